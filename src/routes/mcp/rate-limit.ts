import { LRUCache } from 'lru-cache'

/**
 * Per-session token buckets: a session may make `ratePerSecond` requests a
 * second through this replica, in bursts of twice that. Bounds a flood of
 * requests or reconnects on one session (a loop in a client, or an attack)
 * before it reaches the store or the upstream. Memory is bounded: the least
 * recently used buckets are dropped beyond `maxEntries`.
 */
export class SessionRateLimiter {
  readonly #rate: number
  readonly #burst: number
  readonly #now: () => number
  readonly #buckets: LRUCache<string, { tokens: number, at: number }>

  constructor (options: { ratePerSecond: number, maxEntries: number, now?: () => number }) {
    this.#rate = options.ratePerSecond
    this.#burst = options.ratePerSecond * 2
    this.#now = options.now ?? Date.now
    this.#buckets = new LRUCache({ max: options.maxEntries })
  }

  /** Take one token; returns 0 when allowed, else the seconds to wait before retrying. */
  take (key: string): number {
    const now = this.#now()
    // get() makes the bucket the most recently used; a new one is set as such.
    let bucket = this.#buckets.get(key)
    if (bucket === undefined) {
      bucket = { tokens: this.#burst, at: now }
      this.#buckets.set(key, bucket)
    } else {
      bucket.tokens = Math.min(this.#burst, bucket.tokens + (now - bucket.at) * this.#rate / 1000)
      bucket.at = now
    }
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1
      return 0
    }
    return Math.max(1, Math.ceil((1 - bucket.tokens) / this.#rate))
  }

  get size (): number { return this.#buckets.size }
}
