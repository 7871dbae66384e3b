/**
 * The lease on a session's upstream GET (docs/replicas.md): exactly one
 * replica at a time holds it and feeds the standalone stream; the others
 * follow the store. This file is the contract between the coordination logic
 * (coordinator.ts, store-agnostic) and a backend: Redis (store/redis/
 * lease-backend.ts, shared by every replica) or the local one below (one
 * process, the embedded store).
 */

/** What a replica learns when it takes a session's lease. */
export interface LeaseGrant {
  /** Fencing token: appends to the standalone stream carry it (AppendOptions.fence). */
  readonly token: string
  /**
   * The previous holder did not end its upstream GET cleanly (it died, handed
   * the stream over while draining, or lost its lease): whatever the upstream
   * sent meanwhile never reached the store, unless the upstream resumes.
   */
  readonly takeover: boolean
  /** The upstream's own id of the last event recorded on the standalone stream, when it issues ids. */
  readonly lastUpstreamId: string | undefined
}

/** Another replica holds the lease, for this long at most unless it renews. */
export interface HeldElsewhere { readonly heldForMs: number }
/** `gone`: the store has no record of the session. */
export type AcquireResult = LeaseGrant | HeldElsewhere | 'gone'

export function isGrant (result: AcquireResult): result is LeaseGrant {
  return typeof result === 'object' && 'token' in result
}
/**
 * What a release unless a client is attached elsewhere did: `released`;
 * `lost`, the lease was not held under the token; `attached`, kept for a
 * client attached on another replica, to be asked again after `askAgainMs`.
 */
export type IdleRelease =
  | { readonly kind: 'released' }
  | { readonly kind: 'lost' }
  | { readonly kind: 'attached', readonly askAgainMs: number }

export const IDLE_RELEASED: IdleRelease = Object.freeze({ kind: 'released' })
export const IDLE_LOST: IdleRelease = Object.freeze({ kind: 'lost' })

/** `moved`: renewed, but the session's record names another upstream session than its holder reads. */
export type RenewResult = 'renewed' | 'moved' | 'lost' | 'gone'

export interface TickRequest {
  readonly ttlMs: number
  /** How long an attached marker keeps a holder's upstream GET open (hold + ttl). */
  readonly attachedMs: number
  /**
   * Leases this replica holds: renewed by compare-and-pexpire. With the
   * upstream session id its holder reads, when the backend is to say that
   * the session's record moved elsewhere ('moved').
   */
  readonly renew: ReadonlyArray<{ readonly sessionId: string, readonly token: string, readonly upstreamSessionId?: string | undefined }>
  /**
   * Sessions with a client here whose lease this replica does not hold: the
   * attached marker is refreshed and the lease taken when it is free (the
   * holder died and it expired).
   */
  readonly watch: ReadonlyArray<{ readonly sessionId: string, readonly token: string }>
  /** Refresh this replica's liveness mark for this long (see RecorderLiveness). */
  readonly aliveMs?: number
  /** Replicas recording request streams that clients here wait on: are they alive? */
  readonly recorders?: readonly string[]
}

export interface TickResult {
  /** One per `renew` entry, same order. */
  readonly renew: RenewResult[]
  /** One per `watch` entry, same order. */
  readonly watch: AcquireResult[]
  /** One per `recorders` entry, same order: false once the replica's liveness mark is gone. */
  readonly recordersAlive: boolean[]
}

/** The event that ends a request stream whose recorder died: the gateway's error answer (or a gap marker). */
export interface OrphanAnswer {
  readonly data: string
  readonly event?: string | undefined
}

/**
 * Request streams have no lease: exactly one replica records each (the one
 * that got the POST), and a client resuming on another replica only follows
 * the store. So that a recorder's death does not leave such clients waiting
 * for their timeout, the recorder's replica id is kept with the stream and
 * every replica keeps a liveness mark (refreshed in the lease tick, one key
 * per replica, whatever the number of streams). A replica whose client waits
 * on a stream whose recorder's mark is gone ends the stream with `OrphanAnswer`.
 */
