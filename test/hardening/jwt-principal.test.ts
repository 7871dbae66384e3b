// Sessions bound to a verified token's issuer and subject (AUTH_JWT_*): real
// ES256 tokens signed here, their keys served by a JWK Set endpoint on
// loopback, a real gateway (embedded store) in front of the SDK example
// upstream. A refreshed token keeps its sessions; anything the client could
// forge, or a token the gateway cannot verify, is never served a session.
import t from 'tap'
import { createServer, type Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { randomUUID } from 'node:crypto'
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK } from 'jose'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startGateway, startGatewayOnRedis, type RunningGateway } from '../fixtures/gateway.js'
import { useRedis } from '../fixtures/redis.js'
import { startAuthServer } from '../fixtures/jwt.js'
import { exchange, freePort, jsonRpcError, rawInitialize, sseEvents, type RawSession } from '../fixtures/hardening.js'

const ISSUER = 'https://auth.example.test'
const AUDIENCE = 'https://mcp.example.test/mcp'

interface JwksEndpoint {
  url: string
  /** Requests the endpoint answered (200 or not). */
  fetches: number
  /** false: every request gets 503, as an authorization server that is down. */
  up: boolean
  close: () => Promise<void>
}

async function serveJwks (keys: JWK[]): Promise<JwksEndpoint> {
  const endpoint: JwksEndpoint = { url: '', fetches: 0, up: true, close: async () => {} }
  const server: Server = createServer((req, res) => {
    endpoint.fetches++
    if (!endpoint.up) {
      res.writeHead(503).end()
      return
    }
    res.writeHead(200, { 'content-type': 'application/jwk-set+json' }).end(JSON.stringify({ keys }))
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  endpoint.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/jwks`
  endpoint.close = async () => { await new Promise(resolve => server.close(resolve)) }
  return endpoint
}

const signing = await generateKeyPair('ES256')
const forger = await generateKeyPair('ES256')
const publicJwk = { ...(await exportJWK(signing.publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' }

interface Claims { sub: string, iss?: string, aud?: string, expiresIn?: number, notBefore?: number, key?: CryptoKey, kid?: string }

async function token (claims: Claims): Promise<string> {
  const now = Math.floor(Date.now() / 1000)
  return await new SignJWT({ scope: 'mcp' })
    .setProtectedHeader({ alg: 'ES256', kid: claims.kid ?? 'k1' })
    .setIssuer(claims.iss ?? ISSUER)
    .setAudience(claims.aud ?? AUDIENCE)
    .setSubject(claims.sub)
    .setJti(randomUUID())
    .setIssuedAt(now)
    .setNotBefore(claims.notBefore ?? now)
    .setExpirationTime(now + (claims.expiresIn ?? 3600))
    .sign(claims.key ?? signing.privateKey)
}

const bearer = (value: string): Record<string, string> => ({ authorization: `Bearer ${value}` })

function env (jwksUrl: string, more: Record<string, string> = {}): Record<string, string> {
  return { AUTH_JWT_ISSUER: ISSUER, AUTH_JWKS_URL: jwksUrl, AUTH_JWT_AUDIENCE: AUDIENCE, SESSION_REQUESTS_PER_SECOND: '1000', ...more }
}

/** tools/call stream_notifications on the session: the gateway ids of its request stream. */
async function requestStreamIds (gw: RunningGateway, session: RawSession, auth: Record<string, string>, tag: string): Promise<string[]> {
  const body = JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'stream_notifications', arguments: { count: 3, intervalMs: 0, tag } } })
  const answer = await exchange(`${gw.url}/mcp`, { method: 'POST', headers: session.headers(auth), body })
  const ids = sseEvents(answer.text).map(e => e.id).filter(id => id !== undefined)
  if (answer.status !== 200 || ids.length < 4) throw new Error(`stream_notifications failed: ${answer.status ?? '-'} ${answer.text.slice(0, 200)}`)
  return ids
}

const ping = JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'ping' })

t.test('sessions bound to a verified token\'s iss + sub', async t => {
  const jwks = await serveJwks([publicJwk])
  t.teardown(() => jwks.close())
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, env(jwks.url))
  const mcpUrl = `${gw.url}/mcp`

  const first = await token({ sub: 'alice' })
  const alice = await rawInitialize(mcpUrl, { headers: bearer(first) })
  const ids = await requestStreamIds(gw, alice, bearer(first), 'alice-tag')
  const resumeFrom = ids[1] as string

  t.test('a refreshed token (same sub, new jti and exp) keeps the session: replay works', async t => {
    const refreshed = await token({ sub: 'alice', expiresIn: 7200 })
    t.not(refreshed, first)
    const resume = await exchange(mcpUrl, { headers: alice.getHeaders(resumeFrom, bearer(refreshed)) }, 1500)
    t.equal(resume.status, 200)
    const replayed = sseEvents(resume.text)
    t.ok(replayed.some(e => e.data.includes('alice-tag')), 'the notifications after the Last-Event-ID are replayed')
    t.ok(replayed.some(e => e.id === ids.at(-1)), 'through the last event of the stream')
    const post = await exchange(mcpUrl, { method: 'POST', headers: alice.headers(bearer(refreshed)), body: ping })
    t.equal(post.status, 200, 'a POST on the session with the refreshed token')
  })

  t.test('a token of another sub: 404, nothing replayed', async t => {
    const bob = await token({ sub: 'bob' })
    const resume = await exchange(mcpUrl, { headers: alice.getHeaders(resumeFrom, bearer(bob)) }, 1500)
    t.equal(resume.status, 404)
    t.notOk(resume.text.includes('alice-tag'))
    t.equal((await exchange(mcpUrl, { method: 'POST', headers: alice.headers(bearer(bob)), body: ping })).status, 404, 'POST')
    t.equal((await exchange(mcpUrl, { method: 'DELETE', headers: alice.headers(bearer(bob)) })).status, 404, 'DELETE')
  })

  t.test('the same sub from another issuer is another principal', async t => {
    // Signed with the trusted key but naming another issuer: refused outright, not bound anew.
    const other = await token({ sub: 'alice', iss: 'https://evil.example.test' })
    const resume = await exchange(mcpUrl, { headers: alice.getHeaders(resumeFrom, bearer(other)) }, 1500)
    t.equal(resume.status, 401)
    t.notOk(resume.text.includes('alice-tag'))
  })

  t.test('tokens that fail verification: 401 with a Bearer challenge, never a replay', async t => {
    const now = Math.floor(Date.now() / 1000)
    const [header, payload] = first.split('.') as [string, string]
    const unsigned = `${Buffer.from(JSON.stringify({ alg: 'none' })).toString('base64url')}.${payload}.`
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString()) as Record<string, unknown>
    const tampered = `${header}.${Buffer.from(JSON.stringify({ ...claims, sub: 'alice', exp: now + 99999 })).toString('base64url')}.${first.split('.')[2] as string}`
    const cases: Array<[string, Record<string, string>, string | undefined]> = [
      ['expired (beyond the clock tolerance)', bearer(await token({ sub: 'alice', expiresIn: -120 })), 'invalid_token'],
      ['not yet valid', bearer(await token({ sub: 'alice', notBefore: now + 600 })), 'invalid_token'],
      ['signed by another key under the trusted kid', bearer(await token({ sub: 'alice', key: forger.privateKey })), 'invalid_token'],
      ['signed by a key the set does not have', bearer(await token({ sub: 'alice', key: forger.privateKey, kid: 'k-unknown' })), 'invalid_token'],
      ['claims edited after signing', bearer(tampered), 'invalid_token'],
      ['alg none', bearer(unsigned), 'invalid_token'],
      ['another audience', bearer(await token({ sub: 'alice', aud: 'https://other.example.test/mcp' })), 'invalid_token'],
      ['not a JWT', bearer('opaque-token-value'), 'invalid_token'],
      ['no Authorization', {}, undefined],
      ['another scheme', { authorization: `Basic ${Buffer.from('alice:pw').toString('base64')}` }, undefined]
    ]
    for (const [name, auth, error] of cases) {
      const headers = alice.getHeaders(resumeFrom, {})
      delete headers.authorization
      const resume = await exchange(mcpUrl, { headers: { ...headers, ...auth } }, 1500)
      t.equal(resume.status, 401, `${name}: 401`)
      t.match(resume.headers['www-authenticate'], error === undefined ? /^Bearer$/ : new RegExp(`^Bearer error="${error}"`), `${name}: challenge`)
      t.equal(jsonRpcError(resume.text)?.id, null, `${name}: the gateway's JSON-RPC error`)
      t.notOk(resume.text.includes('alice-tag'), `${name}: nothing replayed`)
    }
    const init = await exchange(mcpUrl, {
      method: 'POST',
      headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', ...bearer(await token({ sub: 'alice', expiresIn: -120 })) },
      body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '0' } } })
    })
    t.equal(init.status, 401, 'initialize with an expired token: no session is created under it')
  })

  t.test('methods the MCP endpoint does not define: a verified token, as on any other path; not a CORS preflight', async t => {
    const anyone = { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-protocol-version': '2025-06-18' }
    for (const method of ['PUT', 'PATCH', 'HEAD'] as const) {
      const bare = await exchange(mcpUrl, { method, headers: anyone, ...(method !== 'HEAD' && { body: '{}' }) })
      t.equal(bare.status, 401, `${method} without a token: 401`)
      const held = await exchange(mcpUrl, { method, headers: { ...anyone, ...bearer(await token({ sub: 'alice' })) }, ...(method !== 'HEAD' && { body: '{}' }) })
      t.not(held.status, 401, `${method} with a token: forwarded (${held.status})`)
    }
    const preflight = await exchange(mcpUrl, { method: 'OPTIONS', headers: { origin: 'http://127.0.0.1', 'access-control-request-method': 'POST' } })
    t.not(preflight.status, 401, `OPTIONS (a preflight, never with credentials): forwarded (${preflight.status})`)
  })

  t.test('the key set is fetched once and cached', async t => {
    // One fetch for the first verification; an unknown kid may cause one more (cooldown).
    t.ok(jwks.fetches >= 1 && jwks.fetches <= 2, `JWK Set fetched ${jwks.fetches} time(s)`)
  })
})

