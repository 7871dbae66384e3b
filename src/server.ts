import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyError } from 'fastify'
import { fastifySSE } from '@fastify/sse'
import { randomBytes } from 'node:crypto'
import type { Readable } from 'node:stream'
import { pino, type Logger } from 'pino'
import { LeaseCoordinator } from './cluster/coordinator.js'
import { drainReplica } from './cluster/drain.js'
import type { LeaseBackend } from './cluster/lease.js'
import { LocalLeaseBackend } from './cluster/local-lease-backend.js'
import type { GatewayConfig } from './config/load.js'
import { errors, GatewayError, jsonRpcErrorBody } from './errors.js'
import { GatewayMetrics } from './metrics/metrics.js'
import { InFlight } from './relay/inflight.js'
import { SessionHub } from './relay/session-hub.js'
import { registerAdminRoutes } from './routes/admin.js'
import { forwardTransparently } from './routes/forward.js'
import { disguisesMcpPath } from './routes/path.js'
import { registerMcpRoute } from './routes/mcp.js'
import type { EventStore } from './store/contract.js'
import { UpstreamClient } from './upstream/client.js'
import { VERSION } from './version.js'
import { LazyChildLogger } from './lazy-logger.js'

export interface GatewayDeps {
  readonly store: EventStore
  readonly logger?: Logger
  readonly metrics?: GatewayMetrics
  readonly upstream?: UpstreamClient
  readonly random?: (size: number) => Uint8Array
  /** Where the upstream GET leases live; by default next to the store (Redis) or in this process. */
  readonly leases?: LeaseBackend
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

/** Fields never logged in clear: credentials travel through the gateway. */
export const REDACT_PATHS = [
  'req.headers.authorization', 'req.headers.cookie', 'req.headers["proxy-authorization"]',
  'req.headers["x-api-key"]', 'res.headers["set-cookie"]', '*.authorization', '*.cookie'
]

export function createLogger (level: string): Logger {
  return pino({ level, redact: { paths: REDACT_PATHS, censor: '[redacted]' } })
}

/** Build the gateway; it does not listen until `listen()` (tests call this with port 0). */
export async function buildGateway (config: GatewayConfig, deps: GatewayDeps): Promise<Gateway> {
  const logger = deps.logger ?? createLogger(config.logLevel)
  const store = deps.store
  const metrics = deps.metrics ?? new GatewayMetrics({ version: VERSION, store: store.kind })
  const upstream = deps.upstream ?? new UpstreamClient({ origin: config.upstreamUrl, headersTimeoutMs: config.upstreamHeadersTimeoutMs })
  const inflight = new InFlight()
  let draining = false

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
    // Oversized header blocks get 431 from Node's parser before any handler runs.
    http: { maxHeaderSize: config.maxHeaderBytes },
    // Upstream answers may take long; nothing here should time a request out.
    requestTimeout: 0,
    // Requests Node's HTTP parser refuses get a JSON-RPC error body like every other refusal.
    clientErrorHandler: (err: NodeJS.ErrnoException, socket) => {
      if (!socket.writable) return
      const tooLarge = err.code === 'HPE_HEADER_OVERFLOW'
      const refusal = new GatewayError(tooLarge ? 'MCPGW_HEADERS_TOO_LARGE' : 'MCPGW_BAD_HTTP', tooLarge ? 431 : 400,
        tooLarge ? `Request Header Fields Too Large: headers are limited to MAX_HEADER_BYTES (${config.maxHeaderBytes}).` : 'Bad Request: the request is not valid HTTP/1.1.')
      const body = jsonRpcErrorBody(refusal)
      socket.end(`HTTP/1.1 ${refusal.statusCode} ${tooLarge ? 'Request Header Fields Too Large' : 'Bad Request'}\r\n` +
        `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`)
    }
  })
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
    maxEventBytes: config.maxEventBytes,
    maxSessions: config.maxSessions,
    leases
  })

  await app.register(fastifySSE)

  app.addHook('onRequest', async (request, reply) => {
    if (draining) {
      // The client's next attempt opens a new connection, to a ready replica.
      reply.header('connection', 'close')
      throw errors.draining()
    }
    const origin = request.headers.origin
    if (config.allowedOrigins !== null && origin !== undefined && !config.allowedOrigins.has(origin)) {
      throw errors.originForbidden()
    }
  })

  // One log line per request, at its end (for streams, when the stream closes).
  app.addHook('onResponse', async (request, reply) => {
    request.log.info({
      req: { method: request.method, url: request.url },
      res: { statusCode: reply.statusCode },
      responseTime: Math.round(reply.elapsedTime)
    }, 'request completed')
  })

  app.setErrorHandler(async (err: FastifyError, request, reply) => {
    const gatewayError = (err as Error) instanceof GatewayError
      ? err as unknown as GatewayError
      : new GatewayError(err.code ?? 'MCPGW_INTERNAL', err.statusCode !== undefined && err.statusCode >= 400 ? err.statusCode : 500,
        err.statusCode !== undefined && err.statusCode < 500 ? err.message : 'Internal error in the gateway.')
    if (gatewayError.statusCode >= 500) request.log.error({ err }, 'request failed')
    else request.log.info({ code: gatewayError.code, statusCode: gatewayError.statusCode }, gatewayError.message)
    if (reply.raw.headersSent) {
      reply.raw.destroy()
      return
    }
    reply.code(gatewayError.statusCode).headers(gatewayError.headers).type('application/json')
    return jsonRpcErrorBody(gatewayError)
  })

  // The MCP endpoint gets whole bodies (they are small JSON-RPC messages, bounded by MAX_BODY_BYTES).
  await app.register(async mcp => {
    mcp.removeAllContentTypeParsers()
    mcp.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => { done(null, body) })
    registerMcpRoute(mcp, { maxBodyBytes: config.maxBodyBytes, config, store, hub, upstream, metrics, inflight, leases, random: deps.random })
  })

  // Every other path of the upstream origin (OAuth metadata and the like) is proxied as it is, streamed.
  await app.register(async proxy => {
    proxy.removeAllContentTypeParsers()
    proxy.addContentTypeParser('*', (_req, payload, done) => { done(null, payload) })
    proxy.route({
      method: ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'HEAD'],
      url: '/*',
      handler: async (request, reply) => {
        if (disguisesMcpPath(request.url, config.mcpPath)) throw errors.nonCanonicalMcpPath(config.mcpPath)
        return await forwardTransparently({ upstream, metrics, maxBodyBytes: config.maxBodyBytes }, request, reply, request.body as Readable | undefined)
      }
    })
  })

  const admin = Fastify({ loggerInstance: logger.child({ listener: 'admin' }) as FastifyBaseLogger, logController: new LogController({ disableRequestLogging: true }) })
  registerAdminRoutes(admin, { store, metrics, isDraining: () => draining, pingTimeoutMs: 2000 })

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
        handoverWaitMs: config.retryMs + 1500
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
      await upstream.close()
      await leases.close()
      await store.close()
    }
  }
}
