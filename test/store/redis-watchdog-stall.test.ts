// The Redis connection watchdog (src/store/redis/watchdog.ts) on a real
// connection, when the process itself stands still (a long collection, a
// starved CPU) while a PING waits: the PONG arrives in the socket meanwhile,
// but the watchdog's overdue timer runs before the loop reads that socket. The
// connection is healthy and must be kept; one that truly answers nothing is
// still closed (test/unit/redis-watchdog.test.ts has the turn-by-turn rules).
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { ConnectionWatchdog } from '../../src/store/redis/watchdog.js'
import { requireRedis } from '../fixtures/redis.js'

const TIMEOUT_MS = 200

/** Holds the event loop: nothing is read from any socket meanwhile. */
function standStill (ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms)
}

t.test('a PING answered while the process stood still past the timeout keeps its connection', async (t) => {
  const url = await requireRedis(t)
  const connection = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  t.teardown(() => connection.disconnect())
  await connection.connect()
  const socket = connection.stream
  const warnings: unknown[] = []
  const watchdog = new ConnectionWatchdog({ connections: () => [connection], timeoutMs: TIMEOUT_MS, logger: { warn: (fields: unknown) => { warnings.push(fields) } } })
  t.teardown(() => watchdog.close())
  for (let round = 0; round < 3; round++) {
    // A PING goes out now; its answer lands in the socket while the loop is held, late in
    // its turn (after the poll phase, as a long callback would be). The watchdog's
    // overdue timer runs next, before the loop reads the socket again.
    await new Promise<void>((resolve) => setImmediate(() => {
      watchdog.check()
      standStill(5 * TIMEOUT_MS)
      resolve()
    }))
    await sleep(TIMEOUT_MS / 2)
  }
  t.same(watchdog.replaced(), { ping: 0, handshake: 0 }, 'no connection taken for dead')
  t.same(warnings, [], 'nothing logged')
  t.equal(connection.stream, socket, 'the same socket')
  t.equal(await connection.ping(), 'PONG', 'and it answers')
})

t.test('a connection whose PING truly goes unanswered is still closed, once the loop has read its socket', async (t) => {
  const url = await requireRedis(t)
  const connection = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  t.teardown(() => connection.disconnect())
  await connection.connect()
  const socket = connection.stream
  const watchdog = new ConnectionWatchdog({ connections: () => [connection], timeoutMs: TIMEOUT_MS })
  t.teardown(() => watchdog.close())
  // A blocking read holds the connection: Redis answers its next command, the PING, only after it.
  connection.blpop(`watchdog-stall:${process.pid}:${Date.now()}`, 1).catch(() => {})
  await sleep(20)
  watchdog.check()
  standStill(2 * TIMEOUT_MS)
  t.ok(await waitFor(() => watchdog.replaced().ping === 1, 2000), 'taken for dead')
  // The read is sent again on the new connection and holds it as long again: no more turns.
  watchdog.close()
  t.ok(await waitFor(() => connection.stream !== socket && connection.status === 'ready', 2000), 'a new connection, ready')
  t.equal(await connection.ping(), 'PONG', 'which answers')
})

async function waitFor (check: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms
  while (!check()) {
    if (Date.now() > deadline) return false
    await sleep(10)
  }
  return true
}
