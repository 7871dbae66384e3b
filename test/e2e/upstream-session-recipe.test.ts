// What a session's recipe keeps of the requests that set session state
// (src/protocol/session-state.ts, post.ts keepSessionState): only what the
// upstream accepted, however the client's JSON spells it, and never more
// than a bound. A store-less SDK server restarted behind the gateway, the
// official SDK client with its default options, raw HTTP where the SDK client
// cannot write what a test needs.
import t from 'tap'
import { createServer } from 'node:http'
import { request } from 'undici'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, postsOnly } from '../fixtures/hand-upstream.js'
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

t.test('the answer to a state request is held back at most a second for its response', async t => {
  // A server that sends something first (a log line; a request to the client would wait for
  // its answer) and answers the request itself only later.
  const RESPONSE_AFTER_MS = 3000
  const upstream = createServer(postsOnly((message, _req, res) => {
    if (message.method === 'initialize') {
      answerInitialize(res, message, 'up-1', '2025-06-18', { logging: {} })
    } else if (message.method === 'logging/setLevel') {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(`data: ${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'first' } })}\n\n`)
      setTimeout(() => res.end(`data: ${JSON.stringify({ jsonrpc: '2.0', id: message.id, result: {} })}\n\n`), RESPONSE_AFTER_MS)
    } else {
      res.writeHead(202).end()
    }
  }))
  const gw = await startGateway(t, 'memory', await listenUntilEnd(t, upstream))
  const session = await rawInitialize(`${gw.url}/mcp`)
  const started = performance.now()
  const answer = await request(`${gw.url}/mcp`, { method: 'POST', headers: session.headers(), body: '{"jsonrpc":"2.0","id":1,"method":"logging/setLevel","params":{"level":"info"}}' })
  let firstAt: number | undefined
  let text = ''
  for await (const chunk of answer.body) {
    text += String(chunk)
    if (firstAt === undefined && text.includes('first')) firstAt = performance.now() - started
  }
  t.ok(firstAt !== undefined && firstAt < RESPONSE_AFTER_MS - 1000, `what came first reached the client before the response (${Math.round(firstAt ?? -1)} ms)`)
  t.match(text, /"result"/, 'then the response')
  t.match(JSON.parse((await gw.store.recipe(session.sessionId))?.logLevel ?? '{}'), { params: { level: 'info' } }, 'and the level is kept (its response was not seen in time: not refused)')
})
