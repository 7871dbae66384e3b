// One name with two loopback addresses, two store-less SDK upstreams behind
// it (sessions in memory), gateway replicas on one Redis. An address leaves
// the DNS answer while its process keeps serving (a pod failing its readiness
// probe for a while): its sessions go on there through every replica, not
// only the one that placed them, and through a replica restarted since; none
// is established again elsewhere, which would drop what the upstream holds in
// memory for it.
import t, { type Test } from 'tap'
import { startBalancer, type Balancer } from '../fixtures/balancer.js'
import { startGatewayOnRedis, type RunningGateway } from '../fixtures/gateway.js'
import { prng, until } from '../fixtures/hardening.js'
import { connectClient, type McpTestClient } from '../fixtures/mcp-client.js'
import { freePort } from '../fixtures/net.js'
import { useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream, type RestartableUpstream } from '../fixtures/restartable-upstream.js'
import type { ResolvedAddress } from '../../src/upstream/discovery.js'

const SESSIONS = 6
const ADDRESSES = ['127.0.0.1', '127.0.0.2']

interface Scene {
  readonly upstreams: readonly [RestartableUpstream, RestartableUpstream]
  /** What the name resolves to now (TTL 1 s): the test changes it. */
  answer: readonly string[]
  startGateway (seed: number): Promise<RunningGateway>
}

async function scene (t: Test, label: string): Promise<Scene> {
  const port = await freePort()
  const upstreams = await Promise.all(ADDRESSES.map(async host => await startRestartableUpstream({ host, port }))) as [RestartableUpstream, RestartableUpstream]
  for (const u of upstreams) t.teardown(() => u.close())
  const redis = await useRedis(t, label)
  const upstreamUrl = `http://mcp.test:${port}/mcp`
  const s: Scene = {
    upstreams,
    answer: ADDRESSES,
    startGateway: async seed => await startGatewayOnRedis(t, redis, upstreamUrl, {}, {
      placementRandom: prng(seed),
      resolveHost: async (): Promise<ResolvedAddress[]> => s.answer.map(address => ({ address, ttl: 1 }))
    })
  }
  return s
}

/** Clients through the balancer, a new connection per request. */
async function clientsThrough (t: Test, balancer: Balancer): Promise<McpTestClient[]> {
  const clients: McpTestClient[] = []
  for (let i = 0; i < SESSIONS; i++) {
    const mcp = await connectClient(balancer.url('/mcp'), { agentOptions: { pipelining: 0 } })
    t.teardown(() => mcp.close())
    clients.push(mcp)
  }
  return clients
}

/** Each client calls `echo` once; how many answered right. */
async function callAll (clients: readonly McpTestClient[], round: string): Promise<number> {
  const answered = await Promise.all(clients.map(async (mcp, i) => {
    try {
      const result = await mcp.client.callTool({ name: 'echo', arguments: { text: `${round} ${i}` } })
      return (result.content as Array<{ text?: string }>)[0]?.text === `${round} ${i}` ? 1 : 0
    } catch {
      return 0
    }
  }))
  return answered.reduce((a: number, b: number) => a + b, 0)
}

function holds (upstream: RestartableUpstream, client: McpTestClient): boolean {
  return upstream.life.initialized.some(id => (client.sessionId as string).endsWith(`.${id}`))
}

async function endpointState (gateway: RunningGateway, endpoint: string): Promise<string | undefined> {
  const body = await (await fetch(`${gateway.adminUrl}/upstreamz`)).json() as { endpoints: Array<{ endpoint: string, state: string }> }
  return body.endpoints.find(e => e.endpoint === endpoint)?.state
}

/** The second address leaves the answer; resolves once every gateway took it out of rotation. */
async function secondLeaves (t: Test, s: Scene, gateways: readonly RunningGateway[]): Promise<void> {
  const leaving = new URL(s.upstreams[1].url).origin
  s.answer = ADDRESSES.slice(0, 1)
  for (const g of gateways) t.ok(await until(async () => await endpointState(g, leaving) !== 'healthy', 5000), `${g.url}: ${leaving} out of rotation`)
}

/** Every client calls once more: answered, each on the upstream session it had. */
async function callsStayPut (t: Test, s: Scene, clients: readonly McpTestClient[]): Promise<void> {
  const [, leaving] = s.upstreams
  const onLeaving = clients.filter(c => holds(leaving, c))
  t.ok(onLeaving.length >= 1, `${onLeaving.length} session(s) on the leaving address`)
  const initialized = s.upstreams.map(u => u.life.initialized.length)
  const seen = leaving.life.requests.length
  t.equal(await callAll(clients, 'after'), SESSIONS, 'every call answered')
  t.same(s.upstreams.map(u => u.life.initialized.length), initialized, 'no session established again on either upstream')
  t.ok(leaving.life.requests.length - seen >= onLeaving.length, 'the leaving address still served its sessions')
}

t.test('an address leaving the answer, its sessions placed by another replica: they go on there', async t => {
  const s = await scene(t, 'upleave-replicas')
  const placing = await s.startGateway(1)
  const other = await s.startGateway(2)
  const balancer = await startBalancer([placing.port])
  t.teardown(() => balancer.close())
  const clients = await clientsThrough(t, balancer)
  t.equal(await callAll(clients, 'before'), SESSIONS)

  await secondLeaves(t, s, [placing, other])
  t.equal(await endpointState(other, new URL(s.upstreams[1].url).origin), 'leaving', 'the other replica keeps it, leaving')
  balancer.setBackends([other.port])
  await callsStayPut(t, s, clients)
})

t.test('an address leaving the answer right after a gateway restart: the sessions placed before go on there', async t => {
  const s = await scene(t, 'upleave-restart')
  const before = await s.startGateway(1)
  const balancer = await startBalancer([before.port])
  t.teardown(() => balancer.close())
  const clients = await clientsThrough(t, balancer)
  t.equal(await callAll(clients, 'before'), SESSIONS)

  await before.close()
  const after = await s.startGateway(1)
  balancer.setBackends([after.port])
  await secondLeaves(t, s, [after])
  await callsStayPut(t, s, clients)
})
