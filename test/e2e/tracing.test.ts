// OpenTelemetry tracing (src/tracing/): off unless the OTEL_* variables ask
// for it; on, the incoming traceparent is continued, the upstream request
// carries it on, and store appends and replays have spans, all exported over
// OTLP/HTTP to a receiver this test runs on loopback.
import t, { type Test } from 'tap'
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { createServer, type IncomingMessage, type Server } from 'node:http'
import { fileURLToPath } from 'node:url'
import type { AddressInfo } from 'node:net'
import { buildGateway } from '../../src/server.js'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import { startTracing, tracingWanted } from '../../src/tracing/tracing.js'
import { testConfig } from '../fixtures/gateway.js'
import { exchange, sseEvents } from '../fixtures/hardening.js'

interface ExportedSpan { traceId: string, spanId: string, parentSpanId?: string, name: string, kind: number }

async function listen (server: Server): Promise<string> {
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

/** An OTLP/HTTP receiver (JSON encoding, as @opentelemetry/exporter-trace-otlp-http sends) on loopback. */
async function otlpReceiver (t: Test): Promise<{ url: string, spans: ExportedSpan[], contentTypes: string[] }> {
  const spans: ExportedSpan[] = []
  const contentTypes: string[] = []
  const receiver = createServer((req, res) => {
    body(req).then(text => {
      contentTypes.push(String(req.headers['content-type']))
      if (req.url === '/v1/traces') {
        const data = JSON.parse(text) as { resourceSpans: Array<{ scopeSpans: Array<{ spans: ExportedSpan[] }> }> }
        for (const rs of data.resourceSpans) for (const ss of rs.scopeSpans) spans.push(...ss.spans)
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}')
    }).catch(() => res.destroy())
  })
  const url = await listen(receiver)
  t.teardown(() => { receiver.closeAllConnections(); receiver.close() })
  return { url, spans, contentTypes }
}

async function body (req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of req) chunks.push(chunk as Buffer)
  return Buffer.concat(chunks).toString('utf8')
}

