import { Cluster, Redis } from 'ioredis'
import type { ClusterOptions, RedisOptions } from 'ioredis'
import { redisUrlOptions } from './redis-url.js'
import type { StoreLogger } from './notice-bus.js'

export type Connection = Redis | Cluster

export interface RedisAddress { readonly host: string, readonly port: number }

/** Where Redis is: one of a URL, Cluster seed nodes or Sentinels. */
export type RedisTarget =
  | { readonly url: string }
  | { readonly cluster: readonly RedisAddress[], readonly password?: string | undefined, readonly tls?: boolean }
  | { readonly sentinels: readonly RedisAddress[], readonly name: string, readonly password?: string | undefined, readonly tls?: boolean }

/**
 * One ioredis connection to the target, named for CLIENT LIST. `batched`: the
 * commands issued in one turn of the event loop leave in one write (ioredis's
 * auto-pipelining; the command connection: with many busy streams, one
 * system call per append cost the gateway CPU, see bench/NOTES.md).
 */
export function openConnection (target: RedisTarget, connectionName: string, redisOptions?: RedisOptions, batched = false, logger?: StoreLogger): Connection {
  const base: RedisOptions = { maxRetriesPerRequest: 3, ...(batched && { enableAutoPipelining: true }), ...redisOptions, connectionName }
  if ('url' in target) {
    const url = redisUrlOptions(target.url)
    return typeof url === 'string' ? new Redis(url, base) : new Redis({ ...url, ...base })
  }
  const tls = target.tls === true ? {} : undefined
  const password = target.password
  if ('cluster' in target) {
    const clusterOptions: ClusterOptions = {
      redisOptions: { ...base, ...(password !== undefined && { password }), ...(tls !== undefined && { tls }) },
      // Commands issued together go out as one pipeline per node (lease ticks rely on it).
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

export async function quit (connection: Connection): Promise<void> {
  try {
    await connection.quit()
  } catch {
    // Already closed or never connected: nothing left to release.
    connection.disconnect()
  }
}
