// An upstream session left behind by a move. Two store-less SDK servers as the
// upstream's endpoints; the first is reached through a relay that can refuse
// connections while its server, and the sessions it holds, live on. A session
// there whose next request is refused is established again on the other
// endpoint, and goes on there. The old upstream session still lives where it
// was: once its endpoint takes connections again, the gateway deletes it (an
// SDK server keeps a session until told). A session the upstream said it lost
// (404 after a restart) leaves nothing behind to delete.
import t, { type Test } from 'tap'
import { pino } from 'pino'
import { startExampleServer, type ExampleServer } from '../../examples/mcp-server.js'
import { buildGateway } from '../../src/server.js'
import { exampleSessions } from '../fixtures/example-sessions.js'
import { makeStore, testConfig } from '../fixtures/gateway.js'
import { startCutProxy, type CutProxy } from '../fixtures/cut-proxy.js'
import { metricSum, metrics, prng } from '../fixtures/hardening.js'
import { connectClient, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'

interface Upstream {
  readonly server: ExampleServer
  /** Session ids this upstream initialized, and those it closed (DELETE). */
  readonly initialized: Set<string>
  readonly closed: Set<string>
}

async function startUpstream (t: Test, port = 0): Promise<Upstream> {
  const { initialized, closed, logger } = exampleSessions()
  const server = await startExampleServer({ port, logger })
  t.teardown(() => server.close())
  return { server, initialized, closed }
}

/** The upstream session of `upstream` the client's session was issued with, if it was there. */
function heldBy (upstream: Upstream, client: McpTestClient): string | undefined {
  return [...upstream.initialized].find(id => (client.sessionId as string).endsWith(`.${id}`))
}

async function echo (client: McpTestClient, text: string): Promise<string | undefined> {
  const result = await client.client.callTool({ name: 'echo', arguments: { text } })
  return (result.content as Array<{ text: string }>)[0]?.text
}

interface Setup {
  readonly first: Upstream
  readonly second: Upstream
  /** In front of the first upstream. */
  readonly relay: CutProxy
  readonly adminUrl: string
  /** A client whose session the first endpoint holds, and that upstream session's id. */
  readonly client: McpTestClient
  readonly upstreamSessionId: string
}

async function setup (t: Test): Promise<Setup> {
  const first = await startUpstream(t)
  const second = await startUpstream(t)
  const firstPort = Number(new URL(first.server.url).port)
  const relay = await startCutProxy(firstPort)
  // The old upstream session is deleted as soon as its endpoint can be reached: no call runs in it here.
  const config = testConfig(`${relay.url('/mcp')},${second.server.url}`, { UPSTREAM_SET_ASIDE_SECONDS: '1', REESTABLISH_DELETE_AFTER_SECONDS: '0' })
  const store = await makeStore(t, 'memory', config)
  const gateway = await buildGateway(config, { store, logger: pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' }), placementRandom: prng(3) })
  t.teardown(() => gateway.close())
  const { url, adminUrl } = await gateway.listen()
  t.teardown(() => relay.close())
  // New sessions go to the better of two endpoints drawn: open them until one is on the first.
  for (let i = 0; i < 10; i++) {
    const client = await connectClient(`${url}/mcp`)
    t.teardown(() => client.close())
    const id = heldBy(first, client)
    if (id !== undefined) return { first, second, relay, adminUrl, client, upstreamSessionId: id }
  }
  throw new Error('no session was placed on the first endpoint')
}

async function leftBehind (adminUrl: string, outcome: string): Promise<number> {
  return metricSum(await metrics(adminUrl), 'mcpgw_upstream_sessions_left_behind_total', { outcome })
}

t.test('a session moved away from an endpoint that refused a connection: its old upstream session is deleted there once the endpoint is back', async t => {
  const s = await setup(t)
  t.equal(await echo(s.client, 'before'), 'before', 'the session is served by the first endpoint')
  const relayPort = s.relay.port
  // The endpoint refuses connections; its server and sessions live on.
  await s.relay.close()
  t.equal(await echo(s.client, 'moved'), 'moved', 'the call is answered, on the other endpoint')
  t.ok(heldBy(s.second, s.client) === undefined && s.second.initialized.size > 0, 'a new upstream session on the second endpoint')
  t.notOk(s.first.closed.has(s.upstreamSessionId), 'the old upstream session lives on, unreachable')
  t.equal(await leftBehind(s.adminUrl, 'answered'), 0, 'nothing answered yet')

  const back = await startCutProxy(Number(new URL(s.first.server.url).port), '127.0.0.1', relayPort)
  t.teardown(() => back.close())
  t.ok(await waitUntil(() => s.first.closed.has(s.upstreamSessionId), 8000), 'once the endpoint takes connections again, the old upstream session is deleted there')
  t.equal(await leftBehind(s.adminUrl, 'answered'), 1, 'counted as answered')
  t.equal(await echo(s.client, 'after'), 'after', 'the session goes on')
})

t.test('a session the upstream said it lost leaves nothing behind to delete', async t => {
  const s = await setup(t)
  const firstPort = Number(new URL(s.first.server.url).port)
  // The first upstream restarts: its sessions are gone, and it answers 404 for them.
  await s.first.server.close()
  const restarted = await startUpstream(t, firstPort)
  t.equal(await echo(s.client, 'again'), 'again', 'the call is answered, in a new upstream session')
  await new Promise(resolve => setTimeout(resolve, 1500))
  for (const outcome of ['answered', 'endpoint_gone', 'expired', 'dropped']) {
    t.equal(await leftBehind(s.adminUrl, outcome), 0, `nothing left behind (${outcome})`)
  }
  t.equal(restarted.closed.size, 0, 'no DELETE sent to the restarted upstream')
})
