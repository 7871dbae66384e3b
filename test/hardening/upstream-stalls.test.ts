// Upstream answers the gateway reads the start of before passing them on, and
// which stall part way: an initialize's answer before its result, and a short
// 400 (read to tell whether it says the session is unknown) before its end.
// Each is passed on within a bound, so that neither the client waits on
// nothing nor the gateway holds the request and the upstream connection for as
// long as the upstream stalls. Hand-written upstream (node:http), gateway on
// the embedded store, raw HTTP.
import t from 'tap'
import type { Test } from 'tap'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, postsOnly } from '../fixtures/hand-upstream.js'
import { ACCEPT_BOTH, metricSum, metrics, rawInitialize, RawSse, rawRequest, until, type RawSession } from '../fixtures/hardening.js'

t.setTimeout(60_000)

const VERSION = '2025-06-18'
const INIT = JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: VERSION, capabilities: {}, clientInfo: { name: 'stalls', version: '0' } } })
const POST_HEADERS = { accept: ACCEPT_BOTH, 'content-type': 'application/json', 'mcp-protocol-version': VERSION }

/**
 * A POST-only upstream whose sessions answer initialize and notifications as
 * usual; each request of the session (a call) goes to `onCall`.
 */
function sessionPosts (upstreamSessionId: string, onCall: (res: ServerResponse) => void): (req: IncomingMessage, res: ServerResponse) => void {
  return postsOnly((message, _req, res) => {
    if (message.method === 'initialize') answerInitialize(res, message, upstreamSessionId, VERSION)
    else if (message.id === undefined) res.writeHead(202).end()
    else onCall(res)
  })
}

/** A call's answer that ends early, after its priming event (SEP-1699): the gateway resumes it. */
function endEarly (res: ServerResponse): void {
  res.writeHead(200, { 'content-type': 'text/event-stream' })
  res.end('id: p0\nretry: 100\ndata:\n\n')
}

/** A tools/call of the session, raw, read as it comes. */
function callTool (t: Test, port: number, session: RawSession, id: number): RawSse {
  const call = new RawSse(port, rawRequest('POST', '/mcp', Object.entries(session.headers()), JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'x', arguments: {} } })))
  t.teardown(() => call.close())
  return call
}

t.test('an initialize whose answer stalls before its result: passed on within the wait, the session without a recipe', async t => {
  const upstreamUrl = await listenUntilEnd(t, createServer(postsOnly((message, _req, res) => {
    // The head, and the start of a body that never ends.
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': '400', 'mcp-session-id': 'stalled-initialize-01' })
    res.write('{"jsonrpc":"2.0",')
  })))
  const gw = await startGateway(t, 'memory', upstreamUrl)
  const started = Date.now()
  const init = new RawSse(gw.port, rawRequest('POST', '/mcp', Object.entries(POST_HEADERS), INIT))
  t.teardown(() => init.close())
  t.ok(await init.waitFor(s => s.status !== undefined, 20_000), 'the client gets the answer\'s head')
  t.comment(`after ${Date.now() - started} ms`)
  t.equal(init.status, 200, 'the upstream\'s')
  const sessionId = init.headers['mcp-session-id'] as string
  t.type(sessionId, 'string', 'with the gateway\'s session id')
  t.not(await gw.store.getSession(sessionId), null, 'the session is recorded')
  t.equal(await gw.store.recipe(sessionId), null, 'without a recipe: its result never came')
})

t.test('a 400 whose short body stalls: passed on within a second, not read as a lost session', async t => {
  const upstreamUrl = await listenUntilEnd(t, createServer(sessionPosts('stalled-400-session-01', res => {
    res.writeHead(400, { 'content-type': 'text/plain', 'content-length': '100' })
    res.write('Bad Reque')
  })))
  const gw = await startGateway(t, 'memory', upstreamUrl)
  const session = await rawInitialize(`${gw.url}/mcp`, { version: VERSION })
  const started = Date.now()
  const call = callTool(t, gw.port, session, 3)
  t.ok(await call.waitFor(s => s.status !== undefined, 10_000), 'the client gets the answer\'s head')
  t.comment(`after ${Date.now() - started} ms`)
  t.equal(call.status, 400, 'the upstream\'s 400')
  t.not(await gw.store.getSession(session.sessionId), null, 'the session is kept: nothing said it was unknown')
})

