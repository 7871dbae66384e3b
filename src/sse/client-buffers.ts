/**
 * What waits for clients, process-wide: every client connection makes
 * progress or is closed, and the bytes waiting in their send buffers share
 * one budget, of which one client address has at most a share.
 *
 * A connection is watched only while bytes wait in it (an idle stream, its
 * buffer empty, costs nothing here and is never cut). One timer looks at the
 * watched ones: a connection whose client accepted no byte for the write
 * timeout is destroyed, whether the gateway still writes to it or not (a
 * replay that waits for room, a stream that ended, a stream with nothing
 * new). Destroying it drops what waited: the socket's queue goes, and with it
 * the last reference to the replay page it held.
 *
 * Progress is seen two ways, with nothing added to each write (no callback):
 * a write the socket finished (writableLength below what was last seen plus
 * what was written since), or libuv's queue of the write in flight getting
 * shorter (a large write that the kernel takes a piece at a time). The second
 * reads the socket handle's `writeQueueSize`, which Node keeps on every
 * stream handle (TCP, pipe, TLS) but does not document; without it, progress
 * is seen per write finished. A look that finds none for the timeout cuts only
 * if the loop's next poll phase brings none either: the process itself may have
 * stood still (a long collection, a starved CPU) while its client read.
 */
import { PageBuffers } from './page-buffers.js'

/** A client's TCP (or TLS) socket, as this sees it. */
export interface ClientSocket {
  readonly destroyed: boolean
  destroy: () => void
}

/** The parts of a client connection (an http ServerResponse) this reads. */
export interface WaitingConnection {
  /** Bytes written and not yet handed to the kernel (the write in flight included). */
  readonly writableLength: number
  readonly destroyed: boolean
  /**
   * Its socket: libuv's queue is read from the socket's handle (see above).
   * null while the answer waits behind an earlier one of its connection (Node
   * hands the socket to pipelined answers in turn).
   */
  readonly socket: ClientSocket | null
  /** Its request, whose socket is the connection's from the start. */
  readonly req?: { readonly socket: ClientSocket | null }
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
 * The part of the budget the connections of one client address may have
 * waiting: a quarter. One address whose clients barely read (each taking a
 * byte before the write timeout, never cut) could otherwise fill the whole
 * budget, and every other client's stream would be closed for it, and its
 * relayed answers held, for as long as they keep it so. Its own writes past
 * its share are refused instead: its streams close with a retry hint, its
 * relayed answers wait.
 */
const ADDRESS_SHARE = 4

/**
 * One gateway's client buffers (two gateways in one process, as in tests,
 * have their own).
 */
export class ClientBuffers {
  readonly maxBytes: number
  /** Bytes the connections of one client address may have waiting (see ADDRESS_SHARE). */
  readonly maxBytesPerAddress: number
  readonly writeTimeoutMs: number
  /**
   * How often the timer looks: a quarter of the timeout, at most a second. A
   * cut comes within 25% of the timeout, and the budget learns of drained
   * buffers within a second.
   */
  readonly lookIntervalMs: number
  /** The buffers the connections' pages are framed into (see page-buffers.ts for who gives them back, and when). */
  readonly pages = new PageBuffers()
  readonly #now: () => number
  readonly #watched = new Set<ClientBuffer>()
  /** Bytes waiting by client address: only addresses with some (an entry goes at 0). */
  readonly #byAddress = new Map<string, number>()
  readonly #timer: NodeJS.Timeout | undefined
  #waiting = 0
  #stopped = false

  constructor (options: ClientBuffersOptions) {
    this.maxBytes = options.maxBytes
    this.maxBytesPerAddress = Math.floor(options.maxBytes / ADDRESS_SHARE)
    this.writeTimeoutMs = options.writeTimeoutMs
    this.#now = options.now ?? Date.now
    this.lookIntervalMs = Math.max(50, Math.min(1000, Math.floor(options.writeTimeoutMs / 4)))
    if (options.timer !== false) {
      this.#timer = setInterval(() => { this.tick() }, this.lookIntervalMs)
      this.#timer.unref()
    }
  }

