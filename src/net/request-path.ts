/**
 * Why a request target's path must not reach the upstream at all, or
 * undefined when it may. Encoded `/`, `.`, `\` and control bytes, raw `\`
 * and dot segments are spelled differently by every server that decodes them
 * (Go's mux, frameworks that decode %2F before routing, Windows paths): a
 * path the gateway checked as one route would be served as another. No MCP
 * client or OAuth metadata URL needs them. Only the path is looked at, not
 * the query.
 */
export function pathTrick (rawUrl: string): string | undefined {
  const path = rawUrl.split('?', 1)[0] as string
  if (!path.startsWith('/')) return 'the target is not a path'
  if (/%(2f|2e|5c|[01][0-9a-f]|7f)/i.test(path)) return 'an encoded /, ., \\ or control character'
  // Some stacks decode once more before routing: "%252F" is "/" there.
  if (/%25[0-9a-f]{2}/i.test(path)) return 'a percent-encoding encoded twice'
  // eslint-disable-next-line no-control-regex -- control bytes are what is looked for
  if (/[\\\x00-\x1f\x7f]/.test(path)) return 'a \\ or control character'
  if (/(^|\/)\.{1,2}(\/|;|$)/.test(path)) return 'a . or .. segment'
  return undefined
}

/**
 * Paths proxied without a principal (PUBLIC_PATHS): the exact path, or
 * everything under a prefix ending in "/". Matched on the raw path, which
 * pathTrick has already cleared of any other spelling.
 */
export function isPublicPath (rawUrl: string, publicPaths: readonly string[]): boolean {
  const path = rawUrl.split('?', 1)[0] as string
  return publicPaths.some(p => p.endsWith('/') ? path.startsWith(p) : path === p)
}