t.test('the JWK Set endpoint unreachable', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())

  t.test('never reached: 503 with Retry-After, no session created or served', async t => {
    const closedPort = await freePort()
    const gw = await startGateway(t, 'memory', upstream.url, env(`http://127.0.0.1:${closedPort}/jwks`, { AUTH_JWKS_TIMEOUT_MS: '500' }))
    const init = await exchange(`${gw.url}/mcp`, {
      method: 'POST',
      headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', ...bearer(await token({ sub: 'alice' })) },
      body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '0' } } })
    })
    t.equal(init.status, 503)
    t.equal(init.headers['retry-after'], '5')
    t.equal(jsonRpcError(init.text)?.message.includes('AUTH_JWKS_URL'), true, 'the answer names the setting')
  })

  t.test('down after the first fetch: the cached set serves until it is too old, then 503 until the endpoint is back', async t => {
    const jwks = await serveJwks([publicJwk])
    t.teardown(() => jwks.close())
    const gw = await startGateway(t, 'memory', upstream.url, env(jwks.url, { AUTH_JWKS_CACHE_SECONDS: '2' }))
    const mcpUrl = `${gw.url}/mcp`
    const alice = await rawInitialize(mcpUrl, { headers: bearer(await token({ sub: 'alice' })) })
    jwks.up = false
    const cached = await exchange(mcpUrl, { method: 'POST', headers: alice.headers(bearer(await token({ sub: 'alice' }))), body: ping })
    t.equal(cached.status, 200, 'within AUTH_JWKS_CACHE_SECONDS: verified with the cached keys')
    await new Promise(resolve => setTimeout(resolve, 2100))
    const stale = await exchange(mcpUrl, { method: 'POST', headers: alice.headers(bearer(await token({ sub: 'alice' }))), body: ping })
    t.equal(stale.status, 503, 'past it, with the endpoint down: 503, the session not served')
    jwks.up = true
    const back = await exchange(mcpUrl, { method: 'POST', headers: alice.headers(bearer(await token({ sub: 'alice' }))), body: ping })
    t.equal(back.status, 200, 'the endpoint back: the same session goes on')
  })
})

