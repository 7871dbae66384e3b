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

/**
 * The wait before resuming an upstream stream that sent no `retry` hint (the
 * SSE default is the client's choice): short, since an upstream without an
 * event store drops what it sends while no stream is open.
 */
export const DEFAULT_UPSTREAM_RETRY_MS = 100
/** Never sooner than this: an upstream that ends every stream at once is not asked in a tight loop. */
export const MIN_UPSTREAM_RETRY_MS = 50
/** An upstream's `retry` above this is capped: a recording waits no longer between upstream resumes. */
export const MAX_UPSTREAM_RETRY_MS = 5000
/** Resumes in a row that bring no new event id before the gateway stops asking. */
export const UPSTREAM_RESUMES_WITHOUT_PROGRESS = 5

/** How long to wait before resuming an upstream stream, given its `retry` hint. */
export function upstreamRetryDelay (hintMs: number | undefined): number {
  return Math.max(MIN_UPSTREAM_RETRY_MS, Math.min(hintMs ?? DEFAULT_UPSTREAM_RETRY_MS, MAX_UPSTREAM_RETRY_MS))
}
