// The bound of a re-establishment: an upstream that accepts the recorded initialize
// and never answers must not hold the client's request (and the session's fence)
// past the fence's time. The re-establisher itself, on the embedded store, against a
// real upstream socket that reads the request and says nothing.
import t from 'tap'
import { once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import pino from 'pino'
import { GatewayMetrics } from '../../src/metrics/metrics.js'
import { SessionReestablisher } from '../../src/sessions/reestablish.js'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import { UpstreamClient } from '../../src/upstream/client.js'

const FENCE_MS = 400
const INITIALIZE = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '0' } } })

t.test('an upstream that never answers the new initialize: unavailable within the fence\'s time, its request aborted, the session kept', async t => {
  const held: ServerResponse[] = []
  const aborted = { count: 0 }
  const upstream = createServer((req, res) => {
    req.resume()
    held.push(res)
    res.on('close', () => { aborted.count++ })
  })
  upstream.listen(0, '127.0.0.1')
  await once(upstream, 'listening')
  t.teardown(() => { for (const res of held) res.destroy(); upstream.close() })
  const client = new UpstreamClient({ origin: new URL(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`), headersTimeoutMs: 60_000 })
  t.teardown(() => client.close())
  const store = new MemoryEventStore({ retention: { maxEvents: 100, maxBytes: 1 << 20, ttlMs: 60_000 }, maxBytes: 1 << 24 })
  const stale = await store.createSession('session-1', 'principal', {
    placement: { upstreamSessionId: 'old' },
    recipe: { initialize: INITIALIZE, initializeResult: '{"capabilities":{},"protocolVersion":"2025-11-25"}' }
  })
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const reestablisher = new SessionReestablisher({ store, upstream: client, metrics, mcpPath: '/mcp', maxAnswerBytes: 1 << 20, fenceMs: FENCE_MS })

  const started = Date.now()
  const result = await Promise.race([
    reestablisher.reestablish('session-1', stale, {}, pino({ level: 'silent' })),
    new Promise<{ outcome: string }>(resolve => setTimeout(() => resolve({ outcome: 'still waiting after 5 s' }), 5000).unref())
  ])
  const took = Date.now() - started
  t.equal(result.outcome, 'unavailable', 'not the upstream\'s last word: the session is kept for the next request')
  t.ok(took >= FENCE_MS - 50 && took < FENCE_MS + 1500, `given up after the fence's time (${took} ms)`)
  t.equal(held.length, 1, 'the upstream got the initialize')
  for (let i = 0; i < 50 && aborted.count < 1; i++) await new Promise(resolve => setTimeout(resolve, 20))
  t.equal(aborted.count, 1, 'and its request was aborted')
  t.equal((await store.getSession('session-1'))?.upstreamSessionId, 'old', 'the record is where it was')
  t.ok(await store.acquireSessionFence('session-1', 'next', 1000), 'the fence was let go')
})
