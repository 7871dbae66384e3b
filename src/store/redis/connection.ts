import { Cluster, Redis } from 'ioredis'
import type { ClusterOptions, RedisOptions } from 'ioredis'
import type { BaseLogger } from 'pino'
import { redisUrlOptions } from './redis-url.js'
import { VARIABLE_KEY_COMMANDS, type ScriptedConnection, type StoreCommands } from './lua.js'

export type Connection = Redis | Cluster

export type StoreLogger = Pick<BaseLogger, 'warn'> & Partial<Pick<BaseLogger, 'error'>>

export interface RedisAddress { readonly host: string, readonly port: number }

/** Where Redis is: one of a URL, Cluster seed nodes or Sentinels. */
export type RedisTarget =
  | { readonly url: string }
  | { readonly cluster: readonly RedisAddress[], readonly password?: string | undefined, readonly tls?: boolean }
  | { readonly sentinels: readonly RedisAddress[], readonly name: string, readonly password?: string | undefined, readonly tls?: boolean }

export type Topology =
  | { readonly kind: 'one-node', readonly redis: Redis & StoreCommands }
  | { readonly kind: 'cluster', readonly redis: Cluster & StoreCommands }

/**
 * The store's two connections and what their topology allows: the one place
 * that tells one Redis (standalone, Sentinel) from a Cluster, and the one
 * place that sets ioredis options on connections already built (but the
 * Sentinel retry strategy, which SentinelRounds sets, with what follows it).
 */
export interface StoreConnections {
  /** Commands, the scripts defined on it (lua.ts). */
  readonly redis: ScriptedConnection
  /** Used only for SUBSCRIBE. */
  readonly subscriber: Connection
  /**
   * Where the keys live, with the command connection typed for it: behind one
   * connection (standalone, Sentinel), where a MULTI runs and one script call
   * may carry several sessions' keys; or spread over a Cluster's nodes, where a
   * call carries one session's keys (one slot), and a MULTI names no key, so
   * ioredis may send it to any node.
   */
  readonly topology: Topology
  /**
   * The connections the watchdog checks (watchdog.ts): on one Redis, both;
   * on a Cluster, the command connection's node connections of the moment.
   * A Cluster's subscriber connection is ioredis's own, not reachable: ioredis
   * moves it when the slot table drops its node.
   */
  readonly watched: () => Iterable<Redis>
}

/**
 * The store's view of `redis` and `subscriber`, which its caller may have
 * built (tests do), so the options the store relies on are set here:
 * - the subscriber does not resubscribe by itself: the notice bus does, and
 *   catches up; ioredis's SUBSCRIBE has no error handler, so the connection
 *   closing before its reply made an unhandled rejection;
 * - auto-pipelining (on for Cluster) routes a script command by its first
 *   argument, which for a variable number of keys is that number: those go on
 *   their own, routed by their keys.
 */
export function storeConnections (redis: ScriptedConnection, subscriber: Connection): StoreConnections {
  const ignored = redis.options.autoPipeliningIgnoredCommands ?? []
  redis.options.autoPipeliningIgnoredCommands = [...ignored, ...VARIABLE_KEY_COMMANDS.filter(name => !ignored.includes(name))]
  if (!isCluster(subscriber)) subscriber.options.autoResubscribe = false
  const topology: Topology = isCluster(redis) ? { kind: 'cluster', redis } : { kind: 'one-node', redis }
  const watched = topology.kind === 'cluster'
    ? () => topology.redis.nodes('all')
    : () => isCluster(subscriber) ? [topology.redis] : [topology.redis, subscriber]
  return Object.freeze({ redis, subscriber, topology, watched })
}

/**
 * ioredis's own word on what a connection is (its public `isCluster`), rather
 * than `instanceof`, which a connection built by another copy of ioredis
 * (a caller's) would fail.
 */
function isCluster<C extends Connection> (connection: C): connection is Extract<C, Cluster> {
  return connection.isCluster
}

/** One ioredis connection to the target, named for CLIENT LIST. */
export function openConnection (target: RedisTarget, connectionName: string, redisOptions?: RedisOptions, logger?: StoreLogger): Connection {
  const base: RedisOptions = { maxRetriesPerRequest: 3, ...redisOptions, connectionName }
  if ('url' in target) {
    const url = redisUrlOptions(target.url)
    return typeof url === 'string' ? new Redis(url, base) : new Redis({ ...url, ...base })
  }
  const tls = target.tls === true ? {} : undefined
  const password = target.password
  if ('cluster' in target) {
    const clusterOptions: ClusterOptions = {
      redisOptions: { ...base, ...(password !== undefined && { password }), ...(tls !== undefined && { tls }) },
      // Commands issued in one turn go out together, one write per node (the lease tick
      // and the audience refresh make their own pipelines: see node-pipelines.ts).
      enableAutoPipelining: true,
      // ioredis's own delay; logged, since ioredis retries silently. Without a reason
      // from ioredis, it reconnects because the slot table came back empty or
      // CLUSTER INFO said cluster_state:fail.
      clusterRetryStrategy: (attempt: number, reason?: Error) => {
        const retryInMs = Math.min(100 + attempt * 2, 2000)
        logger?.warn({ connection: connectionName, attempt, reason: reason?.message ?? 'empty slot table or cluster_state:fail', retryInMs }, 'Redis Cluster: reconnecting')
        return retryInMs
      }
    }
    return new Cluster(target.cluster.map(({ host, port }) => ({ host, port })), clusterOptions)
  }
  return new Redis({
    ...base,
    sentinels: target.sentinels.map(({ host, port }) => ({ host, port })),
    name: target.name,
    ...(password !== undefined && { password }),
    ...(tls !== undefined && { tls, enableTLSForSentinelMode: true })
  })
}

/**
 * Close `connection` with QUIT; closed without it when QUIT is not answered
 * within `timeoutMs`. The wait ends then whatever QUIT does: ioredis settles
 * it only once it can send it, and a disconnect() while the connection waits
 * to reconnect (commands queued meanwhile) cancels the retry that would.
 */
export async function quit (connection: Connection, timeoutMs?: number): Promise<void> {
  // Already closed or never connected: nothing left to release.
  const quitting = connection.quit().then(() => {}, () => { connection.disconnect() })
  if (timeoutMs === undefined) return await quitting
  let timer: NodeJS.Timeout | undefined
  const late = new Promise<void>((resolve) => {
    timer = setTimeout(() => {
      connection.disconnect()
      resolve()
    }, timeoutMs)
  })
  try {
    await Promise.race([quitting, late])
  } finally {
    clearTimeout(timer)
  }
}
