// The packed batch and the builder that packs it. They share a file because
// each needs the other: a batch packs an array of events with a builder
// (EventBatch.from), and a builder hands out batches (take()).

import type { EventInput, StoredEvent } from '../events.js'
import { keptUpstreamId } from '../../protocol/upstream-event-id.js'
import { decodeEvents, eventSize, FLAG_EVENT, FLAG_FRAME, FLAG_UPSTREAM_ID, layoutText, NUMBERS_PER_EVENT, plainFrames } from './packed-layout.js'

/** Smallest buffer a builder starts a batch with; buffers are sized in steps of this. */
const MIN_CAPACITY = 4096
/**
 * Batches a builder sizes for the largest of the recent ones: after this many
 * smaller ones in a row, it sizes for the last one instead.
 */
const PEAK_BATCHES = 4
/** Smallest layout a builder starts a batch with, in events (a Uint32Array this big is off the heap). */
const MIN_EVENTS = 16

/** A builder's buffers: the bytes of a batch's events and their layout. */
interface BatchBuffers { bytes: Buffer, layout: Uint32Array }

/**
 * Events packed for the store: the bytes of every event in one buffer, and
 * four numbers per event in `layout` (packed-layout.ts describes both, and
 * reads and writes them). However many events a batch holds, it is a
 * handful of objects, and both its arrays live outside the JavaScript heap:
 * what waits for the store (a Redis round trip, the next append) gives the
 * garbage collector nothing to trace or copy. The
 * Redis store keeps batches in exactly this form (see docs/redis.md, Key layout).
 */
export class EventBatch {
  static readonly EMPTY = new EventBatch(Buffer.alloc(0), new Uint32Array(0), '')

  readonly bytes: Buffer
  readonly layout: Uint32Array
  /** The last upstream id of the batch that is not empty ('' when none). */
  readonly lastUpstreamId: string
  /**
   * The builder's buffers that `bytes` and `layout` are views of, while they
   * may go back to it for the next batch (see release()).
   */
  #whole: BatchBuffers | undefined

  constructor (bytes: Buffer, layout: Uint32Array, lastUpstreamId: string, whole?: BatchBuffers) {
    this.bytes = bytes
    this.layout = layout
    this.lastUpstreamId = lastUpstreamId
    this.#whole = whole
  }

  /**
   * Something keeps the batch's bytes (a store keeps them as they are, or
   * views of them outlive the append): they are never reused.
   */
  retain (): void {
    this.#whole = undefined
  }

  /**
   * The batch's buffers, for its builder to fill again: the caller is done
   * with the batch and knows that nothing else reads it any more (the store
   * answered the append and took no view of it). Undefined when the batch was
   * retained, its event objects were made (their frames are views), or it
   * was released already.
   */
  release (): BatchBuffers | undefined {
    const whole = this.#whole
    this.#whole = undefined
    return whole
  }

  /** Pack events (the gateway's own, or a caller's array). */
  static from (events: readonly EventInput[]): EventBatch {
    if (events.length === 0) return EventBatch.EMPTY
    const builder = new EventBatchBuilder()
    for (const e of events) builder.add(e)
    return builder.take()
  }

  get length (): number { return this.layout.length / NUMBERS_PER_EVENT }

  /** Bytes of the events' frames or data, without their types and upstream ids. */
  get dataBytes (): number {
    let total = 0
    for (let k = 1; k < this.layout.length; k += NUMBERS_PER_EVENT) total += this.layout[k] as number
    return total
  }

  /** The layout of events [from, to) as text (how Redis keeps it). */
  layoutText (from = 0, to = this.length): Buffer {
    return layoutText(this.layout, from, to)
  }

  /**
   * The batch cut into runs of whole events of at most `maxBytes` each (an
   * event larger than that is a run of its own): each run's event count,
   * layout text and bytes (a view of `bytes`). How the Redis store writes a
   * batch as stream entries.
   */
  runs (maxBytes: number): Array<{ count: number, layout: Buffer, bytes: Buffer }> {
    const out: Array<{ count: number, layout: Buffer, bytes: Buffer }> = []
    const layout = this.layout
    let from = 0
    let start = 0
    let at = 0
    for (let i = 0; i < this.length; i++) {
      const size = eventSize(layout, i)
      if (i > from && at + size - start > maxBytes) {
        out.push({ count: i - from, layout: this.layoutText(from, i), bytes: this.bytes.subarray(start, at) })
        from = i
        start = at
      }
      at += size
    }
    if (this.length > from) out.push({ count: this.length - from, layout: this.layoutText(from, this.length), bytes: this.bytes.subarray(start, at) })
    return out
  }

  /** Every event is a frame without an upstream id: `bytes` is the frames, back to back. */
  get plainFrames (): boolean {
    return plainFrames(this.layout)
  }

  /** The events, numbered from `firstSeq`; frames are views of `bytes` (so the batch is retained). */
  stored (firstSeq: number): StoredEvent[] {
    this.retain()
    return decodeEvents(this.bytes, this.layout, firstSeq)
  }

