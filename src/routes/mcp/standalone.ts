/**
 * A session's standalone stream: the upstream GET runs once per session
 * (here, or on the replica that holds it) and is recorded; each client GET
 * follows the store from where it stands.
 */
import type { FastifyBaseLogger as Logger, FastifyReply, FastifyRequest } from 'fastify'
import { errors, isSessionReestablishing } from '../../errors.js'
import type { ProtocolInfo } from '../../protocol/era.js'
import type { EventPosition } from '../../protocol/event-id.js'
import { StreamFollower } from '../../sessions/follower.js'
import { STANDALONE_STREAM, type SessionRecord, type StreamState } from '../../store/contract.js'
import { discardBody, type UpstreamResponse } from '../../upstream/client.js'
import { lostSession, upstreamUnreachable } from '../../sessions/reestablish.js'
import { sendUpstreamResponse } from '../forward.js'
import type { McpContext } from './context.js'
import { enterReplay, observeReplay, openWithGap, readFirstPage, writeFirstPage } from './replay.js'
import { upstreamGetHeaders } from './request-headers.js'
import { resumePoint } from './resume-point.js'
import { failureVerdict, sessionHash } from './session-guard.js'

/**
 * The session's upstream GET held (see SessionHub.ensurePump). When the
 * upstream lost the session (lostSession, or no answer: its process gone), the
 * session is established there again and the GET opened once more under
 * the new upstream id, which the pump reads from the record.
 */
async function ensurePump (ctx: McpContext, request: FastifyRequest, sessionId: string, record: SessionRecord, headers: Record<string, string | string[]>, log: Logger): Promise<UpstreamResponse | null> {
  const { hub } = ctx.deps
  let refusal: UpstreamResponse | null
  try {
    refusal = await hub.ensurePump(sessionId, headers, log)
  } catch (err) {
    if (!upstreamUnreachable(err)) throw err
    const moved = await ctx.reestablish(request, sessionId, record, 'unanswered')
    if (moved === undefined) {
      await ctx.endedWith(err, sessionId, log)
      throw err
    }
    return await ensuredAgain(ctx, request, sessionId, moved, hub.ensurePump(sessionId, headers, log))
  }
  if (refusal === null) return null
  const told = await lostSession(refusal)
  const moved = told.lost ? await ctx.reestablish(request, sessionId, record, 'answered') : undefined
  if (moved === undefined) return told.res
  discardBody(told.res.body)
  return await ensuredAgain(ctx, request, sessionId, moved, hub.ensurePump(sessionId, headers, log))
}

/**
 * The upstream GET asked for again after a re-establishment (at `moved`): the
 * upstream losing the session once more is not its last word (see McpContext.sentAgain).
 */
async function ensuredAgain (ctx: McpContext, request: FastifyRequest, sessionId: string, moved: SessionRecord, ensured: Promise<UpstreamResponse | null>): Promise<UpstreamResponse | null> {
  const refusal = await ensured
  return refusal === null ? null : await ctx.sentAgain(request, sessionId, moved, refusal)
}

export async function attachStandalone (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, record: SessionRecord, position: EventPosition | null): Promise<unknown> {
  const { guard } = ctx
  const log = request.log.child({ sessionHash: sessionHash(sessionId), streamId: STANDALONE_STREAM })
  // Without the gateway's ids, which mean nothing upstream: the upstream GET starts fresh,
  // under the session's upstream id (the pump addresses it).
  const headers = upstreamGetHeaders(request, 'keep')
  let refusal: UpstreamResponse | null
  try {
    refusal = await ensurePump(ctx, request, sessionId, record, headers, log)
  } catch (err) {
    // The upstream lost the session and cannot be given it again yet (it is restarting):
    // the GET is not refused. A client gives its GET up after a few refused reconnects
    // (the SDK's default: two, in about 2.5 s, whatever Retry-After says), and would never
    // hear from the session's standalone stream again. It follows the store instead, as
    // when another replica holds the stream; the stream's lease, free, comes to this
    // replica, which tries the upstream GET again and, while it still fails, closes the
    // client stream, whose reconnect (a stream that opened counts as no failure) tries
    // the re-establishment again. A session the store had lost is not kept on that
    // ground: the upstream never confirmed it (left lost, for the next request to try).
    if (!isSessionReestablishing(err) || guard.recovers(request)) {
      await guard.settleRecovery(request, failureVerdict(err))
      throw err
    }
    log.info('the session\'s upstream is not back yet: the client\'s GET follows the store until its upstream GET can be opened')
    refusal = null
  }
  // null: the upstream GET runs (here, or on the replica that holds it).
  if (refusal === null) await guard.settleRecovery(request, 'confirmed')
  else refusal = await guard.settleAnswered(request, refusal)
  if (refusal !== null) {
    // The upstream no longer knows the session: neither do we.
    if (refusal.statusCode === 404) await ctx.forgetSession(sessionId, log)
    return sendUpstreamResponse(ctx.deps, reply, refusal)
  }
  if (position === null) return await follow(ctx, reply, proto, sessionId, record, null, headers, log)
  const release = enterReplay(ctx, sessionId, STANDALONE_STREAM)
  try {
    return await follow(ctx, reply, proto, sessionId, record, position, headers, log)
  } finally {
    release()
  }
}

/** The client attached from its position (a resume) or the session's cursor, then followed live. */
async function follow (ctx: McpContext, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, record: SessionRecord, position: EventPosition | null, headers: Record<string, string | string[]>, log: Logger): Promise<void> {
  const { store, metrics, hub } = ctx.deps
  const startedAt = performance.now()
  // Both asked at once (one round trip on Redis, in this order on its connection).
  // A client without a position gets what was recorded since the last connection
  // stopped: nothing recorded in a reconnect gap is dropped for want of a cursor.
  const asked = Promise.all([
    metrics.timeStore('open_stream', () => store.openStream(sessionId, STANDALONE_STREAM)),
    position === null ? metrics.timeStore('load_cursor', () => store.loadCursor(sessionId, STANDALONE_STREAM)) : 0
  ])
  // A resume's first page right behind them (see writeFirstPage).
  const firstPage = position === null ? null : readFirstPage(ctx, sessionId, STANDALONE_STREAM, position.seq)
  let state: StreamState
  let cursor: number
  try {
    ;[state, cursor] = await asked
  } catch (err) {
    throw errors.storeUnavailable(err)
  }
  const start = resumePoint(state, position, record, cursor)
  const client = ctx.clientStream(reply, log, position === null ? 'standalone' : 'resume', state.epoch, STANDALONE_STREAM, proto)
  hub.attachStandalone(sessionId, client, headers, log)
  client.onClose(() => {
    store.saveCursor(sessionId, STANDALONE_STREAM, client.lastSeq).catch((err: unknown) => log.warn({ err }, 'could not save the stream cursor'))
  })
  openWithGap(ctx, client, log, position, start)
  const pages = firstPage !== null && start.gap === undefined ? writeFirstPage(ctx.replayPages, client, await firstPage) : ctx.replayPages
  await new StreamFollower({ store, metrics, log, client, sessionId, ...pages, untilEnded: false }).start()
  if (position !== null) observeReplay(ctx, client, startedAt)
}
