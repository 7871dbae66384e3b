import type { FastifyBaseLogger } from 'fastify'
import type { EventStore, RetentionLimits } from './contract.js'
import { MemoryEventStore } from './memory/memory-store.js'
import { RedisEventStore, type RedisTarget } from './redis/redis-store.js'

type Address = Readonly<{ host: string, port: number }>

/** What the store needs of the gateway's configuration (config/load.ts). */
export interface StoreConfig {
  readonly redisUrl: string | undefined
  readonly redisClusterNodes: readonly Address[] | undefined
  readonly redisSentinel: { readonly sentinels: readonly Address[], readonly name: string } | undefined
  readonly redisPassword: string | undefined
  readonly redisTls: boolean
  readonly redisKeyPrefix: string
  readonly redisSocketTimeoutMs: number
  readonly retention: RetentionLimits
  readonly memoryStoreMaxBytes: number
}

/**
 * The store the configuration asks for: Redis Streams (standalone by
 * REDIS_URL, Cluster by REDIS_CLUSTER_NODES, Sentinel by REDIS_SENTINELS),
 * else the embedded one.
 */
export async function createStore (config: StoreConfig, log: FastifyBaseLogger): Promise<EventStore> {
  const target = redisTarget(config)
  if (target === undefined) {
    log.warn({ maxBytes: config.memoryStoreMaxBytes }, 'REDIS_URL is not set: using the embedded in-memory event store (single process, not durable: events are lost on restart and replicas cannot share sessions)')
    return new MemoryEventStore({ retention: config.retention, maxBytes: config.memoryStoreMaxBytes })
  }
  const store = await RedisEventStore.connect({ ...target, keyPrefix: config.redisKeyPrefix, socketTimeoutMs: config.redisSocketTimeoutMs, retention: config.retention, logger: log })
  log.info({ redis: describeTarget(target), replicaId: store.replicaId }, 'event store: Redis Streams')
  return store
}

/** Which Redis deployment the configuration names (the config allows at most one). */
export function redisTarget (config: StoreConfig): RedisTarget | undefined {
  if (config.redisUrl !== undefined) return { url: config.redisUrl }
  const auth = { password: config.redisPassword, tls: config.redisTls }
  if (config.redisClusterNodes !== undefined) return { cluster: config.redisClusterNodes, ...auth }
  if (config.redisSentinel !== undefined) return { sentinels: config.redisSentinel.sentinels, name: config.redisSentinel.name, ...auth }
  return undefined
}

/** The target for logs: never a password. */
export function describeTarget (target: RedisTarget): string {
  if ('url' in target) return redactUrl(target.url)
  const list = (nodes: ReadonlyArray<{ host: string, port: number }>): string => nodes.map(n => `${n.host}:${n.port}`).join(',')
  const tls = target.tls === true ? ' (tls)' : ''
  if ('cluster' in target) return `cluster ${list(target.cluster)}${tls}`
  return `sentinel ${target.name}@${list(target.sentinels)}${tls}`
}

/** A Redis URL without its password, for logs. */
export function redactUrl (url: string): string {
  try {
    const u = new URL(url)
    if (u.password !== '') u.password = '***'
    return u.toString()
  } catch {
    return '[unparseable]'
  }
}
