// The HTTP edge of the gateway, client side and toward the upstream: Host
// checks (DNS rebinding), absolute-form targets, forwarding headers and
// trusted proxies, Expect: 100-continue, the request read timeout,
// connection caps, the upstream's Cache-Control on recorded streams and the
// JSON-RPC id of error answers. A recording upstream shows what got through.
import t from 'tap'
import type { Test } from 'tap'
import { once } from 'node:events'
import { connect, type Socket } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from 'undici'
import { startGateway, type RunningGateway } from '../fixtures/gateway.js'
import { freePort, jsonRpcError, parseRawResponse, rawHttp } from '../fixtures/hardening.js'
import { INITIALIZE, MCP_HEADERS, startRecordingUpstream, type RecordingUpstream } from '../fixtures/recording-upstream.js'
import { ROUTED_METHODS } from '../../src/routes/forward.js'

async function gatewayFor (t: Test, env: Record<string, string> = {}): Promise<{ gw: RunningGateway, upstream: RecordingUpstream }> {
  const upstream = await startRecordingUpstream(t)
  const gw = await startGateway(t, 'memory', `${upstream.url}/mcp`, env)
  return { gw, upstream }
}

async function get (url: string, headers: Record<string, string> = {}): Promise<{ status: number, text: string }> {
  const res = await request(url, { headers })
  return { status: res.statusCode, text: await res.body.text() }
}

/** A raw request line and headers, exactly as written. */
function raw (lines: readonly string[], body = ''): Buffer {
  return Buffer.from(lines.join('\r\n') + '\r\n\r\n' + body, 'latin1')
}

async function openSocket (port: number): Promise<Socket> {
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => {})
  await once(socket, 'connect')
  return socket
}

/** Resolves with what the socket received once the server closed it (or null if still open after `ms`). */
async function closedWithin (socket: Socket, ms: number): Promise<{ data: Buffer, afterMs: number } | null> {
  const started = performance.now()
  const chunks: Buffer[] = []
  socket.on('data', (c: Buffer) => chunks.push(c))
  if (socket.destroyed) return { data: Buffer.alloc(0), afterMs: 0 }
  const closed = once(socket, 'close').then(() => true)
  const outcome = await Promise.race([closed, sleep(ms).then(() => false)])
  return outcome ? { data: Buffer.concat(chunks), afterMs: performance.now() - started } : null
}

t.test('Host: a name not allowed gets 403 before anything reaches the upstream (MCP path and proxied paths)', async t => {
  const { gw, upstream } = await gatewayFor(t)
  const port = gw.port
  // The conformance suite's probe: Host and Origin both the attacker's name.
  const evil = { host: 'evil.example.com', origin: 'http://evil.example.com' }
  const post = await request(`${gw.url}/mcp`, { method: 'POST', headers: { ...MCP_HEADERS, ...evil }, body: INITIALIZE })
  t.equal(post.statusCode, 403, 'initialize with Host evil.example.com')
  t.match(jsonRpcError(await post.body.text())?.message, /ALLOWED_HOSTS/)
  t.equal((await get(`${gw.url}/.well-known/oauth-protected-resource`, evil)).status, 403, 'a proxied path')
  t.equal((await get(`${gw.url}/nothing-here`, { host: `evil.example.com:${port}` })).status, 403, 'with a port')
  t.equal((await get(`${gw.url}/x`, { host: 'localhost.evil.example.com' })).status, 403, 'a name that only starts like localhost')
  t.equal((await rawHttp(port, raw(['GET /x HTTP/1.0']))).status, 403, 'no Host at all (HTTP/1.0)')
  t.equal((await rawHttp(port, raw(['GET /x HTTP/1.1', 'host: user@localhost', 'connection: close']))).status, 400, 'a Host with userinfo: malformed (RFC 9112), 400')
  t.equal((await rawHttp(port, raw(['GET /x HTTP/1.1', 'host: localhost:99999', 'connection: close']))).status, 400, 'a port past 65535: 400')
  t.equal((await rawHttp(port, raw(['GET /x HTTP/1.1', 'host: localhost', 'host: evil.example.com', 'connection: close']))).status, 400, 'two Host lines: 400')
  t.equal((await rawHttp(port, raw(['GET /x HTTP/1.1', 'host: evil.example.com', 'host: localhost', 'connection: close']))).status, 400, 'two Host lines, either order: 400')
  t.equal(upstream.seen.length, 0, 'the upstream saw none of them')

  for (const host of [`localhost:${port}`, `127.0.0.1:${port}`, 'LOCALHOST', 'localhost.']) {
    t.equal((await get(`${gw.url}/x`, { host })).status, 200, `Host ${host} is served`)
  }
  const ok = await request(`${gw.url}/mcp`, { method: 'POST', headers: { ...MCP_HEADERS, host: `localhost:${port}`, origin: `http://localhost:${port}` }, body: INITIALIZE })
  await ok.body.text()
  t.equal(ok.statusCode, 200, 'initialize with a localhost Host')
})

