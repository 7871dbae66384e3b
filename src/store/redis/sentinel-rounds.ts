import type { Redis } from 'ioredis'
import type { StoreLogger } from './connection.js'

/** The pause before asking the Sentinels again grows by this much after each round none answered... */
const PAUSE_STEP_MS = 200
/** ...up to this. */
const PAUSE_MAX_MS = 2000

/**
 * The errors ioredis reports on a connection for a round of Sentinels that
 * did not answer: SentinelRounds logs each failed round itself, and a round
 * that restarts from the top of the list is no trouble at all.
 */
export function isSentinelRoundError (err: Error): boolean {
  return err.message.startsWith('All sentinels are unreachable')
}

/**
 * The store's connections through Sentinels, when none of them answers.
 *
 * ioredis's own default asks the Sentinels again and again within one
 * connection attempt, for as long as none answers, and every command waits
 * meanwhile, however long that is. Here a connection attempt asks every
 * Sentinel once and fails when none answered (the `sentinelRetryStrategy` set
 * on each connection followed): ioredis fails what waited on the connection
 * then (the requests that need the store get their 503 at once, as do those
 * that come while none answers) and ends it for good. This opens it again
 * after a pause of 200 ms, growing to 2 s, until one answers or close() is
 * called.
 *
 * Asking each once: ioredis goes on through its list of Sentinels from where
 * the last attempt stopped, and asks the strategy whenever it reaches the end
 * of it. An attempt that started after a Sentinel had named a master (the
 * connection connected, or closed after) goes back to the top once; one that
 * started at the top (the first, or one after an attempt that failed) has
 * asked them all when it reaches the end.
 */
export class SentinelRounds {
  readonly #logger: StoreLogger | undefined
  readonly #followed: ReadonlyArray<{ readonly connection: Redis, readonly onEnd: () => void, readonly onReady: () => void, readonly onError: (err: Error) => void, readonly onNamed: () => void }>
  readonly #timers = new Set<NodeJS.Timeout>()
  #closed = false

  /** `connections`: those that do not go through Sentinels are left alone. */
  constructor (connections: readonly Redis[], logger?: StoreLogger) {
    this.#logger = logger
    this.#followed = connections.filter(isSentinelled).map((connection) => {
      let rounds = 0
      /** ioredis's word on the last round that failed, with the last Sentinel's error. */
      let reason: string | undefined
      /** Where the next attempt starts in ioredis's list of Sentinels. */
      let startsAtTop = true
      connection.options.sentinelRetryStrategy = (ends: number): number | null => {
        if (ends === 1 && !startsAtTop) return 0
        startsAtTop = true
        return null
      }
      const onNamed = (): void => { startsAtTop = false }
      const onReady = (): void => { rounds = 0 }
      const onError = (err: Error): void => { if (isSentinelRoundError(err)) reason = err.message }
      const onEnd = (): void => {
        if (this.#closed) return
        rounds++
        const pauseMs = Math.min(PAUSE_STEP_MS * rounds, PAUSE_MAX_MS)
        this.#logger?.warn({ connection: connection.options.connectionName, sentinels: sentinelsOf(connection), reason, rounds, retryInMs: pauseMs }, 'event store: no Redis Sentinel answered; commands fail until one does')
        const timer = setTimeout(() => {
          this.#timers.delete(timer)
          // A failed attempt ends the connection again, and comes back here.
          if (!this.#closed) connection.connect().catch(() => {})
        }, pauseMs)
        this.#timers.add(timer)
      }
      connection.on('end', onEnd)
      connection.on('ready', onReady)
      connection.on('error', onError)
      // A Sentinel named a master: whether or not it could be reached, the next attempt starts after that Sentinel.
      connection.on('connect', onNamed)
      connection.on('close', onNamed)
      return { connection, onEnd, onReady, onError, onNamed }
    })
  }

  /** Stop opening connections again (the store is closing them). */
  close (): void {
    this.#closed = true
    for (const timer of this.#timers) clearTimeout(timer)
    this.#timers.clear()
    for (const { connection, onEnd, onReady, onError, onNamed } of this.#followed) {
      connection.off('end', onEnd)
      connection.off('ready', onReady)
      connection.off('error', onError)
      connection.off('connect', onNamed)
      connection.off('close', onNamed)
    }
  }
}

function isSentinelled (connection: Redis): boolean {
  return sentinelsOf(connection).length > 0
}

/** The Sentinels a connection asks, as host:port. */
function sentinelsOf (connection: Redis): string[] {
  return (connection.options.sentinels ?? []).map(({ host, port }) => `${host ?? 'localhost'}:${String(port ?? 26379)}`)
}
