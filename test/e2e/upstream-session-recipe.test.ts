// What a session's recipe keeps of the requests that set session state
// (src/protocol/session-state.ts, post.ts keepSessionState): only what the
// upstream accepted, however the client's JSON spells it, and never more
// than a bound. A store-less SDK server restarted behind the gateway, the
// official SDK client with its default options, raw HTTP where the SDK client
// cannot write what a test needs.
import t from 'tap'
import { request } from 'undici'
import { startGateway } from '../fixtures/gateway.js'
import { rawInitialize } from '../fixtures/hardening.js'
import { connectClient } from '../fixtures/mcp-client.js'
import { REFUSED_LEVEL, startRestartableUpstream } from '../fixtures/restartable-upstream.js'

t.test('a log level is kept once the upstream accepted it, spelt as the client\'s encoder spells it', async t => {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url)
  const mcp = await connectClient(`${gw.url}/mcp`)
  t.teardown(() => mcp.close())
  const sessionId = mcp.sessionId as string

  await mcp.client.setLoggingLevel('warning')
  // PHP's json_encode writes "/" as "\/": the same request to the upstream's JSON parser.
  const escaped = await request(`${gw.url}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-11-25' },
    body: '{"jsonrpc":"2.0","id":"php-1","method":"logging\\/setLevel","params":{"level":"debug"}}'
  })
  t.equal(escaped.statusCode, 200)
  await escaped.body.text()
  await t.rejects(mcp.client.setLoggingLevel(REFUSED_LEVEL), 'the upstream refuses one level')
  t.same(upstream.life.levels, ['warning', 'debug'], 'the upstream took two levels and refused the third')
  t.match(JSON.parse((await gw.store.recipe(sessionId))?.logLevel ?? '{}'), { method: 'logging/setLevel', params: { level: 'debug' } }, 'the recipe keeps the last level accepted')

  await upstream.restart()
  await mcp.client.callTool({ name: 'echo', arguments: { text: 'after' } })
  t.same(upstream.life.levels, ['debug'], 'established again with that level, not the refused one')
})

t.test('an initialize larger than the recipe\'s bound: the session works, but keeps no recipe', async t => {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url)
  const small = await rawInitialize(`${gw.url}/mcp`, { version: '2025-11-25' })
  t.not(await gw.store.recipe(small.sessionId), null, 'a usual initialize is kept')
  const pad = 'x'.repeat(70 * 1024)
  const init = JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'big', version: '0' }, _meta: { pad } } })
  const answer = await request(`${gw.url}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-11-25' }, body: init })
  await answer.body.text()
  t.equal(answer.statusCode, 200, 'the session is made')
  const sessionId = answer.headers['mcp-session-id'] as string
  t.not(await gw.store.getSession(sessionId), null, 'and recorded')
  t.equal(await gw.store.recipe(sessionId), null, 'without a recipe: its initialize would hold 70 KiB for the session\'s life')
})
