import type { FastifyBaseLogger, FastifyError, FastifyInstance } from 'fastify'
import type { GatewayConfig } from '../config/load.js'
import { errors, GatewayError, jsonRpcErrorBody } from '../errors.js'
import { servedWhileDraining } from '../lifecycle/drain.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import { headerLines, requestAuthority } from '../net/request-authority.js'
import { requestIdOfBody } from '../protocol/request-stream.js'
import { headerValue } from '../upstream/headers.js'
import { sessionHash } from './mcp/session-guard.js'
import { targetAuthority } from './path.js'

type HookConfig = Pick<GatewayConfig, 'allowedHosts' | 'allowedOrigins' | 'mcpPath' | 'maxBodyBytes' | 'principalHeader'>

export interface HookParts {
  readonly metrics: GatewayMetrics
  readonly fromTrustedProxy: (address: string | undefined) => boolean
  readonly isDraining: () => boolean
}

/**
 * What every request of the MCP listener goes through, whatever its path:
 * the Host check (DNS-rebinding protection), the drain, the Origin check, one
 * log line at its end, and refusals answered as JSON-RPC errors and counted.
 */
export function registerRequestHooks (app: FastifyInstance, config: HookConfig, parts: HookParts): void {
  app.decorateRequest('fromTrustedProxy', false)
  app.decorateRequest('authority', null)
  // One value for every request (on the prototype): the configuration's.
  app.decorateRequest('principalHeader', config.principalHeader)
  // DNS-rebinding protection, before anything else looks at the request (or its body is read).
  app.addHook('onRequest', async request => {
    request.fromTrustedProxy = parts.fromTrustedProxy(request.socket.remoteAddress)
    const authority = requestAuthority(config.allowedHosts, {
      hosts: headerLines(request.raw.rawHeaders, 'host'),
      targetAuthority: request.originalUrl === request.url ? undefined : targetAuthority(request.originalUrl),
      trustedPeer: request.fromTrustedProxy,
      forwardedHost: headerValue(request.headers['x-forwarded-host']),
      forwardedProto: headerValue(request.headers['x-forwarded-proto']),
      forwarded: headerValue(request.headers.forwarded),
      protocol: 'encrypted' in request.socket ? 'https' : 'http'
    })
    if (authority.kind === 'malformed') throw errors.badHost(authority.reason)
    if (authority.kind === 'forbidden') throw errors.hostForbidden()
    request.authority = authority
  })

  app.addHook('onRequest', async (request, reply) => {
    // Set on the socket's response: streamed answers (written through reply.raw) carry it too.
    reply.raw.setHeader('x-request-id', request.id)
    if (parts.isDraining()) {
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
    parts.metrics.countRefusal(gatewayError.statusCode, gatewayError.code)
    logRefusal(request.log, gatewayError, err)
    if (reply.raw.headersSent) {
      reply.raw.destroy()
      return
    }
    reply.code(gatewayError.statusCode).headers(gatewayError.headers).type('application/json')
    // The MCP endpoint's bodies are buffers: a request with an id gets its error under that id.
    return jsonRpcErrorBody(gatewayError, Buffer.isBuffer(request.body) ? requestIdOfBody(request.body) ?? null : null)
  })
}

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
