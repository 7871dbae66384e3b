// An upstream session established again but not recorded (another replica's
// was recorded first) is deleted upstream, best effort: an SDK server keeps
// a session until told, so each one left behind would stay for the server's
// life (src/sessions/reestablish.ts #abandon). Real gateway (embedded store),
// a hand-written upstream that moves the record itself at the moment a second
// replica would, raw HTTP.
import t from 'tap'
import { createServer } from 'node:http'
import { request } from 'undici'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, readMessage } from '../fixtures/hand-upstream.js'
import { rawInitialize, until } from '../fixtures/hardening.js'

const VERSION = '2025-06-18'

t.test('a re-establishment that loses the race to record its session deletes that session upstream', async t => {
  let initializes = 0
  const known = new Set<string>()
  const deleted: string[] = []
  let sessionId = ''
  const upstream = createServer((req, res) => {
    const session = req.headers['mcp-session-id'] as string | undefined
    if (req.method === 'DELETE') {
      deleted.push(String(session))
      res.writeHead(200).end()
      return
    }
    if (req.method !== 'POST') {
      res.writeHead(405).end()
      return
    }
    readMessage(req).then(async message => {
      if (message.method === 'initialize') {
        initializes++
        const id = `up-${initializes}`
        if (initializes === 2) {
          // Another replica established the session first and recorded it: up-other.
          known.add(id).add('up-other')
          await gw.store.movePlacement(sessionId, 'up-1', { upstreamSessionId: 'up-other' })
        }
        answerInitialize(res, message, id, VERSION)
      } else if (message.id === undefined) {
        res.writeHead(202).end()
      } else if (session !== undefined && known.has(session)) {
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ jsonrpc: '2.0', id: message.id, result: { tools: [], session } }))
      } else {
        res.writeHead(404).end()
      }
    }, () => res.writeHead(400).end())
  })
  const gw = await startGateway(t, 'memory', await listenUntilEnd(t, upstream))
  const mcpUrl = `${gw.url}/mcp`
  const client = await rawInitialize(mcpUrl, { version: VERSION })
  sessionId = client.sessionId

  const call = await request(mcpUrl, { method: 'POST', headers: client.headers(), body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' })
  t.equal(call.statusCode, 200, 'the call is answered')
  t.match(await call.body.text(), /up-other/, 'on the upstream session the record points at')
  t.ok(await until(() => deleted.includes('up-2'), 3000), 'the session established for nothing is deleted upstream')
  t.notOk(deleted.includes('up-other'), 'the recorded one is not')
})
