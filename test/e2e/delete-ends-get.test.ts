// A DELETE the upstream answers by ending the session's GET stream first (as
// the SDK's transport does, closing its streams before the answer): the
// gateway does not send a GET to reopen the stream of a session on its way
// out, which could only meet a 404. Real gateway (embedded store), an upstream
// that counts its GETs, raw HTTP.
import t from 'tap'
import { createServer, type ServerResponse } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from 'undici'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, readMessage } from '../fixtures/hand-upstream.js'
import { rawInitialize, until } from '../fixtures/hardening.js'

const VERSION = '2025-06-18'
/** How long the upstream takes to answer a DELETE after ending the session's streams. */
const DELETE_ANSWER_MS = 300

t.test('a DELETE that ends the upstream GET: the stream is not reopened for the session going', async t => {
  const sessions = new Set<string>()
  const getsBySession = new Map<string, number>()
  const streams = new Map<string, ServerResponse[]>()
  const upstream = createServer((req, res) => {
    const session = req.headers['mcp-session-id'] as string | undefined
    if (req.method === 'GET') {
      if (session === undefined || !sessions.has(session)) {
        res.writeHead(404).end()
        if (session !== undefined) getsBySession.set(session, (getsBySession.get(session) ?? 0) + 1)
        return
      }
      getsBySession.set(session, (getsBySession.get(session) ?? 0) + 1)
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(': open\n\n')
      streams.set(session, [...(streams.get(session) ?? []), res])
      return
    }
    if (req.method === 'DELETE' && session !== undefined) {
      sessions.delete(session)
      for (const stream of streams.get(session) ?? []) stream.end()
      setTimeout(() => res.writeHead(200).end(), DELETE_ANSWER_MS)
      return
    }
    readMessage(req).then(message => {
      if (message.method !== 'initialize') {
        res.writeHead(202).end()
        return
      }
      const id = `up-${sessions.size + 1}`
      sessions.add(id)
      answerInitialize(res, message, id, VERSION)
    }, () => res.writeHead(400).end())
  })
  const gw = await startGateway(t, 'memory', await listenUntilEnd(t, upstream))
  const mcpUrl = `${gw.url}/mcp`

  const session = await rawInitialize(mcpUrl, { version: VERSION })
  t.ok(await until(() => getsBySession.get('up-1') === 1, 2000), 'initialize opened the upstream GET')
  const deleted = await request(mcpUrl, { method: 'DELETE', headers: session.headers() })
  await deleted.body.text()
  t.equal(deleted.statusCode, 200, 'DELETE answered')
  await sleep(300)
  t.equal(getsBySession.get('up-1'), 1, 'no GET was sent to reopen the stream of the session being deleted')
  t.equal(gw.gateway.hub.pumpCount, 0, 'and no upstream GET is held for it')
})
