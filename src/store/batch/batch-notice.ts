import type { StoredEvent } from '../events.js'
import type { NumberedBatch } from './numbered-batch.js'

/** The notice a store gives its local listeners after an append: the events are the batch's, made on first use. */
export class BatchNotice {
  readonly streamId: string
  readonly toSeq: number
  readonly ended: boolean
  readonly batch: NumberedBatch
  readonly epoch: string | undefined

  constructor (streamId: string, toSeq: number, ended: boolean, batch: NumberedBatch, epoch?: string) {
    this.streamId = streamId
    this.toSeq = toSeq
    this.ended = ended
    this.batch = batch
    this.epoch = epoch
  }

  get events (): readonly StoredEvent[] { return this.batch.events }
}
