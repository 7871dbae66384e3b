// The events a store keeps, apart from the store contract (contract.ts) so
// that the packed form (batch/) and the decoder's errors can name them
// without importing the contract.

/**
 * One server-to-client event, in one of two forms. Upstream events are kept as
 * the bytes the upstream sent (FrameEvent): the gateway never parses or
 * re-serialises their data. Events the gateway makes itself (gap markers,
 * error answers) are TextEvents. Stores keep either form and give it back as
 * it was appended.
 */
export type EventInput = TextEvent | FrameEvent

export interface TextEvent {
  /** The SSE `data` field (lines joined with \n). */
  readonly data: string
  /** The SSE `event` field, when set. */
  readonly event?: string | undefined
  /** The upstream's own event id, kept so the upstream stream can be resumed. */
  readonly upstreamId?: string | undefined
  readonly frame?: undefined
}

export interface FrameEvent {
  /**
   * The event's SSE field lines exactly as the upstream sent them, each with
   * its line break, without the blank line that ended the event (see
   * sse/decoder.ts). Clients get these bytes followed by the gateway's id line.
   */
  readonly frame: Buffer
  readonly upstreamId?: string | undefined
  readonly data?: undefined
  readonly event?: undefined
}

export type StoredEvent = EventInput & { readonly seq: number }