t.test('Host: ALLOWED_HOSTS lists names (subdomains with *.); * turns the check off', async t => {
  const listed = await gatewayFor(t, { ALLOWED_HOSTS: 'mcp.example.com, *.corp.example' })
  t.equal((await get(`${listed.gw.url}/x`, { host: 'mcp.example.com' })).status, 200)
  t.equal((await get(`${listed.gw.url}/x`, { host: 'a.b.corp.example:443' })).status, 200)
  t.equal((await get(`${listed.gw.url}/x`, { host: 'corp.example' })).status, 403, '*.corp.example is subdomains only')
  t.equal((await get(`${listed.gw.url}/x`, { host: 'localhost' })).status, 403, 'a list replaces the default')
  const open = await gatewayFor(t, { ALLOWED_HOSTS: '*' })
  t.equal((await get(`${open.gw.url}/x`, { host: 'evil.example.com' })).status, 200)
})

t.test('absolute-form targets: checked like Host, forwarded in origin-form', async t => {
  const { gw, upstream } = await gatewayFor(t)
  const other = await rawHttp(gw.port, raw(['GET http://other-host/x HTTP/1.1', 'host: 127.0.0.1', 'connection: close']))
  t.equal(other.status, 403, 'an authority not allowed is refused, whatever Host says')
  t.equal(upstream.seen.length, 0)
  const local = await rawHttp(gw.port, raw([`GET http://localhost:${gw.port}/echo?q=1 HTTP/1.1`, 'host: 127.0.0.1', 'connection: close']))
  t.equal(local.status, 200)
  t.equal(upstream.seen.at(-1)?.url, '/echo?q=1', 'the upstream gets the path and query only')
  const headers = Object.entries(MCP_HEADERS).map(([k, v]) => `${k}: ${v}`)
  const mcp = await rawHttp(gw.port, raw(['POST http://localhost/mcp HTTP/1.1', 'host: localhost', 'connection: close', ...headers, `content-length: ${INITIALIZE.length}`], INITIALIZE))
  t.equal(mcp.status, 200)
  t.equal(mcp.headers['content-type'], 'text/event-stream', 'the MCP endpoint served it: a recorded stream')
  t.equal(upstream.seen.at(-1)?.url, '/mcp')
})

t.test('OPTIONS *: the gateway answers for itself, naming every method it routes; nothing reaches the upstream', async t => {
  const { gw, upstream } = await gatewayFor(t)
  const answer = await rawHttp(gw.port, raw(['OPTIONS * HTTP/1.1', 'host: 127.0.0.1', 'connection: close']))
  t.equal(answer.status, 204)
  t.same(answer.headers.allow?.split(', ').sort(), ['DELETE', 'GET', 'HEAD', 'OPTIONS', 'PATCH', 'POST', 'PUT'], 'Allow lists the methods routed, PUT and PATCH included')
  t.same(answer.headers.allow?.split(', '), ROUTED_METHODS, 'the very list the routes are registered with')
  t.equal(upstream.seen.length, 0)
})

