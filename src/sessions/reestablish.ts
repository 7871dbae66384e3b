/**
 * Establishing a session upstream again, when the upstream lost it (it
 * answered 404 for a session the gateway holds, or its process is gone and
 * a new one listens): the client's recorded initialize is sent again, then
 * notifications/initialized and the session-state requests the recipe kept;
 * the session's record then points at the new upstream session, for every
 * replica. The client keeps its session id and never sees the new upstream
 * one. At most one replica does it at a time per session (a fence in the
 * store); the others wait for the record to move and use it.
 */
import { randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger as Logger } from 'fastify'
import PQueue from 'p-queue'
import type { GatewayMetrics, ReestablishOutcome } from '../metrics/metrics.js'
import { initializePromise } from '../protocol/initialize.js'
import type { EventStore, SessionRecipe, SessionRecord, UpstreamPlacement } from '../store/contract.js'
import { discardBody, type UpstreamClient, type UpstreamResponse } from '../upstream/client.js'
import { headerValue, mediaType } from '../upstream/headers.js'
import { readAnswerStart } from '../upstream/answer-start.js'
import { isConnectFailure } from '../upstream/connect-failure.js'
import { readJsonRpcAnswer, type JsonRpcResponse } from '../recording/json-rpc-answer.js'
import { abandonUpstreamSession, samePlacement, sessionRequest } from '../upstream/session-request.js'
import type { LeftBehind } from './left-behind.js'

export interface ReestablishOptions {
  readonly store: EventStore
  readonly upstream: UpstreamClient
  readonly metrics: GatewayMetrics
  readonly mcpPath: string
  /** Bound on an answer read for its JSON-RPC response (MAX_EVENT_BYTES). */
  readonly maxAnswerBytes: number
  /** How long the fence holds, and how long a replica waits for another's re-establishment, or for its turn. */
  readonly fenceMs?: number
  /** Re-establishments talking to the upstream at once in this process (REESTABLISH_CONCURRENCY); the others wait their turn. */
  readonly concurrency: number
  /** Where an upstream session replaced goes to be deleted, when the upstream never said it lost it. */
  readonly leftBehind?: LeftBehind
}

/**
 * What said the session's upstream session may be lost: the upstream's
 * answer (`answered`: 404, or the SDK example servers' 400), or no answer at
 * all (`unanswered`: the connection refused or reset, the endpoint set aside
 * or gone), after which the old upstream session may still live.
 */
export type LossSign = 'answered' | 'unanswered'

/** How a re-establishment ended: the record to go on with, or why there is none. */
export type Reestablished =
  | { readonly outcome: 'reestablished' | 'joined' | 'found', readonly record: SessionRecord }
  | { readonly outcome: Exclude<ReestablishOutcome, 'reestablished' | 'joined' | 'found'> }

const FENCE_MS = 10_000
const WAIT_STEP_MS = 50

/** A re-establishment's turn did not come in time (REESTABLISH_CONCURRENCY). */
class NoTurn extends Error {
  constructor () {
    super('no turn to establish the session upstream again in time')
  }
}

/** The longest 400 answer read to tell whether it speaks of the session id. */
const LOST_SESSION_BODY_BYTES = 4096
/**
 * How long such an answer is read: one whose short body has not ended by
 * then is passed on as it is (not read as a lost session), rather than hold
 * the request and its upstream connection for as long as it stalls.
 */
const LOST_SESSION_WAIT_MS = 1000
/** What a 400 that means the session is unknown speaks of (see lostSession). */
const LOST_SESSION_400 = /session|not initialized/i

/**
 * Does the upstream's answer to a request naming a session say that it does
 * not know the session? 404, as the transports specification has it; and a
 * short 400 whose body speaks of the session id, or of a server not
 * initialized: servers built on the SDK's example code (server-everything
 * among them) answer an unknown session with `400 Bad Request: No valid
 * session ID provided`, and the SDK's transport, serving one session per
 * process, answers any request to a new process with `400 Bad Request: Server
 * not initialized`. `res` is the answer to pass on either way (a 400's body,
 * read to tell, is given back whole).
 */
