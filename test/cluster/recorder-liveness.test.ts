// The primitives that end a request stream whose recording replica died
// (cluster/lease.ts, RecorderLiveness), on a real Redis: the recorder noted
// with the stream, the per-replica liveness mark refreshed by the batched
// tick, and the atomic, idempotent end. The embedded store's backend does
// nothing: one process cannot lose a recorder and live on.
import t from 'tap'
import type { Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger } from 'fastify'
import { pino } from 'pino'
import { LeaseCoordinator } from '../../src/cluster/coordinator.js'
import { LocalLeaseBackend } from '../../src/cluster/local-lease-backend.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import type { RetentionLimits, StreamNotice } from '../../src/store/contract.js'
import { waitUntil } from '../fixtures/mcp-client.js'
import { useRedis, type TestRedis } from '../fixtures/redis.js'

const RETENTION: RetentionLimits = { maxEvents: 5, maxBytes: 1024 * 1024, ttlMs: 60_000 }
const ANSWER = { data: '{"jsonrpc":"2.0","id":7,"error":{"code":-32000,"message":"lost"}}' }

async function storeFor (t: Test, env: TestRedis, retention = RETENTION): Promise<RedisEventStore> {
  const store = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention })
  t.teardown(() => store.close())
  return store
}

t.test('the recorder is noted with the stream, only for a known session', async (t) => {
  const env = await useRedis(t, 'recorder')
  const a = await storeFor(t, env)
  const la = a.leaseBackend()
  await a.createSession('s1', 'p')
  await la.claimRequestStream('s1', 'r1')
  t.equal(await la.requestStreamRecorder('s1', 'r1'), a.replicaId, 'the recording replica')
  t.equal(await la.requestStreamRecorder('s1', 'other'), undefined, 'unknown for a stream nobody claimed')
  await la.claimRequestStream('gone', 'r1')
  t.equal(await env.redis.exists(`${env.prefix}{gone}:m`), 0, 'no record is made for an unknown session')
})

t.test('liveness marks: refreshed by the tick, read by the tick, dropped on retire', async (t) => {
  const env = await useRedis(t, 'liveness')
  const a = await storeFor(t, env)
  const b = await storeFor(t, env)
  const la = a.leaseBackend()
  const lb = b.leaseBackend()
  const tick = { ttlMs: 1000, attachedMs: 1000, renew: [], watch: [] }
  t.same((await lb.tick({ ...tick, recorders: [a.replicaId] })).recordersAlive, [false], 'no mark yet')
  // 1.5 s, not less: the next tick must read the mark before it runs out, on a slow machine too.
  t.same((await la.tick({ ...tick, aliveMs: 1500 })).recordersAlive, [], 'the tick refreshes the mark')
  t.same((await lb.tick({ ...tick, recorders: [a.replicaId, 'never-was'] })).recordersAlive, [true, false], 'alive, and one that never was')
  await sleep(1600)
  t.same((await lb.tick({ ...tick, recorders: [a.replicaId] })).recordersAlive, [false], 'the mark runs out unless refreshed')
  await la.markAlive(5000)
  t.same((await lb.tick({ ...tick, recorders: [a.replicaId] })).recordersAlive, [true], 'markAlive')
  await la.retire()
  t.same((await lb.tick({ ...tick, recorders: [a.replicaId] })).recordersAlive, [false], 'retired: gone at once')
})

