/**
 * A session the upstream issued to a session-less POST (its answer carries
 * an Mcp-Session-Id), in either era: counted against the client address's
 * INITIALIZES_PER_MINUTE_PER_ADDRESS where it is made, so that no body the
 * gateway cannot read as an initialize, and no protocol revision the request
 * claims, makes sessions past the limit.
 */
import type { FastifyRequest } from 'fastify'
import { errors } from '../../errors.js'
import type { UpstreamPlacement } from '../../store/contract.js'
import type { UpstreamResponse } from '../../upstream/client.js'
import { headerValue } from '../../upstream/headers.js'
import { abandonUpstreamSession } from '../../upstream/session-request.js'
import type { McpContext } from './context.js'
import { upstreamGetHeaders } from './request-headers.js'

/** How long the DELETE of a refused session may take: best effort, nobody waits for it. */
const REFUSED_DELETE_TIMEOUT_MS = 5000

/**
 * Throws 429 (MCPGW_INITIALIZE_RATE_LIMITED, as before the upstream) when the
 * address has no initialize left; the session is then ended upstream, as a
 * session established in vain is (sessions/reestablish.ts): an SDK server
 * keeps a session until told, and the gateway will never name it. The
 * caller discards the answer's body.
 */
export function admitIssuedSession (ctx: McpContext, request: FastifyRequest, placement: UpstreamPlacement): void {
  const wait = ctx.initializes.sessionIssued(request)
  if (wait === 0) return
  const headers = upstreamGetHeaders(request, 'keep')
  delete headers.accept
  abandonUpstreamSession(async end => await ctx.deps.metrics.timeUpstream('DELETE', () => ctx.deps.upstream.request(end)), placement, request.url, headers, REFUSED_DELETE_TIMEOUT_MS)
  request.log.debug({ retryAfter: wait }, 'a session the upstream issued past INITIALIZES_PER_MINUTE_PER_ADDRESS: ended upstream, the client refused')
  throw errors.initializeRateLimited(wait)
}

/** The same for an answer passed on transparently (the modern era): its session, if it names one. */
export function admitAnswer (ctx: McpContext, request: FastifyRequest, res: UpstreamResponse): void {
  const issued = headerValue(res.headers['mcp-session-id'])
  if (issued !== undefined) admitIssuedSession(ctx, request, { upstreamSessionId: issued, ...(res.endpoint !== undefined && { endpoint: res.endpoint }) })
}
