import type { Readable } from 'node:stream'
import type { SseDecoder } from '../sse/decoder.js'
import { EventBatchBuilder, type EventBatch } from '../store/batch/event-batch.js'
import { discardBody } from '../upstream/client.js'

/**
 * Bytes of an upstream answer decoded ahead of the store, per stream. While
 * one append is at the store, the reads that arrive meanwhile are decoded and
 * wait here; they go to the store together as the next append. A fast upstream
 * then costs the store fewer, larger round trips, and the gateway decodes while
 * the store works. Past the stream's bound the upstream is paused
 * (backpressure). An idle stream holds nothing. What waits is packed
 * (store/batch/event-batch.ts): a few objects, not a few per event, however long the
 * store takes.
 *
 * The bound is a share of a gateway's READ_AHEAD_BUDGET_BYTES among its
 * streams that have events waiting, between READ_AHEAD_BYTES and
 * READ_AHEAD_MAX_BYTES. One fast stream on Redis gets the most: its appends
 * are larger and fewer, and its upstream is paused less often (one stream on
 * Redis with 2 MB at most appended about 6,000 events at a time instead of
 * 1,600 with 512 KB, and read 0.58x nginx's events/s against 0.50x). Many
 * fast streams get the floor each, so what waits stays within the budget or
 * the floor times their number.
 */
export const READ_AHEAD_BYTES = 256 * 1024
/**
 * At most this per stream. (A replay page reads whole Redis stream entries;
 * the Redis store cuts a large append into entries of ENTRY_MAX_BYTES, so
 * this bound does not make replay slower.)
 */
export const READ_AHEAD_MAX_BYTES = 2 * 1024 * 1024
export const READ_AHEAD_BUDGET_BYTES = 16 * 1024 * 1024

/**
 * Bytes of upstream reads a gateway's streams handle in one turn of the
 * event loop, all streams together. Each read costs its decoding, its
 * append and its writes to clients right away (on the embedded store, all of
 * it before the loop moves on), and libuv reads up to 32 x 64 KB from each
 * ready socket per turn: 100 flooding streams made turns of seconds, and
 * every other request (a new client, /healthz) waited as many turns as it
 * needs. Past this, a stream pauses until a later turn, first come first
 * served. 256 KB is about 870 events of 300 bytes, 1.5-3 ms of work at the
 * 1.7-3.4 us of CPU an event costs with 100 sessions here: a new client
 * needs five or so turns for its initialize and GET. (1 MB made a new
 * client's head wait 100-350 ms at p99 behind a 100-stream flood, 256 KB
 * 88-164 ms, as nginx in the same flood, at the same CPU per event.)
 */
export const TURN_BYTES = 256 * 1024

/**
 * What libuv reads from a socket at once. A stream resumed for its turn may
 * read what its body holds already plus this before it is counted again, so
 * the burst that a resume releases is not cut in the middle (each cut is one
 * more pause, resume and smaller append).
 */
const SOCKET_READ_BYTES = 64 * 1024

/** A stream paused for a later turn (see TURN_BYTES). */
export interface TurnWaiter {
  /**
   * Its turn came: read again. Returns what it may read before it is
   * counted again (counted against the turn): the bytes its body holds
   * already, plus SOCKET_READ_BYTES.
   */
  resumeTurn: () => number
}

/** Resumed slots at the head of the turn queue past which it is compacted. */
const COMPACT_AFTER = 1024

/**
 * One gateway's read-ahead budget: its streams with decoded events waiting
 * for the store share READ_AHEAD_BUDGET_BYTES, and all its streams share
 * TURN_BYTES per turn of the event loop. Each gateway has its own (two
 * gateways in one process, as in tests, do not squeeze each other).
 *
 * A turn ends at the loop's check phase (setImmediate, scheduled by the
 * turn's first read): the count starts again from zero there, so a stream
 * is paused only when this turn really carried TURN_BYTES, never for what
 * earlier turns read. The streams that waited are resumed there, in order,
 * as far as the new turn's bytes go.
 */
