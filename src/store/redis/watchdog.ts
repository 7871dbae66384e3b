import type { Socket } from 'node:net'
import { performance } from 'node:perf_hooks'
import type { Redis, RedisOptions } from 'ioredis'
import { STALLED_WAITS, type StalledWait } from '../contract.js'
import type { StoreLogger } from './connection.js'

/**
 * What the watchdog waits for on one connection, and since when nothing was
 * read from it. A connection with nothing pending has no entry.
 */
type Pending =
  /** A PING sent while the connection was ready, not answered yet. */
  | { readonly kind: 'ping', readonly id: number, readonly quietSince: number, readonly bytesRead: number }
  /** The connection is open but not ready (ioredis's handshake: AUTH, SELECT, the ready check, a loading Redis's INFO). */
  | { readonly kind: 'handshake', readonly quietSince: number, readonly bytesRead: number }

/**
 * libuv runs timers on a clock floored to the millisecond: two turns half a
 * timeout apart may measure a hair under the timeout on the precise clock.
 */
const CLOCK_SLACK_MS = 1

/** How the log names what a connection taken for dead waited for. */
const REASONS: Readonly<Record<StalledWait, string>> = { ping: 'no answer to PING', handshake: 'no answer during the handshake' }

/** ioredis waits this long at most for a closed connection's peer to close its side too (its own default 2 s). */
const DISCONNECT_TIMEOUT_MS = 100

/**
 * ioredis's options for the connections the watchdog checks: they bound what
 * it does not see, and keep a healthy connection from looking dead to it.
 */
export function watchedOptions (timeoutMs: number): RedisOptions {
  return {
    // Opening a connection; with Sentinels, each question to a Sentinel.
    connectTimeout: timeoutMs,
    sentinelCommandTimeout: timeoutMs,
    // A connection the watchdog took for dead is not waited on: its peer's FIN will not come.
    disconnectTimeout: DISCONNECT_TIMEOUT_MS,
    // A Redis loading its data answers the ready check's INFO with loading:1, and ioredis asks
    // again only this much later (loading_eta_seconds when shorter): often enough that the
    // watchdog sees the handshake read something within each timeout.
    maxLoadingRetryTime: Math.max(100, Math.floor(timeoutMs / 4))
  }
}

export interface WatchdogOptions {
  /** The connections to check, read at every turn (a Cluster's nodes come and go). */
  readonly connections: () => Iterable<Redis>
  /** A connection waiting this long for its PING or handshake, with not a byte read meanwhile, is taken for dead. */
  readonly timeoutMs: number
  readonly logger?: StoreLogger | undefined
  /** A monotonic clock in ms (performance.now when absent). */
  readonly now?: () => number
}

/**
 * Finds the store's Redis connections that answer nothing (a frozen Redis, a
 * host gone without closing them, a network cut) and closes them, so that
 * ioredis opens new ones and sends what was waiting there again.
 *
 * Every half timeout it sends each ready connection a PING, unless one is
 * still waiting. A connection whose PING or handshake has waited the whole
 * timeout without a byte read from it meanwhile is closed: a PING waiting
 * behind a long queue of replies that keep arriving is not a dead connection,
 * and neither is one whose answer came while the process stood still (#confirm).
 * This costs one PING per connection per half timeout, whatever the traffic,
 * and checks idle connections too. (ioredis's own `socketTimeout` arms a
 * timer at every read of a busy connection, checks a connection only while
 * commands wait on it, and in ioredis 5 keeps a closed connection's timer,
 * which then closes the new one.) Closing goes through `disconnect(true)`,
 * whose wait for the peer's FIN is bounded by the connection's
 * `disconnectTimeout`.
 */
export class ConnectionWatchdog {
  readonly #o: WatchdogOptions
  readonly #now: () => number
  readonly #pending = new WeakMap<Redis, Pending>()
  /** Connections whose `connect` and `close` are followed (#follow). */
  readonly #followed = new WeakSet<Redis>()
  readonly #timer: NodeJS.Timeout
  readonly #replaced = noneReplaced()
  #pings = 0
  #closed = false

  constructor (options: WatchdogOptions) {
    this.#o = options
    this.#now = options.now ?? (() => performance.now())
    this.#timer = setInterval(() => { this.check() }, Math.max(1, Math.ceil(options.timeoutMs / 2))).unref()
  }

