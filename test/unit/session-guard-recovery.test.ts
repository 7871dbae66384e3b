// Several requests recording one lost session again at once
// (src/routes/mcp/session-guard.ts): after the store restarted empty, two
// requests of the session both miss it and record it again in the same
// epoch. The upstream confirming either keeps it; a request the upstream
// refused drops it only when no other recovery of that epoch was confirmed
// or still waits for its answer. Real guard, cache and embedded store.
import t from 'tap'
import type { FastifyRequest } from 'fastify'
import { SessionGuard } from '../../src/routes/mcp/session-guard.js'
import { SessionCache } from '../../src/routes/mcp/session-cache.js'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import type { GatewayConfig } from '../../src/config/load.js'
import type { GatewayMetrics } from '../../src/metrics/metrics.js'

const log = { info () {}, warn () {}, debug () {}, error () {}, child () { return log } }
const metrics = { timeStore: async (_n: string, fn: () => Promise<unknown>) => await fn(), sessionsRecovered: { inc () {} } } as unknown as GatewayMetrics
const retention = { maxEvents: 1000, maxBytes: 1 << 20, ttlMs: 3_600_000 }
const config = { recoverLostSessions: true, sessionBindingKey: 'k'.repeat(32), retention, principalHeader: 'x-p' } as unknown as GatewayConfig

/** A guard over a store that lost everything a second ago, and two requests that both recorded session `id` again. */
async function twoRecoveries (): Promise<{ guard: SessionGuard, store: MemoryEventStore, id: string, a: FastifyRequest, b: FastifyRequest }> {
  let now = Date.now()
  const store = new MemoryEventStore({ retention, maxBytes: 1 << 26, now: () => now })
  now += 1000
  const sessions = new SessionCache({ freshMs: 2000, staleMs: retention.ttlMs, maxEntries: 100 })
  const guard = new SessionGuard({ config, store, metrics, sessions })
  const id = guard.ids.issue('p', 'up1')
  const a = { log } as unknown as FastifyRequest
  const b = { log } as unknown as FastifyRequest
  const [ra, rb] = await Promise.all([guard.requireSession(id, 'p', a), guard.requireSession(id, 'p', b)])
  if (ra.epoch !== rb.epoch || !guard.recovers(a) || !guard.recovers(b)) throw new Error('expected two recoveries of one epoch')
  return { guard, store, id, a, b }
}

t.test('one confirmed, then the other refused: the session stays', async t => {
  const { guard, store, id, a, b } = await twoRecoveries()
  await guard.settleRecovery(a, true)
  await guard.settleRecovery(b, false)
  t.not(await store.getSession(id), null, 'the session the upstream confirmed is still recorded')
  t.equal(await store.sessionDeleted(id), false, 'and not marked deleted')
})

t.test('one refused while the other waits, then that one confirmed: the session stays', async t => {
  const { guard, store, id, a, b } = await twoRecoveries()
  await guard.settleRecovery(b, false)
  t.not(await store.getSession(id), null, 'not dropped while another recovery waits for its answer')
  await guard.settleRecovery(a, true)
  t.not(await store.getSession(id), null, 'and kept once it is confirmed')
})

t.test('both refused: the last to settle drops the record', async t => {
  const { guard, store, id, a, b } = await twoRecoveries()
  await guard.settleRecovery(a, false)
  t.not(await store.getSession(id), null, 'the first refusal leaves it to the recovery still waiting')
  await guard.settleRecovery(b, false)
  t.equal(await store.getSession(id), null, 'the second drops it: the upstream confirmed neither')
})
