import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyError } from 'fastify'
import { fastifySSE } from '@fastify/sse'
import { randomBytes } from 'node:crypto'
import { STATUS_CODES } from 'node:http'
import type { Readable } from 'node:stream'
import type { Tracer } from '@opentelemetry/api'
import type { Logger } from 'pino'
import { createLogger } from './logger.js'
import { LeaseCoordinator } from './cluster/coordinator.js'
import { drainReplica, servedWhileDraining } from './lifecycle/drain.js'
import type { LeaseBackend } from './cluster/lease.js'
import { LocalLeaseBackend } from './cluster/local-lease-backend.js'
import type { GatewayConfig } from './config/load.js'
import { errors, GatewayError, jsonRpcErrorBody } from './errors.js'
import { GatewayMetrics } from './metrics/metrics.js'
import { InFlight } from './recording/inflight.js'
import { SessionHub } from './sessions/session-hub.js'
import { PrincipalQuota } from './sessions/principal-quota.js'
import { registerAdminRoutes } from './routes/admin.js'
import { forwardTransparently } from './routes/forward.js'
import { SessionReestablisher } from './sessions/reestablish.js'
import { disguisesMcpPath, originForm, targetAuthority } from './routes/path.js'
import { headerLines, requestAuthority } from './net/request-authority.js'
import { headerValue } from './upstream/headers.js'
import { isTrusted, trustedProxyList } from './net/trusted-proxies.js'
import { limitConnections } from './routes/connection-limits.js'
import { requestIdOfBody } from './protocol/request-stream.js'
import { registerMcpRoute } from './routes/mcp/index.js'
import { sessionHash, type SessionGuard } from './routes/mcp/session-guard.js'
import { isPublicPath, pathTrick } from './net/request-path.js'
import { traceRequests } from './tracing/spans.js'
import type { EventStore, SessionRecord } from './store/contract.js'
import { UpstreamClient } from './upstream/client.js'
import { systemResolver, UpstreamDiscovery, type HostResolver } from './upstream/discovery.js'
import { EndpointSet } from './upstream/endpoint-set.js'
import { SessionPlacement } from './upstream/session-placement.js'
import { VERSION } from './version.js'
import { LazyChildLogger } from './lazy-logger.js'

/** How long recorders whose upstream answer was cut at shutdown get to store its end. */
const CUT_SETTLE_MS = 1000

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
 * Refusals the gateway expects (a client's mistake, draining, a store or
 * upstream that is down) are logged without a stack, below error level: a
 * rollout or an outage is not a flood of errors. Only the unexpected is an error.
 */
function logRefusal (log: FastifyBaseLogger, refusal: GatewayError, err: Error): void {
  const fields = { code: refusal.code, statusCode: refusal.statusCode, ...(refusal.cause instanceof Error && { cause: refusal.cause.message }) }
  if (!(err instanceof GatewayError) && refusal.statusCode >= 500) log.error({ err }, 'request failed')
  else if (refusal.statusCode >= 500 && refusal.code !== 'MCPGW_DRAINING') log.warn(fields, refusal.message)
  else log.info(fields, refusal.message)
}

/** Sessions whose placement this process remembers (about 0.2 KB each); beyond, the least recently used go first. */
const PLACEMENT_MAX_SESSIONS = 100_000

/**
 * The upstream client over the endpoints of UPSTREAM_URL, the names among
 * them resolved before the gateway serves, and again as their DNS answers
 * age. One endpoint that never needs DNS needs no placement either.
 */
async function upstreamClient (config: GatewayConfig, deps: GatewayDeps, logger: Logger): Promise<{ upstream: UpstreamClient, discovery: UpstreamDiscovery | undefined }> {
  if (deps.upstream !== undefined) return { upstream: deps.upstream, discovery: undefined }
  const targets = config.upstreamTargets
  const endpoints = new EndpointSet(targets, { setAsideMs: config.upstreamSetAsideMs, random: deps.placementRandom })
  const several = targets.length > 1 || targets.some(t => t.resolvable)
  const placement = several ? new SessionPlacement({ maxSessions: PLACEMENT_MAX_SESSIONS, ttlMs: config.retention.ttlMs }) : undefined
  const upstream = new UpstreamClient({ endpoints, placement, headersTimeoutMs: config.upstreamHeadersTimeoutMs })
  if (!targets.some(t => t.resolvable)) return { upstream, discovery: undefined }
  const discovery = new UpstreamDiscovery({ targets, endpoints, resolver: deps.resolveHost ?? systemResolver, maxAgeMs: config.upstreamResolveMs, log: logger.child({ component: 'upstream-discovery' }) })
  await discovery.start()
  return { upstream, discovery }
}

