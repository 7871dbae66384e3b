// Apart from tracing.ts: main.ts loads the OpenTelemetry SDK only when this says so.

/**
 * Whether the standard OpenTelemetry variables ask for traces: an OTLP
 * endpoint, or OTEL_TRACES_EXPORTER=otlp; OTEL_SDK_DISABLED=true or
 * OTEL_TRACES_EXPORTER=none switch them off. Nothing set: no tracing, and
 * nothing of it on the request path.
 */
export function tracingWanted (env: NodeJS.ProcessEnv): boolean {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === 'true') return false
  const exporters = (env.OTEL_TRACES_EXPORTER ?? '').split(',').map(e => e.trim().toLowerCase()).filter(Boolean)
  if (exporters.includes('none')) return false
  return exporters.includes('otlp') || Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT) || Boolean(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)
}
