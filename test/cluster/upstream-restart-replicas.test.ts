// Two gateway replicas on one Redis, no stickiness (each request to the next
// replica), a store-less SDK upstream restarted under a session: the session is
// established upstream again once (the fence in the store), and both replicas
// go on with the new upstream session from the shared record; the new upstream
// session's standalone GET is open before a call that met the loss is sent again.
import t from 'tap'
import { startReplicas, type RunningGateway } from '../fixtures/gateway.js'
import { metricSum, metrics } from '../fixtures/hardening.js'
import { connectClient, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream } from '../fixtures/restartable-upstream.js'

function standaloneTexts (mcp: McpTestClient): unknown[] {
  return mcp.notifications.filter(n => n.method === 'notifications/message' && (n.params as { logger?: string }).logger === 'standalone').map(n => (n.params as { data: unknown }).data)
}

async function echo (mcp: McpTestClient, text: string): Promise<unknown> {
  return (await mcp.client.callTool({ name: 'echo', arguments: { text } })).content
}

t.test('two replicas, requests alternating, upstream restarted: one re-establishment, both replicas use it', async t => {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const redis = await useRedis(t, 'reest')
  const { replicas, balancer } = await startReplicas(t, redis, upstream.url, 2)
  const [a, b] = replicas as [RunningGateway, RunningGateway]
  // A new connection per request: the balancer alternates them between the replicas.
  const mcp = await connectClient(balancer.url('/mcp'), { agentOptions: { pipelining: 0 } })
  t.teardown(() => mcp.close())
  const sessionId = mcp.sessionId as string
  t.same(await echo(mcp, 'before'), [{ type: 'text', text: 'before' }])

  await upstream.restart()
  const before = balancer.history.length
  // Two calls at once, on two replicas: both meet the upstream's 404.
  const answers = await Promise.all(['x', 'y', 'z', 'w'].map(async text => await echo(mcp, text)))
  t.same(answers, ['x', 'y', 'z', 'w'].map(text => [{ type: 'text', text }]), 'every call after the restart succeeds')
  for (let i = 0; i < 4; i++) t.same(await echo(mcp, `then ${i}`), [{ type: 'text', text: `then ${i}` }], `call ${i} after`)
  const after = balancer.history.slice(before)
  t.ok(after.includes(a.port) && after.includes(b.port), 'requests went to both replicas after the restart')
  t.equal(upstream.life.initialized.length, 1, 'the new upstream got one initialize for the session')
  const upstreamId = upstream.life.initialized[0]
  t.equal((await a.store.getSession(sessionId))?.upstreamSessionId, upstreamId, 'the shared record points at it')
  const calls = upstream.life.requests.filter(r => r.method === 'tools/call')
  t.equal(calls.filter(r => r.sessionId === upstreamId).length, 8, 'each call executed once, on the new upstream session, from either replica')
  t.ok(calls.filter(r => r.sessionId !== upstreamId).length <= 4, 'the old upstream id only on the calls that met the 404 (at most the first four)')
  const counts = await Promise.all([a, b].map(async gw => await metrics(gw.adminUrl)))
  const sum = (outcome: string): number => counts.reduce((n, text) => n + metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome }), 0)
  t.equal(sum('reestablished'), 1, 'one re-establishment across both replicas')
  t.equal(sum('failed') + sum('timed_out') + sum('incompatible'), 0, 'none failed')
  t.equal(mcp.sessionId, sessionId, 'the same client session')
})

t.test('two replicas, 20 sessions, upstream restarted: what each new upstream session sends on its standalone stream right after the first call reaches its client', async t => {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const SESSIONS = 20
  const redis = await useRedis(t, 'reest-notify')
  const env = { INITIALIZES_PER_MINUTE_PER_ADDRESS: String(SESSIONS), MAX_CONNECTIONS_PER_ADDRESS: String(10 * SESSIONS) }
  const { replicas, balancer } = await startReplicas(t, redis, upstream.url, 2, env)
  const clients: McpTestClient[] = []
  t.teardown(async () => { await Promise.all(clients.map(async c => await c.close())) })
  for (let i = 0; i < SESSIONS; i++) clients.push(await connectClient(balancer.url('/mcp'), { agentOptions: { pipelining: 0 } }))
  t.ok(await waitUntil(() => clients.every(c => c.exchanges.some(e => e.method === 'GET' && e.status === 200)), 20_000), 'every standalone GET is open')
  await upstream.restart()
  // Each client's first call meets the loss (on either replica); its second asks the new
  // upstream session to send on the standalone stream, before the client's own GET is back.
  const answers = await Promise.allSettled(clients.map(async (c, i) => {
    const echoed = await c.client.callTool({ name: 'echo', arguments: { text: `after ${i}` } })
    await c.client.callTool({ name: 'notify_standalone', arguments: { text: `standalone ${i}` } })
    return echoed.content
  }))
  t.same(answers.flatMap((x, i) => x.status === 'rejected' ? [`${i}: ${String(x.reason)}`] : []), [], 'every call answered')
  const arrived = await waitUntil(() => clients.every((c, i) => standaloneTexts(c).includes(`standalone ${i}`)), 20_000)
  t.ok(arrived, `every notification reached its client (${clients.filter((c, i) => standaloneTexts(c).includes(`standalone ${i}`)).length} of ${SESSIONS})`)
  const counts = await Promise.all(replicas.map(async gw => await metrics(gw.adminUrl)))
  const sum = (outcome: string): number => counts.reduce((n, text) => n + metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome }), 0)
  t.equal(sum('reestablished'), SESSIONS, 'one re-establishment per session')
  t.equal(sum('failed') + sum('timed_out') + sum('incompatible'), 0, 'none failed')
})
