// What start-up tells about the configuration (src/config/load.ts,
// src/config/describe.ts): REDIS_PASSWORD completes a REDIS_URL without one,
// variables that look like the gateway's but are not are named with the
// closest known one, and the effective configuration is logged with its
// secrets redacted. The last test starts the built gateway (dist/).
import t from 'tap'
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { loadConfig } from '../../src/config/load.js'
import { describeConfig } from '../../src/config/describe.js'
import { redisUrlOptions } from '../../src/store/redis/redis-url.js'

const base = { UPSTREAM_URL: 'http://mcp:3000/mcp' }

t.test('REDIS_PASSWORD completes a REDIS_URL that carries none; the URL\'s own wins', async t => {
  const plain = loadConfig({ ...base, REDIS_URL: 'redis://redis:6379/2', REDIS_PASSWORD: 'p@ss:/w rd' })
  t.equal(new URL(plain.redisUrl as string).password, encodeURIComponent('p@ss:/w rd'))
  t.equal(decodeURIComponent(new URL(plain.redisUrl as string).password), 'p@ss:/w rd', 'any character survives')
  t.equal(new URL(plain.redisUrl as string).pathname, '/2', 'the rest of the URL unchanged')
  t.same(plain.warnings, [])

  const user = loadConfig({ ...base, REDIS_URL: 'rediss://gateway@redis:6380', REDIS_PASSWORD: 'pw' })
  t.equal(user.redisUrl, 'rediss://gateway:pw@redis:6380', 'with the URL\'s user name')

  const both = loadConfig({ ...base, REDIS_URL: 'redis://:inurl@redis:6379', REDIS_PASSWORD: 'other' })
  t.equal(both.redisUrl, 'redis://:inurl@redis:6379', 'the URL\'s password wins')
  t.match(both.warnings, [/^REDIS_PASSWORD: ignored, REDIS_URL carries a password/])

  const socket = loadConfig({ ...base, REDIS_URL: 'unix:///run/redis.sock?db=1', REDIS_PASSWORD: 'pw' })
  t.same(redisUrlOptions(socket.redisUrl as string), { path: '/run/redis.sock', db: 1, password: 'pw' }, 'a unix:// URL too')

  const none = loadConfig({ ...base, REDIS_URL: 'redis://redis:6379' })
  t.equal(none.redisUrl, 'redis://redis:6379', 'no REDIS_PASSWORD: the URL as given')
})

t.test('unknown variables with the gateway\'s prefixes are named, with the closest known one', async t => {
  const config = loadConfig({
    ...base,
    REDIS_PASWORD: 'x',
    RETENTION_MAX_EVENT: '5',
    ADMIN_PROT: '9',
    // Not the gateway's: other prefixes, and the names Kubernetes injects for a Service called redis.
    HOSTNAME: 'pod-1',
    PATH: '/usr/bin',
    NODE_OPTIONS: '',
    REDIS_PORT: 'tcp://10.0.0.1:6379',
    REDIS_PORT_6379_TCP_ADDR: '10.0.0.1',
    REDIS_SERVICE_HOST: '10.0.0.1',
    REDIS_SERVICE_PORT_REDIS: '6379'
  })
  t.same(config.warnings, [
    'ADMIN_PROT: not a variable of the gateway (ignored); did you mean ADMIN_PORT?',
    'REDIS_PASWORD: not a variable of the gateway (ignored); did you mean REDIS_PASSWORD?',
    'RETENTION_MAX_EVENT: not a variable of the gateway (ignored); did you mean RETENTION_MAX_EVENTS?'
  ])
  t.equal(config.port, 8080, 'start-up goes on')
})

t.test('the effective configuration: secrets redacted, URLs without their password', async t => {
  const config = loadConfig({ ...base, UPSTREAM_URL: 'http://user:upw@mcp:3000/mcp', REDIS_URL: 'redis://redis:6379', REDIS_PASSWORD: 'hunter2', ALLOWED_ORIGINS: 'https://a.example' })
  const described = describeConfig(config)
  const text = JSON.stringify(described)
  t.notMatch(text, /hunter2|upw/, 'no secret')
  t.equal(described.redisUrl, 'redis://:***@redis:6379')
  t.equal(described.redisPassword, '[redacted]')
  t.equal(described.upstreamUrl, 'http://user:***@mcp:3000/mcp')
  t.same(described.allowedOrigins, ['https://a.example'])
  t.same(described.retention, { maxEvents: 10000, maxBytes: 16777216, ttlMs: 3600000 })
  t.equal(described.port, 8080)
})

t.test('the built gateway: every line JSON, the configuration once, warnings for typos and for ioredis', async t => {
  const main = fileURLToPath(new URL('../../dist/src/main.js', import.meta.url))
  if (!existsSync(main)) throw new Error('dist/ is missing: run npm run build first')
  const env = {
    PATH: process.env.PATH,
    UPSTREAM_URL: 'http://127.0.0.1:9/mcp',
    HOST: '127.0.0.1',
    ADMIN_HOST: '127.0.0.1',
    PORT: '0',
    ADMIN_PORT: '0',
    // The test Redis has no password: ioredis warns about the one given.
    REDIS_URL: process.env.TEST_REDIS_URL ?? 'redis://127.0.0.1:6379',
    REDIS_PASSWORD: 'hunter2',
    REDIS_KEY_PREFIX: `test:cfgwarn:${process.pid}:`,
    SHUTDOWN_GRACE_SECONDS: '1',
    DRAIN_SPREAD_SECONDS: '0',
    LOG_LEVLE: 'debug'
  }
  const child = spawn(process.execPath, [main], { env, stdio: ['ignore', 'pipe', 'pipe'] })
  let stdout = ''
  let stderr = ''
  child.stdout.setEncoding('utf8').on('data', (s: string) => { stdout += s })
  child.stderr.setEncoding('utf8').on('data', (s: string) => { stderr += s })
  const exited = new Promise<number | null>(resolve => child.on('close', code => resolve(code)))
  t.teardown(() => { if (child.exitCode === null) child.kill('SIGKILL') })
  // Generous: the machine running the tests may be busy.
  for (let i = 0; i < 600 && !stdout.includes('gateway listening') && child.exitCode === null; i++) await new Promise(resolve => setTimeout(resolve, 100))
  t.match(stdout, /gateway listening/, 'started')
  child.kill('SIGTERM')
  await exited
  t.equal(stderr, '', 'nothing on stderr')
  const lines = stdout.split('\n').filter(l => l !== '')
  const parsed = lines.map(l => { try { return JSON.parse(l) as Record<string, unknown> } catch { return l } })
  t.same(parsed.filter(l => typeof l === 'string'), [], 'every line is JSON')
  const objects = parsed.filter((l): l is Record<string, unknown> => typeof l === 'object')
  t.equal(objects.filter(l => l.msg === 'effective configuration').length, 1, 'the configuration, once')
  t.match(objects.find(l => l.msg === 'effective configuration'), { level: 'info', config: { redisUrl: /^redis:\/\/:\*\*\*@/, redisPassword: '[redacted]' } })
  t.notMatch(stdout, /hunter2/, 'the password nowhere')
  t.ok(objects.some(l => l.level === 'warn' && l.msg === 'LOG_LEVLE: not a variable of the gateway (ignored); did you mean LOG_LEVEL?'), 'the typo named')
  t.ok(objects.some(l => l.level === 'warn' && l.source === 'console' && /password was supplied/.test(String(l.msg))), 'ioredis\'s warning, as JSON', { stdout })
})
