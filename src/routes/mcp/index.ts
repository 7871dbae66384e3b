/**
 * The MCP endpoint (Streamable HTTP, transports spec). Legacy-era requests
 * (MCP-Protocol-Version up to 2025-11-25) get recorded, resumable streams;
 * modern-era requests are proxied transparently. Each method has its module:
 * post.ts, get.ts (standalone.ts, resume.ts), delete.ts; session-guard.ts
 * decides who a request acts for and whether its session is theirs.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import { errors } from '../../errors.js'
import { protocolInfo, type ProtocolInfo } from '../../protocol/era.js'
import { KeepAliveTicker } from '../../sse/keep-alive.js'
import { SessionReestablisher } from '../../sessions/reestablish.js'
import { LEFT_BEHIND_CONCURRENCY, LEFT_BEHIND_MAX, LEFT_BEHIND_TIMEOUT_MS, LeftBehind } from '../../sessions/left-behind.js'
import { LEAVING_MAX_MS } from '../../upstream/endpoint-state.js'
import { forwardTransparently, ROUTED_METHODS } from '../forward.js'
import { McpContext, type McpRouteDeps } from './context.js'
import { handleDelete } from './delete.js'
import { handleGet } from './get.js'
import { handlePost } from './post.js'
import { InitializeRate, isInitializeRequest } from './initialize-rate.js'
import { admitAnswer } from './issued-session.js'
import { SessionRateLimiter } from './rate-limit.js'
import { ReplayLimiter } from './replay-limit.js'
import { ANSWERED_CHECK_MS, ANSWERED_HOLDS_PER_SESSION, AnsweredHolds, heldInStore } from './answered-holds.js'
import { isIdentityCoded, sessionIdOf } from './request-headers.js'
import { SessionCache } from './session-cache.js'
import { SessionGuard } from './session-guard.js'

export type { McpRouteDeps } from './context.js'

/**
 * The MCP endpoint in a plugin scope of its own, which gets whole bodies
 * (small JSON-RPC messages, bounded by MAX_BODY_BYTES); sessions are
 * established upstream again unless REESTABLISH_UPSTREAM_SESSIONS=false.
 * Returns the session guard, which every other proxied path goes through too.
 */
export async function registerMcpEndpoint (app: FastifyInstance, deps: Omit<McpRouteDeps, 'maxBodyBytes' | 'reestablisher'>): Promise<SessionGuard> {
  const { config } = deps
  let guard: SessionGuard | undefined
  await app.register(async mcp => {
    mcp.removeAllContentTypeParsers()
    mcp.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => { done(null, body) })
    const reestablisher = config.reestablishUpstreamSessions ? sessionReestablisher(mcp, deps) : undefined
    if (reestablisher !== undefined) deps.metrics.watchReestablishments(reestablisher)
    guard = registerMcpRoute(mcp, { ...deps, maxBodyBytes: config.maxBodyBytes, reestablisher })
  })
  return guard as SessionGuard
}

/** Re-establishments, and the upstream sessions they move away from to be deleted, stopped with `scope`. */
function sessionReestablisher (scope: FastifyInstance, deps: Omit<McpRouteDeps, 'maxBodyBytes' | 'reestablisher'>): SessionReestablisher {
  const { config, upstream, metrics } = deps
  const leftBehind = new LeftBehind({
    send: async request => await upstream.request(request),
    named: async sessionId => (await deps.store.getSession(sessionId))?.upstreamSessionId,
    listed: endpoint => upstream.endpoints.routeOf(endpoint) !== undefined,
    path: config.mcpPath,
    retryMs: config.upstreamSetAsideMs,
    waitMs: config.reestablishDeleteAfterMs,
    maxAgeMs: LEAVING_MAX_MS,
    max: LEFT_BEHIND_MAX,
    concurrency: LEFT_BEHIND_CONCURRENCY,
    requestTimeoutMs: LEFT_BEHIND_TIMEOUT_MS,
    settled: outcome => { metrics.upstreamSessionsLeftBehind.inc({ outcome }) }
  })
  scope.addHook('onClose', async () => { leftBehind.close() })
  return new SessionReestablisher({ store: deps.store, upstream, metrics, mcpPath: config.mcpPath, maxAnswerBytes: config.maxEventBytes, concurrency: config.reestablishConcurrency, leftBehind })
}

/**
 * Sessions tracked per replica (verified records, request budgets): more
 * sessions make requests than hold an upstream GET (MAX_SESSIONS), and a
 * forgotten one only costs a store read or a full budget again.
 */
const TRACKED_PER_HELD_SESSION = 4
const MIN_TRACKED_SESSIONS = 10_000
/**
 * A record verified this recently is not read again: a burst on one session
 * costs one store read, and a session deleted through another replica is
 * still taken for live here for 2 s at most.
 */
const SESSION_FRESH_MS = 2000

/**
 * The methods the MCP endpoint defines in the legacy era (transports spec,
 * Streamable HTTP), each with its handler. Any other method, and every
 * request of the modern era, is forwarded as it is, past the principal check.
 */
