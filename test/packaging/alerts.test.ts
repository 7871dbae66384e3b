// deploy/prometheus/alerts.yml: valid rules (`promtool check rules`), each alert
// unit-tested (`promtool test rules` on alerts.test.yml: fires for a release in
// trouble, stays quiet for a healthy one), and only metrics the gateway exports.
// promtool comes from Debian's prometheus package (scripts/install-packaging-tools.sh);
// without it the promtool checks are skipped, except in CI.
import t from 'tap'
import { execFile } from 'node:child_process'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { parse as parseYaml } from 'yaml'
import { externalTool } from '../fixtures/external-tools.js'

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

t.test('alerts read only metrics the gateway exports (or Prometheus and kube-state-metrics do)', async t => {
  const metrics = await readFile(join(ROOT, 'src', 'metrics', 'metrics.ts'), 'utf8')
  const exported = new Set([...metrics.matchAll(/name: `\$\{p\}([a-z_]+)`/g)].map(m => `mcpgw_${m[1] as string}`))
  t.ok(exported.size > 10, 'metric names found in src/metrics/metrics.ts')
  for (const rule of rules) {
    for (const [name] of rule.expr.matchAll(/\bmcpgw_[a-z_]+/g)) {
      const base = name.replace(/_(count|sum|bucket)$/, '')
      t.ok(exported.has(name) || exported.has(base), `${rule.alert}: ${name}`)
    }
  }
})

t.test('docs/alerts.md explains every alert', async t => {
  const doc = await readFile(join(ROOT, 'docs', 'alerts.md'), 'utf8')
  for (const rule of rules) t.match(doc, new RegExp(`^## ${rule.alert}$`, 'm'), rule.alert)
})
