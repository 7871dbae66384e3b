// Idle upstream connections and an upstream that closes them without saying
// when (no Keep-Alive timeout hint, as uvicorn and gunicorn answer). A request
// written on such a connection just as the upstream closes it is lost on the
// way (the gateway gets a reset, not an answer, and cannot send it again: it
// may have run). The gateway keeps an idle connection no longer than
// UPSTREAM_KEEPALIVE_TIMEOUT_MS, so an upstream that closes later never sees
// a request on a connection it is closing. The race is made certain here: the
// upstream drops a connection that carries a request after being idle longer
// than its own timeout. Hand-written upstream (node:http), embedded store, raw
// HTTP.
import t from 'tap'
import type { Test } from 'tap'
import { createServer } from 'node:http'
import type { Socket } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from 'undici'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, postsOnly } from '../fixtures/hand-upstream.js'
import { metricSum, metrics, rawInitialize } from '../fixtures/hardening.js'

t.setTimeout(60_000)

/** The upstream's own idle timeout, which it announces to no one. */
const UPSTREAM_IDLE_MS = 2000

interface Upstream {
  readonly url: string
  /** Connections the upstream dropped because a request came after its idle timeout. */
  readonly dropped: () => number
  /** Connections the upstream accepted. */
  readonly connections: () => number
}

async function closingUpstream (t: Test): Promise<Upstream> {
  const idleSince = new WeakMap<Socket, number>()
  let dropped = 0
  let connections = 0
  const server = createServer(postsOnly((message, _req, res) => {
    if (message.method === 'initialize') answerInitialize(res, message, 'keepalive-session-01', '2025-06-18')
    else if (message.id === undefined) res.writeHead(202).end()
    else {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ jsonrpc: '2.0', id: message.id, result: { content: [] } }))
    }
  }))
  server.on('connection', () => { connections++ })
  // Seen before the handler, which reads the body first.
  server.prependListener('request', (req, res) => {
    const socket = req.socket
    const since = idleSince.get(socket)
    if (since !== undefined && Date.now() - since > UPSTREAM_IDLE_MS) {
      dropped++
      socket.destroy()
      return
    }
    idleSince.delete(socket)
    res.on('finish', () => idleSince.set(socket, Date.now()))
    // No Keep-Alive: timeout=… hint: Node sends none when the answer names its Connection itself.
    res.setHeader('connection', 'keep-alive')
  })
  return { url: await listenUntilEnd(t, server), dropped: () => dropped, connections: () => connections }
}

async function callAfterIdle (t: Test, keepAliveMs: number): Promise<{ status: number, upstream: Upstream, requestErrors: number }> {
  const upstream = await closingUpstream(t)
  const gw = await startGateway(t, 'memory', upstream.url, { UPSTREAM_KEEPALIVE_TIMEOUT_MS: String(keepAliveMs) })
  const session = await rawInitialize(`${gw.url}/mcp`)
  // Every upstream connection the gateway holds is idle for longer than the upstream keeps it.
  await sleep(UPSTREAM_IDLE_MS + 600)
  const answer = await request(`${gw.url}/mcp`, {
    method: 'POST',
    headers: session.headers(),
    body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'x', arguments: {} } })
  })
  await answer.body.text()
  const requestErrors = metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_errors_total', { kind: 'request' })
  return { status: answer.statusCode, upstream, requestErrors }
}

t.test('an idle connection is let go before the upstream closes it: the call after a pause is answered', async t => {
  const { status, upstream, requestErrors } = await callAfterIdle(t, 300)
  t.equal(status, 200, 'the upstream\'s answer')
  t.equal(requestErrors, 0, 'no upstream request failed')
  t.equal(upstream.dropped(), 0, 'no request came on a connection the upstream was closing')
  t.ok(upstream.connections() >= 2, 'the call went on a new connection')
})

t.test('the control: kept longer than the upstream keeps it, the call is lost on the way', async t => {
  const { status, upstream, requestErrors } = await callAfterIdle(t, 30_000)
  t.equal(upstream.dropped(), 1, 'the call came on a connection the upstream was closing')
  t.equal(status, 502, 'and the client gets 502, the call not sent again')
  t.equal(requestErrors, 1, 'counted as a failed upstream request')
})
