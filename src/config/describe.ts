import type { GatewayConfig } from './load.js'

const SECRET_NAME = /password|secret|token|key$/i

/**
 * The effective configuration as a plain object for the start-up log line:
 * URLs without their password, fields named like secrets replaced, sets as
 * lists. Generic over the fields, so a new setting shows without a change here.
 */
export function describeConfig (config: GatewayConfig): Record<string, unknown> {
  const out: Record<string, unknown> = {}
  for (const [name, value] of Object.entries(config)) {
    if (name === 'warnings') continue
    out[name] = SECRET_NAME.test(name) && value !== undefined ? '[redacted]' : plain(value)
  }
  return out
}

function plain (value: unknown): unknown {
  if (value instanceof URL) return withoutPassword(value.href)
  if (typeof value === 'string' && /^[a-z][\w+.-]*:\/\/[^/]*@/i.test(value)) return withoutPassword(value)
  if (value instanceof Set) return [...value as Set<unknown>].map(plain)
  if (Array.isArray(value)) return value.map(plain)
  if (typeof value === 'object' && value !== null) return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, SECRET_NAME.test(k) ? '[redacted]' : plain(v)]))
  return value
}

function withoutPassword (href: string): string {
  try {
    const url = new URL(href)
    if (url.password !== '') url.password = '***'
    return url.href
  } catch {
    return '[unparseable]'
  }
}
