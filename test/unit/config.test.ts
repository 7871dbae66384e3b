// Configuration from the environment (src/config/load.ts): validated once,
// every problem reported together, the result frozen.
import t from 'tap'
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { ConfigError, loadConfig } from '../../src/config/load.js'
import { ConfigSchema } from '../../src/config/schema.js'
import { fieldName, isGrouped } from '../../src/config/fields.js'
import { expectProblem, problemsOf } from '../fixtures/config-problems.js'

const UPSTREAM = 'http://mcp:3000/mcp'
const base = { UPSTREAM_URL: UPSTREAM }

t.test('defaults', async (t) => {
  const config = loadConfig({ ...base })
  t.equal(config.upstreamUrl.href, UPSTREAM)
  t.equal(config.mcpPath, '/mcp')
  t.equal(config.host, '0.0.0.0')
  t.equal(config.port, 8080)
  t.equal(config.adminHost, '127.0.0.1', 'the admin listener (no access control) is reachable from this host only')
  t.same(config.allowedHosts, { kind: 'non-public' }, 'a 0.0.0.0 listener serves names public DNS cannot point at it')
  t.same(config.trustedProxies, [], 'no forwarding header is believed')
  t.equal(config.requestReadTimeoutMs, 60_000, 'no looser than nginx\'s client_body_timeout')
  t.equal(config.maxConnections, 16384)
  t.equal(config.maxConnectionsPerAddress, 256)
  t.equal(config.adminPort, 9090)
  t.equal(config.logLevel, 'info')
  t.equal(config.redisUrl, undefined, 'no Redis: the embedded store')
  t.equal(config.redisClusterNodes, undefined)
  t.equal(config.redisSentinel, undefined)
  t.equal(config.redisPassword, undefined)
  t.equal(config.redisTls, false)
  t.equal(config.redisKeyPrefix, 'mcpgw:')
  t.equal(config.redisSocketTimeoutMs, 5000, 'a stalled Redis connection is replaced within 5 s')
  t.same(config.retention, { maxEvents: 10000, maxBytes: 16777216, ttlMs: 3600 * 1000 })
  t.equal(config.memoryStoreMaxBytes, 268435456)
  t.equal(config.maxEventBytes, 4194304)
  t.equal(config.maxBodyBytes, 4194304)
  t.equal(config.clientBufferMaxBytes, 8388608)
  t.equal(config.maxSessions, 10000)
  t.equal(config.standaloneHoldMs, 120 * 1000)
  t.equal(config.keepaliveIntervalMs, 15 * 1000)
  t.equal(config.sseRetryMs, 1000)
  t.equal(config.upstreamHeadersTimeoutMs, 300 * 1000)
  t.equal(config.principalHeader, 'authorization')
  t.equal(config.allowedOrigins, null, 'any Origin when unset')
  t.equal(config.shutdownGraceMs, 25 * 1000)
})

t.test('the defaults above are the schema\'s', async (t) => {
  const defaults = Object.fromEntries(Object.entries(ConfigSchema.properties)
    .map(([k, s]) => [k, (s as { default?: unknown }).default]))
  const config = loadConfig({ ...base })
  t.equal(config.port, defaults.PORT)
  t.equal(config.adminPort, defaults.ADMIN_PORT)
  t.equal(config.host, defaults.HOST)
  t.equal(config.adminHost, defaults.ADMIN_HOST)
  t.equal(config.requestReadTimeoutMs, (defaults.REQUEST_READ_TIMEOUT_SECONDS as number) * 1000)
  t.equal(config.maxConnections, defaults.MAX_CONNECTIONS)
  t.equal(config.maxConnectionsPerAddress, defaults.MAX_CONNECTIONS_PER_ADDRESS)
  t.equal(config.logLevel, defaults.LOG_LEVEL)
  t.equal(config.retention.maxEvents, defaults.RETENTION_MAX_EVENTS)
  t.equal(config.retention.maxBytes, defaults.RETENTION_MAX_BYTES)
  t.equal(config.retention.ttlMs, (defaults.RETENTION_TTL_SECONDS as number) * 1000)
  t.equal(config.memoryStoreMaxBytes, defaults.MEMORY_STORE_MAX_BYTES)
  t.equal(config.maxEventBytes, defaults.MAX_EVENT_BYTES)
  t.equal(config.keepaliveIntervalMs, (defaults.KEEPALIVE_INTERVAL_SECONDS as number) * 1000)
  t.equal(config.sseRetryMs, defaults.SSE_RETRY_MS)
  t.equal(config.shutdownGraceMs, (defaults.SHUTDOWN_GRACE_SECONDS as number) * 1000)
  t.equal(config.standaloneHoldMs, (defaults.STANDALONE_HOLD_SECONDS as number) * 1000)
  // UPSTREAM_URL is the only variable that must be set.
  const mustSet = (ConfigSchema.required ?? []).filter(k => defaults[k] === undefined)
  t.same(mustSet, ['UPSTREAM_URL'])
})

