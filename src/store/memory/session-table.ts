// The memory store's sessions: their records and streams, their expiry (lazy
// on access, and a periodic sweep), and the order they were used in, which
// the byte cap drops them by when records alone fill it.
import type { RetentionLimits, SessionRecipe, SessionRecord } from '../contract.js'
import { LruOrder } from './lru-order.js'
import type { MemoryStream } from './memory-stream.js'

export interface MemorySession {
  readonly id: string
  /** Replaced whole when the session moves upstream (movePlacement). */
  record: SessionRecord
  /** Set through ByteCap.setRecipe only, which counts its bytes against the cap. */
  recipe: KeptRecipe | undefined
  readonly streams: Map<string, MemoryStream>
  expiresAt: number
  /** Adoptions of the record (adoptSession): waiting for the upstream's word, and whether one was confirmed, or refused. */
  adoptions?: { pending: number, confirmed: boolean, refused: boolean }
}

/** A session's recipe and the bytes it counts for, one value: they cannot disagree. */
export interface KeptRecipe {
  readonly value: SessionRecipe
  readonly bytes: number
}

export interface SessionTableOptions {
  readonly retention: RetentionLimits
  readonly now: () => number
  /** How often expired sessions are swept. */
  readonly sweepIntervalMs: number
  /** Called for each session dropped (expired, deleted, replaced or evicted), to release what it held. */
  readonly onDrop: (session: MemorySession) => void
}

export class SessionTable {
  /** Least recently used first. */
  readonly #sessions = new LruOrder<string, MemorySession>()
  readonly #retention: RetentionLimits
  readonly #now: () => number
  readonly #onDrop: (session: MemorySession) => void
  readonly #sweeper: NodeJS.Timeout

  constructor (options: SessionTableOptions) {
    this.#retention = options.retention
    this.#now = options.now
    this.#onDrop = options.onDrop
    this.#sweeper = setInterval(() => this.#sweep(), options.sweepIntervalMs)
    this.#sweeper.unref()
  }

  get size (): number { return this.#sessions.size }

  /** A new session without a recipe, most recently used; the id must not be held (drop() it first). */
  add (sessionId: string, record: SessionRecord): MemorySession {
    const session: MemorySession = { id: sessionId, record, recipe: undefined, streams: new Map(), expiresAt: this.#now() + this.#retention.ttlMs }
    this.#sessions.touch(sessionId, session)
    return session
  }

  /** The session unless it expired (then it is dropped now). */
  live (sessionId: string): MemorySession | undefined {
    const session = this.#sessions.get(sessionId)
    if (session !== undefined && session.expiresAt <= this.#now()) {
      this.drop(sessionId)
      return undefined
    }
    return session
  }

  /** Refresh the session's TTL; most recently used last, so the cap evicts from the front. */
  touch (session: MemorySession): void {
    session.expiresAt = this.#now() + this.#retention.ttlMs
    this.#sessions.touch(session.id, session)
  }

  drop (sessionId: string): void {
    const session = this.#sessions.get(sessionId)
    if (session === undefined) return
    this.#onDrop(session)
    this.#sessions.delete(sessionId)
  }

  /** Sessions with their ids, least recently used first; dropping during the walk is safe. */
  [Symbol.iterator] (): MapIterator<[string, MemorySession]> {
    return this.#sessions[Symbol.iterator]()
  }

  /** Stop sweeping and forget every session (without onDrop: the store is closing). */
  close (): void {
    clearInterval(this.#sweeper)
    this.#sessions.clear()
  }

  #sweep (): void {
    const now = this.#now()
    for (const [id, session] of this.#sessions) {
      if (session.expiresAt <= now) this.drop(id)
    }
  }
}
