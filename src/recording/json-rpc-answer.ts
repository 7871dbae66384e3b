/**
 * Reads an upstream answer up to the JSON-RPC response to one request, when
 * the gateway needs that response before passing the answer on (the result of
 * an initialize, which the session's recipe keeps). A JSON body is read whole;
 * an SSE body event by event until the response. Bounded: past `maxBytes`
 * without the response, reading stops and nothing is found. The answer's
 * bytes are never lost: `body` gives what was read, then the rest.
 */
import type { Readable } from 'node:stream'
import { SseDecoder } from '../sse/decoder.js'
import { parseFrame } from '../sse/frame.js'
import { readAnswerStart } from '../upstream/answer-start.js'

export interface JsonRpcAnswer {
  /** The response (result or error) to the request, when found within the bound. */
  readonly response: JsonRpcResponse | undefined
  /** The whole answer as the upstream sent it: the bytes read, then the rest. */
  readonly body: Readable
}

export interface JsonRpcResponse {
  readonly id: string | number
  readonly result?: unknown
  readonly error?: unknown
}

/** `maxWaitMs`: as readAnswerStart's (past it, nothing is found). */
export async function readJsonRpcAnswer (body: Readable, kind: 'json' | 'sse', id: string | number, maxBytes: number, maxWaitMs?: number): Promise<JsonRpcAnswer> {
  let response: JsonRpcResponse | undefined
  // The gateway's own decoder splits the events (in one pass, whatever their lines); each
  // event's data is parsed as a client would. An event past the bound ends the search.
  const decoder = new SseDecoder(maxBytes)
  let unreadable = false
  const start = await readAnswerStart(body, maxBytes, chunk => {
    if (kind === 'sse' && !unreadable) {
      try {
        for (const event of decoder.push(chunk)) {
          const data = parseFrame(event.frame)?.data
          if (data !== undefined) response ??= responseTo(data, id)
        }
      } catch {
        unreadable = true
      }
    }
    return response !== undefined || unreadable
  }, maxWaitMs)
  if (kind === 'json' && start.ended) response = responseTo(Buffer.concat(start.chunks).toString('utf8'), id)
  return { response, body: start.body }
}

/** The JSON-RPC response to `id` in `data`, if it is one. */
function responseTo (data: string, id: string | number): JsonRpcResponse | undefined {
  try {
    const message = JSON.parse(data) as unknown
    if (message === null || typeof message !== 'object' || Array.isArray(message)) return undefined
    const m = message as { id?: unknown, result?: unknown, error?: unknown }
    return m.id === id && (m.result !== undefined || m.error !== undefined) ? m as JsonRpcResponse : undefined
  } catch {
    return undefined
  }
}
