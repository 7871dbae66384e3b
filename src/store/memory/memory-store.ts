import { randomBytes } from 'node:crypto'
import { SessionGoneError } from '../../errors.js'
import { randomToken } from '../../protocol/event-id.js'
import type {
  AppendOptions, EventInput, EventStore, NoticeListener, ReadResult, RetentionLimits,
  SessionRecord, StoreUsage, StoredEvent, StreamNotice, StreamState
} from '../contract.js'
import { EventBatch } from '../batch/event-batch.js'
import { NumberedBatch } from '../batch/numbered-batch.js'
import { BatchNotice } from '../batch/batch-notice.js'

/**
 * What a record weighs against the cap besides event data: about what a
 * session (its id, principal hash, maps) and a stream record take on the heap.
 */
export const RECORD_BYTES = { session: 512, stream: 256 } as const

export interface MemoryStoreOptions {
  readonly retention: RetentionLimits
  /**
   * Process-wide cap on stored event bytes plus RECORD_BYTES per record. Over
   * it, the least recently appended streams lose their events (a finished
   * answer's stream goes altogether), then the least recently used sessions go.
   */
  readonly maxBytes: number
  /** Record weights (tests about event bytes alone set them to 0). */
  readonly recordBytes?: { readonly session: number, readonly stream: number }
  readonly now?: () => number
  readonly random?: (size: number) => Uint8Array
  /** How often expired sessions are swept (they are also dropped lazily on access). */
  readonly sweepIntervalMs?: number
}

/**
 * The events of one append. Upstream frames are copied into one blob with
 * their end offsets, so a retained batch is a handful of objects however many
 * events it holds (the garbage collector then has little to trace in a full
 * store); events the gateway made itself are kept as they came.
 */
type Segment = FrameSegment | EventSegment

interface FrameSegment {
  /** Sequence number of the segment's first event. */
  readonly first: number
  readonly count: number
  /**
   * The frames' bytes: a buffer of its own from OFF_HEAP_SEGMENT_BYTES on,
   * below as a one-byte string (latin1: byte for byte), one leaf object in the
   * heap. Either way a full store costs the collector one object per append.
   */
  readonly blob: string | Buffer
  /** End offset of each event's frame in `blob` (small integers: a plain array, no backing store of its own). */
  readonly ends: readonly number[]
  /** Upstream ids by position, when any event had one. */
  readonly upstreamIds: ReadonlyArray<string | undefined> | undefined
  readonly events?: undefined
}

interface EventSegment {
  readonly first: number
  readonly count: number
  readonly events: readonly StoredEvent[]
}

interface MemoryStream {
  readonly id: string
  segments: Segment[]
  /** Index of the first live segment (trimming shifts lazily). */
  head: number
  /** Events of the first live segment already trimmed. */
  hidden: number
  /** Events retained. */
  retained: number
  lastSeq: number
  bytes: number
  ended: boolean
  cursor: number
}

interface MemorySession {
  readonly id: string
  readonly record: SessionRecord
  readonly streams: Map<string, MemoryStream>
  expiresAt: number
}

/** Bytes an event costs for retention: its data plus the small fields. */
function eventBytes (e: EventInput): number {
  const upstreamId = e.upstreamId?.length ?? 0
  return e.frame !== undefined ? e.frame.length + upstreamId : Buffer.byteLength(e.data) + (e.event?.length ?? 0) + upstreamId
}

/**
 * Segments of at least this many bytes keep them off the JavaScript heap, in
 * a buffer of their own. A fast upstream makes big segments at hundreds of
 * MB/s, all retained: in the heap, every young-generation collection would
 * copy the new ones (twice, before they reach the old generation). Smaller
 * ones (a slow stream's event or two) stay strings: cheap to copy, and one
 * buffer each would pin Node's shared pool or crowd V8 with tiny backing stores.
 */
const OFF_HEAP_SEGMENT_BYTES = 4096

