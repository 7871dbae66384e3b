import { LRUCache } from 'lru-cache'
import type { FastifyBaseLogger as Logger } from 'fastify'
import { setTimeout as sleep } from 'node:timers/promises'
import type { Lease, LeaseCoordinator } from '../cluster/coordinator.js'
import { errors } from '../errors.js'
import type { EventInput, EventStore } from '../store/contract.js'
import { STANDALONE_STREAM } from '../store/contract.js'
import type { GatewayMetrics, CloseOutcome } from '../metrics/metrics.js'
import type { ClientStream } from '../sse/client-stream.js'
import { discardBody, type UpstreamClient, type UpstreamResponse } from '../upstream/client.js'
import { ReadAheadBudget } from './read-ahead.js'
import { StandalonePump, type PumpClients, type PumpOutcome } from './standalone-pump.js'
import type { PumpAdmission } from './principal-quota.js'

export interface SessionHubOptions {
  readonly upstream: UpstreamClient
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly mcpPath: string
  readonly holdMs: number
  readonly maxEventBytes: number
  readonly maxSessions: number
  /** Which replica holds each session's upstream GET. */
  readonly leases: LeaseCoordinator
  /** Per-principal places for upstream GETs (MAX_SESSIONS_PER_PRINCIPAL), if any. */
  readonly admission?: PumpAdmission
}

/** What this process holds for one session. */
class LocalSession implements PumpClients {
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

  // PumpClients: the pump's view of the standalone client attached here (methods,
  // not closures per session).
  localClients (): number { return this.clients.has(STANDALONE_STREAM) ? 1 : 0 }
  writeUnrecorded (events: readonly EventInput[]): void { this.clients.get(STANDALONE_STREAM)?.writeUnrecorded(events) }
  storedAfterAll (afterSeq: number, throughSeq: number): void { this.clients.get(STANDALONE_STREAM)?.storedAfterAll(afterSeq, throughSeq) }
}

/** Attempts to open the upstream GET after taking a stream over (the old one may still be closing upstream: 409). */
const TAKEOVER_ATTEMPTS = 4
const TAKEOVER_BACKOFF_MS = 150
/** A session with neither client nor upstream GET here is forgotten this long after its last GET. */
const FORGET_AFTER_MS = 10_000
/** How often drain looks again at request streams that cannot resume yet. */
const DRAIN_POLL_MS = 50

/**
 * What this process holds for each session: its upstream GET pump (when it
 * holds the session's lease) and the client connections attached to its
 * streams. A client attached here while another replica holds the stream
 * follows the store, and this replica takes the stream over if the holder
 * goes away.
 */
export class SessionHub {
  readonly #o: SessionHubOptions
  /** The read-ahead budget of the streams this gateway records. */
  readonly readAhead = new ReadAheadBudget()
  readonly #sessions = new Map<string, LocalSession>()
  #pumps = 0
  #draining = false
  /** Draining: sessions whose standalone client was closed here; it will ask for the stream from another replica. */
  readonly #handoverExpected = new Set<string>()
  /** Set once the drain closed its last streams: the retry hint for any attached later. */
  #exitRetryMs: number | undefined
  /**
   * Sessions whose upstream answered their GET with 405 (it has no standalone
   * stream), kept after their local state is forgotten: their request streams
   * are never resumed upstream, so an answer that ends early is concluded at
   * once instead of after the upstream's retry delay and a GET bound to fail.
   */
  readonly #getRefused: LRUCache<string, true>

  constructor (options: SessionHubOptions) {
    this.#o = options
    this.#getRefused = new LRUCache({ max: Math.max(10_000, options.maxSessions * 4) })
  }

  get pumpCount (): number { return this.#pumps }

  /** Client streams open, for drain progress. */
  get clientCount (): number {
    let n = 0
    for (const s of this.#sessions.values()) n += s.clients.size
    return n
  }

  #local (sessionId: string): LocalSession {
    let s = this.#sessions.get(sessionId)
    if (s === undefined) {
      s = new LocalSession()
      this.#sessions.set(sessionId, s)
    }
    return s
  }

  #forget (sessionId: string): void {
    const s = this.#sessions.get(sessionId)
    if (s === undefined || s.pump !== undefined || s.opening !== undefined || s.clients.size > 0) return
    s.unwatch?.()
    this.#sessions.delete(sessionId)
  }

