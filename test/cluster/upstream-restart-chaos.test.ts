// A store-less SDK upstream restarted three times, a second or two apart, behind two
// gateway replicas without stickiness, while every client calls a tool again and again
// (the SDK client, default options). Calls that meet the upstream between two lives may
// fail, retryably (502 or 503); what must never happen is a session lost: no client is
// told 404, each keeps its session, the upstream's last life has every session once
// (with its log level), and what that life sends on each standalone stream arrives.
// CHAOS_SESSIONS sets the number of sessions (all in this process: a hundred make it a
// load test).
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startBalancer } from '../fixtures/balancer.js'
import { startGatewayOnRedis } from '../fixtures/gateway.js'
import { metricSum, metrics } from '../fixtures/hardening.js'
import { connectClient, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream } from '../fixtures/restartable-upstream.js'

const SESSIONS = Number(process.env.CHAOS_SESSIONS ?? 30)
const RESTART_DELAYS_MS = [1500, 2300, 1800]

function standaloneTexts (mcp: McpTestClient): unknown[] {
  return mcp.notifications.filter(n => n.method === 'notifications/message' && (n.params as { logger?: string }).logger === 'standalone').map(n => (n.params as { data: unknown }).data)
}

t.test(`${SESSIONS} sessions, two replicas, the upstream restarted ${RESTART_DELAYS_MS.length} times under continuous calls: no session lost`, async t => {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const redis = await useRedis(t, 'restart-chaos')
  const env = { INITIALIZES_PER_MINUTE_PER_ADDRESS: String(SESSIONS), MAX_CONNECTIONS_PER_ADDRESS: String(100 * SESSIONS) }
  const replicas = [await startGatewayOnRedis(t, redis, upstream.url, env), await startGatewayOnRedis(t, redis, upstream.url, env)]
  const balancer = await startBalancer(replicas.map(r => r.port))
  t.teardown(() => balancer.close())
  const clients: McpTestClient[] = []
  t.teardown(async () => { await Promise.all(clients.map(async c => await c.close())) })
  // A new connection per request: the balancer alternates them between the replicas.
  for (let i = 0; i < SESSIONS; i++) clients.push(await connectClient(balancer.url('/mcp'), { agentOptions: { pipelining: 0 } }))
  const ids = clients.map(c => c.sessionId)
  await Promise.all(clients.map(async c => await c.client.setLoggingLevel('warning')))

  const run = { calling: true }
  let answered = 0
  const failures: string[] = []
  const loops = clients.map(async (c, i) => {
    for (let n = 0; run.calling; n++) {
      try {
        const result = await c.client.callTool({ name: 'echo', arguments: { text: `${i}.${n}` } })
        if ((result.content as Array<{ text?: string }>)[0]?.text === `${i}.${n}`) answered++
        else failures.push(`wrong answer: ${JSON.stringify(result.content)}`)
      } catch (err) {
        failures.push(String(err))
      }
      await sleep(20)
    }
  })
  for (const delay of RESTART_DELAYS_MS) {
    await sleep(delay)
    await upstream.restart()
  }
  await sleep(2000)
  run.calling = false
  await Promise.all(loops)

  t.ok(answered > SESSIONS * RESTART_DELAYS_MS.length, `calls answered throughout (${answered}; ${failures.length} failed)`)
  const unexpected = failures.filter(f => !/Bad Gateway: the upstream MCP server could not be reached|could not establish it there again yet/.test(f))
  t.same(unexpected, [], 'a call that failed met the upstream between two lives, and was told to retry (502 or 503)')
  t.same(clients.flatMap((c, i) => c.exchanges.filter(e => e.status === 404).map(e => `${i}: ${e.method}`)), [], 'no client was ever told its session is gone')
  t.same(clients.map(c => c.sessionId), ids, 'every client kept its session')
  t.equal(new Set(upstream.life.initialized).size, SESSIONS, 'the upstream\'s last life holds every session once')
  t.equal(upstream.life.levels.filter(l => l === 'warning').length, SESSIONS, 'each with its log level')

  await Promise.all(clients.map(async (c, i) => await c.client.callTool({ name: 'notify_standalone', arguments: { text: `last ${i}` } })))
  t.ok(await waitUntil(() => clients.every((c, i) => standaloneTexts(c).includes(`last ${i}`)), 15_000),
    `what the last life sent on each standalone stream arrived (${clients.filter((c, i) => standaloneTexts(c).includes(`last ${i}`)).length} of ${SESSIONS})`)

  const texts = await Promise.all(replicas.map(async r => await metrics(r.adminUrl)))
  const count = (outcome: string): number => texts.reduce((n, text) => n + metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome }), 0)
  t.equal(count('failed') + count('incompatible') + count('unrecorded'), 0, 'no re-establishment ended a session')
  t.ok(count('reestablished') >= SESSIONS, `re-establishments: ${count('reestablished')} done, ${count('joined')} joined, ${count('unavailable')} unavailable, ${count('timed_out')} timed out`)
})
