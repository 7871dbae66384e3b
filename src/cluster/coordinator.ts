import { randomBytes } from 'node:crypto'
import type { FastifyBaseLogger as Logger } from 'fastify'
import { randomToken } from '../protocol/event-id.js'
import { unreachable } from '../errors.js'
import { isGrant, type Lease, type LeaseBackend, type OrphanAnswer } from './lease.js'
import { RecorderLivenessWatch } from './recorder-liveness.js'
import { HeldLeases } from './renewal.js'
import { Takeovers, type WatchHandlers } from './takeover.js'

export { Lease, type LostReason } from './lease.js'
export type { WatchHandlers } from './takeover.js'

/**
 * What asking for a session's lease gives: the lease, now this replica's;
 * `held`: another replica holds it; `gone`: the store has no record of the session.
 */
export type LeaseClaim = Lease | 'held' | 'gone'

/** What a tick's settling is reduced to, for the leases waiting on it (Lease.renewing). */
function ignore (): void {}

export interface LeaseCoordinatorOptions {
  readonly backend: LeaseBackend
  /** LEASE_TTL_MS: a dead holder's lease is free after this; renewed every third of it. */
  readonly ttlMs: number
  /** STANDALONE_HOLD_SECONDS: how long after its last client anywhere a holder keeps the upstream GET. */
  readonly holdMs: number
  readonly log: Logger
  readonly random?: (size: number) => Uint8Array
}

/**
 * Replica coordination for upstream GETs, over three parts that share one
 * tick (every ttl/3, one batched round trip whatever the session and stream
 * count): the leases this replica holds and renews (renewal.ts), the
 * sessions it watches to take over when the holder dies or lets go
 * (takeover.ts), and the liveness of request stream recorders
 * (recorder-liveness.ts).
 */
export class LeaseCoordinator {
  readonly backend: LeaseBackend
  readonly #o: LeaseCoordinatorOptions
  readonly #random: (size: number) => Uint8Array
  readonly #held: HeldLeases
  readonly #takeovers: Takeovers
  readonly #recorders: RecorderLivenessWatch
  #timer: NodeJS.Timeout | undefined
  #ticking = false

  constructor (options: LeaseCoordinatorOptions) {
    this.#o = options
    this.backend = options.backend
    this.#random = options.random ?? randomBytes
    const { backend, log, ttlMs } = options
    const tickMs = this.tickMs
    this.#held = new HeldLeases(backend, log)
    this.#takeovers = new Takeovers({ backend, held: this.#held, log, ttlMs, tickMs, attachedMs: this.#attachedMs, token: () => this.#token() })
    this.#recorders = new RecorderLivenessWatch({ backend, log, ttlMs, tickMs })
  }

