import type { Readable } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger as Logger } from 'fastify'
import { EventTooLargeError, LeaseLostError, SessionGoneError } from '../errors.js'
import type { AppendOptions, EventInput, EventStore, StreamState } from '../store/contract.js'
import { EventBatch } from '../store/batch/event-batch.js'
import type { NumberedBatch } from '../store/batch/numbered-batch.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import { SseDecoder } from '../sse/decoder.js'
import { GAP_EVENT, parseFrame } from '../sse/frame.js'
import { readAhead, type ReadAheadBudget, type ReadAheadSink } from './read-ahead.js'
import { discardBody } from '../upstream/client.js'
import { isResumableUpstreamId, upstreamRetryDelay, UPSTREAM_RESUMES_WITHOUT_PROGRESS } from '../protocol/upstream-event-id.js'

/** Keeps the upstream's last event id (the stream's lease does), to resume the upstream GET from it. */
export interface UpstreamIdListener {
  noteUpstreamId: (id: string) => void
}

/** The clients attached to a stream in this process, as the recorder sees them in degraded mode. */
export interface LiveClients {
  /**
   * Events the store refused, handed over so that a client attached to this
   * process still gets them live (without an id: they cannot be replayed).
   * Once the store answers again a gap marker is recorded first, so clients
   * resuming across the outage are told.
   */
  writeUnrecorded: (events: readonly EventInput[]) => void
  /**
   * Once the store answers again: events (afterSeq, throughSeq] were passed
   * on unrecorded, but the store holds them after all (it applied an append
   * whose reply was lost). A client here that got them without ids must not
   * get them again from the store.
   */
  storedAfterAll: (afterSeq: number, throughSeq: number) => void
}

export interface RecordOptions {
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly sessionId: string
  readonly streamId: string
  readonly body: Readable
  readonly maxEventBytes: number
  /** The gateway's read-ahead budget, shared by the streams it records. */
  readonly readAhead: ReadAheadBudget
  /** Request streams end with their upstream answer; the standalone stream outlives one upstream GET. */
  readonly endStreamOnFinish: boolean
  /** Told each upstream event id, so an upstream GET can be resumed upstream (the stream's lease). */
  readonly upstreamIds?: UpstreamIdListener
  /** The clients attached to this stream in this process (objects, not closures: an idle stream keeps them). */
  readonly live?: LiveClients
  /**
   * Sequence number of the stream's last stored event when recording starts,
   * when the caller knows it (or will: a read asked before any append).
   */
  readonly storedThrough?: number | Promise<number | undefined>
  /**
   * Request streams: the JSON-RPC error to record as the stream's last event
   * when the upstream answer breaks off before its response, so live and
   * resuming clients alike get an answer instead of waiting for a timeout.
   */
  readonly failureResponse?: (reason: RecordOutcome) => string | undefined
  /** The JSON-RPC id the request stream answers: an answer that ends without its response is repaired. */
  readonly requestId?: string | number | undefined
  /** The stream's lease token (the standalone stream): appends are fenced with it, see AppendOptions. */
  readonly fence?: string
  /**
   * Resume the upstream's answer after it ended early, having given event ids
   * (SEP-1699 polling, a restart): a GET with the upstream's Last-Event-ID.
   * Resolves with the new SSE body, or undefined when the upstream refuses.
   */
  readonly resumeUpstream?: (lastEventId: string | undefined) => Promise<Readable | undefined>
  /**
   * Request streams: the store lost the session (Redis restarted empty) while
   * the upstream is still answering. Records the session again under a new
   * epoch and opens this stream in it; resolves with the stream's new state,
   * or undefined when the session is not to be recorded again (deleted,
   * expired, RECOVER_LOST_SESSIONS off).
   */
  readonly recoverSession?: () => Promise<StreamState | undefined>
}

