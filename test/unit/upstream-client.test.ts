// The upstream HTTP client (src/upstream/client.ts) against a real socket: an
// answer the gateway stops reading is dropped without an uncaught error.
import t from 'tap'
import type { Test } from 'tap'
import { createServer, type Server, type ServerResponse } from 'node:http'
import { once } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import type { AddressInfo } from 'node:net'
import { discardBody, BODY_BUFFER_BYTES, UpstreamAbort, UpstreamClient } from '../../src/upstream/client.js'

/** Listens on a free port of 127.0.0.1 until the test ends; the origin to send to. */
async function listening (t: Test, server: Server): Promise<URL> {
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => { server.closeAllConnections(); server.close() })
  return new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)
}

for (const answer of ['refused', 'streaming'] as const) {
  t.test(`discardBody: an answer dropped unread (${answer}) is released, its abort not uncaught`, async t => {
    const open = new Set<ServerResponse>()
    const server = createServer((_req, res) => {
      open.add(res)
      if (answer === 'refused') {
      // Complete, never read: undici reports destroying it as an abort (the crash seen in CI).
        res.writeHead(409, { 'content-type': 'application/json' })
        res.end('{"jsonrpc":"2.0","error":{"code":-32000,"message":"Conflict"},"id":null}')
        return
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write('data: {"n":1}\n\n')
    })
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    t.teardown(() => {
      for (const res of open) res.destroy()
      server.close()
    })
    const client = new UpstreamClient({ origin: new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}`), headersTimeoutMs: 2000 })
    t.teardown(() => client.close())

    const res = await client.request({ method: 'GET', path: '/mcp', headers: {} })
    t.equal(res.statusCode, answer === 'refused' ? 409 : 200, 'answered')
    t.equal(res.body.listenerCount('error'), 0, 'nobody listens for its errors (the case that crashed the process)')
    const errors: unknown[] = []
    const spy = (err: unknown): void => { errors.push(err) }
    // tap fails the test on an uncaught exception; this spy only shows what was kept.
    process.prependListener('uncaughtException', spy)
    t.teardown(() => process.off('uncaughtException', spy))
    discardBody(res.body)
    await sleep(50)
    t.ok(res.body.destroyed, 'the body is released')
    t.same(errors, [], 'no uncaught error')
  })
}

t.test('discardBody: a listener the caller had and removes later does not leave the error uncaught', async t => {
  const { PassThrough } = await import('node:stream')
  const body = new PassThrough()
  const temporary = (): void => {}
  body.on('error', temporary)
  discardBody(body)
  body.off('error', temporary) // e.g. a finished() handler cleaned up afterwards
  t.ok(body.destroyed, 'destroyed')
  body.emit('error', new Error('late abort'))
  t.pass('the late error is kept (tap fails the test on an uncaught one)')
})

t.test('UpstreamAbort ends a request before its answer and a stream in the middle of it', async t => {
  const closed: string[] = []
  const server = createServer((req, res) => {
    req.socket.once('close', () => closed.push(req.url ?? ''))
    if (req.url === '/silent') return // no head: the request waits
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: {"n":1}\n\n')
  })
  const client = new UpstreamClient({ origin: await listening(t, server), headersTimeoutMs: 10_000 })
  t.teardown(() => client.close())

  const early = new UpstreamAbort()
  const pending = client.request({ method: 'GET', path: '/silent', headers: {}, signal: early })
  await sleep(50)
  early.abort()
  await t.rejects(pending, { name: 'AbortError' }, 'a request waiting for its head is aborted')

  const read = new UpstreamAbort()
  const whole = await client.request({ method: 'GET', path: '/stream', headers: {}, signal: read })
  t.equal(read.listenerCount('abort'), 1, 'an open answer listens to its signal')
  const wholeClosed = new Promise(resolve => whole.body.once('close', resolve))
  discardBody(whole.body)
  await wholeClosed
  t.equal(read.listenerCount('abort'), 0, 'an answer closed without an abort lets go of its signal')

  const late = new UpstreamAbort()
  const res = await client.request({ method: 'GET', path: '/stream', headers: {}, signal: late })
  const ended = new Promise<Error | undefined>(resolve => {
    res.body.once('error', resolve)
    res.body.once('end', () => resolve(undefined))
  })
  res.body.resume()
  late.abort()
  late.abort()
  t.match(await ended, { name: 'AbortError' }, 'a streaming answer ends in an abort')
  for (let i = 0; i < 100 && closed.length < 3; i++) await sleep(10)
  t.same(closed.sort(), ['/silent', '/stream', '/stream'], 'every upstream connection closed')
  t.equal(late.listenerCount('abort'), 0, 'undici let go of the signal')
})

t.test('a request with an abort of its own: its head waited for on the clock too, its caller\'s reason reported, nothing left on that abort', async t => {
  const server = createServer((req, res) => {
    if (req.url === '/interim') {
      // "Still processing", over and over: undici starts its headers timeout again at each.
      const interim = setInterval(() => { res.writeProcessing() }, 50)
      res.on('close', () => clearInterval(interim))
      return
    }
    if (req.url === '/silent') return
    res.writeHead(200, { 'content-type': 'text/event-stream' }).end('data: {"n":1}\n\n')
  })
  const client = new UpstreamClient({ origin: await listening(t, server), headersTimeoutMs: 300 })
  t.teardown(() => client.close())

  const own = new UpstreamAbort()
  const started = Date.now()
  await t.rejects(client.request({ method: 'GET', path: '/interim', headers: {}, signal: own }), { code: 'MCPGW_UPSTREAM_TIMEOUT' }, 'interim answers do not hold it past the timeout')
  t.ok(Date.now() - started < 2000, `ended at the timeout (${Date.now() - started} ms)`)
  t.notOk(own.aborted, 'the caller\'s own abort is left as it was')
  t.equal(own.listenerCount('abort'), 0, 'and nothing listens to it any more')

  for (let i = 0; i < 3; i++) {
    const res = await client.request({ method: 'GET', path: '/done', headers: {}, signal: own })
    for await (const chunk of res.body) t.ok(chunk.length > 0)
  }
  t.equal(own.listenerCount('abort'), 0, 'answers read to their end leave nothing on an abort that outlives them')

  const reason = new Error('the caller\'s own reason')
  const controller = new AbortController()
  const pending = client.request({ method: 'GET', path: '/silent', headers: {}, signal: controller.signal })
  await sleep(50)
  controller.abort(reason)
  await t.rejects(pending, { cause: reason }, 'an AbortSignal\'s reason is what the request fails with (as undici reports it)')
})

t.test('an abort that came first: the caller\'s error, not a timeout; already aborted, nothing is sent', async t => {
  const { Agent, buildConnector } = await import('undici')
  let requests = 0
  let connectionsClosed = 0
  const server = createServer((_req, res) => {
    requests++
    res.writeHead(200).end('ok')
  })
  server.on('connection', socket => socket.on('close', () => connectionsClosed++))
  const origin = await listening(t, server)

  // Connections made slowly: the caller aborts while one is made, and the deadline passes before it is.
  const connect = buildConnector({})
  const slow = new Agent({ connect: (opts, callback) => { setTimeout(() => connect(opts, callback), 500) } })
  t.teardown(() => slow.close())
  const slowClient = new UpstreamClient({ origin, headersTimeoutMs: 200, dispatcher: slow })
  const own = new UpstreamAbort()
  const pending = slowClient.request({ method: 'GET', path: '/', headers: {}, signal: own })
  await sleep(50)
  own.abort()
  await t.rejects(pending, { name: 'AbortError' }, 'the caller\'s abort, though its request ended after the deadline')

  const client = new UpstreamClient({ origin, headersTimeoutMs: 5000 })
  t.teardown(() => client.close())
  const first = await client.request({ method: 'GET', path: '/', headers: {} })
  for await (const chunk of first.body) t.ok(chunk.length > 0)
  const before = requests
  const closedBefore = connectionsClosed
  const aborted = new UpstreamAbort()
  aborted.abort()
  await t.rejects(client.request({ method: 'GET', path: '/', headers: {}, signal: aborted }), { name: 'AbortError' }, 'a request whose abort came before it fails at once')
  const reason = new Error('gone before it started')
  await t.rejects(client.request({ method: 'GET', path: '/', headers: {}, signal: AbortSignal.abort(reason) }), { cause: reason }, 'with an AbortSignal\'s reason (as a request aborted under way reports it)')
  await sleep(50)
  t.equal(requests, before, 'neither reached the upstream')
  t.equal(connectionsClosed, closedBefore, 'and the idle upstream connection is kept')
})

t.test('several endpoints: a request naming its session\'s endpoint goes there, or fails with upstreamEndpointGone; a request without a session goes past a refusing endpoint', async t => {
  const { EndpointSet } = await import('../../src/upstream/endpoint-set.js')
  const { targetOfUrl } = await import('../../src/upstream/upstream-url.js')
  const { freePort } = await import('../fixtures/net.js')
  const server = createServer((req, res) => {
    // An initialize-like answer issues a session id; the host it saw is echoed.
    res.writeHead(200, { 'content-type': 'text/plain', ...(req.headers['mcp-session-id'] === undefined && { 'mcp-session-id': 'upstream-session-1' }) })
    res.end(req.headers.host)
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => server.close())
  const alive = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const dead = `http://127.0.0.1:${await freePort()}`
  // random 0: the first draw is the refusing endpoint, and wins the tie.
  const endpoints = new EndpointSet([dead, alive].map(o => targetOfUrl(new URL(`${o}/mcp`))), { setAsideMs: 60_000, random: () => 0 })
  const client = new UpstreamClient({ endpoints, headersTimeoutMs: 2000 })
  t.teardown(() => client.close())

  const first = await client.request({ method: 'POST', path: '/mcp', headers: {}, body: Buffer.from('{}'), newSession: true })
  t.equal(first.statusCode, 200, 'a refusing endpoint first: the request went on to the next')
  t.equal(first.endpoint, alive, 'the answer names its endpoint')
  discardBody(first.body)
  t.equal(endpoints.snapshot().find(v => v.endpoint === dead)?.state, 'set_aside')
  t.equal(endpoints.snapshot().find(v => v.endpoint === alive)?.sessionsPlaced, 1, 'the issued session is counted where it was placed')

  // The session's requests name the endpoint its record keeps (sessionRequest); a
  // session id alone is balanced like any request, so the record is the only routing.
  const again = await client.request({ method: 'GET', path: '/mcp', headers: { 'mcp-session-id': 'upstream-session-1' }, endpoint: first.endpoint })
  t.equal(again.endpoint, alive, 'a request naming the session\'s endpoint goes there')
  discardBody(again.body)
  t.equal(endpoints.snapshot().find(v => v.endpoint === alive)?.sessionsPlaced, 1, 'a request carrying a session id places no new session')
  await t.rejects(client.request({ method: 'GET', path: '/mcp', headers: {}, endpoint: dead }), { code: 'MCPGW_UPSTREAM_ENDPOINT_GONE', statusCode: 404 }, 'named, set aside: gone')
  await t.rejects(client.request({ method: 'GET', path: '/mcp', headers: {}, endpoint: 'http://10.9.9.9:1' }), { code: 'MCPGW_UPSTREAM_ENDPOINT_GONE' }, 'named, not in the set: gone')

  // A refusal on the session's own endpoint: gone as well, for the caller to establish the session elsewhere.
  const pinnedSet = new EndpointSet([alive, dead].map(o => targetOfUrl(new URL(`${o}/mcp`))), { setAsideMs: 60_000 })
  const pinned = new UpstreamClient({ endpoints: pinnedSet, headersTimeoutMs: 2000 })
  t.teardown(() => pinned.close())
  await t.rejects(pinned.request({ method: 'GET', path: '/mcp', headers: {}, endpoint: dead }), { code: 'MCPGW_UPSTREAM_ENDPOINT_GONE' })
  t.equal(pinnedSet.snapshot().find(v => v.endpoint === dead)?.state, 'set_aside', 'and set aside')
})

t.test('every endpoint refusing: a request without a session tries each once, then fails with 502', { timeout: 10_000 }, async t => {
  const { EndpointSet } = await import('../../src/upstream/endpoint-set.js')
  const { targetOfUrl } = await import('../../src/upstream/upstream-url.js')
  const { freePort } = await import('../fixtures/net.js')
  const [a, b, c] = [await freePort(), await freePort(), await freePort()]
  const name = targetOfUrl(new URL(`http://upstream.test:${c}/mcp`))
  const endpoints = new EndpointSet([`http://127.0.0.1:${a}/mcp`, `http://127.0.0.1:${b}/mcp`].map(u => targetOfUrl(new URL(u))).concat(name), { setAsideMs: 60_000 })
  // A leaving endpoint: counted in the set, never picked.
  endpoints.update(name, ['127.0.0.1'])
  endpoints.sessionPlaced(`http://127.0.0.1:${c}`)
  endpoints.update(name, ['127.0.0.2'])
  t.same(endpoints.snapshot().map(v => v.state), ['healthy', 'healthy', 'leaving', 'healthy'])
  const client = new UpstreamClient({ endpoints, headersTimeoutMs: 2000 })
  t.teardown(() => client.close())
  const tried: string[] = []
  const report = endpoints.reportFailure.bind(endpoints)
  endpoints.reportFailure = (key, err) => { tried.push(key); return report(key, err) }
  await t.rejects(client.request({ method: 'GET', path: '/mcp', headers: {} }), { code: 'MCPGW_UPSTREAM_UNAVAILABLE', statusCode: 502 })
  t.same(tried.sort(), [`http://127.0.0.1:${a}`, `http://127.0.0.1:${b}`, `http://127.0.0.2:${c}`].sort(), 'each endpoint in rotation once')
})

t.test('an answer whose reader is paused buffers BODY_BUFFER_BYTES before the upstream is paused', async t => {
  const chunk = Buffer.alloc(16 * 1024, 0x61)
  let sent = 0
  let paused = false
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    const more = (): void => {
      // What the socket takes until it pushes back, 4 MB at most.
      while (sent < 4 * 1024 * 1024) {
        sent += chunk.length
        if (!res.write(chunk)) {
          paused = true
          res.once('drain', more)
          return
        }
      }
    }
    more()
  })
  const client = new UpstreamClient({ origin: await listening(t, server), headersTimeoutMs: 2000 })
  t.teardown(() => client.destroy())

  const res = await client.request({ method: 'GET', path: '/mcp', headers: {} })
  res.body.pause()
  // The body fills while nobody reads, until undici stops reading the socket.
  let last = -1
  for (let i = 0; i < 100 && res.body.readableLength !== last; i++) {
    last = res.body.readableLength
    await sleep(50)
  }
  t.ok(paused, 'the upstream was pushed back')
  t.equal(res.body.readableHighWaterMark, BODY_BUFFER_BYTES, 'the body\'s high-water mark')
  t.ok(res.body.readableLength >= BODY_BUFFER_BYTES, `the paused body holds ${res.body.readableLength} bytes: at least ${BODY_BUFFER_BYTES} (undici's default would stop at 64 KB)`)
  t.ok(res.body.readableLength < BODY_BUFFER_BYTES + 256 * 1024, `and not much more: ${res.body.readableLength}`)
  discardBody(res.body)
})

t.test('a connection refused after the wait for a head ran out still reads as a refusal: the request goes on to the next endpoint', async t => {
  const { Agent, buildConnector } = await import('undici')
  const { EndpointSet } = await import('../../src/upstream/endpoint-set.js')
  const { targetOfUrl } = await import('../../src/upstream/upstream-url.js')
  const { freePort } = await import('../fixtures/net.js')
  const server = createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/plain' }).end('served'))
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => server.close())
  const alive = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const deadPort = await freePort()
  const dead = `http://127.0.0.1:${deadPort}`
  // The dead endpoint's connect is refused only after the head's wait (100 ms) ran out, as
  // a host that does not answer ARP is: undici cannot abort a connection being made.
  const connect = buildConnector({})
  const dispatcher = new Agent({
    connect: (options, callback) => {
      if (Number(options.port) !== deadPort) {
        connect(options, callback)
        return
      }
      setTimeout(() => { callback(Object.assign(new Error(`connect ECONNREFUSED 127.0.0.1:${deadPort}`), { code: 'ECONNREFUSED' }), null) }, 300)
    }
  })
  t.teardown(() => dispatcher.close())
  const endpoints = new EndpointSet([dead, alive].map(o => targetOfUrl(new URL(`${o}/mcp`))), { setAsideMs: 60_000, random: () => 0 })
  const client = new UpstreamClient({ endpoints, headersTimeoutMs: 100, dispatcher })
  const res = await client.request({ method: 'POST', path: '/mcp', headers: {}, body: Buffer.from('{}'), newSession: true })
  t.equal(res.statusCode, 200, 'served by the next endpoint, not 504')
  t.equal(res.endpoint, alive)
  discardBody(res.body)
  t.equal(endpoints.snapshot().find(v => v.endpoint === dead)?.state, 'set_aside', 'the refusing endpoint is set aside')
})