export interface RecorderLiveness {
  /** Note this replica as the recorder of a request stream (before it records anything). */
  claimRequestStream (sessionId: string, streamId: string): Promise<void>
  /** The replica recording the stream; undefined when unknown (no record, or an older gateway recorded it). */
  requestStreamRecorder (sessionId: string, streamId: string): Promise<string | undefined>
  /**
   * Atomically: when the stream is not ended and `recorder` still records it,
   * append `answer`, mark the stream ended and notify its followers. True when
   * this call ended it; false when there was nothing to do (ended already, by
   * its recorder or by another replica that got there first).
   */
  endOrphanedRequestStream (sessionId: string, streamId: string, recorder: string, answer: OrphanAnswer): Promise<boolean>
  /** Refresh this replica's liveness mark now (the tick does it too, with `aliveMs`). */
  markAlive (ms: number): Promise<void>
  /** Shutting down: drop the liveness mark, so streams left unended are ended by others at once. */
  retire (): Promise<void>
}

/**
 * `released`: the holder let the lease go (takers, now); `want`: a replica
 * with a client wants the stream (a draining holder hands it over);
 * `draining`: the holder is shutting down (watchers answer with `want`).
 */
export const CONTROL_KINDS = ['released', 'want', 'draining'] as const
export type ControlKind = typeof CONTROL_KINDS[number]
export interface ControlMessage { readonly kind: ControlKind, readonly origin: string }
export type ControlListener = (message: ControlMessage) => void
export interface ControlSubscription {
  /** Settles once messages published from now on will arrive. */
  readonly ready: Promise<void>
  off (): void
}

/** Lease primitives. Every call is one round trip at most; `tick` is one for everything. */
export interface LeaseBackend extends RecorderLiveness {
  readonly replicaId: string
  /** Other processes share these leases (Redis); false for the local one. */
  readonly shared: boolean
  acquire (sessionId: string, token: string, ttlMs: number): Promise<AcquireResult>
  tick (request: TickRequest): Promise<TickResult>
  /** `live`: the stream did not end cleanly (the next holder marks a gap). False when not held under `token`. */
  release (sessionId: string, token: string, live: boolean): Promise<boolean>
  /** Release unless a client is attached on another replica (the hold expired here). */
  releaseIfIdle (sessionId: string, token: string): Promise<IdleRelease>
  /** Tell holders a client is attached here, for `ms`. */
  markAttached (sessionId: string, ms: number): Promise<void>
  /**
   * The upstream's last event id on the standalone stream (Redis keeps it
   * with the events already); '' forgets it (the session moved to another
   * upstream session, which never issued it; Redis forgets it with the move).
   */
  noteUpstreamId (sessionId: string, id: string): void
  /** The session is gone: forget what is kept about it. */
  forget (sessionId: string): void
  subscribeControl (sessionId: string, listener: ControlListener): ControlSubscription
  publish (sessionId: string, kind: ControlKind): Promise<void>
}

export type LostReason = Exclude<RenewResult, 'renewed' | 'moved'>

/** How the upstream GET held under a lease ended, for the next holder: `unclean` leaves it a gap to mark. */
export type UpstreamGetEnd = 'clean' | 'unclean'

/** What a Lease needs from the replica that holds it. */
export interface LeaseOwner {
  readonly backend: LeaseBackend
  /** The lease was released or lost: stop renewing it. */
  forgetHeld: (lease: Lease) => void
}

/** What a lease tells the pump that holds it (Lease.hold). */
export interface LeaseHolder {
  /** Renewal found the lease held by another replica ('lost') or the session gone. */
  readonly lost: (reason: LostReason) => void
  /**
   * Renewal found the session's record at another upstream session than the
   * one followed (established upstream again, maybe by another replica): the
   * lease is still held, its upstream GET is to follow.
   */
  readonly moved: () => void
  /** While draining: another replica asked for the stream. */
  readonly handoverRequested: () => void
}

/**
 * A lease this replica holds. The pump that uses it holds it (hold).
 *
 * Ownership: whoever gets a Lease (LeaseCoordinator.acquire or reacquire, a
 * watch's grant) owns it, and hands it to the StandalonePump it starts
 * (PumpOptions.lease); a lease that no pump takes, or that its pump refused,
 * goes back (giveBack) from its owner. A pump whose session moved upstream
 * hands its lease to the pump that opens the new placement's GET
 * (StandalonePump.moveAway): from then on it is that pump's alone, and the
 * old pump neither releases it nor notes an upstream event id on it. Until
 * it is released or lost it is renewed at every tick: a lease nobody
 * releases holds the stream for good.
 */
