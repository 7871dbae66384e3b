// Structural checks of the Helm chart, for a machine without a helm binary:
//  - every template is well-formed: control blocks balance, and once each
//    directive is replaced by what it could render (nothing, a scalar, or a block)
//    the manifest parses as YAML with apiVersion/kind/metadata.name;
//  - every .Values path a template reads exists in values.yaml, and every value
//    in values.yaml is read by some template;
//  - every included helper is defined; values.schema.json accepts values.yaml and
//    lists exactly the gateway's configuration variables;
//  - the defaults keep the contract: restricted security context, probes on the
//    admin port, a shutdown budget longer than the drain.
// `helm lint` and `helm template` remain worth running where helm exists.
import t from 'tap'
import { readFile, readdir } from 'node:fs/promises'
import { basename, join } from 'node:path'
import { Ajv } from 'ajv'
import { parse as parseYaml, parseAllDocuments } from 'yaml'
import { ConfigSchema } from '../../src/config/schema.js'

const ROOT = join(import.meta.dirname, '..', '..')
const CHART_DIR = join(ROOT, 'helm', 'mcp-resumable-gateway')
const TEMPLATES_DIR = join(CHART_DIR, 'templates')
/** Variables the chart sets itself; `config` must not set them. */
const MANAGED_BY_CHART = ['PORT', 'ADMIN_PORT', 'SHUTDOWN_GRACE_SECONDS', 'REDIS_URL', 'REDIS_PASSWORD']
const SECRET_VARS = ['REDIS_URL', 'REDIS_PASSWORD']

type Values = Record<string, unknown>

interface Action { start: number, end: number, trimLeft: boolean, trimRight: boolean, body: string }

/** Every `{{ ... }}` of a template, with its trim markers. */
function actionsOf (template: string): Action[] {
  const actions: Action[] = []
  for (const m of template.matchAll(/\{\{(-\s)?([\s\S]*?)(\s-)?\}\}/g)) {
    actions.push({
      start: m.index,
      end: m.index + m[0].length,
      trimLeft: m[1] !== undefined,
      trimRight: m[3] !== undefined,
      body: (m[2] ?? '').trim()
    })
  }
  return actions
}

const OPENERS = ['if', 'range', 'with', 'define', 'block']
const SILENT = [...OPENERS, 'else', 'end', 'break', 'continue']

function keyword (body: string): string {
  return /^([a-z]+)\b/.exec(body)?.[1] ?? ''
}

function isComment (body: string): boolean {
  return body.startsWith('/*')
}

function lineOf (text: string, index: number): number {
  return text.slice(0, index).split('\n').length
}

/** Unbalanced or misplaced control directives (if/range/with/define/block/else/end). */
function controlProblems (template: string): string[] {
  const problems: string[] = []
  const stack: Array<{ word: string, line: number }> = []
  for (const action of actionsOf(template)) {
    if (isComment(action.body)) continue
    const word = keyword(action.body)
    const line = lineOf(template, action.start)
    if (OPENERS.includes(word)) {
      stack.push({ word, line })
    } else if (word === 'else') {
      const top = stack.at(-1)
      if (top === undefined || !['if', 'with', 'range'].includes(top.word)) problems.push(`line ${line}: else outside if/with/range`)
    } else if (word === 'end') {
      if (stack.pop() === undefined) problems.push(`line ${line}: end without an open block`)
    }
  }
  for (const open of stack) problems.push(`line ${open.line}: ${open.word} is never closed`)
  return problems
}

/**
 * The template with each directive replaced by a stand-in for what it renders,
 * honouring `{{-` / `-}}` whitespace trimming: control directives, comments and
 * assignments render nothing; `... | nindent N` and directives alone on their
 * line render a block (a YAML comment at the right indentation, valid in any
 * context); any other directive renders a scalar, HELM.
 */
