import type { Server } from 'node:http'
import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger as Logger } from 'fastify'
import type { InFlight } from '../recording/inflight.js'
import type { SessionHub } from '../sessions/session-hub.js'

export interface DrainOptions {
  readonly hub: SessionHub
  readonly inflight: InFlight
  /** The MCP listener: sockets whose response ended are closed while draining. */
  readonly server: Server
  readonly log: Logger
  /** SHUTDOWN_GRACE_SECONDS: the whole drain ends before it. */
  readonly graceMs: number
  /** DRAIN_SPREAD_SECONDS: client streams are closed spread over this window. */
  readonly spreadMs: number
  /**
   * How long a held upstream GET whose client was closed here waits for that
   * client to come back on another replica and ask for it (the retry hint,
   * plus a margin), before it is released anyway.
   */
  readonly handoverWaitMs: number
  /** SSE_RETRY_MS: the hint the streams closed at the start of the drain were given. */
  readonly retryMs: number
  /** DRAIN_RETRY_MS: the hint given, at the end, to the streams still served here. */
  readonly exitRetryMs: number
  readonly now?: () => number
}

/**
 * Kept for closing listeners, the upstream client and the store once the
 * drain is over: the settling of cut recorders (a second) and the closes fit
 * in it, so the process exits within SHUTDOWN_GRACE_SECONDS.
 */
const EXIT_MARGIN_MS = 1500
/** Idle sockets closed this often while draining: well inside the default retry hint (1 s), so a client reconnects on a new connection. */
const IDLE_SWEEP_MS = 100
/** Time a client closed with the retry hint is given, beyond the hint, to come back: a reconnect takes milliseconds; this covers a slow one. */
const RETURN_MARGIN_MS = 1000

/**
 * SIGTERM (docs/operations-restarts.md). Readiness is already false when this runs.
 * 1. Each held upstream GET goes to the first replica that asks for it (a
 *    client of the session attached there); this replica records until then.
 * 2. Client streams get a retry hint and are closed, spread over the window,
 *    so their clients resume elsewhere without all arriving at once. Their
 *    sockets are closed once idle, so the reconnect opens a new connection
 *    (which the balancer sends to a ready replica) instead of reusing this one.
 * 3. Upstream POST answers still being read are read to their end and stored.
 * 4. Whatever upstream GET is still held is released (the next replica to get
 *    a client of the session takes it over at once, with a gap marker); one
 *    whose client was closed here waits a little for that client to ask.
 *    Meanwhile the clients closed in step 2 get the time of their retry hint
 *    to come back.
 * 5. Client streams served here while draining (resumes that came back: this
 *    is a single instance, or a balancer still sends here) are closed last,
 *    with a longer retry hint: the client comes back after the restart, when
 *    there is one, instead of spending its reconnection attempts on a closed
 *    port.
 * Everything ends within the grace period, with a margin for closing.
 * Resolves with the drain's duration in milliseconds.
 */
export async function drainReplica (o: DrainOptions): Promise<number> {
  const now = o.now ?? Date.now
  const started = now()
  const deadline = started + Math.max(0, o.graceMs - EXIT_MARGIN_MS)
  const idleSweep = setInterval(() => o.server.closeIdleConnections(), IDLE_SWEEP_MS)
  idleSweep.unref()
  try {
    o.log.info({ clients: o.hub.clientCount, recording: o.inflight.size, upstreamStreams: o.hub.pumpCount }, 'draining: handing upstream streams over, closing client streams with a retry hint')
    await o.hub.beginDrain().catch((err: unknown) => o.log.warn({ err }, 'draining: could not offer the upstream streams'))
    const spreadMs = Math.min(o.spreadMs, Math.max(0, deadline - now()))
    let closedAt = now()
    const [closed, finished] = await Promise.all([
      o.hub.closeClients(spreadMs, deadline).then(n => {
        closedAt = now()
        return n
      }),
      o.inflight.settle(Math.max(0, deadline - now()))
    ])
    if (!finished) o.log.warn({ recording: o.inflight.size }, 'grace period over: upstream answers still being read are cut')
    const handoverWaitMs = Math.min(o.handoverWaitMs, Math.max(0, deadline - now()))
    const returnWaitMs = closed > 0 ? Math.min(closedAt + o.retryMs + RETURN_MARGIN_MS, deadline) - now() : 0
    await Promise.race([
      Promise.all([o.hub.releaseAll(handoverWaitMs), sleep(Math.max(0, returnWaitMs), undefined, { ref: false })]),
      sleep(Math.max(0, deadline - now()), undefined, { ref: false })
    ])
    const served = o.hub.clientCount
    if (served > 0) o.log.info({ clients: served, retryMs: o.exitRetryMs }, 'draining: closing the streams served while draining, with the retry hint for a restart')
    o.hub.closeAll(o.exitRetryMs)
    o.server.closeIdleConnections()
    const drainMs = now() - started
    o.log.info({ drainMs }, 'drained')
    return drainMs
  } finally {
    clearInterval(idleSweep)
  }
}

/**
 * What a draining process still serves: a GET of a session's stream on the
 * MCP endpoint (a resume, or the standalone stream), from the store. On a
 * single instance no other process can serve it, and an SDK client with
 * default options stops reconnecting after two refusals. Everything else is
 * refused, so that it goes to a ready replica.
 */
export function servedWhileDraining (request: { readonly method: string, readonly routeUrl: string | undefined, readonly sessionId: unknown }, mcpPath: string): boolean {
  return request.method === 'GET' && request.routeUrl === mcpPath && typeof request.sessionId === 'string'
}
