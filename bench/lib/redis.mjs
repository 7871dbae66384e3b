// What the benchmark asks Redis: command statistics, client list, cleanup.
import { readFileSync } from 'node:fs'
import { Redis } from 'ioredis'
import { redisUrlOptions } from '../../dist/src/store/redis/redis-url.js'

export async function connectRedis (url) {
  const options = { lazyConnect: true, maxRetriesPerRequest: 1, connectionName: 'mcpgw-bench-observer' }
  // The gateway's own reading of REDIS_URL (unix:// included), from the build the benchmark runs.
  const target = redisUrlOptions(url)
  const redis = typeof target === 'string' ? new Redis(target, options) : new Redis({ ...target, ...options })
  await redis.connect()
  return redis
}

/** cmdstat_<name> -> calls */
export async function commandStats (redis) {
  const text = await redis.info('commandstats')
  const out = {}
  for (const m of text.matchAll(/^cmdstat_([^:]+):calls=(\d+)/gm)) out[m[1]] = Number(m[2])
  return out
}

export function diffStats (before, after) {
  const out = {}
  for (const [name, calls] of Object.entries(after)) {
    const d = calls - (before[name] ?? 0)
    if (d > 0) out[name] = d
  }
  return out
}

export async function clientList (redis) {
  const text = await redis.client('LIST')
  return text.split('\n').filter(Boolean).map(line => Object.fromEntries(line.split(' ').map(kv => {
    const i = kv.indexOf('=')
    return [kv.slice(0, i), kv.slice(i + 1)]
  })))
}

/** Delete every key under `prefix` (SCAN + UNLINK). Returns the number removed. */
export async function deletePrefix (redis, prefix) {
  let cursor = '0'
  let removed = 0
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
    cursor = next
    if (keys.length > 0) removed += await redis.unlink(...keys)
  } while (cursor !== '0')
  return removed
}

export async function redisVersion (redis) {
  const text = await redis.info('server')
  return /redis_version:(\S+)/.exec(text)?.[1] ?? 'unknown'
}

/**
 * The Redis server's process id when it runs on this machine (its pid from
 * INFO names a redis-server process here), else undefined: its page faults
 * can only be read from /proc then.
 */
export async function localRedisPid (redis) {
  const pid = Number(/process_id:(\d+)/.exec(await redis.info('server'))?.[1])
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').startsWith('redis') ? pid : undefined
  } catch {
    return undefined
  }
}

/** CPU seconds Redis has used (user + sys, all threads). */
export async function redisCpuSeconds (redis) {
  const text = await redis.info('cpu')
  const user = Number(/used_cpu_user:([\d.]+)/.exec(text)?.[1])
  const sys = Number(/used_cpu_sys:([\d.]+)/.exec(text)?.[1])
  return user + sys
}
