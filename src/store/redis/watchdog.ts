import type { Redis } from 'ioredis'
import type { StoreLogger } from './connection.js'

/**
 * What the watchdog waits for on one connection. A connection with nothing
 * pending has no entry.
 */
type Pending =
  /** A PING sent while the connection was ready, not answered yet. */
  | { readonly kind: 'ping', readonly since: number }
  /** The connection was open but not ready (ioredis's handshake: AUTH, SELECT, the ready check) at this moment. */
  | { readonly kind: 'handshake', readonly since: number }

export interface WatchdogOptions {
  /** The connections to check, read at every turn (a Cluster's nodes come and go). */
  readonly connections: () => Iterable<Redis>
  /** A PING or a handshake unanswered this long: the connection is taken for dead. */
  readonly timeoutMs: number
  readonly logger?: StoreLogger | undefined
  readonly now?: () => number
}

/**
 * Finds the store's Redis connections that answer nothing (a frozen Redis, a
 * host gone without closing them, a network cut) and closes them, so that
 * ioredis opens new ones and sends what was waiting there again.
 *
 * Every half timeout it sends each ready connection a PING, unless one is
 * still waiting; a PING or a handshake unanswered for the whole timeout closes
 * the connection. This costs one PING per connection per half timeout,
 * whatever the traffic, and checks idle connections too. ioredis's own
 * `socketTimeout` arms a timer at every read of a busy connection, checks a
 * connection only while commands wait on it, and in ioredis 5 keeps a closed
 * connection's timer, which then closes the new one. Closing goes through
 * `disconnect(true)`, whose wait for the peer's FIN is bounded by the
 * connection's `disconnectTimeout`.
 */
export class ConnectionWatchdog {
  readonly #o: WatchdogOptions
  readonly #now: () => number
  readonly #pending = new WeakMap<Redis, Pending>()
  /** Connections whose `close` is followed: a closed connection's PING is no longer the new one's. */
  readonly #followed = new WeakSet<Redis>()
  readonly #timer: NodeJS.Timeout

  constructor (options: WatchdogOptions) {
    this.#o = options
    this.#now = options.now ?? Date.now
    this.#timer = setInterval(() => { this.check() }, Math.max(1, Math.floor(options.timeoutMs / 2))).unref()
  }

  /** One turn: what the timer does. */
  check (): void {
    const now = this.#now()
    for (const connection of this.#o.connections()) this.#checkOne(connection, now)
  }

  close (): void {
    clearInterval(this.#timer)
  }

  #checkOne (connection: Redis, now: number): void {
    this.#follow(connection)
    const pending = this.#pending.get(connection)
    if (connection.status === 'ready') {
      if (pending?.kind !== 'ping') this.#ping(connection, now)
      else if (now - pending.since >= this.#o.timeoutMs) this.#replace(connection, 'no answer to PING')
    } else if (connection.status === 'connect') {
      if (pending?.kind !== 'handshake') this.#pending.set(connection, { kind: 'handshake', since: now })
      else if (now - pending.since >= this.#o.timeoutMs) this.#replace(connection, 'no answer during the handshake')
    }
    // Any other status: connecting (bounded by ioredis's connectTimeout), waiting to
    // reconnect, closed; whatever was pending went with the connection's close (#follow).
  }

  #ping (connection: Redis, now: number): void {
    const pending: Pending = { kind: 'ping', since: now }
    this.#pending.set(connection, pending)
    const settled = (): void => {
      if (this.#pending.get(connection) === pending) this.#pending.delete(connection)
    }
    // A failed PING is the connection's own failure, which ioredis reports on it.
    connection.ping().then(settled, settled)
  }

  #follow (connection: Redis): void {
    if (this.#followed.has(connection)) return
    this.#followed.add(connection)
    connection.on('close', () => this.#pending.delete(connection))
  }

  #replace (connection: Redis, reason: string): void {
    this.#pending.delete(connection)
    this.#o.logger?.warn({ connection: connection.options.connectionName, reason, timeoutMs: this.#o.timeoutMs }, 'event store: Redis connection answers nothing, closing it to open a new one')
    connection.disconnect(true)
  }
}
