import { createParser, type EventSourceMessage, type EventSourceParser } from 'eventsource-parser'
import { EventTooLargeError } from '../errors.js'

export interface UpstreamEvent {
  readonly data: string
  readonly event?: string | undefined
  readonly id?: string | undefined
}

/** Room for field names and line breaks around an event's data in the pending bound. */
const FIELD_SLACK_BYTES = 4096

/** The last blank line (end of an event or comment block) in `text`, as the index just past it. */
function lastBoundary (text: string): number {
  let best = -1
  for (const terminator of ['\n\n', '\r\n\r\n', '\r\r', '\n\r\n']) {
    const at = text.lastIndexOf(terminator)
    if (at !== -1 && at + terminator.length > best) best = at + terminator.length
  }
  return best
}

/**
 * Turns the upstream's SSE bytes into events, one batch per read, so a batch
 * can be stored in one round trip. Parsing is eventsource-parser's; this adds
 * UTF-8 decoding across chunk boundaries and a bound on one event's size in
 * bytes (an upstream that never ends an event must not grow memory without
 * limit). Comments and keep-alives never count against the bound.
 */
export class SseDecoder {
  readonly #parser: EventSourceParser
  readonly #decoder = new TextDecoder('utf-8')
  readonly #maxEventBytes: number
  #batch: UpstreamEvent[] = []
  /** Bytes received since the last blank line: the size of the block being assembled. */
  #pendingBytes = 0
  #retry: number | undefined
  #tooLarge = false
  #endsWithCr = false

  constructor (maxEventBytes: number) {
    this.#maxEventBytes = maxEventBytes
    this.#parser = createParser({
      onEvent: (message: EventSourceMessage) => {
        if (this.#tooLarge) return
        if (Buffer.byteLength(message.data) > this.#maxEventBytes) {
          this.#tooLarge = true
          return
        }
        this.#batch.push({ data: message.data, event: message.event, id: message.id })
      },
      onRetry: (ms: number) => { this.#retry = ms }
    })
  }

  /** The upstream's own retry hint, if it sent one. */
  get retry (): number | undefined { return this.#retry }

  /**
   * Feed one chunk; returns the events it completed (possibly none). Throws
   * EventTooLargeError when an event exceeds the bound; the error carries the
   * complete events that came before it, which are still to be recorded.
   */
  push (chunk: Uint8Array): UpstreamEvent[] {
    const text = this.#decoder.decode(chunk, { stream: true })
    if (text.length > 0) this.#endsWithCr = text.endsWith('\r')
    this.#parser.feed(text)
    const boundary = lastBoundary(text)
    this.#pendingBytes = boundary === -1 ? this.#pendingBytes + chunk.byteLength : Buffer.byteLength(text.slice(boundary))
    return this.#take()
  }

  /** End of the upstream body: an unterminated last event is discarded, as the SSE spec says. */
  end (): UpstreamEvent[] {
    // A final CR is held by the parser in case LF follows; completing it lets a
    // CR-terminated last event through, while an unfinished event stays unfinished.
    const rest = this.#decoder.decode()
    if (rest.length > 0) this.#endsWithCr = rest.endsWith('\r')
    this.#parser.feed(this.#endsWithCr ? rest + '\n' : rest)
    return this.#take()
  }

  #take (): UpstreamEvent[] {
    const batch = this.#batch
    this.#batch = []
    // The pending block also holds field names ("data: " per line): allow for them,
    // so the verdict on a complete event is the same however it was chunked.
    if (this.#tooLarge || this.#pendingBytes > this.#maxEventBytes + FIELD_SLACK_BYTES) {
      this.#tooLarge = true
      throw new EventTooLargeError(this.#maxEventBytes, batch)
    }
    return batch
  }
}
