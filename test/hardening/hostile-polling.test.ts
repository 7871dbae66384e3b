// A hostile upstream that cuts every SSE answer and answers each resume with a
// new id on an empty priming event (`retry: 0`): the gateway's upstream
// resumption (src/recording/upstream-resume.ts) must back off, stop after a few
// resumes that bring nothing (the client then gets an error response, never
// silence), and stop at once when the session is deleted. Both stores.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from 'undici'
import { startGateway, type StoreKind } from '../fixtures/gateway.js'
import { jsonRpcError, metricSum, metrics, rawInitialize, sseEvents } from '../fixtures/hardening.js'
import { startHostileUpstream } from '../fixtures/hostile-upstream.js'

const TOOL_CALL = '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"slow","arguments":{}}}'

for (const kind of ['memory', 'redis'] as StoreKind[]) {
  t.test(`${kind} store: resumes that bring nothing back off and stop; the client gets an error response`, async (t) => {
    const upstream = await startHostileUpstream(t, { mode: 'cut' })
    const gw = await startGateway(t, kind, upstream.url, { UPSTREAM_RESUMES_WITHOUT_PROGRESS: '4' })
    const session = await rawInitialize(`${gw.url}/mcp`)
    const started = performance.now()
    const answer = await request(`${gw.url}/mcp`, { method: 'POST', headers: session.headers(), body: TOOL_CALL, bodyTimeout: 15_000 })
    const text = await answer.body.text()
    const answeredMs = performance.now() - started
    const firstSeconds = upstream.gets('request', started, started + 5000).length
    const standalone = upstream.gets('standalone', started, started + 5000).length
    t.comment(`${kind}: answered after ${Math.round(answeredMs)} ms; upstream GETs in the first 5 s: ${firstSeconds} resuming the request stream, ${standalone} reopening the standalone stream`)
    const error = sseEvents(text).map(ev => jsonRpcError(ev.data)).find(e => e !== undefined)
    t.equal(error?.id, 7, 'the request got the gateway\'s error response, not silence')
    t.ok(firstSeconds <= 6, `a handful of resumes, backing off (not about 20 a second): ${firstSeconds}`)
    t.ok(standalone <= 8, `the standalone stream's reopens back off too: ${standalone}`)
    const exposition = await metrics(gw.adminUrl)
    t.ok(metricSum(exposition, 'mcpgw_upstream_errors_total', { kind: 'resume_stalled' }) >= 1, 'counted (mcpgw_upstream_errors_total{kind="resume_stalled"})')
  })

  t.test(`${kind} store: after DELETE, no upstream GET for the session's streams`, async (t) => {
    const upstream = await startHostileUpstream(t, { mode: 'cut' })
    const gw = await startGateway(t, kind, upstream.url)
    const session = await rawInitialize(`${gw.url}/mcp`)
    // The client leaves at once: the request stream is recorded (and resumed) all the same.
    const call = new AbortController()
    const answer = request(`${gw.url}/mcp`, { method: 'POST', headers: session.headers(), body: TOOL_CALL, signal: call.signal })
      .then(async res => await res.body.text()).catch(() => '')
    await sleep(300)
    call.abort()
    await answer
    await sleep(1500)
    const polling = upstream.gets('request').length
    t.ok(polling >= 2, `the upstream was being polled: ${polling} GETs`)
    const deleted = await request(`${gw.url}/mcp`, { method: 'DELETE', headers: session.headers() })
    await deleted.body.text()
    t.equal(deleted.statusCode, 200, 'DELETE answered')
    const after = performance.now()
    await sleep(3000)
    const late = [...upstream.gets('request', after + 100), ...upstream.gets('standalone', after + 100)]
    t.comment(`${kind}: ${polling} request-stream GETs before the DELETE, ${late.length} after it`)
    t.same(late, [], 'no upstream GET once the session is deleted')
  })
}
