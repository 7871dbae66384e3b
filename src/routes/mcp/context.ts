import { randomBytes } from 'node:crypto'
import { clientKey } from '../../net/client-address.js'
import type { FastifyBaseLogger as Logger, FastifyReply } from 'fastify'
import type { LeaseCoordinator } from '../../cluster/coordinator.js'
import type { GatewayConfig } from '../../config/load.js'
import type { GatewayMetrics, StreamKind } from '../../metrics/metrics.js'
import type { ProtocolInfo } from '../../protocol/era.js'
import type { InFlight } from '../../recording/inflight.js'
import type { SessionHub } from '../../sessions/session-hub.js'
import type { ClientBuffers } from '../../sse/client-buffers.js'
import { ClientStream } from '../../sse/client-stream.js'
import type { KeepAliveTicker } from '../../sse/keep-alive.js'
import type { EventStore } from '../../store/contract.js'
import type { InitializeRate } from './initialize-rate.js'
import type { ReplayLimiter } from './replay-limit.js'
import type { AnsweredHolds } from './answered-holds.js'
import type { LossSign, SessionReestablisher } from '../../sessions/reestablish.js'
import { lostSession, upstreamNeverReached } from '../../sessions/reestablish.js'
import type { SessionRecord } from '../../store/contract.js'
import { discardBody, type UpstreamClient, type UpstreamRequest, type UpstreamResponse } from '../../upstream/client.js'
import { sessionRequest } from '../../upstream/session-request.js'
import { Relapses, RELAPSES_MAX } from '../../sessions/relapses.js'
import { errors, isUpstreamEndpointGone } from '../../errors.js'
import type { FastifyRequest } from 'fastify'
import type { SessionCache } from './session-cache.js'
import type { SessionGuard } from './session-guard.js'
import { sessionHash } from './session-guard.js'
import { recordableHeaders, upstreamGetHeaders } from './request-headers.js'

/**
 * How long a request waits for its session's upstream GET, being opened (at
 * initialize, or after the session was established upstream again), to
 * open: one upstream round trip normally; beyond it the request goes on
 * without it, as it would without the gateway's own GET.
 */
export const STANDALONE_OPEN_WAIT_MS = 2000
/**
 * The same wait for the request that met the upstream's loss of its session,
 * once the session is established there again: longer, because every
 * session of a restarted upstream is established again at once, and their
 * GETs open in a crowd. The request has waited for the re-establishment
 * already; an event lost for want of the GET would not come back.
 */
const REESTABLISHED_OPEN_WAIT_MS = 10_000

export interface McpRouteDeps {
  readonly maxBodyBytes: number
  readonly config: GatewayConfig
  readonly store: EventStore
  readonly hub: SessionHub
  readonly upstream: UpstreamClient
  readonly metrics: GatewayMetrics
  /** Bytes waiting for clients, process-wide: every stream's and every relayed answer's. */
  readonly buffers: ClientBuffers
  readonly inflight: InFlight
  /** Request stream recorders across replicas: claimed here, watched while a resuming client waits. */
  readonly leases: LeaseCoordinator
  /** Establishes sessions upstream again; undefined: REESTABLISH_UPSTREAM_SESSIONS=false. */
  readonly reestablisher?: SessionReestablisher
  readonly random?: (size: number) => Uint8Array
}

/** Replay pages: at most this many events, their bytes doubling from the first size up to the largest (see StreamFollower). */
export interface ReplayPages {
  readonly pageSize: number
  readonly pageBytes: number
  readonly pageMaxBytes: number
}

/**
 * Pages bounded in bytes and growing: a short resume is answered from one
 * small page, and a client cut off for being slow under a flood catches up.
 * With 500-event pages it resumed at about 33,000 events/s against 500,000
 * produced, retention trimmed past it before every page, and it never became
 * live again. 4 MiB is the largest event (MAX_EVENT_BYTES' default).
 */
const REPLAY_PAGE_EVENTS = 10_000
const REPLAY_FIRST_PAGE_BYTES = 128 * 1024
const REPLAY_PAGE_MAX_BYTES = 4 * 1024 * 1024

/** The replay pages of a gateway whose clients may each have `clientBufferMaxBytes` unsent: a page is written in one piece. */
export function replayPagesFor (clientBufferMaxBytes: number): ReplayPages {
  const pageMaxBytes = Math.min(REPLAY_PAGE_MAX_BYTES, clientBufferMaxBytes)
  return { pageSize: REPLAY_PAGE_EVENTS, pageBytes: Math.min(REPLAY_FIRST_PAGE_BYTES, pageMaxBytes), pageMaxBytes }
}

/**
 * What every handler of the MCP endpoint shares: the gateway's parts, the
 * session guard and cache, and the few steps they all take (checking a
 * session is the request's principal's, opening a client stream, timing an
 * upstream request, forgetting a session).
 */