t.test('interim answers (102 Processing) do not hold a request past UPSTREAM_HEADERS_TIMEOUT_SECONDS', async t => {
  let upstreamClosed = false
  const upstreamUrl = await listenUntilEnd(t, createServer(sessionPosts('interim-session-01', res => {
    // "Still processing", over and over, and never the answer.
    const interim = setInterval(() => { res.writeProcessing() }, 200)
    res.on('close', () => {
      clearInterval(interim)
      upstreamClosed = true
    })
  })))
  const gw = await startGateway(t, 'memory', upstreamUrl, { UPSTREAM_HEADERS_TIMEOUT_SECONDS: '1' })
  const session = await rawInitialize(`${gw.url}/mcp`, { version: VERSION })
  const started = Date.now()
  const call = callTool(t, gw.port, session, 4)
  t.ok(await call.waitFor(s => s.status !== undefined, 8000), 'the client gets an answer')
  const waited = Date.now() - started
  t.equal(call.status, 504, `the gateway's timeout (after ${waited} ms)`)
  t.ok(waited < 4000, 'within the headers timeout, interim answers or not')
  t.ok(await until(() => upstreamClosed, 3000), 'and the upstream request is ended')
})

t.test('a call\'s answer resumed upstream and held open, events or not, ends at UPSTREAM_RESUME_MAX_SECONDS with the gateway\'s error', async t => {
  let resumedClosed = false
  const upstreamUrl = await listenUntilEnd(t, createServer((req, res) => {
    if (req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.flushHeaders()
      if (req.headers['last-event-id'] === undefined) return // the standalone stream: silent
      // The resumed answer: a notification now and then, never the response.
      let n = 0
      const notices = setInterval(() => { res.write(`id: e${++n}\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":${n}}}\n\n`) }, 300)
      res.on('close', () => {
        clearInterval(notices)
        resumedClosed = true
      })
      return
    }
    sessionPosts('resume-expiry-session-01', endEarly)(req, res)
  }))
  const gw = await startGateway(t, 'memory', upstreamUrl, { UPSTREAM_RESUME_MAX_SECONDS: '2' })
  const session = await rawInitialize(`${gw.url}/mcp`, { version: VERSION })
  const started = Date.now()
  const call = callTool(t, gw.port, session, 7)
  t.ok(await call.waitFor(s => s.ended || s.closed, 10_000), 'the call\'s stream ends')
  const waited = Date.now() - started
  t.ok(waited >= 2000 && waited < 4000, `at the deadline, not before (after ${waited} ms)`)
  t.ok(call.events.some(e => e.data.includes('notifications/message')), 'what the resumed answer brought was passed on meanwhile')
  t.match(JSON.parse(call.events.at(-1)?.data ?? '{}'), { id: 7, error: { code: -32000 } }, 'then the gateway\'s error in place of the response')
  t.ok(await until(() => resumedClosed, 3000), 'and the resumed upstream answer is ended')
  const text = await metrics(gw.adminUrl)
  t.equal(metricSum(text, 'mcpgw_upstream_errors_total', { kind: 'resume_expired' }), 1, 'counted as resumes run out')
  t.equal(metricSum(text, 'mcpgw_upstream_errors_total', { kind: 'stream_broken' }), 0, 'not as an answer that broke off')
})

t.test('interim answers to the session\'s standalone GET: it ends at UPSTREAM_HEADERS_TIMEOUT_SECONDS and is asked again', async t => {
  const gets: Array<{ opened: number, closed?: number }> = []
  const posts = sessionPosts('interim-get-session-01', res => {
    res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
  })
  const upstreamUrl = await listenUntilEnd(t, createServer((req, res) => {
    if (req.method !== 'GET') return posts(req, res)
    const get: { opened: number, closed?: number } = { opened: Date.now() }
    gets.push(get)
    if (gets.length === 1) {
      // The first GET: "still processing", over and over, and never its head.
      const interim = setInterval(() => { res.writeProcessing() }, 200)
      res.on('close', () => {
        clearInterval(interim)
        get.closed = Date.now()
      })
      return
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"after the stall"}}\n\n')
  }))
  const gw = await startGateway(t, 'memory', upstreamUrl, { UPSTREAM_HEADERS_TIMEOUT_SECONDS: '1' })
  const session = await rawInitialize(`${gw.url}/mcp`, { version: VERSION })
  const get = new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders())))
  t.teardown(() => get.close())
  t.ok(await until(() => gets[0]?.closed !== undefined, 8000), 'the stalled upstream GET is ended')
  const stalled = gets[0] as { opened: number, closed?: number }
  const held = (stalled.closed ?? Infinity) - stalled.opened
  t.ok(held < 4000, `within the headers timeout, interim answers or not (held ${held} ms)`)
  t.ok(await get.waitFor(s => s.events.some(e => e.data.includes('after the stall')), 10_000), 'the client gets what the GET asked again brings')
  t.equal(get.status, 200)
})

