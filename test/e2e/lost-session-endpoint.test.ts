// Sessions the store lost, with several upstream endpoints: the record a
// recovery writes names no endpoint (the gateway that recovers it never knew
// where the session lives), yet each store-less SDK server holds its sessions
// in memory, and any other endpoint answers 404. Every session must go on on
// the endpoint that holds it, its record pinned there, with no new initialize
// upstream (the recipe went with the store: nothing could establish it again).
// On the embedded store the gateway restarts; on Redis the keys are deleted
// and a gateway that never saw the sessions serves them.
import t, { type Test } from 'tap'
import { startGateway, startGatewayOnRedis, type RunningGateway } from '../fixtures/gateway.js'
import { ACCEPT_BOTH, exchange, metricSum, metrics, rawInitialize, sseEvents, type RawSession } from '../fixtures/hardening.js'
import { deleteKeys, useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream, type RestartableUpstream } from '../fixtures/restartable-upstream.js'
import { request } from 'undici'

/**
 * The status of a GET's response head, waited for up to 10 s (the stream itself is not
 * read): where the gateway that created the sessions still holds their upstream GETs,
 * the upstream answers the new one 409 until the old one goes, and it is asked again.
 */
async function headStatus (url: string, headers: Record<string, string>): Promise<number | undefined> {
  const res = await request(url, { headers, signal: AbortSignal.timeout(10_000) }).catch(() => undefined)
  if (res === undefined) return undefined
  // Destroying a body not read to its end emits an error: this check only wants the status.
  res.body.on('error', () => {}).destroy()
  return res.statusCode
}

const SESSIONS = 8
const VERSION = '2025-06-18'

async function startUpstreams (t: Test, count: number): Promise<RestartableUpstream[]> {
  const upstreams: RestartableUpstream[] = []
  for (let i = 0; i < count; i++) {
    const upstream = await startRestartableUpstream()
    t.teardown(() => upstream.close())
    upstreams.push(upstream)
  }
  return upstreams
}

/** The upstream that initialized the session the client holds (the gateway's id ends with the upstream's first id). */
function holderOf (upstreams: readonly RestartableUpstream[], session: RawSession): { holder: RestartableUpstream, upstreamId: string } {
  for (const holder of upstreams) {
    const upstreamId = holder.life.initialized.find(id => session.sessionId.endsWith(`.${id}`))
    if (upstreamId !== undefined) return { holder, upstreamId }
  }
  throw new Error('no upstream initialized the session')
}

function initializes (upstreams: readonly RestartableUpstream[]): number {
  return upstreams.reduce((n, u) => n + u.life.requests.filter(r => r.method === 'initialize').length, 0)
}

/**
 * Each session's next tools/call, then its GET, through `gw`: served where the session lives, its record pinned there.
 * Returns how many of those calls were first balanced to an endpoint that does not hold the session (each answered
 * 404 there, then found where it lives); the others were pinned by their 2xx.
 */
async function goOn (t: Test, gw: RunningGateway, upstreams: readonly RestartableUpstream[], sessions: readonly RawSession[]): Promise<number> {
  const initializedBefore = initializes(upstreams)
  for (const [i, session] of sessions.entries()) {
    const { holder, upstreamId } = holderOf(upstreams, session)
    const body = JSON.stringify({ jsonrpc: '2.0', id: 10 + i, method: 'tools/call', params: { name: 'echo', arguments: { text: `after ${i}` } } })
    const call = await exchange(`${gw.url}/mcp`, { method: 'POST', headers: session.headers(), body })
    t.equal(call.status, 200, `session ${i}: its tools/call is answered`)
    t.ok(sseEvents(call.text).some(e => e.data.includes(`"after ${i}"`)), `session ${i}: with the tool's result`)
    t.ok(holder.life.requests.some(r => r.method === 'tools/call' && r.sessionId === upstreamId), `session ${i}: by the endpoint that holds it`)
    t.equal(await headStatus(`${gw.url}/mcp`, session.getHeaders()), 200, `session ${i}: its GET opens`)
    const record = await gw.store.getSession(session.sessionId)
    t.equal(record?.endpoint, new URL(holder.url).origin, `session ${i}: its record names the endpoint that holds it`)
    t.equal(record?.upstreamSessionId, upstreamId, `session ${i}: the same upstream session`)
  }
  t.equal(initializes(upstreams), initializedBefore, 'no session was initialized upstream again')
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'unrecorded' }), 0, 'none was given up for want of a recipe')
  return sessions.filter(session => {
    const { holder, upstreamId } = holderOf(upstreams, session)
    return upstreams.some(u => u !== holder && u.life.requests.some(r => r.method === 'tools/call' && r.sessionId === upstreamId))
  }).length
}

async function openSessions (gw: RunningGateway, upstreams: readonly RestartableUpstream[]): Promise<RawSession[]> {
  const sessions: RawSession[] = []
  for (let i = 0; i < SESSIONS; i++) sessions.push(await rawInitialize(`${gw.url}/mcp`, { version: VERSION, headers: { accept: ACCEPT_BOTH } }))
  // Both endpoints hold some: otherwise round robin could not miss.
  for (const upstream of upstreams) {
    if (!sessions.some(s => holderOf(upstreams, s).holder === upstream)) throw new Error('an endpoint got no session')
  }
  return sessions
}

t.test('embedded store: a restarted gateway serves each session it lost on the endpoint that holds it', async (t) => {
  const upstreams = await startUpstreams(t, 2)
  const upstreamUrl = upstreams.map(u => u.url).join(',')
  const first = await startGateway(t, 'memory', upstreamUrl)
  const sessions = await openSessions(first, upstreams)
  // The process restarts: same upstreams, an empty embedded store.
  await first.close()
  const second = await startGateway(t, 'memory', upstreamUrl)
  // Which first calls miss depends on where the sessions were placed (two random draws per session).
  const missed = await goOn(t, second, upstreams, sessions)
  t.comment(`${missed} of ${SESSIONS} first calls went to an endpoint that does not hold the session`)
  t.equal(metricSum(await metrics(second.adminUrl), 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'found' }), missed, 'each endpoint found for a session after a 404 elsewhere is counted as found')
})

t.test('Redis: a gateway that never saw the sessions serves them after their keys went', async (t) => {
  const redis = await useRedis(t, 'lost-endpoint')
  const upstreams = await startUpstreams(t, 3)
  const upstreamUrl = upstreams.map(u => u.url).join(',')
  const first = await startGatewayOnRedis(t, redis, upstreamUrl)
  const sessions = await openSessions(first, upstreams)
  t.ok(await deleteKeys(redis.redis, redis.prefix) > 0, 'every key of the gateway deleted: Redis lost them')
  const other = await startGatewayOnRedis(t, redis, upstreamUrl)
  await goOn(t, other, upstreams, sessions)
})
