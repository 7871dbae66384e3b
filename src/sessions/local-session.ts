import type { FastifyBaseLogger as Logger } from 'fastify'
import type { EventInput } from '../store/contract.js'
import { STANDALONE_STREAM } from '../store/contract.js'
import type { ClientStream } from '../sse/client-stream.js'
import type { UpstreamResponse } from '../upstream/client.js'
import type { PumpClients, StandalonePump } from './standalone-pump.js'

/** What opening the session's upstream GET here resolves with: null once it is held (here or elsewhere), else the upstream's refusal. */
export type Opened = Promise<UpstreamResponse | null>

/**
 * Where the session's upstream GET (its standalone stream) stands in this
 * process. Only LocalSession moves it, each move from the states it names:
 *
 *   idle     → watching   watch
 *   watching → idle       stopWatching, watchEnded
 *   idle     → opening    open
 *   opening  → starting   pumpStarted
 *   starting → opening    pumpStopped (the opening may try again)
 *   starting → pumping    the opening settled, its pump running
 *   opening  → idle       the opening settled without a pump
 *   pumping  → idle       pumpStopped
 */
export type StandaloneState =
  /** Nothing held or watched here. */
  | { readonly kind: 'idle' }
  /** Another replica holds the upstream GET; a client attached here watches its lease, to take it over. */
  | { readonly kind: 'watching', readonly unwatch: () => void }
  /** The upstream GET is being opened here: admission, the lease, or a wait between attempts. */
  | { readonly kind: 'opening', readonly opened: Opened }
  /** Still opening, with a pump whose upstream GET is on its way: the stream counts as held. */
  | { readonly kind: 'starting', readonly opened: Opened, readonly pump: StandalonePump }
  /** The upstream GET is held here, its pump running. */
  | { readonly kind: 'pumping', readonly pump: StandalonePump }

const IDLE: StandaloneState = { kind: 'idle' }
const NO_CLIENTS: readonly ClientStream[] = []

/** What this process holds for one session. */
export class LocalSession implements PumpClients {
  #state: StandaloneState = IDLE
  /**
   * A DELETE of the session is on its way upstream (which may end the GET
   * before it answers). Apart from the state: a DELETE can be under way in
   * any of them, and only names how the upstream GET ended if it ends meanwhile.
   */
  #deleting = false
  #headers: Record<string, string | string[]> | undefined
  #log: Logger | undefined
  /**
   * Client streams by stream id: one connection per stream, the newest wins.
   * Ownership: a client enters only through attachClient (the hub's attach)
   * and leaves only through detachClient with itself (its own close), so a
   * superseded connection closing late never removes its successor; everyone
   * else reads a copy (clientStreams).
   * An array of the exact length, in the order the streams first attached
   * (as a Map would keep them): a session has one or a few, and a Map's table
   * took an idle stream 0.18 KB, an array of one 56 bytes.
   */
  #clients: readonly ClientStream[] = NO_CLIENTS

