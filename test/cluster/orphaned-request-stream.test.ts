// The replica recording a tool call's request stream is SIGKILLed mid-answer.
// The rest of the upstream's answer is lost with its connection, but the
// client, resuming on the surviving replica, must be told at once: that
// replica finds the recorder's liveness mark gone (LEASE_TTL_MS after the
// kill, at its next tick) and ends the stream with the gateway's JSON-RPC
// error answer. Without it the call waits for its own timeout.
import t from 'tap'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import { startExampleServer } from '../../examples/mcp-server.js'
import { decodeEventId } from '../../src/protocol/event-id.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { startBalancer } from '../fixtures/balancer.js'
import { startReplicas } from '../fixtures/cluster-scenario.js'
import { testConfig } from '../fixtures/gateway.js'
import { checkDelivery, connectClient, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import type { Replica } from '../fixtures/replica.js'

const LEASE_TTL_MS = 2000
const TICK_MS = Math.floor(LEASE_TTL_MS / 3)
/** The client's own timeout: what it would wait without the takeover. */
const CALL_TIMEOUT_MS = 30_000
/** Liveness mark runs out (at most the ttl after the kill), the next tick (a third of it), the client's reconnect and slack. */
const BOUND_MS = LEASE_TTL_MS + TICK_MS + 2000

t.test('SIGKILL of the replica recording a tool call: the client resuming elsewhere gets the gateway\'s error answer within seconds', async (t) => {
  const redis = await useRedis(t, 'orphan')
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const env = { REDIS_URL: redis.url, REDIS_KEY_PREFIX: redis.prefix, LEASE_TTL_MS: String(LEASE_TTL_MS), SSE_RETRY_MS: '200' }
  const [a, b] = await startReplicas(t, upstream.url, env, ['A', 'B']) as [Replica, Replica]
  const lb = await startBalancer([a.port, b.port])
  t.teardown(() => lb.close())
  const store = await RedisEventStore.connect({ url: redis.url, keyPrefix: redis.prefix, retention: testConfig(upstream.url).retention })
  t.teardown(() => store.close())

  // A new connection per request, so the balancer places each one.
  const mcp = await connectClient(lb.url('/mcp'), {
    agentOptions: { pipelining: 0 },
    reconnectionOptions: { initialReconnectionDelay: 100, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5, maxRetries: 10 }
  })
  t.teardown(() => mcp.close())
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'standalone GET open')

  // A long tool call (20 s), recorded by A.
  lb.plan([a.port])
  const started = Date.now()
  let settledAt = 0
  const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: 2000, intervalMs: 10, tag: 'long' } }, undefined, { timeout: CALL_TIMEOUT_MS })
    .then(result => ({ result, err: undefined }), (err: unknown) => ({ result: undefined, err }))
    .finally(() => { settledAt = Date.now() })
  const received = (): number[] => sequencesOf(mcp.notifications, 'stream_notifications', 'long')
  t.ok(await waitUntil(() => received().length >= 100, 10_000), 'the tool call streams')
  t.equal(await a.metric('mcpgw_upstream_streams_open', { kind: 'request' }), 1, 'A records it')

  a.kill('SIGKILL')
  const killedAt = Date.now()
  lb.remove(a.port)
  const before = received().length

  const outcome = await call
  const answeredMs = settledAt - killedAt
  t.comment(`orphaned request stream: lease ttl ${LEASE_TTL_MS} ms; ${before} notifications before the kill, ${received().length} in all; the call ended ${answeredMs} ms after the SIGKILL (${settledAt - started} ms after it began; its timeout ${CALL_TIMEOUT_MS} ms)`)
  t.ok(outcome.err instanceof McpError, `the call fails with a JSON-RPC error (${String(outcome.err ?? 'it returned a result')})`)
  t.match(String((outcome.err as Error | undefined)?.message), /MCP gateway: the response to this request was lost \(the gateway replica recording the answer went away\)/, 'it is the gateway\'s error answer')
  t.ok(answeredMs < BOUND_MS, `within ${BOUND_MS} ms of the kill, far from the client's ${CALL_TIMEOUT_MS} ms timeout (${answeredMs} ms)`)

  // The client resumed on B and read the stream to its end there.
  const resumes = mcp.exchanges.filter(e => e.method === 'GET' && e.lastEventId !== undefined && decodeEventId(e.lastEventId)?.streamId !== 's')
  t.ok(resumes.some(e => e.status === 200), 'the client resumed the request stream with Last-Event-ID')
  const report = checkDelivery(received(), received().length === 0 ? 0 : Math.max(...received()) + 1)
  t.same(report.lost, [], 'nothing lost up to where the recorder died')
  t.same(report.duplicated, [], 'nothing duplicated')
  t.equal(report.outOfOrder, 0, 'in order')

  // The stream is ended in the store, its last event the error answer, and that is counted on B.
  const streamId = decodeEventId(resumes[0]?.lastEventId ?? '')?.streamId ?? ''
  const stored = await store.read(mcp.sessionId as string, streamId, 0, 100_000)
  const last = stored?.events[stored.events.length - 1]
  t.ok(stored?.state.ended, 'the stream is ended in the store')
  t.match(last?.data, /"error":\{"code":-32000,"message":"MCP gateway: the response to this request was lost/, 'its last event is the error answer')
  t.equal(stored?.events.filter(e => /MCP gateway: the response/.test(e.data ?? '')).length, 1, 'exactly one error answer')
  t.equal(await b.metric('mcpgw_gaps_total', { reason: 'recorder_lost' }), 1, 'counted: mcpgw_gaps_total{reason="recorder_lost"}')
  t.equal(b.logged(/replica recording this request stream died/).length, 1, 'logged once')

  // A resume after the end gets the end once more: the error answer.
  const lastId = resumes.flatMap(e => e.events).filter(e => e.id !== undefined).at(-1)?.id
  const again = await fetch(lb.url('/mcp'), {
    headers: { 'mcp-session-id': mcp.sessionId as string, 'last-event-id': lastId as string, 'mcp-protocol-version': mcp.protocolVersion as string, accept: 'text/event-stream' }
  })
  const text = await again.text()
  t.equal(again.status, 200, 'a resume past the error answer gets an SSE stream (a GET gets text/event-stream or 405)')
  t.match(text, /-32000/, 'with the error answer once more')
})
