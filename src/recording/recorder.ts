import type { Readable } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import type { EventTooLargeError } from '../sse/event-too-large.js'
import type { EventInput } from '../store/contract.js'
import type { EventBatch } from '../store/batch/event-batch.js'
import { SseDecoder } from '../sse/decoder.js'
import { keptUpstreamId } from '../protocol/upstream-event-id.js'
import { SessionGoneError, unreachable } from '../errors.js'
import { discardBody, MAX_TIMER_MS, UpstreamAbort } from '../upstream/client.js'
import { eventTooLargeGap } from './gap-markers.js'
import { readAhead, type ReadAheadBudget, type ReadAheadSink } from './read-ahead.js'
import { failureOutcome, type RecordOutcome } from './record-outcome.js'
import { StreamAppender, type AppenderOptions } from './stream-appender.js'
import { UpstreamResumes, type ResumeBounds } from './upstream-resume.js'

// The route retries opening a request stream through the same window as a failed append.
export { confirmWindow } from './confirm-window.js'

export interface RecordOptions extends AppenderOptions {
  readonly body: Readable
  readonly maxEventBytes: number
  /** The gateway's read-ahead budget, shared by the streams it records. */
  readonly readAhead: ReadAheadBudget
  /** Request streams end with their upstream answer; the standalone stream outlives one upstream GET. */
  readonly endStreamOnFinish: boolean
  /**
   * Resume the upstream's answer after it ended early, having given event ids
   * (SEP-1699 polling, a restart): a GET with the upstream's Last-Event-ID.
   * Resolves with the new SSE body, or undefined when the upstream refuses.
   */
  readonly resumeUpstream?: (lastEventId: string | undefined, abort: UpstreamAbort) => Promise<Readable | undefined>
  /** How far resumeUpstream is used: answers without events in a row, and (request streams) for how long. */
  readonly resumeBounds: ResumeBounds
  /**
   * Aborted when the session is gone (deleted, expired): the answer being read
   * or resumed is dropped, and nothing more is asked of the upstream. Only an
   * append would find that out otherwise, and an answer held open with
   * comments only makes none.
   */
  readonly sessionGone?: AbortSignal
}

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

/** #resumeOrConclude's answer when the upstream answer was resumed: the recording goes on. */
const RESUMED = 'resumed'

/**
 * One recorded upstream answer: reads it (and its resumes upstream) and
 * hands what it reads to the stream's appender. A class rather than closures
 * over the function's variables: an idle stream holds one of these for its
 * whole life, and methods cost it nothing per stream.
 */
class Recording implements ReadAheadSink {
  readonly #o: RecordOptions
  readonly #appender: StreamAppender
  readonly #resumes: UpstreamResumes
  #decoder: SseDecoder
  /** The upstream answer being read: the first, or the latest resume of it. */
  #body: Readable
  /** When the upstream answer being read was opened (performance.now()). */
  #openedAt = performance.now()
  /** The upstream answer being read brought events (priming events are none). */
  #eventsSinceOpen = false
  #settle: (outcome: RecordOutcome) => void = ignore
  #abandon: (err: unknown) => void = ignore
  /**
   * Ends the resumed answer being read once a request stream's resumes have
   * run out (UPSTREAM_RESUME_MAX_SECONDS): the check is made when an answer
   * ends, and an answer held open, events or not, would never come back to it.
   * Then 'expired'. A resume being asked for when it passes is aborted.
   */
  #expiry: NodeJS.Timeout | 'expired' | undefined
  /** Aborts the resume being asked of the upstream, while one is (resumeUpstream's abort). */
  #asking: UpstreamAbort | undefined

  constructor (o: RecordOptions) {
    this.#o = o
    this.#appender = new StreamAppender(o)
    this.#resumes = new UpstreamResumes(o.resumeBounds, o.requestId !== undefined)
    this.#decoder = new SseDecoder(o.maxEventBytes)
    this.#body = o.body
    o.sessionGone?.addEventListener('abort', () => { this.#stopForGoneSession() }, { once: true })
  }

  /**
   * Records until the upstream answer is over. While it waits for the
   * upstream, nothing of this is suspended: readAhead calls back.
   */
  run (): Promise<RecordOutcome> {
    return new Promise<RecordOutcome>((resolve, reject) => {
      this.#settle = outcome => {
        this.#stopExpiry()
        resolve(outcome)
      }
      this.#abandon = err => {
        this.#stopExpiry()
        reject(err)
      }
      readAhead(this.#body, this.#decoder, this, this.#o.readAhead)
    })
  }

  /** ReadAheadSink: a piece of the upstream's answer came in. */
  read (): void {
    this.#o.metrics.upstreamReads.inc()
  }

  /** ReadAheadSink: one append per batch, the reads that arrived while the previous append was at the store. */
  batch (events: EventBatch): Promise<boolean> {
    if (events.length > 0) this.#eventsSinceOpen = true
    return this.#appender.append(events)
  }

  /** ReadAheadSink: the upstream answer ended. */
  end (): void {
    this.#resumeOrConclude().then(outcome => { if (outcome !== RESUMED) this.#settle(outcome) }, this.#abandon)
  }

  /** ReadAheadSink: reading stopped (the upstream broke off, an event too large, the store refused for good). */
  fail (err: unknown): void {
    // Cut here for the deadline: over as an answer that ended, which the deadline then concludes.
    if (err instanceof ResumesExpiredError) {
      this.end()
      return
    }
    this.#concludeBroken(err).then(this.#settle, this.#abandon)
  }

  /** The deadline passed: the answer being read, if any, is ended (fail, then end, conclude it). */
  #expire (): void {
    this.#expiry = 'expired'
    this.#cut(new ResumesExpiredError())
  }

