import type { FastifyBaseLogger as Logger } from 'fastify'
import type { EventStore } from '../store/contract.js'
import { STANDALONE_STREAM } from '../store/contract.js'
import type { GatewayMetrics } from '../metrics/metrics.js'
import type { UpstreamClient, UpstreamResponse } from '../upstream/client.js'
import { mediaType } from '../upstream/headers.js'
import { recordUpstreamStream, type RecordOutcome } from './recorder.js'

export interface PumpOptions {
  readonly upstream: UpstreamClient
  readonly store: EventStore
  readonly metrics: GatewayMetrics
  readonly log: Logger
  readonly sessionId: string
  readonly path: string
  readonly holdMs: number
  readonly maxEventBytes: number
  /** Called once when the pump stops for good (upstream ended, hold expired, stopped). */
  readonly onStop: (outcome: RecordOutcome | 'hold_expired' | 'stopped') => void
}

/**
 * Holds a session's one upstream GET stream and records everything it
 * carries, also while no client is attached: a client reconnecting after a
 * drop finds the gap's events in the store. With no client attached for
 * `holdMs` the upstream GET is released.
 */
export class StandalonePump {
  readonly #o: PumpOptions
  readonly #abort = new AbortController()
  #clients = 0
  #holdTimer: NodeJS.Timeout | undefined
  #stopped = false
  #lastUpstreamId: string | undefined

  constructor (options: PumpOptions) {
    this.#o = options
  }

  get stopped (): boolean { return this.#stopped }
  get lastUpstreamId (): string | undefined { return this.#lastUpstreamId }

  /**
   * Open the upstream GET. Returns null when the pump runs; otherwise the
   * upstream's answer (405, 404, an error...) for the caller to pass through.
   */
  async open (headers: Record<string, string | string[]>): Promise<UpstreamResponse | null> {
    const { upstream, metrics, log } = this.#o
    const end = metrics.upstreamRequestDuration.startTimer({ method: 'GET' })
    let res: UpstreamResponse
    try {
      res = await upstream.request({ method: 'GET', path: this.#o.path, headers, signal: this.#abort.signal })
    } catch (err) {
      end({ status_class: 'error' })
      metrics.upstreamErrors.inc({ kind: 'request' })
      this.#stop('stopped', false)
      throw err
    }
    end({ status_class: `${Math.floor(res.statusCode / 100)}xx` })
    if (res.statusCode !== 200 || mediaType(res.headers['content-type']) !== 'text/event-stream') {
      this.#stop('stopped', false)
      return res
    }
    metrics.upstreamStreamsOpen.inc({ kind: 'standalone' })
    log.debug('upstream GET stream opened')
    recordUpstreamStream({
      store: this.#o.store,
      metrics,
      log,
      sessionId: this.#o.sessionId,
      streamId: STANDALONE_STREAM,
      body: res.body,
      maxEventBytes: this.#o.maxEventBytes,
      endStreamOnFinish: false,
      onUpstreamId: id => { this.#lastUpstreamId = id }
    }).then(outcome => {
      metrics.upstreamStreamsOpen.dec({ kind: 'standalone' })
      log.debug({ outcome }, 'upstream GET stream finished')
      this.#stop(outcome, true)
    })
    this.#armHold()
    return null
  }

  attach (): void {
    this.#clients++
    clearTimeout(this.#holdTimer)
    this.#holdTimer = undefined
  }

  detach (): void {
    this.#clients = Math.max(0, this.#clients - 1)
    this.#armHold()
  }

  stop (): void {
    this.#stop('stopped', true)
  }

  #armHold (): void {
    if (this.#clients > 0 || this.#stopped || this.#holdTimer !== undefined) return
    this.#holdTimer = setTimeout(() => {
      this.#o.log.debug('no client for the hold time: releasing the upstream GET stream')
      this.#stop('hold_expired', true)
    }, this.#o.holdMs)
    this.#holdTimer.unref()
  }

  #stop (outcome: RecordOutcome | 'hold_expired' | 'stopped', abort: boolean): void {
    if (this.#stopped) return
    this.#stopped = true
    clearTimeout(this.#holdTimer)
    if (abort) this.#abort.abort()
    this.#o.onStop(outcome)
  }
}
