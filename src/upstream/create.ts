import type { Logger } from 'pino'
import { UpstreamClient } from './client.js'
import { systemResolver, UpstreamDiscovery, type HostResolver } from './discovery.js'
import { EndpointSet } from './endpoint-set.js'
import { SessionPlacement } from './session-placement.js'
import type { UpstreamTarget } from './upstream-url.js'

/**
 * Sessions whose placement this process remembers (about 0.2 KB each: 20 MB
 * at most), ten times MAX_SESSIONS' default; beyond, the least recently used
 * go first. Requests that name their endpoint from the session's record
 * bypass this table, so a session forgotten here still reaches its endpoint.
 */
const PLACEMENT_MAX_SESSIONS = 100_000

export interface UpstreamOptions {
  /** Every entry of UPSTREAM_URL. */
  readonly targets: readonly UpstreamTarget[]
  readonly setAsideMs: number
  readonly headersTimeoutMs: number
  /** Longest time a resolved name is used before it is resolved again. */
  readonly resolveMs: number
  /** How long a session's placement is remembered without use (RETENTION_TTL_SECONDS). */
  readonly placementTtlMs: number
  readonly resolveHost?: HostResolver
  /** In [0, 1): the draws that place new sessions on endpoints. */
  readonly placementRandom?: () => number
  readonly log: Logger
}

/**
 * The upstream client over the endpoints of UPSTREAM_URL, the names among
 * them resolved before the gateway serves, and again as their DNS answers
 * age. One endpoint that never needs DNS needs no placement either.
 */
export async function createUpstream (options: UpstreamOptions): Promise<{ upstream: UpstreamClient, discovery: UpstreamDiscovery | undefined }> {
  const { targets } = options
  const endpoints = new EndpointSet(targets, { setAsideMs: options.setAsideMs, random: options.placementRandom })
  const resolvable = targets.some(t => t.resolvable)
  const placement = targets.length > 1 || resolvable ? new SessionPlacement({ maxSessions: PLACEMENT_MAX_SESSIONS, ttlMs: options.placementTtlMs }) : undefined
  const upstream = new UpstreamClient({ endpoints, placement, headersTimeoutMs: options.headersTimeoutMs })
  if (!resolvable) return { upstream, discovery: undefined }
  const discovery = new UpstreamDiscovery({ targets, endpoints, resolver: options.resolveHost ?? systemResolver, maxAgeMs: options.resolveMs, log: options.log.child({ component: 'upstream-discovery' }) })
  await discovery.start()
  return { upstream, discovery }
}
