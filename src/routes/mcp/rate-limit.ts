import { boundedLru, type BoundedLru } from '../../lru.js'

/**
 * Token buckets by key: `perSecond` tokens come back each second, up to
 * `burst`; a key never seen starts full. Memory is bounded: beyond
 * `maxEntries` the least recently used buckets go first (a dropped key starts
 * full again, which errs on the side of serving).
 */
export class TokenBuckets {
  readonly #perSecond: number
  readonly #burst: number
  readonly #now: () => number
  readonly #buckets: BoundedLru<string, { tokens: number, at: number }>

  constructor (options: { perSecond: number, burst: number, maxEntries: number, now?: () => number }) {
    this.#perSecond = options.perSecond
    this.#burst = options.burst
    this.#now = options.now ?? Date.now
    this.#buckets = boundedLru(options.maxEntries)
  }

  /** Take one token; returns 0 when allowed, else the whole seconds to wait before retrying. */
  take (key: string): number {
    const now = this.#now()
    // get() makes the bucket the most recently used; a new one is set as such.
    let bucket = this.#buckets.get(key)
    if (bucket === undefined) {
      bucket = { tokens: this.#burst, at: now }
      this.#buckets.set(key, bucket)
    } else {
      bucket.tokens = Math.min(this.#burst, bucket.tokens + (now - bucket.at) * this.#perSecond / 1000)
      bucket.at = now
    }
    if (bucket.tokens >= 1) {
      bucket.tokens -= 1
      return 0
    }
    return Math.max(1, Math.ceil((1 - bucket.tokens) / this.#perSecond))
  }

  get size (): number { return this.#buckets.size }
}

/**
 * SESSION_REQUESTS_PER_SECOND: a session may make `ratePerSecond` requests a
 * second through this replica, in bursts of twice that (a client that was
 * idle may catch up: a reconnect and its first calls come together). Bounds a
 * flood of requests or reconnects on one session (a loop in a client, or an
 * attack) before it reaches the store or the upstream.
 */
export class SessionRateLimiter extends TokenBuckets {
  constructor (options: { ratePerSecond: number, maxEntries: number, now?: () => number }) {
    super({ perSecond: options.ratePerSecond, burst: options.ratePerSecond * 2, maxEntries: options.maxEntries, now: options.now })
  }
}
