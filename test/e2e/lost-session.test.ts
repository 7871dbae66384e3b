// A session the event store lost (src/routes/mcp/session-guard.ts, recoverLostSession): the
// gateway on its embedded store restarts while the official SDK client holds a
// session on the upstream. The restarted gateway knows nothing of it; the
// session goes on under a new epoch (resuming clients are told of the gap),
// the upstream still decides which sessions exist, and the recovery can be
// switched off.
import t from 'tap'
import { startExampleServer } from '../../examples/mcp-server.js'
import { deleteKeys, useRedis } from '../fixtures/redis.js'
import { setTimeout as sleep } from 'node:timers/promises'
import { createServer } from 'node:http'
import { listenUntilEnd, postsOnly } from '../fixtures/hand-upstream.js'
import { startGateway, startGatewayOnRedis, TEST_SESSION_BINDING_KEY } from '../fixtures/gateway.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { HeaderPrincipal } from '../../src/auth/principal.js'
import { SessionIdIssuer } from '../../src/protocol/session-id.js'
import { ACCEPT_BOTH, exchange, jsonRpcError, metricSum, metrics, rawInitialize, sseEvents } from '../fixtures/hardening.js'

const RECONNECT = { initialReconnectionDelay: 200, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5, maxRetries: 20 }
const VERSION = '2025-11-25'

function callTool (id: number, name: string, args: Record<string, unknown>): string {
  return JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } })
}

async function post (url: string, sessionId: string, body: string): Promise<Awaited<ReturnType<typeof exchange>>> {
  return await exchange(`${url}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'mcp-session-id': sessionId, 'mcp-protocol-version': VERSION },
    body
  })
}

t.test('a restarted gateway picks up the sessions its store lost; the upstream decides', async (t) => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  // The restart is immediate here: the draining process's last retry hint need not
  // cover a slow one (DRAIN_RETRY_MS), or the broadcast would end in the wait.
  const first = await startGateway(t, 'memory', upstream.url, { SSE_RETRY_MS: '100', DRAIN_RETRY_MS: '100' })
  const port = new URL(first.url).port

  const mcp = await connectClient(`${first.url}/mcp`, { reconnectionOptions: RECONNECT })
  t.teardown(() => mcp.close())
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'the standalone stream is open')
  const sessionId = mcp.sessionId as string
  const COUNT = 400
  await mcp.client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: 10 } })
  const received = (): number[] => sequencesOf(mcp.notifications, 'broadcast')
  t.ok(await waitUntil(() => received().length >= 50, 10_000), 'the broadcast is flowing')

  // The process restarts: same address, an empty embedded store.
  await first.close()
  const second = await startGateway(t, 'memory', upstream.url, { PORT: port, SSE_RETRY_MS: '100' })
  t.equal(new URL(second.url).port, port, 'the new gateway listens where the old one did')

  t.ok(await waitUntil(() => received().includes(COUNT - 1), 20_000), 'the live client\'s session goes on, to the end of the broadcast')
  const live = checkDelivery(received(), COUNT)
  t.comment(`restart: sent ${COUNT}, received ${live.received}, lost ${live.lost.length} [${formatRanges(live.lost)}], duplicated ${live.duplicated.length}`)
  t.same(live.duplicated, [], 'nothing twice')
  t.equal(live.outOfOrder, 0, 'in order')
  // The draining process serves resumes from its store until it exits; the one that
  // reaches the new process is the resume across the loss.
  const resumes = mcp.exchanges.filter(e => e.method === 'GET' && e.lastEventId !== undefined && e.status === 200)
  t.ok(resumes.length > 0, 'the client resumed with the id it had from the old gateway, and was served')
  t.ok(resumes.some(r => r.events.some(e => e.event === 'gateway-gap' && e.data.includes('"epoch"'))), 'and was told of the gap: the store lost the history (a new epoch)')

  const echo = await mcp.client.callTool({ name: 'echo', arguments: { text: 'same session' } })
  t.same(echo.content, [{ type: 'text', text: 'same session' }], 'a tool call on the same session works')
  t.equal(mcp.sessionId, sessionId, 'no new initialize')

  // A session id the gateway issued (bound to this principal, under the tests' key) for an
  // upstream session that never existed: recorded for a moment, dropped on the upstream's 404.
  const anonymous = new HeaderPrincipal('authorization').identify({}).principal as string
  const ids = new SessionIdIssuer(TEST_SESSION_BINDING_KEY)
  const bogus = ids.issue(anonymous, 'not-a-session-0123456789abcdef')
  const refused = await post(second.url, bogus, callTool(7, 'echo', { text: 'x' }))
  t.equal(refused.status, 404, 'a session the upstream does not know: 404, as the upstream answered')
  t.equal(await second.store.getSession(bogus), null, 'and nothing of it is left in the store')
  // Any answer but a 2xx leaves nothing either (here a 400: the upstream cannot parse the body).
  const garbledId = ids.issue(anonymous, 'another-unknown-session-42')
  const garbled = await post(second.url, garbledId, '{"jsonrpc":')
  t.equal(garbled.status, 400, 'a garbled request for an unknown session: the upstream\'s 400')
  t.equal(await second.store.getSession(garbledId), null, 'not confirmed, not kept')
  // An id the gateway did not issue (no binding): nothing tells who created it, never recorded again.
  const unbound = await post(second.url, 'not-a-gateway-id-0123456789', callTool(10, 'echo', { text: 'x' }))
  t.equal(unbound.status, 404, 'an id without a binding is never recovered')
  t.match(jsonRpcError(unbound.text), { code: -32001 }, 'the gateway\'s own 404: it did not reach the upstream')
  t.equal(metricSum(await metrics(second.adminUrl), 'mcpgw_sessions_recovered_total'), 1, 'only the confirmed session is counted (mcpgw_sessions_recovered_total)')

  // A session recovered by one principal is not another's.
  const other = await exchange(`${second.url}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'mcp-session-id': sessionId, 'mcp-protocol-version': VERSION, authorization: 'Bearer someone-else' },
    body: callTool(8, 'echo', { text: 'x' })
  })
  t.equal(other.status, 404, 'another principal gets 404 for the recovered session')
})

