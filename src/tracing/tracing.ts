import { trace, type Tracer } from '@opentelemetry/api'
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http'
import { registerInstrumentations } from '@opentelemetry/instrumentation'
import { UndiciInstrumentation } from '@opentelemetry/instrumentation-undici'
import { defaultResource, detectResources, envDetector, resourceFromAttributes } from '@opentelemetry/resources'
import { BatchSpanProcessor, NodeTracerProvider } from '@opentelemetry/sdk-trace-node'
import { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION } from '@opentelemetry/semantic-conventions'
import { tracingWanted } from './wanted.js'

export { tracingWanted }

export interface Tracing {
  readonly tracer: Tracer
  /** Export what is pending and stop. */
  shutdown: () => Promise<void>
}

/**
 * Start the OpenTelemetry SDK as the OTEL_* variables configure it (endpoint,
 * headers, sampler, batch timings, resource attributes: the SDK reads them)
 * and export spans over OTLP/HTTP. W3C trace context is the propagator: an
 * incoming traceparent is continued, and the upstream requests (undici) carry
 * it on. Returns undefined when tracing is not wanted.
 */
export function startTracing (env: NodeJS.ProcessEnv, version: string): Tracing | undefined {
  if (!tracingWanted(env)) return undefined
  const resource = defaultResource()
    .merge(resourceFromAttributes({ [ATTR_SERVICE_NAME]: 'mcp-resumable-gateway', [ATTR_SERVICE_VERSION]: version }))
    // OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win over the defaults above.
    .merge(detectResources({ detectors: [envDetector] }))
  const provider = new NodeTracerProvider({ resource, spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())] })
  // Global context manager (AsyncLocalStorage) and W3C propagators.
  provider.register()
  const unregister = registerInstrumentations({
    tracerProvider: provider,
    // Upstream requests only inside a gateway request's trace (not the standalone pump's long reads).
    instrumentations: [new UndiciInstrumentation({ requireParentforSpans: true })]
  })
  return {
    tracer: trace.getTracer('mcp-resumable-gateway', version),
    async shutdown () {
      unregister()
      await provider.shutdown()
    }
  }
}
