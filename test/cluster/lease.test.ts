// The lease on a session's upstream GET, in process: the Redis primitives
// (acquire, renew, release, fencing, the attached marker, the batched tick),
// the store's detection of lost acknowledged writes, and two gateways on one
// Redis (hold across replicas, drain handover).
import t from 'tap'
import type { Test } from 'tap'
import type { FastifyBaseLogger } from 'fastify'
import { Redis } from 'ioredis'
import { pino } from 'pino'
import { request } from 'undici'
import { createParser } from 'eventsource-parser'
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { LeaseCoordinator, type Lease } from '../../src/cluster/coordinator.js'
import { isGrant, type ControlSubscription, type LeaseGrant } from '../../src/cluster/lease.js'
import { LocalLeaseBackend } from '../../src/cluster/local-lease-backend.js'
import { LeaseLostError } from '../../src/errors.js'
import { buildGateway, type Gateway } from '../../src/server.js'
import { RENEW_PER_CALL } from '../../src/store/redis/lease-backend.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { COMMANDS } from '../../src/store/redis/lua.js'
import { STANDALONE_STREAM, type RetentionLimits, type StreamNotice } from '../../src/store/contract.js'
import { testConfig } from '../fixtures/gateway.js'
import { writtenChunks } from '../fixtures/net.js'
import { waitUntil } from '../fixtures/mcp-client.js'
import { useRedis, type TestRedis } from '../fixtures/redis.js'

const RETENTION: RetentionLimits = { maxEvents: 1000, maxBytes: 1024 * 1024, ttlMs: 60_000 }

async function storeFor (t: Test, env: TestRedis): Promise<RedisEventStore> {
  const store = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention: RETENTION })
  t.teardown(() => store.close())
  return store
}

function grant (result: unknown): LeaseGrant {
  if (!isGrant(result as never)) throw new Error(`not granted: ${JSON.stringify(result)}`)
  return result as LeaseGrant
}

t.test('redis lease primitives', async (t) => {
  const env = await useRedis(t, 'lease')
  const a = await storeFor(t, env)
  const b = await storeFor(t, env)
  const la = a.leaseBackend()
  const lb = b.leaseBackend()
  await a.createSession('s1', 'p')

  t.equal(await la.acquire('nope', 'x', 1000), 'gone', 'unknown session')
  const first = grant(await la.acquire('s1', 'A1', 1000))
  t.same(first, { token: 'A1', takeover: false, lastUpstreamId: undefined }, 'a first holder: no takeover')
  const held = await lb.acquire('s1', 'B1', 1000)
  t.ok(typeof held === 'object' && 'heldForMs' in held && held.heldForMs > 0 && held.heldForMs <= 1000, 'held elsewhere, with the time it still lives')

  // Fencing: appends under the lease token pass, under another one they are refused.
  await a.append('s1', 's', [{ data: 'one', upstreamId: 'u-1' }], { fence: 'A1' })
  await t.rejects(b.append('s1', 's', [{ data: 'stale' }], { fence: 'B0' }), LeaseLostError, 'a stale token is fenced off')
  t.equal((await a.state('s1', 's'))?.lastSeq, 1, 'nothing written by the fenced append')

  // Release (live: the stream did not end cleanly) is announced; the next holder knows.
  const heard: string[] = []
  const sub = lb.subscribeControl('s1', (m) => heard.push(m.kind))
  await sub.ready
  t.equal(await la.release('s1', 'A1', true), true)
  t.ok(await waitUntil(() => heard.includes('released'), 2000), 'the release is published on the session channel')
  sub.off()
  const second = grant(await lb.acquire('s1', 'B1', 5000)) // outlives the attached marker below
  t.same(second, { token: 'B1', takeover: true, lastUpstreamId: 'u-1' }, 'takeover after a live release, with the upstream\'s last id')
  t.equal(await la.release('s1', 'A1', false), false, 'a release under a lost token does nothing')

  // Hold: a client attached on another replica keeps the stream held.
  // 1.5 s, not less: both calls must come back before the marker runs out, on a slow machine too.
  await la.markAttached('s1', 1500)
  const kept = await lb.releaseIfIdle('s1', 'B1')
  const wait = kept.kind === 'attached' ? kept.askAgainMs : 0
  t.ok(wait > 0 && wait <= 1500, `released only when no client is attached (ask again in ${wait} ms)`)
  await sleep(wait + 20)
  t.same(await lb.releaseIfIdle('s1', 'B1'), { kind: 'released' }, 'released once the marker expired')
  t.same(grant(await la.acquire('s1', 'A2', 1000)).takeover, false, 'a clean release owes no gap')

  // Renewal: one pipeline; a lease that expired unclaimed is taken back; a lost one is reported.
  await a.createSession('s2', 'p')
  const tick = await la.tick({ ttlMs: 1000, attachedMs: 500, renew: [{ sessionId: 's1', token: 'A2' }, { sessionId: 's2', token: 'A9' }, { sessionId: 'nope', token: 'x' }], watch: [] })
  t.same(tick.renew, ['renewed', 'renewed', 'gone'], 'renewed, taken back when free, gone')
  const lost = await lb.tick({ ttlMs: 1000, attachedMs: 500, renew: [{ sessionId: 's1', token: 'B1' }], watch: [{ sessionId: 's2', token: 'B2' }] })
  t.same(lost.renew, ['lost'], 'a lease another replica holds is lost')
  t.ok(!isGrant(lost.watch[0] as never), 'a watched lease held elsewhere stays there')
  t.ok(await env.redis.pttl(`${env.prefix}{s2}:att`) > 0, 'the watcher\'s attached marker is up')
})

