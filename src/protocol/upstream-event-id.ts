/**
 * An upstream's event id goes back to it as a `Last-Event-ID` header when the
 * gateway resumes the upstream's stream. SSE allows ids that no HTTP header
 * can carry (control characters, U+2028, any non-ASCII), and leading or
 * trailing blanks would be trimmed on the way: such a stream is not resumable
 * upstream. Sending the id anyway fails the request before it leaves.
 */
const HEADER_SAFE_ID = /^[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?$/

/**
 * The longest upstream event id the gateway keeps to resume from. The last
 * id of each stream is kept beside the session (in the lease's entry, or the
 * session's hash in Redis) outside the retention's byte count: an upstream
 * sending megabyte-long ids would otherwise have that kept per session.
 */
export const MAX_UPSTREAM_ID_LENGTH = 1024

/** What is kept in place of a longer id: no header can carry it, so the stream reads as not resumable upstream. */
export const TOO_LONG_UPSTREAM_ID = '\n'

export function isResumableUpstreamId (id: string): boolean {
  return id.length <= MAX_UPSTREAM_ID_LENGTH && HEADER_SAFE_ID.test(id)
}

/** The id as kept to resume from: itself, or TOO_LONG_UPSTREAM_ID past MAX_UPSTREAM_ID_LENGTH. */
export function keptUpstreamId (id: string): string {
  return id.length > MAX_UPSTREAM_ID_LENGTH ? TOO_LONG_UPSTREAM_ID : id
}
