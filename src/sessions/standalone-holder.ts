import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger as Logger } from 'fastify'
import type { Lease, LeaseClaim, LeaseCoordinator } from '../cluster/coordinator.js'
import { errors, unreachable } from '../errors.js'
import type { EventStore, UpstreamPlacement } from '../store/contract.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import type { ClientStream } from '../sse/client-stream.js'
import { discardBody, type UpstreamClient, type UpstreamResponse } from '../upstream/client.js'
import { samePlacement } from '../upstream/session-request.js'
import type { LocalSession, LocalSessions, Opened } from './local-session.js'
import type { PumpAdmission } from './principal-quota.js'
import type { ReadAheadBudget } from '../recording/read-ahead.js'
import type { ResumeBounds } from '../recording/upstream-resume.js'
import { PUMP_OUTCOMES, releasedAt, StandalonePump, type PumpOutcome, type SessionRecovery } from './standalone-pump.js'

export interface StandaloneHolderOptions {
  readonly upstream: UpstreamClient
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly mcpPath: string
  readonly holdMs: number
  /** The hold of an upstream GET no client attached to yet (STANDALONE_EARLY_HOLD_SECONDS). */
  readonly earlyHoldMs: number
  readonly maxEventBytes: number
  readonly maxSessions: number
  /** How far a standalone stream the upstream ends is reopened. */
  readonly upstreamResumes: ResumeBounds
  /** An upstream GET opened anew resumes from the lease's last upstream event id (STANDALONE_REOPEN_FROM_LAST_ID). */
  readonly standaloneReopenFromLastId: boolean
  /** Which replica holds each session's upstream GET. */
  readonly leases: LeaseCoordinator
  /** Per-principal places for upstream GETs (MAX_SESSIONS_PER_PRINCIPAL), if any. */
  readonly admission?: PumpAdmission
}

/** Whether the process is draining (it then takes on no upstream GET). */
export interface DrainState {
  readonly draining: boolean
}

/** The first wait before asking the upstream again for a GET (see StandaloneHolder#againAfter), doubled up to the second. */
const AGAIN_FIRST_MS = 150
const AGAIN_MAX_MS = 1000

/**
 * Holds sessions' upstream GETs in this process, each under the session's
 * lease, with a pump that records it; and, for a session whose client is
 * attached here while another replica holds its GET, watches that holder and
 * takes the GET over if it goes away.
 */
export class StandaloneHolder {
  readonly #o: StandaloneHolderOptions
  readonly #sessions: LocalSessions
  readonly #readAhead: ReadAheadBudget
  readonly #drain: DrainState
  #pumps = 0
  /** How a session the store lost under an open upstream GET is recorded again; without it, the GET stops. */
  #recoverSession: SessionRecovery | undefined

  constructor (options: StandaloneHolderOptions, sessions: LocalSessions, readAhead: ReadAheadBudget, drain: DrainState) {
    this.#o = options
    this.#sessions = sessions
    this.#readAhead = readAhead
    this.#drain = drain
  }

  /** Set once, by whoever checks sessions' principals (the MCP route). */
  recoverLostWith (recover: SessionRecovery): void {
    this.#recoverSession = recover
  }

