// Several upstream endpoints behind one gateway: three store-less SDK servers,
// named as a list in UPSTREAM_URL or as one name with three addresses. New
// sessions spread over all three and every request of a session reaches the
// endpoint that holds it (any other would answer 404); requests without a
// session are balanced; an endpoint stopped for good is set aside, shown by
// /upstreamz, and new sessions and requests go to the others.
import t, { type Test } from 'tap'
import { pino } from 'pino'
import { startExampleServer, type ExampleServer } from '../../examples/mcp-server.js'
import { buildGateway } from '../../src/server.js'
import type { ResolvedAddress } from '../../src/upstream/discovery.js'
import { exampleSessions } from '../fixtures/example-sessions.js'
import { makeStore, testConfig } from '../fixtures/gateway.js'
import { prng } from '../fixtures/hardening.js'
import { connectClient, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { freePort } from '../fixtures/net.js'

interface Upstream {
  readonly server: ExampleServer
  /** Session ids this upstream initialized. */
  readonly sessions: Set<string>
}

async function startUpstream (t: Test, options: { host?: string, port?: number } = {}): Promise<Upstream> {
  const { initialized, logger } = exampleSessions()
  const server = await startExampleServer({ ...options, logger })
  t.teardown(() => server.close())
  return { server, sessions: initialized }
}

/** Whether the upstream issued the session the client holds (the gateway's id ends with the upstream's first id). */
function holds (upstream: Upstream, client: McpTestClient): boolean {
  return [...upstream.sessions].some(id => (client.sessionId as string).endsWith(`.${id}`))
}

async function startGateway (t: Test, upstreamUrl: string, resolveHost?: (name: string) => Promise<readonly ResolvedAddress[]>): Promise<{ url: string, adminUrl: string }> {
  const config = testConfig(upstreamUrl, { UPSTREAM_SET_ASIDE_SECONDS: '60' })
  const store = await makeStore(t, 'memory', config)
  const gateway = await buildGateway(config, { store, logger: pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' }), placementRandom: prng(7), ...(resolveHost !== undefined && { resolveHost }) })
  t.teardown(() => gateway.close())
  return await gateway.listen()
}

/** `count` SDK clients, each initialized and calling a tool `calls` times. */
async function sessions (t: Test, url: string, count: number, calls: number): Promise<McpTestClient[]> {
  const clients: McpTestClient[] = []
  for (let i = 0; i < count; i++) {
    const client = await connectClient(`${url}/mcp`)
    t.teardown(() => client.close())
    clients.push(client)
  }
  let ok = 0
  for (let n = 0; n < calls; n++) {
    await Promise.all(clients.map(async (c, i) => {
      const result = await c.client.callTool({ name: 'echo', arguments: { text: `${i}.${n}` } })
      if ((result.content as Array<{ text: string }>)[0]?.text === `${i}.${n}`) ok++
    }))
  }
  t.equal(ok, count * calls, `every call of every session answered (${ok}/${count * calls})`)
  return clients
}

interface UpstreamzBody { status: string, endpoints: Array<{ endpoint: string, state: string, sessionsPlaced: number, until?: string }> }

async function upstreamz (adminUrl: string): Promise<UpstreamzBody> {
  return await (await fetch(`${adminUrl}/upstreamz`)).json() as UpstreamzBody
}

/** The upstream that answered a request without a session: the resource its metadata names (from the Host it saw). */
async function resourceOf (url: string): Promise<string> {
  const res = await fetch(`${url}/.well-known/oauth-protected-resource`)
  return (await res.json() as { resource: string }).resource
}

t.test('a list of three endpoints: sessions spread and kept, requests without a session balanced, a stopped endpoint set aside', async t => {
  const upstreams = await Promise.all([0, 1, 2].map(async () => await startUpstream(t)))
  const gw = await startGateway(t, upstreams.map(u => u.server.url).join(','))

  const clients = await sessions(t, gw.url, 9, 3)
  t.same(upstreams.map(u => u.sessions.size > 0), [true, true, true], `sessions on all three: ${upstreams.map(u => u.sessions.size).join(', ')}`)
  t.equal(upstreams.reduce((n, u) => n + u.sessions.size, 0), 9, 'one upstream session per client session')
  for (const c of clients) t.equal(upstreams.filter(u => holds(u, c)).length, 1)

  const answered = await Promise.all([0, 1, 2, 3, 4, 5].map(async () => await resourceOf(gw.url)))
  const byUpstream = upstreams.map(u => answered.filter(r => r === u.server.url).length)
  t.same(byUpstream, [2, 2, 2], 'round robin over the three')
  t.match(await upstreamz(gw.adminUrl), { status: 'reachable', endpoints: upstreams.map(u => ({ endpoint: new URL(u.server.url).origin, state: 'healthy', sessionsPlaced: u.sessions.size })) })

  // One endpoint gone for good.
  const [stopped, ...others] = upstreams as [Upstream, Upstream, Upstream]
  await stopped.server.close()
  const afterStop = await Promise.all([0, 1, 2, 3, 4, 5].map(async () => await resourceOf(gw.url)))
  t.same([...new Set(afterStop)].sort(), others.map(u => u.server.url).sort(), 'requests without a session: all answered, by the two others')
  const status = await upstreamz(gw.adminUrl)
  t.match(status.endpoints.find(e => e.endpoint === new URL(stopped.server.url).origin), { state: 'set_aside', until: String }, '/upstreamz: set aside')
  t.equal(status.endpoints.filter(e => e.state === 'healthy').length, 2)
  const metrics = await (await fetch(`${gw.adminUrl}/metrics`)).text()
  t.match(metrics, /^mcpgw_upstream_endpoints\{state="set_aside"\} 1$/m, 'metrics: one endpoint set aside')
  t.match(metrics, /^mcpgw_upstream_endpoints\{state="healthy"\} 2$/m)
  for (const u of upstreams) {
    t.match(metrics, new RegExp(`^mcpgw_upstream_endpoint_sessions_placed_total\\{endpoint="${new URL(u.server.url).origin}"\\} ${u.sessions.size}$`, 'm'), 'sessions placed, per endpoint')
  }

  const before = others.map(u => u.sessions.size)
  const fresh = await sessions(t, gw.url, 6, 2)
  // At least the six new ones: the stopped endpoint's sessions may be established there again meanwhile.
  t.ok(others.reduce((n, u) => n + u.sessions.size, 0) - before.reduce((a, b) => a + b) >= 6, 'new sessions all on the two others')
  t.ok(fresh.every(c => others.some(u => holds(u, c))))
  const kept = clients.filter(c => others.some(u => holds(u, c)))
  const results = await Promise.allSettled(kept.map(async c => await c.client.callTool({ name: 'echo', arguments: { text: 'still' } })))
  t.equal(results.filter(r => r.status === 'fulfilled').length, kept.length, 'sessions on the endpoints still up go on')
})

t.test('one name with three loopback addresses: each address an endpoint, the name sent as Host, re-resolved at the TTL', async t => {
  // Linux routes all of 127/8 to loopback: three servers on one port.
  const port = await freePort()
  const addresses = ['127.0.0.1', '127.0.0.2', '127.0.0.3']
  const upstreams = await Promise.all(addresses.map(async host => await startUpstream(t, { host, port })))
  let answer = addresses
  const asked: string[] = []
  const resolver = async (name: string): Promise<ResolvedAddress[]> => {
    asked.push(name)
    return answer.map(address => ({ address, ttl: 1 }))
  }
  const gw = await startGateway(t, `http://mcp.test:${port}/mcp`, resolver)
  t.same(asked, ['mcp.test'], 'resolved before serving')

  await sessions(t, gw.url, 9, 2)
  t.same(upstreams.map(u => u.sessions.size > 0), [true, true, true], `sessions on all three: ${upstreams.map(u => u.sessions.size).join(', ')}`)
  t.equal(await resourceOf(gw.url), `http://mcp.test:${port}/mcp`, 'the upstream sees the name as Host, as with one address')
  t.same((await upstreamz(gw.adminUrl)).endpoints.map(e => [e.endpoint, e.state]), addresses.map(a => [`http://${a}:${port}`, 'healthy']), '/upstreamz: one endpoint per address')

  answer = addresses.slice(0, 2)
  t.ok(await waitUntil(() => asked.length >= 2, 5000), 'resolved again once the TTL ran out')
  // The resolver was asked; its answer is applied once the lookup settles.
  const stateOfThird = async (): Promise<string | undefined> => (await upstreamz(gw.adminUrl)).endpoints.find(e => e.endpoint === `http://127.0.0.3:${port}`)?.state
  for (const deadline = Date.now() + 5000; await stateOfThird() !== 'leaving' && Date.now() < deadline;) await new Promise(resolve => setTimeout(resolve, 20))
  t.equal(await stateOfThird(), 'leaving', 'an address the answer no longer lists is leaving')
  t.match(await (await fetch(`${gw.adminUrl}/metrics`)).text(), /^mcpgw_upstream_endpoints\{state="leaving"\} 1$/m)
  const before = upstreams.map(u => u.sessions.size)
  await sessions(t, gw.url, 4, 1)
  t.equal(upstreams[2]?.sessions.size, before[2], 'no new session on a leaving endpoint')
})
