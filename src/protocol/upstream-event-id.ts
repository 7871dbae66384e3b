/**
 * An upstream's event id goes back to it as a `Last-Event-ID` header when the
 * gateway resumes the upstream's stream. SSE allows ids that no HTTP header
 * can carry (control characters, U+2028, any non-ASCII), and leading or
 * trailing blanks would be trimmed on the way: such a stream is not resumable
 * upstream. Sending the id anyway fails the request before it leaves.
 */
const HEADER_SAFE_ID = /^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/

export function isResumableUpstreamId (id: string): boolean {
  return HEADER_SAFE_ID.test(id)
}
