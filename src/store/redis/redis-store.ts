import { randomBytes } from 'node:crypto'
import { Cluster, Command, Redis } from 'ioredis'
import type { ClusterOptions, RedisOptions } from 'ioredis'
import type { BaseLogger } from 'pino'
import { LeaseLostError, SessionGoneError } from '../../errors.js'
import { randomToken } from '../../protocol/event-id.js'
import { STANDALONE_STREAM } from '../contract.js'
import { BatchNotice, EventBatch, FLAG_EVENT, FLAG_FRAME, FLAG_UPSTREAM_ID, NumberedBatch } from '../batch.js'
import type {
  AppendOptions, EventInput, EventStore, NoticeListener, ReadResult, RetentionLimits,
  SessionRecord, StoredEvent, StreamNotice, StreamState
} from '../contract.js'
import type { ControlListener, ControlSubscription } from '../../cluster/lease.js'
import { parseControl, RedisLeaseBackend, type LeaseKeys } from './lease-backend.js'
import { bufferCommand, corkForTurn, isNoScript, RespArgs, ScriptCall } from './script-call.js'
import { redisUrlOptions } from './redis-url.js'
import { ADOPT, APPEND, APPEND_SPLIT, FENCED, INTACT, JOIN, OPEN, READ, READ_PLAN, RESET, ROLLED_BACK, SAVE_CURSOR, TOUCH, UNPARK, UNSPLIT } from './scripts.js'

export type Connection = Redis | Cluster

/**
 * Largest stream entry an append writes (a batch larger than this becomes
 * several entries, still in one script call). A replay page reads whole
 * entries, so a page of a few hundred events must not read megabytes: with
 * one entry per append of up to 512 KiB (the read-ahead's bound then), replaying
 * 10,000 events went from 221,000 to 81,000 events/s in one run. Above the
 * read-ahead's floor (256 KiB and the read that passed it), so that many busy
 * streams still append one entry each.
 */
export const ENTRY_MAX_BYTES = 384 * 1024

/** The APPEND script, its events' bytes written to the connection without a copy (see script-call.ts). */
export const APPEND_CALL = new ScriptCall(APPEND, 5)
const APPEND_SPLIT_CALL = new ScriptCall(APPEND_SPLIT, 6)

/**
 * Batches of at least this many bytes go to Redis past its Lua (APPEND_SPLIT,
 * see scripts.ts), where that is possible. The transaction costs the gateway
 * more than one script call (five commands and their replies instead of one):
 * serial appends on this project's machine, Redis / gateway CPU per event,
 * APPEND against APPEND_SPLIT: 8 KB batches 2.7 / 2.6 against 2.3 / 3.1 us,
 * 31 KB 1.0 / 0.8 against 0.65 / 0.8, 275 KB 0.56 / 0.28 against 0.13 /
 * 0.15. The gateway is the busier of the two, so only from where it loses
 * nothing.
 */
export const SPLIT_MIN_BYTES = 32 * 1024

/**
 * Pages whose entries come to at least this many bytes are read past
 * Redis's Lua too (READ_PLAN, then a plain XRANGE: a second round trip), so
 * a live follower's small reads stay one round trip.
 */
export const READ_SPLIT_MIN_BYTES = 64 * 1024
// Scripts with a variable number of keys go through ScriptCall: on Cluster,
// ioredis's auto-pipelining would route them by their first argument (the
// number of keys), to a node that may not hold them.
const JOIN_CALL = new ScriptCall(JOIN, 0)
const RESET_CALL = new ScriptCall(RESET, 0)

/**
 * How often a replica tells Redis again which sessions it listens to (their
 * audiences, see scripts.ts). An audience lost meanwhile (evicted, or a
 * failover to a replica that had not got it) is found and caught up on then.
 */
export const AUDIENCE_REFRESH_MS = 30_000
/** Audiences refreshed in one script call (standalone and Sentinel; Cluster: one each). */
const JOIN_PER_CALL = 200

type StoreLogger = Pick<BaseLogger, 'warn'> & Partial<Pick<BaseLogger, 'error'>>

export interface RedisAddress { readonly host: string, readonly port: number }

/** Where Redis is: one of a URL, Cluster seed nodes or Sentinels. */
export type RedisTarget =
  | { readonly url: string }
  | { readonly cluster: readonly RedisAddress[], readonly password?: string | undefined, readonly tls?: boolean }
  | { readonly sentinels: readonly RedisAddress[], readonly name: string, readonly password?: string | undefined, readonly tls?: boolean }

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
}

export type RedisStoreConnectOptions = RedisTarget & {
  readonly keyPrefix: string
  readonly retention: RetentionLimits
  readonly replicaId?: string
  readonly random?: (size: number) => Uint8Array
  readonly logger?: StoreLogger
  readonly audienceRefreshMs?: number
  /** Extra ioredis options for both connections. */
  readonly redisOptions?: RedisOptions
}

/** A notice as PUBLISHed: no payload, the subscriber reads the events from the store. */
interface WireNotice {
  /** Replica that appended. */
  readonly o: string
  /** Session epoch. */
  readonly p: string
  readonly s: string
  readonly t: number
  readonly e: boolean
}

interface Topic {
  /**
   * Arrays of their exact length (made by concat, not push, which leaves room
   * for 17), not Sets: a session has one or two of each, and each Set or
   * pushed array costs an idle stream about 150 bytes. Never changed in
   * place, only replaced (subscribing and unsubscribing are rare): a delivery
   * goes through the array it started with, without copying it first.
   */
  listeners: readonly NoticeListener[]
  /** Highest toSeq and ended flag already told to the listeners, per epoch. */
  epoch: string | undefined
  toSeq: number
  ended: boolean
}

