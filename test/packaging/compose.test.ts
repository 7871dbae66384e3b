// docker-compose.yml contract: the three services, their health checks and start
// order, a stop grace period longer than the gateway's drain, Redis with AOF
// persistence, and a gateway environment made only of variables the gateway knows.
// The compose CLI validates the file as well, and redis-server boots the mounted
// config/redis.conf (redis-cli queries it). scripts/install-packaging-tools.sh
// installs them (npm test runs it); without them those two checks are skipped,
// except in CI.
import t from 'tap'
import { execFile } from 'node:child_process'
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { promisify } from 'node:util'
import { parse as parseYaml } from 'yaml'
import { ConfigSchema } from '../../src/config/schema.js'
import { loadConfig } from '../../src/config/load.js'
import { externalTool, externalTools } from '../fixtures/external-tools.js'

const run = promisify(execFile)
const ROOT = join(import.meta.dirname, '..', '..')
const redisTools = await externalTools(['redis-server', 'redis-cli'])
const composeCli = await externalTool('compose')

type Service = Record<string, unknown> & { environment?: Record<string, string>, healthcheck?: { test?: unknown } }

const compose = parseYaml(await readFile(join(ROOT, 'docker-compose.yml'), 'utf8')) as { services: Record<string, Service>, volumes?: Record<string, unknown> }
const services = compose.services
const gateway = services.gateway as Service
const upstream = services.upstream as Service
const redis = services.redis as Service

/** Compose durations: 1m30s, 35s, 500ms. */
function durationSeconds (text: string): number {
  const units: Record<string, number> = { h: 3600, m: 60, s: 1, ms: 0.001, us: 1e-6 }
  const parts = [...String(text).matchAll(/(\d+(?:\.\d+)?)(ms|us|h|m|s)/g)]
  if (parts.length === 0 || parts.map(p => p[0]).join('') !== String(text)) throw new Error(`not a duration: ${text}`)
  return parts.reduce((sum, p) => sum + Number(p[1]) * (units[p[2] as string] as number), 0)
}

/** The value compose would use when the host does not set the variable: ${X:-default}. */
function withoutHostEnv (value: string): string {
  return String(value).replace(/\$\{[A-Z_][A-Z0-9_]*:?-([^}]*)\}/g, '$1')
}

function gatewayEnv (): Record<string, string> {
  return Object.fromEntries(Object.entries(gateway.environment ?? {}).map(([k, v]) => [k, withoutHostEnv(v)]))
}

/** `redis.conf` directives as name -> arguments (last one wins, as in Redis). */
function redisDirectives (text: string): Map<string, string> {
  const directives = new Map<string, string>()
  for (const line of text.split('\n')) {
    const trimmed = line.trim()
    if (trimmed === '' || trimmed.startsWith('#')) continue
    const [name, ...args] = trimmed.split(/\s+/)
    directives.set((name as string).toLowerCase(), args.join(' '))
  }
  return directives
}

t.test('helpers', async t => {
  t.equal(durationSeconds('35s'), 35)
  t.equal(durationSeconds('1m30s'), 90)
  t.equal(durationSeconds('1500ms'), 1.5)
  t.throws(() => durationSeconds('35'), /not a duration/)
  // eslint-disable-next-line no-template-curly-in-string -- compose interpolation syntax, not a JS template
  t.equal(withoutHostEnv('${LOG_LEVEL:-info}'), 'info')
  t.same([...redisDirectives('# c\nsave ""\nappendonly no\nappendonly yes\n')], [['save', '""'], ['appendonly', 'yes']])
})

t.test('services', async t => {
  t.same(Object.keys(services).sort(), ['gateway', 'redis', 'upstream'])
  t.same(gateway.build, { context: '.', target: 'runtime' }, 'the gateway is built from the Dockerfile\'s runtime target')
  t.same(upstream.build, { context: '.', target: 'example' }, 'the example upstream from its own target')
  t.not(upstream.image, gateway.image, 'two images: the gateway\'s holds no MCP SDK')
  t.same(upstream.command, ['node', 'dist/examples/mcp-server.js'])
  t.match(String(redis.image), /^redis:7(\.|$|-)/)
})

t.test('health checks', async t => {
  for (const [name, service] of Object.entries(services)) {
    const test = service.healthcheck?.test
    t.ok(Array.isArray(test) && (test[0] === 'CMD'), `${name}: exec-form health check`)
    const command = (test as string[]).slice(1)
    t.notOk(command.some(a => /\b(curl|wget)\b/.test(a)), `${name}: no curl/wget (not in the image)`)
    if (name === 'redis') t.same(command, ['redis-cli', 'ping'])
    else t.equal(command[0], 'node', `${name}: probes with node`)
  }
  const upstreamPort = upstream.environment?.PORT
  t.match((upstream.healthcheck?.test as string[]).join(' '), new RegExp(`:${upstreamPort ?? 'x'}/healthz`), 'upstream: its own /healthz')
})

t.test('the gateway starts after healthy dependencies', async t => {
  t.same(gateway.depends_on, { redis: { condition: 'service_healthy' }, upstream: { condition: 'service_healthy' } })
})

