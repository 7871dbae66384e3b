// Fairness under a flood: while a few streams flood through the gateway at
// full speed, a new client's initialize + GET gets its response head, and
// /healthz answers, promptly, on both stores. A gateway that does unbounded
// work per turn of its event loop keeps them waiting for seconds (a hung
// gateway, to an operator). The flood runs in a worker thread; the requests
// timed here wait for the gateway alone. The bound is loose for a shared
// CI machine, far under the stalls it catches.
import t from 'tap'
import type { Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startFlood } from '../fixtures/flood.js'
import { useRedis } from '../fixtures/redis.js'
import { startReplica } from '../fixtures/replica.js'

const STREAMS = 50
const PROBES = 8
/**
 * Seen without the fix on a loaded 2-core machine, 50 streams: 1.5 s embedded,
 * over 30 s on Redis (100 streams: over 30 s on both). With it, the slowest of
 * 8 reached 1,008 ms on Redis in a CI run (the others 173-336 ms): 3 s keeps
 * a shared CI machine green and still fails a stall of many seconds; the
 * benchmark's fairness scenario (`--only=fair`) measures the p99 beside nginx.
 */
const BOUND_MS = 3000
const HEADERS = { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-protocol-version': '2025-06-18' }
const INITIALIZE = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'probe', version: '1' } } })

/** initialize, then GET until the response head: ms. */
async function newClient (url: string): Promise<number> {
  const started = performance.now()
  const init = await fetch(url, { method: 'POST', headers: HEADERS, body: INITIALIZE, signal: AbortSignal.timeout(60_000) })
  await init.text()
  const sessionId = init.headers.get('mcp-session-id')
  if (sessionId === null) throw new Error(`initialize answered ${init.status} without a session id`)
  const abort = new AbortController()
  const timeout = setTimeout(() => abort.abort(), 60_000)
  const get = await fetch(url, { headers: { ...HEADERS, accept: 'text/event-stream', 'mcp-session-id': sessionId }, signal: abort.signal })
  const ms = performance.now() - started
  clearTimeout(timeout)
  if (get.status !== 200) throw new Error(`GET answered ${get.status}`)
  abort.abort()
  await get.body?.cancel().catch(() => {})
  return ms
}

async function healthz (adminUrl: string): Promise<number> {
  const started = performance.now()
  const res = await fetch(`${adminUrl}/healthz`, { signal: AbortSignal.timeout(60_000) })
  await res.text()
  if (res.status !== 200) throw new Error(`/healthz answered ${res.status}`)
  return performance.now() - started
}

async function floodAndProbe (t: Test, env: Record<string, string>): Promise<void> {
  // Without the fix a probe waits tens of seconds: fail on the bound, not on tap's timeout.
  t.setTimeout(120_000)
  const flood = await startFlood()
  t.teardown(() => flood.stop())
  const gateway = await startReplica(t, { upstreamUrl: flood.upstreamUrl, env: { LOG_LEVEL: 'warn', ...env } })
  await flood.start(`${gateway.url}/mcp`, STREAMS)
  await sleep(500)
  const before = await flood.received()
  const started = performance.now()
  const heads: number[] = []
  const health: number[] = []
  for (let i = 0; i < PROBES; i++) {
    heads.push(await newClient(`${gateway.url}/mcp`))
    health.push(await healthz(gateway.adminUrl))
    await sleep(50)
  }
  const flooded = (await flood.received()) - before
  const seconds = (performance.now() - started) / 1000
  t.ok(flooded > 1_000_000, `the flood went on meanwhile (${(flooded / 1e6).toFixed(1)} MB read, ${(flooded / 1e6 / seconds).toFixed(1)} MB/s)`)
  const worst = (xs: number[]): string => `${Math.max(...xs).toFixed(0)} ms (all: ${xs.map(x => x.toFixed(0)).join(' ')})`
  t.ok(Math.max(...heads) < BOUND_MS, `initialize + GET head within ${BOUND_MS} ms: slowest ${worst(heads)}`)
  t.ok(Math.max(...health) < BOUND_MS, `/healthz within ${BOUND_MS} ms: slowest ${worst(health)}`)
}

t.test('embedded store: new clients and /healthz are served during a flood', async t => {
  await floodAndProbe(t, {})
})

t.test('Redis store: new clients and /healthz are served during a flood', async t => {
  // A key prefix of its own, deleted at teardown.
  const { url, prefix } = await useRedis(t, 'fairness')
  await floodAndProbe(t, { REDIS_URL: url, REDIS_KEY_PREFIX: prefix })
})
