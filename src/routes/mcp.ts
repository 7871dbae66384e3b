import { randomBytes } from 'node:crypto'
import type { Readable } from 'node:stream'
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify'
import type { FastifyBaseLogger as Logger } from 'fastify'
import type { LeaseCoordinator } from '../cluster/coordinator.js'
import type { OrphanAnswer } from '../cluster/lease.js'
import type { GatewayConfig } from '../config/load.js'
import { errors, GatewayError, SessionGoneError } from '../errors.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import { statusClass } from '../metrics/metrics.js'
import { protocolInfo, type ProtocolInfo } from '../protocol/era.js'
import { decodeEventId, encodeEventId, randomToken, type EventPosition } from '../protocol/event-id.js'
import { lostResponseError, makeRequestStreamId, REPAIRED_SEQ, requestIdOfBody, requestIdOfStream } from '../protocol/request-stream.js'
import { nextPageBytes, StreamFollower } from '../relay/follower.js'
import { confirmWindow, recordUpstreamStream } from '../relay/recorder.js'
import { GAP_EVENT } from '../sse/frame.js'
import type { InFlight } from '../relay/inflight.js'
import type { SessionHub } from '../relay/session-hub.js'
import { SessionRateLimiter } from './rate-limit.js'
import { SessionCache } from './session-cache.js'
import { SessionGuard, sessionHash } from './session-guard.js'
import { ClientStream } from '../sse/client-stream.js'
import { KeepAliveTicker } from '../sse/keep-alive.js'
import { STANDALONE_STREAM, type EventStore, type ReadResult, type SessionRecord, type StreamState } from '../store/contract.js'
import { discardBody, type UpstreamClient, type UpstreamResponse } from '../upstream/client.js'
import { clientResponseHeaders, headerValue, mediaType } from '../upstream/headers.js'
import { forwardTransparently, sendUpstreamResponse, upstreamHeadersFor } from './forward.js'

export interface McpRouteDeps {
  readonly maxBodyBytes: number
  readonly config: GatewayConfig
  readonly store: EventStore
  readonly hub: SessionHub
  readonly upstream: UpstreamClient
  readonly metrics: GatewayMetrics
  readonly inflight: InFlight
  /** Request stream recorders across replicas: claimed here, watched while a resuming client waits. */
  readonly leases: LeaseCoordinator
  readonly random?: (size: number) => Uint8Array
}

/** Header carrying the gap reason when a resume cannot be served in full. */
export const GAP_HEADER = 'x-mcp-gateway-gap'
/** Replay pages: at most this many events, their bytes doubling from the first size up to the largest (see StreamFollower). */
const REPLAY_PAGE_EVENTS = 10_000
const REPLAY_FIRST_PAGE_BYTES = 128 * 1024
const REPLAY_PAGE_MAX_BYTES = 4 * 1024 * 1024
/** How long a request waits for its session's upstream GET, opening at initialize, to open. */
const EARLY_GET_WAIT_MS = 2000
/** Gap reason (mcpgw_gaps_total) of a request stream ended for its dead recorder. */
const RECORDER_LOST = 'recorder_lost'
/** Transports spec: session ids are visible ASCII (0x21-0x7E). */
const SESSION_ID = /^[\x21-\x7e]{1,256}$/

export { sessionHash }
/** The protocol version an initialize request offers (params.protocolVersion), when it is a plain token. */
function offeredVersion (body: Buffer | undefined): string | undefined {
  if (body === undefined) return undefined
  try {
    const version = (JSON.parse(body.toString('utf8')) as { params?: { protocolVersion?: unknown } }).params?.protocolVersion
    return typeof version === 'string' && /^[\w.-]{1,32}$/.test(version) ? version : undefined
  } catch {
    return undefined
  }
}

type GapReason = 'trimmed' | 'epoch' | 'unknown_stream' | 'future_id'

const LOST_PHRASES: Record<GapReason, string> = {
  trimmed: 'it was trimmed by retention',
  epoch: 'the event store lost this stream\'s history',
  unknown_stream: 'the gateway no longer has this stream\'s history',
  future_id: 'the Last-Event-ID is past the end of the stream'
}

/**
 * The MCP endpoint (Streamable HTTP, transports spec). Legacy-era requests
 * (MCP-Protocol-Version up to 2025-11-25) get recorded, resumable streams;
 * modern-era requests are proxied transparently.
 */
