import type { StoredEvent } from '../events.js'
import type { StreamState } from '../contract.js'
import type { NumberedBatch } from './numbered-batch.js'

/**
 * A page of a read, as a store that keeps batches answers it: the batches
 * (or parts of them) in order, their event objects made only when asked for.
 */
export class ReadPage {
  readonly batches: readonly NumberedBatch[]
  readonly state: StreamState
  #events: StoredEvent[] | undefined

  constructor (batches: readonly NumberedBatch[], state: StreamState) {
    this.batches = batches
    this.state = state
  }

  get events (): StoredEvent[] {
    if (this.#events === undefined) {
      const events: StoredEvent[] = []
      for (const batch of this.batches) for (const e of batch.events) events.push(e)
      this.#events = events
    }
    return this.#events
  }
}
