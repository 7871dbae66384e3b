// A request whose upstream connection is cut after the upstream read it (a
// tool that ran, then its connection died before the answer) is not sent
// again: the upstream may have acted on it. The client gets an error for it,
// the session is not established upstream again, and its next request goes
// to the same upstream session. Only a request that never reached the
// upstream (no connection made) is sent again; test/e2e/upstream-restart
// covers that one. Real gateway (embedded store), an upstream that counts
// what it executes, raw HTTP.
import t from 'tap'
import { createServer } from 'node:http'
import { request } from 'undici'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, readMessage } from '../fixtures/hand-upstream.js'
import { rawInitialize } from '../fixtures/hardening.js'

const VERSION = '2025-06-18'

t.test('a tool call cut after the upstream ran it: an error for the client, not a second run', async t => {
  let initializes = 0
  let toolRuns = 0
  const deletes: string[] = []
  const upstream = createServer((req, res) => {
    if (req.method === 'GET') {
      res.writeHead(405).end()
      return
    }
    if (req.method === 'DELETE') {
      deletes.push(String(req.headers['mcp-session-id']))
      res.writeHead(200).end()
      return
    }
    readMessage(req).then(message => {
      if (message.method === 'initialize') {
        initializes++
        answerInitialize(res, message, `up-${initializes}`, VERSION)
      } else if (message.method === 'tools/call') {
        toolRuns++
        // The first call runs, then its connection dies before any answer.
        if (toolRuns === 1) req.socket.destroy()
        else {
          res.writeHead(200, { 'content-type': 'application/json' })
          res.end(JSON.stringify({ jsonrpc: '2.0', id: message.id, result: { content: [{ type: 'text', text: `run ${toolRuns}` }] } }))
        }
      } else {
        res.writeHead(202).end()
      }
    }, () => res.writeHead(400).end())
  })
  const gw = await startGateway(t, 'memory', await listenUntilEnd(t, upstream))
  const mcpUrl = `${gw.url}/mcp`

  const session = await rawInitialize(mcpUrl, { version: VERSION })
  const call = (id: number): string => JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'transfer', arguments: {} } })

  const cut = await request(mcpUrl, { method: 'POST', headers: session.headers(), body: call(1) })
  const cutBody = await cut.body.text()
  t.equal(cut.statusCode, 502, 'the client is told the upstream failed')
  t.match(cutBody, /could not be reached/, 'with the gateway\'s error')
  t.equal(toolRuns, 1, 'the tool ran once: the call was not sent again')
  t.equal(initializes, 1, 'the session was not established upstream again')

  const next = await request(mcpUrl, { method: 'POST', headers: session.headers(), body: call(2) })
  t.equal(next.statusCode, 200, 'the session goes on')
  t.match(await next.body.text(), /run 2/, 'its next call runs on the same upstream session')
  t.equal(initializes, 1, 'still one upstream session')
  t.same(deletes, [], 'and nothing was deleted upstream')
})
