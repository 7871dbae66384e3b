import type { FastifyReply, FastifyRequest } from 'fastify'
import { Transform, type Readable } from 'node:stream'
import { errors } from '../errors.js'
import { clientKey } from '../net/client-address.js'
import type { Authority } from '../net/request-authority.js'
import type { UpstreamPlacement } from '../store/contract.js'
import { discardBody, type UpstreamClient, type UpstreamRequest, type UpstreamResponse } from '../upstream/client.js'
import { sessionRequest } from '../upstream/session-request.js'
import { clientResponseHeaders, upstreamRequestHeaders } from '../upstream/headers.js'
import { relayedBody, type RelayDeps } from '../sse/relayed-answer.js'

/** The methods the gateway routes, on the MCP path and on every other path of the upstream origin. */
export const ROUTED_METHODS = ['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'HEAD'] as const

/** `buffers`: the client buffers its answers are relayed under, the MCP endpoint's streams' too. */
export interface ForwardDeps extends RelayDeps {
  readonly upstream: UpstreamClient
  /** Bound on streamed request bodies (MAX_BODY_BYTES). */
  readonly maxBodyBytes: number
}

/** A streamed body, cut off with an error once it passes `limit` bytes. */
function bounded (body: Readable, limit: number): Readable {
  let seen = 0
  const counter = new Transform({
    transform (chunk: Buffer, _encoding, done) {
      seen += chunk.length
      if (seen > limit) done(errors.bodyTooLarge(limit))
      else done(null, chunk)
    }
  })
  body.on('error', err => counter.destroy(err))
  return body.pipe(counter)
}

declare module 'fastify' {
  interface FastifyRequest {
    /** The connection's peer is in TRUSTED_PROXIES: its forwarding headers are believed. */
    fromTrustedProxy: boolean
    /** The name and scheme the request was checked for (the Host hook), passed on as X-Forwarded-Host/-Proto. */
    authority: Extract<Authority, { kind: 'served' }> | null
    /** PRINCIPAL_HEADER: the gateway reads it, so it reaches the upstream whatever Connection says. */
    principalHeader: string
  }
}

/** The upstream request for a client request, headers cleaned for a proxy hop. */
export function upstreamHeadersFor (request: FastifyRequest, keepContentLength: boolean): Record<string, string | string[]> {
  return upstreamRequestHeaders(request.headers, {
    remoteAddress: request.socket.remoteAddress,
    trustedPeer: request.fromTrustedProxy,
    // Both from the peer, or from a trusted proxy's X-Forwarded-Proto/-Host, checked.
    protocol: request.authority?.protocol ?? 'http',
    host: request.authority?.host,
    principalHeader: request.principalHeader
  }, keepContentLength)
}

/**
 * Send an upstream answer to the client unchanged (status, end-to-end headers,
 * streamed body), under the client buffers' budget and write timeout
 * (sse/relayed-answer.ts).
 */
export function sendUpstreamResponse (deps: RelayDeps, reply: FastifyReply, res: UpstreamResponse): FastifyReply {
  reply.code(res.statusCode)
  reply.headers(clientResponseHeaders(res.headers))
  return reply.send(relayedBody(deps, reply.raw, clientKey(reply.request.ip), reply.log, res.body))
}

/**
 * Transparent streaming proxy: for paths other than the MCP endpoint and for
 * modern-era MCP requests. Closing the client connection aborts the upstream
 * request (there, disconnect means cancellation). `session`: the request named
 * a session the gateway holds, addressed upstream where it lives. `admit`:
 * may refuse the upstream's answer by throwing (its body is then discarded).
 */
export async function forwardTransparently (deps: ForwardDeps, request: FastifyRequest, reply: FastifyReply, body: Buffer | Readable | undefined, session?: UpstreamPlacement, admit?: (res: UpstreamResponse) => void): Promise<FastifyReply> {
  const abort = new AbortController()
  const onClose = (): void => { if (!reply.raw.writableFinished) abort.abort() }
  reply.raw.once('close', onClose)
  const method = request.method
  if (body !== undefined && !Buffer.isBuffer(body)) {
    const declared = Number(request.headers['content-length'] ?? 0)
    if (declared > deps.maxBodyBytes) throw errors.bodyTooLarge(deps.maxBodyBytes)
    body = bounded(body, deps.maxBodyBytes)
  }
  const upstreamRequest: UpstreamRequest = {
    method,
    path: request.url,
    headers: upstreamHeadersFor(request, !Buffer.isBuffer(body)),
    body: method === 'GET' || method === 'HEAD' ? undefined : body,
    signal: abort.signal
  }
  const res = await deps.metrics.timeUpstream(method, () => deps.upstream.request(session === undefined ? upstreamRequest : sessionRequest(session, upstreamRequest)), abort.signal)
  try {
    admit?.(res)
  } catch (err) {
    discardBody(res.body)
    throw err
  }
  return sendUpstreamResponse(deps, reply, res)
}