t.test('redis tick: a few script calls for a thousand leases, each written on its own', async (t) => {
  const env = await useRedis(t, 'tick')
  const redis = new Redis(env.url)
  const subscriber = new Redis(env.url)
  const store = new RedisEventStore({ redis, subscriber, keyPrefix: env.prefix, retention: RETENTION })
  t.teardown(() => store.close())
  const leases = store.leaseBackend()
  const ids = Array.from({ length: 1000 }, (_, i) => `t${i}`)
  await Promise.all(ids.map(async (id) => await store.createSession(id, 'p')))
  await Promise.all(ids.map(async (id) => await leases.acquire(id, `tok-${id}`, 5000)))
  // Outcomes other than 'renewed' on both sides of the script calls' boundaries (RENEW_PER_CALL leases each).
  const expected = ids.map((): string => 'renewed')
  for (const i of [RENEW_PER_CALL - 1, RENEW_PER_CALL, 999]) {
    await env.redis.del(`${env.prefix}{t${i}}:m`)
    expected[i] = 'gone'
  }
  for (const i of [0, 2 * RENEW_PER_CALL]) {
    await env.redis.set(`${env.prefix}{t${i}}:lease`, 'someone-else')
    expected[i] = 'lost'
  }
  // Expired unclaimed: taken back, which counts as renewed.
  await env.redis.del(`${env.prefix}{t${2 * RENEW_PER_CALL + 1}}:lease`)
  let commands = 0
  const connection = redis as unknown as { sendCommand: (...args: unknown[]) => unknown }
  const sendCommand = connection.sendCommand.bind(connection)
  connection.sendCommand = (...args: unknown[]) => {
    commands++
    return sendCommand(...args)
  }
  const chunks = writtenChunks(redis.stream)
  const result = await leases.tick({ ttlMs: 5000, attachedMs: 5000, renew: ids.map((id) => ({ sessionId: id, token: `tok-${id}` })), watch: [], aliveMs: 5000 })
  connection.sendCommand = sendCommand
  t.same(result.renew, expected, 'each lease its own outcome, in order')
  t.equal(await env.redis.get(`${env.prefix}{t${2 * RENEW_PER_CALL + 1}}:lease`), `tok-t${2 * RENEW_PER_CALL + 1}`, 'the expired lease is held again')
  t.ok(await env.redis.pttl(`${env.prefix}{t5}:lease`) > 4000, 'a renewed lease lives its full time again')
  // Not one pipeline: ioredis joins a pipeline into one string, megabytes for
  // thousands of sessions, which V8 keeps until a full collection.
  const written = chunks()
  const calls = Math.ceil(1000 / RENEW_PER_CALL)
  t.equal(written.length, calls + 1, `${calls} script calls written one by one, then the pipeline of the rest`)
  const total = written.reduce((sum, n) => sum + n, 0)
  t.ok(Math.max(...written) < 2 * total / calls, `no write holds two calls' leases (bytes: ${written.join(', ')})`)
  // A session id with the characters its key escapes (a brace would move the hash tag).
  const odd = 'a{b}%c'
  await store.createSession(odd, 'p')
  const grant = await leases.acquire(odd, 'tok-odd', 5000)
  t.ok(isGrant(grant), 'a session id with braces: its lease taken')
  t.same((await leases.tick({ ttlMs: 5000, attachedMs: 5000, renew: [{ sessionId: odd, token: 'tok-odd' }], watch: [] })).renew, ['renewed'], 'and renewed by the tick (the same keys)')
  // Ticks keep their argument buffers for the next; one that overlaps another must not write into them.
  const renewals = (from: number, to: number, token: (id: string) => string): Array<{ sessionId: string, token: string }> =>
    ids.slice(from, to).map(id => ({ sessionId: id, token: token(id) }))
  const [mine, others] = await Promise.all([
    leases.tick({ ttlMs: 5000, attachedMs: 5000, renew: renewals(300, 600, id => `tok-${id}`), watch: [] }),
    leases.tick({ ttlMs: 5000, attachedMs: 5000, renew: renewals(600, 700, () => 'not-the-holder'), watch: [] })
  ])
  t.same(mine.renew, expected.slice(300, 600), 'two ticks at once: the first its own outcomes')
  t.same(others.renew, ids.slice(600, 700).map((_, i) => expected[600 + i] === 'gone' ? 'gone' : 'lost'), 'and the second its own')
  t.same((await leases.tick({ ttlMs: 5000, attachedMs: 5000, renew: renewals(1, 3, id => `tok-${id}`), watch: [] })).renew, ['renewed', 'renewed'], 'fewer leases the next tick')
  t.ok(await env.redis.pttl(`${env.prefix}r:${leases.replicaId}:alive`) > 4000, 'the rest: the liveness mark is up')
  t.equal(commands, Math.ceil(1000 / RENEW_PER_CALL) + 1, `in ${Math.ceil(1000 / RENEW_PER_CALL)} script calls (and the liveness mark's SET), not one per lease`)
})

