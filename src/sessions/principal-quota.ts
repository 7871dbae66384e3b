import { errors } from '../errors.js'

/**
 * How a stream comes to be held here: `new` (a client's GET claims it) is
 * refused past its principal's share; `takeover` (the lease came free while a
 * client was attached here: another replica drained or died) is counted but
 * never refused, since refusing it would leave the upstream GET unheld.
 */
export type AdmissionKind = 'new' | 'takeover'

/**
 * Admission of upstream GET streams (SessionHub): a place reserved per session
 * while its stream is held here. The holder (StandaloneHolder) reserves the
 * place before it takes the lease, or before a takeover's pump; the place is
 * freed when the pump stops, save a pump the upstream refused, whose place
 * stays with its starter for another attempt: the starter frees it when it
 * gives up (SessionHub for a client's GET, StandaloneHolder for a takeover),
 * and a pump moved to the session's new upstream placement, whose place
 * passes with its lease to the pump that follows it there (StandaloneHolder.follow).
 * After a failover a principal may hold more than its share here (within
 * MAX_SESSIONS): its new streams are refused until it is back under.
 */
export interface PumpAdmission {
  /** Reserve the session's place (idempotent); throws (429) for a `new` stream whose principal already holds its share. */
  admit (sessionId: string, kind?: AdmissionKind): Promise<void>
  /** The session's upstream GET is not, or no longer, held here. Idempotent. */
  release (sessionId: string): void
}

export interface PrincipalQuotaOptions {
  /** Upstream GET streams one principal may have held by this process at once. */
  readonly maxPerPrincipal: number
  /**
   * The principal a session is bound to (its stored record); undefined when
   * unknown. Requests without credentials share one principal, counted like
   * any other: otherwise anyone could fill MAX_SESSIONS without a token.
   */
  readonly principalOf: (sessionId: string) => Promise<string | undefined>
}

/**
 * MAX_SESSIONS_PER_PRINCIPAL: one principal cannot take every upstream GET
 * this process may hold (MAX_SESSIONS), for instance by opening sessions and
 * leaving them, each then held STANDALONE_HOLD_SECONDS: it gets 429 for its
 * own new streams while other principals still get theirs.
 */
export class PrincipalQuota implements PumpAdmission {
  readonly #max: number
  readonly #principalOf: PrincipalQuotaOptions['principalOf']
  /** Sessions holding a place, and whose principal they count for. */
  readonly #holders = new Map<string, string>()
  readonly #counts = new Map<string, number>()

  constructor (options: PrincipalQuotaOptions) {
    this.#max = options.maxPerPrincipal
    this.#principalOf = options.principalOf
  }

  /** Places held by `principal`, for tests. */
  held (principal: string): number { return this.#counts.get(principal) ?? 0 }

  async admit (sessionId: string, kind: AdmissionKind = 'new'): Promise<void> {
    if (this.#holders.has(sessionId)) return
    let principal: string | undefined
    try {
      principal = await this.#principalOf(sessionId)
    } catch {
      // The store did not answer: the quota is a fairness bound, not the binding; MAX_SESSIONS still holds.
      return
    }
    if (principal === undefined || this.#holders.has(sessionId)) return
    const count = this.#counts.get(principal) ?? 0
    if (count >= this.#max && kind === 'new') throw errors.tooManyPrincipalSessions()
    this.#holders.set(sessionId, principal)
    this.#counts.set(principal, count + 1)
  }

  release (sessionId: string): void {
    const principal = this.#holders.get(sessionId)
    if (principal === undefined) return
    this.#holders.delete(sessionId)
    const count = (this.#counts.get(principal) ?? 1) - 1
    if (count <= 0) this.#counts.delete(principal)
    else this.#counts.set(principal, count)
  }
}