t.test('off unless the standard variables ask for it', async t => {
  t.equal(tracingWanted({}), false, 'nothing set')
  t.equal(tracingWanted({ OTEL_SERVICE_NAME: 'gw' }), false, 'a service name alone')
  t.equal(tracingWanted({ OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel:4318' }), true, 'an endpoint')
  t.equal(tracingWanted({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: 'http://otel:4318/v1/traces' }), true, 'a traces endpoint')
  t.equal(tracingWanted({ OTEL_TRACES_EXPORTER: 'otlp' }), true, 'the exporter named')
  t.equal(tracingWanted({ OTEL_TRACES_EXPORTER: 'none', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel:4318' }), false, 'exporter none')
  t.equal(tracingWanted({ OTEL_SDK_DISABLED: 'true', OTEL_EXPORTER_OTLP_ENDPOINT: 'http://otel:4318' }), false, 'the SDK disabled')
  t.equal(startTracing({}, 'test'), undefined, 'nothing started')
})

t.test('traceparent continued to the upstream; spans for the request, the upstream call, appends and replays, exported over OTLP/HTTP', async t => {
  const { url: receiverUrl, spans, contentTypes } = await otlpReceiver(t)

  // An upstream that records the traceparent it gets and answers over SSE.
  const seen: Array<{ method: string, traceparent: string | undefined }> = []
  const upstream = createServer((req, res) => {
    body(req).then(text => {
      seen.push({ method: req.method ?? '', traceparent: req.headers.traceparent as string | undefined })
      if (req.method !== 'POST') { res.writeHead(405).end(); return }
      const message = JSON.parse(text) as { id?: number, method: string }
      if (message.id === undefined) { res.writeHead(202).end(); return }
      const result = message.method === 'initialize' ? { protocolVersion: '2025-11-25', capabilities: {}, serverInfo: { name: 'fake', version: '0' } } : {}
      res.writeHead(200, { 'content-type': 'text/event-stream', 'mcp-session-id': 'traced-session' })
      res.end(`event: message\ndata: ${JSON.stringify({ jsonrpc: '2.0', id: message.id, result })}\n\n`)
    }).catch(() => res.destroy())
  })
  const upstreamUrl = await listen(upstream)
  t.teardown(() => { upstream.closeAllConnections(); upstream.close() })

  process.env.OTEL_EXPORTER_OTLP_ENDPOINT = receiverUrl
  process.env.OTEL_BSP_SCHEDULE_DELAY = '50'
  const tracing = startTracing(process.env, 'test')
  if (tracing === undefined) throw new Error('tracing did not start')
  // The test stands for a trusted outer proxy: only its traceparent is continued (a client's is linked).
  const config = testConfig(`${upstreamUrl}/mcp`, { TRUSTED_PROXIES: 'loopback' })
  const store = new MemoryEventStore({ retention: config.retention, maxBytes: config.memoryStoreMaxBytes })
  const gateway = await buildGateway(config, { store, tracer: tracing.tracer })
  const { url } = await gateway.listen()

  const clientTrace = '4bf92f3577b34da6a3ce929d0e0e4736'
  const clientSpan = '00f067aa0ba902b7'
  const headers = {
    accept: 'application/json, text/event-stream',
    'content-type': 'application/json',
    'mcp-protocol-version': '2025-11-25',
    traceparent: `00-${clientTrace}-${clientSpan}-01`
  }
  const init = await exchange(`${url}/mcp`, { method: 'POST', headers, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '0' } } }) })
  t.equal(init.status, 200)
  // The gateway's own session id, which the client gets at initialize.
  const sessionHeaders = { ...headers, 'mcp-session-id': init.headers['mcp-session-id'] ?? 'none issued' }
  const listed = await exchange(`${url}/mcp`, { method: 'POST', headers: sessionHeaders, body: '{"jsonrpc":"2.0","id":2,"method":"tools/list"}' })
  t.equal(listed.status, 200)
  const priming = sseEvents(listed.text).find(e => e.id !== undefined)?.id
  t.ok(priming, 'the answer\'s stream starts with an id')

  // A resume in a trace of its own: the replay reads the store.
  const resumeTrace = '0af7651916cd43dd8448eb211c80319c'
  const resume = await exchange(`${url}/mcp`, {
    headers: { accept: 'text/event-stream', 'mcp-protocol-version': '2025-11-25', 'mcp-session-id': sessionHeaders['mcp-session-id'], 'last-event-id': priming as string, traceparent: `00-${resumeTrace}-b7ad6b7169203331-01` }
  })
  t.equal(resume.status, 200)
  t.match(resume.text, /"id":2/, 'the answer replayed')

  await gateway.close()
  await tracing.shutdown()
  t.ok(spans.length > 0, `spans exported (${spans.length})`)
  t.ok(contentTypes.every(c => c.startsWith('application/json')), 'OTLP/HTTP JSON')

  t.ok(seen.every(s => s.traceparent?.includes(',') !== true), 'one traceparent upstream, not the client\'s and the gateway\'s')
  const upstreamPost = seen.find(s => s.method === 'POST' && s.traceparent !== undefined)
  const [, upstreamTrace, upstreamParent] = (upstreamPost?.traceparent ?? '').split('-')
  t.equal(upstreamTrace, clientTrace, 'the upstream request carries the client\'s trace')
  t.not(upstreamParent, clientSpan, 'with the gateway\'s span as parent')

  const inTrace = spans.filter(s => s.traceId === clientTrace)
  const server = inTrace.filter(s => s.name === 'POST /mcp')
  t.equal(server.length, 2, 'a server span per POST')
  t.ok(server.every(s => s.parentSpanId === clientSpan && s.kind === 2), 'children of the client\'s span, kind SERVER')
  const upstreamSpan = inTrace.find(s => s.spanId === upstreamParent)
  t.ok(upstreamSpan !== undefined && upstreamSpan.kind === 3, 'the upstream call: a CLIENT span, exported')
  t.ok(server.some(s => s.spanId === upstreamSpan?.parentSpanId), 'under the request\'s span')
  t.ok(inTrace.some(s => s.name === 'store append' && server.some(p => p.spanId === s.parentSpanId)), 'a store append in the request\'s trace')
  const resumed = spans.filter(s => s.traceId === resumeTrace)
  t.ok(resumed.some(s => s.name === 'GET /mcp'), 'the resume\'s server span')
  t.ok(resumed.some(s => s.name === 'store read'), 'the replay read from the store')
})

t.test('the built gateway: OTEL_EXPORTER_OTLP_ENDPOINT turns tracing on; spans are flushed on shutdown', async t => {
  const main = fileURLToPath(new URL('../../dist/src/main.js', import.meta.url))
  if (!existsSync(main)) throw new Error('dist/ is missing: run npm run build first')
  const { url: receiverUrl, spans } = await otlpReceiver(t)
  const seen: Array<string | undefined> = []
  const upstream = createServer((req, res) => {
    seen.push(req.headers.traceparent as string | undefined)
    res.writeHead(200, { 'content-type': 'application/json' }).end('{"issuer":"x"}')
  })
  const upstreamUrl = await listen(upstream)
  t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
  const env = {
    PATH: process.env.PATH,
    UPSTREAM_URL: `${upstreamUrl}/mcp`,
    HOST: '127.0.0.1',
    ADMIN_HOST: '127.0.0.1',
    PORT: '0',
    ADMIN_PORT: '0',
    SHUTDOWN_GRACE_SECONDS: '1',
    DRAIN_SPREAD_SECONDS: '0',
    OTEL_EXPORTER_OTLP_ENDPOINT: receiverUrl,
    OTEL_SERVICE_NAME: 'gw-under-test',
    TRUSTED_PROXIES: 'loopback'
  }
  const child = spawn(process.execPath, [main], { env, stdio: ['ignore', 'pipe', 'inherit'] })
  t.teardown(() => { if (child.exitCode === null) child.kill('SIGKILL') })
  let stdout = ''
  child.stdout.setEncoding('utf8').on('data', (s: string) => { stdout += s })
  const exited = new Promise<void>(resolve => child.on('close', () => resolve()))
  for (let i = 0; i < 600 && !stdout.includes('gateway listening') && child.exitCode === null; i++) await new Promise(resolve => setTimeout(resolve, 100))
  const listening = /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(stdout)
  if (listening === null) throw new Error(`the gateway did not start: ${stdout}`)
  const traceId = '5bf92f3577b34da6a3ce929d0e0e4737'
  const answer = await exchange(`${listening[1] as string}/.well-known/oauth-authorization-server`, { headers: { traceparent: `00-${traceId}-10f067aa0ba902b8-01` } })
  t.equal(answer.status, 200, 'proxied')
  child.kill('SIGTERM')
  await exited
  t.match(stdout, /tracing: spans exported over OTLP/, 'says tracing is on')
  t.equal(seen[0]?.split('-')[1], traceId, 'the upstream got the trace')
  t.ok(spans.some(s => s.traceId === traceId && s.kind === 2), 'the server span was exported before the process exited')
})
