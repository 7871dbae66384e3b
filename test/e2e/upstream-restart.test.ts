// Sessions that survive the upstream (src/sessions/reestablish.ts): a store-less SDK
// server restarted behind the gateway (a new server with fresh state on the same
// port) while the official SDK client, with its default options, holds a session.
// The gateway establishes the session upstream again from what it recorded; the
// client keeps its session id and never notices.
import t, { type Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { randomUUID } from 'node:crypto'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { z } from 'zod'
import { startGateway, startGatewayOnRedis, type RunningGateway } from '../fixtures/gateway.js'
import { exchange, metricSum, metrics, rawInitialize, until } from '../fixtures/hardening.js'
import { connectClient, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { deleteKeys, useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream, type RestartableUpstream } from '../fixtures/restartable-upstream.js'

async function echo (mcp: McpTestClient, text: string): Promise<unknown> {
  return (await mcp.client.callTool({ name: 'echo', arguments: { text } })).content
}

function standaloneTexts (mcp: McpTestClient): unknown[] {
  return mcp.notifications.filter(n => n.method === 'notifications/message' && (n.params as { logger?: string }).logger === 'standalone').map(n => (n.params as { data: unknown }).data)
}

async function gatewayFor (t: Test, kind: 'memory' | 'redis', upstream: RestartableUpstream, env: Record<string, string> = {}): Promise<RunningGateway> {
  if (kind === 'memory') return await startGateway(t, 'memory', upstream.url, env)
  return await startGatewayOnRedis(t, await useRedis(t, 'restart-up'), upstream.url, env)
}

/** An SDK client (default options) of the gateway, whose session has made one call. */
async function clientOf (t: Test, gw: RunningGateway): Promise<{ mcp: McpTestClient, sessionId: string }> {
  const mcp = await connectClient(`${gw.url}/mcp`)
  t.teardown(() => mcp.close())
  t.same(await echo(mcp, 'before'), [{ type: 'text', text: 'before' }], 'a call before')
  return { mcp, sessionId: mcp.sessionId as string }
}

/** A store-less upstream, a gateway in front of it, and an SDK client whose session has made one call. */
async function sessionThrough (t: Test, kind: 'memory' | 'redis', env: Record<string, string> = {}, upstreamOptions: Parameters<typeof startRestartableUpstream>[0] = {}): Promise<{ upstream: RestartableUpstream, gw: RunningGateway, mcp: McpTestClient, sessionId: string }> {
  const upstream = await startRestartableUpstream(upstreamOptions)
  t.teardown(() => upstream.close())
  const gw = await gatewayFor(t, kind, upstream, env)
  return { upstream, gw, ...await clientOf(t, gw) }
}

for (const kind of ['memory', 'redis'] as const) {
  t.test(`${kind} store: the upstream restarted twice during one session`, async t => {
    const upstream = await startRestartableUpstream()
    t.teardown(() => upstream.close())
    const gw = await gatewayFor(t, kind, upstream)
    const mcp = await connectClient(`${gw.url}/mcp`)
    t.teardown(() => mcp.close())
    const sessionId = mcp.sessionId as string
    t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'the standalone GET is open')
    await mcp.client.setLoggingLevel('warning')
    t.same(upstream.life.levels, ['warning'], 'the upstream got the log level')
    t.same(await echo(mcp, 'before'), [{ type: 'text', text: 'before' }])
    const firstUpstreamId = upstream.life.initialized[0] as string
    t.not(sessionId, firstUpstreamId, 'the client holds the gateway\'s id, not the upstream\'s')

    for (const round of [1, 2]) {
      await upstream.restart()
      t.same(await echo(mcp, `after restart ${round}`), [{ type: 'text', text: `after restart ${round}` }], `restart ${round}: the next call succeeds`)
      t.equal(mcp.sessionId, sessionId, `restart ${round}: the same client session`)
      t.equal(upstream.life.initialized.length, 1, `restart ${round}: the new upstream got one initialize`)
      t.same(upstream.life.levels, ['warning'], `restart ${round}: the log level set before is set again`)
      const upstreamId = upstream.life.initialized[0] as string
      t.equal((await gw.store.getSession(sessionId))?.upstreamSessionId, upstreamId, `restart ${round}: the record points at the new upstream session`)
      t.notOk(mcp.exchanges.some(e => JSON.stringify(e).includes(upstreamId)), `restart ${round}: the new upstream id never reached the client`)
      for (let i = 0; i < 3; i++) t.same(await echo(mcp, `call ${i}`), [{ type: 'text', text: `call ${i}` }], `restart ${round}: call ${i}`)
      // The client's GET was cut with the old upstream; it reconnects to the new session's stream.
      const text = `standalone after restart ${round}`
      t.ok(await waitUntil(() => upstream.life.requests.some(r => r.method === 'GET' && r.sessionId === upstreamId), 10_000), `restart ${round}: the standalone GET is open on the new upstream session`)
      await mcp.client.callTool({ name: 'notify_standalone', arguments: { text } })
      t.ok(await waitUntil(() => standaloneTexts(mcp).includes(text), 10_000), `restart ${round}: a notification the new upstream session sends on its standalone stream reaches the client's GET`)
    }
    const text = await metrics(gw.adminUrl)
    t.equal(metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'reestablished' }), 2, 'two re-establishments counted')
    t.equal(metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'failed' }), 0, 'none failed')
  })
}

