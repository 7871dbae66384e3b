import { boundedLru, type BoundedLru } from '../../lru.js'
import type { SessionRecord } from '../../store/contract.js'

/**
 * Recently verified session records, per replica. A burst of requests on one
 * session costs one store read, and while the store is unreachable a session
 * verified before the outage keeps its principal binding checked (degraded
 * mode) instead of failing every request. Bounded: the least recently verified go first.
 */
export class SessionCache {
  readonly #fresh: number
  readonly #stale: number
  readonly #now: () => number
  /** Reads peek (a check does not renew an entry); setting one makes it the most recent. */
  readonly #entries: BoundedLru<string, { record: SessionRecord, at: number }>

  constructor (options: { freshMs: number, staleMs: number, maxEntries: number, now?: () => number }) {
    this.#fresh = options.freshMs
    this.#stale = options.staleMs
    this.#now = options.now ?? Date.now
    this.#entries = boundedLru(options.maxEntries)
  }

  /** A record verified within the fresh window. */
  fresh (sessionId: string): SessionRecord | undefined {
    const entry = this.#entries.peek(sessionId)
    return entry !== undefined && this.#now() - entry.at < this.#fresh ? entry.record : undefined
  }

  /** A record verified within the stale window (used only when the store fails). */
  stale (sessionId: string): SessionRecord | undefined {
    const entry = this.#entries.peek(sessionId)
    return entry !== undefined && this.#now() - entry.at < this.#stale ? entry.record : undefined
  }

  set (sessionId: string, record: SessionRecord): void {
    this.#entries.set(sessionId, { record, at: this.#now() })
  }

  /**
   * No longer fresh: the next request reads the store again (the store
   * dropped the session, and may be given it again); what the record told
   * stays for the stale window.
   */
  unverify (sessionId: string): void {
    const entry = this.#entries.peek(sessionId)
    if (entry !== undefined) entry.at = Math.min(entry.at, this.#now() - this.#fresh)
  }

  delete (sessionId: string): void {
    this.#entries.delete(sessionId)
  }
}
