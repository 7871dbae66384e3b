// Upstream sessions left behind by a move (src/sessions/left-behind.ts): each
// gets a DELETE until its endpoint answers, leaves the set or the time runs
// out; at most `max` wait. The upstream here is a stand-in `send`.
import { Readable } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import type { Test } from 'tap'
import type { LeftBehindOutcome } from '../../src/metrics/metrics.js'
import { LeftBehind, type LeftBehindOptions } from '../../src/sessions/left-behind.js'
import type { UpstreamRequest, UpstreamResponse } from '../../src/upstream/client.js'
import { until } from '../fixtures/hardening.js'

const RETRY_MS = 20

interface Harness {
  left: LeftBehind
  readonly sent: UpstreamRequest[]
  readonly settled: LeftBehindOutcome[]
  clock: number
}

/**
 * `answer(n)`: how the n-th DELETE sent (from 0) ends: answered (true, or a
 * status), failed as unreachable (false), or never.
 */
function harness (t: Test, answer: (n: number) => boolean | number | 'never', options: Partial<LeftBehindOptions> = {}): Harness {
  const h: Harness = { left: undefined as unknown as LeftBehind, sent: [], settled: [], clock: 0 }
  const send = async (request: UpstreamRequest): Promise<UpstreamResponse> => {
    const n = h.sent.push(request) - 1
    const outcome = answer(n)
    if (outcome === 'never') return await new Promise(() => {})
    if (outcome === false) throw new Error('connect ECONNREFUSED')
    return { statusCode: outcome === true ? 200 : outcome, headers: {}, body: Readable.from([]) }
  }
  // The sessions' records name other upstream sessions (where they moved).
  const named = async (): Promise<string | undefined> => 'elsewhere'
  h.left = new LeftBehind({ send, named, listed: () => true, path: '/mcp', retryMs: RETRY_MS, waitMs: 0, maxAgeMs: 60_000, max: 8, concurrency: 8, requestTimeoutMs: 1000, settled: o => h.settled.push(o), now: () => h.clock, ...options })
  t.teardown(() => h.left.close())
  return h
}

const placement = (n: number): { upstreamSessionId: string, endpoint: string } => ({ upstreamSessionId: `up-${n}`, endpoint: 'http://10.0.0.7:3000' })

t.test('a DELETE at once, in the session, to its endpoint, with its headers', async t => {
  const h = harness(t, () => true)
  h.left.add('s1', placement(1), { authorization: 'Bearer x', 'mcp-protocol-version': '2025-06-18' })
  t.ok(await until(() => h.settled.length > 0, 2000), 'settled')
  t.equal(h.sent.length, 1)
  t.match(h.sent[0], { method: 'DELETE', path: '/mcp', endpoint: 'http://10.0.0.7:3000', headers: { 'mcp-session-id': 'up-1', authorization: 'Bearer x', 'mcp-protocol-version': '2025-06-18' } })
  t.same(h.settled, ['answered'])
  t.equal(h.left.size, 0)
})

t.test('sent again every retryMs while the endpoint cannot be reached or asks to be called later, until it answers', async t => {
  const statuses = [false, 503, 429, 408, 404]
  const h = harness(t, n => statuses[n] ?? true)
  h.left.add('s1', placement(1), {})
  t.ok(await until(() => h.settled.length > 0, 2000), 'settled')
  await sleep(RETRY_MS * 3)
  t.equal(h.sent.length, 5, 'refused, 503, 429, 408, then 404 (the session is not there): nothing after')
  t.same(h.settled, ['answered'])
})

t.test('a session whose record names that upstream session again is kept, not deleted', async t => {
  let named: string | undefined = 'up-2'
  const h = harness(t, () => false, { named: async () => named })
  h.left.add('s1', placement(1), {})
  t.ok(await until(() => h.sent.length >= 1, 2000), 'named elsewhere: tried')
  t.same(h.settled, [])
  named = 'up-1'
  t.ok(await until(() => h.settled.length > 0, 2000))
  t.same(h.settled, ['kept'], 'the record names it again (the store lost the move): kept')
  const sentThen = h.sent.length
  await sleep(RETRY_MS * 3)
  t.equal(h.sent.length, sentThen, 'and never sent a DELETE after')

  const unread = harness(t, () => true, { named: async () => { throw new Error('store down') } })
  unread.left.add('s2', placement(2), {})
  await sleep(RETRY_MS * 3)
  t.equal(unread.sent.length, 0, 'nothing sent while the record cannot be read')
  t.same(unread.settled, [])
})

