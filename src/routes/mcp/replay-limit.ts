/**
 * Resumes of one stream replaying at once (MAX_REPLAYS_PER_STREAM), on this
 * replica. A replay holds a page of history and what waits in its connection
 * until it catches up; a client has one connection per stream, so many
 * concurrent replays of one stream are a loop or an attack, and past the
 * bound they are refused before they read anything. Entries exist only while
 * replays run.
 */
export class ReplayLimiter {
  readonly #max: number
  readonly #running = new Map<string, number>()

  constructor (maxPerStream: number) {
    this.#max = maxPerStream
  }

  /** A replay of (session, stream) starts: its release, or undefined when the bound is reached. */
  enter (sessionId: string, streamId: string): (() => void) | undefined {
    const key = `${streamId} ${sessionId}`
    const running = this.#running.get(key) ?? 0
    if (running >= this.#max) return undefined
    this.#running.set(key, running + 1)
    let released = false
    return () => {
      if (released) return
      released = true
      const left = (this.#running.get(key) ?? 1) - 1
      if (left === 0) this.#running.delete(key)
      else this.#running.set(key, left)
    }
  }

  /** Streams with a replay running (tests). */
  get size (): number { return this.#running.size }
}
