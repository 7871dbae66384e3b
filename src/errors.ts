/**
 * Every refusal the gateway answers with itself, defined once: its code, the
 * HTTP status, the JSON-RPC error code of the body, and the `reason` label of
 * mcpgw_requests_refused_total. The factories below build the errors from it,
 * metrics/metrics.ts takes the counter's label values from it, and
 * docs/observability.md's table is tested against it.
 */
export const REFUSALS = {
  MCPGW_BAD_HOST: { status: 400, rpcCode: -32000, reason: 'bad_host' },
  MCPGW_BAD_HTTP: { status: 400, rpcCode: -32000, reason: 'bad_http' },
  MCPGW_BAD_LAST_EVENT_ID: { status: 400, rpcCode: -32000, reason: 'bad_last_event_id' },
  MCPGW_BAD_PATH: { status: 400, rpcCode: -32000, reason: 'bad_path' },
  MCPGW_BAD_PROTOCOL_VERSION: { status: 400, rpcCode: -32000, reason: 'bad_protocol_version' },
  MCPGW_BAD_SESSION_ID: { status: 400, rpcCode: -32000, reason: 'bad_session_id' },
  MCPGW_NON_CANONICAL_PATH: { status: 400, rpcCode: -32000, reason: 'non_canonical_path' },
  MCPGW_UNAUTHORIZED: { status: 401, rpcCode: -32001, reason: 'unauthorized' },
  MCPGW_HOST_FORBIDDEN: { status: 403, rpcCode: -32000, reason: 'host_forbidden' },
  MCPGW_ORIGIN_FORBIDDEN: { status: 403, rpcCode: -32000, reason: 'origin_forbidden' },
  MCPGW_SESSION_NOT_FOUND: { status: 404, rpcCode: -32001, reason: 'session_not_found' },
  MCPGW_UPSTREAM_ENDPOINT_GONE: { status: 404, rpcCode: -32001, reason: 'upstream_endpoint_gone' },
  MCPGW_NOT_ACCEPTABLE: { status: 406, rpcCode: -32000, reason: 'not_acceptable' },
  MCPGW_REQUEST_TIMEOUT: { status: 408, rpcCode: -32000, reason: 'request_timeout' },
  MCPGW_BODY_TOO_LARGE: { status: 413, rpcCode: -32000, reason: 'body_too_large' },
  MCPGW_UNSUPPORTED_CONTENT_ENCODING: { status: 415, rpcCode: -32000, reason: 'unsupported_content_encoding' },
  MCPGW_INITIALIZE_RATE_LIMITED: { status: 429, rpcCode: -32000, reason: 'initialize_rate_limited' },
  MCPGW_RATE_LIMITED: { status: 429, rpcCode: -32000, reason: 'rate_limited' },
  MCPGW_TOO_MANY_PRINCIPAL_SESSIONS: { status: 429, rpcCode: -32000, reason: 'too_many_principal_sessions' },
  MCPGW_TOO_MANY_REPLAYS: { status: 429, rpcCode: -32000, reason: 'too_many_replays' },
  MCPGW_TOO_MANY_ANSWERED_RESUMES: { status: 429, rpcCode: -32000, reason: 'too_many_answered_resumes' },
  MCPGW_HEADERS_TOO_LARGE: { status: 431, rpcCode: -32000, reason: 'headers_too_large' },
  MCPGW_INTERNAL: { status: 500, rpcCode: -32000, reason: 'internal' },
  MCPGW_UPSTREAM_UNAVAILABLE: { status: 502, rpcCode: -32000, reason: 'upstream_unavailable' },
  MCPGW_AUTH_UNAVAILABLE: { status: 503, rpcCode: -32000, reason: 'auth_unavailable' },
  MCPGW_DRAINING: { status: 503, rpcCode: -32000, reason: 'draining' },
  MCPGW_SESSION_REESTABLISHING: { status: 503, rpcCode: -32000, reason: 'session_reestablishing' },
  MCPGW_STORE_UNAVAILABLE: { status: 503, rpcCode: -32000, reason: 'store_unavailable' },
  MCPGW_TOO_MANY_SESSIONS: { status: 503, rpcCode: -32000, reason: 'too_many_sessions' },
  MCPGW_UPSTREAM_TIMEOUT: { status: 504, rpcCode: -32000, reason: 'upstream_timeout' }
} as const satisfies Record<string, { status: number, rpcCode: number, reason: string }>

export type RefusalCode = keyof typeof REFUSALS
/** A refusal's metric reason; `other` for a code outside the table (a framework's own error). */
export type RefusalReason = typeof REFUSALS[RefusalCode]['reason'] | 'other'

export function isRefusalCode (code: string): code is RefusalCode {
  return Object.hasOwn(REFUSALS, code)
}

/**
 * An error the gateway answers with. Sent as a JSON-RPC error object, with the
 * request's id when its body had one, else null.
 */
export class GatewayError extends Error {
  readonly code: string
  readonly statusCode: number
  /** JSON-RPC error code used in the body on the MCP endpoint. */
  readonly rpcCode: number
  readonly headers: Readonly<Record<string, string>>

