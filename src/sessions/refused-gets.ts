import { boundedLru, type BoundedLru } from '../lru.js'

/**
 * Sessions whose upstream answered their GET with 405 (it has no standalone
 * stream), kept after their local state is forgotten: their request streams
 * are never resumed upstream, so an answer that ends early is concluded at
 * once instead of after the upstream's retry delay and a GET bound to fail.
 * Bounded: the oldest are forgotten first.
 */
export class RefusedGets {
  readonly #sessions: BoundedLru<string, true>

  constructor (maxSessions: number) {
    this.#sessions = boundedLru(Math.max(10_000, maxSessions * 4))
  }

  note (sessionId: string): void {
    this.#sessions.set(sessionId, true)
  }

  has (sessionId: string): boolean {
    return this.#sessions.has(sessionId)
  }

  forget (sessionId: string): void {
    this.#sessions.delete(sessionId)
  }
}
