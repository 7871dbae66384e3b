// Writes config/REFERENCE.md from the gateway's configuration schema, so the
// reference can never disagree with what the gateway accepts.
//
//   npm run build && node scripts/gen-config-reference.mjs          (write)
//   npm run build && node scripts/gen-config-reference.mjs --check  (exit 1 if stale)
//
// Plain JavaScript on purpose: it runs on the compiled schema (dist/) with no
// TypeScript loader. test/packaging/config-reference.test.ts imports
// renderConfigReference() and fails when config/REFERENCE.md is out of date.
import { readFile, writeFile } from 'node:fs/promises'
import { fileURLToPath, pathToFileURL } from 'node:url'

export const REFERENCE_PATH = fileURLToPath(new URL('../config/REFERENCE.md', import.meta.url))

const HEADER = `# Configuration reference

<!-- Generated from src/config/schema.ts by scripts/gen-config-reference.mjs: do not edit.
     Regenerate with: npm run build && node scripts/gen-config-reference.mjs -->

The gateway reads its configuration from environment variables only. They are
validated once at start-up: every problem is reported together and the process
exits before listening. Variables the gateway does not know are ignored, and an
empty value counts as unset.

Example files: [sidecar.env](sidecar.env), [kubernetes.env](kubernetes.env),
[redis-cluster.env](redis-cluster.env). Redis settings for the event store:
[redis.conf](redis.conf).

| Variable | Default | Type | Description |
| --- | --- | --- | --- |
`

/** The Default cell: the schema default, or whether the variable is required. */
export function formatDefault (name, property, required) {
  if (property.default !== undefined) return `\`${String(property.default)}\``
  return required.includes(name) ? '*required*' : '*unset*'
}

/** The Type cell, from the JSON Schema TypeBox produces. */
export function formatType (property) {
  const literals = property.enum ?? property.anyOf?.map(s => s.const)
  if (literals !== undefined && literals.every(v => v !== undefined)) {
    return `one of ${literals.map(v => `\`${String(v)}\``).join(', ')}`
  }
  const type = String(property.type)
  const { minimum, maximum } = property
  if (minimum !== undefined && maximum !== undefined) return `${type}, ${minimum}–${maximum}`
  if (minimum !== undefined) return `${type}, ≥ ${minimum}`
  if (maximum !== undefined) return `${type}, ≤ ${maximum}`
  return type
}

function cell (text) {
  return text.replace(/\|/g, '\\|').replace(/\s*\n\s*/g, ' ')
}

/**
 * The whole REFERENCE.md for a TypeBox object schema: one table row per
 * property, in the schema's order.
 * @param {{ properties: Record<string, any>, required?: string[] }} schema
 * @returns {string}
 */
export function renderConfigReference (schema) {
  const required = schema.required ?? []
  const rows = Object.entries(schema.properties).map(([name, property]) =>
    `| \`${name}\` | ${formatDefault(name, property, required)} | ${cell(formatType(property))} | ${cell(property.description ?? '')} |`
  )
  return HEADER + rows.join('\n') + '\n'
}

async function main () {
  const compiled = new URL('../dist/src/config/schema.js', import.meta.url)
  let ConfigSchema
  try {
    ({ ConfigSchema } = await import(compiled.href))
  } catch (err) {
    console.error(`cannot load ${fileURLToPath(compiled)}: run \`npm run build\` first (${err.message})`)
    process.exit(1)
  }
  const text = renderConfigReference(ConfigSchema)
  if (process.argv.includes('--check')) {
    const current = await readFile(REFERENCE_PATH, 'utf8').catch(() => '')
    if (current !== text) {
      console.error('config/REFERENCE.md is out of date: run node scripts/gen-config-reference.mjs')
      process.exit(1)
    }
    return
  }
  await writeFile(REFERENCE_PATH, text)
  console.log(`wrote ${REFERENCE_PATH}`)
}

if (process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href) {
  await main()
}
