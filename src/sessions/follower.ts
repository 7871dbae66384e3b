import type { FastifyBaseLogger as Logger } from 'fastify'
import type { EventStore, ReadResult, StoredEvent, StreamNotice } from '../store/contract.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import { NumberedBatch } from '../store/batch/numbered-batch.js'
import type { ClientStream } from '../sse/client-stream.js'

export interface FollowOptions {
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly client: ClientStream
  readonly sessionId: string
  /** Most events per store read while catching up (replay is paged, never one huge read). */
  readonly pageSize: number
  /**
   * Bytes of the first page of a catch-up; each full page doubles it, up to
   * pageMaxBytes: a short resume answers at once, a long one reads in large
   * pages (a round trip per page, each waiting behind the appends of a busy
   * stream, must bring more than the stream gains meanwhile, or a client that
   * fell behind a flood never catches up).
   */
  readonly pageBytes: number
  readonly pageMaxBytes: number
  /** Close the client once the stream has ended and everything was written (request streams). */
  readonly untilEnded: boolean
}

/** Most events kept from notices during one read. */
const HELD_MAX = 10_000

/**
 * Write a page of a read to the client, packed when the store gave it so;
 * returns how many events the page held.
 */
export function writePage (client: ClientStream, page: ReadResult, replayed: boolean): number {
  if (page.batches === undefined) {
    client.writeEvents(page.events, replayed)
    return page.events.length
  }
  client.writeBatches(page.batches, replayed)
  let count = 0
  for (const batch of page.batches) count += batch.length
  return count
}

/** The size of the page after one that did not reach the end: twice as large, up to the largest. */
export function nextPageBytes (pageBytes: number, pageMaxBytes: number): number {
  return Math.min(2 * pageBytes, pageMaxBytes)
}

/**
 * Feeds one client stream from the store: history after the client's
 * position, then live notices. The subscription starts before the first read,
 * so nothing appended in between is missed; contiguous sequence numbers tell
 * whether a notice continues what was written or a read must fill a hole.
 */
export class StreamFollower {
  readonly #o: FollowOptions
  #unsubscribe: (() => void) | undefined
  #reading = false
  #dirty = false
  #stopped = false
  /** Events that notices carried while a read was in flight: written after it when they continue it. */
  #held: StoredEvent[] = []
  #heldEnd: number | undefined

  constructor (options: FollowOptions) {
    this.#o = options
  }

  /** Replay history, then stay subscribed. Resolves when caught up (live). */
  async start (): Promise<void> {
    const { store, client, sessionId } = this.#o
    // A client gone already: its onClose would never come to unsubscribe.
    if (client.closed) return
    this.#unsubscribe = store.subscribe(sessionId, client.streamId, notice => this.#onNotice(notice))
    client.onClose(() => this.stop())
    await this.#catchUp('replay')
  }

  stop (): void {
    this.#stopped = true
    this.#unsubscribe?.()
    this.#unsubscribe = undefined
  }

  #onNotice (notice: StreamNotice): void {
    const { client } = this.#o
    if (this.#stopped || client.closed) return
    if (notice.epoch !== undefined && notice.epoch !== client.epoch) {
      this.#epochChanged()
      return
    }
    if (this.#reading) {
      // Keep what the notice carries rather than read it back (bounded; beyond, read).
      if (notice.events !== undefined && this.#held.length + notice.events.length <= HELD_MAX) {
        for (const e of notice.events) this.#held.push(e)
        if (notice.ended) this.#heldEnd = notice.toSeq
      } else {
        this.#dirty = true
      }
      return
    }
    // A local notice's batch is written as it is, without an object per event.
    const events = notice.batch ?? notice.events
    const first = events instanceof NumberedBatch ? (events.length > 0 ? events.firstSeq : undefined) : events?.[0]?.seq
    if (events !== undefined && (first === undefined || first <= client.lastSeq + 1)) {
      client.writeEvents(events)
    } else if (notice.toSeq > client.lastSeq) {
      this.#catchUp('fill').catch(() => {}) // #catchUp handles its own errors
      return
    }
    if (notice.ended && this.#o.untilEnded && client.lastSeq >= notice.toSeq) {
      this.stop()
      client.end('completed')
    }
  }

  /** Write the held events that continue the client's position; a hole means a read. */
  #applyHeld (): void {
    const { client } = this.#o
    const held = this.#held
    this.#held = []
    this.#heldEnd = undefined
    let next = client.lastSeq + 1
    let run = 0
    for (const e of held) {
      if (e.seq < next) continue
      if (e.seq !== next) {
        this.#dirty = true
        break
      }
      held[run++] = e
      next++
    }
    if (run > 0) client.writeEvents(held.slice(0, run))
  }

  /** The store lost this stream's history and started a new epoch: the client resumes and is told of the gap. */
  #epochChanged (): void {
    this.stop()
    this.#o.log.warn({ streamId: this.#o.client.streamId }, 'the store started a new epoch: closing the client so its resume is told of the gap')
    this.#o.client.close('upstream_error')
  }

  /**
   * Read the stream after the client's position and write it: `replay` the
   * history when the client starts, or `fill` a hole between what it has and
   * a notice.
   */
  async #catchUp (reading: 'replay' | 'fill'): Promise<void> {
    const { store, client, sessionId, pageSize, metrics, log } = this.#o
    this.#reading = true
    let pageBytes = this.#o.pageBytes
    try {
      for (;;) {
        this.#dirty = false
        if (this.#stopped || client.closed) return
        const result = await metrics.timeStore('read', () => store.read(sessionId, client.streamId, client.lastSeq, pageSize, pageBytes))
        if (this.#stopped || client.closed) return
        if (result === null) {
          // The session was deleted or expired while the client was attached.
          this.stop()
          client.end('session_deleted')
          return
        }
        const { state } = result
        if (state.epoch !== client.epoch) {
          this.#epochChanged()
          return
        }
        // Written once the last page has gone out (this one was read meanwhile):
        // at most a page waits in the connection, and one here.
        await client.drained()
        if (this.#stopped || client.closed) return
        if (client.lastSeq + 1 < state.firstSeq && state.lastSeq > client.lastSeq) {
          // Retention overtook this client mid-replay: say so, never skip silently.
          metrics.countGap('trimmed')
          log.warn({ streamId: client.streamId, from: client.lastSeq + 1, to: state.firstSeq - 1 }, 'gap: events trimmed before the client read them')
          client.writeGap({ reason: 'trimmed', streamId: client.streamId, missingFrom: client.lastSeq + 1, missingTo: state.firstSeq - 1 })
        }
        const got = writePage(client, result, reading === 'replay')
        if (client.closed) return
        if (got > 0 && client.lastSeq < state.lastSeq) {
          // A page that did not reach the end: the next is larger (and read while this one goes out).
          pageBytes = nextPageBytes(pageBytes, this.#o.pageMaxBytes)
          continue
        }
        const ended = state.ended || (this.#heldEnd !== undefined)
        const endSeq = Math.max(state.lastSeq, this.#heldEnd ?? 0)
        this.#applyHeld()
        if (client.closed) return
        if (ended && this.#o.untilEnded && client.lastSeq >= endSeq) {
          this.stop()
          client.end('completed')
          return
        }
        if (!this.#dirty) return
      }
    } catch (err) {
      log.error({ err, streamId: client.streamId }, 'store read failed while following a stream: closing the client, it will resume')
      this.stop()
      client.close('upstream_error')
    } finally {
      this.#reading = false
    }
  }
}
