import type { Logger } from 'pino'
import { UpstreamClient } from './client.js'
import { systemResolver, UpstreamDiscovery, type HostResolver } from './discovery.js'
import { EndpointSet } from './endpoint-set.js'
import type { UpstreamTarget } from './upstream-url.js'

export interface UpstreamOptions {
  /** Every entry of UPSTREAM_URL. */
  readonly targets: readonly UpstreamTarget[]
  readonly setAsideMs: number
  readonly headersTimeoutMs: number
  /** UPSTREAM_KEEPALIVE_TIMEOUT_MS. */
  readonly keepAliveTimeoutMs: number
  /** Longest time a resolved name is used before it is resolved again. */
  readonly resolveMs: number
  readonly resolveHost?: HostResolver
  /** In [0, 1): the draws that place new sessions on endpoints. */
  readonly placementRandom?: () => number
  readonly log: Logger
}

/**
 * The upstream client over the endpoints of UPSTREAM_URL, the names among
 * them resolved before the gateway serves, and again as their DNS answers
 * age.
 */
export async function createUpstream (options: UpstreamOptions): Promise<{ upstream: UpstreamClient, discovery: UpstreamDiscovery | undefined }> {
  const { targets } = options
  const endpoints = new EndpointSet(targets, { setAsideMs: options.setAsideMs, random: options.placementRandom })
  const resolvable = targets.some(t => t.resolvable)
  const upstream = new UpstreamClient({ endpoints, headersTimeoutMs: options.headersTimeoutMs, keepAliveTimeoutMs: options.keepAliveTimeoutMs })
  if (!resolvable) return { upstream, discovery: undefined }
  const discovery = new UpstreamDiscovery({ targets, endpoints, resolver: options.resolveHost ?? systemResolver, maxAgeMs: options.resolveMs, log: options.log.child({ component: 'upstream-discovery' }) })
  await discovery.start()
  return { upstream, discovery }
}