  constructor (code: string, statusCode: number, message: string, rpcCode = -32000, headers: Record<string, string> = {}) {
    super(message)
    this.name = 'GatewayError'
    this.code = code
    this.statusCode = statusCode
    this.rpcCode = rpcCode
    this.headers = headers
  }
}

/** A refusal of the table, with its message (which names the fix) and headers. */
function refusal (code: RefusalCode, message: string, headers: Record<string, string> = {}): GatewayError {
  const { status, rpcCode } = REFUSALS[code]
  return new GatewayError(code, status, message, rpcCode, headers)
}

function withCause (error: GatewayError, cause: unknown): GatewayError {
  if (cause !== undefined) error.cause = cause
  return error
}

export const errors = {
  sessionNotFound: (): GatewayError => refusal('MCPGW_SESSION_NOT_FOUND',
    'Session not found: it expired, was deleted, or belongs to another principal. Start a new session with initialize.'),
  unauthorized: (message: string, challenge: string) => refusal('MCPGW_UNAUTHORIZED', message, { 'www-authenticate': challenge }),
  authUnavailable: () => refusal('MCPGW_AUTH_UNAVAILABLE',
    'Service Unavailable: the gateway could not fetch the authorization server\'s keys (AUTH_JWKS_URL) to verify the access token. Retry shortly.', { 'retry-after': '5' }),
  tooManyPrincipalSessions: () => refusal('MCPGW_TOO_MANY_PRINCIPAL_SESSIONS',
    'Too Many Requests: this principal holds MAX_SESSIONS_PER_PRINCIPAL standalone streams on this gateway. End sessions you no longer use (DELETE), or retry later.', { 'retry-after': '10' }),
  badProtocolVersion: (value: string) => refusal('MCPGW_BAD_PROTOCOL_VERSION',
    `Bad Request: MCP-Protocol-Version "${value.slice(0, 40)}" is not a protocol revision (YYYY-MM-DD).`),
  badLastEventId: () => refusal('MCPGW_BAD_LAST_EVENT_ID',
    'Bad Request: Last-Event-ID is not an event id this gateway issued. Reconnect without it to get the live stream.'),
  badSessionId: () => refusal('MCPGW_BAD_SESSION_ID',
    'Bad Request: Mcp-Session-Id must be one value of visible ASCII characters.'),
  badHttp: () => refusal('MCPGW_BAD_HTTP', 'Bad Request: the request is not valid HTTP/1.1.'),
  headersTooLarge: (maxHeaderBytes: number) => refusal('MCPGW_HEADERS_TOO_LARGE',
    `Request Header Fields Too Large: headers are limited to MAX_HEADER_BYTES (${maxHeaderBytes}).`),
  bodyTooLarge: (maxBodyBytes: number) => refusal('MCPGW_BODY_TOO_LARGE',
    `Payload Too Large: request bodies are limited to MAX_BODY_BYTES (${maxBodyBytes}).`),
  /** RFC 9110 section 12.5.3: a 415 for a content coding names the ones accepted. */
  unsupportedContentEncoding: () => refusal('MCPGW_UNSUPPORTED_CONTENT_ENCODING',
    'Unsupported Media Type: request bodies on the MCP endpoint are not compressed (Content-Encoding identity, or none).', { 'accept-encoding': 'identity' }),
  nonCanonicalMcpPath: (mcpPath: string) => refusal('MCPGW_NON_CANONICAL_PATH',
    `Bad Request: this path is another spelling of the MCP endpoint; use ${mcpPath} exactly.`),
  badPath: (reason: string) => refusal('MCPGW_BAD_PATH',
    `Bad Request: the request path has ${reason}, which servers behind the gateway read differently; spell the path plainly.`),
  badHost: (reason: string) => refusal('MCPGW_BAD_HOST',
    `Bad Request: ${reason}; send one Host naming the gateway (and, from a trusted proxy, X-Forwarded-Host names and X-Forwarded-Proto http or https).`),
  originForbidden: () => refusal('MCPGW_ORIGIN_FORBIDDEN',
    'Forbidden: Origin is not in ALLOWED_ORIGINS.'),
  hostForbidden: () => refusal('MCPGW_HOST_FORBIDDEN',
    'Forbidden: Host is not allowed (DNS-rebinding protection). Add the name clients use to ALLOWED_HOSTS.'),
  requestTimeout: (seconds: number) => refusal('MCPGW_REQUEST_TIMEOUT',
    `Request Timeout: the request did not arrive within REQUEST_READ_TIMEOUT_SECONDS (${seconds}).`),
  notAcceptable: () => refusal('MCPGW_NOT_ACCEPTABLE',
    'Not Acceptable: a GET on the MCP endpoint must accept text/event-stream.'),
  /** An unexpected failure in the gateway; the log has it. */
  internal: () => refusal('MCPGW_INTERNAL', 'Internal error in the gateway.'),
  /** `cause`: the store's own error, kept for the log. */
  storeUnavailable: (cause?: unknown) => withCause(refusal('MCPGW_STORE_UNAVAILABLE',
    'Service Unavailable: the event store did not answer. Retry shortly.', { 'retry-after': '1' }), cause),
  upstreamUnavailable: () => refusal('MCPGW_UPSTREAM_UNAVAILABLE',
    'Bad Gateway: the upstream MCP server could not be reached.'),
  /**
   * The endpoint holding the request's session left the upstream's endpoints,
   * is set aside, or refused the connection. Whoever can establish the session
   * elsewhere catches it; otherwise the client is told, as for a session the
   * upstream lost, to start anew.
   */
  upstreamEndpointGone: (cause?: unknown) => withCause(refusal('MCPGW_UPSTREAM_ENDPOINT_GONE',
    'Session not found: the upstream endpoint that held this session is gone. Start a new session with initialize.'), cause),
  upstreamTimeout: () => refusal('MCPGW_UPSTREAM_TIMEOUT',
    'Gateway Timeout: the upstream MCP server did not answer in time.'),
  tooManySessions: () => refusal('MCPGW_TOO_MANY_SESSIONS',
    'Service Unavailable: this gateway holds MAX_SESSIONS standalone streams. Retry shortly.', { 'retry-after': '5' }),
  rateLimited: (retryAfterSeconds: number) => refusal('MCPGW_RATE_LIMITED',
    'Too Many Requests: this session exceeds SESSION_REQUESTS_PER_SECOND. Retry after the Retry-After delay.', { 'retry-after': String(retryAfterSeconds) }),
  tooManyReplays: () => refusal('MCPGW_TOO_MANY_REPLAYS',
    'Too Many Requests: MAX_REPLAYS_PER_STREAM resumes of this stream are replaying on this gateway already. Keep one connection per stream; retry after the Retry-After delay.', { 'retry-after': '1' }),
  tooManyAnsweredResumes: (held: number) => refusal('MCPGW_TOO_MANY_ANSWERED_RESUMES',
    `Too Many Requests: this session holds ${held} resumes of requests answered with an error open on this gateway already; the request this resumes was answered, and its answer was sent again on the first resume. Close resumes of answered requests.`, { 'retry-after': '60' }),
  initializeRateLimited: (retryAfterSeconds: number) => refusal('MCPGW_INITIALIZE_RATE_LIMITED',
    'Too Many Requests: this address exceeds INITIALIZES_PER_MINUTE_PER_ADDRESS new sessions. Reuse the session you have, or retry after the Retry-After delay.', { 'retry-after': String(retryAfterSeconds) }),
  /**
   * The upstream lost the session and it could not be established there again
   * for now (the upstream restarting or unreachable, or another replica's
   * re-establishment not done in time). The session is kept: the next request
   * tries again.
   */
  sessionReestablishing: () => refusal('MCPGW_SESSION_REESTABLISHING',
    'Service Unavailable: the upstream lost this session and the gateway could not establish it there again yet (the upstream is restarting or unreachable). The session is kept; retry shortly.', { 'retry-after': '1' }),
  draining: () => refusal('MCPGW_DRAINING',
    'Service Unavailable: this gateway is shutting down. Retry; another replica will answer.', { 'retry-after': '1' })
}