t.test('lost acknowledged writes are detected: a new epoch, never wrong events', async (t) => {
  const env = await useRedis(t, 'rollback')
  const store = await storeFor(t, env)
  const before = await store.createSession('r1', 'alice')
  await store.append('r1', 's', [{ data: 'a' }, { data: 'b' }])
  await store.append('r1', 's', [{ data: 'c' }])
  const notices: StreamNotice[] = []
  const off = store.subscribe('r1', 's', (n) => notices.push(n))
  t.teardown(off)
  // Redis comes back from an older snapshot: the stream is one batch behind.
  await env.redis.hset(`${env.prefix}{r1}:m`, 'q:s', 2)
  t.equal(await env.redis.xdel(`${env.prefix}{r1}:b:s`, '3-1'), 1, 'the batch holding event 3 is gone')
  const [next] = await store.append('r1', 's', [{ data: 'd' }])
  const record = await store.getSession('r1')
  t.not(record?.epoch, before.epoch, 'the session starts a new epoch')
  t.equal(record?.principal, 'alice', 'bound to the same principal')
  t.equal(next?.seq, 1, 'numbered from 1 in the new epoch')
  t.same((await store.read('r1', 's', 0, 10))?.events.map((e) => e.data), ['d'], 'nothing of the untrustworthy history')
  t.equal(notices.at(-1)?.epoch, record?.epoch, 'followers are told the new epoch')

  // Another replica writing another stream of the session does not rotate it again.
  const other = await storeFor(t, env)
  await other.createSession('r2', 'bob')
  await other.append('r2', 'req1', [{ data: 'x' }])
  await store.append('r2', 's', [{ data: 'y' }])
  await env.redis.hset(`${env.prefix}{r2}:m`, 'q:s', 0)
  await store.append('r2', 's', [{ data: 'z' }])
  const rotated = (await store.getSession('r2'))?.epoch
  const [after] = await other.append('r2', 'req1', [{ data: 'w' }])
  t.equal((await store.getSession('r2'))?.epoch, rotated, 'one new epoch, not one per writer')
  t.equal(after?.seq, 1, 'the other writer goes on in the new epoch')
})

