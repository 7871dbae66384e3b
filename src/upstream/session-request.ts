/**
 * The one place a request for a session is addressed to the upstream: under
 * the id the upstream knows the session by now, at the endpoint that holds it
 * (both from the session's record), never the id the client holds. Every upstream request of a session goes through
 * here: POSTs, the standalone GET and its resumes, the resumes of request
 * streams, DELETE, and requests proxied transparently that name a session.
 */
import type { UpstreamPlacement } from '../store/contract.js'
import { discardBody, type UpstreamResponse, type UpstreamRequest } from './client.js'

export function sessionRequest (placement: UpstreamPlacement, request: UpstreamRequest): UpstreamRequest {
  return {
    ...request,
    headers: { ...request.headers, 'mcp-session-id': placement.upstreamSessionId },
    // The endpoint that holds the session, for every replica (the record's).
    ...(placement.endpoint !== undefined && { endpoint: placement.endpoint })
  }
}

/** The same upstream session at the same endpoint: a record moved by a re-establishment is not. */
export function samePlacement (a: UpstreamPlacement, b: UpstreamPlacement): boolean {
  return a.upstreamSessionId === b.upstreamSessionId && a.endpoint === b.endpoint
}

/**
 * The same upstream session, whichever endpoint each names: a record that
 * only came to name the endpoint holding its session (found after the store
 * lost it) is no move, and the session's standalone stream upstream is the
 * same stream, whose event ids it can resume from.
 */
export function sameUpstreamSession (a: UpstreamPlacement, b: UpstreamPlacement): boolean {
  return a.upstreamSessionId === b.upstreamSessionId
}

/**
 * Ends an upstream session the gateway will never name (established in vain,
 * or issued past a limit): a DELETE, best effort, its answer discarded and
 * nobody waiting for it; an SDK server keeps a session until told.
 */
export function abandonUpstreamSession (send: (request: UpstreamRequest) => Promise<UpstreamResponse>, placement: UpstreamPlacement,
  path: string, headers: Record<string, string | string[]>, timeoutMs: number): void {
  send(sessionRequest(placement, { method: 'DELETE', path, headers, signal: AbortSignal.timeout(timeoutMs) }))
    .then(res => { discardBody(res.body) }, () => {})
}
