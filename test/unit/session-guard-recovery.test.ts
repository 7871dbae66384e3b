// Several requests recording one lost session again at once
// (src/routes/mcp/session-guard.ts): after the store restarted empty, two
// requests of the session both miss it and record it again in the same
// epoch. The upstream confirming either keeps it; a request the upstream
// refused drops it only when no other recovery of that epoch was confirmed
// or still waits for its answer. Real guard, cache and embedded store.
import t from 'tap'
import { Readable } from 'node:stream'
import type { FastifyRequest } from 'fastify'
import { SessionGuard } from '../../src/routes/mcp/session-guard.js'
import { SessionCache } from '../../src/routes/mcp/session-cache.js'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import type { UpstreamResponse } from '../../src/upstream/client.js'
import { config, log, metrics, retention, settlementCases, type TwoRecoveries } from '../fixtures/recovery-settlement.js'

/** A guard over a store that lost everything a second ago, and two requests that both recorded session `id` again. */
async function twoRecoveries (): Promise<TwoRecoveries> {
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
  return { a: { guard, request: a }, b: { guard, request: b }, store, id }
}

settlementCases(t, 'one process', twoRecoveries)

t.test('a recovery the upstream left unanswered keeps, for the next one, where the session lives upstream', async t => {
  let now = Date.now()
  const store = new MemoryEventStore({ retention, maxBytes: 1 << 26, now: () => now })
  const sessions = new SessionCache({ freshMs: 2000, staleMs: retention.ttlMs, maxEntries: 100, now: () => now })
  const guard = new SessionGuard({ config, store, metrics, sessions })
  const id = guard.ids.issue('p', 'up1')
  // Before the loss this replica knew the session established again: another upstream session, on another endpoint.
  sessions.set(id, { epoch: 'before', principal: 'p', upstreamSessionId: 'up2', endpoint: 'http://b:1' })
  now += 5000
  const first = { log } as unknown as FastifyRequest
  const recorded = await guard.requireSession(id, 'p', first)
  t.match(recorded, { upstreamSessionId: 'up2', endpoint: 'http://b:1' }, 'recorded again where this replica knew it lives')
  await guard.settleRecovery(first, 'unanswered')
  t.equal(await store.getSession(id), null, 'the upstream said nothing of it: dropped')
  const next = { log } as unknown as FastifyRequest
  t.match(await guard.requireSession(id, 'p', next), { upstreamSessionId: 'up2', endpoint: 'http://b:1' }, 'the next request records it again at the same place, not at the upstream session its id names')
  t.ok(guard.recovers(next), 'as a recovery of its own')
})

t.test('a recovering request whose answer breaks off before it says anything of the session is settled all the same', async t => {
  let now = Date.now()
  const store = new MemoryEventStore({ retention, maxBytes: 1 << 26, now: () => now })
  now += 1000
  const guard = new SessionGuard({ config, store, metrics, sessions: new SessionCache({ freshMs: 2000, staleMs: retention.ttlMs, maxEntries: 100 }) })
  const id = guard.ids.issue('p', 'up1')
  const request = { log } as unknown as FastifyRequest
  await guard.requireSession(id, 'p', request)
  t.ok(guard.recovers(request), 'the request recorded the session again')
  // A 400 whose body the connection's reset cuts: the start read to tell a lost session fails.
  const body = new Readable({ read () { this.destroy(new Error('connection reset')) } })
  await t.rejects(guard.settleAnswered(request, { statusCode: 400, headers: { 'content-length': '50' }, body } as unknown as UpstreamResponse), /connection reset/, 'the read error goes on to the caller')
  t.notOk(guard.recovers(request), 'settled')
  t.equal(await store.getSession(id), null, 'as unanswered: the record dropped (a pending adoption left behind would hold it until its TTL)')
  t.equal(await store.sessionDeleted(id), false, 'not marked deleted')
})

t.test('a recovery the upstream refused drops what the process holds of the session; one it left unanswered does not', async t => {
  let now = Date.now()
  const store = new MemoryEventStore({ retention, maxBytes: 1 << 26, now: () => now })
  now += 1000
  const dropped: string[] = []
  const guard = new SessionGuard({ config, store, metrics, sessions: new SessionCache({ freshMs: 2000, staleMs: retention.ttlMs, maxEntries: 100 }), dropLocal: (id) => { dropped.push(id) } })
  const unanswered = guard.ids.issue('p', 'up1')
  const first = { log } as unknown as FastifyRequest
  await guard.requireSession(unanswered, 'p', first)
  await guard.settleRecovery(first, 'unanswered')
  t.same(dropped, [], 'left lost, for the next request to record again: nothing dropped')
  const refused = guard.ids.issue('p', 'up2')
  const second = { log } as unknown as FastifyRequest
  await guard.requireSession(refused, 'p', second)
  await guard.settleRecovery(second, 'refused')
  t.equal(await store.sessionDeleted(refused), true, 'marked deleted in the store')
  t.same(dropped, [refused], 'and dropped here at once (the hub ends its streams), as for the upstream\'s 404')
})

t.test('a drop that throws does not take the upstream\'s answer with it', async t => {
  let now = Date.now()
  const store = new MemoryEventStore({ retention, maxBytes: 1 << 26, now: () => now })
  now += 1000
  const guard = new SessionGuard({ config, store, metrics, sessions: new SessionCache({ freshMs: 2000, staleMs: retention.ttlMs, maxEntries: 100 }), dropLocal: () => { throw new Error('hub gone') } })
  const id = guard.ids.issue('p', 'up3')
  const request = { log } as unknown as FastifyRequest
  await guard.requireSession(id, 'p', request)
  await t.resolves(guard.settleRecovery(request, 'refused'), 'settled, the failure logged')
  t.equal(await store.sessionDeleted(id), true, 'and the session marked deleted')
})