export class McpContext {
  readonly deps: McpRouteDeps
  readonly random: (size: number) => Uint8Array
  readonly sessions: SessionCache
  readonly guard: SessionGuard
  readonly replayPages: ReplayPages
  readonly replays: ReplayLimiter
  /** Resumes of answered request streams held open (resume.ts). */
  readonly answeredHolds: AnsweredHolds
  /** INITIALIZES_PER_MINUTE_PER_ADDRESS, taken before the upstream and where a session is issued. */
  readonly initializes: InitializeRate
  /** The session is gone: what this replica holds of it ends (its upstream GET, clients, held resumes, recordings). */
  readonly dropLocal: (sessionId: string) => void
  readonly #relapses: Relapses
  readonly #keepAlive: KeepAliveTicker

  constructor (deps: McpRouteDeps, parts: { sessions: SessionCache, guard: SessionGuard, keepAlive: KeepAliveTicker, replays: ReplayLimiter, answeredHolds: AnsweredHolds, initializes: InitializeRate, dropLocal: (sessionId: string) => void }) {
    this.deps = deps
    this.random = deps.random ?? randomBytes
    this.sessions = parts.sessions
    this.guard = parts.guard
    this.#keepAlive = parts.keepAlive
    this.replays = parts.replays
    this.answeredHolds = parts.answeredHolds
    this.initializes = parts.initializes
    this.dropLocal = parts.dropLocal
    this.#relapses = new Relapses({ maxEntries: Math.max(1000, deps.config.maxSessions) })
    this.replayPages = replayPagesFor(deps.config.clientBufferMaxBytes)
  }

  /** A client stream on `reply`, not yet open. */
  clientStream (reply: FastifyReply, log: Logger, kind: StreamKind, epoch: string, streamId: string, proto: ProtocolInfo): ClientStream {
    return new ClientStream({
      reply,
      kind,
      epoch,
      streamId,
      priming: proto.priming,
      retryMs: this.deps.config.sseRetryMs,
      maxBufferBytes: this.deps.config.clientBufferMaxBytes,
      buffers: this.deps.buffers,
      address: clientKey(reply.request.ip),
      metrics: this.deps.metrics,
      log,
      keepAlive: this.#keepAlive
    })
  }

  /**
   * The session's record, if it is `principal`'s (SessionGuard.requireSession;
   * `recover`: a session the store lost may be recorded again for this
   * request, which the upstream then confirms). Once that check passed, and
   * only then, the request's headers become the ones the gateway's own
   * upstream GETs of the session carry here (SessionHub.requestVerified): a
   * client's refreshed token replaces the one its GET opened with, and
   * another principal's credentials never do.
   */
  async requireSession (request: FastifyRequest, sessionId: string, principal: string, recovery: 'recover' | 'none'): Promise<SessionRecord> {
    const record = await this.guard.requireSession(sessionId, principal, recovery === 'recover' ? request : undefined)
    this.deps.hub.requestVerified(sessionId, () => upstreamGetHeaders(request, 'keep'))
    return record
  }

  /**
   * A request of a session, sent upstream where the session lives. When the
   * upstream lost the session (lostSession, or no connection at all: its
   * process gone), the session is established there again and the request
   * sent once more (the upstream never executed it; its body is a buffer). A
   * connection cut after the request went out is not retried: the upstream
   * may have acted on it, so the client gets the error (at most once). A
   * session whose new initialize result promises something else ends: 404.
   * Otherwise the first answer (or error) stands. The caller has checked the
   * principal.
   */
  async sessionUpstream (request: FastifyRequest, sessionId: string, record: SessionRecord, method: string, upstreamRequest: UpstreamRequest): Promise<UpstreamResponse> {
    const send = async (at: SessionRecord): Promise<UpstreamResponse> =>
      await this.deps.metrics.timeUpstream(method, () => this.deps.upstream.request(sessionRequest(at, upstreamRequest)))
    let first: UpstreamResponse
    try {
      first = await send(record)
    } catch (err) {
      if (!upstreamNeverReached(err)) throw err
      const moved = await this.reestablish(request, sessionId, record, 'unanswered')
      if (moved === undefined) {
        await this.endedWith(err, sessionId, request.log)
        throw err
      }
      return await this.sentAgain(request, sessionId, moved, await send(moved))
    }
    const told = await lostSession(first)
    if (!told.lost) {
      await this.#pinEndpoint(sessionId, record, told.res, request.log)
      return told.res
    }
    const moved = await this.reestablish(request, sessionId, record, 'answered')
    if (moved === undefined) return told.res
    discardBody(told.res.body)
    return await this.sentAgain(request, sessionId, moved, await send(moved))
  }

