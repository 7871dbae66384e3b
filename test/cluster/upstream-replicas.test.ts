// Three store-less SDK upstream replicas named as a list in UPSTREAM_URL,
// behind two gateway replicas on one Redis, each client request to the next
// gateway (no stickiness): every request of a session reaches the upstream
// that holds it, from either gateway (any other would answer 404). One
// upstream replica stopped for good: the sessions it held are established
// again on the others and their clients notice nothing.
import t from 'tap'
import { startBalancer } from '../fixtures/balancer.js'
import { startGatewayOnRedis } from '../fixtures/gateway.js'
import { metricSum, metrics, prng } from '../fixtures/hardening.js'
import { connectClient, type McpTestClient } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream, type RestartableUpstream } from '../fixtures/restartable-upstream.js'

const SESSIONS = 6
const CALLS = 3

/** Each session calls `echo` CALLS times in turn, all sessions at once; the answers that came back right. */
async function callAll (clients: readonly McpTestClient[], round: string): Promise<number> {
  const answered = await Promise.all(clients.map(async (mcp, i) => {
    let ok = 0
    for (let n = 0; n < CALLS; n++) {
      const text = `${round} ${i}.${n}`
      try {
        const result = await mcp.client.callTool({ name: 'echo', arguments: { text } })
        if ((result.content as Array<{ text?: string }>)[0]?.text === text) ok++
      } catch {}
    }
    return ok
  }))
  return answered.reduce((a, b) => a + b, 0)
}

/** Whether the upstream issued the session the client holds (the gateway's id ends with the upstream's first id). */
function holds (upstream: RestartableUpstream, client: McpTestClient): boolean {
  return upstream.life.initialized.some(id => (client.sessionId as string).endsWith(`.${id}`))
}

t.test('three upstream replicas behind two gateways, requests alternating: sessions spread, one replica stopped for good, no call fails', async t => {
  const upstreams = await Promise.all([0, 1, 2].map(async () => await startRestartableUpstream()))
  for (const u of upstreams) t.teardown(() => u.close())
  const redis = await useRedis(t, 'upreplicas')
  const upstreamUrl = upstreams.map(u => u.url).join(',')
  // Seeded placement: the same spread at every run.
  const gateways = [
    await startGatewayOnRedis(t, redis, upstreamUrl, {}, { placementRandom: prng(1) }),
    await startGatewayOnRedis(t, redis, upstreamUrl, {}, { placementRandom: prng(2) })
  ]
  const balancer = await startBalancer(gateways.map(g => g.port))
  t.teardown(() => balancer.close())

  const clients: McpTestClient[] = []
  for (let i = 0; i < SESSIONS; i++) {
    // A new connection per request: the balancer alternates them between the gateways.
    const mcp = await connectClient(balancer.url('/mcp'), { agentOptions: { pipelining: 0 } })
    t.teardown(() => mcp.close())
    clients.push(mcp)
  }
  const ids = clients.map(c => c.sessionId)

  t.equal(await callAll(clients, 'before'), SESSIONS * CALLS, 'every call before the stop answered')
  const initialized = upstreams.map(u => u.life.initialized.length)
  t.ok(initialized.every(n => n >= 1), `sessions on all three upstreams: ${initialized.join(', ')}`)
  t.equal(initialized.reduce((a, b) => a + b, 0), SESSIONS, 'one upstream session per client session')
  t.ok(gateways.every(g => balancer.history.includes(g.port)), 'requests went to both gateways')

  // One upstream replica gone for good.
  const [stopped, ...others] = upstreams as [RestartableUpstream, RestartableUpstream, RestartableUpstream]
  const orphans = clients.filter(c => holds(stopped, c))
  t.ok(orphans.length >= 1, `the stopped upstream held ${orphans.length} session(s)`)
  await stopped.close()
  const stoppedSaw = stopped.life.requests.length
  const othersInitialized = others.map(u => u.life.initialized.length)

  t.equal(await callAll(clients, 'after'), SESSIONS * CALLS, 'every call after the stop answered, the stopped upstream\'s sessions included')
  t.same(clients.map(c => c.sessionId), ids, 'every client kept its session')
  t.equal(stopped.life.requests.length, stoppedSaw, 'the stopped upstream got nothing more')
  const reinitialized = others.reduce((n, u, i) => n + u.life.initialized.length - (othersInitialized[i] as number), 0)
  t.equal(reinitialized, orphans.length, 'its sessions established again on the others, once each')

  const texts = await Promise.all(gateways.map(async g => await metrics(g.adminUrl)))
  const count = (outcome: string): number => texts.reduce((n, text) => n + metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome }), 0)
  t.ok(count('reestablished') > 0, `re-establishments counted on the gateways: ${count('reestablished')}`)
  t.equal(count('reestablished'), orphans.length, 'one per session the stopped upstream held, across both gateways')
})
