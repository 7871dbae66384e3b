// A pump's lease handed to the pump that follows the session to a new
// upstream placement (StandalonePump.moveAway, StandaloneHolder.follow): only
// while nothing is in flight on it (`movable`). A recovery after a store loss
// replaces a lost lease with one taken again, and the hold's release settles
// it: handed over meanwhile, the next pump ran on a settled lease while the
// one taken again stayed renewed by nobody's pump, for ever. A record that
// only comes to name the endpoint holding the upstream session a pump reads is
// no move (StandalonePump.pin): its GET goes on, and is resumed from the
// upstream's last event id. Real leases (HeldLeases) and pumps; the store,
// upstream and backend are stand-ins that answer at chosen moments.
import t from 'tap'
import { PassThrough } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import { HeldLeases } from '../../src/cluster/renewal.js'
import type { IdleRelease, Lease, LeaseBackend } from '../../src/cluster/lease.js'
import { StandalonePump, type PumpOptions } from '../../src/sessions/standalone-pump.js'
import { ReadAheadBudget } from '../../src/recording/read-ahead.js'
import type { EventStore, SessionRecord } from '../../src/store/contract.js'
import { GatewayMetrics } from '../../src/metrics/metrics.js'
import { metricSum } from '../fixtures/hardening.js'
import { waitUntil } from '../fixtures/mcp-client.js'
import type { UpstreamClient, UpstreamRequest } from '../../src/upstream/client.js'
import { EventBatch } from '../../src/store/batch/event-batch.js'
import { NumberedBatch } from '../../src/store/batch/numbered-batch.js'
import type { AppendOptions } from '../../src/store/contract.js'
import { SessionGoneError } from '../../src/errors.js'
import { silentLog, standInMetrics } from '../fixtures/stand-ins.js'

const log = silentLog
const metrics = standInMetrics
const store = {
  async state () { return { epoch: 'e1', lastSeq: 0, firstSeq: 1, ended: false } },
  async sessionDeleted () { await sleep(5); return false },
  async append () { return [] },
  async openStream () { return { epoch: 'e2', lastSeq: 0, firstSeq: 1, ended: false } }
} as unknown as EventStore
const upstream = {
  async request () { return { statusCode: 200, headers: { 'content-type': 'text/event-stream' }, body: new PassThrough() } }
} as unknown as UpstreamClient

interface Setup {
  readonly held: HeldLeases
  readonly released: string[]
  /** The upstream event ids noted on the backend. */
  readonly noted: string[]
  readonly pump: (lease: Lease, more?: Partial<PumpOptions>) => StandalonePump
  /** Resolves the backend's pending releaseIfIdle. */
  readonly answerRelease: (result: IdleRelease) => void
}

function setup (clients = 1): Setup {
  const released: string[] = []
  const noted: string[] = []
  let answerRelease: (result: IdleRelease) => void = () => {}
  const backend = {
    replicaId: 'r1',
    async release (_sessionId: string, token: string) { released.push(token); return true },
    noteUpstreamId (_sessionId: string, id: string) { noted.push(id) },
    async releaseIfIdle () { return await new Promise<IdleRelease>(resolve => { answerRelease = resolve }) }
  } as unknown as LeaseBackend
  const held = new HeldLeases(backend, log)
  const record: SessionRecord = { epoch: 'e1', principal: 'p', upstreamSessionId: 'up-old' }
  const pump = (lease: Lease, more: Partial<PumpOptions> = {}): StandalonePump => new StandalonePump({
    upstream,
    store,
    metrics,
    log,
    sessionId: 's',
    placement: async () => record,
    path: '/mcp',
    holdMs: 20,
    earlyHoldMs: 20,
    maxEventBytes: 1 << 20,
    readAhead: new ReadAheadBudget(),
    resumeBounds: { withoutProgress: 3, maxMs: 1000 },
    lease,
    reopenFromLastId: false,
    recoverSession: async () => { await sleep(20); return true },
    reacquire: async lost => { await sleep(5); return lost.settled ? held.hold('s', { token: lost.token, takeover: false, lastUpstreamId: undefined }) : lost },
    clients: { localClients: () => clients, deleting: false } as unknown as PumpOptions['clients'],
    onStop: () => {},
    ...more
  })
  return { held, released, noted, pump, answerRelease: result => { answerRelease(result) } }
}

