// The gateway's metrics (src/metrics/metrics.ts): store operations timed and
// failures counted, every labelled series at 0 from the start, refusals, the
// embedded store's room, and the store's health told in two log lines.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { GatewayMetrics } from '../../src/metrics/metrics.js'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import { everyMetric } from '../fixtures/metrics.js'

async function histogram (metrics: GatewayMetrics, op: string): Promise<{ count: number, sum: number, le: Record<string, number> }> {
  const values = (await metrics.storeOperationDuration.get()).values.filter(v => v.labels.op === op)
  const le: Record<string, number> = {}
  for (const v of values) if (v.metricName?.endsWith('_bucket') === true) le[String((v.labels as Record<string, unknown>).le)] = v.value
  return {
    count: values.find(v => v.metricName?.endsWith('_count') === true)?.value ?? 0,
    sum: values.find(v => v.metricName?.endsWith('_sum') === true)?.value ?? 0,
    le
  }
}

t.test('timeStore: each operation its own series, its time in seconds, failures counted and rethrown', async t => {
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  t.equal(await metrics.timeStore('append', async () => { await sleep(30); return 'stored' }), 'stored', 'the operation\'s result')
  for (let i = 0; i < 3; i++) await metrics.timeStore('read', async () => 1)
  const append = await histogram(metrics, 'append')
  t.equal(append.count, 1, 'one append timed')
  t.ok(append.sum >= 0.025 && append.sum < 5, `in seconds (${append.sum})`)
  t.equal(append.le['0.01'], 0, 'not in the buckets below its time')
  t.equal(append.le['+Inf'], 1, 'and in +Inf')
  const read = await histogram(metrics, 'read')
  t.equal(read.count, 3, 'three reads, apart from the append')
  t.equal(read.le['0.01'], 3, 'each quick')
  await t.rejects(metrics.timeStore('read', async () => { throw new Error('down') }), /down/, 'a failure is the caller\'s')
  t.equal((await histogram(metrics, 'read')).count, 4, 'and timed too')
  const errors = (await metrics.storeErrors.get()).values
  t.same(errors.filter(v => v.value > 0).map(v => [v.labels.op, v.value]), [['read', 1]], 'and counted, by operation (the other operations at 0)')
  metrics.registry.resetMetrics()
  await metrics.timeStore('read', async () => 1)
  t.equal((await histogram(metrics, 'read')).count, 1, 'after a reset, counted from zero again')
})

t.test('timeUpstream: timed by status class, failures counted, but not a request the gateway aborted itself', async t => {
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const timed = async (): Promise<Array<[string, number]>> => (await metrics.upstreamRequestDuration.get()).values
    .filter(v => v.metricName?.endsWith('_count') === true && v.value > 0).map(v => [`${String(v.labels.method)} ${String(v.labels.status_class)}`, v.value])
  const failed = async (): Promise<number | undefined> => sample(await scrape(metrics), 'mcpgw_upstream_errors_total', { kind: 'request' })
  t.match(await metrics.timeUpstream('POST', async () => ({ statusCode: 202 })), { statusCode: 202 }, 'the answer is the caller\'s')
  await metrics.timeUpstream('GET', async () => ({ statusCode: 404 }))
  await t.rejects(metrics.timeUpstream('GET', async () => { throw new Error('refused') }), /refused/, 'a failure is the caller\'s')
  t.same(await timed(), [['POST 2xx', 1], ['GET 4xx', 1], ['GET error', 1]], 'each by method and status class')
  t.equal(await failed(), 1, 'the failure counted')
  const abort = new AbortController()
  abort.abort()
  await t.rejects(metrics.timeUpstream('GET', async () => { throw new Error('aborted') }, abort.signal), /aborted/, 'an aborted one fails for its caller')
  const stillOpen = new AbortController()
  await t.rejects(metrics.timeUpstream('GET', async () => { throw new Error('refused again') }, stillOpen.signal), /refused again/)
  t.equal(await failed(), 2, 'counted only when its abort did not fire')
  t.same(await timed(), [['POST 2xx', 1], ['GET 4xx', 1], ['GET error', 2]], 'and timed likewise')
})

async function scrape (metrics: GatewayMetrics): Promise<string> {
  return await metrics.registry.metrics()
}

function sample (text: string, name: string, labels: Record<string, string> = {}): number | undefined {
  const line = text.split('\n').find(l => (l.startsWith(`${name}{`) || l.startsWith(`${name} `)) &&
    Object.entries(labels).every(([k, v]) => l.includes(`${k}="${v}"`)))
  return line === undefined ? undefined : Number(line.split(' ').at(-1))
}