t.test('a recovery the upstream answers without a word on the session (405 to a GET, 503 while it restarts) leaves it lost, not deleted: its next request recovers it', async (t) => {
  const UPSTREAM_SESSION = 'restarting-upstream-session-0123'
  const FORGOTTEN = 'forgotten-upstream-session-0123'
  let restarting = false
  const seen: string[] = []
  // An upstream without a standalone stream (405 to every GET), restarting for a moment (503),
  // and which answers a session it does not know as the SDK's example servers do (400).
  const upstreamUrl = await listenUntilEnd(t, createServer(postsOnly((message, req, res) => {
    seen.push(`${message.method ?? 'answer'} ${String(req.headers['mcp-session-id'])}`)
    if (req.headers['mcp-session-id'] === FORGOTTEN) {
      res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'Bad Request: No valid session ID provided' }, id: null }))
      return
    }
    if (restarting) {
      res.writeHead(503, { 'retry-after': '1' }).end('restarting')
      return
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: message.id, result: { content: [{ type: 'text', text: 'served' }] } }))
  })))
  const gw = await startGateway(t, 'memory', upstreamUrl)
  const anonymous = new HeaderPrincipal('authorization').identify({}).principal as string
  // The gateway's id for the upstream session, bound to this principal: what the client holds from before the loss.
  const sessionId = new SessionIdIssuer(TEST_SESSION_BINDING_KEY).issue(anonymous, UPSTREAM_SESSION)

  const get = await exchange(`${gw.url}/mcp`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sessionId, 'mcp-protocol-version': VERSION } })
  t.equal(get.status, 405, 'the client\'s GET: the upstream\'s 405, passed on')
  t.equal(await gw.store.getSession(sessionId), null, 'not confirmed, not kept')
  t.equal(await gw.store.sessionDeleted(sessionId), false, 'nor marked deleted: a 405 says nothing of the session')

  restarting = true
  const during = await post(gw.url, sessionId, callTool(11, 'echo', { text: 'x' }))
  t.equal(during.status, 503, 'a call while the upstream restarts: its 503, passed on')
  t.equal(await gw.store.getSession(sessionId), null, 'not kept')
  t.equal(await gw.store.sessionDeleted(sessionId), false, 'nor marked deleted')

  restarting = false
  const after = await post(gw.url, sessionId, callTool(12, 'echo', { text: 'x' }))
  t.equal(after.status, 200, 'the call once the upstream is back: served')
  t.match(JSON.parse(after.text), { id: 12, result: { content: [{ text: 'served' }] } }, 'by the upstream')
  t.ok(seen.includes(`tools/call ${UPSTREAM_SESSION}`), 'on the session the id names')
  t.not(await gw.store.getSession(sessionId), null, 'the session is recorded again')
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_sessions_recovered_total'), 1, 'and counted as recovered once')

  // An upstream that says it does not know the session, in its example servers' words: that is its word.
  const forgottenId = new SessionIdIssuer(TEST_SESSION_BINDING_KEY).issue(anonymous, FORGOTTEN)
  const forgotten = await post(gw.url, forgottenId, callTool(13, 'echo', { text: 'x' }))
  t.equal(forgotten.status, 400, 'a session the upstream does not know: its 400, passed on')
  t.equal(await gw.store.sessionDeleted(forgottenId), true, 'marked deleted, as for a 404')
  const after400 = await post(gw.url, forgottenId, callTool(14, 'echo', { text: 'x' }))
  t.equal(after400.status, 404, 'its next request: 404, which tells the client to start a new session')
  t.match(jsonRpcError(after400.text), { code: -32001 }, 'the gateway\'s own: nothing reached the upstream')
})