t.test('a batch resent after a reconnect is not appended twice', async (t) => {
  const env = await useRedis(t, 'resend')
  const redis = new Redis(env.url)
  const subscriber = new Redis(env.url)
  const store = new RedisEventStore({ redis, subscriber, keyPrefix: env.prefix, retention: RETENTION })
  t.teardown(() => store.close())
  await store.createSession('d1', 'p')
  await store.append('d1', 's', [{ data: 'a' }])
  // ioredis resends a command in flight when its connection drops: the same script call twice.
  const tag = `${env.prefix}{d1}`
  const epoch = (await store.getSession('d1'))?.epoch as string
  const args = [`${tag}:m`, `${tag}:b:s`, `${tag}:lease`, `${tag}:z:s`, `${tag}:aud`, 's', 1000, 1024 * 1024, 60_000, '0', `${tag}:n`, 'replica', '', 1, epoch, '', 'd1', '', 1, 1, '0 1 0 0 ', 'b']
  const append = async (...a: Array<string | number>): Promise<unknown[]> => await redis.eval(COMMANDS.append.lua, 5, ...a) as unknown[]
  const first = await append(...args)
  const again = await append(...args)
  t.same(first.slice(1, 4), [1, 0, 0], 'applied after seq 1')
  t.same(again.slice(1, 4), [1, 0, 1], 'the resend is recognised as applied')
  t.same((await store.read('d1', 's', 0, 10))?.events.map((e) => e.data), ['a', 'b'], 'stored once')
  await env.redis.hset(`${tag}:m`, 'q:s', 5)
  t.same((await append(...args)).slice(1, 4), [5, 0, 0], 'a stream ahead of the writer (another writer) is appended to')
})

t.test('a release heard while a tick is at Redis is acted on: the tick may have found the lease held just before', async (t) => {
  const env = await useRedis(t, 'lease-release-in-tick')
  const a = await storeFor(t, env)
  const b = await storeFor(t, env)
  await a.createSession('s1', 'p')
  const la = a.leaseBackend()
  grant(await la.acquire('s1', 'A1', 60_000))

  // B's backend, instrumented: acquires counted, the tick's reply held back at a gate, control messages heard.
  const lb = b.leaseBackend()
  const acquire = lb.acquire.bind(lb)
  const tick = lb.tick.bind(lb)
  const subscribe = lb.subscribeControl.bind(lb)
  let acquires = 0
  let tickAnswered = false
  let open = (): void => {}
  const gate = new Promise<void>(resolve => { open = resolve })
  const heard: string[] = []
  let control: ControlSubscription | undefined
  lb.acquire = async (...args) => await acquire(...args).finally(() => { acquires++ })
  lb.tick = async (request) => {
    const result = await tick(request)
    tickAnswered = true
    await gate
    return result
  }
  lb.subscribeControl = (sessionId, listener) => (control = subscribe(sessionId, message => { heard.push(message.kind); listener(message) }))

  // Ticks every 10 s (a third of the TTL), none started: only the watch's own tries can take the lease.
  const coordinator = new LeaseCoordinator({ backend: lb, ttlMs: 30_000, holdMs: 0, log: pino({ level: 'silent' }) as unknown as FastifyBaseLogger })
  t.teardown(() => coordinator.close())
  const granted: Lease[] = []
  coordinator.watch('s1', { onGrant: lease => granted.push(lease), onGone: () => {} })
  await control?.ready
  t.ok(await waitUntil(() => acquires === 1, 2000), 'the watch\'s first try is back: held (for 60 s, past the next tick: no retry timer)')
  await nextTurn() // the coordinator's own callbacks for it have run: the watch is not acquiring any more

  const ticking = coordinator.tick()
  t.ok(await waitUntil(() => tickAnswered, 2000), 'the tick has tried the watched lease: held')
  t.equal(await la.release('s1', 'A1', true), true, 'A lets go while the tick\'s reply is on its way')
  t.ok(await waitUntil(() => heard.includes('released'), 2000), 'B hears the release before the tick settles')
  t.equal(granted.length, 0, 'nothing taken yet')
  open()
  await ticking
  t.ok(await waitUntil(() => granted.length === 1, 2000), 'B takes the stream as soon as the tick settles, not at the next tick 10 s later')
  t.equal(granted[0]?.takeover, true, 'as a takeover of a live release')
})

