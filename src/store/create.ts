import type { FastifyBaseLogger } from 'fastify'
import type { GatewayConfig } from '../config/load.js'
import type { EventStore } from './contract.js'
import { MemoryEventStore } from './memory/memory-store.js'
import { RedisEventStore } from './redis/redis-store.js'

/** The store the configuration asks for: Redis Streams with REDIS_URL, else the embedded one. */
export async function createStore (config: GatewayConfig, log: FastifyBaseLogger): Promise<EventStore> {
  if (config.redisUrl === undefined) {
    log.warn({ maxBytes: config.memoryStoreMaxBytes }, 'REDIS_URL is not set: using the embedded in-memory event store (single process, not durable: events are lost on restart and replicas cannot share sessions)')
    return new MemoryEventStore({ retention: config.retention, maxBytes: config.memoryStoreMaxBytes })
  }
  const store = await RedisEventStore.connect({ url: config.redisUrl, keyPrefix: config.redisKeyPrefix, retention: config.retention, logger: log })
  log.info({ redis: redactUrl(config.redisUrl) }, 'event store: Redis Streams')
  return store
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
