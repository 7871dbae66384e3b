// One lost session recorded again by two requests at once, each on its own
// replica (src/routes/mcp/session-guard.ts, settleRecovery): after Redis
// restarted empty, the client's GET and POST land on two replicas and both
// record the session again, in one epoch. The upstream confirming one keeps
// it; a refusal on the other replica drops it only when no recovery of that
// epoch, on any replica, was confirmed or still waits for its answer. Real
// guards and caches, two RedisEventStores on one Redis.
import t, { type Test } from 'tap'
import type { FastifyRequest } from 'fastify'
import { SessionGuard } from '../../src/routes/mcp/session-guard.js'
import { SessionCache } from '../../src/routes/mcp/session-cache.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { useRedis } from '../fixtures/redis.js'
import { config, log, metrics, retention, settlementCases, type TwoRecoveries } from '../fixtures/recovery-settlement.js'

/** Two replicas over one Redis that lost everything, each with a request that recorded session `id` again. */
async function twoReplicas (t: Test): Promise<TwoRecoveries> {
  const env = await useRedis(t, 'recovery-replicas')
  const replica = async (): Promise<{ guard: SessionGuard, store: RedisEventStore, request: FastifyRequest }> => {
    const store = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention })
    t.teardown(() => store.close())
    const sessions = new SessionCache({ freshMs: 2000, staleMs: retention.ttlMs, maxEntries: 100 })
    return { guard: new SessionGuard({ config, store, metrics, sessions }), store, request: { log } as unknown as FastifyRequest }
  }
  const [a, b] = await Promise.all([replica(), replica()])
  // The store lost its data a moment ago: the intact mark is set now.
  await a.store.intactSince()
  const id = a.guard.ids.issue('p', 'up1')
  const [ra, rb] = await Promise.all([a.guard.requireSession(id, 'p', a.request), b.guard.requireSession(id, 'p', b.request)])
  if (ra.epoch !== rb.epoch || !a.guard.recovers(a.request) || !b.guard.recovers(b.request)) throw new Error('expected two recoveries of one epoch')
  return { a, b, store: b.store, id }
}

settlementCases(t, 'two replicas', twoReplicas)