t.test('not movable while a recovery replaces its lease; movable once done, and the lease moved is the one renewed', async t => {
  const { held, released, noted, pump } = setup()
  const first = held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined })
  const p1 = pump(first)
  t.equal(await p1.open(), null, 'the GET runs')
  t.equal(p1.movable, true, 'movable while nothing is in flight')
  held.renewed([first], ['gone']) // the store lost the session: the pump records it again
  t.equal(p1.movable, false, 'not while the lost lease is being taken again')
  await p1.leaseWorkDone()
  t.equal(p1.movable, true, 'movable once the recovery is done')
  t.not(p1.lease, first, 'under the lease taken again')
  const p2 = pump(p1.moveAway(), { newUpstreamSession: true })
  t.equal(await p2.open(), null, 'the next pump runs')
  t.same(noted, [''], 'and forgets the old upstream session\'s last event id (a later holder must not resume the new one from it)')
  t.same(held.list(), [p2.lease], 'the one lease renewed is the next pump\'s')
  p2.stop()
  await sleep(10)
  t.same(held.list(), [], 'stopped: nothing left renewed')
  t.same(released, ['T'], 'and the lease released once')
})

t.test('stopped while a recovery takes its lost lease again: no lease left renewed for ever', async t => {
  // No client: the 20 ms hold runs out during the store-loss recovery, while the session is
  // recorded again (which takes the lease with the record) or while the lease is taken again.
  // Each step of the recovery waits until the hold has stopped the pump. Either way the lease
  // taken again is released: left, it would hold the stream from every replica.
  for (const when of ['recording again', 'taking the lease again'] as const) {
    const { held, released, pump } = setup(0)
    const first = held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined })
    let outcome: string | undefined
    const stopped = async (): Promise<void> => {
      for (let i = 0; i < 400; i++) {
        if (outcome !== undefined) return
        await sleep(5)
      }
    }
    const p = pump(first, {
      recoverSession: async () => {
        if (when === 'recording again') await stopped()
        return true
      },
      reacquire: async lost => {
        if (when === 'taking the lease again') await stopped()
        return lost.settled ? held.hold('s', { token: lost.token, takeover: false, lastUpstreamId: undefined }) : lost
      },
      onStop: o => { outcome = o }
    })
    t.equal(await p.open(), null, `${when}: the GET runs`)
    held.renewed([first], ['gone'])
    await p.leaseWorkDone()
    await sleep(10)
    t.equal(outcome, 'lease_lost', `${when}: the hold found the lease lost meanwhile, the pump stopped`)
    t.same(held.list(), [], `${when}: no lease left for the renewals of a pump that is gone`)
    t.same(released, ['T'], `${when}: the one taken again released`)
  }
})

t.test('handed over (draining) while a recovery records the session again: settles once the lease the recording took is released', async t => {
  const { held, released, pump } = setup()
  const first = held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined })
  let record: () => void = () => {}
  const recording = new Promise<void>(resolve => { record = resolve })
  const p = pump(first, { recoverSession: async () => { await recording; return true } })
  t.equal(await p.open(), null, 'the GET runs')
  held.renewed([first], ['gone']) // the store lost the session: the pump records it again
  t.ok(await waitUntil(() => p.leaseBusy, 1000), 'the recovery is under way')
  const handing = p.handOver()
  record()
  await handing
  t.same(released, ['T'], 'the lease taken with the record is released before the hand-over settles (the process may exit then)')
  t.same(held.list(), [], 'and none is left renewed')
})

t.test('the lease lost while the GET opens: acted on once it has, not recorded under', async t => {
  const slowUpstream = {
    async request () { await sleep(30); return { statusCode: 200, headers: { 'content-type': 'text/event-stream' }, body: new PassThrough() } }
  } as unknown as UpstreamClient
  for (const reason of ['lost', 'gone'] as const) {
    const { held, pump } = setup()
    const first = held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined })
    let outcome: string | undefined
    const p = pump(first, { upstream: slowUpstream, onStop: o => { outcome = o } })
    const opening = p.open()
    await sleep(10)
    held.renewed([first], [reason])
    t.equal(await opening, null, `${reason}: the GET opened`)
    await p.leaseWorkDone()
    if (reason === 'lost') {
      t.equal(outcome, 'lease_lost', 'lost (another replica holds it): the pump stops instead of recording')
    } else {
      t.equal(p.stopped, false, 'gone (the store lost the session): the pump records it again and goes on')
      t.not(p.lease, first, 'under the lease taken again')
      t.same(held.list(), [p.lease], 'which is the one renewed')
      p.stop()
    }
  }
  // A lease settled before the pump had it (a claim retried on a lease lost meanwhile).
  const { held, pump } = setup()
  const settled = held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined })
  held.renewed([settled], ['lost'])
  let outcome: string | undefined
  const p = pump(settled, { onStop: o => { outcome = o } })
  t.equal(await p.open(), null, 'a lease settled already: the GET opened')
  t.equal(outcome, 'lease_lost', 'and the pump stops at once')
})

