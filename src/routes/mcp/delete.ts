/**
 * DELETE on the MCP endpoint: the session ends upstream, then its records
 * go. Fails closed: while the store cannot drop them, the client gets 503
 * and retries.
 */
import type { FastifyReply, FastifyRequest } from 'fastify'
import { errors, isUpstreamEndpointGone } from '../../errors.js'
import { discardBody, type UpstreamResponse } from '../../upstream/client.js'
import { sessionRequest } from '../../upstream/session-request.js'
import { forwardTransparently, sendUpstreamResponse, upstreamHeadersFor } from '../forward.js'
import type { McpContext } from './context.js'
import { sessionIdOf } from './request-headers.js'
import { failureVerdict } from './session-guard.js'

/** Whether the upstream's answer to a DELETE means the session is gone there. */
export function sessionGone (statusCode: number): boolean {
  return (statusCode >= 200 && statusCode < 300) || statusCode === 404
}

export async function handleDelete (ctx: McpContext, request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
  const sessionId = sessionIdOf(request)
  if (sessionId === undefined) return await forwardTransparently(ctx.deps, request, reply, undefined)
  // Not while the session is being established upstream again: this DELETE would end the
  // upstream session the record named before, and leave the new one open for the server's life.
  // (The id's binding first: another principal's DELETE never holds up the session's re-establishment.)
  const reestablisher = ctx.deps.reestablisher
  if (reestablisher === undefined || !ctx.guard.boundTo(sessionId, ctx.guard.principalOf(request))) return await deleteSession(ctx, request, reply, sessionId)
  return await reestablisher.excluding(sessionId, request.log, async () => await deleteSession(ctx, request, reply, sessionId))
}

async function deleteSession (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, sessionId: string): Promise<unknown> {
  const { guard } = ctx
  const { hub } = ctx.deps
  // Read from the store, not this replica's cache: another replica may have established the
  // session upstream again moments ago, and the DELETE must end the upstream session its record
  // names now (the old one is gone; the new one, never told, would stay for the server's life).
  const record = await guard.requireSession(sessionId, guard.principalOf(request), request, 'store')
  let res: UpstreamResponse
  hub.deleteForwarded(sessionId)
  try {
    res = await ctx.deps.metrics.timeUpstream('DELETE', () => ctx.deps.upstream.request(sessionRequest(record, {
      method: 'DELETE', path: request.url, headers: upstreamHeadersFor(request, false)
    })))
  } catch (err) {
    if (!isUpstreamEndpointGone(err)) {
      hub.deleteRefused(sessionId)
      await guard.settleRecovery(request, failureVerdict(err))
      throw err
    }
    // The endpoint that held the session left, was set aside or refused the connection: the
    // session is ended here as for the upstream's 404, or the client, told 404, would see the
    // session it deleted go on (established again elsewhere at its next request).
    await dropRecords(ctx, request, sessionId)
    throw err
  }
  const gone = sessionGone(res.statusCode)
  if (!gone) {
    hub.deleteRefused(sessionId)
    return sendUpstreamResponse(ctx.deps, reply, await guard.settleAnswered(request, res))
  }
  try {
    await dropRecords(ctx, request, sessionId)
  } catch (err) {
    discardBody(res.body)
    throw err
  }
  return sendUpstreamResponse(ctx.deps, reply, res)
}

/** The session ended: its streams here and its records go; fails closed (503) while the store cannot drop them. */
async function dropRecords (ctx: McpContext, request: FastifyRequest, sessionId: string): Promise<void> {
  // A lost session deleted at once is not counted as recovered: its records go below.
  ctx.guard.forgetRecovery(request)
  ctx.sessions.delete(sessionId)
  ctx.dropLocal(sessionId)
  try {
    await ctx.deps.metrics.timeStore('delete_session', () => ctx.deps.store.deleteSession(sessionId))
  } catch (err) {
    // Fail closed: the client retries the DELETE until the records are gone.
    throw errors.storeUnavailable(err)
  }
}