/** Build the gateway; it does not listen until `listen()` (tests call this with port 0). */
export async function buildGateway (config: GatewayConfig, deps: GatewayDeps): Promise<Gateway> {
  const logger = deps.logger ?? createLogger(config.logLevel)
  const store = deps.store
  const metrics = deps.metrics ?? new GatewayMetrics({ version: VERSION, store: store.kind })
  metrics.reportStoreHealth(logger as FastifyBaseLogger)
  if (store.usage !== undefined) metrics.watchMemoryStore({ usage: store.usage.bind(store) })
  const { upstream, discovery } = await upstreamClient(config, deps, logger)
  metrics.watchUpstreamEndpoints(() => upstream.endpoints.snapshot())
  const inflight = new InFlight()
  let draining = false
  if (config.allowedHosts.kind === 'any') logger.warn('ALLOWED_HOSTS is *: no Host check, so no DNS-rebinding protection; list the names clients use instead')
  const trustedProxies = trustedProxyList(config.trustedProxies)
  const fromTrustedProxy = (address: string | undefined): boolean => isTrusted(trustedProxies, address)

  const app = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    logController: new LogController({ disableRequestLogging: true }),
    // A request's logger is made when it first logs: most never do (an idle stream's memory).
    childLoggerFactory: LazyChildLogger.factory,
    bodyLimit: config.maxBodyBytes,
    genReqId: req => {
      const given = req.headers['x-request-id']
      // 72 random bits in 12 characters: a string this short is one flat string
      // (randomUUID()'s is a rope of ten, ~0.3 KB that an idle stream keeps).
      return typeof given === 'string' && /^[\w.:-]{1,128}$/.test(given) ? given : randomBytes(9).toString('base64url')
    },
    forceCloseConnections: true,
    // Forwarding headers (X-Forwarded-*) are believed from TRUSTED_PROXIES only: request.ip, .protocol, .host.
    trustProxy: config.trustedProxies.length > 0 ? (address: string) => fromTrustedProxy(address) : false,
    // Absolute-form targets ("GET http://other/x") are routed, checked and forwarded by their path only.
    rewriteUrl: req => originForm(req.url ?? '/'),
    http: {
      // Oversized header blocks get 431 from Node's parser before any handler runs.
      maxHeaderSize: config.maxHeaderBytes,
      // A request (headers, then body) must arrive in time: a stalled body holds
      // its buffered bytes. Only the receiving is timed; answers stream as long
      // as they last. Node checks every connectionsCheckingInterval.
      requestTimeout: config.requestReadTimeoutMs,
      headersTimeout: Math.min(config.requestReadTimeoutMs, 60_000),
      connectionsCheckingInterval: Math.min(1000, config.requestReadTimeoutMs)
    },
    requestTimeout: config.requestReadTimeoutMs,
    // Requests Node's HTTP parser refuses get a JSON-RPC error body like every other refusal.
    clientErrorHandler: (err: NodeJS.ErrnoException, socket) => {
      if (err.code === 'ECONNRESET' || !socket.writable) {
        socket.destroy()
        return
      }
      const refusal = err.code === 'HPE_HEADER_OVERFLOW'
        ? errors.headersTooLarge(config.maxHeaderBytes)
        : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? errors.requestTimeout(config.requestReadTimeoutMs / 1000)
          : errors.badHttp()
      const body = jsonRpcErrorBody(refusal)
      metrics.countRefusal(refusal.statusCode, refusal.code)
      socket.end(`HTTP/1.1 ${refusal.statusCode} ${STATUS_CODES[refusal.statusCode] ?? ''}\r\n` +
        `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`)
      // Node leaves the socket to this handler: a peer that neither reads nor closes must not keep it.
      setTimeout(() => socket.destroy(), 1000).unref()
    }
  })
  limitConnections(app.server, {
    maxConnections: config.maxConnections,
    maxPerAddress: config.maxConnectionsPerAddress,
    exempt: fromTrustedProxy
  })
  if (deps.tracer !== undefined) {
    // First of the hooks: refusals get their span too.
    traceRequests(app, deps.tracer, fromTrustedProxy)
    metrics.traceStore(deps.tracer)
  }
  const leases = new LeaseCoordinator({
    backend: deps.leases ?? store.leaseBackend?.() ?? new LocalLeaseBackend(),
    ttlMs: config.leaseTtlMs,
    holdMs: config.standaloneHoldMs,
    log: logger as FastifyBaseLogger
  })
  leases.start()
  const hub = new SessionHub({
    upstream,
    store,
    metrics,
    log: logger as FastifyBaseLogger,
    mcpPath: config.mcpPath,
    holdMs: config.standaloneHoldMs,
    earlyHoldMs: config.standaloneEarlyHoldMs,
    maxEventBytes: config.maxEventBytes,
    maxSessions: config.maxSessions,
    upstreamResumes: config.upstreamResumes,
    leases,
    admission: new PrincipalQuota({
      maxPerPrincipal: config.maxSessionsPerPrincipal,
      principalOf: async sessionId => (await store.getSession(sessionId))?.principal
    })
  })

  await app.register(fastifySSE)

  app.decorateRequest('fromTrustedProxy', false)
  app.decorateRequest('authority', null)
  // DNS-rebinding protection, before anything else looks at the request (or its body is read).
  app.addHook('onRequest', async request => {
    request.fromTrustedProxy = fromTrustedProxy(request.socket.remoteAddress)
    const authority = requestAuthority(config.allowedHosts, {
      hosts: headerLines(request.raw.rawHeaders, 'host'),
      targetAuthority: request.originalUrl === request.url ? undefined : targetAuthority(request.originalUrl),
      trustedPeer: request.fromTrustedProxy,
      forwardedHost: headerValue(request.headers['x-forwarded-host']),
      forwardedProto: headerValue(request.headers['x-forwarded-proto']),
      protocol: 'encrypted' in request.socket ? 'https' : 'http'
    })
    if (authority.kind === 'malformed') throw errors.badHost(authority.reason)
    if (authority.kind === 'forbidden') throw errors.hostForbidden()
    request.authority = authority
  })

  app.addHook('onRequest', async (request, reply) => {
    // Set on the socket's response: streamed answers (written through reply.raw) carry it too.
    reply.raw.setHeader('x-request-id', request.id)
    if (draining) {
      // The client's next attempt opens a new connection, to a ready replica.
      reply.header('connection', 'close')
      if (!servedWhileDraining({ method: request.method, routeUrl: request.routeOptions.url, sessionId: request.headers['mcp-session-id'] }, config.mcpPath)) throw errors.draining()
    }
    const origin = request.headers.origin
    if (config.allowedOrigins !== null && origin !== undefined && !config.allowedOrigins.has(origin)) {
      throw errors.originForbidden()
    }
  })

  // One log line per request, at its end (for streams, when the stream closes).
  app.addHook('onResponse', async (request, reply) => {
    const sessionId = request.headers['mcp-session-id'] ?? reply.getHeader('mcp-session-id')
    request.log.info({
      ...(typeof sessionId === 'string' && { sessionHash: sessionHash(sessionId) }),
      req: { method: request.method, url: request.url },
      res: { statusCode: reply.statusCode },
      responseTime: Math.round(reply.elapsedTime)
    }, 'request completed')
  })

  app.setErrorHandler(async (err: FastifyError, request, reply) => {
    const gatewayError = (err as Error) instanceof GatewayError
      ? err as unknown as GatewayError
      : err.code === 'FST_ERR_CTP_BODY_TOO_LARGE'
        ? errors.bodyTooLarge(config.maxBodyBytes)
        : err.statusCode === undefined || err.statusCode >= 500
          ? errors.internal()
          // fastify's own refusals (a media type it cannot parse...) keep their code; counted as reason "other".
          : new GatewayError(err.code ?? 'MCPGW_INTERNAL', err.statusCode >= 400 ? err.statusCode : 500, err.message)
    metrics.countRefusal(gatewayError.statusCode, gatewayError.code)
    logRefusal(request.log, gatewayError, err)
    if (reply.raw.headersSent) {
      reply.raw.destroy()
      return
    }
    reply.code(gatewayError.statusCode).headers(gatewayError.headers).type('application/json')
    // The MCP endpoint's bodies are buffers: a request with an id gets its error under that id.
    return jsonRpcErrorBody(gatewayError, Buffer.isBuffer(request.body) ? requestIdOfBody(request.body) ?? null : null)
  })

  // The MCP endpoint gets whole bodies (they are small JSON-RPC messages, bounded by MAX_BODY_BYTES).
  let guard: SessionGuard | undefined
  await app.register(async mcp => {
    mcp.removeAllContentTypeParsers()
    mcp.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => { done(null, body) })
    const reestablisher = config.reestablishUpstreamSessions
      ? new SessionReestablisher({ store, upstream, metrics, mcpPath: config.mcpPath, maxAnswerBytes: config.maxEventBytes })
      : undefined
    guard = registerMcpRoute(mcp, { maxBodyBytes: config.maxBodyBytes, config, store, hub, upstream, metrics, inflight, leases, reestablisher, random: deps.random })
  })
  const sessionGuard = guard as SessionGuard

  // Every other path of the upstream origin is proxied as it is, streamed, after
  // the MCP endpoint's checks: an upstream may serve MCP on more paths than one.
  await app.register(async proxy => {
    proxy.removeAllContentTypeParsers()
    proxy.addContentTypeParser('*', (_req, payload, done) => { done(null, payload) })
    proxy.route({
      method: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'HEAD'],
      url: '/*',
      handler: async (request, reply) => {
        // RFC 9110 section 9.3.7: OPTIONS * asks about the server, not a resource:
        // the gateway answers for itself (the upstream would get "*" as a path).
        if (request.url === '*' && request.method === 'OPTIONS') return await reply.code(204).header('allow', 'GET, POST, DELETE, OPTIONS, HEAD').send()
        const trick = pathTrick(request.url)
        if (trick !== undefined) throw errors.badPath(trick)
        if (disguisesMcpPath(request.url, config.mcpPath)) throw errors.nonCanonicalMcpPath(config.mcpPath)
        const sessionId = request.headers['mcp-session-id']
        // PUBLIC_PATHS (OAuth metadata: fetched before a token exists) need no
        // principal; a request naming a session needs its own, on any path, and
        // goes upstream under the id the upstream knows it by, like the MCP path's.
        let session: SessionRecord | undefined
        if (sessionId !== undefined || !isPublicPath(request.url, config.publicPaths)) {
          await sessionGuard.verifiedPrincipalOf(request)
          if (sessionId !== undefined) session = await sessionGuard.requireKnownSessionOrStateless(String(sessionId), request)
        }
        return await forwardTransparently({ upstream, metrics, maxBodyBytes: config.maxBodyBytes }, request, reply, request.body as Readable | undefined, session)
      }
    })
  })

  const admin = Fastify({ loggerInstance: logger.child({ listener: 'admin' }) as FastifyBaseLogger, logController: new LogController({ disableRequestLogging: true }) })
  // The same DNS-rebinding protection: a page in a local browser must not read /metrics.
  admin.addHook('onRequest', async (request, reply) => {
    const authority = requestAuthority(config.adminAllowedHosts, { hosts: headerLines(request.raw.rawHeaders, 'host'), trustedPeer: false, protocol: 'http' })
    if (authority.kind !== 'served') {
      const refusal = authority.kind === 'malformed' ? errors.badHost(authority.reason) : errors.hostForbidden()
      return await reply.code(refusal.statusCode).type('application/json').send(jsonRpcErrorBody(refusal))
    }
  })
  registerAdminRoutes(admin, { store, metrics, isDraining: () => draining, pingTimeoutMs: 2000, upstream, mcpPath: config.mcpPath })

  let drained: Promise<void> | undefined
  const drain = async (): Promise<void> => {
    drained ??= (async () => {
      draining = true
      await drainReplica({
        hub,
        inflight,
        server: app.server,
        log: logger as FastifyBaseLogger,
        graceMs: config.shutdownGraceMs,
        spreadMs: config.drainSpreadMs,
        // The client reconnects after the retry hint, then asks for its stream.
        handoverWaitMs: config.retryMs + 1500,
        retryMs: config.retryMs,
        exitRetryMs: config.drainRetryMs
      })
    })()
    return await drained
  }

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
    drain,
    async close () {
      await drain()
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
}
