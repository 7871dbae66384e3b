import { randomBytes } from 'node:crypto'
import { SessionGoneError } from '../../errors.js'
import { randomToken } from '../../protocol/event-id.js'
import type {
  AdoptOptions, Adoption, AdoptionSettlement, AdoptionVerdict, AppendOptions, CreateSessionOptions, EventInput, EventStore, NoticeListener, ReadResult, RetentionLimits,
  SessionRecipe, SessionRecord, SessionStateChange, StoreUsage, StoredEvent, StreamState, UpstreamPlacement
} from '../contract.js'
import { applyStateChange } from '../session-recipe.js'
import { EventBatch } from '../batch/event-batch.js'
import { NumberedBatch } from '../batch/numbered-batch.js'
import { ReadPage } from '../batch/read-page.js'
import { BatchNotice } from '../batch/batch-notice.js'
import { ByteCap, type RecordWeights } from './byte-cap.js'
import { MemoryStream } from './memory-stream.js'
import { SEGMENT_WEIGHTS, type SegmentWeights } from './segment.js'
import { NoticeListeners } from './notice-listeners.js'
import { type MemorySession, SessionTable } from './session-table.js'
import { Tombstones } from './tombstones.js'

/**
 * What a record weighs against the cap besides event data and recipes: about
 * what a session (its id, principal hash, maps) and a stream record take on
 * the heap.
 */
export const RECORD_BYTES = { session: 512, stream: 256 } as const

export interface MemoryStoreOptions {
  readonly retention: RetentionLimits
  /**
   * Process-wide cap on the bytes stored events hold (with what their segments
   * hold besides, see segment.ts) plus RECORD_BYTES per record. Over
   * it, the least recently appended streams lose their events (a finished
   * answer's stream goes altogether), then the least recently used sessions go.
   */
  readonly maxBytes: number
  /** Record weights (tests about event bytes alone set them to 0). */
  readonly recordBytes?: RecordWeights
  /** What a segment of events weighs besides their bytes (SEGMENT_WEIGHTS; tests about event bytes alone set them to 0). */
  readonly segmentBytes?: SegmentWeights
  readonly now?: () => number
  readonly random?: (size: number) => Uint8Array
  /** How often expired sessions are swept (they are also dropped lazily on access). */
  readonly sweepIntervalMs?: number
}

/**
 * The embedded store: one process, not durable, bounded. Per-stream retention
 * by count and bytes, per-session TTL, and a process-wide byte cap enforced by
 * evicting the stream that was appended to least recently. Its parts: the
 * streams (memory-stream.ts, segment.ts), the sessions (session-table.ts),
 * the cap (byte-cap.ts) and the listeners (notice-listeners.ts).
 */
export class MemoryEventStore implements EventStore {
  readonly kind = 'memory' as const
  readonly #retention: RetentionLimits
  readonly #now: () => number
  readonly #random: (size: number) => Uint8Array
  /** When this store started: it lost everything before. */
  readonly #startedAt: number
  readonly #cap: ByteCap
  readonly #sessions: SessionTable
  readonly #listeners = new NoticeListeners()
  readonly #deleted: Tombstones
  /** Re-establishment fences by session: few, short-lived, each released by its taker. */
  readonly #fences = new Map<string, { readonly token: string, readonly until: number }>()
  readonly #segmentBytes: SegmentWeights

