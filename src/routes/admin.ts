import type { FastifyInstance } from 'fastify'
import type { EventStore } from '../store/contract.js'
import type { GatewayMetrics } from '../metrics/metrics.js'

export interface AdminDeps {
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly isDraining: () => boolean
  /** How long readiness waits for the store before calling it down. */
  readonly pingTimeoutMs: number
}

/**
 * Liveness, readiness and metrics, on their own port so they never shadow a
 * path of the upstream.
 */
export function registerAdminRoutes (admin: FastifyInstance, deps: AdminDeps): void {
  admin.get('/healthz', async () => ({ status: 'ok' }))

  admin.get('/readyz', async (_request, reply) => {
    if (deps.isDraining()) return await reply.code(503).send({ status: 'draining' })
    let timer: NodeJS.Timeout | undefined
    try {
      await Promise.race([
        deps.store.ping(),
        new Promise((_resolve, reject) => { timer = setTimeout(() => reject(new Error('store ping timed out')), deps.pingTimeoutMs) })
      ])
    } catch (err) {
      reply.log.warn({ err }, 'not ready: the event store does not answer')
      return await reply.code(503).send({ status: 'store_unavailable', store: deps.store.kind })
    } finally {
      clearTimeout(timer)
    }
    return { status: 'ready', store: deps.store.kind }
  })

  admin.get('/metrics', async (_request, reply) => {
    reply.type(deps.metrics.registry.contentType)
    return await deps.metrics.registry.metrics()
  })
}
