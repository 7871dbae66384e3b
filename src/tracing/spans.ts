import { context, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Span, type Tracer } from '@opentelemetry/api'
import type { FastifyInstance, FastifyRequest } from 'fastify'

/**
 * A server span for each request on the MCP listener; the route runs inside
 * it, so the upstream request and the store operations it makes are its
 * children. A stream's span ends when the stream does.
 *
 * An incoming traceparent is the parent only from a trusted proxy
 * (TRUSTED_PROXIES): its sampled flag decides with a parent-based sampler, and
 * a client that set it could force exports the sampler's ratio refuses. From
 * anyone else the span starts a trace of its own, linked to the client's.
 * Span names carry the route, never the raw path (one name per route).
 */
export function traceRequests (app: FastifyInstance, tracer: Tracer, trustedPeer: (address: string | undefined) => boolean): void {
  const spans = new WeakMap<FastifyRequest, Span>()
  app.addHook('onRequest', (request, _reply, done) => {
    const given = propagation.extract(ROOT_CONTEXT, request.headers)
    // The upstream request carries the gateway's span as parent (the undici
    // instrumentation adds it): the client's header passed on too would make two.
    delete request.headers.traceparent
    delete request.headers.tracestate
    const trusted = trustedPeer(request.socket.remoteAddress)
    const parent = trusted ? given : ROOT_CONTEXT
    const link = trusted ? undefined : trace.getSpanContext(given)
    const route = request.routeOptions.url ?? 'unmatched'
    const path = request.url.split('?', 1)[0] as string
    const span = tracer.startSpan(`${request.method} ${route}`, {
      kind: SpanKind.SERVER,
      attributes: { 'http.request.method': request.method, 'http.route': route, 'url.path': path, 'mcpgw.request_id': request.id },
      ...(link !== undefined && { links: [{ context: link }] })
    }, parent)
    spans.set(request, span)
    context.with(trace.setSpan(parent, span), done)
  })
  app.addHook('onResponse', (request, reply, done) => {
    const span = spans.get(request)
    if (span !== undefined) {
      span.setAttribute('http.response.status_code', reply.statusCode)
      if (reply.statusCode >= 500) span.setStatus({ code: SpanStatusCode.ERROR })
      span.end()
    }
    done()
  })
}

/**
 * Run a store operation in a span of its own, when a recording span (a
 * request's) is active: a standalone stream's appends, made long after the
 * request that opened it ended, are not traced.
 */
export async function traceStoreOperation<T> (tracer: Tracer, op: string, fn: () => Promise<T>): Promise<T> {
  if (trace.getActiveSpan()?.isRecording() !== true) return await fn()
  return await tracer.startActiveSpan(`store ${op}`, { kind: SpanKind.CLIENT, attributes: { 'mcpgw.store.operation': op } }, async span => {
    try {
      return await fn()
    } catch (err) {
      span.recordException(err as Error)
      span.setStatus({ code: SpanStatusCode.ERROR })
      throw err
    } finally {
      span.end()
    }
  })
}
