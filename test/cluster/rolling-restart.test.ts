// A rolling restart (start a successor, SIGTERM the oldest, repeat) while a
// client streams a long tool call and listens on its standalone stream: the
// tool call loses nothing, each drain hands its streams over and exits
// before the grace period ends.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startBalancer } from '../fixtures/balancer.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startReplica, stopped, type Replica } from '../fixtures/replica.js'
import { silentJumps, standaloneItems } from '../fixtures/standalone-log.js'

const COUNT = 600
const INTERVAL_MS = 15
const GRACE_SECONDS = 15
const ROLLS = 3

t.test('rolling restart while a tool call streams: nothing lost', async (t) => {
  const redis = await useRedis(t, 'rolling')
  let broadcastFinished = false
  const quiet = (): void => {}
  const upstream = await startExampleServer({
    logger: { debug: quiet, warn: quiet, error: quiet, info: (_obj, msg) => { if (msg === 'broadcast finished') broadcastFinished = true } }
  })
  t.teardown(() => upstream.close())
  const env = {
    REDIS_URL: redis.url,
    REDIS_KEY_PREFIX: redis.prefix,
    DRAIN_SPREAD_SECONDS: '2',
    SHUTDOWN_GRACE_SECONDS: String(GRACE_SECONDS)
  }
  let generation = 0
  const start = async (): Promise<Replica> => await startReplica(t, { upstreamUrl: upstream.url, env, name: `R${++generation}` })
  const live: Replica[] = await Promise.all([start(), start()])
  const lb = await startBalancer(live.map(r => r.port))
  t.teardown(() => lb.close())

  // A new connection per request: the client's streams spread over the replicas.
  const mcp = await connectClient(lb.url('/mcp'), { agentOptions: { pipelining: 0 } })
  t.teardown(() => mcp.close())
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'standalone GET open')
  const started = Date.now()
  await mcp.client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: INTERVAL_MS } })
  const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: COUNT, intervalMs: INTERVAL_MS } }, undefined, { timeout: 120_000 })
  const received = (): number[] => sequencesOf(mcp.notifications, 'stream_notifications')
  t.ok(await waitUntil(() => received().length >= 20, 10_000), 'the tool call streams')

  // As a Deployment rolls (maxSurge 1, maxUnavailable 0): the next step starts
  // once the successor is ready, while the old replica may still be draining.
  const drains: Array<Promise<{ name: string, ms: number, code: number | null }>> = []
  for (let i = 0; i < ROLLS; i++) {
    const successor = await start()
    lb.add(successor.port)
    live.push(successor)
    const oldest = live.shift() as Replica
    lb.remove(oldest.port) // a terminating pod leaves the Service's endpoints
    oldest.kill('SIGTERM')
    t.comment(`rolling: SIGTERM ${oldest.name} at ${received().length} of ${COUNT} notifications`)
    drains.push(stopped(oldest, (GRACE_SECONDS + 5) * 1000).then(async ms => ({ name: oldest.name, ms, code: (await oldest.exited).code })))
    await sleep(1500)
  }

  const result = await call
  const elapsed = Date.now() - started
  const drained = await Promise.all(drains)
  t.same(result.content, [{ type: 'text', text: `done ${COUNT}` }], 'the tool result arrived')
  await sleep(200)
  const report = checkDelivery(received(), COUNT)
  // The broadcast's end arrived, or what the upstream sent while no GET was open
  // (a handover) was lost at the tail, and the gap marker came after the last event.
  const tailTold = (): boolean => {
    const items = standaloneItems(mcp.exchanges)
    const last = items.findLastIndex(i => i.kind === 'seq')
    return items.slice(last + 1).some(i => i.kind === 'gap')
  }
  t.ok(await waitUntil(() => broadcastFinished && (sequencesOf(mcp.notifications, 'broadcast').includes(COUNT - 1) || tailTold()), 10_000),
    'the broadcast ran to its end: its last event arrived, or a gap marker told of a lost tail')
  const items = standaloneItems(mcp.exchanges)
  const gaps = items.filter(i => i.kind === 'gap')
  const standalone = checkDelivery(sequencesOf(mcp.notifications, 'broadcast'), COUNT)
  t.comment(`rolling: ${ROLLS} restarts in ${elapsed} ms; tool call sent ${COUNT}, received ${report.received}, lost ${report.lost.length} [${formatRanges(report.lost)}], duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}`)
  t.comment(`rolling: standalone broadcast sent ${COUNT}, received ${standalone.received}, lost ${standalone.lost.length} [${formatRanges(standalone.lost)}] in handovers, ${gaps.length} gap marker(s), duplicated ${standalone.duplicated.length}, out of order ${standalone.outOfOrder}`)
  t.same(silentJumps(items), [], 'standalone stream: whatever a handover lost is marked, nothing skipped silently')
  t.same(standalone.duplicated, [], 'standalone stream: nothing duplicated')
  t.comment(`rolling: drain times (SIGTERM to exit) ${drained.map(d => `${d.name} ${d.ms} ms`).join(', ')}`)
  t.same(report.lost, [], 'nothing lost')
  t.same(report.duplicated, [], 'nothing duplicated')
  t.equal(report.outOfOrder, 0, 'in order')
  for (const d of drained) {
    t.equal(d.code, 0, `${d.name} exited cleanly`)
    t.ok(d.ms < GRACE_SECONDS * 1000, `${d.name} exited before the grace period ended (${d.ms} ms)`)
  }
  t.notOk(mcp.errors.some(e => /Maximum reconnection attempts/.test(e.message)), 'the client never gave up reconnecting')
  t.ok(mcp.exchanges.some(e => e.method === 'GET' && e.status === 200 && e.startedAt > started), 'the client resumed on other replicas')
})
