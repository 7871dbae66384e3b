/**
 * POST on the MCP endpoint: the request goes upstream, and an SSE answer is
 * recorded as a request stream while it is relayed, so a client that loses
 * the connection resumes it from the store. Initialize gives the client the
 * gateway's own id for the session the upstream issues, bound to the
 * request's principal, and opens the session's upstream GET at once.
 */
import type { FastifyBaseLogger as Logger, FastifyReply, FastifyRequest } from 'fastify'
import { errors, SessionGoneError } from '../../errors.js'
import type { ProtocolInfo } from '../../protocol/era.js'
import { randomToken } from '../../protocol/event-id.js'
import { lostResponseError, makeRequestStreamId, requestIdOfBody } from '../../protocol/request-stream.js'
import { StreamFollower } from '../../sessions/follower.js'
import { confirmWindow, recordUpstreamStream, type RecordOptions } from '../../recording/recorder.js'
import { initializePromise } from '../../protocol/initialize.js'
import { RECIPE_INITIALIZE_MAX_BYTES, STANDALONE_STREAM, type CreateSessionOptions, type SessionRecord, type StreamState } from '../../store/contract.js'
import { discardBody, type UpstreamRequest, type UpstreamResponse } from '../../upstream/client.js'
import { readJsonRpcAnswer } from '../../recording/json-rpc-answer.js'
import { sessionStateChange } from '../../protocol/session-state.js'
import { sessionRequest } from '../../upstream/session-request.js'
import { clientResponseHeaders, headerValue, mediaType } from '../../upstream/headers.js'
import { sendUpstreamResponse } from '../forward.js'
import { STANDALONE_OPEN_WAIT_MS, type McpContext } from './context.js'
import { admitIssuedSession } from './issued-session.js'
import { isUpstreamSessionId, recordableHeaders, sessionIdOf, upstreamGetHeaders } from './request-headers.js'
import { failureVerdict, sessionHash } from './session-guard.js'

export async function handlePost (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo): Promise<unknown> {
  const { guard } = ctx
  const { hub } = ctx.deps
  const sessionId = sessionIdOf(request)
  const principal = guard.principalOf(request)
  let record: SessionRecord | undefined
  if (sessionId !== undefined) {
    record = await ctx.requireSession(request, sessionId, principal, 'recover')
    // The session's upstream GET, opened at initialize, first: what this request
    // makes the upstream send on the standalone stream then finds it open.
    await hub.opened(sessionId, STANDALONE_OPEN_WAIT_MS)
  }
  // Not tied to the client connection: the answer is read to its end and recorded.
  let res: UpstreamResponse
  try {
    const post: UpstreamRequest = { method: 'POST', path: request.url, headers: recordableHeaders(request), body: request.body as Buffer | undefined }
    res = sessionId === undefined || record === undefined
      ? await ctx.deps.metrics.timeUpstream('POST', () => ctx.deps.upstream.request({ ...post, newSession: sessionId === undefined }))
      : await ctx.sessionUpstream(request, sessionId, record, 'POST', post)
  } catch (err) {
    await guard.settleRecovery(request, failureVerdict(err))
    throw err
  }
  res = await guard.settleAnswered(request, res)
  if (sessionId !== undefined && res.statusCode >= 200 && res.statusCode < 300) res = await keepSessionState(ctx, request, sessionId, res)
  let recordSession = sessionId
  const issued = headerValue(res.headers['mcp-session-id'])
  if (sessionId === undefined && issued !== undefined && isUpstreamSessionId(issued)) {
    const created = await createSession(ctx, request, principal, issued, res)
    recordSession = created.sessionId
    res = created.res
  }
  if (sessionId !== undefined && res.statusCode === 404) await ctx.forgetSession(sessionId, request.log)
  // The client's id where the upstream named its own (an SDK client takes the id of any answer).
  if (issued !== undefined && recordSession !== undefined) reply.header('mcp-session-id', recordSession)
  if (res.statusCode !== 200 || mediaType(res.headers['content-type']) !== 'text/event-stream' || recordSession === undefined) {
    return sendUpstreamResponse(ctx.deps, reply, res)
  }
  return await serveRequestStream(ctx, request, reply, proto, recordSession, res)
}

/**
 * initialize: the upstream issued a session. Counted against the client's
 * address first (issued-session.ts): past its initializes, 429 and the
 * upstream session ended. The client gets the gateway's
 * own id for it, bound to this principal; the record keeps the upstream's id
 * and the recipe to establish the session again: the client's initialize and
 * what its result promised, read from the answer before it is passed on.
 */
