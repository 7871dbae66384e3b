import type { FrameEvent } from '../store/events.js'

/** An upstream SSE event exceeded MAX_EVENT_BYTES. */
export class EventTooLargeError extends Error {
  /** Complete events that arrived before the oversized one (still to be recorded). */
  readonly completed: readonly FrameEvent[]
  constructor (limit: number, completed: EventTooLargeError['completed'] = []) {
    super(`upstream SSE event exceeds MAX_EVENT_BYTES (${limit})`)
    this.name = 'EventTooLargeError'
    this.completed = completed
  }
}
