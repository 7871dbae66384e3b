import { isResumableUpstreamId } from '../protocol/upstream-event-id.js'

/** Keeps the upstream's last event id (the stream's lease does), to resume the upstream GET from it. */
export interface UpstreamIdListener {
  noteUpstreamId: (id: string) => void
  /** The upstream session the stream is read from now (AppendOptions.readFrom). */
  readFrom?: () => string | undefined
}

/** How far one stream is resumed upstream (UPSTREAM_RESUMES_WITHOUT_PROGRESS, UPSTREAM_RESUME_MAX_SECONDS). */
export interface ResumeBounds {
  /** Answers in a row (the first and its resumes) that bring no event before the gateway stops asking. */
  readonly withoutProgress: number
  /** Request streams: longest time resumed, from the answer's first early end. */
  readonly maxMs: number
}

/**
 * The first wait before resuming after an answer without progress, doubled
 * for each such answer in a row: an upstream that polls expects a prompt
 * resume (and one without an event store drops what it sends meanwhile),
 * one that ends every answer at once must not get a GET every few ms.
 */
export const RESUME_BACKOFF_FIRST_MS = 100
/**
 * The longest backoff: a stream stuck in a loop costs two GETs a minute. An
 * answer held open at least this long before it ended is no loop (it costs
 * no more than the slowest backoff), so it is not counted against
 * `withoutProgress` either: an upstream that closes idle streams on a timer
 * keeps its standalone stream.
 */
export const RESUME_BACKOFF_MAX_MS = 30_000
/** An upstream's `retry` is waited for (never less), up to this: beyond, the stream is as good as gone. */
export const MAX_UPSTREAM_RETRY_MS = 60_000

/**
 * What to do when an upstream answer ended early and the stream is one to
 * resume: `resume` (a GET with the upstream's Last-Event-ID after delayMs);
 * `unresumable_id`: its last id cannot go back in a header; `stalled`:
 * resumed `withoutProgress` times in a row without an event; `expired`:
 * resumed for `maxMs` already (request streams).
 */
export type ResumeVerdict = 'resume' | 'unresumable_id' | 'stalled' | 'expired'

/** One clock shared by every stream's resumes (not a bound function per stream). */
const monotonicNow = (): number => performance.now()

/**
 * The upstream's position across the answers of one recorded stream (the
 * first and each resume of it), and the bounds on resuming it when it ends
 * early (SEP-1699 polling, a restart): only events are progress (a new id on
 * an empty priming event is not), and the wait between resumes grows while
 * none comes. No I/O: the recorder asks, then acts.
 */
export class UpstreamResumes {
  readonly #bounds: ResumeBounds
  /** Request streams have a deadline; the standalone stream lives as long as its session. */
  readonly #deadline: boolean
  readonly #now: () => number
  #lastId: string | undefined
  #retryMs: number | undefined
  #progressed = false
  #withoutProgress = 0
  /** How long the latest answer was open. */
  #heldMs = 0
  #firstEndAt: number | undefined

  constructor (bounds: ResumeBounds, deadline: boolean, now: () => number = monotonicNow) {
    this.#bounds = bounds
    this.#deadline = deadline
    this.#now = now
  }

  /** The upstream's last event id across its answers, if it gave any. */
  get lastId (): string | undefined { return this.#lastId }
  /** The latest answer brought events. */
  get progressed (): boolean { return this.#progressed }
  /** Answers in a row that brought no event (answers held open RESUME_BACKOFF_MAX_MS or more aside). */
  get withoutProgress (): number { return this.#withoutProgress }

  /**
   * Milliseconds until verdict() says `expired` whatever the next answer
   * does; undefined without a deadline (the standalone stream), or before the
   * first early end.
   */
  get msUntilExpired (): number | undefined {
    if (!this.#deadline || this.#firstEndAt === undefined) return undefined
    return Math.max(0, this.#firstEndAt + this.#bounds.maxMs - this.#now()) + 1
  }

  /**
   * The wait before resuming: at least the upstream's retry hint, counted
   * from the answer's end as SSE has it; at least the backoff, counted from
   * the answer's start, so an answer held open long is resumed at once.
   */
  get delayMs (): number {
    const backoff = Math.min(RESUME_BACKOFF_FIRST_MS * 2 ** Math.max(0, this.#withoutProgress - 1), RESUME_BACKOFF_MAX_MS)
    return Math.max(Math.min(this.#retryMs ?? 0, MAX_UPSTREAM_RETRY_MS), backoff - this.#heldMs, 0)
  }

  /**
   * An upstream answer ended, having given `lastId` and `retryMs` (undefined
   * when it gave none: earlier answers' stand), with events in it or not,
   * after being open `heldMs`.
   */
  answerEnded (lastId: string | undefined, retryMs: number | undefined, events: boolean, heldMs: number): void {
    this.#firstEndAt ??= this.#now()
    this.#progressed = events
    this.#heldMs = heldMs
    if (events) this.#withoutProgress = 0
    else if (heldMs < RESUME_BACKOFF_MAX_MS) this.#withoutProgress++
    this.#retryMs = retryMs ?? this.#retryMs
    this.#lastId = lastId ?? this.#lastId
  }

  /** Whether to resume after the answer that just ended (the stream being one to resume). */
  verdict (): ResumeVerdict {
    if (this.#lastId !== undefined && !isResumableUpstreamId(this.#lastId)) return 'unresumable_id'
    if (this.#withoutProgress >= this.#bounds.withoutProgress) return 'stalled'
    if (this.#deadline && this.#now() + this.delayMs - (this.#firstEndAt as number) > this.#bounds.maxMs) return 'expired'
    return 'resume'
  }
}
