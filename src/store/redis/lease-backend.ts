import type { Cluster, Redis } from 'ioredis'
import {
  IDLE_LOST, IDLE_RELEASED,
  type AcquireResult, type ControlKind, type ControlListener, type ControlSubscription, type IdleRelease, type LeaseBackend, type OrphanAnswer,
  type RenewResult, type TickRequest, type TickResult
} from '../../cluster/lease.js'
import type { RetentionLimits } from '../contract.js'
import { STANDALONE_STREAM } from '../contract.js'
import type { KeyLayout } from './key-layout.js'
import type { StoreConnections, Topology } from './connection.js'
import type { ScriptedConnection, StoreCommands } from './lua.js'
import { inNodePipelines, replyOf } from './node-pipelines.js'
import { controlMessage, type NoticeBus } from './notice-bus.js'

/** Leases renewed per script call (the call's run time in Redis stays around a millisecond). */
export const RENEW_PER_CALL = 256
type AcquireReply = [number, (string | number)?, string?]

export interface RedisLeaseBackendOptions {
  /** The store's connections: leases cost no connection of their own. */
  readonly connections: StoreConnections
  readonly replicaId: string
  readonly keys: KeyLayout
  /** The store's per-session channels, shared with its notices. */
  readonly bus: NoticeBus
  /** The store's retention: an orphaned stream's last event is trimmed for like any other. */
  readonly retention: RetentionLimits
}

// The reply codes of the lease scripts, one table per script, each code as the
// script's header documents it and what it means here. A code outside its
// script's table comes from a script this gateway does not know: decoding it throws.

/** lease-acquire-2.lua: { -1 } unknown session; { 0, ms it still lives } held elsewhere; { 1, previous h, upstream's last id } taken. */
export const ACQUIRE_REPLIES = {
  '-1': () => 'gone',
  0: reply => ({ heldForMs: Math.max(0, Number(reply[1] ?? 0)) }),
  1: (reply, token) => {
    const upstreamId = reply[2]
    return { token, takeover: reply[1] === '1', lastUpstreamId: upstreamId === undefined || upstreamId === '' ? undefined : upstreamId }
  }
} as const satisfies Record<string, (reply: AcquireReply, token: string) => AcquireResult>

/** lease-renew.lua, one per lease: -1 unknown session, 0 held elsewhere, 1 renewed, 2 taken back, 3 renewed or taken back with the record at another upstream session. */
export const RENEW_REPLIES = {
  '-1': 'gone',
  0: 'lost',
  1: 'renewed',
  2: 'renewed',
  3: 'moved'
} as const satisfies Record<string, RenewResult>

/** lease-release-2.lua: 1 released, 0 not held under the token. */
export const RELEASE_REPLIES = {
  0: false,
  1: true
} as const satisfies Record<string, boolean>

/**
 * lease-release-if-idle-3.lua: -1 not held under the token, 0 released, else
 * the milliseconds to wait (a positive integer, outside this table: `attached`).
 */
export const RELEASE_IF_IDLE_REPLIES = {
  '-1': IDLE_LOST,
  0: IDLE_RELEASED
} as const satisfies Record<string, IdleRelease>

/** What `reply` means in `table`; an error naming the script and the code when it is not one of them. */
function decodeReply<T> (script: string, table: Readonly<Record<string, T>>, reply: unknown): T {
  if (typeof reply !== 'number' || !Object.hasOwn(table, String(reply))) {
    throw new Error(`lease: ${script} replied with an unknown code ${typeof reply === 'string' ? JSON.stringify(reply) : String(reply)}`)
  }
  return table[String(reply)] as T
}

export function toAcquireResult (reply: AcquireReply, token: string): AcquireResult {
  return decodeReply('lease-acquire-2.lua', ACQUIRE_REPLIES, reply[0])(reply, token)
}

export function toRenewResult (reply: unknown): RenewResult {
  return decodeReply('lease-renew.lua', RENEW_REPLIES, reply)
}

export function toReleaseResult (reply: unknown): boolean {
  return decodeReply('lease-release-2.lua', RELEASE_REPLIES, reply)
}

export function toReleaseIfIdleResult (reply: unknown): IdleRelease {
  if (typeof reply === 'number' && Number.isSafeInteger(reply) && reply > 0) return { kind: 'attached', askAgainMs: reply }
  return decodeReply('lease-release-if-idle-3.lua', RELEASE_IF_IDLE_REPLIES, reply)
}

