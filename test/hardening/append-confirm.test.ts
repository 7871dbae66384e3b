// An append Redis applied but whose reply was lost (a restart or failover with
// the command in flight), on real Redis: the gateway's store talks to Redis
// through a relay that cuts the connection right after Redis ran the append
// carrying the tool's notifications, then refuses connections for a while.
// ioredis gives up on the command (maxRetriesPerRequest) although Redis applied
// it. The recorder resends the identical append (the store recognises it as
// already applied) instead of passing the events on live without ids, so every
// event reaches the client exactly once, with its id, and no gap is marked.
// An outage longer than the recorder's confirm window still degrades as before:
// events passed on live without ids, a store_unavailable gap marker counting them;
// when the cut append had been applied, the recorder finds it in the store once
// Redis answers again: the marker counts only what the store lacks, and the live
// client does not get the applied events a second time from the store.
import t from 'tap'
import type { Test } from 'tap'
import { pino } from 'pino'
import { startExampleServer } from '../../examples/mcp-server.js'
import { buildGateway } from '../../src/server.js'
import { decodeEventId } from '../../src/protocol/event-id.js'
import { RedisEventStore, type AppendWrite } from '../../src/store/redis/redis-store.js'
import { dataOf, eventOf } from '../fixtures/events.js'
import { testConfig } from '../fixtures/gateway.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil, type McpTestClient, type SseEventRecord } from '../fixtures/mcp-client.js'
import { metricSum, metrics } from '../fixtures/hardening.js'
import { useRedis } from '../fixtures/redis.js'
import { startRedisCut, type CutPoint } from '../fixtures/redis-cut.js'

type Tool = 'broadcast' | 'stream_notifications'
const COUNT = 300

interface Run {
  mcp: McpTestClient
  store: RedisEventStore
  adminUrl: string
  fired: number
  /** Every SSE event the client got that carries one of the tool's notifications. */
  copies: SseEventRecord[]
  gapEvents: SseEventRecord[]
  /** The tool's sequence numbers as stored, over every stream that carried them. */
  stored: number[]
  storedGaps: string[]
}

function seqOf (data: string, tool: Tool): number | undefined {
  try {
    const message = JSON.parse(data) as { method?: string, params?: { data?: { tool?: string, seq?: number } } }
    const d = message.params?.data
    return message.method === 'notifications/message' && d?.tool === tool ? d.seq : undefined
  } catch {
    return undefined
  }
}

