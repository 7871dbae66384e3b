import { Redis } from 'ioredis'
import type { RedisOptions } from 'ioredis'
import type { RedisAddress, StoreLogger } from './connection.js'

/**
 * How often a forming cluster is asked again: the gateway listens at most this
 * long after the cluster is ready (redis-cli --cluster create takes 1-3 s to
 * agree on a 3-node cluster).
 */
export const CLUSTER_POLL_MS = 250
/** How long a cluster that answers but is not ready yet is waited for before start-up fails. */
export const CLUSTER_READY_TIMEOUT_MS = 60_000

/** Why one node is not ready to serve yet, or undefined when it is. */
export function clusterNotReady (info: string): string | undefined {
  const field = (name: string): string | undefined => new RegExp(`^${name}:(\\S+)`, 'm').exec(info)?.[1]
  const state = field('cluster_state')
  const assigned = Number(field('cluster_slots_assigned') ?? 0)
  if (state === 'ok' && assigned === 16384) return undefined
  return `cluster_state:${state ?? 'unknown'}, ${assigned} of 16384 slots assigned`
}

async function askNode (node: RedisAddress, options: RedisOptions): Promise<{ reachable: boolean, problem: string | undefined }> {
  const client = new Redis({ ...options, host: node.host, port: node.port, lazyConnect: true, connectTimeout: 2000, maxRetriesPerRequest: 0, retryStrategy: () => null, enableOfflineQueue: false })
  client.on('error', () => {})
  try {
    await client.connect()
    const info = await client.cluster('INFO') as string
    return { reachable: true, problem: clusterNotReady(info) }
  } catch (err) {
    return { reachable: false, problem: (err as Error).message }
  } finally {
    client.disconnect()
  }
}

/**
 * Waits until every seed node that answers says the cluster is ok with all
 * slots assigned, logging each wait at warn with its reason. ioredis on its own
 * retries a forming cluster silently (empty slot table, failed ready check),
 * and a command sent while its slot table is empty is lost (its
 * auto-pipelining throws outside the command's promise): start-up hung or the
 * process died. Fails at once when no seed answers (as before: Redis is not
 * there), and after CLUSTER_READY_TIMEOUT_MS when it answers but never gets ready.
 */
export async function waitForClusterReady (seeds: readonly RedisAddress[], options: RedisOptions, logger: StoreLogger | undefined, timing = { pollMs: CLUSTER_POLL_MS, timeoutMs: CLUSTER_READY_TIMEOUT_MS }): Promise<void> {
  const deadline = Date.now() + timing.timeoutMs
  for (let attempt = 1; ; attempt++) {
    const answers = await Promise.all(seeds.map(async node => ({ node: `${node.host}:${node.port}`, ...await askNode(node, options) })))
    const reachable = answers.filter(a => a.reachable)
    if (reachable.length === 0) throw new Error(`no Redis Cluster seed node answers: ${answers.map(a => `${a.node}: ${a.problem ?? ''}`).join('; ')}`)
    const waiting = answers.filter(a => a.problem !== undefined)
    if (reachable.every(a => a.problem === undefined)) return
    const reason = waiting.map(a => `${a.node}: ${a.problem ?? ''}`).join('; ')
    if (Date.now() >= deadline) throw new Error(`Redis Cluster not ready after ${timing.timeoutMs / 1000} s: ${reason}`)
    logger?.warn({ attempt, reason, retryInMs: timing.pollMs }, 'Redis Cluster not ready yet: waiting before connecting')
    await new Promise(resolve => setTimeout(resolve, timing.pollMs))
  }
}
