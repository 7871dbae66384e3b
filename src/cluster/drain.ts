import type { Server } from 'node:http'
import type { FastifyBaseLogger as Logger } from 'fastify'
import type { InFlight } from '../relay/inflight.js'
import type { SessionHub } from '../relay/session-hub.js'

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
  readonly now?: () => number
}

/** Kept for closing listeners, the upstream client and the store once the drain is over. */
const EXIT_MARGIN_MS = 1500
const IDLE_SWEEP_MS = 100

/**
 * SIGTERM (DESIGN.md, "Replicas"). Readiness is already false when this runs.
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
    const [, finished] = await Promise.all([
      o.hub.closeClients(spreadMs, deadline),
      o.inflight.settle(Math.max(0, deadline - now()))
    ])
    if (!finished) o.log.warn({ recording: o.inflight.size }, 'grace period over: upstream answers still being read are cut')
    const handoverWaitMs = Math.min(o.handoverWaitMs, Math.max(0, deadline - now()))
    await Promise.race([o.hub.releaseAll(handoverWaitMs), new Promise(resolve => setTimeout(resolve, Math.max(0, deadline - now())).unref())])
    o.server.closeIdleConnections()
    const drainMs = now() - started
    o.log.info({ drainMs }, 'drained')
    return drainMs
  } finally {
    clearInterval(idleSweep)
  }
}