t.test('forwarding headers: a client\'s are dropped, the gateway says what it saw', async t => {
  const { gw, upstream } = await gatewayFor(t)
  const forged = {
    host: `localhost:${gw.port}`,
    'x-forwarded-for': '198.51.100.1',
    'x-forwarded-host': 'evil.example.com',
    'x-forwarded-proto': 'https',
    'x-forwarded-port': '443',
    'x-real-ip': '198.51.100.1',
    forwarded: 'for=198.51.100.1;host=evil.example.com;proto=https'
  }
  t.equal((await get(`${gw.url}/.well-known/oauth-authorization-server`, forged)).status, 200)
  const seen = upstream.seen.at(-1)?.headers ?? {}
  t.equal(seen['x-forwarded-for'], '127.0.0.1', 'X-Forwarded-For: the peer only')
  t.equal(seen['x-forwarded-host'], `localhost:${gw.port}`, 'X-Forwarded-Host: the Host the gateway served')
  t.equal(seen['x-forwarded-proto'], 'http', 'X-Forwarded-Proto: the connection\'s')
  for (const name of ['forwarded', 'x-forwarded-port', 'x-real-ip']) t.notOk(name in seen, `${name} dropped`)
  const post = await request(`${gw.url}/mcp`, { method: 'POST', headers: { ...MCP_HEADERS, ...forged }, body: INITIALIZE })
  await post.body.text()
  const mcpSeen = upstream.seen.at(-1)?.headers ?? {}
  t.equal(mcpSeen['x-forwarded-for'], '127.0.0.1', 'the MCP path too')
  t.notOk('forwarded' in mcpSeen)
})

t.test('forwarding headers: from TRUSTED_PROXIES they are kept, appended to, and Host is checked on X-Forwarded-Host', async t => {
  const { gw, upstream } = await gatewayFor(t, { TRUSTED_PROXIES: 'loopback' })
  const viaProxy = { 'x-forwarded-for': '198.51.100.1', 'x-forwarded-host': 'localhost', 'x-forwarded-proto': 'https', forwarded: 'for=198.51.100.1' }
  t.equal((await get(`${gw.url}/x`, viaProxy)).status, 200)
  const seen = upstream.seen.at(-1)?.headers ?? {}
  t.equal(seen['x-forwarded-for'], '198.51.100.1, 127.0.0.1', 'the proxy\'s list, then the proxy')
  t.equal(seen['x-forwarded-host'], 'localhost')
  t.equal(seen['x-forwarded-proto'], 'https')
  t.equal(seen.forwarded, 'for=198.51.100.1')
  t.equal((await get(`${gw.url}/x`, { ...viaProxy, 'x-forwarded-host': 'evil.example.com' })).status, 403, 'the name the client used is the one checked')
})

