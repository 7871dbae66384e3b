// The AUTH_JWT_* / AUTH_JWKS_* settings and MAX_SESSIONS_PER_PRINCIPAL, validated at start-up.
import t from 'tap'
import { ConfigError, loadConfig } from '../../src/config/load.js'

const BASE = { UPSTREAM_URL: 'http://mcp:3000/mcp' }
const JWT = { AUTH_JWT_ISSUER: 'https://auth.example.com', AUTH_JWKS_URL: 'https://auth.example.com/jwks', AUTH_JWT_AUDIENCE: 'https://mcp.example.com/mcp' }

function problems (env: Record<string, string>): readonly string[] {
  try {
    loadConfig({ ...BASE, ...env })
    return []
  } catch (err) {
    return (err as ConfigError).problems
  }
}

t.test('unset: sessions bound to the PRINCIPAL_HEADER hash', async t => {
  t.equal(loadConfig(BASE).jwt, undefined)
})

t.test('all three set: verified JWTs, with defaults', async t => {
  const jwt = loadConfig({ ...BASE, ...JWT, AUTH_JWT_AUDIENCE: 'a, b' }).jwt
  t.equal(jwt?.issuer, JWT.AUTH_JWT_ISSUER)
  t.equal(jwt?.jwksUrl.href, JWT.AUTH_JWKS_URL)
  t.same(jwt?.audience, ['a', 'b'], 'a comma-separated list')
  t.equal(jwt?.clockToleranceSeconds, 30)
  t.equal(jwt?.jwksTimeoutMs, 5000)
  t.equal(jwt?.jwksCacheMaxAgeMs, 600_000)
  t.equal(jwt?.jwksCooldownMs, 30_000)
  t.equal(jwt?.resourceMetadataUrl, undefined)
  t.ok(Object.isFrozen(jwt))
})

t.test('refused at start-up', async t => {
  t.match(problems({ AUTH_JWT_ISSUER: JWT.AUTH_JWT_ISSUER }), [/set all three/], 'issuer alone')
  t.match(problems({ ...JWT, AUTH_JWT_AUDIENCE: ' , ' }), [/at least one audience/])
  t.match(problems({ ...JWT, AUTH_JWKS_URL: 'http://auth.example.com/jwks' }), [/https/], 'keys in clear from another host')
  t.same(problems({ ...JWT, AUTH_JWKS_URL: 'http://127.0.0.1:8000/jwks' }), [], 'http on loopback is fine')
  t.match(problems({ ...JWT, AUTH_JWKS_URL: 'not a url' }), [/https/])
  t.match(problems({ AUTH_RESOURCE_METADATA_URL: 'https://mcp.example.com/.well-known/oauth-protected-resource' }), [/only meaningful/])
  t.match(problems({ ...JWT, AUTH_RESOURCE_METADATA_URL: 'https://x/"' }), [/absolute URL/], 'nothing that would break the WWW-Authenticate quoting')
  t.match(problems({ ...JWT, AUTH_JWT_CLOCK_TOLERANCE_SECONDS: '3600' }), [/AUTH_JWT_CLOCK_TOLERANCE_SECONDS/])
})

t.test('MAX_SESSIONS_PER_PRINCIPAL: a tenth of MAX_SESSIONS unless set', async t => {
  t.equal(loadConfig(BASE).maxSessionsPerPrincipal, 1000)
  t.equal(loadConfig({ ...BASE, MAX_SESSIONS: '55' }).maxSessionsPerPrincipal, 6)
  t.equal(loadConfig({ ...BASE, MAX_SESSIONS: '1' }).maxSessionsPerPrincipal, 1)
  t.equal(loadConfig({ ...BASE, MAX_SESSIONS_PER_PRINCIPAL: '3' }).maxSessionsPerPrincipal, 3)
  t.match(problems({ MAX_SESSIONS_PER_PRINCIPAL: '0' }), [/MAX_SESSIONS_PER_PRINCIPAL/])
})