export async function lostSession (answer: UpstreamResponse): Promise<{ readonly lost: boolean, readonly res: UpstreamResponse }> {
  if (answer.statusCode === 404) return { lost: true, res: answer }
  const length = Number(headerValue(answer.headers['content-length']) ?? 0)
  if (answer.statusCode !== 400 || length > LOST_SESSION_BODY_BYTES) return { lost: false, res: answer }
  const start = await readAnswerStart(answer.body, LOST_SESSION_BODY_BYTES, undefined, LOST_SESSION_WAIT_MS)
  const lost = start.ended && LOST_SESSION_400.test(Buffer.concat(start.chunks).toString('utf8'))
  return { lost, res: { ...answer, body: start.body } }
}

/**
 * A failure before any answer that says the session's upstream process may be
 * gone: the connection refused or reset, or the endpoint holding the session
 * left the set or was set aside.
 */
export function upstreamUnreachable (err: unknown): boolean {
  const code = errorCode(err)
  return code === 'MCPGW_UPSTREAM_UNAVAILABLE' || code === 'MCPGW_UPSTREAM_ENDPOINT_GONE'
}

/**
 * upstreamUnreachable, and nothing of the request reached the upstream: no
 * connection was made, or the endpoint was gone before it was tried. Only
 * then may a request that can change state be sent again. A reset on a
 * connection that was open may come after the upstream read the request and
 * acted on it (a tool that ran, then its process died before answering).
 */
export function upstreamNeverReached (err: unknown): boolean {
  const code = errorCode(err)
  if (code === 'MCPGW_UPSTREAM_ENDPOINT_GONE') return true
  return code === 'MCPGW_UPSTREAM_UNAVAILABLE' && isConnectFailure((err as { cause?: unknown }).cause)
}

function errorCode (err: unknown): unknown {
  return typeof err === 'object' && err !== null ? (err as { code?: unknown }).code : undefined
}

export class SessionReestablisher {
  readonly #o: ReestablishOptions
  readonly #fenceMs: number
  /** Re-establishments running in this process, by session: a second request joins the first. */
  readonly #running = new Map<string, Promise<Reestablished>>()
  /** The turns of re-establishments under their fence (the part that talks to the upstream). */
  readonly #turns: PQueue

  constructor (options: ReestablishOptions) {
    this.#o = options
    this.#fenceMs = options.fenceMs ?? FENCE_MS
    this.#turns = new PQueue({ concurrency: options.concurrency })
  }

