import { createParser, type EventSourceMessage, type EventSourceParser } from 'eventsource-parser'
import { EventTooLargeError } from '../errors.js'

export interface UpstreamEvent {
  readonly data: string
  readonly event?: string | undefined
  readonly id?: string | undefined
}

/** Room for field names and line breaks around an event's data in the pending bound. */
const FIELD_SLACK_BYTES = 4096

function isLineBreak (c: string | undefined): boolean {
  return c === '\n' || c === '\r'
}

/**
 * Index just past the last blank line (two line breaks in a row, in any of
 * SSE's spellings: LF, CR, CRLF) in `text`, or -1. Scans backwards, so a
 * block being assembled costs one pass over the newest read.
 */
function lastBoundary (text: string): number {
  for (let j = text.length - 1; j > 0; j--) {
    const c = text[j]
    if (!isLineBreak(c)) continue
    // The line break ending at j starts at j-1 when it is CRLF.
    const start = c === '\n' && text[j - 1] === '\r' ? j - 1 : j
    if (isLineBreak(text[start - 1])) return j + 1
  }
  return -1
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
  /** The end of the previous read, so a blank line split across two reads is seen. */
  #tail = ''

  constructor (maxEventBytes: number) {
    this.#maxEventBytes = maxEventBytes
    this.#parser = createParser({
      onEvent: (message: EventSourceMessage) => {
        if (this.#tooLarge) return
        // A UTF-16 unit is at most 3 UTF-8 bytes: measure only events that could be too large.
        if (message.data.length * 3 > this.#maxEventBytes && Buffer.byteLength(message.data) > this.#maxEventBytes) {
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
    this.#parser.feed(text)
    const window = this.#tail + text
    const boundary = lastBoundary(window)
    this.#pendingBytes = boundary === -1 ? this.#pendingBytes + chunk.byteLength : Buffer.byteLength(window.slice(boundary))
    this.#tail = window.slice(-3)
    return this.#take()
  }

  /** End of the upstream body: an unterminated last event is discarded, as the SSE spec says. */
  end (): UpstreamEvent[] {
    // eventsource-parser holds a CR until it sees what follows (it may be CRLF), even
    // across reads. Ending the last line releases it; a line that already ended
    // with LF must not get a second one, which would complete an unfinished event.
    const rest = this.#decoder.decode()
    const last = (this.#tail + rest).slice(-1)
    this.#parser.feed(last === '\n' || last === '' ? rest : rest + '\n')
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
