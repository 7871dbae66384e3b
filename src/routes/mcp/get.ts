/**
 * GET on the MCP endpoint: the session's standalone stream (live, or resumed
 * from a Last-Event-ID on it), or the resume of a request stream.
 */
import type { FastifyReply, FastifyRequest } from 'fastify'
import { errors } from '../../errors.js'
import type { ProtocolInfo } from '../../protocol/era.js'
import { decodeEventId, type EventPosition } from '../../protocol/event-id.js'
import { STANDALONE_STREAM } from '../../store/contract.js'
import { forwardTransparently } from '../forward.js'
import type { McpContext } from './context.js'
import { acceptsEventStream, sessionIdOf } from './request-headers.js'
import { resumeRequestStream } from './resume.js'
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
  // the resume of a request stream never reaches the upstream.
  const requestStream = position !== null && position.streamId !== STANDALONE_STREAM ? position : null
  const record = await ctx.guard.requireSession(sessionId, ctx.guard.principalOf(request), requestStream === null ? request : undefined)
  if (requestStream !== null) return await resumeRequestStream(ctx, request, reply, proto, sessionId, record, requestStream)
  return await attachStandalone(ctx, request, reply, proto, sessionId, record, position)
}
