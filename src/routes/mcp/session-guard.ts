import type { FastifyBaseLogger, FastifyInstance, FastifyRequest } from 'fastify'
import { createHash } from 'node:crypto'
import { JwtPrincipal } from '../../auth/jwt-principal.js'
import { HeaderPrincipal, type Identity, type PrincipalResolver } from '../../auth/principal.js'
import type { GatewayConfig } from '../../config/load.js'
import { errors, GatewayError } from '../../errors.js'
import type { GatewayMetrics } from '../../metrics/metrics.js'
import { parseSessionId, SessionIdIssuer } from '../../protocol/session-id.js'
import type { AdoptOptions, Adoption, AdoptionSettlement, AdoptionVerdict, EventStore, LeaseHold, SessionRecord, UpstreamPlacement } from '../../store/contract.js'
import type { SessionCache } from './session-cache.js'
import { lostSession } from '../../sessions/reestablish.js'
import type { UpstreamResponse } from '../../upstream/client.js'

export interface SessionGuardOptions {
  readonly config: GatewayConfig
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly sessions: SessionCache
  /** Who requests act for; by default from the configuration (JWT verification or PRINCIPAL_HEADER). */
  readonly principals?: PrincipalResolver
  /**
   * A session this guard found deleted when it settled a recovery (the
   * upstream refused it): what this process still holds of it goes (the
   * hub's upstream GET and client streams), as for the upstream's 404.
   */
  readonly dropLocal?: (sessionId: string) => void
}

/**
 * A lost session a request recorded again, until the upstream's answer
 * settles it. `created`: this request's adoption made the record (another
 * request may have made it first): only that one is counted.
 */
interface Recovery { readonly sessionId: string, readonly epoch: string, readonly intactSince: number, readonly created: boolean }

/**
 * The upstream's word on a request that recorded a lost session again, from
 * its answer: a 2xx confirms the session; an answer that says the upstream
 * does not know it (lostSession: a 404, or the SDK example servers' 400)
 * refuses it; anything else says nothing of the session (a 5xx while it
 * restarts, a 405 for a GET it does not serve). With the answer to pass on
 * (its start read, when it had to be).
 */
export async function answerVerdict (answer: UpstreamResponse): Promise<{ readonly verdict: AdoptionVerdict, readonly res: UpstreamResponse }> {
  if (answer.statusCode >= 200 && answer.statusCode < 300) return { verdict: 'confirmed', res: answer }
  const { lost, res } = await lostSession(answer)
  return { verdict: lost ? 'refused' : 'unanswered', res }
}

/**
 * The same, from the error that ended the request: the gateway's 404 (the
 * upstream, or the endpoint that held the session, no longer knows it)
 * refuses it; no answer, or a re-establishment not possible yet, says nothing.
 */
export function failureVerdict (err: unknown): AdoptionVerdict {
  return err instanceof GatewayError && err.statusCode === 404 ? 'refused' : 'unanswered'
}

export function createPrincipalResolver (config: GatewayConfig): PrincipalResolver {
  return config.jwt === undefined ? new HeaderPrincipal(config.principalHeader) : new JwtPrincipal(config.jwt)
}

/** A session in logs: 12 hex characters (48 bits) tell sessions apart without giving the id away. */
export function sessionHash (sessionId: string): string {
  return createHash('sha256').update(sessionId).digest('hex').slice(0, 12)
}

/**
 * The binding of sessions to principals on the MCP endpoint: who a request
 * acts for, whether the session it names is theirs, and the recovery of
 * sessions the store lost. A session's events are only ever served to the
 * principal that created it; anything else looks like a missing session.
 */
export class SessionGuard {
  readonly #config: GatewayConfig
  readonly #store: EventStore
  readonly #metrics: GatewayMetrics
  readonly #sessions: SessionCache
  readonly #principals: PrincipalResolver
  readonly #dropLocal: ((sessionId: string) => void) | undefined
  /** Issues the session ids clients see, and checks their binding. */
  readonly ids: SessionIdIssuer
  /** Identities resolved before the handler runs (a JWT's verification is asynchronous). */
  readonly #identities = new WeakMap<FastifyRequest, Identity>()
  /** Lost sessions a request recorded again, until the upstream's answer settles them. */
  readonly #recovering = new WeakMap<FastifyRequest, Recovery>()

  constructor (options: SessionGuardOptions) {
    this.#config = options.config
    this.#store = options.store
    this.#metrics = options.metrics
    this.#sessions = options.sessions
    this.#principals = options.principals ?? createPrincipalResolver(options.config)
    this.#dropLocal = options.dropLocal
    this.ids = new SessionIdIssuer(options.config.sessionBindingKey)
  }

