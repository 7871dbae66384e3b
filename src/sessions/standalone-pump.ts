import type { Readable } from 'node:stream'
import type { FastifyBaseLogger as Logger } from 'fastify'
import type { Lease, LeaseClaim, LostReason } from '../cluster/coordinator.js'
import { LeaseLostError, SessionGoneError } from '../errors.js'
import type { EventStore, SessionRecord, StreamState, UpstreamPlacement } from '../store/contract.js'
import { errors, unreachable } from '../errors.js'
import { sameUpstreamSession, sessionRequest } from '../upstream/session-request.js'
import { STANDALONE_STREAM } from '../store/contract.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import { discardBody, UpstreamAbort, type UpstreamClient, type UpstreamResponse } from '../upstream/client.js'
import { mediaType } from '../upstream/headers.js'
import type { ReadAheadBudget } from '../recording/read-ahead.js'
import { isResumableUpstreamId } from '../protocol/upstream-event-id.js'
import { recordUpstreamStream } from '../recording/recorder.js'
import type { LiveClients } from '../recording/live-clients.js'
import type { RecordOutcome } from '../recording/record-outcome.js'
import { upstreamHandoverGap } from '../recording/gap-markers.js'
import type { ResumeBounds } from '../recording/upstream-resume.js'

/**
 * Why a pump stopped. `refused`: the upstream GET never opened (the caller
 * has the answer); `handed_over`: drain gave the stream to another replica;
 * `lease_lost`: another replica holds the stream now (fencing); `moved`: the
 * session was established upstream again (another upstream session id), and
 * the holder goes on there under the same lease.
 */
export type PumpOutcome = RecordOutcome | 'refused' | 'hold_expired' | 'stopped' | 'handed_over' | 'moved'

export interface PumpOptions {
  readonly upstream: UpstreamClient
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly sessionId: string
  /** The session's record (where it lives upstream now): read at each open and resume. Null: the session is gone. */
  readonly placement: () => Promise<SessionRecord | null>
  readonly path: string
  readonly holdMs: number
  /**
   * The hold while no client has attached here yet (the GET opened at
   * initialize): a session whose client never asks for its stream stops
   * costing the upstream a connection after this long, not holdMs.
   */
  readonly earlyHoldMs: number
  readonly maxEventBytes: number
  readonly readAhead: ReadAheadBudget
  /** How far the upstream GET is reopened when the upstream ends it. */
  readonly resumeBounds: ResumeBounds
  /**
   * The session's lease, held by this replica: appends are fenced with its
   * token. The pump owns it from then on and releases it when it stops, save
   * after 'refused' (the upstream GET never opened), when it stays the caller's,
   * and after 'moved' (moveAway), when it is the next pump's, on which this one
   * writes nothing more.
   */
  readonly lease: Lease
  /**
   * The upstream GET goes to an upstream session other than the one the
   * lease was recording (the pump before it was moved there): the lease's
   * last upstream event id is not this session's, so the GET opens afresh,
   * and no handover gap is recorded (the previous pump stopped reading a
   * session that was abandoned, not a stream cut in the middle).
   */
  readonly newUpstreamSession?: boolean
  /**
   * The GET opens resuming from the lease's last upstream event id
   * (STANDALONE_REOPEN_FROM_LAST_ID, never for a new upstream session); else
   * afresh, and a takeover records a handover gap. Off by default: the event
   * stores of widespread servers file a GET resumed on the standalone stream
   * under no stream, and the upstream then sends nothing on it. A GET the
   * upstream ended itself is resumed from its last id all the same (#resume).
   */
  readonly reopenFromLastId: boolean
  /**
   * The store lost the session while its upstream GET is open: record it
   * again for the principal of its last record, toward the upstream session
   * that GET goes to. False when it is not to be (see SessionRecovery).
   */
  readonly recoverSession?: SessionRecovery
  /** Take a lease lost with the store again, with its token (LeaseCoordinator.reacquire). */
  readonly reacquire: (lost: Lease) => Promise<LeaseClaim>
  /** The client connections attached to the standalone stream in this process. */
  readonly clients: PumpClients
  /** Called once when the pump stops for good. */
  readonly onStop: (outcome: PumpOutcome) => void
  /**
   * The lease's renewal found the session's record at another upstream
   * session than the one this pump's GET goes to: established upstream
   * again, by another replica (this one's re-establishments move the pump
   * at once). The holder moves the GET (StandaloneHolder.follow).
   */
  readonly onMoved?: () => void
}