for (const kind of ['memory', 'redis'] as const) {
  t.test(`${kind} store: an upstream with an event store restarted: the new upstream session's GET opens afresh, not from the old session's last event id`, async t => {
    const upstream = await startRestartableUpstream({ eventStore: true })
    t.teardown(() => upstream.close())
    const gw = await gatewayFor(t, kind, upstream)
    const mcp = await connectClient(`${gw.url}/mcp`)
    t.teardown(() => mcp.close())
    t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'the standalone GET is open')
    await mcp.client.callTool({ name: 'notify_standalone', arguments: { text: 'before' } })
    t.ok(await waitUntil(() => standaloneTexts(mcp).includes('before'), 5000), 'a standalone message (with its upstream event id) before the restart')
    await upstream.restart()
    await mcp.client.callTool({ name: 'notify_standalone', arguments: { text: 'after' } })
    const upstreamId = upstream.life.initialized[0]
    const gets = upstream.life.requests.filter(r => r.method === 'GET' && r.sessionId === upstreamId)
    t.ok(gets.length > 0, 'the new upstream session\'s GET was opened')
    t.same(gets.map(r => r.lastEventId), gets.map(() => undefined), 'without a Last-Event-ID its stream never issued')
    t.ok(await waitUntil(() => standaloneTexts(mcp).includes('after'), 5000), 'what the new session sends on its standalone stream reaches the client')
  })
}

t.test('a restarted upstream whose initialize result has other capabilities: 404, the session ends', async t => {
  const { upstream, gw, mcp, sessionId } = await sessionThrough(t, 'memory')
  await upstream.restart({ capabilities: { experimental: { somethingNew: {} } } })
  await t.rejects(echo(mcp, 'after'), /404|Session not found/, 'the client gets 404')
  t.equal(await gw.store.getSession(sessionId), null, 'the gateway dropped the session')
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'incompatible' }), 1, 'counted as incompatible')
})

t.test('REESTABLISH_UPSTREAM_SESSIONS=false: the upstream\'s 404, as before', async t => {
  const { upstream, gw, mcp } = await sessionThrough(t, 'memory', { REESTABLISH_UPSTREAM_SESSIONS: 'false' })
  await upstream.restart()
  await t.rejects(echo(mcp, 'after'), /404|Session not found/, 'the client gets the upstream\'s 404')
  t.equal(upstream.life.initialized.length, 0, 'nothing was initialized again')
  t.equal(await gw.store.getSession(mcp.sessionId as string), null, 'and the gateway dropped the session\'s records')
})

t.test('a re-establishment waiting for another replica\'s takes the fence when that one lets it go without moving the record', async t => {
  const { upstream, gw, mcp } = await sessionThrough(t, 'memory')
  await upstream.restart()
  // Another replica holds the fence: it is establishing the session, then gives up.
  t.ok(await gw.store.acquireSessionFence(mcp.sessionId as string, 'other-replica', 10_000), 'the fence taken by someone else')
  const started = Date.now()
  const call = echo(mcp, 'after')
  await sleep(300)
  await gw.store.releaseSessionFence(mcp.sessionId as string, 'other-replica')
  t.same(await call, [{ type: 'text', text: 'after' }], 'the call succeeds')
  const waited = Date.now() - started
  t.ok(waited < 5000, `soon after the fence went, not at the end of the wait (${waited} ms)`)
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'reestablished' }), 1, 'established again by this replica')
})

