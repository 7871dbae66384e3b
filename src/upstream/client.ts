import { Agent, Pool, errors as undiciErrors, type Dispatcher } from 'undici'
import type { Readable } from 'node:stream'
import { errors, GatewayError } from '../errors.js'
import { EndpointSet, type EndpointKey, type EndpointRoute } from './endpoint-set.js'
import { headerValue } from './headers.js'
import { targetOfUrl } from './upstream-url.js'

/**
 * What an upstream answer's body buffers while its reader is paused, before
 * the upstream connection is paused in turn (undici's default is 64 KB). A
 * stream paused for a later turn of the event loop (TURN_BYTES in
 * recording/read-ahead.ts) goes on receiving meanwhile, and its next turn
 * hands all of that to the store as one batch: fewer, larger appends and
 * client writes. With 100 flooding streams, 256 KB took 15-19% off the
 * gateway's CPU per event against 64 KB (bench/run.mjs --only=thr100,fair)
 * and a new client's head waited no longer; 1 MB took more off,
 * but a resumed stream's turn grows with it, and new clients waited longer.
 * A paused stream holds this much beyond its read-ahead bound (the same as
 * the bound's floor, READ_AHEAD_BYTES).
 */
export const BODY_BUFFER_BYTES = 256 * 1024

export interface UpstreamRequest {
  readonly method: string
  /** Path and query on the upstream origin. */
  readonly path: string
  readonly headers: Record<string, string | string[]>
  readonly body?: Buffer | Readable | undefined
  readonly signal?: AbortSignal | UpstreamAbort | undefined
  /**
   * The endpoint that holds the request's session (the key kept with the
   * session): the request goes there, or fails with `upstreamEndpointGone`
   * when that endpoint left the set, is set aside, or refuses the connection,
   * for the caller to establish the session elsewhere. Every request of a
   * session names it: the session's record is where each replica finds it
   * (sessionRequest). Absent: balanced (`newSession`: by the placement policy).
   */
  readonly endpoint?: EndpointKey | undefined
  /** An initialize: the endpoint is chosen by the placement policy, not round robin. */
  readonly newSession?: boolean | undefined
}

const NO_LISTENERS: ReadonlyArray<() => void> = []

/** The longest delay setTimeout keeps (a longer one fires at once). */
export const MAX_TIMER_MS = 2 ** 31 - 1

/**
 * Aborts an upstream request, like an AbortController, for requests that
 * may stay open for a stream's whole life. undici takes an EventEmitter as a
 * signal (it calls `once('abort')` and `removeListener`); an AbortSignal is an
 * EventTarget with two Maps, about 0.6 KB more per idle stream, and an
 * EventEmitter's listener table and once-wrapper about 0.3 KB
 * (bench/idle-census.mjs --by-owner). This keeps undici's listeners itself:
 * one per request open under it, most often one.
 */
export class UpstreamAbort {
  aborted = false
  /** Of the exact length (concat, filter): push() would make room for 17. */
  #listeners: ReadonlyArray<() => void> = NO_LISTENERS

  /** As undici registers (once: an abort happens once). */
  once (_event: 'abort', listener: () => void): this {
    if (!this.aborted) this.#listeners = this.#listeners.concat(listener)
    return this
  }

  /** undici checks for `on` to tell an emitter. */
  on (event: 'abort', listener: () => void): this {
    return this.once(event, listener)
  }

  removeListener (_event: 'abort', listener: () => void): this {
    this.#listeners = this.#listeners.filter(l => l !== listener)
    return this
  }

  /** What undici reports for an abort without one: its own RequestAbortedError. (A getter: nothing per instance.) */
  get reason (): unknown {
    return undefined
  }

  listenerCount (_event: 'abort'): number {
    return this.#listeners.length
  }

  abort (): void {
    if (this.aborted) return
    this.aborted = true
    const listeners = this.#listeners
    this.#listeners = NO_LISTENERS
    for (const listener of listeners) listener()
  }
}

/**
 * An UpstreamAbort that also aborts when the caller's does, for a request that
 * brings its own (a pump's, a client's) and gets the head deadline besides. It
 * listens to the caller's only while undici listens to it, from the request's
 * start until its body closes, so a caller's abort that outlives many requests
 * (a pump's, over its GETs) keeps nothing of those that ended. The caller's
 * reason, if any, is the one undici reports.
 */
class FollowingAbort extends UpstreamAbort {
  readonly #caller: AbortSignal | UpstreamAbort
  readonly #follow = (): void => { this.abort() }

  constructor (caller: AbortSignal | UpstreamAbort) {
    super()
    this.#caller = caller
    if (caller.aborted) this.aborted = true
  }

