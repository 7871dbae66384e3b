import envSchema from 'env-schema'
import { closest } from 'fastest-levenshtein'
import { ConfigSchema, type RawConfig } from './schema.js'
import { plainFields, type PlainFields } from './fields.js'
import type { RetentionLimits } from '../store/contract.js'
import { redisUrlProblem } from '../store/redis/redis-url.js'
import { adminHostPolicy, allowListEntry, defaultHostPolicy, type HostPolicy } from '../net/host-policy.js'
import { trustedProxyList } from '../net/trusted-proxies.js'
import { pathTrick } from '../net/request-path.js'
import type { JwtOptions } from '../auth/jwt-principal.js'
import { parseUpstreamUrls, type UpstreamTarget } from '../upstream/upstream-url.js'

/**
 * The configuration: every variable of the schema as its field (fields.ts:
 * camelCase, seconds as milliseconds), except the values derived below
 * (parsed lists, groups, defaults that depend on another variable), which
 * replace or group them.
 */
export type GatewayConfig = Omit<PlainFields, keyof DerivedConfig> & DerivedConfig
type DerivedConfig = ReturnType<typeof derivedConfig>

/**
 * Names Kubernetes injects for each Service of the namespace (REDIS_PORT,
 * REDIS_SERVICE_HOST, REDIS_PORT_6379_TCP_ADDR, ...): not the gateway's.
 */
