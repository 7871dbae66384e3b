// Gap repair: when a POST stream's JSON-RPC response can no longer be delivered
// (its history is gone, or the upstream answer broke off), the gateway answers
// the request with a JSON-RPC error, so the SDK client's call fails fast instead
// of waiting for its 60 s timeout.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startCutProxy } from '../fixtures/cut-proxy.js'
import { connectClient, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { startGateway } from '../fixtures/gateway.js'
import { useRedis } from '../fixtures/redis.js'
import { loadConfig } from '../../src/config/load.js'
import { buildGateway } from '../../src/server.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { decodeEventId } from '../../src/protocol/event-id.js'

t.test('a resume whose stream history is gone gets a JSON-RPC error for the request', async (t) => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const redis = await useRedis(t, 'repair')
  // A long retry hint leaves time to destroy the stream's history before the client resumes.
  const config = loadConfig({ UPSTREAM_URL: upstream.url, HOST: '127.0.0.1', ADMIN_HOST: '127.0.0.1', PORT: '0', ADMIN_PORT: '0', LOG_LEVEL: 'silent', SSE_RETRY_MS: '3000' })
  const store = await RedisEventStore.connect({ url: redis.url, keyPrefix: redis.prefix, retention: config.retention })
  const gateway = await buildGateway(config, { store })
  const { url } = await gateway.listen()
  t.teardown(() => gateway.close())
  const proxy = await startCutProxy(Number(new URL(url).port))
  t.teardown(() => proxy.close())
  const mcp = await connectClient(proxy.url('/mcp'))
  t.teardown(() => mcp.close())

  const started = Date.now()
  const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: 100, intervalMs: 5 } }, undefined, { timeout: 60_000 })
  call.catch(() => {})
  t.ok(await waitUntil(() => sequencesOf(mcp.notifications, 'stream_notifications').length >= 20, 10_000), 'the stream is flowing')
  // The tools/call POST: the latest one with an SSE answer (initialize was answered as a stream too).
  const post = [...mcp.exchanges].reverse().find(e => e.method === 'POST' && e.events.some(ev => ev.id !== undefined && decodeEventId(ev.id)?.streamId !== 's'))
  const position = decodeEventId(post?.events.find(ev => ev.id !== undefined)?.id)
  t.ok(position, 'the POST stream carries gateway ids')
  const streamId = position?.streamId ?? ''
  proxy.cutAll()
  // The upstream answer completes while the client is away; then the stream's history is lost
  // (as when its key expires), while the session lives on.
  const sessionId = mcp.sessionId ?? ''
  t.ok(await (async () => {
    for (let i = 0; i < 200; i++) {
      if ((await store.state(sessionId, streamId))?.ended === true) return true
      await sleep(10)
    }
    return false
  })(), 'the stream was recorded to its end')
  const keys = await redis.redis.keys(`${redis.prefix}*`)
  for (const key of keys) {
    if (key.endsWith(`:b:${streamId}`)) await redis.redis.del(key)
    if (key.endsWith(':m')) await redis.redis.hdel(key, ...['q', 'f', 'b', 'e', 'c'].map(f => `${f}:${streamId}`))
  }
  const outcome = await call.then(() => 'resolved', (err: unknown) => err)
  const elapsed = Date.now() - started
  t.type(outcome, McpError, 'the call fails with a JSON-RPC error')
  t.match((outcome as McpError).message, /response to this request was lost/, 'the error says why')
  t.ok(elapsed < 15_000, `the call failed fast (${elapsed} ms), not at its 60 s timeout`)
  const resume = mcp.exchanges.find(e => e.method === 'GET' && e.lastEventId !== undefined && !e.lastEventId.includes('.s.'))
  t.equal(resume?.status, 200, 'the resume was answered')
  t.ok(resume?.events.some(e => e.event === 'gateway-gap'), 'with an explicit gap notice')
  // Two retry hints (3 s): the SDK client resumes a stream that ended without a result (the
  // repair is an error) once more; a loop would resume it again after each.
  await sleep(7000)
  const after = mcp.exchanges.filter(e => e.method === 'GET' && e.lastEventId !== undefined && !e.lastEventId.includes('.s.'))
  // A GET gets an SSE stream (or 405): the repair answer once more, on a stream held open.
  t.ok(after.slice(1).every(e => e.status === 200 && e.contentType?.startsWith('text/event-stream') === true), `a resume past the repair answer gets an SSE stream (${after.map(e => e.status).join(',')})`)
  t.equal(after.length, 2, `no reconnection loop (${after.length} resumes)`)
  t.equal(after[1]?.ended, false, 'the resume past the repair answer is held open')
  t.equal(after.filter(e => e.events.some(ev => ev.event === 'gateway-gap')).length, 1, 'exactly one repair')
  const metrics = await gateway.metrics.registry.getSingleMetricAsString('mcpgw_gaps_total')
  t.match(metrics, /mcpgw_gaps_total\{reason="unknown_stream"\} 1$/m, 'the gap is counted')
})

t.test('an upstream answer that breaks off ends with a JSON-RPC error for the request', async (t) => {
  const upstream = await startExampleServer()
  let upstreamClosed = false
  t.teardown(async () => { if (!upstreamClosed) await upstream.close() })
  const { url } = await startGateway(t, 'memory', upstream.url)
  const mcp = await connectClient(`${url}/mcp`)
  t.teardown(() => mcp.close())
  const started = Date.now()
  const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: 1000, intervalMs: 10 } }, undefined, { timeout: 60_000 })
  call.catch(() => {})
  t.ok(await waitUntil(() => sequencesOf(mcp.notifications, 'stream_notifications').length >= 20, 10_000), 'the stream is flowing')
  upstreamClosed = true
  await upstream.close()
  const outcome = await call.then(() => 'resolved', (err: unknown) => err)
  t.type(outcome, McpError, 'the call fails with a JSON-RPC error')
  t.match((outcome as McpError).message, /the upstream answer broke off/, 'the error names the upstream')
  t.ok(Date.now() - started < 10_000, 'fast, not at the timeout')
})