async function createSession (ctx: McpContext, request: FastifyRequest, principal: string, issued: string, res: UpstreamResponse): Promise<{ sessionId: string, res: UpstreamResponse }> {
  const { hub, metrics, config } = ctx.deps
  try {
    admitIssuedSession(ctx, request, { upstreamSessionId: issued, ...(res.endpoint !== undefined && { endpoint: res.endpoint }) })
  } catch (err) {
    discardBody(res.body)
    throw err
  }
  const sessionId = ctx.guard.ids.issue(principal, issued)
  const body = request.body as Buffer | undefined
  const ok = res.statusCode >= 200 && res.statusCode < 300
  let recipe: CreateSessionOptions['recipe']
  const requestId = requestIdOfBody(body)
  const kind = answerKind(res)
  if (ok && body !== undefined && requestId !== undefined && kind !== undefined) {
    const answer = await readJsonRpcAnswer(res.body, kind, requestId, config.maxEventBytes, INITIALIZE_ANSWER_WAIT_MS)
    res = { ...res, body: answer.body }
    const promised = initializePromise(answer.response?.result)
    if (promised !== undefined && body.length <= RECIPE_INITIALIZE_MAX_BYTES) recipe = { initialize: body.toString('utf8'), initializeResult: promised }
  }
  try {
    ctx.sessions.set(sessionId, await metrics.timeStore('create_session', () =>
      ctx.deps.store.createSession(sessionId, principal, { placement: { upstreamSessionId: issued, ...(res.endpoint !== undefined && { endpoint: res.endpoint }) }, ...(recipe !== undefined && { recipe }) })))
  } catch (err) {
    discardBody(res.body)
    throw errors.storeUnavailable(err)
  }
  if (ok) hub.openEarly(sessionId, upstreamGetHeaders(request, 'offered'), request.log.child({ sessionHash: sessionHash(sessionId), streamId: STANDALONE_STREAM }))
  request.log.debug({ sessionHash: sessionHash(sessionId), recipe: recipe !== undefined }, 'session created')
  return { sessionId, res }
}

/**
 * How long an initialize's answer is read for its result before it is passed
 * on without it (the session then has no recipe: it cannot be established
 * again should the upstream forget it). A server sends that result at once;
 * one whose answer stalls before it would otherwise hold the request, its
 * body and an upstream connection for as long as it stalls, the client long
 * gone, since nothing is passed on to it meanwhile.
 */
const INITIALIZE_ANSWER_WAIT_MS = 10_000

/**
 * How long the answer to a state request is read for its response before it
 * is passed on: such requests are answered at once, but a server may send
 * other messages first (a request to the client, which waits for its answer).
 */
const STATE_ANSWER_WAIT_MS = 1000

/**
 * A request that set session state the client expects to keep: kept in the
 * session's recipe, to be sent again if the session must be established
 * upstream again, unless the upstream's response to it is an error (a level
 * or unsubscribe it refused would otherwise replace what it kept). The answer
 * is read up to that response, for at most STATE_ANSWER_WAIT_MS, and given
 * back whole; not seen by then (or the stream ended before it, to be resumed),
 * the request is kept, as any 2xx was. A batch that sets state is not read:
 * it makes the recipe incomplete, whatever its answers. A failure to record
 * only costs the recipe.
 */
async function keepSessionState (ctx: McpContext, request: FastifyRequest, sessionId: string, res: UpstreamResponse): Promise<UpstreamResponse> {
  const body = request.body as Buffer | undefined
  const change = sessionStateChange(body)
  if (change === undefined) return res
  if (change.kind !== 'untracked') {
    const requestId = requestIdOfBody(body)
    const kind = answerKind(res)
    if (requestId === undefined || kind === undefined) return res
    const answer = await readJsonRpcAnswer(res.body, kind, requestId, ctx.deps.config.maxEventBytes, STATE_ANSWER_WAIT_MS)
    res = { ...res, body: answer.body }
    if (answer.response?.error !== undefined) return res
  }
  await ctx.deps.metrics.timeStore('session_state', () => ctx.deps.store.recordSessionState(sessionId, change))
    .catch((err: unknown) => request.log.warn({ err }, 'could not keep a session-state request in the session\'s recipe'))
  return res
}

function answerKind (res: UpstreamResponse): 'json' | 'sse' | undefined {
  const type = mediaType(res.headers['content-type'])
  return type === 'text/event-stream' ? 'sse' : type === 'application/json' ? 'json' : undefined
}

/**
 * Open a request stream in the store. A failure is retried for as long as
 * the recorder retries a failed append (its confirm window), the upstream's
 * answer waiting meanwhile: a short outage only delays the answer, which
 * stays resumable. Throws the last error after that.
 */
async function openRequestStream (ctx: McpContext, sessionId: string, streamId: string, log: Logger): Promise<StreamState> {
  const window = confirmWindow()
  let retries = 0
  for (;;) {
    try {
      const state = await ctx.deps.metrics.timeStore('open_stream', () => ctx.deps.store.openStream(sessionId, streamId))
      if (retries > 0) log.info({ retries }, 'event store back: request stream opened, its answer is recorded')
      return state
    } catch (err) {
      if (err instanceof SessionGoneError) throw err
      if (retries === 0) log.warn({ err }, 'event store unavailable: retrying to open the request stream before passing its answer through unrecorded')
      const next = await window.next()
      if (next.done === true) throw err
      retries = next.value
    }
  }
}

