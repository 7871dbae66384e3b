import { EventTooLargeError } from './event-too-large.js'
import { CR, isField, keptLines, LF } from './lines.js'
import { EventBatchBuilder } from '../store/batch/event-batch.js'
import type { FrameEvent } from '../store/contract.js'

/**
 * One complete upstream SSE event, as bytes (an EventInput, stored as it
 * is): its field lines exactly as the upstream sent them (less any `retry`
 * and `id` fields), each with its line break, without the blank line that
 * ended the event. The gateway forwards these bytes and adds its own `id:`
 * line after them, so the
 * upstream's data is never parsed or re-serialised on the hot path.
 */
export interface UpstreamEvent extends FrameEvent {
  /** The upstream's own id field (the last one of the event), when it sent one. */
  readonly upstreamId?: string | undefined
}

const BOM = Buffer.from([0xef, 0xbb, 0xbf])
const EMPTY = Buffer.alloc(0)
/** Bytes of a line that tell which field it is ("retry:" and one more). */
const HEAD_BYTES = 8

/** The value of a field line: after the colon, one leading space dropped. */
function fieldValue (buf: Buffer, start: number, end: number, nameLength: number): string {
  let from = start + nameLength + 1
  if (from < end && buf[from] === 0x20) from++
  return from >= end ? '' : buf.toString('utf8', from, end)
}

/**
 * The block's lines without its `retry` and `id` fields. The reconnection
 * delay clients get is the gateway's (SSE_RETRY_MS), and the ids they see are
 * the gateway's only: an upstream's hint or id inside an event would be
 * passed on with it. A copy, only for events that carry either.
 */
function withoutRetryLines (buf: Buffer, start: number, end: number): Buffer {
  return keptLines(buf, start, end, notRetryOrId)
}

function notRetryOrId (buf: Buffer, start: number, end: number): boolean {
  return !isField(buf, start, end, 'retry') && !isField(buf, start, end, 'id')
}

/**
 * Splits the upstream's SSE bytes into events, packed as they complete into
 * a batch (store/batch/event-batch.ts) that the store takes in one round trip. It finds event boundaries (blank lines in
 * any of SSE's spellings: LF, CR, CRLF, even split across reads) and which
 * blocks are events (a block without a `data` field dispatches nothing), and
 * reads the few fields the gateway needs (`id`, `retry`); it never decodes an
 * event's data. A frame keeps the event's lines as sent, except `retry`
 * and `id` fields (the gateway's retry hint and ids are the ones clients
 * follow); events with empty data (priming) are not kept. A leading byte
 * order mark is dropped, as a client would.
 *
 * MAX_EVENT_BYTES bounds an event's bytes on the wire (all its lines): an
 * upstream that never ends an event must not grow memory without limit.
 */
export class SseDecoder {
  readonly #maxEventBytes: number
  /**
   * The unfinished block's bytes from earlier reads (copies, so a read's
   * buffer is not pinned), in order. Kept as a list and joined once, when
   * the block completes: a large event arriving in small reads costs time
   * in proportion to its size, not to its size squared.
   */
  #pending: Buffer[] = []
  #pendingBytes = 0
  /** The pieces of #pending that hold the unfinished line (it started in an earlier read). */
  #lineParts: Buffer[] = []
  #lineBytes = 0
  #hasData = false
  /** The block's data is empty (one `data` field, empty): clients dispatch no such event (priming). */
  #emptyData = false
  /** The block has a retry field (kept out of the frame). */
  #hasRetry = false
  /** The value of the block's last id line, if any. */
  #blockId: string | undefined
  /** The previous read ended with CR: an LF starting the next read belongs to it. */
  #skipLf = false
  #atStart = true
  /** The first bytes of the body, while too few to tell whether they start with a byte order mark. */
  #head: Buffer | undefined
  #retry: number | undefined
  #lastId: string | undefined

  constructor (maxEventBytes: number) {
    this.#maxEventBytes = maxEventBytes
  }