t.test('reacquire: a lease the store lost with the session is ours again at once, with its token, before another replica can take it', async (t) => {
  const env = await useRedis(t, 'lease-reacquire')
  const a = await storeFor(t, env)
  const b = await storeFor(t, env)
  await a.createSession('s1', 'p')
  const log = pino({ level: 'silent' }) as unknown as FastifyBaseLogger
  const coordinator = new LeaseCoordinator({ backend: a.leaseBackend(), ttlMs: 30_000, holdMs: 0, log })
  t.teardown(() => coordinator.close())
  const held = await coordinator.acquire('s1')
  if (typeof held === 'string') throw new Error(`not granted: ${held}`)

  // The store loses the session (its lease with it), and a request records it again.
  const lose = async (id: string): Promise<void> => { await env.redis.del(...await env.redis.keys(`${env.prefix}{${id}}*`)) }
  await lose('s1')
  t.equal(await coordinator.reacquire(held), 'gone', 'while the session is unknown: gone')
  await a.adoptSession('s1', 'p', { confirmation: 'pending' })
  t.equal(await coordinator.reacquire(held), held, 'once recorded again, still held here: the same lease')
  const other = await b.leaseBackend().acquire('s1', 'B1', 30_000)
  t.ok(typeof other === 'object' && 'heldForMs' in other, 'another replica finds it held at once, not free until the next renewal')
  t.equal(await env.redis.get(`${env.prefix}{s1}:lease`), held.token, 'under the same token: the appends fenced with it stay valid')

  // Let go here meanwhile (a renewal found it gone): a lease under the same token.
  held.lose('gone')
  await lose('s1')
  await a.adoptSession('s1', 'p', { confirmation: 'pending' })
  const again = await coordinator.reacquire(held)
  t.ok(typeof again !== 'string' && again !== held && again.token === held.token && !again.settled, 'a new lease, same token, held and renewed from now on')

  // Another replica took it first: held.
  await lose('s1')
  await a.adoptSession('s1', 'p', { confirmation: 'pending' })
  grant(await b.leaseBackend().acquire('s1', 'B2', 30_000))
  t.equal(await coordinator.reacquire(held), 'held', 'held elsewhere: not taken from it')
})