async function serveRequestStream (ctx: McpContext, request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, res: UpstreamResponse): Promise<FastifyReply | undefined> {
  const { store, metrics, hub, config } = ctx.deps
  // The stream id carries the request's JSON-RPC id, for gap repair.
  const requestId = requestIdOfBody(request.body as Buffer | undefined)
  const streamId = makeRequestStreamId(randomToken(8, ctx.random), randomToken(3, ctx.random), requestId)
  const log = request.log.child({ sessionHash: sessionHash(sessionId), streamId })
  const principal = ctx.guard.principalOf(request)
  let state: StreamState
  // Noted before any event id goes out: a client resuming elsewhere can then learn if this replica dies.
  const recording = ctx.deps.leases.recordRequestStream(sessionId, streamId)
  const claimed = recording.claimed
    .catch((err: unknown) => log.warn({ err }, 'could not note this replica as the recorder: if it dies, resuming clients wait for their timeout'))
  try {
    state = await openRequestStream(ctx, sessionId, streamId, log)
  } catch (err) {
    // Degraded mode: the request already reached the upstream; pass its answer
    // on as it is (live, not resumable) rather than lose the result. The claim,
    // pointless now, is not waited for.
    recording.done()
    log.error({ err }, 'event store unavailable: passing the SSE answer through unrecorded')
    metrics.eventsUnrecorded.inc({ reason: 'store_error' })
    return sendUpstreamResponse(ctx.deps, reply, res)
  }
  await claimed
  const client = ctx.clientStream(reply, log, 'request', state.epoch, streamId, proto)
  hub.attach(sessionId, client)
  client.open(clientResponseHeaders(res.headers, ['content-type', 'content-length', 'content-encoding']), 0)
  // Subscribe before recording starts, so the first event already finds its reader.
  await new StreamFollower({ store, metrics, log, client, sessionId, ...ctx.replayPages, untilEnded: true }).start()
  metrics.upstreamStreamsOpen.inc({ kind: 'request' })
  // Looked up with the held resumes, and ended with the session here: an upstream may hold
  // the answer open without an event, which no append then finds the session gone for.
  const gone = new AbortController()
  const recorded = ctx.answeredHolds.record(sessionId, streamId, () => { gone.abort() })
  ctx.deps.inflight.track(recordUpstreamStream({
    store,
    metrics,
    log,
    sessionId,
    streamId,
    body: res.body,
    maxEventBytes: config.maxEventBytes,
    readAhead: hub.readAhead,
    endStreamOnFinish: true,
    live: client,
    storedThrough: state.lastSeq,
    requestId,
    ...(requestId !== undefined && !hub.upstreamGetRefused(sessionId) && { resumeUpstream: resumeRequestUpstream(ctx, request, sessionId) }),
    resumeBounds: config.upstreamResumes,
    sessionGone: gone.signal,
    failureResponse: requestId === undefined ? undefined : reason => lostResponseError(requestId, reason === 'event_too_large' ? 'an upstream event exceeded MAX_EVENT_BYTES' : 'the upstream answer broke off'),
    // The store lost the session mid-answer (Redis restarted empty): rather than drop the
    // rest of the answer, the result included, the session is recorded again for the
    // principal this request was verified for, and this stream goes on in the new epoch.
    // The client following it is closed on the epoch change and resumes: an epoch gap,
    // then the rest, recorded and resumable like any answer. Not passed on unrecorded
    // instead: a client cut off after the loss would then lose the result all the same.
    // The upstream answering the session's request is its confirmation.
    recoverSession: async () => {
      if (await ctx.guard.recoverDuringAnswer(sessionId, principal, log) === null) return undefined
      return await metrics.timeStore('open_stream', () => store.openStream(sessionId, streamId))
    }
  })).then(outcome => {
    recording.done()
    recorded()
    metrics.upstreamStreamsOpen.dec({ kind: 'request' })
    if (outcome !== 'completed') client.close('upstream_error')
  })
}

/**
 * Resumes a POST's SSE answer that the upstream ended early (SEP-1699 polling):
 * GET with its Last-Event-ID, carrying the session's latest credentials here
 * (SessionHub.upstreamHeaders), else the POST's: a long call's answer may
 * outlive the token the POST came with, which the client has refreshed since.
 */
function resumeRequestUpstream (ctx: McpContext, request: FastifyRequest, sessionId: string): NonNullable<RecordOptions['resumeUpstream']> {
  const posted = upstreamGetHeaders(request, 'keep')
  return async (lastEventId, abort) => {
    if (lastEventId === undefined) return undefined
    // Under the session's upstream id as it is now (the record, shared by every replica).
    const record = await ctx.deps.store.getSession(sessionId)
    if (record === null) return undefined
    const headers = ctx.deps.hub.upstreamHeaders(sessionId) ?? posted
    const get: UpstreamRequest = { method: 'GET', path: request.url, headers: { ...headers, 'last-event-id': lastEventId }, signal: abort }
    const res = await ctx.deps.metrics.timeUpstream('GET', () => ctx.deps.upstream.request(sessionRequest(record, get)), abort)
    if (res.statusCode === 200 && mediaType(res.headers['content-type']) === 'text/event-stream') return res.body
    discardBody(res.body)
    return undefined
  }
}
