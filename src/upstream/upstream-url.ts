import { isIP } from 'node:net'

/**
 * Pure: UPSTREAM_URL read as the endpoints of one MCP server. One URL, or
 * several of the same scheme and path separated by commas; a host name that
 * is not loopback is resolved later, each of its addresses an endpoint.
 */

/** One entry of UPSTREAM_URL: where to connect, as written. */
export interface UpstreamTarget {
  /** scheme://host:port as written (WHATWG-normalised, default port omitted). */
  readonly origin: string
  readonly protocol: 'http:' | 'https:'
  /** Without brackets for IPv6. */
  readonly hostname: string
  readonly port: number
  /** A DNS name to resolve into addresses (not an IP literal, not localhost). */
  readonly resolvable: boolean
}

export interface UpstreamUrls {
  /** The first entry, whole. */
  readonly first: URL
  /** The MCP endpoint's path, the same on every entry. */
  readonly path: string
  readonly targets: readonly UpstreamTarget[]
}

const FORM = 'write one URL such as http://mcp:3000/mcp, or the URLs of one server\'s replicas with the same scheme and path, ' +
  'separated by commas: http://mcp-0:3000/mcp,http://mcp-1:3000/mcp'

/** Names that never need DNS: IP literals and localhost (RFC 6761). */
export function isLiteralHost (hostname: string): boolean {
  const bare = hostname.replace(/^\[|\]$/g, '')
  return isIP(bare) !== 0 || bare === 'localhost' || bare.endsWith('.localhost')
}

function parseEntry (entry: string, n: number, label: string, problems: string[]): URL | undefined {
  let url: URL
  try {
    url = new URL(entry)
  } catch {
    problems.push(n === 0
      ? 'UPSTREAM_URL: must be an absolute URL such as http://mcp:3000/mcp'
      : `UPSTREAM_URL: ${label} "${entry.slice(0, 80)}" is not an absolute URL (a path cannot hold a comma); ${FORM}`)
    return undefined
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    problems.push(`UPSTREAM_URL: must be an http:// or https:// URL, got ${url.protocol}`)
    return undefined
  }
  if (url.search !== '' || url.hash !== '') problems.push('UPSTREAM_URL: must not carry a query or fragment')
  // "http://a:3000/mcp http://b:3000/mcp" parses, its path holding the second URL.
  if (/:\/\/|%20|\s/.test(url.pathname)) {
    problems.push(`UPSTREAM_URL: ${label} has a path holding a second URL or a space ("${url.pathname.slice(0, 80)}"); ${FORM}`)
    return undefined
  }
  // WHATWG URLs give "http://mcp:3000" the path "/": the MCP endpoint would be
  // "/" and clients of "/mcp" would be proxied unrecorded. Only an explicit "/" means "/".
  if (url.pathname === '/' && !/^[a-z][a-z0-9+.-]*:\/\/[^/]*\/$/i.test(entry)) {
    problems.push(`UPSTREAM_URL: has no path; write the MCP endpoint's full URL, such as ${url.origin}/mcp ` +
      `(or ${url.origin}/ if the server's MCP endpoint really is /)`)
  }
  return url
}

/** One URL's target. */
export function targetOfUrl (url: URL): UpstreamTarget {
  const protocol = url.protocol as 'http:' | 'https:'
  const hostname = url.hostname.replace(/^\[|\]$/g, '')
  return {
    origin: url.origin,
    protocol,
    hostname,
    port: url.port === '' ? (protocol === 'https:' ? 443 : 80) : Number(url.port),
    resolvable: !isLiteralHost(hostname)
  }
}

/** Problems are pushed (every one at once, with the form to write), not thrown. */
export function parseUpstreamUrls (value: string, problems: string[]): UpstreamUrls | undefined {
  const entries = value.split(',').map(e => e.trim())
  const several = entries.length > 1
  const before = problems.length
  const urls: URL[] = []
  entries.forEach((entry, n) => {
    const label = several ? `entry ${n + 1}` : 'the URL'
    if (entry === '') {
      problems.push(`UPSTREAM_URL: ${label} is empty; ${FORM}`)
      return
    }
    const url = parseEntry(entry, several ? n + 1 : 0, label, problems)
    if (url !== undefined) urls.push(url)
  })
  const first = urls[0]
  if (first === undefined || problems.length > before) return undefined
  const paths = new Set(urls.map(u => u.pathname))
  if (paths.size > 1) problems.push(`UPSTREAM_URL: the entries have different paths (${[...paths].join(', ')}); they must be replicas of one server, ${FORM}`)
  const schemes = new Set(urls.map(u => u.protocol))
  if (schemes.size > 1) problems.push(`UPSTREAM_URL: the entries mix ${[...schemes].join(' and ')}; ${FORM}`)
  const origins = urls.map(u => u.origin)
  const repeated = [...new Set(origins.filter((o, i) => origins.indexOf(o) !== i))]
  if (repeated.length > 0) problems.push(`UPSTREAM_URL: ${repeated.join(', ')} is listed more than once; list each endpoint once`)
  if (problems.length > before) return undefined
  return { first, path: first.pathname, targets: urls.map(targetOfUrl) }
}
