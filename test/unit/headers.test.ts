// Header forwarding (src/upstream/headers.ts): end-to-end fields pass both
// ways, hop-by-hop fields (RFC 9110 section 7.6.1) never do.
import t from 'tap'
import type { IncomingHttpHeaders } from 'node:http'
import {
  clientResponseHeaders, headerValue, mediaType, upstreamRequestHeaders, type ForwardContext
} from '../../src/upstream/headers.js'

const HOP_BY_HOP = [
  'connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'proxy-connection',
  'te', 'trailer', 'transfer-encoding', 'upgrade'
]

const ctx: ForwardContext = { remoteAddress: '203.0.113.7', trustedPeer: false, protocol: 'https', host: 'gateway.example' }
/** The peer is an outer proxy in TRUSTED_PROXIES. */
const proxied: ForwardContext = { ...ctx, trustedPeer: true }
const noCtx: ForwardContext = { remoteAddress: undefined, trustedPeer: false, protocol: 'http', host: undefined }

/** End-to-end headers an MCP client sends. */
const endToEnd: IncomingHttpHeaders = {
  accept: 'application/json, text/event-stream',
  'content-type': 'application/json',
  authorization: 'Bearer secret',
  'mcp-session-id': 'abc',
  'mcp-protocol-version': '2025-06-18',
  'last-event-id': 'e.s.1',
  cookie: 'a=1',
  'user-agent': 'sdk/1'
}

t.test('upstreamRequestHeaders: end-to-end headers pass unchanged', async (t) => {
  const out = upstreamRequestHeaders({ ...endToEnd }, noCtx, true)
  for (const [name, value] of Object.entries(endToEnd)) t.equal(out[name], value, name)
  t.same(Object.keys(out).sort(), [...Object.keys(endToEnd), 'x-forwarded-proto'].sort(), 'nothing else but x-forwarded-proto')
})

t.test('upstreamRequestHeaders: hop-by-hop headers are removed', async (t) => {
  const incoming: IncomingHttpHeaders = { ...endToEnd }
  for (const name of HOP_BY_HOP) incoming[name] = 'x'
  incoming.connection = 'keep-alive'
  const out = upstreamRequestHeaders(incoming, ctx, true)
  for (const name of HOP_BY_HOP) t.notOk(name in out, `${name} dropped`)
  t.equal(out.authorization, 'Bearer secret', 'authorization (end-to-end) kept')
  t.equal(out['mcp-session-id'], 'abc')
})

t.test('upstreamRequestHeaders: headers named in Connection are removed', async (t) => {
  const incoming: IncomingHttpHeaders = {
    ...endToEnd,
    connection: 'close, X-Custom-Hop ,  x-other,,',
    'x-custom-hop': '1',
    'x-other': '2',
    'x-kept': '3'
  }
  const out = upstreamRequestHeaders(incoming, noCtx, true)
  t.notOk('x-custom-hop' in out, 'named in Connection, case-insensitively')
  t.notOk('x-other' in out)
  t.notOk('close' in out)
  t.equal(out['x-kept'], '3')
})

t.test('upstreamRequestHeaders: Connection listing an end-to-end header removes it too', async (t) => {
  const out = upstreamRequestHeaders({ ...endToEnd, connection: 'cookie' }, noCtx, true)
  t.notOk('cookie' in out, 'the sender declared it hop-by-hop')
  t.equal(out.authorization, 'Bearer secret')
})

t.test('upstreamRequestHeaders: Connection given as an array (repeated header)', async (t) => {
  const incoming = { connection: ['x-a', 'X-B, x-c'], 'x-a': '1', 'x-b': '2', 'x-c': '3', 'x-d': '4' } as unknown as IncomingHttpHeaders
  const out = upstreamRequestHeaders(incoming, noCtx, true)
  t.same(Object.keys(out).sort(), ['x-d', 'x-forwarded-proto'])
})

t.test('upstreamRequestHeaders: host is dropped (the client sets the upstream\'s)', async (t) => {
  const out = upstreamRequestHeaders({ ...endToEnd, host: 'gateway.example:8080' }, noCtx, true)
  t.notOk('host' in out)
})

t.test('upstreamRequestHeaders: content-length is kept or dropped per flag', async (t) => {
  const incoming = { ...endToEnd, 'content-length': '42' }
  t.equal(upstreamRequestHeaders(incoming, noCtx, true)['content-length'], '42', 'kept')
  t.notOk('content-length' in upstreamRequestHeaders(incoming, noCtx, false), 'dropped (body re-framed)')
  t.notOk('content-length' in upstreamRequestHeaders({ ...endToEnd }, noCtx, true), 'absent stays absent')
  t.notOk('transfer-encoding' in upstreamRequestHeaders({ ...incoming, 'transfer-encoding': 'chunked' }, noCtx, true), 'never transfer-encoding')
})

