// config/REFERENCE.md must document exactly the variables of ConfigSchema, in its
// order, with its current defaults. Regenerate it with
//   npm run build && node scripts/gen-config-reference.mjs
import t from 'tap'
import { readFile } from 'node:fs/promises'
import { ConfigSchema } from '../../src/config/schema.js'
import { REFERENCE_PATH, formatDefault, renderConfigReference } from '../../scripts/gen-config-reference.mjs'

const REGENERATE = 'run `npm run build && node scripts/gen-config-reference.mjs`'

interface ReferenceRow { name: string, defaultCell: string }

/** The rows of the reference table: `| \`NAME\` | default | type | description |`. */
function parseReferenceTable (markdown: string): ReferenceRow[] {
  const rows: ReferenceRow[] = []
  for (const line of markdown.split('\n')) {
    const match = /^\|\s*`([A-Z][A-Z0-9_]*)`\s*\|\s*((?:[^|\\]|\\.)*?)\s*\|/.exec(line)
    if (match !== null) rows.push({ name: match[1] as string, defaultCell: match[2] as string })
  }
  return rows
}

type Schema = typeof ConfigSchema

/** Every way the reference disagrees with the schema; empty when in sync. */
function referenceProblems (markdown: string, schema: Schema): string[] {
  const problems: string[] = []
  const rows = parseReferenceTable(markdown)
  const documented = rows.map(r => r.name)
  const expected = Object.keys(schema.properties)
  const required = schema.required ?? []
  for (const name of expected) {
    if (!documented.includes(name)) problems.push(`${name} is missing`)
  }
  for (const name of documented) {
    if (!expected.includes(name)) problems.push(`${name} is not in ConfigSchema`)
  }
  if (new Set(documented).size !== documented.length) problems.push('a variable is listed twice')
  const inBoth = documented.filter(n => expected.includes(n))
  if (inBoth.join() !== expected.filter(n => documented.includes(n)).join()) {
    problems.push('variables are not in the schema\'s order')
  }
  for (const row of rows) {
    const property = (schema.properties as Record<string, { default?: unknown }>)[row.name]
    if (property === undefined) continue
    const want = formatDefault(row.name, property, required)
    if (row.defaultCell !== want) problems.push(`${row.name}: default is ${row.defaultCell}, schema says ${want}`)
  }
  return problems
}

const reference = await readFile(REFERENCE_PATH, 'utf8')

t.test('the checker catches a stale reference', async t => {
  const good = renderConfigReference(ConfigSchema)
  t.same(referenceProblems(good, ConfigSchema), [], 'generated text is in sync by construction')

  const missing = good.split('\n').filter(l => !l.startsWith('| `PORT`')).join('\n')
  t.same(referenceProblems(missing, ConfigSchema), ['PORT is missing'])

  const extra = good + '| `NOT_A_SETTING` | `1` | integer | nothing |\n'
  t.same(referenceProblems(extra, ConfigSchema), ['NOT_A_SETTING is not in ConfigSchema'])

  const staleDefault = good.replace('| `PORT` | `8080` |', '| `PORT` | `8000` |')
  t.same(referenceProblems(staleDefault, ConfigSchema), ['PORT: default is `8000`, schema says `8080`'])

  const wrongKind = good.replace('| `UPSTREAM_URL` | *required* |', '| `UPSTREAM_URL` | *unset* |')
  t.same(referenceProblems(wrongKind, ConfigSchema), ['UPSTREAM_URL: default is *unset*, schema says *required*'])

  const lines = good.split('\n')
  const a = lines.findIndex(l => l.startsWith('| `HOST`'))
  const b = lines.findIndex(l => l.startsWith('| `PORT`'))
  ;[lines[a], lines[b]] = [lines[b] as string, lines[a] as string]
  t.same(referenceProblems(lines.join('\n'), ConfigSchema), ['variables are not in the schema\'s order'])
})

t.test('REFERENCE.md lists exactly the schema\'s variables with their defaults', async t => {
  const problems = referenceProblems(reference, ConfigSchema)
  t.same(problems, [], `config/REFERENCE.md agrees with src/config/schema.ts (if not: ${REGENERATE})`)
  t.equal(parseReferenceTable(reference).length, Object.keys(ConfigSchema.properties).length, 'one row per variable')
})

t.test('REFERENCE.md is exactly the generator\'s output (descriptions and types too)', async t => {
  t.equal(reference, renderConfigReference(ConfigSchema), `config/REFERENCE.md is the generator's output (if not: ${REGENERATE})`)
})