  /**
   * Make sure the session's upstream GET is held, here or by another
   * replica. Resolves null when it is (already or now); otherwise with the
   * upstream's refusal to pass through.
   */
  async ensurePump (sessionId: string, headers: Record<string, string | string[]>, log: Logger): Promise<UpstreamResponse | null> {
    const s = this.#local(sessionId)
    s.headers = headers
    s.log = log
    if (s.pump !== undefined && !s.pump.stopped) return null
    if (s.opening !== undefined) return await s.opening
    // Another replica holds it (we watch), or we are draining: the client follows the store.
    if (s.unwatch !== undefined || this.#draining) return null
    if (this.#pumps >= this.#o.maxSessions) throw errors.tooManySessions()
    s.opening = this.#claim(s, sessionId, log)
    try {
      return await s.opening
    } finally {
      s.opening = undefined
      if (s.pump === undefined || s.pump.stopped) this.#o.admission?.release(sessionId)
      // The client attaches next (keeping the headers a takeover needs); if it never does, forget later.
      setTimeout(() => this.#forget(sessionId), FORGET_AFTER_MS).unref()
    }
  }

  /**
   * A session was just created (initialize answered with a session id): hold
   * its upstream GET from now on, before any client asks for it. An SDK server
   * drops a request or notification it sends on the standalone stream while no
   * GET is open (sampling, elicitation, roots), so waiting for the client's
   * GET, which may come later than its first tool call or never, loses them.
   * Nothing is thrown: a refusal (405: the upstream has no standalone stream)
   * is left for the client's own GET to meet and pass through, once.
   */
  openEarly (sessionId: string, headers: Record<string, string | string[]>, log: Logger): void {
    this.ensurePump(sessionId, headers, log).then(refusal => {
      if (refusal === null) return
      if (refusal.statusCode === 405) this.#getRefused.set(sessionId, true)
      discardBody(refusal.body)
      log.debug({ status: refusal.statusCode }, 'the upstream refused the session\'s standalone GET; a client GET gets its answer')
    }, (err: unknown) => {
      log.warn({ err }, 'could not open the session\'s upstream GET stream at initialize; the client\'s GET opens it')
    })
  }

  /** Did the upstream answer this session's GET with 405 (known here)? Its streams cannot be resumed upstream. */
  upstreamGetRefused (sessionId: string): boolean {
    return this.#getRefused.has(sessionId)
  }

  /**
   * Resolves once the session's upstream GET being opened here has opened
   * (or failed), at most after `maxWaitMs`: a request that may make the
   * upstream send on the standalone stream goes upstream after it.
   */
  async opened (sessionId: string, maxWaitMs: number): Promise<void> {
    const opening = this.#sessions.get(sessionId)?.opening
    if (opening === undefined) return
    let timer: NodeJS.Timeout | undefined
    await Promise.race([
      opening.catch(() => null),
      new Promise<void>(resolve => { timer = setTimeout(resolve, maxWaitMs) })
    ])
    clearTimeout(timer)
  }

  async #claim (s: LocalSession, sessionId: string, log: Logger): Promise<UpstreamResponse | null> {
    await this.#o.admission?.admit(sessionId)
    let lease: Lease | 'held' | 'gone'
    try {
      lease = await this.#o.metrics.timeStore('lease_acquire', () => this.#o.leases.acquire(sessionId))
    } catch (err) {
      throw errors.storeUnavailable(err)
    }
    if (lease === 'gone') throw errors.sessionNotFound()
    // Held by another replica: attach() watches it for a takeover.
    if (lease === 'held') return null
    let res: UpstreamResponse | null = null
    try {
      for (let attempt = 1; attempt <= TAKEOVER_ATTEMPTS; attempt++) {
        res = await this.#startPump(s, sessionId, lease, log)
        // 409: the previous holder's GET is still closing upstream (one GET per session); it goes in a moment.
        if (res?.statusCode !== 409 || attempt === TAKEOVER_ATTEMPTS) break
        discardBody(res.body)
        await sleep(TAKEOVER_BACKOFF_MS * 2 ** (attempt - 1))
      }
    } catch (err) {
      await lease.release(lease.takeover).catch(() => {})
      throw err
    }
    if (res !== null) await lease.release(lease.takeover).catch(() => {})
    return res
  }

  async #startPump (s: LocalSession, sessionId: string, lease: Lease, log: Logger): Promise<UpstreamResponse | null> {
    const pump: StandalonePump = new StandalonePump({
      upstream: this.#o.upstream,
      store: this.#o.store,
      metrics: this.#o.metrics,
      log,
      sessionId,
      path: this.#o.mcpPath,
      holdMs: this.#o.holdMs,
      maxEventBytes: this.#o.maxEventBytes,
      readAhead: this.readAhead,
      lease,
      clients: s,
      onStop: outcome => this.#pumpStopped(s, sessionId, pump, outcome)
    })
    lease.onHandoverRequest = () => {
      log.info('draining: another replica asked for the upstream GET stream; handing it over')
      pump.handOver()
    }
    this.#pumps++
    s.pump = pump
    s.unwatch?.()
    s.unwatch = undefined
    return await pump.open(s.headers ?? {})
  }

  #pumpStopped (s: LocalSession, sessionId: string, pump: StandalonePump, outcome: PumpOutcome): void {
    this.#pumps--
    this.#o.admission?.release(sessionId)
    if (s.pump === pump) s.pump = undefined
    const local = s.clients.get(STANDALONE_STREAM)
    switch (outcome) {
      case 'refused':
      case 'handed_over':
      case 'stopped':
        // stopped: dropSession closes the clients itself, with its own outcome (session_deleted).
        break
      case 'hold_expired':
      case 'lease_lost':
        // Another replica holds (or may take) the stream: the client here follows the store.
        if (local !== undefined) this.#watch(s, sessionId)
        break
      default:
        // The upstream GET ended or broke: the client reconnects (retry hint) and reopens it.
        local?.close(s.deleting ? 'session_deleted' : 'upstream_error')
    }
    this.#forget(sessionId)
  }

