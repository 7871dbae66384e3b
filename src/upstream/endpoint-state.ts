/**
 * Pure: the life of one upstream endpoint, as the gateway sees it.
 *
 * - `healthy`: gets new sessions and balanced requests.
 * - `set_aside`: refused a connection; gets nothing until `until`, and its
 *   sessions are re-established elsewhere. Each refusal in a row doubles the
 *   time (up to SET_ASIDE_MAX_FACTOR times the base), so a dead endpoint costs
 *   a failed connection now and then, not one per request.
 * - `on_trial`: its time set aside is over and it is in rotation again; the
 *   first answer makes it healthy, the next refusal sets it aside for longer.
 * - `leaving`: the DNS answer no longer lists it. No new sessions, no balanced
 *   requests, but the sessions placed on it go on there (a pod that failed its
 *   readiness probe, a load balancer address rotated out, still serve) until it
 *   refuses a connection or LEAVING_MAX_MS passes: an address may be reused.
 */
export type EndpointState =
  | { readonly kind: 'healthy' }
  | { readonly kind: 'set_aside', readonly until: number, readonly refusals: number }
  | { readonly kind: 'on_trial', readonly refusals: number }
  | { readonly kind: 'leaving', readonly since: number }

/** Every kind once: a kind added to EndpointState and missing here does not compile. */
const KINDS: Readonly<Record<EndpointState['kind'], true>> = { healthy: true, set_aside: true, on_trial: true, leaving: true }
export const ENDPOINT_STATES = Object.keys(KINDS) as ReadonlyArray<EndpointState['kind']>

/**
 * 16 times UPSTREAM_SET_ASIDE_SECONDS (80 s at its default): an endpoint down
 * for long costs one failed connection about every minute and a half, and
 * one that comes back is in rotation again within that.
 */
export const SET_ASIDE_MAX_FACTOR = 16
/**
 * A leaving endpoint is forgotten after this long, even if it still answers:
 * long enough for a pod out of readiness for a while (a slow start, a
 * rollout) to keep its sessions, short enough that an address given to
 * another pod does not get this server's sessions for long.
 */
export const LEAVING_MAX_MS = 15 * 60_000
/**
 * At most this many leaving endpoints are kept; past it, those leaving longest
 * are forgotten first. Every address gone from the DNS answer is kept, since
 * another replica may have placed sessions there, so a name whose addresses
 * churn (pods replaced again and again, an answer that rotates a pool) would
 * otherwise keep each for LEAVING_MAX_MS: 256 endpoints stay well under a
 * megabyte, and outnumber the pods a rollout replaces within that time.
 */
export const LEAVING_MAX_COUNT = 256

export const HEALTHY: EndpointState = Object.freeze({ kind: 'healthy' })

/** The state at `now`: a set-aside whose time is over is on trial. */
export function stateAt (state: EndpointState, now: number): EndpointState {
  if (state.kind === 'set_aside' && now >= state.until) return { kind: 'on_trial', refusals: state.refusals }
  return state
}

/** A connection refused. Returns undefined when the endpoint should be forgotten (a leaving one). */
export function refused (state: EndpointState, now: number, baseMs: number): EndpointState | undefined {
  const current = stateAt(state, now)
  switch (current.kind) {
    case 'leaving': return undefined
    // Refusals of requests already under way when it was set aside: no longer.
    case 'set_aside': return current
    case 'healthy':
    case 'on_trial': {
      const refusals = current.kind === 'healthy' ? 1 : current.refusals + 1
      const factor = Math.min(2 ** (refusals - 1), SET_ASIDE_MAX_FACTOR)
      return { kind: 'set_aside', until: now + baseMs * factor, refusals }
    }
  }
}

/** An answer came: a trial is over. */
export function answered (state: EndpointState): EndpointState {
  return state.kind === 'on_trial' ? HEALTHY : state
}

/** Listed by DNS again. */
export function listed (state: EndpointState): EndpointState {
  return state.kind === 'leaving' ? HEALTHY : state
}

/** No longer listed by DNS. */
export function unlisted (state: EndpointState, now: number): EndpointState {
  return state.kind === 'leaving' ? state : { kind: 'leaving', since: now }
}

/** Gets new sessions and balanced requests. */
export function inRotation (state: EndpointState): boolean {
  return state.kind === 'healthy' || state.kind === 'on_trial'
}

/** The sessions placed on it may still be sent there. */
export function reachable (state: EndpointState): boolean {
  return state.kind !== 'set_aside'
}