  /** One turn: what the timer does. */
  check (): void {
    const now = this.#now()
    for (const connection of this.#o.connections()) this.#checkOne(connection, now)
  }

  /** No more turns, and no verdict already waiting is given (the store is closing its connections itself). */
  close (): void {
    this.#closed = true
    clearInterval(this.#timer)
  }

  /** Connections closed since start, by what waited unanswered on them. */
  replaced (): Readonly<Record<StalledWait, number>> {
    return { ...this.#replaced }
  }

  #checkOne (connection: Redis, now: number): void {
    this.#follow(connection)
    const pending = this.#pending.get(connection)
    const status = connection.status
    if (status === 'ready' && pending?.kind !== 'ping') return this.#ping(connection, now)
    if (status === 'connect' && pending?.kind !== 'handshake') return this.#handshake(connection, now)
    // Any other status: connecting (bounded by ioredis's connectTimeout, and with Sentinels
    // by sentinelCommandTimeout), waiting to reconnect, closed; whatever was pending went
    // with the connection's close.
    if (pending === undefined || (status !== 'ready' && status !== 'connect')) return
    const read = bytesRead(connection)
    if (read !== pending.bytesRead) this.#pending.set(connection, { ...pending, quietSince: now, bytesRead: read })
    else if (now - pending.quietSince >= this.#o.timeoutMs - CLOCK_SLACK_MS) setImmediate(() => { this.#confirm(connection, pending) })
  }

  /**
   * The timeout ran out at a timer turn: the verdict waits for the loop's next
   * poll phase. The turn may come straight after the process itself stood
   * still (a long collection, a starved CPU, a long callback), with an answer
   * waiting in the socket, not read yet. The connection is closed only if that
   * read brought nothing and it still waits for the same thing.
   */
  #confirm (connection: Redis, pending: Pending): void {
    if (this.#closed || this.#pending.get(connection) !== pending) return
    const read = bytesRead(connection)
    if (read !== pending.bytesRead) this.#pending.set(connection, { ...pending, quietSince: this.#now(), bytesRead: read })
    else this.#replace(connection, pending.kind)
  }

  #ping (connection: Redis, now: number): void {
    const id = ++this.#pings
    this.#pending.set(connection, { kind: 'ping', id, quietSince: now, bytesRead: bytesRead(connection) })
    const settled = (): void => {
      const pending = this.#pending.get(connection)
      if (pending?.kind === 'ping' && pending.id === id) this.#pending.delete(connection)
    }
    // A failed PING is the connection's own failure, which ioredis reports on it.
    connection.ping().then(settled, settled)
  }

  #handshake (connection: Redis, now: number): void {
    this.#pending.set(connection, { kind: 'handshake', quietSince: now, bytesRead: bytesRead(connection) })
  }

  /** A handshake is timed from the connection's `connect`; a closed connection's PING is not the next one's. */
  #follow (connection: Redis): void {
    if (this.#followed.has(connection)) return
    this.#followed.add(connection)
    connection.on('connect', () => this.#handshake(connection, this.#now()))
    connection.on('close', () => this.#pending.delete(connection))
  }

  #replace (connection: Redis, waited: StalledWait): void {
    this.#pending.delete(connection)
    this.#replaced[waited]++
    const stream: Partial<Pick<Socket, 'remoteAddress' | 'remotePort'>> | undefined = connection.stream
    const peer = stream?.remoteAddress === undefined ? undefined : `${stream.remoteAddress}:${String(stream.remotePort)}`
    this.#o.logger?.warn({ connection: connection.options.connectionName, peer, reason: REASONS[waited], timeoutMs: this.#o.timeoutMs }, 'event store: Redis connection answers nothing, closing it to open a new one')
    connection.disconnect(true)
  }
}

/** A count of zero for each StalledWait. */
export function noneReplaced (): Record<StalledWait, number> {
  return Object.fromEntries(STALLED_WAITS.map(wait => [wait, 0])) as Record<StalledWait, number>
}

/** Bytes read from the connection's socket so far (none before it has one). */
function bytesRead (connection: Redis): number {
  // ioredis types its socket as a public property (it is what commands are written to).
  const stream: Partial<Pick<Socket, 'bytesRead'>> | undefined = connection.stream
  return stream?.bytesRead ?? 0
}