t.test('at most `concurrency` DELETEs at once; the next goes as soon as one is answered', async t => {
  // No turn comes within the test (retryMs a minute): only answers can let the next go.
  const h = harness(t, () => true, { concurrency: 2, retryMs: 60_000 })
  const held = harness(t, () => 'never', { concurrency: 2 })
  for (const n of [1, 2, 3, 4, 5]) held.left.add(`s${n}`, placement(n), {})
  t.ok(await until(() => held.sent.length === 2, 2000))
  await sleep(RETRY_MS * 3)
  t.equal(held.sent.length, 2, 'two in flight, the rest wait')
  for (const n of [1, 2, 3, 4, 5]) h.left.add(`s${n}`, placement(n), {})
  t.ok(await until(() => h.settled.length === 5, 2000))
  t.same(h.settled, ['answered', 'answered', 'answered', 'answered', 'answered'], 'answers let the next go at once, without waiting for a turn')
})

t.test('given up when the endpoint leaves the set, or when maxAgeMs passes', async t => {
  let listed = true
  const gone = harness(t, () => false, { listed: () => listed })
  gone.left.add('s1', placement(1), {})
  await sleep(RETRY_MS * 3)
  t.same(gone.settled, [], 'still tried while listed')
  listed = false
  t.ok(await until(() => gone.settled.length > 0, 2000))
  t.same(gone.settled, ['endpoint_gone'])
  const sentThen = gone.sent.length
  await sleep(RETRY_MS * 3)
  t.equal(gone.sent.length, sentThen, 'nothing sent after')

  const old = harness(t, () => false, { maxAgeMs: 1000 })
  old.left.add('s2', placement(2), {})
  await sleep(RETRY_MS * 3)
  t.same(old.settled, [])
  old.clock = 1000
  t.ok(await until(() => old.settled.length > 0, 2000))
  t.same(old.settled, ['expired'])
  t.equal(old.left.size, 0)
})

t.test('at most max wait: past it, the oldest is given up', async t => {
  const h = harness(t, () => 'never', { max: 2 })
  for (const n of [1, 2, 3]) h.left.add(`s${n}`, placement(n), {})
  t.equal(h.left.size, 2)
  t.same(h.settled, ['dropped'])
  await sleep(RETRY_MS * 3)
  t.same(h.sent.map(r => r.headers['mcp-session-id']), ['up-2', 'up-3'], 'the one given up is not sent; one DELETE in flight per session at most: none sent again while one waits')
})

t.test('close() gives every one up, uncounted, and sends nothing more', async t => {
  const h = harness(t, () => false)
  h.left.add('s1', placement(1), {})
  h.left.close()
  const sentThen = h.sent.length
  await sleep(RETRY_MS * 3)
  t.equal(h.sent.length, sentThen)
  t.same(h.settled, [])
  t.equal(h.left.size, 0)
})

t.test('each DELETE waits waitMs from its session\'s move, and is sent at the first turn after it', async t => {
  const h = harness(t, () => true, { waitMs: 1000 })
  h.left.add('s1', placement(1), {})
  h.clock = 500
  h.left.add('s2', placement(2), {})
  await sleep(RETRY_MS * 4)
  t.equal(h.sent.length, 0, 'nothing while the waits run')
  h.clock = 999
  await sleep(RETRY_MS * 3)
  t.equal(h.sent.length, 0, 'still nothing a millisecond short of the first')
  h.clock = 1000
  t.ok(await until(() => h.settled.length === 1, 2000), 'the first settled')
  await sleep(RETRY_MS * 3)
  t.same(h.sent.map(r => r.headers['mcp-session-id']), ['up-1'], 'the second waits on, even after an answer')
  h.clock = 1500
  t.ok(await until(() => h.settled.length === 2, 2000), 'the second settled')
  t.same(h.sent.map(r => r.headers['mcp-session-id']), ['up-1', 'up-2'])
  t.equal(h.left.size, 0)
})
