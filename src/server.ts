import Fastify, { type FastifyBaseLogger, type FastifyInstance } from 'fastify'
import { fastifySSE } from '@fastify/sse'
import type { Tracer } from '@opentelemetry/api'
import type { Logger } from 'pino'
import { createLogger } from './logger.js'
import { LeaseCoordinator } from './cluster/coordinator.js'
import type { LeaseBackend } from './cluster/lease.js'
import { LocalLeaseBackend } from './cluster/local-lease-backend.js'
import type { GatewayConfig } from './config/load.js'
import { GatewayShutdown } from './lifecycle/shutdown.js'
import { GatewayMetrics } from './metrics/metrics.js'
import { isTrusted, trustedProxyList } from './net/trusted-proxies.js'
import { InFlight } from './recording/inflight.js'
import { PrincipalQuota } from './sessions/principal-quota.js'
import { SessionHub } from './sessions/session-hub.js'
import { ClientBuffers } from './sse/client-buffers.js'
import { buildAdminServer } from './routes/admin.js'
import { limitConnections } from './routes/connection-limits.js'
import { listenerOptions } from './routes/listener-options.js'
import { registerMcpEndpoint } from './routes/mcp/index.js'
import { servePipelinedInTurn } from './routes/pipelining.js'
import { registerProxyRoute } from './routes/proxy.js'
import { registerRequestHooks } from './routes/request-hooks.js'
import { traceRequests } from './tracing/spans.js'
import type { EventStore } from './store/contract.js'
import type { UpstreamClient } from './upstream/client.js'
import { createUpstream } from './upstream/create.js'
import type { HostResolver } from './upstream/discovery.js'
import { VERSION } from './version.js'

/**
 * How long /readyz waits for the store, and /upstreamz for the upstream:
 * under the probes' 3 s timeout (Helm chart, Dockerfile HEALTHCHECK), so a
 * probe gets the gateway's 503 and its reason rather than a timeout.
 */
const PING_TIMEOUT_MS = 2000

export interface GatewayDeps {
  readonly store: EventStore
  readonly logger?: Logger
  readonly metrics?: GatewayMetrics
  readonly upstream?: UpstreamClient
  readonly random?: (size: number) => Uint8Array
  /** Where the upstream GET leases live; by default next to the store (Redis) or in this process. */
  readonly leases?: LeaseBackend
  /** OpenTelemetry tracing is on: spans for requests and store operations. */
  readonly tracer?: Tracer
  /** How the host names of UPSTREAM_URL are resolved; by default DNS (node:dns). */
  readonly resolveHost?: HostResolver
  /** In [0, 1): the draws that place new sessions on upstream endpoints. */
  readonly placementRandom?: () => number
}

export interface Gateway {
  readonly app: FastifyInstance
  readonly admin: FastifyInstance
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly hub: SessionHub
  /** Listen on the configured (or given) ports; returns the base URLs. */
  listen (ports?: { port?: number, adminPort?: number }): Promise<{ url: string, adminUrl: string }>
  /** Readiness false, client streams closed with a retry hint, in-flight upstream answers finished. */
  drain (): Promise<void>
  /** Drain, then close listeners, the upstream client and the store. */
  close (): Promise<void>
}

export { createLogger, REDACT_PATHS } from './logger.js'

/**
 * Build the gateway; it does not listen until `listen()` (tests call this with port 0).
 * The MCP listener's requests go through the hooks (Host, drain, Origin), then
 * the MCP endpoint or the proxy of every other path; the hub holds sessions'
 * upstream GETs under leases; the admin listener serves health and metrics.
 */
