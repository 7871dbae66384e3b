import { betterOfTwo, RoundRobin } from './balance.js'
import { isConnectFailure } from './connect-failure.js'
import { answered, HEALTHY, inRotation, LEAVING_MAX_COUNT, LEAVING_MAX_MS, listed, reachable, refused, stateAt, unlisted, type EndpointState } from './endpoint-state.js'
import type { UpstreamTarget } from './upstream-url.js'

/**
 * One endpoint of the upstream server, named by where the gateway connects:
 * "http://10.0.0.7:3000", or the origin as written in UPSTREAM_URL when it is
 * not resolved. Stable while the endpoint exists: safe to keep in a session's
 * record and to compare across replicas.
 */
export type EndpointKey = string

/** Where to send a request for an endpoint. */
export interface EndpointRoute {
  readonly origin: string
  /**
   * The Host header to send when connecting by address: the name written in
   * UPSTREAM_URL, which the upstream sees today (and may check, as the SDKs'
   * DNS-rebinding protection does). Undefined: the origin's own.
   */
  readonly host: string | undefined
  /** The TLS server name when connecting by address over https. */
  readonly servername: string | undefined
}

export interface EndpointView {
  readonly endpoint: EndpointKey
  readonly state: EndpointState['kind']
  /** set_aside: until when (ms since the epoch). */
  readonly until?: number
  /** Connections refused in a row. */
  readonly refusals?: number
  /** Sessions this replica placed there. */
  readonly sessionsPlaced: number
  /** The UPSTREAM_URL entry it comes from. */
  readonly from: string
}

interface Endpoint {
  readonly key: EndpointKey
  readonly route: EndpointRoute
  readonly from: string
  state: EndpointState
  /** Sessions established there by this replica. */
  placed: number
  /** Added to `placed` when placing: a late joiner starts level with the others. */
  readonly offset: number
}

export interface EndpointSetOptions {
  /** UPSTREAM_SET_ASIDE_SECONDS, in ms. */
  readonly setAsideMs: number
  readonly now?: () => number
  /** In [0, 1); a seeded one makes placement reproducible in tests. */
  readonly random?: () => number
}

function addressKey (target: UpstreamTarget, address: string): EndpointKey {
  return `${target.protocol}//${address.includes(':') ? `[${address}]` : address}:${target.port}`
}

/**
 * The endpoints of the upstream server and their state. Pure logic over a
 * clock and a random source: discovery (DNS) feeds it through `update`, the
 * upstream client through `reportFailure` and `reportAnswer`.
 *
 * - `place()`: the endpoint for a new session (better of two random picks by
 *   sessions placed, among endpoints in rotation).
 * - `pick()`: the endpoint for a request without a session (round robin).
 * - `resolve(key)`: where a session placed on `key` goes; undefined when that
 *   endpoint is gone or set aside: the caller establishes the session elsewhere.
 *
 * With nothing in rotation (every endpoint set aside), `place` and `pick`
 * answer the one whose time set aside ends first: trying beats refusing
 * every request until then. A lone endpoint is never set aside: there is
 * nowhere else to go.
 */
export class EndpointSet {
  readonly #endpoints = new Map<EndpointKey, Endpoint>()
  readonly #roundRobin = new RoundRobin()
  readonly #setAsideMs: number
  readonly #now: () => number
  readonly #random: () => number

  constructor (targets: readonly UpstreamTarget[], options: EndpointSetOptions) {
    this.#setAsideMs = options.setAsideMs
    this.#now = options.now ?? Date.now
    this.#random = options.random ?? Math.random
    for (const target of targets) this.#add(target.origin, { origin: target.origin, host: undefined, servername: undefined }, target.origin, 0)
  }

