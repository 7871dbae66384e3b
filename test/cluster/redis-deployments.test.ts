// The multi-replica resume scenario on each Redis deployment the gateway
// supports besides a plain URL: Redis Cluster (three masters: a session's keys
// share one hash tag, so every script runs in one slot), Sentinel, and a Redis
// reached through its Unix socket.
import t from 'tap'
import { Cluster, Redis } from 'ioredis'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { setTimeout as sleep } from 'node:timers/promises'
import calculateSlot from 'cluster-key-slot'
import { IDLE_RELEASED, isGrant, Lease, type TickResult } from '../../src/cluster/lease.js'
import { LeaseCoordinator } from '../../src/cluster/coordinator.js'
import pino from 'pino'
import { PIPELINE_COMMANDS } from '../../src/store/redis/node-pipelines.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { resumeAcrossReplicas } from '../fixtures/cluster-scenario.js'
import { startRedisCluster, startRedisProcess, startRedisSentinel } from '../fixtures/redis-topologies.js'
import { externalTools } from '../fixtures/external-tools.js'

const ownCluster = await externalTools(['redis-server', 'redis-cli'])
const ownRedis = await externalTools(['redis-server'])

t.test('Redis Cluster (REDIS_CLUSTER_NODES): three masters', { skip: ownCluster.skip }, async (t) => {
  if (!ownCluster.present(t)) return
  const nodes = await startRedisCluster(t)
  await resumeAcrossReplicas(t, {
    label: 'cluster',
    env: { REDIS_CLUSTER_NODES: nodes.map(n => `127.0.0.1:${n.port}`).join(',') }
  })
  const perNode = await Promise.all(nodes.map(async (node) => {
    const admin = new Redis({ port: node.port, host: '127.0.0.1' })
    try {
      const list = await admin.client('LIST') as string
      return list.split('\n').filter(line => / name=mcpgw-/.test(line)).length
    } finally {
      admin.disconnect()
    }
  }))
  t.comment(`cluster: gateway connections per node (3 replicas): ${perNode.join(', ')}`)

  // The store's scripts with a variable number of keys, on Cluster: the lease
  // tick (a call per lease), the audience (joined on subscribe, refreshed one
  // key a call) and the epoch reset after lost writes. ioredis's auto-pipelining
  // routed such a command by its first argument (the number of keys).
  const cluster = nodes.map(n => ({ host: '127.0.0.1', port: n.port }))
  const store = await RedisEventStore.connect({ cluster, keyPrefix: 'deploy:', retention: { maxEvents: 100, maxBytes: 1 << 20, ttlMs: 60_000 }, replicaId: 'r1', audienceRefreshMs: 200 })
  t.teardown(() => store.close())
  const admin = new Cluster(cluster)
  t.teardown(() => admin.disconnect())
  const leases = store.leaseBackend()
  const ids = Array.from({ length: 20 }, (_, i) => `c${i}`)
  for (const id of ids) {
    await store.createSession(id, 'p')
    await leases.acquire(id, `tok-${id}`, 5000)
  }
  await admin.set('deploy:{c3}:lease', 'someone-else')
  await admin.del('deploy:{c7}:m')
  const result = await leases.tick({ ttlMs: 5000, attachedMs: 5000, renew: ids.map(id => ({ sessionId: id, token: `tok-${id}` })), watch: [], aliveMs: 5000 })
  t.same(result.renew, ids.map(id => id === 'c3' ? 'lost' : id === 'c7' ? 'gone' : 'renewed'), 'cluster: each lease its own outcome, in order, across the nodes')
  // Watches in the same tick (sessions whose stream another replica holds): a free lease is taken, a held one is not.
  await admin.del('deploy:{c9}:lease')
  const watched = await leases.tick({ ttlMs: 5000, attachedMs: 5000, renew: [], watch: [{ sessionId: 'c9', token: 'w-c9' }, { sessionId: 'c4', token: 'w-c4' }] })
  t.match(watched.watch[0], { token: 'w-c9' }, 'cluster: a watched session whose lease ran out is taken')
  t.match(watched.watch[1], { heldForMs: Number }, 'cluster: one still held is not')
  t.equal(await admin.get('deploy:{c9}:att'), 'r1', 'cluster: and the attached marker is up')

  // Sessions on every node, subscribed in one turn: their JOINs go out together, as the refresh's do.
  const listened = ids.slice(0, 9)
  for (const id of listened) t.teardown(store.subscribe(id, 's', () => {}))
  const audiences = listened.map(id => `deploy:{${id}}:aud`)
  const until = async (what: string, check: () => Promise<boolean>): Promise<void> => {
    for (let i = 0; i < 100 && !(await check()); i++) await sleep(50)
    t.ok(await check(), what)
  }
  const allJoined = async (): Promise<boolean> => (await Promise.all(audiences.map(async key => await admin.sismember(key, 'r1')))).every(n => n === 1)
  await until('cluster: the replica joins each session\'s audience', allJoined)
  for (const key of audiences) await admin.del(key)
  await until('cluster: and joins them again on the refresh when they were lost', allJoined)

  for (const id of ['r0', 'r1', 'r2', 'r3', 'r4', 'r5']) {
    const before = await store.createSession(id, 'alice')
    await store.append(id, 's', [{ data: 'a' }, { data: 'b' }])
    await store.append(id, 's', [{ data: 'c' }])
    // Redis came back from an older snapshot: the stream is one batch behind.
    await admin.hset(`deploy:{${id}}:m`, 'q:s', 2)
    await admin.xdel(`deploy:{${id}}:b:s`, '3-1')
    const [next] = await store.append(id, 's', [{ data: 'd' }])
    t.ok(next?.seq === 1 && (await store.getSession(id))?.epoch !== before.epoch, `cluster: session ${id} starts a new epoch after lost writes`)
  }

  // A thousand sessions on the three masters, through the gateway's own kind of
  // Cluster connection (auto-pipelining on). Auto-pipelining would send each node
  // a turn's commands as one string, which V8 keeps until a full collection once
  // it is large: the tick and the refresh go in pipelines of PIPELINE_COMMANDS.
  const commands = new Cluster(cluster, { enableAutoPipelining: true })
  const many = new RedisEventStore({ redis: commands, subscriber: new Cluster(cluster), keyPrefix: 'many:', retention: { maxEvents: 100, maxBytes: 1 << 20, ttlMs: 60_000 }, replicaId: 'r2', audienceRefreshMs: 300 })
  t.teardown(() => many.close())
  const manyIds = Array.from({ length: 1000 }, (_, i) => `m${i}`)
  await Promise.all(manyIds.map(async id => await many.createSession(id, 'p')))
  const masters = commands.nodes('master')
  t.equal(masters.length, 3, 'cluster: three masters to write to')
  /** Counts `pattern` in each write to a master (writes without it left out) until stopped. */
  const perWrite = (pattern: RegExp): { counts: () => number[], stop: () => void } => {
    const counts: number[] = []
    const restore = masters.map((node) => {
      const stream = node.stream as unknown as { write: (chunk: unknown, ...rest: unknown[]) => boolean }
      const write = stream.write
      stream.write = function (chunk, ...rest) {
        const n = String(chunk).match(pattern)?.length ?? 0
        if (n > 0) counts.push(n)
        return write.call(this, chunk, ...rest)
      }
      return () => { stream.write = write }
    })
    return { counts: () => [...counts], stop: () => { for (const undo of restore) undo() } }
  }
  const sum = (counts: number[]): number => counts.reduce((a, n) => a + n, 0)
  const manyLeases = many.leaseBackend()
  const renewedIds = manyIds.slice(0, 700)
  const watchedIds = manyIds.slice(700)
  await Promise.all(renewedIds.map(async id => await manyLeases.acquire(id, `tok-${id}`, 5000)))
  const bigTick = async (): Promise<TickResult> => await manyLeases.tick({
    ttlMs: 5000,
    attachedMs: 5000,
    renew: renewedIds.map(id => ({ sessionId: id, token: `tok-${id}` })),
    watch: watchedIds.map(id => ({ sessionId: id, token: `w-${id}` }))
  })
  const tickWrites = perWrite(/\}:(lease|att)\b/g)
  const ticking = bigTick()
  // Before any reply can be read: pipelines sent one after another, each waiting for the
  // replies of the one before, would have written only the first lot by now.
  await new Promise(resolve => { process.nextTick(resolve) })
  const inTheTurn = sum(tickWrites.counts())
  const ticked = await ticking
  t.equal(inTheTurn, renewedIds.length + 2 * watchedIds.length, 'cluster: every renewal and watch of the tick is written before any reply is read (none waits behind a node\'s replies)')
  t.ok(ticked.renew.length === renewedIds.length && ticked.renew.every(r => r === 'renewed'), 'cluster: the 700 leases renewed')
  t.ok(ticked.watch.length === watchedIds.length && ticked.watch.every((w, i) => isGrant(w) && w.token === `w-${watchedIds[i] as string}`), 'cluster: the 300 free leases watched are taken, each its own outcome in order')
  t.equal(await admin.get('many:{m999}:att'), 'r2', 'cluster: with their attached markers')
  await bigTick()
  tickWrites.stop()
  const writes = tickWrites.counts()
  t.ok(sum(writes) === 2 * (renewedIds.length + 2 * watchedIds.length) && Math.max(...writes) <= PIPELINE_COMMANDS,
    `cluster: no write to a node carries more than PIPELINE_COMMANDS of a tick's commands (most: ${Math.max(...writes)}, in ${writes.length} writes for two ticks)`)

  // The audience refresh of the thousand sessions, likewise.
  for (const id of manyIds) t.teardown(many.subscribe(id, 's', () => {}))
  await until('cluster: the thousand sessions\' audiences joined', async () =>
    (await Promise.all(manyIds.filter((_, i) => i % 50 === 0).map(async id => await admin.sismember(`many:{${id}}:aud`, 'r2')))).every(n => n === 1))
  const joinWrites = perWrite(/\}:aud\b/g)
  await until('cluster: a refresh joined them again', async () => sum(joinWrites.counts()) >= 1000)
  joinWrites.stop()
  const joins = joinWrites.counts()
  t.ok(Math.max(...joins) <= PIPELINE_COMMANDS, `cluster: no write to a node carries more than PIPELINE_COMMANDS of the refresh (most: ${Math.max(...joins)}, in ${joins.length} writes)`)

  // ioredis sends a pipeline's commands again after some replies; a release issued
  // meanwhile waits for the tick, or the renewal sent again behind the release's DEL
  // would take the lease back (held by nobody for a TTL, a takeover for the next holder).
  // After NOSCRIPT (the scripts flushed): each call is sent again on its own.
  // Through the leases' own coordinator, as the gateway takes and lets them go.
  const coordinator = new LeaseCoordinator({ backend: manyLeases, ttlMs: 5000, holdMs: 60_000, log: pino({ level: 'silent' }) })
  t.teardown(async () => { await coordinator.close() })
  const raced = ['q0', 'q1', 'q2', 'q3', 'q4', 'q5']
  const racedLeases: Lease[] = []
  for (const id of raced) {
    await many.createSession(id, 'p')
    const lease = await coordinator.acquire(id)
    if (!(lease instanceof Lease)) throw new Error(`lease of ${id} not taken: ${lease}`)
    racedLeases.push(lease)
  }
  await coordinator.tick()
  for (const node of nodes) {
    const direct = new Redis({ port: node.port, host: '127.0.0.1' })
    await direct.script('FLUSH')
    direct.disconnect()
  }
  const flushedTick = coordinator.tick()
  const releases = await Promise.all(racedLeases.map(async lease => await lease.releaseIfIdle()))
  await flushedTick
  t.same(releases, raced.map(() => IDLE_RELEASED), 'cluster: releases issued while a tick\'s scripts are sent again are released')
  t.same(await Promise.all(raced.map(async id => await admin.get(`many:{${id}}:lease`))), raced.map(() => null), 'cluster: and no lease is taken back by a renewal sent again after NOSCRIPT')

  // After CLUSTERDOWN (the session's slot unserved for a moment): the whole pipeline is
  // sent again 100 ms later. Last in this test: it takes the Cluster down.
  const downId = 'q6'
  await many.createSession(downId, 'p')
  const downLease = await coordinator.acquire(downId)
  if (!(downLease instanceof Lease)) throw new Error(`lease of ${downId} not taken: ${downLease}`)
  const downSlot = calculateSlot(`many:{${downId}}:m`)
  const [downHost, downPort] = (admin.slots[downSlot]?.[0] ?? '').split(':')
  const owner = new Redis({ host: downHost, port: Number(downPort) })
  t.teardown(() => owner.disconnect())
  const clusterState = async (state: string): Promise<void> => {
    for (let i = 0; i < 200 && !((await owner.cluster('INFO')) as string).includes(`cluster_state:${state}`); i++) await sleep(5)
  }
  await owner.cluster('DELSLOTS', downSlot)
  await clusterState('fail')
  const downTick = coordinator.tick()
  await sleep(15)
  await owner.cluster('ADDSLOTS', downSlot)
  await clusterState('ok')
  const downRelease = await downLease.releaseIfIdle()
  await downTick
  t.equal(downRelease, IDLE_RELEASED, 'cluster: a release issued while a tick waits out CLUSTERDOWN is released')
  t.equal(await admin.get(`many:{${downId}}:lease`), null, 'cluster: and its lease is not taken back by the renewal sent again')
})

