/**
 * Reads an upstream answer up to the JSON-RPC response to one request, when
 * the gateway needs that response before passing the answer on (the result of
 * an initialize, which the session's recipe keeps). A JSON body is read whole;
 * an SSE body event by event until the response. Bounded: past `maxBytes`
 * without the response, reading stops and nothing is found. The answer's
 * bytes are never lost: `body` gives what was read, then the rest.
 */
import { PassThrough, pipeline, type Readable } from 'node:stream'
import { createParser } from 'eventsource-parser'

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

export async function readJsonRpcAnswer (body: Readable, kind: 'json' | 'sse', id: string | number, maxBytes: number): Promise<JsonRpcAnswer> {
  const chunks: Buffer[] = []
  let bytes = 0
  let response: JsonRpcResponse | undefined
  const parser = createParser({
    onEvent: event => { response ??= responseTo(event.data, id) }
  })
  const ended = await new Promise<boolean>((resolve, reject) => {
    const done = (end: boolean): void => {
      body.off('data', onData)
      body.off('end', onEnd)
      body.off('error', onError)
      if (!end) body.pause()
      resolve(end)
    }
    const onData = (chunk: Buffer): void => {
      chunks.push(chunk)
      bytes += chunk.length
      if (kind === 'sse') parser.feed(chunk.toString('utf8'))
      if (response !== undefined || bytes > maxBytes) done(false)
    }
    const onEnd = (): void => done(true)
    const onError = (err: Error): void => {
      body.off('data', onData)
      body.off('end', onEnd)
      reject(err)
    }
    body.on('data', onData)
    body.on('end', onEnd)
    body.on('error', onError)
  })
  if (kind === 'json' && ended && bytes <= maxBytes) response = responseTo(Buffer.concat(chunks).toString('utf8'), id)
  const rest = new PassThrough()
  for (const chunk of chunks) rest.write(chunk)
  if (ended) rest.end()
  // Whoever drops the answer (destroys `rest`) drops the upstream's body too.
  else pipeline(body, rest, () => {})
  return { response, body: rest }
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