  /** The upstream's own retry hint, if it sent one. */
  get retry (): number | undefined { return this.#retry }
  /** The upstream's last event id, also from blocks that carried no data. */
  get lastId (): string | undefined { return this.#lastId }

  /**
   * Feed one chunk; returns the events it completed (possibly none), copied
   * out of it. Throws EventTooLargeError when an event exceeds the bound; the
   * error carries the complete events that came before it.
   */
  push (chunk: Uint8Array): UpstreamEvent[] {
    const into = new EventBatchBuilder()
    try {
      this.pushInto(chunk, into)
    } catch (err) {
      if (err instanceof EventTooLargeError) throw new EventTooLargeError(this.#maxEventBytes, into.take().toArray() as UpstreamEvent[])
      throw err
    }
    return into.take().toArray() as UpstreamEvent[]
  }

  /**
   * Feed one chunk; the events it completes are packed into `into` (their
   * bytes copied: the chunk is not kept). Throws EventTooLargeError when an
   * event exceeds the bound; the complete events before it are in `into`.
   */
  pushInto (chunk: Uint8Array, into: EventBatchBuilder): void {
    let bytes = Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength)
    if (this.#skipLf && bytes.length > 0) {
      this.#skipLf = false
      if (bytes[0] === LF) bytes = bytes.subarray(1)
    }
    if (this.#atStart) {
      const head = this.#head === undefined ? bytes : Buffer.concat([this.#head, bytes])
      // Too short to tell whether it starts with a byte order mark: wait for more.
      if (head.length < BOM.length && BOM.subarray(0, head.length).equals(head)) {
        this.#head = head
        return
      }
      this.#atStart = false
      this.#head = undefined
      bytes = head.subarray(0, BOM.length).equals(BOM) ? head.subarray(BOM.length) : head
    }
    if (bytes.length === 0) return
    try {
      this.#scan(bytes, into)
    } finally {
      // The events are copied out of the chunk before the caller has it back.
      into.flush()
    }
  }

  /** End of the upstream body: an unterminated last event is discarded, as the SSE spec says. */
  end (): UpstreamEvent[] {
    this.#reset()
    return []
  }

  /** Forget the unfinished block. */
  #reset (): void {
    this.#pending = []
    this.#pendingBytes = 0
    this.#lineParts = []
    this.#lineBytes = 0
    this.#hasData = false
    this.#emptyData = false
    this.#hasRetry = false
    this.#blockId = undefined
  }

  #scan (buf: Buffer, into: EventBatchBuilder): void {
    /** Where the unfinished block starts in `buf`; 0 with #pending non-empty: it started in an earlier read. */
    let blockStart = 0
    let pos = 0
    // Most upstreams end lines with LF alone: then one search per line does.
    const anyCr = buf.indexOf(CR) !== -1
    // With CRs, the next LF and the next CR from `pos` (-1: none left), each searched
    // again only once passed: a read of many LF lines and one CR is scanned once.
    let lf = -2
    let cr = -2
    for (;;) {
      let end: number
      let next: number
      if (!anyCr) {
        end = buf.indexOf(LF, pos)
        if (end === -1) break
        next = end + 1
      } else {
        if (lf !== -1 && lf < pos) lf = buf.indexOf(LF, pos)
        if (cr !== -1 && cr < pos) cr = buf.indexOf(CR, pos)
        if (lf === -1 && cr === -1) break
        end = cr === -1 || (lf !== -1 && lf < cr) ? lf : cr
        if (buf[end] === CR) {
          if (end + 1 < buf.length) {
            next = buf[end + 1] === LF ? end + 2 : end + 1
          } else {
            // A CR ending the read ends its line; a following LF is part of it.
            next = end + 1
            this.#skipLf = true
          }
        } else {
          next = end + 1
        }
      }
      if (this.#lineBytes > 0) {
        // The end of a line that started in an earlier read.
        this.#splitField(buf, end)
      } else if (end === pos) {
        // A blank line: the block is over.
        if (this.#pendingBytes > 0) this.#dispatchJoined(buf, pos, into)
        else if (pos > blockStart) this.#dispatch(buf, blockStart, pos, into)
        blockStart = next
      } else {
        this.#field(buf, pos, end)
      }
      pos = next
    }
    const rest = this.#pendingBytes + buf.length - blockStart
    if (rest > this.#maxEventBytes) {
      this.#reset()
      throw new EventTooLargeError(this.#maxEventBytes)
    }
    if (blockStart === buf.length) return
    // Keep the unfinished block's bytes from this read (a copy: the read's buffer is not pinned by it).
    const kept = Buffer.from(buf.subarray(blockStart))
    this.#pending.push(kept)
    this.#pendingBytes += kept.length
    if (pos < buf.length) {
      const line = kept.subarray(pos - blockStart)
      this.#lineParts.push(line)
      this.#lineBytes += line.length
    }
  }

  /**
   * A line that started in an earlier read ends at `end` in `buf`. Only its
   * first bytes tell which field it is; the whole line is joined only for the
   * fields whose value the gateway reads (id, retry), once.
   */
  #splitField (buf: Buffer, end: number): void {
    const length = this.#lineBytes + end
    const first = this.#lineParts[0] as Buffer
    const whole = first[0] === 0x69 || first[0] === 0x72 || length <= HEAD_BYTES // i(d), r(etry)
    // Otherwise its head is enough: #field reads no further than a field name and its colon.
    const line = Buffer.concat([...this.#lineParts, buf.subarray(0, whole ? end : Math.min(end, HEAD_BYTES))], whole ? length : HEAD_BYTES)
    this.#lineParts = []
    this.#lineBytes = 0
    this.#field(line, 0, length)
  }

  /** Note what the gateway needs from one field line [start, end). */
  #field (buf: Buffer, start: number, end: number): void {
    switch (buf[start]) {
      case 0x64: // d
        if (isField(buf, start, end, 'data')) {
          // "data", "data:" or "data: ": empty (the value itself is never decoded here).
          this.#emptyData = !this.#hasData && (end - start <= 5 || (end - start === 6 && buf[start + 5] === 0x20))
          this.#hasData = true
        }
        break
      case 0x69: // i
        if (isField(buf, start, end, 'id')) this.#blockId = fieldValue(buf, start, end, 2)
        break
      case 0x72: // r
        if (isField(buf, start, end, 'retry')) {
          this.#hasRetry = true
          const value = fieldValue(buf, start, end, 5)
          if (/^\d+$/.test(value)) this.#retry = Number(value)
        }
        break
    }
  }

  /** A block that started in an earlier read ends at `end` in `buf`: its pieces joined, once. */
  #dispatchJoined (buf: Buffer, end: number, into: EventBatchBuilder): void {
    const length = this.#pendingBytes + end
    // Too large events are refused before their bytes are joined.
    const block = this.#hasData && length <= this.#maxEventBytes ? Buffer.concat([...this.#pending, buf.subarray(0, end)], length) : EMPTY
    this.#pending = []
    this.#pendingBytes = 0
    this.#dispatch(block, 0, length, into)
  }

  #dispatch (buf: Buffer, start: number, end: number, into: EventBatchBuilder): void {
    let id: string | undefined
    const value = this.#blockId
    // An id containing NUL is ignored by clients (SSE spec).
    if (value !== undefined && !value.includes('\0')) {
      id = value
      this.#lastId = value
    }
    // An event with empty data (the upstream's priming event) is never dispatched by
    // a client: only its id counts, for resuming the upstream.
    if (this.#hasData && !this.#emptyData) {
      if (end - start > this.#maxEventBytes) {
        this.#reset()
        throw new EventTooLargeError(this.#maxEventBytes)
      }
      if (this.#hasRetry || this.#blockId !== undefined) {
        const frame = withoutRetryLines(buf, start, end)
        into.addFrame(frame, 0, frame.length, id)
      } else {
        into.addFrame(buf, start, end, id)
      }
    }
    this.#hasData = false
    this.#emptyData = false
    this.#hasRetry = false
    this.#blockId = undefined
  }
}