  constructor (options: MemoryStoreOptions) {
    this.#retention = options.retention
    this.#now = options.now ?? Date.now
    this.#random = options.random ?? randomBytes
    this.#startedAt = this.#now()
    this.#deleted = new Tombstones(options.retention.ttlMs, this.#now)
    this.#segmentBytes = options.segmentBytes ?? SEGMENT_WEIGHTS
    const cap = this.#cap = new ByteCap(options.maxBytes, options.recordBytes ?? RECORD_BYTES)
    this.#sessions = new SessionTable({
      retention: options.retention,
      now: this.#now,
      sweepIntervalMs: options.sweepIntervalMs ?? 30_000,
      onDrop: (session) => cap.release(session)
    })
  }

  /** Bytes of event data held, for tests and metrics. */
  get totalBytes (): number { return this.#cap.eventBytes }

  /** Bytes counted against the cap: event data and records. */
  get heldBytes (): number { return this.#cap.heldBytes }

  /** Sessions held, for tests. */
  get sessionCount (): number { return this.#sessions.size }

  /** Room and evictions, for metrics. */
  usage (): StoreUsage {
    return { heldBytes: this.heldBytes, maxBytes: this.#cap.maxBytes, sessions: this.#sessions.size, evicted: this.#cap.evicted() }
  }

  async createSession (sessionId: string, principal: string, options: CreateSessionOptions = {}): Promise<SessionRecord> {
    return this.#create(sessionId, principal, options).record
  }

  #create (sessionId: string, principal: string, options: CreateSessionOptions): MemorySession {
    this.#sessions.drop(sessionId)
    this.#deleted.clear(sessionId)
    const record = { epoch: randomToken(8, this.#random), principal, ...placementOf(sessionId, options.placement) }
    const session = this.#sessions.add(sessionId, record)
    this.#cap.sessionAdded()
    if (options.recipe !== undefined) this.#cap.setRecipe(session, { ...options.recipe, subscriptions: [], complete: true })
    this.#cap.evict(undefined, session, this.#sessions)
    return session
  }

  async adoptSession (sessionId: string, principal: string, { placement, confirmation }: AdoptOptions): Promise<Adoption | null> {
    // No await from the look-up to the count: two adoptions never both create, and the session
    // counted is the one returned.
    const live = this.#sessions.live(sessionId)
    const created = live === undefined
    if (created && this.#deleted.has(sessionId)) return null
    const session = live ?? this.#create(sessionId, principal, placement === undefined ? {} : { placement })
    if (!created) this.#sessions.touch(session)
    if (session.record.principal === principal) {
      const adoptions = session.adoptions ??= { pending: 0, confirmed: false, refused: false }
      if (confirmation === 'confirmed') adoptions.confirmed = true
      else adoptions.pending++
    }
    return { record: session.record, created }
  }

  async settleAdoption (sessionId: string, epoch: string, verdict: AdoptionVerdict): Promise<AdoptionSettlement> {
    const session = this.#sessions.live(sessionId)
    const adoptions = session?.adoptions
    if (session === undefined || adoptions === undefined || session.record.epoch !== epoch) return 'kept'
    adoptions.pending--
    if (verdict === 'confirmed') adoptions.confirmed = true
    if (verdict === 'refused') adoptions.refused = true
    if (adoptions.confirmed || adoptions.pending !== 0) return 'kept'
    if (adoptions.refused) {
      await this.deleteSession(sessionId)
      return 'deleted'
    }
    this.#sessions.drop(sessionId)
    return 'dropped'
  }

  async movePlacement (sessionId: string, expected: string, next: UpstreamPlacement): Promise<SessionRecord | null> {
    const session = this.#sessions.live(sessionId)
    if (session === undefined) return null
    if (session.record.upstreamSessionId === expected) {
      session.record = { epoch: session.record.epoch, principal: session.record.principal, ...placementOf(sessionId, next) }
    }
    this.#sessions.touch(session)
    return session.record
  }

  async acquireSessionFence (sessionId: string, token: string, ttlMs: number): Promise<boolean> {
    const held = this.#fences.get(sessionId)
    if (held !== undefined && held.until > this.#now()) return false
    this.#fences.set(sessionId, { token, until: this.#now() + ttlMs })
    return true
  }

  async releaseSessionFence (sessionId: string, token: string): Promise<void> {
    if (this.#fences.get(sessionId)?.token === token) this.#fences.delete(sessionId)
  }

  async recipe (sessionId: string): Promise<SessionRecipe | null> {
    return this.#sessions.live(sessionId)?.recipe?.value ?? null
  }

  async recordSessionState (sessionId: string, change: SessionStateChange): Promise<void> {
    const session = this.#sessions.live(sessionId)
    if (session?.recipe === undefined) return
    this.#cap.setRecipe(session, applyStateChange(session.recipe.value, change))
    this.#cap.evict(undefined, session, this.#sessions)
  }

  /**
   * Everything before this process started is gone; but once the cap evicted
   * a session, the store cannot tell a session it lost from one it dropped,
   * and claims no loss at all (0: intact since ever). Dropped under a bound,
   * like an expired session, it is not lost: an id this store does not know
   * may be one it dropped, which whoever comes back with it first must not adopt.
   */
  async intactSince (): Promise<number> {
    return this.#cap.evictedSessions > 0 ? 0 : this.#startedAt
  }

  async getSession (sessionId: string): Promise<SessionRecord | null> {
    const session = this.#sessions.live(sessionId)
    if (session === undefined) return null
    this.#sessions.touch(session)
    return session.record
  }

  async deleteSession (sessionId: string): Promise<void> {
    this.#sessions.drop(sessionId)
    this.#deleted.note(sessionId)
  }

  async sessionDeleted (sessionId: string): Promise<boolean> {
    return this.#deleted.has(sessionId)
  }

  async openStream (sessionId: string, streamId: string): Promise<StreamState> {
    const session = this.#require(sessionId)
    return this.#stream(session, streamId).state(session.record.epoch)
  }

  async append (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions = {}): Promise<StoredEvent[]> {
    return (await this.appendBatch(sessionId, streamId, events, options)).events.slice()
  }

  async appendBatch (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions = {}): Promise<NumberedBatch> {
    const session = this.#require(sessionId)
    const stream = this.#stream(session, streamId)
    const batch = events instanceof EventBatch ? events : EventBatch.from(events)
    const stored = new NumberedBatch(batch, stream.lastSeq + 1)
    this.#cap.eventsAdded(stream.append(batch, stored))
    if (options.end === true) stream.ended = true
    this.#sessions.touch(session)
    this.#cap.eventsFreed(stream.trim(this.#retention))
    // Most recently appended last: eviction takes from the front.
    this.#cap.appended(stream, session)
    this.#cap.evict(stream, session, this.#sessions)
    const notice = new BatchNotice(streamId, stream.lastSeq, stream.ended, stored)
    try {
      this.#listeners.notify(sessionId, notice)
    } finally {
      notice.spend()
    }
    return stored
  }

  async end (sessionId: string, streamId: string): Promise<void> {
    const session = this.#require(sessionId)
    const stream = this.#stream(session, streamId)
    stream.ended = true
    this.#listeners.notify(sessionId, { streamId, toSeq: stream.lastSeq, events: [], ended: true })
  }

  async read (sessionId: string, streamId: string, afterSeq: number, limit: number, maxBytes = Infinity): Promise<ReadResult | null> {
    const session = this.#sessions.live(sessionId)
    const stream = session?.streams.get(streamId)
    if (session === undefined || stream === undefined) return null
    const state = stream.state(session.record.epoch)
    return new ReadPage(stream.read(afterSeq, limit, maxBytes), state)
  }

  async state (sessionId: string, streamId: string): Promise<StreamState | null> {
    const session = this.#sessions.live(sessionId)
    const stream = session?.streams.get(streamId)
    if (session === undefined || stream === undefined) return null
    return stream.state(session.record.epoch)
  }

  async saveCursor (sessionId: string, streamId: string, seq: number): Promise<void> {
    const session = this.#sessions.live(sessionId)
    const stream = session?.streams.get(streamId)
    if (stream !== undefined) stream.cursor = seq
  }

  async loadCursor (sessionId: string, streamId: string): Promise<number> {
    return this.#sessions.live(sessionId)?.streams.get(streamId)?.cursor ?? 0
  }

  subscribe (sessionId: string, streamId: string, listener: NoticeListener): () => void {
    return this.#listeners.subscribe(sessionId, streamId, listener)
  }

  async ping (): Promise<void> {}

  async close (): Promise<void> {
    this.#sessions.close()
    this.#cap.clear()
    this.#listeners.clear()
  }

  #require (sessionId: string): MemorySession {
    const session = this.#sessions.live(sessionId)
    if (session === undefined) throw new SessionGoneError(sessionId)
    return session
  }

  #stream (session: MemorySession, streamId: string): MemoryStream {
    let stream = session.streams.get(streamId)
    if (stream === undefined) {
      stream = new MemoryStream(streamId, this.#segmentBytes)
      session.streams.set(streamId, stream)
      this.#cap.streamAdded()
      this.#cap.evict(stream, session, this.#sessions)
    }
    return stream
  }
}

/** A record's placement: the given one, or the session's own id on the one upstream. */
function placementOf (sessionId: string, placement: UpstreamPlacement | undefined): UpstreamPlacement {
  if (placement === undefined) return { upstreamSessionId: sessionId }
  return placement.endpoint === undefined ? { upstreamSessionId: placement.upstreamSessionId } : { upstreamSessionId: placement.upstreamSessionId, endpoint: placement.endpoint }
}
