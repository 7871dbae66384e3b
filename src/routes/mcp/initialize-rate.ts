import { clientKey } from '../../net/client-address.js'
import { TokenBuckets } from './rate-limit.js'

/**
 * Whether a POST body is, or holds in a batch, an initialize request (the
 * only request that makes a session): whatever the upstream reads as one is
 * counted as one.
 */
export function isInitializeRequest (body: Buffer | undefined): boolean {
  // Most bodies are not, and are not parsed twice. JSON may spell the method
  // with escapes ("\u0069nitialize"), so only a body without the word and
  // without a backslash is passed over.
  if (body === undefined || (!body.includes('initialize') && !body.includes(BACKSLASH))) return false
  let message: unknown
  try {
    message = JSON.parse(body.toString('utf8'))
  } catch {
    return false
  }
  return Array.isArray(message) ? message.some(isInitialize) : isInitialize(message)
}

const BACKSLASH = 0x5c

function isInitialize (message: unknown): boolean {
  return typeof message === 'object' && message !== null && (message as { method?: unknown }).method === 'initialize'
}

/**
 * INITIALIZES_PER_MINUTE_PER_ADDRESS: a token bucket per client address (an
 * IPv6 client by its /64), in bursts of a minute's worth. Each initialize
 * costs the upstream a session and, until released, a GET stream, and takes a
 * place of MAX_SESSIONS: one address rotating credentials (each a new
 * principal) or sending none could otherwise fill them all.
 */
export class InitializeRate {
  readonly #buckets: TokenBuckets

  constructor (options: { perMinute: number, maxEntries: number, now?: () => number }) {
    this.#buckets = new TokenBuckets({ perSecond: options.perMinute / 60, burst: options.perMinute, maxEntries: options.maxEntries, now: options.now })
  }

  /** Take one initialize for `address`; 0 when allowed, else the seconds to wait. */
  take (address: string): number {
    return this.#buckets.take(clientKey(address))
  }
}
