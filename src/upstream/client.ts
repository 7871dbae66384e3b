import { Agent, errors as undiciErrors, type Dispatcher } from 'undici'
import { EventEmitter } from 'node:events'
import type { Readable } from 'node:stream'
import { errors, GatewayError } from '../errors.js'

export interface UpstreamRequest {
  readonly method: string
  /** Path and query on the upstream origin. */
  readonly path: string
  readonly headers: Record<string, string | string[]>
  readonly body?: Buffer | Readable | undefined
  readonly signal?: AbortSignal | UpstreamAbort | undefined
}

/**
 * Aborts an upstream request, like an AbortController, for requests that
 * may stay open for a stream's whole life. undici takes an EventEmitter as a
 * signal; an AbortSignal is an EventTarget with two Maps, about 0.6 KB more
 * per idle stream (bench/idle-census.mjs --by-owner).
 */
export class UpstreamAbort extends EventEmitter {
  aborted = false

  abort (): void {
    if (this.aborted) return
    this.aborted = true
    this.emit('abort')
  }
}

export interface UpstreamResponse {
  readonly statusCode: number
  readonly headers: Record<string, string | string[] | undefined>
  readonly body: Readable
}

export interface UpstreamClientOptions {
  readonly origin: URL
  readonly headersTimeoutMs: number
  readonly dispatcher?: Dispatcher
}

/**
 * The HTTP client for the upstream MCP server (undici). SSE answers can stay
 * open for hours, so bodies have no read timeout; only the wait for response
 * headers is bounded.
 */
export class UpstreamClient {
  readonly #origin: string
  readonly #dispatcher: Dispatcher
  readonly #ownsDispatcher: boolean
  readonly #headersTimeoutMs: number

  constructor (options: UpstreamClientOptions) {
    this.#origin = options.origin.origin
    this.#headersTimeoutMs = options.headersTimeoutMs
    this.#ownsDispatcher = options.dispatcher === undefined
    this.#dispatcher = options.dispatcher ?? new Agent({
      keepAliveTimeout: 30_000,
      // One client stream may hold an upstream connection for its lifetime.
      connections: null,
      pipelining: 1
    })
  }

  async request (req: UpstreamRequest): Promise<UpstreamResponse> {
    try {
      const res = await this.#dispatcher.request({
        origin: this.#origin,
        path: req.path,
        method: req.method as Dispatcher.HttpMethod,
        headers: req.headers,
        body: req.body ?? null,
        signal: req.signal,
        headersTimeout: this.#headersTimeoutMs,
        bodyTimeout: 0
      })
      return { statusCode: res.statusCode, headers: res.headers, body: res.body }
    } catch (err) {
      throw toGatewayError(err)
    }
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

function toGatewayError (err: unknown): Error {
  if (err instanceof GatewayError) return err
  if (err instanceof undiciErrors.HeadersTimeoutError || err instanceof undiciErrors.ConnectTimeoutError) return errors.upstreamTimeout()
  if (err instanceof Error && err.name === 'AbortError') return err
  const wrapped = errors.upstreamUnavailable()
  wrapped.cause = err
  return wrapped
}
