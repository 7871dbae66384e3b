import { CONTROL_KINDS, type ControlKind, type ControlListener, type ControlMessage, type ControlSubscription } from '../../cluster/lease.js'
import type { NoticeListener, StreamNotice } from '../contract.js'
import type { KeyLayout } from './key-layout.js'
import type { StoreConnections, StoreLogger } from './connection.js'
import { inNodePipelines, replyOf } from './node-pipelines.js'

/**
 * How often a replica tells Redis again which sessions it listens to (their
 * audiences). An audience lost meanwhile (evicted, or a failover to a replica
 * that had not got it) is found and caught up on then.
 */
export const AUDIENCE_REFRESH_MS = 30_000
/** Audiences refreshed in one script call (standalone and Sentinel; Cluster: one a call, see node-pipelines.ts). */
const JOIN_PER_CALL = 200

/** Where a stream stands: the catch-up after a (re)subscription reads it. */
export type StreamStanding = readonly [epoch: string, toSeq: number, ended: boolean]

export interface NoticeBusOptions {
  readonly connections: StoreConnections
  readonly keys: KeyLayout
  readonly replicaId: string
  readonly logger: StoreLogger | undefined
  readonly audienceRefreshMs: number
  readonly standing: (sessionId: string, streamId: string) => Promise<StreamStanding | null>
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

/**
 * Live notices between replicas, one channel per session. This replica holds
 * one SUBSCRIBE per session that has local listeners (refcounted), on one
 * subscriber connection whatever the number of sessions: a blocking XREAD per
 * client would cost a connection per client, and one PSUBSCRIBE to every
 * session would make every replica receive every other replica's traffic.
 * Plain PUBLISH also works on Redis Cluster (broadcast to all nodes).
 *
 * Audiences: the replicas subscribed to a session are a set in Redis, and an
 * append PUBLISHes only when a replica other than the writer is in it (the
 * writer hands its own listeners the events). A replica joins once its
 * SUBSCRIBE took effect, refreshes every audienceRefreshMs, leaves on
 * UNSUBSCRIBE; an audience nobody refreshes expires.
 */
export class NoticeBus {
  readonly #o: NoticeBusOptions
  /** Local listeners by channel name (one channel per session). */
  readonly #channels = new Map<string, Channel>()
  readonly #onMessage = (channel: string, message: string): void => this.#receive(channel, message)
  readonly #onReady = (): void => this.#resubscribe()
  readonly #audienceTtlMs: number
  readonly #audienceTimer: NodeJS.Timeout
  #closed = false

