// What a started gateway exposes to operators: a scrape that promtool
// accepts, with every labelled series there at 0 on a healthy system; a
// session DELETE counted as such; refusals counted; request lines with the
// session hash and the request id echoed; expected 503s below error level,
// and one line when the store fails and one when it answers again.
import t from 'tap'
import type { Test } from 'tap'
import { execFileSync } from 'node:child_process'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startGatewayWithLog, type LoggingGateway } from '../fixtures/gateway.js'
import { connectClient, waitUntil } from '../fixtures/mcp-client.js'
import { exchange, metricSum, metrics, rawInitialize } from '../fixtures/hardening.js'
import { externalTool } from '../fixtures/external-tools.js'

const promtool = await externalTool('promtool')

async function started (t: Test, env: Record<string, string> = {}): Promise<LoggingGateway> {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  return await startGatewayWithLog(t, upstream.url, env)
}

t.test('a real scrape passes promtool check metrics', { skip: promtool.skip }, async t => {
  const tool = promtool.require(t)
  if (tool === undefined) return
  const gw = await started(t)
  const text = await metrics(gw.adminUrl)
  let checked: string
  try {
    checked = execFileSync(tool.file, ['check', 'metrics'], { input: text, encoding: 'utf8', stdio: ['pipe', 'pipe', 'pipe'] })
  } catch (err) {
    const e = err as { status?: number, stdout?: string, stderr?: string }
    checked = `exit ${String(e.status)}: ${e.stdout ?? ''}${e.stderr ?? ''}`
    t.fail(`promtool check metrics: ${checked}`)
  }
  t.equal(checked, '', 'promtool has nothing to say')
})

t.test('every labelled series is at 0 from the start', async t => {
  const gw = await started(t)
  const text = await metrics(gw.adminUrl)
  const zero = (name: string, labels: Record<string, string>): void => {
    const line = text.split('\n').find(l => l.startsWith(`${name}{`) && Object.entries(labels).every(([k, v]) => l.includes(`${k}="${v}"`)))
    t.match(line, / 0$/, `${name} ${JSON.stringify(labels)} at 0`)
  }
  zero('mcpgw_gaps_total', { reason: 'trimmed' })
  zero('mcpgw_gaps_total', { reason: 'store_unavailable' })
  zero('mcpgw_store_errors_total', { op: 'append' })
  zero('mcpgw_store_errors_total', { op: 'read' })
  zero('mcpgw_upstream_errors_total', { kind: 'request' })
  zero('mcpgw_upstream_errors_total', { kind: 'stream_broken' })
  zero('mcpgw_events_unrecorded_total', { reason: 'store_error' })
  zero('mcpgw_events_unrecorded_total', { reason: 'too_large' })
  zero('mcpgw_append_resends_total', { outcome: 'unrecorded' })
  zero('mcpgw_streams_closed_total', { kind: 'standalone', outcome: 'upstream_error' })
  zero('mcpgw_resumes_total', { outcome: 'gap' })
  zero('mcpgw_requests_refused_total', { status: '503', reason: 'store_unavailable' })
  zero('mcpgw_requests_refused_total', { status: '429', reason: 'rate_limited' })
  zero('mcpgw_requests_refused_total', { status: '431', reason: 'headers_too_large' })
  zero('mcpgw_requests_refused_total', { status: '413', reason: 'body_too_large' })
  zero('mcpgw_memory_store_evictions_total', { what: 'session' })
  zero('mcpgw_store_operation_duration_seconds_count', { op: 'append' })
  t.match(text, /^mcpgw_memory_store_max_bytes \d+/m, 'the embedded store\'s cap')
  t.notMatch(text, /nodejs_active_\w+_total/, 'no gauge named like a counter')
})

t.test('a session DELETE closes its stream as session_deleted, not upstream_error', async t => {
  const gw = await started(t)
  const mcp = await connectClient(`${gw.url}/mcp`)
  t.teardown(() => mcp.close())
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'the standalone stream is open')
  await mcp.transport.terminateSession()
  const closedAs = async (outcome: string): Promise<number> => metricSum(await metrics(gw.adminUrl), 'mcpgw_streams_closed_total', { kind: 'standalone', outcome })
  let deleted = 0
  for (let i = 0; i < 50 && deleted === 0; i++) {
    deleted = await closedAs('session_deleted')
    if (deleted === 0) await new Promise(resolve => setTimeout(resolve, 100))
  }
  t.equal(deleted, 1, 'counted as session_deleted')
  t.equal(await closedAs('upstream_error'), 0, 'not as upstream_error')
})

