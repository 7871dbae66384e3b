import type { Tracer } from '@opentelemetry/api'
import type { FastifyBaseLogger } from 'fastify'
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client'
import { REFUSALS, SessionGoneError, isRefusalCode, type RefusalReason } from '../errors.js'
import { GAP_REASONS, type GapReason } from '../gaps.js'
import { EVICTION_KINDS, STALLED_WAITS, type EventStore, type StalledWait, type StoreUsage as MemoryStoreUsage } from '../store/contract.js'
import { traceStoreOperation } from '../tracing/spans.js'
import { ENDPOINT_STATES, type EndpointState } from '../upstream/endpoint-state.js'

// Every label value the code uses, listed once: each series is exported at 0
// from the start, so a rate() or a ratio over a healthy system is 0, not "No data".
const STREAM_KINDS = ['standalone', 'request', 'resume'] as const
const CLOSE_OUTCOMES = ['completed', 'client_gone', 'slow_client', 'superseded', 'upstream_error', 'draining', 'session_deleted', 'write_timeout', 'buffers_full'] as const
const RESUME_OUTCOMES = ['replayed', 'gap', 'unknown', 'refused'] as const
const UNRECORDED_REASONS = ['too_large', 'store_error'] as const
const STORE_OPS = ['append', 'read', 'state', 'get_session', 'create_session', 'adopt_session', 'settle_adoption', 'delete_session', 'session_deleted', 'intact_since', 'open_stream', 'load_cursor', 'lease_acquire', 'move_placement', 'recipe', 'session_state', 'session_fence'] as const
/**
 * How a re-establishment of an upstream session ended: `reestablished` (here),
 * `joined` (another request or replica did it meanwhile), `incompatible` (the
 * new initialize result promises something else: the session ends), `gone`
 * (the session was deleted, or the store lost its records, meanwhile: it ends),
 * `unrecorded` (no complete recipe: an older or adopted session, or too many
 * subscriptions), `failed` (the upstream answered, and did not establish
 * it), `unavailable` (the upstream or the store could not be reached, or the
 * upstream answered with a server error: the session is kept and the client
 * told to retry), `timed_out` (waited in vain for another replica's; kept
 * and retried likewise), `busy` (no turn within the fence's time under
 * REESTABLISH_CONCURRENCY; kept and retried likewise), `found` (a record
 * that named no endpoint, recovered after the store lost it: the endpoint
 * holding its upstream session was found and recorded, nothing established).
 */
export const REESTABLISH_OUTCOMES = ['reestablished', 'joined', 'found', 'incompatible', 'gone', 'unrecorded', 'failed', 'unavailable', 'timed_out', 'busy'] as const
export type ReestablishOutcome = typeof REESTABLISH_OUTCOMES[number]
/**
 * The outcomes mcpgw_upstream_sessions_reestablished_total counts: the
 * re-establisher's, and `relapsed`, which the route counts when a session
 * ends because the upstream lost it again right after each re-establishment
 * (sessions/relapses.ts: an upstream that keeps no session).
 */
const REESTABLISHED_COUNTED = [...REESTABLISH_OUTCOMES, 'relapsed'] as const
export type ReestablishedCounted = typeof REESTABLISHED_COUNTED[number]
/**
 * How an upstream session left behind by a move was settled (sessions/left-behind.ts):
 * `answered` (its endpoint answered the DELETE, with any status but one that
 * asks to be called again), `kept` (the session's record names that upstream
 * session again: not deleted), `endpoint_gone` (the endpoint left the set
 * first), `expired` (not reachable in time), `dropped` (given up, past the
 * bound on those waiting).
 */
const LEFT_BEHIND_OUTCOMES = ['answered', 'kept', 'endpoint_gone', 'expired', 'dropped'] as const
export type LeftBehindOutcome = typeof LEFT_BEHIND_OUTCOMES[number]
const RESEND_OUTCOMES = ['recorded', 'unrecorded'] as const
const UPSTREAM_ERROR_KINDS = ['request', 'stream_broken', 'unresumable_id', 'resume_stalled', 'resume_expired'] as const
/** Upstream answers being read: the client stream kinds that have one (a resume reads the store). */
const UPSTREAM_STREAM_KINDS = STREAM_KINDS.filter((kind): kind is Exclude<StreamKind, 'resume'> => kind !== 'resume')
/**
 * Upstream endpoints with a series of their own; the rest are summed under
 * endpoint="other". An endpoint's series goes when it leaves the set, so
 * addresses that come and go (pods rescheduled) do not pile up. 32 covers the
 * replicas of most servers while bounding the series of each metric.
 */
