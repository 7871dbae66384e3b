import parseForwarded from 'forwarded-parse'
import { hostAllowed, hostName, type HostPolicy } from './host-policy.js'

/** What a request says about the name and scheme it was made for. */
export interface AuthorityInput {
  /** Every Host header line the request carried (RFC 9112 section 3.2: exactly one). */
  readonly hosts: readonly string[]
  /** The authority of an absolute-form target, if the target was one. */
  readonly targetAuthority?: string
  /** The connection's peer is in TRUSTED_PROXIES: its X-Forwarded-Host/-Proto are believed. */
  readonly trustedPeer: boolean
  readonly forwardedHost?: string | undefined
  readonly forwardedProto?: string | undefined
  /** The RFC 7239 Forwarded header (its lines joined), passed on as it is from a trusted peer: its host and proto are checked. */
  readonly forwarded?: string | undefined
  /** The connection's own scheme. */
  readonly protocol: 'http' | 'https'
}

export type Authority =
  /** Served: the one name and scheme the upstream is told of (X-Forwarded-Host/-Proto). */
  | { readonly kind: 'served', readonly host: string | undefined, readonly protocol: 'http' | 'https' }
  /** RFC 9112: no answer but 400 for several Host lines, a malformed one, or a forwarded value that is not one. */
  | { readonly kind: 'malformed', readonly reason: string }
  /** A name the policy does not serve (DNS-rebinding protection): 403. */
  | { readonly kind: 'forbidden' }

function list (value: string | undefined): string[] | undefined {
  return value === undefined ? undefined : value.split(',').map(s => s.trim())
}

/**
 * Whether a request may be served, for which name and scheme: what nginx and
 * Envoy do. Host is always checked, proxies or not; from a trusted proxy
 * every X-Forwarded-Host entry is checked too (a client may have put its own
 * before the proxy's), the first (the name the client used, as Express reads
 * it) is the one passed on, alone, and X-Forwarded-Proto must say http or https.
 */
export function requestAuthority (policy: HostPolicy, input: AuthorityInput): Authority {
  if (input.hosts.length > 1) return { kind: 'malformed', reason: 'more than one Host header' }
  const host = input.hosts[0]
  if (host !== undefined && hostName(host) === undefined) return { kind: 'malformed', reason: 'a Host header that is not a host[:port]' }
  const names = [host]
  if (input.targetAuthority !== undefined) names.push(input.targetAuthority)
  let served = host?.toLowerCase()
  let protocol = input.protocol
  if (input.trustedPeer) {
    const forwarded = list(input.forwardedHost)
    if (forwarded !== undefined) {
      if (forwarded.some(entry => hostName(entry) === undefined)) return { kind: 'malformed', reason: 'an X-Forwarded-Host entry that is not a host[:port]' }
      names.push(...forwarded)
      served = (forwarded[0] as string).toLowerCase()
    }
    const protos = list(input.forwardedProto)?.map(p => p.toLowerCase())
    if (protos !== undefined) {
      if (protos.some(p => !isHttp(p))) return { kind: 'malformed', reason: 'an X-Forwarded-Proto other than http or https' }
      protocol = protos[0] as 'http' | 'https'
    }
    const refused = checkForwarded(input.forwarded, names)
    if (refused !== undefined) return { kind: 'malformed', reason: refused }
  }
  if (!names.every(name => hostAllowed(policy, name))) return { kind: 'forbidden' }
  return { kind: 'served', host: served === '' ? undefined : served, protocol }
}

function isHttp (proto: string): boolean {
  return proto === 'http' || proto === 'https'
}

/**
 * The Forwarded header of a trusted proxy goes to the upstream as it is, and
 * a framework may build URLs from it rather than from X-Forwarded-Host: each
 * element's host joins `names` (checked like Host), and its proto must say
 * http or https. Returns why it is malformed, if it is.
 */
function checkForwarded (forwarded: string | undefined, names: Array<string | undefined>): string | undefined {
  if (forwarded === undefined) return undefined
  let elements: Array<Record<string, string>>
  try {
    elements = parseForwarded(forwarded)
  } catch {
    return 'a Forwarded header that is not a list of name=value pairs (RFC 7239)'
  }
  for (const element of elements) {
    const { host, proto } = element
    if (host !== undefined) {
      if (hostName(host) === undefined) return 'a Forwarded host that is not a host[:port]'
      names.push(host)
    }
    if (proto !== undefined && !isHttp(proto.toLowerCase())) return 'a Forwarded proto other than http or https'
  }
  return undefined
}

/** The values of every line of header `name` (lower case) in Node's rawHeaders. */
export function headerLines (rawHeaders: readonly string[], name: string): string[] {
  const values: string[] = []
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    if ((rawHeaders[i] as string).toLowerCase() === name) values.push(rawHeaders[i + 1] as string)
  }
  return values
}