  /** A client is attached here and another replica holds the stream: take it over if the holder goes. */
  #watch (s: LocalSession, sessionId: string): void {
    if (s.unwatch !== undefined || this.#draining || s.opening !== undefined || (s.pump !== undefined && !s.pump.stopped)) return
    s.unwatch = this.#o.leases.watch(sessionId, {
      onGrant: lease => {
        s.unwatch = undefined
        this.#takeover(s, sessionId, lease)
      },
      onGone: () => {
        s.unwatch = undefined
        // The store lost the session: the client reconnects and is told (404).
        s.clients.get(STANDALONE_STREAM)?.close('session_deleted')
      }
    })
  }

  /** This replica got the lease of a session another replica held: reopen the upstream GET here. */
  #takeover (s: LocalSession, sessionId: string, lease: Lease): void {
    const log = s.log ?? this.#o.log
    const busy = s.opening !== undefined || (s.pump !== undefined && !s.pump.stopped)
    if (busy || this.#draining || !s.clients.has(STANDALONE_STREAM) || s.headers === undefined || this.#pumps >= this.#o.maxSessions) {
      log.info({ busy, draining: this.#draining }, 'takeover declined: the lease goes back')
      lease.release(lease.takeover).catch(() => {})
      if (!busy) s.clients.get(STANDALONE_STREAM)?.close('upstream_error')
      return
    }
    log.info({ takeover: lease.takeover }, 'took the upstream GET stream over from another replica')
    s.opening = (async () => {
      for (let attempt = 1; ; attempt++) {
        let res: UpstreamResponse | null | undefined
        try {
          res = await this.#startPump(s, sessionId, lease, log)
        } catch (err) {
          log.warn({ err, attempt }, 'takeover: the upstream GET failed')
        }
        if (res === null) return null
        if (res !== undefined) discardBody(res.body)
        if (attempt >= TAKEOVER_ATTEMPTS || this.#draining || !s.clients.has(STANDALONE_STREAM) || lease.settled) {
          log.warn({ status: res?.statusCode, attempt }, 'takeover: the upstream GET could not be opened; the client reconnects')
          await lease.release(lease.takeover).catch(() => {})
          // Its reconnect goes through ensurePump, which passes the upstream's answer on.
          s.clients.get(STANDALONE_STREAM)?.close('upstream_error')
          return null
        }
        await sleep(TAKEOVER_BACKOFF_MS * 2 ** (attempt - 1))
      }
    })()
    s.opening.catch(() => null).finally(() => {
      s.opening = undefined
      this.#forget(sessionId)
    }).catch(() => {})
  }

  /** Attach a client to a stream; an older connection to the same stream is closed (superseded). */
  attach (sessionId: string, client: ClientStream): void {
    const s = this.#local(sessionId)
    const previous = s.clients.get(client.streamId)
    s.clients.set(client.streamId, client)
    if (previous !== undefined && previous !== client) previous.end('superseded')
    const standalone = client.streamId === STANDALONE_STREAM
    if (standalone) {
      if (s.pump !== undefined && !s.pump.stopped) s.pump.clientsChanged()
      else this.#watch(s, sessionId)
    }
    client.onClose(() => {
      if (s.clients.get(client.streamId) === client) s.clients.delete(client.streamId)
      if (standalone) {
        s.pump?.clientsChanged()
        if (!s.clients.has(STANDALONE_STREAM)) {
          s.unwatch?.()
          s.unwatch = undefined
        }
      }
      this.#forget(sessionId)
    })
    // Attached while draining (a client came back here: a single instance, or a
    // balancer still sending here): served from the store until closeAll(); after
    // it, closed with its retry hint right after its head is written.
    const exitRetryMs = this.#exitRetryMs
    if (exitRetryMs !== undefined) setImmediate(() => client.close('draining', exitRetryMs))
  }

  /** A DELETE of the session goes upstream (pending) or was answered: closes meanwhile are the DELETE's. */
  deleting (sessionId: string, pending: boolean): void {
    const s = this.#sessions.get(sessionId)
    if (s !== undefined) s.deleting = pending
  }

  /** The session is gone (DELETE, upstream 404): release its upstream GET and close its clients. */
  dropSession (sessionId: string, outcome: CloseOutcome = 'session_deleted'): void {
    this.#o.leases.backend.forget(sessionId)
    this.#getRefused.delete(sessionId)
    const s = this.#sessions.get(sessionId)
    if (s === undefined) return
    s.unwatch?.()
    s.unwatch = undefined
    s.pump?.stop()
    for (const client of [...s.clients.values()]) client.end(outcome)
    this.#sessions.delete(sessionId)
  }

  /**
   * Draining: take on no upstream stream, watch none, and hand each held one
   * to the first replica that asks for it (its clients will, once closed here).
   */
  async beginDrain (): Promise<void> {
    this.#draining = true
    for (const s of this.#sessions.values()) {
      s.unwatch?.()
      s.unwatch = undefined
    }
    await this.#o.leases.beginDrain()
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
    for (const [sessionId, s] of this.#sessions) for (const client of s.clients.values()) clients.push([sessionId, client])
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
      for (const client of [...s.clients.values()]) client.close('draining', retryMs)
    }
  }

  /**
   * Hand every upstream GET still held here over (lease released, live): the
   * next replica to ask takes it. A session whose client was closed here is
   * about to ask from another replica (after the retry hint): its stream is
   * recorded here until it does, for up to `waitMs`, so the gap stays small.
   */
  async releaseAll (waitMs = 0): Promise<void> {
    const released: Array<Promise<void>> = []
    // Alone (the embedded store), nobody else can take a stream over: no point waiting.
    const until = Date.now() + (this.#o.leases.backend.shared ? waitMs : 0)
    const waiting = (): Array<[string, LocalSession]> => [...this.#sessions].filter(([, s]) => s.pump !== undefined && !s.pump.stopped)
    for (const [sessionId, s] of waiting()) {
      if (!this.#handoverExpected.has(sessionId)) released.push((s.pump as StandalonePump).handOver())
    }
    while (waiting().length > 0 && Date.now() < until) await sleep(DRAIN_POLL_MS)
    for (const [, s] of waiting()) released.push((s.pump as StandalonePump).handOver())
    await Promise.all(released)
  }

  #closeForDrain (client: ClientStream, deadline: number, sessionId?: string): void {
    if (client.closed) return
    if (client.kind === 'request' && client.lastSeq === 0 && Date.now() < deadline) {
      setTimeout(() => this.#closeForDrain(client, deadline, sessionId), DRAIN_POLL_MS).unref()
      return
    }
    if (sessionId !== undefined && client.streamId === STANDALONE_STREAM) this.#handoverExpected.add(sessionId)
    client.close('draining')
  }
}