/**
 * A batch's buffer is kept as the blob when its memory holds little besides
 * the batch (a builder's buffer grows by doubling, so it may be up to twice
 * what it holds): kept as it is, the events cost no copy and no allocation.
 * Past this share of unused room, a blob of the exact size is made instead,
 * so retention by bytes stays close to the memory actually held.
 */
const KEEP_BUFFER_MAX_SLACK = 0.25

function segmentOf (first: number, batch: EventBatch, plain: boolean, numbered: NumberedBatch): Segment {
  const count = batch.length
  if (plain) {
    // The usual batch, the upstream's frames and nothing else: its bytes are the blob.
    const bytes = batch.bytes
    const total = bytes.length
    const ends = new Array<number>(count)
    for (let i = 0, at = 0; i < count; i++) {
      at += batch.layout[4 * i + 1] as number
      ends[i] = at
    }
    if (total < OFF_HEAP_SEGMENT_BYTES) return { first, count, blob: bytes.toString('latin1'), ends, upstreamIds: undefined }
    if (bytes.buffer.byteLength <= total * (1 + KEEP_BUFFER_MAX_SLACK)) {
      batch.retain()
      return { first, count, blob: bytes, ends, upstreamIds: undefined }
    }
    const blob = Buffer.allocUnsafeSlow(total)
    bytes.copy(blob)
    return { first, count, blob, ends, upstreamIds: undefined }
  }
  // Frames are views of the batch's buffer (which may be twice their size): keep copies.
  const stored = numbered.events
  let total = 0
  let upstreamIds: Array<string | undefined> | undefined
  for (const [i, e] of stored.entries()) {
    if (e.frame === undefined) return { first, count, events: stored.map(e => e.frame === undefined ? e : { ...e, frame: Buffer.from(e.frame) }) }
    total += e.frame.length
    if (e.upstreamId !== undefined) (upstreamIds ??= [])[i] = e.upstreamId
  }
  const offHeap = total >= OFF_HEAP_SEGMENT_BYTES
  const bytes = offHeap ? Buffer.allocUnsafeSlow(total) : Buffer.allocUnsafe(total)
  const ends = new Array<number>(count)
  let at = 0
  for (const [i, e] of stored.entries()) {
    bytes.set(e.frame as Buffer, at)
    at += (e.frame as Buffer).length
    ends[i] = at
  }
  return { first, count, blob: offHeap ? bytes : bytes.toString('latin1'), ends, upstreamIds }
}

/** The event at position `i` of a segment. */
function eventAt (segment: Segment, i: number): StoredEvent {
  if (segment.events !== undefined) return segment.events[i] as StoredEvent
  const start = i === 0 ? 0 : segment.ends[i - 1] as number
  const frame = typeof segment.blob === 'string' ? Buffer.from(segment.blob.slice(start, segment.ends[i]), 'latin1') : segment.blob.subarray(start, segment.ends[i])
  const upstreamId = segment.upstreamIds?.[i]
  return upstreamId === undefined ? { seq: segment.first + i, frame } : { seq: segment.first + i, frame, upstreamId }
}

function sizeAt (segment: Segment, i: number): number {
  if (segment.events !== undefined) return eventBytes(segment.events[i] as StoredEvent)
  const start = i === 0 ? 0 : segment.ends[i - 1] as number
  return (segment.ends[i] as number) - start + (segment.upstreamIds?.[i]?.length ?? 0)
}

/**
 * The embedded store: one process, not durable, bounded. Per-stream retention
 * by count and bytes, per-session TTL, and a process-wide byte cap enforced by
 * evicting the stream that was appended to least recently.
 */
export class MemoryEventStore implements EventStore {
  readonly kind = 'memory' as const
  readonly #retention: RetentionLimits
  readonly #maxBytes: number
  readonly #now: () => number
  readonly #random: (size: number) => Uint8Array
  readonly #recordBytes: { readonly session: number, readonly stream: number }
  /** When this store started (it lost everything before); 0 once it evicted a session. */
  #intactSince: number
  /** Bytes of session and stream records (RECORD_BYTES each). */
  #recordTotal = 0
  readonly #sessions = new Map<string, MemorySession>()
  /** Streams in least-recently-appended order (Map keeps insertion order). */
  readonly #lru = new Map<MemoryStream, MemorySession>()
  readonly #listeners = new Map<string, Set<NoticeListener>>()
  readonly #sweeper: NodeJS.Timeout
  /** What the cap evicted since start (metrics read it). */
  readonly #evicted = { stream: 0, events: 0, session: 0 }
  #totalBytes = 0

