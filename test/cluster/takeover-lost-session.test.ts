// The replica holding a session's upstream GET is SIGKILLed, and the upstream
// restarts before its lease expires: the upstream lost the session. The replica
// where the client's standalone stream is attached takes the stream over and
// meets the upstream's 404. Unlike a 409 (another GET still open there), that
// answer is final: it is not asked again for LEASE_TTL_MS, the client's stream
// is closed at once, and the client's reconnect establishes the session
// upstream again; the standalone stream then carries what the new upstream
// session sends, and no request of the client fails.
import t from 'tap'
import { startBalancer } from '../fixtures/balancer.js'
import { startReplicas } from '../fixtures/cluster-scenario.js'
import { connectClient, waitUntil, type McpTestClient } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import type { Replica } from '../fixtures/replica.js'
import { startRestartableUpstream } from '../fixtures/restartable-upstream.js'

// Large enough that a 404 asked again up to LEASE_TTL_MS stands out from one acted on at once.
const LEASE_TTL_MS = 6000
/** How long after the takeover's 404 the client's stream may be closed: well under LEASE_TTL_MS. */
const PROMPT_MS = LEASE_TTL_MS / 4

function standaloneTexts (mcp: McpTestClient): unknown[] {
  return mcp.notifications.filter(n => n.method === 'notifications/message' && (n.params as { logger?: string }).logger === 'standalone').map(n => (n.params as { data: unknown }).data)
}

/** When the replica logged its first line matching `msg` (epoch ms), NaN if it did not. */
function loggedAt (replica: Replica, msg: RegExp): number {
  const time = replica.logged(msg)[0]?.time
  return typeof time === 'string' ? Date.parse(time) : typeof time === 'number' ? time : NaN
}

