// The standalone GET follows its session to a new upstream placement made by another
// replica. Two replicas on one Redis, two store-less SDK upstream endpoints. Replica A
// holds the session's upstream GET (its client is attached there); the endpoint holding
// the session stops accepting connections but keeps the GET open (a graceful
// server.close()), and a request through replica B establishes the session again on
// the other endpoint. A learns of it at its next lease renewal (the record names
// another upstream session) and moves its GET there: what the new upstream session
// sends on its standalone stream reaches the client.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGatewayOnRedis } from '../fixtures/gateway.js'
import { exchange, metricSum, metrics } from '../fixtures/hardening.js'
import { connectClient, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream, type RestartableUpstream } from '../fixtures/restartable-upstream.js'

const URI = 'test://followed-across'

function upstreamGets (upstream: RestartableUpstream, upstreamSessionId: string): number {
  return upstream.life.requests.filter(r => r.method === 'GET' && r.sessionId === upstreamSessionId).length
}

function updates (mcp: McpTestClient): unknown[] {
  return mcp.notifications.filter(n => n.method === 'notifications/resources/updated').map(n => (n.params as { uri: string }).uri)
}

t.test('re-established through another replica: the holder\'s GET moves at its next renewal', async t => {
  const upstreams = [await startRestartableUpstream({ resources: true }), await startRestartableUpstream({ resources: true })]
  for (const u of upstreams) t.teardown(() => u.close())
  const redis = await useRedis(t, 'follow-move-replicas')
  const upstreamUrl = upstreams.map(u => u.url).join(',')
  const env = { UPSTREAM_SET_ASIDE_SECONDS: '60', LEASE_TTL_MS: '1500' }
  const a = await startGatewayOnRedis(t, redis, upstreamUrl, env)
  const b = await startGatewayOnRedis(t, redis, upstreamUrl, env)
  const mcp = await connectClient(`${a.url}/mcp`)
  t.teardown(() => mcp.close())
  const sessionId = mcp.sessionId as string
  await mcp.client.subscribeResource({ uri: URI })
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'the client\'s GET is attached on replica A')

  const before = await a.store.getSession(sessionId)
  const holder = upstreams.find(u => new URL(u.url).origin === before?.endpoint) as RestartableUpstream
  const other = upstreams.find(u => u !== holder) as RestartableUpstream
  t.ok(holder !== undefined && other !== undefined, 'the session is placed on one of the two endpoints')
  t.ok(await waitUntil(() => upstreamGets(holder, before?.upstreamSessionId as string) > 0, 5000), 'A\'s upstream GET is open on the session\'s endpoint')

  holder.stopListening()
  await sleep(200)
  const call = await exchange(`${b.url}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 'through-b', method: 'tools/call', params: { name: 'echo', arguments: { text: 'via b' } } })
  })
  t.equal(call.status, 200, 'the call through replica B is answered')
  t.match(call.text, /via b/)
  const after = await a.store.getSession(sessionId)
  const newId = after?.upstreamSessionId as string
  t.equal(after?.endpoint, new URL(other.url).origin, 'replica B moved the record to the other endpoint')
  t.same(other.life.subscriptions, [{ uri: URI, sessionId: newId }], 'the subscription was replayed to the new upstream session')

  // A's lease renews every 500 ms: its GET moves then.
  t.ok(await waitUntil(() => upstreamGets(other, newId) > 0, 5000), 'a standalone GET is open on the new upstream session')
  await mcp.client.callTool({ name: 'update_subscribed', arguments: {} })
  t.ok(await waitUntil(() => updates(mcp).length === 1, 5000), 'the update the new upstream session sends on its standalone stream reaches the client on A')
  t.equal(upstreamGets(other, newId), 1, 'one GET on the new upstream session')
  const open = await Promise.all([a, b].map(async gw => metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_streams_open', { kind: 'standalone' })))
  t.same(open, [1, 0], 'A holds the one upstream GET: the old one aborted, B opened none')
})
