// Taking over a session whose id leaked, by making the gateway forget it: an
// initialize flood that evicts it from the embedded store (which used to open
// the lost-session recovery to whoever came first), or a modern-era protocol
// version on a session whose record expired (which used to be forwarded under
// any principal); and after a real loss, coming back first with the id.
// Real gateway, SDK example upstream, raw HTTP, real Redis.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { RECORD_BYTES, type MemoryEventStore } from '../../src/store/memory/memory-store.js'
import { startGateway, startGatewayOnRedis } from '../fixtures/gateway.js'
import { deleteKeys, useRedis } from '../fixtures/redis.js'
import { exchange, jsonRpcError, rawInitialize } from '../fixtures/hardening.js'
import { HeaderPrincipal, principalHash } from '../../src/auth/principal.js'
import { parseSessionId, SessionIdIssuer } from '../../src/protocol/session-id.js'

const CAP = 1048576
/** Past the session cache's fresh window (2 s): the next request asks the store. */
const CACHE_FRESH_MS = 2100
const ping = (id: number): string => JSON.stringify({ jsonrpc: '2.0', id, method: 'ping' })
const GATEWAY_404 = /^Session not found/

t.test('an initialize flood that evicts a session does not hand it to another principal', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, { MEMORY_STORE_MAX_BYTES: String(CAP), SESSION_REQUESTS_PER_SECOND: '1000' })
  const mcpUrl = `${gw.url}/mcp`
  const store = gw.gateway.store as MemoryEventStore
  const alice = await rawInitialize(mcpUrl, { headers: { authorization: 'Bearer alice' } })
  t.equal((await exchange(mcpUrl, { method: 'POST', headers: alice.headers(), body: ping(1) })).status, 200, 'alice\'s session works')
  const intactBefore = await store.intactSince()

  // The flood: as many new sessions as the cap holds, straight into the store
  // (what a flood of initialize requests does to it, without 2,000 upstream sessions).
  const flood = Math.ceil(CAP / RECORD_BYTES.session) + 10
  for (let i = 0; i < flood; i++) await store.createSession(`flood-${i}`, 'mallory-principal')
  t.equal(await store.getSession(alice.sessionId), null, 'alice\'s session was evicted')
  t.ok(await store.intactSince() <= intactBefore, 'the store does not call the eviction a loss (intactSince does not move forward)')
  await sleep(CACHE_FRESH_MS)

  const mallory = await exchange(mcpUrl, { method: 'POST', headers: alice.headers({ authorization: 'Bearer mallory' }), body: ping(2) })
  t.equal(mallory.status, 404, 'mallory with alice\'s leaked session id: 404')
  t.match(jsonRpcError(mallory.text)?.message, GATEWAY_404, 'the gateway\'s answer, not the upstream\'s')
  const stream = await exchange(mcpUrl, { headers: alice.getHeaders(undefined, { authorization: 'Bearer mallory' }) }, 800)
  t.equal(stream.status, 404, 'nor alice\'s standalone stream')

  // Evicted is gone, as expired is: the owner starts a new session too (the store's cap is the bound).
  const owner = await exchange(mcpUrl, { method: 'POST', headers: alice.headers(), body: ping(3) })
  t.equal(owner.status, 404, 'alice gets 404 too, and initializes again')
  t.equal(await store.getSession(alice.sessionId), null, 'nothing recorded under anyone')
})