t.test('every labelled series exists at 0 before anything happened, and again after reset()', async t => {
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const expectZero = (text: string): void => {
    for (const [name, labels] of [
      ['mcpgw_gaps_total', { reason: 'trimmed' }], ['mcpgw_gaps_total', { reason: 'recorder_lost' }], ['mcpgw_gaps_total', { reason: 'upstream_handover' }],
      ['mcpgw_store_errors_total', { op: 'append' }], ['mcpgw_store_errors_total', { op: 'lease_acquire' }],
      ['mcpgw_upstream_errors_total', { kind: 'request' }], ['mcpgw_upstream_errors_total', { kind: 'stream_broken' }],
      ['mcpgw_events_unrecorded_total', { reason: 'store_error' }], ['mcpgw_append_resends_total', { outcome: 'recorded' }],
      ['mcpgw_streams_closed_total', { kind: 'request', outcome: 'session_deleted' }], ['mcpgw_streams_opened_total', { kind: 'resume' }],
      ['mcpgw_client_streams_open', { kind: 'standalone' }], ['mcpgw_upstream_streams_open', { kind: 'request' }],
      ['mcpgw_resumes_total', { outcome: 'refused' }], ['mcpgw_store_operation_duration_seconds_count', { op: 'read' }],
      ['mcpgw_requests_refused_total', { status: '503', reason: 'draining' }], ['mcpgw_requests_refused_total', { status: '403', reason: 'origin_forbidden' }],
      ['mcpgw_requests_refused_total', { status: '404', reason: 'session_not_found' }], ['mcpgw_requests_refused_total', { status: '502', reason: 'upstream_unavailable' }]
    ] as const) t.equal(sample(text, name, labels), 0, `${name} ${JSON.stringify(labels)}`)
  }
  expectZero(await scrape(metrics))
  metrics.countGap('trimmed')
  metrics.reset()
  expectZero(await scrape(metrics))
})

t.test('refusals: by status and reason; a code outside the known set is "other"', async t => {
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  metrics.countRefusal(429, 'MCPGW_RATE_LIMITED')
  metrics.countRefusal(429, 'MCPGW_RATE_LIMITED')
  metrics.countRefusal(413, 'MCPGW_BODY_TOO_LARGE')
  metrics.countRefusal(415, 'FST_ERR_CTP_INVALID_MEDIA_TYPE')
  const text = await scrape(metrics)
  t.equal(sample(text, 'mcpgw_requests_refused_total', { status: '429', reason: 'rate_limited' }), 2)
  t.equal(sample(text, 'mcpgw_requests_refused_total', { status: '413', reason: 'body_too_large' }), 1)
  t.equal(sample(text, 'mcpgw_requests_refused_total', { status: '415', reason: 'other' }), 1)
})

t.test('the embedded store: bytes, cap, sessions and evictions, read at each scrape', async t => {
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const store = new MemoryEventStore({ retention: { maxEvents: 1000, maxBytes: 1 << 20, ttlMs: 60_000 }, maxBytes: 2000, recordBytes: { session: 0, stream: 0 } })
  t.teardown(() => store.close())
  metrics.watchMemoryStore(store)
  let text = await scrape(metrics)
  t.equal(sample(text, 'mcpgw_memory_store_bytes'), 0)
  t.equal(sample(text, 'mcpgw_memory_store_max_bytes'), 2000)
  t.equal(sample(text, 'mcpgw_memory_store_evictions_total', { what: 'stream' }), 0, 'evictions at 0 from the start')
  const data = 'x'.repeat(400)
  for (const session of ['s1', 's2']) {
    await store.createSession(session, 'p')
    await store.openStream(session, 'a')
    await store.append(session, 'a', [{ data }, { data }])
  }
  text = await scrape(metrics)
  t.equal(sample(text, 'mcpgw_memory_store_sessions'), 2)
  t.ok((sample(text, 'mcpgw_memory_store_bytes') ?? 0) >= 1600, 'the events\' bytes held')
  t.equal(sample(text, 'mcpgw_memory_store_evictions_total', { what: 'stream' }), 0)
  await store.append('s2', 'a', [{ data }, { data }])
  text = await scrape(metrics)
  t.equal(sample(text, 'mcpgw_memory_store_evictions_total', { what: 'stream' }), 1, 'the least recently appended stream emptied')
  t.ok((sample(text, 'mcpgw_memory_store_bytes') ?? Infinity) <= 2000, 'back under the cap')
  text = await scrape(metrics)
  t.equal(sample(text, 'mcpgw_memory_store_evictions_total', { what: 'stream' }), 1, 'a second scrape counts nothing twice')
})

t.test('store connections replaced: 0 from the start, then the totals the store keeps, read at each scrape', async t => {
  const metrics = new GatewayMetrics({ version: 'test', store: 'redis', defaultMetrics: false })
  let text = await scrape(metrics)
  t.equal(sample(text, 'mcpgw_store_connections_replaced_total', { waited: 'ping' }), 0, 'before any store is watched')
  t.equal(sample(text, 'mcpgw_store_connections_replaced_total', { waited: 'handshake' }), 0)
  const replaced = { ping: 0, handshake: 0 }
  metrics.watchStoreConnections(() => replaced)
  replaced.ping = 2
  replaced.handshake = 1
  text = await scrape(metrics)
  t.equal(sample(text, 'mcpgw_store_connections_replaced_total', { waited: 'ping' }), 2)
  t.equal(sample(text, 'mcpgw_store_connections_replaced_total', { waited: 'handshake' }), 1)
  text = await scrape(metrics)
  t.equal(sample(text, 'mcpgw_store_connections_replaced_total', { waited: 'ping' }), 2, 'a second scrape counts nothing twice')
})

