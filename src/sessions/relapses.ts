import { boundedLru, type BoundedLru } from '../lru.js'

/**
 * Sessions the upstream lost again right after they were established there
 * again: the request sent once more met the loss too. Once or twice is an
 * upstream restarting again meanwhile, and the session is kept (503, the
 * client's retry establishes it again). RELAPSES_MAX upstream sessions lost
 * so within RELAPSE_WINDOW_MS is an upstream that does not keep the session
 * at all: a load-balanced Service of replicas that keep sessions in memory,
 * routed without affinity, answers each request from another replica.
 * Establishing the session again at every retry would leave an upstream
 * session behind each time and never serve the client, so the session ends
 * instead (404: the client starts anew). What is counted is upstream sessions
 * lost, not requests that met the loss: the calls a client had in flight all
 * join one re-establishment, are all sent again, and all meet the next
 * restart together, which is one relapse.
 */
export const RELAPSES_MAX = 3
export const RELAPSE_WINDOW_MS = 60_000

export class Relapses {
  /** The upstream sessions each session lost right after they were established, for RELAPSE_WINDOW_MS from the first. Bounded: the least recent go first. */
  readonly #lost: BoundedLru<string, Set<string>>

  constructor (options: { maxEntries: number, windowMs?: number }) {
    this.#lost = boundedLru(options.maxEntries, { ttl: options.windowMs ?? RELAPSE_WINDOW_MS })
  }

  /**
   * The upstream lost `upstreamSessionId`, established for the session just
   * before: true when that makes one too many (the session is to end).
   */
  note (sessionId: string, upstreamSessionId: string): boolean {
    const lost = this.#lost.get(sessionId) ?? new Set<string>()
    lost.add(upstreamSessionId)
    if (lost.size >= RELAPSES_MAX) {
      this.#lost.delete(sessionId)
      return true
    }
    this.#lost.set(sessionId, lost, { noUpdateTTL: true })
    return false
  }
}
