/**
 * The resume of a request stream (GET with a Last-Event-ID of one): its
 * history replayed from the store, then followed live until the response.
 * Never reaches the upstream. When the history is gone, the request is
 * answered with a JSON-RPC error so the call fails fast instead of hanging.
 */
import type { FastifyBaseLogger as Logger, FastifyReply, FastifyRequest } from 'fastify'
import type { OrphanAnswer } from '../../cluster/lease.js'
import { errors } from '../../errors.js'
import type { ProtocolInfo } from '../../protocol/era.js'
import { encodeEventId, type EventPosition } from '../../protocol/event-id.js'
import { lostResponseError, REPAIRED_SEQ, requestIdOfStream } from '../../protocol/request-stream.js'
import { StreamFollower, writePage } from '../../sessions/follower.js'
import type { SessionRecord, StreamState } from '../../store/contract.js'
import type { McpContext } from './context.js'
import type { ClientStream } from '../../sse/client-stream.js'
import { enterReplay, GAP_HEADER, observeReplay, openWithGap, readFirstPage, writeFirstPage } from './replay.js'
import { LOST_PHRASES, requestResumePosition, resumePoint, type HistoryGone } from './resume-point.js'
import { isResultEvent } from '../../recording/json-rpc-response.js'
import type { GapReason as AnyGapReason } from '../../gaps.js'
import { recorderLostGap } from '../../recording/gap-markers.js'
import { sessionHash } from './session-guard.js'
import { ANSWERED_HOLDS_PER_SESSION } from './answered-holds.js'

/** Gap reason (mcpgw_gaps_total) of a request stream ended for its dead recorder. */
const RECORDER_LOST: AnyGapReason = 'recorder_lost'

export async function resumeRequestStream (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, record: SessionRecord, resumeFrom: EventPosition): Promise<unknown> {
  const log = request.log.child({ sessionHash: sessionHash(sessionId), streamId: resumeFrom.streamId })
  // The client already got the gateway's answer for a lost response: it gets it again,
  // on a stream held open (a GET is answered with an SSE stream or 405, and an SDK
  // client reconnects a resumed request stream until a result arrives: see answerAgain).
  if (resumeFrom.seq === REPAIRED_SEQ) {
    answerRepairAgain(ctx, reply, log, proto, sessionId, resumeFrom)
    return
  }
  const release = enterReplay(ctx, sessionId, resumeFrom.streamId)
  try {
    return await replayRequestStream(ctx, request, reply, proto, sessionId, record, resumeFrom, log)
  } finally {
    release()
  }
}

/** The replay itself: history from the store, then live until the response (or the client leaves). */
async function replayRequestStream (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, record: SessionRecord, resumeFrom: EventPosition, log: Logger): Promise<void> {
  const { store, metrics } = ctx.deps
  const startedAt = performance.now()
  const asked = metrics.timeStore('state', () => store.state(sessionId, resumeFrom.streamId))
  // The first page right behind the state, not after its answer: on Redis, one
  // round trip less before the first event (see writeFirstPage).
  const firstPage = readFirstPage(ctx, sessionId, resumeFrom.streamId, resumeFrom.seq)
  let state: StreamState | null
  try {
    state = await asked
  } catch (err) {
    throw errors.storeUnavailable(err)
  }
  const position = requestResumePosition(state, resumeFrom)
  if (position !== resumeFrom && state !== null) {
    await answerAgain(ctx, request, reply, proto, sessionId, state, position, log)
    return
  }
  // A stream in another epoch was opened again after the store lost the session
  // during its answer: an epoch gap, then what the new epoch holds (resumePoint).
  if (state === null) {
    // The store has no history for this stream (expired, or lost with the epoch):
    // say so, and answer the request with an error so the call fails fast.
    answerHistoryGone(ctx, request, reply, proto, position, record.epoch, 'unknown_stream', log)
    return
  }
  const client = ctx.clientStream(reply, log, 'resume', state.epoch, position.streamId, proto)
  ctx.deps.hub.attach(sessionId, client)
  const start = resumePoint(state, position, record, 0)
  openWithGap(ctx, client, log, position, start)
  const pages = start.gap === undefined ? writeFirstPage(ctx.replayPages, client, await firstPage) : ctx.replayPages
  await new StreamFollower({ store, metrics, log, client, sessionId, ...pages, untilEnded: true }).start()
  observeReplay(ctx, client, startedAt)
  if (client.closed) return
  // The client waits for the rest: should the session end through another replica (no
  // notice says so), or expire, the stream ends within a check of the answered holds.
  ctx.answeredHolds.follow(sessionId, position.streamId, client)
  // Should the replica recording it die, end the stream with an answer.
  const unwatch = ctx.deps.leases.watchRequestStream(sessionId, position.streamId, orphanAnswer(position.streamId), () => {
    metrics.countGap(RECORDER_LOST)
    log.warn({ reason: RECORDER_LOST }, 'gap: the replica recording this request stream died; ended it with the gateway\'s error answer')
  })
  client.onClose(unwatch)
}

/** A resume past the gateway's own error for a lost response: the error again, on a stream held open. */
function answerRepairAgain (ctx: McpContext, reply: FastifyReply, log: Logger, proto: ProtocolInfo, sessionId: string, resumeFrom: EventPosition): void {
  const requestId = requestIdOfStream(resumeFrom.streamId)
  const client = answeringStream(ctx, reply, log, proto, sessionId, resumeFrom.epoch, resumeFrom.streamId, true)
  client.open({}, resumeFrom.seq)
  if (requestId !== undefined) client.writeSynthesized(encodeEventId(resumeFrom), lostResponseError(requestId, 'it was lost (told before)'))
  log.debug('a resume of a request answered with the gateway\'s error: the error again, then held open')
}

