// The standalone GET follows its session to a new upstream placement. Two store-less SDK
// servers behind one gateway; the one holding the session stops accepting connections
// but keeps those it has (a graceful server.close(), as a pod being terminated does), so
// the gateway's GET on the old upstream session stays open and never ends into a resume.
// The session is established again on the other endpoint (its resource subscription
// replayed there): the gateway's GET must move to the new upstream session, or the SDK
// server drops what that session sends on its standalone stream (no GET open).
import t, { type Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGateway, startGatewayOnRedis, type RunningGateway } from '../fixtures/gateway.js'
import { metricSum, metrics } from '../fixtures/hardening.js'
import { connectClient, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream, type RestartableUpstream } from '../fixtures/restartable-upstream.js'

const URI = 'test://followed'

async function gatewayFor (t: Test, kind: 'memory' | 'redis', upstreamUrl: string): Promise<RunningGateway> {
  const env = { UPSTREAM_SET_ASIDE_SECONDS: '60' }
  if (kind === 'memory') return await startGateway(t, 'memory', upstreamUrl, env)
  return await startGatewayOnRedis(t, await useRedis(t, 'follow-move'), upstreamUrl, env)
}

function upstreamGets (upstream: RestartableUpstream, upstreamSessionId: string): number {
  return upstream.life.requests.filter(r => r.method === 'GET' && r.sessionId === upstreamSessionId).length
}

function updates (mcp: McpTestClient): unknown[] {
  return mcp.notifications.filter(n => n.method === 'notifications/resources/updated').map(n => (n.params as { uri: string }).uri)
}

function standaloneTexts (mcp: McpTestClient): unknown[] {
  return mcp.notifications.filter(n => n.method === 'notifications/message' && (n.params as { logger?: string }).logger === 'standalone').map(n => (n.params as { data: unknown }).data)
}

for (const kind of ['memory', 'redis'] as const) {
  t.test(`${kind} store: the endpoint holding the session closes gracefully; the GET moves with the session`, async t => {
    const upstreams = [await startRestartableUpstream({ resources: true }), await startRestartableUpstream({ resources: true })]
    for (const u of upstreams) t.teardown(() => u.close())
    const gw = await gatewayFor(t, kind, upstreams.map(u => u.url).join(','))
    const mcp = await connectClient(`${gw.url}/mcp`)
    t.teardown(() => mcp.close())
    const sessionId = mcp.sessionId as string
    await mcp.client.subscribeResource({ uri: URI })
    t.same((await mcp.client.callTool({ name: 'echo', arguments: { text: 'before' } })).content, [{ type: 'text', text: 'before' }], 'a call before')

    const before = await gw.store.getSession(sessionId)
    const holder = upstreams.find(u => new URL(u.url).origin === before?.endpoint) as RestartableUpstream
    const other = upstreams.find(u => u !== holder) as RestartableUpstream
    t.ok(holder !== undefined && other !== undefined, 'the session is placed on one of the two endpoints')
    const oldId = before?.upstreamSessionId as string
    t.ok(await waitUntil(() => upstreamGets(holder, oldId) > 0, 5000), 'the gateway\'s standalone GET is open on the session\'s endpoint')
    t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'and the client\'s GET is attached')
    await mcp.client.callTool({ name: 'update_subscribed', arguments: {} })
    t.ok(await waitUntil(() => updates(mcp).length === 1, 5000), 'an update of the old upstream session reaches the client')

    holder.stopListening()
    // The gateway sees its idle connections to that endpoint closed before its next request.
    await sleep(200)
    t.same((await mcp.client.callTool({ name: 'echo', arguments: { text: 'after' } })).content, [{ type: 'text', text: 'after' }], 'the call after: the session established again on the other endpoint')
    const after = await gw.store.getSession(sessionId)
    const newId = after?.upstreamSessionId as string
    t.equal(after?.endpoint, new URL(other.url).origin, 'the record moved to the other endpoint')
    t.same(other.life.subscriptions, [{ uri: URI, sessionId: newId }], 'the subscription was replayed to the new upstream session')

    t.ok(await waitUntil(() => upstreamGets(other, newId) > 0, 5000), 'a standalone GET is open on the new upstream session')
    await mcp.client.callTool({ name: 'update_subscribed', arguments: {} })
    t.ok(await waitUntil(() => updates(mcp).length === 2, 5000), 'the update the new upstream session sends on its standalone stream reaches the client')
    t.same(updates(mcp), [URI, URI])
    await mcp.client.callTool({ name: 'notify_standalone', arguments: { text: 'moved' } })
    t.ok(await waitUntil(() => standaloneTexts(mcp).includes('moved'), 5000), 'so does a log message')

    const text = await metrics(gw.adminUrl)
    t.equal(metricSum(text, 'mcpgw_upstream_streams_open', { kind: 'standalone' }), 1, 'one upstream GET open: the new session\'s, the old one aborted')
    t.equal(metricSum(text, 'mcpgw_gaps_total'), 0, 'no gap recorded: the old upstream session was left, not cut off in the middle')
    t.equal(upstreamGets(other, newId), 1, 'the new upstream session got one GET')
  })
}