t.test('upstreamRequestHeaders: x-forwarded-for is the peer, after a trusted proxy\'s list', async (t) => {
  t.equal(upstreamRequestHeaders({}, ctx, true)['x-forwarded-for'], '203.0.113.7', 'set when absent')
  t.equal(upstreamRequestHeaders({ 'x-forwarded-for': '198.51.100.1' }, ctx, true)['x-forwarded-for'], '203.0.113.7', 'a client\'s value is replaced')
  t.equal(upstreamRequestHeaders({ 'x-forwarded-for': '198.51.100.1' }, proxied, true)['x-forwarded-for'], '198.51.100.1, 203.0.113.7', 'a trusted proxy\'s is appended to')
  t.equal(upstreamRequestHeaders({ 'x-forwarded-for': '10.0.0.1, 10.0.0.2' }, proxied, true)['x-forwarded-for'], '10.0.0.1, 10.0.0.2, 203.0.113.7', 'appended to a list')
  t.equal(upstreamRequestHeaders({ 'x-forwarded-for': '' }, proxied, true)['x-forwarded-for'], '203.0.113.7', 'empty prior value')
  const repeated = { 'x-forwarded-for': ['10.0.0.1', '10.0.0.2'] } as unknown as IncomingHttpHeaders
  t.equal(upstreamRequestHeaders(repeated, proxied, true)['x-forwarded-for'], '10.0.0.1, 10.0.0.2, 203.0.113.7', 'repeated headers joined')
  t.notOk('x-forwarded-for' in upstreamRequestHeaders({ 'x-forwarded-for': '198.51.100.1' }, noCtx, true), 'unknown peer: a client\'s value is not passed')
  t.notOk('x-forwarded-for' in upstreamRequestHeaders({}, noCtx, true), 'unknown peer, no prior: absent')
  const v6 = upstreamRequestHeaders({}, { ...ctx, remoteAddress: '::ffff:127.0.0.1' }, true)
  t.equal(v6['x-forwarded-for'], '::ffff:127.0.0.1')
})

t.test('upstreamRequestHeaders: x-forwarded-proto and -host say what the gateway saw', async (t) => {
  const fresh = upstreamRequestHeaders({}, ctx, true)
  t.equal(fresh['x-forwarded-proto'], 'https')
  t.equal(fresh['x-forwarded-host'], 'gateway.example')
  const forged = upstreamRequestHeaders({ 'x-forwarded-proto': 'http', 'x-forwarded-host': 'evil.example' }, ctx, true)
  t.equal(forged['x-forwarded-proto'], 'https', 'a client\'s value is overwritten')
  t.equal(forged['x-forwarded-host'], 'gateway.example')
  // From a trusted proxy, ctx carries the values the Host check took from its headers (request-authority.ts).
  const prior = upstreamRequestHeaders({ 'x-forwarded-proto': 'http, https', 'x-forwarded-host': 'edge.example, other.example' }, { ...proxied, protocol: 'http', host: 'edge.example' }, true)
  t.equal(prior['x-forwarded-proto'], 'http', 'a trusted proxy\'s checked value, alone')
  t.equal(prior['x-forwarded-host'], 'edge.example', 'one entry, not the list')
  const noHost = upstreamRequestHeaders({}, noCtx, true)
  t.equal(noHost['x-forwarded-proto'], 'http')
  t.notOk('x-forwarded-host' in noHost, 'no host known: not set')
})

t.test('upstreamRequestHeaders: Forwarded, X-Real-IP and other X-Forwarded-* only from a trusted proxy', async (t) => {
  const incoming: IncomingHttpHeaders = {
    forwarded: 'for=198.51.100.1;host=evil.example;proto=https',
    'x-real-ip': '198.51.100.1',
    'x-forwarded-port': '443',
    'x-forwarded-prefix': '/evil'
  }
  const out = upstreamRequestHeaders(incoming, ctx, true)
  for (const name of ['forwarded', 'x-real-ip', 'x-forwarded-port', 'x-forwarded-prefix']) t.notOk(name in out, `${name} dropped from a client`)
  const trusted = upstreamRequestHeaders(incoming, proxied, true)
  for (const name of ['forwarded', 'x-real-ip', 'x-forwarded-port', 'x-forwarded-prefix']) t.equal(trusted[name], incoming[name], `${name} kept from a trusted proxy`)
})

t.test('upstreamRequestHeaders: Expect is answered here, never forwarded', async (t) => {
  t.notOk('expect' in upstreamRequestHeaders({ ...endToEnd, expect: '100-continue' }, ctx, true))
})

