import type {} from '@fastify/sse'
import type { FastifyReply } from 'fastify'
import type { ServerResponse } from 'node:http'
import type { FastifyBaseLogger as Logger } from 'fastify'
import type { EventInput, StoredEvent } from '../store/contract.js'
import { randomBytes } from 'node:crypto'
import { encodeEventId, encodePrimingId, randomToken, writeBase36 } from '../protocol/event-id.js'
import { NumberedBatch } from '../store/batch/numbered-batch.js'
import type { CloseOutcome, GatewayMetrics, StreamKind } from '../metrics/metrics.js'
import { formatComment, formatEvent, formatEventWithoutId, formatGap, formatPriming, formatRetry, frameWithoutId, startsWithBom } from './frame.js'
import type { GapNotice } from '../gaps.js'
import { framePage } from './page-frames.js'
import type { ClientBuffer, ClientBuffers, StalledListener } from './client-buffers.js'
import { TICKS_PER_INTERVAL, type KeepAliveTarget, type KeepAliveTicker } from './keep-alive.js'

/**
 * How long a client closed for being slow has to read what its buffer holds
 * (at most CLIENT_BUFFER_MAX_BYTES and one write) before its socket is dropped.
 */
export const SLOW_CLIENT_GRACE_MS = 10_000

const KEEP_ALIVE = formatComment('keep-alive')

/**
 * Where a client stream stands; only its own methods move it. `created`: made
 * and attached to its session, its head not sent (open() sends it, in the same
 * turn); `closing`: the gateway closed it before its head was sent, which
 * open() sends all the same, then the retry hint and the end (a write before
 * the head would have committed a head that is not SSE); `open`: the head is
 * sent, events are written; `closed`: over, its listeners told how (a
 * listener registered later is told at once).
 */
type Phase =
  | { readonly kind: 'created' }
  | { readonly kind: 'closing', readonly outcome: CloseOutcome, readonly retryMs: number | undefined }
  | { readonly kind: 'open' }
  | { readonly kind: 'closed', readonly outcome: CloseOutcome }

const CREATED: Phase = Object.freeze({ kind: 'created' })
const OPEN: Phase = Object.freeze({ kind: 'open' })

export interface ClientStreamOptions {
  readonly reply: FastifyReply
  readonly kind: StreamKind
  readonly epoch: string
  readonly streamId: string
  readonly priming: boolean
  readonly retryMs: number
  readonly maxBufferBytes: number
  /** The process's client buffers: their budget, and the write timeout. */
  readonly buffers: ClientBuffers
  /** The client's address (clientKey of the request's ip): its share of the budget. */
  readonly address: string
  readonly metrics: GatewayMetrics
  readonly log: Logger
  /** Keeps the stream alive once its head is sent (none: no keep-alive comments). */
  readonly keepAlive?: KeepAliveTicker
}

/**
 * One client SSE connection. The response head and the connection lifecycle
 * are @fastify/sse's; events are written here as pre-framed text, one write
 * per batch (the plugin writes one per message), and keep-alive comments when
 * the ticker finds the stream silent.
 * Writes never wait for the client: the store holds everything, so a client
 * whose buffer passes the bound, or whose write would pass the process's
 * budget, is closed with a retry hint and resumes. One that accepts nothing
 * for the write timeout is cut (client-buffers.ts), open or already ended.
 */
export class ClientStream implements KeepAliveTarget, StalledListener {
  readonly kind: StreamKind
  readonly streamId: string
  readonly epoch: string
  readonly #reply: FastifyReply
  readonly #raw: ServerResponse
  readonly #priming: boolean
  readonly #retryMs: number
  readonly #maxBufferBytes: number
  readonly #metrics: GatewayMetrics
  readonly #log: Logger
  readonly #keepAlive: KeepAliveTicker | undefined
  readonly #buffers: ClientBuffers
  readonly #address: string
  /** Made at the first write that leaves bytes waiting: most streams never need one. */
  #buffer: ClientBuffer | undefined
  /** The keep-alive ticker's tick at the last write. */
  #wroteAt = 0
  /**
   * Exactly as long as it needs to be: push() would give each idle stream room
   * for 17, and an array literal with a spread room for 20; concat() makes one
   * of the exact length.
   */
  #onClose: ReadonlyArray<(outcome: CloseOutcome) => void> = []
  #phase: Phase = CREATED
  #lastSeq = 0
  #replayed = 0
  /** lastSeq when events were first written here without ids (degraded mode) since the last recorded one. */
  #unrecordedAfter: number | undefined
  /** `id: <epoch>.<stream>.`: an event's id line is this, its sequence number in base 36, a line break. */
  readonly #idPrefix: Buffer

