/**
 * GET on the MCP endpoint: the session's standalone stream (live, or resumed
 * from a Last-Event-ID on it), or the resume of a request stream.
 */
import type { FastifyReply, FastifyRequest } from 'fastify'
import { errors, isSessionNotFound } from '../../errors.js'
import type { ProtocolInfo } from '../../protocol/era.js'
import { decodeEventId, type EventPosition } from '../../protocol/event-id.js'
import { STANDALONE_STREAM, type SessionRecord } from '../../store/contract.js'
import { forwardTransparently } from '../forward.js'
import type { McpContext } from './context.js'
import { acceptsEventStream, sessionIdOf } from './request-headers.js'
import { answerLostWithTheStore, resumeRequestStream } from './resume.js'
import { attachStandalone } from './standalone.js'

export async function handleGet (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo): Promise<unknown> {
  if (!acceptsEventStream(request.headers.accept)) throw errors.notAcceptable()
  const sessionId = sessionIdOf(request)
  // Without a session there is nothing to record under: a stateless upstream is proxied as is.
  if (sessionId === undefined) return await forwardTransparently(ctx.deps, request, reply, undefined)
  const lastEventId = request.headers['last-event-id']
  let position: EventPosition | null = null
  if (lastEventId !== undefined) {
    position = Array.isArray(lastEventId) ? null : decodeEventId(lastEventId)
    if (position === null) {
      ctx.deps.metrics.resumes.inc({ outcome: 'refused' })
      throw errors.badLastEventId()
    }
  }
  // A session whose records are gone (deleted, expired) gets 404, as the transports
  // spec requires for a terminated session: the client starts a new one. One the store
  // lost is recovered only on the standalone stream, whose upstream GET can refuse it;
  // the resume of a request stream never reaches the upstream, and is told its
  // response was lost (SessionGuard.lostWithTheStore).
  const requestStream = position !== null && position.streamId !== STANDALONE_STREAM ? position : null
  const principal = ctx.guard.principalOf(request)
  if (requestStream === null) return await attachStandalone(ctx, request, reply, proto, sessionId, await ctx.requireSession(request, sessionId, principal, 'recover'), position)
  let record: SessionRecord
  try {
    record = await ctx.requireSession(request, sessionId, principal, 'none')
  } catch (err) {
    // A session the store lost is not a session that ended: its response was lost with
    // the store, and its next request (which the upstream confirms) records it again.
    if (isSessionNotFound(err) && await ctx.guard.lostWithTheStore(sessionId, principal)) return answerLostWithTheStore(ctx, request, reply, proto, sessionId, requestStream)
    throw err
  }
  return await resumeRequestStream(ctx, request, reply, proto, sessionId, record, requestStream)
}
