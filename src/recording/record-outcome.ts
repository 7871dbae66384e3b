import { LeaseLostError, SessionGoneError } from '../errors.js'
import { EventTooLargeError } from '../sse/event-too-large.js'

/** How the recording of an upstream answer ended. */
export type RecordOutcome = 'completed' | 'upstream_error' | 'session_gone' | 'aborted' | 'event_too_large' | 'lease_lost'

/** Why reading an upstream answer stopped, from the error that stopped it. */
export function failureOutcome (err: unknown): Exclude<RecordOutcome, 'completed'> {
  if (err instanceof SessionGoneError) return 'session_gone'
  // Fencing: another replica holds this stream now.
  if (err instanceof LeaseLostError) return 'lease_lost'
  if (err instanceof EventTooLargeError) return 'event_too_large'
  if ((err as Error).name === 'AbortError' || (err as NodeJS.ErrnoException).code === 'UND_ERR_ABORTED') return 'aborted'
  return 'upstream_error'
}