  /** The events as the caller appended them (numbers aside). */
  toArray (): EventInput[] {
    return this.stored(0).map(({ seq: _seq, ...event }) => event as EventInput)
  }

  /** Does any event's frame or data hold `needle`? A quick check before parsing any. */
  includes (needle: string): boolean {
    return this.bytes.includes(needle)
  }
}

/**
 * Packs events into a batch as they come: the upstream's frames are copied
 * out of the read they came in (the read is free to go at once), into one
 * buffer. The buffer starts at the size of the largest of the last few
 * batches and a sixteenth, and grows by half when a batch outgrows it. A busy
 * stream's batches alternate between large ones (what its upstream answer
 * buffered while the previous append ran) and a read or two: sized after the
 * last batch alone, the large ones would regrow every time, and sized in
 * powers of two, their buffers were a third empty on average. Either is
 * memory allocated for nothing, and what Node allocates outside the
 * JavaScript heap sets how often a flooded gateway runs a full garbage
 * collection (V8 starts one for every 64 MB of it). After PEAK_BATCHES
 * smaller batches in a row (a stream that went quiet), buffers are small
 * again. A batch the store is done with comes back (recycle()) and the next
 * one is packed into its buffers, so a flooded stream does not make new ones
 * (and work for the garbage collector) for every append; between batches the
 * builder holds them only weakly, so a quiet stream holds nothing.
 */
export class EventBatchBuilder {
  #bytes: Buffer | undefined
  #used = 0
  #layout: Uint32Array | undefined
  #count = 0
  #lastUpstreamId = ''
  /** Bytes of the largest of the recent batches (see PEAK_BATCHES). */
  #peak = 0
  /** Batches taken since #peak was set. */
  #peakAge = 0
  #nextEvents = MIN_EVENTS
  /**
   * Frames without an upstream id, from one source, not copied yet: `copy()`
   * of part of a buffer makes a view object each time, so they are copied in
   * one piece (from the first's start to the last's end, the lines between
   * them included) and then moved together in place (copyWithin makes no object).
   */
  #source: Buffer | undefined
  #sourceStart = 0
  #sourceEnd = 0
  /** Where the first pending frame goes in #bytes. */
  #target = 0
  /** Start and end in #source of each pending frame: the first #spanCount pairs (kept between batches). */
  readonly #spans: number[] = []
  #spanCount = 0
  /** A batch's buffers that came back (recycle()) while events waited, for the next batch. */
  #spare: BatchBuffers | undefined
  /**
   * A batch's buffers that came back while no events waited, held weakly: a
   * stream that went quiet keeps nothing the collector would not free anyway,
   * and one that reads again before the next full collection packs into them.
   */
  #weakSpare: WeakRef<BatchBuffers> | undefined