t.test('Redis Sentinel (REDIS_SENTINELS, REDIS_SENTINEL_NAME)', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const { sentinel, name } = await startRedisSentinel(t)
  await resumeAcrossReplicas(t, {
    label: 'sentinel',
    env: { REDIS_SENTINELS: `127.0.0.1:${sentinel.port}`, REDIS_SENTINEL_NAME: name }
  })
})

t.test('A Unix socket (REDIS_URL=unix://...), with a password and a database number', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const dir = mkdtempSync(join(tmpdir(), 'mcpgw-sock-'))
  t.teardown(() => rmSync(dir, { recursive: true, force: true }))
  const socket = join(dir, 'redis.sock')
  const server = await startRedisProcess(t, ['--unixsocket', socket, '--unixsocketperm', '700'], 'unix')
  // The password only now: the fixture checks the server is up with a plain PING.
  const admin = new Redis({ port: server.port, host: '127.0.0.1' })
  t.teardown(() => admin.disconnect())
  await admin.config('SET', 'requirepass', 's:cret')
  await admin.auth('s:cret')

  await resumeAcrossReplicas(t, {
    label: 'unix',
    env: { REDIS_URL: `unix://:${encodeURIComponent('s:cret')}@localhost${socket}?db=3` }
  })
  const clients = (await admin.client('LIST') as string).split('\n').filter(line => / name=mcpgw-/.test(line))
  t.ok(clients.length >= 6, `the replicas' connections are up (${clients.length})`)
  t.ok(clients.every(line => /\bflags=\S*U/.test(line) && / db=3 /.test(line)), 'every one through the socket (flag U), on database 3')
  const [db0, db3] = [await admin.select(0).then(async () => await admin.dbsize()), await admin.select(3).then(async () => await admin.dbsize())]
  t.ok(db0 === 0 && db3 > 0, `the sessions are in database 3 (${db3} keys; database 0: ${db0})`)
})
