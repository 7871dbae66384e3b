import { randomBytes } from 'node:crypto'
import type { RedisOptions } from 'ioredis'
import { SessionGoneError } from '../../errors.js'
import { randomToken } from '../../protocol/event-id.js'
import { STANDALONE_STREAM, SUBSCRIPTIONS_MAX } from '../contract.js'
import type { EventBatch } from '../batch/event-batch.js'
import type { NumberedBatch } from '../batch/numbered-batch.js'
import type {
  AdoptOptions, Adoption, AdoptionSettlement, AdoptionVerdict, AppendOptions, CreateSessionOptions, EventInput, EventStore, NoticeListener, ReadResult, RetentionLimits,
  SessionRecipe, SessionRecord, SessionStateChange, StalledWait, StoredEvent, StreamState, UpstreamPlacement
} from '../contract.js'
import type { ControlListener, ControlSubscription } from '../../cluster/lease.js'
import { Appender } from './append.js'
import type { AppendWrite } from './append-writes.js'
import { openConnection, quit, storeConnections, type Connection, type RedisTarget, type StoreConnections, type StoreLogger } from './connection.js'
import { waitForClusterReady } from './cluster-ready.js'
import { KeyLayout, RECORD_FIELDS } from './key-layout.js'
import { RedisLeaseBackend } from './lease-backend.js'
import { defineCommands, isReply, ROLLED_BACK, type RecordReply, type ScriptedConnection } from './lua.js'
import { AUDIENCE_REFRESH_MS, NoticeBus } from './notice-bus.js'
import { Reader } from './read.js'
import { isSentinelRoundError, SentinelRounds } from './sentinel-rounds.js'
import { ConnectionWatchdog, noneReplaced, watchedOptions } from './watchdog.js'

export { ENTRY_MAX_BYTES, SPLIT_MIN_BYTES } from './append.js'
export { AUDIENCE_REFRESH_MS } from './notice-bus.js'
export { READ_SPLIT_MIN_BYTES } from './read.js'
export type { Connection, RedisAddress, RedisTarget } from './connection.js'
export type { AppendWrite } from './append-writes.js'

export interface RedisStoreOptions {
  /** Command connection. The store owns it from now on: close() quits it. */
  readonly redis: Connection
  /** A second connection, used only for SUBSCRIBE. Owned by the store too. */
  readonly subscriber: Connection
  /** Prepended to every key and channel; no `{` or `}` (the hash tag is the session's). */
  readonly keyPrefix: string
  readonly retention: RetentionLimits
  /** Tells this replica's notices from the others'; random when absent. */
  readonly replicaId?: string
  readonly random?: (size: number) => Uint8Array
  readonly logger?: StoreLogger
  /** See AUDIENCE_REFRESH_MS (tests shorten it); audiences expire after four of these. */
  readonly audienceRefreshMs?: number
  /** How appends reach Redis (append-writes.ts); `zero-copy` when absent. */
  readonly appendWrite?: AppendWrite
  /**
   * REDIS_SOCKET_TIMEOUT_MS: a connection whose PING (or handshake) waits
   * this long with nothing read from it is closed and opened again, and what
   * waited on it is sent again there (watchdog.ts). connect() also bounds
   * each connection attempt by it. Unchecked when absent.
   */
  readonly socketTimeoutMs?: number
}

/** Where Redis is, and the store's own options (every one but its two connections, which connect() opens). */
export type RedisStoreConnectOptions = RedisTarget & Omit<RedisStoreOptions, 'redis' | 'subscriber'> & {
  /** Extra ioredis options for both connections. */
  readonly redisOptions?: RedisOptions
}

/** The session's stream set changing under a reset this often in a row means something is wrong. */
const RESET_ATTEMPTS = 16

/**
 * Redis Streams event store: one Redis stream per (session, stream), every key
 * of a session under the hash tag `{<session>}` (key-layout.ts). A facade over
 * the appends (append.ts), reads (read.ts), live notices (notice-bus.ts) and
 * the session records kept here; the scripts are in commands/.
 *
 * Connections: exactly two, whatever the number of sessions and subscribers.
 * Commands (all short, never blocking) share the command connection; live
 * notices come over the subscriber connection (see NoticeBus).
 */