t.test('store health: one line when operations start failing, one when they succeed again', async t => {
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const lines: Array<[string, Record<string, unknown>, string]> = []
  metrics.reportStoreHealth({
    warn: (fields: Record<string, unknown>, msg: string) => { lines.push(['warn', fields, msg]) },
    info: (fields: Record<string, unknown>, msg: string) => { lines.push(['info', fields, msg]) }
  } as never)
  await metrics.timeStore('read', async () => 1)
  for (let i = 0; i < 4; i++) await metrics.timeStore('append', async () => { throw new Error('down') }).catch(() => {})
  await metrics.timeStore('read', async () => 1)
  await metrics.timeStore('read', async () => 1)
  t.match(lines, [
    ['warn', { op: 'append', err: { message: 'down' } }, /operations failing/],
    ['info', { failedOperations: 4, downMs: Number }, 'event store: answering again']
  ])
  t.equal(lines.length, 2)
})

t.test('docs/observability.md names every label value the metrics export', async t => {
  const { readFile } = await import('node:fs/promises')
  const doc = await readFile(new URL('../../docs/observability.md', import.meta.url), 'utf8')
  // The watchers' metrics too: eviction kinds (what), endpoint and re-establishment states.
  const metrics = everyMetric()
  // Values that are not a closed set of the code's: bucket bounds, the build's own
  // version, store and Node, and HTTP statuses (the refusal table is checked in refusals.test.ts).
  const open = new Set(['le', 'version', 'node_version', 'store', 'status', 'endpoint'])
  const undocumented = new Set<string>()
  let checked = 0
  for (const metric of await metrics.registry.getMetricsAsJSON()) {
    for (const { labels } of metric.values) {
      for (const [name, value] of Object.entries(labels)) {
        if (open.has(name)) continue
        checked++
        if (!doc.includes(`\`${String(value)}\``)) undocumented.add(`${metric.name}{${name}="${String(value)}"}`)
      }
    }
  }
  t.ok(checked > 50, `label values checked: ${checked}`)
  t.same([...undocumented], [], 'each named in the doc')
})

t.test('docs/observability.md names no label value the metrics do not export', async t => {
  const { readFile } = await import('node:fs/promises')
  const doc = await readFile(new URL('../../docs/observability.md', import.meta.url), 'utf8')
  const exported = new Map<string, Set<string>>()
  for (const metric of await everyMetric().registry.getMetricsAsJSON()) {
    for (const { labels } of metric.values) {
      for (const [name, value] of Object.entries(labels)) {
        const key = `${metric.name}{${name}}`
        exported.set(key, (exported.get(key) ?? new Set()).add(String(value)))
      }
    }
  }
  let checked = 0
  // A table row of a metric with one label: the lower-case words its meaning
  // backquotes are that label's values (variables are upper case, links and
  // headers have other characters).
  for (const [, metric, label, meaning] of doc.matchAll(/^\| `(mcpgw_[a-z_]+)` \| [a-z]+ \| `([a-z_]+)` \| (.*) \|$/gm)) {
    const values = exported.get(`${metric as string}{${label as string}}`)
    if (values === undefined) continue
    for (const [, word] of (meaning as string).matchAll(/`([a-z][a-z0-9_]*)`/g)) {
      checked++
      t.ok(values.has(word as string), `${metric as string}{${label as string}="${word as string}"}`)
    }
  }
  t.ok(checked > 25, `label values named in the doc's tables: ${checked}`)
})

/**
 * Never called: `npm run typecheck` (which covers the tests) fails when a
 * labelled metric takes a value outside its closed set, as each line expects.
 */
export function closedSetsTypeCheck (metrics: GatewayMetrics): void {
  // @ts-expect-error -- not a close outcome (CLOSE_OUTCOMES)
  metrics.streamsClosed.inc({ kind: 'standalone', outcome: 'timeout' })
  // @ts-expect-error -- not a stream kind (STREAM_KINDS)
  metrics.streamsOpened.inc({ kind: 'standalone-stream' })
  // @ts-expect-error -- not a stream kind (STREAM_KINDS)
  metrics.clientStreamsOpen.dec({ kind: 'post' })
  // @ts-expect-error -- not a store operation (STORE_OPS)
  metrics.storeErrors.inc({ op: 'append_batch' })
  // @ts-expect-error -- not a left-behind outcome
  metrics.upstreamSessionsLeftBehind.inc({ outcome: 'deleted' })
}
