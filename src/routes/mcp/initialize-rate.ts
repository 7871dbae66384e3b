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
 * IPv6 client by its /64), in bursts of a minute's worth. Each session costs
 * the upstream a session and, until released, a GET stream, and takes a place
 * of MAX_SESSIONS: one address rotating credentials (each a new principal) or
 * sending none could otherwise fill them all.
 *
 * A request is counted once, at one of two points: before the upstream, for
 * a body the gateway reads as an initialize (beforeUpstream), else where the
 * upstream issues it a session, whatever the body, its charset or the
 * protocol revision claimed (sessionIssued). Only the second holds against
 * any upstream, whose body parser may read what the gateway does not (a byte
 * order mark, UTF-16); the first spares the upstream a plain flood.
 */
export class InitializeRate {
  readonly #buckets: TokenBuckets
  /** Requests beforeUpstream let through: the session they make was paid for. */
  readonly #paid = new WeakSet<object>()

  constructor (options: { perMinute: number, maxEntries: number, now?: () => number }) {
    this.#buckets = new TokenBuckets({ perSecond: options.perMinute / 60, burst: options.perMinute, maxEntries: options.maxEntries, now: options.now })
  }

  /** Take one initialize for `address`; 0 when allowed, else the seconds to wait. */
  take (address: string): number {
    return this.#buckets.take(clientKey(address))
  }

  /** An initialize about to go upstream: take one for its address (`ip`, the client's); 0 when allowed, else the seconds to wait. */
  beforeUpstream (request: { readonly ip: string }): number {
    const wait = this.take(request.ip)
    if (wait === 0) this.#paid.add(request)
    return wait
  }

  /** The upstream issued a session to `request`: take one, unless beforeUpstream did; 0 when allowed, else the seconds to wait. */
  sessionIssued (request: { readonly ip: string }): number {
    if (this.#paid.has(request)) return 0
    return this.take(request.ip)
  }
}
