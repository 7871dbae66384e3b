import { finished, type Readable } from 'node:stream'
import type { SseDecoder } from '../sse/decoder.js'
import { EventBatchBuilder, type EventBatch } from '../store/batch.js'
import { discardBody } from '../upstream/client.js'

/**
 * Bytes of an upstream answer decoded ahead of the store, per stream. While
 * one append is at the store, the reads that arrive meanwhile are decoded and
 * wait here; they go to the store together as the next append. A fast upstream
 * then costs the store fewer, larger round trips, and the gateway decodes while
 * the store works. Past the stream's bound the upstream is paused
 * (backpressure). An idle stream holds nothing. What waits is packed
 * (store/batch.ts): a few objects, not a few per event, however long the
 * store takes.
 *
 * The bound is a share of READ_AHEAD_BUDGET_BYTES among the streams that have
 * events waiting, between READ_AHEAD_BYTES and READ_AHEAD_MAX_BYTES. One fast
 * stream on Redis gets the most: its appends are larger and fewer, and its
 * upstream is paused less often. In A/B runs of bench/run.mjs with one
 * stream on Redis: 512 KiB against a fixed 256 KiB, 0.48x against 0.43x
 * nginx's events/s; 2 MiB against 512 KiB, 0.58x against 0.50x (16% less
 * gateway CPU per event). Many fast streams get the floor each, so what
 * waits stays within the budget or the floor times their number.
 */
export const READ_AHEAD_BYTES = 256 * 1024
/**
 * At most this per stream. (A replay page reads whole Redis stream entries;
 * the Redis store cuts a large append into entries of ENTRY_MAX_BYTES, so
 * this bound does not make replay slower.)
 */
export const READ_AHEAD_MAX_BYTES = 2 * 1024 * 1024
export const READ_AHEAD_BUDGET_BYTES = 16 * 1024 * 1024

/** Streams of this process with decoded events waiting for the store. */
let waiting = 0

/** A waiting stream's bound now. */
export function readAheadLimit (): number {
  return Math.min(READ_AHEAD_MAX_BYTES, Math.max(READ_AHEAD_BYTES, Math.floor(READ_AHEAD_BUDGET_BYTES / Math.max(1, waiting))))
}

/**
 * The upstream's events, in order, as batches: each batch is everything that
 * arrived since the previous batch was taken (at least one event). Reading
 * goes on while the consumer works on a batch, up to `limitBytes` (by
 * default the stream's share, readAheadLimit()). Ends when the body ends;
 * throws the body's error, or the decoder's (an EventTooLargeError, after a
 * batch with the events that came before it).
 */
export async function * readAhead (body: Readable, decoder: SseDecoder, limitBytes?: number): AsyncGenerator<EventBatch, void, undefined> {
  const queued = new EventBatchBuilder()
  let queuedBytes = 0
  let done = false
  let failure: unknown
  let wake: (() => void) | undefined
  /** This stream is counted in `waiting`. */
  let counted = false
  const uncount = (): void => {
    if (counted) waiting--
    counted = false
  }
  const onData = (chunk: Buffer): void => {
    if (failure !== undefined) return
    try {
      decoder.pushInto(chunk, queued)
    } catch (err) {
      failure = err
      body.pause()
    }
    queuedBytes += chunk.length
    if (queued.length > 0 && !counted) {
      counted = true
      waiting++
    }
    // Only decoded events wait here; an event still arriving is the decoder's (MAX_EVENT_BYTES).
    if (queued.length > 0 && queuedBytes >= (limitBytes ?? readAheadLimit())) body.pause()
    wake?.()
  }
  const cleanup = finished(body, (err) => {
    if (err !== undefined && err !== null) failure ??= err
    done = true
    wake?.()
  })
  body.on('data', onData)
  try {
    for (;;) {
      if (queued.length > 0) {
        const batch = queued.take()
        queuedBytes = 0
        uncount()
        if (failure === undefined && body.isPaused()) body.resume()
        yield batch
        continue
      }
      if (failure !== undefined) throw failure
      if (done) return
      await new Promise<void>(resolve => { wake = resolve })
      wake = undefined
    }
  } finally {
    uncount()
    body.off('data', onData)
    cleanup()
    if (!done) {
      // The consumer stopped early (the store refused, the lease was lost): nothing
      // reads this body any more. Release it, as a for-await loop over it would, and
      // keep its late errors (undici reports a destroyed body as aborted) from
      // being uncaught, which would bring the process down.
      discardBody(body)
    }
  }
}