  /** Re-establishments talking to the upstream now, and waiting their turn. */
  get load (): { readonly running: number, readonly waiting: number } {
    return { running: this.#turns.pending, waiting: this.#turns.size }
  }

  /**
   * Establish the session upstream again, if `stale` (the record the failed
   * request was sent under) is still where the session lives; else the
   * record it moved to. `headers`: the failed request's (its auth). `sign`:
   * what said the upstream session may be lost (the one of a request that
   * joins a re-establishment under way is not looked at).
   */
  async reestablish (sessionId: string, stale: SessionRecord, headers: Record<string, string | string[]>, sign: LossSign, log: Logger): Promise<Reestablished> {
    let running = this.#running.get(sessionId)
    if (running === undefined) {
      running = this.#run(sessionId, stale, headers, sign, log).finally(() => this.#running.delete(sessionId))
      this.#running.set(sessionId, running)
      return await running
    }
    const result = await running
    return result.outcome === 'reestablished' ? { outcome: 'joined', record: result.record } : result
  }

  /**
   * Run `task` while no re-establishment of the session is under way, here
   * or on another replica: under the session's fence, once one running
   * lets it go. A DELETE runs so: it reads the record a re-establishment
   * left and ends the upstream session that record names, and one that
   * starts meanwhile waits, then finds the session gone. The fence lasts
   * its own time (FENCE_MS), not renewed: a task that outlives it holds
   * nothing after that. After twice that without the fence (one taken again
   * and again), the task runs without it, logged; and at once when the store
   * cannot be asked (the task meets the store's failure itself).
   */
  async excluding<T> (sessionId: string, log: Logger, task: () => Promise<T>): Promise<T> {
    const { store, metrics } = this.#o
    const token = randomBytes(12).toString('base64url')
    const deadline = Date.now() + 2 * this.#fenceMs
    const take = async (): Promise<'held' | 'busy' | 'failed'> => {
      try {
        return await metrics.timeStore('session_fence', () => store.acquireSessionFence(sessionId, token, this.#fenceMs)) ? 'held' : 'busy'
      } catch (err) {
        log.warn({ err }, 'could not take the session\'s fence: going on without it')
        return 'failed'
      }
    }
    let fence = await take()
    while (fence === 'busy' && Date.now() < deadline) {
      await sleep(WAIT_STEP_MS)
      fence = await take()
    }
    const held = fence === 'held'
    if (fence === 'busy') log.warn('the session is being established upstream again for too long: going on without waiting for it')
    try {
      return await task()
    } finally {
      if (held) await store.releaseSessionFence(sessionId, token).catch(() => {})
    }
  }

  async #run (sessionId: string, stale: SessionRecord, headers: Record<string, string | string[]>, sign: LossSign, log: Logger): Promise<Reestablished> {
    const { metrics } = this.#o
    const startedAt = performance.now()
    const token = randomBytes(12).toString('base64url')
    let result: Reestablished
    const deadline = Date.now() + this.#fenceMs
    try {
      result = await this.#fenced(sessionId, token, stale, headers, sign, log, deadline) ??
        // Another replica holds the fence: wait for the record to move, or for the fence to go.
        await this.#awaitOther(sessionId, token, stale, headers, sign, log, deadline)
    } catch (err) {
      if (err instanceof NoTurn) {
        log.warn({ running: this.#turns.pending, waiting: this.#turns.size }, 'too many sessions being established upstream again at once (REESTABLISH_CONCURRENCY): this one waited too long for its turn; the session is kept')
        result = { outcome: 'busy' }
      } else {
        // Nothing definitive was answered (the upstream or the store could not be reached,
        // a connection broke): the session is kept, and the next request tries again.
        log.warn({ err }, 'could not establish the session upstream again for now; the session is kept')
        result = { outcome: 'unavailable' }
      }
    }
    metrics.upstreamSessionsReestablished.inc({ outcome: result.outcome })
    log.info({ outcome: result.outcome, durationMs: Math.round(performance.now() - startedAt) }, 'upstream session re-establishment')
    return result
  }

  /**
   * The re-establishment under the session's fence, in its turn (at most
   * `concurrency` at once; the fence is taken once the turn came, so waiting
   * holds none); undefined when another holds the fence. Throws NoTurn when
   * the turn did not come before `deadline`.
   */
  async #fenced (sessionId: string, token: string, stale: SessionRecord, headers: Record<string, string | string[]>, sign: LossSign, log: Logger, deadline: number): Promise<Reestablished | undefined> {
    const { store, metrics } = this.#o
    const waited = new AbortController()
    const timer = setTimeout(() => waited.abort(new NoTurn()), Math.max(0, deadline - Date.now())).unref()
    try {
      return await this.#turns.add(async () => {
        // Its turn came: from now on it runs to its end, whatever the deadline (the queue's
        // signal would free the turn of a task still running).
        clearTimeout(timer)
        if (!await metrics.timeStore('session_fence', () => store.acquireSessionFence(sessionId, token, this.#fenceMs))) return undefined
        try {
          return await this.#underFence(sessionId, stale, headers, sign, log)
        } finally {
          await store.releaseSessionFence(sessionId, token).catch(() => {})
        }
      }, { signal: waited.signal })
    } finally {
      clearTimeout(timer)
    }
  }

  /**
   * Another replica holds the fence: wait for the record to move. Should the
   * fence go without it moving (that replica could not reach the upstream, or
   * died), this one tries in turn.
   */
  async #awaitOther (sessionId: string, token: string, stale: SessionRecord, headers: Record<string, string | string[]>, sign: LossSign, log: Logger, deadline: number): Promise<Reestablished> {
    const { store, metrics } = this.#o
    while (Date.now() < deadline) {
      await sleep(WAIT_STEP_MS)
      const record = await metrics.timeStore('get_session', () => store.getSession(sessionId))
      if (record === null) return { outcome: 'gone' }
      if (!samePlacement(record, stale)) return { outcome: 'joined', record }
      const mine = await this.#fenced(sessionId, token, stale, headers, sign, log, deadline)
      if (mine !== undefined) return mine
    }
    return { outcome: 'timed_out' }
  }

  async #underFence (sessionId: string, stale: SessionRecord, headers: Record<string, string | string[]>, sign: LossSign, log: Logger): Promise<Reestablished> {
    const { store, metrics } = this.#o
    const [current, recipe] = await Promise.all([
      metrics.timeStore('get_session', () => store.getSession(sessionId)),
      metrics.timeStore('recipe', () => store.recipe(sessionId))
    ])
    if (current === null) return { outcome: 'gone' }
    // Another replica did it (or found the session's endpoint) just before this one took the fence.
    if (!samePlacement(current, stale)) return { outcome: 'joined', record: current }
    // The upstream's answers within the fence's time: one that accepts the requests and
    // never answers must not hold the client's request (and the fence) for long.
    const signal = AbortSignal.timeout(this.#fenceMs)
    if (current.endpoint === undefined && this.#o.upstream.endpoints.size > 1) {
      const found = await this.#locate(sessionId, current, headers, signal, log)
      if (found !== undefined) return found
    }
    if (recipe === null || !recipe.complete) return { outcome: 'unrecorded' }
    const established = await this.#initialize(recipe, baseHeaders(headers), signal, log)
    if (established === 'failed' || established === 'unavailable') return { outcome: established }
    if (established === 'incompatible') return { outcome: 'incompatible' }
    const { upstreamSessionId, version, endpoint } = established
    const sessionHeaders = { ...baseHeaders(headers), 'mcp-protocol-version': version }
    // Where the upstream placed the new session (with several endpoints, maybe not where the old one was).
    const placement: UpstreamPlacement = { upstreamSessionId, ...(endpoint !== undefined && { endpoint }) }
    let moved: SessionRecord | null
    try {
      await this.#notify(placement, sessionHeaders, signal)
      for (const request of stateRequests(recipe)) {
        const response = await this.#call(placement, sessionHeaders, request, signal)
        if (response?.error !== undefined) log.warn({ method: request.method, error: response.error }, 'the upstream refused a session-state request replayed on re-establishment; going on without it')
      }
      moved = await metrics.timeStore('move_placement', () => store.movePlacement(sessionId, stale.upstreamSessionId, placement))
    } catch (err) {
      this.#abandon(placement, sessionHeaders)
      throw err
    }
    if (moved?.upstreamSessionId !== upstreamSessionId) this.#abandon(placement, sessionHeaders)
    if (moved === null) return { outcome: 'gone' }
    if (moved.upstreamSessionId !== upstreamSessionId) return { outcome: 'joined', record: moved }
    // Nothing said the old upstream session was lost (a refused or reset connection, an
    // endpoint set aside or gone): it may live on where it was, on another endpoint that comes
    // back or on this one (a reset connection), calls still running in it.
    const left = current.endpoint ?? (this.#o.upstream.endpoints.size === 1 ? endpoint : undefined)
    if (sign === 'unanswered' && left !== undefined && current.upstreamSessionId !== upstreamSessionId) {
      this.#o.leftBehind?.add(sessionId, { upstreamSessionId: current.upstreamSessionId, endpoint: left }, sessionHeaders)
      log.info({ endpoint: left, moved: left !== endpoint }, 'the session was established again without the upstream saying it lost the old upstream session: that one is deleted after REESTABLISH_DELETE_AFTER_SECONDS, once its endpoint can be reached')
    }
    return { outcome: 'reestablished', record: moved }
  }

  /**
   * A record that names no endpoint (recorded again after the store lost it,
   * on a replica that did not know where the session lives), with several
   * endpoints: its requests were balanced, and one that does not hold the
   * session answered 404 (SDK servers keep sessions in memory, one endpoint
   * each). The session may well live on another one, which the recipe, lost
   * with the store, could not replace. Each endpoint is asked with a `ping`
   * (harmless in any session: transports spec, 2025-06-18, "Session
   * Management"); the first that answers it with a 2xx holds it (an
   * endpoint that does not know the session answers 404, or 400 for the
   * SDK's example servers; any other refusal, such as a 401, says nothing of
   * the session), and the record is pinned there, same upstream session.
   * At most one request per endpoint, all within the fence's time.
   * Undefined: no endpoint knows it.
   */
  async #locate (sessionId: string, current: SessionRecord, headers: Record<string, string | string[]>, signal: AbortSignal, log: Logger): Promise<Reestablished | undefined> {
    const { store, metrics, upstream } = this.#o
    const version = headerValue(headers['mcp-protocol-version'])
    const pingHeaders = { ...baseHeaders(headers), ...(version !== undefined && { 'mcp-protocol-version': version }) }
    const body = Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: `mcpgw-locate-${randomBytes(6).toString('base64url')}`, method: 'ping' }))
    const keys = upstream.endpoints.snapshot().map(e => e.endpoint)
    const holds = await Promise.all(keys.map(async endpoint => {
      const placement: UpstreamPlacement = { upstreamSessionId: current.upstreamSessionId, endpoint }
      try {
        const res = await this.#post(pingHeaders, body, signal, placement)
        discardBody(res.body)
        return res.statusCode >= 200 && res.statusCode < 300
      } catch {
        // Refused, set aside, gone, or no answer in time: not where the session can be used now.
        return false
      }
    }))
    const endpoint = keys.find((_, i) => holds[i])
    if (endpoint === undefined) return undefined
    const moved = await metrics.timeStore('move_placement', () => store.movePlacement(sessionId, current.upstreamSessionId, { upstreamSessionId: current.upstreamSessionId, endpoint }))
    if (moved === null) return { outcome: 'gone' }
    log.info({ endpoint }, 'found the endpoint holding a recovered session\'s upstream session; its record names it now')
    return { outcome: samePlacement(moved, { upstreamSessionId: current.upstreamSessionId, endpoint }) ? 'found' : 'joined', record: moved }
  }