t.test('the gateway gets longer than its drain to stop', async t => {
  const env = gatewayEnv()
  const grace = Number(env.SHUTDOWN_GRACE_SECONDS ?? ConfigSchema.properties.SHUTDOWN_GRACE_SECONDS.default)
  const stop = durationSeconds(String(gateway.stop_grace_period))
  t.ok(stop > grace, `stop_grace_period ${stop}s > SHUTDOWN_GRACE_SECONDS ${grace}s`)
})

t.test('the gateway environment is made of gateway variables with valid values', async t => {
  const env = gatewayEnv()
  const unknown = Object.keys(env).filter(k => !(k in ConfigSchema.properties))
  t.same(unknown, [], 'every variable is in src/config/schema.ts')
  const config = loadConfig(env)
  t.equal(config.upstreamUrl.hostname, 'upstream', 'UPSTREAM_URL names the upstream service')
  t.equal(config.upstreamUrl.port, upstream.environment?.PORT, 'on the port the upstream listens on')
  t.equal(new URL(config.redisUrl ?? '').hostname, 'redis', 'REDIS_URL names the redis service')
  const ports = (gateway.ports ?? []) as string[]
  const published = ports.map(p => Number(String(p).split(':').at(-1)))
  t.same(published.sort(), [config.port, config.adminPort].sort(), 'PORT and ADMIN_PORT are published')
  const admin = ports.find(p => Number(String(p).split(':').at(-1)) === config.adminPort)
  t.match(String(admin), /^127\.0\.0\.1:/, 'the admin port (metrics) on this host\'s loopback only')
})

t.test('redis persists with AOF from the mounted config', async t => {
  const command = redis.command as string[]
  const confPath = command[1] as string
  t.equal(command[0], 'redis-server')
  const volumes = redis.volumes as string[]
  t.ok(volumes.includes(`./config/redis.conf:${confPath}:ro`), 'config/redis.conf mounted read-only where redis-server reads it')
  const directives = redisDirectives(await readFile(join(ROOT, 'config', 'redis.conf'), 'utf8'))
  t.equal(directives.get('appendonly'), 'yes')
  t.equal(directives.get('appendfsync'), 'everysec')
  t.equal(directives.get('maxmemory-policy'), 'noeviction', 'evicting a stream key would silently lose events')
  const dataDir = directives.get('dir')
  const dataVolume = volumes.find(v => v.endsWith(`:${dataDir ?? ''}`))
  t.ok(dataVolume, 'the data dir is a volume')
  const volumeName = (dataVolume ?? '').split(':')[0] ?? ''
  t.ok(Object.hasOwn(compose.volumes ?? {}, volumeName), 'a named volume')
})

t.test('redis-server boots config/redis.conf', { skip: redisTools.skip }, async t => {
  if (!redisTools.present(t)) return
  const dir = await mkdtemp(join(tmpdir(), 'mcpgw-redis-conf-'))
  t.teardown(() => rm(dir, { recursive: true, force: true }))
  const conf = (await readFile(join(ROOT, 'config', 'redis.conf'), 'utf8')).replace(/^dir .*$/m, `dir ${dir}`)
  await writeFile(join(dir, 'redis.conf'), conf)
  const socket = join(dir, 'redis.sock')
  // Port 0: no TCP listener, so the check never collides with a running Redis.
  await run('redis-server', [join(dir, 'redis.conf'), '--port', '0', '--unixsocket', socket, '--daemonize', 'yes', '--pidfile', join(dir, 'redis.pid'), '--logfile', join(dir, 'redis.log')])
  try {
    let pong = ''
    for (let i = 0; i < 50 && pong !== 'PONG'; i++) {
      pong = (await run('redis-cli', ['-s', socket, 'ping']).catch(() => ({ stdout: '' }))).stdout.trim()
      if (pong !== 'PONG') await new Promise(resolve => setTimeout(resolve, 100))
    }
    t.equal(pong, 'PONG', `redis-server started (log: ${join(dir, 'redis.log')})`)
    const get = async (name: string): Promise<string> => (await run('redis-cli', ['-s', socket, 'config', 'get', name])).stdout.trim().split('\n')[1] ?? ''
    t.equal(await get('appendonly'), 'yes')
    t.equal(await get('maxmemory-policy'), 'noeviction')
  } finally {
    await run('redis-cli', ['-s', socket, 'shutdown', 'nosave']).catch(() => {})
  }
})

t.test('the compose CLI validates docker-compose.yml', { skip: composeCli.skip }, async t => {
  const cli = composeCli.require(t)
  if (cli === undefined) return
  const { file: command, prefix } = cli
  const env = { ...process.env }
  delete env.LOG_LEVEL
  delete env.ALLOWED_ORIGINS
  const result = await run(command, [...prefix, '-f', 'docker-compose.yml', 'config', '-q'], { cwd: ROOT, env }).then(
    r => ({ code: 0, stderr: r.stderr }),
    (err: { code?: number, stderr?: string }) => ({ code: err.code ?? 1, stderr: err.stderr ?? '' })
  )
  t.equal(result.code, 0, `${[command, ...prefix].join(' ')} config -q ${result.stderr}`.trim())
})