  /**
   * A record that names no endpoint (recorded again after the store lost it,
   * by a replica that did not know where it lives) sends its requests round
   * robin; the endpoint that answered one with a 2xx holds the session (SDK
   * servers keep sessions in memory, one endpoint each): the record names it
   * from now on, for every replica. Best effort: unpinned, the session's next
   * request meeting a 404 finds its endpoint (SessionReestablisher).
   */
  async #pinEndpoint (sessionId: string, record: SessionRecord, answer: UpstreamResponse, log: Logger): Promise<void> {
    const endpoint = answer.endpoint
    if (record.endpoint !== undefined || endpoint === undefined || this.deps.upstream.endpoints.size < 2) return
    if (answer.statusCode < 200 || answer.statusCode >= 300) return
    const placement = { upstreamSessionId: record.upstreamSessionId, endpoint }
    try {
      const moved = await this.deps.metrics.timeStore('move_placement', () => this.deps.store.movePlacement(sessionId, record.upstreamSessionId, placement))
      if (moved !== null) this.sessions.set(sessionId, moved)
    } catch (err) {
      log.warn({ err, sessionHash: sessionHash(sessionId) }, 'could not record the endpoint holding a recovered session; its next request finds it again')
    }
  }

  /**
   * The record to retry under once the session is established upstream again;
   * undefined: the first answer stands. Throws 404 when the session cannot
   * carry over, and 503 (the session kept) when it could not be established
   * for now.
   */
  async reestablish (request: FastifyRequest, sessionId: string, record: SessionRecord, sign: LossSign): Promise<SessionRecord | undefined> {
    const reestablisher = this.deps.reestablisher
    if (reestablisher === undefined) return undefined
    const log = request.log.child({ sessionHash: sessionHash(sessionId) })
    const result = await reestablisher.reestablish(sessionId, record, recordableHeaders(request), sign, log)
    switch (result.outcome) {
      case 'reestablished':
      case 'joined':
      case 'found':
        this.sessions.set(sessionId, result.record)
        // The new upstream session's GET first, then the request that met the loss:
        // what that request makes the upstream send on the standalone stream (an SDK
        // server drops it while no GET is open) then finds the stream open.
        this.deps.hub.reopen(sessionId, result.record, record, upstreamGetHeaders(request, 'keep'), log)
        await this.deps.hub.opened(sessionId, REESTABLISHED_OPEN_WAIT_MS)
        return result.record
      case 'incompatible':
      case 'gone':
        await this.forgetSession(sessionId, log)
        throw errors.sessionNotFound()
      case 'unavailable':
      case 'timed_out':
      case 'busy':
        // Not the upstream's last word: the session stays, and the client's retry tries again.
        // (The answer to the request sent again after a re-establishment is read likewise: sentAgain.)
        throw errors.sessionReestablishing()
      case 'failed':
      case 'unrecorded':
        return undefined
    }
  }

  /**
   * The answer to a request sent again once its session was established
   * upstream again. One that says the upstream lost the session (lostSession)
   * says it lost it once more (it restarted again meanwhile), not that the
   * session ended: the session is kept, and the client's retry establishes it
   * again; unless that keeps happening (Relapses), when it ends: 404. `at`:
   * the record the request was sent again under.
   */
  async sentAgain (request: FastifyRequest, sessionId: string, at: SessionRecord, answer: UpstreamResponse): Promise<UpstreamResponse> {
    const { lost, res } = await lostSession(answer)
    if (!lost) return res
    discardBody(res.body)
    if (!this.#relapses.note(sessionId, at.upstreamSessionId)) throw errors.sessionReestablishing()
    this.deps.metrics.upstreamSessionsReestablished.inc({ outcome: 'relapsed' })
    const log = request.log.child({ sessionHash: sessionHash(sessionId) })
    log.warn({ relapses: RELAPSES_MAX }, 'the upstream lost the session again right after each re-establishment: it does not keep sessions (is UPSTREAM_URL a load-balanced Service of replicas that keep sessions in memory? name their addresses instead, e.g. a headless Service); the session ends')
    await this.forgetSession(sessionId, log)
    throw errors.sessionNotFound()
  }

  /**
   * The session's request failed with `err`, which the client is about to get.
   * Told the endpoint holding its session is gone (404: start anew), it is: the
   * gateway forgets the session too, as for the upstream's own 404, so that
   * the session the client was told is gone does not go on.
   */
  async endedWith (err: unknown, sessionId: string, log: Logger): Promise<void> {
    if (isUpstreamEndpointGone(err)) await this.forgetSession(sessionId, log)
  }

  /** A session the upstream no longer knows: neither does the gateway. */
  async forgetSession (sessionId: string, log: Logger): Promise<void> {
    this.sessions.delete(sessionId)
    this.dropLocal(sessionId)
    await this.deps.metrics.timeStore('delete_session', () => this.deps.store.deleteSession(sessionId))
      .catch((err: unknown) => log.warn({ err }, 'could not drop the records of a session the upstream no longer knows'))
  }
}