t.test('each variable is the field its name says, a duration in seconds as milliseconds', async (t) => {
  t.equal(fieldName('UPSTREAM_RESOLVE_SECONDS'), 'upstreamResolveMs')
  t.equal(fieldName('LEASE_TTL_MS'), 'leaseTtlMs')
  t.equal(fieldName('HOST'), 'host')
  t.equal(fieldName('INITIALIZES_PER_MINUTE_PER_ADDRESS'), 'initializesPerMinutePerAddress')
  const config = loadConfig({ ...base, UPSTREAM_SET_ASIDE_SECONDS: '7', LEASE_TTL_MS: '700' }) as unknown as Record<string, unknown>
  t.equal(config.upstreamSetAsideMs, 7000)
  t.equal(config.leaseTtlMs, 700)
  const grouped = Object.keys(ConfigSchema.properties).filter(isGrouped)
  t.same(grouped.filter(v => fieldName(v) in config), [], 'a variable read into a group is no field of its own')
  t.same(Object.keys(ConfigSchema.properties).filter(v => !isGrouped(v) && !(fieldName(v) in config)), [], 'every other variable is a field')
  t.ok(grouped.includes('RETENTION_TTL_SECONDS') && grouped.includes('AUTH_JWKS_URL') && grouped.includes('UPSTREAM_RESUME_MAX_SECONDS') && grouped.includes('REDIS_SENTINEL_NAME'))
  t.notOk(isGrouped('UPSTREAM_RESOLVE_SECONDS'))
})

t.test('every variable is read and converted', async (t) => {
  const config = loadConfig({
    UPSTREAM_URL: 'https://upstream.example:8443/api/mcp',
    HOST: '127.0.0.1',
    PORT: '3000',
    ADMIN_HOST: '127.0.0.2',
    ADMIN_PORT: '3001',
    LOG_LEVEL: 'debug',
    REDIS_URL: 'rediss://:secret@redis:6380/0',
    REDIS_KEY_PREFIX: 'gw:',
    RETENTION_MAX_EVENTS: '50',
    RETENTION_MAX_BYTES: '2048',
    RETENTION_TTL_SECONDS: '60',
    MEMORY_STORE_MAX_BYTES: '2097152',
    MAX_EVENT_BYTES: '4096',
    MAX_BODY_BYTES: '8192',
    CLIENT_BUFFER_MAX_BYTES: '65536',
    MAX_SESSIONS: '7',
    STANDALONE_HOLD_SECONDS: '0',
    KEEPALIVE_INTERVAL_SECONDS: '5',
    SSE_RETRY_MS: '0',
    UPSTREAM_HEADERS_TIMEOUT_SECONDS: '9',
    PRINCIPAL_HEADER: 'X-Api-Key',
    ALLOWED_ORIGINS: 'https://app.example.com',
    ALLOWED_HOSTS: 'mcp.example.com',
    TRUSTED_PROXIES: '10.0.0.0/8',
    REQUEST_READ_TIMEOUT_SECONDS: '5',
    MAX_CONNECTIONS: '100',
    MAX_CONNECTIONS_PER_ADDRESS: '10',
    SHUTDOWN_GRACE_SECONDS: '3'
  })
  t.equal(config.upstreamUrl.origin, 'https://upstream.example:8443')
  t.equal(config.mcpPath, '/api/mcp')
  t.equal(config.host, '127.0.0.1')
  t.equal(config.port, 3000)
  t.equal(config.adminHost, '127.0.0.2')
  t.equal(config.adminPort, 3001)
  t.equal(config.logLevel, 'debug')
  t.equal(config.redisUrl, 'rediss://:secret@redis:6380/0')
  t.equal(config.redisKeyPrefix, 'gw:')
  t.same(config.retention, { maxEvents: 50, maxBytes: 2048, ttlMs: 60000 })
  t.equal(config.memoryStoreMaxBytes, 2097152)
  t.equal(config.maxEventBytes, 4096)
  t.equal(config.maxBodyBytes, 8192)
  t.equal(config.clientBufferMaxBytes, 65536)
  t.equal(config.maxSessions, 7)
  t.equal(config.standaloneHoldMs, 0)
  t.equal(config.keepaliveIntervalMs, 5000)
  t.equal(config.sseRetryMs, 0)
  t.equal(config.upstreamHeadersTimeoutMs, 9000)
  t.equal(config.principalHeader, 'x-api-key', 'lower-cased like Node\'s header names')
  t.same([...(config.allowedOrigins ?? [])], ['https://app.example.com'])
  t.same(config.allowedHosts, { kind: 'list', names: ['mcp.example.com'] })
  t.same(config.trustedProxies, ['10.0.0.0/8'])
  t.equal(config.requestReadTimeoutMs, 5000)
  t.equal(config.maxConnections, 100)
  t.equal(config.maxConnectionsPerAddress, 10)
  t.equal(config.shutdownGraceMs, 3000)
})