function renderSkeleton (template: string): string {
  let out = ''
  let cursor = 0
  let trimNext = false
  for (const action of actionsOf(template)) {
    let text = template.slice(cursor, action.start)
    if (trimNext) text = text.replace(/^\s+/, '')
    out += text
    if (action.trimLeft) out = out.replace(/\s+$/, '')
    const lineStart = template.lastIndexOf('\n', action.start - 1) + 1
    const lineEnd = template.indexOf('\n', action.end)
    const aloneOnLine = template.slice(lineStart, action.start).trim() === '' &&
      template.slice(action.end, lineEnd === -1 ? undefined : lineEnd).trim() === ''
    const body = action.body
    const nindent = /\|\s*nindent\s+(\d+)\s*$/.exec(body)
    const indent = /\|\s*indent\s+(\d+)\s*$/.exec(body)
    if (isComment(body) || SILENT.includes(keyword(body)) || /^\$\w*\s*:?=/.test(body)) {
      // renders nothing
    } else if (nindent !== null) {
      out += '\n' + ' '.repeat(Number(nindent[1])) + '# helm block'
    } else if (indent !== null) {
      out += ' '.repeat(Number(indent[1])) + '# helm block'
    } else if (aloneOnLine) {
      out += '# helm block'
    } else {
      out += 'HELM'
    }
    trimNext = action.trimRight
    cursor = action.end
  }
  let rest = template.slice(cursor)
  if (trimNext) rest = rest.replace(/^\s+/, '')
  return out + rest
}

/** YAML problems of a rendered skeleton, and its non-empty documents. */
function parseSkeleton (skeleton: string): { problems: string[], docs: Values[] } {
  const problems: string[] = []
  const docs: Values[] = []
  // Branches of an if/else are both present in a skeleton, so keys may repeat.
  for (const doc of parseAllDocuments(skeleton, { uniqueKeys: false })) {
    for (const e of doc.errors) problems.push(e.message.split('\n')[0] as string)
    if (doc.errors.length > 0) continue
    const value = doc.toJS() as unknown
    if (value === null || value === undefined) continue
    if (typeof value !== 'object' || Array.isArray(value)) { problems.push('a document is not a mapping'); continue }
    docs.push(value as Values)
  }
  return { problems, docs }
}

/** `.Values.a.b` paths read by directives (comments excluded). */
function valuesPaths (template: string): string[][] {
  const paths: string[][] = []
  for (const action of actionsOf(template)) {
    if (isComment(action.body)) continue
    for (const m of action.body.matchAll(/\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)/g)) {
      paths.push((m[1] as string).slice(1).split('.'))
    }
  }
  return paths
}

function pathExists (values: unknown, path: readonly string[]): boolean {
  let node = values
  for (const key of path) {
    if (node === null || typeof node !== 'object' || Array.isArray(node) || !Object.hasOwn(node, key)) return false
    node = (node as Values)[key]
  }
  return true
}

/** Paths to every leaf of values.yaml (empty maps and lists count as leaves). */
function leafPaths (node: unknown, prefix: string[] = []): string[][] {
  if (node === null || typeof node !== 'object' || Array.isArray(node) || Object.keys(node).length === 0) return [prefix]
  return Object.entries(node as Values).flatMap(([k, v]) => leafPaths(v, [...prefix, k]))
}

function helperNames (template: string, directive: 'define' | 'include' | 'template'): string[] {
  const names: string[] = []
  for (const action of actionsOf(template)) {
    for (const m of action.body.matchAll(new RegExp(`\\b${directive}\\s+"([^"]+)"`, 'g'))) names.push(m[1] as string)
  }
  return names
}

function manifestProblems (docs: Values[]): string[] {
  const problems: string[] = []
  for (const doc of docs) {
    if (typeof doc.apiVersion !== 'string') problems.push('a document has no apiVersion')
    if (typeof doc.kind !== 'string') problems.push('a document has no kind')
    const metadata = doc.metadata as Values | undefined
    if (metadata?.name === undefined || metadata.name === null) problems.push(`${String(doc.kind)} has no metadata.name`)
  }
  return problems
}

function checkTemplate (template: string): { problems: string[], docs: Values[] } {
  const control = controlProblems(template)
  if (control.length > 0) return { problems: control, docs: [] }
  const { problems, docs } = parseSkeleton(renderSkeleton(template))
  return { problems: [...problems, ...manifestProblems(docs)], docs }
}

// ---------------------------------------------------------------------------
// The checker itself: it must catch the mistakes it exists for.

t.test('the skeleton renderer honours trimming and directive kinds', async t => {
  t.equal(renderSkeleton('a:\n  {{- if .Values.x }}\n  b: 1\n  {{- end }}\n'), 'a:\n  b: 1\n')
  t.equal(renderSkeleton('image: "{{ .Values.r }}:{{ .Values.t }}"'), 'image: "HELM:HELM"')
  t.equal(renderSkeleton('labels:\n  {{- include "x" . | nindent 4 }}\nspec: {}'), 'labels:\n    # helm block\nspec: {}')
  t.equal(renderSkeleton('{{- $x := 1 -}}\nkind: A'), 'kind: A')
  t.equal(renderSkeleton('{{/* note */}}\nkind: A'), '\nkind: A')
  t.equal(renderSkeleton('{{ include "validate" . }}\nkind: A'), '# helm block\nkind: A')
})