  constructor (options: MemoryStoreOptions) {
    this.#retention = options.retention
    this.#maxBytes = options.maxBytes
    this.#now = options.now ?? Date.now
    this.#random = options.random ?? randomBytes
    this.#intactSince = this.#now()
    this.#recordBytes = options.recordBytes ?? RECORD_BYTES
    this.#sweeper = setInterval(() => this.#sweep(), options.sweepIntervalMs ?? 30_000)
    this.#sweeper.unref()
  }

  /** Bytes of event data held, for tests and metrics. */
  get totalBytes (): number { return this.#totalBytes }

  /** Bytes counted against the cap: event data and records. */
  get heldBytes (): number { return this.#totalBytes + this.#recordTotal }

  /** Sessions held, for tests. */
  get sessionCount (): number { return this.#sessions.size }

  /** Room and evictions, for metrics. */
  usage (): StoreUsage {
    return { heldBytes: this.heldBytes, maxBytes: this.#maxBytes, sessions: this.#sessions.size, evicted: { ...this.#evicted } }
  }

  async createSession (sessionId: string, principal: string): Promise<SessionRecord> {
    this.#drop(sessionId)
    const record = { epoch: randomToken(8, this.#random), principal }
    const session: MemorySession = { id: sessionId, record, streams: new Map(), expiresAt: this.#now() + this.#retention.ttlMs }
    this.#sessions.set(sessionId, session)
    this.#recordTotal += this.#recordBytes.session
    this.#evict(undefined, session)
    return record
  }

  async adoptSession (sessionId: string, principal: string): Promise<SessionRecord> {
    // No await between the look-up and the creation: two adoptions never both create.
    const session = this.#live(sessionId)
    if (session === undefined) return await this.createSession(sessionId, principal)
    this.#touch(session)
    return session.record
  }

  /**
   * Everything before this process started is gone; but once the cap evicted
   * a session, the store cannot tell a session it lost from one it dropped,
   * and claims no loss at all (0: intact since ever).
   */
  async intactSince (): Promise<number> {
    return this.#intactSince
  }

  async getSession (sessionId: string): Promise<SessionRecord | null> {
    const session = this.#live(sessionId)
    if (session === undefined) return null
    this.#touch(session)
    return session.record
  }

  async deleteSession (sessionId: string): Promise<void> {
    this.#drop(sessionId)
  }

  async openStream (sessionId: string, streamId: string): Promise<StreamState> {
    const session = this.#require(sessionId)
    return this.#stateOf(session, this.#stream(session, streamId))
  }

  async append (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions = {}): Promise<StoredEvent[]> {
    return (await this.appendBatch(sessionId, streamId, events, options)).events.slice()
  }

  async appendBatch (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions = {}): Promise<NumberedBatch> {
    const session = this.#require(sessionId)
    const stream = this.#stream(session, streamId)
    const batch = events instanceof EventBatch ? events : EventBatch.from(events)
    const stored = new NumberedBatch(batch, stream.lastSeq + 1)
    const count = batch.length
    if (count > 0) {
      let size = 0
      const plain = batch.plainFrames
      if (plain) size = batch.bytes.length
      else for (const e of stored.events) size += eventBytes(e)
      stream.lastSeq += count
      stream.segments.push(segmentOf(stream.lastSeq - count + 1, batch, plain, stored))
      stream.retained += count
      stream.bytes += size
      this.#totalBytes += size
    }
    if (options.end === true) stream.ended = true
    this.#touch(session)
    this.#trim(stream)
    // Most recently appended last: eviction takes from the front.
    this.#lru.delete(stream)
    this.#lru.set(stream, session)
    this.#evict(stream, session)
    this.#notify(sessionId, new BatchNotice(streamId, stream.lastSeq, stream.ended, stored))
    return stored
  }

  async end (sessionId: string, streamId: string): Promise<void> {
    const session = this.#require(sessionId)
    const stream = this.#stream(session, streamId)
    stream.ended = true
    this.#notify(sessionId, { streamId, toSeq: stream.lastSeq, events: [], ended: true })
  }

  async read (sessionId: string, streamId: string, afterSeq: number, limit: number, maxBytes = Infinity): Promise<ReadResult | null> {
    const session = this.#live(sessionId)
    const stream = session?.streams.get(streamId)
    if (session === undefined || stream === undefined) return null
    const state = this.#stateOf(session, stream)
    const from = Math.max(afterSeq + 1, state.firstSeq)
    const events: StoredEvent[] = []
    if (from > stream.lastSeq || limit <= 0) return { events, state }
    // Segments are in sequence order: find the one holding `from`, then walk on.
    let lo = stream.head
    let hi = stream.segments.length - 1
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1
      if ((stream.segments[mid] as Segment).first <= from) lo = mid
      else hi = mid - 1
    }
    let bytes = 0
    for (let k = lo; k < stream.segments.length && events.length < limit; k++) {
      const segment = stream.segments[k] as Segment
      for (let i = Math.max(0, from - segment.first); i < segment.count && events.length < limit; i++) {
        bytes += sizeAt(segment, i)
        if (bytes > maxBytes && events.length > 0) return { events, state }
        events.push(eventAt(segment, i))
      }
    }
    return { events, state }
  }

  async state (sessionId: string, streamId: string): Promise<StreamState | null> {
    const session = this.#live(sessionId)
    const stream = session?.streams.get(streamId)
    if (session === undefined || stream === undefined) return null
    return this.#stateOf(session, stream)
  }

  async saveCursor (sessionId: string, streamId: string, seq: number): Promise<void> {
    const session = this.#live(sessionId)
    const stream = session?.streams.get(streamId)
    if (stream !== undefined) stream.cursor = seq
  }

  async loadCursor (sessionId: string, streamId: string): Promise<number> {
    return this.#live(sessionId)?.streams.get(streamId)?.cursor ?? 0
  }

  subscribe (sessionId: string, streamId: string, listener: NoticeListener): () => void {
    const key = `${sessionId}\n${streamId}`
    let set = this.#listeners.get(key)
    if (set === undefined) {
      set = new Set()
      this.#listeners.set(key, set)
    }
    set.add(listener)
    return () => {
      set.delete(listener)
      if (set.size === 0 && this.#listeners.get(key) === set) this.#listeners.delete(key)
    }
  }

  async ping (): Promise<void> {}

  async close (): Promise<void> {
    clearInterval(this.#sweeper)
    this.#sessions.clear()
    this.#lru.clear()
    this.#listeners.clear()
    this.#totalBytes = 0
    this.#recordTotal = 0
  }

  #notify (sessionId: string, notice: StreamNotice): void {
    const set = this.#listeners.get(`${sessionId}\n${notice.streamId}`)
    if (set === undefined) return
    for (const listener of [...set]) listener(notice)
  }

  #live (sessionId: string): MemorySession | undefined {
    const session = this.#sessions.get(sessionId)
    if (session !== undefined && session.expiresAt <= this.#now()) {
      this.#drop(sessionId)
      return undefined
    }
    return session
  }

  #require (sessionId: string): MemorySession {
    const session = this.#live(sessionId)
    if (session === undefined) throw new SessionGoneError(sessionId)
    return session
  }

  #stream (session: MemorySession, streamId: string): MemoryStream {
    let stream = session.streams.get(streamId)
    if (stream === undefined) {
      stream = { id: streamId, segments: [], head: 0, hidden: 0, retained: 0, lastSeq: 0, bytes: 0, ended: false, cursor: 0 }
      session.streams.set(streamId, stream)
      this.#recordTotal += this.#recordBytes.stream
      this.#evict(stream, session)
    }
    return stream
  }

  /** Refresh the session's TTL; most recently used last, so the cap evicts from the front. */
  #touch (session: MemorySession): void {
    session.expiresAt = this.#now() + this.#retention.ttlMs
    this.#sessions.delete(session.id)
    this.#sessions.set(session.id, session)
  }

  #stateOf (session: MemorySession, stream: MemoryStream): StreamState {
    const retained = stream.retained
    return {
      epoch: session.record.epoch,
      lastSeq: stream.lastSeq,
      firstSeq: stream.lastSeq - retained + 1,
      ended: stream.ended
    }
  }

  /** Per-stream retention: drop the oldest events beyond the count or byte limit, never the newest. */
  #trim (stream: MemoryStream): void {
    const { maxEvents, maxBytes } = this.#retention
    while (stream.retained > 1 && (stream.retained > maxEvents || stream.bytes > maxBytes)) {
      this.#dropOldest(stream)
    }
    this.#compact(stream)
  }

  #dropOldest (stream: MemoryStream): void {
    const segment = stream.segments[stream.head] as Segment
    const size = sizeAt(segment, stream.hidden)
    stream.bytes -= size
    this.#totalBytes -= size
    stream.retained--
    if (++stream.hidden === segment.count) {
      stream.segments[stream.head] = undefined as unknown as Segment
      stream.head++
      stream.hidden = 0
    }
  }

