// An upstream that answers the standalone GET with 405 has no stream to resume
// anything with: when its POST answer ends before the response, the gateway
// concludes at once (the JSON-RPC error for the request) instead of waiting the
// upstream's retry hint and sending a GET that is bound to fail. This holds after
// the session's local state is forgotten (FORGET_AFTER_MS after the refusal).
import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from 'undici'
import { startGateway, type StoreKind } from '../fixtures/gateway.js'
import { answerInitialize, readMessage } from '../fixtures/hand-upstream.js'
import { waitUntil } from '../fixtures/mcp-client.js'

const VERSION = '2025-06-18'

// The hub's memory of the refusal is the same whatever the store: one store suffices.
for (const kind of ['memory'] as StoreKind[]) {
  t.test(`${kind} store: a session whose upstream refused its GET is not resumed upstream`, async (t) => {
    const gets: Array<string | undefined> = []
    const upstream = createServer((req, res) => {
      if (req.method === 'GET') {
        gets.push(req.headers['last-event-id'] as string | undefined)
        res.writeHead(405, { allow: 'POST' }).end()
        return
      }
      readMessage(req).then(message => {
        if (message.method === 'initialize') {
          answerInitialize(res, message, 'sess-405', VERSION)
          return
        }
        // An event with an id and a long retry hint, then the end: no response.
        res.writeHead(200, { 'content-type': 'text/event-stream' })
        res.end('id: up-1\nretry: 3000\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"working"}}\n\n')
      }, () => res.writeHead(400).end())
    })
    await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
    t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
    const { url } = await startGateway(t, kind, `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/mcp`)
    const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': VERSION }
    const init = await request(`${url}/mcp`, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: VERSION, capabilities: {}, clientInfo: { name: 'c', version: '1' } } }) })
    await init.body.text()
    // The gateway's own session id, which the client gets at initialize.
    const sessionId = String(init.headers['mcp-session-id'])
    t.ok(await waitUntil(() => gets.length >= 1, 3000), 'the gateway opened the session\'s upstream GET, and got 405')
    // Past the hub's forget delay (10 s) for a session with no client and no stream.
    await sleep(10_500)

    const call = await request(`${url}/mcp`, { method: 'POST', headers: { ...headers, 'mcp-session-id': sessionId }, body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'slow', arguments: {} } }) })
    const text = await call.body.text()
    t.match(text, /"id":2/, 'the request gets its answer')
    t.match(text, /-32000/, 'the gateway\'s error: the upstream answer broke off')
    t.same(gets.filter(id => id !== undefined), [], 'no GET with the upstream\'s Last-Event-ID was sent')
  })
}
