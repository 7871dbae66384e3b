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

const METHODS = ['logging/setLevel', 'resources/subscribe', 'resources/unsubscribe'] as const

/** The state change a request body makes, or undefined (most bodies: a look at their bytes tells). */
export function sessionStateChange (body: Buffer | undefined): SessionStateChange | undefined {
  if (body === undefined || !METHODS.some(method => body.includes(method))) return undefined
  let message: unknown
  try {
    message = JSON.parse(body.toString('utf8'))
  } catch {
    return undefined
  }
  if (message === null || typeof message !== 'object' || Array.isArray(message)) return undefined
  const { method, params } = message as { method?: unknown, params?: { uri?: unknown } }
  switch (method) {
    case 'logging/setLevel':
      return { kind: 'log_level', request: body.toString('utf8') }
    case 'resources/subscribe':
    case 'resources/unsubscribe': {
      const uri = params?.uri
      if (typeof uri !== 'string') return undefined
      return { kind: method === 'resources/subscribe' ? 'subscribe' : 'unsubscribe', uri }
    }
    default:
      return undefined
  }
}
