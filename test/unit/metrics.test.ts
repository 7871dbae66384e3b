// Store operations timed into the histogram by operation, failures counted
// (src/metrics/metrics.ts).
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { GatewayMetrics } from '../../src/metrics/metrics.js'

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
  t.same(errors.map(v => [v.labels.op, v.value]), [['read', 1]], 'and counted, by operation')
  metrics.registry.resetMetrics()
  await metrics.timeStore('read', async () => 1)
  t.equal((await histogram(metrics, 'read')).count, 1, 'after a reset, counted from zero again')
})
