// LeaseCoordinator.reacquire over each renewal outcome a backend can give:
// a lease renewed or taken back is this replica's (a move of the record
// included: the holder's own renewals tell it to follow), one held elsewhere
// is 'held', a session the store does not know is 'gone', and anything else
// throws rather than passing for one of them.
import t, { type Test } from 'tap'
import type { FastifyBaseLogger } from 'fastify'
import { pino } from 'pino'
import { LeaseCoordinator, type Lease } from '../../src/cluster/coordinator.js'
import type { LeaseBackend, RenewResult, TickResult } from '../../src/cluster/lease.js'

const log = pino({ level: 'silent' }) as unknown as FastifyBaseLogger

/** A coordinator holding one lease, whose backend's renewals answer `outcome`. */
async function holding (t: Test, outcome: () => RenewResult[]): Promise<{ coordinator: LeaseCoordinator, lease: Lease }> {
  const backend = {
    replicaId: 'r1',
    shared: true,
    async acquire (_sessionId: string, token: string) { return { token, takeover: false, lastUpstreamId: 'u-1' } },
    async tick (): Promise<TickResult> { return { renew: outcome(), watch: [], recordersAlive: [] } },
    async release () { return true }
  } as unknown as LeaseBackend
  const coordinator = new LeaseCoordinator({ backend, ttlMs: 30_000, holdMs: 0, log })
  t.teardown(() => coordinator.close())
  const lease = await coordinator.acquire('s1')
  if (typeof lease === 'string') throw new Error(`not granted: ${lease}`)
  return { coordinator, lease }
}

t.test('held under its token still: the same lease', async t => {
  for (const outcome of ['renewed', 'moved'] as const) {
    const { coordinator, lease } = await holding(t, () => [outcome])
    t.equal(await coordinator.reacquire(lease), lease, `${outcome}: the lease itself`)
    t.equal(coordinator.heldCount, 1, `${outcome}: still renewed at each tick`)
  }
})

t.test('let go here meanwhile: a lease under the same token, held from now on', async t => {
  for (const outcome of ['renewed', 'moved'] as const) {
    const { coordinator, lease } = await holding(t, () => [outcome])
    lease.lose('gone')
    t.equal(coordinator.heldCount, 0)
    const again = await coordinator.reacquire(lease)
    t.ok(typeof again !== 'string' && again !== lease && again.token === lease.token && !again.settled, `${outcome}: a new lease, same token`)
    t.equal(typeof again !== 'string' && again.lastUpstreamId, 'u-1', `${outcome}: the upstream's last id kept`)
    t.equal(coordinator.heldCount, 1, `${outcome}: renewed at each tick`)
  }
})

t.test('held elsewhere, or the session unknown', async t => {
  const lost = await holding(t, () => ['lost'])
  t.equal(await lost.coordinator.reacquire(lost.lease), 'held', 'lost: another replica holds it')
  const gone = await holding(t, () => ['gone'])
  t.equal(await gone.coordinator.reacquire(gone.lease), 'gone', 'gone: the store has no record of the session')
})

t.test('no outcome, or one outside RenewResult: thrown', async t => {
  const none = await holding(t, () => [])
  await t.rejects(none.coordinator.reacquire(none.lease), /a renewal without its result/)
  const odd = await holding(t, () => ['stolen' as RenewResult])
  await t.rejects(odd.coordinator.reacquire(odd.lease), /unhandled member of a closed set: stolen/)
})