t.test('forwarding headers from TRUSTED_PROXIES: Host always checked, every X-Forwarded-Host entry too, one value passed on', async t => {
  const { gw, upstream } = await gatewayFor(t, { TRUSTED_PROXIES: 'loopback' })
  const before = upstream.seen.length
  t.equal((await get(`${gw.url}/x`, { host: 'evil.example.com', 'x-forwarded-host': 'evil.example.com, localhost' })).status, 403, 'Host evil.example.com, the last entry allowed: 403')
  t.equal((await get(`${gw.url}/x`, { host: 'evil.example.com', 'x-forwarded-host': 'localhost' })).status, 403, 'Host is checked even when X-Forwarded-Host is allowed')
  t.equal((await get(`${gw.url}/x`, { 'x-forwarded-host': 'evil.example.com, localhost' })).status, 403, 'an entry the client put before the proxy\'s: 403')
  t.equal((await get(`${gw.url}/x`, { 'x-forwarded-host': 'localhost:99999' })).status, 400, 'a malformed entry: 400')
  for (const proto of ['javascript', 'https, ftp', 'HTTPS2', '']) {
    t.equal((await get(`${gw.url}/x`, { 'x-forwarded-proto': proto })).status, 400, `X-Forwarded-Proto "${proto}": 400`)
  }
  // Forwarded goes on as it is from a trusted proxy: a framework may read its host rather than X-Forwarded-Host.
  t.equal((await get(`${gw.url}/x`, { forwarded: 'for=192.0.2.1;host=evil.example.com;proto=https' })).status, 403, 'Forwarded host=evil.example.com: 403')
  t.equal((await get(`${gw.url}/x`, { forwarded: 'host=localhost, for=192.0.2.1;host=evil.example.com' })).status, 403, 'in a later element: 403')
  t.equal((await get(`${gw.url}/x`, { forwarded: 'proto=javascript' })).status, 400, 'Forwarded proto=javascript: 400')
  t.equal((await get(`${gw.url}/x`, { forwarded: 'host=localhost:8443' })).status, 400, 'a Forwarded that does not parse (a port unquoted): 400')
  t.equal(upstream.seen.length, before, 'the upstream saw none of them')
  t.equal((await get(`${gw.url}/x`, { 'x-forwarded-host': 'LocalHost:8443, 127.0.0.1', 'x-forwarded-proto': 'HTTPS, http', forwarded: 'for=192.0.2.1;host="localhost:8443";proto=https' })).status, 200)
  const seen = upstream.seen.at(-1)?.headers ?? {}
  t.equal(seen['x-forwarded-host'], 'localhost:8443', 'the first entry (the name the client used), alone, lower case')
  t.equal(seen['x-forwarded-proto'], 'https', 'one scheme')
  t.equal(seen.forwarded, 'for=192.0.2.1;host="localhost:8443";proto=https', 'a Forwarded whose hosts are allowed goes on as it is')
})

/** Sends a request with Expect: 100-continue the way curl does: the body only after 100 Continue. */
async function expectContinue (port: number, path: string, headers: readonly string[], body: string): Promise<{ continued: boolean, status: number | undefined, text: string }> {
  const socket = await openSocket(port)
  const chunks: Buffer[] = []
  socket.on('data', (c: Buffer) => chunks.push(c))
  socket.write(raw([`POST ${path} HTTP/1.1`, 'host: 127.0.0.1', 'connection: close', 'expect: 100-continue', `content-length: ${Buffer.byteLength(body)}`, ...headers]).toString('latin1'))
  const deadline = Date.now() + 2000
  while (!Buffer.concat(chunks).includes('\r\n\r\n') && Date.now() < deadline) await sleep(10)
  const interim = Buffer.concat(chunks).toString('latin1')
  const continued = interim.startsWith('HTTP/1.1 100 Continue\r\n\r\n')
  chunks.length = 0
  if (continued) chunks.push(Buffer.from(interim.slice('HTTP/1.1 100 Continue\r\n\r\n'.length), 'latin1'))
  socket.write(body)
  await Promise.race([once(socket, 'close'), sleep(3000)])
  socket.destroy()
  const answer = parseRawResponse(Buffer.concat(chunks))
  return { continued, status: answer.status, text: answer.text }
}

t.test('a Connection header cannot drop PRINCIPAL_HEADER on the way upstream: the gateway bound the session to it', async t => {
  const { gw, upstream } = await gatewayFor(t, { PRINCIPAL_HEADER: 'x-api-key' })
  const before = upstream.seen.length
  const answer = await rawHttp(gw.port, raw(['GET /other HTTP/1.1', 'host: 127.0.0.1', 'connection: close, X-Api-Key, x-debug', 'x-api-key: k-1', 'x-debug: 1']))
  t.equal(answer.status, 200)
  t.equal(upstream.seen.length, before + 1, 'forwarded')
  const seen = upstream.seen.at(-1)?.headers ?? {}
  t.equal(seen['x-api-key'], 'k-1', 'the principal header reached the upstream')
  t.notOk('x-debug' in seen, 'another header the Connection header named did not')
})

