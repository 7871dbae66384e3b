// The memory store's process-wide byte cap: what is held (event bytes, a
// fixed weight per session and stream record, and each session's recipe), the
// order streams were appended to, and eviction when the total goes over the cap.
import type { EvictionKind, SessionRecipe, StoreUsage } from '../contract.js'
import { recipeBytes } from '../session-recipe.js'
import { LruOrder } from './lru-order.js'
import type { MemoryStream } from './memory-stream.js'
import type { MemorySession, SessionTable } from './session-table.js'

export interface RecordWeights { readonly session: number, readonly stream: number }

export class ByteCap {
  readonly #maxBytes: number
  readonly #recordBytes: RecordWeights
  /** Bytes of retained event data. */
  #eventBytes = 0
  /** Bytes of session and stream records, recipes included. */
  #recordTotal = 0
  /** Streams holding events, least recently appended first. */
  readonly #streams = new LruOrder<MemoryStream, MemorySession>()
  /** What the cap evicted since start (metrics read it). */
  readonly #evicted: Record<EvictionKind, number> = { stream: 0, events: 0, session: 0 }

  constructor (maxBytes: number, recordBytes: RecordWeights) {
    this.#maxBytes = maxBytes
    this.#recordBytes = recordBytes
  }

  get maxBytes (): number { return this.#maxBytes }
  get eventBytes (): number { return this.#eventBytes }
  /** Bytes counted against the cap: event data and records. */
  get heldBytes (): number { return this.#eventBytes + this.#recordTotal }
  /** Sessions the cap dropped since start. */
  get evictedSessions (): number { return this.#evicted.session }

  evicted (): StoreUsage['evicted'] {
    return { ...this.#evicted }
  }

  eventsAdded (bytes: number): void { this.#eventBytes += bytes }
  eventsFreed (bytes: number): void { this.#eventBytes -= bytes }
  sessionAdded (): void { this.#recordTotal += this.#recordBytes.session }
  streamAdded (): void { this.#recordTotal += this.#recordBytes.stream }

  /** The session's recipe from now on; its bytes count instead of the last one's (call evict after). */
  setRecipe (session: MemorySession, recipe: SessionRecipe | undefined): void {
    const kept = recipe === undefined ? undefined : { value: recipe, bytes: recipeBytes(recipe) }
    this.#recordTotal += (kept?.bytes ?? 0) - (session.recipe?.bytes ?? 0)
    session.recipe = kept
  }

  /** The stream was appended to: it is evicted last. */
  appended (stream: MemoryStream, session: MemorySession): void {
    this.#streams.touch(stream, session)
  }

  /** A session is dropped: release its records and its streams' events. */
  release (session: MemorySession): void {
    for (const stream of session.streams.values()) {
      this.#eventBytes -= stream.bytes
      this.#streams.delete(stream)
    }
    this.#recordTotal -= this.#recordBytes.session + (session.recipe?.bytes ?? 0) + session.streams.size * this.#recordBytes.stream
  }

  /**
   * Back under the cap, in order: empty the least recently appended streams (a
   * finished answer's stream goes altogether: a resume of it is told the
   * history is gone); then keep only the newest event of the current stream;
   * then, records alone being over the cap (a flood of sessions), drop the
   * least recently used sessions. Never the current session or stream.
   */
  evict (current: MemoryStream | undefined, currentSession: MemorySession, sessions: SessionTable): void {
    if (this.heldBytes <= this.#maxBytes) return
    for (const [stream, session] of this.#streams) {
      if (this.heldBytes <= this.#maxBytes) return
      if (stream === current) continue
      this.#evicted.stream++
      this.#eventBytes -= stream.empty()
      this.#streams.delete(stream)
      if (stream.ended && session.streams.get(stream.id) === stream) {
        session.streams.delete(stream.id)
        this.#recordTotal -= this.#recordBytes.stream
      }
    }
    if (current !== undefined) {
      while (this.heldBytes > this.#maxBytes && current.retained > 1) {
        this.#eventBytes -= current.dropOldest()
        this.#evicted.events++
      }
      current.compact()
    }
    // Still over with every other stream emptied and the current one down to its
    // newest event: records alone fill the cap (a flood of sessions).
    for (const [id, session] of sessions) {
      if (this.heldBytes <= this.#maxBytes) break
      if (session === currentSession) continue
      this.#evicted.session++
      sessions.drop(id)
    }
  }

  /** Forget everything held (the store is closing); the eviction counts stay. */
  clear (): void {
    this.#streams.clear()
    this.#eventBytes = 0
    this.#recordTotal = 0
  }
}