/** Cheap pre-check on the bytes, then a parse: is this event the JSON-RPC response to `id`? */
function isResponseTo (e: EventInput, id: string | number): boolean {
  const raw = e.frame ?? e.data
  if (!raw.includes('"id"') || (!raw.includes('"result"') && !raw.includes('"error"'))) return false
  const data = e.frame === undefined ? e.data : parseFrame(e.frame)?.data
  if (data === undefined) return false
  try {
    const message = JSON.parse(data) as { id?: unknown, result?: unknown, error?: unknown }
    return message.id === id && (message.result !== undefined || message.error !== undefined)
  } catch {
    return false
  }
}

/** Does the batch hold the JSON-RPC response to `id`? Most hold none, which one look at their bytes tells. */
function respondsTo (batch: EventBatch, id: string | number): boolean {
  if (!batch.includes('"id"') || (!batch.includes('"result"') && !batch.includes('"error"'))) return false
  return batch.toArray().some(e => isResponseTo(e, id))
}

/** Waits between attempts to record a stream's end after the store refused it. */
const END_RETRY_DELAYS_MS = [250, 1000, 2000, 4000, 8000]

/**
 * Confirm before degrading: an append that failed at the client may still have
 * been applied (Redis restarted or failed over after running the script, or its
 * reply was lost). Resending the identical batch is safe: the store recognises a
 * batch it already applied (src/store/redis/commands/append-5.lua). So a failed
 * append is resent for this long, reading nothing more from the upstream
 * meanwhile, before its events are passed on unrecorded: through a short outage
 * they arrive late, never twice. Past the window, what the store applied all
 * the same is found once it answers again (reconcile, below).
 */
const APPEND_CONFIRM_WINDOW_MS = 2000
/** First wait between resends of a failed append; it doubles up to APPEND_CONFIRM_MAX_DELAY_MS. */
const APPEND_CONFIRM_FIRST_DELAY_MS = 100
const APPEND_CONFIRM_MAX_DELAY_MS = 800

/**
 * The waits of the confirm window, for retrying a store operation that
 * failed (an append, opening a request stream): yields the retry's number
 * (from 1) after each wait, until APPEND_CONFIRM_WINDOW_MS from the first
 * call has passed.
 */
export async function * confirmWindow (): AsyncGenerator<number, void, undefined> {
  const deadline = performance.now() + APPEND_CONFIRM_WINDOW_MS
  let retry = 0
  for (let delayMs = APPEND_CONFIRM_FIRST_DELAY_MS; performance.now() < deadline; delayMs = Math.min(delayMs * 2, APPEND_CONFIRM_MAX_DELAY_MS)) {
    await sleep(Math.max(0, Math.min(delayMs, deadline - performance.now())))
    yield ++retry
  }
}

export type RecordOutcome = 'completed' | 'upstream_error' | 'session_gone' | 'aborted' | 'event_too_large' | 'lease_lost'

/**
 * Reads an upstream SSE answer to its end and appends every event to the
 * store: one append (one Redis round trip) per batch, however many events
 * it carries: a batch is every upstream read that arrived while the previous
 * append was at the store (see readAhead). Clients never get events from
 * here: they follow the store, so every event is stored before any client
 * sees it. A client going away does not stop this (in the legacy era
 * disconnect is not cancellation).
 */
export function recordUpstreamStream (o: RecordOptions): Promise<RecordOutcome> {
  return new Recording(o).run()
}

function ignore (): void {}

/**
 * One recorded upstream answer. A class rather than closures over the
 * function's variables: an idle stream holds one of these for its whole life,
 * and methods cost it nothing per stream.
 */
class Recording implements ReadAheadSink {
  readonly #o: RecordOptions
  #decoder: SseDecoder
  /** The upstream answer being read: the first, or the latest resume of it. */
  #body: Readable
  /** The upstream's last event id and retry hint across its resumed answers. */
  #upstreamId: string | undefined
  #upstreamRetry: number | undefined
  #resumesWithoutProgress = 0
  /** Events were recorded since the upstream answer was last (re)opened. */
  #recordedSinceOpen = false
  /** Events passed on unrecorded since the last append the store took. */
  #unrecorded = 0
  /** Sequence number of the last event known to be in the store (from the last append it took). */
  #storedThrough: number | undefined
  /** The request's response (or the gateway's error answer) is safely in the store. */
  #answered: boolean
  /** The stream's end could not be recorded yet. */
  #endPending = false
  /** The session was recorded again under a new epoch: a gap marker goes first in it. */
  #epochGapPending = false
  #settle: (outcome: RecordOutcome) => void = ignore
  #abandon: (err: unknown) => void = ignore