type LegacyHandler = (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo) => Promise<unknown>
const LEGACY_HANDLERS: ReadonlyMap<string, LegacyHandler> = new Map<string, LegacyHandler>([
  ['POST', handlePost],
  ['GET', handleGet],
  ['DELETE', handleDelete]
])

/** Registers the MCP endpoint; returns its guard, which every other proxied path goes through too. */
export function registerMcpRoute (app: FastifyInstance, deps: McpRouteDeps): SessionGuard {
  const { config } = deps
  const entries = Math.max(MIN_TRACKED_SESSIONS, config.maxSessions * TRACKED_PER_HELD_SESSION)
  const sessions = new SessionCache({ freshMs: SESSION_FRESH_MS, staleMs: config.retention.ttlMs, maxEntries: entries })
  const answeredHolds = new AnsweredHolds({
    max: ANSWERED_HOLDS_PER_SESSION,
    checkMs: ANSWERED_CHECK_MS,
    alive: heldInStore(deps.store)
  })
  // A session gone here: its upstream GET and clients, the resumes held or followed and the recordings of its answers.
  const dropLocal = (sessionId: string): void => {
    deps.hub.dropSession(sessionId)
    answeredHolds.endSession(sessionId)
  }
  // Who requests act for, and whether the sessions they name are theirs.
  const guard = new SessionGuard({ config, store: deps.store, metrics: deps.metrics, sessions, dropLocal })
  guard.register(app)
  // An upstream GET held here whose session the store loses goes on: the session is recorded
  // again for the principal of its last record, under the same rules as any recovery, with
  // the GET's lease.
  deps.hub.recoverLostWith(async (sessionId, record, log, token) => {
    const placement = { upstreamSessionId: record.upstreamSessionId, ...(record.endpoint !== undefined && { endpoint: record.endpoint }) }
    const again = await guard.recoverDuringAnswer(sessionId, record.principal, log, placement, { token, ttlMs: config.leaseTtlMs })
    return again !== null
  })
  const limiter = new SessionRateLimiter({ ratePerSecond: config.sessionRequestsPerSecond, maxEntries: entries })
  const initializes = new InitializeRate({ perMinute: config.initializesPerMinutePerAddress, maxEntries: entries })
  const keepAlive = new KeepAliveTicker(config.keepaliveIntervalMs)
  app.addHook('onClose', async () => {
    keepAlive.stop()
    answeredHolds.stop()
  })
  const ctx = new McpContext(deps, { sessions, guard, keepAlive, replays: new ReplayLimiter(config.maxReplaysPerStream), answeredHolds, initializes, dropLocal })

  app.route({
    method: [...ROUTED_METHODS],
    url: config.mcpPath,
    // Keep-alive comments come from the streams' own ticker (sse/keep-alive.ts).
    sse: { kind: 'manual', heartbeat: false },
    // Before the body is read: a compressed body is refused whatever it holds.
    onRequest: async request => {
      if (!isIdentityCoded(request.headers['content-encoding'])) throw errors.unsupportedContentEncoding()
    },
    handler: async (request, reply) => {
      const versionHeader = request.headers['mcp-protocol-version']
      const proto = protocolInfo(versionHeader)
      if (proto === null) throw errors.badProtocolVersion(String(versionHeader))
      const sessionId = sessionIdOf(request)
      const sessionLess = sessionId === undefined && request.method === 'POST'
      // INITIALIZES_PER_MINUTE_PER_ADDRESS. A legacy-era initialize the gateway reads as one is
      // refused here, before the upstream (only session-less POST bodies are parsed to tell).
      // Any other session-less POST is counted if the upstream issues it a session, in either
      // era (post.ts, issued-session.ts); none is counted twice.
      if (sessionLess && proto.era === 'legacy' && isInitializeRequest(request.body as Buffer | undefined)) {
        // request.ip: the peer, or the client a trusted proxy forwards for.
        const wait = initializes.beforeUpstream(request)
        if (wait > 0) throw errors.initializeRateLimited(wait)
      }
      if (sessionId !== undefined) {
        // Keyed by session and principal: someone who learnt a session id cannot
        // exhaust its owner's budget.
        const wait = limiter.take(`${guard.principalOf(request)} ${sessionId}`)
        if (wait > 0) throw errors.rateLimited(wait)
      }
      const handle = proto.era === 'legacy' ? LEGACY_HANDLERS.get(request.method) : undefined
      if (handle === undefined) {
        // Never a way around the principal binding: a session this gateway knows is
        // checked whatever the method or the protocol revision claimed.
        const record = sessionId === undefined ? undefined : await guard.requireKnownSessionOrStateless(sessionId, request)
        // Methods the MCP endpoint does not define need a verified token, as on any other
        // path; OPTIONS does not: a browser's CORS preflight never carries credentials.
        if (sessionId === undefined && proto.era === 'legacy' && request.method !== 'OPTIONS') await guard.verifiedPrincipalOf(request)
        return await forwardTransparently(deps, request, reply, request.body as Buffer | undefined, record,
          sessionLess ? res => { admitAnswer(ctx, request, res) } : undefined)
      }
      return await handle(ctx, request, reply, proto)
    }
  })
  return guard
}
