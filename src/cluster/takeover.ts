import type { FastifyBaseLogger as Logger } from 'fastify'
import { isGrant, type AcquireResult, type ControlMessage, type ControlSubscription, type Lease, type LeaseBackend } from './lease.js'
import type { HeldLeases } from './renewal.js'

/** A watcher tries again this long after the holder's lease would expire (clock skew inside Redis is nil). */
const EXPIRY_SLACK_MS = 20

export interface WatchHandlers {
  /** The lease was free and is now this replica's: open the upstream GET (or release it). */
  readonly onGrant: (lease: Lease) => void
  /** The store has no record of the session any more. */
  readonly onGone: () => void
}

/**
 * A watch's tries for the lease: none at Redis (`idle`), one at Redis
 * (`acquiring`), one at Redis and another asked for meanwhile
 * (`acquiring_again`: a `released` notice, or the retry at the holder's
 * expiry, came while it was there; it may have run before the release and
 * found the lease held, so another follows it), or the watch is over.
 */
type Attempt = 'idle' | 'acquiring' | 'acquiring_again' | 'stopped'

interface Watch {
  readonly sessionId: string
  readonly handlers: WatchHandlers
  readonly control: ControlSubscription
  attempt: Attempt
  /** Another try right when the holder's lease runs out, when that comes before the next tick. */
  retry: NodeJS.Timeout | undefined
}

export interface TakeoversOptions {
  readonly backend: LeaseBackend
  readonly held: HeldLeases
  readonly log: Logger
  readonly ttlMs: number
  readonly tickMs: number
  readonly attachedMs: number
  /** A fresh lease token. */
  readonly token: () => string
}

/**
 * Sessions whose clients are attached here while another replica holds the
 * stream: an attached marker keeps the holder's upstream GET open, and the
 * lease is taken when the holder dies (its lease expires, found by the tick
 * or right at its expiry) or lets go (a `released` message).
 */
export class Takeovers {
  readonly #o: TakeoversOptions
  readonly #watched = new Map<string, Watch>()
  #draining = false

  constructor (options: TakeoversOptions) {
    this.#o = options
  }

  get size (): number { return this.#watched.size }

  /** Watches the tick takes the lease for, if free (none already at Redis): marked as acquiring. */
  due (): Watch[] {
    const watched = [...this.#watched.values()].filter(w => w.attempt === 'idle')
    for (const w of watched) w.attempt = 'acquiring'
    return watched
  }

  /** What the tick found for each of `watched`; then each is free for another try. */
  settled (watched: readonly Watch[], outcomes: readonly AcquireResult[]): void {
    outcomes.forEach((outcome, i) => this.#settle(watched[i] as Watch, outcome))
  }

  /** The tick is over for `watched` (answered or not). */
  done (watched: readonly Watch[]): void {
    for (const w of watched) this.#acquired(w)
  }

  watch (sessionId: string, handlers: WatchHandlers): () => void {
    if (this.#draining) return () => {}
    const backend = this.#o.backend
    const existing = this.#watched.get(sessionId)
    if (existing !== undefined) this.#unwatch(existing)
    const watch: Watch = {
      sessionId,
      handlers,
      attempt: 'idle',
      retry: undefined,
      control: backend.subscribeControl(sessionId, message => this.#onControl(watch, message))
    }
    this.#watched.set(sessionId, watch)
    backend.markAttached(sessionId, this.#o.attachedMs).catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not mark a client attached'))
    // A draining holder hands the stream over to the first replica that asks.
    watch.control.ready
      .then(async () => { if (watch.attempt !== 'stopped') await backend.publish(sessionId, 'want') })
      .catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not ask for a stream'))
    // Learn when the holder's lease runs out (it may be dead already).
    this.#tryTake(watch)
    return () => this.#unwatch(watch)
  }

  /** No new watches; the existing ones stop. */
  drain (): void {
    this.#draining = true
    this.close()
  }

  close (): void {
    for (const watch of [...this.#watched.values()]) this.#unwatch(watch)
  }

  #onControl (watch: Watch, message: ControlMessage): void {
    if (watch.attempt === 'stopped' || message.origin === this.#o.backend.replicaId) return
    if (message.kind === 'released') this.#tryTake(watch)
    else if (message.kind === 'draining') {
      this.#o.backend.publish(watch.sessionId, 'want').catch((err: unknown) => this.#o.log.warn({ err }, 'lease: could not ask for a stream'))
    }
  }

  /** The holder let go: try now rather than at the next tick. */
  #tryTake (watch: Watch): void {
    if (watch.attempt === 'stopped') return
    if (watch.attempt !== 'idle') {
      watch.attempt = 'acquiring_again'
      return
    }
    watch.attempt = 'acquiring'
    this.#o.backend.acquire(watch.sessionId, this.#o.token(), this.#o.ttlMs).then(
      outcome => {
        this.#settle(watch, outcome)
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
    if (watch.attempt === 'stopped') return
    const again = watch.attempt === 'acquiring_again'
    watch.attempt = 'idle'
    if (again) this.#tryTake(watch)
  }

  #settle (watch: Watch, outcome: AcquireResult): void {
    if (outcome !== 'gone' && !isGrant(outcome)) {
      // Held: if the holder died, its lease runs out in heldForMs; try right then rather than at a later tick.
      const delay = outcome.heldForMs + EXPIRY_SLACK_MS
      if (watch.attempt !== 'stopped' && watch.retry === undefined && delay < this.#o.tickMs) {
        watch.retry = setTimeout(() => {
          watch.retry = undefined
          this.#tryTake(watch)
        }, delay)
        watch.retry.unref()
      }
      return
    }
    if (outcome === 'gone') {
      if (watch.attempt !== 'stopped') {
        this.#unwatch(watch)
        watch.handlers.onGone()
      }
      return
    }
    if (watch.attempt === 'stopped' || this.#draining) {
      // Nobody here needs it any more: give it back as it was.
      this.#o.backend.release(watch.sessionId, outcome.token, outcome.takeover).catch(() => {})
      return
    }
    this.#unwatch(watch)
    watch.handlers.onGrant(this.#o.held.hold(watch.sessionId, outcome))
  }

  #unwatch (watch: Watch): void {
    if (watch.attempt === 'stopped') return
    watch.attempt = 'stopped'
    clearTimeout(watch.retry)
    watch.control.off()
    if (this.#watched.get(watch.sessionId) === watch) this.#watched.delete(watch.sessionId)
  }
}