t.test('upstreamRequestHeaders: undefined values are skipped, the input is not modified', async (t) => {
  const incoming: IncomingHttpHeaders = { ...endToEnd, 'x-undefined': undefined, host: 'h', connection: 'x-a', 'x-a': '1' }
  const copy = structuredClone(incoming)
  const out = upstreamRequestHeaders(incoming, ctx, false)
  t.notOk('x-undefined' in out)
  t.same(incoming, copy, 'input unchanged')
  t.not(out, incoming)
})

t.test('upstreamRequestHeaders: array values pass as arrays', async (t) => {
  const incoming = { 'x-multi': ['a', 'b'] } as unknown as IncomingHttpHeaders
  t.same(upstreamRequestHeaders(incoming, noCtx, true)['x-multi'], ['a', 'b'])
})

t.test('clientResponseHeaders: hop-by-hop headers are removed', async (t) => {
  const upstream: Record<string, string | string[] | undefined> = {
    'content-type': 'text/event-stream',
    'cache-control': 'no-cache',
    'mcp-session-id': 'abc',
    'set-cookie': ['a=1', 'b=2'],
    'www-authenticate': 'Bearer resource_metadata="https://x/.well-known/oauth-protected-resource"'
  }
  for (const name of HOP_BY_HOP) upstream[name] = 'x'
  upstream.connection = 'keep-alive'
  const out = clientResponseHeaders(upstream)
  for (const name of HOP_BY_HOP) t.notOk(name in out, `${name} dropped`)
  t.equal(out['content-type'], 'text/event-stream')
  t.equal(out['cache-control'], 'no-cache')
  t.notOk('mcp-session-id' in out, 'the upstream\'s session id never reaches a client (the gateway sets its own)')
  t.notOk('Mcp-Session-Id' in clientResponseHeaders({ 'Mcp-Session-Id': 'abc' }), 'in any case')
  t.same(out['set-cookie'], ['a=1', 'b=2'])
  t.match(out['www-authenticate'], /resource_metadata/)
})

t.test('clientResponseHeaders: headers named in Connection are removed', async (t) => {
  const out = clientResponseHeaders({ connection: 'X-Hop, x-two', 'x-hop': '1', 'x-two': '2', 'x-end': '3' })
  t.same(out, { 'x-end': '3' })
})

t.test('clientResponseHeaders: names are lower-cased and hop-by-hop checks are case-insensitive', async (t) => {
  const out = clientResponseHeaders({ 'Content-Type': 'application/json', 'Transfer-Encoding': 'chunked', 'Keep-Alive': 'timeout=5', 'X-Up': '1' })
  t.same(out, { 'content-type': 'application/json', 'x-up': '1' })
})

t.test('clientResponseHeaders: a capitalised Connection header still removes the headers it names', async (t) => {
  const out = clientResponseHeaders({ Connection: 'X-Hop', 'X-Hop': '1', 'X-End': '2' })
  t.notOk('connection' in out, 'Connection itself is dropped')
  t.equal(out['x-end'], '2')
  t.notOk('x-hop' in out, 'X-Hop dropped')
})

t.test('clientResponseHeaders: omit list and undefined values', async (t) => {
  const upstream = { 'content-length': '10', 'content-type': 'application/json', etag: 'x', 'x-u': undefined }
  t.same(clientResponseHeaders(upstream, ['content-length', 'content-type']), { etag: 'x' })
  t.same(clientResponseHeaders(upstream), { 'content-length': '10', 'content-type': 'application/json', etag: 'x' })
  t.same(clientResponseHeaders({}), {})
})

t.test('headerValue', async (t) => {
  t.equal(headerValue(undefined), undefined)
  t.equal(headerValue('a'), 'a')
  t.equal(headerValue(''), '')
  t.equal(headerValue(['a', 'b']), 'a', 'the first of repeated values')
  t.equal(headerValue([]), undefined)
})

t.test('mediaType: the essence of a media type', async (t) => {
  const cases: Array<[string | string[] | undefined, string]> = [
    [undefined, ''],
    ['', ''],
    ['text/event-stream', 'text/event-stream'],
    ['text/event-stream; charset=utf-8', 'text/event-stream'],
    ['text/event-stream;charset=utf-8', 'text/event-stream'],
    ['Text/Event-Stream ; Charset=UTF-8', 'text/event-stream'],
    ['  application/json  ', 'application/json'],
    ['APPLICATION/JSON', 'application/json'],
    ['application/json; charset="utf-8"; x=";"', 'application/json'],
    [';charset=utf-8', ''],
    [['text/event-stream; charset=utf-8', 'application/json'], 'text/event-stream'],
    [[], ''],
    ['application/vnd.api+json', 'application/vnd.api+json']
  ]
  for (const [input, expected] of cases) t.equal(mediaType(input), expected, JSON.stringify(input))
  t.not(mediaType('text/event-streamx'), 'text/event-stream', 'no prefix matching')
})