export class RedisEventStore implements EventStore {
  readonly kind = 'redis' as const
  readonly replicaId: string
  readonly #redis: ScriptedConnection
  readonly #subscriber: Connection
  readonly #connections: StoreConnections
  readonly #keys: KeyLayout
  readonly #retention: RetentionLimits
  readonly #random: (size: number) => Uint8Array
  readonly #logger: StoreLogger | undefined
  readonly #bus: NoticeBus
  readonly #watchdog: ConnectionWatchdog | undefined
  readonly #sentinelRounds: SentinelRounds
  readonly #socketTimeoutMs: number | undefined
  readonly #appender: Appender
  readonly #reader: Reader
  readonly #onError = (err: Error): void => {
    if (!isSentinelRoundError(err)) this.#logger?.warn({ err }, 'event store: redis connection error')
  }

  #leases: RedisLeaseBackend | undefined
  #closed = false

  constructor (options: RedisStoreOptions) {
    this.#keys = new KeyLayout(options.keyPrefix)
    this.#retention = Object.freeze({ ...validRetention(options.retention) })
    this.#random = options.random ?? randomBytes
    this.#logger = options.logger
    this.replicaId = options.replicaId ?? randomToken(12, this.#random)
    const appendWrite = options.appendWrite ?? 'zero-copy'
    this.#connections = storeConnections(defineCommands(options.redis, { append: appendWrite === 'ioredis' }), options.subscriber)
    this.#redis = this.#connections.redis
    this.#subscriber = options.subscriber
    this.#reader = new Reader(this.#connections, this.#keys)
    this.#bus = new NoticeBus({
      connections: this.#connections,
      keys: this.#keys,
      replicaId: this.replicaId,
      logger: options.logger,
      audienceRefreshMs: options.audienceRefreshMs ?? AUDIENCE_REFRESH_MS,
      standing: async (sessionId, streamId) => await this.#reader.standing(sessionId, streamId)
    })
    this.#appender = new Appender({ connections: this.#connections, write: appendWrite, keys: this.#keys, retention: this.#retention, replicaId: this.replicaId, bus: this.#bus })
    const timeoutMs = options.socketTimeoutMs
    this.#socketTimeoutMs = timeoutMs
    this.#watchdog = timeoutMs === undefined ? undefined : new ConnectionWatchdog({ connections: this.#connections.watched, timeoutMs, logger: options.logger })
    // On one Redis, both connections; a Cluster's go through no Sentinel.
    this.#sentinelRounds = new SentinelRounds([...this.#connections.watched()], options.logger)
    this.#redis.on('error', this.#onError)
    this.#subscriber.on('error', this.#onError)
  }

  /**
   * Open both connections (standalone Redis by URL, Cluster or Sentinel) and
   * check that Redis answers.
   */
  static async connect (options: RedisStoreConnectOptions): Promise<RedisEventStore> {
    const random = options.random ?? randomBytes
    const replicaId = options.replicaId ?? randomToken(12, random)
    // Names make the store's connections visible in CLIENT LIST.
    if ('cluster' in options) {
      const auth = { ...(options.password !== undefined && { password: options.password }), ...(options.tls === true && { tls: {} }) }
      await waitForClusterReady(options.cluster, { ...options.redisOptions, ...auth }, options.logger)
    }
    const timeout = options.socketTimeoutMs
    const redisOptions: RedisOptions = { ...(timeout !== undefined && watchedOptions(timeout)), ...options.redisOptions }
    const redis = openConnection(options, `mcpgw-${replicaId}-cmd`, redisOptions, options.logger)
    const subscriber = openConnection(options, `mcpgw-${replicaId}-sub`, redisOptions, options.logger)
    // The store's options pass through whole: one added to RedisStoreOptions reaches the store.
    const store = new RedisEventStore({ ...options, redis, subscriber, replicaId, random })
    try {
      await store.ping()
    } catch (err) {
      await store.close()
      throw err
    }
    return store
  }

  async createSession (sessionId: string, principal: string, options: CreateSessionOptions = {}): Promise<SessionRecord> {
    const epoch = randomToken(8, this.#random)
    const fields: Record<string, string> = {}
    const { placement, recipe } = options
    if (placement !== undefined) {
      fields[RECORD_FIELDS.upstreamSessionId] = placement.upstreamSessionId
      if (placement.endpoint !== undefined) fields[RECORD_FIELDS.endpoint] = placement.endpoint
    }
    if (recipe !== undefined) {
      fields[RECORD_FIELDS.initialize] = recipe.initialize
      fields[RECORD_FIELDS.initializeResult] = recipe.initializeResult
    }
    await this.#reset(sessionId, { epoch, principal, fields }, { listStreams: false })
    return recordOf(sessionId, [epoch, principal, placement?.upstreamSessionId ?? '', placement?.endpoint ?? ''])
  }

  async getSession (sessionId: string): Promise<SessionRecord | null> {
    const keys = this.#keys.session(sessionId)
    const reply = await this.#redis.mcpgwTouch(keys.meta, keys.stream(STANDALONE_STREAM), keys.ledger(STANDALONE_STREAM), this.#retention.ttlMs)
    return reply === null ? null : recordOf(sessionId, reply)
  }

  async movePlacement (sessionId: string, expected: string, next: UpstreamPlacement): Promise<SessionRecord | null> {
    const keys = this.#keys.session(sessionId)
    const reply = await this.#redis.mcpgwMovePlacement(keys.meta, sessionId, expected, next.upstreamSessionId, next.endpoint ?? '', STANDALONE_STREAM)
    return reply === null ? null : recordOf(sessionId, reply)
  }

  async acquireSessionFence (sessionId: string, token: string, ttlMs: number): Promise<boolean> {
    return await this.#redis.set(this.#keys.session(sessionId).fence, token, 'PX', ttlMs, 'NX') === 'OK'
  }

  async releaseSessionFence (sessionId: string, token: string): Promise<void> {
    await this.#redis.mcpgwFenceRelease(this.#keys.session(sessionId).fence, token)
  }

  async recipe (sessionId: string): Promise<SessionRecipe | null> {
    const keys = this.#keys.session(sessionId)
    const [initialize, initializeResult, logLevel, subscriptions, incomplete] = await this.#redis.hmget(keys.meta,
      RECORD_FIELDS.initialize, RECORD_FIELDS.initializeResult, RECORD_FIELDS.logLevel, RECORD_FIELDS.subscriptions, RECORD_FIELDS.incomplete)
    if (initialize == null || initializeResult == null) return null
    const list: unknown = JSON.parse(subscriptions ?? '[]')
    return {
      initialize,
      initializeResult,
      ...(logLevel != null && { logLevel }),
      subscriptions: Array.isArray(list) ? list.filter((uri): uri is string => typeof uri === 'string') : [],
      complete: incomplete == null
    }
  }

  async recordSessionState (sessionId: string, change: SessionStateChange): Promise<void> {
    const keys = this.#keys.session(sessionId)
    await this.#redis.mcpgwSessionState(keys.meta, change.kind, stateValue(change),
      SUBSCRIPTIONS_MAX.count, SUBSCRIPTIONS_MAX.bytes)
  }

  async deleteSession (sessionId: string): Promise<void> {
    await this.#reset(sessionId, undefined, { listStreams: true, mark: true })
  }

  /** The deletion mark reset.lua leaves for RETENTION_TTL_SECONDS. */
  async sessionDeleted (sessionId: string): Promise<boolean> {
    return await this.#redis.exists(this.#keys.session(sessionId).deleted) === 1
  }

  async adoptSession (sessionId: string, principal: string, { placement, hold, confirmation }: AdoptOptions): Promise<Adoption | null> {
    const keys = this.#keys.session(sessionId)
    const epoch = randomToken(8, this.#random)
    const reply = await this.#redis.mcpgwAdopt(keys.meta, keys.lease, keys.attached, keys.stream(STANDALONE_STREAM), keys.ledger(STANDALONE_STREAM), keys.deleted,
      epoch, principal, this.#retention.ttlMs, placement?.upstreamSessionId ?? '', placement?.endpoint ?? '',
      hold?.token ?? '', hold?.ttlMs ?? 0, STANDALONE_STREAM, confirmation === 'confirmed' ? '1' : '0')
    if (reply === null) return null
    // A new record: what this replica knew of the session's writes is history.
    const created = reply[0] === epoch
    if (created) {
      this.#appender.forget(sessionId)
      this.#bus.publishRecordedAgain(sessionId).catch((err: unknown) => {
        this.#logger?.warn({ err }, 'event store: could not tell the other replicas of a session recorded again (they catch up at their next audience refresh)')
      })
    }
    return { record: recordOf(sessionId, reply), created }
  }

  async settleAdoption (sessionId: string, epoch: string, verdict: AdoptionVerdict): Promise<AdoptionSettlement> {
    const keys = this.#keys.session(sessionId)
    const settled = await this.#redis.mcpgwSettleAdoption(keys.meta, epoch, verdict)
    if (settled !== 1) return 'kept'
    // Dropped only if nothing changed since: reset.lua checks again, with the deletion, and
    // marks it when an adoption of the epoch was refused.
    const reset = await this.#reset(sessionId, undefined, { listStreams: true, onlyIn: epoch })
    return reset === 'reset' ? 'dropped' : reset
  }

  /**
   * One key without a hash tag or TTL, `<prefix>intact`: Redis restarted
   * empty (or a new Redis) has none, and the first replica to ask after that
   * sets it to the time it asked.
   */
  async intactSince (): Promise<number> {
    return Number(await this.#redis.mcpgwIntact(this.#keys.intact, Date.now()))
  }

  /** Leases live next to the sessions, on this store's connections (see cluster/lease.ts). */
  leaseBackend (): RedisLeaseBackend {
    this.#leases ??= new RedisLeaseBackend({
      connections: this.#connections,
      replicaId: this.replicaId,
      keys: this.#keys,
      bus: this.#bus,
      retention: this.#retention
    })
    return this.#leases
  }

  async openStream (sessionId: string, streamId: string): Promise<StreamState> {
    const keys = this.#keys.session(sessionId, streamId)
    const reply = await this.#redis.mcpgwOpen(keys.meta, keys.stream(streamId), streamId, this.#retention.ttlMs)
    if (reply === null) throw new SessionGoneError(sessionId)
    return { epoch: reply[0], lastSeq: reply[1], firstSeq: reply[2], ended: reply[3] === 1 }
  }

  async append (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions = {}): Promise<StoredEvent[]> {
    return (await this.appendBatch(sessionId, streamId, events, options)).events.slice()
  }

  async appendBatch (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions = {}): Promise<NumberedBatch> {
    if (Array.isArray(events)) {
      for (const event of events as readonly EventInput[]) {
        if (event.frame === undefined ? typeof event.data !== 'string' : !Buffer.isBuffer(event.frame)) throw new TypeError('an event needs a string data or a Buffer frame')
      }
    }
    try {
      return await this.#appender.append(sessionId, streamId, events, options)
    } catch (err) {
      if (!isReply(err, ROLLED_BACK)) throw err
    }
    // Redis lost writes it had acknowledged (and clients may have seen): the
    // session's history cannot be trusted. A new epoch makes every resume
    // with an older id see an explicit `epoch` gap instead of wrong events.
    await this.#rotateEpoch(sessionId)
    return await this.#appender.append(sessionId, streamId, events, options)
  }

  async end (sessionId: string, streamId: string): Promise<void> {
    await this.append(sessionId, streamId, [], { end: true })
  }

  async read (sessionId: string, streamId: string, afterSeq: number, limit: number, maxBytes = Infinity): Promise<ReadResult | null> {
    return await this.#reader.read(sessionId, streamId, afterSeq, limit, maxBytes)
  }

  async state (sessionId: string, streamId: string): Promise<StreamState | null> {
    return await this.#reader.state(sessionId, streamId)
  }

  /** A no-op when the session or stream is unknown: there is nothing left to resume. */
  async saveCursor (sessionId: string, streamId: string, seq: number): Promise<void> {
    if (!Number.isSafeInteger(seq) || seq < 0) throw new RangeError('seq must be a non-negative integer')
    const keys = this.#keys.session(sessionId, streamId)
    await this.#redis.mcpgwSaveCursor(keys.meta, keys.stream(streamId), keys.ledger(streamId), streamId, seq, this.#retention.ttlMs)
  }

  async loadCursor (sessionId: string, streamId: string): Promise<number> {
    const keys = this.#keys.session(sessionId, streamId)
    const value = await this.#redis.hget(keys.meta, `c:${streamId}`)
    return value === null ? 0 : Number(value)
  }

  subscribe (sessionId: string, streamId: string, listener: NoticeListener): () => void {
    return this.#bus.subscribe(sessionId, streamId, listener)
  }

  /** Lease coordination messages of a session (see NoticeBus.subscribeControl). */
  subscribeControl (sessionId: string, listener: ControlListener): ControlSubscription {
    return this.#bus.subscribeControl(sessionId, listener)
  }

  /** Connections the watchdog closed (none when REDIS_SOCKET_TIMEOUT_MS leaves it off). */
  connectionsReplaced (): Readonly<Record<StalledWait, number>> {
    return this.#watchdog?.replaced() ?? noneReplaced()
  }

  async ping (): Promise<void> {
    // The subscriber connection matters too: without it no notice arrives.
    await Promise.all([this.#redis.ping(), this.#subscriber.ping()])
  }

  async close (): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    this.#bus.close()
    this.#watchdog?.close()
    this.#sentinelRounds.close()
    // A frozen Redis does not answer QUIT: the connections are then closed after the timeout.
    await Promise.all([quit(this.#redis, this.#socketTimeoutMs), quit(this.#subscriber, this.#socketTimeoutMs)])
    this.#redis.off('error', this.#onError)
    this.#subscriber.off('error', this.#onError)
  }

  /** Start a new epoch for the session (same principal, placement and recipe, empty streams): its history was lost. */
  async #rotateEpoch (sessionId: string): Promise<void> {
    const keys = this.#keys.session(sessionId)
    const kept = Object.values(RECORD_FIELDS)
    const [principal, ...values] = await this.#redis.hmget(keys.meta, 'principal', ...kept)
    if (principal == null) throw new SessionGoneError(sessionId)
    const fields: Record<string, string> = {}
    kept.forEach((field, i) => { const value = values[i]; if (value != null) fields[field] = value })
    const epoch = randomToken(8, this.#random)
    this.#logger?.error?.({ epoch }, 'event store: Redis lost acknowledged writes (restart from an older snapshot or failover to a lagging replica): the session starts a new epoch, resuming clients are told')
    await this.#reset(sessionId, { epoch, principal, fields }, { listStreams: true })
  }

  /**
   * Delete every key of the session and, given a record, write it. The
   * script must see the stream keys in KEYS, so they are listed first and the
   * script refuses (we list again) if a stream appeared in between. Without
   * `listStreams` (a new session, which has none but for a reused id) the
   * first try lists none without asking, a round trip less. `onlyIn`: only
   * while the record is in that epoch, with no adoption confirmed or
   * pending (`kept` when it was not). `mark`: a deletion leaves the deletion
   * mark (sessionDeleted): `deleted`, else `reset`.
   */
  async #reset (sessionId: string, record: NewRecord | undefined, { listStreams, onlyIn, mark = false }: { listStreams: boolean, onlyIn?: string, mark?: boolean }): Promise<'kept' | 'reset' | 'deleted'> {
    const keys = this.#keys.session(sessionId)
    // A conditional drop may keep the session: what is known of its writes stays until it does not.
    if (onlyIn === undefined) this.#appender.forget(sessionId)
    for (let attempt = 0; attempt < RESET_ATTEMPTS; attempt++) {
      const streamIds = attempt === 0 && !listStreams
        ? []
        : (await this.#redis.hkeys(keys.meta)).filter((field) => field.startsWith('q:')).map((field) => field.slice(2))
      const done = await this.#redis.mcpgwReset(4 + 2 * streamIds.length,
        keys.meta, keys.lease, keys.attached, keys.deleted, ...streamIds.map(id => keys.stream(id)), ...streamIds.map(id => keys.ledger(id)),
        record?.epoch ?? '', record?.principal ?? '', this.#retention.ttlMs,
        record === undefined || Object.keys(record.fields).length === 0 ? '' : JSON.stringify(record.fields), onlyIn ?? '', mark ? '1' : '', ...streamIds)
      if (done === 2) return 'kept'
      if (done === 1 || done === 3) {
        this.#appender.forget(sessionId)
        return done === 3 ? 'deleted' : 'reset'
      }
    }
    throw new Error(`event store: the streams of session ${sessionId.slice(0, 8)}... kept changing during a reset`)
  }
}

/** A record as #reset writes it: epoch, principal, and the other fields of the session hash. */
interface NewRecord { readonly epoch: string, readonly principal: string, readonly fields: Readonly<Record<string, string>> }

function recordOf (sessionId: string, [epoch, principal, upstreamSessionId, endpoint]: RecordReply): SessionRecord {
  return {
    epoch,
    principal,
    upstreamSessionId: upstreamSessionId === '' ? sessionId : upstreamSessionId,
    ...(endpoint !== '' && { endpoint })
  }
}

function validRetention (retention: RetentionLimits): RetentionLimits {
  const { maxEvents, maxBytes, ttlMs } = retention
  if (!Number.isSafeInteger(maxEvents) || maxEvents < 1) throw new RangeError('retention.maxEvents must be an integer >= 1')
  if (!Number.isSafeInteger(maxBytes) || maxBytes < 0) throw new RangeError('retention.maxBytes must be an integer >= 0')
  if (!Number.isSafeInteger(ttlMs) || ttlMs < 1) throw new RangeError('retention.ttlMs must be an integer >= 1')
  return { maxEvents, maxBytes, ttlMs }
}

/** What session-state-1.lua keeps of a change: the request, the URI, or nothing. */
function stateValue (change: SessionStateChange): string {
  switch (change.kind) {
    case 'log_level': return change.request
    case 'subscribe':
    case 'unsubscribe': return change.uri
    case 'untracked': return ''
  }
}
