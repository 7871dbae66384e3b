/** What the ticker asks of a stream: a comment line, if it has been silent for an interval. */
export interface KeepAliveTarget {
  keepAliveTick: (now: number) => void
}

/** Ticks per interval: how finely the comments of streams that went silent at different times are spread. */
export const TICKS_PER_INTERVAL = 8

/**
 * Keep-alive comments for every client stream of the process, from one timer.
 * Time is counted in ticks, TICKS_PER_INTERVAL to an interval; a stream notes
 * the tick of its last write (a field read, no clock), and one that has been
 * silent for a whole interval writes a comment line. No stream is silent for
 * longer than the interval, a stream that carries events gets no comments, and
 * streams that went silent at different times get theirs at different ticks.
 *
 * In place of @fastify/sse's heartbeat, which holds a timer per connection
 * (with 10,000 idle streams, 10,000 timers of about a quarter of a kilobyte
 * each) and writes on every connection at each interval, busy or not.
 */
export class KeepAliveTicker {
  readonly #streams = new Set<KeepAliveTarget>()
  readonly #timer: NodeJS.Timeout
  #now = 0

  constructor (intervalMs: number) {
    this.#timer = setInterval(() => { this.tick() }, Math.max(1, Math.floor(intervalMs / TICKS_PER_INTERVAL)))
    this.#timer.unref()
  }

  /** Ticks so far. */
  get now (): number { return this.#now }

  /** Streams it keeps alive. */
  get size (): number { return this.#streams.size }

  add (stream: KeepAliveTarget): void {
    this.#streams.add(stream)
  }

  delete (stream: KeepAliveTarget): void {
    this.#streams.delete(stream)
  }

  /** One tick (the timer's; tests call it directly). */
  tick (): void {
    const now = ++this.#now
    for (const stream of this.#streams) stream.keepAliveTick(now)
  }

  stop (): void {
    clearInterval(this.#timer)
    this.#streams.clear()
  }
}