  get heldCount (): number { return this.#held.size }
  get watchedCount (): number { return this.#takeovers.size }
  /** LEASE_TTL_MS. */
  get ttlMs (): number { return this.#o.ttlMs }
  // A third of the lease: two renewals may fail before it lapses. The floor only
  // matters for tests' leases (LEASE_TTL_MS is at least 500).
  get tickMs (): number { return Math.max(100, Math.floor(this.#o.ttlMs / 3)) }
  /** How long an attached marker holds the stream after its last refresh (the hold, and a lease's time to notice). */
  get #attachedMs (): number { return Math.max(1, this.#o.holdMs + this.#o.ttlMs) }

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
    return this.#recorders.record(sessionId, streamId)
  }

  /**
   * A client here waits on a request stream. If another replica records it
   * and dies (its liveness mark runs out, LEASE_TTL_MS), the next tick ends
   * the stream with `answer` (every follower sees the end as usual) and calls
   * `onEnded` on the replica that did. Returns the function that stops.
   */
  watchRequestStream (sessionId: string, streamId: string, answer: OrphanAnswer, onEnded: () => void): () => void {
    if (!this.backend.shared) return () => {}
    return this.#recorders.watch(sessionId, streamId, answer, onEnded)
  }

  /** Take the session's lease now if it is free. */
  async acquire (sessionId: string): Promise<LeaseClaim> {
    const result = await this.backend.acquire(sessionId, this.#token(), this.#o.ttlMs)
    if (result === 'gone') return result
    return isGrant(result) ? this.#held.hold(sessionId, result) : 'held'
  }

  /**
   * Make a lease the store lost with the session's records ours again, now
   * that the session is recorded again, with the same token: the appends its
   * holder is making, fenced with that token, stay valid. The recording took
   * the lease already if it was free (EventStore.adoptSession's hold); this
   * renewal takes it if not yet, at once rather than at the next tick, and
   * tells which. The lease itself, or one held under the same token if this
   * replica had let it go ('gone' at a tick); 'held' when another replica
   * took it meanwhile.
   */
  async reacquire (lease: Lease): Promise<LeaseClaim> {
    const { sessionId, token } = lease
    // A renewal: it takes back a lease nobody holds, and keeps one this token holds.
    const renewing = this.backend.tick({ ttlMs: this.#o.ttlMs, attachedMs: this.#attachedMs, renew: [{ sessionId, token }], watch: [] })
    const settled = renewing.then(ignore, ignore)
    lease.renewing(settled)
    const { renew: [result] } = await renewing.finally(() => { lease.renewalDone(settled) })
    if (result === undefined) throw new Error('lease: a renewal without its result')
    switch (result) {
      case 'gone':
        return 'gone'
      case 'lost':
        return 'held'
      // 'moved' is renewed or taken back too, the record naming another upstream session than
      // the holder reads. This renewal does not say which one it reads, so it is not answered
      // here; were it, the lease is this token's all the same: the holder's next renewal, which
      // says, reports the move and its GET follows the record (LeaseHolder.moved).
      case 'renewed':
      case 'moved':
        return lease.settled ? this.#held.hold(sessionId, { token, takeover: false, lastUpstreamId: lease.lastUpstreamId }) : lease
      default:
        return unreachable(result)
    }
  }

  /**
   * A client of the session is attached here and another replica holds its
   * stream: keep an attached marker up (so the holder keeps its upstream GET)
   * and take the lease when it frees up. Returns the function that stops.
   */
  watch (sessionId: string, handlers: WatchHandlers): () => void {
    return this.#takeovers.watch(sessionId, handlers)
  }

  /**
   * Shutting down: no new watches, and each held stream goes to the first
   * replica that asks (`want`); watchers that exist already are told now.
   */
  async beginDrain (): Promise<void> {
    this.#takeovers.drain()
    await this.#held.beginDrain()
  }

  /** One round trip: renew held leases, refresh attached markers, take free watched leases, check recorders. */
  async tick (): Promise<void> {
    if (this.#ticking) return
    const held = this.#held.list()
    const watched = this.#takeovers.due()
    const recorders = this.#recorders.due()
    if (held.length === 0 && watched.length === 0 && recorders.recorders.length === 0 && !recorders.alive) return
    this.#ticking = true
    const watchTokens = watched.map(() => this.#token())
    const sentAt = Date.now()
    const ticking = this.backend.tick({
      ttlMs: this.#o.ttlMs,
      attachedMs: this.#attachedMs,
      renew: held,
      watch: watched.map((w, i) => ({ sessionId: w.sessionId, token: watchTokens[i] as string })),
      recorders: recorders.recorders,
      ...(recorders.alive && { aliveMs: this.#o.ttlMs })
    })
    // A release of one of these leases waits for the tick (Lease.renewing).
    const settled = ticking.then(ignore, ignore)
    for (const lease of held) lease.renewing(settled)
    try {
      const result = await ticking
      this.#recorders.settled(recorders, sentAt, result.recordersAlive)
      this.#held.renewed(held, result.renew)
      this.#takeovers.settled(watched, result.watch)
    } catch (err) {
      // Redis unreachable: leases run on (fencing guards the appends) and are renewed, or taken back, next tick.
      this.#o.log.warn({ err }, 'lease: renewal tick failed')
    } finally {
      for (const lease of held) lease.renewalDone(settled)
      this.#ticking = false
      this.#takeovers.done(watched)
    }
  }

  async close (): Promise<void> {
    clearInterval(this.#timer)
    this.#timer = undefined
    this.#takeovers.close()
    this.#held.close()
    await this.#recorders.close()
  }

  #token (): string {
    return `${this.backend.replicaId}.${randomToken(12, this.#random)}`
  }
}
