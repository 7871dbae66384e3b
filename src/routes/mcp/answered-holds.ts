/**
 * Resumes of answered request streams held open (resume.ts): the official
 * SDK client resumes a request stream until it has a result on it, so one
 * answered with an error is held open after its last event rather than
 * resumed again once a second. Per session on this replica, at most `max`
 * streams are held; a new connection to a stream held already replaces the
 * old one (it counts once). A held stream is watched by no follower: every
 * `checkMs` the sessions holding some are looked up, and the streams of one
 * the store no longer has (deleted through another replica, expired) end.
 * Resumes of request streams still being answered are looked up with them
 * (`follow`): their follower hears of appends, not of the session's end
 * through another replica, and the upstream may never end the answer. So are
 * the recordings of the answers themselves (`record`): an upstream that holds
 * an answer open with comments only never gives the recording an append that
 * would find the session gone. A session dropped on this replica (its DELETE,
 * the upstream's 404) ends all of its at once (`endSession`).
 */
import type { CloseOutcome } from '../../metrics/metrics.js'
import type { EventStore } from '../../store/contract.js'

/**
 * Streams held per session: an SDK client holds one per call answered with an
 * error, so a few cover the calls of one moment; past them, 429 ends the
 * client's retries (it gives up after two).
 */
export const ANSWERED_HOLDS_PER_SESSION = 4

/** How often sessions holding streams are looked up: a held stream of a session gone outlives it this long at most. */
export const ANSWERED_CHECK_MS = 60_000

/** What a hold needs of a client stream (or of a recording, see record). */
export interface HeldClient {
  onClose: (listener: () => void) => void
  end: (outcome: CloseOutcome) => void
}

export interface AnsweredHoldsOptions {
  /** Streams held at once per session. */
  readonly max: number
  /** How often the sessions holding streams are looked up. */
  readonly checkMs: number
  /** Whether the store still has the stream, and so its session (see heldInStore). */
  readonly alive: (sessionId: string, streamId: string) => Promise<boolean>
}

/**
 * The store's answer for AnsweredHoldsOptions.alive: the held stream's state,
 * which leaves the session's expiry alone. Reading the session record would
 * refresh it, and the check, once a minute, would keep a session with a held
 * stream from ever expiring.
 */
export function heldInStore (store: Pick<EventStore, 'state'>): AnsweredHoldsOptions['alive'] {
  return async (sessionId, streamId) => await store.state(sessionId, streamId) !== null
}

function ignore (): void {}

export class AnsweredHolds {
  readonly #o: AnsweredHoldsOptions
  /** By session, by stream: the connection held. */
  readonly #held = new Map<string, Map<string, HeldClient>>()
  /** By session: the resumes followed here (see follow), with their stream. */
  readonly #followed = new Map<string, Map<HeldClient, string>>()
  #timer: NodeJS.Timeout | undefined

  constructor (options: AnsweredHoldsOptions) {
    this.#o = options
  }

  /** Whether `client` may be held for (session, stream): false past `max` other streams of the session. */
  admits (sessionId: string, streamId: string): boolean {
    const streams = this.#held.get(sessionId)
    return streams === undefined || streams.has(streamId) || streams.size < this.#o.max
  }

  /** Hold `client` (admits() said yes): it counts until it closes. */
  hold (sessionId: string, streamId: string, client: HeldClient): void {
    let streams = this.#held.get(sessionId)
    if (streams === undefined) {
      streams = new Map()
      this.#held.set(sessionId, streams)
    }
    streams.set(streamId, client)
    this.#timer ??= setInterval(() => { this.#check() }, this.#o.checkMs).unref()
    client.onClose(() => {
      if (streams.get(streamId) !== client) return
      streams.delete(streamId)
      if (streams.size === 0 && this.#held.get(sessionId) === streams) this.#held.delete(sessionId)
      this.#stopWhenEmpty()
    })
  }

  /** A resume of a request stream still answered, followed here until it closes: ended like a held one once its session is gone. Not counted. */
  follow (sessionId: string, streamId: string, client: HeldClient): void {
    let clients = this.#followed.get(sessionId)
    if (clients === undefined) {
      clients = new Map()
      this.#followed.set(sessionId, clients)
    }
    clients.set(client, streamId)
    this.#timer ??= setInterval(() => { this.#check() }, this.#o.checkMs).unref()
    client.onClose(() => {
      clients.delete(client)
      if (clients.size === 0 && this.#followed.get(sessionId) === clients) this.#followed.delete(sessionId)
      this.#stopWhenEmpty()
    })
  }

  /**
   * The recording of an answer of the session on this replica: `stop` is
   * called once its session is gone (as a followed resume is ended). Returns
   * what to call when the recording ends by itself.
   */
  record (sessionId: string, streamId: string, stop: () => void): () => void {
    let ended = ignore
    this.follow(sessionId, streamId, { onClose: listener => { ended = listener }, end: stop })
    return () => { ended() }
  }

  /** The session is gone (dropped on this replica): everything held or followed for it ends now. */
  endSession (sessionId: string): void {
    for (const client of [...this.#held.get(sessionId)?.values() ?? []]) client.end('session_deleted')
    for (const client of [...this.#followed.get(sessionId)?.keys() ?? []]) client.end('session_deleted')
  }

  /** Streams held now, in all. */
  get size (): number {
    let n = 0
    for (const streams of this.#held.values()) n += streams.size
    return n
  }

  stop (): void {
    clearInterval(this.#timer)
    this.#timer = undefined
  }

  #stopWhenEmpty (): void {
    if (this.#held.size === 0 && this.#followed.size === 0) this.stop()
  }

  /**
   * Each stream asked about on its own: the embedded store may drop a session's
   * ended streams under memory pressure while the session lives, and that ends
   * only their clients.
   */
  #check (): void {
    for (const [sessionId, streams] of this.#held) {
      for (const [streamId, client] of streams) this.#endUnlessAlive(sessionId, streamId, client)
    }
    for (const [sessionId, clients] of this.#followed) {
      for (const [client, streamId] of clients) this.#endUnlessAlive(sessionId, streamId, client)
    }
  }

  #endUnlessAlive (sessionId: string, streamId: string, client: HeldClient): void {
    this.#o.alive(sessionId, streamId).then(alive => {
      if (!alive) client.end('session_deleted')
    }, () => {}) // the store out of reach: asked again at the next check
  }
}
