// The session hub (src/sessions/session-hub.ts) at moments where two requests of
// one session meet: a standalone client attached while another request's
// opening of the upstream GET runs. Real hub, holder, pumps and leases
// (LocalLeaseBackend); the store and the upstream are stand-ins answering at
// chosen moments.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { PassThrough } from 'node:stream'
import { LeaseCoordinator } from '../../src/cluster/coordinator.js'
import { LocalLeaseBackend } from '../../src/cluster/local-lease-backend.js'
import { SessionHub } from '../../src/sessions/session-hub.js'
import { STANDALONE_STREAM, type EventStore, type SessionRecord } from '../../src/store/contract.js'
import type { UpstreamClient } from '../../src/upstream/client.js'
import type { ClientStream } from '../../src/sse/client-stream.js'
import { silentLog, standInMetrics } from '../fixtures/stand-ins.js'

const log = silentLog
const metrics = standInMetrics
const record: SessionRecord = { epoch: 'e1', principal: 'p', upstreamSessionId: 'up' }
const store = { async getSession () { return record } } as unknown as EventStore

/** What the hub reads of a standalone client: its stream, and its close (recorded). */
function standaloneClient (closes: string[]): ClientStream {
  return { streamId: STANDALONE_STREAM, onClose () {}, end () {}, close (outcome: string) { closes.push(outcome) }, closed: false } as unknown as ClientStream
}

t.test('a standalone client attached while another request opens the upstream GET, which fails: it watches the lease once the opening ends', async t => {
  // The upstream answers the GET 503 after 30 ms: the opening ends without a pump.
  let gets = 0
  const upstream = {
    async request () { gets++; await sleep(30); return { statusCode: 503, headers: {}, body: new PassThrough() } }
  } as unknown as UpstreamClient
  const backend = new LocalLeaseBackend()
  const leases = new LeaseCoordinator({ backend, ttlMs: 3000, holdMs: 1000, log })
  t.teardown(async () => { await leases.close() })
  const hub = new SessionHub({ upstream, store, metrics, log, mcpPath: '/mcp', holdMs: 1000, earlyHoldMs: 1000, maxEventBytes: 1 << 20, maxSessions: 100, upstreamResumes: { withoutProgress: 3, maxMs: 1000 }, standaloneReopenFromLastId: false, leases })
  // The client's GET found the stream held elsewhere (it follows the store); the holder
  // then let go, and a re-establishment's opening started here before the client attached.
  await backend.acquire('s', 'other')
  t.equal(await hub.ensurePump('s', {}, log), null, 'held elsewhere: the client\'s GET goes on to attach')
  await backend.release('s', 'other', false)
  hub.openEarly('s', {}, log)
  const closes: string[] = []
  hub.attachStandalone('s', standaloneClient(closes), {}, log)
  t.equal(leases.watchedCount, 0, 'attached during the opening: not watching yet')
  for (let i = 0; i < 200 && closes.length === 0; i++) await sleep(5)
  t.equal(hub.pumpCount, 0, 'the opening failed (503): no pump here')
  // Watching, it found the lease free and took it for the client: the upstream was asked
  // again, refused again, and the client was told to reconnect (its reconnect passes the
  // refusal on). Unwatched, it would wait on keep-alives for events nobody records.
  t.equal(gets, 2, 'the client\'s watch took the free lease and asked the upstream again')
  t.same(closes, ['upstream_error'], 'refused again: the client is closed, to reconnect')
})

t.test('past MAX_SESSIONS upstream GETs, an initialize\'s early opening or a client GET leaves nothing kept for the session', async t => {
  let gets = 0
  const upstream = { async request () { gets++; return { statusCode: 200, headers: { 'content-type': 'text/event-stream' }, body: new PassThrough() } } } as unknown as UpstreamClient
  const backend = new LocalLeaseBackend()
  const leases = new LeaseCoordinator({ backend, ttlMs: 3000, holdMs: 1000, log })
  t.teardown(async () => { await leases.close() })
  const hub = new SessionHub({ upstream, store, metrics, log, mcpPath: '/mcp', holdMs: 1000, earlyHoldMs: 1000, maxEventBytes: 1 << 20, maxSessions: 0, upstreamResumes: { withoutProgress: 3, maxMs: 1000 }, standaloneReopenFromLastId: false, leases })
  const bigHeaders = { authorization: `Bearer ${'x'.repeat(12_000)}` }
  for (let i = 0; i < 50; i++) hub.openEarly(`s${i}`, bigHeaders, log)
  await t.rejects(hub.ensurePump('g', bigHeaders, log), { code: 'MCPGW_TOO_MANY_SESSIONS' }, 'a client GET is refused (503)')
  await sleep(10)
  t.equal(gets, 0, 'nothing opened upstream')
  t.equal(hub.sessionCount, 0, 'and no session kept here with its headers (each would stay until the session\'s DELETE)')
})

t.test('a takeover whose lease is lost while its GET opens: the client attached watches again once the opening ends', async t => {
  let gets = 0
  // The takeover's GET answers after 50 ms.
  const upstream = {
    async request () { gets++; await sleep(50); return { statusCode: 200, headers: { 'content-type': 'text/event-stream' }, body: new PassThrough() } }
  } as unknown as UpstreamClient
  const backend = new LocalLeaseBackend()
  const leases = new LeaseCoordinator({ backend, ttlMs: 3000, holdMs: 1000, log })
  t.teardown(async () => { await leases.close() })
  const hub = new SessionHub({ upstream, store, metrics, log, mcpPath: '/mcp', holdMs: 1000, earlyHoldMs: 1000, maxEventBytes: 1 << 20, maxSessions: 100, upstreamResumes: { withoutProgress: 3, maxMs: 1000 }, standaloneReopenFromLastId: false, leases })
  t.teardown(() => { hub.dropSession('s') })
  await backend.acquire('s', 'other')
  t.equal(await hub.ensurePump('s', {}, log), null, 'held elsewhere: the client follows the store')
  hub.attachStandalone('s', standaloneClient([]), {}, log)
  t.equal(leases.watchedCount, 1, 'and watches the lease')
  // The holder lets go: the watch takes the lease and the takeover's GET goes out.
  await backend.release('s', 'other', false)
  await leases.tick()
  for (let i = 0; i < 100; i++) {
    if (gets > 0) break
    await sleep(5)
  }
  t.equal(gets, 1, 'the takeover asked the upstream')
  // While its GET opens, another replica takes the lease (this one's lapsed meanwhile).
  backend.forget('s')
  await backend.acquire('s', 'someone-else')
  await leases.tick()
  for (let i = 0; i < 100 && leases.watchedCount === 0; i++) await sleep(5)
  t.equal(hub.pumpCount, 0, 'the takeover\'s pump stopped once its GET opened: its lease was lost')
  t.equal(leases.watchedCount, 1, 'the client watches the lease again, for the next takeover')
})
