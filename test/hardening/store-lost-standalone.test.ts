// Redis emptied while the gateway holds a session's upstream GET (the standalone
// stream), with a store-less SDK server upstream and the SDK client with its default
// options. The upstream GET stays open: the pump records the session again for the
// principal of its last record and goes on in the new epoch (src/sessions/standalone-pump.ts,
// #recoverOnce). Had it stopped, the SDK server would have dropped everything it sent
// until the client's reconnect opened a GET again.
import t, { type Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startReplicas, type RunningGateway } from '../fixtures/gateway.js'
import { metricSum, metrics } from '../fixtures/hardening.js'
import { checkDelivery, connectClient, formatRanges, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { deleteKeys, useRedis, type TestRedis } from '../fixtures/redis.js'
import { startRestartableUpstream, type RestartableUpstream } from '../fixtures/restartable-upstream.js'

interface Setup { upstream: RestartableUpstream, redis: TestRedis, replicas: RunningGateway[], mcp: McpTestClient, upstreamId: string }

/** A store-less SDK upstream, `count` gateway replicas on one Redis (requests alternating between them), an SDK client with its GET open. */
async function setup (t: Test, options: { env?: Record<string, string>, replicas?: number, plan?: readonly number[] } = {}): Promise<Setup> {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const redis = await useRedis(t, 'lost-standalone')
  const { replicas, balancer } = await startReplicas(t, redis, upstream.url, options.replicas ?? 1, options.env)
  // The replica (by index) of each of the client's first connections; then round robin.
  if (options.plan !== undefined) balancer.plan(options.plan.map(i => (replicas[i] as RunningGateway).port))
  // A new connection per request: the balancer alternates them between the replicas.
  const mcp = await connectClient(balancer.url('/mcp'), { agentOptions: { pipelining: 0 } })
  t.teardown(() => mcp.close())
  const upstreamId = upstream.life.initialized[0] as string
  t.ok(await waitUntil(() => upstreamGets(upstream, upstreamId) === 1 && mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'the standalone GET is open, upstream and client')
  return { upstream, redis, replicas, mcp, upstreamId }
}

/**
 * The store loses everything while the upstream broadcasts `count` notifications
 * on the standalone stream: each reaches the client once, over the one upstream
 * GET. `stored`: how many may be lost for having been in the store only (appended
 * before the loss, not yet read by a follower on another replica), each told.
 */
async function lossDuringBroadcast (t: Test, { upstream, redis, mcp, upstreamId }: Setup, count: number, stored = 0): Promise<void> {
  await broadcast(mcp, count, 10)
  t.ok(await waitUntil(() => broadcastSeqs(mcp).length >= 80, 10_000), 'the broadcast is flowing')
  t.ok(await deleteKeys(redis.redis, redis.prefix) > 0, 'the store lost everything')
  t.ok(await waitUntil(() => broadcastSeqs(mcp).includes(count - 1), 20_000), 'the broadcast reaches its end')
  const delivery = checkDelivery(broadcastSeqs(mcp), count)
  t.comment(`sent ${count}, received ${delivery.received}, lost ${delivery.lost.length} [${formatRanges(delivery.lost)}], duplicated ${delivery.duplicated.length}`)
  t.same(delivery.duplicated, [], 'nothing twice')
  if (stored === 0) t.same(delivery.lost, [], 'nothing lost')
  else {
    t.ok(delivery.lost.length <= stored, `nothing lost but what the store held at the loss (${delivery.lost.length}, at most ${stored})`)
    const told = mcp.exchanges.some(e => e.method === 'GET' && e.events.some(ev => ev.event === 'gateway-gap'))
    t.ok(delivery.lost.length === 0 || told, 'and the client told of the gap')
  }
  t.equal(upstreamGets(upstream, upstreamId), 1, 'the upstream saw one GET for the session: it stayed open')
}

async function recoveredCount (replicas: readonly RunningGateway[]): Promise<number> {
  const counts = await Promise.all(replicas.map(async gw => metricSum(await metrics(gw.adminUrl), 'mcpgw_sessions_recovered_total')))
  return counts.reduce((sum, n) => sum + n, 0)
}

function upstreamGets (upstream: RestartableUpstream, upstreamId: string): number {
  return upstream.life.requests.filter(r => r.method === 'GET' && r.sessionId === upstreamId).length
}

function broadcastSeqs (mcp: McpTestClient): number[] {
  return mcp.notifications
    .filter(n => n.method === 'notifications/message' && (n.params as { logger?: string }).logger === 'broadcast')
    .map(n => (n.params as { data: number }).data)
}

async function broadcast (mcp: McpTestClient, count: number, intervalMs: number): Promise<void> {
  await mcp.client.callTool({ name: 'broadcast_standalone', arguments: { count, intervalMs } })
}

t.test('Redis emptied while the upstream sends on the standalone stream: the upstream GET stays open, nothing is lost or duplicated', async t => {
  const session = await setup(t)
  await lossDuringBroadcast(t, session, 300)
  t.not(await session.replicas[0]?.store.getSession(session.mcp.sessionId as string), null, 'the session is recorded again')
  t.equal(await recoveredCount(session.replicas), 1, 'counted as recovered, once')
})

t.test('a replica watching the session at the moment its holder records it again finds the lease held: it opens no second upstream GET', async t => {
  const session = await setup(t)
  const store = (session.replicas[0] as RunningGateway).store
  const leases = store.leaseBackend?.()
  if (leases === undefined) throw new Error('the Redis store keeps the leases')
  // Between the recording and anything after it, the way a watching replica's tick may come.
  const watched: unknown[] = []
  const adopt = store.adoptSession.bind(store)
  store.adoptSession = async (...args) => {
    const adoption = await adopt(...args)
    watched.push(await leases.acquire(args[0], 'watcher', 30_000))
    return adoption
  }
  await lossDuringBroadcast(t, session, 300)
  t.equal(watched.length, 1, 'recorded again once')
  t.ok(watched.every(w => typeof w === 'object' && w !== null && 'heldForMs' in w), `the watching replica found the lease held (${JSON.stringify(watched)})`)
})

t.test('Redis emptied while the session is quiet: the lease\'s renewal finds it, the session is recorded again, the GET stays open', async t => {
  // Renewal every 200 ms: the loss is found by the lease before any append or request.
  const { upstream, redis, replicas, mcp, upstreamId } = await setup(t, { env: { LEASE_TTL_MS: '600' } })
  t.ok(await deleteKeys(redis.redis, redis.prefix) > 0, 'the store lost everything')
  t.ok(await eventuallyRecorded(replicas[0] as RunningGateway, mcp.sessionId as string), 'recorded again without any request of the client')
  await sleep(600)
  const COUNT = 50
  await broadcast(mcp, COUNT, 10)
  t.ok(await waitUntil(() => broadcastSeqs(mcp).includes(COUNT - 1), 20_000), 'a broadcast after the loss reaches its end')
  const delivery = checkDelivery(broadcastSeqs(mcp), COUNT)
  t.same([delivery.lost, delivery.duplicated], [[], []], 'nothing lost, nothing twice')
  t.equal(upstreamGets(upstream, upstreamId), 1, 'the upstream saw one GET for the session: it stayed open')
})

async function eventuallyRecorded (gw: RunningGateway, sessionId: string): Promise<boolean> {
  const deadline = Date.now() + 5000
  while (Date.now() < deadline) {
    if (await gw.store.getSession(sessionId) !== null) return true
    await sleep(50)
  }
  return false
}

t.test('two replicas, the client\'s GET on the one not holding the upstream GET: Redis emptied while the upstream sends on the standalone stream; the GET stays open on its holder, the client hears the rest', async t => {
  // initialize and notifications/initialized on the first replica, which holds the upstream GET from then
  // on; the client's GET on the second, which watches the lease (renewals every 200 ms on both) and would
  // take it while free if the holder waited for its own next renewal to take it back.
  const session = await setup(t, { replicas: 2, env: { LEASE_TTL_MS: '600' }, plan: [0, 0, 1] })
  // The client's replica reads what the holder appends from the store: the last appends before the
  // loss may be gone before it read them (a notification every 10 ms; 10 allows for a slow machine).
  await lossDuringBroadcast(t, session, 300, 10)
  t.equal(await recoveredCount(session.replicas), 1, 'counted as recovered once across the replicas')
})

t.test('two replicas, the lease long: the client\'s replica hears the rest through the holder\'s announcement alone', async t => {
  // The same, with a lease of 30 s: the client's replica does not see the lease lapse, nor refresh
  // its audience, within the test; the holder's "recorded again" message on the session's channel
  // makes it join the new audience at once. (Without that message the client usually hears nothing
  // more; in some runs its replica learns of the new epoch another way, as the holder's appends reach
  // the channel, and the client resumes across the gap.)
  const session = await setup(t, { replicas: 2, env: { LEASE_TTL_MS: '30000' }, plan: [0, 0, 1] })
  await lossDuringBroadcast(t, session, 300, 10)
  t.equal(await recoveredCount(session.replicas), 1, 'counted as recovered once across the replicas')
})
