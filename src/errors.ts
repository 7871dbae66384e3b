/**
 * Every error the gateway answers with, defined once: a stable code, a message
 * that says what to do, and the HTTP status. Errors are sent as JSON-RPC
 * error objects, with the request's id when its body had one, else null.
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

function withCause (error: GatewayError, cause: unknown): GatewayError {
  if (cause !== undefined) error.cause = cause
  return error
}

export const errors = {
  sessionNotFound: (): GatewayError => new GatewayError('MCPGW_SESSION_NOT_FOUND', 404,
    'Session not found: it expired, was deleted, or belongs to another principal. Start a new session with initialize.', -32001),
  unauthorized: (message: string, challenge: string) => new GatewayError('MCPGW_UNAUTHORIZED', 401, message, -32001, { 'www-authenticate': challenge }),
  authUnavailable: () => new GatewayError('MCPGW_AUTH_UNAVAILABLE', 503,
    'Service Unavailable: the gateway could not fetch the authorization server\'s keys (AUTH_JWKS_URL) to verify the access token. Retry shortly.', -32000, { 'retry-after': '5' }),
  tooManyPrincipalSessions: () => new GatewayError('MCPGW_TOO_MANY_PRINCIPAL_SESSIONS', 429,
    'Too Many Requests: this principal holds MAX_SESSIONS_PER_PRINCIPAL standalone streams on this gateway. End sessions you no longer use (DELETE), or retry later.', -32000, { 'retry-after': '10' }),
  badProtocolVersion: (value: string) => new GatewayError('MCPGW_BAD_PROTOCOL_VERSION', 400,
    `Bad Request: MCP-Protocol-Version "${value.slice(0, 40)}" is not a protocol revision (YYYY-MM-DD).`),
  badLastEventId: () => new GatewayError('MCPGW_BAD_LAST_EVENT_ID', 400,
    'Bad Request: Last-Event-ID is not an event id this gateway issued. Reconnect without it to get the live stream.'),
  nonCanonicalMcpPath: (mcpPath: string) => new GatewayError('MCPGW_NON_CANONICAL_PATH', 400,
    `Bad Request: this path is another spelling of the MCP endpoint; use ${mcpPath} exactly.`),
  badPath: (reason: string) => new GatewayError('MCPGW_BAD_PATH', 400,
    `Bad Request: the request path has ${reason}, which servers behind the gateway read differently; spell the path plainly.`),
  originForbidden: () => new GatewayError('MCPGW_ORIGIN_FORBIDDEN', 403,
    'Forbidden: Origin is not in ALLOWED_ORIGINS.'),
  badHost: (reason: string) => new GatewayError('MCPGW_BAD_HOST', 400,
    `Bad Request: ${reason}; send one Host naming the gateway (and, from a trusted proxy, X-Forwarded-Host names and X-Forwarded-Proto http or https).`),
  hostForbidden: () => new GatewayError('MCPGW_HOST_FORBIDDEN', 403,
    'Forbidden: Host is not allowed (DNS-rebinding protection). Add the name clients use to ALLOWED_HOSTS.'),
  requestTimeout: (seconds: number) => new GatewayError('MCPGW_REQUEST_TIMEOUT', 408,
    `Request Timeout: the request did not arrive within REQUEST_READ_TIMEOUT_SECONDS (${seconds}).`),
  notAcceptable: () => new GatewayError('MCPGW_NOT_ACCEPTABLE', 406,
    'Not Acceptable: a GET on the MCP endpoint must accept text/event-stream.'),
  /** `cause`: the store's own error, kept for the log. */
  storeUnavailable: (cause?: unknown) => withCause(new GatewayError('MCPGW_STORE_UNAVAILABLE', 503,
    'Service Unavailable: the event store did not answer. Retry shortly.', -32000, { 'retry-after': '1' }), cause),
  upstreamUnavailable: () => new GatewayError('MCPGW_UPSTREAM_UNAVAILABLE', 502,
    'Bad Gateway: the upstream MCP server could not be reached.'),
  /**
   * The endpoint holding the request's session left the upstream's endpoints,
   * is set aside, or refused the connection. Whoever can establish the session
   * elsewhere catches it; otherwise the client is told, as for a session the
   * upstream lost, to start anew.
   */
  upstreamEndpointGone: (cause?: unknown) => withCause(new GatewayError('MCPGW_UPSTREAM_ENDPOINT_GONE', 404,
    'Session not found: the upstream endpoint that held this session is gone. Start a new session with initialize.', -32001), cause),
  upstreamTimeout: () => new GatewayError('MCPGW_UPSTREAM_TIMEOUT', 504,
    'Gateway Timeout: the upstream MCP server did not answer in time.'),
  tooManySessions: () => new GatewayError('MCPGW_TOO_MANY_SESSIONS', 503,
    'Service Unavailable: this gateway holds MAX_SESSIONS standalone streams. Retry shortly.', -32000, { 'retry-after': '5' }),
  rateLimited: (retryAfterSeconds: number) => new GatewayError('MCPGW_RATE_LIMITED', 429,
    'Too Many Requests: this session exceeds SESSION_REQUESTS_PER_SECOND. Retry after the Retry-After delay.', -32000, { 'retry-after': String(retryAfterSeconds) }),
  tooManyReplays: () => new GatewayError('MCPGW_TOO_MANY_REPLAYS', 429,
    'Too Many Requests: MAX_REPLAYS_PER_STREAM resumes of this stream are replaying on this gateway already. Keep one connection per stream; retry after the Retry-After delay.', -32000, { 'retry-after': '1' }),
  initializeRateLimited: (retryAfterSeconds: number) => new GatewayError('MCPGW_INITIALIZE_RATE_LIMITED', 429,
    'Too Many Requests: this address exceeds INITIALIZES_PER_MINUTE_PER_ADDRESS new sessions. Reuse the session you have, or retry after the Retry-After delay.', -32000, { 'retry-after': String(retryAfterSeconds) }),
  draining: () => new GatewayError('MCPGW_DRAINING', 503,
    'Service Unavailable: this gateway is shutting down. Retry; another replica will answer.', -32000, { 'retry-after': '1' })
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
