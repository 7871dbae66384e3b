// Request spans (src/tracing/spans.ts): who may choose the parent (and so,
// with a parent-based sampler, whether a trace is exported), and span names.
import t from 'tap'
import Fastify from 'fastify'
import { propagation } from '@opentelemetry/api'
import { W3CTraceContextPropagator } from '@opentelemetry/core'
import { BasicTracerProvider, InMemorySpanExporter, ParentBasedSampler, SimpleSpanProcessor, TraceIdRatioBasedSampler } from '@opentelemetry/sdk-trace-node'
import { traceRequests } from '../../src/tracing/spans.js'

// What provider.register() sets up in production (tracing.ts).
propagation.setGlobalPropagator(new W3CTraceContextPropagator())

const TRACE_ID = '4bf92f3577b34da6a3ce929d0e0e4736'
const SAMPLED = `00-${TRACE_ID}-00f067aa0ba902b7-01`

async function traced (trusted: boolean): Promise<{ exporter: InMemorySpanExporter, inject: (url: string, headers?: Record<string, string>) => Promise<void> }> {
  const exporter = new InMemorySpanExporter()
  // The OTEL_TRACES_SAMPLER=parentbased_traceidratio, OTEL_TRACES_SAMPLER_ARG=0 of a deployment that exports nothing of its own.
  const provider = new BasicTracerProvider({ sampler: new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(0) }), spanProcessors: [new SimpleSpanProcessor(exporter)] })
  const app = Fastify()
  traceRequests(app, provider.getTracer('test'), () => trusted)
  app.all('/mcp', async () => 'ok')
  app.all('/*', async () => 'ok')
  t.teardown(() => app.close())
  return { exporter, inject: async (url, headers = {}) => { await app.inject({ method: 'GET', url, headers }) } }
}

t.test('a client\'s sampled traceparent does not force an export at ratio 0', async t => {
  const { exporter, inject } = await traced(false)
  for (let i = 0; i < 20; i++) await inject('/mcp', { traceparent: SAMPLED })
  t.equal(exporter.getFinishedSpans().length, 0, 'nothing exported')
})

t.test('a trusted proxy\'s traceparent is the parent: its sampled flag decides', async t => {
  const { exporter, inject } = await traced(true)
  await inject('/mcp', { traceparent: SAMPLED })
  const spans = exporter.getFinishedSpans()
  t.equal(spans.length, 1)
  t.equal(spans[0]?.spanContext().traceId, TRACE_ID, 'the proxy\'s trace continued')
})

t.test('span names carry the route, not the path', async t => {
  const { exporter, inject } = await traced(true)
  for (const path of ['/a/1', '/b/2?x=y', '/mcp']) await inject(path, { traceparent: SAMPLED })
  t.same(exporter.getFinishedSpans().map(s => s.name), ['GET /*', 'GET /*', 'GET /mcp'])
  t.equal(exporter.getFinishedSpans()[0]?.attributes['url.path'], '/a/1', 'the path stays an attribute')
})
