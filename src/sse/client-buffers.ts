/**
 * What waits for clients, process-wide: every client connection makes
 * progress or is closed, and the bytes waiting in their send buffers share
 * one budget.
 *
 * A connection is watched only while bytes wait in it (an idle stream, its
 * buffer empty, costs nothing here and is never cut). One timer looks at the
 * watched ones: a connection whose client accepted no byte for the write
 * timeout is destroyed, whether the gateway still writes to it or not (a
 * replay that waits for room, a stream that ended, a stream with nothing
 * new). Destroying it drops what waited: the socket's queue goes, and with it
 * the last reference to the replay page it held.
 *
 * Progress is seen two ways: a write the socket finished (its callback), or
 * libuv's queue of the write in flight getting shorter (a large write that
 * the kernel takes a piece at a time). The second reads the socket handle's
 * `writeQueueSize`, which Node keeps on every stream handle (TCP, pipe, TLS)
 * but does not document; without it, progress is seen per write finished.
 */

/** The parts of a client connection (an http ServerResponse) this reads. */
export interface WaitingConnection {
  /** Bytes written and not yet handed to the kernel (the write in flight included). */
  readonly writableLength: number
  readonly destroyed: boolean
  /** Its socket: libuv's queue is read from the socket's handle (see above). */
  readonly socket: object | null
  destroy: () => void
  once: (event: 'close', listener: () => void) => unknown
}

export interface ClientBuffersOptions {
  /** Process-wide bound on bytes waiting in client connections (CLIENT_BUFFERS_MAX_BYTES). */
  readonly maxBytes: number
  /** A connection whose client accepts no byte for this long is destroyed (CLIENT_WRITE_TIMEOUT_SECONDS). */
  readonly writeTimeoutMs: number
  /** Milliseconds; Date.now by default (tests pass a fake clock and call tick()). */
  readonly now?: () => number
  /** false: no timer, tick() is called by hand (tests). */
  readonly timer?: boolean
}

/**
 * One gateway's client buffers (two gateways in one process, as in tests,
 * have their own).
 */
export class ClientBuffers {
  readonly maxBytes: number
  readonly writeTimeoutMs: number
  readonly #now: () => number
  readonly #watched = new Set<ClientBuffer>()
  readonly #timer: NodeJS.Timeout | undefined
  #waiting = 0

  constructor (options: ClientBuffersOptions) {
    this.maxBytes = options.maxBytes
    this.writeTimeoutMs = options.writeTimeoutMs
    this.#now = options.now ?? Date.now
    if (options.timer !== false) {
      // A quarter of the timeout, at most a second: a cut comes within 25% of
      // it, and the budget learns of drained buffers within a second.
      this.#timer = setInterval(() => { this.tick() }, Math.max(50, Math.min(1000, Math.floor(options.writeTimeoutMs / 4))))
      this.#timer.unref()
    }
  }

  /** Bytes waiting in client connections, as last seen (a write's end, a tick). */
  get waitingBytes (): number { return this.#waiting }
  /** Connections with bytes waiting. */
  get watched (): number { return this.#watched.size }

  /** The account of one client connection. `onStalled` runs when it is cut for want of progress. */
  connection (raw: WaitingConnection, onStalled: (waitingBytes: number) => void): ClientBuffer {
    return new ClientBuffer(this, raw, onStalled)
  }

  /** Look at every connection with bytes waiting: drained ones leave, stalled ones are cut. */
  tick (): void {
    const now = this.#now()
    for (const buffer of this.#watched) buffer.look(now, this.writeTimeoutMs)
  }

  stop (): void {
    clearInterval(this.#timer)
  }

  /** @internal ClientBuffer's bookkeeping. */
  charge (delta: number): void { this.#waiting += delta }
  /** @internal */
  watch (buffer: ClientBuffer): void { this.#watched.add(buffer) }
  /** @internal */
  unwatch (buffer: ClientBuffer): void { this.#watched.delete(buffer) }
  /** @internal */
  now (): number { return this.#now() }
}

/**
 * One connection's account: what it has waiting (charged to the budget) and,
 * while that is not nothing, when its client last accepted bytes.
 */
export class ClientBuffer {
  readonly #buffers: ClientBuffers
  readonly #raw: WaitingConnection
  readonly #onStalled: (waitingBytes: number) => void
  /** Bytes charged to the budget: writableLength when last seen. */
  #charged = 0
  #watched = false
  #closeHeard = false
  /** Writes finished so far, and when last looked at. */
  #finished = 0
  #finishedSeen = 0
  /** libuv's queue when last looked at. */
  #queuedSeen = 0
  #progressAt = 0
  /** Passed as every write's callback: one function per connection, not one per write. */
  readonly afterWrite = (): void => {
    this.#finished++
    this.#settle()
  }

  constructor (buffers: ClientBuffers, raw: WaitingConnection, onStalled: (waitingBytes: number) => void) {
    this.#buffers = buffers
    this.#raw = raw
    this.#onStalled = onStalled
  }

  /** The process's bytes waiting, and its budget (for a log line). */
  get waitingBytes (): number { return this.#buffers.waitingBytes }
  get maxBytes (): number { return this.#buffers.maxBytes }

  /**
   * May `bytes` more be written? Not when the process's bytes waiting would
   * pass the budget (unless nothing waits anywhere: one write larger than the
   * whole budget still goes, alone).
   */
  room (bytes: number): boolean {
    this.#settle()
    const waiting = this.#buffers.waitingBytes
    return waiting === 0 || waiting + bytes <= this.#buffers.maxBytes
  }

  /** After a write: charge what now waits, and watch the connection if anything does. */
  wrote (): void {
    this.#settle()
  }

  /** The timer's look: drained, progressing, or stalled past `timeoutMs`. */
  look (now: number, timeoutMs: number): void {
    this.#settle()
    if (!this.#watched) return
    const queued = this.#queued()
    if (this.#finished !== this.#finishedSeen || queued < this.#queuedSeen) this.#progressAt = now
    this.#finishedSeen = this.#finished
    this.#queuedSeen = queued
    if (now - this.#progressAt < timeoutMs) return
    const waiting = this.#charged
    this.#release()
    this.#raw.destroy()
    this.#onStalled(waiting)
  }

  /** Charge what waits now; start or stop watching. */
  #settle (): void {
    const raw = this.#raw
    const waiting = raw.destroyed ? 0 : raw.writableLength
    if (waiting === 0) {
      this.#release()
      return
    }
    this.#buffers.charge(waiting - this.#charged)
    this.#charged = waiting
    if (this.#watched) return
    this.#watched = true
    this.#progressAt = this.#buffers.now()
    this.#finishedSeen = this.#finished
    this.#queuedSeen = this.#queued()
    this.#buffers.watch(this)
    if (!this.#closeHeard) {
      this.#closeHeard = true
      raw.once('close', () => this.#release())
    }
  }

  #release (): void {
    if (this.#charged !== 0) this.#buffers.charge(-this.#charged)
    this.#charged = 0
    if (!this.#watched) return
    this.#watched = false
    this.#buffers.unwatch(this)
  }

  #queued (): number {
    const socket = this.#raw.socket as { readonly _handle?: { readonly writeQueueSize?: unknown } | null } | null
    const queued = socket?._handle?.writeQueueSize
    return typeof queued === 'number' ? queued : 0
  }
}
