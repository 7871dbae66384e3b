import { setTimeout as sleep } from 'node:timers/promises'
import type { FastifyBaseLogger as Logger } from 'fastify'
import { LeaseLostError, SessionGoneError } from '../errors.js'
import type { AppendOptions, EventStore } from '../store/contract.js'
import type { EventBatch } from '../store/batch/event-batch.js'
import type { NumberedBatch } from '../store/batch/numbered-batch.js'
import type { GatewayMetrics } from '../metrics/metrics.js'

/**
 * Confirm before degrading: an append that failed at the client may still have
 * been applied (Redis restarted or failed over after running the script, or its
 * reply was lost). Resending the identical batch is safe: the store recognises a
 * batch it already applied (src/store/redis/commands/append-5.lua). So a failed
 * append is resent for this long, reading nothing more from the upstream
 * meanwhile, before its events are passed on unrecorded: through a short outage
 * they arrive late, never twice. Past the window, what the store applied all
 * the same is found once it answers again (StreamAppender's reconcile).
 */
const APPEND_CONFIRM_WINDOW_MS = 2000
/** First wait between resends of a failed append; it doubles up to APPEND_CONFIRM_MAX_DELAY_MS. */
const APPEND_CONFIRM_FIRST_DELAY_MS = 100
const APPEND_CONFIRM_MAX_DELAY_MS = 800

/**
 * The waits of the confirm window, for retrying a store operation that
 * failed (an append, opening a request stream): yields the retry's number
 * (from 1) after each wait, until APPEND_CONFIRM_WINDOW_MS from the first
 * call has passed.
 */
export async function * confirmWindow (): AsyncGenerator<number, void, undefined> {
  const deadline = performance.now() + APPEND_CONFIRM_WINDOW_MS
  let retry = 0
  for (let delayMs = APPEND_CONFIRM_FIRST_DELAY_MS; performance.now() < deadline; delayMs = Math.min(delayMs * 2, APPEND_CONFIRM_MAX_DELAY_MS)) {
    await sleep(Math.max(0, Math.min(delayMs, deadline - performance.now())))
    yield ++retry
  }
}

/** The stream a failed append is resent to. */
export interface ResendTarget {
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly sessionId: string
  readonly streamId: string
}

/**
 * Resend a failed append, identical, until it goes through or the confirm
 * window has passed: what the store took, else the last error. A session
 * gone or a lease lost is thrown at once: resending cannot help.
 */
export async function resendAppend (o: ResendTarget, batch: EventBatch, options: AppendOptions, first: unknown): Promise<{ stored: NumberedBatch } | { err: unknown }> {
  let err = first
  o.log.warn({ err, streamId: o.streamId, events: batch.length }, 'event store append failed: resending it (it may have been applied) before passing its events on unrecorded')
  for await (const attempts of confirmWindow()) {
    try {
      const stored = await o.metrics.timeStore('append', () => o.store.appendBatch(o.sessionId, o.streamId, batch, options))
      o.metrics.appendResends.inc({ outcome: 'recorded' })
      o.log.info({ streamId: o.streamId, events: batch.length, attempts }, 'event store append resent: recorded (applied now, or found applied already), nothing passed on unrecorded')
      return { stored }
    } catch (next) {
      if (next instanceof SessionGoneError || next instanceof LeaseLostError) throw next
      err = next
    }
  }
  o.metrics.appendResends.inc({ outcome: 'unrecorded' })
  return { err }
}
