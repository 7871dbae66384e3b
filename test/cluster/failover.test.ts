// The replica holding a session's upstream GET is SIGKILLed in the middle of a
// broadcast: another replica takes the stream over within seconds. What the
// upstream sent while nobody held the stream is lost, but only as one
// explicit gap marker (counted), exactly where the loss is.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startBalancer } from '../fixtures/balancer.js'
import { startReplicas } from '../fixtures/cluster-scenario.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import type { Replica } from '../fixtures/replica.js'
import { missingRanges, standaloneItems } from '../fixtures/standalone-log.js'

const COUNT = 1000
const INTERVAL_MS = 10
const LEASE_TTL_MS = 5000 // the default

t.test('SIGKILL of the lease holder mid-broadcast: takeover within seconds, loss only as a counted gap', async (t) => {
  const redis = await useRedis(t, 'failover')
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const env = { REDIS_URL: redis.url, REDIS_KEY_PREFIX: redis.prefix, LEASE_TTL_MS: String(LEASE_TTL_MS) }
  const replicas = await startReplicas(t, upstream.url, env, ['A', 'B', 'C'])
  const lb = await startBalancer(replicas.map(r => r.port))
  t.teardown(() => lb.close())

  const mcp = await connectClient(lb.url('/mcp'))
  t.teardown(() => mcp.close())
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'standalone GET open')
  const holdsStream = async (r: Replica): Promise<boolean> => await r.metric('mcpgw_upstream_streams_open', { kind: 'standalone' }) === 1
  const holder = (await Promise.all(replicas.map(async r => await holdsStream(r) ? r : undefined))).find(r => r !== undefined)
  if (holder === undefined) throw new Error('no replica holds the upstream GET')
  const survivors = replicas.filter(r => r !== holder)

  await mcp.client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: INTERVAL_MS } })
  const received = (): number[] => sequencesOf(mcp.notifications, 'broadcast')
  t.ok(await waitUntil(() => received().length >= 150, 10_000), 'broadcast flowing')

  holder.kill('SIGKILL')
  const killedAt = Date.now()
  lb.remove(holder.port) // the endpoint leaves the Service
  const gapSeen = (): boolean => standaloneItems(mcp.exchanges).some(i => i.kind === 'gap')
  t.ok(await waitUntil(gapSeen, 4 * LEASE_TTL_MS), 'the client is told about the gap')
  const observedMs = Date.now() - killedAt
  t.ok(await waitUntil(() => received().includes(COUNT - 1), 30_000), 'the broadcast runs to its end')
  await sleep(200)

  const takenBy = survivors.find(r => r.logged(/gap marker recorded/).length > 0)
  // Log lines carry ISO times.
  const loggedAt = takenBy?.logged(/gap marker recorded/)[0]?.time as string | undefined
  const takeoverMs = loggedAt === undefined ? NaN : Date.parse(loggedAt) - killedAt
  const report = checkDelivery(received(), COUNT)
  const lost = missingRanges(received(), COUNT)
  t.comment(`failover: lease ttl ${LEASE_TTL_MS} ms; takeover ${takeoverMs} ms after SIGKILL (gap marker recorded by ${takenBy?.name ?? '?'}), seen by the client after ${observedMs} ms`)
  t.comment(`failover: sent ${COUNT}, received ${report.received}, lost ${report.lost.length} [${formatRanges(report.lost)}] in ${lost.length} gap(s), duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}`)
  t.ok(takenBy !== undefined, 'a surviving replica took the stream over')
  t.ok(takeoverMs < LEASE_TTL_MS + LEASE_TTL_MS / 3 + 2000, `takeover within lease ttl + one renewal tick (${takeoverMs} ms)`)
  t.same(report.duplicated, [], 'nothing duplicated')
  t.equal(report.outOfOrder, 0, 'in order')
  t.ok(lost.length <= 1, 'at most one run of lost events')

  // The marker sits exactly where the loss is.
  const items = standaloneItems(mcp.exchanges)
  const gaps = items.filter(i => i.kind === 'gap')
  t.equal(gaps.length, 1, 'one gap marker')
  t.match(gaps[0], { kind: 'gap', reason: 'upstream_handover' })
  const at = items.findIndex(i => i.kind === 'gap')
  const before = items.slice(0, at).flatMap(i => i.kind === 'seq' ? [i.seq] : [])
  const after = items.slice(at + 1).flatMap(i => i.kind === 'seq' ? [i.seq] : [])
  const [from, to] = lost[0] ?? [Math.max(...before) + 1, Math.max(...before)]
  t.ok(before.every(s => s < from) && after.every(s => s > to), `marker between ${from - 1} and ${to + 1}`)

  const gapsCounted = (await Promise.all(survivors.map(async r => await r.metric('mcpgw_gaps_total', { reason: 'upstream_handover' })))).reduce((a, b) => a + b, 0)
  const takeovers = (await Promise.all(survivors.map(async r => await r.metric('mcpgw_lease_takeovers_total')))).reduce((a, b) => a + b, 0)
  t.equal(gapsCounted, 1, 'the gap is counted (mcpgw_gaps_total{reason="upstream_handover"})')
  t.equal(takeovers, 1, 'the takeover is counted (mcpgw_lease_takeovers_total)')
  t.notOk(mcp.errors.some(e => /Maximum reconnection attempts/.test(e.message)), 'the client never gave up reconnecting')
})
