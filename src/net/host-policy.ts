import { isIP } from 'node:net'

/**
 * DNS-rebinding protection (transports spec, "Security Warning"): a page on
 * an attacker's name whose DNS later points at the gateway can talk to it
 * same-origin, but its requests still carry the attacker's name in Host. The
 * gateway checks Host itself, because it replaces Host toward the upstream
 * and the upstream's own check never sees the client's.
 */
export type HostPolicy =
  /** No check (ALLOWED_HOSTS=*). */
  | { readonly kind: 'any' }
  /**
   * These names only (exact, or `*.suffix` for subdomains); lower case, IPv6
   * without brackets. `andNonPublic`: names no public DNS answers for too.
   */
  | { readonly kind: 'list', readonly names: readonly string[], readonly andNonPublic?: boolean }
  /** Names no public DNS answers for: IP literals, single labels, special-use suffixes. */
  | { readonly kind: 'non-public' }

/** What the MCP SDKs allow on a loopback listener. */
export const LOOPBACK_NAMES: readonly string[] = ['localhost', '127.0.0.1', '::1']

/**
 * Suffixes that public DNS never delegates: RFC 6761 (localhost), RFC 6762
 * (local, hence cluster.local), RFC 8375 (home.arpa), ICANN's private-use
 * internal, and Kubernetes' svc. An attacker cannot make a victim's browser
 * resolve such a name through a domain it controls.
 */
const NON_PUBLIC_SUFFIXES = ['.localhost', '.local', '.internal', '.home.arpa', '.svc']

const HOST_HEADER = /^(\[[0-9a-fA-F:.]+\]|[^\s[\]:/?#@\\]+)(?::\d{1,5})?$/

/** The host name of a Host header value (port dropped, lower case, no trailing dot, IPv6 unbracketed); undefined if malformed. */
export function hostName (value: string | undefined): string | undefined {
  if (value === undefined) return undefined
  const match = HOST_HEADER.exec(value)
  if (match === null) return undefined
  // RFC 3986 section 3.2.3: a port is a number, and a TCP one at most 65535.
  const port = /:(\d+)$/.exec(value)?.[1]
  if (port !== undefined && !value.endsWith(']') && Number(port) > 65535) return undefined
  const name = (match[1] as string).toLowerCase().replace(/^\[|\]$/g, '').replace(/\.$/, '')
  return name === '' ? undefined : name
}

/** An ALLOWED_HOSTS entry in the form HostPolicy keeps; undefined when it is not a host name. */
export function allowListEntry (entry: string): string | undefined {
  const wildcard = entry.startsWith('*.')
  const rest = wildcard ? entry.slice(2) : entry
  // A bare IPv6 address has colons but no port: bracket it before parsing.
  const name = hostName(isIP(rest) === 6 ? `[${rest}]` : rest)
  if (name === undefined || (wildcard && isIP(name) !== 0)) return undefined
  // Ports are not compared (as in the SDKs): an entry with one is a mistake.
  if (isIP(name) !== 6 && rest.includes(':')) return undefined
  return wildcard ? `*.${name}` : name
}

export function isLoopbackAddress (host: string): boolean {
  const name = host.replace(/^\[|\]$/g, '').toLowerCase()
  return name === 'localhost' || name === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(name)
}

function nonPublic (name: string): boolean {
  return isIP(name) !== 0 || !name.includes('.') || NON_PUBLIC_SUFFIXES.some(suffix => name.endsWith(suffix))
}

/** Whether a request for this Host header value may be served. */
export function hostAllowed (policy: HostPolicy, value: string | undefined): boolean {
  if (policy.kind === 'any') return true
  const name = hostName(value)
  if (name === undefined) return false
  if (policy.kind === 'non-public' || (policy.andNonPublic === true && nonPublic(name))) return nonPublic(name)
  return policy.names.some(allowed => allowed.startsWith('*.') ? name.endsWith(allowed.slice(1)) : allowed === name)
}

/** ALLOWED_HOSTS unset: the policy for a listener bound to `bindHost`. */
export function defaultHostPolicy (bindHost: string): HostPolicy {
  return isLoopbackAddress(bindHost) ? { kind: 'list', names: LOOPBACK_NAMES } : { kind: 'non-public' }
}

/**
 * The admin listener's policy: its own bind address's default, or, when
 * ALLOWED_HOSTS lists names, those and every non-public name (probes and
 * scrapers reach it by a pod's address or a Service name, rarely by the
 * public name clients use). A rebinding page in a local browser can then not
 * read /metrics either.
 */
export function adminHostPolicy (allowedHosts: HostPolicy, explicit: boolean, adminBindHost: string): HostPolicy {
  if (!explicit) return defaultHostPolicy(adminBindHost)
  return allowedHosts.kind === 'list' ? { ...allowedHosts, andNonPublic: true } : allowedHosts
}