t.test('a client\'s GET meets the upstream losing the session again right after it was established again: the GET opens and follows the store, the session is kept, the next GET opens the upstream stream', async t => {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const gw = await gatewayFor(t, 'memory', upstream)
  const mcpUrl = `${gw.url}/mcp`
  const session = await rawInitialize(mcpUrl, { version: '2025-11-25' })
  t.ok(await until(() => gw.gateway.hub.pumpCount === 1, 2000), 'the session\'s upstream GET opened at initialize')
  await upstream.stop()
  t.ok(await until(() => gw.gateway.hub.pumpCount === 0, 2000), 'and ended with the upstream')
  await upstream.start({ forgetSessions: 1 })
  const first = await exchange(mcpUrl, { headers: session.getHeaders() }, 6000)
  t.equal(first.status, 200, 'the GET is not refused (a client gives its GET up after a few refusals)')
  t.equal(first.headers['content-type'], 'text/event-stream', 'it is the session\'s stream')
  t.equal(gw.gateway.hub.pumpCount, 0, 'with no upstream GET: the one it would take is of a session the upstream lost again')
  t.not(await gw.store.getSession(session.sessionId), null, 'the session\'s records are kept')
  const second = await exchange(mcpUrl, { headers: session.getHeaders() }, 1500)
  t.equal(second.status, 200, 'the next GET opens the stream')
  t.equal(upstream.life.initialized.length, 2, 'on the second session established upstream')
  const held = upstream.life.initialized[1]
  t.ok(upstream.life.requests.some(r => r.method === 'GET' && r.sessionId === held), 'whose GET is open upstream')
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_requests_refused_total', { reason: 'session_reestablishing' }), 0, 'no GET refused')
})

for (const kind of ['memory', 'redis'] as const) {
  t.test(`${kind} store: the upstream down for seconds, an SDK client (default options) holding its GET: its standalone stream is back once the upstream is`, async t => {
    const upstream = await startRestartableUpstream()
    t.teardown(() => upstream.close())
    const gw = await gatewayFor(t, kind, upstream)
    const mcp = await connectClient(`${gw.url}/mcp`)
    t.teardown(() => mcp.close())
    t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'the standalone GET is open')
    await upstream.stop()
    // Longer than the SDK's reconnects of its GET take to give up (two, in about 2.5 s).
    await sleep(5000)
    await upstream.start()
    t.same(await echo(mcp, 'back'), [{ type: 'text', text: 'back' }], 'a call once the upstream is back')
    const text = 'standalone once back'
    t.ok(await waitUntil(() => upstream.life.requests.some(r => r.method === 'GET' && r.sessionId === upstream.life.initialized[0]), 10_000), 'the standalone GET is open on the new upstream session')
    await mcp.client.callTool({ name: 'notify_standalone', arguments: { text } })
    t.ok(await waitUntil(() => standaloneTexts(mcp).includes(text), 10_000), 'what it sends on its standalone stream reaches the client')
    const gets = mcp.exchanges.filter(e => e.method === 'GET')
    t.ok(gets.every(e => e.status === 200), `every GET of the client opened (${gets.map(e => e.status ?? e.error).join(', ')})`)
  })
}

// Not the upstream's last word: the session stays, the client is told to retry, and its
// next request establishes the session again. Before, the upstream's 404 went to the
// client and the gateway dropped the session: a restart that took a moment longer
// ended every session whose client called in between.
const notYet: Array<{ what: string, down: (u: RestartableUpstream) => Promise<void>, up: (u: RestartableUpstream) => Promise<void>, initializes: number, reestablished: number, unavailable: boolean }> = [
  { what: 'does not listen yet', down: async u => await u.stop(), up: async u => await u.start(), initializes: 1, reestablished: 1, unavailable: true },
  { what: 'answers the new initialize with 503', down: async u => { await u.stop(); await u.start({ refuseInitializes: 1 }) }, up: async () => {}, initializes: 1, reestablished: 1, unavailable: true },
  // The first session the new life establishes is gone before the call is sent again: its 404 is the upstream losing it again.
  { what: 'loses the session again right after it was established again', down: async u => { await u.stop(); await u.start({ forgetSessions: 1 }) }, up: async () => {}, initializes: 2, reestablished: 2, unavailable: false }
]
for (const kind of ['memory', 'redis'] as const) {
  for (const c of notYet) {
    t.test(`${kind} store: the restarted upstream ${c.what}: 503, the session kept, the next call goes on with it`, async t => {
      const { upstream, gw, mcp, sessionId } = await sessionThrough(t, kind)
      await c.down(upstream)
      await t.rejects(echo(mcp, 'meanwhile'), /503|could not establish it there again yet/, 'the call gets 503')
      t.not(await gw.store.getSession(sessionId), null, 'the session\'s records are kept')
      await c.up(upstream)
      t.same(await echo(mcp, 'then'), [{ type: 'text', text: 'then' }], 'the next call succeeds')
      t.equal(mcp.sessionId, sessionId, 'in the same client session')
      t.equal(upstream.life.initialized.length, c.initializes, `${c.initializes} initialize(s) on the upstream's new life`)
      const text = await metrics(gw.adminUrl)
      t.equal(metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'unavailable' }) > 0, c.unavailable, c.unavailable ? 'the failed attempt counted as unavailable' : 'no attempt counted as unavailable')
      t.equal(metricSum(text, 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'reestablished' }), c.reestablished, `${c.reestablished} re-establishment(s) done`)
      t.equal(metricSum(text, 'mcpgw_requests_refused_total', { reason: 'session_reestablishing' }), 1, 'one refusal, counted')
    })
  }
}

