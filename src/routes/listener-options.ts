import { LogController, type FastifyBaseLogger, type FastifyHttpOptions } from 'fastify'
import { randomBytes } from 'node:crypto'
import { STATUS_CODES, type Server } from 'node:http'
import type { GatewayConfig } from '../config/load.js'
import { errors, jsonRpcErrorBody } from '../errors.js'
import { LazyChildLogger } from '../lazy-logger.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import { originForm } from './path.js'

type ListenerConfig = Pick<GatewayConfig, 'maxBodyBytes' | 'maxHeaderBytes' | 'requestReadTimeoutMs' | 'trustedProxies'>

/** Node's own cap on the time to receive headers (its default); REQUEST_READ_TIMEOUT_SECONDS may only shorten it. */
const HEADERS_TIMEOUT_MAX_MS = 60_000
/** How often Node checks the request timeouts: a second late at most, without a timer per connection. */
const TIMEOUT_CHECK_MS = 1000
/** A peer refused by the HTTP parser gets this long to read its error before the socket is destroyed. */
const REFUSED_SOCKET_LINGER_MS = 1000

/** The MCP listener's fastify options: logging, request ids, limits, timeouts, and the parser's refusals. */
export function listenerOptions (config: ListenerConfig, parts: { logger: FastifyBaseLogger, metrics: GatewayMetrics, fromTrustedProxy: (address: string | undefined) => boolean }): FastifyHttpOptions<Server, FastifyBaseLogger> {
  const { metrics } = parts
  return {
    loggerInstance: parts.logger,
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
    trustProxy: config.trustedProxies.length > 0 ? (address: string) => parts.fromTrustedProxy(address) : false,
    // Absolute-form targets ("GET http://other/x") are routed, checked and forwarded by their path only.
    rewriteUrl: req => originForm(req.url ?? '/'),
    http: {
      // Oversized header blocks get 431 from Node's parser before any handler runs.
      maxHeaderSize: config.maxHeaderBytes,
      // A request (headers, then body) must arrive in time: a stalled body holds
      // its buffered bytes. Only the receiving is timed; answers stream as long
      // as they last. Node checks every connectionsCheckingInterval.
      requestTimeout: config.requestReadTimeoutMs,
      headersTimeout: Math.min(config.requestReadTimeoutMs, HEADERS_TIMEOUT_MAX_MS),
      connectionsCheckingInterval: Math.min(TIMEOUT_CHECK_MS, config.requestReadTimeoutMs)
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
      setTimeout(() => socket.destroy(), REFUSED_SOCKET_LINGER_MS).unref()
    }
  }
}