t.test('upstreamRequestHeaders: other client-address and override headers, and underscore spellings', async (t) => {
  const sent: Record<string, string> = Object.fromEntries([
    ['x-forwarded_host', 'evil.example'], ['x_forwarded_for', '198.51.100.1'], ['x_real_ip', '198.51.100.1'], ['forwarded_', 'x'],
    ['true-client-ip', '198.51.100.1'], ['x-client-ip', '198.51.100.1'], ['cf-connecting-ip', '198.51.100.1'], ['x-cluster-client-ip', '1.1.1.1'],
    ['x-original-url', '/admin'], ['x-rewrite-url', '/admin'], ['x-host', 'evil.example'], ['x_original_url', '/admin'], ['x-http-method-override', 'DELETE'],
    ['x-custom_header', 'kept']
  ])
  const direct = upstreamRequestHeaders(sent, ctx, true)
  t.same(Object.keys(direct).sort(), ['forwarded_', 'x-custom_header', 'x-forwarded-for', 'x-forwarded-host', 'x-forwarded-proto'].sort(), 'from a client: none of them')
  t.equal(direct['x-forwarded-host'], 'gateway.example')
  const viaProxy = upstreamRequestHeaders(sent, proxied, true)
  for (const name of ['true-client-ip', 'x-client-ip', 'cf-connecting-ip', 'x-cluster-client-ip']) t.equal(viaProxy[name], sent[name], `${name}: kept from a trusted proxy`)
  for (const name of ['x-forwarded_host', 'x_forwarded_for', 'x_real_ip', 'x-original-url', 'x-rewrite-url', 'x-host', 'x_original_url', 'x-http-method-override']) {
    t.notOk(name in viaProxy, `${name}: dropped even from a trusted proxy`)
  }
})

t.test('upstreamRequestHeaders: Connection cannot make the headers the gateway checked hop-by-hop', async (t) => {
  const out = upstreamRequestHeaders({
    connection: 'Authorization, Mcp-Session-Id, MCP-Protocol-Version, Last-Event-ID, x-debug',
    authorization: 'Bearer t',
    'mcp-session-id': 's',
    'mcp-protocol-version': '2025-06-18',
    'last-event-id': 'e',
    'x-debug': '1'
  }, ctx, true)
  for (const name of ['authorization', 'mcp-session-id', 'mcp-protocol-version', 'last-event-id']) t.ok(name in out, `${name} kept`)
  t.notOk('x-debug' in out, 'another nominated header is still dropped')

  // PRINCIPAL_HEADER=x-api-key: the session is bound to the principal read from it.
  const sent: IncomingHttpHeaders = { connection: 'X-Api-Key, x-debug', 'x-api-key': 'k', 'x-debug': '1' }
  const keyed = upstreamRequestHeaders(sent, { ...ctx, principalHeader: 'x-api-key' }, true)
  t.equal(keyed['x-api-key'], 'k', 'the principal header is kept')
  t.notOk('x-debug' in keyed, 'the other nominated header is still dropped')
  t.notOk('x-api-key' in upstreamRequestHeaders(sent, ctx, true), 'a header the gateway does not read stays hop-by-hop when nominated')
})

t.test('upstreamRequestHeaders: a checked header spelled with "_" is dropped from anyone', async (t) => {
  // Servers that map names to variables (CGI, WSGI, PHP) would read these as the
  // session, credential or principal the gateway checked under the dashed name.
  const sent: IncomingHttpHeaders = {
    mcp_session_id: 'upstream-id-of-someone-else',
    'mcp-session_id': 'x',
    authorization_: 'kept: not a checked name once dashed',
    Authorization_x: 'kept',
    last_event_id: 'e',
    mcp_protocol_version: '2025-06-18',
    x_api_key: 'k',
    'x-api-key': 'k'
  }
  for (const peer of [ctx, proxied]) {
    const out = upstreamRequestHeaders(sent, { ...peer, principalHeader: 'x-api-key' }, true)
    for (const name of ['mcp_session_id', 'mcp-session_id', 'last_event_id', 'mcp_protocol_version', 'x_api_key']) t.notOk(name in out, `${name}: dropped`)
    t.equal(out['x-api-key'], 'k', 'the principal header under its own name is kept')
    t.equal(out.authorization_, 'kept: not a checked name once dashed')
  }
})
