import type { FastifyBaseLogger as Logger } from 'fastify'
import { errors } from '../errors.js'
import { STANDALONE_STREAM, type UpstreamPlacement } from '../store/contract.js'
import type { CloseOutcome } from '../metrics/metrics.js'
import type { ClientStream } from '../sse/client-stream.js'
import { discardBody, type UpstreamResponse } from '../upstream/client.js'
import { sameUpstreamSession } from '../upstream/session-request.js'
import { type LocalSession, LocalSessions, type Opened } from './local-session.js'
import { ReadAheadBudget } from '../recording/read-ahead.js'
import { RefusedGets } from './refused-gets.js'
import { StandaloneHolder, type StandaloneHolderOptions } from './standalone-holder.js'
import type { SessionRecovery } from './standalone-pump.js'
import { StreamDrain } from './stream-drain.js'

/** What the hub needs: what holding upstream GETs does (see StandaloneHolderOptions). */
export type SessionHubOptions = StandaloneHolderOptions

/** A session with neither client nor upstream GET here is forgotten this long after its last GET. */
const FORGET_AFTER_MS = 10_000

/**
 * What this process holds for each session: its upstream GET pump (when it
 * holds the session's lease) and the client connections attached to its
 * streams. A client attached here while another replica holds the stream
 * follows the store, and this replica takes the stream over if the holder
 * goes away (StandaloneHolder).
 */
export class SessionHub {
  readonly #o: SessionHubOptions
  /** The read-ahead budget of the streams this gateway records. */
  readonly readAhead = new ReadAheadBudget()
  readonly #sessions = new LocalSessions()
  readonly #drain: StreamDrain
  readonly #holder: StandaloneHolder
  readonly #refusedGets: RefusedGets

  constructor (options: SessionHubOptions) {
    this.#o = options
    this.#drain = new StreamDrain(this.#sessions, options.leases)
    this.#holder = new StandaloneHolder(options, this.#sessions, this.readAhead, this.#drain)
    this.#refusedGets = new RefusedGets(options.maxSessions)
  }

