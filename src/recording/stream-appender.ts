import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger as Logger } from 'fastify'
import { LeaseLostError, SessionGoneError } from '../errors.js'
import type { EventInput, EventStore, StreamState } from '../store/contract.js'
import { EventBatch } from '../store/batch/event-batch.js'
import type { NumberedBatch } from '../store/batch/numbered-batch.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import { resendAppend } from './confirm-window.js'
import { epochGap, storeUnavailableGap } from './gap-markers.js'
import { respondsTo } from './json-rpc-response.js'
import type { LiveClients } from './live-clients.js'
import type { RecordOutcome } from './record-outcome.js'
import type { UpstreamIdListener } from './upstream-resume.js'

export interface AppenderOptions {
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly sessionId: string
  readonly streamId: string
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
   * The store lost the session (Redis restarted empty) while the upstream is
   * still answering (a request's answer, or the standalone stream). Records the session again under a new
   * epoch and opens this stream in it; resolves with the stream's new state,
   * or undefined when the session is not to be recorded again (expired,
   * RECOVER_LOST_SESSIONS off). Never called for a session the store says
   * was deleted (sessionDeleted): that one stays deleted.
   */
  readonly recoverSession?: () => Promise<StreamState | undefined>
  /**
   * The standalone stream: its pump found the session lost before an append
   * did (the lease's renewal) and recorded it again itself. The stream's
   * state in the new epoch, handed over once; asked before each append.
   */
  readonly epochMoved?: () => StreamState | undefined
}

/** Waits between attempts to record a stream's end after the store refused it. */
const END_RETRY_DELAYS_MS = [250, 1000, 2000, 4000, 8000]

/**
 * Appends one recorded stream's events to the store, and keeps the stream
 * whole when the store fails: a failed append is resent through the confirm
 * window, then its events are passed on unrecorded to the clients here
 * (degraded mode) and a gap marker is recorded once the store answers again;
 * a session the store lost is recorded again under a new epoch; a request
 * stream's end, and its answer, always reach the store.
 */
export class StreamAppender {
  readonly #o: AppenderOptions
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

  constructor (o: AppenderOptions) {
    this.#o = o
    this.#storedThrough = typeof o.storedThrough === 'number' ? o.storedThrough : undefined
    this.#answered = o.requestId === undefined
  }

  /** The request's response (or the gateway's error answer) is in the store; always true for the standalone stream. */
  get answered (): boolean { return this.#answered }

  /** Append what the upstream sent (one or more reads); false when the store refused it (degraded mode). */
  append (events: EventBatch | readonly EventInput[]): Promise<boolean> {
    return this.#append(events, false, 'upstream_error')
  }

  /**
   * Append the last events and mark the stream ended, with an error answer
   * in place of the request's response if it never came (`reason` says why).
   */
  appendEnd (events: readonly EventInput[], reason: RecordOutcome): Promise<boolean> {
    return this.#append(events, true, reason)
  }

  /**
   * The upstream answer broke off: nothing more can arrive. Mark the end
   * (after `closing`) so resuming clients are not left waiting, with an error
   * answer for the request unless its response is already stored or the
   * request was aborted. A refused end is left to settleEnd().
   */
  async endAfterFailure (closing: readonly EventInput[], outcome: RecordOutcome): Promise<void> {
    if (outcome === 'aborted') this.#answered = true
    this.#endPending = !(await this.#append(closing, true, outcome).catch(() => false))
  }

  /**
   * The end of a request stream must reach the store, or resuming clients wait
   * for ever: after a refused final append, retry a few times (with the gap
   * marker and, if the response never made it, an error answer).
   */
  async settleEnd (reason: RecordOutcome): Promise<void> {
    for (const delayMs of END_RETRY_DELAYS_MS) {
      if (!this.#endPending) return
      await sleep(delayMs)
      await this.#append([], true, reason).catch(() => {})
    }
    if (this.#endPending) this.#o.log.error({ streamId: this.#o.streamId }, 'could not record the end of the stream: resuming clients will not see it end')
  }

  #errorAnswer (reason: RecordOutcome): EventInput | undefined {
    const data = this.#answered ? undefined : this.#o.failureResponse?.(reason)
    return data === undefined ? undefined : { data }
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
    if (stored.length > 0) this.#storedThrough = stored.lastSeq
    if (answers) this.#answered = true
    if (end) this.#endPending = false
    this.#epochGapPending = false
    if (this.#unrecorded > 0) {
      o.metrics.countGap('store_unavailable')
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
   * False when the store refused the append (degraded mode). A session the
   * store lost is recorded again (recoverSession) and the append made in the
   * new epoch, after a gap marker: the upstream is still answering, and the
   * rest of its answer, the response included, stays resumable instead of
   * being thrown away.
   */
  async #append (events: EventBatch | readonly EventInput[], end: boolean, reason: RecordOutcome): Promise<boolean> {
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
      // Deleted (DELETE, upstream 404) while its answer is read: the session stays deleted.
      if (await o.metrics.timeStore('session_deleted', () => o.store.sessionDeleted(o.sessionId))) {
        o.log.info({ streamId: o.streamId }, 'session deleted during its answer: stopped recording it')
        return false
      }
      state = await o.recoverSession()
    } catch (err) {
      o.log.warn({ err, streamId: o.streamId }, 'could not record the lost session again')
      return false
    }
    if (state === undefined) return false
    this.#movedTo(state)
    return true
  }

  /** The session was recorded again under a new epoch: the stream goes on there, after a gap marker. */
  #movedTo (state: StreamState): void {
    this.#storedThrough = state.lastSeq
    this.#epochGapPending = true
    this.#o.log.warn({ streamId: this.#o.streamId, epoch: state.epoch }, 'the event store lost the session during its answer: recorded again under a new epoch, recording goes on after a gap marker')
  }

  async #appendOnce (events: EventBatch | readonly EventInput[], end: boolean, reason: RecordOutcome): Promise<boolean> {
    const o = this.#o
    const moved = o.epochMoved?.()
    if (moved !== undefined) this.#movedTo(moved)
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
    const markers = [...(this.#epochGapPending ? [epochGap(o.streamId)] : []), ...(this.#unrecorded === 0 ? [] : [storeUnavailableGap(this.#unrecorded)])]
    const batch = markers.length === 0 && answer === undefined
      ? read
      : EventBatch.from([...markers, ...read.toArray(), ...(answer === undefined ? [] : [answer])])
    const readFrom = o.upstreamIds?.readFrom?.()
    const options = { end, ...(o.fence !== undefined && { fence: o.fence }), ...(readFrom !== undefined && { readFrom }) }
    let stored: NumberedBatch
    try {
      stored = await o.metrics.timeStore('append', () => o.store.appendBatch(o.sessionId, o.streamId, batch, options))
    } catch (first) {
      if (first instanceof SessionGoneError || first instanceof LeaseLostError) throw first
      // Only a failure that would pass events on live can duplicate them; once
      // degraded, events are passed on at once (the window was spent already).
      if (read.length === 0 || this.#unrecorded > 0) return this.#passOn(read, end, first)
      const resent = await resendAppend(o, batch, options, first)
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
}
