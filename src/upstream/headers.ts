import type { IncomingHttpHeaders } from 'node:http'

/** RFC 9110 section 7.6.1: connection-specific fields a proxy must not forward. */
const HOP_BY_HOP = new Set([
  'connection', 'keep-alive', 'proxy-authenticate', 'proxy-authorization', 'proxy-connection',
  'te', 'trailer', 'transfer-encoding', 'upgrade'
])

function connectionTokens (value: string | string[] | undefined): Set<string> {
  const out = new Set<string>()
  if (value === undefined) return out
  for (const part of (Array.isArray(value) ? value : [value])) {
    for (const token of part.split(',')) {
      const t = token.trim().toLowerCase()
      if (t !== '') out.add(t)
    }
  }
  return out
}

/**
 * Headers a client could use to pose as someone else toward the upstream
 * (which builds OAuth metadata URLs and logs from them, or reads the client's
 * address from them): believed only from a trusted outer proxy, as Envoy and
 * Traefik do by default.
 */
const CLIENT_IDENTITY = new Set(['forwarded', 'x-real-ip', 'true-client-ip', 'x-client-ip', 'cf-connecting-ip', 'x-cluster-client-ip', 'fastly-client-ip'])

/**
 * Headers that make some servers route or act on another URL, host or method
 * than the request's (IIS and Symfony's X-Original-URL, X-HTTP-Method-Override):
 * they would undo the checks the gateway made on the request's own. Never
 * passed on, whoever sends them.
 */
const OVERRIDES = new Set(['x-original-url', 'x-rewrite-url', 'x-host', 'x-original-host', 'x-forwarded-server',
  'x-http-method-override', 'x-http-method', 'x-method-override'])

/**
 * End-to-end headers the gateway reads and checks before forwarding: a
 * client's Connection header cannot make them hop-by-hop, or the upstream
 * would get a request without the credential or session the gateway verified.
 */
const CHECKED = new Set(['authorization', 'mcp-session-id', 'mcp-protocol-version', 'last-event-id', 'accept', 'content-type', 'content-length'])

function isForwardingHeader (name: string): boolean {
  return CLIENT_IDENTITY.has(name) || name.startsWith('x-forwarded-')
}

/**
 * Whether a request header goes to the upstream as far as its name goes. A
 * name with "_" that reads as a forwarding, override or checked header once
 * "_" is "-" is dropped from anyone: servers that map header names to
 * variables (CGI, WSGI, PHP) read X_Forwarded_For as X-Forwarded-For, and
 * Mcp_Session_Id as the session the gateway never checked. nginx drops such
 * names by default (underscores_in_headers off).
 */
function passesByName (name: string, ctx: ForwardContext): boolean {
  const dashed = name.replaceAll('_', '-')
  if (OVERRIDES.has(dashed)) return false
  if (dashed !== name && (CHECKED.has(dashed) || dashed === ctx.principalHeader)) return false
  if (!isForwardingHeader(dashed)) return true
  return ctx.trustedPeer && dashed === name
}

export interface ForwardContext {
  /** The peer of the client connection. */
  readonly remoteAddress: string | undefined
  /** The peer is a trusted outer proxy (TRUSTED_PROXIES): its forwarding headers are kept. */
  readonly trustedPeer: boolean
  readonly protocol: 'http' | 'https'
  readonly host: string | undefined
  /**
   * The header the gateway read the request's principal from (PRINCIPAL_HEADER),
   * when not one of the checked ones already: a Connection token cannot drop it either.
   */
  readonly principalHeader?: string | undefined
}

/**
 * Headers for the upstream request: end-to-end fields only. `host` and
 * `content-length` are set by the HTTP client for the upstream; `expect` was
 * answered here (Node sent 100 Continue), and the upstream gets the whole
 * body anyway. X-Forwarded-For/-Proto/-Host say what the gateway saw, after
 * what a trusted outer proxy saw.
 */
export function upstreamRequestHeaders (incoming: IncomingHttpHeaders, ctx: ForwardContext, keepContentLength: boolean): Record<string, string | string[]> {
  const drop = connectionTokens(incoming.connection)
  for (const name of CHECKED) drop.delete(name)
  if (ctx.principalHeader !== undefined) drop.delete(ctx.principalHeader)
  const out: Record<string, string | string[]> = {}
  for (const [name, value] of Object.entries(incoming)) {
    if (value === undefined) continue
    if (HOP_BY_HOP.has(name) || drop.has(name) || name === 'host' || name === 'expect') continue
    if (name === 'content-length' && !keepContentLength) continue
    if (!passesByName(name, ctx)) continue
    out[name] = value
  }
  const prior = ctx.trustedPeer ? incoming['x-forwarded-for'] : undefined
  const priorList = Array.isArray(prior) ? prior.join(', ') : prior
  if (ctx.remoteAddress !== undefined) {
    out['x-forwarded-for'] = priorList !== undefined && priorList !== '' ? `${priorList}, ${ctx.remoteAddress}` : ctx.remoteAddress
  }
  // One value each, the one the Host check passed: a list would be read
  // differently by each framework (Express takes the first entry, fastify the last).
  out['x-forwarded-proto'] = ctx.protocol
  if (ctx.host !== undefined) out['x-forwarded-host'] = ctx.host
  else delete out['x-forwarded-host']
  return out
}

/**
 * Headers of the upstream response to pass to the client: end-to-end fields,
 * minus those the gateway re-creates when it re-frames a body (length, type).
 * Never the upstream's Mcp-Session-Id: clients hold the gateway's session ids
 * only (protocol/session-id.ts), which the MCP route sets itself.
 */
export function clientResponseHeaders (upstream: Record<string, string | string[] | undefined>, omit: readonly string[] = []): Record<string, string | string[]> {
  const connectionName = Object.keys(upstream).find(name => name.toLowerCase() === 'connection')
  const drop = connectionTokens(connectionName === undefined ? undefined : upstream[connectionName])
  const out: Record<string, string | string[]> = {}
  for (const [name, value] of Object.entries(upstream)) {
    if (value === undefined) continue
    const lower = name.toLowerCase()
    if (HOP_BY_HOP.has(lower) || drop.has(lower) || lower === 'mcp-session-id' || omit.includes(lower)) continue
    out[lower] = value
  }
  return out
}

export function headerValue (value: string | string[] | undefined): string | undefined {
  return Array.isArray(value) ? value[0] : value
}

/** The essence of a media type: "text/event-stream; charset=utf-8" -> "text/event-stream". */
export function mediaType (value: string | string[] | undefined): string {
  const v = headerValue(value)
  if (v === undefined) return ''
  return (v.split(';')[0] as string).trim().toLowerCase()
}
