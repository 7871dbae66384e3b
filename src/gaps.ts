/**
 * Why history could not fill a resume, the closed set: the `reason` of a
 * `gateway-gap` event and of mcpgw_gaps_total (docs/resumption.md and
 * docs/observability.md describe each).
 */
export const GAP_REASONS = ['trimmed', 'epoch', 'unknown_stream', 'future_id', 'recorder_lost', 'event_too_large', 'store_unavailable', 'upstream_handover'] as const

export type GapReason = typeof GAP_REASONS[number]

/** What a `gateway-gap` event says: its reason, and what the reason tells (stream, range, limit...). */
export type GapNotice = { readonly reason: GapReason } & Readonly<Record<string, unknown>>