t.test('without SESSION_BINDING_KEY, an id made under the built-in key for another principal\'s upstream session is not taken for a lost session', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  // A fresh process: its embedded store was "lost" at its start, less than RETENTION_TTL_SECONDS ago.
  const gw = await startGateway(t, 'memory', upstream.url, { SESSION_BINDING_KEY: '' })
  const mcpUrl = `${gw.url}/mcp`
  const alice = await rawInitialize(mcpUrl, { headers: { authorization: 'Bearer alice' } })
  t.equal((await exchange(mcpUrl, { method: 'POST', headers: alice.headers(), body: ping(1) })).status, 200, 'alice\'s session works')
  const parsed = parseSessionId(alice.sessionId)
  if (parsed.kind !== 'bound') throw new Error('the gateway issued an unbound id')
  // The built-in key is in the source: mallory binds alice's upstream session to herself.
  const mallory = new HeaderPrincipal('authorization').identify({ authorization: 'Bearer mallory' }).principal as string
  const forged = new SessionIdIssuer(undefined).issue(mallory, parsed.firstUpstreamId)
  const headers = alice.headers({ authorization: 'Bearer mallory', 'mcp-session-id': forged })
  const call = await exchange(mcpUrl, { method: 'POST', headers, body: ping(2) })
  t.equal(call.status, 404, 'mallory\'s forged id: 404')
  t.match(jsonRpcError(call.text)?.message, GATEWAY_404, 'the gateway\'s answer: nothing went to alice\'s upstream session')
  const stream = await exchange(mcpUrl, { headers: alice.getHeaders(undefined, { authorization: 'Bearer mallory', 'mcp-session-id': forged }) }, 800)
  t.equal(stream.status, 404, 'nor does its GET open alice\'s standalone stream')
  t.equal(await gw.store.getSession(forged), null, 'nothing recorded under the forged id')
  t.equal((await exchange(mcpUrl, { method: 'POST', headers: alice.headers(), body: ping(3) })).status, 200, 'alice\'s session goes on')
})

t.test('an evicted session this replica never verified is not recovered for anyone', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, { MEMORY_STORE_MAX_BYTES: String(CAP) })
  const mcpUrl = `${gw.url}/mcp`
  const store = gw.gateway.store as MemoryEventStore
  // A session the upstream knows but this gateway's cache never saw (as on a restarted replica).
  const bob = await rawInitialize(upstream.url, { headers: { authorization: 'Bearer bob' } })
  await store.createSession(bob.sessionId, 'bob-principal-hash')
  for (let i = 0; i < Math.ceil(CAP / RECORD_BYTES.session) + 10; i++) await store.createSession(`flood-${i}`, 'mallory-principal')
  t.equal(await store.getSession(bob.sessionId), null, 'evicted')
  const mallory = await exchange(mcpUrl, { method: 'POST', headers: bob.headers({ authorization: 'Bearer mallory' }), body: ping(1) })
  t.equal(mallory.status, 404)
  t.match(jsonRpcError(mallory.text)?.message, GATEWAY_404, 'the gateway\'s 404: no recovery opened by the flood')
  t.equal(await store.getSession(bob.sessionId), null, 'nothing recorded under mallory')
})

t.test('after a real loss (Redis restarted empty), a session this replica knew is recovered only for its principal', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const testRedis = await useRedis(t, 'takeover')
  const { prefix, redis } = testRedis
  const { url, store } = await startGatewayOnRedis(t, testRedis, upstream.url)
  const mcpUrl = `${url}/mcp`
  const alice = await rawInitialize(mcpUrl, { headers: { authorization: 'Bearer alice' } })
  const alicePrincipal = (await store.getSession(alice.sessionId))?.principal
  // What a Redis restarted empty does: the session's keys gone, the intact mark new.
  t.ok(await deleteKeys(redis, `${prefix}{${alice.sessionId}}`) > 0, 'alice\'s records are gone')
  await redis.set(`${prefix}intact`, String(Date.now()))
  await sleep(CACHE_FRESH_MS)
  for (const attempt of [1, 2]) {
    const mallory = await exchange(mcpUrl, { method: 'POST', headers: alice.headers({ authorization: 'Bearer mallory' }), body: ping(attempt) })
    t.equal(mallory.status, 404, `mallory first, attempt ${attempt}: 404`)
    t.match(jsonRpcError(mallory.text)?.message, GATEWAY_404, 'the gateway\'s answer')
  }
  // The session's upstream GET, held since initialize, may have recorded it again meanwhile: for alice.
  const meanwhile = await store.getSession(alice.sessionId)
  t.ok(meanwhile === null || meanwhile.principal === alicePrincipal, 'nothing recorded under mallory')
  const owner = await exchange(mcpUrl, { method: 'POST', headers: alice.headers(), body: ping(3) })
  t.equal(owner.status, 200, 'alice: her session recovered under a new epoch (the upstream confirmed it)')
  t.not(await store.getSession(alice.sessionId), null, 'recorded again, for alice')
  t.equal((await exchange(mcpUrl, { method: 'POST', headers: alice.headers({ authorization: 'Bearer mallory' }), body: ping(4) })).status, 404, 'mallory still 404')
})