t.test('header and JWT principals never meet: a replica on each over one Redis prefix', async t => {
  // A migration between the bindings, or a rollback within the TTL: one
  // replica verifies tokens, the other hashes the Authorization header.
  const jwks = await serveJwks([publicJwk])
  t.teardown(() => jwks.close())
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const redis = await useRedis(t, 'kinds')
  const onJwt = await startGatewayOnRedis(t, redis, upstream.url, env(jwks.url))
  const onHeader = await startGatewayOnRedis(t, redis, upstream.url, { SESSION_REQUESTS_PER_SECOND: '1000' })
  const aliceToken = bearer(await token({ sub: 'alice' }))
  const alice = await rawInitialize(`${onJwt.url}/mcp`, { headers: aliceToken })
  const ids = await requestStreamIds(onJwt, alice, aliceToken, 'alice-secret')
  // The string a JWT principal's hash is taken over, sent as a header value.
  const forged = { authorization: [['jwt', ISSUER, 'alice']].flat().map(p => `${Buffer.byteLength(p)}:${p}`).join('') }
  t.equal(forged.authorization, `3:jwt${ISSUER.length}:${ISSUER}5:alice`)
  const resume = await exchange(`${onHeader.url}/mcp`, { headers: alice.getHeaders(ids[0], forged) }, 1500)
  t.equal(resume.status, 404, 'the header replica does not take the forged value for alice')
  t.notOk(resume.text.includes('alice-secret'), 'nothing of alice\'s replayed')
  const post = await exchange(`${onHeader.url}/mcp`, { method: 'POST', headers: alice.headers(forged), body: ping })
  t.equal(post.status, 404, 'nor acts in her session')
  const own = await exchange(`${onJwt.url}/mcp`, { headers: alice.getHeaders(ids[0], aliceToken) }, 1500)
  t.ok(own.text.includes('alice-secret'), 'alice herself still resumes')
})

t.test('a validly signed token whose sub is not a non-empty string: 401, not a key-set outage', async t => {
  const auth = await startAuthServer(t)
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, auth.env)
  const init = JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '0' } } })
  for (const sub of [123, '', { id: 'alice' }, ['alice'], null, true]) {
    const answer = await exchange(`${gw.url}/mcp`, {
      method: 'POST',
      headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', ...bearer(await auth.token(sub)) },
      body: init
    })
    t.equal(answer.status, 401, `sub ${JSON.stringify(sub)}: 401`)
    t.match(answer.headers['www-authenticate'], /^Bearer error="invalid_token"/, 'invalid_token')
    t.notOk('retry-after' in answer.headers, 'no Retry-After: retrying the same token cannot help')
  }
  const metricsText = (await exchange(`${gw.adminUrl}/metrics`)).text
  t.notMatch(metricsText, /MCPGW_AUTH_UNAVAILABLE/, 'not counted as the authorization server being down')
  t.equal((await exchange(`${gw.url}/mcp`, { method: 'POST', headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', ...bearer(await auth.token('alice')) }, body: init })).status, 200, 'a string sub: served')
})