export function registerMcpRoute (app: FastifyInstance, deps: McpRouteDeps): void {
  const { config, store, hub, upstream, metrics } = deps
  const random = deps.random ?? randomBytes
  const sessions = new SessionCache({ freshMs: 2000, staleMs: config.retention.ttlMs, maxEntries: Math.max(10_000, config.maxSessions * 4) })
  // Who requests act for, and whether the sessions they name are theirs.
  const guard = new SessionGuard({ config, store, metrics, sessions })
  guard.register(app)
  const recovering = guard.recovering
  const limiter = new SessionRateLimiter({ ratePerSecond: config.sessionRequestsPerSecond, maxEntries: Math.max(10_000, config.maxSessions * 4) })
  // A page is written in one piece: never larger than a client's send buffer may hold.
  const pageMaxBytes = Math.min(REPLAY_PAGE_MAX_BYTES, config.clientBufferMaxBytes)
  const replayPages = { pageSize: REPLAY_PAGE_EVENTS, pageBytes: Math.min(REPLAY_FIRST_PAGE_BYTES, pageMaxBytes), pageMaxBytes }
  const keepAlive = new KeepAliveTicker(config.keepAliveMs)
  app.addHook('onClose', async () => { keepAlive.stop() })

  const streamOptions = (reply: FastifyReply, log: Logger, kind: 'standalone' | 'request' | 'resume', epoch: string, streamId: string, proto: ProtocolInfo): ClientStream =>
    new ClientStream({
      reply,
      kind,
      epoch,
      streamId,
      priming: proto.priming,
      retryMs: config.retryMs,
      maxBufferBytes: config.clientBufferMaxBytes,
      metrics,
      log,
      keepAlive
    })

  async function requireSession (sessionId: string, principal: string, recoverFor?: FastifyRequest): Promise<SessionRecord> {
    return await guard.requireSession(sessionId, principal, recoverFor)
  }

  async function settleRecovery (request: FastifyRequest, confirmed: boolean): Promise<void> {
    await guard.settleRecovery(request, confirmed)
  }

  async function requireKnownSessionOrStateless (sessionId: string, request: FastifyRequest, _proto: ProtocolInfo): Promise<void> {
    await guard.requireKnownSessionOrStateless(sessionId, request)
  }

  function principalOf (request: FastifyRequest, _header: string): string {
    return guard.principalOf(request)
  }

  function sessionIdOf (request: FastifyRequest): string | undefined {
    const raw = request.headers['mcp-session-id']
    if (raw === undefined) return undefined
    const value = headerValue(raw) as string
    if (Array.isArray(raw) || !SESSION_ID.test(value)) {
      throw new GatewayError('MCPGW_BAD_SESSION_ID', 400, 'Bad Request: Mcp-Session-Id must be one value of visible ASCII characters.')
    }
    return value
  }

  /** Upstream headers for an answer the gateway may record: it parses the SSE, so no content coding. */
  function recordableHeaders (request: FastifyRequest): Record<string, string | string[]> {
    const headers = upstreamHeadersFor(request, false)
    headers['accept-encoding'] = 'identity'
    return headers
  }

  /**
   * An upstream GET of the session on behalf of a POST: its auth and other
   * end-to-end headers. The GET opened at initialize carries the version the
   * client offered: the negotiated one is in the answer's body, and is the
   * offered one whenever the server supports it (lifecycle spec); a server
   * that does not refuses the GET, and the client's own GET opens it later.
   * The version matters: servers send priming events (ids to resume from)
   * only from 2025-11-25 on.
   */
  function upstreamGetHeaders (request: FastifyRequest, sessionId: string, version: 'keep' | 'offered'): Record<string, string | string[]> {
    const headers = recordableHeaders(request)
    for (const name of ['content-type', 'content-length', 'content-encoding', 'last-event-id']) delete headers[name]
    if (version === 'offered') {
      delete headers['mcp-protocol-version']
      const offered = offeredVersion(request.body as Buffer | undefined)
      if (offered !== undefined) headers['mcp-protocol-version'] = offered
    }
    headers.accept = 'text/event-stream'
    headers['mcp-session-id'] = sessionId
    return headers
  }

  /** Resumes a POST's SSE answer that the upstream ended early (SEP-1699 polling): GET with its Last-Event-ID. */
  function resumeRequestUpstream (request: FastifyRequest, sessionId: string): (lastEventId: string | undefined) => Promise<Readable | undefined> {
    const headers = upstreamGetHeaders(request, sessionId, 'keep')
    return async lastEventId => {
      if (lastEventId === undefined) return undefined
      const res = await timedUpstream('GET', () => upstream.request({ method: 'GET', path: request.url, headers: { ...headers, 'last-event-id': lastEventId } }))
      if (res.statusCode === 200 && mediaType(res.headers['content-type']) === 'text/event-stream') return res.body
      discardBody(res.body)
      return undefined
    }
  }

  async function timedUpstream (method: string, fn: () => Promise<UpstreamResponse>): Promise<UpstreamResponse> {
    const end = metrics.upstreamRequestDuration.startTimer({ method })
    try {
      const res = await fn()
      end({ status_class: statusClass(res.statusCode) })
      return res
    } catch (err) {
      end({ status_class: 'error' })
      metrics.upstreamErrors.inc({ kind: 'request' })
      throw err
    }
  }

  async function handlePost (request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo): Promise<unknown> {
    const sessionId = sessionIdOf(request)
    const principal = principalOf(request, config.principalHeader)
    if (sessionId !== undefined) {
      await requireSession(sessionId, principal, request)
      // The session's upstream GET, opened at initialize, first: what this request
      // makes the upstream send on the standalone stream then finds it open.
      await hub.opened(sessionId, EARLY_GET_WAIT_MS)
    }
    // Not tied to the client connection: the answer is read to its end and recorded.
    let res: UpstreamResponse
    try {
      res = await timedUpstream('POST', () => upstream.request({
        method: 'POST',
        path: request.url,
        headers: recordableHeaders(request),
        body: request.body as Buffer | undefined
      }))
    } catch (err) {
      await settleRecovery(request, false)
      throw err
    }
    await settleRecovery(request, res.statusCode >= 200 && res.statusCode < 300)
    const issued = headerValue(res.headers['mcp-session-id'])
    let recordSession = sessionId
    if (sessionId === undefined && issued !== undefined && SESSION_ID.test(issued)) {
      // initialize: the upstream issued a session; bind it to this principal.
      try {
        sessions.set(issued, await metrics.timeStore('create_session', () => store.createSession(issued, principal)))
      } catch (err) {
        discardBody(res.body)
        throw errors.storeUnavailable(err)
      }
      recordSession = issued
      if (res.statusCode >= 200 && res.statusCode < 300) hub.openEarly(issued, upstreamGetHeaders(request, issued, 'offered'), request.log.child({ sessionHash: sessionHash(issued), streamId: STANDALONE_STREAM }))
    }
    if (sessionId !== undefined && res.statusCode === 404) await forgetSession(sessionId, request.log)
    if (res.statusCode !== 200 || mediaType(res.headers['content-type']) !== 'text/event-stream' || recordSession === undefined) {
      return sendUpstreamResponse(reply, res)
    }
    return await serveRequestStream(request, reply, proto, recordSession, res)
  }

  /**
   * Open a request stream in the store. A failure is retried for as long as
   * the recorder retries a failed append (its confirm window), the upstream's
   * answer waiting meanwhile: a short outage only delays the answer, which
   * stays resumable. Throws the last error after that.
   */
  async function openRequestStream (sessionId: string, streamId: string, log: Logger): Promise<StreamState> {
    const window = confirmWindow()
    let retries = 0
    for (;;) {
      try {
        const state = await metrics.timeStore('open_stream', () => store.openStream(sessionId, streamId))
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

  async function serveRequestStream (request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, res: UpstreamResponse): Promise<FastifyReply | undefined> {
    // The stream id carries the request's JSON-RPC id, for gap repair.
    const requestId = requestIdOfBody(request.body as Buffer | undefined)
    const streamId = makeRequestStreamId(randomToken(8, random), randomToken(3, random), requestId)
    const log = request.log.child({ sessionHash: sessionHash(sessionId), streamId })
    const principal = guard.principalOf(request)
    let state: StreamState
    // Noted before any event id goes out: a client resuming elsewhere can then learn if this replica dies.
    const recording = deps.leases.recordRequestStream(sessionId, streamId)
    const claimed = recording.claimed
      .catch((err: unknown) => log.warn({ err }, 'could not note this replica as the recorder: if it dies, resuming clients wait for their timeout'))
    try {
      state = await openRequestStream(sessionId, streamId, log)
    } catch (err) {
      // Degraded mode: the request already reached the upstream; pass its answer
      // on as it is (live, not resumable) rather than lose the result. The claim,
      // pointless now, is not waited for.
      recording.done()
      log.error({ err }, 'event store unavailable: passing the SSE answer through unrecorded')
      metrics.eventsUnrecorded.inc({ reason: 'store_error' })
      return sendUpstreamResponse(reply, res)
    }
    await claimed
    const client = streamOptions(reply, log, 'request', state.epoch, streamId, proto)
    hub.attach(sessionId, client)
    client.open(clientResponseHeaders(res.headers, ['content-type', 'content-length', 'content-encoding']), 0)
    // Subscribe before recording starts, so the first event already finds its reader.
    await new StreamFollower({ store, metrics, log, client, sessionId, ...replayPages, untilEnded: true }).start()
    metrics.upstreamStreamsOpen.inc({ kind: 'request' })
    deps.inflight.track(recordUpstreamStream({
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
      ...(requestId !== undefined && !hub.upstreamGetRefused(sessionId) && { resumeUpstream: resumeRequestUpstream(request, sessionId) }),
      failureResponse: requestId === undefined ? undefined : reason => lostResponseError(requestId, reason === 'event_too_large' ? 'an upstream event exceeded MAX_EVENT_BYTES' : 'the upstream answer broke off'),
      // The store lost the session mid-answer (Redis restarted empty): rather than drop the
      // rest of the answer, the result included, the session is recorded again for the
      // principal this request was verified for, and this stream goes on in the new epoch.
      // The client following it is closed on the epoch change and resumes: an epoch gap,
      // then the rest, recorded and resumable like any answer. Not passed on unrecorded
      // instead: a client cut off after the loss would then lose the result all the same.
      // The upstream answering the session's request is its confirmation.
      recoverSession: async () => {
        if (await guard.recoverDuringAnswer(sessionId, principal, log) === null) return undefined
        return await metrics.timeStore('open_stream', () => store.openStream(sessionId, streamId))
      }
    })).then(outcome => {
      recording.done()
      metrics.upstreamStreamsOpen.dec({ kind: 'request' })
      if (outcome !== 'completed') client.close('upstream_error')
    })
  }

  async function handleGet (request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo): Promise<unknown> {
    const accept = request.headers.accept
    if (accept !== undefined && !/text\/event-stream|\*\/\*|text\/\*/.test(accept)) throw errors.notAcceptable()
    const sessionId = sessionIdOf(request)
    // Without a session there is nothing to record under: a stateless upstream is proxied as is.
    if (sessionId === undefined) return await forwardTransparently(deps, request, reply, undefined)
    const lastEventId = request.headers['last-event-id']
    let position: EventPosition | null = null
    if (lastEventId !== undefined) {
      position = Array.isArray(lastEventId) ? null : decodeEventId(lastEventId)
      if (position === null) {
        metrics.resumes.inc({ outcome: 'refused' })
        throw errors.badLastEventId()
      }
    }
    // A session whose records are gone (deleted, expired) gets 404, as the transports
    // spec requires for a terminated session: the client starts a new one. One the store
    // lost is recovered only on the standalone stream, whose upstream GET can refuse it;
    // the resume of a request stream never reaches the upstream.
    const requestStream = position !== null && position.streamId !== STANDALONE_STREAM ? position : null
    const record = await requireSession(sessionId, principalOf(request, config.principalHeader), requestStream === null ? request : undefined)
    if (requestStream !== null) return await resumeRequestStream(request, reply, proto, sessionId, record, requestStream)
    return await attachStandalone(request, reply, proto, sessionId, record, position)
  }

  /** Gap repair without a stream: a gap notice and a JSON-RPC error for the request, then the end. */
  function answerLostResponse (request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, position: EventPosition, requestId: string | number, reason: GapReason): void {
    const log = request.log.child({ streamId: position.streamId })
    metrics.resumes.inc({ outcome: 'unknown' })
    metrics.gaps.inc({ reason })
    log.warn({ reason }, 'gap: resume of a stream whose history is gone; answering its request with an error')
    const client = streamOptions(reply, log, 'resume', position.epoch, position.streamId, proto)
    client.open({ [GAP_HEADER]: reason }, position.seq, { reason, streamId: position.streamId })
    client.writeSynthesized(encodeEventId({ epoch: position.epoch, streamId: position.streamId, seq: REPAIRED_SEQ }), lostResponseError(requestId, LOST_PHRASES[reason]))
    client.end('completed')
  }

  async function attachStandalone (request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, record: SessionRecord, position: EventPosition | null): Promise<unknown> {
    const log = request.log.child({ sessionHash: sessionHash(sessionId), streamId: STANDALONE_STREAM })
    const headers = recordableHeaders(request)
    // The gateway's ids mean nothing upstream; the upstream GET starts fresh.
    delete headers['last-event-id']
    let refusal: UpstreamResponse | null
    try {
      refusal = await hub.ensurePump(sessionId, headers, log)
    } catch (err) {
      await settleRecovery(request, false)
      throw err
    }
    // null: the upstream GET runs (here, or on the replica that holds it).
    await settleRecovery(request, refusal === null)
    if (refusal !== null) {
      // The upstream no longer knows the session: neither do we.
      if (refusal.statusCode === 404) await forgetSession(sessionId, log)
      return sendUpstreamResponse(reply, refusal)
    }
    const startedAt = performance.now()
    // Both asked at once (one round trip on Redis, in this order on its connection).
    // A client without a position gets what was recorded since the last connection
    // stopped: nothing recorded in a reconnect gap is dropped for want of a cursor.
    const asked = Promise.all([
      metrics.timeStore('open_stream', () => store.openStream(sessionId, STANDALONE_STREAM)),
      position === null ? metrics.timeStore('load_cursor', () => store.loadCursor(sessionId, STANDALONE_STREAM)) : 0
    ])
    // A resume's first page right behind them (see writeFirstPage).
    const firstPage = position === null ? null : readFirstPage(sessionId, STANDALONE_STREAM, position.seq)
    let state: StreamState
    let cursor: number
    try {
      ;[state, cursor] = await asked
    } catch (err) {
      throw errors.storeUnavailable(err)
    }
    const start = resumePoint(state, position, record, cursor)
    const client = streamOptions(reply, log, position === null ? 'standalone' : 'resume', state.epoch, STANDALONE_STREAM, proto)
    hub.attach(sessionId, client)
    client.onClose(() => {
      store.saveCursor(sessionId, STANDALONE_STREAM, client.lastSeq).catch((err: unknown) => log.warn({ err }, 'could not save the stream cursor'))
    })
    openWithGap(client, log, position, start)
    const pages = firstPage !== null && start.gap === undefined ? await writeFirstPage(client, await firstPage) : replayPages
    await new StreamFollower({ store, metrics, log, client, sessionId, ...pages, untilEnded: false }).start()
    if (position !== null) observeReplay(client, startedAt)
  }

  /**
   * A resume's first page of history, read while the route still asks the
   * store about the stream; null when the read failed (the follower then reads
   * it, and fails or not, as it would have).
   */
  async function readFirstPage (sessionId: string, streamId: string, afterSeq: number): Promise<ReadResult | null> {
    try {
      return await metrics.timeStore('read', () => store.read(sessionId, streamId, afterSeq, replayPages.pageSize, replayPages.pageBytes))
    } catch {
      return null
    }
  }

  /**
   * Write the first page when it continues exactly where the client stands
   * (same epoch, no event missing in between); otherwise leave it all to the
   * follower. It was read before the follower subscribed, so the follower
   * still reads from the client's new position after subscribing: whatever
   * was appended in between is found there, as on any resume. Returns the
   * follower's pages: after a page short of the end, the next size up, as if
   * the follower had read it.
   */
  async function writeFirstPage (client: ClientStream, page: ReadResult | null): Promise<typeof replayPages> {
    if (page === null || page.state.epoch !== client.epoch || page.events[0]?.seq !== client.lastSeq + 1) return replayPages
    client.writeEvents(page.events, true)
    await client.drained()
    if (client.lastSeq >= page.state.lastSeq) return replayPages
    return { ...replayPages, pageBytes: nextPageBytes(replayPages.pageBytes, replayPages.pageMaxBytes) }
  }

  /**
   * A resume's replay, when the store had the stream's history (resumes
   * answered 204 or with only a gap are not observed): the events written from
   * history, and the time from its first store request until the follower
   * caught up (or the stream ended, or the client left).
   */
  function observeReplay (client: ClientStream, startedAt: number): void {
    metrics.replayEvents.observe(client.replayed)
    metrics.replayDuration.observe((performance.now() - startedAt) / 1000)
  }

  async function resumeRequestStream (request: FastifyRequest, reply: FastifyReply, proto: ProtocolInfo, sessionId: string, record: SessionRecord, position: EventPosition): Promise<unknown> {
    const log = request.log.child({ sessionHash: sessionHash(sessionId), streamId: position.streamId })
    // The client already got the gateway's answer for a lost response: it gets it again
    // (a GET is answered with an SSE stream or 405, and an SDK client resuming a request
    // stream reconnects until a response arrives).
    if (position.seq === REPAIRED_SEQ) {
      const requestId = requestIdOfStream(position.streamId)
      const client = streamOptions(reply, log, 'resume', position.epoch, position.streamId, proto)
      client.open({}, position.seq)
      if (requestId !== undefined) client.writeSynthesized(encodeEventId(position), lostResponseError(requestId, 'it was lost (told before)'))
      client.end('completed')
      return
    }
    const startedAt = performance.now()
    const asked = metrics.timeStore('state', () => store.state(sessionId, position.streamId))
    // The first page right behind the state, not after its answer: on Redis, one
    // round trip less before the first event (see writeFirstPage).
    const firstPage = readFirstPage(sessionId, position.streamId, position.seq)
    let state: StreamState | null
    try {
      state = await asked
    } catch (err) {
      throw errors.storeUnavailable(err)
    }
    if (state !== null && state.epoch === position.epoch && state.ended && position.seq === state.lastSeq && position.seq > 0) {
      // Past the end of a finished stream: its last event (the response) once more, then
      // the end. A GET is answered with an SSE stream or 405 (transports spec), and an SDK
      // client resuming with a saved token reconnects until a response arrives.
      position = { ...position, seq: position.seq - 1 }
    }
    // A stream in another epoch was opened again after the store lost the session
    // during its answer: an epoch gap, then what the new epoch holds (resumePoint).
    if (state === null) {
      // The store has no history for this stream (expired, or lost with the epoch):
      // say so, and answer the request with an error so the call fails fast.
      const reason: GapReason = 'unknown_stream'
      const requestId = requestIdOfStream(position.streamId)
      if (requestId !== undefined) return answerLostResponse(request, reply, proto, position, requestId, reason)
      metrics.resumes.inc({ outcome: 'unknown' })
      metrics.gaps.inc({ reason })
      log.warn({ reason }, 'gap: resume of a stream whose history is gone')
      const client = streamOptions(reply, log, 'resume', record.epoch, position.streamId, proto)
      client.open({ [GAP_HEADER]: reason }, position.seq, { reason, streamId: position.streamId })
      client.end('completed')
      return
    }
    const client = streamOptions(reply, log, 'resume', state.epoch, position.streamId, proto)
    hub.attach(sessionId, client)
    const start = resumePoint(state, position, record, 0)
    openWithGap(client, log, position, start)
    const pages = start.gap === undefined ? await writeFirstPage(client, await firstPage) : replayPages
    await new StreamFollower({ store, metrics, log, client, sessionId, ...pages, untilEnded: true }).start()
    observeReplay(client, startedAt)
    if (client.closed) return
    // The client waits for the rest: should the replica recording it die, end the stream with an answer.
    const unwatch = deps.leases.watchRequestStream(sessionId, position.streamId, orphanAnswer(position.streamId), () => {
      metrics.gaps.inc({ reason: RECORDER_LOST })
      log.warn({ reason: RECORDER_LOST }, 'gap: the replica recording this request stream died; ended it with the gateway\'s error answer')
    })
    client.onClose(unwatch)
  }

  /** What ends a request stream whose recorder died: the JSON-RPC error for its request, else a gap marker. */
  function orphanAnswer (streamId: string): OrphanAnswer {
    const requestId = requestIdOfStream(streamId)
    if (requestId === undefined) return { event: GAP_EVENT, data: JSON.stringify({ reason: RECORDER_LOST, streamId }) }
    return { data: lostResponseError(requestId, 'the gateway replica recording the answer went away') }
  }

  interface StartPoint { readonly after: number, readonly gap?: { reason: GapReason, missingFrom?: number, missingTo?: number } }

  function resumePoint (state: StreamState, position: EventPosition | null, record: SessionRecord, cursor: number): StartPoint {
    if (position === null) return { after: Math.min(Math.max(cursor, state.firstSeq - 1), state.lastSeq) }
    if (position.epoch !== state.epoch || position.epoch !== record.epoch) {
      // The store lost the history this id points into: replay what the new epoch holds.
      return { after: state.firstSeq - 1, gap: { reason: 'epoch' } }
    }
    if (position.seq > state.lastSeq) return { after: state.lastSeq, gap: { reason: 'future_id' } }
    if (position.seq + 1 < state.firstSeq) {
      return { after: state.firstSeq - 1, gap: { reason: 'trimmed', missingFrom: position.seq + 1, missingTo: state.firstSeq - 1 } }
    }
    return { after: position.seq }
  }

  function openWithGap (client: ClientStream, log: Logger, position: EventPosition | null, start: StartPoint): void {
    if (position !== null) metrics.resumes.inc({ outcome: start.gap === undefined ? 'replayed' : 'gap' })
    if (start.gap !== undefined) {
      metrics.gaps.inc({ reason: start.gap.reason })
      log.warn({ gap: start.gap }, 'gap: history cannot fill this resume; the client is told')
      client.open({ [GAP_HEADER]: start.gap.reason }, start.after, { ...start.gap, streamId: client.streamId })
    } else {
      client.open({}, start.after)
    }
  }

  async function forgetSession (sessionId: string, log: Logger): Promise<void> {
    sessions.delete(sessionId)
    hub.dropSession(sessionId)
    await metrics.timeStore('delete_session', () => store.deleteSession(sessionId))
      .catch((err: unknown) => log.warn({ err }, 'could not drop the records of a session the upstream no longer knows'))
  }

  async function handleDelete (request: FastifyRequest, reply: FastifyReply): Promise<unknown> {
    const sessionId = sessionIdOf(request)
    if (sessionId === undefined) return await forwardTransparently(deps, request, reply, undefined)
    await requireSession(sessionId, principalOf(request, config.principalHeader), request)
    let res: UpstreamResponse
    hub.deleting(sessionId, true)
    try {
      res = await timedUpstream('DELETE', () => upstream.request({
        method: 'DELETE', path: request.url, headers: upstreamHeadersFor(request, false)
      }))
    } catch (err) {
      hub.deleting(sessionId, false)
      await settleRecovery(request, false)
      throw err
    }
    const gone = (res.statusCode >= 200 && res.statusCode < 300) || res.statusCode === 404
    if (!gone) hub.deleting(sessionId, false)
    // A lost session deleted at once is not counted as recovered: its records go below,
    // or, the upstream having refused the DELETE, as an unconfirmed recovery.
    if (gone) recovering.delete(request)
    else await settleRecovery(request, false)
    if (gone) {
      sessions.delete(sessionId)
      hub.dropSession(sessionId)
      try {
        await metrics.timeStore('delete_session', () => store.deleteSession(sessionId))
      } catch (err) {
        // Fail closed: the client retries the DELETE until the records are gone.
        discardBody(res.body)
        throw errors.storeUnavailable(err)
      }
    }
    return sendUpstreamResponse(reply, res)
  }

  app.route({
    method: ['GET', 'POST', 'DELETE', 'PUT', 'PATCH', 'OPTIONS', 'HEAD'],
    url: config.mcpPath,
    // Keep-alive comments come from the streams' own ticker (sse/keep-alive.ts).
    sse: { kind: 'manual', heartbeat: false },
    handler: async (request, reply) => {
      const versionHeader = request.headers['mcp-protocol-version']
      const proto = protocolInfo(versionHeader)
      if (proto === null) throw errors.badProtocolVersion(String(versionHeader))
      const sessionId = sessionIdOf(request)
      if (sessionId !== undefined) {
        // Keyed by session and principal: someone who learnt a session id cannot
        // exhaust its owner's budget.
        const wait = limiter.take(`${principalOf(request, config.principalHeader)} ${sessionId}`)
        if (wait > 0) throw errors.rateLimited(wait)
      }
      const body = request.body as Buffer | undefined
      const legacyMethod = request.method === 'POST' || request.method === 'GET' || request.method === 'DELETE'
      if (proto.era === 'modern' || !legacyMethod) {
        // Never a way around the principal binding: a session this gateway knows is
        // checked whatever the method or the protocol revision claimed.
        if (sessionId !== undefined) await requireKnownSessionOrStateless(sessionId, request, proto)
        return await forwardTransparently(deps, request, reply, body)
      }
      switch (request.method) {
        case 'POST': return await handlePost(request, reply, proto)
        case 'GET': return await handleGet(request, reply, proto)
        default: return await handleDelete(request, reply)
      }
    }
  })
}