t.test('replicas over one Redis bound to different headers: the same value in another header is another principal', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const testRedis = await useRedis(t, 'takeover')
  // A migration or a rollback: one replica bound to what an authenticating proxy sets, one on the default.
  const proxied = await startGatewayOnRedis(t, testRedis, upstream.url, { PRINCIPAL_HEADER: 'X-Authenticated-User' })
  const plain = await startGatewayOnRedis(t, testRedis, upstream.url)
  const alice = await rawInitialize(`${proxied.url}/mcp`, { headers: { 'x-authenticated-user': 'alice@example.com' } })
  t.equal((await exchange(`${proxied.url}/mcp`, { method: 'POST', headers: alice.headers(), body: ping(1) })).status, 200, 'alice\'s session works')

  // Mallory holds the leaked id and knows alice's user name.
  const asMallory = { authorization: 'alice@example.com' }
  const call = await exchange(`${plain.url}/mcp`, { method: 'POST', headers: alice.headers(asMallory), body: ping(2) })
  t.equal(call.status, 404, 'alice\'s user name as Authorization, on the default replica: 404')
  t.match(jsonRpcError(call.text)?.message, GATEWAY_404, 'the gateway\'s answer: nothing reached alice\'s upstream session')
  const initializeId = alice.initEvents.find(e => e.id !== undefined)?.id
  t.type(initializeId, 'string', 'alice\'s initialize answer was recorded under an event id')
  const resume = await exchange(`${plain.url}/mcp`, { headers: alice.getHeaders(initializeId, asMallory) }, 800)
  t.equal(resume.status, 404, 'nor does a resume replay what was recorded for alice')
  t.equal((await exchange(`${proxied.url}/mcp`, { method: 'POST', headers: alice.headers(), body: ping(3) })).status, 200, 'alice\'s session goes on')

  const value = 'Bearer token'
  t.equal(new HeaderPrincipal('authorization').identify({ authorization: value }).principal, principalHash('header', value), 'Authorization\'s principals keep their form: sessions carry over an upgrade')
  t.not(new HeaderPrincipal('x-authenticated-user').identify({ 'x-authenticated-user': value }).principal, principalHash('header', value), 'another header\'s name is part of its principals')
})

t.test('a modern-era protocol version does not get around the binding of a session whose record expired', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, { RETENTION_TTL_SECONDS: '1' })
  const mcpUrl = `${gw.url}/mcp`
  const store = gw.gateway.store as MemoryEventStore
  const alice = await rawInitialize(mcpUrl, { headers: { authorization: 'Bearer alice' } })
  t.equal((await exchange(mcpUrl, { method: 'POST', headers: alice.headers({ 'mcp-protocol-version': '2026-07-28' }), body: ping(1) })).status !== 404, true,
    'alice, her live session, modern era: not refused by the gateway')
  // Expired: the record's TTL ran out (and the cache's windows with it).
  await store.deleteSession(alice.sessionId)
  await sleep(CACHE_FRESH_MS)
  for (const [who, auth] of [['mallory', 'Bearer mallory'], ['alice', 'Bearer alice']] as const) {
    for (const method of ['POST', 'GET', 'DELETE', 'PUT'] as const) {
      const headers = method === 'GET' ? alice.getHeaders(undefined, { authorization: auth, 'mcp-protocol-version': '2026-07-28' }) : alice.headers({ authorization: auth, 'mcp-protocol-version': '2026-07-28' })
      const answer = await exchange(mcpUrl, { method, headers, ...(method === 'POST' || method === 'PUT' ? { body: ping(2) } : {}) }, 800)
      t.equal(answer.status, 404, `${who}, ${method}, 2026-07-28, the expired session's id: 404`)
      t.match(jsonRpcError(answer.text)?.message, GATEWAY_404, `${who}, ${method}: the gateway's answer, nothing forwarded`)
    }
  }
  const stateless = await exchange(mcpUrl, { method: 'POST', headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-protocol-version': '2026-07-28' }, body: ping(3) })
  t.not(stateless.status, 404, 'a modern-era request without a session id still goes to the upstream')
})