/** The session in this process as the pump sees it: its standalone stream's clients here, and what its GETs carry. */
export interface PumpClients extends LiveClients {
  /** How many are attached here (0 or 1). */
  localClients: () => number
  /** A DELETE of the session is on its way upstream: an end of the upstream GET now is the DELETE's. */
  readonly deleting: boolean
  /**
   * The headers of the session's latest request here that passed its
   * principal check (LocalSession.headers), read at each opening and resume
   * of the upstream GET: credentials the client refreshed since the GET
   * opened reach the upstream, not the ones it opened with.
   */
  readonly headers: Record<string, string | string[]> | undefined
}

/**
 * Records a session the store lost again, for the principal and toward the
 * upstream placement of `record` (its last record known here), if that may
 * be done (recovery on, a real loss, the id bound to that principal). The
 * upstream still answering the session's GET is its confirmation. The
 * standalone stream's lease is taken with the record under `leaseToken`,
 * the token of the pump whose GET is open (EventStore.adoptSession).
 */
export type SessionRecovery = (sessionId: string, record: SessionRecord, log: Logger, leaseToken: string) => Promise<boolean>

/** Where a pump is: its upstream GET being opened, recorded, or stopped (and how). */
type PumpPhase =
  | { readonly kind: 'opening', readonly lost?: LostReason }
  | { readonly kind: 'recording' }
  | { readonly kind: 'stopped', readonly outcome: PumpOutcome }

/** What a pump's end means for what it held: its lease (with its place), and the client attached here. */
interface OutcomeRule {
  /**
   * `clean`: released, the upstream GET ended cleanly (the next holder owes
   * clients no gap marker); `unclean`: released, the next holder marks a gap;
   * `caller`: kept by whoever started the pump, who may try again (a refusal),
   * with the session's place; `next_pump`: handed, with the place, to the
   * pump that follows the session to its new placement (moveAway).
   */
  readonly lease: 'clean' | 'unclean' | 'caller' | 'next_pump'
  /**
   * `reconnect`: the client's stream is closed, and its reconnect reopens the
   * upstream GET; `follow_store`: another replica holds (or may take) the
   * stream, the client here follows the store; `as_is`: left alone (closed by
   * whoever stopped the pump, or kept for the next pump).
   */
  readonly client: 'reconnect' | 'follow_store' | 'as_is'
}

/** The rule of each outcome: one row each, complete by type. */
export const PUMP_OUTCOMES = {
  completed: { lease: 'clean', client: 'reconnect' },
  session_gone: { lease: 'clean', client: 'reconnect' },
  // dropSession closes the clients itself, with its own outcome (session_deleted).
  stopped: { lease: 'clean', client: 'as_is' },
  upstream_error: { lease: 'unclean', client: 'reconnect' },
  aborted: { lease: 'unclean', client: 'reconnect' },
  event_too_large: { lease: 'unclean', client: 'reconnect' },
  lease_lost: { lease: 'unclean', client: 'follow_store' },
  hold_expired: { lease: 'unclean', client: 'follow_store' },
  // The drain closes the clients, with their retry hint.
  handed_over: { lease: 'unclean', client: 'as_is' },
  refused: { lease: 'caller', client: 'as_is' },
  moved: { lease: 'next_pump', client: 'as_is' }
} as const satisfies Record<PumpOutcome, OutcomeRule>

/** Whether the pump's lease, and the session's place, were let go at its end (not kept by its starter or handed on). */
export function releasedAt (outcome: PumpOutcome): boolean {
  const { lease } = PUMP_OUTCOMES[outcome]
  return lease === 'clean' || lease === 'unclean'
}

/** What a pump's promise fields start as: one for every pump, not three each (48 bytes apiece). */
const SETTLED: Promise<void> = Promise.resolve()