const SERVICE_LINK = /_SERVICE_(HOST|PORT)(_\w+)?$|_PORT(_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?$/

/**
 * Variables that look like the gateway's (their first word is one of its
 * variables' first words) but that it does not read: most likely misspelled.
 */
function unknownVariables (env: NodeJS.ProcessEnv, known: readonly string[]): string[] {
  const prefixes = new Set(known.filter(k => k.includes('_')).map(k => k.slice(0, k.indexOf('_') + 1)))
  const warnings: string[] = []
  for (const name of Object.keys(env).sort()) {
    if (known.includes(name) || !name.includes('_') || !prefixes.has(name.slice(0, name.indexOf('_') + 1))) continue
    if (SERVICE_LINK.test(name)) continue
    warnings.push(`${name}: not a variable of the gateway (ignored); did you mean ${closest(name, known as string[])}?`)
  }
  return warnings
}

/**
 * REDIS_PASSWORD completes a REDIS_URL that carries no password (a Secret may
 * hold only the password); a password in the URL wins.
 */
function withRedisPassword (url: string, password: string | undefined, warnings: string[]): string {
  if (password === undefined) return url
  const parsed = new URL(url)
  if (parsed.password !== '') {
    warnings.push('REDIS_PASSWORD: ignored, REDIS_URL carries a password of its own (the URL\'s wins)')
    return url
  }
  // A unix:// URL takes credentials with the host localhost only (unix://:password@localhost/path).
  if (parsed.protocol === 'unix:' && parsed.hostname === '') parsed.hostname = 'localhost'
  parsed.password = encodeURIComponent(password)
  return parsed.toString()
}

/** "host:port,host:port" -> addresses; problems are pushed, not thrown. */
function parseAddresses (name: string, value: string, problems: string[]): Array<{ host: string, port: number }> {
  const out: Array<{ host: string, port: number }> = []
  for (const part of value.split(',').map(p => p.trim()).filter(Boolean)) {
    const match = /^(\[[0-9a-fA-F:]+\]|[^:\s]+):(\d{1,5})$/.exec(part)
    const port = match === null ? NaN : Number(match[2])
    if (match === null || port < 1 || port > 65535) {
      problems.push(`${name}: "${part}" is not host:port`)
      continue
    }
    out.push({ host: (match[1] as string).replace(/^\[|\]$/g, ''), port })
  }
  if (out.length === 0 && problems.every(p => !p.startsWith(name))) problems.push(`${name}: needs at least one host:port`)
  return out
}

const LOOPBACK = new Set(['localhost', '127.0.0.1', '[::1]'])

/** The AUTH_JWT_* / AUTH_JWKS_* group: all three main ones or none; problems are pushed, not thrown. */
function jwtOptions (raw: RawConfig, problems: string[]): JwtOptions | undefined {
  const { AUTH_JWT_ISSUER: issuer, AUTH_JWKS_URL: jwksUrl, AUTH_JWT_AUDIENCE: audience } = raw
  if (issuer === undefined && jwksUrl === undefined && audience === undefined) {
    if (raw.AUTH_RESOURCE_METADATA_URL !== undefined) problems.push('AUTH_RESOURCE_METADATA_URL: only meaningful with AUTH_JWT_ISSUER')
    return undefined
  }
  if (issuer === undefined || jwksUrl === undefined || audience === undefined) {
    problems.push('AUTH_JWT_ISSUER, AUTH_JWKS_URL and AUTH_JWT_AUDIENCE: set all three (or none)')
    return undefined
  }
  let url: URL | undefined
  try {
    url = new URL(jwksUrl)
  } catch {}
  // Keys fetched in clear could be swapped on the way: anyone could then sign tokens.
  if (url === undefined || !(url.protocol === 'https:' || (url.protocol === 'http:' && LOOPBACK.has(url.hostname)))) {
    problems.push('AUTH_JWKS_URL: must be an https:// URL (http:// only on loopback)')
  }
  const audiences = audience.split(',').map(a => a.trim()).filter(Boolean)
  if (audiences.length === 0) problems.push('AUTH_JWT_AUDIENCE: needs at least one audience')
  const metadata = raw.AUTH_RESOURCE_METADATA_URL
  if (metadata !== undefined && (!URL.canParse(metadata) || /["\\\s]/.test(metadata))) {
    problems.push('AUTH_RESOURCE_METADATA_URL: must be an absolute URL')
  }
  if (url === undefined) return undefined
  return Object.freeze({
    issuer,
    jwksUrl: url,
    audience: Object.freeze(audiences),
    clockToleranceSeconds: raw.AUTH_JWT_CLOCK_TOLERANCE_SECONDS,
    jwksTimeoutMs: raw.AUTH_JWKS_TIMEOUT_MS,
    jwksCacheMaxAgeMs: raw.AUTH_JWKS_CACHE_SECONDS * 1000,
    jwksCooldownMs: raw.AUTH_JWKS_COOLDOWN_SECONDS * 1000,
    ...(metadata !== undefined && { resourceMetadataUrl: metadata })
  })
}

export class ConfigError extends Error {
  readonly problems: readonly string[]
  constructor (problems: readonly string[]) {
    super(`invalid configuration:\n${problems.map(p => `  - ${p}`).join('\n')}`)
    this.name = 'ConfigError'
    this.problems = problems
  }
}

/**
 * Validate the environment once, reporting every problem together, and return
 * a frozen configuration. Throws ConfigError.
 */
export function loadConfig (env: NodeJS.ProcessEnv = process.env): GatewayConfig {
  const problems: string[] = []
  const raw = schemaValues(env, problems)
  // The checks across variables run even when the schema found problems: all are reported at once.
  const derived = derivedConfig(raw, env, problems)
  return Object.freeze({ ...plainFields(raw), ...derived })
}

/** The variables as the schema reads them (defaults applied); problems are pushed, not thrown. */
function schemaValues (env: NodeJS.ProcessEnv, problems: string[]): RawConfig {
  let raw: RawConfig
  // Only the variables the schema knows are passed, so env-schema's
  // additionalProperties:false never trips over the rest of the environment.
  const known: Record<string, string> = {}
  for (const [key, schema] of Object.entries(ConfigSchema.properties)) {
    const value = env[key]
    if (value === undefined || value === '') continue
    // Plain decimal digits only: ajv would coerce "0x1F90", "1e3" and "Infinity".
    if ((schema as { type?: string }).type === 'integer' && !/^\d{1,15}$/.test(value)) {
      problems.push(`${key}: must be an integer written in decimal digits, got "${value.slice(0, 40)}"`)
      continue
    }
    if ((schema as { type?: string }).type === 'boolean' && !/^(true|false)$/.test(value)) {
      problems.push(`${key}: must be a boolean (true or false), got "${value.slice(0, 40)}"`)
      continue
    }
    known[key] = value
  }
  try {
    raw = envSchema<RawConfig>({ schema: ConfigSchema, data: known, env: false })
  } catch (err) {
    const errors = (err as { errors?: Array<{ instancePath: string, message?: string, params?: Record<string, unknown> }> }).errors ?? []
    for (const e of errors) {
      const name = e.instancePath.replace(/^\//, '') || String(e.params?.missingProperty ?? '')
      const allowed = e.params?.allowedValues
      problems.push(`${name}: ${e.message ?? 'is invalid'}${Array.isArray(allowed) ? ` (${allowed.join(', ')})` : ''}`)
    }
    if (problems.length === 0) problems.push((err as Error).message)
    raw = { ...Object.fromEntries(Object.entries(ConfigSchema.properties).map(([k, s]) => [k, (s as { default?: unknown }).default])), ...known } as unknown as RawConfig
  }
  if (problems.length > 0 && typeof raw.PORT === 'string') {
    // Validation failed before coercion: compare the numbers, not their spellings.
    raw = { ...raw, PORT: Number(raw.PORT), ADMIN_PORT: Number(raw.ADMIN_PORT) }
  }
  return raw
}

/**
 * What is derived from the variables rather than read as it is: parsed lists
 * and URLs, groups of variables, defaults depending on another variable, and
 * the checks across variables. Throws ConfigError with every problem, the
 * schema's included.
 */
function derivedConfig (raw: RawConfig, env: NodeJS.ProcessEnv, problems: string[]) {
  const upstream = typeof raw.UPSTREAM_URL === 'string' ? parseUpstreamUrls(raw.UPSTREAM_URL, problems) : undefined
  if (raw.REDIS_URL !== undefined) {
    const problem = redisUrlProblem(raw.REDIS_URL)
    if (problem !== undefined) problems.push(problem)
  }
  let redisClusterNodes: Array<{ host: string, port: number }> | undefined
  let redisSentinel: { sentinels: Array<{ host: string, port: number }>, name: string } | undefined
  const redisModes = [raw.REDIS_URL, raw.REDIS_CLUSTER_NODES, raw.REDIS_SENTINELS].filter(v => v !== undefined).length
  if (redisModes > 1) problems.push('REDIS_URL, REDIS_CLUSTER_NODES and REDIS_SENTINELS: set only one of them')
  if (raw.REDIS_CLUSTER_NODES !== undefined) redisClusterNodes = parseAddresses('REDIS_CLUSTER_NODES', raw.REDIS_CLUSTER_NODES, problems)
  if (raw.REDIS_SENTINELS !== undefined) {
    const sentinels = parseAddresses('REDIS_SENTINELS', raw.REDIS_SENTINELS, problems)
    if (raw.REDIS_SENTINEL_NAME === undefined) problems.push('REDIS_SENTINEL_NAME: is required with REDIS_SENTINELS')
    else redisSentinel = { sentinels, name: raw.REDIS_SENTINEL_NAME }
  } else if (raw.REDIS_SENTINEL_NAME !== undefined) {
    problems.push('REDIS_SENTINEL_NAME: only meaningful with REDIS_SENTINELS')
  }
  // A wildcard bind takes the port on every address, loopback included.
  const wildcard = (host: string): boolean => host === '0.0.0.0' || host === '::'
  if (raw.PORT !== 0 && raw.PORT === raw.ADMIN_PORT && (raw.HOST === raw.ADMIN_HOST || wildcard(raw.HOST) || wildcard(raw.ADMIN_HOST))) {
    problems.push('ADMIN_PORT: must differ from PORT so admin endpoints never shadow upstream paths')
  }
  let allowedOrigins: Set<string> | null = null
  if (raw.ALLOWED_ORIGINS !== undefined) {
    allowedOrigins = new Set()
    const entries = raw.ALLOWED_ORIGINS.split(',').map(s => s.trim()).filter(Boolean)
    if (entries.includes('*')) {
      if (entries.length > 1) problems.push('ALLOWED_ORIGINS: "*" cannot be combined with origins')
      allowedOrigins = null
    } else {
      for (const o of entries) {
        let origin: string | undefined
        try {
          const u = new URL(o)
          // Only http(s) URLs have an origin: "localhost:3000" would parse with origin "null".
          if ((u.protocol === 'http:' || u.protocol === 'https:') && u.hostname !== '') origin = u.origin
        } catch {}
        if (origin === undefined) problems.push(`ALLOWED_ORIGINS: "${o}" is not an origin such as https://app.example.com`)
        else allowedOrigins.add(origin)
      }
    }
  }
  let allowedHosts: HostPolicy = defaultHostPolicy(raw.HOST)
  if (raw.ALLOWED_HOSTS !== undefined) {
    const entries = raw.ALLOWED_HOSTS.split(',').map(s => s.trim()).filter(Boolean)
    if (entries.includes('*')) {
      if (entries.length > 1) problems.push('ALLOWED_HOSTS: "*" cannot be combined with host names')
      allowedHosts = { kind: 'any' }
    } else {
      const names: string[] = []
      for (const entry of entries) {
        const name = allowListEntry(entry)
        if (name === undefined) problems.push(`ALLOWED_HOSTS: "${entry.slice(0, 80)}" is not a host name such as mcp.example.com, *.example.com or 10.0.0.5 (no port, no scheme)`)
        else names.push(name)
      }
      if (entries.length === 0) problems.push('ALLOWED_HOSTS: lists no host; unset it for the default, or write * to turn the check off')
      allowedHosts = { kind: 'list', names }
    }
  }
  const trustedProxies = (raw.TRUSTED_PROXIES ?? '').split(',').map(s => s.trim()).filter(Boolean)
  trustedProxyList(trustedProxies, problems)
  const jwt = jwtOptions(raw, problems)
  const publicPaths = raw.PUBLIC_PATHS.split(',').map(s => s.trim()).filter(Boolean)
  for (const path of publicPaths) {
    if (pathTrick(path) !== undefined || path.includes('?')) problems.push(`PUBLIC_PATHS: "${path.slice(0, 80)}" is not a plain path such as /.well-known/ (starting with /, no %, \\, . or .. segment, no query)`)
  }
  const warnings = unknownVariables(env, Object.keys(ConfigSchema.properties))
  const redisUrl = raw.REDIS_URL === undefined || problems.length > 0 ? raw.REDIS_URL : withRedisPassword(raw.REDIS_URL, raw.REDIS_PASSWORD, warnings)
  if (problems.length > 0 || upstream === undefined) {
    throw new ConfigError(problems.length > 0 ? problems : ['UPSTREAM_URL: is required'])
  }

  return {
    /** The first entry of UPSTREAM_URL. */
    upstreamUrl: upstream.first,
    /** Every entry of UPSTREAM_URL: the endpoints of one server, or names resolving to them. */
    upstreamTargets: Object.freeze(upstream.targets) as readonly UpstreamTarget[],
    /** The MCP endpoint path, taken from the upstream URL. */
    mcpPath: upstream.path,
    /** REDIS_URL, completed with REDIS_PASSWORD when it carries none. */
    redisUrl,
    /** Cluster seed nodes, when Redis Cluster is used. */
    redisClusterNodes: redisClusterNodes as ReadonlyArray<{ host: string, port: number }> | undefined,
    /** Sentinels and the master name, when Sentinel is used. */
    redisSentinel: redisSentinel as { readonly sentinels: ReadonlyArray<{ host: string, port: number }>, readonly name: string } | undefined,
    retention: Object.freeze({
      maxEvents: raw.RETENTION_MAX_EVENTS,
      maxBytes: raw.RETENTION_MAX_BYTES,
      ttlMs: raw.RETENTION_TTL_SECONDS * 1000
    }) as RetentionLimits,
    maxSessionsPerPrincipal: raw.MAX_SESSIONS_PER_PRINCIPAL ?? Math.ceil(raw.MAX_SESSIONS / 10),
    /** How far an upstream stream that ended early is resumed (see ResumeBounds). */
    upstreamResumes: Object.freeze({ withoutProgress: raw.UPSTREAM_RESUMES_WITHOUT_PROGRESS, maxMs: raw.UPSTREAM_RESUME_MAX_SECONDS * 1000 }),
    /** Lower-cased, as Node names headers. */
    principalHeader: raw.PRINCIPAL_HEADER.toLowerCase(),
    /** Bearer JWT verification; undefined: sessions are bound to the hash of principalHeader. */
    jwt,
    /** Paths (exact, or prefixes ending in /) proxied without a principal. */
    publicPaths: Object.freeze(publicPaths) as readonly string[],
    /** null: any Origin is accepted. */
    allowedOrigins: allowedOrigins as ReadonlySet<string> | null,
    /** Which Host values are served (DNS-rebinding protection). */
    allowedHosts: Object.freeze(allowedHosts) as HostPolicy,
    /** The same, on the admin listener. */
    adminAllowedHosts: Object.freeze(adminHostPolicy(allowedHosts, raw.ALLOWED_HOSTS !== undefined, raw.ADMIN_HOST)) as HostPolicy,
    /** Outer proxies whose forwarding headers are believed (addresses, CIDR ranges, preset names); empty: none. */
    trustedProxies: Object.freeze(trustedProxies) as readonly string[],
    /** What start-up should warn about (unknown variables, a password given twice); never fatal. */
    warnings: Object.freeze(warnings) as readonly string[]
  }
}
