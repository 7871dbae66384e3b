// deploy/prometheus/alerts.yml: valid rules (`promtool check rules`), each alert
// unit-tested (`promtool test rules` on alerts.test.yml: fires for a release in
// trouble, stays quiet for a healthy one), and only metrics, labels and label
// values the gateway exports: the alerts' selectors and groupings, and the rule
// tests' input series and expected labels, against the code's own sets.
// promtool comes from Debian's prometheus package (scripts/install-packaging-tools.sh);
// without it the promtool checks are skipped, except in CI.
import t from 'tap'
import { execFile } from 'node:child_process'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { parse as parseYaml } from 'yaml'
import { statusClass } from '../../src/metrics/metrics.js'
import { ROUTED_METHODS } from '../../src/routes/forward.js'
import type { EventStore } from '../../src/store/contract.js'
import { externalTool } from '../fixtures/external-tools.js'
import { everyMetric } from '../fixtures/metrics.js'

const run = promisify(execFile)
const ROOT = join(import.meta.dirname, '..', '..')
const RULES = join(ROOT, 'deploy', 'prometheus', 'alerts.yml')
const RULE_TESTS = join(ROOT, 'deploy', 'prometheus', 'alerts.test.yml')
const tool = await externalTool('promtool')

async function promtool (file: string, args: string[]): Promise<{ code: number, output: string }> {
  return await run(file, args, { cwd: ROOT }).then(
    r => ({ code: 0, output: r.stdout + r.stderr }),
    (err: { code?: number | string, stdout?: string, stderr?: string }) => ({ code: typeof err.code === 'number' ? err.code : -1, output: `${String(err.code)} ${err.stdout ?? ''}${err.stderr ?? ''}` })
  )
}

interface Rule { alert: string, expr: string, labels?: Record<string, string>, annotations?: Record<string, string> }
const rules = (parseYaml(await readFile(RULES, 'utf8')) as { groups: Array<{ rules: Rule[] }> }).groups.flatMap(g => g.rules)
const ruleTests = parseYaml(await readFile(RULE_TESTS, 'utf8')) as { tests: Array<{ alert_rule_test: Array<{ alertname: string, exp_alerts: unknown[] }> }> }

t.test('promtool check rules', { skip: tool.skip }, async t => {
  const command = tool.require(t)
  if (command === undefined) return
  const { code, output } = await promtool(command.file, ['check', 'rules', RULES])
  t.equal(code, 0, output)
})

t.test('promtool test rules', { skip: tool.skip }, async t => {
  const command = tool.require(t)
  if (command === undefined) return
  const { code, output } = await promtool(command.file, ['test', 'rules', RULE_TESTS])
  t.equal(code, 0, output)
})

t.test('every alert is tested firing and quiet', async t => {
  for (const rule of rules) {
    const cases = ruleTests.tests.flatMap(c => c.alert_rule_test).filter(c => c.alertname === rule.alert)
    t.ok(cases.some(c => c.exp_alerts.length > 0), `${rule.alert} fires in a test`)
    t.ok(cases.some(c => c.exp_alerts.length === 0), `${rule.alert} stays quiet in a test`)
    t.match(rule.labels?.severity, /^(critical|warning)$/, `${rule.alert} has a severity`)
    t.type(rule.annotations?.summary, 'string', `${rule.alert} has a summary`)
    t.type(rule.annotations?.description, 'string', `${rule.alert} has a description`)
  }
})

/**
 * Labels Prometheus gives every series from its scrape target (a
 * ServiceMonitor adds namespace, pod, container and service), whatever the metric.
 */
const TARGET_LABELS = new Set(['namespace', 'job', 'instance', 'pod', 'container', 'service'])
/** Labels with no closed set: a bucket bound, the build's own version and Node, an endpoint's address. */
const OPEN_LABELS = new Set(['le', 'version', 'node_version', 'endpoint'])
/** Every kind of event store once: a kind added to EventStore and missing here does not compile. */
const STORE_KINDS = Object.keys({ memory: true, redis: true } satisfies Record<EventStore['kind'], true>)
/**
 * Label values not exported at 0 from the start (they come with the first
 * request, or from the build), from the code's own sets.
 */