  /** Upstream GETs held here. */
  get pumpCount (): number { return this.#pumps }
  /** As many upstream GETs held here as MAX_SESSIONS allows. */
  get full (): boolean { return this.#pumps >= this.#o.maxSessions }

  /**
   * Take the session's lease and open its upstream GET here. Resolves null
   * when the GET is held, here or (the lease being taken) by another replica;
   * otherwise with the upstream's refusal to pass through.
   */
  async claim (s: LocalSession, sessionId: string, log: Logger): Promise<UpstreamResponse | null> {
    await this.#o.admission?.admit(sessionId)
    let lease: LeaseClaim
    try {
      lease = await this.#o.metrics.timeStore('lease_acquire', () => this.#o.leases.acquire(sessionId))
    } catch (err) {
      throw errors.storeUnavailable(err)
    }
    if (lease === 'gone') throw errors.sessionNotFound()
    // Held by another replica: attach() watches it for a takeover.
    if (lease === 'held') return null
    let res: UpstreamResponse | null = null
    const since = performance.now()
    try {
      for (let attempt = 1; ; attempt++) {
        res = await this.#startPump(s, sessionId, lease, log)
        // 409: the previous holder's GET is still open upstream (one GET per session); it goes.
        if (res?.statusCode !== 409) break
        const wait = this.#againAfter(attempt, since)
        if (wait === undefined) break
        discardBody(res.body)
        await sleep(wait)
      }
    } catch (err) {
      await lease.giveBack().catch(() => {})
      throw err
    }
    if (res !== null) await lease.giveBack().catch(() => {})
    return res
  }

  /**
   * How long to wait before asking the upstream again for a GET it refused with
   * 409 or did not answer, `attempt` tries after the first at `since`; undefined
   * once that would pass LEASE_TTL_MS. The GET open upstream belongs to a holder
   * that is closing it (a takeover), that died (its connection goes), or that
   * lost its lease with the store's records and lets go at its next renewal, a
   * third of LEASE_TTL_MS later: asked again for less, the client would be
   * refused for the moment a renewal takes.
   */
  #againAfter (attempt: number, since: number): number | undefined {
    const wait = Math.min(AGAIN_MAX_MS, AGAIN_FIRST_MS * 2 ** (attempt - 1))
    return performance.now() - since + wait > this.#o.leases.ttlMs ? undefined : wait
  }

  /** A client is attached here and another replica holds the stream: take it over if the holder goes. */
  watch (s: LocalSession, sessionId: string): void {
    if (this.#drain.draining) return
    // Only from idle: not while watching already, opening or holding the stream here.
    s.watch(() => this.#o.leases.watch(sessionId, {
      onGrant: lease => {
        s.watchEnded()
        this.#takeover(s, sessionId, lease)
      },
      onGone: () => {
        s.watchEnded()
        // The store lost the session: the client reconnects and is told (404).
        s.standaloneClient?.close('session_deleted')
      }
    }))
  }

  /**
   * The standalone client attached here, not served by a pump here, watches
   * the holder's lease. While an opening runs (another request's, a
   * re-establishment's, a takeover's), the watch waits for it: an opening that
   * ends without a pump here (the stream held elsewhere, refused, failed, its
   * lease lost) would otherwise leave the client served by nothing, not even
   * followed.
   */
  watchOnceOpened (s: LocalSession, sessionId: string, client: ClientStream): void {
    const opening = s.opening
    if (opening === undefined) {
      this.watch(s, sessionId)
      return
    }
    opening.catch(() => null).then(() => {
      if (s.standaloneClient === client && !s.pumping) this.watchOnceOpened(s, sessionId, client)
    }).catch(() => {})
  }

