import type { Readable } from 'node:stream'
import type { FastifyBaseLogger as Logger } from 'fastify'
import { EventTooLargeError, LeaseLostError, SessionGoneError } from '../errors.js'
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
  /**
   * Request streams: the JSON-RPC error to record as the stream's last event
   * when the upstream answer breaks off before its response, so live and
   * resuming clients alike get an answer instead of waiting for a timeout.
   */
  readonly failureResponse?: (reason: RecordOutcome) => string | undefined
  /** The JSON-RPC id the request stream answers: an answer that ends without its response is repaired. */
  readonly requestId?: string | number | undefined
  /** The stream's lease token (the standalone stream): appends are fenced with it, see AppendOptions. */
  readonly fence?: string
}

/** Cheap pre-check, then a parse: is this event the JSON-RPC response to `id`? */
function isResponseTo (data: string, id: string | number): boolean {
  if (!data.includes('"id"') || (!data.includes('"result"') && !data.includes('"error"'))) return false
  try {
    const message = JSON.parse(data) as { id?: unknown, result?: unknown, error?: unknown }
    return message.id === id && (message.result !== undefined || message.error !== undefined)
  } catch {
    return false
  }
}

/** Event type of gap markers stored in a stream (the SSE gap notices use the same type). */
export const GAP_MARKER_EVENT = 'gateway-gap'

export type RecordOutcome = 'completed' | 'upstream_error' | 'session_gone' | 'aborted' | 'event_too_large' | 'lease_lost'

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
  let sawResponse = o.requestId === undefined
  const append = async (events: UpstreamEvent[], end: boolean): Promise<void> => {
    if (events.length === 0 && !end) return
    const inputs = events.map(toInput)
    if (!sawResponse) {
      for (const e of inputs) if (isResponseTo(e.data, o.requestId as string | number)) sawResponse = true
      if (end && !sawResponse) {
        // The upstream ended its answer without the response: record an error answer in its place.
        const data = o.failureResponse?.('upstream_error')
        if (data !== undefined) {
          inputs.push({ data })
          o.log.warn({ streamId: o.streamId }, 'upstream answer ended without its response: recorded an error answer')
        }
      }
    }
    const batch = unrecorded === 0
      ? inputs
      : [{ event: GAP_MARKER_EVENT, data: JSON.stringify({ reason: 'store_unavailable', unrecorded }) }, ...inputs]
    try {
      await o.metrics.timeStore('append', () => o.store.append(o.sessionId, o.streamId, batch, { end, ...(o.fence !== undefined && { fence: o.fence }) }))
    } catch (err) {
      if (err instanceof SessionGoneError || err instanceof LeaseLostError) throw err
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
    } else if (err instanceof LeaseLostError) {
      // Fencing: another replica holds this stream now; stop at once.
      outcome = 'lease_lost'
      o.log.warn({ streamId: o.streamId }, 'stream lease lost to another replica: stopped recording')
    } else if (err instanceof EventTooLargeError) {
      outcome = 'event_too_large'
      // What came complete before the oversized event is recorded all the same.
      await append([...err.completed], false).catch(() => {})
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
      // Nothing more can arrive: mark the end so resuming clients are not left waiting,
      // with an error answer for the request when one is known (gap repair).
      const data = outcome === 'aborted' ? undefined : o.failureResponse?.(outcome)
      const closing = data === undefined
        ? o.store.end(o.sessionId, o.streamId)
        : o.store.append(o.sessionId, o.streamId, [{ data }], { end: true })
      await closing.catch((err: unknown) => o.log.warn({ err, streamId: o.streamId }, 'could not mark the broken stream ended'))
    }
  }
  return outcome
}
