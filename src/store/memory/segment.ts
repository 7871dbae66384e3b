// How the memory store keeps a stream's events: one segment per append.
import type { EventInput, StoredEvent } from '../events.js'
import { EventBatch } from '../batch/event-batch.js'
import { NumberedBatch } from '../batch/numbered-batch.js'
import { FLAG_FRAME, NUMBERS_PER_EVENT } from '../batch/packed-layout.js'

/**
 * The events of one append. Upstream frames are copied into one blob with
 * their end offsets, so a retained batch is a handful of objects however many
 * events it holds (the garbage collector then has little to trace in a full
 * store); events the gateway made itself are kept as they came.
 */
export type Segment = FrameSegment | EventSegment

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
  /**
   * What the segment holds beyond its events' own bytes (segmentOverhead):
   * held until the segment goes, so retention counts it with its last event.
   */
  readonly overhead: number
  readonly events?: undefined
}

interface EventSegment {
  readonly first: number
  readonly count: number
  readonly events: readonly StoredEvent[]
  /** segmentOverhead: event objects hold their own buffers, none to spare. */
  readonly overhead: number
}

/** Heap bytes a segment holds besides its events' bytes: its own, per event, per upstream id. */
export interface SegmentWeights {
  readonly segment: number
  readonly offset: number
  readonly upstreamId: number
}

/**
 * SegmentWeights measured on Node 24: a segment's object, its offsets and its
 * blob's header (about 160 bytes for one event), and per upstream id its slot
 * and string (about 200 more). Counted with the events, so that
 * MEMORY_STORE_MAX_BYTES and RETENTION_MAX_BYTES hold for an upstream that
 * sends tiny events one read at a time, one segment each (7-byte events used to
 * cost 23 to 34 times what was counted).
 */
export const SEGMENT_WEIGHTS: SegmentWeights = { segment: 160, offset: 8, upstreamId: 200 }

/** What a segment of `count` events, `upstreamIds` of them with an upstream id, holds besides their bytes; plus `spare`, the unused room of a buffer kept as it is. */
function segmentOverhead (weights: SegmentWeights, count: number, upstreamIds: number, spare = 0): number {
  return weights.segment + weights.offset * count + weights.upstreamId * upstreamIds + spare
}

/** Bytes an event costs for retention: its data plus the small fields. */
export function eventBytes (e: EventInput): number {
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
 * A batch's buffer is kept as the blob when its events fill at least half of
 * it (a builder sizes its buffer for the largest of its last few batches, so
 * it usually does): kept as it is, the events cost no copy and no
 * allocation, and retention counts the room they leave (in `overhead`), so the
 * store's byte bounds hold the memory actually held. Against copying every
 * batch more than a quarter empty, this rule spent 1.77-1.99 rather than
 * 2.11-2.57 us per event with 100 flooding sessions (bench/run.mjs
 * --only=thr100). A buffer less than half full (a builder sized for a larger
 * batch than it got), or a view into a buffer it does not start (the rest is
 * not the batch's to count), is copied to a blob of the exact size.
 */
const KEEP_BUFFER_MIN_FILL = 0.5

export function segmentOf (first: number, batch: EventBatch, plain: boolean, numbered: NumberedBatch, weights: SegmentWeights = SEGMENT_WEIGHTS): Segment {
  const count = batch.length
  if (plain) {
    // The usual batch, the upstream's frames and nothing else: its bytes are the blob.
    const bytes = batch.bytes
    const total = bytes.length
    const ends = new Array<number>(count)
    for (let i = 0, at = 0; i < count; i++) {
      at += batch.layout[NUMBERS_PER_EVENT * i + 1] as number
      ends[i] = at
    }
    if (total < OFF_HEAP_SEGMENT_BYTES) return { first, count, blob: bytes.toString('latin1'), ends, upstreamIds: undefined, overhead: segmentOverhead(weights, count, 0) }
    if (bytes.byteOffset === 0 && total >= bytes.buffer.byteLength * KEEP_BUFFER_MIN_FILL) {
      batch.retain()
      return { first, count, blob: bytes, ends, upstreamIds: undefined, overhead: segmentOverhead(weights, count, 0, bytes.buffer.byteLength - total) }
    }
    const blob = Buffer.allocUnsafeSlow(total)
    bytes.copy(blob)
    return { first, count, blob, ends, upstreamIds: undefined, overhead: segmentOverhead(weights, count, 0) }
  }
  // Frames are views of the batch's buffer (which may be twice their size): keep copies.
  const stored = numbered.events
  let total = 0
  let upstreamIds: Array<string | undefined> | undefined
  let ids = 0
  for (const [i, e] of stored.entries()) {
    if (e.frame === undefined) return { first, count, events: stored.map(e => e.frame === undefined ? e : { ...e, frame: Buffer.from(e.frame) }), overhead: segmentOverhead(weights, count, 0) }
    total += e.frame.length
    if (e.upstreamId !== undefined) {
      (upstreamIds ??= [])[i] = e.upstreamId
      ids++
    }
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
  return { first, count, blob: offHeap ? bytes : bytes.toString('latin1'), ends, upstreamIds, overhead: segmentOverhead(weights, count, ids) }
}

/** The event at position `i` of a segment. */
export function eventAt (segment: Segment, i: number): StoredEvent {
  if (segment.events !== undefined) return segment.events[i] as StoredEvent
  const start = i === 0 ? 0 : segment.ends[i - 1] as number
  const frame = typeof segment.blob === 'string' ? Buffer.from(segment.blob.slice(start, segment.ends[i]), 'latin1') : segment.blob.subarray(start, segment.ends[i])
  const upstreamId = segment.upstreamIds?.[i]
  return upstreamId === undefined ? { seq: segment.first + i, frame } : { seq: segment.first + i, frame, upstreamId }
}

/**
 * Events [from, to) of a segment, packed: the frames of a segment of frames
 * as they are kept (a view of its blob when that is a buffer), other events
 * packed afresh.
 */
export function batchOf (segment: Segment, from: number, to: number): NumberedBatch {
  const first = segment.first + from
  if (segment.events !== undefined || segment.upstreamIds !== undefined) {
    const events: StoredEvent[] = []
    for (let i = from; i < to; i++) events.push(eventAt(segment, i))
    return new NumberedBatch(EventBatch.from(events), first)
  }
  const ends = segment.ends
  const start = from === 0 ? 0 : ends[from - 1] as number
  const end = ends[to - 1] as number
  const layout = new Uint32Array(NUMBERS_PER_EVENT * (to - from))
  for (let i = from, k = 0, at = start; i < to; i++, k += NUMBERS_PER_EVENT) {
    layout[k] = FLAG_FRAME
    layout[k + 1] = (ends[i] as number) - at
    at = ends[i] as number
  }
  const bytes = typeof segment.blob === 'string' ? Buffer.from(segment.blob.slice(start, end), 'latin1') : segment.blob.subarray(start, end)
  return new NumberedBatch(new EventBatch(bytes, layout, ''), first)
}

/** Bytes the event at position `i` holds: its own, and for the last one the segment's overhead. */
export function heldAt (segment: Segment, i: number): number {
  return sizeAt(segment, i) + (i === segment.count - 1 ? segment.overhead : 0)
}

/** Bytes of the event at position `i` (its frame or data and small fields). */
export function sizeAt (segment: Segment, i: number): number {
  if (segment.events !== undefined) return eventBytes(segment.events[i] as StoredEvent)
  const start = i === 0 ? 0 : segment.ends[i - 1] as number
  return (segment.ends[i] as number) - start + (segment.upstreamIds?.[i]?.length ?? 0)
}