t.test('a takeover whose session the store lost while its GET opened records it again, not a handover gap first', async t => {
  const slowUpstream = {
    async request () { await sleep(30); return { statusCode: 200, headers: { 'content-type': 'text/event-stream' }, body: new PassThrough() } }
  } as unknown as UpstreamClient
  // The store lost the session: an append (the handover's gap marker) finds it gone.
  let gapAppends = 0
  const lostStore = { ...store, async append () { gapAppends++; throw new SessionGoneError('s') } } as unknown as EventStore
  const { held, pump } = setup()
  const taken = held.hold('s', { token: 'T', takeover: true, lastUpstreamId: undefined })
  let outcome: string | undefined
  const p = pump(taken, { upstream: slowUpstream, store: lostStore, onStop: o => { outcome = o } })
  const opening = p.open()
  await sleep(10)
  held.renewed([taken], ['gone'])
  t.equal(await opening, null, 'the GET opened')
  await p.leaseWorkDone()
  t.equal(outcome, undefined, 'the pump goes on: the session recorded again')
  t.equal(gapAppends, 0, 'no handover gap appended to the session gone')
  t.not(p.lease, taken, 'under the lease taken again')
  p.stop()
})

t.test('not movable while the hold\'s release is in flight', async t => {
  const { held, pump, answerRelease } = setup(0)
  const lease = held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined })
  const p = pump(lease)
  t.equal(await p.open(), null)
  await sleep(40) // the 20 ms hold ran out: its release is asked of the backend
  t.equal(p.movable, false, 'not while the release may settle the lease')
  answerRelease({ kind: 'released' })
  await p.leaseWorkDone()
  await sleep(1)
  t.equal(p.stopped, true, 'released for want of a client: the pump stopped')
  t.equal(p.movable, false, 'and a stopped pump is never movable')
})

t.test('its appends say which upstream session they were read from, so a move elsewhere makes the store drop their resume point', async t => {
  const { held, noted, pump } = setup()
  const body = new PassThrough()
  const appends: AppendOptions[] = []
  const recording = {
    ...store,
    async appendBatch (_s: string, _stream: string, batch: EventBatch, options: AppendOptions) {
      appends.push(options)
      return new NumberedBatch(batch, 1)
    }
  } as unknown as EventStore
  const p = pump(held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined }), recordingFrom(body, recording))
  t.equal(await p.open(), null, 'the GET runs')
  body.write('id: ev-1\ndata: {}\n\n')
  await waitFor(() => appends.length > 0)
  t.match(appends[0], { fence: 'T', readFrom: 'up-old' }, 'read from the record\'s upstream session')
  t.same(noted, ['ev-1'], 'its event id noted')
  p.stop()
})

t.test('an append still in flight when the pump moved away notes nothing on the lease it handed on', async t => {
  const { held, noted, pump } = setup()
  const body = new PassThrough()
  let release: () => void = () => {}
  const gate = new Promise<void>(resolve => { release = resolve })
  let appends = 0
  const slow = {
    ...store,
    async appendBatch (_s: string, _stream: string, batch: EventBatch) {
      appends++
      await gate
      return new NumberedBatch(batch, 1)
    }
  } as unknown as EventStore
  const p1 = pump(held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined }), recordingFrom(body, slow))
  t.equal(await p1.open(), null, 'the GET runs')
  body.write('id: old-session-ev-9\ndata: {}\n\n')
  await waitFor(() => appends > 0)
  const p2 = pump(p1.moveAway(), { newUpstreamSession: true })
  t.equal(await p2.open(), null, 'the next pump runs on the lease')
  release()
  await sleep(20)
  t.same(noted, [''], 'only the next pump\'s forgetting: the old session\'s id never reaches the lease')
  p2.stop()
})

t.test('a resume of the upstream GET that fails is timed and counted as an upstream error, as its first opening would be', async t => {
  const { held, pump } = setup()
  const body = new PassThrough()
  const counted = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  let requests = 0
  const p = pump(held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined }), {
    metrics: counted,
    upstream: {
      async request () {
        if (++requests > 1) throw new Error('connect ECONNREFUSED')
        return { statusCode: 200, headers: { 'content-type': 'text/event-stream' }, body }
      }
    } as unknown as UpstreamClient
  })
  t.equal(await p.open(), null, 'the GET runs')
  body.end() // the upstream ends its GET: the pump resumes it, and the upstream is gone
  await waitFor(() => requests > 1)
  await sleep(20)
  const text = await counted.registry.metrics()
  t.equal(metricSum(text, 'mcpgw_upstream_errors_total', { kind: 'request' }), 1, 'the failed resume counted')
  t.equal(metricSum(text, 'mcpgw_upstream_request_duration_seconds_count', { status_class: 'error' }), 1, 'and timed, its status class "error"')
  p.stop()
})