  override get reason (): unknown {
    return this.#caller.reason
  }

  override once (event: 'abort', listener: () => void): this {
    const first = this.listenerCount(event) === 0
    super.once(event, listener)
    if (first && this.listenerCount(event) > 0) {
      if (this.#caller instanceof UpstreamAbort) this.#caller.once('abort', this.#follow)
      else this.#caller.addEventListener('abort', this.#follow, { once: true })
    }
    return this
  }

  override removeListener (event: 'abort', listener: () => void): this {
    const had = this.listenerCount(event) > 0
    super.removeListener(event, listener)
    if (had && this.listenerCount(event) === 0) this.#unfollow()
    return this
  }

  override abort (): void {
    this.#unfollow()
    super.abort()
  }

  #unfollow (): void {
    if (this.#caller instanceof UpstreamAbort) this.#caller.removeListener('abort', this.#follow)
    else this.#caller.removeEventListener('abort', this.#follow)
  }
}

export interface UpstreamResponse {
  readonly statusCode: number
  readonly headers: Record<string, string | string[] | undefined>
  /**
   * The caller owns it: read it to its end, or pass it to discardBody. A body
   * left unread keeps its upstream connection busy.
   */
  readonly body: Readable
  /** The endpoint that answered: the one to keep with a session it issued. */
  readonly endpoint?: EndpointKey
}

export type UpstreamClientOptions = {
  readonly headersTimeoutMs: number
  /** UPSTREAM_KEEPALIVE_TIMEOUT_MS: how long an idle connection is kept when the upstream gives no Keep-Alive hint (unset: undici's 4 s). */
  readonly keepAliveTimeoutMs?: number
  readonly dispatcher?: Dispatcher
} & ({
  /** One endpoint. */
  readonly origin: URL
} | {
  /** The upstream server's endpoints. */
  readonly endpoints: EndpointSet
})

/**
 * The HTTP client for the upstream MCP server (undici). SSE answers can stay
 * open for hours, so bodies have no read timeout; only the wait for response
 * headers is bounded.
 *
 * The server may have several endpoints (EndpointSet): a request goes to the
 * endpoint of its session, or is balanced. A connection refused sets that
 * endpoint aside; a request without a session, whose body can be sent again,
 * then goes to the next endpoint (nothing reached the first).
 */
export class UpstreamClient {
  readonly endpoints: EndpointSet
  readonly #dispatcher: Dispatcher
  readonly #ownsDispatcher: boolean
  readonly #headersTimeoutMs: number