  get pumpCount (): number { return this.#holder.pumpCount }

  /**
   * How a session the store lost while this process holds its upstream GET
   * is recorded again (set by the MCP route, which checks principals): the
   * GET then stays open and its recording goes on in the new epoch. Without
   * it, the GET stops and the client's reconnect opens it again.
   */
  recoverLostWith (recover: SessionRecovery): void {
    this.#holder.recoverLostWith(recover)
  }

  /** Client streams open, for drain progress. */
  get clientCount (): number { return this.#sessions.clientCount }
  /** Sessions this process keeps anything for (a client, an upstream GET, one opening or watched, a GET's headers). */
  get sessionCount (): number { return this.#sessions.size }

  /**
   * A client's GET: make sure the session's upstream GET is held, here or by
   * another replica. Resolves null when it is (already or now); otherwise
   * with the upstream's refusal to pass through.
   */
  async ensurePump (sessionId: string, headers: Record<string, string | string[]>, log: Logger): Promise<UpstreamResponse | null> {
    const refusal = await this.#ensurePump(sessionId, headers, log)
    // The client attaches once its position is read: the hold must not run out meanwhile.
    if (refusal === null) this.#sessions.get(sessionId)?.pump?.clientAsked()
    return refusal
  }

  async #ensurePump (sessionId: string, headers: Record<string, string | string[]>, log: Logger): Promise<UpstreamResponse | null> {
    const known = this.#sessions.get(sessionId)
    // Nothing will be opened here (draining, or MAX_SESSIONS upstream GETs held): nothing is
    // kept for the session either, or each such request (an initialize's openEarly) would
    // leave an entry with its headers that nothing forgets. A client GET attaches anew.
    if (known === undefined && (this.#drain.draining || this.#holder.full)) return this.#notOpened()
    const s = known ?? this.#sessions.local(sessionId)
    s.standaloneGet(headers, log)
    if (s.pumping) return null
    if (s.opening !== undefined) return await s.opening
    // Another replica holds it (we watch), or we are draining: the client follows the store.
    if (s.watching) return null
    if (this.#drain.draining || this.#holder.full) return this.#notOpened()
    // Idle (nothing above applies), so the opening starts.
    const opened = s.open(async () => await this.#holder.claim(s, sessionId, log)) as Opened
    try {
      return await opened
    } finally {
      if (!s.pumping) this.#o.admission?.release(sessionId)
      // The client attaches next (keeping the headers a takeover needs); if it never does, forget later.
      setTimeout(() => this.#sessions.forget(sessionId), FORGET_AFTER_MS).unref()
    }
  }

  /** Not opened here: while draining the client follows the store; past MAX_SESSIONS, 503. */
  #notOpened (): null {
    if (this.#drain.draining) return null
    throw errors.tooManySessions()
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
    this.#ensurePump(sessionId, headers, log).then(refusal => {
      if (refusal === null) return
      if (refusal.statusCode === 405) this.#refusedGets.note(sessionId)
      discardBody(refusal.body)
      log.debug({ status: refusal.statusCode }, 'the upstream refused the session\'s standalone GET; a client GET gets its answer')
    }, (err: unknown) => {
      log.warn({ err }, 'could not open the session\'s upstream GET stream at initialize; the client\'s GET opens it')
    })
  }

  /**
   * The session was established upstream again (or the endpoint holding it
   * found), its record now at `placement` (`from`: the record it was found
   * lost under): its upstream GET is opened there, so what the new upstream
   * session sends on it is not dropped. One running or opening here on the old placement moves there
   * under the same lease (StandaloneHolder.follow: the old GET may never end
   * by itself), unless the record only came to name the endpoint holding the
   * same upstream session: that GET goes on. Otherwise one is opened (the
   * pump reads the record), with the headers of the session's latest request
   * here, else `headers` (the re-establishing request's): the old GET may
   * have ended, and its client gone, before the session was established
   * again. One held by another replica follows at that replica's next lease
   * renewal, which tells it the record moved.
   */
  reopen (sessionId: string, placement: UpstreamPlacement, from: UpstreamPlacement, headers: Record<string, string | string[]>, log: Logger): void {
    // The upstream has no standalone stream (405): nothing to reopen.
    if (this.#refusedGets.has(sessionId)) return
    // In a new upstream session, the last upstream event id the lease kept is the old one's:
    // a GET opened from it would ask the new session to resume a stream it never had (an SDK
    // server with an event store then files that GET under no stream, and drops what the
    // session sends). Redis forgets it with the move itself; the process-local leases, here.
    // The same upstream session, its endpoint named, keeps it: its GET resumes from there.
    if (!sameUpstreamSession(from, placement)) this.#o.leases.backend.noteUpstreamId(sessionId, '')
    const s = this.#sessions.get(sessionId)
    if (s !== undefined && (s.pumping || s.opening !== undefined)) {
      this.#holder.follow(s, sessionId, placement, s.log ?? log)
      return
    }
    this.openEarly(sessionId, s?.headers ?? headers, s?.log ?? log)
  }

  /** Did the upstream answer this session's GET with 405 (known here)? Its streams cannot be resumed upstream. */
  upstreamGetRefused (sessionId: string): boolean {
    return this.#refusedGets.has(sessionId)
  }

  /**
   * Resolves once the session's upstream GET being opened here has opened
   * (or failed), at most after `maxWaitMs`: a request that may make the
   * upstream send on the standalone stream goes upstream after it.
   */
  async opened (sessionId: string, maxWaitMs: number): Promise<void> {
    const deadline = Date.now() + maxWaitMs
    let waited: Opened | undefined
    // Once more when another opening follows the one waited for (a pump that opened at the
    // old placement moves to the new one: StandaloneHolder.follow).
    for (;;) {
      const opening = this.#sessions.get(sessionId)?.opening
      const left = deadline - Date.now()
      if (opening === undefined || opening === waited || left <= 0) return
      waited = opening
      let timer: NodeJS.Timeout | undefined
      await Promise.race([
        opening.catch(() => null),
        new Promise<void>(resolve => { timer = setTimeout(resolve, left) })
      ])
      clearTimeout(timer)
      // The opening's follow-up (follow's check) runs after it settles: let it start.
      await new Promise<void>(resolve => setImmediate(resolve))
    }
  }

  /**
   * Attach the client of the session's standalone stream, with its GET's
   * headers and log. The session may have been forgotten here since
   * ensurePump (its upstream GET stopped while the client's position was
   * read): the headers are kept again, so the takeover that reopens the
   * upstream GET has them.
   */
  attachStandalone (sessionId: string, client: ClientStream, headers: Record<string, string | string[]>, log: Logger): void {
    const s = this.#sessions.local(sessionId)
    s.standaloneGet(headers, log)
    this.#attach(s, sessionId, client)
  }

  /**
   * A request of the session passed its principal check here: the headers
   * `shape` makes of it replace those the gateway's own upstream GETs of the
   * session carry (LocalSession.headers), so a token the client refreshed
   * reaches the upstream, not one that may have expired. Only for a session
   * this process holds something for: none is made per request (sessions that
   * only POST would pile up), and `shape` is not called for the others.
   */
  requestVerified (sessionId: string, shape: () => Record<string, string | string[]>): void {
    this.#sessions.get(sessionId)?.requestVerified(shape())
  }

  /**
   * The headers the gateway's own upstream GETs of the session carry here
   * (LocalSession.headers: its latest request here that passed the principal
   * check); undefined when this process holds nothing for the session.
   */
  upstreamHeaders (sessionId: string): Record<string, string | string[]> | undefined {
    return this.#sessions.get(sessionId)?.headers
  }

  /** Attach the client of a request stream. */
  attach (sessionId: string, client: ClientStream): void {
    if (client.streamId === STANDALONE_STREAM) throw new Error('the standalone stream\'s client attaches with attachStandalone (a takeover needs its headers)')
    this.#attach(this.#sessions.local(sessionId), sessionId, client)
  }

  /** An older connection to the same stream is closed (superseded). */
  #attach (s: LocalSession, sessionId: string, client: ClientStream): void {
    s.attachClient(client)?.end('superseded')
    const standalone = client.streamId === STANDALONE_STREAM
    if (standalone) {
      if (s.pumping) s.pump?.clientsChanged()
      // Not held here, or held by a pump whose GET is still on its way: should that opening
      // end without a pump (the upstream refused the GET), the client watches the lease, free
      // again, for the takeover to open the GET for it, instead of waiting on keep-alives.
      if (!s.pumping || s.opening !== undefined) this.#holder.watchOnceOpened(s, sessionId, client)
    }
    client.onClose(() => {
      s.detachClient(client)
      if (standalone) {
        s.pump?.clientsChanged()
        if (s.standaloneClient === undefined) s.stopWatching()
      }
      this.#sessions.forget(sessionId)
    })
    // Attached while draining (a client came back here: a single instance, or a
    // balancer still sending here): served from the store until closeAll(); after
    // it, closed with its retry hint, which follows its head (ClientStream: a stream
    // closed before its head is sent sends it first).
    const exitRetryMs = this.#drain.exitRetryMs
    if (exitRetryMs !== undefined) client.close('draining', exitRetryMs)
  }

  /** A DELETE of the session goes upstream: until it is answered, the end of the session's upstream GET is the DELETE's. */
  deleteForwarded (sessionId: string): void {
    this.#sessions.get(sessionId)?.deleteForwarded()
  }

  /** The upstream answered the DELETE without ending the session (or did not answer). */
  deleteRefused (sessionId: string): void {
    this.#sessions.get(sessionId)?.deleteRefused()
  }

  /** The session is gone (DELETE, upstream 404): release its upstream GET and close its clients. */
  dropSession (sessionId: string, outcome: CloseOutcome = 'session_deleted'): void {
    this.#o.leases.backend.forget(sessionId)
    this.#refusedGets.forget(sessionId)
    const s = this.#sessions.get(sessionId)
    if (s === undefined) return
    s.stopWatching()
    s.pump?.stop()
    for (const client of s.clientStreams()) client.end(outcome)
    this.#sessions.delete(sessionId)
  }

  /**
   * Draining: take on no upstream stream, watch none, and hand each held one
   * to the first replica that asks for it (its clients will, once closed here).
   */
  async beginDrain (): Promise<void> {
    await this.#drain.begin()
  }

  /** Close every client stream with a retry hint, spread over `spreadMs` (see StreamDrain.closeClients). */
  async closeClients (spreadMs: number, deadline: number): Promise<number> {
    return await this.#drain.closeClients(spreadMs, deadline)
  }

  /** The end of a drain: close every client stream still open, telling it to come back after `retryMs`. */
  closeAll (retryMs: number): void {
    this.#drain.closeAll(retryMs)
  }

  /** Hand every upstream GET still held here over, waiting up to `waitMs` for the replicas that will ask (see StreamDrain.releaseAll). */
  async releaseAll (waitMs = 0): Promise<void> {
    await this.#drain.releaseAll(waitMs)
  }
}