t.test('a record that comes to name the endpoint holding the upstream session the pump reads is no move: its GET goes on, and is resumed there from its last event id', async t => {
  const setUp = setup()
  let record: SessionRecord = { epoch: 'e1', principal: 'p', upstreamSessionId: 'up-1' }
  const { p, bodies, requests } = resumingPump(setUp, () => record)
  t.equal(await p.open(), null, 'the GET runs, balanced: the record names no endpoint')
  bodies[0]?.write('id: ev-1\ndata: {}\n\n')
  await waitFor(() => setUp.noted.length > 0)
  record = { ...record, endpoint: 'http://b:1' }
  t.equal(p.pin(record), true, 'the same upstream session at the endpoint named: taken')
  t.equal(p.stopped, false, 'the GET goes on')
  t.same(p.placement, record, 'read at that endpoint from now on')
  t.equal(p.pin({ upstreamSessionId: 'up-2', endpoint: 'http://b:1' }), false, 'another upstream session is a move, not taken')
  bodies[0]?.end() // the upstream ends its GET: the pump resumes it
  await waitFor(() => requests.length > 1)
  t.equal(requests[1]?.endpoint, 'http://b:1', 'resumed at the endpoint named')
  t.equal(requests[1]?.headers['last-event-id'], 'ev-1', 'from the upstream\'s last event id: the same stream')
  p.stop()
})

t.test('a resume after the record came to name the endpoint keeps the Last-Event-ID, though the pump was not told', async t => {
  const setUp = setup()
  let record: SessionRecord = { epoch: 'e1', principal: 'p', upstreamSessionId: 'up-1' }
  const { p, bodies, requests } = resumingPump(setUp, () => record)
  t.equal(await p.open(), null, 'the GET runs')
  bodies[0]?.write('id: ev-1\ndata: {}\n\n')
  // A request answered by that endpoint named it in the record (McpContext), the pump unaware.
  record = { ...record, endpoint: 'http://b:1' }
  bodies[0]?.end()
  await waitFor(() => requests.length > 1)
  t.equal(requests[1]?.endpoint, 'http://b:1', 'resumed at the endpoint the record names')
  t.equal(requests[1]?.headers['last-event-id'], 'ev-1', 'from the upstream\'s last event id')
  bodies[1]?.write('id: ev-2\ndata: {}\n\n')
  record = { ...record, upstreamSessionId: 'up-2' }
  bodies[1]?.end()
  await waitFor(() => requests.length > 2)
  t.equal(requests[2]?.headers['last-event-id'], undefined, 'a new upstream session never issued it: opened afresh')
  p.stop()
})

/** A pump at `record()` whose upstream answers its GETs (the first, then each resume) with the next of `bodies`, each request kept. */
function resumingPump ({ held, pump }: Setup, record: () => SessionRecord): { p: StandalonePump, bodies: PassThrough[], requests: UpstreamRequest[] } {
  const bodies = [new PassThrough(), new PassThrough(), new PassThrough()]
  const requests: UpstreamRequest[] = []
  const recording = { ...store, async appendBatch (_s: string, _stream: string, batch: EventBatch) { return new NumberedBatch(batch, 1) } } as unknown as EventStore
  const p = pump(held.hold('s', { token: 'T', takeover: false, lastUpstreamId: undefined }), {
    ...recordingFrom(bodies[0] as PassThrough, recording),
    placement: async () => record(),
    upstream: {
      async request (req: UpstreamRequest) {
        requests.push(req)
        return { statusCode: 200, headers: { 'content-type': 'text/event-stream' }, body: bodies[requests.length - 1] }
      }
    } as unknown as UpstreamClient
  })
  return { p, bodies, requests }
}

/** A pump's options to record what `body` carries into `into` (the recorder needs real metrics). */
function recordingFrom (body: PassThrough, into: EventStore): Partial<PumpOptions> {
  return {
    store: into,
    metrics: new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false }),
    upstream: { async request () { return { statusCode: 200, headers: { 'content-type': 'text/event-stream' }, body } } } as unknown as UpstreamClient
  }
}

async function waitFor (check: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !check(); i++) await sleep(5)
}
