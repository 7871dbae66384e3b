// The Redis connection watchdog (src/store/redis/watchdog.ts), turn by turn on
// a clock of its own, over stand-in connections: a PING or a handshake left
// unanswered for the timeout, with nothing read meanwhile, closes the
// connection; nothing else does. The
// real connections are in test/store/redis-store.test.ts and
// test/hardening/redis-stalled.test.ts.
import { EventEmitter } from 'node:events'
import t from 'tap'
import type { Test } from 'tap'
import type { Redis } from 'ioredis'
import { ConnectionWatchdog } from '../../src/store/redis/watchdog.js'

const TIMEOUT_MS = 1000

class StandIn extends EventEmitter {
  status = 'ready'
  readonly options = { connectionName: 'stand-in' }
  /** What the watchdog reads of the socket: bytes read so far. */
  readonly stream = { bytesRead: 0, remoteAddress: '127.0.0.1', remotePort: 6379 }
  pings = 0
  disconnects: boolean[] = []
  #answers: Array<() => void> = []

  async ping (): Promise<'PONG'> {
    this.pings++
    return await new Promise((resolve) => this.#answers.push(() => resolve('PONG')))
  }

  /** Answer the `count` oldest PINGs waiting, or all. */
  answer (count = Infinity): void {
    for (const answer of this.#answers.splice(0, count)) answer()
  }

  disconnect (reconnect?: boolean): void {
    this.disconnects.push(reconnect === true)
  }
}

interface Harness {
  watchdog: ConnectionWatchdog
  readonly warnings: unknown[]
  clock: number
  /** One turn at `at` ms, then the promise callbacks it set off. */
  turn: (at: number) => Promise<void>
}

function harness (t: Test, connections: () => Iterable<StandIn>): Harness {
  const h: Harness = {
    watchdog: undefined as unknown as ConnectionWatchdog,
    warnings: [],
    clock: 0,
    turn: async (at) => {
      h.clock = at
      h.watchdog.check()
      await settle()
    }
  }
  const logger = { warn: (fields: unknown) => { h.warnings.push(fields) } }
  h.watchdog = new ConnectionWatchdog({ connections: connections as () => Iterable<Redis>, timeoutMs: TIMEOUT_MS, logger, now: () => h.clock })
  t.teardown(() => h.watchdog.close())
  return h
}

/**
 * Turns just before `at` and at it: `c` is closed (to be opened again) at the
 * second, not before (the watchdog allows its clock 1 ms).
 */
async function closedAt (t: Test, h: Harness, c: StandIn, at: number, what: string): Promise<void> {
  await h.turn(at - 2)
  t.same(c.disconnects, [], `not closed before ${at} ms`)
  await h.turn(at)
  t.same(c.disconnects, [true], what)
}

async function settle (): Promise<void> {
  await new Promise((resolve) => setImmediate(resolve))
}

t.test('a connection that answers its PINGs is never closed, and has one PING out at a time', async (t) => {
  const c = new StandIn()
  const h = harness(t, () => [c])
  await h.turn(0)
  t.equal(c.pings, 1, 'a ready connection is pinged')
  await h.turn(500)
  t.equal(c.pings, 1, 'not again while the first waits')
  c.answer()
  await settle()
  await h.turn(999)
  t.equal(c.pings, 2, 'pinged again once answered')
  for (let at = 1500; at <= 10_000; at += 500) {
    c.answer()
    await h.turn(at)
  }
  t.same(c.disconnects, [], 'never closed')
  t.same(h.warnings, [])
  t.same(h.watchdog.replaced(), { ping: 0, handshake: 0 }, 'nothing counted')
})

t.test('a PING unanswered for the timeout closes the connection, to be opened again, and not before', async (t) => {
  const c = new StandIn()
  const h = harness(t, () => [c])
  await h.turn(0)
  await h.turn(500)
  await closedAt(t, h, c, 1000, 'closed with reconnect')
  t.match(h.warnings, [{ connection: 'stand-in', peer: '127.0.0.1:6379', reason: 'no answer to PING', timeoutMs: TIMEOUT_MS }], 'said why, and where')
  t.same(h.watchdog.replaced(), { ping: 1, handshake: 0 }, 'counted, by what waited')
  await h.turn(1500)
  t.equal(c.pings, 2, 'the connection is watched afresh: a new PING')
  t.same(c.disconnects, [true], 'and not closed again at once')
})

t.test('a handshake unfinished for the timeout closes the connection; one that finishes does not', async (t) => {
  const stuck = new StandIn()
  const slow = new StandIn()
  stuck.status = 'connect'
  slow.status = 'connect'
  const h = harness(t, () => [stuck, slow])
  await h.turn(0)
  await h.turn(500)
  t.equal(stuck.pings + slow.pings, 0, 'nothing is sent before the connection is ready')
  slow.status = 'ready'
  await closedAt(t, h, stuck, 1000, 'the stuck handshake is closed')
  t.match(h.warnings, [{ reason: 'no answer during the handshake' }])
  t.same(h.watchdog.replaced(), { ping: 0, handshake: 1 }, 'counted as a handshake')
  t.same(slow.disconnects, [], 'the handshake that finished is not')
  t.equal(slow.pings, 1, 'and it is pinged once ready')
})

t.test('a PING waiting behind replies that keep arriving is not taken for dead: the timeout counts from the last byte read', async (t) => {
  const c = new StandIn()
  const h = harness(t, () => [c])
  await h.turn(0)
  // A deep queue on a healthy Redis: replies to earlier commands arrive, the PING's not yet.
  for (let at = 500; at <= 5000; at += 500) {
    c.stream.bytesRead += 4 << 20
    await h.turn(at)
  }
  t.same(c.disconnects, [], 'not closed while bytes come in, long past the timeout')
  t.equal(c.pings, 1, 'one PING waiting all along')
  await h.turn(5500)
  await closedAt(t, h, c, 6000, 'closed a whole timeout after the last byte read')
})

t.test('an answer read only after the turn that found the timeout run out (the process stood still) keeps the connection', async (t) => {
  const c = new StandIn()
  const h = harness(t, () => [c])
  await h.turn(0)
  t.equal(c.pings, 1)
  // The timer turn comes first; the loop reads the socket after it, in the same turn of the loop.
  h.clock = TIMEOUT_MS
  h.watchdog.check()
  c.stream.bytesRead += 7
  c.answer()
  await settle()
  t.same(c.disconnects, [], 'not closed: the PONG was waiting in the socket')
  t.same(h.watchdog.replaced(), { ping: 0, handshake: 0 }, 'nothing counted')
  // A handshake likewise: what the read brings is a sign of life.
  c.status = 'connect'
  c.emit('connect')
  h.clock = 2 * TIMEOUT_MS
  h.watchdog.check()
  h.clock = 3 * TIMEOUT_MS
  h.watchdog.check()
  c.stream.bytesRead += 100
  await settle()
  t.same(c.disconnects, [], 'nor a handshake whose reply came in that read')
  await h.turn(3.5 * TIMEOUT_MS)
  await closedAt(t, h, c, 4 * TIMEOUT_MS, 'a whole timeout after that read, still in its handshake, it is closed')
})

t.test('a handshake is timed from the connection\'s connect; one that reads something (a loading Redis\'s INFO) is not taken for dead', async (t) => {
  const stuck = new StandIn()
  const loading = new StandIn()
  const h = harness(t, () => [stuck, loading])
  await h.turn(0)
  for (const c of [stuck, loading]) {
    c.emit('close')
    c.status = 'connect'
  }
  h.clock = 100
  stuck.emit('connect')
  loading.emit('connect')
  loading.stream.bytesRead += 100
  await h.turn(500)
  await closedAt(t, h, stuck, 1100, 'closed a timeout after its connect, not after the turn that first saw it')
  for (let at = 1500; at <= 4000; at += 500) {
    loading.stream.bytesRead += 100
    await h.turn(at)
  }
  t.same(loading.disconnects, [], 'a handshake that reads answers goes on')
})

t.test('a connection that closed forgets its PING: the next one is not taken for dead', async (t) => {
  const c = new StandIn()
  const h = harness(t, () => [c])
  await h.turn(0)
  t.equal(c.pings, 1)
  // Closed by something else (Redis restarted); ioredis sends the PING again on the new connection, where it waits.
  c.status = 'reconnecting'
  c.emit('close')
  c.status = 'ready'
  await h.turn(1000)
  t.same(c.disconnects, [], 'the old PING does not count against the new connection')
  t.equal(c.pings, 2, 'the new connection gets its own PING')
  await closedAt(t, h, c, 2000, 'its own PING unanswered for the timeout does')
})

t.test('a PING sent before a close and answered after it does not clear the new connection\'s', async (t) => {
  const c = new StandIn()
  const h = harness(t, () => [c])
  await h.turn(0)
  c.emit('close')
  await h.turn(500)
  t.equal(c.pings, 2, 'a PING for the new connection')
  c.answer(1)
  await settle()
  await h.turn(1000)
  t.equal(c.pings, 2, 'the old PING\'s answer leaves the new one waiting')
  await closedAt(t, h, c, 1500, 'the new PING, unanswered, counts from 500 ms')
})

t.test('connections opening or waiting to reconnect are left to ioredis; the set is read at every turn', async (t) => {
  const a = new StandIn()
  const b = new StandIn()
  a.status = 'connecting'
  let set: StandIn[] = [a]
  const h = harness(t, () => set)
  await h.turn(0)
  await h.turn(5000)
  t.equal(a.pings, 0, 'nothing sent while connecting')
  t.same(a.disconnects, [], 'and nothing closed: connectTimeout bounds it')
  a.status = 'ready'
  set = [a, b]
  await h.turn(5500)
  t.equal(a.pings, 1, 'pinged once ready')
  t.equal(b.pings, 1, 'a connection added to the set is watched')
  set = [a]
  await h.turn(7000)
  t.same(b.disconnects, [], 'one no longer in the set is not')
  t.same(a.disconnects, [true])
})

t.test('close(): a verdict already waiting is not given (the store closes its connections itself)', async (t) => {
  const c = new StandIn()
  const h = harness(t, () => [c])
  await h.turn(0)
  h.clock = TIMEOUT_MS
  h.watchdog.check()
  h.watchdog.close()
  await settle()
  t.same(c.disconnects, [], 'not closed')
  t.same(h.watchdog.replaced(), { ping: 0, handshake: 0 }, 'nothing counted')
  t.same(h.warnings, [])
})

t.test('close() stops the turns', async (t) => {
  const c = new StandIn()
  const watchdog = new ConnectionWatchdog({ connections: () => [c as unknown as Redis], timeoutMs: 20 })
  await new Promise((resolve) => setTimeout(resolve, 60))
  t.ok(c.pings >= 1, `turns on a timer of half the timeout (${c.pings} PINGs)`)
  watchdog.close()
  c.answer()
  const pings = c.pings
  await new Promise((resolve) => setTimeout(resolve, 60))
  t.equal(c.pings, pings, 'none after close()')
})