  /**
   * The session's record moved to `placement` (established upstream again,
   * here or by another replica): the upstream GET held here follows it. The
   * old upstream session's GET may well stay open (an endpoint that closes
   * gracefully keeps its connections; one set aside after a refusal lives on)
   * and never end into the resume that would read the record again, while an
   * SDK server drops what the new session sends with no GET open. So the pump
   * reading the old placement stops and one opens at the new placement under
   * the same lease, synchronously (the request retried after the
   * re-establishment waits for that opening). One still opening is looked at
   * once it has opened: it may have read the record before the move. A
   * record that only came to name the endpoint holding the upstream session
   * the pump reads is no move: that GET goes on (StandalonePump.pin).
   */
  follow (s: LocalSession, sessionId: string, placement: UpstreamPlacement, log: Logger): void {
    const opening = s.opening
    if (opening !== undefined) {
      // At once when it has opened, so that the request retried after the re-establishment
      // waits for the move too (SessionHub.opened). Should the opening have read a record
      // newer than `placement`, the pump that replaces it reads that one again: one GET
      // opened twice, not one at an old placement.
      opening.catch(() => null).then(() => { this.follow(s, sessionId, placement, log) }).catch(() => {})
      return
    }
    const pump = s.pump
    if (s.kind !== 'pumping' || pump === undefined || pump.stopped) return
    const at = pump.placement
    if (at === undefined || samePlacement(at, placement)) return
    if (pump.pin(placement)) {
      log.debug('the session\'s record names the endpoint holding its upstream session now: its upstream GET goes on')
      return
    }
    if (!pump.movable) {
      // A lease settled with nothing under way: the pump stops on its loss; nothing to follow.
      if (!pump.leaseBusy) return
      // A recovery or the hold's release is under way on the lease: whether the pump goes on,
      // and under which lease, is known once it is done.
      pump.leaseWorkDone().then(() => { this.#movedElsewhere(s, sessionId, log) }, () => {})
      return
    }
    if (this.#drain.draining) {
      // Not reopened here: the replica the stream goes to opens it from the record.
      pump.handOver().catch(() => {})
      return
    }
    log.info('the session was established upstream again: its upstream GET moves to the new upstream session')
    const lease = pump.moveAway()
    const opened = s.open(async () => {
      try {
        const res = await this.#startPump(s, sessionId, lease, log, true)
        if (res === null) return null
        discardBody(res.body)
        log.warn({ status: res.statusCode }, 'the upstream refused the GET of the session established again; the client reconnects')
      } catch (err) {
        log.warn({ err }, 'the upstream GET of the session established again could not be opened; the client reconnects')
      }
      // As a failed takeover.
      return await this.#giveUp(s, sessionId, lease)
    }) as Opened
    this.#forgetOnceSettled(sessionId, opened)
  }

  /**
   * A stream this replica could not open after all (a takeover, a follow): the
   * place and the lease go back, and the client attached here reconnects
   * through ensurePump, which opens the stream or passes a refusal on.
   */
  async #giveUp (s: LocalSession, sessionId: string, lease: Lease): Promise<null> {
    this.#o.admission?.release(sessionId)
    await lease.giveBack().catch(() => {})
    s.standaloneClient?.close('upstream_error')
    return null
  }

  /** The session is forgotten here once its opening settled, unless something holds it (LocalSessions.forget). */
  #forgetOnceSettled (sessionId: string, opened: Opened): void {
    opened.catch(() => null).finally(() => this.#sessions.forget(sessionId)).catch(() => {})
  }

  /**
   * The GET held here follows the session's record as the store has it now:
   * another replica established the session upstream again (the lease's
   * renewal saw the record move), or a follow had to wait.
   */
  #movedElsewhere (s: LocalSession, sessionId: string, log: Logger): void {
    this.#o.metrics.timeStore('get_session', () => this.#o.store.getSession(sessionId)).then(record => {
      if (record !== null) this.follow(s, sessionId, record, log)
    }, (err: unknown) => {
      // The next renewal tells again.
      log.warn({ err }, 'could not read the record of a session established upstream again elsewhere')
    })
  }

  /** Synchronous up to the pump's count (#pumps), so that `full` is right for the next caller. */
  async #startPump (s: LocalSession, sessionId: string, lease: Lease, log: Logger, newUpstreamSession = false): Promise<UpstreamResponse | null> {
    const pump: StandalonePump = new StandalonePump({
      upstream: this.#o.upstream,
      store: this.#o.store,
      metrics: this.#o.metrics,
      log,
      sessionId,
      placement: async () => await this.#o.metrics.timeStore('get_session', () => this.#o.store.getSession(sessionId)),
      path: this.#o.mcpPath,
      holdMs: this.#o.holdMs,
      earlyHoldMs: this.#o.earlyHoldMs,
      maxEventBytes: this.#o.maxEventBytes,
      readAhead: this.#readAhead,
      resumeBounds: this.#o.upstreamResumes,
      lease,
      newUpstreamSession,
      reopenFromLastId: this.#o.standaloneReopenFromLastId && !newUpstreamSession,
      ...(this.#recoverSession !== undefined && { recoverSession: this.#recoverSession }),
      reacquire: async lost => await this.#o.leases.reacquire(lost),
      clients: s,
      onStop: outcome => this.#pumpStopped(s, sessionId, pump, outcome),
      onMoved: () => { this.#movedElsewhere(s, sessionId, log) }
    })
    s.pumpStarted(pump)
    this.#pumps++
    return await pump.open()
  }

  #pumpStopped (s: LocalSession, sessionId: string, pump: StandalonePump, outcome: PumpOutcome): void {
    this.#pumps--
    // A refused pump's place stays with whoever started it, who may try again (claim's retries,
    // a takeover's attempts) and frees it when it gives up (SessionHub, #takeover); a moved
    // one's goes to the pump follow() starts at once.
    const rule = PUMP_OUTCOMES[outcome]
    if (releasedAt(outcome)) this.#o.admission?.release(sessionId)
    s.pumpStopped(pump)
    // Not forgotten either: follow() opens the stream again on this same LocalSession next.
    if (rule.lease === 'next_pump') return
    const local = s.standaloneClient
    const client = rule.client
    switch (client) {
      case 'as_is':
        break
      case 'follow_store':
        // Stopped while its opening runs (its lease lost meanwhile): the watch waits for it.
        if (local !== undefined) this.watchOnceOpened(s, sessionId, local)
        break
      case 'reconnect':
        // The client reconnects (retry hint) and reopens the upstream GET.
        local?.close(s.deleting ? 'session_deleted' : 'upstream_error')
        break
      default:
        unreachable(client)
    }
    this.#sessions.forget(sessionId)
  }

  /** This replica got the lease of a session another replica held: reopen the upstream GET here. */
  #takeover (s: LocalSession, sessionId: string, lease: Lease): void {
    const log = s.log ?? this.#o.log
    const busy = s.kind !== 'idle'
    const draining = this.#drain.draining
    const client = s.standaloneClient
    if (busy || draining || client === undefined || s.headers === undefined || this.full) {
      lease.giveBack().catch(() => {})
      if (busy || client === undefined) {
        log.info({ busy, draining }, 'takeover declined: the lease goes back')
        return
      }
      // Its reconnect goes through ensurePump, which opens the stream or passes a refusal on.
      log.warn({ draining, full: this.full }, 'takeover declined: the lease goes back, the client attached here reconnects')
      client.close('upstream_error')
      return
    }
    // The lease came free: another replica let go of the stream or died (takeover), or this
    // one let go of it just before its client attached.
    log.info({ takeover: lease.takeover }, 'the upstream GET stream\'s lease came free: opening the stream here for the client attached')
    const giveUp = async (): Promise<null> => await this.#giveUp(s, sessionId, lease)
    const opened = s.open(async () => {
      // Counted for its principal, never refused for it (AdmissionKind). The check above may be
      // stale after that wait: another takeover may have filled MAX_SESSIONS meanwhile.
      await this.#o.admission?.admit(sessionId, 'takeover')
      if (this.full || this.#drain.draining || s.standaloneClient === undefined) {
        log.warn({ draining: this.#drain.draining, full: this.full }, 'takeover declined: the lease goes back, the client attached here reconnects')
        return await giveUp()
      }
      const since = performance.now()
      for (let attempt = 1; ; attempt++) {
        let res: UpstreamResponse | null | undefined
        try {
          res = await this.#startPump(s, sessionId, lease, log)
        } catch (err) {
          log.warn({ err, attempt }, 'takeover: the upstream GET failed')
        }
        if (res === null) return null
        if (res !== undefined) discardBody(res.body)
        // Asked again only after a failure of the moment: no answer, or 409 (the previous
        // holder's GET still closing upstream). Any other refusal is the upstream's word (404:
        // it lost the session), which the client's reconnect acts on (ensurePump establishes
        // the session again); retrying it here would only hold a request that waits for this
        // opening (SessionHub.opened) behind the backoff.
        const final = res !== undefined && res.statusCode !== 409
        const wait = final ? undefined : this.#againAfter(attempt, since)
        if (wait === undefined || this.#drain.draining || s.standaloneClient === undefined || lease.settled) {
          log.warn({ status: res?.statusCode, attempt }, 'takeover: the upstream GET could not be opened; the client reconnects')
          return await giveUp()
        }
        await sleep(wait)
      }
    }) as Opened
    this.#forgetOnceSettled(sessionId, opened)
  }
}
