// grafana/dashboard.json: valid JSON Grafana can import, a datasource variable every
// panel uses, a layout without overlaps, and queries that only name metrics (and
// labels) the gateway registers, so a renamed metric cannot leave a silent empty
// panel. Every mcpgw_ metric is shown somewhere, and every panel has data on a
// healthy gateway's real scrape.
import t from 'tap'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { GatewayMetrics } from '../../src/metrics/metrics.js'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startGateway } from '../fixtures/gateway.js'
import { metrics as scrape } from '../fixtures/hardening.js'
import { connectClient } from '../fixtures/mcp-client.js'

interface Target { expr?: string, datasource?: { uid?: string } }
interface Panel { id: number, type: string, title: string, gridPos: { x: number, y: number, w: number, h: number }, datasource?: { type?: string, uid?: string }, targets?: Target[], panels?: Panel[] }

const dashboard = JSON.parse(await readFile(join(import.meta.dirname, '..', '..', 'grafana', 'dashboard.json'), 'utf8')) as {
  title: string, uid: string, schemaVersion: number, panels: Panel[], templating: { list: Array<{ name: string, type: string, query: unknown }> }
}
const metrics = new GatewayMetrics({ version: 'test', store: 'memory' })
const registered = new Map<string, { type: string, labels: string[] }>()
for (const m of await metrics.registry.getMetricsAsJSON()) {
  const single = metrics.registry.getSingleMetric(m.name) as unknown as { labelNames?: string[] } | undefined
  registered.set(m.name, { type: String(m.type), labels: single?.labelNames ?? [] })
}

const panels = dashboard.panels.flatMap(p => [p, ...(p.panels ?? [])])
const queryPanels = panels.filter(p => p.type !== 'row')
const exprs = queryPanels.flatMap(p => (p.targets ?? []).map(target => ({ panel: p.title, expr: target.expr ?? '' })))

/** PromQL functions, keywords and label names that look like metric names. */
const NOT_METRICS = new Set(['sum', 'rate', 'increase', 'histogram_quantile', 'by', 'without', 'clamp_min', 'count', 'le', 'job', 'instance', 'on', 'ignoring', 'avg', 'max', 'min'])

/** Metric names an expression selects, with histogram/summary suffixes mapped to their family. */
function metricNames (expr: string): string[] {
  const withoutStrings = expr.replace(/"[^"]*"/g, '""').replace(/\{[^}]*\}/g, '{}').replace(/\[[^\]]*\]/g, '[]')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, '')
  const names = new Set<string>()
  for (const m of withoutStrings.matchAll(/\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()/g)) {
    const name = m[1] as string
    if (NOT_METRICS.has(name) || /^\d/.test(name)) continue
    names.add(name)
  }
  return [...names]
}

function family (name: string): string | undefined {
  if (registered.has(name)) return name
  const base = name.replace(/_(bucket|sum|count)$/, '')
  return registered.get(base)?.type === 'histogram' ? base : undefined
}

/** Labels named in `by (...)` clauses. */
function groupingLabels (expr: string): string[] {
  return [...expr.matchAll(/\bby\s*\(([^)]*)\)/g)].flatMap(m => (m[1] as string).split(',').map(s => s.trim()).filter(Boolean))
}

t.test('the expression checker', async t => {
  t.same(metricNames('histogram_quantile(0.99, sum by (le, op) (rate(mcpgw_store_operation_duration_seconds_bucket{job=~"$job"}[$__rate_interval])))'),
    ['mcpgw_store_operation_duration_seconds_bucket'])
  t.same(metricNames('sum(rate(a_total{x="y"}[5m])) / clamp_min(count(b), 1e-9)'), ['a_total', 'b'])
  t.equal(family('mcpgw_replay_events_bucket'), 'mcpgw_replay_events')
  t.equal(family('mcpgw_events_recorded_total_bucket'), undefined, 'suffixes only on histograms')
  t.equal(family('mcpgw_no_such_metric'), undefined)
  t.same(groupingLabels('sum by (method, status_class) (x) + sum by (le) (y)'), ['method', 'status_class', 'le'])
})

t.test('dashboard metadata and datasource variable', async t => {
  t.type(dashboard.title, 'string')
  t.type(dashboard.uid, 'string')
  t.ok(dashboard.schemaVersion >= 36, 'a current schema version')
  const ds = dashboard.templating.list.find(v => v.type === 'datasource')
  t.equal(ds?.name, 'datasource')
  t.equal(ds?.query, 'prometheus')
})

t.test('panels: unique ids, the datasource variable, a layout without overlaps', async t => {
  const ids = panels.map(p => p.id)
  t.equal(new Set(ids).size, ids.length, 'unique panel ids')
  for (const p of queryPanels) {
    // eslint-disable-next-line no-template-curly-in-string -- Grafana variable syntax, not a JS template
    t.equal(p.datasource?.uid, '${datasource}', `${p.title}: uses $datasource`)
    t.ok((p.targets ?? []).length > 0 && (p.targets ?? []).every(target => (target.expr ?? '') !== ''), `${p.title}: has queries`)
  }
  const cells = new Map<string, string>()
  for (const p of dashboard.panels) {
    const { x, y, w, h } = p.gridPos
    t.ok(x >= 0 && w > 0 && x + w <= 24, `${p.title}: within the 24-column grid`)
    for (let i = x; i < x + w; i++) {
      for (let j = y; j < y + h; j++) {
        const other = cells.get(`${i},${j}`)
        if (other !== undefined) t.fail(`${p.title} overlaps ${other}`)
        cells.set(`${i},${j}`, p.title)
      }
    }
  }
})

t.test('queries name only metrics and labels the gateway registers', async t => {
  for (const { panel, expr } of exprs) {
    const names = metricNames(expr)
    t.ok(names.length > 0, `${panel}: selects a metric`)
    const unknown = names.filter(n => family(n) === undefined)
    t.same(unknown, [], `${panel}: ${expr}`)
    const labels = new Set(['le', 'job', 'instance', ...names.flatMap(n => registered.get(family(n) ?? '')?.labels ?? [])])
    t.same(groupingLabels(expr).filter(l => !labels.has(l)), [], `${panel}: grouping labels exist`)
  }
})

t.test('every gateway metric is on the dashboard', async t => {
  const shown = new Set(exprs.flatMap(e => metricNames(e.expr)).map(family))
  const missing = [...registered.keys()].filter(n => n.startsWith('mcpgw_') && !shown.has(n))
  t.same(missing, [], 'add a panel to grafana/dashboard.json for each new mcpgw_ metric')
  for (const name of ['process_resident_memory_bytes', 'process_cpu_seconds_total', 'nodejs_eventloop_lag_p99_seconds']) {
    t.ok(shown.has(name), `process health: ${name}`)
  }
})

t.test('every panel has data on a healthy gateway (a real scrape, after one session and a tool call)', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url)
  const client = await connectClient(`${gw.url}/mcp`)
  t.teardown(() => client.close())
  await client.client.callTool({ name: 'echo', arguments: { text: 'hello' } })
  const scraped = await scrape(gw.adminUrl)
  const series = new Set(scraped.split('\n').filter(l => l !== '' && !l.startsWith('#')).map(l => (/^[a-zA-Z_:][\w:]*/.exec(l) as RegExpExecArray)[0]))
  for (const { panel, expr } of exprs) {
    const empty = metricNames(expr).filter(name => !series.has(name) && !series.has(`${name}_count`))
    t.same(empty, [], `${panel}: every metric it selects has a series (${expr})`)
  }
})
