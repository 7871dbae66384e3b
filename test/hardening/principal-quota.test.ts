// One principal cannot exhaust MAX_SESSIONS for everyone: the attack of
// opening sessions, each with its standalone GET, and leaving (each upstream
// GET then held STANDALONE_HOLD_SECONDS); and the streams a replica takes
// over when another drains, which count without being refused. Real gateways
// (the embedded store; two replicas on Redis for the failover) in front of the
// SDK example upstream, raw HTTP.
import t from 'tap'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startGateway, startGatewayOnRedis } from '../fixtures/gateway.js'
import { exchange, rawInitialize, rawRequest, RawSse, until, type Answer, type RawSession } from '../fixtures/hardening.js'
import { useRedis } from '../fixtures/redis.js'

const MAX_SESSIONS = 50
const CYCLES = 55
/** The default: a tenth of MAX_SESSIONS. */
const PER_PRINCIPAL = 5

/**
 * initialize, open the standalone GET, disconnect after `readMs` (the gateway
 * keeps holding the upstream GET). 2025-11-25: the stream starts with a
 * priming event, so its status is known at once.
 */
async function cycle (mcpUrl: string, auth?: string, readMs = 1500): Promise<{ session: RawSession, get: Answer }> {
  const session = await rawInitialize(mcpUrl, { version: '2025-11-25', headers: auth === undefined ? {} : { authorization: auth } })
  const get = await exchange(mcpUrl, { headers: session.getHeaders() }, readMs)
  return { session, get }
}

t.test(`${CYCLES} initialize+GET+disconnect cycles of one principal leave others their sessions`, async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, { MAX_SESSIONS: String(MAX_SESSIONS), STANDALONE_HOLD_SECONDS: '120', SESSION_REQUESTS_PER_SECOND: '1000', INITIALIZES_PER_MINUTE_PER_ADDRESS: '1000' })
  const mcpUrl = `${gw.url}/mcp`

  const statuses: number[] = []
  const sessions: RawSession[] = []
  for (let i = 0; i < CYCLES; i += 11) {
    const batch = await Promise.all(Array.from({ length: Math.min(11, CYCLES - i) }, async () => await cycle(mcpUrl, 'Bearer mallory')))
    for (const { session, get } of batch) {
      statuses.push(get.status ?? 0)
      sessions.push(session)
    }
  }
  const held = statuses.filter(s => s === 200).length
  t.comment(statuses.join(' '))
  t.equal(held, PER_PRINCIPAL, `mallory got ${PER_PRINCIPAL} standalone streams (MAX_SESSIONS_PER_PRINCIPAL defaults to MAX_SESSIONS / 10)`)
  t.same(statuses.filter(s => s !== 200).map(String), Array(CYCLES - PER_PRINCIPAL).fill('429'), 'every further one: 429')
  t.equal(gw.gateway.hub.pumpCount, PER_PRINCIPAL, 'upstream GETs held: her share only')

  for (const user of ['alice', 'bob', 'carol']) {
    const { get } = await cycle(mcpUrl, `Bearer ${user}`)
    t.equal(get.status, 200, `${user}: a standalone stream, not 503`)
  }

  // A place comes back when one of mallory's sessions ends.
  const ended = sessions[statuses.indexOf(200)] as RawSession
  const del = await exchange(mcpUrl, { method: 'DELETE', headers: ended.headers() })
  t.equal(del.status, 200, 'mallory ends one session')
  const { get } = await cycle(mcpUrl, 'Bearer mallory')
  t.equal(get.status, 200, 'and may open one stream again')
})

t.test('requests without credentials share one principal, counted like any other', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, { MAX_SESSIONS: '20', MAX_SESSIONS_PER_PRINCIPAL: '2', SESSION_REQUESTS_PER_SECOND: '1000' })
  const mcpUrl = `${gw.url}/mcp`
  const answers = await Promise.all(Array.from({ length: 4 }, async () => await cycle(mcpUrl)))
  t.same(answers.map(a => a.get.status).sort(), [200, 200, 429, 429], 'anonymous users: MAX_SESSIONS_PER_PRINCIPAL, as one principal')
})