  constructor (options: NoticeBusOptions) {
    this.#o = options
    // The bus subscribes again itself when the connection is back (#resubscribe, which
    // also catches up); ioredis does not (storeConnections).
    options.connections.subscriber.on('message', this.#onMessage)
    options.connections.subscriber.on('ready', this.#onReady)
    this.#audienceTtlMs = 4 * options.audienceRefreshMs
    this.#audienceTimer = setInterval(() => { this.#refreshAudiences() }, options.audienceRefreshMs).unref()
  }

  subscribe (sessionId: string, streamId: string, listener: NoticeListener): () => void {
    const name = this.#o.keys.session(sessionId, streamId).channel
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
    const name = this.#o.keys.session(sessionId).channel
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

  async publishControl (sessionId: string, kind: ControlKind): Promise<void> {
    await this.#o.connections.redis.publish(this.#o.keys.session(sessionId).channel, controlMessage(kind, this.#o.replicaId))
  }

  /**
   * This replica recorded a session the store had lost again. The audience
   * went with the rest of its keys while other replicas' subscriptions to
   * its channel stayed (a flush, not a restart): without a word they would
   * hear of nothing appended from now on until their next refresh. Told,
   * they join again and catch up.
   */
  async publishRecordedAgain (sessionId: string): Promise<void> {
    await this.#o.connections.redis.publish(this.#o.keys.session(sessionId).channel, channelMessage(RECORDED_AGAIN, this.#o.replicaId))
  }

  /**
   * Give a notice to this replica's own listeners of the session. Notices
   * reach a replica by two paths (its own appends, the subscriber connection)
   * that may interleave; a notice older than one already given to the
   * listeners carries nothing new and is dropped, so listeners see toSeq
   * only grow.
   */
  deliver (sessionId: string, epoch: string, notice: StreamNotice): void {
    this.#deliver(this.#o.keys.session(sessionId).channel, epoch, notice)
  }

  close (): void {
    this.#closed = true
    clearInterval(this.#audienceTimer)
    this.#channels.clear()
    this.#o.connections.subscriber.off('message', this.#onMessage)
    this.#o.connections.subscriber.off('ready', this.#onReady)
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
    const logger = this.#o.logger
    this.#o.connections.subscriber.unsubscribe(name).catch((err: unknown) => {
      logger?.warn({ err, channel: name }, 'event store: UNSUBSCRIBE failed')
    })
    // After any JOIN of this channel's (same connection, sent before): appends stop notifying us.
    this.#o.connections.redis.srem(this.#o.keys.session(channel.sessionId).audience, this.#o.replicaId).catch((err: unknown) => {
      logger?.warn({ err, channel: name }, 'event store: leaving the audience failed (it expires)')
    })
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
    channel.ready = this.#o.connections.subscriber.subscribe(name).then(
      async () => {
        // Released meanwhile (its SREM already sent): joining now would leave us in the audience.
        if (this.#channels.get(name) !== channel) return
        // The catch-up reads go right behind the JOIN, on the same connection: Redis
        // runs them after it, and the stream opening waits one round trip less.
        const joined = this.#join([this.#o.keys.session(channel.sessionId).audience])
        this.#catchUp(name, channel)
        try {
          await joined
        } catch (err) {
          // The next refresh joins (and catches up); until then appends elsewhere may not notify.
          if (!this.#closed) this.#o.logger?.warn({ err, channel: name }, 'event store: joining the audience failed')
        }
      },
      (err: unknown) => this.#o.logger?.warn({ err, channel: name }, 'event store: SUBSCRIBE failed')
    )
  }

  /** Add this replica to audiences (keys of one node); per key, 1 when it was not in it. */
  async #join (audiences: readonly string[]): Promise<number[]> {
    const redis = this.#o.connections.redis
    if (audiences.length === 1) return await redis.mcpgwJoinOne(audiences[0] as string, this.#o.replicaId, this.#audienceTtlMs)
    return await redis.mcpgwJoin(audiences.length, ...audiences, this.#o.replicaId, this.#audienceTtlMs)
  }

  /**
   * Join every audience again (keeping them from expiring). One this replica
   * was missing from (lost in Redis) may have let appends go unannounced:
   * catch up on those channels.
   */
  #refreshAudiences (): void {
    if (this.#closed || this.#channels.size === 0) return
    const channels = [...this.#channels]
    const joined = (group: ReadonlyArray<[string, Channel]>, added: readonly number[]): void => {
      group.forEach(([name, channel], j) => {
        if (added[j] === 1 && this.#channels.get(name) === channel) this.#catchUp(name, channel)
      })
    }
    const failed = (err: unknown, sessions: number): void => {
      if (!this.#closed) this.#o.logger?.warn({ err, sessions }, 'event store: refreshing audiences failed')
    }
    const topology = this.#o.connections.topology
    if (topology.kind === 'cluster') {
      // A call per session (one slot each), in pipelines of a bounded size per node.
      const audienceOf = ([, channel]: [string, Channel]): string => this.#o.keys.session(channel.sessionId).audience
      inNodePipelines(topology.redis, channels, 1, audienceOf, (pipeline, entry) => {
        pipeline.mcpgwJoinOne(audienceOf(entry), this.#o.replicaId, this.#audienceTtlMs)
      }).then((replies) => {
        let errors = 0
        let firstError: unknown
        channels.forEach((entry, i) => {
          try {
            joined([entry], replyOf(replies[i]?.[0]) as number[])
          } catch (err) {
            if (errors++ === 0) firstError = err
          }
        })
        if (errors > 0) failed(firstError, errors)
      }, (err: unknown) => { failed(err, channels.length) })
      return
    }
    for (let i = 0; i < channels.length; i += JOIN_PER_CALL) {
      const group = channels.slice(i, i + JOIN_PER_CALL)
      this.#join(group.map(([, channel]) => this.#o.keys.session(channel.sessionId).audience)).then(added => { joined(group, added) }, (err: unknown) => { failed(err, group.length) })
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
      this.#o.standing(channel.sessionId, streamId).then((standing) => {
        if (standing === null || this.#channels.get(name) !== channel) return
        this.#deliver(name, standing[0], { streamId, toSeq: standing[1], ended: standing[2] })
      }, (err: unknown) => {
        this.#o.logger?.warn({ err, channel: name, streamId }, 'event store: catch-up read failed')
      })
    }
  }

  /** Another replica recorded the session again (publishRecordedAgain): join its new audience and catch up. */
  #rejoin (name: string): void {
    const channel = this.#channels.get(name)
    if (channel === undefined || this.#closed) return
    this.#join([this.#o.keys.session(channel.sessionId).audience]).then(() => {
      if (this.#channels.get(name) === channel) this.#catchUp(name, channel)
    }, (err: unknown) => {
      this.#o.logger?.warn({ err, channel: name }, 'event store: joining the audience of a session recorded again failed (the next refresh joins)')
    })
  }

  /** The subscriber connection came back: notices published meanwhile are lost, so subscribe and catch up. */
  #resubscribe (): void {
    for (const [name, channel] of this.#channels) this.#listen(name, channel)
  }

  #receive (name: string, message: string): void {
    const parsed = parseChannelMessage(message)
    if (parsed !== null) {
      const { kind, origin } = parsed
      if (origin === this.#o.replicaId) return
      if (kind === RECORDED_AGAIN) {
        this.#rejoin(name)
        return
      }
      const control: ControlMessage = { kind, origin }
      const listeners = this.#channels.get(name)?.control
      for (const listener of listeners ?? []) {
        try {
          listener(control)
        } catch (err) {
          this.#o.logger?.warn({ err }, 'event store: control listener threw')
        }
      }
      return
    }
    const notice = parseWireNotice(message)
    if (notice === null) {
      this.#o.logger?.warn({ channel: name }, 'event store: malformed notice ignored')
      return
    }
    // Our own appends were delivered locally, with their events.
    if (notice.o === this.#o.replicaId) return
    this.#deliver(name, notice.p, { streamId: notice.s, toSeq: notice.t, ended: notice.e })
  }

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
        this.#o.logger?.warn({ err, streamId: notice.streamId }, 'event store: notice listener threw')
      }
    }
  }
}

/** A lease coordination message as PUBLISHed on the session's channel: `k` tells it from a notice. */
export function controlMessage (kind: ControlKind, origin: string): string {
  return channelMessage(kind, origin)
}

/**
 * Besides the lease's control messages, the bus's own, in the same format:
 * a replica recorded the session again (publishRecordedAgain).
 */
const RECORDED_AGAIN = 'recorded_again'
const CHANNEL_KINDS = [...CONTROL_KINDS, RECORDED_AGAIN] as const
type ChannelKind = typeof CHANNEL_KINDS[number]

function channelMessage (kind: ChannelKind, origin: string): string {
  return JSON.stringify({ k: kind, o: origin })
}

/** A control message or the bus's own; null for a notice (or anything else). */
function parseChannelMessage (message: string): { kind: ChannelKind, origin: string } | null {
  if (!message.startsWith('{"k":')) return null
  try {
    const { k, o } = JSON.parse(message) as Record<string, unknown>
    const kind = CHANNEL_KINDS.find(known => known === k)
    if (kind !== undefined && typeof o === 'string') return { kind, origin: o }
  } catch {}
  return null
}

export function parseControl (message: string): ControlMessage | null {
  const parsed = parseChannelMessage(message)
  return parsed === null || parsed.kind === RECORDED_AGAIN ? null : { kind: parsed.kind, origin: parsed.origin }
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

/** `list` without one occurrence of `item` (one subscription's listener), as a new array of its exact length. */
function without<T> (list: readonly T[], item: T): readonly T[] {
  const at = list.indexOf(item)
  return at < 0 ? list : list.slice(0, at).concat(list.slice(at + 1))
}