  /** Where the standalone stream stands (the state itself, with its parts, stays here). */
  get kind (): StandaloneState['kind'] { return this.#state.kind }

  /** The session's upstream GET is held here (starting or pumping), its pump running. */
  get pumping (): boolean {
    const s = this.#state
    return (s.kind === 'starting' || s.kind === 'pumping') && !s.pump.stopped
  }

  /** The pump of the upstream GET held here, if any. */
  get pump (): StandalonePump | undefined {
    const s = this.#state
    return s.kind === 'starting' || s.kind === 'pumping' ? s.pump : undefined
  }

  /** The opening of the upstream GET under way here, if any. */
  get opening (): Opened | undefined {
    const s = this.#state
    return s.kind === 'opening' || s.kind === 'starting' ? s.opened : undefined
  }

  get watching (): boolean { return this.#state.kind === 'watching' }

  /** Nothing here for the session: no upstream GET held or being opened, no client. */
  get unused (): boolean {
    return (this.#state.kind === 'idle' || this.#state.kind === 'watching') && this.#clients.length === 0
  }

  /**
   * The end-to-end headers of the session's latest request here that passed
   * its principal check (its GETs and POSTs), shaped for an upstream GET:
   * every upstream GET the gateway opens for the session carries them (the
   * pump's opening and resumes, a takeover, a follow). Not the ones of the GET
   * that opened the stream: a client that refreshed its token sends the new
   * one on its requests, and the old one may have expired since.
   */
  get headers (): Record<string, string | string[]> | undefined { return this.#headers }
  get log (): Logger | undefined { return this.#log }

  /**
   * A client asked for the standalone stream here, with these headers: they
   * are the session's unless it has some already. Those came from a request
   * verified here (requestVerified), this GET's own verification included, so
   * they are at least as new as the GET's: a GET that attaches after waiting
   * for its upstream GET must not put back a token that a request verified
   * meanwhile refreshed. A session made here after the GET was verified has
   * none: the GET's fill in.
   */
  standaloneGet (headers: Record<string, string | string[]>, log: Logger): void {
    this.#headers ??= headers
    this.#log = log
  }

  /** A request of the session passed its principal check here, with these headers (see headers). */
  requestVerified (headers: Record<string, string | string[]>): void {
    this.#headers = headers
  }

  get deleting (): boolean { return this.#deleting }
  /** A DELETE of the session goes upstream. */
  deleteForwarded (): void { this.#deleting = true }
  /** The upstream answered the DELETE without ending the session (or did not answer). */
  deleteRefused (): void { this.#deleting = false }

  /** The client of the standalone stream attached here, if any. */
  get standaloneClient (): ClientStream | undefined { return this.#client(STANDALONE_STREAM) }

  /** Client streams attached here. */
  get clientCount (): number { return this.#clients.length }

  /** The client streams attached here, as a copy (closing them detaches them meanwhile). */
  clientStreams (): ClientStream[] { return [...this.#clients] }

  /** `client` becomes its stream's connection here; returns the one it supersedes, for the caller to end. */
  attachClient (client: ClientStream): ClientStream | undefined {
    const previous = this.#client(client.streamId)
    this.#clients = previous === undefined ? this.#clients.concat(client) : this.#clients.map(c => c === previous ? client : c)
    return previous === client ? undefined : previous
  }

  /** `client` closed: it leaves, unless a newer connection superseded it. */
  detachClient (client: ClientStream): void {
    if (this.#clients.includes(client)) this.#clients = this.#clients.filter(c => c !== client)
  }

  #client (streamId: string): ClientStream | undefined {
    for (const client of this.#clients) if (client.streamId === streamId) return client
    return undefined
  }

  /**
   * idle → watching: `begin` starts watching the holder's lease and returns
   * the function that stops. Refused (false, `begin` not called) otherwise.
   */
  watch (begin: () => () => void): boolean {
    if (this.#state.kind !== 'idle') return false
    this.#state = { kind: 'watching', unwatch: begin() }
    return true
  }

  /** watching → idle, the watch stopped. Nothing in any other state. */
  stopWatching (): void {
    if (this.#state.kind !== 'watching') return
    const { unwatch } = this.#state
    this.#state = IDLE
    unwatch()
  }

  /** watching → idle: the watch ended by itself (the lease granted, or the session gone). Nothing in any other state. */
  watchEnded (): void {
    if (this.#state.kind === 'watching') this.#state = IDLE
  }

  /**
   * idle → opening, with what `start` resolves with; once that settles,
   * → pumping if a pump runs by then, else → idle. Refused (undefined,
   * `start` not called) in any other state.
   */
  open (start: () => Opened): Opened | undefined {
    if (this.#state.kind !== 'idle') return undefined
    let settle!: (started: Opened) => void
    const opened: Opened = new Promise(resolve => { settle = resolve })
    this.#state = { kind: 'opening', opened }
    // Moves first: every caller awaiting `opened` finds the state settled.
    const done = (): void => this.#settled(opened)
    opened.then(done, done)
    // Opening before `start` runs: `start` may start a pump before it returns.
    try {
      settle(start())
    } catch (err) {
      settle(Promise.reject(err))
    }
    return opened
  }

  /** opening → starting. A pump anywhere else is a bug: thrown, before anything is opened. */
  pumpStarted (pump: StandalonePump): void {
    if (this.#state.kind !== 'opening') throw new Error(`a pump started while the standalone stream was ${this.#state.kind}, not opening`)
    this.#state = { kind: 'starting', opened: this.#state.opened, pump }
  }

  /** starting → opening (it may try again), pumping → idle: when `pump` is this state's. Nothing otherwise. */
  pumpStopped (pump: StandalonePump): void {
    const s = this.#state
    if (s.kind === 'starting' && s.pump === pump) this.#state = { kind: 'opening', opened: s.opened }
    else if (s.kind === 'pumping' && s.pump === pump) this.#state = IDLE
  }

  #settled (opened: Opened): void {
    const s = this.#state
    if (s.kind === 'opening' && s.opened === opened) this.#state = IDLE
    else if (s.kind === 'starting' && s.opened === opened) this.#state = s.pump.stopped ? IDLE : { kind: 'pumping', pump: s.pump }
  }

  // PumpClients: the pump's view of the standalone client attached here (methods,
  // not closures per session).
  localClients (): number { return this.#client(STANDALONE_STREAM) !== undefined ? 1 : 0 }
  writeUnrecorded (events: readonly EventInput[]): void { this.#client(STANDALONE_STREAM)?.writeUnrecorded(events) }
  storedAfterAll (afterSeq: number, throughSeq: number): void { this.#client(STANDALONE_STREAM)?.storedAfterAll(afterSeq, throughSeq) }
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
    if (s === undefined || !s.unused) return
    s.stopWatching()
    this.#sessions.delete(sessionId)
  }

  /** The session is gone: forget it whatever it holds (the caller closed it). */
  delete (sessionId: string): void {
    this.#sessions.delete(sessionId)
  }

  get size (): number { return this.#sessions.size }

  /** Client streams open here. */
  get clientCount (): number {
    let n = 0
    for (const s of this.#sessions.values()) n += s.clientCount
    return n
  }

  values (): IterableIterator<LocalSession> {
    return this.#sessions.values()
  }

  entries (): IterableIterator<[string, LocalSession]> {
    return this.#sessions.entries()
  }
}
