// Why recording an upstream answer stopped, from the error that stopped it (src/recording/record-outcome.ts).
import t from 'tap'
import { failureOutcome } from '../../src/recording/record-outcome.js'
import { LeaseLostError, SessionGoneError } from '../../src/errors.js'
import { EventTooLargeError } from '../../src/sse/event-too-large.js'

t.test('each failure has its outcome', async t => {
  t.equal(failureOutcome(new SessionGoneError('session-1')), 'session_gone')
  t.equal(failureOutcome(new LeaseLostError('session-1')), 'lease_lost')
  t.equal(failureOutcome(new EventTooLargeError(10)), 'event_too_large')
  t.equal(failureOutcome(Object.assign(new Error('x'), { name: 'AbortError' })), 'aborted')
  t.equal(failureOutcome(Object.assign(new Error('x'), { code: 'UND_ERR_ABORTED' })), 'aborted')
  t.equal(failureOutcome(new Error('socket hang up')), 'upstream_error')
})