t.test('RECOVER_LOST_SESSIONS=false: a session the store lost gets 404', async (t) => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const first = await startGateway(t, 'memory', upstream.url)
  const mcp = await connectClient(`${first.url}/mcp`)
  t.teardown(() => mcp.close())
  const sessionId = mcp.sessionId as string
  await first.close()

  const strict = await startGateway(t, 'memory', upstream.url, { RECOVER_LOST_SESSIONS: 'false' })
  const answer = await post(strict.url, sessionId, callTool(3, 'echo', { text: 'x' }))
  t.equal(answer.status, 404, '404')
  t.match(jsonRpcError(answer.text), { code: -32001 }, 'the gateway\'s own JSON-RPC error: the request did not reach the upstream')
  t.equal(await strict.store.getSession(sessionId), null, 'nothing recorded')

  const lenient = await startGateway(t, 'memory', upstream.url)
  const served = await post(lenient.url, sessionId, callTool(4, 'echo', { text: 'back' }))
  t.equal(served.status, 200, 'with recovery on, the same request is served')
  t.ok(sseEvents(served.text).some(e => e.data.includes('"back"')), 'by the upstream, on the same session')

  // A DELETE is how a client ends a session it lost with the store: it reaches the upstream.
  await lenient.close()
  const last = await startGateway(t, 'memory', upstream.url)
  const deleted = await exchange(`${last.url}/mcp`, { method: 'DELETE', headers: { 'mcp-session-id': sessionId, 'mcp-protocol-version': VERSION } })
  t.equal(deleted.status, 200, 'the DELETE of a lost session reaches the upstream')
  t.equal(await last.store.getSession(sessionId), null, 'nothing is left recorded')
  t.equal(metricSum(await metrics(last.adminUrl), 'mcpgw_sessions_recovered_total'), 0, 'and it is not counted as recovered')
  t.equal((await post(last.url, sessionId, callTool(9, 'echo', { text: 'x' }))).status, 404, 'the upstream ended the session: 404 after')
})

