import { LRUCache } from 'lru-cache'
import type { EndpointKey } from './endpoint-set.js'

/**
 * Which endpoint holds each upstream session, in this process: set when an
 * answer issues `Mcp-Session-Id`, looked up by the upstream client for every
 * request that carries that id without naming an endpoint (the POSTs, the
 * session's upstream GET, its resumes, DELETE), so they all reach the
 * endpoint that holds the session.
 *
 * Per replica and lost at restart: a session's placement shared by every
 * replica belongs in its stored record, which then names the endpoint on
 * each request (`UpstreamRequest.endpoint`), and this table is bypassed.
 * Keyed by the id the upstream issued, the one sent back to it.
 */
export class SessionPlacement {
  readonly #placed: LRUCache<string, EndpointKey>

  /** `ttlMs`: forgotten after this long unused, like the session's records (RETENTION_TTL_SECONDS). */
  constructor (options: { maxSessions: number, ttlMs: number }) {
    this.#placed = new LRUCache({ max: options.maxSessions, ttl: options.ttlMs, updateAgeOnGet: true })
  }

  set (upstreamSessionId: string, endpoint: EndpointKey): void {
    this.#placed.set(upstreamSessionId, endpoint)
  }

  get (upstreamSessionId: string): EndpointKey | undefined {
    return this.#placed.get(upstreamSessionId)
  }

  delete (upstreamSessionId: string): void {
    this.#placed.delete(upstreamSessionId)
  }

  get size (): number { return this.#placed.size }
}