t.test('a session recorded again for the holder of its open upstream GET comes with the lease: never free for a watching replica', async (t) => {
  const env = await useRedis(t, 'lease-adopt-hold')
  const a = await storeFor(t, env)
  const b = await storeFor(t, env)
  const lease = (id: string): string => `${env.prefix}{${id}}:lease`

  // Lost and recorded again by the holder: the lease is the holder's in the same step.
  await a.adoptSession('s1', 'p', { hold: { token: 'A1', ttlMs: 30_000 }, confirmation: 'confirmed' })
  t.equal(await env.redis.get(lease('s1')), 'A1', 'held under the holder\'s token')
  const ttl = await env.redis.pttl(lease('s1'))
  t.ok(ttl > 25_000 && ttl <= 30_000, `for the lease's time to live (${ttl} ms)`)
  t.equal(await env.redis.hget(`${env.prefix}{s1}:m`, `h:${STANDALONE_STREAM}`), '1', 'its GET marked live: a next holder after a crash marks the gap')
  const watcher = await b.leaseBackend().acquire('s1', 'B1', 30_000)
  t.ok(typeof watcher === 'object' && 'heldForMs' in watcher, 'a watching replica finds it held')

  // Recorded again first by a request (no hold): the holder's own recording takes the free lease.
  await a.adoptSession('s2', 'p', { confirmation: 'pending' })
  t.equal(await env.redis.get(lease('s2')), null, 'a request\'s recording takes no lease')
  t.equal((await a.adoptSession('s2', 'p', { hold: { token: 'A2', ttlMs: 30_000 }, confirmation: 'confirmed' }))?.created, false, 'the holder finds the record')
  t.equal(await env.redis.get(lease('s2')), 'A2', 'and takes the free lease with it')
  t.equal((await a.adoptSession('s2', 'p', { hold: { token: 'A3', ttlMs: 30_000 }, confirmation: 'confirmed' }))?.created, false, 'a second holder finds it too')
  t.equal(await env.redis.get(lease('s2')), 'A2', 'and leaves the lease to the first')

  // Recorded for another principal: nothing taken.
  await a.adoptSession('s3', 'other', { confirmation: 'pending' })
  t.equal((await a.adoptSession('s3', 'p', { hold: { token: 'A4', ttlMs: 30_000 }, confirmation: 'confirmed' }))?.record.principal, 'other', 'another principal\'s record')
  t.equal(await env.redis.get(lease('s3')), null, 'its lease not taken')
})

t.test('a tick sent while a release-if-idle is at Redis leaves that lease out: a renewal behind the release would take it back', async (t) => {
  const env = await useRedis(t, 'lease-release-idle-tick')
  const a = await storeFor(t, env)
  await a.createSession('s1', 'p')
  await a.createSession('s2', 'p')
  const coordinator = new LeaseCoordinator({ backend: a.leaseBackend(), ttlMs: 30_000, holdMs: 0, log: pino({ level: 'silent' }) as unknown as FastifyBaseLogger })
  t.teardown(() => coordinator.close())
  const held = await coordinator.acquire('s1')
  const other = await coordinator.acquire('s2')
  if (typeof held === 'string' || typeof other === 'string') throw new Error('not granted')
  // The release goes out first; the tick, started before its reply, goes out behind it on the same connection.
  const releasing = held.releaseIfIdle()
  t.notOk(held.renewable, 'while the release is at Redis, ticks leave the lease out')
  await coordinator.tick()
  t.same(await releasing, { kind: 'released' }, 'released: no client attached anywhere')
  t.equal(await env.redis.get(`${env.prefix}{s1}:lease`), null, 'and not taken back by the tick')
  t.ok(held.settled, 'the lease is settled here')
  t.equal(await env.redis.get(`${env.prefix}{s2}:lease`), other.token, 'the other lease, renewed by the same tick, is still held')
  t.ok(await env.redis.pttl(`${env.prefix}{s2}:lease`) > 25_000, 'with its full time')

  // Kept (a client attached on another replica): renewed again from the next tick.
  await a.leaseBackend().markAttached('s2', 60_000)
  t.match(await other.releaseIfIdle(), { kind: 'attached' }, 'a client attached elsewhere keeps it')
  t.ok(other.renewable && !other.settled, 'held again, renewed by the next tick')
})