  constructor (options: UpstreamClientOptions) {
    this.endpoints = 'endpoints' in options
      ? options.endpoints
      : new EndpointSet([{ ...targetOfUrl(options.origin), resolvable: false }], { setAsideMs: 1000 })
    this.#headersTimeoutMs = options.headersTimeoutMs
    this.#ownsDispatcher = options.dispatcher === undefined
    this.#dispatcher = options.dispatcher ?? new Agent({
      // Idle upstream connections kept for the next request. A server's Keep-Alive
      // timeout hint replaces it, less undici's 2 s margin (Node's timeout=5: 3 s).
      ...(options.keepAliveTimeoutMs !== undefined && { keepAliveTimeout: options.keepAliveTimeoutMs }),
      // One client stream may hold an upstream connection for its lifetime.
      connections: null,
      pipelining: 1,
      // One pool per origin (undici's default), with the name's TLS server name when
      // connecting by address. The origin is the route's, as the request gave it: an
      // endpoint's key (a URL's origin would drop a default port the key keeps).
      factory: (origin, opts) => {
        const servername = this.endpoints.routeOf(String(origin))?.servername
        return new Pool(origin, servername === undefined ? opts : { ...opts, connect: { servername } })
      }
    })
  }

  async request (req: UpstreamRequest): Promise<UpstreamResponse> {
    // Aborted already: nothing is sent (undici would still take a connection, and close it).
    if (req.signal?.aborted === true) throw toGatewayError(req.signal.reason ?? new undiciErrors.RequestAbortedError())
    if (req.endpoint !== undefined) return await this.#toSessionEndpoint(req.endpoint, req)
    return await this.#balanced(req, req.headers['mcp-session-id'] === undefined)
  }

  async #toSessionEndpoint (key: EndpointKey, req: UpstreamRequest): Promise<UpstreamResponse> {
    const route = this.endpoints.resolve(key)
    if (route === undefined) throw errors.upstreamEndpointGone()
    try {
      return await this.#send(key, route, req)
    } catch (err) {
      if (this.endpoints.reportFailure(key, err)) throw errors.upstreamEndpointGone(err)
      throw toGatewayError(err)
    }
  }

  async #balanced (req: UpstreamRequest, sessionless: boolean): Promise<UpstreamResponse> {
    // Endpoints that refused this request; made only once one has (not on every request).
    let refused: Set<EndpointKey> | undefined
    let refusal: unknown
    for (;;) {
      const key = req.newSession === true ? this.endpoints.place() : this.endpoints.pick()
      const route = this.endpoints.routeOf(key)
      // Every endpoint in rotation refused: the last refusal is the answer.
      if (route === undefined || refused?.has(key) === true) throw toGatewayError(refusal ?? errors.upstreamUnavailable())
      try {
        const res = await this.#send(key, route, req)
        const issued = headerValue(res.headers['mcp-session-id'])
        if (sessionless && issued !== undefined) this.endpoints.sessionPlaced(key)
        return res
      } catch (err) {
        // Set aside, it is not picked again while another is in rotation.
        const setAside = this.endpoints.reportFailure(key, err)
        if (!setAside || aborted(req.signal) || !(req.body === undefined || Buffer.isBuffer(req.body))) throw toGatewayError(err)
        refused ??= new Set()
        refused.add(key)
        refusal = err
      }
    }
  }

  async #send (key: EndpointKey, route: EndpointRoute, req: UpstreamRequest): Promise<UpstreamResponse> {
    // undici's headersTimeout starts again at each interim (1xx) answer, so an upstream
    // sending 102 Processing every few seconds would hold a request for as long as it
    // keeps on: a POST with its body, or the session's standalone GET. The wait for the
    // final head is bounded here too, on the clock, by the same timeout (an
    // UpstreamAbort: the request may be a stream's), following the request's own abort
    // when it brings one. Not for a body streamed from a client, whose upload may
    // outlast the timeout: that request ends with its client.
    let timer: NodeJS.Timeout | undefined
    let timedOut = false
    let signal = req.signal
    if ((req.body === undefined || Buffer.isBuffer(req.body)) && this.#headersTimeoutMs <= MAX_TIMER_MS) {
      const deadline = req.signal === undefined ? new UpstreamAbort() : new FollowingAbort(req.signal)
      timer = setTimeout(() => {
        // The caller's abort came first: its error is the one to report.
        if (deadline.aborted) return
        timedOut = true
        deadline.abort()
      }, this.#headersTimeoutMs)
      signal = deadline
    }
    let res: Dispatcher.ResponseData
    try {
      res = await this.#dispatcher.request({
        origin: route.origin,
        path: req.path,
        method: req.method as Dispatcher.HttpMethod,
        headers: route.host === undefined ? req.headers : { ...req.headers, host: route.host },
        body: req.body ?? null,
        signal,
        headersTimeout: this.#headersTimeoutMs,
        bodyTimeout: 0,
        highWaterMark: BODY_BUFFER_BYTES
      })
    } catch (err) {
      // The abort's own error only: undici cannot abort a connection being made, and a
      // connect that fails after the deadline must still read as one (the endpoint set
      // aside, the request tried elsewhere, the session established again).
      throw timedOut && (err as { code?: unknown }).code === 'UND_ERR_ABORTED' ? new undiciErrors.HeadersTimeoutError() : err
    } finally {
      clearTimeout(timer)
    }
    this.endpoints.reportAnswer(key)
    return { statusCode: res.statusCode, headers: res.headers, body: res.body, endpoint: key }
  }

  async close (): Promise<void> {
    if (this.#ownsDispatcher) await this.#dispatcher.close()
  }

  /** Like close(), but answers still being read are cut instead of awaited. */
  async destroy (): Promise<void> {
    if (this.#ownsDispatcher) await this.#dispatcher.destroy()
  }
}

/**
 * Drops an upstream answer nobody will read. undici reports a body destroyed
 * before its end as an `error` (aborted); with no listener that error would be
 * uncaught and bring the process down, so it is kept here.
 */
export function discardBody (body: Readable): void {
  // Always: a listener someone else has now may be removed before the error comes.
  body.on('error', ignore)
  body.destroy()
}

function ignore (): void {}

function aborted (signal: UpstreamRequest['signal']): boolean {
  return signal?.aborted === true
}

function toGatewayError (err: unknown): Error {
  if (err instanceof GatewayError) return err
  if (err instanceof undiciErrors.HeadersTimeoutError || err instanceof undiciErrors.ConnectTimeoutError) return errors.upstreamTimeout()
  if (err instanceof Error && err.name === 'AbortError') return err
  const wrapped = errors.upstreamUnavailable()
  wrapped.cause = err
  return wrapped
}
