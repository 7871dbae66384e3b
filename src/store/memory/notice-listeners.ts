// Who listens to which stream of the memory store, in this process: every
// append and end is told to the stream's listeners as it happens.
import type { NoticeListener, StreamNotice } from '../contract.js'

export class NoticeListeners {
  /** By `${sessionId}\n${streamId}`. */
  readonly #listeners = new Map<string, Set<NoticeListener>>()

  subscribe (sessionId: string, streamId: string, listener: NoticeListener): () => void {
    const key = `${sessionId}\n${streamId}`
    let set = this.#listeners.get(key)
    if (set === undefined) {
      set = new Set()
      this.#listeners.set(key, set)
    }
    set.add(listener)
    return () => {
      set.delete(listener)
      if (set.size === 0 && this.#listeners.get(key) === set) this.#listeners.delete(key)
    }
  }

  notify (sessionId: string, notice: StreamNotice): void {
    const set = this.#listeners.get(`${sessionId}\n${notice.streamId}`)
    if (set === undefined) return
    for (const listener of [...set]) listener(notice)
  }

  clear (): void {
    this.#listeners.clear()
  }
}
