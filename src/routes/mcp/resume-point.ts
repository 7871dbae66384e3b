/**
 * Where a resume starts, and what the client is told when history cannot
 * fill it: decisions on the store's answer alone, without I/O.
 */
import type { EventPosition } from '../../protocol/event-id.js'
import type { SessionRecord, StreamState } from '../../store/contract.js'
import type { GapNotice, GapReason } from '../../gaps.js'

/** Why a request stream's whole history is gone: its request is answered with a lost response's error. */
export type HistoryGone = Extract<GapReason, 'epoch' | 'unknown_stream'>

/** How a lost response's JSON-RPC error says why, by gap reason. */
export const LOST_PHRASES: Readonly<Record<HistoryGone, string>> = {
  epoch: 'the event store lost this stream\'s history',
  unknown_stream: 'the gateway no longer has this stream\'s history'
}

/** What a resume's start tells the client is missing (the notice, without the stream the client reads it on). */
export type Gap =
  | { readonly reason: 'trimmed', readonly missingFrom: number, readonly missingTo: number }
  | { readonly reason: 'epoch' | 'future_id' }

/** The notice a client reading `streamId` gets for `gap`. */
export function gapNotice (gap: Gap, streamId: string): GapNotice {
  return { ...gap, streamId }
}

/** Replay what comes after `after`; `gap`: what the client is told is missing first. */
export interface StartPoint { readonly after: number, readonly gap?: Gap }

/**
 * The start of a stream's replay. `position` null: a standalone stream
 * opened without a Last-Event-ID, which gets what was recorded since the
 * session's last connection stopped (`cursor`), within what is retained.
 */
export function resumePoint (state: StreamState, position: EventPosition | null, record: SessionRecord, cursor: number): StartPoint {
  if (position === null) return { after: Math.min(Math.max(cursor, state.firstSeq - 1), state.lastSeq) }
  if (position.epoch !== state.epoch || position.epoch !== record.epoch) {
    // The store lost the history this id points into: replay what the new epoch holds.
    return { after: state.firstSeq - 1, gap: { reason: 'epoch' } }
  }
  if (position.seq > state.lastSeq) return { after: state.lastSeq, gap: { reason: 'future_id' } }
  if (position.seq + 1 < state.firstSeq) {
    return { after: state.firstSeq - 1, gap: { reason: 'trimmed', missingFrom: position.seq + 1, missingTo: state.firstSeq - 1 } }
  }
  return { after: position.seq }
}

/**
 * The position a request stream's resume replays from. Past the end of a
 * finished stream it steps back one event, so the last one (the response)
 * comes once more: a GET is answered with an SSE stream or 405 (transports
 * spec), and an SDK client resuming with a saved token reconnects until a
 * result arrives (resume.ts's answerAgain ends the stream after a result and
 * holds it open after anything else).
 */
export function requestResumePosition (state: StreamState | null, position: EventPosition): EventPosition {
  if (state !== null && state.epoch === position.epoch && state.ended && position.seq === state.lastSeq && position.seq > 0) {
    return { ...position, seq: position.seq - 1 }
  }
  return position
}