for (const answered of [0, 1]) {
  t.test(`a resume the upstream never answers when UPSTREAM_RESUME_MAX_SECONDS passes is aborted then, not waited for (${answered} answered before it)`, async t => {
    const resumes: Array<{ closed: boolean }> = []
    const upstreamUrl = await listenUntilEnd(t, createServer((req, res) => {
      if (req.method === 'GET') {
        if (req.headers['last-event-id'] === undefined) {
          res.writeHead(200, { 'content-type': 'text/event-stream' })
          res.flushHeaders()
          return // the standalone stream: silent
        }
        const resume = { closed: false }
        resumes.push(resume)
        res.on('close', () => { resume.closed = true })
        // The first `answered` resumes bring a notification and end early again; the next is never answered.
        if (resumes.length <= answered) {
          res.writeHead(200, { 'content-type': 'text/event-stream' })
          res.end('id: e1\nretry: 100\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":1}}\n\n')
        }
        return
      }
      sessionPosts('resume-asked-expiry-session-01', endEarly)(req, res)
    }))
    const gw = await startGateway(t, 'memory', upstreamUrl, { UPSTREAM_RESUME_MAX_SECONDS: '2', UPSTREAM_HEADERS_TIMEOUT_SECONDS: '20' })
    const session = await rawInitialize(`${gw.url}/mcp`, { version: VERSION })
    const started = Date.now()
    const call = callTool(t, gw.port, session, 8)
    t.ok(await call.waitFor(s => s.ended || s.closed, 15_000), 'the call\'s stream ends')
    const waited = Date.now() - started
    t.equal(resumes.length, answered + 1, 'the unanswered resume was asked for')
    t.ok(waited >= 2000 && waited < 5000, `at the deadline, not at the headers timeout (after ${waited} ms)`)
    t.match(JSON.parse(call.events.at(-1)?.data ?? '{}'), { id: 8, error: { code: -32000 } }, 'with the gateway\'s error in place of the response')
    t.ok(await until(() => resumes[answered]?.closed === true, 3000), 'and the resume asked for is ended upstream')
    const text = await metrics(gw.adminUrl)
    t.equal(metricSum(text, 'mcpgw_upstream_errors_total', { kind: 'resume_expired' }), 1, 'counted as resumes run out')
    t.equal(metricSum(text, 'mcpgw_upstream_errors_total', { kind: 'stream_broken' }), 0, 'not as an answer that broke off')
    t.equal(metricSum(text, 'mcpgw_upstream_errors_total', { kind: 'request' }), 0, 'nor as a failed upstream request: the gateway aborted it')
  })
}

t.test('answers held open with comments only end with their session\'s DELETE, though their clients left and no event comes', async t => {
  const open = new Set<ServerResponse>()
  const tickers: NodeJS.Timeout[] = []
  t.teardown(() => { tickers.forEach(clearInterval) })
  const upstreamUrl = await listenUntilEnd(t, createServer((req, res) => {
    if (req.method === 'DELETE') {
      res.writeHead(200).end()
      return
    }
    postsOnly((message, _req, res) => {
      if (message.method === 'initialize') return answerInitialize(res, message, 'held-open-session-01', VERSION)
      if (message.method === 'notifications/initialized') return res.writeHead(202).end()
      // A call, and another notification: a head, then comments, for as long as the connection lasts.
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(': open\n\n')
      open.add(res)
      res.on('close', () => open.delete(res))
      tickers.push(setInterval(() => res.write(': still here\n\n'), 200))
    })(req, res)
  }))
  const gw = await startGateway(t, 'memory', upstreamUrl)
  const session = await rawInitialize(`${gw.url}/mcp`, { version: VERSION })
  const call = callTool(t, gw.port, session, 7)
  const notification = new RawSse(gw.port, rawRequest('POST', '/mcp', Object.entries(session.headers()), JSON.stringify({ jsonrpc: '2.0', method: 'notifications/roots/list_changed' })))
  t.teardown(() => notification.close())
  t.ok(await call.waitFor(s => s.status !== undefined, 5000) && await notification.waitFor(s => s.status !== undefined, 5000), 'both answered with a head')
  t.ok(await until(() => open.size === 2, 2000), 'two answers held open upstream')
  call.close()
  notification.close()
  await sleep(300)
  t.equal(open.size, 2, 'the clients leaving does not end them (disconnect is not cancellation)')

  const deleted = await fetch(`${gw.url}/mcp`, { method: 'DELETE', headers: session.headers() })
  t.equal(deleted.status, 200, 'the session is deleted')
  t.ok(await until(() => open.size === 0, 3000), `nothing of it is still read upstream (${open.size} open)`)
  t.ok(await until(async () => metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_streams_open', { kind: 'request' }) === 0, 3000), 'no request stream counted open')
})
