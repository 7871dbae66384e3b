// Every path that reaches the upstream gets the MCP endpoint's checks: the
// principal (a verified JWT when AUTH_JWT_* is set) and the session binding,
// apart from PUBLIC_PATHS; paths that servers behind the gateway would read
// as another route (encoded /, ., \, NUL, dot segments, trailing dots or
// spaces) are refused. A recording upstream shows what got through: an
// upstream serving MCP on more paths than one would have run what it got.
import t from 'tap'
import { startGateway } from '../fixtures/gateway.js'
import { rawHttp, rawRequest, type Answer } from '../fixtures/hardening.js'
import { startAuthServer } from '../fixtures/jwt.js'
import { INITIALIZE, MCP_HEADERS, startRecordingUpstream } from '../fixtures/recording-upstream.js'

const CALL = JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'delete_everything', arguments: {} } })

/** The spellings of the MCP path an outside attack pass sent, tokenless, with a victim's session id. */
const SPELLINGS = ['/mcp%2F', '/mcp%2e', '/mcp.', '/%2fmcp', '/mcp%20', '/mcp%00', '/mcp%5c',
  // and more of the same family
  '/mcp%2f..', '/.well-known/..%2fmcp', '/.well-known/../mcp', '/x/..;/mcp', '/mcp\\', '/MCP%2E%2E', '/mcp%09', '/mcp..', '/mcp%2520']

async function send (port: number, method: string, path: string, headers: Record<string, string>, body?: string): Promise<Answer> {
  return await rawHttp(port, rawRequest(method, path, Object.entries(headers), body), 2000)
}

t.test('with AUTH_JWT_*: no path reaches the upstream around the token check or the session binding', async t => {
  const auth = await startAuthServer(t)
  const upstream = await startRecordingUpstream(t)
  const gw = await startGateway(t, 'memory', `${upstream.url}/mcp`, auth.env)
  const alice = { authorization: `Bearer ${await auth.token('alice')}` }
  const mallory = { authorization: `Bearer ${await auth.token('mallory')}` }
  const init = await send(gw.port, 'POST', '/mcp', { ...MCP_HEADERS, ...alice }, INITIALIZE)
  t.equal(init.status, 200)
  const session = init.headers['mcp-session-id'] as string
  t.ok(session, 'alice has a session')
  const before = upstream.seen.length

  for (const path of SPELLINGS) {
    const answer = await send(gw.port, 'POST', path, { ...MCP_HEADERS, 'mcp-session-id': session }, CALL)
    t.equal(answer.status, 400, `${path}: 400, tokenless`)
    const withToken = await send(gw.port, 'POST', path, { ...MCP_HEADERS, ...alice, 'mcp-session-id': session }, CALL)
    t.equal(withToken.status, 400, `${path}: 400 with a token too (the exact path is the way)`)
  }
  t.equal(upstream.seen.length, before, 'the upstream saw none of them')

  t.equal((await send(gw.port, 'POST', '/other', MCP_HEADERS, CALL)).status, 401, 'another path without a token: 401')
  t.equal((await send(gw.port, 'POST', '/other', { ...MCP_HEADERS, 'mcp-session-id': session }, CALL)).status, 401, 'with alice\'s session id: 401')
  t.equal((await send(gw.port, 'POST', '/other', { ...MCP_HEADERS, ...mallory, 'mcp-session-id': session }, CALL)).status, 404, 'another principal naming alice\'s session: 404')
  t.equal((await send(gw.port, 'POST', '/other', { ...MCP_HEADERS, ...alice, 'mcp-session-id': 'made-up' }, CALL)).status, 404, 'a session the gateway does not know: 404')
  t.equal(upstream.seen.length, before, 'none of those reached the upstream')

  t.equal((await send(gw.port, 'GET', '/.well-known/oauth-protected-resource', {})).status, 200, 'PUBLIC_PATHS: OAuth metadata without a token')
  t.equal((await send(gw.port, 'GET', '/.well-known/oauth-protected-resource', { 'mcp-session-id': session })).status, 401, 'but naming a session needs its principal there too')
  t.equal((await send(gw.port, 'POST', '/other', { ...MCP_HEADERS, ...alice }, CALL)).status, 200, 'a token: forwarded')
  t.equal((await send(gw.port, 'POST', '/other', { ...MCP_HEADERS, ...alice, 'mcp-session-id': session }, CALL)).status, 200, 'alice on her own session: forwarded')
  t.same(upstream.seen.slice(before).map(s => s.url), ['/.well-known/oauth-protected-resource', '/other', '/other'])
  // The gateway's id is the client's only: the upstream gets the id it issued (the one the
  // gateway's own GET of the session carried), on any path.
  const upstreamId = upstream.seen.find(s => s.method === 'GET' && s.url === '/mcp')?.headers['mcp-session-id']
  t.ok(upstreamId !== undefined && upstreamId !== session, 'the upstream knows the session by its own id')
  t.equal(upstream.seen.at(-1)?.headers['mcp-session-id'], upstreamId, 'alice\'s session on another path goes upstream under that id')
})

t.test('with the header binding: another path naming a session needs the principal that created it', async t => {
  const upstream = await startRecordingUpstream(t)
  const gw = await startGateway(t, 'memory', `${upstream.url}/mcp`, { PUBLIC_PATHS: '/.well-known/,/oauth/token' })
  const init = await send(gw.port, 'POST', '/mcp', { ...MCP_HEADERS, authorization: 'alice' }, INITIALIZE)
  const session = init.headers['mcp-session-id'] as string
  const before = upstream.seen.length
  t.equal((await send(gw.port, 'POST', '/mcp/', { ...MCP_HEADERS, 'mcp-session-id': session }, CALL)).status, 400, 'a disguised MCP path: 400')
  t.equal((await send(gw.port, 'POST', '/other', { ...MCP_HEADERS, authorization: 'mallory', 'mcp-session-id': session }, CALL)).status, 404, 'mallory: 404')
  t.equal((await send(gw.port, 'POST', '/other', { ...MCP_HEADERS, 'mcp-session-id': session }, CALL)).status, 404, 'anonymous: 404')
  t.equal((await send(gw.port, 'POST', '/oauth/token', { 'mcp-session-id': session }, '')).status, 404, 'a public path naming a session: 404')
  t.equal(upstream.seen.length, before, 'nothing reached the upstream')
  t.equal((await send(gw.port, 'POST', '/other', { ...MCP_HEADERS, authorization: 'alice', 'mcp-session-id': session }, CALL)).status, 200, 'alice: forwarded')
  t.equal((await send(gw.port, 'POST', '/oauth/token', {}, '')).status, 200, 'a public path: forwarded')
})