  constructor (o: RecordOptions) {
    this.#o = o
    this.#decoder = new SseDecoder(o.maxEventBytes)
    this.#body = o.body
    this.#storedThrough = typeof o.storedThrough === 'number' ? o.storedThrough : undefined
    this.#answered = o.requestId === undefined
  }

  /**
   * Records until the upstream answer is over. While it waits for the
   * upstream, nothing of this is suspended: readAhead calls back.
   */
  run (): Promise<RecordOutcome> {
    return new Promise<RecordOutcome>((resolve, reject) => {
      this.#settle = resolve
      this.#abandon = reject
      readAhead(this.#body, this.#decoder, this, this.#o.readAhead)
    })
  }

  /** ReadAheadSink: a piece of the upstream's answer came in. */
  read (): void {
    this.#o.metrics.upstreamReads.inc()
  }

  /** ReadAheadSink: one append per batch, the reads that arrived while the previous append was at the store. */
  batch (events: EventBatch): Promise<boolean> {
    return this.#append(events, false)
  }

  /** ReadAheadSink: the upstream answer ended. */
  end (): void {
    this.#resumeOrConclude().then(this.#settle, this.#abandon)
  }

  /**
   * The upstream ended its answer. A request stream without its response yet,
   * or the standalone stream, whose upstream gave event ids, is resumed
   * upstream (after the upstream's retry hint) until the response comes or
   * the upstream refuses; only then is the answer concluded (gap repair).
   */
  async #resumeOrConclude (): Promise<RecordOutcome> {
    const o = this.#o
    const lastId = this.#decoder.lastId ?? this.#upstreamId
    const progress = lastId !== this.#upstreamId || this.#recordedSinceOpen
    this.#recordedSinceOpen = false
    this.#upstreamRetry = this.#decoder.retry ?? this.#upstreamRetry
    this.#upstreamId = lastId
    // The standalone stream is held for as long as the session lives: reopened even
    // without ids (the upstream drops what it sends while no GET is open).
    const wanted = o.resumeUpstream !== undefined && (o.requestId === undefined || (!this.#answered && lastId !== undefined))
    if (!wanted) return await this.#conclude(false, undefined)
    if (lastId !== undefined && !isResumableUpstreamId(lastId)) {
      o.metrics.upstreamErrors.inc({ kind: 'unresumable_id' })
      o.log.warn({ streamId: o.streamId }, 'upstream event id cannot go back in a Last-Event-ID header (control or non-ASCII characters): its stream is not resumable upstream')
      return await this.#conclude(false, undefined)
    }
    this.#resumesWithoutProgress = progress ? 0 : this.#resumesWithoutProgress + 1
    if (this.#resumesWithoutProgress >= UPSTREAM_RESUMES_WITHOUT_PROGRESS) {
      o.log.warn({ streamId: o.streamId, resumes: this.#resumesWithoutProgress }, 'upstream resumed its stream without anything new, again: stopped resuming it')
      return await this.#conclude(false, undefined)
    }
    if (progress && lastId !== undefined) o.upstreamIds?.noteUpstreamId(lastId)
    await sleep(upstreamRetryDelay(this.#upstreamRetry))
    let body: Readable | undefined
    try {
      body = await (o.resumeUpstream as (id: string | undefined) => Promise<Readable | undefined>)(lastId)
    } catch (err) {
      return await this.#conclude(true, err)
    }
    if (body === undefined) {
      o.log.info({ streamId: o.streamId }, 'upstream refused to resume its stream: concluding it')
      return await this.#conclude(false, undefined)
    }
    o.log.debug({ streamId: o.streamId }, 'upstream ended its stream early: resumed it with its Last-Event-ID')
    this.#body = body
    this.#decoder = new SseDecoder(o.maxEventBytes)
    return await new Promise<RecordOutcome>((resolve, reject) => {
      this.#settle = resolve
      this.#abandon = reject
      readAhead(body, this.#decoder, this, this.#o.readAhead)
    })
  }

  /** ReadAheadSink: reading stopped (the upstream broke off, an event too large, the store refused for good). */
  fail (err: unknown): void {
    this.#conclude(true, err).then(this.#settle, this.#abandon)
  }

  async #conclude (failed: boolean, failure: unknown): Promise<RecordOutcome> {
    const o = this.#o
    let outcome: RecordOutcome = 'completed'
    let tooLargeMarker: EventInput | undefined
    try {
      if (failed) throw failure
      await this.#append(this.#decoder.end(), o.endStreamOnFinish, 'upstream_error')
    } catch (err) {
      if (err instanceof SessionGoneError) {
        outcome = 'session_gone'
        o.log.info({ streamId: o.streamId }, 'session records gone: stopped recording its stream')
      } else if (err instanceof LeaseLostError) {
        // Fencing: another replica holds this stream now; stop at once.
        outcome = 'lease_lost'
        o.log.warn({ streamId: o.streamId }, 'stream lease lost to another replica: stopped recording')
      } else if (err instanceof EventTooLargeError) {
        outcome = 'event_too_large'
        // What came complete before the oversized event is recorded all the same, then a
        // gap marker says that the rest of this answer was cut off.
        await this.#append(err.completed, false).catch(() => {})
        tooLargeMarker = { event: GAP_EVENT, data: JSON.stringify({ reason: 'event_too_large', limit: o.maxEventBytes }) }
        o.metrics.eventsUnrecorded.inc({ reason: 'too_large' })
        o.metrics.gaps.inc({ reason: 'event_too_large' })
        o.log.error({ streamId: o.streamId, err }, 'upstream event too large: stream closed')
      } else if ((err as Error).name === 'AbortError' || (err as NodeJS.ErrnoException).code === 'UND_ERR_ABORTED') {
        outcome = 'aborted'
      } else {
        outcome = 'upstream_error'
        o.metrics.upstreamErrors.inc({ kind: 'stream_broken' })
        o.log.warn({ err, streamId: o.streamId }, 'upstream SSE answer broke off')
      }
      discardBody(this.#body)
      const closing: EventInput[] = tooLargeMarker === undefined ? [] : [tooLargeMarker]
      if (o.endStreamOnFinish && outcome !== 'session_gone' && outcome !== 'lease_lost') {
        // Nothing more can arrive: mark the end so resuming clients are not left waiting,
        // with an error answer for the request unless its response is already stored.
        if (outcome === 'aborted') this.#answered = true
        this.#endPending = !(await this.#append(closing, true, outcome).catch(() => false))
      } else if (closing.length > 0) {
        await this.#append(closing, false).catch(() => false)
      }
    }
    if (this.#endPending) await this.#settleEnd(outcome === 'completed' ? 'upstream_error' : outcome)
    return outcome
  }

  #marker (): EventInput {
    return { event: GAP_EVENT, data: JSON.stringify({ reason: 'store_unavailable', unrecorded: this.#unrecorded }) }
  }

  /** What a client replaying the new epoch reads first: what came before is gone with the old one. */
  #epochMarker (): EventInput {
    return { event: GAP_EVENT, data: JSON.stringify({ reason: 'epoch', streamId: this.#o.streamId }) }
  }

  #errorAnswer (reason: RecordOutcome): EventInput | undefined {
    const data = this.#answered ? undefined : this.#o.failureResponse?.(reason)
    return data === undefined ? undefined : { data }
  }

  /**
   * Resend a failed append, identical, until it goes through or
   * APPEND_CONFIRM_WINDOW_MS has passed: what the store took, else the last error.
   */
  async #resend (batch: EventBatch, options: AppendOptions, first: unknown): Promise<{ stored: NumberedBatch } | { err: unknown }> {
    const o = this.#o
    let err = first
    o.log.warn({ err, streamId: o.streamId, events: batch.length }, 'event store append failed: resending it (it may have been applied) before passing its events on unrecorded')
    for await (const attempts of confirmWindow()) {
      try {
        const stored = await o.metrics.timeStore('append', () => o.store.appendBatch(o.sessionId, o.streamId, batch, options))
        o.metrics.appendResends.inc({ outcome: 'recorded' })
        o.log.info({ streamId: o.streamId, events: batch.length, attempts }, 'event store append resent: recorded (applied now, or found applied already), nothing passed on unrecorded')
        return { stored }
      } catch (next) {
        if (next instanceof SessionGoneError || next instanceof LeaseLostError) throw next
        err = next
      }
    }
    o.metrics.appendResends.inc({ outcome: 'unrecorded' })
    return { err }
  }

  /**
   * The store answers again after events were passed on unrecorded: did it
   * apply some of the appends that failed (a reply lost as Redis stopped)?
   * This recorder is the stream's only writer, so whatever the store holds
   * past the last append it took came from those. They are in the store,
   * so the gap marker does not count them, and the clients here that got
   * them without ids are told, so they do not get them twice.
   */
  async #reconcile (): Promise<void> {
    const o = this.#o
    // No append went through yet: where the stream stood when recording started, if known.
    this.#storedThrough ??= await o.storedThrough
    const storedThrough = this.#storedThrough
    if (storedThrough === undefined) return
    const state = await o.metrics.timeStore('state', () => o.store.state(o.sessionId, o.streamId))
    const applied = state === null ? 0 : state.lastSeq - storedThrough
    // More than was passed on cannot be ours: another epoch (Redis came back empty and the session was recorded anew).
    if (state === null || applied <= 0 || applied > this.#unrecorded) return
    o.log.info({ streamId: o.streamId, applied, unrecorded: this.#unrecorded }, 'event store back: some events passed on unrecorded were stored after all (an append applied whose reply was lost)')
    o.live?.storedAfterAll(storedThrough, state.lastSeq)
    this.#unrecorded -= applied
    this.#storedThrough = state.lastSeq
  }

  /** Book-keeping once the store took an append: the upstream's events, and an error answer of the gateway's. */
  #recorded (stored: NumberedBatch, read: EventBatch, answer: EventInput | undefined, answers: boolean, end: boolean): true {
    const o = this.#o
    if (stored.length > 0) {
      this.#storedThrough = stored.lastSeq
      this.#recordedSinceOpen = true
    }
    if (answers) this.#answered = true
    if (end) this.#endPending = false
    this.#epochGapPending = false
    if (this.#unrecorded > 0) {
      o.metrics.gaps.inc({ reason: 'store_unavailable' })
      o.log.warn({ streamId: o.streamId, unrecorded: this.#unrecorded }, 'event store back: gap marker recorded for the events it missed')
      this.#unrecorded = 0
    }
    const count = read.length + (answer === undefined ? 0 : 1)
    if (count > 0) {
      o.metrics.eventsRecorded.inc(count)
      o.metrics.eventBytesRecorded.inc(read.dataBytes + (answer === undefined ? 0 : Buffer.byteLength(answer.data ?? '')))
      if (read.lastUpstreamId !== '') o.upstreamIds?.noteUpstreamId(read.lastUpstreamId)
    }
    return true
  }

  /**
   * Append what the upstream sent (one or more reads); false when the store
   * refused it (degraded mode). A session the store lost is recorded again
   * (recoverSession) and the append made in the new epoch, after a gap marker:
   * the upstream is still answering, and the rest of its answer, the response
   * included, stays resumable instead of being thrown away.
   */
  async #append (events: EventBatch | readonly EventInput[], end: boolean, reason: RecordOutcome = 'upstream_error'): Promise<boolean> {
    try {
      return await this.#appendOnce(events, end, reason)
    } catch (err) {
      if (!(err instanceof SessionGoneError) || !(await this.#recoverSession())) throw err
      return await this.#appendOnce(events, end, reason)
    }
  }

  async #recoverSession (): Promise<boolean> {
    const o = this.#o
    if (o.recoverSession === undefined) return false
    let state: StreamState | undefined
    try {
      state = await o.recoverSession()
    } catch (err) {
      o.log.warn({ err, streamId: o.streamId }, 'could not record the lost session again')
      return false
    }
    if (state === undefined) return false
    this.#storedThrough = state.lastSeq
    this.#epochGapPending = true
    o.log.warn({ streamId: o.streamId, epoch: state.epoch }, 'the event store lost the session during its answer: recorded again under a new epoch, recording goes on after a gap marker')
    return true
  }

  async #appendOnce (events: EventBatch | readonly EventInput[], end: boolean, reason: RecordOutcome): Promise<boolean> {
    const o = this.#o
    const read = events instanceof EventBatch ? events : EventBatch.from(events)
    if (read.length === 0 && !end && this.#unrecorded === 0) return true
    if (this.#unrecorded > 0) {
      try {
        await this.#reconcile()
      } catch (err) {
        return this.#passOn(read, end, err)
      }
      if (read.length === 0 && !end && this.#unrecorded === 0) return true
    }
    let answers = !this.#answered && respondsTo(read, o.requestId as string | number)
    let answer: EventInput | undefined
    if (end && !this.#answered && !answers) {
      // The answer is over without its response: record an error answer in its place.
      answer = this.#errorAnswer(reason)
      if (answer !== undefined) {
        answers = true
        o.log.warn({ streamId: o.streamId, reason }, 'upstream answer ended without its response: recorded an error answer')
      }
    }
    // A gap marker before the events or an error answer after them (both rare) means packing anew.
    const markers = [...(this.#epochGapPending ? [this.#epochMarker()] : []), ...(this.#unrecorded === 0 ? [] : [this.#marker()])]
    const batch = markers.length === 0 && answer === undefined
      ? read
      : EventBatch.from([...markers, ...read.toArray(), ...(answer === undefined ? [] : [answer])])
    const options = { end, ...(o.fence !== undefined && { fence: o.fence }) }
    let stored: NumberedBatch
    try {
      stored = await o.metrics.timeStore('append', () => o.store.appendBatch(o.sessionId, o.streamId, batch, options))
    } catch (first) {
      if (first instanceof SessionGoneError || first instanceof LeaseLostError) throw first
      // Only a failure that would pass events on live can duplicate them; once
      // degraded, events are passed on at once (the window was spent already).
      if (read.length === 0 || this.#unrecorded > 0) return this.#passOn(read, end, first)
      const resent = await this.#resend(batch, options, first)
      if (!('stored' in resent)) return this.#passOn(read, end, resent.err)
      stored = resent.stored
    }
    return this.#recorded(stored, read, answer, answers, end)
  }

  /**
   * The store failed: these events cannot be replayed. Reading goes on so
   * the upstream is never stalled; live clients here still get them.
   */
  #passOn (read: EventBatch, end: boolean, err: unknown): false {
    const o = this.#o
    const passed = read.length
    this.#unrecorded += passed
    if (end) this.#endPending = true
    o.metrics.eventsUnrecorded.inc({ reason: 'store_error' }, passed)
    o.log.error({ err, streamId: o.streamId, events: passed }, 'event store append failed: events passed on unrecorded')
    if (passed > 0) o.live?.writeUnrecorded(read.toArray())
    return false
  }

  /**
   * The end of a request stream must reach the store, or resuming clients wait
   * for ever: after a refused final append, retry a few times (with the gap
   * marker and, if the response never made it, an error answer).
   */
  async #settleEnd (reason: RecordOutcome): Promise<void> {
    for (const delayMs of END_RETRY_DELAYS_MS) {
      if (!this.#endPending) return
      await sleep(delayMs)
      await this.#append([], true, reason).catch(() => {})
    }
    if (this.#endPending) this.#o.log.error({ streamId: this.#o.streamId }, 'could not record the end of the stream: resuming clients will not see it end')
  }
}
