// The example environment files in config/ must only set variables the gateway
// knows, with values it accepts, in a format docker --env-file and
// kubectl create configmap --from-env-file read the same way.
import t from 'tap'
import { readdir, readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { ConfigSchema } from '../../src/config/schema.js'
import { loadConfig } from '../../src/config/load.js'

const CONFIG_DIR = join(import.meta.dirname, '..', '..', 'config')
const known = new Set(Object.keys(ConfigSchema.properties))

interface EnvFile { values: Record<string, string>, commentedOut: string[], problems: string[] }

function parseEnvFile (text: string): EnvFile {
  const values: Record<string, string> = {}
  const commentedOut: string[] = []
  const problems: string[] = []
  text.split('\n').forEach((line, i) => {
    const where = `line ${i + 1}`
    if (line.trim() === '') return
    const commented = /^#\s*([A-Z][A-Z0-9_]*)=/.exec(line)
    if (commented !== null) { commentedOut.push(commented[1] as string); return }
    if (line.startsWith('#')) return
    const match = /^([A-Z][A-Z0-9_]*)=(.*)$/.exec(line)
    if (match === null) { problems.push(`${where}: not KEY=value`); return }
    const [, key, value] = match as unknown as [string, string, string]
    if (/^["']/.test(value)) problems.push(`${where}: ${key} is quoted (docker --env-file keeps the quotes)`)
    if (/\s#/.test(value)) problems.push(`${where}: ${key} has an inline comment (it would be part of the value)`)
    if (value !== value.trim()) problems.push(`${where}: ${key} has surrounding spaces`)
    if (key in values) problems.push(`${where}: ${key} is set twice`)
    values[key] = value
  })
  return { values, commentedOut, problems }
}

t.test('the parser rejects what env-file readers disagree on', async t => {
  const parsed = parseEnvFile('A=1\nB="x"\nC=1 # note\nnot a line\n# D=2\nA=3\n')
  t.same(parsed.problems, [
    'line 2: B is quoted (docker --env-file keeps the quotes)',
    'line 3: C has an inline comment (it would be part of the value)',
    'line 4: not KEY=value',
    'line 6: A is set twice'
  ])
  t.same(parsed.commentedOut, ['D'])
})

const files = (await readdir(CONFIG_DIR)).filter(f => f.endsWith('.env')).sort()

t.test('the expected example files exist', async t => {
  t.same(files, ['kubernetes.env', 'redis-cluster.env', 'sidecar.env'])
})

for (const file of files) {
  t.test(file, async t => {
    const { values, commentedOut, problems } = parseEnvFile(await readFile(join(CONFIG_DIR, file), 'utf8'))
    t.same(problems, [], 'well-formed')
    const unknown = Object.keys(values).filter(k => !known.has(k))
    t.same(unknown, [], 'every variable set is in ConfigSchema')
    const strayComments = commentedOut.filter(k => !known.has(k))
    t.same(strayComments, [], 'every commented-out alternative is in ConfigSchema')
    t.doesNotThrow(() => loadConfig(values), 'the gateway accepts the values')
  })
}

t.test('redis-cluster.env shows the three highly available topologies, one active', async t => {
  const { values, commentedOut } = parseEnvFile(await readFile(join(CONFIG_DIR, 'redis-cluster.env'), 'utf8'))
  t.ok('REDIS_CLUSTER_NODES' in values, 'Redis Cluster is the active example')
  for (const alternative of ['REDIS_SENTINELS', 'REDIS_SENTINEL_NAME', 'REDIS_URL']) {
    t.ok(commentedOut.includes(alternative), `${alternative} is shown as a commented-out alternative`)
  }
  // Each commented-out alternative must itself be accepted once swapped in.
  const sentinel = { ...values, REDIS_CLUSTER_NODES: '', REDIS_SENTINELS: 'sentinel-0:26379', REDIS_SENTINEL_NAME: 'mymaster' }
  t.doesNotThrow(() => loadConfig(sentinel), 'the Sentinel alternative')
  const url = { ...values, REDIS_CLUSTER_NODES: '', REDIS_PASSWORD: '', REDIS_TLS: '', REDIS_URL: 'rediss://default:x@redis:6380' }
  t.doesNotThrow(() => loadConfig(url), 'the primary-endpoint alternative')
})