t.test('a server that answers an unknown session with 400, as the SDK\'s example servers do: the session is established again, on a call and on the client\'s GET', async t => {
  const { upstream, gw, mcp, sessionId } = await sessionThrough(t, 'memory', {}, { unknownSession: 400 })
  await upstream.restart()
  t.same(await echo(mcp, 'after'), [{ type: 'text', text: 'after' }], 'the call after the restart succeeds')
  t.equal(mcp.sessionId, sessionId, 'in the same client session')
  t.equal(upstream.life.initialized.length, 1, 'established again once')

  const raw = await rawInitialize(`${gw.url}/mcp`, { version: '2025-11-25' })
  t.ok(await until(() => gw.gateway.hub.pumpCount === 2, 2000), 'a second session\'s upstream GET opened at initialize')
  await upstream.restart()
  t.ok(await until(() => gw.gateway.hub.pumpCount === 0, 2000), 'both ended with the upstream')
  const get = await exchange(`${gw.url}/mcp`, { headers: raw.getHeaders() }, 1500)
  t.equal(get.status, 200, 'the client\'s GET gets its stream')
  t.ok(upstream.life.initialized.length >= 1 && upstream.life.requests.some(r => r.method === 'GET' && upstream.life.initialized.includes(r.sessionId as string)), 'open upstream on a session established again')
})

/**
 * The SDK's transport serving one session per process (one transport made at start):
 * a new process answers every request of the old session `400 Bad Request: Server
 * not initialized` until its own initialize. `restart()` starts a new one on the same port.
 */
async function startOneSessionServer (t: Test): Promise<{ url: string, initializes: () => number, restart: () => Promise<void> }> {
  let initializes = 0
  let server: Server | undefined
  let port = 0
  const listen = async (): Promise<void> => {
    const mcp = new McpServer({ name: 'one-session', version: '1.0.0' })
    mcp.registerTool('echo', { inputSchema: { text: z.string() } }, async ({ text }) => ({ content: [{ type: 'text', text }] }))
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: randomUUID, onsessioninitialized: () => { initializes++ } })
    await mcp.connect(transport)
    server = createServer((req, res) => { transport.handleRequest(req, res).catch(() => res.destroy()) })
    await new Promise<void>(resolve => (server as Server).listen(port, '127.0.0.1', resolve))
    port = (server.address() as AddressInfo).port
  }
  const stop = async (): Promise<void> => { await new Promise<void>(resolve => { server?.closeAllConnections(); server?.close(() => resolve()) }) }
  await listen()
  t.teardown(stop)
  return { url: `http://127.0.0.1:${port}/mcp`, initializes: () => initializes, restart: async () => { await stop(); await listen() } }
}

t.test('the SDK\'s one-session server restarted: its 400 "Server not initialized" is the session lost, and the session goes on', async t => {
  const upstream = await startOneSessionServer(t)
  const gw = await startGateway(t, 'memory', upstream.url)
  const { mcp, sessionId } = await clientOf(t, gw)
  await upstream.restart()
  t.same(await echo(mcp, 'after'), [{ type: 'text', text: 'after' }], 'the call after the restart succeeds')
  t.equal(mcp.sessionId, sessionId, 'in the same client session')
  t.equal(upstream.initializes(), 2, 'the new process was initialized by the gateway')
})

t.test('Redis lost the session after the upstream had been given it again under a new id: the session is recorded again toward that id, not the one it started with', async t => {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const redis = await useRedis(t, 'restart-then-loss')
  const gw = await startGatewayOnRedis(t, redis, upstream.url)
  const { mcp, sessionId } = await clientOf(t, gw)
  await upstream.restart()
  t.same(await echo(mcp, 'after the restart'), [{ type: 'text', text: 'after the restart' }], 'the session established again')
  const upstreamId = upstream.life.initialized[0] as string
  t.equal((await gw.store.getSession(sessionId))?.upstreamSessionId, upstreamId, 'the record points at the new upstream session')

  // Redis restarts empty (every key of the gateway's, its intact mark included).
  t.ok(await deleteKeys(redis.redis, redis.prefix) > 0, 'the store lost everything')
  await sleep(2100) // past the gateway's 2 s cache of verified sessions: the next call meets the loss
  t.same(await echo(mcp, 'after the loss'), [{ type: 'text', text: 'after the loss' }], 'the next call succeeds')
  t.equal(mcp.sessionId, sessionId, 'in the same client session')
  t.equal(upstream.life.initialized.length, 1, 'sent to the upstream session the upstream has: no initialize again')
  t.equal((await gw.store.getSession(sessionId))?.upstreamSessionId, upstreamId, 'and recorded again toward it')
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_sessions_recovered_total'), 1, 'counted as recovered')
})
