import type { FastifyBaseLogger as Logger } from 'fastify'
import { errors } from '../errors.js'
import type { EventStore } from '../store/contract.js'
import type { GatewayMetrics, CloseOutcome } from '../metrics/metrics.js'
import type { ClientStream } from '../sse/client-stream.js'
import type { UpstreamClient, UpstreamResponse } from '../upstream/client.js'
import { StandalonePump } from './standalone-pump.js'

export interface SessionHubOptions {
  readonly upstream: UpstreamClient
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly mcpPath: string
  readonly holdMs: number
  readonly maxEventBytes: number
  readonly maxSessions: number
}

interface LocalSession {
  pump: StandalonePump | undefined
  opening: Promise<UpstreamResponse | null> | undefined
  /** Client streams by stream id: one connection per stream, the newest wins. */
  readonly clients: Map<string, ClientStream>
}

/**
 * What this process holds for each session: its upstream GET pump and the
 * client connections attached to its streams.
 */
export class SessionHub {
  readonly #o: SessionHubOptions
  readonly #sessions = new Map<string, LocalSession>()
  #pumps = 0

  constructor (options: SessionHubOptions) {
    this.#o = options
  }

  get pumpCount (): number { return this.#pumps }

  #local (sessionId: string): LocalSession {
    let s = this.#sessions.get(sessionId)
    if (s === undefined) {
      s = { pump: undefined, opening: undefined, clients: new Map() }
      this.#sessions.set(sessionId, s)
    }
    return s
  }

  #forget (sessionId: string): void {
    const s = this.#sessions.get(sessionId)
    if (s !== undefined && s.pump === undefined && s.opening === undefined && s.clients.size === 0) this.#sessions.delete(sessionId)
  }

  /**
   * Make sure the session's upstream GET is held. Resolves null when it is
   * (already or now); otherwise with the upstream's refusal to pass through.
   */
  async ensurePump (sessionId: string, headers: Record<string, string | string[]>, log: Logger): Promise<UpstreamResponse | null> {
    const s = this.#local(sessionId)
    if (s.pump !== undefined && !s.pump.stopped) return null
    if (s.opening !== undefined) return await s.opening
    if (this.#pumps >= this.#o.maxSessions) throw errors.tooManySessions()
    const pump = new StandalonePump({
      upstream: this.#o.upstream,
      store: this.#o.store,
      metrics: this.#o.metrics,
      log,
      sessionId,
      path: this.#o.mcpPath,
      holdMs: this.#o.holdMs,
      maxEventBytes: this.#o.maxEventBytes,
      onStop: outcome => {
        this.#pumps--
        if (s.pump === pump) s.pump = undefined
        // Clients on the standalone stream reconnect and reopen it (with a retry hint).
        if (outcome !== 'hold_expired') s.clients.get('s')?.close('upstream_error', true)
        this.#forget(sessionId)
      }
    })
    this.#pumps++
    s.pump = pump
    s.opening = pump.open(headers)
    try {
      return await s.opening
    } finally {
      s.opening = undefined
      this.#forget(sessionId)
    }
  }

  /** Attach a client to a stream; an older connection to the same stream is closed (superseded). */
  attach (sessionId: string, client: ClientStream): void {
    const s = this.#local(sessionId)
    const previous = s.clients.get(client.streamId)
    if (previous !== undefined && previous !== client) previous.close('superseded', false)
    s.clients.set(client.streamId, client)
    const pump = client.streamId === 's' ? s.pump : undefined
    pump?.attach()
    client.onClose(() => {
      if (s.clients.get(client.streamId) === client) s.clients.delete(client.streamId)
      pump?.detach()
      this.#forget(sessionId)
    })
  }

  /** The session is gone (DELETE, upstream 404): release its upstream GET and close its clients. */
  dropSession (sessionId: string, outcome: CloseOutcome = 'session_deleted'): void {
    const s = this.#sessions.get(sessionId)
    if (s === undefined) return
    s.pump?.stop()
    for (const client of [...s.clients.values()]) client.close(outcome, false)
    this.#sessions.delete(sessionId)
  }

  /** Close every client stream with a retry hint and release every upstream GET. */
  closeAll (outcome: CloseOutcome): void {
    for (const s of this.#sessions.values()) {
      for (const client of [...s.clients.values()]) client.close(outcome, true)
      s.pump?.stop()
    }
  }

  /** Client streams open, for drain progress. */
  get clientCount (): number {
    let n = 0
    for (const s of this.#sessions.values()) n += s.clients.size
    return n
  }
}
