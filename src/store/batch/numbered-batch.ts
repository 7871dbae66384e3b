import type { StoredEvent } from '../events.js'
import type { EventBatch } from './event-batch.js'

/**
 * A batch as a store took it: its events are numbered from `firstSeq`. The
 * event objects are made only when asked for (`events`): a listener that
 * writes the batch out reads `batch` directly, without an object per event.
 */
export class NumberedBatch {
  readonly batch: EventBatch
  readonly firstSeq: number
  #events: StoredEvent[] | undefined

  constructor (batch: EventBatch, firstSeq: number) {
    this.batch = batch
    this.firstSeq = firstSeq
  }

  get length (): number { return this.batch.length }
  /** Sequence number of the last event (firstSeq - 1 when there is none). */
  get lastSeq (): number { return this.firstSeq + this.batch.length - 1 }
  /** The events; frames are views of the batch's bytes. Made once, shared by every caller: do not change it. */
  get events (): readonly StoredEvent[] {
    this.#events ??= this.batch.stored(this.firstSeq)
    return this.#events
  }
}