t.test('local lease backend (embedded store, one process)', async (t) => {
  const local = new LocalLeaseBackend()
  const first = grant(await local.acquire('x', 'k1'))
  t.equal(first.takeover, false)
  const held = await local.acquire('x', 'k2')
  t.notOk(isGrant(held), 'held while held')
  local.noteUpstreamId('x', 'up-7')
  t.equal(await local.release('x', 'k1', true), true)
  t.same(grant(await local.acquire('x', 'k3')), { token: 'k3', takeover: true, lastUpstreamId: 'up-7' })
  t.same(await local.releaseIfIdle('x', 'k3'), { kind: 'released' })
  t.same(await local.releaseIfIdle('x', 'k3'), { kind: 'lost' }, 'no longer held under the token')
  t.same((await local.tick({ ttlMs: 1, attachedMs: 1, renew: [{ sessionId: 'x', token: 'k3' }], watch: [{ sessionId: 'y', token: 'k4' }] })).renew, ['lost'])
  // The session moved to another upstream session: the old one's last id is forgotten.
  local.noteUpstreamId('x', '')
  t.equal(grant(await local.acquire('x', 'k5')).lastUpstreamId, undefined, 'after a move: no id to resume the new upstream session from')
})

// ---------------------------------------------------------------------------
// Two gateways on one Redis

interface SseReader { events: Array<{ id?: string, event?: string, data: string }>, status: number, abort: () => void }

async function openSse (url: string, headers: Record<string, string>): Promise<SseReader> {
  const controller = new AbortController()
  const res = await request(url, { method: 'GET', headers: { accept: 'text/event-stream', ...headers }, signal: controller.signal })
  const reader: SseReader = { events: [], status: res.statusCode, abort: () => controller.abort() }
  const parser = createParser({ onEvent: (e) => { reader.events.push({ data: e.data, ...(e.id !== undefined && { id: e.id }), ...(e.event !== undefined && { event: e.event }) }) } })
  res.body.on('data', (chunk: Buffer) => parser.feed(chunk.toString()))
  res.body.on('error', () => {})
  return reader
}

function broadcastSeqs (reader: SseReader): number[] {
  return reader.events.flatMap((e) => {
    if (e.data === '' || (e.event !== undefined && e.event !== 'message')) return []
    const data = (JSON.parse(e.data) as { params?: { data?: { tool?: string, seq?: number } } }).params?.data
    return data?.tool === 'broadcast' && typeof data.seq === 'number' ? [data.seq] : []
  })
}

async function twoGateways (t: Test, env: Record<string, string>): Promise<{ g1: Gateway, g2: Gateway, url1: string, url2: string, redis: TestRedis }> {
  const redis = await useRedis(t, 'two')
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const config = testConfig(upstream.url, env)
  const start = async (): Promise<[Gateway, string]> => {
    const store = await RedisEventStore.connect({ url: redis.url, keyPrefix: redis.prefix, retention: config.retention })
    const gateway = await buildGateway(config, { store, logger: pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' }) })
    const { url } = await gateway.listen()
    t.teardown(() => gateway.close())
    return [gateway, `${url}/mcp`]
  }
  const [[g1, url1], [g2, url2]] = await Promise.all([start(), start()])
  return { g1, g2, url1, url2, redis }
}

async function initialize (url: string): Promise<Record<string, string>> {
  const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18' }
  const init = await request(url, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'lease-test', version: '0' } } }) })
  await init.body.text()
  const session = { ...headers, 'mcp-session-id': init.headers['mcp-session-id'] as string }
  await (await request(url, { method: 'POST', headers: session, body: '{"jsonrpc":"2.0","method":"notifications/initialized"}' })).body.text()
  return session
}

async function broadcast (url: string, session: Record<string, string>, count: number, intervalMs: number): Promise<void> {
  const res = await request(url, { method: 'POST', headers: session, body: JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'broadcast', arguments: { count, intervalMs } } }) })
  await res.body.text()
}

