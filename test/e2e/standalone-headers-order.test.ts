// The headers the gateway's own upstream GETs of a session carry are those of
// the session's latest request verified here (a client's refreshed token, say).
// A client GET that waited for the upstream GET it opened (the upstream slow
// to answer) attaches after a later request was verified: it must not put its
// older headers back. Hand-written upstream (node:http), which
// records the header each GET carries; gateway on the embedded store.
import t from 'tap'
import { createServer, type ServerResponse } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, postsOnly } from '../fixtures/hand-upstream.js'
import { exchange, rawInitialize, RawSse, rawRequest, until } from '../fixtures/hardening.js'

const VERSION = '2025-06-18'
/** How long the upstream takes to answer the client's GET: it waits for that. */
const CLIENT_GET_DELAY_MS = 800

t.test('a client GET that attaches after a later request was verified leaves that request\'s headers for the upstream GETs', async t => {
  const tags: Array<string | undefined> = []
  const open: ServerResponse[] = []
  const posts = postsOnly((message, _req, res) => {
    if (message.method === 'initialize') answerInitialize(res, message, 'headers-order-session-01', VERSION)
    else if (message.id === undefined) res.writeHead(202).end()
    else res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: message.id, result: {} }))
  })
  const upstreamUrl = await listenUntilEnd(t, createServer((req, res) => {
    if (req.method === 'GET') {
      const tag = req.headers['x-client-tag']
      tags.push(Array.isArray(tag) ? tag.join(',') : tag)
      const answer = (): void => {
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.write(': open\n\n')
        open.push(res)
      }
      // The GET initialize opens meets a restart; the client's own is answered late.
      if (tags.length === 1) res.writeHead(503, { 'retry-after': '1' }).end('restarting')
      else if (tags.length === 2) setTimeout(answer, CLIENT_GET_DELAY_MS)
      else answer()
      return
    }
    posts(req, res)
  }))
  const gw = await startGateway(t, 'memory', upstreamUrl)
  const mcpUrl = `${gw.url}/mcp`
  const session = await rawInitialize(mcpUrl, { version: VERSION, headers: { 'x-client-tag': 'first' } })
  t.ok(await until(() => tags.length === 1, 3000), 'initialize opened the upstream GET, which met a restart')
  await sleep(100)

  // The client's GET, with the headers it has had so far: it opens the upstream GET and waits for it.
  const get = new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders())))
  t.teardown(() => get.close())
  t.ok(await until(() => tags.length === 2, 3000), 'the client\'s GET opens the upstream GET, which is slow to answer')
  await sleep(100)
  // Meanwhile a request with new headers (a refreshed token would be one) is verified and answered.
  const ping = await exchange(mcpUrl, { method: 'POST', headers: session.headers({ 'x-client-tag': 'second' }), body: JSON.stringify({ jsonrpc: '2.0', id: 5, method: 'ping' }) })
  t.equal(ping.status, 200, 'the later request is served')
  t.ok(await get.waitFor(s => s.status !== undefined, 5000), 'the client\'s GET gets its stream once the upstream GET opened')
  t.equal(get.status, 200)
  await sleep(100)
  t.equal(gw.gateway.hub.upstreamHeaders(session.sessionId)?.['x-client-tag'], 'second', 'the session\'s upstream GETs carry the later request\'s headers')

  // The upstream ends its GET: the gateway opens it again, with those headers.
  for (const res of open.splice(0)) res.end()
  t.ok(await until(() => tags.length >= 3, 5000), 'the gateway opened the upstream GET again')
  t.equal(tags[2], 'second', `with the latest verified request's headers (GETs carried: ${tags.join(', ')})`)
})
