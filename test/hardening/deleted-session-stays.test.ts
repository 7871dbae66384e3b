// A session DELETEd while the upstream is still answering one of its requests:
// the recorder then finds the session's records gone. It must not take that
// for a store loss (src/recording/stream-appender.ts recoverSession): nothing is
// recorded again, no store error and no recovered session are counted. The
// deletion mark is written by the store's deletion itself (EventStore
// sessionDeleted), so on Redis a second replica's DELETE is seen too.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from 'undici'
import { startGateway, startGatewayOnRedis, type RunningGateway } from '../fixtures/gateway.js'
import { metricSum, metrics, rawInitialize, until } from '../fixtures/hardening.js'
import { startHostileUpstream } from '../fixtures/hostile-upstream.js'
import { useRedis } from '../fixtures/redis.js'

const TOOL_CALL = '{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"slow","arguments":{}}}'

for (const setup of ['memory', 'redis, DELETE on a second replica'] as const) {
  t.test(`${setup}: a session deleted during an answer stays deleted`, async (t) => {
    const upstream = await startHostileUpstream(t, { mode: 'hold' })
    let recording: RunningGateway
    let deleting: RunningGateway
    if (setup === 'memory') {
      recording = deleting = await startGateway(t, 'memory', upstream.url)
    } else {
      const redis = await useRedis(t, 'deleted-stays')
      recording = await startGatewayOnRedis(t, redis, upstream.url)
      deleting = await startGatewayOnRedis(t, redis, upstream.url)
    }
    const session = await rawInitialize(`${recording.url}/mcp`)
    // The client reads the start of the answer, then leaves: the answer is still recorded.
    const call = new AbortController()
    const answer = await request(`${recording.url}/mcp`, { method: 'POST', headers: session.headers(), body: TOOL_CALL, signal: call.signal })
    t.equal(answer.statusCode, 200, 'the tool call\'s answer streams')
    for await (const chunk of answer.body) if (String(chunk).includes('working')) break
    call.abort()
    const deleted = await request(`${deleting.url}/mcp`, { method: 'DELETE', headers: session.headers() })
    await deleted.body.text()
    t.equal(deleted.statusCode, 200, 'DELETE answered')
    t.equal(await deleting.store.getSession(session.sessionId), null, 'the records are gone')

    // The upstream goes on answering the deleted session's request: the recorder appends.
    upstream.finish()
    await sleep(1000)
    t.equal(await recording.store.getSession(session.sessionId), null, 'nothing was recorded again')
    t.ok(await recording.store.sessionDeleted(session.sessionId), 'the store remembers the deletion')
    const exposition = await metrics(recording.adminUrl)
    t.equal(metricSum(exposition, 'mcpgw_sessions_recovered_total'), 0, 'no session counted as recovered')
    t.equal(metricSum(exposition, 'mcpgw_store_errors_total'), 0, 'no store error counted')
    t.ok(await until(async () => metricSum(await metrics(recording.adminUrl), 'mcpgw_upstream_streams_open', { kind: 'request' }) === 0, 2000), 'the answer\'s recording is over')
    // A replica trusts a record it verified within the last 2 s (SessionCache): past that,
    // the recording replica asks the store, which no longer has the session.
    await sleep(2100)
    const seen = upstream.requests.length
    const again = await request(`${recording.url}/mcp`, { method: 'POST', headers: session.headers(), body: '{"jsonrpc":"2.0","id":10,"method":"tools/list"}' })
    await again.body.text()
    t.equal(again.statusCode, 404, 'the session id is unknown afterwards')
    // Deleted, not lost: not recorded again for its owner's next request either.
    t.equal(upstream.requests.length, seen, 'the gateway answers it: nothing goes upstream')
    t.equal(await recording.store.getSession(session.sessionId), null, 'and nothing is recorded')
  })
}