t.test('the checker rejects broken templates', async t => {
  const ok = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ include "n" . }}\n  labels:\n    {{- include "l" . | nindent 4 }}\ndata:\n  {{- range $k, $v := .Values.config }}\n  {{ $k }}: {{ $v | quote }}\n  {{- end }}\n'
  t.same(checkTemplate(ok).problems, [])
  t.same(checkTemplate(ok.replace('  {{- end }}\n', '')).problems, ['line 8: range is never closed'])
  t.same(checkTemplate(ok + '{{- end }}\n').problems, ['line 11: end without an open block'])
  t.same(checkTemplate('{{ else }}').problems, ['line 1: else outside if/with/range'])
  t.ok(checkTemplate(ok.replace('data:\n', 'data:\n   bad: [\n')).problems.length > 0, 'a YAML syntax error')
  t.ok(checkTemplate(ok.replace('  name: {{', ' name: {{')).problems.length > 0, 'bad indentation')
  t.same(checkTemplate('apiVersion: v1\nmetadata:\n  name: x\n').problems, ['a document has no kind'])
  t.same(checkTemplate('- a\n- b\n').problems, ['a document is not a mapping'])
})

t.test('the checker finds .Values paths and checks them', async t => {
  const tpl = '{{ .Values.a.b }} {{ $.Values.c }} {{/* .Values.ignored */}} {{ toYaml .Values.d.e.f | nindent 2 }}'
  t.same(valuesPaths(tpl), [['a', 'b'], ['c'], ['d', 'e', 'f']])
  const values = { a: { b: null }, c: 1, d: { e: {} } }
  t.ok(pathExists(values, ['a', 'b']), 'a null value exists')
  t.notOk(pathExists(values, ['d', 'e', 'f']), 'a missing key is reported')
  t.notOk(pathExists(values, ['c', 'x']), 'a scalar has no children')
  t.same(leafPaths({ a: { b: 1, c: {} }, d: [] }), [['a', 'b'], ['a', 'c'], ['d']])
})

// ---------------------------------------------------------------------------
// The chart.

const values = parseYaml(await readFile(join(CHART_DIR, 'values.yaml'), 'utf8')) as Values
const chart = parseYaml(await readFile(join(CHART_DIR, 'Chart.yaml'), 'utf8')) as Values
const valuesSchema = JSON.parse(await readFile(join(CHART_DIR, 'values.schema.json'), 'utf8')) as Values
const templateFiles = (await readdir(TEMPLATES_DIR)).sort()
const templates = new Map<string, string>()
for (const file of templateFiles) templates.set(file, await readFile(join(TEMPLATES_DIR, file), 'utf8'))
const manifests = new Map<string, Values[]>()

t.test('Chart.yaml has the required fields', async t => {
  const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string }
  t.equal(chart.apiVersion, 'v2')
  t.equal(chart.name, basename(CHART_DIR), 'name matches the chart folder')
  t.match(chart.version, /^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$/, 'version is SemVer')
  t.equal(chart.appVersion, pkg.version, 'appVersion is the gateway version (the default image tag)')
  t.equal(chart.type, 'application')
  t.type(chart.description, 'string')
})

t.test('the expected templates exist', async t => {
  for (const file of ['_helpers.tpl', 'deployment.yaml', 'service.yaml', 'configmap.yaml', 'secret.yaml', 'hpa.yaml', 'pdb.yaml', 'servicemonitor.yaml', 'NOTES.txt']) {
    t.ok(templates.has(file), file)
  }
})

for (const [file, template] of templates) {
  t.test(`${file} is well-formed`, async t => {
    if (!file.endsWith('.yaml')) {
      t.same(controlProblems(template), [], 'control blocks balance')
      return
    }
    const { problems, docs } = checkTemplate(template)
    t.same(problems, [], 'parses as Kubernetes YAML once directives are set aside')
    t.equal(docs.length, 1, 'one manifest')
    manifests.set(file, docs)
  })
}

t.test('every .Values path a template reads exists in values.yaml', async t => {
  for (const [file, template] of templates) {
    const missing = valuesPaths(template).filter(p => !pathExists(values, p)).map(p => `.Values.${p.join('.')}`)
    t.same(missing, [], file)
  }
})

