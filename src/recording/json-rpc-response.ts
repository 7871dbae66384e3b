import type { EventBatch } from '../store/batch/event-batch.js'
import type { EventInput } from '../store/contract.js'
import { parseFrame } from '../sse/frame.js'

/** Cheap pre-check on the bytes, then a parse: is this event the JSON-RPC response to `id`? */
export function isResponseTo (e: EventInput, id: string | number): boolean {
  const raw = e.frame ?? e.data
  if (!raw.includes('"id"') || (!raw.includes('"result"') && !raw.includes('"error"'))) return false
  const data = e.frame === undefined ? e.data : parseFrame(e.frame)?.data
  if (data === undefined) return false
  try {
    const message = JSON.parse(data) as { id?: unknown, result?: unknown, error?: unknown }
    return message.id === id && (message.result !== undefined || message.error !== undefined)
  } catch {
    return false
  }
}

/**
 * Is this event a JSON-RPC result as the official SDK client reads one (one
 * message, version 2.0, a string or integer id, an object result, no other
 * member): the one answer after which it stops reconnecting a resumed request
 * stream. Anything it would not take for one counts as no result.
 */
export function isResultEvent (e: EventInput): boolean {
  const parsed = e.frame === undefined ? { data: e.data, event: e.event } : parseFrame(e.frame)
  if (parsed === undefined || (parsed.event !== undefined && parsed.event !== 'message')) return false
  let message: unknown
  try {
    message = JSON.parse(parsed.data)
  } catch {
    return false
  }
  if (typeof message !== 'object' || message === null || Array.isArray(message)) return false
  const { jsonrpc, id, result } = message as Record<string, unknown>
  return jsonrpc === '2.0' && (typeof id === 'string' || Number.isInteger(id)) &&
    typeof result === 'object' && result !== null && !Array.isArray(result) &&
    Object.keys(message).every(key => key === 'jsonrpc' || key === 'id' || key === 'result')
}

/** Does the batch hold the JSON-RPC response to `id`? Most hold none, which one look at their bytes tells. */
export function respondsTo (batch: EventBatch, id: string | number): boolean {
  if (!batch.includes('"id"') || (!batch.includes('"result"') && !batch.includes('"error"'))) return false
  return batch.toArray().some(e => isResponseTo(e, id))
}