  /** Drop every retained event at once (the stream keeps its numbering). */
  #empty (stream: MemoryStream): void {
    this.#totalBytes -= stream.bytes
    stream.bytes = 0
    stream.retained = 0
    stream.segments = []
    stream.head = 0
    stream.hidden = 0
  }

  /** Release trimmed slots once they are a large share of the array (amortised O(1)). */
  #compact (stream: MemoryStream): void {
    if (stream.head > 64 && stream.head * 2 > stream.segments.length) {
      stream.segments = stream.segments.slice(stream.head)
      stream.head = 0
    }
  }

  /**
   * Process-wide cap, in order: empty the least recently appended streams (a
   * finished answer's stream goes altogether: a resume of it is told the
   * history is gone); then keep only the newest event of the current stream;
   * then, records alone being over the cap (a flood of sessions), drop the
   * least recently used sessions. Never the current session or stream.
   */
  #evict (current: MemoryStream | undefined, currentSession: MemorySession): void {
    if (this.heldBytes <= this.#maxBytes) return
    for (const [stream, session] of this.#lru) {
      if (this.heldBytes <= this.#maxBytes) return
      if (stream === current) continue
      this.#evicted.stream++
      this.#empty(stream)
      this.#lru.delete(stream)
      if (stream.ended && session.streams.get(stream.id) === stream) {
        session.streams.delete(stream.id)
        this.#recordTotal -= this.#recordBytes.stream
      }
    }
    if (current !== undefined) {
      while (this.heldBytes > this.#maxBytes && current.retained > 1) {
        this.#dropOldest(current)
        this.#evicted.events++
      }
      this.#compact(current)
    }
    // Still over with every other stream emptied and the current one down to its
    // newest event: records alone fill the cap (a flood of sessions).
    for (const [id, session] of this.#sessions) {
      if (this.heldBytes <= this.#maxBytes) break
      if (session === currentSession) continue
      this.#evicted.session++
      this.#drop(id)
      // Dropped under a bound, like an expired session: not lost. From now on an
      // id this store does not know may be one it dropped, which whoever comes
      // back with it first must not adopt: the store stops claiming a loss.
      this.#intactSince = 0
    }
  }

  #drop (sessionId: string): void {
    const session = this.#sessions.get(sessionId)
    if (session === undefined) return
    for (const stream of session.streams.values()) {
      this.#totalBytes -= stream.bytes
      this.#lru.delete(stream)
    }
    this.#recordTotal -= this.#recordBytes.session + session.streams.size * this.#recordBytes.stream
    this.#sessions.delete(sessionId)
  }

  #sweep (): void {
    const now = this.#now()
    for (const [id, session] of this.#sessions) {
      if (session.expiresAt <= now) this.#drop(id)
    }
  }
}