export class Lease implements LeaseGrant {
  readonly sessionId: string
  readonly token: string
  readonly takeover: boolean
  readonly lastUpstreamId: string | undefined
  /** Told what renewals find; set by the pump that holds the lease (hold). */
  #holder: LeaseHolder | undefined
  #upstreamSessionId: string | undefined
  readonly #owner: LeaseOwner
  /**
   * held: renewed at every tick. releasing: a release-if-idle is at the store;
   * left out of ticks until its reply, since a renewal sent behind it would take
   * the lease back. settled: released or lost.
   */
  #state: 'held' | 'releasing' | 'settled' = 'held'
  /**
   * The tick renewing this lease, while it is at the store (settles either
   * way). A release waits for it: on Cluster, ioredis sends a pipeline's
   * commands again after a failover (CLUSTERDOWN, TRYAGAIN, MOVED, a closed
   * connection) or a script's after NOSCRIPT, and a renewal sent again behind
   * the release's DEL would take the lease back.
   */
  #renewal: Promise<void> | undefined

  constructor (owner: LeaseOwner, sessionId: string, grant: LeaseGrant) {
    this.#owner = owner
    this.sessionId = sessionId
    this.token = grant.token
    this.takeover = grant.takeover
    this.lastUpstreamId = grant.lastUpstreamId
  }

  /** No longer held (released, found lost). */
  get settled (): boolean { return this.#state === 'settled' }

  /** Whether a tick renews it now (held, and no release at the store). */
  get renewable (): boolean { return this.#state === 'held' }

  noteUpstreamId (id: string): void {
    this.#owner.backend.noteUpstreamId(this.sessionId, id)
  }

  /**
   * Let the lease go and tell the session's channel, so a replica with a
   * client takes over at once. `unclean`: the upstream GET did not end
   * cleanly, the next holder marks a gap. Only the first release or loss counts.
   */
  async release (end: UpstreamGetEnd): Promise<void> {
    if (!this.#settle()) return
    await this.#renewal
    await this.#owner.backend.release(this.sessionId, this.token, end === 'unclean')
  }

  /** A tick renewing this lease is at the store until `tick` settles (it must not reject). */
  renewing (tick: Promise<void>): void {
    this.#renewal = tick
  }

  /** That tick settled. */
  renewalDone (tick: Promise<void>): void {
    if (this.#renewal === tick) this.#renewal = undefined
  }

  /**
   * Give back a lease that was not used (the upstream GET refused or failed,
   * a takeover declined): a gap the previous holder left stays owed.
   */
  async giveBack (): Promise<void> {
    await this.release(this.takeover ? 'unclean' : 'clean')
  }

  /** The hold expired here: release unless a client is attached on another replica. */
  async releaseIfIdle (): Promise<IdleRelease> {
    if (this.#state !== 'held') return IDLE_LOST
    this.#state = 'releasing'
    let result: IdleRelease
    try {
      await this.#renewal
      result = await this.#owner.backend.releaseIfIdle(this.sessionId, this.token)
    } catch (err) {
      if (this.#state === 'releasing') this.#state = 'held'
      throw err
    }
    if (result.kind !== 'attached') this.#settle()
    else if (this.#state === 'releasing') this.#state = 'held'
    return result
  }

  /**
   * The pump holding the lease from now on, and the upstream session its GET
   * goes to: a pump that takes the lease over (moveAway) holds it anew.
   */
  hold (holder: LeaseHolder, upstreamSessionId: string | undefined): void {
    this.#holder = holder
    this.#upstreamSessionId = upstreamSessionId
  }

  /** The holder read the session's record again: its GET goes to this upstream session. */
  follow (upstreamSessionId: string): void {
    this.#upstreamSessionId = upstreamSessionId
  }

  /** The upstream session renewals compare with the record. Undefined: not compared. */
  get upstreamSessionId (): string | undefined {
    return this.#upstreamSessionId
  }

  /** Renewal found the lease lost (another holder, or the session gone). */
  lose (reason: LostReason): void {
    if (this.#settle()) this.#holder?.lost(reason)
  }

  /** Renewal found the record at another upstream session than the one followed. */
  tellMoved (): void {
    this.#holder?.moved()
  }

  /** While draining: another replica asked for the stream. */
  tellHandoverRequest (): void {
    this.#holder?.handoverRequested()
  }

  #settle (): boolean {
    if (this.#state === 'settled') return false
    this.#state = 'settled'
    this.#owner.forgetHeld(this)
    return true
  }
}