export const MAX_ENDPOINT_SERIES = 32

export type StreamKind = typeof STREAM_KINDS[number]
export type CloseOutcome = typeof CLOSE_OUTCOMES[number]
export type ResumeOutcome = typeof RESUME_OUTCOMES[number]
export type UnrecordedReason = typeof UNRECORDED_REASONS[number]
export type ResendOutcome = typeof RESEND_OUTCOMES[number]
export type UpstreamErrorKind = typeof UPSTREAM_ERROR_KINDS[number]
export type UpstreamStreamKind = typeof UPSTREAM_STREAM_KINDS[number]

/**
 * A counter whose labels take only their closed sets of values (the lists
 * above): prom-client's own types accept any string, so a misspelt value
 * would make a series of its own, never exported at 0 and missed by alerts.
 */
export interface ClosedCounter<Labels extends Record<string, string>> {
  inc: (labels: Labels, value?: number) => void
}

/** The same, for a gauge. */
export interface ClosedGauge<Labels extends Record<string, string>> extends ClosedCounter<Labels> {
  dec: (labels: Labels, value?: number) => void
  set: (labels: Labels, value: number) => void
}
export type StoreOp = typeof STORE_OPS[number]

/**
 * Events per resume: powers of ten, from a reconnect that missed nothing to
 * ten times RETENTION_MAX_EVENTS's default (10,000), where a client that
 * fell behind a raised retention lands.
 */
const REPLAY_EVENTS_BUCKETS: readonly number[] = [0, 1, 10, 100, 1000, 10000, 100000]
/**
 * Replay time: a short resume answers in about a millisecond, 10,000 events
 * take 7-40 ms (docs/performance.md); seconds mean a slow client or store.
 */
const REPLAY_SECONDS_BUCKETS: readonly number[] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5]
/**
 * Store operations: from a Redis round trip on the same host (0.1-0.5 ms) in
 * fine steps up to the tens of milliseconds a busy replica's event loop or a
 * distant Redis adds, then 0.5 and 1 s for an operation that is stuck.
 */
const STORE_SECONDS_BUCKETS: readonly number[] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1]
/**
 * Upstream response heads: milliseconds for an SSE answer or a quick call,
 * up to 30 s for a JSON answer that waits for a long tool call to finish.
 */
const UPSTREAM_SECONDS_BUCKETS: readonly number[] = [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30]

/**
 * The gateway's Prometheus metrics, on an application-owned registry (tests
 * build as many gateways as they like). Labels are small closed sets: never a
 * session id, event id or anything a client chooses.
 */
export class GatewayMetrics {
  readonly registry = new Registry()
  readonly clientStreamsOpen: ClosedGauge<{ kind: StreamKind }> & Pick<Gauge, 'get'>
  readonly streamsOpened: ClosedCounter<{ kind: StreamKind }>
  readonly streamsClosed: ClosedCounter<{ kind: StreamKind, outcome: CloseOutcome }> & Pick<Counter, 'get'>
  readonly resumes: ClosedCounter<{ outcome: ResumeOutcome }>
  /** By reason: count through countGap(), which takes only the closed set. */
  readonly #gaps: Counter<'reason'>
  readonly eventsRecorded: Counter
  readonly eventBytesRecorded: Counter
  readonly upstreamReads: Counter
  readonly eventsReplayed: Counter
  readonly eventsDelivered: Counter
  readonly eventsUnrecorded: ClosedCounter<{ reason: UnrecordedReason }>
  readonly replayEvents: Histogram
  readonly replayDuration: Histogram
  readonly storeOperationDuration: Histogram<'op'>
  readonly storeErrors: ClosedCounter<{ op: StoreOp }> & Pick<Counter, 'get'>
  readonly appendResends: ClosedCounter<{ outcome: ResendOutcome }>
  readonly upstreamSessionsLeftBehind: ClosedCounter<{ outcome: LeftBehindOutcome }>
  readonly upstreamRequestDuration: Histogram<'method' | 'status_class'>
  readonly upstreamErrors: ClosedCounter<{ kind: UpstreamErrorKind }>
  readonly upstreamStreamsOpen: ClosedGauge<{ kind: UpstreamStreamKind }>
  readonly slowClientDisconnects: Counter
  readonly clientWriteTimeouts: Counter
  readonly clientBufferedBytes: Gauge
  readonly sessionsRecovered: Counter
  readonly upstreamSessionsReestablished: ClosedCounter<{ outcome: ReestablishedCounted }>
  readonly leaseTakeovers: Counter
  readonly buildInfo: Gauge<'version' | 'node_version' | 'store'>
  /** Counted through countRefusal(), which derives the reason from the error code. */
  readonly #requestsRefused: Counter<'status' | 'reason'>
  /** Set from the store's totals at each scrape (watchStoreConnections), nowhere else. */
  readonly #storeConnectionsReplaced: Counter<'waited'>
  /** By operation (a handful of names, fixed in the code). */
  readonly #storeTimers = new Map<string, { observe: (value: number) => void }>()
  #storeLog: Pick<FastifyBaseLogger, 'warn' | 'info'> | undefined
  /** Since when store operations fail (undefined: they succeed), and how many did. */
  #storeDownSince: number | undefined
  #storeFailures = 0
  #tracer: Tracer | undefined
  #clientBuffers: { readonly waitingBytes: number } | undefined
  #connectionsReplaced: (() => Readonly<Record<StalledWait, number>>) | undefined