interface Channel {
  readonly sessionId: string
  readonly topics: Map<string, Topic>
  /** Lease coordination messages (released, want, draining), see cluster/. */
  control: readonly ControlListener[]
  /** Settles once SUBSCRIBE took effect and this replica is in the session's audience. */
  ready: Promise<void>
}

/** Where this replica left a stream it writes: the next append expects it (see APPEND). */
interface WriteMark {
  seq: number
  fence: string
  epoch: string
  /**
   * The batch of an append that failed since: it may have been applied, so
   * the mark says something only to an identical resend of that batch (which
   * the script then recognises as applied). Another batch carries no
   * expectation, or a batch of the same length would be taken for it.
   */
  uncertain?: readonly EventInput[] | EventBatch
}

type ReadReply = [string, number, number, number, Array<[Buffer, Buffer[]]>] | null

interface ScriptCommands {
  mcpgwOpen (...args: Array<string | number>): Promise<[string, number, number, number] | null>
  /** Binary replies: frames are the upstream's bytes, whatever their encoding. */
  mcpgwReadBuffer (...args: Array<string | number>): Promise<[Buffer, number, number, number, Array<[Buffer, Buffer[]]>] | null>
  /** READ's reply, or the same with the page's entries to read (first id, last id, count) instead of them. */
  mcpgwReadPlanBuffer (...args: Array<string | number>): Promise<[Buffer, number, number, number, Array<[Buffer, Buffer[]]>] |
  [Buffer, number, number, number, [], Buffer, Buffer, number] | null>
  mcpgwTouch (...args: Array<string | number>): Promise<[string, string] | null>
  mcpgwSaveCursor (...args: Array<string | number>): Promise<number>
  mcpgwAdopt (...args: Array<string | number>): Promise<[string, string]>
  mcpgwIntact (...args: Array<string | number>): Promise<string>
}

/** The session's stream set changing under a reset this often in a row means something is wrong. */
const RESET_ATTEMPTS = 16
/** Sessions whose write marks are kept (the least recently written are forgotten first). */
const WRITE_MARK_SESSIONS = 50_000

/**
 * Redis Streams event store: one Redis stream per (session, stream), every key
 * of a session under the hash tag `{<session>}` (see scripts.ts for the layout).
 *
 * Connections: exactly two, whatever the number of sessions and subscribers.
 * Commands (all short, never blocking) share the command connection; live
 * notices come over one subscriber connection on which this replica holds one
 * SUBSCRIBE per session that has local listeners (refcounted). A blocking
 * XREAD per client would cost a connection per client, and one PSUBSCRIBE to
 * every session would make every replica receive every other replica's
 * traffic; per-session channels cost a replica only what its own clients
 * follow. Plain PUBLISH also works on Redis Cluster (broadcast to all nodes).
 */
export class RedisEventStore implements EventStore {
  readonly kind = 'redis' as const
  readonly replicaId: string
  readonly #redis: Connection & ScriptCommands
  readonly #subscriber: Connection
  readonly #prefix: string
  readonly #retention: RetentionLimits
  readonly #random: (size: number) => Uint8Array
  readonly #logger: StoreLogger | undefined
  /** Local listeners by channel name (one channel per session). */
  readonly #channels = new Map<string, Channel>()
  readonly #onMessage = (channel: string, message: string): void => this.#receive(channel, message)
  readonly #onReady = (): void => this.#resubscribe()
  readonly #onError = (err: Error): void => this.#logger?.warn({ err }, 'event store: redis connection error')
  /** Per session, per stream this replica writes: where it left it. */
  readonly #marks = new Map<string, Map<string, WriteMark>>()
  #leases: RedisLeaseBackend | undefined
  readonly #audienceTtlMs: number
  readonly #audienceTimer: NodeJS.Timeout
  #closed = false