  get size (): number { return this.#endpoints.size }

  place (): EndpointKey {
    if (this.#endpoints.size === 1) return this.#endpoints.keys().next().value as EndpointKey
    const now = this.#now()
    const candidates = this.#inRotation(now).map(e => ({ key: e.key, placed: e.placed + e.offset }))
    return (betterOfTwo(candidates, this.#random) ?? this.#fallback(now)).key
  }

  /** A session was established on `key` (its answer issued a session id): counted for placement. */
  sessionPlaced (key: EndpointKey): void {
    const endpoint = this.#endpoints.get(key)
    if (endpoint !== undefined) endpoint.placed++
  }

  pick (): EndpointKey {
    // The common case, on every request: no list to build.
    if (this.#endpoints.size === 1) return this.#endpoints.keys().next().value as EndpointKey
    const now = this.#now()
    return (this.#roundRobin.pick(this.#inRotation(now)) ?? this.#fallback(now)).key
  }

  /** The route to a session's endpoint; undefined when it is gone or set aside. */
  resolve (key: EndpointKey): EndpointRoute | undefined {
    const endpoint = this.#endpoints.get(key)
    if (endpoint === undefined) return undefined
    const now = this.#now()
    if (this.#expired(endpoint, now)) {
      this.#endpoints.delete(key)
      return undefined
    }
    return reachable(stateAt(endpoint.state, now)) || this.#endpoints.size === 1 ? endpoint.route : undefined
  }

  /** Where `key` is, whatever its state (for `place` and `pick` answers). */
  routeOf (key: EndpointKey): EndpointRoute | undefined {
    return this.#endpoints.get(key)?.route
  }

  /** A request to `key` failed. Returns whether it set the endpoint aside (or forgot a leaving one). */
  reportFailure (key: EndpointKey, err: unknown): boolean {
    const endpoint = this.#endpoints.get(key)
    if (endpoint === undefined || !isConnectFailure(err) || this.#endpoints.size === 1) return false
    const next = refused(endpoint.state, this.#now(), this.#setAsideMs)
    if (next === undefined) this.#endpoints.delete(key)
    else endpoint.state = next
    return true
  }

  /** An answer came from `key` (any status). */
  reportAnswer (key: EndpointKey): void {
    const endpoint = this.#endpoints.get(key)
    if (endpoint === undefined) return
    const state = stateAt(endpoint.state, this.#now())
    if (state.kind === 'on_trial') endpoint.state = answered(state)
  }

  /**
   * The addresses `target`'s name resolves to now. The endpoints of that
   * target that are no longer listed start leaving, whoever placed sessions
   * there: the sessions' records are the routing table, and another replica,
   * or this one before a restart, may have placed some there (`placed` counts
   * only this process's). New ones join level with the endpoint with the
   * fewest sessions, so they are not sent every new session until they catch
   * up. The name as written, used until its first answer, gives way at once
   * if this replica placed nothing there: it is no address that left, and a
   * replica that resolved at start never routes to it.
   */
  update (target: UpstreamTarget, addresses: readonly string[]): void {
    if (addresses.length === 0) return
    const now = this.#now()
    const hostHeader = new URL(target.origin).host
    const servername = target.protocol === 'https:' ? target.hostname : undefined
    const keys = new Set(addresses.map(a => addressKey(target, a)))
    for (const endpoint of this.#endpoints.values()) {
      if (endpoint.from !== target.origin) continue
      if (keys.has(endpoint.key)) endpoint.state = listed(endpoint.state)
      else if (endpoint.key === target.origin && endpoint.placed === 0) this.#endpoints.delete(endpoint.key)
      else endpoint.state = unlisted(endpoint.state, now)
    }
    const start = Math.min(...[...this.#endpoints.values()].filter(e => inRotation(stateAt(e.state, now))).map(e => e.placed + e.offset), Number.MAX_SAFE_INTEGER)
    for (const address of addresses) {
      const key = addressKey(target, address)
      if (this.#endpoints.has(key)) continue
      this.#add(key, { origin: key, host: hostHeader, servername }, target.origin, start === Number.MAX_SAFE_INTEGER ? 0 : start)
    }
    for (const endpoint of this.#endpoints.values()) {
      if (this.#expired(endpoint, now)) this.#endpoints.delete(endpoint.key)
    }
    this.#boundLeaving()
  }

  /** Every endpoint and its state, for /upstreamz and the metrics. */
  snapshot (): EndpointView[] {
    const now = this.#now()
    return [...this.#endpoints.values()].map(e => {
      const state = stateAt(e.state, now)
      return {
        endpoint: e.key,
        state: state.kind,
        ...(state.kind === 'set_aside' && { until: state.until }),
        ...((state.kind === 'set_aside' || state.kind === 'on_trial') && { refusals: state.refusals }),
        sessionsPlaced: e.placed,
        from: e.from
      }
    })
  }

  #add (key: EndpointKey, route: EndpointRoute, from: string, offset: number): void {
    this.#endpoints.set(key, { key, route, from, state: HEALTHY, placed: 0, offset })
  }

  #inRotation (now: number): Endpoint[] {
    const out: Endpoint[] = []
    for (const e of this.#endpoints.values()) if (inRotation(stateAt(e.state, now))) out.push(e)
    return out
  }

  /** Nothing in rotation: the endpoint back soonest. */
  #fallback (now: number): Endpoint {
    let best: Endpoint | undefined
    let bestAt = Infinity
    for (const e of this.#endpoints.values()) {
      const at = e.state.kind === 'set_aside' ? e.state.until : e.state.kind === 'leaving' ? Number.MAX_VALUE : now
      if (best === undefined || at < bestAt) {
        best = e
        bestAt = at
      }
    }
    return best as Endpoint
  }

  /** Past LEAVING_MAX_COUNT leaving endpoints, those leaving longest go first. */
  #boundLeaving (): void {
    const leaving: Array<{ key: EndpointKey, since: number }> = []
    for (const e of this.#endpoints.values()) if (e.state.kind === 'leaving') leaving.push({ key: e.key, since: e.state.since })
    if (leaving.length <= LEAVING_MAX_COUNT) return
    leaving.sort((a, b) => a.since - b.since)
    for (const { key } of leaving.slice(0, leaving.length - LEAVING_MAX_COUNT)) this.#endpoints.delete(key)
  }

  #expired (endpoint: Endpoint, now: number): boolean {
    return endpoint.state.kind === 'leaving' && now - endpoint.state.since >= LEAVING_MAX_MS && this.#endpoints.size > 1
  }
}