t.test('on Redis the intact mark decides; a mark that is not a time reads as intact', async (t) => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const testRedis = await useRedis(t, 'lost')
  const { prefix, redis } = testRedis
  const { url, config, store } = await startGatewayOnRedis(t, testRedis, upstream.url)

  const session = await rawInitialize(`${url}/mcp`)
  // What a Redis restarted empty does to the session, with a mark nobody can read as a time.
  t.ok(await deleteKeys(redis, `${prefix}{${session.sessionId}}`) > 0, 'the session\'s keys are gone')
  await redis.set(`${prefix}intact`, 'not-a-time')
  await sleep(2100) // past the gateway's 2 s cache of verified sessions
  const refused = await post(url, session.sessionId, callTool(5, 'echo', { text: 'x' }))
  t.equal(refused.status, 404, 'an unreadable mark: no recovery, 404')
  t.match(jsonRpcError(refused.text), { code: -32001 }, 'the gateway\'s own answer')

  await redis.set(`${prefix}intact`, String(Date.now() - config.retention.ttlMs - 1000))
  t.equal((await post(url, session.sessionId, callTool(6, 'echo', { text: 'x' }))).status, 404, 'a loss longer ago than a session lives: 404')

  await redis.set(`${prefix}intact`, String(Date.now()))
  const served = await post(url, session.sessionId, callTool(7, 'echo', { text: 'back' }))
  t.equal(served.status, 200, 'a fresh loss: the session is recovered')
  t.ok(sseEvents(served.text).some(e => e.data.includes('"back"')), 'and served by the upstream')
  t.not(await store.getSession(session.sessionId), null, 'recorded again in Redis')
})

/** A session through the gateway at `url` with one call answered, and the last event id of that call's stream. */
async function sessionWithCall (url: string): Promise<{ session: Awaited<ReturnType<typeof rawInitialize>>, lastId: string | undefined }> {
  const session = await rawInitialize(`${url}/mcp`, { version: VERSION })
  const call = await post(url, session.sessionId, callTool(3, 'echo', { text: 'x' }))
  return { session, lastId: sseEvents(call.text).map(e => e.id).filter(id => id !== undefined).at(-1) }
}

t.test('the resume of a request stream of a session the store lost: its response is reported lost, not the session; the session\'s next request records it again', async (t) => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const first = await startGateway(t, 'memory', upstream.url)
  const { session, lastId } = await sessionWithCall(first.url)
  t.ok(lastId !== undefined, 'the call\'s answer carried gateway event ids')
  // The process restarts with an empty embedded store.
  await first.close()
  const second = await startGateway(t, 'memory', upstream.url)

  const resumed = await exchange(`${second.url}/mcp`, { headers: session.getHeaders(lastId) })
  t.equal(resumed.status, 200, 'the resume is answered, not refused')
  t.equal(resumed.headers['x-mcp-gateway-gap'], 'epoch', 'with the gap the store\'s loss made')
  const answer = sseEvents(resumed.text).map(e => e.data === '' ? undefined : JSON.parse(e.data) as { id?: unknown, error?: { message?: string } }).find(m => m?.id === 3)
  t.match(answer?.error, { code: -32000, message: /lost/ }, 'its request answered with the error for a lost response: the client retries it')
  t.equal(await second.store.getSession(session.sessionId), null, 'nothing recorded by the resume (it never reaches the upstream)')

  // The SDK client resumes a stream that ended without a result: past the error, the
  // resume is held open (an ended one would be resumed once a second until the next POST).
  const repairId = sseEvents(resumed.text).find(e => e.data.includes('"id":3'))?.id
  t.ok(repairId !== undefined, 'the error carries an event id')
  const startedAgain = Date.now()
  const again = await exchange(`${second.url}/mcp`, { headers: session.getHeaders(repairId) }, 1500)
  t.equal(again.status, 200, 'the resume past the error is answered')
  t.ok(sseEvents(again.text).some(e => e.data.includes('"id":3') && e.data.includes('lost')), 'with the error once more')
  t.ok(Date.now() - startedAgain >= 1400, `and held open (read for ${Date.now() - startedAgain} ms)`)
  t.equal(await second.store.getSession(session.sessionId), null, 'still nothing recorded')

  const stranger = await exchange(`${second.url}/mcp`, { headers: session.getHeaders(lastId, { authorization: 'Bearer someone-else' }) })
  t.equal(stranger.status, 404, 'another principal with the same id and Last-Event-ID: 404, as before')

  const next = await post(second.url, session.sessionId, callTool(4, 'echo', { text: 'again' }))
  t.equal(next.status, 200, 'the session\'s next request is served')
  t.ok(sseEvents(next.text).some(e => e.data.includes('"again"')), 'by the upstream, on the same session')
  t.not(await second.store.getSession(session.sessionId), null, 'and records the session again')
})