t.test('takeover of a session the upstream lost: the 404 is not asked again, the client reconnects at once and its session goes on', async t => {
  const redis = await useRedis(t, 'takeover-404')
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const env = { REDIS_URL: redis.url, REDIS_KEY_PREFIX: redis.prefix, LEASE_TTL_MS: String(LEASE_TTL_MS) }
  const [a, b] = await startReplicas(t, upstream.url, env, ['A', 'B']) as [Replica, Replica]
  const lb = await startBalancer([a.port, b.port])
  t.teardown(() => lb.close())

  // One connection per request: initialize (A opens the upstream GET and holds its lease)
  // and notifications/initialized on A, the client's standalone GET on B.
  lb.plan([a.port, a.port, b.port])
  const mcp = await connectClient(lb.url('/mcp'), { agentOptions: { pipelining: 0 } })
  t.teardown(() => mcp.close())
  const sessionId = mcp.sessionId
  const gets = (): typeof mcp.exchanges => mcp.exchanges.filter(e => e.method === 'GET')
  t.ok(await waitUntil(() => gets().some(e => e.status === 200), 5000), 'standalone GET open')
  t.same(lb.history.slice(0, 3), [a.port, a.port, b.port], 'initialize on A, the standalone GET on B')
  const holders = await Promise.all([a, b].map(async r => await r.metric('mcpgw_upstream_streams_open', { kind: 'standalone' })))
  t.same(holders, [1, 0], 'A holds the upstream GET, B follows the store')
  const firstUpstreamId = upstream.life.initialized[0]
  if (firstUpstreamId === undefined) throw new Error('the upstream initialized no session')
  const attached = gets().find(e => e.status === 200)
  if (attached === undefined) throw new Error('no standalone GET')

  // A dies; the upstream restarts while A's lease still runs, losing the session.
  lb.remove(a.port)
  a.kill('SIGKILL')
  const killedAt = Date.now()
  await a.exited
  await upstream.restart()

  // B takes the stream over once A's lease expired; its GET meets the upstream's 404.
  const takeoverGets = (): number => upstream.life.requests.filter(r => r.method === 'GET' && r.sessionId === firstUpstreamId).length
  t.ok(await waitUntil(() => takeoverGets() > 0, 3 * LEASE_TTL_MS), 'B asks the restarted upstream for the session\'s GET')
  const refusedAt = Date.now()
  t.match(upstream.life.requests[0], { method: 'GET', sessionId: firstUpstreamId }, 'the takeover\'s GET is the first request the restarted upstream sees')
  t.ok(await waitUntil(() => attached.ended, 2 * LEASE_TTL_MS), 'the client\'s stream on B is closed')
  const closedAt = Date.now()
  const closedMs = closedAt - refusedAt
  // Before the client's reconnect, which asks for the GET once more (and then establishes the session again).
  const askedBeforeClose = takeoverGets()
  const reconnected = await waitUntil(() => gets().some(e => e.startedAt >= closedAt - 50 && e.status === 200), 3 * LEASE_TTL_MS)
  const reconnect = gets().find(e => e.startedAt >= closedAt - 50)
  const reconnectedAt = reconnect?.startedAt ?? NaN
  const cameFreeAt = loggedAt(b, /lease came free/)
  const gaveUp = b.logged(/takeover: the upstream GET could not be opened/)
  t.comment(`takeover 404: lease ttl ${LEASE_TTL_MS} ms; B took the lease ${cameFreeAt - killedAt} ms after the SIGKILL; the client's stream closed ${closedMs} ms after the upstream's 404 (B gave up ${loggedAt(b, /takeover: the upstream GET could not be opened/) - cameFreeAt} ms after taking the lease, at attempt ${String(gaveUp[0]?.attempt)}); its reconnect ${reconnectedAt - closedAt} ms after the close`)
  t.ok(closedMs < PROMPT_MS, `closed ${closedMs} ms after the 404, not after LEASE_TTL_MS (${LEASE_TTL_MS} ms) of asking again`)
  t.match(gaveUp, [{ status: 404, attempt: 1 }], 'B gave the takeover up at its first 404')
  t.equal(askedBeforeClose, 1, 'the takeover asked the upstream once for the lost session\'s GET')

  // The client's reconnect goes through B, which establishes the session upstream again
  // and opens the new upstream session's GET.
  t.ok(reconnected, 'the client\'s standalone stream is back')
  t.equal(upstream.life.initialized.length, 1, 'the session was established upstream again, once')
  const secondUpstreamId = upstream.life.initialized[0]
  t.ok(upstream.life.requests.some(r => r.method === 'GET' && r.sessionId === secondUpstreamId), 'its GET goes to the new upstream session')
  t.equal(mcp.sessionId, sessionId, 'the same client session')

  // What the new upstream session sends on its standalone stream reaches the client.
  const sent = await mcp.client.callTool({ name: 'notify_standalone', arguments: { text: 'after the takeover' } })
  t.same(sent.content, [{ type: 'text', text: 'sent' }], 'the call is answered')
  t.ok(await waitUntil(() => standaloneTexts(mcp).includes('after the takeover'), 5000), 'the notification arrives')
  t.ok(reconnect?.events.some(e => e.data.includes('after the takeover')), 'on the standalone stream the client reconnected')
  const echoed = await mcp.client.callTool({ name: 'echo', arguments: { text: 'still here' } })
  t.same(echoed.content, [{ type: 'text', text: 'still here' }], 'the session goes on')

  const failed = mcp.exchanges.filter(e => e.status === undefined ? e.error !== undefined : e.status >= 400)
  t.same(failed.map(e => `${e.method} ${e.status ?? e.error ?? ''}`), [], 'no request of the client failed')
  t.notOk(mcp.errors.some(e => /Maximum reconnection attempts|Failed to reconnect/.test(e.message)), 'the client never gave up reconnecting')
  t.equal(await b.metric('mcpgw_upstream_sessions_reestablished_total', { outcome: 'reestablished' }), 1, 'B counted the re-establishment')
})