export async function buildGateway (config: GatewayConfig, deps: GatewayDeps): Promise<Gateway> {
  const logger = deps.logger ?? createLogger(config.logLevel)
  const log = logger as FastifyBaseLogger
  const store = deps.store
  const metrics = deps.metrics ?? new GatewayMetrics({ version: VERSION, store: store.kind })
  metrics.reportStoreHealth(log)
  if (store.usage !== undefined) metrics.watchMemoryStore({ usage: store.usage.bind(store) })
  if (store.connectionsReplaced !== undefined) metrics.watchStoreConnections(store.connectionsReplaced.bind(store))
  const { upstream, discovery } = deps.upstream !== undefined
    ? { upstream: deps.upstream, discovery: undefined }
    : await createUpstream({ targets: config.upstreamTargets, setAsideMs: config.upstreamSetAsideMs, headersTimeoutMs: config.upstreamHeadersTimeoutMs, keepAliveTimeoutMs: config.upstreamKeepaliveTimeoutMs, resolveMs: config.upstreamResolveMs, resolveHost: deps.resolveHost, placementRandom: deps.placementRandom, log: logger })
  metrics.watchUpstreamEndpoints(() => upstream.endpoints.snapshot())
  if (config.allowedHosts.kind === 'any') logger.warn('ALLOWED_HOSTS is *: no Host check, so no DNS-rebinding protection; list the names clients use instead')
  const trustedProxies = trustedProxyList(config.trustedProxies)
  const fromTrustedProxy = (address: string | undefined): boolean => isTrusted(trustedProxies, address)
  const isDraining = (): boolean => shutdown.draining

  const app = Fastify(listenerOptions(config, { logger: log, metrics, fromTrustedProxy }))
  limitConnections(app.server, { maxConnections: config.maxConnections, maxPerAddress: config.maxConnectionsPerAddress, exempt: fromTrustedProxy })
  // First of the hooks: a pipelined request waits for its turn before anything is done for it.
  servePipelinedInTurn(app)
  if (deps.tracer !== undefined) {
    // First of the hooks: refusals get their span too.
    traceRequests(app, deps.tracer, fromTrustedProxy)
    metrics.traceStore(deps.tracer)
  }
  const leases = new LeaseCoordinator({
    backend: deps.leases ?? store.leaseBackend?.() ?? new LocalLeaseBackend(),
    ttlMs: config.leaseTtlMs,
    holdMs: config.standaloneHoldMs,
    log
  })
  leases.start()
  const admission = new PrincipalQuota({ maxPerPrincipal: config.maxSessionsPerPrincipal, principalOf: async sessionId => (await store.getSession(sessionId))?.principal })
  const hub = new SessionHub({ upstream, store, metrics, log, mcpPath: config.mcpPath, holdMs: config.standaloneHoldMs, earlyHoldMs: config.standaloneEarlyHoldMs, maxEventBytes: config.maxEventBytes, maxSessions: config.maxSessions, upstreamResumes: config.upstreamResumes, standaloneReopenFromLastId: config.standaloneReopenFromLastId, leases, admission })
  const inflight = new InFlight()
  // One budget and one write timeout for every client connection: the MCP
  // endpoint's streams and every answer relayed as it is, on any path.
  const buffers = new ClientBuffers({ maxBytes: config.clientBuffersMaxBytes, writeTimeoutMs: config.clientWriteTimeoutMs })
  metrics.watchClientBuffers(buffers)
  app.addHook('onClose', async () => { buffers.stop() })

  await app.register(fastifySSE)
  registerRequestHooks(app, config, { metrics, fromTrustedProxy, isDraining })
  const guard = await registerMcpEndpoint(app, { config, store, hub, upstream, metrics, buffers, inflight, leases, random: deps.random })
  await registerProxyRoute(app, config, { upstream, metrics, buffers, maxBodyBytes: config.maxBodyBytes, guard })
  const admin = buildAdminServer(log, config.adminAllowedHosts, { store, metrics, isDraining, pingTimeoutMs: PING_TIMEOUT_MS, upstream, mcpPath: config.mcpPath })
  const shutdown = new GatewayShutdown(config, { app, admin, hub, inflight, discovery, upstream, leases, store, log })

  return {
    app,
    admin,
    store,
    metrics,
    hub,
    async listen (ports = {}) {
      const url = await app.listen({ host: config.host, port: ports.port ?? config.port })
      const adminUrl = await admin.listen({ host: config.adminHost, port: ports.adminPort ?? config.adminPort })
      return { url, adminUrl }
    },
    drain: async () => { await shutdown.drain() },
    close: async () => { await shutdown.close() }
  }
}
