/**
 * Upstream sessions a re-establishment replaced although the upstream never
 * said it lost them: their endpoint refused a connection, timed out, reset
 * it, was set aside or left the DNS answer, and the session was established
 * again, on another endpoint or on the same one. The old endpoint may come
 * back holding them (a connect timeout under load, a pod not ready for a
 * while), or never have lost them (a reset connection), and an SDK server
 * keeps a session until told: each is sent a DELETE, after `waitMs` (a call
 * may still be running in it) and then every `retryMs` while
 * its endpoint cannot be reached or asks to be called later (408, 429, 5xx),
 * until it answers, its endpoint leaves the set, or `maxAgeMs` passes. Before
 * each DELETE the session's record is read: one that names that upstream
 * session again (the store lost the move, and the session was found there
 * again) keeps it. At most `max` wait, `concurrency` DELETEs at a time (an
 * endpoint that comes back is not met with hundreds at once); past `max` the
 * oldest is given up. Nobody waits for any of it.
 */
import type { LeftBehindOutcome } from '../metrics/metrics.js'
import type { UpstreamPlacement } from '../store/contract.js'
import { discardBody, type UpstreamRequest, type UpstreamResponse } from '../upstream/client.js'
import { sessionRequest } from '../upstream/session-request.js'

export interface LeftBehindOptions {
  readonly send: (request: UpstreamRequest) => Promise<UpstreamResponse>
  /** The upstream session the session's record names now; undefined without a record. */
  readonly named: (sessionId: string) => Promise<string | undefined>
  /** Whether the upstream's endpoint set still lists `endpoint`, in any state. */
  readonly listed: (endpoint: string) => boolean
  /** The MCP endpoint's path upstream. */
  readonly path: string
  readonly retryMs: number
  /**
   * How long the first DELETE waits (REESTABLISH_DELETE_AFTER_SECONDS): the
   * old process may live on, and a call still running in the old session
   * (its answer being recorded) would be cut by it. Tried at the first turn
   * after it.
   */
  readonly waitMs: number
  /** From the session's move: what has not been answered by then is given up. */
  readonly maxAgeMs: number
  readonly max: number
  /** DELETEs (with their record reads) under way at once. */
  readonly concurrency: number
  /** Longest wait for one DELETE's answer head. */
  readonly requestTimeoutMs: number
  readonly settled: (outcome: LeftBehindOutcome) => void
  readonly now?: () => number
}

/**
 * Sessions left behind waiting at once, per process: each keeps the headers
 * of the request that moved it (at most MAX_HEADER_BYTES), so at the default
 * 16 KiB, 8 MiB at worst.
 */
export const LEFT_BEHIND_MAX = 512
/** Longest wait for the answer head of one DELETE. */
export const LEFT_BEHIND_TIMEOUT_MS = 10_000
export const LEFT_BEHIND_CONCURRENCY = 8

type Placed = UpstreamPlacement & { readonly endpoint: string }

interface Entry {
  readonly sessionId: string
  readonly placement: Placed
  readonly headers: Record<string, string | string[]>
  readonly since: number
  /** No DELETE before then. */
  readonly notBefore: number
  /** A DELETE of it is under way. */
  sending: boolean
}

export class LeftBehind {
  readonly #o: LeftBehindOptions
  readonly #now: () => number
  /** Oldest first. */
  readonly #entries: Entry[] = []
  #timer: NodeJS.Timeout | undefined
  #sending = 0

  constructor (options: LeftBehindOptions) {
    this.#o = options
    this.#now = options.now ?? Date.now
  }

  /** Sessions waiting for their DELETE to be answered. */
  get size (): number {
    return this.#entries.length
  }

  /** `headers`: what the session's requests carry upstream (its credentials and protocol version). */
  add (sessionId: string, placement: Placed, headers: Record<string, string | string[]>): void {
    if (this.#entries.length >= this.#o.max) this.#settle(this.#entries[0] as Entry, 'dropped')
    const since = this.#now()
    const entry: Entry = { sessionId, placement, headers, since, notBefore: since + this.#o.waitMs, sending: false }
    this.#entries.push(entry)
    if (this.#o.waitMs <= 0 && this.#sending < this.#o.concurrency) this.#send(entry)
    this.#timer ??= setInterval(() => { this.#retry() }, this.#o.retryMs).unref()
  }

  /** Gives every one up, uncounted (the process is stopping). */
  close (): void {
    this.#entries.length = 0
    this.#stop()
  }

  #retry (): void {
    const now = this.#now()
    for (const entry of [...this.#entries]) {
      if (entry.sending) continue
      if (!this.#o.listed(entry.placement.endpoint)) this.#settle(entry, 'endpoint_gone')
      else if (now - entry.since >= this.#o.maxAgeMs) this.#settle(entry, 'expired')
      else if (now >= entry.notBefore && this.#sending < this.#o.concurrency) this.#send(entry)
    }
  }

  #send (entry: Entry): void {
    entry.sending = true
    this.#sending++
    this.#attempt(entry).then(outcome => {
      this.#sent(entry)
      if (outcome === undefined) return
      this.#settle(entry, outcome)
      // The endpoint answers: the next one waiting need not wait for the next turn.
      const now = this.#now()
      const next = this.#entries.find(e => !e.sending && now >= e.notBefore)
      if (next !== undefined && this.#sending < this.#o.concurrency) this.#send(next)
    }, () => {
      // The store or the endpoint could not be reached: tried again at the next turn, within maxAgeMs.
      this.#sent(entry)
    })
  }

  /** How the entry ends now; undefined: try again later. */
  async #attempt (entry: Entry): Promise<LeftBehindOutcome | undefined> {
    const { placement } = entry
    if (await this.#o.named(entry.sessionId) === placement.upstreamSessionId) return 'kept'
    // Given up while its record was read (dropped, or the process stopping): nothing to send.
    if (!this.#entries.includes(entry)) return undefined
    const request = { method: 'DELETE', path: this.#o.path, headers: entry.headers, signal: AbortSignal.timeout(this.#o.requestTimeoutMs) }
    const res = await this.#o.send(sessionRequest(placement, request))
    discardBody(res.body)
    return laterPlease(res.statusCode) ? undefined : 'answered'
  }

  #sent (entry: Entry): void {
    entry.sending = false
    this.#sending--
  }

  #settle (entry: Entry, outcome: LeftBehindOutcome): void {
    const at = this.#entries.indexOf(entry)
    // Dropped or given up meanwhile: settled already.
    if (at < 0) return
    this.#entries.splice(at, 1)
    this.#o.settled(outcome)
    if (this.#entries.length === 0) this.#stop()
  }

  #stop (): void {
    clearInterval(this.#timer)
    this.#timer = undefined
  }
}

/** An answer that asks to be called again: a timeout, too many requests, a server error. */
function laterPlease (status: number): boolean {
  return status === 408 || status === 429 || status >= 500
}