t.test('ending an orphaned stream: atomic, idempotent, only while unended and still the recorder\'s', async (t) => {
  const env = await useRedis(t, 'orphan-end')
  const a = await storeFor(t, env)
  const b = await storeFor(t, env)
  const c = await storeFor(t, env)
  await a.createSession('s1', 'p')
  await a.openStream('s1', 'r1')
  await a.leaseBackend().claimRequestStream('s1', 'r1')
  await a.append('s1', 'r1', [{ data: 'one' }, { data: 'two' }])

  const onB: StreamNotice[] = []
  const onC: StreamNotice[] = []
  const offB = b.subscribe('s1', 'r1', n => onB.push(n))
  const offC = c.subscribe('s1', 'r1', n => onC.push(n))
  t.teardown(() => { offB(); offC() })
  await b.subscribeControl('s1', () => {}).ready
  await c.subscribeControl('s1', () => {}).ready

  t.equal(await b.leaseBackend().endOrphanedRequestStream('s1', 'r1', 'someone-else', ANSWER), false, 'not the recorder named: nothing done')
  t.equal(await b.leaseBackend().endOrphanedRequestStream('gone', 'r1', a.replicaId, ANSWER), false, 'unknown session: nothing done')
  t.equal((await a.state('s1', 'r1'))?.ended, false)

  // Two replicas race: exactly one ends it.
  const results = await Promise.all([b, c].map(async s => await s.leaseBackend().endOrphanedRequestStream('s1', 'r1', a.replicaId, ANSWER)))
  t.same(results.filter(Boolean).length, 1, 'exactly one of two racing replicas ends it')
  const read = await a.read('s1', 'r1', 0, 100)
  t.same(read?.events.map(e => [e.seq, e.data]), [[1, 'one'], [2, 'two'], [3, ANSWER.data]], 'the answer appended once, after what was recorded')
  t.match(read?.state, { lastSeq: 3, firstSeq: 1, ended: true }, 'ended')
  t.equal(await b.leaseBackend().endOrphanedRequestStream('s1', 'r1', a.replicaId, ANSWER), false, 'ended already: nothing done')

  // Both replicas' followers hear the end: the one that ended it with the event, the other by pub/sub.
  t.ok(await waitUntil(() => onB.some(n => n.ended) && onC.some(n => n.ended), 2000), 'every replica is told the stream ended')
  const winner = results[0] === true ? onB : onC
  t.match(winner.find(n => n.ended), { toSeq: 3, ended: true, events: [{ seq: 3, data: ANSWER.data }] }, 'locally, with the event itself')
  t.match((results[0] === true ? onC : onB).find(n => n.ended), { toSeq: 3, ended: true }, 'elsewhere, as a notice')

  // A stream its recorder ended normally is never touched.
  await a.openStream('s1', 'r2')
  await a.leaseBackend().claimRequestStream('s1', 'r2')
  await a.append('s1', 'r2', [{ data: 'response' }], { end: true })
  t.equal(await b.leaseBackend().endOrphanedRequestStream('s1', 'r2', a.replicaId, ANSWER), false, 'ended by its recorder: nothing done')
  t.equal((await a.state('s1', 'r2'))?.lastSeq, 1)
})

t.test('the answer is bounded by retention like any event, and may be a gap marker', async (t) => {
  const env = await useRedis(t, 'orphan-retention')
  const a = await storeFor(t, env)
  await a.createSession('s1', 'p')
  await a.leaseBackend().claimRequestStream('s1', 'r1')
  await a.append('s1', 'r1', [1, 2, 3, 4, 5].map(i => ({ data: `e${i}` })))
  t.ok(await a.leaseBackend().endOrphanedRequestStream('s1', 'r1', a.replicaId, { event: 'gateway-gap', data: '{"reason":"recorder_lost"}' }))
  const read = await a.read('s1', 'r1', 0, 100)
  t.same(read?.events.map(e => e.seq), [2, 3, 4, 5, 6], `maxEvents ${RETENTION.maxEvents} kept: the oldest trimmed`)
  t.match(read?.events.at(-1), { seq: 6, event: 'gateway-gap', data: '{"reason":"recorder_lost"}' }, 'a gap marker keeps its event type')
  t.match(read?.state, { firstSeq: 2, lastSeq: 6, ended: true })

  // Batches appended one by one: the entry wholly below the first kept event goes from storage.
  await a.leaseBackend().claimRequestStream('s1', 'r2')
  for (const i of [1, 2, 3, 4, 5]) await a.append('s1', 'r2', [{ data: `e${i}` }])
  t.ok(await a.leaseBackend().endOrphanedRequestStream('s1', 'r2', a.replicaId, ANSWER))
  t.same((await a.read('s1', 'r2', 0, 100))?.events.map(e => e.seq), [2, 3, 4, 5, 6], 'per event: the oldest trimmed')
  t.equal(await env.redis.xlen(`${env.prefix}{s1}:b:r2`), 5, 'in storage: its entry deleted, one entry per batch left')

  // Bytes: the answer pushes the oldest events out, never itself.
  const small = await storeFor(t, env, { maxEvents: 100, maxBytes: 100, ttlMs: 60_000 })
  await small.createSession('s2', 'p')
  await small.leaseBackend().claimRequestStream('s2', 'r1')
  await small.append('s2', 'r1', [{ data: 'x'.repeat(40) }, { data: 'y'.repeat(40) }])
  t.ok(await small.leaseBackend().endOrphanedRequestStream('s2', 'r1', small.replicaId, ANSWER))
  const bounded = await small.read('s2', 'r1', 0, 100)
  t.same(bounded?.events.map(e => e.seq), [3], 'both older events trimmed for the answer\'s bytes')
  // A later append (from another replica: the recorder is dead) finds the byte count exact.
  const other = await storeFor(t, env, { maxEvents: 100, maxBytes: 100, ttlMs: 60_000 })
  await other.append('s2', 'r1', [{ data: 'z'.repeat(100 - ANSWER.data.length) }])
  t.same((await other.read('s2', 'r1', 0, 100))?.events.map(e => e.seq), [3, 4], 'the byte count left by the script is exact: exactly at the bound, nothing trimmed')
  await other.append('s2', 'r1', [{ data: 'w' }])
  t.same((await other.read('s2', 'r1', 0, 100))?.events.map(e => e.seq), [4, 5], 'one byte over: the oldest goes')
})