  /**
   * An upstream session established here that the record does not point at
   * (another replica's was recorded first, the session went meanwhile, or
   * the steps after initialize failed): deleted upstream, best effort, not
   * waited for. An SDK server keeps a session until told, so each one left
   * would stay there for the server's life.
   */
  #abandon (placement: UpstreamPlacement, headers: Record<string, string | string[]>): void {
    abandonUpstreamSession(async request => await this.#o.upstream.request(request), placement, this.#o.mcpPath, headers, this.#fenceMs)
  }

  /**
   * POST the recorded initialize: the new session's id and version;
   * 'incompatible'; 'unavailable' when the upstream answered with a server
   * error, or asked to be called later (408, 429); else 'failed' when it did
   * not establish one.
   */
  async #initialize (recipe: SessionRecipe, headers: Record<string, string | string[]>, signal: AbortSignal, log: Logger): Promise<{ upstreamSessionId: string, version: string, endpoint: string | undefined } | Extract<ReestablishOutcome, 'incompatible' | 'failed' | 'unavailable'>> {
    const id = `mcpgw-reinit-${randomBytes(6).toString('base64url')}`
    const body = withId(recipe.initialize, id)
    if (body === undefined) return 'failed'
    const res = await this.#post(headers, body, signal)
    const upstreamSessionId = headerValue(res.headers['mcp-session-id'])
    const response = await this.#response(res, id)
    if (res.statusCode !== 200 || upstreamSessionId === undefined || response?.result === undefined) {
      const unavailable = res.statusCode >= 500 || res.statusCode === 408 || res.statusCode === 429
      log.warn({ status: res.statusCode, sessionIssued: upstreamSessionId !== undefined }, unavailable
        ? 'the upstream could not establish the session again for now; the session is kept'
        : 'the upstream did not establish the session again')
      return unavailable ? 'unavailable' : 'failed'
    }
    const promised = initializePromise(response.result)
    if (promised !== recipe.initializeResult) return 'incompatible'
    return { upstreamSessionId, version: (response.result as { protocolVersion: string }).protocolVersion, endpoint: res.endpoint }
  }

  async #notify (placement: UpstreamPlacement, headers: Record<string, string | string[]>, signal: AbortSignal): Promise<void> {
    const res = await this.#post(headers, Buffer.from('{"jsonrpc":"2.0","method":"notifications/initialized"}'), signal, placement)
    discardBody(res.body)
  }

  async #call (placement: UpstreamPlacement, headers: Record<string, string | string[]>, request: { method: string, body: string }, signal: AbortSignal): Promise<JsonRpcResponse | undefined> {
    const id = `mcpgw-restate-${randomBytes(6).toString('base64url')}`
    const body = withId(request.body, id)
    if (body === undefined) return undefined
    return await this.#response(await this.#post(headers, body, signal, placement), id)
  }

  /** A request of the new session (`placement`), or without one: an initialize, placed as a new session is. */
  async #post (headers: Record<string, string | string[]>, body: Buffer, signal: AbortSignal, placement?: UpstreamPlacement): Promise<UpstreamResponse> {
    const post = { method: 'POST', path: this.#o.mcpPath, headers, body, signal }
    return await this.#o.upstream.request(placement === undefined ? { ...post, newSession: true } : sessionRequest(placement, post))
  }

  /** The JSON-RPC response in an answer (JSON or SSE), the rest of it dropped. */
  async #response (res: UpstreamResponse, id: string): Promise<JsonRpcResponse | undefined> {
    const type = mediaType(res.headers['content-type'])
    const kind = type === 'text/event-stream' ? 'sse' : type === 'application/json' ? 'json' : undefined
    if (kind === undefined) {
      discardBody(res.body)
      return undefined
    }
    const answer = await readJsonRpcAnswer(res.body, kind, id, this.#o.maxAnswerBytes)
    discardBody(answer.body)
    return answer.response
  }
}

