import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from 'fastify'
import type { EventStore } from '../store/contract.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import { errors, GatewayError, jsonRpcErrorBody } from '../errors.js'
import { headerLines, requestAuthority } from '../net/request-authority.js'
import type { HostPolicy } from '../net/host-policy.js'
import { discardBody, UpstreamAbort, type UpstreamClient } from '../upstream/client.js'
import { servePipelinedInTurn } from './pipelining.js'

export interface AdminDeps {
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly isDraining: () => boolean
  /** How long readiness waits for the store (and /upstreamz for the upstream) before calling it down. */
  readonly pingTimeoutMs: number
  readonly upstream: UpstreamClient
  /** The MCP endpoint's path on the upstream, which /upstreamz asks. */
  readonly mcpPath: string
}

export type UpstreamProbe = { readonly reachable: true, readonly statusCode: number } | { readonly reachable: false, readonly code: string, readonly statusCode?: number }

/**
 * Asks the upstream's MCP endpoint for its stream without a session: any HTTP
 * answer below 500 (400, 405, 401 and the like) shows a server that answers;
 * the body, if any, is dropped unread.
 */
export async function probeUpstream (upstream: UpstreamClient, path: string, timeoutMs: number): Promise<UpstreamProbe> {
  const abort = new UpstreamAbort()
  const timer = setTimeout(() => abort.abort(), timeoutMs)
  try {
    const res = await upstream.request({ method: 'GET', path, headers: { accept: 'text/event-stream' }, signal: abort })
    discardBody(res.body)
    return res.statusCode < 500 ? { reachable: true, statusCode: res.statusCode } : { reachable: false, code: 'upstream_error_status', statusCode: res.statusCode }
  } catch (err) {
    if (abort.aborted) return { reachable: false, code: 'timeout' }
    return { reachable: false, code: err instanceof GatewayError ? err.code : 'unknown' }
  } finally {
    clearTimeout(timer)
  }
}

/**
 * Liveness, readiness, upstream health and metrics, on their own port so they
 * never shadow a path of the upstream.
 *
 * Readiness is this process's own ability to serve: not draining, and its
 * event store answers. The upstream is left out on purpose: it is shared by
 * every replica, so a readiness tied to it would take them all out of the
 * balancer at once, turning the gateway's JSON-RPC errors into the balancer's
 * bare refusals and stopping the replays the store can still serve. Its health
 * is reported apart, by /upstreamz.
 */
export function registerAdminRoutes (admin: FastifyInstance, deps: AdminDeps): void {
  admin.get('/healthz', async () => ({ status: 'ok' }))

  admin.get('/readyz', async (_request, reply) => {
    if (deps.isDraining()) return await reply.code(503).send({ status: 'draining' })
    let timer: NodeJS.Timeout | undefined
    try {
      await Promise.race([
        deps.store.ping(),
        // The verdict waits for the loop's next poll: after the process itself stood still
        // past the timeout, its overdue timer runs before the answer in the socket is read.
        new Promise((_resolve, reject) => { timer = setTimeout(() => setImmediate(() => reject(new Error('store ping timed out'))), deps.pingTimeoutMs) })
      ])
    } catch (err) {
      reply.log.warn({ err }, 'not ready: the event store does not answer')
      return await reply.code(503).send({ status: 'store_unavailable', store: deps.store.kind })
    } finally {
      clearTimeout(timer)
    }
    return { status: 'ready', store: deps.store.kind }
  })

  // The probe goes where a request without a session would; the endpoints are listed with their state.
  admin.get('/upstreamz', async (_request, reply) => {
    const probe = await probeUpstream(deps.upstream, deps.mcpPath, deps.pingTimeoutMs)
    const endpoints = deps.upstream.endpoints.snapshot().map(({ until, ...view }) => ({ ...view, ...(until !== undefined && { until: new Date(until).toISOString() }) }))
    if (probe.reachable) return { status: 'reachable', statusCode: probe.statusCode, endpoints }
    reply.log.warn({ code: probe.code, statusCode: probe.statusCode }, 'the upstream does not answer')
    return await reply.code(503).send({ status: 'unreachable', code: probe.code, ...(probe.statusCode !== undefined && { statusCode: probe.statusCode }), endpoints })
  })

  admin.get('/metrics', async (_request, reply) => {
    reply.type(deps.metrics.registry.contentType)
    return await deps.metrics.registry.metrics()
  })
}

/**
 * The admin listener: the routes above behind the same DNS-rebinding
 * protection as the MCP listener (a page in a local browser must not read
 * /metrics), with ADMIN_HOST's own host policy.
 */
export function buildAdminServer (logger: FastifyBaseLogger, allowedHosts: HostPolicy, deps: AdminDeps): FastifyInstance {
  const admin = Fastify({ loggerInstance: logger.child({ listener: 'admin' }), logController: new LogController({ disableRequestLogging: true }) })
  // Pipelined /upstreamz probes must not reach the upstream all at once.
  servePipelinedInTurn(admin)
  admin.addHook('onRequest', async (request, reply) => {
    const authority = requestAuthority(allowedHosts, { hosts: headerLines(request.raw.rawHeaders, 'host'), trustedPeer: false, protocol: 'http' })
    if (authority.kind !== 'served') {
      const refusal = authority.kind === 'malformed' ? errors.badHost(authority.reason) : errors.hostForbidden()
      return await reply.code(refusal.statusCode).type('application/json').send(jsonRpcErrorBody(refusal))
    }
  })
  registerAdminRoutes(admin, deps)
  return admin
}
