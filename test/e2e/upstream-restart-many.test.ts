// Many sessions through one upstream restart: a deploy of a store-less SDK server
// forgets every session at once, and every client's next call meets the new
// server. Each session is established again exactly once, every call is
// answered, and the new upstream session's standalone GET is open before the
// call that met the loss is sent again: what that call makes the upstream send
// on the standalone stream (an SDK server drops it while no GET is open)
// reaches the client, although the client's own GET was cut with the old
// upstream and has not come back yet. The SDK client at its default options.
// RESTART_SESSIONS sets the number of sessions (the upstream, the clients and
// the gateway share this process: a few hundred make it a load test).
import t from 'tap'
import { startGateway, startGatewayOnRedis } from '../fixtures/gateway.js'
import { metricSum, metrics } from '../fixtures/hardening.js'
import { connectClient, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream } from '../fixtures/restartable-upstream.js'

const SESSIONS = Number(process.env.RESTART_SESSIONS ?? 40)

function standaloneTexts (mcp: McpTestClient): unknown[] {
  return mcp.notifications.filter(n => n.method === 'notifications/message' && (n.params as { logger?: string }).logger === 'standalone').map(n => (n.params as { data: unknown }).data)
}

for (const kind of ['memory', 'redis'] as const) {
  t.test(`${kind} store: ${SESSIONS} sessions through an upstream restart: each established again once, its standalone GET open before the call is sent again`, async t => {
    const upstream = await startRestartableUpstream()
    t.teardown(() => upstream.close())
    const env = { INITIALIZES_PER_MINUTE_PER_ADDRESS: String(SESSIONS), MAX_CONNECTIONS_PER_ADDRESS: String(10 * SESSIONS) }
    const gw = kind === 'memory'
      ? await startGateway(t, 'memory', upstream.url, env)
      : await startGatewayOnRedis(t, await useRedis(t, 'restart-many'), upstream.url, env)
    const clients: McpTestClient[] = []
    t.teardown(async () => { await Promise.all(clients.map(async c => await c.close())) })
    for (let i = 0; i < SESSIONS; i += 20) {
      clients.push(...await Promise.all(Array.from({ length: Math.min(20, SESSIONS - i) }, async () => await connectClient(`${gw.url}/mcp`))))
    }
    t.ok(await waitUntil(() => clients.every(c => c.exchanges.some(e => e.method === 'GET' && e.status === 200)), 20_000), 'every standalone GET is open')
    await Promise.all(clients.map(async (c, i) => await c.client.setLoggingLevel(i % 2 === 0 ? 'warning' : 'error')))

    const started = Date.now()
    await upstream.restart()
    // Each client's first call meets the loss; its second asks the upstream to send on the
    // standalone stream at once, without waiting for the client's own GET to come back.
    const answers = await Promise.allSettled(clients.map(async (c, i) => {
      const echoed = await c.client.callTool({ name: 'echo', arguments: { text: `after ${i}` } })
      await c.client.callTool({ name: 'notify_standalone', arguments: { text: `standalone ${i}` } })
      return echoed.content
    }))
    const failed = answers.flatMap((a, i) => a.status === 'rejected' ? [`${i}: ${String(a.reason)}`] : [])
    t.same(failed, [], 'every call after the restart was answered')
    t.same(answers.map(a => a.status === 'fulfilled' ? a.value : undefined), clients.map((_, i) => [{ type: 'text', text: `after ${i}` }]), 'each with its own answer')
    t.comment(`${2 * SESSIONS} calls answered ${Date.now() - started} ms after the restart began`)
    t.equal(upstream.life.initialized.length, SESSIONS, 'the new upstream got one initialize per session')
    t.equal(upstream.life.levels.filter(l => l === 'warning').length, SESSIONS / 2, 'and each session\'s log level again')
    t.ok(clients.every(c => !c.exchanges.some(e => e.status === 404)), 'no client was told its session is gone')

    const arrived = await waitUntil(() => clients.every((c, i) => standaloneTexts(c).includes(`standalone ${i}`)), 20_000)
    t.ok(arrived, `every client's standalone stream got what the new upstream session sent on it (${clients.filter((c, i) => standaloneTexts(c).includes(`standalone ${i}`)).length} of ${SESSIONS})`)

    const text = await metrics(gw.adminUrl)
    t.equal(metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'reestablished' }), SESSIONS, 'one re-establishment per session')
    t.equal(metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'failed' }), 0, 'none failed')
  })
}
