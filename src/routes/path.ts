/**
 * A path reduced to what lenient servers treat as the same route: dot segments
 * resolved (also when percent-encoded), unreserved characters decoded, slashes
 * collapsed, trailing slashes dropped, case folded. A request for a path that
 * reduces to the MCP endpoint's but is not spelled exactly like it would reach
 * the upstream's MCP route around the gateway (and its principal check): it is
 * refused instead.
 */
export function canonicalPath (rawUrl: string): string {
  let path: string
  try {
    // WHATWG URL parsing resolves "." and ".." segments, "%2e" included.
    // Collapse slashes first: "//mcp" would otherwise parse as a host name.
    path = new URL(rawUrl.split('?')[0]!.replace(/\/{2,}/g, '/'), 'http://gateway.invalid').pathname
  } catch {
    return rawUrl
  }
  path = path.replace(/%([0-9a-fA-F]{2})/g, (match, hex: string) => {
    const c = String.fromCharCode(Number.parseInt(hex, 16))
    return /[A-Za-z0-9\-._~ ]/.test(c) ? c : match
  })
  // Trailing dots and spaces of a segment are dropped by Windows-style file
  // routing (and some frameworks trim them): "/mcp." and "/mcp%20" are "/mcp" there.
  path = path.replace(/[. ]+(?=\/|$)/g, '')
  // Decoding may have produced new dot segments ("%2E%2E" is decoded by URL already).
  try {
    path = new URL(path, 'http://gateway.invalid').pathname
  } catch {}
  path = path.replace(/\/{2,}/g, '/').replace(/;[^/]*/g, '')
  if (path.length > 1) path = path.replace(/\/+$/, '')
  return path.toLowerCase()
}

/** The request path is a disguised spelling of the MCP endpoint. */
export function disguisesMcpPath (rawUrl: string, mcpPath: string): boolean {
  const exact = rawUrl.split('?')[0]
  return exact !== mcpPath && canonicalPath(rawUrl) === canonicalPath(mcpPath)
}

const ABSOLUTE_FORM = /^[a-z][a-z0-9+.-]*:\/\//i

/**
 * The origin-form (path and query) of a request target. RFC 9112 section
 * 3.2.2: a server accepts the absolute-form (`GET http://host/x`), whose
 * authority overrides Host; toward the upstream only the path goes, never a
 * URL naming another host.
 */
export function originForm (target: string): string {
  if (target.startsWith('/') || !ABSOLUTE_FORM.test(target)) return target
  try {
    const url = new URL(target)
    return url.pathname + url.search
  } catch {
    return target
  }
}

/** The authority (host[:port]) named by an absolute-form target; undefined for any other form. */
export function targetAuthority (target: string): string | undefined {
  if (!ABSOLUTE_FORM.test(target)) return undefined
  try {
    return new URL(target).host
  } catch {
    return ''
  }
}