t.test('Expect: 100-continue is answered here and the request goes through', async t => {
  const { gw, upstream } = await gatewayFor(t)
  const body = JSON.stringify({ big: 'x'.repeat(2000) })
  const proxied = await expectContinue(gw.port, '/upload', ['content-type: application/json'], body)
  t.ok(proxied.continued, '100 Continue first')
  t.equal(proxied.status, 200, 'a proxied path: 200, not 502')
  t.equal(upstream.seen.at(-1)?.body, body, 'the upstream got the body')
  t.notOk('expect' in (upstream.seen.at(-1)?.headers ?? {}), 'and no Expect')
  const mcp = await expectContinue(gw.port, '/mcp', Object.entries(MCP_HEADERS).map(([k, v]) => `${k}: ${v}`), INITIALIZE)
  t.ok(mcp.continued)
  t.equal(mcp.status, 200, 'the MCP path: 200')
  t.match(mcp.text, /"serverInfo"/)
})

t.test('a request whose body stalls is answered 408 and closed after REQUEST_READ_TIMEOUT_SECONDS; answers are not timed', async t => {
  const { gw, upstream } = await gatewayFor(t, { REQUEST_READ_TIMEOUT_SECONDS: '1' })
  for (const path of ['/mcp', '/upload']) {
    const socket = await openSocket(gw.port)
    socket.write(raw([`POST ${path} HTTP/1.1`, 'host: 127.0.0.1', 'content-type: application/json', ...Object.entries(MCP_HEADERS).slice(1).map(([k, v]) => `${k}: ${v}`), 'content-length: 100000'], '{"jsonrpc":'))
    const closed = await closedWithin(socket, 5000)
    t.ok(closed !== null, `${path}: the stalled connection was closed`)
    t.ok(closed !== null && closed.afterMs < 3500, `${path}: within the timeout and a check interval (${Math.round(closed?.afterMs ?? -1)} ms)`)
    t.equal(parseRawResponse(closed?.data ?? Buffer.alloc(0)).status, 408, `${path}: 408`)
  }
  t.notOk(upstream.seen.some(s => s.url === '/mcp'), 'the stalled MCP request never reached the upstream')
  // An answer that takes longer than the read timeout is not cut.
  const slow = await get(`${gw.url}/slow?delayMs=2500`)
  t.equal(slow.status, 200, 'a 2.5 s answer after a 1 s read timeout')
})

t.test('connections per address are capped: the excess gets 503 and is closed, at once', async t => {
  const { gw } = await gatewayFor(t, { MAX_CONNECTIONS_PER_ADDRESS: '3' })
  const held = await Promise.all([1, 2, 3].map(async () => await openSocket(gw.port)))
  t.teardown(() => { for (const s of held) s.destroy() })
  const extra = await openSocket(gw.port)
  const refused = await closedWithin(extra, 2000)
  t.ok(refused !== null, 'the fourth connection is closed')
  t.equal(parseRawResponse(refused?.data ?? Buffer.alloc(0)).status, 503)
  held.pop()?.destroy()
  await sleep(50)
  t.equal((await get(`${gw.url}/x`)).status, 200, 'with one closed, a new connection is served')
})

t.test('connections per process are capped; trusted proxies only count there', async t => {
  const { gw } = await gatewayFor(t, { MAX_CONNECTIONS: '4', MAX_CONNECTIONS_PER_ADDRESS: '2', TRUSTED_PROXIES: '127.0.0.1' })
  const held = await Promise.all([1, 2, 3, 4].map(async () => await openSocket(gw.port)))
  t.teardown(() => { for (const s of held) s.destroy() })
  await sleep(50)
  t.ok(held.every(s => !s.destroyed), 'a trusted proxy holds more than MAX_CONNECTIONS_PER_ADDRESS')
  const extra = await openSocket(gw.port)
  const refused = await closedWithin(extra, 2000)
  t.ok(refused !== null, 'the fifth connection is closed')
  t.equal(refused?.data.length, 0, 'without reading or answering anything')
})

