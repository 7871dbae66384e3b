// Two client GETs of one session at once: the first opens the session's
// upstream GET, the second finds it on its way (held, as far as the gateway
// knows) and attaches to follow it. When the upstream then refuses that GET
// (here a 503 while it restarts), the first client gets the refusal; the
// second must not be left on a stream nothing feeds: the gateway opens the
// upstream GET again for it, and what the upstream sends reaches it.
// Hand-written upstream (node:http), gateway on the embedded store, raw HTTP.
import t from 'tap'
import { createServer } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, readMessage } from '../fixtures/hand-upstream.js'
import { exchange, rawInitialize, sseEvents, until } from '../fixtures/hardening.js'

const VERSION = '2025-06-18'
const NOTICE = 'sent once the upstream is back'

t.test('a client GET that joined an upstream GET the upstream refused is fed once the upstream takes a GET again', async t => {
  const answered: number[] = []
  const upstreamUrl = await listenUntilEnd(t, createServer((req, res) => {
    if (req.method === 'GET') {
      const n = answered.length + 1
      // The first two GETs (the one initialize opens, the first client's) meet a restart; the
      // first client's is answered late, so that the second client's GET arrives meanwhile.
      if (n <= 2) {
        answered.push(503)
        setTimeout(() => res.writeHead(503, { 'retry-after': '1' }).end('restarting'), n === 2 ? 400 : 0)
        return
      }
      answered.push(200)
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(`data: ${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: NOTICE } })}\n\n`)
      return
    }
    if (req.method !== 'POST') {
      res.writeHead(405).end()
      return
    }
    readMessage(req).then(message => {
      if (message.method === 'initialize') answerInitialize(res, message, 'joined-refusal-session-01', VERSION)
      else res.writeHead(202).end()
    }, () => res.writeHead(400).end())
  }))
  const gw = await startGateway(t, 'memory', upstreamUrl)
  const mcpUrl = `${gw.url}/mcp`
  const session = await rawInitialize(mcpUrl, { version: VERSION })
  t.ok(await until(() => answered.length === 1, 3000), 'initialize opened the upstream GET, which met the restart')
  await sleep(200)

  const first = exchange(mcpUrl, { headers: session.getHeaders(undefined) }, 2000)
  t.ok(await until(() => answered.length === 2, 2000), 'the first client\'s GET opens the upstream GET again')
  const second = exchange(mcpUrl, { headers: session.getHeaders(undefined) }, 8000)
  const refused = await first
  t.equal(refused.status, 503, 'the first client gets the upstream\'s refusal')
  const joined = await second
  t.equal(joined.status, 200, 'the second client, which found the GET on its way, got a stream')
  const notices = sseEvents(joined.text).filter(e => e.data.includes(NOTICE))
  t.equal(notices.length, 1, `and what the upstream sent once it took a GET again reached it (upstream GETs answered: ${answered.join(', ')})`)
  t.equal(answered.filter(status => status === 200).length, 1, 'on one upstream GET')
})
