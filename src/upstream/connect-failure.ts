/**
 * Pure: whether an upstream request failed before any connection was made.
 * Only these set an endpoint aside: nothing reached the upstream, so the
 * request may go to another endpoint. A reset on a connection that was open
 * (a keep-alive socket the server closed, a crash mid-answer) does not: the
 * request may have been executed.
 */
const CONNECT_FAILURES = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'EHOSTDOWN', 'UND_ERR_CONNECT_TIMEOUT'])

export function isConnectFailure (err: unknown): boolean {
  for (let e = err, depth = 0; e !== undefined && e !== null && depth < 4; e = (e as { cause?: unknown }).cause, depth++) {
    const code = (e as { code?: unknown }).code
    if (typeof code === 'string' && CONNECT_FAILURES.has(code)) return true
    // Happy eyeballs (autoSelectFamily) reports every address it tried.
    const tried = (e as { errors?: unknown }).errors
    if (Array.isArray(tried) && tried.length > 0 && tried.every(isConnectFailure)) return true
  }
  return false
}
