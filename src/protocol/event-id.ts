/**
 * Gateway event ids. Opaque to clients, but the gateway reads back from an id
 * alone which stream to replay, where to resume and whether the store lost the
 * history behind it (the epoch changed).
 *
 *   <epoch>.<streamId>.<seq base 36>[_<nonce>]   (the nonce only on priming events)
 *
 * Visible ASCII only ([0-9a-z.]), so an id is always safe in an SSE `id:` line
 * and in the Last-Event-ID header. Decoding is strict: anything that is not an
 * id we could have issued decodes to null.
 */

export interface EventPosition {
  readonly epoch: string
  readonly streamId: string
  /** The sequence number the id stands for; 0 means "before the first event". */
  readonly seq: number
}

const ID_PATTERN = /^([0-9a-z]{1,16})\.([0-9a-z]{1,32})\.([0-9a-z]{1,11})(?:_[0-9a-z]{1,8})?$/
/** The longest ID_PATTERN matches (16 + 1 + 32 + 1 + 11 + 1 + 8); longer ids are rejected before it runs. */
export const MAX_EVENT_ID_LENGTH = 70

export function encodeEventId (position: EventPosition): string {
  return `${position.epoch}.${position.streamId}.${position.seq.toString(36)}`
}

/**
 * Writes a sequence number in base 36 into `out` at `at`, byte for byte what
 * encodeEventId spells, without making a string (the hot path writes one per
 * event). Returns the offset after it. `digits`: base36Digits(value), when
 * the caller has it already.
 */
export function writeBase36 (out: Uint8Array, at: number, value: number, digits = base36Digits(value)): number {
  let v = value
  for (let i = at + digits - 1; i >= at; i--) {
    const d = v % 36
    out[i] = d < 10 ? 0x30 + d : 0x57 + d
    v = (v - d) / 36
  }
  return at + digits
}

/** How many base-36 digits writeBase36 writes for `value`. */
export function base36Digits (value: number): number {
  let digits = 1
  // (v - d) / 36 is exact for any safe integer; Math.floor(v / 36) is not near 2^53.
  for (let v = value; v >= 36; v = (v - (v % 36)) / 36) digits++
  return digits
}

/**
 * The id of a priming event: the position it resumes from plus a nonce, so it
 * never repeats the id of an event the client already has (ids are unique
 * within a session) yet resumes from the same place.
 */
export function encodePrimingId (position: EventPosition, nonce: string): string {
  return `${encodeEventId(position)}_${nonce}`
}

export function decodeEventId (id: string | undefined | null): EventPosition | null {
  if (typeof id !== 'string' || id.length === 0 || id.length > MAX_EVENT_ID_LENGTH) return null
  const match = ID_PATTERN.exec(id)
  if (match === null) return null
  const seq = Number.parseInt(match[3] as string, 36)
  if (!Number.isSafeInteger(seq)) return null
  // Reject non-canonical spellings ("0a" for "a") so one position has one id.
  if (seq.toString(36) !== match[3]) return null
  return { epoch: match[1] as string, streamId: match[2] as string, seq }
}

const ALPHABET = '0123456789abcdefghijklmnopqrstuvwxyz'

/** A random token of [0-9a-z], for epochs and request stream ids. */
export function randomToken (length: number, random: (size: number) => Uint8Array): string {
  const bytes = random(length)
  let out = ''
  for (let i = 0; i < length; i++) out += ALPHABET[(bytes[i] as number) % 36]
  return out
}
