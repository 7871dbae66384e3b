import { LRUCache } from 'lru-cache'
import { clientKey } from '../../net/client-address.js'

/** Whether a POST body is an initialize request (the only request that makes a session). */
export function isInitializeRequest (body: Buffer | undefined): boolean {
  // Most bodies are not: they are not parsed twice.
  if (body === undefined || !body.includes('"initialize"')) return false
  try {
    return (JSON.parse(body.toString('utf8')) as { method?: unknown }).method === 'initialize'
  } catch {
    return false
  }
}

/**
 * INITIALIZES_PER_MINUTE_PER_ADDRESS: a token bucket per client address (an
 * IPv6 client by its /64), in bursts of a minute's worth. Each initialize
 * costs the upstream a session and, until released, a GET stream, and takes a
 * place of MAX_SESSIONS: one address rotating credentials (each a new
 * principal) or sending none could otherwise fill them all. Memory is
 * bounded: the least recently used buckets go first beyond `maxEntries`.
 */
export class InitializeRate {
  readonly #perMs: number
  readonly #burst: number
  readonly #now: () => number
  readonly #buckets: LRUCache<string, { tokens: number, at: number }>

  constructor (options: { perMinute: number, maxEntries: number, now?: () => number }) {
    this.#perMs = options.perMinute / 60_000
    this.#burst = options.perMinute
    this.#now = options.now ?? Date.now
    this.#buckets = new LRUCache({ max: options.maxEntries })
  }

  /** Take one initialize for `address`; 0 when allowed, else the seconds to wait. */
  take (address: string): number {
    const key = clientKey(address)
    const now = this.#now()
    let bucket = this.#buckets.get(key)
    if (bucket === undefined) {
      bucket = { tokens: this.#burst, at: now }
      this.#buckets.set(key, bucket)
    } else {
      bucket.tokens = Math.min(this.#burst, bucket.tokens + (now - bucket.at) * this.#perMs)
      bucket.at = now
    }
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1
      return 0
    }
    return Math.max(1, Math.ceil((1 - bucket.tokens) / this.#perMs / 1000))
  }
}
