import { promises as dns } from 'node:dns'
import type { EndpointSet } from './endpoint-set.js'
import type { UpstreamTarget } from './upstream-url.js'

/** One address of a name, with the DNS answer's TTL in seconds when known. */
export interface ResolvedAddress {
  readonly address: string
  readonly ttl?: number
}

/** One DNS try: with two, a name that does not answer delays the start by 4 s at most. */
const RESOLVE_TIMEOUT_MS = 2000

/** Resolves a host name into its addresses; throws when it cannot. */
export type HostResolver = (hostname: string) => Promise<readonly ResolvedAddress[]>

/**
 * The DNS answer itself (A and AAAA, with their TTL), as a Kubernetes
 * headless Service gives one address per ready pod. Names only the system
 * resolver knows (/etc/hosts, Docker's extra_hosts, Kubernetes hostAliases)
 * fall back to getaddrinfo, without a TTL.
 */
export const systemResolver: HostResolver = async hostname => {
  // Bounded: the first resolution delays the gateway's start (c-ares' default is 5 s, four tries).
  const resolver = new dns.Resolver({ timeout: RESOLVE_TIMEOUT_MS, tries: 2 })
  const answers = await Promise.allSettled([resolver.resolve4(hostname, { ttl: true }), resolver.resolve6(hostname, { ttl: true })])
  const found = answers.flatMap(a => a.status === 'fulfilled' ? a.value : [])
  if (found.length > 0) return found
  const looked = await dns.lookup(hostname, { all: true })
  return looked.map(a => ({ address: a.address }))
}

export interface DiscoveryLog {
  info (obj: object, msg: string): void
  warn (obj: object, msg: string): void
}

export interface DiscoveryOptions {
  readonly targets: readonly UpstreamTarget[]
  readonly endpoints: EndpointSet
  readonly resolver: HostResolver
  /** UPSTREAM_RESOLVE_SECONDS, in ms: the longest a DNS answer is used. */
  readonly maxAgeMs: number
  readonly log: DiscoveryLog
}

/** A TTL of 0 would resolve in a loop; Kubernetes' CoreDNS gives 5 to 30 s. */
const MIN_RESOLVE_MS = 1000

/**
 * Keeps the endpoint set in step with DNS: every name of UPSTREAM_URL
 * resolved at start, then again when its answer's TTL (at most
 * UPSTREAM_RESOLVE_SECONDS) runs out. A failed resolution changes nothing:
 * the endpoints of the last answer stay (or the name itself, connected to as
 * written, when it never resolved).
 */
export class UpstreamDiscovery {
  readonly #o: DiscoveryOptions
  readonly #timers = new Set<NodeJS.Timeout>()
  #stopped = false

  constructor (options: DiscoveryOptions) {
    this.#o = options
  }

  /** Resolve every name once; resolves when done (failures included). */
  async start (): Promise<void> {
    await Promise.all(this.#o.targets.filter(t => t.resolvable).map(async t => await this.#refresh(t)))
  }

  stop (): void {
    this.#stopped = true
    for (const timer of this.#timers) clearTimeout(timer)
    this.#timers.clear()
  }

  async #refresh (target: UpstreamTarget): Promise<void> {
    let delayMs = this.#o.maxAgeMs
    try {
      const answer = await this.#o.resolver(target.hostname)
      const addresses = [...new Set(answer.map(a => a.address))].sort()
      const ttls = answer.map(a => a.ttl).filter((ttl): ttl is number => ttl !== undefined)
      if (ttls.length > 0) delayMs = Math.min(delayMs, Math.max(MIN_RESOLVE_MS, Math.min(...ttls) * 1000))
      const before = this.#o.endpoints.snapshot().filter(e => e.from === target.origin && e.state !== 'leaving').map(e => e.endpoint).sort()
      this.#o.endpoints.update(target, addresses)
      const after = this.#o.endpoints.snapshot().filter(e => e.from === target.origin && e.state !== 'leaving').map(e => e.endpoint).sort()
      if (before.join() !== after.join()) this.#o.log.info({ upstream: target.origin, endpoints: after }, 'upstream endpoints changed')
    } catch (err) {
      this.#o.log.warn({ upstream: target.origin, err }, 'could not resolve the upstream\'s host name: its endpoints stay as they were')
    }
    if (this.#stopped) return
    const timer = setTimeout(() => {
      this.#timers.delete(timer)
      this.#refresh(target).catch(() => {})
    }, delayMs)
    timer.unref()
    this.#timers.add(timer)
  }
}
