/**
 * Request stream ids carry the JSON-RPC id of the request they answer, so the
 * gateway can answer for a lost response from the Last-Event-ID alone, even
 * when the store no longer knows the stream (gap repair).
 *
 *   <8 random [0-9a-z]><kind><payload>
 *   kind n: payload is a non-negative integer id in base 36
 *   kind s: payload is a short string id, its UTF-8 bytes in hex (at most 11 bytes)
 *   kind x: no usable id (batch, long string, negative or fractional number); 3 random chars
 */

export type JsonRpcId = string | number

/** 22 hex characters: the stream id (8 + 1 + 22) fits the 32 characters an event id gives it (event-id.ts). */
const MAX_STRING_ID_BYTES = 11

export function makeRequestStreamId (random8: string, random3: string, requestId: JsonRpcId | undefined): string {
  if (typeof requestId === 'number' && Number.isSafeInteger(requestId) && requestId >= 0) {
    return `${random8}n${requestId.toString(36)}`
  }
  if (typeof requestId === 'string') {
    const bytes = Buffer.from(requestId, 'utf8')
    if (bytes.length <= MAX_STRING_ID_BYTES) return `${random8}s${bytes.toString('hex')}`
  }
  return `${random8}x${random3}`
}

/** The JSON-RPC id a request stream id carries, or undefined. */
export function requestIdOfStream (streamId: string): JsonRpcId | undefined {
  if (streamId.length < 10) return undefined
  const kind = streamId[8]
  const payload = streamId.slice(9)
  if (kind === 'n') {
    const n = Number.parseInt(payload, 36)
    return Number.isSafeInteger(n) && n.toString(36) === payload ? n : undefined
  }
  if (kind === 's' && /^(?:[0-9a-f]{2})*$/.test(payload)) {
    const text = Buffer.from(payload, 'hex').toString('utf8')
    // Only ids that round-trip exactly (valid UTF-8) are trusted.
    return Buffer.from(text, 'utf8').toString('hex') === payload ? text : undefined
  }
  return undefined
}

/**
 * The id of a single JSON-RPC request in a POST body, or undefined (a
 * notification, a response, a batch or unparseable JSON).
 */
export function requestIdOfBody (body: Buffer | undefined): JsonRpcId | undefined {
  if (body === undefined || body.length === 0) return undefined
  try {
    const message = JSON.parse(body.toString('utf8')) as unknown
    if (message === null || typeof message !== 'object' || Array.isArray(message)) return undefined
    const { id, method } = message as { id?: unknown, method?: unknown }
    if (typeof method !== 'string') return undefined
    return typeof id === 'string' || typeof id === 'number' ? id : undefined
  } catch {
    return undefined
  }
}

/** Sequence number of a synthesized (repair) event's id: resuming from it means "nothing more". */
export const REPAIRED_SEQ = Number.MAX_SAFE_INTEGER

/**
 * The JSON-RPC error the gateway answers with when a request's response was
 * lost: the client's call fails fast instead of waiting for its timeout.
 */
export function lostResponseError (requestId: JsonRpcId, reason: string): string {
  return JSON.stringify({
    jsonrpc: '2.0',
    id: requestId,
    error: { code: -32000, message: `MCP gateway: the response to this request was lost (${reason}); retry the request`, data: { reason } }
  })
}