  get length (): number { return this.#count }
  /** Bytes packed so far. */
  get byteLength (): number { return this.#used }

  /**
   * An upstream frame: bytes [start, end) of `source`, copied before the
   * next call that is not addFrame() with the same source and no upstream id,
   * and before take(). Until then the caller must not change `source`.
   */
  addFrame (source: Buffer, start: number, end: number, upstreamId?: string): void {
    if (upstreamId === undefined && end > start) {
      if (source !== this.#source || start < this.#sourceEnd) {
        this.flush()
        this.#source = source
        this.#sourceStart = start
        this.#target = this.#used
      }
      // Room for the piece copied at once, lines between the frames included.
      this.#reserve(this.#target + end - this.#sourceStart - this.#used)
      this.#sourceEnd = end
      this.#spans[2 * this.#spanCount] = start
      this.#spans[2 * this.#spanCount + 1] = end
      this.#spanCount++
      this.#used += end - start
      this.#push(FLAG_FRAME, end - start, 0, 0)
      return
    }
    this.flush()
    const idBytes = upstreamId === undefined ? 0 : Buffer.byteLength(upstreamId)
    const bytes = this.#reserve(end - start + idBytes)
    this.#used += source.copy(bytes, this.#used, start, end)
    this.#push(upstreamId === undefined ? FLAG_FRAME : FLAG_FRAME | FLAG_UPSTREAM_ID, end - start, 0, idBytes)
    if (upstreamId !== undefined) this.#writeUpstreamId(upstreamId)
  }

  /** Copy the pending frames (see addFrame) into the batch: their source may change after this. */
  flush (): void {
    const source = this.#source
    if (source === undefined) return
    const bytes = this.#bytes as Buffer
    const spans = this.#spans
    source.copy(bytes, this.#target, this.#sourceStart, this.#sourceEnd)
    // Each frame moves left over the lines that came between it and the previous one.
    let at = this.#target
    for (let i = 0; i < 2 * this.#spanCount; i += 2) {
      const start = spans[i] as number
      const length = (spans[i + 1] as number) - start
      const from = this.#target + start - this.#sourceStart
      if (from !== at) bytes.copyWithin(at, from, from + length)
      at += length
    }
    this.#spanCount = 0
    this.#source = undefined
  }

  add (event: EventInput): void {
    if (event.frame !== undefined) {
      this.addFrame(event.frame, 0, event.frame.length, event.upstreamId)
      return
    }
    this.flush()
    const { data, event: type, upstreamId } = event
    const dataBytes = Buffer.byteLength(data)
    const typeBytes = type === undefined ? 0 : Buffer.byteLength(type)
    const idBytes = upstreamId === undefined ? 0 : Buffer.byteLength(upstreamId)
    const bytes = this.#reserve(dataBytes + typeBytes + idBytes)
    this.#used += bytes.write(data, this.#used)
    if (type !== undefined) this.#used += bytes.write(type, this.#used)
    this.#push((type === undefined ? 0 : FLAG_EVENT) | (upstreamId === undefined ? 0 : FLAG_UPSTREAM_ID), dataBytes, typeBytes, idBytes)
    if (upstreamId !== undefined) this.#writeUpstreamId(upstreamId)
  }

  /**
   * A batch of this builder's that nothing reads any more (see
   * EventBatch.release()): its buffers take the next batch's events. If
   * events wait already (the stream is busy), the builder keeps them for it;
   * otherwise only weakly, and lets go of any it kept, so a stream that went
   * quiet holds nothing. A busy stream's small batches come between large
   * ones in buffers sized for those: the store copies such a batch out, and
   * its buffer, kept weakly, takes the next batch instead of a new one.
   */
  recycle (batch: EventBatch): void {
    const whole = batch.release()
    if (this.#count === 0) {
      this.#spare = undefined
      if (whole !== undefined) this.#weakSpare = new WeakRef(whole)
      return
    }
    this.#spare ??= whole
  }

  /** The events packed so far, as a batch; the builder starts over empty. */
  take (): EventBatch {
    this.flush()
    if (this.#count === 0) return EventBatch.EMPTY
    const bytes = this.#bytes as Buffer
    const layout = this.#layout as Uint32Array
    const batch = new EventBatch(bytes.subarray(0, this.#used), layout.subarray(0, NUMBERS_PER_EVENT * this.#count), this.#lastUpstreamId, { bytes, layout })
    if (this.#used >= this.#peak || ++this.#peakAge >= PEAK_BATCHES) {
      this.#peak = this.#used
      this.#peakAge = 0
    }
    this.#nextEvents = MIN_EVENTS
    while (this.#nextEvents < this.#count) this.#nextEvents *= 2
    this.#bytes = undefined
    this.#used = 0
    this.#layout = undefined
    this.#count = 0
    this.#lastUpstreamId = ''
    return batch
  }

  #push (flags: number, a: number, b: number, c: number): void {
    let layout = this.#layout
    const k = NUMBERS_PER_EVENT * this.#count
    if (layout === undefined || layout.length === k) {
      const grown = new Uint32Array(layout === undefined ? NUMBERS_PER_EVENT * this.#nextEvents : 2 * layout.length)
      if (layout !== undefined) grown.set(layout)
      layout = this.#layout = grown
    }
    layout[k] = flags
    layout[k + 1] = a
    layout[k + 2] = b
    layout[k + 3] = c
    this.#count++
  }

  #writeUpstreamId (upstreamId: string): void {
    this.#used += (this.#bytes as Buffer).write(upstreamId, this.#used)
    if (upstreamId !== '') this.#lastUpstreamId = keptUpstreamId(upstreamId)
  }

  /** The buffer, with room for `more` bytes after what is used. */
  #reserve (more: number): Buffer {
    const need = this.#used + more
    const current = this.#bytes
    if (current !== undefined && current.length >= need) return current
    const spare = current === undefined ? this.#spare ?? this.#weakSpare?.deref() : undefined
    if (spare !== undefined) {
      // The first event of a batch: it takes the spare's layout (grown like any
      // other when full), and its bytes when they have room.
      this.#spare = undefined
      this.#weakSpare = undefined
      this.#layout ??= spare.layout
      if (spare.bytes.length >= need) {
        this.#bytes = spare.bytes
        return spare.bytes
      }
    }
    let capacity = current === undefined ? roundUp(this.#peak + (this.#peak >> 4)) : largerCapacity(current.length)
    while (capacity < need) capacity = largerCapacity(capacity)
    // Never from Node's shared pool (64 KB from Node 24 on, so a 4-8 KB batch
    // would be a slice of it): a batch is kept in the store and across a Redis
    // round trip, and must not hold other buffers' memory alive with it.
    const grown = Buffer.allocUnsafeSlow(capacity)
    if (current !== undefined) current.copy(grown, 0, 0, this.#used)
    this.#bytes = grown
    return grown
  }
}

/** `bytes` rounded up to whole steps of MIN_CAPACITY (at least one). */
function roundUp (bytes: number): number {
  return Math.max(MIN_CAPACITY, Math.ceil(bytes / MIN_CAPACITY) * MIN_CAPACITY)
}

/** The next size of a buffer that is too small: half as large again. */
function largerCapacity (capacity: number): number {
  return roundUp(capacity + (capacity >> 1))
}
