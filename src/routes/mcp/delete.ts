/**
 * DELETE on the MCP endpoint: the session ends upstream, then its records
 * go. Fails closed: while the store cannot drop them, the client gets 503
 * and retries.
 */
import type { FastifyReply, FastifyRequest } from 'fastify'
import { errors } from '../../errors.js'
import { discardBody, type UpstreamResponse } from '../../upstream/client.js'
import { sessionRequest } from '../../upstream/session-request.js'
import { forwardTransparently, sendUpstreamResponse, upstreamHeadersFor } from '../forward.js'
import type { McpContext } from './context.js'
import { sessionIdOf } from './request-headers.js'

/** Whether the upstream's answer to a DELETE means the session is gone there. */
export function sessionGone (statusCode: number): boolean {
  return (statusCode >= 200 && statusCode < 300) || statusCode === 404
}

export async function handleDelete (ctx: McpContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const { guard } = ctx
  const { hub } = ctx.deps
  const sessionId = sessionIdOf(request)
  if (sessionId === undefined) return await forwardTransparently(ctx.deps, request, reply, undefined)
  const record = await guard.requireSession(sessionId, guard.principalOf(request), request)
  let res: UpstreamResponse
  hub.deleteForwarded(sessionId)
  try {
    res = await ctx.timedUpstream('DELETE', () => ctx.deps.upstream.request(sessionRequest(record, {
      method: 'DELETE', path: request.url, headers: upstreamHeadersFor(request, false)
    })))
  } catch (err) {
    hub.deleteRefused(sessionId)
    await guard.settleRecovery(request, false)
    throw err
  }
  const gone = sessionGone(res.statusCode)
  if (!gone) {
    hub.deleteRefused(sessionId)
    await guard.settleRecovery(request, false)
    return sendUpstreamResponse(ctx.deps, reply, res)
  }
  // A lost session deleted at once is not counted as recovered: its records go below.
  guard.recovering.delete(request)
  ctx.sessions.delete(sessionId)
  hub.dropSession(sessionId)
  try {
    await ctx.deps.metrics.timeStore('delete_session', () => ctx.deps.store.deleteSession(sessionId))
  } catch (err) {
    // Fail closed: the client retries the DELETE until the records are gone.
    discardBody(res.body)
    throw errors.storeUnavailable(err)
  }
  return sendUpstreamResponse(ctx.deps, reply, res)
}
