/**
 * The packed-batch layout, described here once: how the events of one append
 * are packed (EventBatch), kept on Redis (an entry's `l` and `b` fields) and
 * read back. Every TypeScript reader goes through these functions; the Lua
 * scripts that read or write a layout (includes/trim-for-batch.lua,
 * end-orphaned-3.lua) follow this description.
 *
 * - `bytes`: each event's fields back to back, event after event: its frame
 *   (an upstream frame as it came) or its data (text), then its event type,
 *   then its upstream id, each as UTF-8 and possibly empty.
 * - `layout`: four numbers per event (NUMBERS_PER_EVENT): its flags, then the
 *   byte lengths of those three fields in that order.
 * - Flags: FLAG_EVENT (1) it has an event type; FLAG_UPSTREAM_ID (2) it has an
 *   upstream id (possibly empty); FLAG_FRAME (4) it is an upstream frame
 *   rather than text data.
 * - As text (Redis): each number in decimal followed by one space, so
 *   `4 301 0 0 4 299 0 0 ` is two plain frames of 301 and 299 bytes.
 */
import type { StoredEvent } from '../events.js'

export const FLAG_EVENT = 1
export const FLAG_UPSTREAM_ID = 2
export const FLAG_FRAME = 4
export const NUMBERS_PER_EVENT = 4

const SPACE = 0x20
const ZERO = 0x30

/** Bytes event `i` takes in `bytes` (all three fields). */
export function eventSize (layout: Uint32Array, i: number): number {
  const k = NUMBERS_PER_EVENT * i
  return (layout[k + 1] as number) + (layout[k + 2] as number) + (layout[k + 3] as number)
}

/** Where event `i` starts in `bytes`. */
export function eventStart (layout: Uint32Array, i: number): number {
  let at = 0
  for (let j = 0; j < i; j++) at += eventSize(layout, j)
  return at
}

/** Events [from, to) are upstream frames without an upstream id: their frames are `bytes`, back to back. */
export function plainFrames (layout: Uint32Array, from = 0, to = layout.length / NUMBERS_PER_EVENT): boolean {
  for (let k = NUMBERS_PER_EVENT * from; k < NUMBERS_PER_EVENT * to; k += NUMBERS_PER_EVENT) if (layout[k] !== FLAG_FRAME) return false
  return true
}

/** The layout of events [from, to) as text (encode). */
export function layoutText (layout: Uint32Array, from: number, to: number): Buffer {
  // Ten digits at most per number, and its space.
  const out = Buffer.allocUnsafe((to - from) * NUMBERS_PER_EVENT * 11)
  let at = 0
  for (let k = NUMBERS_PER_EVENT * from; k < NUMBERS_PER_EVENT * to; k++) {
    let n = layout[k] as number
    let digits = 1
    for (let m = n; m >= 10; m = (m / 10) >>> 0) digits++
    for (let i = at + digits - 1; i >= at; i--) {
      out[i] = ZERO + n % 10
      n = (n / 10) >>> 0
    }
    at += digits
    out[at++] = SPACE
  }
  return out.subarray(0, at)
}

/**
 * A layout read back from its text (decode), without a string or an object
 * per number. Throws on text that is not a whole number of events.
 */
export function parseLayoutText (text: Uint8Array): Uint32Array {
  let numbers = 0
  for (let i = 0; i < text.length; i++) if (text[i] === SPACE) numbers++
  if (numbers % NUMBERS_PER_EVENT !== 0) throw new RangeError(`a packed layout holds four numbers per event, not ${numbers}`)
  const layout = new Uint32Array(numbers)
  let k = 0
  let n = 0
  for (let i = 0; i < text.length; i++) {
    const c = text[i] as number
    if (c === SPACE) {
      layout[k++] = n
      n = 0
    } else {
      n = n * 10 + c - ZERO
    }
  }
  return layout
}

/**
 * Events [from, to) as objects, numbered from `firstSeq` for event 0
 * (iterate); `start` is where event `from` begins in `bytes`. Frames are
 * views of `bytes`.
 */
export function decodeEvents (bytes: Buffer, layout: Uint32Array, firstSeq: number, from = 0, to = layout.length / NUMBERS_PER_EVENT, start = eventStart(layout, from)): StoredEvent[] {
  const out = new Array<StoredEvent>(to - from)
  let at = start
  for (let i = from; i < to; i++) {
    const k = NUMBERS_PER_EVENT * i
    const flags = layout[k] as number
    const a = layout[k + 1] as number
    const b = layout[k + 2] as number
    const c = layout[k + 3] as number
    const upstreamId = (flags & FLAG_UPSTREAM_ID) !== 0 ? bytes.toString('utf8', at + a + b, at + a + b + c) : undefined
    const seq = firstSeq + i
    if ((flags & FLAG_FRAME) !== 0) {
      const frame = bytes.subarray(at, at + a)
      out[i - from] = upstreamId === undefined ? { seq, frame } : { seq, frame, upstreamId }
    } else {
      out[i - from] = {
        seq,
        data: bytes.toString('utf8', at, at + a),
        event: (flags & FLAG_EVENT) !== 0 ? bytes.toString('utf8', at + a, at + a + b) : undefined,
        upstreamId
      }
    }
    at += a + b + c
  }
  return out
}