t.test('coordinators: the mark lives exactly while recording; a waiting client\'s replica ends the stream once the recorder is gone', async (t) => {
  const env = await useRedis(t, 'orphan-coordinator')
  const a = await storeFor(t, env)
  const b = await storeFor(t, env)
  const ttlMs = 600
  const log = pino({ level: 'silent' }) as unknown as FastifyBaseLogger
  const coordinator = (store: RedisEventStore): LeaseCoordinator => {
    const c = new LeaseCoordinator({ backend: store.leaseBackend(), ttlMs, holdMs: 0, log })
    c.start()
    t.teardown(() => c.close())
    return c
  }
  const ca = coordinator(a)
  const cb = coordinator(b)
  const aliveKey = `${env.prefix}r:${a.replicaId}:alive`
  await a.createSession('s1', 'p')
  await a.openStream('s1', 'r1')

  await sleep(ttlMs)
  t.equal(await env.redis.exists(aliveKey), 0, 'a replica that records nothing keeps no mark')
  const recording = ca.recordRequestStream('s1', 'r1')
  await recording.claimed
  t.equal(await a.leaseBackend().requestStreamRecorder('s1', 'r1'), a.replicaId, 'claimed')
  await a.append('s1', 'r1', [{ data: 'one' }])

  let ended = 0
  const stop = cb.watchRequestStream('s1', 'r1', ANSWER, () => { ended++ })
  await sleep(ttlMs * 3)
  t.equal(await env.redis.exists(aliveKey), 1, 'the ticks keep the mark up past its ttl while recording')
  t.equal((await a.state('s1', 'r1'))?.ended, false, 'a live recorder\'s stream is left alone')
  t.equal(ended, 0)

  recording.done()
  await sleep(50)
  t.equal(await env.redis.exists(aliveKey), 0, 'done: the mark is dropped at once')
  const diedAt = Date.now()
  t.ok(await waitUntil(() => ended === 1, ttlMs * 3), 'the watcher ends the stream whose recorder left it unended')
  t.comment(`ended ${Date.now() - diedAt} ms after the recorder's mark went (tick ${cb.tickMs} ms)`)
  const read = await b.read('s1', 'r1', 0, 100)
  t.same(read?.events.map(e => e.data), ['one', ANSWER.data])
  t.equal(read?.state.ended, true)
  await sleep(ttlMs)
  t.equal(ended, 1, 'once')
  stop()

  // Watching a stream this replica records itself is a no-op.
  await a.openStream('s1', 'r2')
  const own = ca.recordRequestStream('s1', 'r2')
  await own.claimed
  const stopOwn = ca.watchRequestStream('s1', 'r2', ANSWER, () => { ended++ })
  own.done()
  await sleep(ttlMs * 2)
  t.equal((await a.state('s1', 'r2'))?.ended, false, 'never ended by its own replica')
  stopOwn()
})

t.test('the embedded store: nothing to watch, nothing ever orphaned', async (t) => {
  const local = new LocalLeaseBackend()
  await local.claimRequestStream()
  t.equal(await local.requestStreamRecorder(), undefined)
  t.equal(await local.endOrphanedRequestStream(), false)
  t.same((await local.tick({ ttlMs: 1, attachedMs: 1, renew: [], watch: [], recorders: ['x'] })).recordersAlive, [true])
})