  constructor (options: RedisStoreOptions) {
    if (options.keyPrefix.includes('{') || options.keyPrefix.includes('}')) {
      throw new TypeError('RedisEventStore: keyPrefix must not contain "{" or "}" (the hash tag is the session id)')
    }
    this.#retention = Object.freeze({ ...validRetention(options.retention) })
    this.#prefix = options.keyPrefix
    this.#random = options.random ?? randomBytes
    this.#logger = options.logger
    this.replicaId = options.replicaId ?? randomToken(12, this.#random)

    const redis = options.redis
    redis.defineCommand('mcpgwOpen', { numberOfKeys: 2, lua: OPEN })
    redis.defineCommand('mcpgwRead', { numberOfKeys: 2, lua: READ })
    redis.defineCommand('mcpgwReadPlan', { numberOfKeys: 3, lua: READ_PLAN })
    redis.defineCommand('mcpgwTouch', { numberOfKeys: 3, lua: TOUCH })
    redis.defineCommand('mcpgwSaveCursor', { numberOfKeys: 3, lua: SAVE_CURSOR })
    redis.defineCommand('mcpgwAdopt', { numberOfKeys: 5, lua: ADOPT })
    redis.defineCommand('mcpgwIntact', { numberOfKeys: 1, lua: INTACT })
    this.#redis = redis as Connection & ScriptCommands
    this.#subscriber = options.subscriber
    // The store subscribes again itself when the connection is back (#resubscribe, which
    // also catches up). ioredis would too, and its SUBSCRIBE has no error handler: the
    // connection closing before the reply made an unhandled rejection.
    if (options.subscriber instanceof Redis) options.subscriber.options.autoResubscribe = false

    redis.on('error', this.#onError)
    this.#subscriber.on('error', this.#onError)
    this.#subscriber.on('message', this.#onMessage)
    this.#subscriber.on('ready', this.#onReady)
    const refreshMs = options.audienceRefreshMs ?? AUDIENCE_REFRESH_MS
    this.#audienceTtlMs = 4 * refreshMs
    this.#audienceTimer = setInterval(() => { this.#refreshAudiences() }, refreshMs).unref()
  }

  /**
   * Open both connections (standalone Redis by URL, Cluster or Sentinel) and
   * check that Redis answers.
   */
  static async connect (options: RedisStoreConnectOptions): Promise<RedisEventStore> {
    const random = options.random ?? randomBytes
    const replicaId = options.replicaId ?? randomToken(12, random)
    // Names make the store's connections visible in CLIENT LIST.
    const redis = openConnection(options, `mcpgw-${replicaId}-cmd`)
    const subscriber = openConnection(options, `mcpgw-${replicaId}-sub`)
    const store = new RedisEventStore({
      redis,
      subscriber,
      keyPrefix: options.keyPrefix,
      retention: options.retention,
      replicaId,
      random,
      ...(options.logger === undefined ? {} : { logger: options.logger }),
      ...(options.audienceRefreshMs === undefined ? {} : { audienceRefreshMs: options.audienceRefreshMs })
    })
    try {
      await store.ping()
    } catch (err) {
      await store.close()
      throw err
    }
    return store
  }

  async createSession (sessionId: string, principal: string): Promise<SessionRecord> {
    const epoch = randomToken(8, this.#random)
    await this.#reset(sessionId, epoch, principal, false)
    return { epoch, principal }
  }

  async getSession (sessionId: string): Promise<SessionRecord | null> {
    const keys = this.#keys(sessionId)
    const reply = await this.#redis.mcpgwTouch(keys.meta, keys.stream(STANDALONE_STREAM), keys.ledger(STANDALONE_STREAM), this.#retention.ttlMs)
    return reply === null ? null : { epoch: reply[0], principal: reply[1] }
  }

  async deleteSession (sessionId: string): Promise<void> {
    await this.#reset(sessionId, '', '')
  }

  async adoptSession (sessionId: string, principal: string): Promise<SessionRecord> {
    const keys = this.#keys(sessionId)
    const epoch = randomToken(8, this.#random)
    const reply = await this.#redis.mcpgwAdopt(keys.meta, keys.lease, keys.attached, keys.stream(STANDALONE_STREAM), keys.ledger(STANDALONE_STREAM),
      epoch, principal, this.#retention.ttlMs)
    // A new record: what this replica knew of the session's writes is history.
    if (reply[0] === epoch) this.#marks.delete(sessionId)
    return { epoch: reply[0], principal: reply[1] }
  }

  /**
   * One key without a hash tag or TTL, `<prefix>intact`: Redis restarted
   * empty (or a new Redis) has none, and the first replica to ask after that
   * sets it to the time it asked.
   */
  async intactSince (): Promise<number> {
    return Number(await this.#redis.mcpgwIntact(`${this.#prefix}intact`, Date.now()))
  }

  /** Lease primitives on this store's connections (see cluster/lease.ts). */
  leaseBackend (): RedisLeaseBackend {
    this.#leases ??= new RedisLeaseBackend({
      redis: this.#redis,
      replicaId: this.replicaId,
      keys: (sessionId) => this.#keys(sessionId),
      pushKey: (args, sessionId, key) => { this.#pushKey(args, sessionId, key === 'lease' ? '}:lease' : '}:m') },
      subscribeControl: (sessionId, listener) => this.subscribeControl(sessionId, listener),
      aliveKey: (replicaId) => `${this.#prefix}r:${replicaId}:alive`,
      retention: this.#retention,
      deliver: (sessionId, epoch, notice) => this.#deliver(this.#keys(sessionId).channel, epoch, notice)
    })
    return this.#leases
  }

  async openStream (sessionId: string, streamId: string): Promise<StreamState> {
    const keys = this.#keys(sessionId, streamId)
    const reply = await this.#redis.mcpgwOpen(keys.meta, keys.stream(streamId), streamId, this.#retention.ttlMs)
    if (reply === null) throw new SessionGoneError(sessionId)
    return { epoch: reply[0], lastSeq: reply[1], firstSeq: reply[2], ended: reply[3] === 1 }
  }

  async append (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions = {}): Promise<StoredEvent[]> {
    return (await this.appendBatch(sessionId, streamId, events, options)).events.slice()
  }

  async appendBatch (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions = {}): Promise<NumberedBatch> {
    if (!(events instanceof EventBatch)) {
      for (const event of events) {
        if (event.frame === undefined ? typeof event.data !== 'string' : !Buffer.isBuffer(event.frame)) throw new TypeError('an event needs a string data or a Buffer frame')
      }
    }
    try {
      return await this.#append(sessionId, streamId, events, options)
    } catch (err) {
      if (!isReply(err, ROLLED_BACK)) throw err
    }
    // Redis lost writes it had acknowledged (and clients may have seen): the
    // session's history cannot be trusted. A new epoch makes every resume
    // with an older id see an explicit `epoch` gap instead of wrong events.
    await this.#rotateEpoch(sessionId)
    return await this.#append(sessionId, streamId, events, options)
  }

  async #append (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions): Promise<NumberedBatch> {
    const batch = events instanceof EventBatch ? events : EventBatch.from(events)
    const keys = this.#keys(sessionId, streamId)
    const { maxEvents, maxBytes, ttlMs } = this.#retention
    const ending = options.end === true
    const fence = options.fence ?? ''
    const mark = this.#marks.get(sessionId)?.get(streamId)
    // A mark left under another lease says nothing: someone else wrote since.
    const known = mark !== undefined && mark.fence === fence && (mark.uncertain === undefined || mark.uncertain === events)
    const head: Array<string | number> = [
      streamId, maxEvents, maxBytes, ttlMs, ending ? '1' : '0', keys.channel, this.replicaId,
      fence, known ? mark.seq : -1, known ? mark.epoch : '', batch.lastUpstreamId, batch.length
    ]
    // Cut so that no entry is much larger than ENTRY_MAX_BYTES.
    const runs = batch.runs(ENTRY_MAX_BYTES)
    let reply: AppendReply | null | undefined
    try {
      const redis = this.#redis
      if (known && redis instanceof Redis && batch.bytes.length >= SPLIT_MIN_BYTES &&
        batch.length <= maxEvents && batch.bytes.length <= maxBytes) {
        reply = await appendSplit(redis, keys, streamId, head, runs, mark.seq + 1)
      }
      if (reply === undefined) {
        // The batch as APPEND takes it: after the head, each entry's count, layout and bytes.
        const args: Array<string | number | Buffer> = [keys.meta, keys.stream(streamId), keys.lease, keys.ledger(streamId), keys.audience, ...head]
        for (const run of runs) args.push(run.count, run.layout, run.bytes)
        reply = await APPEND_CALL.call(redis, args) as AppendReply | null
      }
    } catch (err) {
      // The connection may still hold the failed append's bytes (to resend them
      // after a reconnect): they are never reused for another batch.
      batch.retain()
      if (isReply(err, FENCED)) throw new LeaseLostError(sessionId)
      if (known && batch.length > 0) mark.uncertain = events
      throw err
    }
    if (reply === null) {
      this.#marks.delete(sessionId)
      throw new SessionGoneError(sessionId)
    }
    // A batch Redis had already applied (resent after a reconnect) comes back as if applied now.
    const [epoch, previous, ended] = reply
    this.#mark(sessionId, streamId, ended === 1 ? undefined : { seq: previous + batch.length, fence, epoch })
    const stored = new NumberedBatch(batch, previous + 1)
    if (stored.length > 0 || ending) {
      // Local listeners get the events themselves: no read back from Redis.
      this.#deliver(keys.channel, epoch, new BatchNotice(streamId, stored.lastSeq, ended === 1, stored, epoch))
    }
    return stored
  }

  async end (sessionId: string, streamId: string): Promise<void> {
    await this.append(sessionId, streamId, [], { end: true })
  }

  async read (sessionId: string, streamId: string, afterSeq: number, limit: number, maxBytes = Infinity): Promise<ReadResult | null> {
    if (!Number.isSafeInteger(afterSeq) || afterSeq < 0) throw new RangeError('afterSeq must be a non-negative integer')
    if (!Number.isSafeInteger(limit) || limit < 0) throw new RangeError('limit must be a non-negative integer')
    if (!(maxBytes >= 0)) throw new RangeError('maxBytes must be a non-negative number')
    const reply = await this.#read(sessionId, streamId, afterSeq, limit, maxBytes)
    if (reply === null) return null
    const [epoch, lastSeq, firstSeq, ended, rows] = reply
    return { events: unpackEntries(rows, Math.max(afterSeq + 1, firstSeq), limit, maxBytes), state: { epoch, lastSeq, firstSeq, ended: ended === 1 } }
  }

  async state (sessionId: string, streamId: string): Promise<StreamState | null> {
    const reply = await this.#read(sessionId, streamId, 0, 0, 0)
    if (reply === null) return null
    return { epoch: reply[0], lastSeq: reply[1], firstSeq: reply[2], ended: reply[3] === 1 }
  }

  /** A no-op when the session or stream is unknown: there is nothing left to resume. */
  async saveCursor (sessionId: string, streamId: string, seq: number): Promise<void> {
    if (!Number.isSafeInteger(seq) || seq < 0) throw new RangeError('seq must be a non-negative integer')
    const keys = this.#keys(sessionId, streamId)
    await this.#redis.mcpgwSaveCursor(keys.meta, keys.stream(streamId), keys.ledger(streamId), streamId, seq, this.#retention.ttlMs)
  }

  async loadCursor (sessionId: string, streamId: string): Promise<number> {
    const keys = this.#keys(sessionId, streamId)
    const value = await this.#redis.hget(keys.meta, `c:${streamId}`)
    return value === null ? 0 : Number(value)
  }

  subscribe (sessionId: string, streamId: string, listener: NoticeListener): () => void {
    const name = this.#keys(sessionId, streamId).channel
    const channel = this.#channel(sessionId, name)
    let topic = channel.topics.get(streamId)
    if (topic === undefined) {
      topic = { listeners: [], epoch: undefined, toSeq: 0, ended: false }
      channel.topics.set(streamId, topic)
    }
    topic.listeners = topic.listeners.concat(listener)

    let subscribed = true
    return () => {
      if (!subscribed) return
      subscribed = false
      topic.listeners = without(topic.listeners, listener)
      if (topic.listeners.length > 0) return
      channel.topics.delete(streamId)
      this.#release(name, channel)
    }
  }

  /**
   * Lease coordination messages of a session, on the same per-session
   * channel (and subscription) as its notices: no extra connection.
   */
  subscribeControl (sessionId: string, listener: ControlListener): ControlSubscription {
    const name = this.#keys(sessionId).channel
    const channel = this.#channel(sessionId, name)
    channel.control = channel.control.concat(listener)
    let subscribed = true
    return {
      ready: channel.ready,
      off: () => {
        if (!subscribed) return
        subscribed = false
        channel.control = without(channel.control, listener)
        this.#release(name, channel)
      }
    }
  }

  #channel (sessionId: string, name: string): Channel {
    let channel = this.#channels.get(name)
    if (channel === undefined) {
      channel = { sessionId, topics: new Map(), control: [], ready: Promise.resolve() }
      this.#channels.set(name, channel)
      this.#listen(name, channel)
    }
    return channel
  }

  /** UNSUBSCRIBE once a channel has no local listener left. */
  #release (name: string, channel: Channel): void {
    if (channel.topics.size > 0 || channel.control.length > 0 || this.#channels.get(name) !== channel) return
    this.#channels.delete(name)
    if (this.#closed) return
    this.#subscriber.unsubscribe(name).catch((err: unknown) => {
      this.#logger?.warn({ err, channel: name }, 'event store: UNSUBSCRIBE failed')
    })
    // After any JOIN of this channel's (same connection, sent before): appends stop notifying us.
    this.#redis.srem(this.#keys(channel.sessionId).audience, this.replicaId).catch((err: unknown) => {
      this.#logger?.warn({ err, channel: name }, 'event store: leaving the audience failed (it expires)')
    })
  }

  async ping (): Promise<void> {
    // The subscriber connection matters too: without it no notice arrives.
    await Promise.all([this.#redis.ping(), this.#subscriber.ping()])
  }

  async close (): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    clearInterval(this.#audienceTimer)
    this.#channels.clear()
    this.#subscriber.off('message', this.#onMessage)
    this.#subscriber.off('ready', this.#onReady)
    await Promise.all([quit(this.#redis), quit(this.#subscriber)])
    this.#redis.off('error', this.#onError)
    this.#subscriber.off('error', this.#onError)
  }

  /** One of a session's keys (its name's end: `}:m`, `}:lease`, `}:aud`) onto packed script arguments. */
  #pushKey (args: RespArgs, sessionId: string, end: string): void {
    args.pushParts(this.#prefix, '{', NEEDS_ESCAPE.test(sessionId) ? escapeTag(sessionId) : sessionId, end)
  }

  #keys (sessionId: string, streamId?: string): SessionKeys {
    if (typeof sessionId !== 'string' || sessionId.length === 0) throw new TypeError('session id must be a non-empty string')
    if (streamId !== undefined && (typeof streamId !== 'string' || streamId.length === 0)) {
      throw new TypeError('stream id must be a non-empty string')
    }
    return new SessionKeys(`${this.#prefix}{${escapeTag(sessionId)}}`)
  }

  async #read (sessionId: string, streamId: string, afterSeq: number, limit: number, maxBytes: number): Promise<ReadReply> {
    const keys = this.#keys(sessionId, streamId)
    const stream = keys.stream(streamId)
    // Lua numbers are doubles: no limit is the largest safe integer.
    const bound = Math.min(maxBytes, Number.MAX_SAFE_INTEGER)
    const redis = this.#redis
    if (redis instanceof Redis && limit > 0) {
      const plan = await redis.mcpgwReadPlanBuffer(keys.meta, stream, keys.ledger(streamId), streamId, afterSeq, limit, bound, READ_SPLIT_MIN_BYTES)
      if (plan === null) return null
      const epoch = plan[0].toString()
      if (plan.length === 5) return [epoch, plan[1], plan[2], plan[3], plan[4]]
      const rows = await readEntries(redis, keys.meta, stream, epoch, plan[5], plan[6], plan[7])
      // Trimmed or reset between the two round trips: READ's own way.
      if (rows !== undefined) return [epoch, plan[1], plan[2], plan[3], rows]
    }
    const reply = await redis.mcpgwReadBuffer(keys.meta, stream, streamId, afterSeq, limit, bound)
    return reply === null ? null : [reply[0].toString(), reply[1], reply[2], reply[3], reply[4]]
  }

  /** Remember where this replica left a stream it writes (undefined: forget it). */
  #mark (sessionId: string, streamId: string, mark: WriteMark | undefined): void {
    let streams = this.#marks.get(sessionId)
    if (mark === undefined) {
      streams?.delete(streamId)
      if (streams?.size === 0) this.#marks.delete(sessionId)
      return
    }
    if (streams === undefined) {
      streams = new Map()
      if (this.#marks.size >= WRITE_MARK_SESSIONS) {
        const oldest = this.#marks.keys().next().value
        if (oldest !== undefined) this.#marks.delete(oldest)
      }
    } else {
      this.#marks.delete(sessionId)
    }
    // Most recently written last: the oldest are forgotten first.
    this.#marks.set(sessionId, streams)
    streams.set(streamId, mark)
  }

  /** Start a new epoch for the session (same principal, empty streams): its history was lost. */
  async #rotateEpoch (sessionId: string): Promise<void> {
    const keys = this.#keys(sessionId)
    const principal = await this.#redis.hget(keys.meta, 'principal')
    if (principal === null) throw new SessionGoneError(sessionId)
    const epoch = randomToken(8, this.#random)
    this.#logger?.error?.({ epoch }, 'event store: Redis lost acknowledged writes (restart from an older snapshot or failover to a lagging replica): the session starts a new epoch, resuming clients are told')
    await this.#reset(sessionId, epoch, principal)
  }

  /**
   * Delete every key of the session and, given an epoch, write a new record.
   * The script must see the stream keys in KEYS, so they are listed first and
   * the script refuses (we list again) if a stream appeared in between.
   * Without `expectStreams` (a new session, which has none but for a reused
   * id) the first try lists none without asking, a round trip less.
   */
  async #reset (sessionId: string, epoch: string, principal: string, expectStreams = true): Promise<void> {
    const keys = this.#keys(sessionId)
    this.#marks.delete(sessionId)
    for (let attempt = 0; attempt < RESET_ATTEMPTS; attempt++) {
      const streamIds = attempt === 0 && !expectStreams
        ? []
        : (await this.#redis.hkeys(keys.meta)).filter((field) => field.startsWith('q:')).map((field) => field.slice(2))
      const done = await RESET_CALL.call(this.#redis, [
        keys.meta, keys.lease, keys.attached, ...streamIds.map(id => keys.stream(id)), ...streamIds.map(id => keys.ledger(id)),
        epoch, principal, this.#retention.ttlMs, ...streamIds
      ], 3 + 2 * streamIds.length)
      if (done === 1) return
    }
    throw new Error(`event store: the streams of session ${sessionId.slice(0, 8)}... kept changing during a reset`)
  }

  /**
   * SUBSCRIBE for a session's first local listener, then join its audience
   * (from then on appends elsewhere PUBLISH), then catch up on what was
   * appended before. In that order, no append goes unnoticed: one before the
   * JOIN is in the catch-up read (sent right after it, without waiting for its
   * reply, on the same connection), one after it publishes to a subscription
   * already in effect.
   */
  #listen (name: string, channel: Channel): void {
    channel.ready = this.#subscriber.subscribe(name).then(
      async () => {
        // Released meanwhile (its SREM already sent): joining now would leave us in the audience.
        if (this.#channels.get(name) !== channel) return
        // The catch-up reads go right behind the JOIN, on the same connection: Redis
        // runs them after it, and the stream opening waits one round trip less.
        const joined = JOIN_CALL.call(this.#redis, [this.#keys(channel.sessionId).audience, this.replicaId, this.#audienceTtlMs], 1)
        this.#catchUp(name, channel)
        try {
          await joined
        } catch (err) {
          // The next refresh joins (and catches up); until then appends elsewhere may not notify.
          if (!this.#closed) this.#logger?.warn({ err, channel: name }, 'event store: joining the audience failed')
        }
      },
      (err: unknown) => this.#logger?.warn({ err, channel: name }, 'event store: SUBSCRIBE failed')
    )
  }

  /**
   * Join every audience again (keeping them from expiring). One this replica
   * was missing from (lost in Redis) may have let appends go unannounced:
   * catch up on those channels.
   */
  #refreshAudiences (): void {
    if (this.#closed || this.#channels.size === 0) return
    const channels = [...this.#channels]
    // Keys of many sessions in one call only where every key lives on the one node.
    const perCall = this.#redis instanceof Cluster ? 1 : JOIN_PER_CALL
    for (let i = 0; i < channels.length; i += perCall) {
      const group = channels.slice(i, i + perCall)
      let joined: Promise<number[]>
      if (this.#redis instanceof Cluster) {
        joined = JOIN_CALL.call(this.#redis, [this.#keys((group[0] as [string, Channel])[1].sessionId).audience, this.replicaId, this.#audienceTtlMs], 1) as Promise<number[]>
      } else {
        // Key names written as they come, not made as strings (see RespArgs).
        const args = new RespArgs(Buffer.allocUnsafeSlow(perCall * 96))
        for (const [, channel] of group) this.#pushKey(args, channel.sessionId, '}:aud')
        joined = JOIN_CALL.callPacked(this.#redis, group.length, args.push(this.replicaId).push(this.#audienceTtlMs)) as Promise<number[]>
      }
      joined.then((added) => {
        group.forEach(([name, channel], j) => {
          if (added[j] === 1 && this.#channels.get(name) === channel) this.#catchUp(name, channel)
        })
      }, (err: unknown) => {
        if (!this.#closed) this.#logger?.warn({ err, sessions: group.length }, 'event store: refreshing audiences failed')
      })
    }
  }

  /**
   * After a (re)subscription, tell the listeners where each stream stands: an
   * append by another replica between the listener's own read and the moment
   * SUBSCRIBE took effect (or while the connection was down) would otherwise
   * go unnoticed until the next one. Notices already delivered are filtered out.
   */
  #catchUp (name: string, channel: Channel): void {
    for (const streamId of channel.topics.keys()) {
      this.#read(channel.sessionId, streamId, 0, 0, 0).then((reply) => {
        if (reply === null || this.#channels.get(name) !== channel) return
        this.#deliver(name, reply[0], { streamId, toSeq: reply[1], ended: reply[3] === 1 })
      }, (err: unknown) => {
        this.#logger?.warn({ err, channel: name, streamId }, 'event store: catch-up read failed')
      })
    }
  }

  /** The subscriber connection came back: notices published meanwhile are lost, so subscribe and catch up. */
  #resubscribe (): void {
    for (const [name, channel] of this.#channels) this.#listen(name, channel)
  }

  #receive (name: string, message: string): void {
    const control = parseControl(message)
    if (control !== null) {
      if (control.origin === this.replicaId) return
      const listeners = this.#channels.get(name)?.control
      for (const listener of listeners ?? []) {
        try {
          listener(control)
        } catch (err) {
          this.#logger?.warn({ err }, 'event store: control listener threw')
        }
      }
      return
    }
    const notice = parseWireNotice(message)
    if (notice === null) {
      this.#logger?.warn({ channel: name }, 'event store: malformed notice ignored')
      return
    }
    // Our own appends were delivered locally, with their events.
    if (notice.o === this.replicaId) return
    this.#deliver(name, notice.p, { streamId: notice.s, toSeq: notice.t, ended: notice.e })
  }

  /**
   * Notices reach a replica by two paths (its own appends, the subscriber
   * connection) that may interleave; a notice older than one already given
   * to the listeners carries nothing new and is dropped, so listeners see
   * toSeq only grow.
   */
  #deliver (name: string, epoch: string, notice: StreamNotice): void {
    const topic = this.#channels.get(name)?.topics.get(notice.streamId)
    if (topic === undefined) return
    if (topic.epoch !== epoch) {
      topic.epoch = epoch
      topic.toSeq = 0
      topic.ended = false
    }
    if (notice.toSeq <= topic.toSeq && (!notice.ended || topic.ended)) return
    topic.toSeq = Math.max(topic.toSeq, notice.toSeq)
    topic.ended ||= notice.ended
    // An append's own notice (a BatchNotice, whose events a spread would lose) comes with its epoch.
    const told = notice.epoch === epoch ? notice : { ...notice, epoch }
    for (const listener of topic.listeners) {
      try {
        listener(told)
      } catch (err) {
        this.#logger?.warn({ err, streamId: notice.streamId }, 'event store: notice listener threw')
      }
    }
  }
}

/**
 * The keys of one session, all under its hash tag (the layout is in
 * scripts.ts). Names are made when asked for: a call uses a few of them, and
 * a listener keeps only its channel's name, not these.
 */
class SessionKeys implements LeaseKeys {
  readonly #tag: string
  constructor (tag: string) { this.#tag = tag }
  get meta (): string { return `${this.#tag}:m` }
  get channel (): string { return `${this.#tag}:n` }
  get lease (): string { return `${this.#tag}:lease` }
  get attached (): string { return `${this.#tag}:att` }
  get audience (): string { return `${this.#tag}:aud` }
  stream (streamId: string): string { return `${this.#tag}:b:${streamId}` }
  ledger (streamId: string): string { return `${this.#tag}:z:${streamId}` }
  /** Where APPEND_SPLIT puts a stream aside, only within its transaction. */
  get aside (): string { return `${this.#tag}:aside` }
}

function validRetention (retention: RetentionLimits): RetentionLimits {
  const { maxEvents, maxBytes, ttlMs } = retention
  if (!Number.isSafeInteger(maxEvents) || maxEvents < 1) throw new RangeError('retention.maxEvents must be an integer >= 1')
  if (!Number.isSafeInteger(maxBytes) || maxBytes < 0) throw new RangeError('retention.maxBytes must be an integer >= 0')
  if (!Number.isSafeInteger(ttlMs) || ttlMs < 1) throw new RangeError('retention.ttlMs must be an integer >= 1')
  return { maxEvents, maxBytes, ttlMs }
}

const NEEDS_ESCAPE = /[%{}]/

/**
 * Session ids come from the upstream (visible ASCII). Braces would move the
 * hash tag, so they are percent-escaped (with `%` itself, to stay reversible).
 */
function escapeTag (sessionId: string): string {
  return sessionId.replace(/[%{}]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
}

/**
 * The events of stream entries (batches, see scripts.ts) numbered from `from`,
 * at most `limit`, and as many as fit in `maxBytes` (the first always).
 */
function unpackEntries (rows: Array<[Buffer, Buffer[]]>, from: number, limit: number, maxBytes: number): StoredEvent[] {
  const events: StoredEvent[] = []
  let bytes = 0
  for (const [id, fields] of rows) {
    let seq = Number.parseInt(id.toString(), 10)
    let layout = ''
    let blob: Buffer = Buffer.alloc(0)
    for (let i = 0; i + 1 < fields.length; i += 2) {
      const name = (fields[i] as Buffer)[0]
      if (name === 0x6c) layout = (fields[i + 1] as Buffer).toString() // l
      else if (name === 0x62) blob = fields[i + 1] as Buffer // b
    }
    const nums = layout.split(' ')
    let at = 0
    for (let i = 0; i + 3 < nums.length; i += 4, seq++) {
      const flags = Number(nums[i])
      const a = Number(nums[i + 1])
      const b = Number(nums[i + 2])
      const c = Number(nums[i + 3])
      const start = at
      at += a + b + c
      if (seq < from) continue
      bytes += a + b + c
      if (events.length === limit || (bytes > maxBytes && events.length > 0)) return events
      const upstreamId = (flags & FLAG_UPSTREAM_ID) !== 0 ? blob.toString('utf8', start + a + b, start + a + b + c) : undefined
      if ((flags & FLAG_FRAME) !== 0) {
        events.push({ seq, frame: blob.subarray(start, start + a), upstreamId })
      } else {
        events.push({ seq, data: blob.toString('utf8', start, start + a), event: (flags & FLAG_EVENT) !== 0 ? blob.toString('utf8', start + a, start + a + b) : undefined, upstreamId })
      }
    }
  }
  return events
}

/** APPEND's reply: epoch, the lastSeq before the batch, ended (1|0), already applied (1|0). */
type AppendReply = [string, number, number, number]

/**
 * A batch appended past Redis's Lua: APPEND_SPLIT in a MULTI with the batch's
 * XADDs (see scripts.ts). The entries' ids start at `firstSeq`, where the
 * caller expects the stream to go on. Undefined when the script refused
 * (UNSPLIT): the caller appends through APPEND.
 */
async function appendSplit (redis: Redis, keys: SessionKeys, streamId: string, head: ReadonlyArray<string | number>,
  runs: ReturnType<EventBatch['runs']>, firstSeq: number): Promise<AppendReply | null | undefined> {
  const stream = keys.stream(streamId)
  const aside = keys.aside
  const args: Array<string | number> = [keys.meta, stream, keys.lease, keys.ledger(streamId), keys.audience, aside, ...head]
  for (const run of runs) args.push(run.count, run.bytes.length)
  for (let attempt = 0; ; attempt++) {
    const commands = [APPEND_SPLIT_CALL.command(args)]
    let seq = firstSeq
    for (const run of runs) {
      commands.push(bufferCommand('xadd', [aside, 'NOMKSTREAM', `${seq}-${run.count}`, 's', run.bytes.length, 'l', run.layout, 'b', run.bytes]))
      seq += run.count
    }
    commands.push(new Command('eval', [UNPARK, 2, aside, stream], { replyEncoding: 'utf8' }))
    const replies = await transaction(redis, commands, 'utf8')
    if (replies === null) throw new Error('Redis did not run the append transaction')
    const reply = replies[0]
    if (reply instanceof Error) {
      if (isReply(reply, UNSPLIT)) return undefined
      if (isNoScript(reply) && attempt === 0) {
        APPEND_SPLIT_CALL.forget(redis)
        continue
      }
      throw reply
    }
    if (reply === null) return null
    // Accepted: every XADD must have written its entry.
    for (let i = 1; i <= runs.length; i++) {
      const added = replies[i]
      if (added instanceof Error || added === null) throw new Error(`Redis recorded the batch but not its entry ${i} of ${runs.length}: ${String(added)}`)
    }
    return reply as AppendReply
  }
}

/**
 * The entries a READ_PLAN named, read plainly: MULTI, HGET epoch, XRANGE,
 * EXEC. Undefined when they are not those any more (the session reset, an
 * entry trimmed since the plan).
 */
async function readEntries (redis: Redis, meta: string, stream: string, epoch: string,
  firstId: Buffer, lastId: Buffer, count: number): Promise<Array<[Buffer, Buffer[]]> | undefined> {
  const replies = await transaction(redis, [new Command('hget', [meta, 'epoch']), new Command('xrange', [stream, firstId, lastId])], null)
  if (replies === null) return undefined
  const [current, rows] = replies as [Buffer | null, Array<[Buffer, Buffer[]]>]
  if (current === null || current.toString() !== epoch || !Array.isArray(rows) || rows.length !== count) return undefined
  if (rows[0]?.[0].equals(firstId) !== true || rows[count - 1]?.[0].equals(lastId) !== true) return undefined
  return rows
}

/**
 * `commands` in MULTI ... EXEC, written at once; EXEC's replies (in
 * `encoding`: null for Buffers), or null when Redis aborted the transaction
 * (a WATCH; EXECABORT is thrown). Sent as ioredis sends its own pipelines: a
 * connection lost midway rejects the rest instead of sending it again
 * outside the transaction.
 */
async function transaction (redis: Redis, commands: readonly Command[], encoding: 'utf8' | null): Promise<unknown[] | null> {
  const exec = new Command('exec', [], { replyEncoding: encoding })
  const all = [new Command('multi'), ...commands, exec]
  corkForTurn(redis)
  all.forEach((command, i) => {
    command.pipelineIndex = i
    command.inTransaction = i > 0
    if (command !== exec) (redis.sendCommand(command) as Promise<unknown>).catch(ignore)
  })
  const replies = await redis.sendCommand(exec) as unknown[] | null
  return Array.isArray(replies) ? replies : null
}

function ignore (): void {}

/** An error reply of one of our scripts (see scripts.ts). */
function isReply (err: unknown, prefix: string): boolean {
  return err instanceof Error && err.name === 'ReplyError' && err.message.startsWith(prefix)
}

/** One ioredis connection to the target, named for CLIENT LIST. */
function openConnection (options: RedisStoreConnectOptions, connectionName: string): Connection {
  const base: RedisOptions = { maxRetriesPerRequest: 3, ...options.redisOptions, connectionName }
  if ('url' in options) {
    const target = redisUrlOptions(options.url)
    return typeof target === 'string' ? new Redis(target, base) : new Redis({ ...target, ...base })
  }
  const tls = options.tls === true ? {} : undefined
  const password = options.password
  if ('cluster' in options) {
    const clusterOptions: ClusterOptions = {
      redisOptions: { ...base, ...(password !== undefined && { password }), ...(tls !== undefined && { tls }) },
      // Commands issued together go out as one pipeline per node (lease ticks rely on it).
      enableAutoPipelining: true
    }
    return new Cluster(options.cluster.map(({ host, port }) => ({ host, port })), clusterOptions)
  }
  return new Redis({
    ...base,
    sentinels: options.sentinels.map(({ host, port }) => ({ host, port })),
    name: options.name,
    ...(password !== undefined && { password }),
    ...(tls !== undefined && { tls, enableTLSForSentinelMode: true })
  })
}

function parseWireNotice (message: string): WireNotice | null {
  let value: unknown
  try {
    value = JSON.parse(message)
  } catch {
    return null
  }
  if (typeof value !== 'object' || value === null) return null
  const { o, p, s, t, e } = value as Record<string, unknown>
  if (typeof o !== 'string' || typeof p !== 'string' || typeof s !== 'string' ||
    typeof t !== 'number' || typeof e !== 'boolean') return null
  return { o, p, s, t, e }
}

async function quit (connection: Connection): Promise<void> {
  try {
    await connection.quit()
  } catch {
    // Already closed or never connected: nothing left to release.
    connection.disconnect()
  }
}

/** `list` without one occurrence of `item` (one subscription's listener), as a new array of its exact length. */
function without<T> (list: readonly T[], item: T): readonly T[] {
  const at = list.indexOf(item)
  return at < 0 ? list : list.slice(0, at).concat(list.slice(at + 1))
}