t.test('the holder keeps the upstream GET while a client is attached on another replica', async (t) => {
  const { g1, g2, url1, url2 } = await twoGateways(t, { STANDALONE_HOLD_SECONDS: '1', LEASE_TTL_MS: '600' })
  const session = await initialize(url1)
  const first = await openSse(url1, session)
  t.ok(await waitUntil(() => g1.hub.pumpCount === 1, 2000), 'the first GET holds the stream on G1')
  first.abort()
  const moved = await openSse(url2, session)
  t.equal(moved.status, 200)
  await sleep(2500) // more than the hold, several ticks
  t.equal(g1.hub.pumpCount, 1, 'G1 still holds the upstream GET (its own clients: none)')
  t.equal(g2.hub.pumpCount, 0, 'G2 follows the store')
  await broadcast(url2, session, 20, 1)
  t.ok(await waitUntil(() => broadcastSeqs(moved).length === 20, 3000), 'events G1 records reach the client on G2')
  moved.abort()
  t.ok(await waitUntil(() => g1.hub.pumpCount === 0, 5000), 'once no client is attached anywhere for the hold, G1 releases the stream')
})

t.test('drain hands the upstream GET to the replica that asks, with a small, marked gap', async (t) => {
  const { g1, g2, url1, url2 } = await twoGateways(t, { DRAIN_SPREAD_SECONDS: '0', LEASE_TTL_MS: '5000' })
  const session = await initialize(url1)
  const onG1 = await openSse(url1, session)
  t.ok(await waitUntil(() => g1.hub.pumpCount === 1, 2000), 'G1 holds the stream')
  const onG2 = await openSse(url2, session)
  await sleep(100)
  await broadcast(url1, session, 400, 5)
  t.ok(await waitUntil(() => broadcastSeqs(onG2).length >= 50, 5000), 'flowing')
  const started = Date.now()
  const draining = g1.drain()
  t.ok(await waitUntil(() => g2.hub.pumpCount === 1, 3000), 'G2 took the stream over')
  // At once, on G2's request: not once the drain has waited for the broadcast call in flight.
  const atTakeover = broadcastSeqs(onG2).length
  t.ok(atTakeover < 300, `while the broadcast was still running (${atTakeover} of 400 events delivered)`)
  await draining
  const drainMs = Date.now() - started
  t.ok(await waitUntil(() => broadcastSeqs(onG2).includes(399), 10_000), 'the broadcast runs to its end on G2')
  const seqs = broadcastSeqs(onG2)
  const lost = 400 - new Set(seqs).size
  const gaps = onG2.events.filter((e) => e.event === 'gateway-gap').map((e) => (JSON.parse(e.data) as { reason: string }).reason)
  t.comment(`handover: drain took ${drainMs} ms; ${lost} of 400 broadcast events (5 ms apart) lost in the handover, gap markers [${gaps.join(', ')}]`)
  t.same(gaps, ['upstream_handover'], 'one handover gap marker')
  t.ok(lost <= 20, 'a small gap')
  t.ok(onG1.events.length > 0, 'G1\'s client had been served')
})

t.test('fencing: a holder whose lease was taken stops recording at once and closes its upstream GET', async (t) => {
  const { g1, g2, url1, url2, redis } = await twoGateways(t, { LEASE_TTL_MS: '1500' })
  const session = await initialize(url1)
  const sessionId = session['mcp-session-id'] as string
  const onG1 = await openSse(url1, session)
  t.ok(await waitUntil(() => g1.hub.pumpCount === 1, 2000), 'G1 holds the stream')
  const onG2 = await openSse(url2, session)
  t.equal(onG2.status, 200)
  // Another holder appears under G1 (say a partition healed the wrong way).
  await redis.redis.set(`${redis.prefix}{${sessionId}}:lease`, 'intruder.token', 'PX', 1500)
  await broadcast(url1, session, 50, 5)
  t.ok(await waitUntil(() => g1.hub.pumpCount === 0, 3000), 'G1 stopped its upstream GET (fenced)')
  const recorded = await g1.store.state(sessionId, 's')
  t.equal(recorded?.lastSeq ?? 0, 0, 'nothing recorded under the lost lease')
  t.ok(await waitUntil(() => g1.hub.pumpCount + g2.hub.pumpCount === 1, 5000), 'once the intruder\'s lease expires, a replica with a client takes the stream over')
  t.equal(onG1.status, 200)
})
