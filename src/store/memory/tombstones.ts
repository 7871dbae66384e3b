/**
 * At most this many deleted sessions are remembered (about 100 bytes each):
 * past it the oldest are forgotten first, and a recorder still reading one
 * of their answers takes the missing records for an eviction (not a loss:
 * see MemoryEventStore.intactSince), so even then nothing is recorded again.
 */
const MAX_TOMBSTONES = 100_000

/**
 * The embedded store's deleted sessions, each for `ttlMs` after its
 * deletion (the TTL its records had): see EventStore.sessionDeleted.
 */
export class Tombstones {
  /** Session id to the end of its mark; one TTL for all, so oldest first. */
  readonly #until = new Map<string, number>()
  readonly #ttlMs: number
  readonly #now: () => number

  constructor (ttlMs: number, now: () => number) {
    this.#ttlMs = ttlMs
    this.#now = now
  }

  /** The session was deleted. */
  note (sessionId: string): void {
    this.#until.delete(sessionId)
    this.#until.set(sessionId, this.#now() + this.#ttlMs)
    this.#prune()
  }

  /** The session id was created again. */
  clear (sessionId: string): void {
    this.#until.delete(sessionId)
  }

  has (sessionId: string): boolean {
    this.#prune()
    return this.#until.has(sessionId)
  }

  #prune (): void {
    const now = this.#now()
    for (const [id, until] of this.#until) {
      if (until > now && this.#until.size <= MAX_TOMBSTONES) return
      this.#until.delete(id)
    }
  }
}
