import type { FastifyBaseLogger as Logger } from 'fastify'
import type { EventInput } from '../store/contract.js'
import { STANDALONE_STREAM } from '../store/contract.js'
import type { ClientStream } from '../sse/client-stream.js'
import type { UpstreamResponse } from '../upstream/client.js'
import type { PumpClients, StandalonePump } from './standalone-pump.js'

/** What this process holds for one session. */
export class LocalSession implements PumpClients {
  pump: StandalonePump | undefined
  opening: Promise<UpstreamResponse | null> | undefined
  /** Client streams by stream id: one connection per stream, the newest wins. */
  readonly clients = new Map<string, ClientStream>()
  /** Headers of the latest standalone GET here: a takeover opens the upstream GET with them. */
  headers: Record<string, string | string[]> | undefined
  log: Logger | undefined
  /** Set while another replica holds the stream and a client is attached here. */
  unwatch: (() => void) | undefined
  /** A DELETE of the session is on its way upstream (which may end the GET before it answers). */
  deleting = false

  /** The session's upstream GET is held here, its pump running. */
  get pumping (): boolean { return this.pump !== undefined && !this.pump.stopped }

  /** The client of the standalone stream attached here, if any. */
  get standaloneClient (): ClientStream | undefined { return this.clients.get(STANDALONE_STREAM) }

  /** Stop watching the replica that holds the stream. */
  stopWatching (): void {
    this.unwatch?.()
    this.unwatch = undefined
  }

  // PumpClients: the pump's view of the standalone client attached here (methods,
  // not closures per session).
  localClients (): number { return this.clients.has(STANDALONE_STREAM) ? 1 : 0 }
  writeUnrecorded (events: readonly EventInput[]): void { this.clients.get(STANDALONE_STREAM)?.writeUnrecorded(events) }
  storedAfterAll (afterSeq: number, throughSeq: number): void { this.clients.get(STANDALONE_STREAM)?.storedAfterAll(afterSeq, throughSeq) }
}

/** The sessions this process holds something for: a client, an upstream GET, one being opened. */
export class LocalSessions {
  readonly #sessions = new Map<string, LocalSession>()

  get (sessionId: string): LocalSession | undefined {
    return this.#sessions.get(sessionId)
  }

  /** The session's local state, created on first use. */
  local (sessionId: string): LocalSession {
    let s = this.#sessions.get(sessionId)
    if (s === undefined) {
      s = new LocalSession()
      this.#sessions.set(sessionId, s)
    }
    return s
  }

  /** Forget the session once nothing is held for it here: no client, no upstream GET, none being opened. */
  forget (sessionId: string): void {
    const s = this.#sessions.get(sessionId)
    if (s === undefined || s.pump !== undefined || s.opening !== undefined || s.clients.size > 0) return
    s.unwatch?.()
    this.#sessions.delete(sessionId)
  }

  /** The session is gone: forget it whatever it holds (the caller closed it). */
  delete (sessionId: string): void {
    this.#sessions.delete(sessionId)
  }

  /** Client streams open here. */
  get clientCount (): number {
    let n = 0
    for (const s of this.#sessions.values()) n += s.clients.size
    return n
  }

  values (): IterableIterator<LocalSession> {
    return this.#sessions.values()
  }

  entries (): IterableIterator<[string, LocalSession]> {
    return this.#sessions.entries()
  }
}