/**
 * Holds a session's one upstream GET stream, under the session's lease, and
 * records everything it carries, also while no client is attached: a client
 * reconnecting after a drop, here or on another replica, finds the gap's
 * events in the store. Once no client has been attached anywhere for
 * `holdMs` the upstream GET is released.
 */
export class StandalonePump {
  readonly #o: PumpOptions
  readonly #abort = new UpstreamAbort()
  #holdTimer: NodeJS.Timeout | undefined
  /**
   * opening: its upstream GET not answered yet; recording: the GET open and
   * recorded (from then on a lost lease stops the pump, or has the session
   * recorded again); stopped: for good.
   */
  #phase: PumpPhase = { kind: 'opening' }
  /** A client attached here since the GET opened: from then on the hold is holdMs. */
  #clientSeen = false
  #released: Promise<void> = SETTLED
  /** The lease the stream is held under: another, same token, once the store lost the session (#recoverOnce). */
  #lease: Lease
  /** The session's record as last read: whose it is, and where its upstream GET goes. */
  #record: SessionRecord | undefined
  /** Recoveries from a store loss, one after the other. */
  #recoveries: Promise<unknown> = SETTLED
  /** The stream's state in the epoch a recovery the lease's renewal started moved it to, until the recorder takes it. */
  #moved: StreamState | undefined
  /** Recoveries and hold releases in flight on the lease (see movable), and the latest's end. */
  #leaseWork = 0
  #leaseWorkSettled: Promise<void> = SETTLED
  /** The epoch the recorder was last moved to (undefined: the one it started in). */
  #recorderEpoch: string | undefined

  constructor (options: PumpOptions) {
    this.#o = options
    this.#lease = options.lease
    this.#useLease(options.lease)
  }

