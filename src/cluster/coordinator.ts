import { randomBytes } from 'node:crypto'
import type { FastifyBaseLogger as Logger } from 'fastify'
import { randomToken } from '../protocol/event-id.js'
import { isGrant, type AcquireResult, type ControlMessage, type ControlSubscription, type LeaseBackend, type LeaseGrant, type OrphanAnswer } from './lease.js'

export interface LeaseCoordinatorOptions {
  readonly backend: LeaseBackend
  /** LEASE_TTL_MS: a dead holder's lease is free after this; renewed every third of it. */
  readonly ttlMs: number
  /** STANDALONE_HOLD_SECONDS: how long after its last client anywhere a holder keeps the upstream GET. */
  readonly holdMs: number
  readonly log: Logger
  readonly random?: (size: number) => Uint8Array
}

export type LostReason = 'lost' | 'gone'

/** A lease this replica holds. The pump that uses it sets the callbacks. */
export class Lease implements LeaseGrant {
  readonly sessionId: string
  readonly token: string
  readonly takeover: boolean
  readonly lastUpstreamId: string | undefined
  /** Renewal found the lease held by another replica ('lost') or the session gone. */
  onLost: ((reason: LostReason) => void) | undefined
  /** While draining: another replica asked for the stream. */
  onHandoverRequest: (() => void) | undefined
  readonly #owner: LeaseCoordinator
  #settled = false

  constructor (owner: LeaseCoordinator, sessionId: string, grant: LeaseGrant) {
    this.#owner = owner
    this.sessionId = sessionId
    this.token = grant.token
    this.takeover = grant.takeover
    this.lastUpstreamId = grant.lastUpstreamId
  }

