import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'

export type StreamKind = 'standalone' | 'request' | 'resume'
export type CloseOutcome = 'completed' | 'client_gone' | 'slow_client' | 'superseded' | 'upstream_error' | 'draining' | 'session_deleted'
export type ResumeOutcome = 'replayed' | 'gap' | 'unknown' | 'refused'

/**
 * The gateway's Prometheus metrics, on an application-owned registry (tests
 * build as many gateways as they like). Labels are small closed sets: never a
 * session id, event id or anything a client chooses.
 */
export class GatewayMetrics {
  readonly registry = new Registry()
  readonly clientStreamsOpen: Gauge<'kind'>
  readonly streamsOpened: Counter<'kind'>
  readonly streamsClosed: Counter<'kind' | 'outcome'>
  readonly resumes: Counter<'outcome'>
  readonly gaps: Counter<'reason'>
  readonly eventsRecorded: Counter
  readonly eventBytesRecorded: Counter
  readonly upstreamReads: Counter
  readonly eventsReplayed: Counter
  readonly eventsDelivered: Counter
  readonly eventsUnrecorded: Counter<'reason'>
  readonly replayEvents: Histogram
  readonly replayDuration: Histogram
  readonly storeOperationDuration: Histogram<'op'>
  readonly storeErrors: Counter<'op'>
  readonly appendResends: Counter<'outcome'>
  readonly upstreamRequestDuration: Histogram<'method' | 'status_class'>
  readonly upstreamErrors: Counter<'kind'>
  readonly upstreamStreamsOpen: Gauge<'kind'>
  readonly slowClientDisconnects: Counter
  readonly sessionsRecovered: Counter
  readonly leaseTakeovers: Counter
  readonly buildInfo: Gauge<'version' | 'node_version' | 'store'>
  /** By operation (a handful of names, fixed in the code). */
  readonly #storeTimers = new Map<string, { observe: (value: number) => void }>()

  constructor (options: { version: string, store: string, defaultMetrics?: boolean }) {
    const registers = [this.registry]
    const p = 'mcpgw_'
    if (options.defaultMetrics !== false) collectDefaultMetrics({ register: this.registry })
    this.clientStreamsOpen = new Gauge({ name: `${p}client_streams_open`, help: 'Client SSE streams currently open, by kind.', labelNames: ['kind'], registers })
    this.streamsOpened = new Counter({ name: `${p}streams_opened_total`, help: 'Client SSE streams opened, by kind.', labelNames: ['kind'], registers })
    this.streamsClosed = new Counter({ name: `${p}streams_closed_total`, help: 'Client SSE streams closed, by kind and outcome.', labelNames: ['kind', 'outcome'], registers })
    this.resumes = new Counter({ name: `${p}resumes_total`, help: 'Requests carrying Last-Event-ID, by outcome.', labelNames: ['outcome'], registers })
    this.gaps = new Counter({ name: `${p}gaps_total`, help: 'Gaps signalled to clients (history could not fill a resume), by reason.', labelNames: ['reason'], registers })
    this.eventsRecorded = new Counter({ name: `${p}events_recorded_total`, help: 'Upstream SSE events appended to the store.', registers })
    this.eventBytesRecorded = new Counter({ name: `${p}event_bytes_recorded_total`, help: 'Bytes of upstream event data appended to the store.', registers })
    this.upstreamReads = new Counter({ name: `${p}upstream_reads_total`, help: 'Pieces of upstream SSE answers read (as the HTTP client hands them over). Each store append carries one or more: appends per read is the batching.', registers })
    this.eventsReplayed = new Counter({ name: `${p}events_replayed_total`, help: 'Events written to clients from history on resume.', registers })
    this.eventsDelivered = new Counter({ name: `${p}events_delivered_total`, help: 'Events written to client streams (live and replayed).', registers })
    this.eventsUnrecorded = new Counter({ name: `${p}events_unrecorded_total`, help: 'Upstream events that could not be stored, by reason.', labelNames: ['reason'], registers })
    this.replayEvents = new Histogram({ name: `${p}replay_events`, help: 'Events replayed per resume (Last-Event-ID) that found the stream\'s history.', buckets: [0, 1, 10, 100, 1000, 10000, 100000], registers })
    this.replayDuration = new Histogram({ name: `${p}replay_duration_seconds`, help: 'Time to replay history on resume, from its first store request until live (or until the stream ended or the client left).', buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5], registers })
    this.storeOperationDuration = new Histogram({ name: `${p}store_operation_duration_seconds`, help: 'Event store operation latency, by operation.', labelNames: ['op'], buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1], registers })
    this.storeErrors = new Counter({ name: `${p}store_errors_total`, help: 'Event store operations that failed, by operation.', labelNames: ['op'], registers })
    this.appendResends = new Counter({ name: `${p}append_resends_total`, help: 'Failed appends resent before their events were passed on unrecorded, by outcome: recorded (applied, or found applied already) or unrecorded (the confirm window ran out).', labelNames: ['outcome'], registers })
    this.upstreamRequestDuration = new Histogram({ name: `${p}upstream_request_duration_seconds`, help: 'Time to upstream response headers, by method and status class.', labelNames: ['method', 'status_class'], buckets: [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30], registers })
    this.upstreamErrors = new Counter({ name: `${p}upstream_errors_total`, help: 'Upstream requests or streams that failed, by kind.', labelNames: ['kind'], registers })
    this.upstreamStreamsOpen = new Gauge({ name: `${p}upstream_streams_open`, help: 'Upstream SSE answers being read, by kind.', labelNames: ['kind'], registers })
    this.slowClientDisconnects = new Counter({ name: `${p}slow_client_disconnects_total`, help: 'Client streams closed because their send buffer exceeded CLIENT_BUFFER_MAX_BYTES.', registers })
    this.sessionsRecovered = new Counter({ name: `${p}sessions_recovered_total`, help: 'Sessions the event store had lost (restarted empty), recorded again under a new epoch when a client came back with them (RECOVER_LOST_SESSIONS).', registers })
    this.leaseTakeovers = new Counter({ name: `${p}lease_takeovers_total`, help: 'Upstream GET streams taken over from another replica.', registers })
    this.buildInfo = new Gauge({ name: `${p}build_info`, help: 'Gateway build information (always 1).', labelNames: ['version', 'node_version', 'store'], registers })
    this.buildInfo.set({ version: options.version, node_version: process.version, store: options.store }, 1)
  }

  /** Time a store operation, counting failures. */
  async timeStore<T> (op: string, fn: () => Promise<T>): Promise<T> {
    const started = performance.now()
    try {
      return await fn()
    } catch (err) {
      this.storeErrors.inc({ op })
      throw err
    } finally {
      this.#storeTimer(op).observe((performance.now() - started) / 1000)
    }
  }

  /**
   * The operation's histogram child, made once: prom-client's startTimer makes
   * two closures, two hrtime arrays and a label object on every call (about
   * ten store operations per stream opened, one per append).
   */
  #storeTimer (op: string): { observe: (value: number) => void } {
    let timer = this.#storeTimers.get(op)
    if (timer === undefined) {
      timer = this.storeOperationDuration.labels({ op })
      this.#storeTimers.set(op, timer)
    }
    return timer
  }
}

export function statusClass (status: number): string {
  return `${Math.floor(status / 100)}xx`
}