const NOT_PRE_EXPORTED: Readonly<Record<string, Readonly<Record<string, readonly string[]>>>> = {
  mcpgw_upstream_request_duration_seconds: {
    method: ROUTED_METHODS,
    status_class: [...new Set(Array.from({ length: 500 }, (_, n) => statusClass(100 + n)))]
  },
  mcpgw_build_info: { store: STORE_KINDS }
}

/**
 * Each gateway metric's labels and every value each can take: the values
 * every series is exported with at 0 (with every watcher registered), and
 * NOT_PRE_EXPORTED's; undefined for an open label.
 */
async function gatewayLabels (): Promise<Map<string, Map<string, Set<string> | undefined>>> {
  const metrics = everyMetric()
  const known = new Map<string, Map<string, Set<string> | undefined>>()
  for (const metric of await metrics.registry.getMetricsAsJSON()) {
    const labelNames = (metrics.registry.getSingleMetric(metric.name) as unknown as { labelNames: readonly string[] }).labelNames
    const labels = new Map<string, Set<string> | undefined>()
    for (const name of labelNames) labels.set(name, OPEN_LABELS.has(name) ? undefined : new Set(NOT_PRE_EXPORTED[metric.name]?.[name]))
    // A histogram's buckets carry le besides its own labels.
    if (String(metric.type) === 'histogram') labels.set('le', undefined)
    for (const { labels: values } of metric.values) {
      for (const [name, value] of Object.entries(values)) labels.get(name)?.add(String(value))
    }
    known.set(metric.name, labels)
  }
  return known
}
const known = await gatewayLabels()

/** The gateway metric a series name belongs to (a histogram's _bucket, _count and _sum are its own). */
function metricOf (series: string): string | undefined {
  if (known.has(series)) return series
  const base = series.replace(/_(bucket|count|sum)$/, '')
  return known.has(base) ? base : undefined
}

interface Matcher { label: string, op: string, value: string }

/** `label="v"`, `label!="v"`, `label=~"a|b"`, `label!~"a|b"` within a selector's braces. */
function matchers (braces: string): Matcher[] {
  return [...braces.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"/g)]
    .map(m => ({ label: m[1] as string, op: m[2] as string, value: m[3] as string }))
}

/**
 * What is wrong with a matcher on a gateway metric, or undefined: a label the
 * metric does not have, or a value it never takes. A regular expression that
 * is an alternation of plain words needs each word to be a value; any other
 * needs to match one.
 */
function problem (metric: string, { label, op, value }: Matcher): string | undefined {
  const labels = known.get(metric) as Map<string, Set<string> | undefined>
  if (!labels.has(label)) return `${metric} has no label ${label} (it has ${[...labels.keys()].join(', ') || 'none'})`
  const values = labels.get(label)
  if (values === undefined) return undefined
  const unknown = (v: string): string => `${metric}{${label}} is never "${v}" (it takes ${[...values].join(', ')})`
  if (op === '=' || op === '!=') return values.has(value) ? undefined : unknown(value)
  if (/^\w+(\|\w+)*$/.test(value)) return value.split('|').filter(v => !values.has(v)).map(unknown).join('; ') || undefined
  const re = new RegExp(`^(?:${value})$`)
  return [...values].some(v => re.test(v)) ? undefined : `${metric}{${label}${op}"${value}"} matches none of ${[...values].join(', ')}`
}

t.test('the code\'s metrics and label values, with every watcher registered', async t => {
  t.ok(known.size > 30, `gateway metrics (${known.size})`)
  for (const [metric, labels] of known) {
    for (const [label, values] of labels) {
      if (values !== undefined) t.ok(values.size > 0, `${metric}{${label}}: its values are known`)
    }
  }
})

t.test('alerts read only metrics, labels and label values the gateway exports (or Prometheus and kube-state-metrics do)', async t => {
  let checked = 0
  for (const rule of rules) {
    const expr = rule.expr.replace(/\s+/g, ' ')
    const read = new Set<string>()
    for (const [, name, braces] of expr.matchAll(/\b(mcpgw_[a-z_]+)(?:\s*\{([^}]*)\})?/g)) {
      const metric = metricOf(name as string)
      t.ok(metric, `${rule.alert}: ${name as string} is a gateway metric`)
      if (metric === undefined) continue
      read.add(metric)
      for (const matcher of matchers(braces ?? '').filter(m => !TARGET_LABELS.has(m.label))) {
        checked++
        const wrong = problem(metric, matcher)
        t.notOk(wrong, `${rule.alert}: ${name as string}{${matcher.label}${matcher.op}"${matcher.value}"}`, { wrong })
      }
    }
    // Grouping and matching by a label the metrics read do not have drops it silently.
    for (const [, list] of expr.matchAll(/\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)/g)) {
      for (const label of (list as string).split(',').map(l => l.trim()).filter(l => l !== '' && !TARGET_LABELS.has(l))) {
        checked++
        const has = [...read].some(metric => known.get(metric)?.has(label) === true)
        t.ok(has, `${rule.alert}: grouped or matched by ${label}, a label of ${[...read].join(', ') || 'no gateway metric'} or of the target`)
      }
    }
  }
  t.ok(checked > 2, `selectors and groupings checked (${checked})`)
})