/** The failed request's end-to-end headers (its auth), for requests of the gateway's own: no session, no resume id, JSON in. */
function baseHeaders (headers: Record<string, string | string[]>): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {}
  for (const [name, value] of Object.entries(headers)) {
    if (name === 'mcp-session-id' || name === 'last-event-id' || name === 'content-length' || name === 'content-encoding' || name === 'mcp-protocol-version') continue
    out[name] = value
  }
  out['content-type'] = 'application/json'
  out.accept = 'application/json, text/event-stream'
  out['accept-encoding'] = 'identity'
  return out
}

/** The recipe's session-state requests, in the order they are replayed: the log level, then each subscription. */
function stateRequests (recipe: SessionRecipe): Array<{ method: string, body: string }> {
  const requests: Array<{ method: string, body: string }> = []
  if (recipe.logLevel !== undefined) requests.push({ method: 'logging/setLevel', body: recipe.logLevel })
  for (const uri of recipe.subscriptions) {
    requests.push({ method: 'resources/subscribe', body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'resources/subscribe', params: { uri } }) })
  }
  return requests
}

/** A recorded request under a new JSON-RPC id (the upstream's new session has seen none of the old ones). */
function withId (body: string, id: string): Buffer | undefined {
  try {
    const message = JSON.parse(body) as Record<string, unknown>
    if (message === null || typeof message !== 'object' || Array.isArray(message)) return undefined
    return Buffer.from(JSON.stringify({ ...message, id }))
  } catch {
    return undefined
  }
}