  /** No longer held (released, found lost). */
  get settled (): boolean { return this.#settled }

  noteUpstreamId (id: string): void {
    this.#owner.backend.noteUpstreamId(this.sessionId, id)
  }

  /**
   * Let the lease go and tell the session's channel, so a replica with a
   * client takes over at once. `live`: the upstream GET did not end cleanly,
   * the next holder marks a gap. Only the first release or loss counts.
   */
  async release (live: boolean): Promise<void> {
    if (!this.#settle()) return
    await this.#owner.backend.release(this.sessionId, this.token, live)
  }

  /**
   * The hold expired here: release unless a client is attached on another
   * replica. Resolves 0 when released, -1 when the lease was lost, else the
   * milliseconds to wait before asking again.
   */
  async releaseIfIdle (): Promise<number> {
    if (this.#settled) return -1
    const result = await this.#owner.backend.releaseIfIdle(this.sessionId, this.token)
    if (result <= 0) this.#settle()
    return result
  }

  /** @internal the coordinator found the lease lost. */
  lose (reason: LostReason): void {
    if (this.#settle()) this.onLost?.(reason)
  }

  #settle (): boolean {
    if (this.#settled) return false
    this.#settled = true
    this.#owner.forgetHeld(this)
    return true
  }
}

export interface WatchHandlers {
  /** The lease was free and is now this replica's: open the upstream GET (or release it). */
  readonly onGrant: (lease: Lease) => void
  /** The store has no record of the session any more. */
  readonly onGone: () => void
}

interface Watch {
  readonly sessionId: string
  readonly handlers: WatchHandlers
  readonly control: ControlSubscription
  acquiring: boolean
  /**
   * A try was asked for (a `released` notice, the retry at the holder's
   * expiry) while an acquire was at Redis: that acquire may have run before
   * the release and found the lease held, so another follows it.
   */
  askedMeanwhile: boolean
  stopped: boolean
  /** Another try right when the holder's lease runs out, when that comes before the next tick. */
  retry: NodeJS.Timeout | undefined
}

/** A client here waits on a request stream another replica records (see RecorderLiveness). */
interface RecorderWatch {
  readonly sessionId: string
  readonly streamId: string
  readonly answer: OrphanAnswer
  readonly onEnded: () => void
  /** The recording replica, once looked up. */
  recorder: string | undefined
  looking: boolean
  ending: boolean
  stopped: boolean
}

/** How long drain waits for its control subscriptions before going on without them. */
const SUBSCRIBE_WAIT_MS = 1000
/** A watcher tries again this long after the holder's lease would expire (clock skew inside Redis is nil). */
const EXPIRY_SLACK_MS = 20

/**
 * Replica coordination for upstream GETs. Holds this replica's leases and
 * renews them; watches the sessions whose clients are attached here while
 * another replica holds the stream, to take over when the holder dies (its
 * lease expires) or lets go (a `released` message). Also keeps this
 * replica's liveness mark up while it records request streams, and ends
 * the request streams clients here wait on when their recorder's mark runs
 * out (RecorderLiveness). Everything periodic is one batched round trip per
 * tick (every ttl/3), whatever the session and stream count.
 */
export class LeaseCoordinator {
  readonly backend: LeaseBackend
  readonly #o: LeaseCoordinatorOptions
  readonly #random: (size: number) => Uint8Array
  readonly #held = new Map<string, Lease>()
  readonly #watched = new Map<string, Watch>()
  readonly #drainSubscriptions = new Map<string, ControlSubscription>()
  readonly #recorderWatches = new Set<RecorderWatch>()
  /** Request streams this replica records now: its liveness mark is kept up while there are any. */
  #recording = 0
  /** When the last refresh of this replica's liveness mark was sent (0: not up). */
  #aliveAt = 0
  /** Bumped when the mark is dropped: a refresh sent before then says nothing of the mark now. */
  #aliveGeneration = 0
  #timer: NodeJS.Timeout | undefined
  #ticking = false
  #draining = false

  constructor (options: LeaseCoordinatorOptions) {
    this.#o = options
    this.backend = options.backend
    this.#random = options.random ?? randomBytes
  }

  get heldCount (): number { return this.#held.size }
  get watchedCount (): number { return this.#watched.size }
  get tickMs (): number { return Math.max(100, Math.floor(this.#o.ttlMs / 3)) }

  start (): void {
    if (this.#timer !== undefined) return
    this.#timer = setInterval(() => { this.tick().catch(() => {}) }, this.tickMs)
    this.#timer.unref()
  }

  /**
   * This replica starts recording a request stream: note it with the stream,
   * so a replica whose client waits on it can end it if this one dies, and
   * keep this replica's liveness mark up until `done` (the stream recorded to
   * its end). `claimed` settles once both are in place: before the stream's
   * first event id goes out, no client can resume it, so their order does not matter.
   */
  recordRequestStream (sessionId: string, streamId: string): { readonly claimed: Promise<void>, readonly done: () => void } {
    if (!this.backend.shared) return { claimed: Promise.resolve(), done: () => {} }
    this.#recording++
    let finished = false
    const stale = Date.now() - this.#aliveAt > this.tickMs * 1.5
    const claimed = Promise.all([stale ? this.#markAlive() : undefined, this.backend.claimRequestStream(sessionId, streamId)]).then(() => {})
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

  /**
   * A client here waits on a request stream. If another replica records it
   * and dies (its liveness mark runs out, LEASE_TTL_MS), the next tick ends
   * the stream with `answer` (every follower sees the end as usual) and calls
   * `onEnded` on the replica that did. Returns the function that stops.
   */
  watchRequestStream (sessionId: string, streamId: string, answer: OrphanAnswer, onEnded: () => void): () => void {
    if (!this.backend.shared) return () => {}
    const watch: RecorderWatch = { sessionId, streamId, answer, onEnded, recorder: undefined, looking: false, ending: false, stopped: false }
    this.#recorderWatches.add(watch)
    this.#lookUpRecorder(watch)
    return () => {
      watch.stopped = true
      this.#recorderWatches.delete(watch)
    }
  }

  /** Take the session's lease now if it is free. */
  async acquire (sessionId: string): Promise<Lease | 'held' | 'gone'> {
    const result = await this.backend.acquire(sessionId, this.#token(), this.#o.ttlMs)
    if (result === 'gone') return result
    return isGrant(result) ? this.#hold(sessionId, result) : 'held'
  }

  /**
   * A client of the session is attached here and another replica holds its
   * stream: keep an attached marker up (so the holder keeps its upstream GET)
   * and take the lease when it frees up. Returns the function that stops.
   */
  watch (sessionId: string, handlers: WatchHandlers): () => void {
    if (this.#draining) return () => {}
    const existing = this.#watched.get(sessionId)
    if (existing !== undefined) this.#unwatch(existing)
    const watch: Watch = {
      sessionId,
      handlers,
      acquiring: false,
      askedMeanwhile: false,
      stopped: false,
      retry: undefined,
      control: this.backend.subscribeControl(sessionId, message => this.#onWatchControl(watch, message))
    }
    this.#watched.set(sessionId, watch)
    this.backend.markAttached(sessionId, this.#attachedMs()).catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not mark a client attached'))
    // A draining holder hands the stream over to the first replica that asks.
    watch.control.ready
      .then(async () => { if (!watch.stopped) await this.backend.publish(sessionId, 'want') })
      .catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not ask for a stream'))
    // Learn when the holder's lease runs out (it may be dead already).
    this.#tryTake(watch)
    return () => this.#unwatch(watch)
  }

  /**
   * Shutting down: no new watches, and each held stream goes to the first
   * replica that asks (`want`); watchers that exist already are told now.
   */
  async beginDrain (): Promise<void> {
    this.#draining = true
    for (const watch of [...this.#watched.values()]) this.#unwatch(watch)
    await Promise.all([...this.#held.values()].map(async lease => {
      const subscription = this.backend.subscribeControl(lease.sessionId, message => {
        if (message.kind === 'want' && message.origin !== this.backend.replicaId) lease.onHandoverRequest?.()
      })
      this.#drainSubscriptions.set(lease.sessionId, subscription)
      let timer: NodeJS.Timeout | undefined
      await Promise.race([subscription.ready, new Promise(resolve => { timer = setTimeout(resolve, SUBSCRIBE_WAIT_MS) })])
      clearTimeout(timer)
      if (!lease.settled) await this.backend.publish(lease.sessionId, 'draining').catch(() => {})
    }))
  }

  /** One round trip: renew held leases, refresh attached markers, take free watched leases. */
  async tick (): Promise<void> {
    if (this.#ticking) return
    const held = [...this.#held.values()]
    const watched = [...this.#watched.values()].filter(w => !w.acquiring)
    for (const w of this.#recorderWatches) if (w.recorder === undefined) this.#lookUpRecorder(w)
    const recorders = [...new Set([...this.#recorderWatches].flatMap(w => w.recorder === undefined || w.ending ? [] : [w.recorder]))]
    const alive = this.#recording > 0
    if (held.length === 0 && watched.length === 0 && recorders.length === 0 && !alive) return
    this.#ticking = true
    for (const w of watched) w.acquiring = true
    const watchTokens = watched.map(() => this.#token())
    const sentAt = Date.now()
    const generation = this.#aliveGeneration
    try {
      const result = await this.backend.tick({
        ttlMs: this.#o.ttlMs,
        attachedMs: this.#attachedMs(),
        renew: held,
        watch: watched.map((w, i) => ({ sessionId: w.sessionId, token: watchTokens[i] as string })),
        recorders,
        ...(alive && { aliveMs: this.#o.ttlMs })
      })
      if (alive && generation === this.#aliveGeneration) this.#aliveAt = Math.max(this.#aliveAt, sentAt)
      result.recordersAlive.forEach((alive, i) => { if (!alive) this.#endOrphans(recorders[i] as string) })
      result.renew.forEach((outcome, i) => {
        const lease = held[i] as Lease
        if (outcome === 'renewed' || lease.settled) return
        this.#o.log.warn({ outcome }, outcome === 'gone' ? 'lease: session records gone' : 'lease: another replica holds the stream now')
        lease.lose(outcome)
      })
      result.watch.forEach((outcome, i) => this.#settleWatch(watched[i] as Watch, outcome))
    } catch (err) {
      // Redis unreachable: leases run on (fencing guards the appends) and are renewed, or taken back, next tick.
      this.#o.log.warn({ err }, 'lease: renewal tick failed')
    } finally {
      this.#ticking = false
      for (const w of watched) this.#acquired(w)
    }
  }

  async close (): Promise<void> {
    clearInterval(this.#timer)
    this.#timer = undefined
    for (const watch of [...this.#watched.values()]) this.#unwatch(watch)
    for (const subscription of this.#drainSubscriptions.values()) subscription.off()
    this.#drainSubscriptions.clear()
    for (const watch of this.#recorderWatches) watch.stopped = true
    this.#recorderWatches.clear()
    // After drain: a request stream still unended here never will be; let the other replicas end it now.
    if (this.backend.shared && this.#recording > 0) {
      this.#recording = 0
      this.#aliveAt = 0
      this.#aliveGeneration++
      await this.backend.retire().catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not drop the liveness mark'))
    }
  }

  async #markAlive (): Promise<void> {
    const sentAt = Date.now()
    const generation = this.#aliveGeneration
    await this.backend.markAlive(this.#o.ttlMs)
    if (generation === this.#aliveGeneration) this.#aliveAt = Math.max(this.#aliveAt, sentAt)
  }

  /** Nothing recorded here any more: no mark left behind (a new recording sets it again, after this). */
  #dropAlive (): void {
    this.#aliveAt = 0
    this.#aliveGeneration++
    this.backend.retire().catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not drop the liveness mark'))
  }

  /** Which replica records the stream: unknown (an older gateway) or this one means nothing to watch. */
  #lookUpRecorder (watch: RecorderWatch): void {
    if (watch.looking || watch.stopped) return
    watch.looking = true
    this.backend.requestStreamRecorder(watch.sessionId, watch.streamId).then(recorder => {
      watch.looking = false
      if (recorder === undefined || recorder === this.backend.replicaId) {
        watch.stopped = true
        this.#recorderWatches.delete(watch)
      } else {
        watch.recorder = recorder
      }
    }, (err: unknown) => {
      // Tried again at the next tick.
      watch.looking = false
      this.#o.log.warn({ err }, 'lease: could not look up the recorder of a request stream')
    })
  }

  /** The replica's liveness mark is gone: end the streams it left unended that clients here wait on. */
  #endOrphans (recorder: string): void {
    for (const watch of this.#recorderWatches) {
      if (watch.recorder !== recorder || watch.ending || watch.stopped) continue
      watch.ending = true
      this.backend.endOrphanedRequestStream(watch.sessionId, watch.streamId, recorder, watch.answer).then(ended => {
        this.#recorderWatches.delete(watch)
        // Ended by someone else (its recorder, or another replica first): the usual notice ends the client.
        watch.stopped = true
        if (ended) watch.onEnded()
      }, (err: unknown) => {
        watch.ending = false
        this.#o.log.warn({ err }, 'lease: could not end a request stream whose recorder died; trying again next tick')
      })
    }
  }

  /** @internal a lease was released or lost. */
  forgetHeld (lease: Lease): void {
    if (this.#held.get(lease.sessionId) === lease) this.#held.delete(lease.sessionId)
    this.#drainSubscriptions.get(lease.sessionId)?.off()
    this.#drainSubscriptions.delete(lease.sessionId)
  }

  #hold (sessionId: string, grant: LeaseGrant): Lease {
    const lease = new Lease(this, sessionId, grant)
    this.#held.get(sessionId)?.lose('lost')
    this.#held.set(sessionId, lease)
    return lease
  }

  #onWatchControl (watch: Watch, message: ControlMessage): void {
    if (watch.stopped || message.origin === this.backend.replicaId) return
    if (message.kind === 'released') this.#tryTake(watch)
    else if (message.kind === 'draining') {
      this.backend.publish(watch.sessionId, 'want').catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not ask for a stream'))
    }
  }

  /** The holder let go: try now rather than at the next tick. */
  #tryTake (watch: Watch): void {
    if (watch.stopped) return
    if (watch.acquiring) {
      watch.askedMeanwhile = true
      return
    }
    watch.askedMeanwhile = false
    watch.acquiring = true
    this.backend.acquire(watch.sessionId, this.#token(), this.#o.ttlMs).then(
      outcome => {
        this.#settleWatch(watch, outcome)
        this.#acquired(watch)
      },
      (err: unknown) => {
        this.#o.log.warn({ err }, 'lease: could not take a released stream')
        this.#acquired(watch)
      }
    )
  }

  /**
   * An acquire for the watch is back (settled already). If the holder let go
   * while it was at Redis, it may have been answered "held" from before the
   * release: try once more now, rather than at the next tick (up to a third
   * of LEASE_TTL_MS of events missed meanwhile).
   */
  #acquired (watch: Watch): void {
    watch.acquiring = false
    if (watch.askedMeanwhile) this.#tryTake(watch)
  }

  #settleWatch (watch: Watch, outcome: AcquireResult): void {
    if (outcome !== 'gone' && !isGrant(outcome)) {
      // Held: if the holder died, its lease runs out in heldForMs; try right then rather than at a later tick.
      const delay = outcome.heldForMs + EXPIRY_SLACK_MS
      if (!watch.stopped && watch.retry === undefined && delay < this.tickMs) {
        watch.retry = setTimeout(() => {
          watch.retry = undefined
          this.#tryTake(watch)
        }, delay)
        watch.retry.unref()
      }
      return
    }
    if (outcome === 'gone') {
      if (!watch.stopped) {
        this.#unwatch(watch)
        watch.handlers.onGone()
      }
      return
    }
    if (watch.stopped || this.#draining) {
      // Nobody here needs it any more: give it back as it was.
      this.backend.release(watch.sessionId, outcome.token, outcome.takeover).catch(() => {})
      return
    }
    this.#unwatch(watch)
    watch.handlers.onGrant(this.#hold(watch.sessionId, outcome))
  }

  #unwatch (watch: Watch): void {
    if (watch.stopped) return
    watch.stopped = true
    clearTimeout(watch.retry)
    watch.control.off()
    if (this.#watched.get(watch.sessionId) === watch) this.#watched.delete(watch.sessionId)
  }

  #attachedMs (): number {
    return Math.max(1, this.#o.holdMs + this.#o.ttlMs)
  }

  #token (): string {
    return `${this.backend.replicaId}.${randomToken(12, this.#random)}`
  }
}
