/**
 * Upstream sessions a re-establishment moved away from although the upstream
 * never said it lost them: their endpoint refused a connection, was set aside
 * or left the DNS answer, and the session was established again on another
 * endpoint. The old endpoint may come back holding them (a connect timeout
 * under load, a pod not ready for a while), and an SDK server keeps a session
 * until told: each is sent a DELETE, at once and then every `retryMs` while
 * its endpoint cannot be reached, until it answers (any status), its endpoint
 * leaves the set, or `maxAgeMs` passes. At most `max` wait; past that the
 * oldest is given up. Nobody waits for any of it.
 */
import type { LeftBehindOutcome } from '../metrics/metrics.js'
import type { UpstreamPlacement } from '../store/contract.js'
import { discardBody, type UpstreamRequest, type UpstreamResponse } from '../upstream/client.js'
import { sessionRequest } from '../upstream/session-request.js'

export interface LeftBehindOptions {
  readonly send: (request: UpstreamRequest) => Promise<UpstreamResponse>
  /** Whether the upstream's endpoint set still lists `endpoint`, in any state. */
  readonly listed: (endpoint: string) => boolean
  /** The MCP endpoint's path upstream. */
  readonly path: string
  readonly retryMs: number
  readonly maxAgeMs: number
  readonly max: number
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

type Placed = UpstreamPlacement & { readonly endpoint: string }

interface Entry {
  readonly placement: Placed
  readonly headers: Record<string, string | string[]>
  readonly since: number
  /** A DELETE of it is under way. */
  sending: boolean
}

export class LeftBehind {
  readonly #o: LeftBehindOptions
  readonly #now: () => number
  /** Oldest first. */
  readonly #entries: Entry[] = []
  #timer: NodeJS.Timeout | undefined

  constructor (options: LeftBehindOptions) {
    this.#o = options
    this.#now = options.now ?? Date.now
  }

  /** Sessions waiting for their DELETE to be answered. */
  get size (): number {
    return this.#entries.length
  }

  /** `headers`: what the session's requests carry upstream (its credentials and protocol version). */
  add (placement: Placed, headers: Record<string, string | string[]>): void {
    if (this.#entries.length >= this.#o.max) this.#settle(this.#entries[0] as Entry, 'dropped')
    const entry: Entry = { placement, headers, since: this.#now(), sending: false }
    this.#entries.push(entry)
    this.#send(entry)
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
      else this.#send(entry)
    }
  }

  #send (entry: Entry): void {
    entry.sending = true
    const request = { method: 'DELETE', path: this.#o.path, headers: entry.headers, signal: AbortSignal.timeout(this.#o.requestTimeoutMs) }
    this.#o.send(sessionRequest(entry.placement, request)).then(res => {
      discardBody(res.body)
      this.#settle(entry, 'answered')
    }, () => {
      // Not reached, or no answer: tried again at the next turn, within maxAgeMs.
      entry.sending = false
    })
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