/** Run the tool through a gateway whose store connection is cut once, at the append carrying its notifications. */
/** `first`: cut the first append carrying the tool's notifications (for the standalone stream, the first of its upstream GET). */
async function run (t: Test, tool: Tool, point: CutPoint, downMs: number, intervalMs = 10, first = false, appendWrite: AppendWrite = 'zero-copy'): Promise<Run> {
  const { url: redisUrl, prefix } = await useRedis(t, 'append-confirm')
  const cut = await startRedisCut(redisUrl)
  t.teardown(() => cut.close())
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const config = testConfig(upstream.url, { REDIS_URL: cut.url, REDIS_KEY_PREFIX: prefix, SSE_RETRY_MS: '200' })
  const store = await RedisEventStore.connect({ url: cut.url, keyPrefix: prefix, retention: config.retention, appendWrite })
  const gateway = await buildGateway(config, { store, logger: pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' }) })
  const { url, adminUrl } = await gateway.listen()
  t.teardown(() => gateway.close())
  const mcp = await connectClient(`${url}/mcp`, { reconnectionOptions: { initialReconnectionDelay: 200, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5, maxRetries: 20 } })
  t.teardown(() => mcp.close())
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'the standalone stream is open')

  const received = (): number[] => sequencesOf(mcp.notifications, tool)
  const args = { count: COUNT, intervalMs }
  let call: Promise<unknown> = Promise.resolve()
  if (first) cut.arm(`"tool":"${tool}"`, point, downMs)
  if (tool === 'broadcast') await mcp.client.callTool({ name: tool, arguments: args })
  else call = mcp.client.callTool({ name: tool, arguments: args }, undefined, { timeout: 30_000 })
  if (!first) {
    t.ok(await waitUntil(() => received().length >= 30, 10_000), `the ${tool} notifications are flowing`)
    cut.arm(`"tool":"${tool}"`, point, downMs)
  }
  t.ok(await waitUntil(() => cut.fired === 1, 5000), `the store connection was cut ${point === 'after' ? 'after Redis ran' : 'before Redis got'} an append of the tool's notifications`)
  const result = await call.then(r => JSON.stringify((r as { content?: unknown } | undefined)?.content ?? null), (err: unknown) => `failed: ${String(err)}`)
  if (tool === 'stream_notifications') t.equal(result, JSON.stringify([{ type: 'text', text: `done ${COUNT}` }]), 'the tool call ends with its result')
  t.ok(await waitUntil(() => received().includes(COUNT - 1), 20_000), 'the last notification arrived')
  await new Promise(resolve => setTimeout(resolve, 300)) // a duplicate would arrive now

  const events = mcp.exchanges.flatMap(e => e.events)
  const copies = events.filter(e => seqOf(e.data, tool) !== undefined)
  const streamIds = new Set(copies.flatMap(e => e.id === undefined ? [] : [decodeEventId(e.id)?.streamId ?? '']))
  const stored: number[] = []
  const storedGaps: string[] = []
  for (const streamId of streamIds) {
    const read = await store.read(mcp.sessionId as string, streamId, 0, 10_000)
    for (const e of read?.events ?? []) {
      if (eventOf(e) === 'gateway-gap') storedGaps.push(dataOf(e))
      const seq = seqOf(dataOf(e), tool)
      if (seq !== undefined) stored.push(seq)
    }
  }
  return { mcp, store, adminUrl, fired: cut.fired, copies, gapEvents: events.filter(e => e.event === 'gateway-gap'), stored, storedGaps }
}

function summary (r: Run, tool: Tool): string {
  const report = checkDelivery(sequencesOf(r.mcp.notifications, tool), COUNT)
  return `received ${report.received}, lost [${formatRanges(report.lost)}], duplicated [${formatRanges(report.duplicated)}], without id ${r.copies.filter(e => e.id === undefined).length}, gap events ${r.gapEvents.map(e => e.data).join(' ') || 'none'}`
}

// Both ways appends reach Redis (src/store/redis/append-writes.ts): they send the same commands.
for (const [tool, appendWrite] of [['broadcast', 'zero-copy'], ['stream_notifications', 'zero-copy'], ['broadcast', 'ioredis'], ['stream_notifications', 'ioredis']] as const) {
  t.test(`${tool} (appends: ${appendWrite}): an append applied but reported failed is resent, not passed on unrecorded`, async t => {
    // 1 s refused: ioredis fails the command after its 3 reconnect attempts (~0.5 s), well inside the confirm window.
    const r = await run(t, tool, 'after', 1000, 10, false, appendWrite)
    t.comment(`${tool}, reply lost: ${summary(r, tool)}`)
    const report = checkDelivery(sequencesOf(r.mcp.notifications, tool), COUNT)
    t.ok(report.ok, `every notification exactly once, in order (duplicated: ${formatRanges(report.duplicated) || 'none'})`)
    t.same(r.copies.filter(e => e.id === undefined).map(e => seqOf(e.data, tool)), [], 'none passed on without an id')
    t.same(r.gapEvents, [], 'no gateway-gap event')
    t.same(checkDelivery(r.stored.slice().sort((a, b) => a - b), COUNT).duplicated, [], 'each stored once')
    t.equal(r.stored.length, COUNT, 'all stored')
    t.same(r.storedGaps, [], 'no gap marker in the store')
    const text = await metrics(r.adminUrl)
    t.ok(metricSum(text, 'mcpgw_store_errors_total', { op: 'append' }) >= 1, 'an append did fail at the client')
    t.ok(metricSum(text, 'mcpgw_append_resends_total', { outcome: 'recorded' }) >= 1, 'and its resend recorded it')
    t.equal(metricSum(text, 'mcpgw_append_resends_total', { outcome: 'unrecorded' }), 0, 'no resend ran out of time')
    t.equal(metricSum(text, 'mcpgw_events_unrecorded_total'), 0, 'nothing counted unrecorded')
    t.equal(metricSum(text, 'mcpgw_gaps_total', { reason: 'store_unavailable' }), 0, 'no gap counted')
  })
}

t.test('broadcast: Redis unreachable longer than the confirm window: degraded mode as before', async t => {
  // Cut before Redis gets the append (nothing applied), refused for 4 s: longer than the 2 s window.
  const r = await run(t, 'broadcast', 'before', 4000)
  t.comment(`broadcast, long outage: ${summary(r, 'broadcast')}; stored gap markers ${r.storedGaps.join(' ') || 'none'}`)
  const report = checkDelivery(sequencesOf(r.mcp.notifications, 'broadcast'), COUNT)
  t.same(report.lost, [], 'the live client lost nothing')
  t.same(report.duplicated, [], 'nor got anything twice')
  t.equal(report.outOfOrder, 0, 'in order')
  const withoutId = r.copies.filter(e => e.id === undefined).length
  t.ok(withoutId > 0, `events passed on live without an id meanwhile (${withoutId})`)
  t.equal(r.storedGaps.length, 1, 'one gap marker recorded once the store answered')
  const marker = JSON.parse(r.storedGaps[0] ?? '{}') as { reason?: string, unrecorded?: number }
  t.equal(marker.reason, 'store_unavailable', 'reason store_unavailable')
  t.equal(marker.unrecorded, withoutId, 'it counts exactly the events passed on without an id')
  t.equal(r.stored.length + withoutId, COUNT, 'what the store lacks is what was passed on unrecorded')
  const text = await metrics(r.adminUrl)
  t.ok(metricSum(text, 'mcpgw_append_resends_total', { outcome: 'unrecorded' }) >= 1, 'the resends ran out of time')
  t.equal(metricSum(text, 'mcpgw_events_unrecorded_total'), withoutId, 'counted unrecorded')
  t.equal(metricSum(text, 'mcpgw_gaps_total', { reason: 'store_unavailable' }), 1, 'one gap counted')
})

for (const tool of ['broadcast', 'stream_notifications'] as const) {
  t.test(`${tool}: an append applied but reported failed, Redis unreachable past the confirm window: nothing twice, the marker counts what the store lacks`, async t => {
    // Cut right after Redis ran the append, refused for 9 s: the resends run out of
    // time (each failed attempt waits ~3 s for ioredis' reconnects), so its events are
    // passed on without ids although the store holds them, then the next append's too,
    // which the store never gets. The tool runs 15 s: appends go through again before it ends.
    const r = await run(t, tool, 'after', 9000, 50)
    const marker = JSON.parse(r.storedGaps[0] ?? '{}') as { reason?: string, unrecorded?: number }
    const withoutId = r.copies.filter(e => e.id === undefined).length
    t.comment(`${tool}, reply lost, long outage: ${summary(r, tool)}; stored ${r.stored.length}, stored gap markers ${r.storedGaps.join(' ') || 'none'}`)
    const report = checkDelivery(sequencesOf(r.mcp.notifications, tool), COUNT)
    t.same(report.lost, [], 'the live client lost nothing')
    t.same(report.duplicated, [], 'nor got anything twice (the applied append is not written again from the store)')
    t.equal(report.outOfOrder, 0, 'in order')
    t.same(checkDelivery(r.stored.slice().sort((a, b) => a - b), COUNT).duplicated, [], 'each stored once')
    t.equal(r.storedGaps.length, 1, 'one gap marker recorded once the store answered')
    t.equal(marker.reason, 'store_unavailable', 'reason store_unavailable')
    t.equal(r.stored.length + (marker.unrecorded ?? NaN), COUNT, `it counts exactly what the store lacks (${String(marker.unrecorded)} of ${COUNT}; ${r.stored.length} stored)`)
    t.ok(withoutId > (marker.unrecorded ?? NaN), `more were passed on without an id (${withoutId}) than the store lacks: the applied append's events, stored after all`)
    const text = await metrics(r.adminUrl)
    t.ok(metricSum(text, 'mcpgw_append_resends_total', { outcome: 'unrecorded' }) >= 1, 'the resends ran out of time')
    t.equal(metricSum(text, 'mcpgw_events_unrecorded_total'), withoutId, 'what was passed on without an id is counted unrecorded')
  })
}

t.test('broadcast: the first append of the upstream GET applied but reported failed, Redis unreachable past the confirm window: nothing twice', async t => {
  // The recorder of a standalone stream learns where the stream stood when its upstream
  // GET opened, so it can tell what Redis applied even when no append of its own went through.
  const r = await run(t, 'broadcast', 'after', 9000, 50, true)
  const marker = JSON.parse(r.storedGaps[0] ?? '{}') as { unrecorded?: number }
  const withoutId = r.copies.filter(e => e.id === undefined).length
  t.comment(`broadcast, first append's reply lost, long outage: ${summary(r, 'broadcast')}; stored ${r.stored.length}, stored gap markers ${r.storedGaps.join(' ') || 'none'}`)
  const report = checkDelivery(sequencesOf(r.mcp.notifications, 'broadcast'), COUNT)
  t.same(report.lost, [], 'the live client lost nothing')
  t.same(report.duplicated, [], 'nor got anything twice')
  t.equal(report.outOfOrder, 0, 'in order')
  t.ok(r.stored.length > 0 && r.storedGaps.length === 1, 'the applied append and later events are stored, with one gap marker')
  t.equal(r.stored.length + (marker.unrecorded ?? NaN), COUNT, `the marker counts exactly what the store lacks (${String(marker.unrecorded)})`)
  t.ok(withoutId > (marker.unrecorded ?? NaN), `more were passed on without an id (${withoutId}) than the store lacks`)
})