  /** Bytes waiting in client connections, as last seen (a write's end, a tick). */
  get waitingBytes (): number { return this.#waiting }
  /** Connections with bytes waiting. */
  get watched (): number { return this.#watched.size }

  /** Bytes waiting in the connections of one client address (clientKey), as last seen. */
  waitingFor (address: string): number { return this.#byAddress.get(address) ?? 0 }

  /**
   * The account of one client connection, of the client at `address` (its
   * clientKey); `listener` hears when it is cut for want of progress.
   */
  connection (raw: WaitingConnection, listener: StalledListener, address: string): ClientBuffer {
    return new ClientBuffer(this, raw, listener, address)
  }

  /**
   * May `bytes` more be written to a connection of the client at `address`
   * (`account`: the connection's, if it has one)? Not when the process's
   * bytes waiting would pass the budget, nor when that address's would pass
   * its share (unless nothing waits anywhere, or for that address: one write
   * larger than the whole budget, or share, still goes, alone).
   */
  room (bytes: number, address: string, account: ClientBuffer | undefined): boolean {
    account?.settle()
    if (this.#fits(bytes, address)) return true
    // Others' charges are as of their last write or tick: bring them up to date
    // before refusing (a replay page drains in milliseconds to a client that reads).
    for (const buffer of this.#watched) buffer.settle()
    return this.#fits(bytes, address)
  }

  #fits (bytes: number, address: string): boolean {
    if (this.#waiting === 0) return true
    if (this.#waiting + bytes > this.maxBytes) return false
    const mine = this.#byAddress.get(address) ?? 0
    return mine === 0 || mine + bytes <= this.maxBytesPerAddress
  }

  /** Look at every connection with bytes waiting: drained ones leave, stalled ones are cut. */
  tick (): void {
    const now = this.#now()
    for (const buffer of this.#watched) buffer.look(now, this.writeTimeoutMs)
  }

  /** After stop(), no connection is cut (a verdict already waiting included). */
  get stopped (): boolean { return this.#stopped }

  stop (): void {
    this.#stopped = true
    clearInterval(this.#timer)
  }

  /** @internal ClientBuffer's bookkeeping. */
  charge (delta: number, address: string): void {
    this.#waiting += delta
    const mine = (this.#byAddress.get(address) ?? 0) + delta
    if (mine === 0) this.#byAddress.delete(address)
    else this.#byAddress.set(address, mine)
  }

  /** @internal */
  watch (buffer: ClientBuffer): void { this.#watched.add(buffer) }
  /** @internal */
  unwatch (buffer: ClientBuffer): void { this.#watched.delete(buffer) }
  /** @internal */
  now (): number { return this.#now() }
}

/** Told when its connection was cut for want of progress (the socket is destroyed already). */
export interface StalledListener {
  writeTimedOut: (waitingBytes: number) => void
}

/**
 * One connection's account, made at its first write that left bytes waiting
 * (an idle stream whose writes all went straight to the kernel has none):
 * what it has waiting (charged to the budget) and, while that is not
 * nothing, when its client last accepted bytes.
 */
export class ClientBuffer {
  readonly #buffers: ClientBuffers
  readonly #raw: WaitingConnection
  readonly #listener: StalledListener
  /** The client's address (clientKey): whose share the bytes are charged to. */
  readonly #address: string
  /** Bytes charged to the budget: writableLength when last seen. */
  #charged = 0
  #watched = false
  #closeHeard = false
  /** writableLength at the last look, and what writes added since (measured around each write). */
  #seenLength = 0
  #added = 0
  /** libuv's queue at the last look. */
  #queuedSeen = 0
  #progressAt = 0
  /**
   * Set by a look that found no progress for the timeout: the verdict it waits
   * to give after the next poll phase (#confirm). A release drops it: a
   * connection drained and watched again meanwhile has a clock of its own.
   */
  #verdict: object | undefined

  constructor (buffers: ClientBuffers, raw: WaitingConnection, listener: StalledListener, address: string) {
    this.#buffers = buffers
    this.#raw = raw
    this.#listener = listener
    this.#address = address
  }

  /**
   * After a write that changed writableLength by `added` (its bytes, less
   * what the kernel took at once): charge what now waits, and watch the
   * connection if anything does.
   */
  wrote (added: number): void {
    if (this.#watched) this.#added += added
    this.#settle()
  }

  /** Charge what waits now (before the budget is asked). */
  settle (): void {
    this.#settle()
  }

  /**
   * The timer's look: drained, progressing, or stalled past `timeoutMs`.
   * Progress: writableLength below what the last look saw plus what was
   * written since (a write finished), or the write in flight shorter.
   */
  look (now: number, timeoutMs: number): void {
    this.#settle()
    if (!this.#watched) return
    if (this.#progressed()) this.#progressAt = now
    if (now - this.#progressAt < timeoutMs || this.#verdict !== undefined) return
    // The verdict waits for the loop's next poll phase: a look may come straight after the
    // process itself stood still (a long collection, a starved CPU, a long callback), before
    // the loop has handed the kernel what its client made room for meanwhile.
    const verdict = {}
    this.#verdict = verdict
    setImmediate(() => { this.#confirm(verdict) })
  }

  /** After a look that found no progress for the timeout: cut, unless the poll phase since brought some. */
  #confirm (verdict: object): void {
    if (this.#verdict !== verdict) return
    this.#verdict = undefined
    this.#settle()
    if (!this.#watched || this.#buffers.stopped) return
    if (this.#progressed()) {
      this.#progressAt = this.#buffers.now()
      return
    }
    const waiting = this.#charged
    this.#release()
    this.#raw.destroy()
    // An answer without its socket yet destroys nothing by itself (Node
    // destroys the socket when handing it over): the connection is cut now,
    // and the answers queued on it leave uncounted (see #settle).
    this.#connectionSocket()?.destroy()
    this.#listener.writeTimedOut(waiting)
  }

  /** Progress since the last look (see look), which this look becomes. */
  #progressed (): boolean {
    const waiting = this.#charged
    const queued = this.#queued()
    const progressed = waiting < this.#seenLength + this.#added || queued < this.#queuedSeen
    this.#seenLength = waiting
    this.#added = 0
    this.#queuedSeen = queued
    return progressed
  }

  /** Charge what waits now; start or stop watching. */
  #settle (): void {
    const raw = this.#raw
    const waiting = raw.destroyed || this.#connectionSocket()?.destroyed === true ? 0 : raw.writableLength
    if (waiting === 0) {
      this.#release()
      return
    }
    this.#buffers.charge(waiting - this.#charged, this.#address)
    this.#charged = waiting
    if (this.#watched) return
    this.#watched = true
    this.#progressAt = this.#buffers.now()
    this.#seenLength = waiting
    this.#added = 0
    this.#queuedSeen = this.#queued()
    this.#buffers.watch(this)
    if (!this.#closeHeard) {
      this.#closeHeard = true
      raw.once('close', () => this.#release())
    }
  }

  #release (): void {
    this.#verdict = undefined
    if (this.#charged !== 0) this.#buffers.charge(-this.#charged, this.#address)
    this.#charged = 0
    if (!this.#watched) return
    this.#watched = false
    this.#buffers.unwatch(this)
  }

  /** The connection's socket: the answer's own, or while it waits its turn, its request's. */
  #connectionSocket (): ClientSocket | null | undefined {
    return this.#raw.socket ?? this.#raw.req?.socket
  }

  #queued (): number {
    const socket = this.#raw.socket as { readonly _handle?: { readonly writeQueueSize?: unknown } | null } | null
    const queued = socket?._handle?.writeQueueSize
    return typeof queued === 'number' ? queued : 0
  }
}