t.test('the rule tests feed only series the gateway exports, and expect only its label values', async t => {
  const ruleTestFile = parseYaml(await readFile(RULE_TESTS, 'utf8')) as {
    tests: Array<{ name: string, input_series: Array<{ series: string }>, alert_rule_test: Array<{ alertname: string, exp_alerts: Array<{ exp_labels?: Record<string, string> }> }> }>
  }
  let checked = 0
  for (const test of ruleTestFile.tests) {
    for (const { series } of test.input_series) {
      const [, name, braces] = /^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$/.exec(series) ?? []
      t.ok(name, `"${test.name}": ${series} parses`)
      // Other programs' series (up, kube-state-metrics'): not the gateway's to check.
      if (name === undefined || !name.startsWith('mcpgw_')) continue
      const metric = metricOf(name)
      t.ok(metric, `"${test.name}": ${name} is a gateway metric`)
      if (metric === undefined) continue
      for (const matcher of matchers(braces ?? '').filter(m => !TARGET_LABELS.has(m.label))) {
        checked++
        const wrong = problem(metric, matcher)
        t.notOk(wrong, `"${test.name}": ${series}: ${matcher.label}="${matcher.value}"`, { wrong })
      }
    }
    for (const { alertname, exp_alerts: alerts } of test.alert_rule_test) {
      const rule = rules.find(r => r.alert === alertname)
      t.ok(rule, `"${test.name}": ${alertname} is an alert of alerts.yml`)
      const read = [...(rule?.expr ?? '').matchAll(/\bmcpgw_[a-z_]+/g)].map(([name]) => metricOf(name)).filter(m => m !== undefined)
      for (const { exp_labels: labels = {} } of alerts) {
        for (const [label, value] of Object.entries(labels)) {
          const metric = read.find(m => known.get(m)?.has(label) === true)
          if (metric === undefined) continue
          checked++
          const wrong = problem(metric, { label, op: '=', value: String(value) })
          t.notOk(wrong, `"${test.name}": ${alertname} expected with ${label}="${String(value)}"`, { wrong })
        }
      }
    }
  }
  t.ok(checked > 20, `input series labels and expected labels checked (${checked})`)
})

t.test('docs/alerts.md explains every alert', async t => {
  const doc = await readFile(join(ROOT, 'docs', 'alerts.md'), 'utf8')
  for (const rule of rules) t.match(doc, new RegExp(`^## ${rule.alert}$`, 'm'), rule.alert)
})
