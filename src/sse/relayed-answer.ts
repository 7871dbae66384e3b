/**
 * An upstream answer passed on to its client as it comes, unrecorded: a JSON
 * answer, a 202 or an error, a DELETE's answer, a refused GET, the answer to
 * a modern-era request or to another path. Its connection is under the rules
 * every client connection is under (client-buffers.ts): the bytes waiting in
 * its socket count toward CLIENT_BUFFERS_MAX_BYTES, and a client that accepts
 * no byte of them for CLIENT_WRITE_TIMEOUT_SECONDS is cut, the upstream
 * answer with it (its body destroyed: undici aborts the request and frees
 * the upstream connection). Nothing else would cut it: upstream bodies have
 * no read timeout (an SSE answer may stay open for hours), and a client that
 * stopped reading held a socket, the upstream answer and their buffers for
 * good.
 *
 * Over the budget it is paused, not closed: unlike a recorded stream it
 * cannot be resumed from the store, so closing it would lose the answer (a
 * tool's result). Paused, it holds no more than its fixed buffers (the
 * upstream connection is paused in turn), and it goes on once the budget has
 * room. A client whose socket drained while its answer waits for the budget
 * is not cut (the wait is not its doing); one that stops reading is.
 *
 * The writes into the connection are Fastify's (reply.send pipes this stream
 * into it). They are measured as a client stream measures its own: the bytes
 * waiting just before and just after each, read by 'data' listeners on
 * either side of the pipe's, added when the pipe is made.
 */
import type { FastifyBaseLogger as Logger } from 'fastify'
import type { ServerResponse } from 'node:http'
import { pipeline, Transform, type Readable, type TransformCallback } from 'node:stream'
import type { GatewayMetrics } from '../metrics/metrics.js'
import type { ClientBuffer, ClientBuffers, StalledListener } from './client-buffers.js'

export interface RelayDeps {
  /** The process's client buffers: their budget, and the write timeout. */
  readonly buffers: ClientBuffers
  readonly metrics: GatewayMetrics
}

/**
 * What to send on `raw` for the upstream answer `body`: the body, passed on
 * under the budget (and the share of it of the client at `address`, its
 * clientKey) and the write timeout. The two end together: the body's
 * error reaches the reply, and the reply's end before the body's (the client
 * gone, or cut) destroys the body.
 */
export function relayedBody (deps: RelayDeps, raw: ServerResponse, address: string, log: Logger, body: Readable): Readable {
  const relay = new RelayedAnswer(deps, raw, address, log)
  // Errors are the reply's to report (Fastify listens to the stream it sends).
  pipeline(body, relay, ignore)
  return relay
}

class RelayedAnswer extends Transform implements StalledListener {
  readonly #buffers: ClientBuffers
  readonly #metrics: GatewayMetrics
  readonly #log: Logger
  readonly #raw: ServerResponse
  readonly #address: string
  /** Made at the first write that leaves bytes waiting: a short answer read promptly needs none. */
  #account: ClientBuffer | undefined
  /** writableLength just before the pipe's write of the chunk being passed on. */
  #before = 0
  /** The next look for room in the budget, while a chunk waits for it. */
  #retry: NodeJS.Timeout | undefined

  constructor (deps: RelayDeps, raw: ServerResponse, address: string, log: Logger) {
    super()
    this.#buffers = deps.buffers
    this.#metrics = deps.metrics
    this.#log = log
    this.#raw = raw
    this.#address = address
    const onPipe = (source: unknown): void => {
      if (source !== this) return
      raw.off('pipe', onPipe)
      // The pipe's own 'data' listener (made before it emits 'pipe') writes each
      // chunk: one listener runs before it, the other after.
      this.prependListener('data', () => { this.#before = raw.writableLength })
      this.on('data', () => { this.#wrote() })
    }
    raw.on('pipe', onPipe)
  }

  override _transform (chunk: Buffer, _encoding: BufferEncoding, done: TransformCallback): void {
    if (this.#buffers.room(chunk.length, this.#address, this.#account)) {
      done(null, chunk)
      return
    }
    // Held until the budget has room: the body, then the upstream connection, wait.
    this.#log.debug({ bytes: chunk.length, waitingBytes: this.#buffers.waitingBytes, maxBytes: this.#buffers.maxBytes, addressWaitingBytes: this.#buffers.waitingFor(this.#address) }, 'client buffers full (CLIENT_BUFFERS_MAX_BYTES, or this client address\'s share of it): a relayed answer waits for room')
    const retry = (): void => {
      this.#retry = undefined
      if (this.#buffers.room(chunk.length, this.#address, this.#account)) done(null, chunk)
      else this.#wait(retry)
    }
    this.#wait(retry)
  }

  override _destroy (err: Error | null, callback: (error?: Error | null) => void): void {
    clearTimeout(this.#retry)
    this.#retry = undefined
    callback(err)
  }

  /** Cut by the write timeout (the socket is destroyed already): counted as a recorded stream's, logged, the upstream answer dropped. */
  writeTimedOut (waitingBytes: number): void {
    this.#metrics.clientWriteTimeouts.inc()
    this.#log.warn({ statusCode: this.#raw.statusCode, waitingBytes, upstreamEnded: this.writableFinished, timeoutSeconds: this.#buffers.writeTimeoutMs / 1000 }, 'client accepted no bytes of a relayed answer within CLIENT_WRITE_TIMEOUT_SECONDS: connection destroyed, the upstream answer dropped (it cannot be resumed)')
    this.destroy()
  }

  /** As often as the timer looks at the connections: the budget is no fresher before. */
  #wait (retry: () => void): void {
    this.#retry = setTimeout(retry, this.#buffers.lookIntervalMs)
    this.#retry.unref()
  }

  /** After the pipe's write: what it left waiting goes to the process's account. */
  #wrote (): void {
    const after = this.#raw.writableLength
    if (this.#account === undefined && after === 0) return
    this.#account ??= this.#buffers.connection(this.#raw, this, this.#address)
    this.#account.wrote(after - this.#before)
  }
}

function ignore (): void {}