t.test('the resume of a request stream of a deleted session: 404, as before', async (t) => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url)
  const { session, lastId } = await sessionWithCall(gw.url)
  t.equal((await exchange(`${gw.url}/mcp`, { method: 'DELETE', headers: session.headers() })).status, 200, 'deleted')
  await sleep(2100) // past the gateway's 2 s cache of verified sessions
  t.equal((await exchange(`${gw.url}/mcp`, { headers: session.getHeaders(lastId) })).status, 404, 'the resume gets 404')
})

t.test('a recovery the upstream refuses (the SDK example servers\' 400) ends at once what this replica held of the session: its client streams close', async (t) => {
  const FORGOTTEN = 'forgotten-upstream-session-4567'
  let forgotten = false
  // An upstream whose standalone stream stays open, until it forgets the session: then a POST gets its 400.
  const upstreamUrl = await listenUntilEnd(t, createServer((req, res) => {
    if (req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write(': open\n\n')
      return
    }
    if (req.method !== 'POST') {
      res.writeHead(405).end()
      return
    }
    if (forgotten) res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'Bad Request: No valid session ID provided' }, id: null }))
    else res.writeHead(202).end()
    req.resume()
  }))
  const testRedis = await useRedis(t, 'refused-recovery')
  const { prefix, redis } = testRedis
  // Lease renewals far apart: the holder of the upstream GET does not find the loss by itself meanwhile.
  const { url, adminUrl } = await startGatewayOnRedis(t, testRedis, upstreamUrl, { LEASE_TTL_MS: '60000' })
  const anonymous = new HeaderPrincipal('authorization').identify({}).principal as string
  const sessionId = new SessionIdIssuer(TEST_SESSION_BINDING_KEY).issue(anonymous, FORGOTTEN)
  await redis.set(`${prefix}intact`, String(Date.now()))

  // The client's GET recovers the session (the upstream's GET answers), and stays open.
  const abort = new AbortController()
  t.teardown(() => abort.abort())
  const res = await fetch(`${url}/mcp`, { headers: { accept: 'text/event-stream', 'mcp-session-id': sessionId, 'mcp-protocol-version': VERSION }, signal: abort.signal })
  t.equal(res.status, 200, 'the client\'s GET: recovered, open')
  let closedAt: number | undefined
  // Read to its end (the chunks themselves do not matter here).
  const reading = res.text().catch(() => '').finally(() => { closedAt = Date.now() })

  // The store loses the session again, and the upstream forgets it.
  t.ok(await deleteKeys(redis, `${prefix}{${sessionId}}`) > 0, 'the session\'s keys are gone')
  await redis.set(`${prefix}intact`, String(Date.now()))
  forgotten = true
  await sleep(2100) // past the gateway's 2 s cache of verified sessions
  const refusedAt = Date.now()
  const refused = await post(url, sessionId, callTool(21, 'echo', { text: 'x' }))
  t.equal(refused.status, 400, 'the recovering call: the upstream\'s 400, passed on')
  t.ok(await waitUntil(() => closedAt !== undefined, 12_000), 'the client\'s GET stream is closed')
  // Lease renewals come every 20 s: one cannot have closed it instead.
  t.ok(closedAt !== undefined && closedAt - refusedAt < 10_000, `at once (${closedAt === undefined ? 'open' : `${closedAt - refusedAt} ms`})`)
  abort.abort()
  await reading
  t.equal(metricSum(await metrics(adminUrl), 'mcpgw_streams_closed_total', { kind: 'standalone', outcome: 'session_deleted' }), 1, 'closed as a deleted session, not as an upstream error')
})