/**
 * A resume with the id of a finished request stream's last event: that event
 * once more. A result then ends the stream: the official SDK client stops
 * reconnecting at a result, and an application resuming with a token it saved
 * before a restart gets the call's result. Anything else (an error response,
 * the gateway's own error for a lost response, a gap marker) is held open,
 * keep-alives only, until the client closes it or the session ends: the SDK
 * client reconnects a resumed stream that ends without a result, at once and
 * for ever, and holds one that stays open, as an SDK server with an event
 * store would keep it.
 */
async function answerAgain (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, state: StreamState, position: EventPosition, log: Logger): Promise<void> {
  const { store, metrics } = ctx.deps
  const page = await metrics.timeStore('read', () => store.read(sessionId, position.streamId, position.seq, 1, ctx.replayPages.pageMaxBytes))
    .catch((err: unknown) => { throw errors.storeUnavailable(err) })
  if (page === null) {
    // Gone between the state and the read.
    answerHistoryGone(ctx, request, reply, proto, position, state.epoch, 'unknown_stream', log)
    return
  }
  const last = page.events.at(-1)
  const result = last !== undefined && isResultEvent(last)
  const client = answeringStream(ctx, reply, log, proto, sessionId, state.epoch, position.streamId, !result)
  openWithGap(ctx, client, log, position, { after: position.seq })
  writePage(client, page, true)
  if (result) {
    client.end('completed')
    return
  }
  log.debug('a resume of a request answered without a result: its last event again, then held open')
}

/**
 * The client stream of a resume past an answer, attached to its session;
 * `held`: counted among the session's held streams from the moment it is
 * made, or the 429 past ANSWERED_HOLDS_PER_SESSION before anything is sent.
 */
function answeringStream (ctx: McpContext, reply: FastifyReply, log: Logger, proto: ProtocolInfo, sessionId: string, epoch: string, streamId: string, held: boolean): ClientStream {
  if (held && !ctx.answeredHolds.admits(sessionId, streamId)) throw errors.tooManyAnsweredResumes(ANSWERED_HOLDS_PER_SESSION)
  const client = ctx.clientStream(reply, log, 'resume', epoch, streamId, proto)
  if (held) ctx.answeredHolds.hold(sessionId, streamId, client)
  ctx.deps.hub.attach(sessionId, client)
  return client
}

/** Gap repair without a stream: a gap notice and a JSON-RPC error for the request, then the end. */
function answerLostResponse (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, position: EventPosition, requestId: string | number, reason: HistoryGone): void {
  const log = request.log.child({ streamId: position.streamId })
  ctx.deps.metrics.resumes.inc({ outcome: 'unknown' })
  ctx.deps.metrics.countGap(reason)
  log.warn({ reason }, 'gap: resume of a stream whose history is gone; answering its request with an error')
  const client = ctx.clientStream(reply, log, 'resume', position.epoch, position.streamId, proto)
  client.open({ [GAP_HEADER]: reason }, position.seq, { reason, streamId: position.streamId })
  client.writeSynthesized(encodeEventId({ epoch: position.epoch, streamId: position.streamId, seq: REPAIRED_SEQ }), lostResponseError(requestId, LOST_PHRASES[reason]))
  client.end('completed')
}

/**
 * The resume of a request stream of a session the store lost (see
 * SessionGuard.lostWithTheStore): its history went with the store, so its
 * request is answered with the JSON-RPC error for a lost response, and the
 * client retries it; a stream id without a request id gets the gap alone.
 * The resume past that error is held open, as for a session the store has:
 * the session stays unrecorded until its next request, and the SDK client
 * would resume an ended one once a second until then. The periodic check of
 * held streams ends it (the store has no such session), so a client that sends
 * nothing is answered again about once a minute.
 */
export function answerLostWithTheStore (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, position: EventPosition): void {
  const log = request.log.child({ sessionHash: sessionHash(sessionId), streamId: position.streamId })
  if (position.seq === REPAIRED_SEQ) {
    answerRepairAgain(ctx, reply, log, proto, sessionId, position)
    return
  }
  answerHistoryGone(ctx, request, reply, proto, position, position.epoch, 'epoch', log)
}

/**
 * A resume whose stream's history is gone: its request answered with the
 * JSON-RPC error for a lost response, so the call fails fast; a stream id
 * without a request id gets the gap alone (in `epoch`).
 */
function answerHistoryGone (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, position: EventPosition, epoch: string, reason: HistoryGone, log: Logger): void {
  const requestId = requestIdOfStream(position.streamId)
  if (requestId !== undefined) {
    answerLostResponse(ctx, request, reply, proto, position, requestId, reason)
    return
  }
  ctx.deps.metrics.resumes.inc({ outcome: 'unknown' })
  ctx.deps.metrics.countGap(reason)
  log.warn({ reason }, 'gap: resume of a stream whose history is gone')
  const client = ctx.clientStream(reply, log, 'resume', epoch, position.streamId, proto)
  client.open({ [GAP_HEADER]: reason }, position.seq, { reason, streamId: position.streamId })
  client.end('completed')
}

/** What ends a request stream whose recorder died: the JSON-RPC error for its request, else a gap marker. */
export function orphanAnswer (streamId: string): OrphanAnswer {
  const requestId = requestIdOfStream(streamId)
  if (requestId === undefined) return recorderLostGap(streamId)
  return { data: lostResponseError(requestId, 'the gateway replica recording the answer went away') }
}
