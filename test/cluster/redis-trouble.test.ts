// Redis trouble mid-stream, with its defined outcome (docs/replicas.md, "Redis trouble:
// what clients see"):
// - Redis frozen for a while (connections open, no answer): events are
//   delayed, nothing is lost.
// - Redis restarted from an older snapshot (it lost writes it had
//   acknowledged, and clients had seen): detected, the session starts a new
//   epoch, resuming clients are told (`epoch` gap) and counted; nothing is
//   skipped silently.
// - Redis restarted empty: the session goes on under a new epoch and the client
//   is told of the gap; with RECOVER_LOST_SESSIONS=false it is gone, the client
//   is told with 404 (MCP: start a new session) and a new session works at once.
import t from 'tap'
import type { Test } from 'tap'
import { Redis } from 'ioredis'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { startRedisProcess } from '../fixtures/redis-topologies.js'
import { startReplica } from '../fixtures/replica.js'
import { silentJumps, standaloneItems } from '../fixtures/standalone-log.js'
import { externalTools } from '../fixtures/external-tools.js'

const ownRedis = await externalTools(['redis-server'])

const COUNT = 600
const INTERVAL_MS = 10

async function broadcasting (t: Test, label: string, env: Record<string, string> = {}): Promise<{ mcp: McpTestClient, received: () => number[], redis: Awaited<ReturnType<typeof startRedisProcess>>, replica: Awaited<ReturnType<typeof startReplica>>, admin: Redis }> {
  const redis = await startRedisProcess(t, [], label)
  const admin = new Redis({ port: redis.port, host: '127.0.0.1', maxRetriesPerRequest: 1 })
  admin.on('error', () => {})
  t.teardown(() => admin.disconnect())
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const replica = await startReplica(t, { upstreamUrl: upstream.url, env: { REDIS_URL: `redis://127.0.0.1:${redis.port}`, ...env }, name: label })
  const mcp = await connectClient(`${replica.url}/mcp`)
  t.teardown(() => mcp.close())
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'standalone GET open')
  await mcp.client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: INTERVAL_MS } })
  return { mcp, received: () => sequencesOf(mcp.notifications, 'broadcast'), redis, replica, admin }
}

t.test('Redis frozen for 2 s mid-stream: delayed, nothing lost', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const { mcp, received, redis } = await broadcasting(t, 'frozen')
  t.ok(await waitUntil(() => received().length >= 100, 10_000))
  await redis.freeze(2000)
  t.ok(await waitUntil(() => received().includes(COUNT - 1), 20_000), 'the broadcast ran to its end')
  await sleep(200)
  const report = checkDelivery(received(), COUNT)
  t.comment(`frozen: sent ${COUNT}, received ${report.received}, lost ${report.lost.length} [${formatRanges(report.lost)}], duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}`)
  t.ok(report.ok, 'exactly once, in order')
  t.same(standaloneItems(mcp.exchanges).filter(i => i.kind === 'gap'), [], 'no gap')
})

t.test('Redis restarted from an older snapshot: new epoch, the client is told, nothing skipped silently', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const { mcp, received, redis, replica, admin } = await broadcasting(t, 'snapshot')
  t.ok(await waitUntil(() => received().length >= 100, 10_000))
  await admin.save()
  const atSnapshot = received().length
  t.ok(await waitUntil(() => received().length >= 250, 10_000))
  await redis.stop('SIGKILL')
  const seenBeforeCrash = received().length
  await redis.start() // loads the snapshot: ~150 acknowledged events are gone from Redis
  t.ok(await waitUntil(() => received().includes(COUNT - 1), 30_000), 'the broadcast ran to its end')
  await sleep(200)
  const report = checkDelivery(received(), COUNT)
  const items = standaloneItems(mcp.exchanges)
  const gaps = items.flatMap(i => i.kind === 'gap' ? [i.reason] : [])
  const epochGaps = await replica.metric('mcpgw_gaps_total', { reason: 'epoch' })
  t.comment(`snapshot: snapshot at ${atSnapshot} events, crash at ${seenBeforeCrash}; sent ${COUNT}, received ${report.received}, lost ${report.lost.length} [${formatRanges(report.lost)}], duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}; gap markers [${gaps.join(', ')}], mcpgw_gaps_total{reason="epoch"} ${epochGaps}`)
  t.ok(gaps.includes('epoch'), 'the resuming client is told the store lost history (epoch)')
  t.ok(epochGaps >= 1, 'and it is counted')
  t.ok(mcp.exchanges.some(e => e.method === 'GET' && e.status === 200 && e.lastEventId !== undefined && e.events.some(ev => ev.event === 'gateway-gap')), 'on a resume with Last-Event-ID')
  t.same(report.duplicated, [], 'nothing duplicated')
  t.same(silentJumps(items), [], 'nothing skipped silently')
})

t.test('Redis restarted empty: the session goes on under a new epoch, the client is told', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const { mcp, received, redis } = await broadcasting(t, 'empty')
  t.ok(await waitUntil(() => received().length >= 100, 10_000))
  await redis.stop('SIGKILL')
  const restartedAt = Date.now()
  await redis.start()
  t.ok(await waitUntil(() => received().includes(COUNT - 1), 20_000), 'the broadcast reaches the client to its end, on the same session')
  await sleep(200)
  const report = checkDelivery(received(), COUNT)
  t.comment(`empty: received ${report.received} of ${COUNT}, lost ${report.lost.length} [${formatRanges(report.lost)}], duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}`)
  t.same(report.duplicated, [], 'nothing duplicated')
  t.equal(report.outOfOrder, 0, 'in order')
  const items = standaloneItems(mcp.exchanges)
  t.same(silentJumps(items), [], 'nothing skipped silently')
  t.ok(items.some(i => i.kind === 'gap' && i.reason === 'epoch'), 'the loss is told: an epoch gap')
  t.ok(mcp.exchanges.some(e => e.method === 'GET' && e.status === 200 && e.startedAt > restartedAt && e.lastEventId !== undefined), 'the client resumed with its old id and was served')
  t.notOk(mcp.exchanges.some(e => e.status === 404), 'no 404')
})

t.test('Redis restarted empty with RECOVER_LOST_SESSIONS=false: the session is gone (404), a new one works', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const { mcp, received, redis, replica } = await broadcasting(t, 'empty-strict', { RECOVER_LOST_SESSIONS: 'false' })
  t.ok(await waitUntil(() => received().length >= 100, 10_000))
  await redis.stop('SIGKILL')
  const restartedAt = Date.now()
  await redis.start()
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 404 && e.startedAt > restartedAt), 15_000), 'the client resuming its standalone stream gets 404 (session not found)')
  const report = checkDelivery(received(), COUNT)
  t.comment(`empty, strict: received ${report.received} of ${COUNT} before the session was lost; duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}`)
  t.same(report.duplicated, [], 'nothing duplicated')
  t.equal(report.outOfOrder, 0, 'in order')
  t.same(silentJumps(standaloneItems(mcp.exchanges)), [], 'nothing skipped silently')

  const fresh = await connectClient(`${replica.url}/mcp`)
  t.teardown(() => fresh.close())
  const result = await fresh.client.callTool({ name: 'stream_notifications', arguments: { count: 20, intervalMs: 1 } })
  t.same(result.content, [{ type: 'text', text: 'done 20' }], 'a new session works')
})
