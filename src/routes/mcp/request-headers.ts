/**
 * What the MCP endpoint reads from a request's headers and body, and the
 * headers of the upstream requests it makes on a request's behalf.
 */
import type { FastifyRequest } from 'fastify'
import { errors } from '../../errors.js'
import { SESSION_ID_MAX, UPSTREAM_SESSION_ID_MAX } from '../../protocol/session-id.js'
import { headerValue } from '../../upstream/headers.js'
import { upstreamHeadersFor } from '../forward.js'

/** Transports spec: session ids are visible ASCII (0x21-0x7E). */
const VISIBLE_ASCII = /^[\x21-\x7e]+$/

/** Whether an id the upstream issued may stand behind a session (it is recorded only then). */
export function isUpstreamSessionId (value: string): boolean {
  return value.length <= UPSTREAM_SESSION_ID_MAX && VISIBLE_ASCII.test(value)
}

/** The request's Mcp-Session-Id; throws 400 for several values or one that is not visible ASCII. */
export function sessionIdOf (request: FastifyRequest): string | undefined {
  const raw = request.headers['mcp-session-id']
  if (raw === undefined) return undefined
  const value = headerValue(raw) as string
  if (Array.isArray(raw) || value.length > SESSION_ID_MAX || !VISIBLE_ASCII.test(value)) {
    throw errors.badSessionId()
  }
  return value
}

/**
 * Whether a body's Content-Encoding leaves it as sent (none, or identity
 * alone). MCP clients do not compress requests, and the gateway reads
 * initialize and session-state bodies for the recipe and the initialize
 * limit; a compressed body would pass unread, and inflate upstream beyond
 * MAX_BODY_BYTES.
 */
export function isIdentityCoded (contentEncoding: string | string[] | undefined): boolean {
  if (contentEncoding === undefined) return true
  const codings = (Array.isArray(contentEncoding) ? contentEncoding.join(',') : contentEncoding).split(',')
  return codings.every(coding => /^\s*(identity)?\s*$/i.test(coding))
}

/** Whether a GET's Accept lets it be answered with an SSE stream (no Accept does). */
export function acceptsEventStream (accept: string | undefined): boolean {
  return accept === undefined || /text\/event-stream|\*\/\*|text\/\*/.test(accept)
}

/** The protocol version an initialize request offers (params.protocolVersion), when it is a plain token. */
export function offeredVersion (body: Buffer | undefined): string | undefined {
  if (body === undefined) return undefined
  try {
    const version = (JSON.parse(body.toString('utf8')) as { params?: { protocolVersion?: unknown } }).params?.protocolVersion
    return typeof version === 'string' && /^[\w.-]{1,32}$/.test(version) ? version : undefined
  } catch {
    return undefined
  }
}

/** Upstream headers for an answer the gateway may record: it parses the SSE, so no content coding. */
export function recordableHeaders (request: FastifyRequest): Record<string, string | string[]> {
  const headers = upstreamHeadersFor(request, false)
  headers['accept-encoding'] = 'identity'
  return headers
}

/**
 * An upstream GET of the session on behalf of a client's request (a POST, or
 * its own GET): its auth and other end-to-end headers, without the session id
 * (upstream/session-request.ts adds the one the upstream knows) or the
 * gateway's Last-Event-ID. The GET opened at initialize carries the version the
 * client offered: the negotiated one is in the answer's body, and is the
 * offered one whenever the server supports it (lifecycle spec); a server
 * that does not refuses the GET, and the client's own GET opens it later.
 * The version matters: servers send priming events (ids to resume from)
 * only from 2025-11-25 on.
 */
export function upstreamGetHeaders (request: FastifyRequest, version: 'keep' | 'offered'): Record<string, string | string[]> {
  const headers = recordableHeaders(request)
  for (const name of ['content-type', 'content-length', 'content-encoding', 'last-event-id', 'mcp-session-id']) delete headers[name]
  if (version === 'offered') {
    delete headers['mcp-protocol-version']
    const offered = offeredVersion(request.body as Buffer | undefined)
    if (offered !== undefined) headers['mcp-protocol-version'] = offered
  }
  headers.accept = 'text/event-stream'
  // A copy: the deletes left the object in dictionary mode (about 0.3 KB more), and a session keeps it.
  return { ...headers }
}