export class ReadAheadBudget {
  /** Streams with decoded events waiting for the store. */
  #waiting = 0
  /** Bytes read in this turn of the event loop, all streams together. */
  #turnBytes = 0
  /** The end of this turn is scheduled. */
  #turnEnds = false
  /** Streams paused for a later turn, in the order they paused (from #head on). */
  #waiters: TurnWaiter[] = []
  #head = 0
  readonly #endTurn = (): void => {
    this.#turnEnds = false
    this.#turnBytes = 0
    const waiters = this.#waiters
    if (this.#head === waiters.length) return
    // What the resumed streams read (in this check phase) belongs to the next turn: end that one too.
    this.#scheduleEnd()
    while (this.#head < waiters.length && this.#turnBytes < TURN_BYTES) {
      const waiter = waiters[this.#head] as TurnWaiter
      waiters[this.#head++] = undefined as unknown as TurnWaiter
      this.#turnBytes += waiter.resumeTurn()
    }
    if (this.#head === waiters.length) {
      this.#waiters = []
      this.#head = 0
    } else if (this.#head >= COMPACT_AFTER && 2 * this.#head >= waiters.length) {
      // Under a flood that never lets every stream through in one turn the queue never
      // empties: the slots already resumed go, or the array would grow for as long.
      this.#waiters = waiters.slice(this.#head)
      this.#head = 0
    }
  }

  /** Slots the queue of waiting streams takes (its memory): those waiting, and at most as many resumed. */
  get queueSlots (): number { return this.#waiters.length }

  /** A stream read `bytes` in this turn: false once the turn's share is spent (the stream is to wait). */
  spend (bytes: number): boolean {
    if (!this.#turnEnds) this.#scheduleEnd()
    this.#turnBytes += bytes
    return this.#turnBytes < TURN_BYTES
  }

  /** A stream paused until a later turn: resumed first come first served. */
  waitTurn (waiter: TurnWaiter): void {
    this.#waiters.push(waiter)
    if (!this.#turnEnds) this.#scheduleEnd()
  }

  #scheduleEnd (): void {
    this.#turnEnds = true
    setImmediate(this.#endTurn)
  }

  /** A waiting stream's bound now. */
  limit (): number {
    return Math.min(READ_AHEAD_MAX_BYTES, Math.max(READ_AHEAD_BYTES, Math.floor(READ_AHEAD_BUDGET_BYTES / Math.max(1, this.#waiting))))
  }

  /** A stream has events waiting. */
  enter (): void { this.#waiting++ }
  /** A stream's events went to the store (or it stopped). */
  leave (): void { this.#waiting-- }
}

/** Where readAhead hands what it read. */
export interface ReadAheadSink {
  /**
   * The events that arrived since the previous batch was handed over (at
   * least one). Reading goes on while the returned promise is pending; the
   * next batch comes once it settles. A rejection stops reading: fail() gets
   * the reason. Resolving true says that nothing reads the batch any more
   * (the store answered): its buffers may take the next events unless the
   * store retained them (the ownership rule is EventStore.append's, in
   * store/contract.ts).
   */
  batch: (events: EventBatch) => Promise<boolean>
  /** A piece of the body was read (before it is decoded): for counting. */
  read?: () => void
  /** The body ended and every batch has settled. */
  end: () => void
  /**
   * Reading stopped for good: the body's error, the decoder's (an
   * EventTooLargeError, after a batch with the events that came before it),
   * or a batch's rejection. Every batch has settled.
   */
  fail: (err: unknown) => void
}

/**
 * Reads the upstream's events, in order, and hands them to `sink` as
 * batches: each batch is everything that arrived since the previous one was
 * handed over. Reading goes on while the sink works on a batch, up to
 * `limit`: the stream's share of a gateway's budget, or a fixed number of
 * bytes. Exactly one of end() and fail() is called, last.
 *
 * Driven by the body's events rather than an async loop: an idle stream
 * (most of them, most of the time) holds one small object and its
 * listeners, not suspended async functions with their promises and frames.
 */
export function readAhead (body: Readable, decoder: SseDecoder, sink: ReadAheadSink, limit: ReadAheadBudget | number): void {
  // eslint-disable-next-line no-new -- the body's listeners hold it
  new ReadAhead(body, decoder, sink, limit)
}

class ReadAhead implements TurnWaiter {
  readonly #body: Readable
  readonly #decoder: SseDecoder
  readonly #sink: ReadAheadSink
  readonly #limit: ReadAheadBudget | number
  /** Made on the first read: a stream that never sends holds none. */
  #queued: EventBatchBuilder | undefined
  #queuedBytes = 0
  /** This stream is counted among the budget's waiting streams. */
  #counted = false
  /** A batch is at the sink. */
  #busy = false
  /** A turn of #next() is due (scheduled from a listener, not run inside the body's emit). */
  #due = false
  /** Paused until a later turn of the event loop (see TURN_BYTES). */
  #waitingTurn = false
  /** Bytes this stream's turn granted it, still to read. */
  #granted = 0
  /** The body finished (ended or failed). */
  #done = false
  #failed = false
  #failure: unknown
  /** end() or fail() was called. */
  #over = false
  readonly #onData = (chunk: Buffer): void => { this.#read(chunk) }
  // The end of the body, told apart by hand rather than with stream.finished(),
  // which makes eight closures per call: an idle stream keeps them all its life.
  readonly #onEnd = (): void => { this.#finished(undefined) }
  readonly #onError = (err: Error): void => { this.#finished(err) }
  readonly #onClose = (): void => {
    const body = this.#body
    this.#finished(body.readableEnded ? undefined : (body.errored ?? prematureClose()))
  }

  readonly #turn = (): void => {
    this.#due = false
    this.#next()
  }

  constructor (body: Readable, decoder: SseDecoder, sink: ReadAheadSink, limit: ReadAheadBudget | number) {
    this.#body = body
    this.#decoder = decoder
    this.#sink = sink
    this.#limit = limit
    body.on('end', this.#onEnd)
    body.on('error', this.#onError)
    body.on('close', this.#onClose)
    // Over before it was handed here (the request was aborted): no event will say so.
    if (body.destroyed || body.readableEnded) queueMicrotask(this.#onClose)
    else body.on('data', this.#onData)
  }

  #finished (err: Error | undefined): void {
    if (this.#done) return
    this.#done = true
    if (err !== undefined && !this.#failed) this.#fail(err)
    this.#wake()
  }

  #read (chunk: Buffer): void {
    if (this.#failed || this.#over) return
    this.#sink.read?.()
    const queued = this.#queued ??= new EventBatchBuilder()
    try {
      this.#decoder.pushInto(chunk, queued)
    } catch (err) {
      this.#fail(err)
      this.#body.pause()
    }
    this.#queuedBytes += chunk.length
    const limit = this.#limit
    if (queued.length > 0 && !this.#counted && typeof limit !== 'number') {
      this.#counted = true
      limit.enter()
    }
    // Only decoded events wait here; an event still arriving is the decoder's (MAX_EVENT_BYTES).
    if (this.#overLimit()) this.#body.pause()
    if (typeof limit !== 'number' && !this.#waitingTurn && !this.#failed) {
      // What its turn granted first, then this turn's common share; once both are spent, wait.
      if (this.#granted > 0) this.#granted -= chunk.length
      else if (!limit.spend(chunk.length)) {
        this.#waitingTurn = true
        this.#body.pause()
        limit.waitTurn(this)
      }
    }
    this.#wake()
  }

  #overLimit (): boolean {
    const queued = this.#queued
    const limit = this.#limit
    return queued !== undefined && queued.length > 0 && this.#queuedBytes >= (typeof limit === 'number' ? limit : limit.limit())
  }

  /** TurnWaiter: read on, unless the store still has to take what waits. */
  resumeTurn (): number {
    this.#waitingTurn = false
    if (this.#over || this.#failed) return 0
    const body = this.#body
    if (!this.#overLimit() && body.isPaused()) body.resume()
    this.#granted = body.readableLength + SOCKET_READ_BYTES
    return this.#granted
  }

  #fail (err: unknown): void {
    this.#failed = true
    this.#failure = err
  }

  #wake (): void {
    if (this.#busy || this.#due || this.#over) return
    this.#due = true
    queueMicrotask(this.#turn)
  }

  /** Hand over what waits, or finish once nothing will come. */
  #next (): void {
    if (this.#busy || this.#over) return
    const queued = this.#queued
    if (queued !== undefined && queued.length > 0) {
      const batch = queued.take()
      this.#queuedBytes = 0
      this.#uncount()
      if (!this.#failed && !this.#waitingTurn && this.#body.isPaused()) this.#body.resume()
      this.#busy = true
      this.#sink.batch(batch).then(done => {
        this.#busy = false
        if (done) queued.recycle(batch)
        this.#next()
      }, (err: unknown) => {
        this.#busy = false
        this.#stop()
        this.#sink.fail(err)
      })
      return
    }
    if (this.#failed) {
      this.#stop()
      this.#sink.fail(this.#failure)
    } else if (this.#done) {
      this.#stop()
      this.#sink.end()
    }
  }

  #uncount (): void {
    if (this.#counted && typeof this.#limit !== 'number') this.#limit.leave()
    this.#counted = false
  }

  #stop (): void {
    this.#over = true
    this.#uncount()
    const body = this.#body
    body.off('data', this.#onData)
    body.off('end', this.#onEnd)
    body.off('error', this.#onError)
    body.off('close', this.#onClose)
    if (!this.#done) {
      // The sink stopped early (the store refused, the lease was lost): nothing
      // reads this body any more. Release it, and keep its late errors (undici
      // reports a destroyed body as aborted) from being uncaught, which would
      // bring the process down.
      discardBody(body)
    }
  }
}

/** What stream.finished() reports for a body closed before its end (a connection cut). */
function prematureClose (): Error {
  return Object.assign(new Error('Premature close'), { code: 'ERR_STREAM_PREMATURE_CLOSE' })
}
