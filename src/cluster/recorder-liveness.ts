import type { FastifyBaseLogger as Logger } from 'fastify'
import type { LeaseBackend, OrphanAnswer } from './lease.js'

/**
 * Where a watch stands: its recorder not known yet (`unknown`, looked up at
 * the next tick), being looked up, known and watched, its stream being ended
 * for that recorder's death, or done with.
 */
type WatchPhase =
  | { readonly kind: 'unknown' }
  | { readonly kind: 'looking' }
  | { readonly kind: 'watching', readonly recorder: string }
  | { readonly kind: 'ending', readonly recorder: string }
  | { readonly kind: 'stopped' }

/** A client here waits on a request stream another replica records. */
interface RecorderWatch {
  readonly sessionId: string
  readonly streamId: string
  readonly answer: OrphanAnswer
  readonly onEnded: () => void
  phase: WatchPhase
}

const STOPPED: WatchPhase = { kind: 'stopped' }

export interface RecorderLivenessOptions {
  readonly backend: LeaseBackend
  readonly log: Logger
  readonly ttlMs: number
  readonly tickMs: number
}

/**
 * Request streams have no lease (see RecorderLiveness in lease.ts): this
 * replica keeps its liveness mark up while it records any, and ends the
 * request streams clients here wait on once their recorder's mark runs out.
 * Both ride on the lease tick.
 */
export class RecorderLivenessWatch {
  readonly #o: RecorderLivenessOptions
  readonly #watches = new Set<RecorderWatch>()
  /** Request streams this replica records now: its liveness mark is kept up while there are any. */
  #recording = 0
  /** When the last refresh of this replica's liveness mark was sent (0: not up). */
  #aliveAt = 0
  /** Bumped when the mark is dropped: a refresh sent before then says nothing of the mark now. */
  #aliveGeneration = 0

  constructor (options: RecorderLivenessOptions) {
    this.#o = options
  }

  /** See LeaseCoordinator.recordRequestStream. */
  record (sessionId: string, streamId: string): { readonly claimed: Promise<void>, readonly done: () => void } {
    this.#recording++
    let finished = false
    const stale = Date.now() - this.#aliveAt > this.#o.tickMs * 1.5
    const claimed = Promise.all([stale ? this.#markAlive() : undefined, this.#o.backend.claimRequestStream(sessionId, streamId)]).then(() => {})
    return {
      claimed,
      done: () => {
        if (finished) return
        finished = true
        // After close() the count is 0 and the mark dropped already.
        if (this.#recording > 0 && --this.#recording === 0) this.#dropAlive()
      }
    }
  }

  /** See LeaseCoordinator.watchRequestStream. */
  watch (sessionId: string, streamId: string, answer: OrphanAnswer, onEnded: () => void): () => void {
    const watch: RecorderWatch = { sessionId, streamId, answer, onEnded, phase: { kind: 'unknown' } }
    this.#watches.add(watch)
    this.#lookUpRecorder(watch)
    return () => {
      watch.phase = STOPPED
      this.#watches.delete(watch)
    }
  }

  /** What the next tick asks: which recorders are alive, and whether to refresh this replica's mark. */
  due (): { readonly recorders: string[], readonly alive: boolean, readonly generation: number } {
    for (const w of this.#watches) this.#lookUpRecorder(w)
    const recorders = [...new Set([...this.#watches].flatMap(w => w.phase.kind === 'watching' ? [w.phase.recorder] : []))]
    return { recorders, alive: this.#recording > 0, generation: this.#aliveGeneration }
  }

  /** The tick's answer to `due`, sent at `sentAt`. */
  settled (asked: ReturnType<RecorderLivenessWatch['due']>, sentAt: number, recordersAlive: readonly boolean[]): void {
    if (asked.alive && asked.generation === this.#aliveGeneration) this.#aliveAt = Math.max(this.#aliveAt, sentAt)
    recordersAlive.forEach((alive, i) => { if (!alive) this.#endOrphans(asked.recorders[i] as string) })
  }

  /** After drain: a request stream still unended here never will be; let the other replicas end it now. */
  async close (): Promise<void> {
    for (const watch of this.#watches) watch.phase = STOPPED
    this.#watches.clear()
    if (this.#recording === 0) return
    this.#recording = 0
    this.#aliveAt = 0
    this.#aliveGeneration++
    await this.#o.backend.retire().catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not drop the liveness mark'))
  }

  async #markAlive (): Promise<void> {
    const sentAt = Date.now()
    const generation = this.#aliveGeneration
    await this.#o.backend.markAlive(this.#o.ttlMs)
    if (generation === this.#aliveGeneration) this.#aliveAt = Math.max(this.#aliveAt, sentAt)
  }

  /** Nothing recorded here any more: no mark left behind (a new recording sets it again, after this). */
  #dropAlive (): void {
    this.#aliveAt = 0
    this.#aliveGeneration++
    this.#o.backend.retire().catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not drop the liveness mark'))
  }

  /**
   * Which replica records the stream, for a watch that does not know yet:
   * unknown (an older gateway) or this one means nothing to watch.
   */
  #lookUpRecorder (watch: RecorderWatch): void {
    if (watch.phase.kind !== 'unknown') return
    const looking: WatchPhase = { kind: 'looking' }
    watch.phase = looking
    this.#o.backend.requestStreamRecorder(watch.sessionId, watch.streamId).then(recorder => {
      // Stopped meanwhile: nothing to watch.
      if (watch.phase !== looking) return
      if (recorder === undefined || recorder === this.#o.backend.replicaId) {
        watch.phase = STOPPED
        this.#watches.delete(watch)
      } else {
        watch.phase = { kind: 'watching', recorder }
      }
    }, (err: unknown) => {
      // Tried again at the next tick.
      if (watch.phase === looking) watch.phase = { kind: 'unknown' }
      this.#o.log.warn({ err }, 'lease: could not look up the recorder of a request stream')
    })
  }

  /** The replica's liveness mark is gone: end the streams it left unended that clients here wait on. */
  #endOrphans (recorder: string): void {
    for (const watch of this.#watches) {
      if (watch.phase.kind !== 'watching' || watch.phase.recorder !== recorder) continue
      const ending: WatchPhase = { kind: 'ending', recorder }
      watch.phase = ending
      this.#o.backend.endOrphanedRequestStream(watch.sessionId, watch.streamId, recorder, watch.answer).then(ended => {
        this.#watches.delete(watch)
        // Ended by someone else (its recorder, or another replica first): the usual notice ends the client.
        watch.phase = STOPPED
        if (ended) watch.onEnded()
      }, (err: unknown) => {
        if (watch.phase === ending) watch.phase = { kind: 'watching', recorder }
        this.#o.log.warn({ err }, 'lease: could not end a request stream whose recorder died; trying again next tick')
      })
    }
  }
}
