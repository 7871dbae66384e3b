/**
 * The requests that set session state a client expects to keep for the
 * session's life, which the gateway sends again when it establishes the
 * session upstream again: logging/setLevel (the last one counts) and
 * resources/subscribe and resources/unsubscribe (a set of URIs).
 */
/** A request that set session state, as the session's recipe keeps it. */
export type SessionStateChange =
  | { readonly kind: 'log_level', readonly request: string }
  | { readonly kind: 'subscribe', readonly uri: string }
  | { readonly kind: 'unsubscribe', readonly uri: string }
  /** State set in a way the recipe cannot follow (a batch): the session can no longer be established again. */
  | { readonly kind: 'untracked' }

/** The levels logging/setLevel takes (the MCP specification's, after RFC 5424's severities). */
export const LOG_LEVELS = ['debug', 'info', 'notice', 'warning', 'error', 'critical', 'alert', 'emergency'] as const

const METHODS: ReadonlySet<string> = new Set(['logging/setLevel', 'resources/subscribe', 'resources/unsubscribe'])
const LEVELS: ReadonlySet<string> = new Set(LOG_LEVELS)

/**
 * The state change a request body makes, or undefined (most bodies: a look at
 * their bytes tells; the method names are looked for without their "/", which
 * some encoders write as "\/"). A batch that holds a state request is
 * `untracked`. The caller keeps a change only once the upstream accepted it.
 */
export function sessionStateChange (body: Buffer | undefined): SessionStateChange | undefined {
  if (body === undefined || (!body.includes('setLevel') && !body.includes('subscribe'))) return undefined
  let message: unknown
  try {
    message = JSON.parse(body.toString('utf8'))
  } catch {
    return undefined
  }
  if (Array.isArray(message)) return message.some(m => changeOf(m) !== undefined) ? { kind: 'untracked' } : undefined
  return changeOf(message)
}

function changeOf (message: unknown): SessionStateChange | undefined {
  if (message === null || typeof message !== 'object') return undefined
  const { method, params, id } = message as { method?: unknown, params?: { uri?: unknown, level?: unknown }, id?: unknown }
  if (typeof method !== 'string' || !METHODS.has(method)) return undefined
  if (method === 'logging/setLevel') {
    const level = params?.level
    if (typeof level !== 'string' || !LEVELS.has(level)) return undefined
    // Kept as the request the gateway sends again, and no more of it than that
    // (the client's body may carry anything else, up to MAX_BODY_BYTES).
    return { kind: 'log_level', request: JSON.stringify({ jsonrpc: '2.0', id: typeof id === 'number' || typeof id === 'string' ? id : 0, method, params: { level } }) }
  }
  const uri = params?.uri
  if (typeof uri !== 'string') return undefined
  return { kind: method === 'resources/subscribe' ? 'subscribe' : 'unsubscribe', uri }
}
