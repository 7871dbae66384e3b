/**
 * The gap markers the recorders store in a stream, where events are missing,
 * so that every client reading across the gap is told (never a silent skip).
 */
import type { GapNotice } from '../gaps.js'
import type { TextEvent } from '../store/contract.js'
import { GAP_EVENT } from '../sse/frame.js'

function gapMarker (notice: GapNotice): TextEvent {
  return { event: GAP_EVENT, data: JSON.stringify(notice) }
}

/** The store refused appends: `unrecorded` events were passed on live only, and cannot be replayed. */
export function storeUnavailableGap (unrecorded: number): TextEvent {
  return gapMarker({ reason: 'store_unavailable', unrecorded })
}

/** What a client replaying a new epoch reads first: what came before is gone with the old one. */
export function epochGap (streamId: string): TextEvent {
  return gapMarker({ reason: 'epoch', streamId })
}

/** An upstream event over `limit` bytes: the rest of the answer was cut off. */
export function eventTooLargeGap (limit: number): TextEvent {
  return gapMarker({ reason: 'event_too_large', limit })
}

/** A request stream whose recorder died before its answer: what the stream held last is all there is. */
export function recorderLostGap (streamId: string): TextEvent {
  return gapMarker({ reason: 'recorder_lost', streamId })
}

/** The stream changed holder without the upstream resuming it: what the upstream sent in between is unknown. */
export function upstreamHandoverGap (streamId: string): TextEvent {
  return gapMarker({ reason: 'upstream_handover', streamId })
}