  constructor (options: { version: string, store: EventStore['kind'], defaultMetrics?: boolean }) {
    const registers = [this.registry]
    const p = 'mcpgw_'
    if (options.defaultMetrics !== false) {
      collectDefaultMetrics({ register: this.registry })
      // Gauges named like counters (promtool rejects them); each is the sum of
      // its labelled namesake (nodejs_active_handles by type, and so on).
      for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) {
        this.registry.removeSingleMetric(name)
      }
    }
    this.clientStreamsOpen = new Gauge({ name: `${p}client_streams_open`, help: 'Client SSE streams currently open, by kind.', labelNames: ['kind'], registers })
    this.streamsOpened = new Counter({ name: `${p}streams_opened_total`, help: 'Client SSE streams opened, by kind.', labelNames: ['kind'], registers })
    this.streamsClosed = new Counter({ name: `${p}streams_closed_total`, help: 'Client SSE streams closed, by kind and outcome.', labelNames: ['kind', 'outcome'], registers })
    this.resumes = new Counter({ name: `${p}resumes_total`, help: 'Requests carrying Last-Event-ID, by outcome.', labelNames: ['outcome'], registers })
    this.#gaps = new Counter({ name: `${p}gaps_total`, help: 'Gaps signalled to clients (history could not fill a resume), by reason.', labelNames: ['reason'], registers })
    this.eventsRecorded = new Counter({ name: `${p}events_recorded_total`, help: 'Upstream SSE events appended to the store.', registers })
    this.eventBytesRecorded = new Counter({ name: `${p}event_bytes_recorded_total`, help: 'Bytes of upstream event data appended to the store.', registers })
    this.upstreamReads = new Counter({ name: `${p}upstream_reads_total`, help: 'Pieces of upstream SSE answers read (as the HTTP client hands them over). Each store append carries one or more: appends per read is the batching.', registers })
    this.eventsReplayed = new Counter({ name: `${p}events_replayed_total`, help: 'Events written to clients from history on resume.', registers })
    this.eventsDelivered = new Counter({ name: `${p}events_delivered_total`, help: 'Events written to client streams (live and replayed).', registers })
    this.eventsUnrecorded = new Counter({ name: `${p}events_unrecorded_total`, help: 'Upstream events that could not be stored, by reason.', labelNames: ['reason'], registers })
    this.replayEvents = new Histogram({ name: `${p}replay_events`, help: 'Events replayed per resume (Last-Event-ID) that found the stream\'s history.', buckets: [...REPLAY_EVENTS_BUCKETS], registers })
    this.replayDuration = new Histogram({ name: `${p}replay_duration_seconds`, help: 'Time to replay history on resume, from its first store request until live (or until the stream ended or the client left).', buckets: [...REPLAY_SECONDS_BUCKETS], registers })
    this.storeOperationDuration = new Histogram({ name: `${p}store_operation_duration_seconds`, help: 'Event store operation latency, by operation.', labelNames: ['op'], buckets: [...STORE_SECONDS_BUCKETS], registers })
    this.storeErrors = new Counter({ name: `${p}store_errors_total`, help: 'Event store operations that failed, by operation.', labelNames: ['op'], registers })
    this.appendResends = new Counter({ name: `${p}append_resends_total`, help: 'Failed appends resent before their events were passed on unrecorded, by outcome: recorded (applied, or found applied already) or unrecorded (the confirm window ran out).', labelNames: ['outcome'], registers })
    this.upstreamSessionsLeftBehind = new Counter({ name: `${p}upstream_sessions_left_behind_total`, help: 'Upstream sessions a re-establishment moved away from while their endpoint could not be reached, each sent a DELETE, by how that ended: answered, kept (the record names it again), endpoint_gone, expired, dropped.', labelNames: ['outcome'], registers })
    this.upstreamRequestDuration = new Histogram({ name: `${p}upstream_request_duration_seconds`, help: 'Time to upstream response headers, by method and status class.', labelNames: ['method', 'status_class'], buckets: [...UPSTREAM_SECONDS_BUCKETS], registers })
    this.upstreamErrors = new Counter({ name: `${p}upstream_errors_total`, help: 'Upstream requests or streams that failed, by kind.', labelNames: ['kind'], registers })
    this.upstreamStreamsOpen = new Gauge({ name: `${p}upstream_streams_open`, help: 'Upstream SSE answers being read, by kind.', labelNames: ['kind'], registers })
    this.slowClientDisconnects = new Counter({ name: `${p}slow_client_disconnects_total`, help: 'Client streams closed because their send buffer exceeded CLIENT_BUFFER_MAX_BYTES.', registers })
    this.clientWriteTimeouts = new Counter({ name: `${p}client_write_timeouts_total`, help: 'Client connections destroyed because their client accepted no byte of what waited for CLIENT_WRITE_TIMEOUT_SECONDS (open streams, streams already ended whose last bytes were not read, and answers relayed unrecorded).', registers })
    const metrics = this
    this.clientBufferedBytes = new Gauge({
      name: `${p}client_buffered_bytes`,
      help: 'Bytes waiting in client connections\' send buffers, process-wide (bounded by CLIENT_BUFFERS_MAX_BYTES plus one write).',
      registers,
      collect () { this.set(metrics.#clientBuffers?.waitingBytes ?? 0) }
    })
    this.#storeConnectionsReplaced = new Counter({
      name: `${p}store_connections_replaced_total`,
      help: 'Connections to the store server closed and opened again because they answered nothing for REDIS_SOCKET_TIMEOUT_MS, by what waited: ping (an idle or busy connection\'s PING), handshake (a connection opened but never ready). Always 0 on the embedded store.',
      labelNames: ['waited'],
      registers,
      collect () {
        const read = metrics.#connectionsReplaced
        if (read === undefined) return
        // The store keeps the totals: set them (a counter has no set()).
        const replaced = read()
        this.reset()
        for (const waited of STALLED_WAITS) this.inc({ waited }, replaced[waited])
      }
    })
    this.sessionsRecovered = new Counter({ name: `${p}sessions_recovered_total`, help: 'Sessions the event store had lost (restarted empty), recorded again under a new epoch when a client came back with them (RECOVER_LOST_SESSIONS).', registers })
    this.upstreamSessionsReestablished = new Counter({ name: `${p}upstream_sessions_reestablished_total`, help: 'Upstream sessions established again after the upstream lost them (404, or a connection failed before any answer), by outcome (REESTABLISH_UPSTREAM_SESSIONS); relapsed: sessions ended because the upstream lost them again right after each re-establishment.', labelNames: ['outcome'], registers })
    this.leaseTakeovers = new Counter({ name: `${p}lease_takeovers_total`, help: 'Upstream GET streams opened again after their last holder did not end them cleanly: another replica that died or lost its lease, or this one after its upstream GET failed.', registers })
    this.buildInfo = new Gauge({ name: `${p}build_info`, help: 'Gateway build information (always 1).', labelNames: ['version', 'node_version', 'store'], registers })
    this.buildInfo.set({ version: options.version, node_version: process.version, store: options.store }, 1)
    this.#requestsRefused = new Counter({ name: `${p}requests_refused_total`, help: 'Requests the gateway answered with an error of its own (not an upstream answer passed on), by HTTP status and reason (the error code).', labelNames: ['status', 'reason'], registers })
    this.#zero()
  }

  /** Every known series at 0 (also after registry.resetMetrics(), which drops them). */
  #zero (): void {
    for (const kind of STREAM_KINDS) {
      this.clientStreamsOpen.set({ kind }, 0)
      this.streamsOpened.inc({ kind }, 0)
      for (const outcome of CLOSE_OUTCOMES) this.streamsClosed.inc({ kind, outcome }, 0)
    }
    for (const outcome of RESUME_OUTCOMES) this.resumes.inc({ outcome }, 0)
    for (const reason of GAP_REASONS) this.#gaps.inc({ reason }, 0)
    for (const reason of UNRECORDED_REASONS) this.eventsUnrecorded.inc({ reason }, 0)
    for (const op of STORE_OPS) {
      this.storeErrors.inc({ op }, 0)
      this.storeOperationDuration.zero({ op })
    }
    for (const outcome of RESEND_OUTCOMES) this.appendResends.inc({ outcome }, 0)
    for (const waited of STALLED_WAITS) this.#storeConnectionsReplaced.inc({ waited }, 0)
    for (const outcome of LEFT_BEHIND_OUTCOMES) this.upstreamSessionsLeftBehind.inc({ outcome }, 0)
    for (const outcome of REESTABLISHED_COUNTED) this.upstreamSessionsReestablished.inc({ outcome }, 0)
    for (const kind of UPSTREAM_ERROR_KINDS) this.upstreamErrors.inc({ kind }, 0)
    for (const kind of UPSTREAM_STREAM_KINDS) this.upstreamStreamsOpen.set({ kind }, 0)
    for (const { status, reason } of Object.values(REFUSALS)) this.#requestsRefused.inc({ status: String(status), reason }, 0)
  }

  /** Zero every series again (tests; prom-client's reset drops labelled series). */
  reset (): void {
    this.registry.resetMetrics()
    this.#zero()
  }

  /** Count an error answer of the gateway's own under its reason (errors.ts REFUSALS); codes outside the table count as "other". */
  countRefusal (statusCode: number, code: string): void {
    const reason: RefusalReason = isRefusalCode(code) ? REFUSALS[code].reason : 'other'
    this.#requestsRefused.inc({ status: String(statusCode), reason })
  }

  /** Count a gap signalled to a client: the reason is one of the closed set (gaps.ts). */
  countGap (reason: GapReason): void {
    this.#gaps.inc({ reason })
  }

  /** Where mcpgw_client_buffered_bytes is read at each scrape. */
  watchClientBuffers (buffers: { readonly waitingBytes: number }): void {
    this.#clientBuffers = buffers
  }

  /** Where mcpgw_store_connections_replaced_total is read at each scrape (a store that checks its connections). */
  watchStoreConnections (replaced: () => Readonly<Record<StalledWait, number>>): void {
    this.#connectionsReplaced = replaced
  }

  /** The embedded store's room and evictions, read at each scrape. */
  watchMemoryStore (store: { usage: () => MemoryStoreUsage }): void {
    const registers = [this.registry]
    const p = 'mcpgw_memory_store_'
    const gauges: Array<[string, string, (usage: MemoryStoreUsage) => number]> = [
      ['bytes', 'Embedded store: bytes counted against MEMORY_STORE_MAX_BYTES (event data and what each append keeps besides, plus per-session and per-stream records).', u => u.heldBytes],
      ['max_bytes', 'Embedded store: MEMORY_STORE_MAX_BYTES.', u => u.maxBytes],
      ['sessions', 'Embedded store: sessions held.', u => u.sessions]
    ]
    for (const [name, help, read] of gauges) {
      this.registry.registerMetric(new Gauge({ name: `${p}${name}`, help, registers: [], collect () { this.set(read(store.usage())) } }))
    }
    const evictions = new Counter({
      name: `${p}evictions_total`,
      help: 'Embedded store: what the MEMORY_STORE_MAX_BYTES cap evicted, by what: stream (a stream emptied, least recently appended first), events (oldest events of the stream being appended to), session (a whole session, least recently used first).',
      labelNames: ['what'],
      registers,
      collect () {
        // The store keeps the totals: set them (a counter has no set()).
        const evicted = store.usage().evicted
        this.reset()
        for (const what of EVICTION_KINDS) this.inc({ what }, evicted[what])
      }
    })
    for (const what of EVICTION_KINDS) evictions.inc({ what }, 0)
  }

  /** Re-establishments of upstream sessions in this process, read at each scrape: talking to the upstream, and waiting their turn. */
  watchReestablishments (source: { readonly load: { readonly running: number, readonly waiting: number } }): void {
    this.registry.registerMetric(new Gauge({
      name: 'mcpgw_upstream_reestablishments',
      help: 'Upstream sessions being established again in this process: running (at most REESTABLISH_CONCURRENCY), or waiting their turn.',
      labelNames: ['state'],
      registers: [],
      collect () {
        const { running, waiting } = source.load
        this.set({ state: 'running' }, running)
        this.set({ state: 'waiting' }, waiting)
      }
    }))
  }

  /** The upstream's endpoints, read at each scrape: how many in each state, and the sessions placed on each. */
  watchUpstreamEndpoints (snapshot: () => ReadonlyArray<{ readonly endpoint: string, readonly state: EndpointState['kind'], readonly sessionsPlaced: number }>): void {
    const p = 'mcpgw_upstream_'
    this.registry.registerMetric(new Gauge({
      name: `${p}endpoints`,
      help: 'Upstream endpoints by state: healthy, set_aside (refused a connection; gets nothing for a while), on_trial (back from set_aside), leaving (no longer in the DNS answer; its sessions go on).',
      labelNames: ['state'],
      registers: [],
      collect () {
        const views = snapshot()
        for (const state of ENDPOINT_STATES) this.set({ state }, views.filter(v => v.state === state).length)
      }
    }))
    this.registry.registerMetric(new Counter({
      name: `${p}endpoint_sessions_placed_total`,
      help: `Sessions this replica established on each upstream endpoint, for endpoints in the set (at most ${MAX_ENDPOINT_SERIES}; the rest as endpoint="other").`,
      labelNames: ['endpoint'],
      registers: [],
      collect () {
        // The endpoint set keeps the totals: set them (a counter has no set()), dropping endpoints gone.
        this.reset()
        snapshot().forEach((view, n) => this.inc({ endpoint: n < MAX_ENDPOINT_SERIES ? view.endpoint : 'other' }, view.sessionsPlaced))
      }
    }))
  }

  /** Store operations get spans of their own (tracing on). */
  traceStore (tracer: Tracer): void {
    this.#tracer = tracer
  }

  /**
   * Time an upstream request by its answer's status class, counting failures
   * (`upstreamErrors{kind="request"}`). One the gateway aborted itself
   * (`abort`: a client gone, a pump stopped, a resume past its deadline) has
   * no outcome of the upstream's: neither timed nor counted.
   */
  async timeUpstream<T extends { readonly statusCode: number }> (method: string, send: () => Promise<T>, abort?: { readonly aborted: boolean }): Promise<T> {
    const end = this.upstreamRequestDuration.startTimer({ method })
    try {
      const res = await send()
      end({ status_class: statusClass(res.statusCode) })
      return res
    } catch (err) {
      if (abort?.aborted !== true) {
        end({ status_class: 'error' })
        this.upstreamErrors.inc({ kind: 'request' })
      }
      throw err
    }
  }

  /** Time a store operation, counting failures (and trace it, tracing on). */
  timeStore<T> (op: StoreOp, fn: () => Promise<T>): Promise<T> {
    if (this.#tracer === undefined) return this.#timed(op, fn)
    return traceStoreOperation(this.#tracer, op, async () => await this.#timed(op, fn))
  }

  async #timed<T> (op: StoreOp, fn: () => Promise<T>): Promise<T> {
    const started = performance.now()
    try {
      const result = await fn()
      if (this.#storeDownSince !== undefined) this.#storeBack()
      return result
    } catch (err) {
      // The store answered: no such session (deleted, expired, lost). Not an outage.
      if (err instanceof SessionGoneError) throw err
      this.storeErrors.inc({ op })
      this.#storeFailed(op, err)
      throw err
    } finally {
      this.#storeTimer(op).observe((performance.now() - started) / 1000)
    }
  }

  /**
   * Log one line when store operations start failing and one when they
   * succeed again (with how long and how many), whatever the number of
   * requests that failed in between: each of those has its own 503 already.
   */
  reportStoreHealth (log: Pick<FastifyBaseLogger, 'warn' | 'info'>): void {
    this.#storeLog = log
  }

  #storeFailed (op: StoreOp, err: unknown): void {
    this.#storeFailures++
    if (this.#storeDownSince !== undefined) return
    this.#storeDownSince = Date.now()
    this.#storeLog?.warn({ op, err }, 'event store: operations failing; requests that need it get 503 until it answers')
  }

  #storeBack (): void {
    this.#storeLog?.info({ downMs: Date.now() - (this.#storeDownSince as number), failedOperations: this.#storeFailures }, 'event store: answering again')
    this.#storeDownSince = undefined
    this.#storeFailures = 0
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
