// What a session keeps for as long as its streams are idle stays compact:
// the headers of its upstream GET are kept once per session (twice, with a
// client attached), and V8 turns an object it deleted fields from into a
// dictionary of about 0.45 KB.
import t from 'tap'
import v8 from 'node:v8'
import type { FastifyRequest } from 'fastify'
import { upstreamGetHeaders } from '../../src/routes/mcp/request-headers.js'

v8.setFlagsFromString('--allow-natives-syntax')
// eslint-disable-next-line no-new-func
const hasFastProperties = new Function('o', 'return %HasFastProperties(o)') as (o: object) => boolean

function request (headers: Record<string, string>): FastifyRequest {
  return {
    headers,
    socket: { remoteAddress: '127.0.0.1' },
    fromTrustedProxy: false,
    authority: { kind: 'served', protocol: 'http', host: 'gw.example' },
    body: Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18' } }))
  } as unknown as FastifyRequest
}

t.test('the headers of a session\'s upstream GET are a fast object, not a dictionary', async t => {
  const incoming = {
    host: 'gw.example',
    accept: 'application/json, text/event-stream',
    'content-type': 'application/json',
    'content-length': '120',
    'mcp-session-id': 'abc',
    'mcp-protocol-version': '2025-06-18',
    'last-event-id': '5',
    authorization: 'Bearer x',
    'user-agent': 'client/1'
  }
  for (const version of ['keep', 'offered'] as const) {
    const headers = upstreamGetHeaders(request(incoming), version)
    t.equal(headers.accept, 'text/event-stream')
    t.notOk('content-length' in headers || 'mcp-session-id' in headers || 'last-event-id' in headers, 'request-only and session fields dropped')
    t.ok(hasFastProperties(headers), `${version}: fast properties`)
  }
})