t.test('the upstream\'s Cache-Control reaches the client on a recorded stream', async t => {
  const { gw } = await gatewayFor(t)
  const res = await request(`${gw.url}/mcp`, { method: 'POST', headers: MCP_HEADERS, body: INITIALIZE })
  const text = await res.body.text()
  t.equal(res.headers['content-type'], 'text/event-stream')
  t.match(text, /"serverInfo"/, 'recorded and relayed')
  t.equal(res.headers['cache-control'], 'no-cache, no-transform', 'no-transform kept: intermediaries must not re-encode the stream')
})

t.test('an error answer carries the request\'s JSON-RPC id', async t => {
  const gw = await startGateway(t, 'memory', `http://127.0.0.1:${await freePort()}/mcp`)
  const ask = async (body: string): Promise<{ status: number, id: unknown }> => {
    const res = await request(`${gw.url}/mcp`, { method: 'POST', headers: MCP_HEADERS, body })
    return { status: res.statusCode, id: jsonRpcError(await res.body.text())?.id }
  }
  t.same(await ask(JSON.stringify({ jsonrpc: '2.0', id: 42, method: 'tools/list' })), { status: 502, id: 42 }, 'a number id')
  t.same(await ask(JSON.stringify({ jsonrpc: '2.0', id: 'req-7', method: 'tools/list' })), { status: 502, id: 'req-7' }, 'a string id')
  t.same(await ask(JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' })), { status: 502, id: null }, 'a notification: null')
  t.same(await ask('{not json'), { status: 502, id: null }, 'no JSON: null')
})

t.test('OPTIONS * is answered by the gateway: not forwarded, not an upstream error', async t => {
  const { gw, upstream } = await gatewayFor(t)
  const answer = await rawHttp(gw.port, raw(['OPTIONS * HTTP/1.1', 'host: localhost', 'connection: close']))
  t.equal(answer.status, 204)
  t.match(answer.headers.allow, /OPTIONS/)
  t.equal(upstream.seen.length, 0, 'the upstream saw nothing')
  const text = (await get(`${gw.adminUrl}/metrics`)).text
  t.notMatch(text, /mcpgw_upstream_errors_total\{[^}]*\} [1-9]/, 'no upstream error counted')
  t.equal((await rawHttp(gw.port, raw(['GET * HTTP/1.1', 'host: localhost', 'connection: close']))).status, 400, 'GET *: 400')
})

t.test('the admin listener checks Host like the MCP listener (a rebinding page cannot read /metrics)', async t => {
  const { gw } = await gatewayFor(t)
  t.equal((await get(`${gw.adminUrl}/metrics`, { host: 'evil.example.com' })).status, 403, '/metrics for evil.example.com: 403')
  t.equal((await get(`${gw.adminUrl}/healthz`, { host: 'evil.example.com:9090' })).status, 403, '/healthz too')
  t.equal((await rawHttp(Number(new URL(gw.adminUrl).port), raw(['GET /metrics HTTP/1.1', 'host: localhost', 'host: evil.example.com', 'connection: close']))).status, 400, 'two Host lines: 400')
  t.equal((await get(`${gw.adminUrl}/metrics`)).status, 200, '127.0.0.1: served')
  const listed = await gatewayFor(t, { ALLOWED_HOSTS: 'mcp.example.com' })
  t.equal((await get(`${listed.gw.adminUrl}/readyz`, { host: '10.0.0.5:9090' })).status, 200, 'with a list: a pod address (probes) is served')
  t.equal((await get(`${listed.gw.adminUrl}/metrics`, { host: 'gw-admin.ns.svc' })).status, 200, 'and a Service name (scrapers)')
  t.equal((await get(`${listed.gw.adminUrl}/metrics`, { host: 'evil.example.com' })).status, 403, 'not a public name off the list')
})
