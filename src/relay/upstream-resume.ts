import { isResumableUpstreamId, upstreamRetryDelay, UPSTREAM_RESUMES_WITHOUT_PROGRESS } from '../protocol/upstream-event-id.js'

/** Keeps the upstream's last event id (the stream's lease does), to resume the upstream GET from it. */
export interface UpstreamIdListener {
  noteUpstreamId: (id: string) => void
}

/**
 * What to do when an upstream answer ended early and the stream is one to
 * resume: `resume` (a GET with the upstream's Last-Event-ID after its retry
 * hint); `unresumable_id`: its last id cannot go back in a header;
 * `stalled`: resumed again and again without anything new.
 */
export type ResumeVerdict = 'resume' | 'unresumable_id' | 'stalled'

/**
 * The upstream's position across the answers of one recorded stream (the
 * first and each resume of it), for resuming it upstream when it ends early
 * (SEP-1699 polling, a restart). No I/O: the recorder asks, then acts.
 */
export class UpstreamResumes {
  #lastId: string | undefined
  #retryMs: number | undefined
  #progressed = false
  #withoutProgress = 0

  /** The upstream's last event id across its answers, if it gave any. */
  get lastId (): string | undefined { return this.#lastId }
  /** The latest answer brought something: a new event id, or events recorded. */
  get progressed (): boolean { return this.#progressed }
  /** Resumes in a row that brought nothing. */
  get withoutProgress (): number { return this.#withoutProgress }
  /** The wait before resuming: the upstream's retry hint, bounded. */
  get delayMs (): number { return upstreamRetryDelay(this.#retryMs) }

  /**
   * An upstream answer ended, having given `lastId` and `retryMs` (undefined
   * when it gave none: earlier answers' stand) and with events from it
   * recorded or not.
   */
  answerEnded (lastId: string | undefined, retryMs: number | undefined, recorded: boolean): void {
    const id = lastId ?? this.#lastId
    this.#progressed = id !== this.#lastId || recorded
    this.#retryMs = retryMs ?? this.#retryMs
    this.#lastId = id
  }

  /** Whether to resume after the answer that just ended (the stream being one to resume). */
  verdict (): ResumeVerdict {
    if (this.#lastId !== undefined && !isResumableUpstreamId(this.#lastId)) return 'unresumable_id'
    this.#withoutProgress = this.#progressed ? 0 : this.#withoutProgress + 1
    return this.#withoutProgress >= UPSTREAM_RESUMES_WITHOUT_PROGRESS ? 'stalled' : 'resume'
  }
}
