// An upstream that loses a session again right after every re-establishment
// (as a load-balanced Service of replicas keeping sessions in memory does,
// routed without affinity): the session is kept through a restart or two
// (503, the client retries), then ends (404) instead of being established
// again at every retry, each leaving an upstream session behind
// (src/sessions/relapses.ts). Real gateway (embedded store), an upstream
// that knows no session past its initialize, raw HTTP. What counts is upstream
// sessions lost, not requests: calls in flight together that meet one restart
// right after a re-establishment (a store-less SDK server restarted twice) are
// one relapse, and the session is kept.
import t from 'tap'
import { createServer } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from 'undici'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, postsOnly } from '../fixtures/hand-upstream.js'
import { metricSum, metrics, rawInitialize } from '../fixtures/hardening.js'
import { startRestartableUpstream } from '../fixtures/restartable-upstream.js'
import { Relapses, RELAPSES_MAX } from '../../src/sessions/relapses.js'

const VERSION = '2025-06-18'

/** A new session through the gateway at `mcpUrl`, and its tools/list calls: each answered with a status. */
async function sessionCalls (mcpUrl: string): Promise<(id: number) => Promise<number>> {
  const session = await rawInitialize(mcpUrl, { version: VERSION })
  return async id => {
    const answer = await request(mcpUrl, { method: 'POST', headers: session.headers(), body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/list' }) })
    await answer.body.text()
    return answer.statusCode
  }
}

t.test('Relapses: one upstream session too many within the window; the window starts at the first', async t => {
  const relapses = new Relapses({ maxEntries: 10, windowMs: 200 })
  for (let i = 1; i < RELAPSES_MAX; i++) {
    t.equal(relapses.note('a', `up-${i}`), false, `relapse ${i}: kept`)
    t.equal(relapses.note('a', `up-${i}`), false, `relapse ${i} met again by another request: still one`)
  }
  t.equal(relapses.note('b', 'up-1'), false, 'counted by session')
  t.equal(relapses.note('a', `up-${RELAPSES_MAX}`), true, `relapse ${RELAPSES_MAX}: the session ends`)
  t.equal(relapses.note('a', 'up-1'), false, 'and counting starts again')
  await sleep(250)
  for (let i = 1; i < RELAPSES_MAX; i++) t.equal(relapses.note('b', `up-${i + 1}`), false, `after the window, relapse ${i} of b: kept`)
})

t.test('the upstream loses the session after every re-establishment: 503 twice, then 404, and nothing more upstream', async t => {
  let initializes = 0
  let calls = 0
  const upstream = createServer(postsOnly((message, _req, res) => {
    if (message.method === 'initialize') {
      initializes++
      answerInitialize(res, message, `up-${initializes}`, VERSION)
    } else if (message.id === undefined) {
      res.writeHead(202).end()
    } else {
      // Another replica behind the same address: it never heard of the session.
      calls++
      res.writeHead(404, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null }))
    }
  }))
  const gw = await startGateway(t, 'memory', await listenUntilEnd(t, upstream))
  const mcpUrl = `${gw.url}/mcp`
  const call = await sessionCalls(mcpUrl)

  const relapsed = async (): Promise<number> => metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'relapsed' })
  for (let i = 1; i < RELAPSES_MAX; i++) t.equal(await call(i), 503, `call ${i}: 503, the session kept`)
  t.equal(initializes, RELAPSES_MAX, 'one re-establishment each')
  t.equal(await relapsed(), 0, 'no session counted as relapsed while it is kept')
  t.equal(await call(RELAPSES_MAX), 404, `call ${RELAPSES_MAX}: 404, the session ends`)
  t.equal(await relapsed(), 1, 'counted: mcpgw_upstream_sessions_reestablished_total{outcome="relapsed"}')
  t.equal(initializes, RELAPSES_MAX + 1, 'after its last re-establishment')
  const before = calls
  t.equal(await call(99), 404, 'the next call: 404')
  t.equal(calls, before, 'from the gateway: nothing went upstream')
  t.equal(initializes, RELAPSES_MAX + 1, 'no re-establishment either')
})

t.test('calls at once that meet one relapse together count it once: the session is kept', async t => {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url)
  const mcpUrl = `${gw.url}/mcp`
  const call = await sessionCalls(mcpUrl)
  // A restart, and another right after the session is established in the new life: one
  // upstream session lost again, whatever number of calls were waiting on it.
  await upstream.stop()
  await upstream.start({ forgetSessions: 1 })
  const CALLS = 2 * RELAPSES_MAX
  const statuses = await Promise.all(Array.from({ length: CALLS }, async (_, i) => await call(i + 1)))
  t.comment(`statuses: ${statuses.join(', ')}`)
  t.notOk(statuses.includes(404), 'no call is told the session is gone')
  t.ok(statuses.every(s => s === 200 || s === 503), 'each call answered, or 503 to retry')
  t.equal(await call(100), 200, 'the next call goes on with the session')
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_upstream_sessions_reestablished_total', { outcome: 'relapsed' }), 0, 'nothing counted as relapsed')
})