  /**
   * Resolve every request's identity as it arrives on `app` (the MCP route's
   * context), before its body is read: the handlers then ask for it
   * synchronously. A request that fails verification is not refused here: it
   * is refused where a principal is needed (a stateless modern-era request
   * goes on to the upstream, which answers for its token itself).
   */
  register (app: FastifyInstance): void {
    if (this.#principals.kind === 'header') return
    app.addHook('onRequest', async (request) => {
      this.#identities.set(request, await this.#principals.identify(request.headers))
    })
  }

  /** The principal the request acts for; throws 401 (or 503) when its token could not be verified. */
  principalOf (request: FastifyRequest): string {
    const identity = this.#identities.get(request) ?? this.#principals.identify(request.headers)
    if (identity instanceof Promise) throw new Error('the principal of a request is resolved by the hook SessionGuard.register adds')
    if (identity.error !== undefined) throw identity.error
    return identity.principal
  }

  /** principalOf, for a request the hook did not see (a path outside the MCP endpoint). */
  async verifiedPrincipalOf (request: FastifyRequest): Promise<string> {
    if (!this.#identities.has(request)) this.#identities.set(request, await this.#principals.identify(request.headers))
    return this.principalOf(request)
  }

  /**
   * The session's record, if it belongs to `principal`. `recoverFor`: the
   * request goes on to the upstream, which confirms or refuses a session the
   * store lost (settleRecovery). `read`: 'store' reads the record from the
   * store even when this replica verified it within the cache's time (the
   * cache still serves when the store fails): for a request that must reach
   * the upstream session the record names now, which another replica may
   * have just moved.
   */
  async requireSession (sessionId: string, principal: string, recoverFor?: FastifyRequest, read: 'cached' | 'store' = 'cached'): Promise<SessionRecord> {
    // The id's own binding first, before the store: it holds whether or not
    // the store has the session's records (see protocol/session-id.ts).
    if (!this.boundTo(sessionId, principal)) throw errors.sessionNotFound()
    const sessions = this.#sessions
    let record: SessionRecord | null | undefined = read === 'cached' ? sessions.fresh(sessionId) : undefined
    if (record === undefined) {
      try {
        record = await this.#metrics.timeStore('get_session', () => this.#store.getSession(sessionId))
      } catch (err) {
        // Degraded mode: a session verified before the store failed keeps working.
        record = sessions.stale(sessionId)
        if (record === undefined) {
          throw errors.storeUnavailable(err)
        }
      }
      const known = sessions.stale(sessionId)
      if (record === null && recoverFor !== undefined) record = await this.recoverLostSession(sessionId, principal, recoverFor)
      // Who owned a session the store lost stays known: another principal's attempt must not erase it.
      if (record === null && (known === undefined || known.principal === principal)) sessions.delete(sessionId)
      else if (record !== null) sessions.set(sessionId, record)
    }
    // Another principal's session looks exactly like a missing one.
    if (record === null || record.principal !== principal) throw errors.sessionNotFound()
    return record
  }

  /**
   * Whether `principal` may act on the session id: the creator of an id the
   * gateway issued; anyone, as far as the id alone tells, for an id without a
   * binding (recorded before the gateway issued its own ids: its record decides).
   */
  boundTo (sessionId: string, principal: string): boolean {
    const parsed = parseSessionId(sessionId)
    return parsed.kind === 'unbound' || this.ids.verify(parsed, principal)
  }

  /**
   * A session the store does not know, from a client that had it. When the
   * store lost its records since then (Redis restarted empty, the embedded
   * store's process restarted) and no longer ago than a session lives, it is
   * recorded again, under a new epoch, bound to this request's principal: the
   * client's old ids then read as a gap. The request goes on to the upstream,
   * which decides whether the session still exists: see settleRecovery.
   * Only a session id the gateway issued is recovered, and only for the
   * principal its binding names (checked before, in requireSession): whoever
   * learnt the id gets 404, before or after the loss. An id without a binding
   * is never recovered: after a loss nothing tells who created it. The
   * record goes on toward the upstream session this replica last knew the
   * session by, else the one the id names.
   */
  async recoverLostSession (sessionId: string, principal: string, request: FastifyRequest): Promise<SessionRecord | null> {
    try {
      const adopted = await this.#adoptLost(sessionId, principal, { confirmation: 'pending' })
      if (adopted === null) return null
      const { record, intactSince, created } = adopted
      if (record.principal === principal) this.#beginRecovery(request, { sessionId, epoch: record.epoch, intactSince, created })
      return record
    } catch (err) {
      throw errors.storeUnavailable(err)
    }
  }

  /**
   * A session the store lost while the upstream was still streaming an
   * answer of it: one of its requests', made for `principal`, or its
   * standalone GET's (`principal` from the session's last record, and
   * `placement` where that GET goes, `hold` its lease, taken with the
   * record). The upstream answering is its confirmation, so it is recorded
   * again at once (same rules as recoverLostSession); null when it is not to
   * be, or the store has it for another principal already. Throws when the
   * store fails.
   */
  async recoverDuringAnswer (sessionId: string, principal: string, log: FastifyBaseLogger, placement?: UpstreamPlacement, hold?: LeaseHold): Promise<SessionRecord | null> {
    const adopted = await this.#adoptLost(sessionId, principal, { current: placement, hold, confirmation: 'confirmed' })
    if (adopted === null || adopted.record.principal !== principal) return null
    const { record, intactSince, created } = adopted
    this.#sessions.set(sessionId, record)
    // Another answer (or request) may have recorded it again first: counted once, by that one.
    if (created) {
      this.#metrics.sessionsRecovered.inc()
      log.warn({ sessionHash: sessionHash(sessionId), epoch: record.epoch, storeIntactSince: new Date(intactSince).toISOString() },
        'a session the event store had lost (it restarted empty, or evicted it) while the upstream was answering goes on under a new epoch; resuming clients are told of the gap')
    }
    return record
  }

  /**
   * A session the store does not know, named by a resume of one of its
   * request streams (which never reaches the upstream, so cannot confirm
   * it): was it `principal`'s, and lost with the store rather than deleted?
   * Then the resume is told its response was lost, not that the session is
   * gone: the session's next request, which reaches the upstream, records it
   * again (recoverLostSession). Nothing is recorded here.
   */
  async lostWithTheStore (sessionId: string, principal: string): Promise<boolean> {
    try {
      return await this.#lostSince(sessionId, principal) !== null
    } catch (err) {
      throw errors.storeUnavailable(err)
    }
  }

  /**
   * Record a lost session again (see recoverLostSession): the store's record,
   * or null when it was not lost, or too long ago. Its upstream placement is
   * `current` (where an upstream GET still open goes), else the last this
   * replica knew of (the upstream may have been given the session again
   * under another id, on another endpoint, since the id was issued), else
   * the upstream session the id names. `hold` and `confirmation`: see
   * EventStore.adoptSession.
   */
  async #adoptLost (sessionId: string, principal: string, { current, hold, confirmation }: { current?: UpstreamPlacement | undefined, hold?: LeaseHold | undefined, confirmation: AdoptOptions['confirmation'] }): Promise<(Adoption & { intactSince: number }) | null> {
    const lost = await this.#lostSince(sessionId, principal)
    if (lost === null) return null
    const known = current ?? this.#sessions.stale(sessionId)
    const placement: UpstreamPlacement = known === undefined
      ? { upstreamSessionId: lost.firstUpstreamId }
      : { upstreamSessionId: known.upstreamSessionId, ...(known.endpoint !== undefined && { endpoint: known.endpoint }) }
    const adoption = await this.#metrics.timeStore('adopt_session', () => this.#store.adoptSession(sessionId, principal, { placement, ...(hold !== undefined && { hold }), confirmation }))
    // Deleted since #lostSince looked: it stays deleted.
    return adoption === null ? null : { ...adoption, intactSince: lost.intactSince }
  }

  /**
   * Since when the store has been intact, and the upstream id the session
   * id carries, when the session may be taken for one the store lost:
   * recovery is on under a key of the deployment's own (the built-in key is
   * no secret: anyone can make an id that names another's upstream session
   * and is bound to themselves), the id is bound to `principal` (and no other principal
   * was seen with it), the store lost its data less than a session's
   * lifetime ago, and the session was not deleted (the store's mark of a
   * DELETE or an upstream 404). Null otherwise.
   */
  async #lostSince (sessionId: string, principal: string): Promise<{ intactSince: number, firstUpstreamId: string } | null> {
    if (!this.#config.recoverLostSessions || this.#config.sessionBindingKey === undefined) return null
    const parsed = parseSessionId(sessionId)
    if (parsed.kind !== 'bound' || !this.ids.verify(parsed, principal)) return null
    const known = this.#sessions.stale(sessionId)
    if (known !== undefined && known.principal !== principal) return null
    const intactSince = await this.#metrics.timeStore('intact_since', () => this.#store.intactSince())
    const lostFor = Date.now() - Math.min(intactSince, Date.now())
    // A mark that is not a time (written by something else) reads as intact: no recovery.
    if (!Number.isFinite(lostFor) || lostFor >= this.#config.retention.ttlMs) return null
    // Deleted (its DELETE, or the upstream's 404), not lost: it stays deleted.
    if (await this.#metrics.timeStore('session_deleted', () => this.#store.sessionDeleted(sessionId))) return null
    return { intactSince, firstUpstreamId: parsed.firstUpstreamId }
  }

  /** Did this request record a session the store had lost again, not settled yet (settleRecovery)? */
  recovers (request: FastifyRequest): boolean {
    return this.#recovering.has(request)
  }

  #beginRecovery (request: FastifyRequest, recovery: Recovery): void {
    this.#recovering.set(request, recovery)
  }

  /** A lost session deleted by the request that recorded it again: not counted as recovered, nothing more to drop. */
  forgetRecovery (request: FastifyRequest): void {
    this.#recovering.delete(request)
  }

  /**
   * settleRecovery by the upstream's answer to the request (answerVerdict);
   * returns the answer to pass on. Nothing is read of an answer to a request
   * that recorded nothing.
   */
  async settleAnswered (request: FastifyRequest, answer: UpstreamResponse): Promise<UpstreamResponse> {
    if (!this.#recovering.has(request)) return answer
    let read: Awaited<ReturnType<typeof answerVerdict>>
    try {
      read = await answerVerdict(answer)
    } catch (err) {
      // The answer broke off before it said anything of the session: settled all the same,
      // or the pending adoption would hold the record until its TTL.
      await this.settleRecovery(request, 'unanswered')
      throw err
    }
    await this.settleRecovery(request, read.verdict)
    return read.res
  }

  /**
   * The upstream's word on a request that recorded a lost session again
   * (answerVerdict, failureVerdict): `confirmed`, the session is (counted,
   * logged). Otherwise the record goes again, unless another request gave it
   * a new life meanwhile, or another recovery of the same epoch, on any
   * replica, was confirmed or still waits for its answer (the last of them to
   * settle decides: EventStore.settleAdoption): marked deleted when the
   * upstream said it does not know the session, else left lost, for the
   * session's next request to record again.
   */
  async settleRecovery (request: FastifyRequest, verdict: AdoptionVerdict): Promise<void> {
    const recovery = this.#recovering.get(request)
    if (recovery === undefined) return
    this.#recovering.delete(request)
    const { sessionId, epoch, intactSince, created } = recovery
    let settled: AdoptionSettlement
    try {
      settled = await this.#metrics.timeStore('settle_adoption', () => this.#store.settleAdoption(sessionId, epoch, verdict))
    } catch (err) {
      request.log.warn({ err, verdict }, 'could not tell the store the upstream\'s word on a lost session recorded again (a record the upstream refused expires with its TTL)')
      settled = 'kept'
    }
    if (settled === 'deleted') {
      this.#sessions.delete(sessionId)
      try {
        this.#dropLocal?.(sessionId)
      } catch (err) {
        // The upstream's answer is passed on all the same; what is held here ends at its next check.
        request.log.warn({ err }, 'could not drop what this process holds of a session the upstream refused')
      }
    }
    // Still lost: where it lives upstream stays known here, for its next recovery (#adoptLost).
    if (settled === 'dropped') this.#sessions.unverify(sessionId)
    if (verdict !== 'confirmed' || !created) return
    this.#metrics.sessionsRecovered.inc()
    request.log.warn({ sessionHash: sessionHash(sessionId), epoch, storeIntactSince: new Date(intactSince).toISOString() },
      'a session the event store had lost (it restarted empty, or evicted it) goes on under a new epoch; resuming clients are told of the gap')
  }

  /**
   * For requests proxied transparently that name a session: it must be one
   * the gateway knows, bound to the caller, whatever the protocol revision
   * claims. The modern era has no sessions, so its clients send no session
   * id; one that does could only mean a session a legacy upstream would
   * honour, and a session id whose record expired must not pass under any
   * principal. No recovery here (these are not the session's own methods).
   */
  async requireKnownSessionOrStateless (sessionId: string, request: FastifyRequest): Promise<SessionRecord> {
    const principal = this.principalOf(request)
    return await this.requireSession(sessionId, principal)
  }
}