/** Is `err` the gateway's 404 for a session it does not know (or not for this principal)? */
export function isSessionNotFound (err: unknown): boolean {
  return err instanceof GatewayError && err.code === 'MCPGW_SESSION_NOT_FOUND'
}

/** Is `err` the gateway's 404 for a session whose upstream endpoint is gone (the client is told to start anew)? */
export function isUpstreamEndpointGone (err: unknown): boolean {
  return err instanceof GatewayError && err.code === 'MCPGW_UPSTREAM_ENDPOINT_GONE'
}

/** Is `err` the gateway's 503 for a session whose upstream could not be given it again yet (a restart under way)? */
export function isSessionReestablishing (err: unknown): boolean {
  return err instanceof GatewayError && err.code === 'MCPGW_SESSION_REESTABLISHING'
}

/** The store has no record of the session (never created, expired, deleted or lost). */
export class SessionGoneError extends Error {
  constructor (sessionId: string) {
    super(`no stored session ${sessionId.slice(0, 8)}...`)
    this.name = 'SessionGoneError'
  }
}

/**
 * Fencing: the append was refused because this replica no longer holds the
 * lease of the stream it writes (another replica took the upstream GET over).
 */
export class LeaseLostError extends Error {
  constructor (sessionId: string) {
    super(`the stream lease of session ${sessionId.slice(0, 8)}... is held by another replica`)
    this.name = 'LeaseLostError'
  }
}

export function jsonRpcErrorBody (err: GatewayError, id: string | number | null = null): string {
  return JSON.stringify({ jsonrpc: '2.0', id, error: { code: err.rpcCode, message: err.message } })
}

/**
 * The default of a switch over a closed set that returns nothing: with every
 * member handled above it, `value` is `never`, so a member added to the set
 * and not handled is a compile error there, not a silent fall-through.
 */
export function unreachable (value: never): never {
  throw new Error(`unhandled member of a closed set: ${String(value)}`)
}
