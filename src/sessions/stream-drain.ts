import { setTimeout as sleep } from 'node:timers/promises'
import type { LeaseCoordinator } from '../cluster/coordinator.js'
import { STANDALONE_STREAM } from '../store/contract.js'
import type { ClientStream } from '../sse/client-stream.js'
import type { LocalSession, LocalSessions } from './local-session.js'
import type { StandalonePump } from './standalone-pump.js'

/** How often drain looks again at request streams that cannot resume yet. */
const DRAIN_POLL_MS = 50

/**
 * The session hub's part of a drain (src/lifecycle/drain.ts runs the whole):
 * its client streams closed with a retry hint, its upstream GETs handed over
 * to the replicas that ask for them.
 */
export class StreamDrain {
  readonly #sessions: LocalSessions
  readonly #leases: LeaseCoordinator
  #draining = false
  /** Sessions whose standalone client was closed here; it will ask for the stream from another replica. */
  readonly #handoverExpected = new Set<string>()
  /** Set once the drain closed its last streams: the retry hint for any attached later. */
  #exitRetryMs: number | undefined

  constructor (sessions: LocalSessions, leases: LeaseCoordinator) {
    this.#sessions = sessions
    this.#leases = leases
  }

  /** Draining: take on no upstream stream and watch none. */
  get draining (): boolean { return this.#draining }
  /** The retry hint for a client attached after the drain closed its last streams. */
  get exitRetryMs (): number | undefined { return this.#exitRetryMs }

  /**
   * Take on no upstream stream, watch none, and hand each held one to the
   * first replica that asks for it (its clients will, once closed here).
   */
  async begin (): Promise<void> {
    this.#draining = true
    for (const s of this.#sessions.values()) s.stopWatching()
    await this.#leases.beginDrain()
  }

  /**
   * Close every client stream with a retry hint, spread evenly over
   * `spreadMs` so the clients do not all reconnect at once. A request stream
   * that has not written an event id yet cannot be resumed, so it is closed
   * once it has (or at `deadline`). Resolves with how many it closed, when
   * none of them is left open, or at `deadline`. Streams attached after this
   * started are left to closeAll().
   */
  async closeClients (spreadMs: number, deadline: number): Promise<number> {
    const clients: Array<[string, ClientStream]> = []
    for (const [sessionId, s] of this.#sessions.entries()) for (const client of s.clientStreams()) clients.push([sessionId, client])
    const step = clients.length > 1 ? spreadMs / clients.length : 0
    const timers = clients.map(([sessionId, client], i) => setTimeout(() => this.#closeForDrain(client, deadline, sessionId), Math.round(i * step)))
    while (clients.some(([, client]) => !client.closed) && Date.now() < deadline) await sleep(DRAIN_POLL_MS)
    for (const timer of timers) clearTimeout(timer)
    for (const [, client] of clients) client.close('draining')
    return clients.length
  }

  /** The end of a drain: close every client stream still open, telling it to come back after `retryMs`. */
  closeAll (retryMs: number): void {
    this.#exitRetryMs = retryMs
    for (const s of this.#sessions.values()) {
      for (const client of s.clientStreams()) client.close('draining', retryMs)
    }
  }

  /**
   * Hand every upstream GET still held here over (lease released, live): the
   * next replica to ask takes it. A session whose client was closed here is
   * about to ask from another replica (after the retry hint): its stream is
   * recorded here until it does, for up to `waitMs`, so the gap stays small.
   */
  async releaseAll (waitMs: number): Promise<void> {
    const released: Array<Promise<void>> = []
    // Alone (the embedded store), nobody else can take a stream over: no point waiting.
    const until = Date.now() + (this.#leases.backend.shared ? waitMs : 0)
    const waiting = (): Array<[string, LocalSession]> => [...this.#sessions.entries()].filter(([, s]) => s.pumping)
    for (const [sessionId, s] of waiting()) {
      if (!this.#handoverExpected.has(sessionId)) released.push((s.pump as StandalonePump).handOver())
    }
    while (waiting().length > 0 && Date.now() < until) await sleep(DRAIN_POLL_MS)
    for (const [, s] of waiting()) released.push((s.pump as StandalonePump).handOver())
    await Promise.all(released)
  }

  #closeForDrain (client: ClientStream, deadline: number, sessionId: string): void {
    if (client.closed) return
    if (client.kind === 'request' && client.lastSeq === 0 && Date.now() < deadline) {
      setTimeout(() => this.#closeForDrain(client, deadline, sessionId), DRAIN_POLL_MS).unref()
      return
    }
    if (client.streamId === STANDALONE_STREAM) this.#handoverExpected.add(sessionId)
    client.close('draining')
  }
}
