import type { FastifyBaseLogger, FastifyInstance } from 'fastify'
import type { LeaseCoordinator } from '../cluster/coordinator.js'
import type { GatewayConfig } from '../config/load.js'
import type { InFlight } from '../recording/inflight.js'
import type { SessionHub } from '../sessions/session-hub.js'
import type { EventStore } from '../store/contract.js'
import type { UpstreamClient } from '../upstream/client.js'
import type { UpstreamDiscovery } from '../upstream/discovery.js'
import { drainReplica } from './drain.js'

/** How long recorders whose upstream answer was cut at shutdown get to store its end: one append each, within drain's EXIT_MARGIN_MS. */
const CUT_SETTLE_MS = 1000
/**
 * Beyond the retry hint, how long a held upstream GET waits for its client to
 * come back on another replica: a reconnect over a new connection, its
 * Last-Event-ID GET and the lease claim there take well under this.
 */
const HANDOVER_MARGIN_MS = 1500

type ShutdownConfig = Pick<GatewayConfig, 'shutdownGraceMs' | 'drainSpreadMs' | 'sseRetryMs' | 'drainRetryMs'>

/** What a gateway stops, in the order it stops them. */
export interface ShutdownParts {
  readonly app: FastifyInstance
  readonly admin: FastifyInstance
  readonly hub: SessionHub
  readonly inflight: InFlight
  readonly discovery: UpstreamDiscovery | undefined
  readonly upstream: UpstreamClient
  readonly leases: LeaseCoordinator
  readonly store: EventStore
  readonly log: FastifyBaseLogger
}

/**
 * A gateway's end: the drain once (readiness false, client streams moved,
 * recordings finished), then the listeners, the upstream client, the leases
 * and the store closed in that order.
 */
export class GatewayShutdown {
  readonly #config: ShutdownConfig
  readonly #parts: ShutdownParts
  #draining = false
  #drained: Promise<unknown> | undefined

  constructor (config: ShutdownConfig, parts: ShutdownParts) {
    this.#config = config
    this.#parts = parts
  }

  /** True from the first call of drain(): readiness is false and new work is refused. */
  get draining (): boolean { return this.#draining }

  async drain (): Promise<void> {
    const config = this.#config
    const { hub, inflight, app, log } = this.#parts
    // Set before the drain's first step: readiness is false from its start.
    this.#draining = true
    this.#drained ??= drainReplica({
      hub,
      inflight,
      server: app.server,
      log,
      graceMs: config.shutdownGraceMs,
      spreadMs: config.drainSpreadMs,
      // The client reconnects after the retry hint, then asks for its stream.
      handoverWaitMs: config.sseRetryMs + HANDOVER_MARGIN_MS,
      retryMs: config.sseRetryMs,
      exitRetryMs: config.drainRetryMs
    })
    await this.#drained
  }

  async close (): Promise<void> {
    const { app, admin, discovery, upstream, inflight, leases, store } = this.#parts
    await this.drain()
    await app.close()
    await admin.close()
    // The drain is over: whatever is still being read upstream is cut (close()
    // would wait for it), and the recorders get a moment to store the error
    // answer that ends each such stream.
    discovery?.stop()
    await upstream.destroy()
    if (inflight.size > 0) await inflight.settle(CUT_SETTLE_MS)
    await leases.close()
    await store.close()
  }
}