t.test('every value in values.yaml is read by a template', async t => {
  const used = [...templates.values()].flatMap(valuesPaths)
  const unused = leafPaths(values)
    .filter(leaf => !used.some(p => p.length <= leaf.length && p.every((k, i) => leaf[i] === k)))
    .map(p => p.join('.'))
  t.same(unused, [], 'values nobody reads are misleading documentation')
})

t.test('every included helper is defined, every included file exists', async t => {
  const defined = new Set(helperNames(templates.get('_helpers.tpl') ?? '', 'define'))
  for (const [file, template] of templates) {
    const undefinedHelpers = [...helperNames(template, 'include'), ...helperNames(template, 'template')].filter(n => !defined.has(n))
    t.same(undefinedHelpers, [], file)
    for (const m of template.matchAll(/\.Template\.BasePath\s+"\/([^"]+)"/g)) {
      t.ok(templates.has(m[1] as string), `${file} includes ${m[1] as string}`)
    }
  }
})

t.test('values.schema.json accepts values.yaml and rejects mistakes', async t => {
  const ajv = new Ajv({ allErrors: true, strict: true, allowUnionTypes: true })
  const validate = ajv.compile(valuesSchema)
  t.ok(validate(values), `values.yaml is valid: ${ajv.errorsText(validate.errors)}`)
  const withConfig = (patch: Values): Values => ({ ...values, config: { ...(values.config as Values), ...patch } })
  t.notOk(validate({ ...values, replicaCount: 'two' }), 'a string replica count')
  t.notOk(validate({ ...values, replicaz: 2 }), 'an unknown top-level key')
  t.notOk(validate(withConfig({ RETENTION_MAX_EVENT: 5 })), 'a misspelt gateway variable')
  t.notOk(validate(withConfig({ PORT: 8081 })), 'a variable the chart manages')
  t.notOk(validate(withConfig({ REDIS_URL: 'redis://x' })), 'REDIS_URL outside a Secret')
  t.notOk(validate(withConfig({ REDIS_PASSWORD: 'x' })), 'REDIS_PASSWORD outside a Secret')
  t.notOk(validate(withConfig({ REDIS_TLS: 'yes' })), 'a non-boolean REDIS_TLS')
  t.notOk(validate(withConfig({ LOG_LEVEL: 'verbose' })), 'an unknown log level')
  t.notOk(validate(withConfig({ UPSTREAM_URL: undefined })), 'no upstream')
  t.notOk(validate({ ...values, redis: { ...(values.redis as Values), url: 'http://redis:6379' } }), 'a non-redis URL')
})

t.test('values.schema.json config lists exactly the gateway\'s variables', async t => {
  const configSchema = (valuesSchema.properties as Record<string, Values>).config as Values
  const chartVars = Object.keys(configSchema.properties as Values).sort()
  const gatewayVars = Object.keys(ConfigSchema.properties).filter(k => !MANAGED_BY_CHART.includes(k)).sort()
  t.same(chartVars, gatewayVars, 'update values.schema.json when src/config/schema.ts changes')
  for (const [name, property] of Object.entries(ConfigSchema.properties)) {
    const chartProperty = (configSchema.properties as Record<string, Values>)[name]
    if (chartProperty === undefined) continue
    const p = property as { minimum?: number, maximum?: number, enum?: unknown[], anyOf?: Array<{ const?: unknown }> }
    t.equal(chartProperty.minimum, p.minimum, `${name} minimum`)
    t.equal(chartProperty.maximum, p.maximum, `${name} maximum`)
    const allowed = p.enum ?? p.anyOf?.map(s => s.const)
    if (allowed !== undefined) t.same((chartProperty.enum as unknown[]).filter(v => v !== null), allowed, `${name} allowed values`)
  }
  for (const key of Object.keys(values.config as Values)) {
    t.ok(key in ConfigSchema.properties, `config.${key} is a gateway variable`)
  }
})