t.test('an initialize flood, anonymous or with rotating credentials, leaves a token holder served', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  // The test stands for a trusted proxy: X-Forwarded-For says which client each request is.
  const gw = await startGateway(t, 'memory', upstream.url, {
    MAX_SESSIONS: '20', TRUSTED_PROXIES: 'loopback', INITIALIZES_PER_MINUTE_PER_ADDRESS: '5', STANDALONE_EARLY_HOLD_SECONDS: '1', SESSION_REQUESTS_PER_SECOND: '1000'
  })
  const mcpUrl = `${gw.url}/mcp`
  const from = (address: string, more: Record<string, string> = {}): Record<string, string> => ({ 'x-forwarded-for': address, ...more })
  const init = JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'flood', version: '0' } } })
  const initialize = async (headers: Record<string, string>): Promise<Answer> => await exchange(mcpUrl, {
    method: 'POST', headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', ...headers }, body: init
  })

  // One address: INITIALIZES_PER_MINUTE_PER_ADDRESS.
  const burst = await Promise.all(Array.from({ length: 30 }, async () => await initialize(from('198.51.100.1'))))
  t.equal(burst.filter(a => a.status === 200).length, 5, 'one address: 5 sessions')
  const refused = burst.filter(a => a.status === 429)
  t.equal(refused.length, 25, 'the rest: 429')
  t.ok(refused.every(a => Number(a.headers['retry-after']) >= 1), 'with Retry-After')
  // The method spelt with a JSON escape is what the upstream reads: an initialize, counted as one.
  const escaped = await exchange(mcpUrl, {
    method: 'POST', headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', ...from('198.51.100.1') }, body: init.replace('"initialize"', '"\\u0069nitialize"')
  })
  t.equal(escaped.status, 429, 'an escaped initialize from that address: 429 too')
  const v6 = await Promise.all(Array.from({ length: 8 }, async (_, i) => await initialize(from(`2001:db8:7:7::${i + 1}`))))
  t.equal(v6.filter(a => a.status === 200).length, 5, 'one IPv6 /64 is one address')

  // Many addresses, no credentials: one principal's share of upstream GETs.
  await Promise.all(Array.from({ length: 30 }, async (_, i) => await initialize(from(`203.0.113.${i + 1}`))))
  await new Promise(resolve => setTimeout(resolve, 300))
  t.ok(gw.gateway.hub.pumpCount <= 2, `anonymous sessions hold ${gw.gateway.hub.pumpCount} upstream GETs (MAX_SESSIONS_PER_PRINCIPAL: 2)`)

  // Many addresses, a new Authorization each: every place of MAX_SESSIONS taken, for a while.
  // The most held at once, read while the flood goes on: on a loaded machine the first
  // sessions' early hold (a second) can pass before the last initialize is answered.
  let peak = 0
  const watch = setInterval(() => { peak = Math.max(peak, gw.gateway.hub.pumpCount) }, 5)
  try {
    await Promise.all(Array.from({ length: 40 }, async (_, i) => await initialize(from(`192.0.2.${i + 1}`, { authorization: `Bearer rotating-${i}` }))))
  } finally {
    clearInterval(watch)
  }
  peak = Math.max(peak, gw.gateway.hub.pumpCount)
  t.equal(peak, 20, 'the flood holds every upstream GET MAX_SESSIONS allows, and no more')
  // Nobody opened those streams: released after STANDALONE_EARLY_HOLD_SECONDS, not STANDALONE_HOLD_SECONDS (120 s).
  const deadline = Date.now() + 5000
  while (gw.gateway.hub.pumpCount > 0 && Date.now() < deadline) await new Promise(resolve => setTimeout(resolve, 100))
  t.equal(gw.gateway.hub.pumpCount, 0, 'released once the early hold passed')

  const alice = await rawInitialize(mcpUrl, { version: '2025-11-25', headers: from('198.51.100.200', { authorization: 'Bearer alice' }) })
  const stream = await exchange(mcpUrl, { headers: alice.getHeaders() }, 1500)
  t.equal(stream.status, 200, 'a token holder: her standalone stream, not 503')
  t.match(stream.headers['content-type'], /text\/event-stream/)
})

t.test('a stream taken over at a failover counts for its principal: not refused, and its new streams wait until it is back under', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const redis = await useRedis(t, 'quota-takeover')
  // One stream per principal and replica.
  const env = { MAX_SESSIONS_PER_PRINCIPAL: '1', STANDALONE_HOLD_SECONDS: '120', SESSION_REQUESTS_PER_SECOND: '1000', DRAIN_SPREAD_SECONDS: '0' }
  const r1 = await startGatewayOnRedis(t, redis, upstream.url, env)
  const r2 = await startGatewayOnRedis(t, redis, upstream.url, env)
  const auth = { authorization: 'Bearer pat' }
  const getOn = (port: number, session: RawSession): RawSse => new RawSse(port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders(undefined, auth))))

  // s1's stream is held by r1; its client follows it from r2 (r2 watches the lease).
  const s1 = await rawInitialize(`${r1.url}/mcp`, { headers: auth })
  const first = getOn(r1.port, s1)
  t.teardown(() => first.close())
  t.ok(await until(() => first.status !== undefined, 5000) && first.status === 200, 's1\'s stream held by r1')
  first.close()
  const follower = getOn(r2.port, s1)
  t.teardown(() => follower.close())
  t.ok(await until(() => follower.status !== undefined, 5000) && follower.status === 200, 's1\'s client follows it on r2')
  t.equal(r2.gateway.hub.pumpCount, 0, 'r2 does not hold s1\'s stream')
  // s2's stream is held by r2: pat's share there.
  const s2 = await rawInitialize(`${r2.url}/mcp`, { headers: auth })
  const second = getOn(r2.port, s2)
  t.teardown(() => second.close())
  t.ok(await until(() => second.status !== undefined, 5000) && second.status === 200, 's2\'s stream held by r2')

  // r1 drains: r2 takes s1's stream over, over pat's share.
  await r1.close()
  t.ok(await until(() => r2.gateway.hub.pumpCount === 2, 10_000), `r2 took s1's stream over although pat holds its share there (r2 holds ${r2.gateway.hub.pumpCount})`)

  // s2 ends: pat still holds its share on r2 (the stream taken over counts).
  const del = await exchange(`${r2.url}/mcp`, { method: 'DELETE', headers: s2.headers(auth) })
  t.equal(del.status, 200, 's2 ends')
  t.ok(await until(() => r2.gateway.hub.pumpCount === 1, 5000), 'r2 holds s1\'s stream only')
  const s3 = await rawInitialize(`${r2.url}/mcp`, { headers: auth })
  const third = await exchange(`${r2.url}/mcp`, { headers: s3.getHeaders(undefined, auth) }, 1000)
  t.equal(third.status, 429, 'a new stream of pat on r2 is refused: the stream taken over holds its place')
})
