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
import type { GatewayConfig } from '../../src/config/load.js'
import type { GatewayMetrics } from '../../src/metrics/metrics.js'
import { useRedis } from '../fixtures/redis.js'

const log = { info () {}, warn () {}, debug () {}, error () {}, child () { return log } }
const metrics = { timeStore: async (_n: string, fn: () => Promise<unknown>) => await fn(), sessionsRecovered: { inc () {} } } as unknown as GatewayMetrics
const retention = { maxEvents: 1000, maxBytes: 1 << 20, ttlMs: 3_600_000 }
const config = { recoverLostSessions: true, sessionBindingKey: 'k'.repeat(32), retention, principalHeader: 'x-p' } as unknown as GatewayConfig

interface Replica { guard: SessionGuard, store: RedisEventStore, request: FastifyRequest }

/** Two replicas over one Redis that lost everything, each with a request that recorded session `id` again. */
async function twoReplicas (t: Test): Promise<{ a: Replica, b: Replica, id: string }> {
  const env = await useRedis(t, 'recovery-replicas')
  const replica = async (): Promise<Replica> => {
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
  return { a, b, id }
}

t.test('confirmed on one replica, then refused on the other: the session stays', async t => {
  const { a, b, id } = await twoReplicas(t)
  await a.guard.settleRecovery(a.request, true)
  await b.guard.settleRecovery(b.request, false)
  t.not(await a.store.getSession(id), null, 'the session the upstream confirmed is still recorded')
  t.equal(await a.store.sessionDeleted(id), false, 'and not marked deleted')
})

t.test('refused on one replica while the other waits, then confirmed there: the session stays', async t => {
  const { a, b, id } = await twoReplicas(t)
  await b.guard.settleRecovery(b.request, false)
  t.not(await a.store.getSession(id), null, 'not dropped while the other replica\'s recovery waits for its answer')
  await a.guard.settleRecovery(a.request, true)
  t.not(await b.store.getSession(id), null, 'and kept once it is confirmed')
})

t.test('refused on both replicas: the last to settle drops the record', async t => {
  const { a, b, id } = await twoReplicas(t)
  await a.guard.settleRecovery(a.request, false)
  t.not(await b.store.getSession(id), null, 'the first refusal leaves it to the recovery still waiting')
  await b.guard.settleRecovery(b.request, false)
  t.equal(await a.store.getSession(id), null, 'the second drops it: the upstream confirmed neither')
  t.equal(await a.store.sessionDeleted(id), true, 'for good')
})