  get stopped (): boolean { return this.#phase.kind === 'stopped' }
  /**
   * Moved away: the lease is the next pump's, which opened the new upstream
   * session's GET, and nothing this pump's recording still finishes (an
   * append in flight) may write on it: an upstream event id of the old
   * session, noted after the next pump forgot it, would be sent to the new
   * session as the point to resume from.
   */
  get #handedOn (): boolean { return this.#phase.kind === 'stopped' && this.#phase.outcome === 'moved' }
  get lease (): Lease { return this.#lease }
  /** Where the upstream GET goes (the record as last read for it); undefined before the first read. */
  get placement (): UpstreamPlacement | undefined { return this.#record }

  /**
   * Open the upstream GET (resuming the upstream's own stream when the
   * lease knows its last id). Returns null when the pump runs; otherwise the
   * upstream's answer (405, 404, 409, an error...) for the caller to pass
   * through. The lease stays the caller's to release when it is refused.
   */
  async open (): Promise<UpstreamResponse | null> {
    const { log, metrics } = this.#o
    const lease = this.#lease
    const lastId = this.#o.reopenFromLastId ? lease.lastUpstreamId : undefined
    let resuming = lastId !== undefined && isResumableUpstreamId(lastId)
    if (lastId !== undefined && !resuming) {
      // Sent as Last-Event-ID it would fail every GET (502 on each client retry): open afresh.
      metrics.upstreamErrors.inc({ kind: 'unresumable_id' })
      log.warn('the upstream\'s last event id cannot go back in a Last-Event-ID header: its GET stream is opened afresh')
    }
    let res = await this.#request(resuming ? { ...this.#headers, 'last-event-id': lastId as string } : this.#headers)
    if (resuming && !this.stopped && res.statusCode >= 400 && res.statusCode !== 404 && res.statusCode !== 405) {
      // The upstream cannot resume from that id (it forgot it, restarted...): open afresh.
      discardBody(res.body)
      resuming = false
      res = await this.#request(this.#headers)
    }
    if (res.statusCode !== 200 || mediaType(res.headers['content-type']) !== 'text/event-stream') {
      this.#stop('refused')
      return res
    }
    return await this.#start(res, resuming)
  }

  /** The end-to-end headers of the upstream GET, as the session's latest request here has them (PumpClients.headers). */
  get #headers (): Record<string, string | string[]> {
    return this.#o.clients.headers ?? {}
  }

  async #request (headers: Record<string, string | string[]>): Promise<UpstreamResponse> {
    const placement = await this.#o.placement().catch((err: unknown) => { this.#stop('refused'); throw errors.storeUnavailable(err) })
    if (placement === null) {
      this.#stop('refused')
      throw errors.sessionNotFound()
    }
    this.#read(placement)
    try {
      return await this.#get(placement, headers)
    } catch (err) {
      this.#stop('refused')
      throw err
    }
  }

  /** The upstream GET at `placement`, timed and its failure counted (both ways it is opened: #request and #resume). */
  async #get (placement: SessionRecord, headers: Record<string, string | string[]>): Promise<UpstreamResponse> {
    const { upstream, metrics } = this.#o
    return await metrics.timeUpstream('GET', () => upstream.request(sessionRequest(placement, { method: 'GET', path: this.#o.path, headers, signal: this.#abort })), this.#abort)
  }

  async #start (res: UpstreamResponse, resuming: boolean): Promise<null> {
    const { metrics, log } = this.#o
    const lease = this.#lease
    if (this.stopped) {
      // Stopped while opening (session dropped, handed over): nothing to record.
      discardBody(res.body)
      return null
    }
    // Lost while opening (no loss heard: a lease settled before this pump had it).
    const phase = this.#phase
    const lost = phase.kind === 'opening' && phase.lost !== undefined ? phase.lost : lease.settled ? 'lost' : undefined
    if (lost !== undefined && (lost !== 'gone' || this.#o.recoverSession === undefined)) {
      // Nothing to record under a lease another replica may hold now, or of a session gone.
      discardBody(res.body)
      this.#stop(lost === 'gone' ? 'session_gone' : 'lease_lost')
      return null
    }
    metrics.upstreamStreamsOpen.inc({ kind: 'standalone' })
    log.debug({ takeover: lease.takeover, resuming }, 'upstream GET stream opened')
    this.#phase = { kind: 'recording' }
    // The old upstream session's last event id is no id of this one: a later holder opens afresh.
    if (this.#o.newUpstreamSession === true) lease.noteUpstreamId('')
    if (lease.takeover && this.#o.newUpstreamSession !== true) {
      metrics.leaseTakeovers.inc()
      // The store lost the session meanwhile: recorded again below, in a new epoch, whose gap says it all.
      if (!resuming && lost === undefined) await this.#recordHandoverGap()
    }
    // Where the stream stands before this upstream GET's first append (none yet: 0), so the
    // recorder can tell, after an outage, what Redis applied although the append failed.
    // Not waited for: asked before any append of the recorder, on the same connection, it
    // answers for the stream as it was before them.
    const storedThrough = metrics.timeStore('state', () => this.#o.store.state(this.#o.sessionId, STANDALONE_STREAM))
      .then(state => state?.lastSeq ?? 0, () => undefined)
    recordUpstreamStream({
      store: this.#o.store,
      metrics,
      log,
      sessionId: this.#o.sessionId,
      streamId: STANDALONE_STREAM,
      body: res.body,
      maxEventBytes: this.#o.maxEventBytes,
      readAhead: this.#o.readAhead,
      resumeBounds: this.#o.resumeBounds,
      endStreamOnFinish: false,
      // The same token under a lease taken again after a store loss (#recoverOnce).
      fence: lease.token,
      upstreamIds: { noteUpstreamId: id => { if (!this.#handedOn) this.#lease.noteUpstreamId(id) }, readFrom: () => this.#record?.upstreamSessionId },
      live: this.#o.clients,
      storedThrough,
      resumeUpstream: lastEventId => this.#resume(lastEventId),
      ...(this.#o.recoverSession !== undefined && {
        recoverSession: async () => await this.#recoverForRecorder(),
        epochMoved: () => this.#takeMoved()
      })
    }).then(outcome => {
      metrics.upstreamStreamsOpen.dec({ kind: 'standalone' })
      log.debug({ outcome }, 'upstream GET stream finished')
      this.#stop(outcome)
    })
    this.clientsChanged()
    // The store lost the session while the GET opened: recorded again now, as while recording.
    if (lost === 'gone') this.#lose(lost)
    return null
  }

  /**
   * The upstream ended its GET stream: open it again, from its last event id
   * when it gave one, so nothing it sends later is dropped for want of a GET.
   */
  async #resume (lastEventId: string | undefined): Promise<Readable | undefined> {
    if (this.stopped) return undefined
    // The upstream ended the GET with the session it is deleting: reopening it would only meet a 404.
    if (this.#o.clients.deleting) {
      this.#o.log.debug('a DELETE of the session is on its way upstream: its ended GET stream is not reopened')
      return undefined
    }
    const placement = await this.#o.placement()
    if (placement === null || this.stopped) return undefined
    // Established upstream again meanwhile: the new upstream session's stream is another
    // stream, which never issued that id (an upstream with an event store may refuse it).
    // A record that only came to name the endpoint holding this upstream session is no move.
    const moved = this.#record !== undefined && !sameUpstreamSession(this.#record, placement)
    this.#read(placement)
    // The session's latest credentials here, not the ones of the GET that ended: they may have expired.
    const headers = lastEventId === undefined || moved ? this.#headers : { ...this.#headers, 'last-event-id': lastEventId }
    const res = await this.#get(placement, headers)
    if (res.statusCode === 200 && mediaType(res.headers['content-type']) === 'text/event-stream') return res.body
    discardBody(res.body)
    return undefined
  }

  /** The hub's local client count changed: the hold timer runs only with none. */
  clientsChanged (): void {
    if (this.#o.clients.localClients() > 0) {
      this.#clientSeen = true
      clearTimeout(this.#holdTimer)
      this.#holdTimer = undefined
    } else {
      this.#armHold(this.#hold())
    }
  }

  /**
   * A client's GET for the stream is on its way here (it attaches once its
   * position is read): from now on the hold is holdMs, and a hold still
   * running starts again, so the early hold does not release the upstream
   * GET under a client about to attach.
   */
  clientAsked (): void {
    this.#clientSeen = true
    if (this.#holdTimer === undefined) return
    clearTimeout(this.#holdTimer)
    this.#holdTimer = undefined
    this.#armHold(this.#o.holdMs)
  }

  /** The session is gone (DELETE, upstream 404): release the upstream GET. */
  stop (): void {
    this.#stop('stopped')
  }

  /**
   * The session's record moved to another upstream placement: stop reading
   * the old one (its GET aborted; the old upstream session may well keep it
   * open, an endpoint closing gracefully does) without releasing the lease,
   * which the holder hands to the pump it opens at the new placement. Its
   * callbacks are that pump's from then on (#useLease in its constructor).
   */
  moveAway (): Lease {
    this.#stop('moved')
    return this.#lease
  }

  /**
   * The session's record came to name the endpoint holding the upstream
   * session this pump reads (found after the store lost the session): no
   * move, the upstream GET goes on (no other endpoint knows that session, so
   * a GET that opened is there already). Its resumes go to that endpoint, and
   * so does a recovery of the session should the store lose it again. False
   * when the pump reads another upstream session (a move: see moveAway), or
   * none yet, or has stopped.
   */
  pin (placement: UpstreamPlacement): boolean {
    const record = this.#record
    if (this.stopped || record === undefined || !sameUpstreamSession(record, placement)) return false
    if (placement.endpoint !== undefined) this.#record = { ...record, endpoint: placement.endpoint }
    return true
  }

  /**
   * Whether the lease may be handed over (moveAway) now: held, and nothing
   * in flight on it that would settle or replace it under the next pump (a
   * recovery after a store loss, the hold's release).
   */
  get movable (): boolean {
    return !this.stopped && !this.#lease.settled && this.#leaseWork === 0
  }

  /** Work on the lease under way (a recovery, the hold's release): whether the pump goes on is known once it is done. */
  get leaseBusy (): boolean { return this.#leaseWork > 0 }

  /** Settles once nothing is in flight on the lease (see movable). */
  async leaseWorkDone (): Promise<void> {
    while (this.#leaseWork > 0) await this.#leaseWorkSettled
  }

  /** Work on the lease that may settle or replace it, counted until it is done (see movable). */
  #onLease<T> (work: Promise<T>): Promise<T> {
    this.#leaseWork++
    const done = work.finally(() => { this.#leaseWork-- })
    this.#leaseWorkSettled = done.then(() => {}, () => {})
    return done
  }

  /**
   * Draining: close the upstream GET first, then release the lease (live),
   * so the replica that asked opens its own with the smallest gap. Settles
   * once released, with a lease a recovery in flight takes again after the
   * stop (#recoverOnce): the process may exit then.
   */
  async handOver (): Promise<void> {
    this.#stop('handed_over')
    await this.leaseWorkDone()
    await this.#released
  }

  /**
   * The lease the stream is held under from now on. Its loss stops the pump,
   * unless the store lost the session with it ('gone') and the session can be
   * recorded again: the upstream GET stays open, nothing it sends is dropped.
   */
  #useLease (lease: Lease): void {
    this.#lease = lease
    lease.hold({
      moved: () => {
        if (this.#phase.kind === 'recording') this.#o.onMoved?.()
      },
      lost: reason => {
        const phase = this.#phase
        // Lost while the GET opens: acted on once it has (#start).
        if (phase.kind === 'opening') this.#phase = { kind: 'opening', lost: reason }
        else if (phase.kind === 'recording') this.#lose(reason)
      },
      handoverRequested: () => {
        this.#o.log.info('draining: another replica asked for the upstream GET stream; handing it over')
        this.handOver()
      }
    }, this.#record?.upstreamSessionId)
  }

  /** The lease lost while recording: the pump stops, unless the store lost the session and it can be recorded again. */
  #lose (reason: LostReason): void {
    if (reason === 'gone' && this.#o.recoverSession !== undefined) this.#lostWithTheStore()
    else this.#stop(reason === 'gone' ? 'session_gone' : 'lease_lost')
  }

  /** The record as read for the upstream GET: the lease's renewals compare its upstream session with the store's. */
  #read (record: SessionRecord): void {
    // Stopped, its lease may be another pump's now (moveAway).
    if (this.stopped) return
    this.#record = record
    this.#lease.follow(record.upstreamSessionId)
  }

  /** The lease's renewal found the session's records gone: record it again now, before the next append finds out. */
  #lostWithTheStore (): void {
    this.#recover().then(state => {
      if (state === undefined) this.#stop('session_gone')
      // The recorder may have recorded the session again itself first (its append found the
      // loss before the renewal did): then it is there already.
      else if (state.epoch !== this.#recorderEpoch) this.#moved = state
    }, (err: unknown) => {
      this.#o.log.warn({ err }, 'could not record again the session the event store lost; its upstream GET stops')
      this.#stop('session_gone')
    })
  }

  /** The recorder's append found the session gone: its state in the new epoch, undefined when it is not to go on. */
  async #recoverForRecorder (): Promise<StreamState | undefined> {
    const moved = this.#takeMoved()
    if (moved !== undefined) return moved
    const state = await this.#recover()
    // Where the recorder goes on now: a move the renewal's recovery left is no news to it.
    this.#moved = undefined
    this.#recorderEpoch = state?.epoch
    return state
  }

  #takeMoved (): StreamState | undefined {
    const moved = this.#moved
    this.#moved = undefined
    if (moved !== undefined) this.#recorderEpoch = moved.epoch
    return moved
  }

  /** One recovery at a time: a second finds the session recorded again by the first, and only checks. */
  #recover (): Promise<StreamState | undefined> {
    const next = this.#onLease(this.#recoveries.then(async () => await this.#recoverOnce()))
    this.#recoveries = next.catch(() => {})
    return next
  }

  /**
   * Record the session again (SessionRecovery), make the lease ours again at
   * once under the same token (the records took it), and open the stream in
   * the new epoch. Undefined when the pump is to stop: stopped already, the
   * session deleted or not to be recorded again, or another replica holding
   * its stream now.
   */
  async #recoverOnce (): Promise<StreamState | undefined> {
    const { store, metrics, log, sessionId, recoverSession } = this.#o
    const record = this.#record
    if (this.stopped || this.#o.clients.deleting || record === undefined || recoverSession === undefined) return undefined
    if (await metrics.timeStore('session_deleted', () => store.sessionDeleted(sessionId))) return undefined
    if (!await recoverSession(sessionId, record, log, this.#lease.token)) return undefined
    // Taken again even by a pump stopped meanwhile: the recording took the lease with it,
    // under this token, after the stop released it, and would hold the stream from every
    // replica until it ran out.
    const again = await this.#o.reacquire(this.#lease)
    if (again === 'held' || again === 'gone') {
      if (this.stopped) return undefined
      log.info({ lease: again }, 'the session was recorded again after the event store lost it, and another replica holds its stream now')
      this.#stop('lease_lost')
      return undefined
    }
    if (this.stopped) {
      // Stopped while the session was recorded again or the lease taken again (the hold ran
      // out, the recorder ended): the stop released the lease it had, settled already; this
      // one would be renewed for ever.
      if (again !== this.#lease) this.#releaseTakenAgain(again)
      return undefined
    }
    if (again !== this.#lease) this.#useLease(again)
    return await metrics.timeStore('open_stream', () => store.openStream(sessionId, STANDALONE_STREAM))
  }

  /** A lease taken again after the pump stopped: released as the stop released its own. */
  #releaseTakenAgain (lease: Lease): void {
    const phase = this.#phase
    const end = phase.kind === 'stopped' ? PUMP_OUTCOMES[phase.outcome].lease : 'unclean'
    this.#released = lease.release(end === 'clean' ? 'clean' : 'unclean').catch((err: unknown) => this.#o.log.warn({ err }, 'could not release the upstream GET lease'))
  }

  /**
   * The previous holder's upstream GET did not end cleanly and the upstream
   * cannot resume: what it sent in between is unknown. Say so in the stream,
   * before anything new, so every client reading across the handover is told.
   */
  async #recordHandoverGap (): Promise<void> {
    const { store, metrics, log, sessionId } = this.#o
    try {
      await metrics.timeStore('append', () => store.append(sessionId, STANDALONE_STREAM, [upstreamHandoverGap(STANDALONE_STREAM)], { fence: this.#lease.token }))
      metrics.countGap('upstream_handover')
      log.warn('upstream GET taken over without upstream resumption: gap marker recorded')
    } catch (err) {
      if (err instanceof LeaseLostError) this.#stop('lease_lost')
      else if (err instanceof SessionGoneError) this.#stop('session_gone')
      else log.error({ err }, 'could not record the handover gap marker')
    }
  }

  #hold (): number {
    return this.#clientSeen ? this.#o.holdMs : Math.min(this.#o.earlyHoldMs, this.#o.holdMs)
  }

  #armHold (delayMs: number): void {
    if (this.stopped || this.#holdTimer !== undefined || this.#o.clients.localClients() > 0) return
    this.#holdTimer = setTimeout(() => {
      this.#holdTimer = undefined
      if (this.stopped || this.#o.clients.localClients() > 0) return
      // A client attached on another replica keeps the stream held (its marker lives in the store).
      this.#onLease(this.#lease.releaseIfIdle()).then(result => {
        if (this.stopped) return
        switch (result.kind) {
          case 'released':
            this.#o.log.debug('no client anywhere for the hold time: releasing the upstream GET stream')
            this.#stop('hold_expired')
            return
          case 'lost':
            this.#stop('lease_lost')
            return
          case 'attached':
            this.#armHold(result.askAgainMs)
            return
          default:
            unreachable(result)
        }
      }, (err: unknown) => {
        this.#o.log.warn({ err }, 'could not release the upstream GET lease; holding on')
        this.#armHold(this.#hold())
      })
    }, delayMs)
    this.#holdTimer.unref()
  }

  #stop (outcome: PumpOutcome): void {
    if (this.#phase.kind === 'stopped') return
    this.#phase = { kind: 'stopped', outcome }
    clearTimeout(this.#holdTimer)
    this.#holdTimer = undefined
    // A refusal's body is the caller's to pass on: not aborted.
    if (outcome !== 'refused') this.#abort.abort()
    const { log } = this.#o
    const lease = this.#lease
    // Released after the abort, so the next holder's GET does not race this one
    // upstream. A lease already released or lost is left alone.
    const end = PUMP_OUTCOMES[outcome].lease
    if (end === 'clean' || end === 'unclean') {
      this.#released = lease.release(end).catch((err: unknown) => log.warn({ err }, 'could not release the upstream GET lease'))
    }
    this.#o.onStop(outcome)
  }
}
