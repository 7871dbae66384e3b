/**
 * What an initialize result promised a client, in a form that compares
 * byte for byte: a session is established again upstream only if the new
 * result promises the same (lifecycle spec: the negotiated protocol version
 * and the capabilities are what a client relies on for the session's life).
 */

/** The result's protocolVersion and capabilities as canonical JSON (keys sorted); undefined when it is no initialize result. */
export function initializePromise (result: unknown): string | undefined {
  if (result === null || typeof result !== 'object') return undefined
  const { protocolVersion, capabilities } = result as { protocolVersion?: unknown, capabilities?: unknown }
  if (typeof protocolVersion !== 'string' || capabilities === null || typeof capabilities !== 'object') return undefined
  return canonicalJson({ protocolVersion, capabilities })
}

/** JSON with object keys in order: the same value always gives the same text. */
export function canonicalJson (value: unknown): string {
  return JSON.stringify(sorted(value))
}

function sorted (value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sorted)
  if (value === null || typeof value !== 'object') return value
  const out: Record<string, unknown> = {}
  for (const key of Object.keys(value).sort()) out[key] = sorted((value as Record<string, unknown>)[key])
  return out
}
