/**
 * Why history could not fill a resume, the closed set: the `reason` of a
 * `gateway-gap` event and of mcpgw_gaps_total (docs/resumption.md and
 * docs/observability.md describe each).
 */
export const GAP_REASONS = ['trimmed', 'epoch', 'unknown_stream', 'future_id', 'recorder_lost', 'event_too_large', 'store_unavailable', 'upstream_handover'] as const

export type GapReason = typeof GAP_REASONS[number]

/**
 * What a `gateway-gap` event says, by reason: the stream a client reads it
 * on, the range retention took, the size limit an event went past, or how
 * many events went unrecorded.
 */
export type GapNotice =
  | { readonly reason: 'trimmed', readonly streamId: string, readonly missingFrom: number, readonly missingTo: number }
  | { readonly reason: 'epoch' | 'unknown_stream' | 'future_id' | 'recorder_lost' | 'upstream_handover', readonly streamId: string }
  | { readonly reason: 'event_too_large', readonly limit: number }
  | { readonly reason: 'store_unavailable', readonly unrecorded: number }

/** A notice for every reason of the closed set, and no other: the build breaks when the two part. */
type SameSet<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false
export const NOTICES_COVER_REASONS: SameSet<GapNotice['reason'], GapReason> = true
