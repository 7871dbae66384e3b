/**
 * Pure: a page of packed batches framed for a client, in one buffer, without
 * an object per event. Each upstream frame goes out as it came, followed by
 * the gateway's id line (the last id field of an event is the one the client
 * keeps); events the gateway made itself are framed by formatEvent.
 */
import { base36Digits, writeBase36 } from '../protocol/event-id.js'
import type { NumberedBatch } from '../store/batch/numbered-batch.js'
import { eventSize, eventStart, FLAG_EVENT, FLAG_FRAME, NUMBERS_PER_EVENT, plainFrames } from '../store/batch/packed-layout.js'
import { formatEvent, startsWithBom } from './frame.js'

export interface FramedPage {
  readonly bytes: Buffer
  /** Sequence number of the last event framed. */
  readonly lastSeq: number
  readonly count: number
}

/**
 * The events of `batches` (contiguous, in order) after `afterSeq`, framed;
 * undefined when there are none. `idPrefix` is an id line up to the sequence
 * number (`id: <epoch>.<stream>.`), `eventId` a whole id, for text events. A
 * batch of plain upstream frames is copied in one piece, then its frames are
 * moved apart in place, last first, to make room for each one's id line;
 * other batches are framed event by event. The page's buffer comes from
 * `allocate` (a size in bytes; PageBuffers.take lends reused ones).
 */
export function framePage (batches: readonly NumberedBatch[], afterSeq: number, idPrefix: Buffer, eventId: (seq: number) => string, allocate: (size: number) => Buffer = Buffer.allocUnsafe): FramedPage | undefined {
  let size = 0
  let count = 0
  let last = afterSeq
  /** Text events, framed in the first pass: their bytes are known only then. */
  let texts: string[] | undefined
  for (const { batch, firstSeq } of batches) {
    const { bytes, layout } = batch
    const n = batch.length
    const skip = Math.max(0, last + 1 - firstSeq)
    if (skip >= n) continue
    for (let i = skip, at = eventStart(layout, skip); i < n; i++) {
      const k = NUMBERS_PER_EVENT * i
      const flags = layout[k] as number
      const length = layout[k + 1] as number
      const seq = firstSeq + i
      if ((flags & FLAG_FRAME) !== 0) {
        // A byte order mark starting a response body is dropped by clients: when a
        // frame starts with one, an empty comment line keeps it where it was.
        if (startsWithBom(bytes, at)) size += 2
        size += length + idPrefix.length + base36Digits(seq) + 2
      } else {
        const text = formatEvent(eventId(seq), bytes.toString('utf8', at, at + length),
          (flags & FLAG_EVENT) !== 0 ? bytes.toString('utf8', at + length, at + length + (layout[k + 2] as number)) : undefined)
        ;(texts ??= []).push(text)
        size += Buffer.byteLength(text)
      }
      at += eventSize(layout, i)
    }
    count += n - skip
    last = firstSeq + n - 1
  }
  if (count === 0) return undefined
  const out = allocate(size)
  let at = 0
  let text = 0
  last = afterSeq
  for (const { batch, firstSeq } of batches) {
    const { bytes, layout } = batch
    const n = batch.length
    const skip = Math.max(0, last + 1 - firstSeq)
    if (skip >= n) continue
    if (plainFrames(layout, skip, n)) {
      at = spreadFrames(out, at, bytes, layout, firstSeq, skip, idPrefix)
    } else {
      for (let i = skip, from = eventStart(layout, skip); i < n; i++) {
        const k = NUMBERS_PER_EVENT * i
        if (((layout[k] as number) & FLAG_FRAME) !== 0) {
          const length = layout[k + 1] as number
          if (startsWithBom(bytes, from)) {
            out[at++] = 0x3a
            out[at++] = 0x0a
          }
          at += bytes.copy(out, at, from, from + length)
          out.set(idPrefix, at)
          at = writeBase36(out, at + idPrefix.length, firstSeq + i)
          out[at++] = 0x0a
          out[at++] = 0x0a
        } else {
          at += out.write((texts as string[])[text++] as string, at)
        }
        from += eventSize(layout, i)
      }
    }
    last = firstSeq + n - 1
  }
  return { bytes: out, lastSeq: last, count }
}

/**
 * Plain frames [skip, end) of a batch written at `at` of `out` with their id
 * lines: copied in one piece, then moved apart in place, last first. Returns
 * where they end.
 */
function spreadFrames (out: Buffer, at: number, bytes: Buffer, layout: Uint32Array, firstSeq: number, skip: number, idPrefix: Buffer): number {
  const count = layout.length / NUMBERS_PER_EVENT
  const start = eventStart(layout, skip)
  let frames = 0
  let size = 0
  for (let k = NUMBERS_PER_EVENT * skip, seq = firstSeq + skip; k < layout.length; k += NUMBERS_PER_EVENT, seq++) {
    const length = layout[k + 1] as number
    if (startsWithBom(bytes, start + frames)) size += 2
    frames += length
    size += length + idPrefix.length + base36Digits(seq) + 2
  }
  bytes.copy(out, at, start, start + frames)
  let end = at + size
  let from = at + frames
  for (let k = layout.length - NUMBERS_PER_EVENT, seq = firstSeq + count - 1; k >= NUMBERS_PER_EVENT * skip; k -= NUMBERS_PER_EVENT, seq--) {
    const length = layout[k + 1] as number
    from -= length
    const digits = base36Digits(seq)
    const idAt = end - idPrefix.length - digits - 2
    const to = idAt - length
    if (to !== from) out.copyWithin(to, from, from + length)
    idPrefix.copy(out, idAt)
    const lf = writeBase36(out, idAt + idPrefix.length, seq, digits)
    out[lf] = 0x0a
    out[lf + 1] = 0x0a
    end = to
    if (startsWithBom(out, to)) {
      out[--end] = 0x0a
      out[--end] = 0x3a
    }
  }
  return at + size
}
