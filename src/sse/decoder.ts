import { createParser, type EventSourceMessage, type EventSourceParser } from 'eventsource-parser'
import { EventTooLargeError } from '../errors.js'

export interface UpstreamEvent {
  readonly data: string
  readonly event?: string | undefined
  readonly id?: string | undefined
}

/**
 * Turns the upstream's SSE bytes into events, one batch per read, so a batch
 * can be stored in one round trip. Parsing is eventsource-parser's; this adds
 * UTF-8 decoding across chunk boundaries and a bound on a single event's size
 * (an upstream that never ends an event must not grow memory without limit).
 */
export class SseDecoder {
  readonly #parser: EventSourceParser
  readonly #decoder = new TextDecoder('utf-8')
  readonly #maxEventBytes: number
  #batch: UpstreamEvent[] = []
  #pendingBytes = 0
  #retry: number | undefined
  #tooLarge = false

  constructor (maxEventBytes: number) {
    this.#maxEventBytes = maxEventBytes
    this.#parser = createParser({
      onEvent: (message: EventSourceMessage) => {
        this.#pendingBytes = 0
        if (message.data.length > this.#maxEventBytes) this.#tooLarge = true
        this.#batch.push({ data: message.data, event: message.event, id: message.id })
      },
      onRetry: (ms: number) => { this.#retry = ms }
    })
  }

  /** The upstream's own retry hint, if it sent one. */
  get retry (): number | undefined { return this.#retry }

  /** Feed one chunk; returns the events it completed (possibly none). */
  push (chunk: Uint8Array): UpstreamEvent[] {
    this.#pendingBytes += chunk.byteLength
    this.#parser.feed(this.#decoder.decode(chunk, { stream: true }))
    const batch = this.#batch
    this.#batch = []
    if (this.#tooLarge || this.#pendingBytes > this.#maxEventBytes) {
      throw new EventTooLargeError(this.#maxEventBytes)
    }
    return batch
  }

  /** End of the upstream body: an unterminated last event is discarded, as the SSE spec says. */
  end (): UpstreamEvent[] {
    this.#parser.feed(this.#decoder.decode())
    const batch = this.#batch
    this.#batch = []
    return batch
  }
}
