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

const RETRY_MS = 20

interface Harness {
  left: LeftBehind
  readonly sent: UpstreamRequest[]
  readonly settled: LeftBehindOutcome[]
  clock: number
}

/** `answer(n)`: whether the n-th DELETE sent (from 0) is answered; else it fails as unreachable. */
function harness (t: Test, answer: (n: number) => boolean | 'never', options: Partial<LeftBehindOptions> = {}): Harness {
  const h: Harness = { left: undefined as unknown as LeftBehind, sent: [], settled: [], clock: 0 }
  const send = async (request: UpstreamRequest): Promise<UpstreamResponse> => {
    const n = h.sent.push(request) - 1
    const outcome = answer(n)
    if (outcome === 'never') return await new Promise(() => {})
    if (!outcome) throw new Error('connect ECONNREFUSED')
    return { statusCode: 200, headers: {}, body: Readable.from([]) }
  }
  h.left = new LeftBehind({ send, listed: () => true, path: '/mcp', retryMs: RETRY_MS, maxAgeMs: 60_000, max: 8, requestTimeoutMs: 1000, settled: o => h.settled.push(o), now: () => h.clock, ...options })
  t.teardown(() => h.left.close())
  return h
}

const placement = (n: number): { upstreamSessionId: string, endpoint: string } => ({ upstreamSessionId: `up-${n}`, endpoint: 'http://10.0.0.7:3000' })

t.test('a DELETE at once, in the session, to its endpoint, with its headers', async t => {
  const h = harness(t, () => true)
  h.left.add(placement(1), { authorization: 'Bearer x', 'mcp-protocol-version': '2025-06-18' })
  await sleep(5)
  t.equal(h.sent.length, 1)
  t.match(h.sent[0], { method: 'DELETE', path: '/mcp', endpoint: 'http://10.0.0.7:3000', headers: { 'mcp-session-id': 'up-1', authorization: 'Bearer x', 'mcp-protocol-version': '2025-06-18' } })
  t.same(h.settled, ['answered'])
  t.equal(h.left.size, 0)
})

t.test('sent again every retryMs while the endpoint cannot be reached, until it answers', async t => {
  const h = harness(t, n => n >= 3)
  h.left.add(placement(1), {})
  await sleep(RETRY_MS * 8)
  t.equal(h.sent.length, 4, 'three failures, then the answer; nothing after')
  t.same(h.settled, ['answered'])
})

t.test('given up when the endpoint leaves the set, or when maxAgeMs passes', async t => {
  let listed = true
  const gone = harness(t, () => false, { listed: () => listed })
  gone.left.add(placement(1), {})
  await sleep(RETRY_MS * 3)
  t.same(gone.settled, [], 'still tried while listed')
  listed = false
  await sleep(RETRY_MS * 3)
  t.same(gone.settled, ['endpoint_gone'])
  const sentThen = gone.sent.length
  await sleep(RETRY_MS * 3)
  t.equal(gone.sent.length, sentThen, 'nothing sent after')

  const old = harness(t, () => false, { maxAgeMs: 1000 })
  old.left.add(placement(2), {})
  await sleep(RETRY_MS * 3)
  t.same(old.settled, [])
  old.clock = 1000
  await sleep(RETRY_MS * 3)
  t.same(old.settled, ['expired'])
  t.equal(old.left.size, 0)
})

t.test('at most max wait: past it, the oldest is given up', async t => {
  const h = harness(t, () => 'never', { max: 2 })
  for (const n of [1, 2, 3]) h.left.add(placement(n), {})
  t.equal(h.left.size, 2)
  t.same(h.settled, ['dropped'])
  await sleep(RETRY_MS * 3)
  t.equal(h.sent.length, 3, 'one DELETE in flight per session at most: none sent again while one waits')
})

t.test('close() gives every one up, uncounted, and sends nothing more', async t => {
  const h = harness(t, () => false)
  h.left.add(placement(1), {})
  h.left.close()
  const sentThen = h.sent.length
  await sleep(RETRY_MS * 3)
  t.equal(h.sent.length, sentThen)
  t.same(h.settled, [])
  t.equal(h.left.size, 0)
})
