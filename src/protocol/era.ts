/**
 * Protocol era of a request, from its MCP-Protocol-Version header.
 *
 * Revisions 2025-03-26 .. 2025-11-25 have sessions, the standalone GET stream
 * and Last-Event-ID resumability ("legacy" here). Revision 2026-07-28 removed
 * them and made closing a response stream mean cancellation ("modern"): the
 * gateway is then a transparent streaming proxy.
 */

/** Transports spec: a request without the header is assumed to speak 2025-03-26. */
export const DEFAULT_PROTOCOL_VERSION = '2025-03-26'
/** From this revision on, servers send a priming event (an id, empty data) first. */
export const PRIMING_SINCE = '2025-11-25'
/** From this revision on there is no resumability: disconnect means cancel. */
export const MODERN_SINCE = '2026-07-28'

export type Era = 'legacy' | 'modern'

export interface ProtocolInfo {
  readonly version: string
  readonly era: Era
  /** The client expects a priming event at the start of every stream. */
  readonly priming: boolean
}

const VERSION_PATTERN = /^\d{4}-\d{2}-\d{2}$/

/**
 * Returns null for a header that is not a protocol revision (malformed); the
 * caller answers 400. Revisions are dates, so they compare as strings.
 */
export function protocolInfo (header: string | string[] | undefined): ProtocolInfo | null {
  if (Array.isArray(header)) return null
  const version = header === undefined || header === '' ? DEFAULT_PROTOCOL_VERSION : header.trim()
  if (!VERSION_PATTERN.test(version)) return null
  return {
    version,
    era: version >= MODERN_SINCE ? 'modern' : 'legacy',
    priming: version >= PRIMING_SINCE
  }
}