t.test('every log level is accepted', async (t) => {
  for (const level of ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']) {
    t.equal(loadConfig({ ...base, LOG_LEVEL: level }).logLevel, level)
  }
})

t.test('mcpPath comes from the upstream URL', async (t) => {
  t.equal(loadConfig({ UPSTREAM_URL: 'http://mcp:3000/' }).mcpPath, '/', 'an explicit / is the MCP endpoint at the root')
  t.equal(loadConfig({ UPSTREAM_URL: 'http://mcp/a/b/mcp' }).mcpPath, '/a/b/mcp')
  t.equal(loadConfig({ UPSTREAM_URL: 'http://[::1]:3000/mcp' }).upstreamUrl.hostname, '[::1]')
})

t.test('UPSTREAM_URL without a path is refused, saying what to write', async (t) => {
  // Its path would be "/" and clients of /mcp would be proxied unrecorded.
  for (const url of ['http://mcp:3000', 'https://mcp.example', 'http://[::1]:3000', ' http://mcp:3000']) {
    expectProblem(t, { UPSTREAM_URL: url }, 'UPSTREAM_URL', /has no path; write the MCP endpoint's full URL, such as https?:\/\/[^ ]+\/mcp/)
  }
  const problems = problemsOf({ UPSTREAM_URL: 'http://mcp:3000', PORT: 'abc' })
  t.same(problems.map(p => p.slice(0, p.indexOf(':'))).sort(), ['PORT', 'UPSTREAM_URL'], 'reported with the other problems')
})

t.test('ALLOWED_HOSTS: names without port, * to turn the check off, defaults by HOST', async (t) => {
  t.same(loadConfig({ ...base, HOST: '127.0.0.1' }).allowedHosts, { kind: 'list', names: ['localhost', '127.0.0.1', '::1'] }, 'loopback listener: the SDKs\' list')
  t.same(loadConfig({ ...base, HOST: '::1' }).allowedHosts, { kind: 'list', names: ['localhost', '127.0.0.1', '::1'] })
  t.same(loadConfig({ ...base, HOST: '::' }).allowedHosts, { kind: 'non-public' })
  t.same(loadConfig({ ...base, HOST: '10.0.0.5' }).allowedHosts, { kind: 'non-public' })
  t.same(loadConfig({ ...base, ALLOWED_HOSTS: 'MCP.example.com., *.corp.example, 10.0.0.5, [::1], fe80::1' }).allowedHosts,
    { kind: 'list', names: ['mcp.example.com', '*.corp.example', '10.0.0.5', '::1', 'fe80::1'] })
  t.same(loadConfig({ ...base, HOST: '127.0.0.1', ALLOWED_HOSTS: '*' }).allowedHosts, { kind: 'any' })
  expectProblem(t, { ...base, ALLOWED_HOSTS: 'mcp.example.com:8080' }, 'ALLOWED_HOSTS', /no port/)
  expectProblem(t, { ...base, ALLOWED_HOSTS: 'https://mcp.example.com' }, 'ALLOWED_HOSTS')
  expectProblem(t, { ...base, ALLOWED_HOSTS: '*, mcp.example.com' }, 'ALLOWED_HOSTS', /cannot be combined/)
  expectProblem(t, { ...base, ALLOWED_HOSTS: ',' }, 'ALLOWED_HOSTS', /lists no host/)
  expectProblem(t, { ...base, ALLOWED_HOSTS: '*.10.0.0.5' }, 'ALLOWED_HOSTS')
})

t.test('TRUSTED_PROXIES: addresses, CIDR ranges and preset names', async (t) => {
  t.same(loadConfig({ ...base, TRUSTED_PROXIES: '10.0.0.0/8, 192.0.2.1, ::1, fd00::/8, loopback' }).trustedProxies,
    ['10.0.0.0/8', '192.0.2.1', '::1', 'fd00::/8', 'loopback'])
  expectProblem(t, { ...base, TRUSTED_PROXIES: 'proxy.example' }, 'TRUSTED_PROXIES')
  expectProblem(t, { ...base, TRUSTED_PROXIES: '10.0.0.0/33' }, 'TRUSTED_PROXIES')
  expectProblem(t, { ...base, TRUSTED_PROXIES: '10.0.0.0/x' }, 'TRUSTED_PROXIES')
})

t.test('UPSTREAM_URL is required', async (t) => {
  const err = t.throws(() => loadConfig({})) as unknown
  t.type(err, ConfigError)
  t.equal((err as ConfigError).name, 'ConfigError')
  t.same((err as ConfigError).problems.length, 1)
  t.match((err as ConfigError).problems[0], /^UPSTREAM_URL: /)
  t.match((err as ConfigError).message, /invalid configuration:\n {2}- UPSTREAM_URL: /)
  expectProblem(t, { UPSTREAM_URL: '' }, 'UPSTREAM_URL', /required/)
})

t.test('UPSTREAM_URL must be an absolute http(s) URL without query or fragment', async (t) => {
  expectProblem(t, { UPSTREAM_URL: 'mcp:3000/mcp' }, 'UPSTREAM_URL', /http/)
  expectProblem(t, { UPSTREAM_URL: '/mcp' }, 'UPSTREAM_URL', /absolute URL/)
  expectProblem(t, { UPSTREAM_URL: 'not a url' }, 'UPSTREAM_URL', /absolute URL/)
  expectProblem(t, { UPSTREAM_URL: 'ftp://mcp/mcp' }, 'UPSTREAM_URL', /got ftp:/)
  expectProblem(t, { UPSTREAM_URL: 'ws://mcp/mcp' }, 'UPSTREAM_URL', /got ws:/)
  expectProblem(t, { UPSTREAM_URL: 'file:///etc/passwd' }, 'UPSTREAM_URL', /got file:/)
  expectProblem(t, { UPSTREAM_URL: 'http://mcp/mcp?token=1' }, 'UPSTREAM_URL', /query or fragment/)
  expectProblem(t, { UPSTREAM_URL: 'http://mcp/mcp#frag' }, 'UPSTREAM_URL', /query or fragment/)
  t.same(problemsOf({ UPSTREAM_URL: 'HTTPS://MCP.example/mcp' }), [], 'scheme and host are case-insensitive')
})

t.test('malformed numbers', async (t) => {
  for (const value of ['abc', '80.5', '8080abc', 'true', '[]', '{}', '8 080']) {
    expectProblem(t, { ...base, PORT: value }, 'PORT', /integer/)
  }
  expectProblem(t, { ...base, RETENTION_MAX_EVENTS: 'many' }, 'RETENTION_MAX_EVENTS', /integer/)
  expectProblem(t, { ...base, MAX_EVENT_BYTES: '4MiB' }, 'MAX_EVENT_BYTES', /integer/)
  expectProblem(t, { ...base, SSE_RETRY_MS: '1.5' }, 'SSE_RETRY_MS', /integer/)
  expectProblem(t, { ...base, RETENTION_TTL_SECONDS: 'NaN' }, 'RETENTION_TTL_SECONDS', /integer/)
  expectProblem(t, { ...base, REDIS_TLS: 'yes' }, 'REDIS_TLS', /boolean/)
})

t.test('infinite numbers are refused, whatever the range', async (t) => {
  for (const [name, value] of [['PORT', 'Infinity'], ['ADMIN_PORT', '-Infinity'], ['MAX_SESSIONS', 'Infinity'], ['RETENTION_MAX_EVENTS', '-Infinity'], ['MAX_EVENT_BYTES', 'Infinity']] as const) {
    const problems = problemsOf({ ...base, [name]: value })
    t.equal(problems.length, 1, `${name}=${value} is a problem`)
  }
})

t.test('numbers written in other notations are refused', async (t) => {
  for (const [name, value] of [['PORT', '0x1F90'], ['ADMIN_PORT', '1e3'], ['PORT', ' 8080 '], ['MAX_SESSIONS', '0b101']] as const) {
    t.equal(problemsOf({ ...base, [name]: value }).length, 1, `${name}=${JSON.stringify(value)} is a problem`)
  }
})

t.test('out-of-range values', async (t) => {
  expectProblem(t, { ...base, PORT: '65536' }, 'PORT', /<= 65535/)
  expectProblem(t, { ...base, PORT: '-1' }, 'PORT', /integer written in decimal digits/)
  expectProblem(t, { ...base, ADMIN_PORT: '99999' }, 'ADMIN_PORT', /<= 65535/)
  expectProblem(t, { ...base, RETENTION_MAX_EVENTS: '0' }, 'RETENTION_MAX_EVENTS', />= 1/)
  expectProblem(t, { ...base, RETENTION_MAX_BYTES: '1023' }, 'RETENTION_MAX_BYTES', />= 1024/)
  expectProblem(t, { ...base, MEMORY_STORE_MAX_BYTES: '1048575' }, 'MEMORY_STORE_MAX_BYTES', />= 1048576/)
  expectProblem(t, { ...base, CLIENT_BUFFER_MAX_BYTES: '65535' }, 'CLIENT_BUFFER_MAX_BYTES', />= 65536/)
  expectProblem(t, { ...base, KEEPALIVE_INTERVAL_SECONDS: '0' }, 'KEEPALIVE_INTERVAL_SECONDS', />= 1/)
  expectProblem(t, { ...base, SSE_RETRY_MS: '-5' }, 'SSE_RETRY_MS', /integer written in decimal digits/)
  t.same(problemsOf({ ...base, PORT: '0', ADMIN_PORT: '65535' }), [], 'the bounds themselves are accepted')
  t.same(problemsOf({ ...base, RETENTION_MAX_BYTES: '1024', MEMORY_STORE_MAX_BYTES: '1048576' }), [])
})

t.test('LOG_LEVEL must be a pino level', async (t) => {
  for (const value of ['loud', 'INFO', 'warning', '10']) {
    const problems = problemsOf({ ...base, LOG_LEVEL: value })
    t.ok(problems.length >= 1, `${value} is refused`)
    t.ok(problems.every(p => p.startsWith('LOG_LEVEL: ')), `${value}: every problem names LOG_LEVEL`)
    t.equal(problems.length, 1, `${value}: reported once, not once per allowed level`)
  }
})

t.test('REDIS_URL must be redis://, rediss:// or unix://', async (t) => {
  t.equal(loadConfig({ ...base, REDIS_URL: 'redis://redis:6379' }).redisUrl, 'redis://redis:6379')
  t.equal(loadConfig({ ...base, REDIS_URL: 'rediss://user:pw@redis:6380/2' }).redisUrl, 'rediss://user:pw@redis:6380/2')
  expectProblem(t, { ...base, REDIS_URL: 'http://redis:6379' }, 'REDIS_URL', /got http:/)
  expectProblem(t, { ...base, REDIS_URL: 'tcp://redis:6379' }, 'REDIS_URL', /got tcp:/)
  expectProblem(t, { ...base, REDIS_URL: 'not a url' }, 'REDIS_URL', /must be a URL/)
  expectProblem(t, { ...base, REDIS_URL: 'redis6379' }, 'REDIS_URL', /must be a URL/)
  t.equal(problemsOf({ ...base, REDIS_URL: 'redis:6379' }).length, 1, 'a redis: URL without a host ("redis:6379") is a problem')
  t.equal(loadConfig({ ...base, REDIS_URL: '' }).redisUrl, undefined, 'empty means unset')
  t.equal(loadConfig({ ...base, REDIS_URL: 'unix:///run/redis/redis.sock?db=3' }).redisUrl, 'unix:///run/redis/redis.sock?db=3', 'a Unix socket')
  expectProblem(t, { ...base, REDIS_URL: 'unix://redis.sock' }, 'REDIS_URL', /names no host \(got redis\.sock\); write unix:\/\/\/path/)
  expectProblem(t, { ...base, REDIS_URL: 'unix:///run/redis.sock?password=x' }, 'REDIS_URL', /unknown parameter password/)
  expectProblem(t, { ...base, REDIS_URL: 'ftp://redis' }, 'REDIS_URL', /redis:\/\/, rediss:\/\/ or unix:\/\//)
})

t.test('a secret in REDIS_URL never appears in a problem', async (t) => {
  const problems = problemsOf({ ...base, REDIS_URL: 'http://user:hunter2@redis:6379' })
  t.equal(problems.length, 1)
  t.notMatch(problems.join('\n'), /hunter2/)
})

t.test('ALLOWED_ORIGINS', async (t) => {
  t.equal(loadConfig({ ...base, ALLOWED_ORIGINS: '*' }).allowedOrigins, null, '* allows any')
  expectProblem(t, { ...base, ALLOWED_ORIGINS: 'https://a.example, *' }, 'ALLOWED_ORIGINS', /cannot be combined/)
  const list = loadConfig({ ...base, ALLOWED_ORIGINS: 'https://a.example, http://localhost:3000 ,HTTPS://B.EXAMPLE:443,,' }).allowedOrigins
  t.same([...(list ?? [])].sort(), ['http://localhost:3000', 'https://a.example', 'https://b.example'], 'trimmed, normalised, empty entries skipped')
  const withPath = loadConfig({ ...base, ALLOWED_ORIGINS: 'https://a.example/some/path' }).allowedOrigins
  t.same([...(withPath ?? [])], ['https://a.example'], 'reduced to the origin')
  expectProblem(t, { ...base, ALLOWED_ORIGINS: 'not an origin' }, 'ALLOWED_ORIGINS', /"not an origin"/)
  const two = problemsOf({ ...base, ALLOWED_ORIGINS: 'https://ok.example,bad one,also bad' })
  t.equal(two.length, 2, 'each invalid entry is reported')
  t.ok(two.every(p => p.startsWith('ALLOWED_ORIGINS: ')))
  t.same([...(loadConfig({ ...base, ALLOWED_ORIGINS: ' , ' }).allowedOrigins ?? ['x'])], [], 'only separators: an empty allow-list')
})

t.test('ALLOWED_ORIGINS entries without an origin are refused, not turned into "null"', async (t) => {
  for (const entry of ['localhost:3000', 'app.example.com:443', 'mailto:a@b.example', 'data:text/plain']) {
    const problems = problemsOf({ ...base, ALLOWED_ORIGINS: entry })
    const origins = problems.length === 0 ? [...(loadConfig({ ...base, ALLOWED_ORIGINS: entry }).allowedOrigins ?? [])] : []
    t.notOk(origins.includes('null'), `${entry}: "null" is not allowed`)
    t.equal(problems.length, 1, `${entry}: reported`)
  }
  expectProblem(t, { ...base, ALLOWED_ORIGINS: 'null' }, 'ALLOWED_ORIGINS', /"null"/)
})

t.test('Redis Cluster and Sentinel', async (t) => {
  const cluster = loadConfig({ ...base, REDIS_CLUSTER_NODES: 'a:7000, b:7001,[::1]:7002', REDIS_PASSWORD: 'pw', REDIS_TLS: 'true' })
  t.same(cluster.redisClusterNodes, [{ host: 'a', port: 7000 }, { host: 'b', port: 7001 }, { host: '::1', port: 7002 }])
  t.equal(cluster.redisUrl, undefined)
  t.equal(cluster.redisPassword, 'pw')
  t.equal(cluster.redisTls, true)
  const sentinel = loadConfig({ ...base, REDIS_SENTINELS: 's1:26379,s2:26380', REDIS_SENTINEL_NAME: 'mymaster' })
  t.same(sentinel.redisSentinel, { sentinels: [{ host: 's1', port: 26379 }, { host: 's2', port: 26380 }], name: 'mymaster' })
  t.equal(sentinel.redisTls, false)

  const bad = problemsOf({ ...base, REDIS_CLUSTER_NODES: 'a, b:99999, :1, c:0' })
  t.equal(bad.length, 4, 'every bad address is reported')
  t.ok(bad.every(p => p.startsWith('REDIS_CLUSTER_NODES: ') && p.includes('is not host:port')))
  expectProblem(t, { ...base, REDIS_CLUSTER_NODES: ' , ' }, 'REDIS_CLUSTER_NODES', /at least one/)
  expectProblem(t, { ...base, REDIS_SENTINELS: 's1:26379' }, 'REDIS_SENTINEL_NAME', /required/)
  expectProblem(t, { ...base, REDIS_SENTINEL_NAME: 'm' }, 'REDIS_SENTINEL_NAME', /only meaningful/)
  const two = problemsOf({ ...base, REDIS_URL: 'redis://r', REDIS_CLUSTER_NODES: 'a:1' })
  t.equal(two.length, 1)
  t.match(two[0], /set only one/)
  const three = problemsOf({ ...base, REDIS_URL: 'redis://r', REDIS_CLUSTER_NODES: 'a:1', REDIS_SENTINELS: 's:1', REDIS_SENTINEL_NAME: 'm' })
  t.equal(three.length, 1, 'the conflict is reported once')
})

t.test('PORT and ADMIN_PORT must differ on the same host', async (t) => {
  expectProblem(t, { ...base, PORT: '9090' }, 'ADMIN_PORT', /differ from PORT/)
  expectProblem(t, { ...base, PORT: '7000', ADMIN_PORT: '7000' }, 'ADMIN_PORT', /differ from PORT/)
  t.same(problemsOf({ ...base, PORT: '7000', ADMIN_PORT: '7000', HOST: '127.0.0.2', ADMIN_HOST: '127.0.0.1' }), [], 'different hosts')
  t.same(problemsOf({ ...base, PORT: '0', ADMIN_PORT: '0' }), [], 'both ephemeral (tests)')
  expectProblem(t, { ...base, HOST: '0.0.0.0', ADMIN_HOST: '127.0.0.1', PORT: '7000', ADMIN_PORT: '7000' }, 'ADMIN_PORT', /differ from PORT/)
  expectProblem(t, { ...base, HOST: '127.0.0.1', ADMIN_HOST: '::', PORT: '7000', ADMIN_PORT: '7000' }, 'ADMIN_PORT', /differ from PORT/)
})

t.test('every problem is reported at once', async (t) => {
  const problems = problemsOf({
    UPSTREAM_URL: 'ftp://mcp/mcp',
    PORT: 'abc',
    RETENTION_MAX_EVENTS: '0',
    REDIS_URL: 'http://redis'
  })
  t.equal(problems.length, 4, JSON.stringify(problems))
  t.ok(problems.some(p => p.startsWith('UPSTREAM_URL: ')))
  t.ok(problems.some(p => p.startsWith('PORT: ')))
  t.ok(problems.some(p => p.startsWith('RETENTION_MAX_EVENTS: ')))
  t.ok(problems.some(p => p.startsWith('REDIS_URL: ')))

  const six = problemsOf({
    UPSTREAM_URL: 'http://mcp/mcp?x',
    PORT: '70000',
    ADMIN_PORT: 'x',
    MAX_EVENT_BYTES: '1',
    ALLOWED_ORIGINS: 'nope',
    REDIS_URL: 'tcp://r'
  })
  t.same(six.map(p => p.slice(0, p.indexOf(':'))).sort(),
    ['ADMIN_PORT', 'ALLOWED_ORIGINS', 'MAX_EVENT_BYTES', 'PORT', 'REDIS_URL', 'UPSTREAM_URL'])

  const missingUpstream = problemsOf({ PORT: 'abc' })
  t.same(missingUpstream.map(p => p.slice(0, p.indexOf(':'))).sort(), ['PORT', 'UPSTREAM_URL'], 'a missing UPSTREAM_URL is reported with the rest')
})

t.test('PORT === ADMIN_PORT is still reported when the schema finds another problem', async (t) => {
  const problems = problemsOf({ ...base, PORT: '9090', RETENTION_MAX_EVENTS: '0' })
  t.ok(problems.some(p => p.startsWith('RETENTION_MAX_EVENTS: ')))
  t.ok(problems.some(p => p.startsWith('ADMIN_PORT: ')), 'both are reported')
  const both = problemsOf({ ...base, PORT: '7000', ADMIN_PORT: '7000', MAX_SESSIONS: '0' })
  t.equal(both.length, 2, 'two explicit equal values are still compared (both are strings then)')
})

t.test('the result is frozen', async (t) => {
  const config = loadConfig({ ...base, ALLOWED_ORIGINS: 'https://a.example' })
  t.ok(Object.isFrozen(config), 'config')
  t.ok(Object.isFrozen(config.retention), 'config.retention')
  t.throws(() => { (config as { port: number }).port = 1 }, TypeError, 'assignment throws in strict mode')
  t.throws(() => { (config.retention as { maxEvents: number }).maxEvents = 1 }, TypeError)
  t.throws(() => { delete (config as { host?: string }).host }, TypeError)
  t.equal(config.port, 8080)
})

t.test('each call returns a fresh configuration', async (t) => {
  const a = loadConfig({ ...base, PORT: '1000' })
  const b = loadConfig({ ...base, PORT: '2000' })
  t.equal(a.port, 1000)
  t.equal(b.port, 2000)
  t.not(a.upstreamUrl, b.upstreamUrl)
})

t.test('unrelated and empty env vars are ignored', async (t) => {
  const env = {
    ...base,
    PATH: '/usr/bin',
    HOME: '/root',
    NODE_ENV: 'production',
    UPSTREAM_URL_OVERRIDE: 'garbage',
    PORT_ALT: 'not-a-port',
    port: 'lower-case is another variable',
    log_level: 'nonsense',
    REDIS_KEY_PREFIX: '',
    PORT: '',
    LOG_LEVEL: ''
  }
  const config = loadConfig(env)
  t.equal(config.port, 8080, 'empty PORT means the default')
  t.equal(config.logLevel, 'info')
  t.equal(config.redisKeyPrefix, 'mcpgw:', 'empty means the default')
  t.same(env.PORT, '', 'the env object is not modified')
  t.equal(Object.keys(env).length, 11)
})

t.test('the entry point refuses an UPSTREAM_URL without a path, with the other problems', async (t) => {
  const main = fileURLToPath(new URL('../../dist/src/main.js', import.meta.url))
  if (!existsSync(main)) {
    t.fail(`${main} is missing: run \`npm run build\` first (npm test does it in pretest)`)
    return
  }
  const env = { PATH: process.env.PATH ?? '', UPSTREAM_URL: 'http://mcp:3000', PORT: '0', ADMIN_PORT: '0', MAX_SESSIONS: '0' }
  const child = spawn(process.execPath, [main], { env, stdio: ['ignore', 'ignore', 'pipe'] })
  let stderr = ''
  child.stderr.setEncoding('utf8').on('data', (s: string) => { stderr += s })
  const timer = setTimeout(() => child.kill('SIGKILL'), 20_000)
  const code = await new Promise<number | null>((resolve) => { child.on('close', c => resolve(c)) })
  clearTimeout(timer)
  t.equal(code, 2, 'exit code 2: it never starts')
  t.match(stderr, /UPSTREAM_URL: has no path; write the MCP endpoint's full URL, such as http:\/\/mcp:3000\/mcp/)
  t.match(stderr, /MAX_SESSIONS: /, 'the other problem too')
})

t.test('the entry point exits non-zero and lists every problem', async (t) => {
  const main = fileURLToPath(new URL('../../dist/src/main.js', import.meta.url))
  if (!existsSync(main)) {
    t.fail(`${main} is missing: run \`npm run build\` first (npm test does it in pretest)`)
    return
  }
  const env = {
    PATH: process.env.PATH ?? '',
    UPSTREAM_URL: 'ftp://mcp/mcp',
    PORT: 'abc',
    RETENTION_MAX_EVENTS: '0',
    REDIS_URL: 'http://user:hunter2@redis',
    ALLOWED_ORIGINS: 'not an origin'
  }
  const expected = problemsOf(env)
  t.equal(expected.length, 5, 'the same env yields five problems in-process')
  const child = spawn(process.execPath, [main], { env, stdio: ['ignore', 'pipe', 'pipe'] })
  let stderr = ''
  let stdout = ''
  child.stderr.setEncoding('utf8').on('data', (s: string) => { stderr += s })
  child.stdout.setEncoding('utf8').on('data', (s: string) => { stdout += s })
  const timer = setTimeout(() => child.kill('SIGKILL'), 20_000)
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) => {
    child.on('close', (c, s) => resolve([c, s]))
  })
  clearTimeout(timer)
  t.equal(signal, null, 'exited by itself (not killed after 20 s)')
  t.not(code, 0, 'non-zero exit code')
  t.equal(code, 2, 'exit code 2 for a configuration error')
  t.match(stderr, /invalid configuration/)
  for (const problem of expected) {
    t.ok(stderr.includes(problem), `stderr lists: ${problem}`)
  }
  t.notMatch(stderr, /hunter2/, 'no secret on stderr')
  t.notMatch(stderr, /\n\s+at /, 'no stack trace')
  t.equal(stdout, '', 'nothing on stdout')
})
