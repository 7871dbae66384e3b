// Resumes of answered request streams held open (src/routes/mcp/answered-holds.ts):
// a bound per session where a new connection to a stream held already counts
// once, a hold that ends with its connection, and the held streams of a session
// the store no longer has ended by the periodic check.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { AnsweredHolds, heldInStore, type HeldClient } from '../../src/routes/mcp/answered-holds.js'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import type { CloseOutcome } from '../../src/metrics/metrics.js'

class FakeClient implements HeldClient {
  ended: CloseOutcome | undefined
  #listeners: Array<(outcome: CloseOutcome) => void> = []
  onClose (listener: (outcome: CloseOutcome) => void): void {
    if (this.ended !== undefined) listener(this.ended)
    else this.#listeners.push(listener)
  }

  end (outcome: CloseOutcome): void {
    if (this.ended !== undefined) return
    this.ended = outcome
    for (const listener of this.#listeners.splice(0)) listener(outcome)
  }
}

t.test('at most `max` streams per session; a stream held already counts once', async t => {
  const holds = new AnsweredHolds({ max: 2, checkMs: 60_000, alive: async () => true })
  t.teardown(() => { holds.stop() })
  const a = new FakeClient()
  const b = new FakeClient()
  holds.hold('s1', 'x', a)
  holds.hold('s1', 'y', b)
  t.notOk(holds.admits('s1', 'z'), 'a third stream of the session: refused')
  t.ok(holds.admits('s2', 'z'), 'another session\'s: admitted')
  t.ok(holds.admits('s1', 'x'), 'a new connection to a stream held: admitted (it replaces the old one)')
  const again = new FakeClient()
  holds.hold('s1', 'x', again)
  t.equal(holds.size, 2, 'counted once')
  a.end('superseded')
  t.equal(holds.size, 2, 'the replaced connection ending does not free its stream')
  t.notOk(holds.admits('s1', 'z'))
  again.end('client_gone')
  t.equal(holds.size, 1, 'the one holding it does')
  t.ok(holds.admits('s1', 'z'))
  b.end('client_gone')
  t.equal(holds.size, 0, 'nothing left')
})

t.test('a connection closed before it was held frees its place at once', async t => {
  const holds = new AnsweredHolds({ max: 1, checkMs: 60_000, alive: async () => true })
  t.teardown(() => { holds.stop() })
  const gone = new FakeClient()
  gone.end('client_gone')
  holds.hold('s1', 'x', gone)
  t.equal(holds.size, 0)
  t.ok(holds.admits('s1', 'y'))
})

t.test('the held streams of a session the store no longer has are ended by the check', async t => {
  const alive = new Set(['live'])
  const holds = new AnsweredHolds({ max: 4, checkMs: 30, alive: async id => alive.has(id) })
  t.teardown(() => { holds.stop() })
  const kept = new FakeClient()
  const dropped = [new FakeClient(), new FakeClient()]
  holds.hold('live', 'x', kept)
  holds.hold('gone', 'x', dropped[0] as FakeClient)
  holds.hold('gone', 'y', dropped[1] as FakeClient)
  await sleep(120)
  t.same(dropped.map(c => c.ended), ['session_deleted', 'session_deleted'], 'the session gone: its held streams ended')
  t.equal(kept.ended, undefined, 'a live session\'s stay')
  t.equal(holds.size, 1)
})

t.test('the check asks the store without refreshing the session\'s expiry: a held session still expires', async t => {
  let now = 0
  const store = new MemoryEventStore({ retention: { maxEvents: 100, maxBytes: 1 << 20, ttlMs: 1000 }, maxBytes: 1 << 20, now: () => now })
  await store.createSession('S', 'p')
  await store.append('S', 'call-1', [{ data: '{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no"}}' }])
  const alive = heldInStore(store)
  const seen: boolean[] = []
  // The check, every 400 ms of the store's clock, past the 1,000 ms the session lives untouched.
  for (let i = 0; i < 5; i++) {
    seen.push(await alive('S', 'call-1'))
    now += 400
  }
  t.same(seen, [true, true, true, false, false], 'alive until its TTL passed since its last use, then gone')
})

t.test('resumes followed (not held) are looked up with the held ones, and ended once their session is gone; they do not count', async t => {
  const alive = new Set(['live'])
  const asked: string[] = []
  const holds = new AnsweredHolds({ max: 1, checkMs: 30, alive: async (id, streamId) => { asked.push(`${id}/${streamId}`); return alive.has(id) } })
  t.teardown(() => { holds.stop() })
  const kept = new FakeClient()
  const ended = new FakeClient()
  holds.follow('live', 'call-1', kept)
  holds.follow('gone', 'call-2', ended)
  t.equal(holds.size, 0, 'not counted among the held streams')
  t.ok(holds.admits('gone', 'call-3'), 'nor against the bound')
  await sleep(80)
  t.equal(ended.ended, 'session_deleted', 'the session gone (deleted through another replica, expired): ended')
  t.equal(kept.ended, undefined, 'a live session\'s goes on')
  t.ok(asked.includes('live/call-1') && asked.includes('gone/call-2'), 'each asked about with its own stream')
})

t.test('each stream asked about on its own: one the store dropped from a live session ends alone', async t => {
  // The embedded store drops a session's ended streams first under memory pressure.
  const holds = new AnsweredHolds({ max: 4, checkMs: 30, alive: async (_id, streamId) => streamId !== 'dropped' })
  t.teardown(() => { holds.stop() })
  const kept = new FakeClient()
  const followed = new FakeClient()
  const ended = new FakeClient()
  holds.hold('S', 'kept', kept)
  holds.hold('S', 'dropped', ended)
  holds.follow('S', 'live-call', followed)
  await sleep(80)
  t.equal(ended.ended, 'session_deleted', 'the dropped stream\'s client ended')
  t.equal(kept.ended, undefined, 'the session\'s other held stream goes on')
  t.equal(followed.ended, undefined, 'and so does its live resume')
})

t.test('recordings of answers: stopped once their session is gone, never looked up again once ended', async t => {
  const alive = new Set(['live', 'ended'])
  const asked: string[] = []
  const holds = new AnsweredHolds({ max: 1, checkMs: 30, alive: async (id, streamId) => { asked.push(`${id}/${streamId}`); return alive.has(id) } })
  t.teardown(() => { holds.stop() })
  const stopped: string[] = []
  holds.record('live', 'call-1', () => { stopped.push('live') })
  holds.record('gone', 'call-2', () => { stopped.push('gone') })
  const endedByItself = holds.record('ended', 'call-3', () => { stopped.push('ended') })
  endedByItself()
  alive.delete('ended')
  await sleep(80)
  t.ok(stopped.includes('gone'), 'the recording of a session gone is stopped')
  t.notOk(stopped.includes('live'), 'a live session\'s goes on')
  t.notOk(stopped.includes('ended'), 'one that ended by itself is left alone')
  t.notOk(asked.includes('ended/call-3'), 'and no longer looked up')
  t.equal(holds.size, 0, 'recordings are not counted among the held streams')
})

t.test('endSession: everything held or followed for the session ends at once, other sessions\' goes on', async t => {
  const holds = new AnsweredHolds({ max: 4, checkMs: 60_000, alive: async () => true })
  t.teardown(() => { holds.stop() })
  const held = new FakeClient()
  const followed = new FakeClient()
  const other = new FakeClient()
  let recordingStopped = 0
  holds.hold('S', 'answered', held)
  holds.follow('S', 'live-call', followed)
  holds.record('S', 'live-call', () => { recordingStopped++ })
  holds.hold('T', 'answered', other)
  holds.endSession('S')
  t.equal(held.ended, 'session_deleted', 'the held resume')
  t.equal(followed.ended, 'session_deleted', 'the followed resume')
  t.equal(recordingStopped, 1, 'the recording, once')
  t.equal(other.ended, undefined, 'another session\'s')
  t.equal(holds.size, 1, 'only the other session\'s hold is left')
})
