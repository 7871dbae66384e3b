// An upstream event id that no HTTP header can carry (U+2028, a control
// character: both legal in SSE) must not make the session's standalone stream
// fail on every client GET: the gateway never sends it back as Last-Event-ID
// and opens the upstream GET afresh.
import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { request } from 'undici'
import { startGateway, type StoreKind } from '../fixtures/gateway.js'
import { answerInitialize, readMessage } from '../fixtures/hand-upstream.js'
import { waitUntil } from '../fixtures/mcp-client.js'

const BAD_IDS: Record<string, string> = { 'U+2028': 'a\u2028b', 'U+0001': 'c\u0001d' }

for (const kind of ['memory', 'redis'] as StoreKind[]) {
  for (const [name, badId] of Object.entries(BAD_IDS)) {
    t.test(`${kind} store, an id with ${name}`, async (t) => {
      const gets: Array<string | undefined> = []
      const upstream = createServer((req, res) => {
        if (req.method === 'POST') {
          readMessage(req).then(message => answerInitialize(res, message, 'sess-1', '2025-06-18'), () => res.writeHead(400).end())
          return
        }
        gets.push(req.headers['last-event-id'] as string | undefined)
        // One event under an id no header can carry, then the end of the stream.
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.end(`id: ${badId}\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":${gets.length}}}\n\n`)
      })
      await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
      t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
      const { url } = await startGateway(t, kind, `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/mcp`)
      const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18' }
      const init = await request(`${url}/mcp`, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'c', version: '1' } } }) })
      await init.body.text()
      t.equal(init.statusCode, 200)
      // The gateway's own session id, which the client gets at initialize.
      const sessionId = String(init.headers['mcp-session-id'])
      t.ok(await waitUntil(() => gets.length >= 1, 3000), 'the upstream GET was opened')
      for (let i = 0; i < 3; i++) {
        const res = await request(`${url}/mcp`, { method: 'GET', headers: { accept: 'text/event-stream', 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' } })
        t.equal(res.statusCode, 200, `client GET ${i + 1}: the standalone stream opens`)
        res.body.on('error', () => {}).destroy()
      }
      t.same(gets.filter(id => id !== undefined), [], 'the id never went upstream as Last-Event-ID')
    })
  }
}