  constructor (options: ClientStreamOptions) {
    this.kind = options.kind
    this.streamId = options.streamId
    this.epoch = options.epoch
    this.#idPrefix = Buffer.from(`id: ${encodeEventId({ epoch: options.epoch, streamId: options.streamId, seq: 0 }).slice(0, -1)}`, 'latin1')
    this.#reply = options.reply
    this.#raw = options.reply.raw
    this.#priming = options.priming
    this.#retryMs = options.retryMs
    this.#maxBufferBytes = options.maxBufferBytes
    this.#metrics = options.metrics
    this.#log = options.log
    this.#keepAlive = options.keepAlive
    this.#buffers = options.buffers
    this.#address = options.address
    options.metrics.streamsOpened.inc({ kind: this.kind })
    options.metrics.clientStreamsOpen.inc({ kind: this.kind })
    const sse = options.reply.sse
    sse.keepAlive()
    sse.onClose(() => this.#finish('client_gone'))
    // Gone while the handler was awaiting (its close event came before this listener): over now.
    if (this.#raw.destroyed || !sse.isConnected) this.#finish('client_gone')
  }

  /** Nothing more is written: closed, or closed before its head was sent. */
  get closed (): boolean { return this.#phase.kind === 'closing' || this.#phase.kind === 'closed' }
  get #writable (): boolean { return this.#phase.kind === 'open' }
  /** Sequence number of the last event written to this connection. */
  get lastSeq (): number { return this.#lastSeq }
  /** Events written to this connection from history (replayed). */
  get replayed (): number { return this.#replayed }

  /**
   * Commit the response head (status 200, SSE headers plus `headers`) and the
   * priming event; once only. Closed meanwhile by the gateway: then the retry
   * hint and the end. The client gone already: nothing.
   */
  open (headers: Record<string, string | string[]>, position: number, gap?: GapNotice): void {
    const phase = this.#phase
    if (phase.kind === 'closed') return
    if (phase.kind === 'open') throw new Error('a client stream is opened once')
    this.#phase = OPEN
    for (const [name, value] of Object.entries(headers)) this.#reply.header(name, value)
    this.#reply.sse.sendHeaders(200)
    this.#lastSeq = position
    let head = ''
    if (gap !== undefined) head += formatGap(gap)
    // 2025-11-25 clients get a priming event; older ones must never see empty data.
    if (this.#priming) head += formatPriming(encodePrimingId({ epoch: this.epoch, streamId: this.streamId, seq: position }, randomToken(6, randomBytes)), this.#retryMs)
    if (head !== '') this.#write(head)
    // Nothing to write yet: send the head now, not with the first event or keep-alive.
    else this.#raw.flushHeaders()
    if (phase.kind === 'closing') this.#close(phase.outcome, phase.retryMs)
    if (this.#keepAlive !== undefined && this.#writable) {
      this.#wroteAt = this.#keepAlive.now
      this.#keepAlive.add(this)
    }
  }

  /** The keep-alive ticker's turn: a comment line if nothing was written for an interval. */
  keepAliveTick (now: number): void {
    // (A finished stream has left the ticker; one whose socket is gone has not yet heard.)
    if (now - this.#wroteAt < TICKS_PER_INTERVAL || this.#raw.destroyed) return
    // Bytes still waiting for the client: the connection is not idle, and they come first.
    if (this.#raw.writableLength === 0) this.#write(KEEP_ALIVE, false)
  }

  /** Write events (contiguous, in order); those at or before lastSeq are skipped. Returns false once closed. */
  writeEvents (events: readonly StoredEvent[] | NumberedBatch, replayed = false): boolean {
    if (!this.#writable) return false
    if (events instanceof NumberedBatch) return this.writeBatches([events], replayed)
    // One buffer per batch: each upstream frame as it came, then our id line
    // (the last id field of an event is the one the client keeps).
    const prefix = this.#idPrefix
    let size = 0
    let count = 0
    let last = this.#lastSeq
    for (const e of events) {
      if (e.seq <= last) continue
      size += e.frame !== undefined
        ? e.frame.length + prefix.length + 15
        : Buffer.byteLength(formatEvent(encodeEventId({ epoch: this.epoch, streamId: this.streamId, seq: e.seq }), e.data, e.event))
      last = e.seq
      count++
    }
    if (count === 0) return true
    const out = Buffer.allocUnsafe(size)
    let at = 0
    for (const e of events) {
      if (e.seq <= this.#lastSeq) continue
      if (e.frame !== undefined) {
        if (startsWithBom(e.frame, 0)) {
          out[at++] = 0x3a
          out[at++] = 0x0a
        }
        out.set(e.frame, at)
        at += e.frame.length
        out.set(prefix, at)
        at = writeBase36(out, at + prefix.length, e.seq)
        out[at++] = 0x0a
        out[at++] = 0x0a
      } else {
        at += out.write(formatEvent(encodeEventId({ epoch: this.epoch, streamId: this.streamId, seq: e.seq }), e.data, e.event), at)
      }
    }
    return this.#written(out.subarray(0, at), last, count, replayed)
  }

  /**
   * Batches as the store keeps them (contiguous, in order; events at or
   * before lastSeq are skipped), written as one buffer without an object per
   * event (see framePage).
   */
  writeBatches (batches: readonly NumberedBatch[], replayed = false): boolean {
    if (!this.#writable) return false
    const pages = this.#buffers.pages
    const page = framePage(batches, this.#lastSeq, this.#idPrefix, seq => encodeEventId({ epoch: this.epoch, streamId: this.streamId, seq }), pages.take)
    if (page === undefined) return true
    // A lent page goes back once the socket is done with it (page-buffers.ts), or at once if it was not written.
    const { bytes } = page
    const done = pages.pooled(bytes) ? () => { pages.give(bytes) } : undefined
    if (this.#written(bytes, page.lastSeq, page.count, replayed, done)) return true
    done?.()
    return false
  }

  #written (out: Buffer, last: number, count: number, replayed: boolean, done?: () => void): boolean {
    if (!this.#write(out, true, done)) return false
    this.#lastSeq = last
    this.#unrecordedAfter = undefined
    this.#metrics.eventsDelivered.inc(count)
    if (replayed) {
      this.#replayed += count
      this.#metrics.eventsReplayed.inc(count)
    }
    return true
  }

  /** Events the store could not take (degraded mode): written without an id, they cannot be resumed. */
  writeUnrecorded (events: readonly EventInput[]): void {
    if (!this.#writable || events.length === 0) return
    this.#unrecordedAfter ??= this.#lastSeq
    const parts: Buffer[] = []
    for (const e of events) {
      parts.push(e.frame !== undefined ? frameWithoutId(e.frame) : Buffer.from(formatEventWithoutId(e.data, e.event)))
    }
    this.#metrics.eventsDelivered.inc(events.length)
    this.#write(Buffer.concat(parts))
  }

  /**
   * Events (afterSeq, throughSeq], passed on unrecorded, are in the store
   * after all. When this connection got every event passed on unrecorded
   * since afterSeq, it has them: they are not written again. (Its client
   * still holds the id of afterSeq until the next event: a resume from
   * there replays them, as it would any event after its id.)
   */
  storedAfterAll (afterSeq: number, throughSeq: number): void {
    if (this.#unrecordedAfter === afterSeq && this.#lastSeq === afterSeq) this.#lastSeq = throughSeq
  }

  /** An event the gateway made up (a repair answer), under an id of its choosing. */
  writeSynthesized (id: string, data: string): void {
    if (this.#writable) this.#write(formatEvent(id, data))
  }

  writeGap (notice: GapNotice): void {
    if (this.#writable) this.#write(formatGap(notice))
  }

  /** Resolves when the connection's buffer has room again (or it closed). */
  async drained (): Promise<void> {
    if (this.closed || !this.#raw.writableNeedDrain) return
    await new Promise<void>(resolve => {
      const done = (): void => {
        this.#raw.off('drain', done)
        this.#raw.off('close', done)
        resolve()
      }
      this.#raw.on('drain', done)
      this.#raw.on('close', done)
    })
  }

  /** `listener` runs once the stream is closed; at once when it is closed already. */
  onClose (listener: (outcome: CloseOutcome) => void): void {
    const phase = this.#phase
    if (phase.kind === 'closed') {
      listener(phase.outcome)
      return
    }
    this.#onClose = this.#onClose.concat(listener)
  }

  /** Close from the gateway's side, the stream being over: no retry hint. */
  end (outcome: CloseOutcome): void {
    this.#close(outcome, undefined)
  }

  /** Close from the gateway's side, telling the client to come back after `retryMs` (by default SSE_RETRY_MS). */
  close (outcome: CloseOutcome, retryMs: number = this.#retryMs): void {
    this.#close(outcome, retryMs)
  }

  #close (outcome: CloseOutcome, retryMs: number | undefined): void {
    const phase = this.#phase
    if (phase.kind === 'created') {
      this.#phase = { kind: 'closing', outcome, retryMs }
      return
    }
    if (phase.kind !== 'open') return
    const raw = this.#raw
    const before = raw.writableLength
    if (retryMs !== undefined && !raw.destroyed) raw.write(formatRetry(retryMs))
    this.#finish(outcome)
    this.#reply.sse.close()
    // What still waits is watched until it is read or cut.
    this.#account(before)
  }

  /**
   * The bound applies to what earlier writes left unsent: one large write (a
   * replay page, a big event) to a client that reads promptly is fine.
   * `done` is called once the socket is done with `text`, if it was written
   * (true returned).
   */
  #write (text: string | Buffer, budgeted = true, done?: () => void): boolean {
    if (this.#raw.writableLength > this.#maxBufferBytes) {
      this.#metrics.slowClientDisconnects.inc()
      this.#log.warn({ streamId: this.streamId, buffered: this.#raw.writableLength }, 'client too slow: ending its stream after what it was sent, with a retry hint; it resumes from the store')
      // Nothing more is queued: the client reads what waits, then the hint and the
      // end. One that does not read that much within the grace is cut off.
      const raw = this.#raw
      const cutOff = setTimeout(() => raw.destroy(), SLOW_CLIENT_GRACE_MS)
      cutOff.unref()
      raw.once('close', () => clearTimeout(cutOff))
      this.close('slow_client')
      return false
    }
    // (A keep-alive comment is written only when nothing waits: not budgeted.)
    if (budgeted && !this.#buffers.room(text.length, this.#address, this.#buffer)) {
      const buffers = this.#buffers
      this.#log.warn({ streamId: this.streamId, bytes: text.length, waitingBytes: buffers.waitingBytes, maxBytes: buffers.maxBytes, addressWaitingBytes: buffers.waitingFor(this.#address), maxBytesPerAddress: buffers.maxBytesPerAddress },
        'client buffers full (CLIENT_BUFFERS_MAX_BYTES, or this client address\'s share of it): closing this stream with a retry hint; it resumes from the store')
      this.close('buffers_full')
      return false
    }
    const before = this.#raw.writableLength
    if (done === undefined) this.#raw.write(text)
    else this.#raw.write(text, done)
    this.#account(before)
    if (this.#keepAlive !== undefined) this.#wroteAt = this.#keepAlive.now
    return true
  }

  /** After writing: what the writes left waiting goes to the process's account. */
  #account (before: number): void {
    const after = this.#raw.writableLength
    if (this.#buffer === undefined && after === 0) return
    this.#buffer ??= this.#buffers.connection(this.#raw, this, this.#address)
    this.#buffer.wrote(after - before)
  }

  /** Cut by the write timeout (the socket is destroyed already): counted, logged once. */
  writeTimedOut (waitingBytes: number): void {
    this.#metrics.clientWriteTimeouts.inc()
    this.#log.warn({ streamId: this.streamId, kind: this.kind, waitingBytes, ended: this.closed, timeoutSeconds: this.#buffers.writeTimeoutMs / 1000 }, 'client accepted no bytes within CLIENT_WRITE_TIMEOUT_SECONDS: connection destroyed, what waited for it dropped; it resumes from the store')
    this.#finish('write_timeout')
  }

  #finish (outcome: CloseOutcome): void {
    if (this.#phase.kind === 'closed') return
    this.#phase = { kind: 'closed', outcome }
    this.#keepAlive?.delete(this)
    this.#metrics.clientStreamsOpen.dec({ kind: this.kind })
    this.#metrics.streamsClosed.inc({ kind: this.kind, outcome })
    const listeners = this.#onClose
    this.#onClose = []
    for (const listener of listeners) listener(outcome)
  }
}
