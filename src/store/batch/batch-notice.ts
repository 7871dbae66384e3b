import type { StoredEvent } from '../events.js'
import type { NumberedBatch } from './numbered-batch.js'

/** A local notice's batch or events were read after its listener returned: the listener broke the rule of StreamNotice.batch. */
export class NoticeSpentError extends Error {
  constructor (streamId: string) {
    super(`the batch of a notice of stream ${streamId} was read after its listener returned: take \`events\` during the call to keep them`)
    this.name = 'NoticeSpentError'
  }
}

/**
 * The notice a store gives its local listeners after an append: the events
 * are the batch's, made on first use. Once every listener has returned, the
 * store spends it (its builder may fill the same bytes with the next batch),
 * and reading `batch` or `events` from it then throws.
 */
export class BatchNotice {
  readonly streamId: string
  readonly toSeq: number
  readonly ended: boolean
  readonly epoch: string | undefined
  readonly #batch: NumberedBatch
  #spent = false

  constructor (streamId: string, toSeq: number, ended: boolean, batch: NumberedBatch, epoch?: string) {
    this.streamId = streamId
    this.toSeq = toSeq
    this.ended = ended
    this.#batch = batch
    this.epoch = epoch
  }

  get batch (): NumberedBatch {
    if (this.#spent) throw new NoticeSpentError(this.streamId)
    return this.#batch
  }

  get events (): readonly StoredEvent[] { return this.batch.events }

  /** The store's, once the notice was told to every listener. */
  spend (): void {
    this.#spent = true
  }
}