t.test('every refusal counted under its own reason: a bad session id, a body too large on either path', async t => {
  const gw = await started(t, { MAX_BODY_BYTES: '1024' })
  const mcpUrl = `${gw.url}/mcp`
  const count = async (status: string, reason: string): Promise<number> => metricSum(await metrics(gw.adminUrl), 'mcpgw_requests_refused_total', { status, reason })
  const badId = await exchange(mcpUrl, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': 'not\u00e9ascii' }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' })
  t.equal(badId.status, 400)
  t.equal(await count('400', 'bad_session_id'), 1, 'MCPGW_BAD_SESSION_ID as bad_session_id')
  const big = 'x'.repeat(4096)
  const mcpBody = await exchange(mcpUrl, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"${big}"}}` })
  t.equal(mcpBody.status, 413)
  const proxied = await exchange(`${gw.url}/other/path`, { method: 'POST', headers: { 'content-type': 'application/octet-stream' }, body: big })
  t.equal(proxied.status, 413)
  t.equal(await count('413', 'body_too_large'), 2, 'MCPGW_BODY_TOO_LARGE as body_too_large, on the MCP endpoint and on the proxy path')
  t.equal(await count('400', 'other') + await count('413', 'other'), 0, 'none as other')
})

t.test('requests: the id echoed, the session hash on the request line, refusals counted and logged below error', async t => {
  const gw = await started(t, { ALLOWED_ORIGINS: 'https://app.example.com' })
  const mcpUrl = `${gw.url}/mcp`
  const session = await rawInitialize(mcpUrl)
  const given = await exchange(mcpUrl, { method: 'POST', headers: session.headers({ 'x-request-id': 'trace-me-1' }), body: '{"jsonrpc":"2.0","id":7,"method":"ping"}' })
  t.equal(given.status, 200)
  t.equal(given.headers['x-request-id'], 'trace-me-1', 'a given request id comes back')
  const made = await exchange(mcpUrl, { method: 'POST', headers: session.headers(), body: '{"jsonrpc":"2.0","id":8,"method":"ping"}' })
  t.match(made.headers['x-request-id'], /^[\w-]{12}$/, 'the gateway\'s own id otherwise')
  const line = gw.lines.find(l => l.msg === 'request completed' && l.reqId === 'trace-me-1')
  t.match(line, { level: 'info', sessionHash: /^[0-9a-f]{12}$/, res: { statusCode: 200 } }, 'the request line names the session by its hash')
  t.match(String(line?.time), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/, 'ISO time')

  const refused = await exchange(mcpUrl, { method: 'POST', headers: session.headers({ origin: 'https://evil.example' }), body: '{"jsonrpc":"2.0","id":9,"method":"ping"}' })
  t.equal(refused.status, 403)
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_requests_refused_total', { status: '403', reason: 'origin_forbidden' }), 1, 'the 403 counted by status and reason')

  // The store fails: 503, one warning without a stack, then one line when it answers again.
  const initialize = async (): Promise<number | undefined> => (await exchange(mcpUrl, {
    method: 'POST',
    headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-protocol-version': '2025-06-18' },
    body: JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'observability', version: '0' } } })
  })).status
  const createSession = gw.store.createSession.bind(gw.store)
  gw.store.createSession = async () => { throw new Error('store down for the test') }
  for (let i = 0; i < 3; i++) t.equal(await initialize(), 503, 'the store is down: 503')
  gw.store.createSession = createSession
  t.equal(await initialize(), 200, 'the store is back')
  const refusals = gw.lines.filter(l => l.code === 'MCPGW_STORE_UNAVAILABLE')
  t.equal(refusals.length, 1, 'the three 503s: one line, the repeats counted')
  t.match(refusals[0], { level: 'warn', statusCode: 503, cause: 'store down for the test' })
  t.notOk(JSON.stringify(refusals[0]).includes('stack'), 'no stack')
  t.notOk(gw.lines.some(l => l.level === 'error'), 'nothing at error level')
  t.match(gw.lines.filter(l => String(l.msg).startsWith('event store:')), [
    { level: 'warn', op: 'create_session', err: { message: 'store down for the test' }, msg: /operations failing/ },
    { level: 'info', failedOperations: 3, msg: 'event store: answering again' }
  ], 'one line when it fails, one when it recovers')
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_requests_refused_total', { status: '503', reason: 'store_unavailable' }), 3)

  // Draining: the refusal is expected, logged at info.
  const draining = gw.close()
  const late = await exchange(mcpUrl, { method: 'POST', headers: session.headers(), body: '{"jsonrpc":"2.0","id":12,"method":"ping"}' }).catch(() => undefined)
  await draining
  if (late?.status === 503) t.match(gw.lines.find(l => l.code === 'MCPGW_DRAINING'), { level: 'info' }, 'a draining refusal is info')
})
