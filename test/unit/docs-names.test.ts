// The names the docs give users must exist: every configuration variable
// (a backquoted name whose first word starts one of the schema's variables) is
// in src/config/schema.ts, and every mcpgw_ metric is one the gateway exports.
import t from 'tap'
import { readFile, readdir } from 'node:fs/promises'
import { join } from 'node:path'
import { ConfigSchema } from '../../src/config/schema.js'
import { everyMetric } from '../fixtures/metrics.js'

const ROOT = join(import.meta.dirname, '..', '..')
const docs = ['README.md', ...(await readdir(join(ROOT, 'docs'))).filter(f => f.endsWith('.md')).map(f => `docs/${f}`)]
const texts = await Promise.all(docs.map(async file => ({ file, text: await readFile(join(ROOT, file), 'utf8') })))

/** Named in docs without being variables of the gateway: Kubernetes' service variables, the tests' own, other programs'. */
const NOT_GATEWAY_VARIABLES = new Set(['REDIS_PORT', 'REDIS_SERVICE_HOST', 'REDIS_PORT_6379_TCP_ADDR', 'TEST_REDIS_URL', 'TEST_NODE22', 'REPLICA_LOGS', 'CONFORMANCE_TRACE', 'CONFORMANCE_LOG_LEVEL', 'NODE_OPTIONS', 'NODE_ENV'])

t.test('every configuration variable the docs name is in the schema', async t => {
  const variables = new Set(Object.keys(ConfigSchema.properties))
  const firstWords = new Set([...variables].map(v => v.split('_')[0] as string))
  let checked = 0
  for (const { file, text } of texts) {
    for (const [, name] of text.matchAll(/`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)(?:=[^`]*)?`/g)) {
      const variable = name as string
      if (!firstWords.has(variable.split('_')[0] as string) || NOT_GATEWAY_VARIABLES.has(variable)) continue
      checked++
      t.ok(variables.has(variable), `${file}: ${variable}`)
    }
  }
  t.ok(checked > 50, `variables found in the docs (${checked})`)
})

t.test('every mcpgw_ metric the docs name is exported', async t => {
  const metrics = everyMetric()
  const exported = new Set((await metrics.registry.getMetricsAsJSON()).map(m => m.name))
  let checked = 0
  for (const { file, text } of texts) {
    // A name, not a prefix (`mcpgw_memory_store_*`).
    for (const [name] of text.matchAll(/\bmcpgw_[a-z_]*[a-z](?![a-z_*])/g)) {
      const base = name.replace(/_(bucket|count|sum)$/, '')
      checked++
      t.ok(exported.has(name) || exported.has(base), `${file}: ${name}`)
    }
  }
  t.ok(checked > 20, `metrics found in the docs (${checked})`)
})

t.test('docs/source-layout.md names every source file', async t => {
  const layout = texts.find(d => d.file === 'docs/source-layout.md')?.text ?? ''
  const named = new Set([...layout.matchAll(/`([\w./-]+\.ts)`/g)].map(m => m[1] as string))
  const files = (await readdir(join(ROOT, 'src'), { recursive: true })).filter(f => f.endsWith('.ts') && !f.endsWith('.d.ts'))
  // A file's row is in its folder's section, named from there (`redis/read.ts` under store/),
  // or in "Other folders" by its folder alone (`tracing/`).
  const folderRows = new Set([...layout.matchAll(/^\| `(\w+)\/` \|/gm)].map(m => m[1] as string))
  for (const file of files) {
    const parts = file.split('/')
    const found = parts.some((_, i) => named.has(parts.slice(i).join('/'))) || folderRows.has(parts[0] as string)
    t.ok(found, file)
  }
  t.ok(files.length > 100, `source files found (${files.length})`)
})
