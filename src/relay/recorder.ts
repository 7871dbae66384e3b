import type { Readable } from 'node:stream'
import type { FastifyBaseLogger as Logger } from 'fastify'
import { EventTooLargeError, SessionGoneError } from '../errors.js'
import type { EventInput, EventStore } from '../store/contract.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import { SseDecoder, type UpstreamEvent } from '../sse/decoder.js'

export interface RecordOptions {
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly sessionId: string
  readonly streamId: string
  readonly body: Readable
  readonly maxEventBytes: number
  /** Request streams end with their upstream answer; the standalone stream outlives one upstream GET. */
  readonly endStreamOnFinish: boolean
  /** Called with each upstream event id, so an upstream GET can be resumed upstream. */
  readonly onUpstreamId?: (id: string) => void
  /**
   * Degraded mode: events the store refused are handed here so a client
   * attached to this process still gets them live (without an id: they cannot
   * be replayed). Once the store answers again a gap marker is recorded first,
   * so clients resuming across the outage are told.
   */
  readonly onUnrecorded?: (events: readonly EventInput[]) => void
}

/** Event type of gap markers stored in a stream (the SSE gap notices use the same type). */
export const GAP_MARKER_EVENT = 'gateway-gap'

export type RecordOutcome = 'completed' | 'upstream_error' | 'session_gone' | 'aborted' | 'event_too_large'

function toInput (e: UpstreamEvent): EventInput {
  return { data: e.data, event: e.event, upstreamId: e.id }
}

/**
 * Reads an upstream SSE answer to its end and appends every event to the
 * store: one append (one Redis round trip) per upstream read, however many
 * events it carried. Clients never get events from here: they follow the
 * store, so every event is stored before any client sees it. A client going
 * away does not stop this (in the legacy era disconnect is not cancellation).
 */
export async function recordUpstreamStream (o: RecordOptions): Promise<RecordOutcome> {
  const decoder = new SseDecoder(o.maxEventBytes)
  let outcome: RecordOutcome = 'completed'
  let unrecorded = 0
  const append = async (events: UpstreamEvent[], end: boolean): Promise<void> => {
    if (events.length === 0 && !end) return
    const inputs = events.map(toInput)
    const batch = unrecorded === 0
      ? inputs
      : [{ event: GAP_MARKER_EVENT, data: JSON.stringify({ reason: 'store_unavailable', unrecorded }) }, ...inputs]
    try {
      await o.metrics.timeStore('append', () => o.store.append(o.sessionId, o.streamId, batch, { end }))
    } catch (err) {
      if (err instanceof SessionGoneError) throw err
      // The store failed: these events cannot be replayed. Reading goes on so
      // the upstream is never stalled; live clients here still get them.
      unrecorded += inputs.length
      o.metrics.eventsUnrecorded.inc({ reason: 'store_error' }, inputs.length)
      o.log.error({ err, streamId: o.streamId, events: inputs.length }, 'event store append failed: events passed on unrecorded')
      if (inputs.length > 0) o.onUnrecorded?.(inputs)
      return
    }
    if (unrecorded > 0) {
      o.metrics.gaps.inc({ reason: 'store_unavailable' })
      o.log.warn({ streamId: o.streamId, unrecorded }, 'event store back: gap marker recorded for the events it missed')
      unrecorded = 0
    }
    if (inputs.length > 0) {
      o.metrics.eventsRecorded.inc(inputs.length)
      let bytes = 0
      for (const e of inputs) bytes += e.data.length
      o.metrics.eventBytesRecorded.inc(bytes)
      const last = events[events.length - 1]?.id
      if (last !== undefined && last !== '' && o.onUpstreamId !== undefined) o.onUpstreamId(last)
    }
  }

  try {
    for await (const chunk of o.body) {
      await append(decoder.push(chunk as Buffer), false)
    }
    await append(decoder.end(), o.endStreamOnFinish)
  } catch (err) {
    if (err instanceof SessionGoneError) {
      outcome = 'session_gone'
      o.log.info({ streamId: o.streamId }, 'session records gone: stopped recording its stream')
    } else if (err instanceof EventTooLargeError) {
      outcome = 'event_too_large'
      o.metrics.eventsUnrecorded.inc({ reason: 'too_large' })
      o.log.error({ streamId: o.streamId, err }, 'upstream event too large: stream closed')
    } else if ((err as Error).name === 'AbortError' || (err as NodeJS.ErrnoException).code === 'UND_ERR_ABORTED') {
      outcome = 'aborted'
    } else {
      outcome = 'upstream_error'
      o.metrics.upstreamErrors.inc({ kind: 'stream_broken' })
      o.log.warn({ err, streamId: o.streamId }, 'upstream SSE answer broke off')
    }
    o.body.destroy()
    if (o.endStreamOnFinish && outcome !== 'session_gone') {
      // Nothing more can arrive: mark the end so resuming clients are not left waiting.
      await o.store.end(o.sessionId, o.streamId).catch(() => {})
    }
  }
  return outcome
}
