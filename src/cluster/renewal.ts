import type { FastifyBaseLogger as Logger } from 'fastify'
import { Lease, type ControlSubscription, type LeaseBackend, type LeaseGrant, type RenewResult } from './lease.js'

/**
 * How long drain waits for its control subscriptions before going on without
 * them: a subscription is one round trip on a live store; one slower than a
 * second would take the drain's time from the streams it hands over.
 */
const SUBSCRIBE_WAIT_MS = 1000

/**
 * The leases this replica holds: renewed by every tick (a holder that stops
 * renewing loses its lease after LEASE_TTL_MS), and handed over while
 * draining to the first replica that asks.
 */
export class HeldLeases {
  readonly backend: LeaseBackend
  readonly #log: Logger
  readonly #held = new Map<string, Lease>()
  readonly #drainSubscriptions = new Map<string, ControlSubscription>()

  constructor (backend: LeaseBackend, log: Logger) {
    this.backend = backend
    this.#log = log
  }

  get size (): number { return this.#held.size }

  /** The leases to renew now. */
  list (): Lease[] { return [...this.#held.values()].filter(lease => lease.renewable) }

  /** A grant is this replica's lease from now on (one per session: an older one is lost). */
  hold (sessionId: string, grant: LeaseGrant): Lease {
    const lease = new Lease(this, sessionId, grant)
    this.#held.get(sessionId)?.lose('lost')
    this.#held.set(sessionId, lease)
    return lease
  }

  /** A lease was released or lost. */
  forgetHeld (lease: Lease): void {
    if (this.#held.get(lease.sessionId) === lease) this.#held.delete(lease.sessionId)
    this.#drainSubscriptions.get(lease.sessionId)?.off()
    this.#drainSubscriptions.delete(lease.sessionId)
  }

  /** What a tick's renewals found, one outcome per lease of `leases`. */
  renewed (leases: readonly Lease[], outcomes: readonly RenewResult[]): void {
    outcomes.forEach((outcome, i) => {
      const lease = leases[i] as Lease
      if (outcome === 'renewed' || lease.settled) return
      if (outcome === 'moved') {
        lease.tellMoved()
        return
      }
      this.#log.warn({ outcome }, outcome === 'gone' ? 'lease: session records gone' : 'lease: another replica holds the stream now')
      lease.lose(outcome)
    })
  }

  /** Shutting down: each held stream goes to the first replica that asks (`want`); watchers are told now. */
  async beginDrain (): Promise<void> {
    await Promise.all([...this.#held.values()].map(async lease => {
      const subscription = this.backend.subscribeControl(lease.sessionId, message => {
        if (message.kind === 'want' && message.origin !== this.backend.replicaId) lease.tellHandoverRequest()
      })
      this.#drainSubscriptions.set(lease.sessionId, subscription)
      let timer: NodeJS.Timeout | undefined
      await Promise.race([subscription.ready, new Promise(resolve => { timer = setTimeout(resolve, SUBSCRIBE_WAIT_MS) })])
      clearTimeout(timer)
      if (!lease.settled) await this.backend.publish(lease.sessionId, 'draining').catch(() => {})
    }))
  }

  close (): void {
    for (const subscription of this.#drainSubscriptions.values()) subscription.off()
    this.#drainSubscriptions.clear()
  }
}
