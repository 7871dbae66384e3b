// The table of refusals (REFUSALS in src/errors.ts) is the one source: every
// error factory builds a refusal of it with its status and JSON-RPC code, the
// refusal counter counts each under its own reason, and the docs' table lists
// exactly its statuses and reasons.
import t from 'tap'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { REFUSALS, errors, isRefusalCode, type GatewayError } from '../../src/errors.js'
import { GatewayMetrics } from '../../src/metrics/metrics.js'

const ROOT = join(import.meta.dirname, '..', '..')

/** Every factory called (arguments do not matter here, only what it builds). */
const made: GatewayError[] = Object.values(errors).map(make => (make as (...args: unknown[]) => GatewayError)('x', 'y'))

function sample (text: string, labels: Record<string, string>): number {
  const line = text.split('\n').find(l => l.startsWith('mcpgw_requests_refused_total{') && Object.entries(labels).every(([k, v]) => l.includes(`${k}="${v}"`)))
  return line === undefined ? Number.NaN : Number(line.split(' ').at(-1))
}

t.test('every factory builds a refusal of the table, with its status and JSON-RPC code', async t => {
  for (const error of made) {
    t.ok(isRefusalCode(error.code), `${error.code} is in REFUSALS`)
    if (!isRefusalCode(error.code)) continue
    t.equal(error.statusCode, REFUSALS[error.code].status, `${error.code}: status`)
    t.equal(error.rpcCode, REFUSALS[error.code].rpcCode, `${error.code}: JSON-RPC code`)
  }
  t.same([...new Set(made.map(e => e.code))].sort(), Object.keys(REFUSALS).sort(), 'every code of the table has a factory')
})

t.test('reasons: one per code, lower case, none called other', async t => {
  const reasons = Object.values(REFUSALS).map(r => r.reason)
  t.equal(new Set(reasons).size, reasons.length, 'no two codes share a reason')
  for (const [code, { reason }] of Object.entries(REFUSALS)) t.equal(reason, code.replace(/^MCPGW_/, '').toLowerCase(), code)
})

t.test('every refusal is counted under its own reason', async t => {
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  for (const error of made) metrics.countRefusal(error.statusCode, error.code)
  const text = await metrics.registry.metrics()
  for (const [code, { status, reason }] of Object.entries(REFUSALS)) {
    t.equal(sample(text, { status: String(status), reason }), made.filter(e => e.code === code).length, `${code} as ${reason}`)
  }
  t.ok(Number.isNaN(sample(text, { reason: 'other' })) || sample(text, { reason: 'other' }) === 0, 'nothing as other')
  t.equal(sample(text, { status: '400', reason: 'bad_session_id' }), 1, 'MCPGW_BAD_SESSION_ID')
  t.equal(sample(text, { status: '413', reason: 'body_too_large' }), 1, 'MCPGW_BODY_TOO_LARGE')
})

t.test('docs/observability.md lists exactly the table\'s statuses and reasons', async t => {
  const doc = await readFile(join(ROOT, 'docs', 'observability.md'), 'utf8')
  const section = doc.slice(doc.indexOf('`reason` of a refusal'), doc.indexOf('Any other refusal'))
  const documented = [...section.matchAll(/^\| (\d{3}) \| (.+) \|$/gm)]
    .flatMap(m => [...(m[2] as string).matchAll(/`(\w+)`/g)].map(r => `${m[1] as string} ${r[1] as string}`))
  const table = Object.values(REFUSALS).map(r => `${r.status} ${r.reason}`)
  t.same(documented.sort(), table.sort())
})