  /** Stops reading from the upstream: a resume being asked for is aborted, the answer being read fails with `err`. */
  #cut (err: Error): void {
    this.#asking?.abort()
    const body = this.#body
    body.on('error', ignore)
    body.destroy(err)
  }

  /** A method, not a field's test: the deadline passes while an await is on its way. */
  #expired (): boolean {
    return this.#expiry === 'expired'
  }

  /** The session is gone: the answer being read, if any, fails as a gone session's; a resume being asked for is aborted. */
  #stopForGoneSession (): void {
    this.#cut(new SessionGoneError(this.#o.sessionId))
  }

  /** Was the session found gone meanwhile (sessionGone)? A method: it changes while an await is on its way. */
  #gone (): boolean {
    return this.#o.sessionGone?.aborted === true
  }

  #stopExpiry (): void {
    if (this.#expiry !== 'expired') clearTimeout(this.#expiry)
  }

  /**
   * The upstream ended its answer. A request stream without its response yet,
   * or the standalone stream, whose upstream gave event ids, is resumed
   * upstream (after the upstream's retry hint, backing off while answers
   * bring nothing) until the response comes, the upstream refuses, the
   * resumes' bounds are reached or the session is deleted; only then is the
   * answer concluded (gap repair: an error response in place of a lost one).
   */
  async #resumeOrConclude (): Promise<RecordOutcome | typeof RESUMED> {
    const o = this.#o
    const resumes = this.#resumes
    const before = resumes.lastId
    resumes.answerEnded(this.#decoder.lastId, this.#decoder.retry, this.#eventsSinceOpen, performance.now() - this.#openedAt)
    const lastId = resumes.lastId
    // The standalone stream is held for as long as the session lives: reopened even
    // without ids (the upstream drops what it sends while no GET is open).
    const wanted = o.resumeUpstream !== undefined && (o.requestId === undefined || (!this.#appender.answered && lastId !== undefined))
    if (!wanted) return await this.#concludeEnded()
    const verdict = resumes.verdict()
    switch (verdict) {
      case 'unresumable_id':
        o.metrics.upstreamErrors.inc({ kind: 'unresumable_id' })
        o.log.warn({ streamId: o.streamId }, 'upstream event id cannot go back in a Last-Event-ID header (control or non-ASCII characters): its stream is not resumable upstream')
        return await this.#concludeEnded()
      case 'stalled':
      case 'expired':
        return await this.#gaveUp(verdict)
      case 'resume':
        break
      default:
        unreachable(verdict)
    }
    if (lastId !== undefined && lastId !== before) o.upstreamIds?.noteUpstreamId(keptUpstreamId(lastId))
    // From the first early end on: the wait, the resume asked for and the answer read are all under it.
    const left = resumes.msUntilExpired
    // (A deadline past what a timer takes is left to the check at each answer's end.)
    if (left !== undefined && left <= MAX_TIMER_MS) this.#expiry ??= setTimeout(() => { this.#expire() }, left).unref()
    await sleep(resumes.delayMs)
    // A deleted session stays deleted: nothing more is asked of the upstream for it.
    if (this.#gone() || await this.#sessionDeleted()) return await this.#concludeBroken(new SessionGoneError(o.sessionId))
    // The deadline passed during the wait: nothing more is asked.
    if (this.#expired()) return await this.#gaveUp('expired')
    let body: Readable | undefined
    const asking = this.#asking = new UpstreamAbort()
    try {
      body = await (o.resumeUpstream as NonNullable<RecordOptions['resumeUpstream']>)(lastId, asking)
    } catch (err) {
      if (this.#gone()) return await this.#concludeBroken(new SessionGoneError(o.sessionId))
      // Aborted for the deadline: the resumes ran out, the upstream did not fail.
      if (this.#expired()) return await this.#gaveUp('expired')
      return await this.#concludeBroken(err)
    } finally {
      this.#asking = undefined
    }
    if (this.#gone()) {
      if (body !== undefined) discardBody(body)
      return await this.#concludeBroken(new SessionGoneError(o.sessionId))
    }
    // The deadline passed as the answer came: it is not read.
    if (this.#expired()) {
      if (body !== undefined) discardBody(body)
      return await this.#gaveUp('expired')
    }
    if (body === undefined) {
      o.log.info({ streamId: o.streamId }, 'upstream stream not resumed (the upstream refused, or its session is going): concluding it')
      return await this.#concludeEnded()
    }
    o.log.debug({ streamId: o.streamId }, 'upstream ended its stream early: resumed it with its Last-Event-ID')
    this.#body = body
    this.#decoder = new SseDecoder(o.maxEventBytes)
    this.#openedAt = performance.now()
    this.#eventsSinceOpen = false
    // Read on under the recording's one promise: awaiting a new one per resume would keep
    // every resume's promise and frame until the stream ends (never, for a standalone
    // stream whose upstream polls).
    readAhead(this.#body, this.#decoder, this, o.readAhead)
    return RESUMED
  }

  /** The resumes' bounds are reached: counted, logged, the answer concluded. */
  async #gaveUp (verdict: 'stalled' | 'expired'): Promise<RecordOutcome> {
    const o = this.#o
    o.metrics.upstreamErrors.inc({ kind: `resume_${verdict}` })
    o.log.warn({ streamId: o.streamId, answersWithoutEvents: this.#resumes.withoutProgress }, verdict === 'stalled'
      ? 'upstream ended its stream again and again without an event: stopped resuming it (UPSTREAM_RESUMES_WITHOUT_PROGRESS)'
      : 'upstream stream resumed for UPSTREAM_RESUME_MAX_SECONDS already: stopped resuming it')
    return await this.#concludeEnded()
  }

  /** Was the session deleted (DELETE, upstream 404) meanwhile? When the store cannot tell, the upstream decides. */
  async #sessionDeleted (): Promise<boolean> {
    const o = this.#o
    try {
      return await o.metrics.timeStore('session_deleted', () => o.store.sessionDeleted(o.sessionId))
    } catch (err) {
      o.log.debug({ err, streamId: o.streamId }, 'could not ask the event store whether the session was deleted: resuming its stream upstream')
      return false
    }
  }

  /** The upstream answer is over: record what the decoder still held, and the stream's end (request streams). */
  async #concludeEnded (): Promise<RecordOutcome> {
    try {
      const rest = this.#decoder.end()
      await (this.#o.endStreamOnFinish ? this.#appender.appendEnd(rest, 'upstream_error') : this.#appender.append(rest))
    } catch (err) {
      return await this.#concludeBroken(err)
    }
    await this.#appender.settleEnd('upstream_error')
    return 'completed'
  }

  /** Reading the upstream answer, or recording it, failed for good: say why, and end the stream when it is a request stream. */
  async #concludeBroken (err: unknown): Promise<RecordOutcome> {
    const o = this.#o
    const outcome = failureOutcome(err)
    const closing: EventInput[] = []
    switch (outcome) {
      case 'session_gone':
        o.log.info({ streamId: o.streamId }, 'session records gone: stopped recording its stream')
        break
      case 'lease_lost':
        o.log.warn({ streamId: o.streamId }, 'stream lease lost to another replica: stopped recording')
        break
      case 'event_too_large':
        // What came complete before the oversized event is recorded all the same, then a
        // gap marker says that the rest of this answer was cut off.
        await this.#appender.append((err as EventTooLargeError).completed).catch(() => {})
        closing.push(eventTooLargeGap(o.maxEventBytes))
        o.metrics.eventsUnrecorded.inc({ reason: 'too_large' })
        o.metrics.countGap('event_too_large')
        o.log.error({ streamId: o.streamId, err }, 'upstream event too large: stream closed')
        break
      case 'aborted':
        break
      case 'upstream_error':
        o.metrics.upstreamErrors.inc({ kind: 'stream_broken' })
        o.log.warn({ err, streamId: o.streamId }, 'upstream SSE answer broke off')
        break
      default:
        unreachable(outcome)
    }
    discardBody(this.#body)
    if (o.endStreamOnFinish && outcome !== 'session_gone' && outcome !== 'lease_lost') {
      await this.#appender.endAfterFailure(closing, outcome)
    } else if (closing.length > 0) {
      await this.#appender.append(closing).catch(() => false)
    }
    await this.#appender.settleEnd(outcome)
    return outcome
  }
}

/** The answer a request stream's expired resumes cut (Recording's expiry): not a failure of the upstream's. */
class ResumesExpiredError extends Error {
  constructor () {
    super('UPSTREAM_RESUME_MAX_SECONDS passed: the resumed answer is ended')
  }
}
