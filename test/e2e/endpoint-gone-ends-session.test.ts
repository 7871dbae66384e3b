// A session whose upstream endpoint is gone (set aside after it refused a
// connection: a pod closing gracefully, its sessions still open there) and
// that cannot be carried over is answered 404 MCPGW_UPSTREAM_ENDPOINT_GONE
// ("Session not found: start a new session"). The session told that must be
// gone in the gateway too, as after the upstream's own 404: before, its
// records stayed, and a DELETE answered 404 left the session going on,
// established again elsewhere at its next request.
import t, { type Test } from 'tap'
import { startGateway, type RunningGateway } from '../fixtures/gateway.js'
import { exchange, rawInitialize, type RawSession } from '../fixtures/hardening.js'
import { startRestartableUpstream, type RestartableUpstream } from '../fixtures/restartable-upstream.js'

interface Setup {
  readonly gw: RunningGateway
  readonly upstreams: RestartableUpstream[]
  readonly session: RawSession
  /** The endpoint holding the session, closed to new connections (its open ones live on). */
  readonly holder: RestartableUpstream
}

async function sessionOnClosingEndpoint (t: Test, env: Record<string, string> = {}): Promise<Setup> {
  const upstreams = [await startRestartableUpstream(), await startRestartableUpstream()]
  for (const u of upstreams) t.teardown(() => u.close())
  const gw = await startGateway(t, 'memory', upstreams.map(u => u.url).join(','), { UPSTREAM_SET_ASIDE_SECONDS: '60', ...env })
  const session = await rawInitialize(`${gw.url}/mcp`)
  const holder = upstreams.find(u => u.life.initialized.some(id => session.sessionId.endsWith(`.${id}`)))
  if (holder === undefined) throw new Error('no upstream holds the session')
  holder.stopListening()
  return { gw, upstreams, session, holder }
}

async function call (gw: RunningGateway, session: RawSession, id: number): Promise<{ status: number | undefined, text: string }> {
  return await exchange(`${gw.url}/mcp`, {
    method: 'POST',
    headers: session.headers(),
    body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'echo', arguments: { text: 'x' } } })
  })
}

function initializes (upstreams: RestartableUpstream[]): number {
  return upstreams.reduce((n, u) => n + u.life.initialized.length, 0)
}

t.test('a DELETE meeting the endpoint gone ends the session in the gateway', async t => {
  const { gw, upstreams, session } = await sessionOnClosingEndpoint(t)
  const before = initializes(upstreams)
  const del = await exchange(`${gw.url}/mcp`, { method: 'DELETE', headers: session.headers() })
  t.equal(del.status, 404, 'the DELETE is answered 404')
  t.match(del.text, /endpoint that held this session is gone/, 'saying the endpoint is gone')
  t.equal(await gw.store.getSession(session.sessionId), null, 'the session\'s records are dropped')
  const after = await call(gw, session, 2)
  t.equal(after.status, 404, 'a request of the deleted session is answered 404')
  t.equal(initializes(upstreams), before, 'and the session is not established again anywhere')
})

t.test('REESTABLISH_UPSTREAM_SESSIONS=false: a request told the endpoint is gone ends the session', async t => {
  const { gw, upstreams, session } = await sessionOnClosingEndpoint(t, { REESTABLISH_UPSTREAM_SESSIONS: 'false' })
  const first = await call(gw, session, 2)
  t.equal(first.status, 404, 'the request is answered 404')
  t.match(first.text, /endpoint that held this session is gone/, 'saying the endpoint is gone')
  t.equal(await gw.store.getSession(session.sessionId), null, 'the session\'s records are dropped')
  const get = await exchange(`${gw.url}/mcp`, { headers: session.getHeaders() }, 1000)
  t.equal(get.status, 404, 'its GET too is answered 404')
  t.equal(initializes(upstreams), 1, 'nothing established upstream but the session itself')
})

t.test('a session carried over to another endpoint is not ended', async t => {
  const { gw, upstreams, session, holder } = await sessionOnClosingEndpoint(t)
  const first = await call(gw, session, 2)
  t.equal(first.status, 200, 'the request is answered, on the other endpoint')
  const other = upstreams.find(u => u !== holder) as RestartableUpstream
  t.equal(other.life.initialized.length, 1, 'where the session was established again')
  t.not(await gw.store.getSession(session.sessionId), null, 'the session goes on')
})
