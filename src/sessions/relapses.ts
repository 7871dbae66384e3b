import { LRUCache } from 'lru-cache'

/**
 * Sessions the upstream lost again right after they were established there
 * again: the request sent once more met the loss too. Once or twice is an
 * upstream restarting again meanwhile, and the session is kept (503, the
 * client's retry establishes it again). RELAPSES_MAX times within
 * RELAPSE_WINDOW_MS is an upstream that does not keep the session at all: a
 * load-balanced Service of replicas that keep sessions in memory, routed
 * without affinity, answers each request from another replica. Establishing
 * the session again at every retry would leave an upstream session behind
 * each time and never serve the client, so the session ends instead (404:
 * the client starts anew).
 */
export const RELAPSES_MAX = 3
export const RELAPSE_WINDOW_MS = 60_000

export class Relapses {
  /** Relapses by session, each entry for RELAPSE_WINDOW_MS from the first. Bounded: the least recent go first. */
  readonly #counts: LRUCache<string, number>

  constructor (options: { maxEntries: number, windowMs?: number }) {
    this.#counts = new LRUCache({ max: options.maxEntries, ttl: options.windowMs ?? RELAPSE_WINDOW_MS })
  }

  /** One more relapse of the session: true when it is one too many (the session is to end). */
  note (sessionId: string): boolean {
    const count = (this.#counts.get(sessionId) ?? 0) + 1
    if (count >= RELAPSES_MAX) {
      this.#counts.delete(sessionId)
      return true
    }
    this.#counts.set(sessionId, count, { noUpdateTTL: true })
    return false
  }
}
