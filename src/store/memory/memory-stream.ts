// One stream of the memory store: its events in segments (segment.ts), its
// numbering, and per-stream retention. The byte totals across streams are the
// byte cap's (byte-cap.ts): what changes them here returns the bytes it adds or frees.
import type { RetentionLimits, StreamState } from '../contract.js'
import type { EventBatch } from '../batch/event-batch.js'
import { NumberedBatch } from '../batch/numbered-batch.js'
import { type Segment, type SegmentWeights, batchOf, eventBytes, heldAt, SEGMENT_WEIGHTS, segmentOf, sizeAt } from './segment.js'

export class MemoryStream {
  readonly id: string
  ended = false
  cursor = 0
  #segments: Segment[] = []
  /** Index of the first live segment (trimming shifts lazily). */
  #head = 0
  /** Events of the first live segment already trimmed. */
  #hidden = 0
  #retained = 0
  #lastSeq = 0
  #bytes = 0
  readonly #weights: SegmentWeights

  /** `weights`: what a segment counts besides its events' bytes (tests about event bytes alone set them to 0). */
  constructor (id: string, weights: SegmentWeights = SEGMENT_WEIGHTS) {
    this.id = id
    this.#weights = weights
  }

  /** Sequence number of the newest event, 0 when none was appended. */
  get lastSeq (): number { return this.#lastSeq }
  /** Events retained. */
  get retained (): number { return this.#retained }
  /** Bytes the retained events hold: theirs, and what their segments hold besides (see segment.ts). */
  get bytes (): number { return this.#bytes }

  state (epoch: string): StreamState {
    return {
      epoch,
      lastSeq: this.#lastSeq,
      firstSeq: this.#lastSeq - this.#retained + 1,
      ended: this.ended
    }
  }

  /** Keep a batch's events, numbered from lastSeq + 1 (`numbered`); returns the bytes they add. */
  append (batch: EventBatch, numbered: NumberedBatch): number {
    const count = batch.length
    if (count === 0) return 0
    let size = 0
    const plain = batch.plainFrames
    if (plain) size = batch.bytes.length
    else for (const e of numbered.events) size += eventBytes(e)
    this.#lastSeq += count
    const segment = segmentOf(this.#lastSeq - count + 1, batch, plain, numbered, this.#weights)
    size += segment.overhead
    this.#segments.push(segment)
    this.#retained += count
    this.#bytes += size
    return size
  }

  /**
   * Retained events after `afterSeq`, oldest first: at most `limit` of them and
   * `maxBytes` of event bytes, but at least one when any is left. Packed, one
   * batch per segment they come from (views of its blob when it is a buffer).
   */
  read (afterSeq: number, limit: number, maxBytes: number): NumberedBatch[] {
    const from = Math.max(afterSeq + 1, this.#lastSeq - this.#retained + 1)
    const batches: NumberedBatch[] = []
    if (from > this.#lastSeq || limit <= 0) return batches
    // Segments are in sequence order: find the one holding `from`, then walk on.
    const segments = this.#segments
    let lo = this.#head
    let hi = segments.length - 1
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1
      if ((segments[mid] as Segment).first <= from) lo = mid
      else hi = mid - 1
    }
    let bytes = 0
    let count = 0
    for (let k = lo; k < segments.length && count < limit; k++) {
      const segment = segments[k] as Segment
      const start = Math.max(0, from - segment.first)
      let end = start
      for (; end < segment.count && count < limit; end++, count++) {
        bytes += sizeAt(segment, end)
        if (bytes > maxBytes && count > 0) break
      }
      if (end > start) batches.push(batchOf(segment, start, end))
      if (end < segment.count) break
    }
    return batches
  }

  /** Per-stream retention: drop the oldest events beyond the count or byte limit, never the newest. Returns the bytes freed. */
  trim (retention: RetentionLimits): number {
    const { maxEvents, maxBytes } = retention
    let freed = 0
    while (this.#retained > 1 && (this.#retained > maxEvents || this.#bytes > maxBytes)) {
      freed += this.dropOldest()
    }
    this.compact()
    return freed
  }

  /** Drop the oldest retained event; returns its bytes. */
  dropOldest (): number {
    const segment = this.#segments[this.#head] as Segment
    const size = heldAt(segment, this.#hidden)
    this.#bytes -= size
    this.#retained--
    if (++this.#hidden === segment.count) {
      this.#segments[this.#head] = undefined as unknown as Segment
      this.#head++
      this.#hidden = 0
    }
    return size
  }

  /** Drop every retained event at once (the stream keeps its numbering); returns the bytes freed. */
  empty (): number {
    const freed = this.#bytes
    this.#bytes = 0
    this.#retained = 0
    this.#segments = []
    this.#head = 0
    this.#hidden = 0
    return freed
  }

  /** Release trimmed slots once they are a large share of the array (amortised O(1)). */
  compact (): void {
    if (this.#head > 64 && this.#head * 2 > this.#segments.length) {
      this.#segments = this.#segments.slice(this.#head)
      this.#head = 0
    }
  }
}