/**
 * Leases in Redis, next to the session's records (same hash tag, so every
 * script runs in one slot on Cluster). A tick is a few writes whatever the
 * number of sessions: RENEW_PER_CALL leases a script call on one node, and on
 * Cluster pipelines of PIPELINE_COMMANDS per node.
 */
export class RedisLeaseBackend implements LeaseBackend {
  readonly replicaId: string
  readonly shared = true
  readonly #redis: ScriptedConnection
  readonly #topology: Topology
  readonly #keys: KeyLayout
  readonly #o: RedisLeaseBackendOptions

  constructor (options: RedisLeaseBackendOptions) {
    this.replicaId = options.replicaId
    this.#keys = options.keys
    this.#redis = options.connections.redis
    this.#topology = options.connections.topology
    this.#o = options
  }

  async acquire (sessionId: string, token: string, ttlMs: number): Promise<AcquireResult> {
    const k = this.#keys.session(sessionId)
    return toAcquireResult(await this.#redis.mcpgwLeaseAcquire(k.lease, k.meta, token, ttlMs, STANDALONE_STREAM), token)
  }

  async tick (request: TickRequest): Promise<TickResult> {
    const topology = this.#topology
    return topology.kind === 'one-node' ? await this.#tickOnOneNode(topology.redis, request) : await this.#tickOnCluster(topology.redis, request)
  }

  /**
   * A call per lease (one slot each), in explicit pipelines of a bounded size
   * per node, all written in this turn (see node-pipelines.ts): no renewal
   * waits for another node's replies, and a lease whose release is at the
   * store is left out (Lease's state). A release waits for the tick in flight
   * with its lease (Lease.renewing): ioredis may send a renewal again.
   */
  async #tickOnCluster (cluster: Cluster & StoreCommands, request: TickRequest): Promise<TickResult> {
    const metaOf = ({ sessionId }: { sessionId: string }): string => this.#keys.session(sessionId).meta
    const renew = inNodePipelines(cluster, request.renew, 1, metaOf, (pipeline, { sessionId, token, upstreamSessionId }) => {
      const k = this.#keys.session(sessionId)
      pipeline.mcpgwLeaseRenewOne(k.lease, k.meta, request.ttlMs, STANDALONE_STREAM, token, upstreamSessionId ?? '')
    })
    // The attached marker, then the lease taken if it ran out (the marker's failure is not the watch's).
    const watch = inNodePipelines(cluster, request.watch, 2, metaOf, (pipeline, { sessionId, token }) => {
      const k = this.#keys.session(sessionId)
      pipeline.set(k.attached, this.replicaId, 'PX', request.attachedMs)
      pipeline.mcpgwLeaseAcquire(k.lease, k.meta, token, request.ttlMs, STANDALONE_STREAM)
    })
    const recorders = Promise.all((request.recorders ?? []).map(async replicaId => await cluster.exists(this.#keys.alive(replicaId))))
    const alive = request.aliveMs === undefined ? undefined : cluster.set(this.#keys.alive(this.replicaId), '1', 'PX', Math.max(1, request.aliveMs))
    const [renewReplies, watchReplies, recorderReplies] = await Promise.all([renew, watch, recorders, alive])
    return {
      renew: renewReplies.map(replies => toRenewResult((replyOf(replies[0]) as number[])[0])),
      watch: watchReplies.map((replies, i) => toAcquireResult(replyOf(replies[1]) as AcquireReply, request.watch[i]?.token as string)),
      recordersAlive: recorderReplies.map(n => n === 1)
    }
  }

  /**
   * Renewals RENEW_PER_CALL to a script call, each call written on its own,
   * then the rest in one pipeline. Not all in one pipeline: ioredis joins a
   * pipeline's commands into one string before writing it, which for thousands
   * of sessions is megabytes in V8's large-object space, garbage that only a
   * full collection frees: an idle gateway's heap grew by that every tick.
   */
  async #tickOnOneNode (redis: Redis & StoreCommands, request: TickRequest): Promise<TickResult> {
    const renewCalls: Array<Promise<number[]>> = []
    for (let at = 0; at < request.renew.length; at += RENEW_PER_CALL) {
      const leases = request.renew.slice(at, at + RENEW_PER_CALL)
      const args: Array<string | number> = []
      for (const { sessionId } of leases) {
        const k = this.#keys.session(sessionId)
        args.push(k.lease, k.meta)
      }
      args.push(request.ttlMs, STANDALONE_STREAM)
      for (const { token, upstreamSessionId } of leases) args.push(token, upstreamSessionId ?? '')
      renewCalls.push(redis.mcpgwLeaseRenew(2 * leases.length, ...args))
    }
    const pipeline = redis.pipeline() as unknown as ReturnType<Redis['pipeline']> & {
      mcpgwLeaseAcquire: (...args: Array<string | number>) => unknown
    }
    for (const { sessionId, token } of request.watch) {
      const k = this.#keys.session(sessionId)
      pipeline.set(k.attached, this.replicaId, 'PX', request.attachedMs)
      pipeline.mcpgwLeaseAcquire(k.lease, k.meta, token, request.ttlMs, STANDALONE_STREAM)
    }
    const recorders = request.recorders ?? []
    for (const replicaId of recorders) pipeline.exists(this.#keys.alive(replicaId))
    if (request.aliveMs !== undefined) pipeline.set(this.#keys.alive(this.replicaId), '1', 'PX', Math.max(1, request.aliveMs))
    const [renewReplies, replies] = await Promise.all([Promise.all(renewCalls), pipeline.length > 0 ? pipeline.exec() : []])
    const value = (i: number): unknown => {
      const [err, result] = replies?.[i] ?? [new Error('no reply')]
      if (err !== null && err !== undefined) throw err
      return result
    }
    const recordersAt = 2 * request.watch.length
    if (request.aliveMs !== undefined) value(recordersAt + recorders.length)
    const renew: RenewResult[] = []
    for (const call of renewReplies) {
      for (const reply of call) renew.push(toRenewResult(reply))
    }
    return {
      renew,
      watch: request.watch.map(({ token }, i) => toAcquireResult(value(2 * i + 1) as AcquireReply, token)),
      recordersAlive: recorders.map((_, i) => value(recordersAt + i) === 1)
    }
  }

  async release (sessionId: string, token: string, live: boolean): Promise<boolean> {
    const k = this.#keys.session(sessionId)
    const message = controlMessage('released', this.replicaId)
    return toReleaseResult(await this.#redis.mcpgwLeaseRelease(k.lease, k.meta, token, live ? '1' : '0', STANDALONE_STREAM, k.channel, message))
  }

  async releaseIfIdle (sessionId: string, token: string): Promise<IdleRelease> {
    const k = this.#keys.session(sessionId)
    const message = controlMessage('released', this.replicaId)
    return toReleaseIfIdleResult(await this.#redis.mcpgwLeaseReleaseIfIdle(k.lease, k.meta, k.attached, token, STANDALONE_STREAM, k.channel, message))
  }

  async markAttached (sessionId: string, ms: number): Promise<void> {
    await this.#redis.set(this.#keys.session(sessionId).attached, this.replicaId, 'PX', Math.max(1, ms))
  }

  async claimRequestStream (sessionId: string, streamId: string): Promise<void> {
    await this.#redis.mcpgwClaimRecorder(this.#keys.session(sessionId).meta, streamId, this.replicaId)
  }

  async requestStreamRecorder (sessionId: string, streamId: string): Promise<string | undefined> {
    return await this.#redis.hget(this.#keys.session(sessionId).meta, `w:${streamId}`) ?? undefined
  }

  async endOrphanedRequestStream (sessionId: string, streamId: string, recorder: string, answer: OrphanAnswer): Promise<boolean> {
    const k = this.#keys.session(sessionId)
    const { maxEvents, maxBytes, ttlMs } = this.#o.retention
    const reply = await this.#redis.mcpgwEndOrphaned(k.meta, k.stream(streamId), k.ledger(streamId),
      streamId, recorder, maxEvents, maxBytes, ttlMs, k.channel, this.replicaId, answer.data, answer.event ?? '')
    if (reply === null || reply === 0) return false
    const [epoch, seq] = reply
    // Local followers get the event itself, as with any append made here.
    this.#o.bus.deliver(sessionId, epoch, { streamId, toSeq: seq, events: [{ seq, data: answer.data, event: answer.event }], ended: true })
    return true
  }

  async markAlive (ms: number): Promise<void> {
    await this.#redis.set(this.#keys.alive(this.replicaId), '1', 'PX', Math.max(1, ms))
  }

  async retire (): Promise<void> {
    await this.#redis.del(this.#keys.alive(this.replicaId))
  }

  /** The append script keeps the upstream's last id in the session hash already. */
  noteUpstreamId (): void {}

  forget (): void {}

  subscribeControl (sessionId: string, listener: ControlListener): ControlSubscription {
    return this.#o.bus.subscribeControl(sessionId, listener)
  }

  async publish (sessionId: string, kind: ControlKind): Promise<void> {
    await this.#o.bus.publishControl(sessionId, kind)
  }
}