t.test('defaults: restricted security context, matching the image', async t => {
  const dockerfile = await readFile(join(ROOT, 'Dockerfile'), 'utf8')
  const imageUser = /^USER\s+(\d+)(?::(\d+))?\s*$/m.exec(dockerfile)
  const pod = values.podSecurityContext as Values
  const container = values.securityContext as Values
  t.equal(pod.runAsNonRoot, true)
  t.equal(container.runAsNonRoot, true)
  t.equal(container.readOnlyRootFilesystem, true)
  t.equal(container.allowPrivilegeEscalation, false)
  t.same((container.capabilities as Values).drop, ['ALL'])
  t.same(pod.seccompProfile, { type: 'RuntimeDefault' })
  t.same(container.seccompProfile, { type: 'RuntimeDefault' })
  t.ok(Number.isInteger(pod.runAsUser) && (pod.runAsUser as number) > 0, 'numeric non-root uid')
  t.equal(String(pod.runAsUser), imageUser?.[1], 'runAsUser is the Dockerfile USER')
  t.equal(container.runAsUser, pod.runAsUser)
  t.equal((values.serviceAccount as Values).automount, false)
})

t.test('defaults: ports and shutdown budget agree with the gateway', async t => {
  const defaults = ConfigSchema.properties
  const ports = values.containerPorts as Values
  const shutdown = values.shutdown as Record<string, number>
  t.equal(ports.mcp, defaults.PORT.default)
  t.equal(ports.admin, defaults.ADMIN_PORT.default)
  t.equal(shutdown.graceSeconds, defaults.SHUTDOWN_GRACE_SECONDS.default)
  t.ok((shutdown.terminationGracePeriodSeconds as number) > (shutdown.graceSeconds as number) + (shutdown.preStopSleepSeconds as number),
    'terminationGracePeriodSeconds exceeds preStop sleep + drain')
  t.match(templates.get('_helpers.tpl'), /fail .*terminationGracePeriodSeconds/, 'the chart refuses a shorter budget')
  t.match(templates.get('_helpers.tpl'), /fail .*needs Redis/, 'the chart refuses several replicas without Redis')
})

t.test('deployment: probes, preStop, /tmp, env sources', async t => {
  const deployment = manifests.get('deployment.yaml')?.[0]
  if (deployment === undefined) return t.fail('deployment.yaml did not parse')
  const podSpec = ((deployment.spec as Values).template as Values).spec as Values
  const container = (podSpec.containers as Values[])[0] as Values
  const httpGet = (probe: string): Values => ((container[probe] as Values).httpGet as Values)
  t.same(httpGet('livenessProbe'), { path: '/healthz', port: 'admin' })
  t.same(httpGet('readinessProbe'), { path: '/readyz', port: 'admin' })
  t.same(httpGet('startupProbe'), { path: '/healthz', port: 'admin' })
  const ports = (container.ports as Values[]).map(p => p.name)
  t.same(ports, ['mcp', 'admin'])
  const preStop = ((container.lifecycle as Values).preStop as Values).exec as Values
  t.equal((preStop.command as string[])[0], 'sleep', 'preStop uses the image\'s coreutils sleep')
  t.same(container.volumeMounts, [{ name: 'tmp', mountPath: '/tmp' }])
  t.same(Object.keys(((podSpec.volumes as Values[])[0] as Values).emptyDir as Values), ['sizeLimit'])
  t.ok('terminationGracePeriodSeconds' in podSpec)
  const env = container.env as Values[]
  t.equal(env.length, 1, 'one env entry, repeated for each Redis credential')
  t.ok((env[0]?.valueFrom as Values).secretKeyRef !== undefined, 'credentials come from a Secret')
  t.ok(((container.envFrom as Values[])[0] as Values).configMapRef !== undefined, 'the rest comes from the ConfigMap')
})

t.test('service: mcp and admin ports', async t => {
  const service = manifests.get('service.yaml')?.[0]
  if (service === undefined) return t.fail('service.yaml did not parse')
  const ports = (service.spec as Values).ports as Values[]
  t.same(ports.map(p => [p.name, p.targetPort]), [['mcp', 'mcp'], ['admin', 'admin']])
})

t.test('configmap renders the variables the chart manages', async t => {
  const configmap = templates.get('configmap.yaml') ?? ''
  for (const name of MANAGED_BY_CHART.filter(n => !SECRET_VARS.includes(n))) t.match(configmap, new RegExp(`^  ${name}: `, 'm'), name)
  for (const name of SECRET_VARS) {
    t.notMatch(configmap, new RegExp(name), `${name} never lands in a ConfigMap`)
    t.match(templates.get('secret.yaml'), new RegExp(`^  ${name}: `, 'm'), `${name} is in the chart's Secret`)
    t.match(templates.get('_helpers.tpl'), new RegExp(`"${name}"`), `${name} is wired into the env`)
  }
})
