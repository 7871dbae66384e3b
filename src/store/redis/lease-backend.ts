import { Cluster } from 'ioredis'
import type { Redis } from 'ioredis'
import type {
  AcquireResult, ControlKind, ControlListener, ControlMessage, ControlSubscription, LeaseBackend, OrphanAnswer, RenewResult, TickRequest, TickResult
} from '../../cluster/lease.js'
import type { RetentionLimits, StreamNotice } from '../contract.js'
import { STANDALONE_STREAM } from '../contract.js'
import { CLAIM_RECORDER, END_ORPHANED, LEASE_ACQUIRE, LEASE_RELEASE, LEASE_RELEASE_IF_IDLE, LEASE_RENEW } from './scripts.js'
import { RespArgs, ScriptCall } from './script-call.js'

type Connection = Redis | Cluster

/** Leases renewed per script call (the call's run time in Redis stays around a millisecond). */
export const RENEW_PER_CALL = 256
const RENEW_CALL = new ScriptCall(LEASE_RENEW, 0)
type LeaseRef = TickRequest['renew'][number]
type AcquireReply = [number, (string | number)?, string?]

interface LeaseCommands {
  mcpgwLeaseAcquire (lease: string, meta: string, token: string, ttlMs: number, streamId: string): Promise<AcquireReply>
  mcpgwLeaseRelease (lease: string, meta: string, token: string, live: string, streamId: string, channel: string, message: string): Promise<number>
  mcpgwLeaseReleaseIfIdle (lease: string, meta: string, attached: string, token: string, streamId: string, channel: string, message: string): Promise<number>
  mcpgwClaimRecorder (meta: string, streamId: string, replicaId: string): Promise<number>
  mcpgwEndOrphaned (meta: string, stream: string, ledger: string, ...args: Array<string | number>): Promise<[string, number] | 0 | null>
}

export interface LeaseKeys {
  readonly lease: string
  readonly meta: string
  readonly attached: string
  readonly channel: string
  /** The key of one of the session's streams. */
  readonly stream: (streamId: string) => string
  /** The key of a stream's ledger (its entries' ids and sizes, see scripts.ts). */
  readonly ledger: (streamId: string) => string
}

export interface RedisLeaseBackendOptions {
  /** The store's command connection: leases cost no connection of their own. */
  readonly redis: Connection
  readonly replicaId: string
  readonly keys: (sessionId: string) => LeaseKeys
  /** Add one of a session's keys to packed script arguments, its name never made as a string. */
  readonly pushKey: (args: RespArgs, sessionId: string, key: 'lease' | 'meta') => void
  /** The store's per-session channel subscription, shared with its notices. */
  readonly subscribeControl: (sessionId: string, listener: ControlListener) => ControlSubscription
  /** A replica's liveness key (not a session's: no hash tag). */
  readonly aliveKey: (replicaId: string) => string
  /** The store's retention: an orphaned stream's last event is trimmed for like any other. */
  readonly retention: RetentionLimits
  /** Give a notice to this replica's own listeners (they do not hear their own PUBLISH). */
  readonly deliver: (sessionId: string, epoch: string, notice: StreamNotice) => void
}

/** A lease coordination message as PUBLISHed on the session's channel: `k` tells it from a notice. */
export function controlMessage (kind: ControlKind, origin: string): string {
  return JSON.stringify({ k: kind, o: origin })
}

export function parseControl (message: string): ControlMessage | null {
  if (!message.startsWith('{"k":')) return null
  try {
    const { k, o } = JSON.parse(message) as Record<string, unknown>
    if ((k === 'released' || k === 'want' || k === 'draining') && typeof o === 'string') return { kind: k, origin: o }
  } catch {}
  return null
}

function toAcquireResult (reply: AcquireReply, token: string): AcquireResult {
  if (reply[0] === -1) return 'gone'
  if (reply[0] === 0) return { heldForMs: Math.max(0, Number(reply[1] ?? 0)) }
  const upstreamId = reply[2]
  return { token, takeover: reply[1] === '1', lastUpstreamId: upstreamId === undefined || upstreamId === '' ? undefined : upstreamId }
}

function toRenewResult (reply: number): RenewResult {
  if (reply === -1) return 'gone'
  return reply === 0 ? 'lost' : 'renewed'
}

/**
 * Leases in Redis, next to the session's records (same hash tag, so every
 * script runs in one slot on Cluster). A tick is one pipeline (one per node on
 * Cluster, by auto-pipelining), whatever the number of sessions.
 */
export class RedisLeaseBackend implements LeaseBackend {
  readonly replicaId: string
  readonly shared = true
  readonly #redis: Connection & LeaseCommands
  readonly #keys: (sessionId: string) => LeaseKeys
  readonly #subscribe: (sessionId: string, listener: ControlListener) => ControlSubscription
  readonly #o: RedisLeaseBackendOptions
  /** The renewals' packed arguments, one buffer per script call (see tick). */
  readonly #renewBuffers: Buffer[] = []
  #renewing = false

  constructor (options: RedisLeaseBackendOptions) {
    this.replicaId = options.replicaId
    this.#keys = options.keys
    this.#subscribe = options.subscribeControl
    this.#o = options
    const redis = options.redis
    redis.defineCommand('mcpgwLeaseAcquire', { numberOfKeys: 2, lua: LEASE_ACQUIRE })
    redis.defineCommand('mcpgwLeaseRelease', { numberOfKeys: 2, lua: LEASE_RELEASE })
    redis.defineCommand('mcpgwLeaseReleaseIfIdle', { numberOfKeys: 3, lua: LEASE_RELEASE_IF_IDLE })
    redis.defineCommand('mcpgwClaimRecorder', { numberOfKeys: 1, lua: CLAIM_RECORDER })
    redis.defineCommand('mcpgwEndOrphaned', { numberOfKeys: 3, lua: END_ORPHANED })
    this.#redis = redis as Connection & LeaseCommands
  }

  async acquire (sessionId: string, token: string, ttlMs: number): Promise<AcquireResult> {
    const k = this.#keys(sessionId)
    return toAcquireResult(await this.#redis.mcpgwLeaseAcquire(k.lease, k.meta, token, ttlMs, STANDALONE_STREAM), token)
  }

  async tick (request: TickRequest): Promise<TickResult> {
    const redis = this.#redis
    if (redis instanceof Cluster) {
      // Auto-pipelining sends what is issued in this turn as one pipeline per node.
      const renew = request.renew.map(({ sessionId, token }) => {
        const k = this.#keys(sessionId)
        return RENEW_CALL.call(redis, [k.lease, k.meta, request.ttlMs, STANDALONE_STREAM, token], 2).then(replies => (replies as number[])[0] as number)
      })
      const watch = request.watch.map(({ sessionId, token }) => {
        const k = this.#keys(sessionId)
        redis.set(k.attached, this.replicaId, 'PX', request.attachedMs).catch(() => {})
        return redis.mcpgwLeaseAcquire(k.lease, k.meta, token, request.ttlMs, STANDALONE_STREAM)
      })
      const recorders = Promise.all((request.recorders ?? []).map(async replicaId => await redis.exists(this.#o.aliveKey(replicaId))))
      const alive = request.aliveMs === undefined ? undefined : redis.set(this.#o.aliveKey(this.replicaId), '1', 'PX', Math.max(1, request.aliveMs))
      const [renewReplies, watchReplies, recorderReplies] = await Promise.all([Promise.all(renew), Promise.all(watch), recorders, alive])
      return {
        renew: renewReplies.map(toRenewResult),
        watch: watchReplies.map((reply, i) => toAcquireResult(reply, request.watch[i]?.token as string)),
        recordersAlive: recorderReplies.map(n => n === 1)
      }
    }
    // Renewals go RENEW_PER_CALL to a script call, their arguments put in RESP
    // as they come (RespArgs), into buffers kept from tick to tick: at rest,
    // with thousands of streams held, each lease would otherwise cost a
    // command and its reply every tick, or garbage enough to keep the heap
    // (or, with fresh buffers, RSS) growing. A buffer is used again only once
    // every call of the tick before has settled (its bytes sent, or never
    // to be); a tick that overlaps another takes fresh ones. Issued in the
    // same turn as the pipeline, all leave in one write.
    const keep = !this.#renewing
    if (keep) this.#renewing = true
    try {
      return await this.#tickOnOneNode(redis, request, keep ? this.#renewBuffers : [])
    } finally {
      if (keep) this.#renewing = false
    }
  }

  async #tickOnOneNode (redis: Redis & LeaseCommands, request: TickRequest, buffers: Buffer[]): Promise<TickResult> {
    const renewals: Array<Promise<unknown>> = []
    for (let at = 0, call = 0; at < request.renew.length; at += RENEW_PER_CALL, call++) {
      const end = Math.min(at + RENEW_PER_CALL, request.renew.length)
      const args = new RespArgs(buffers[call] ?? Buffer.allocUnsafeSlow(RENEW_PER_CALL * 256))
      for (let i = at; i < end; i++) {
        const { sessionId } = request.renew[i] as LeaseRef
        this.#o.pushKey(args, sessionId, 'lease')
        this.#o.pushKey(args, sessionId, 'meta')
      }
      args.push(request.ttlMs).push(STANDALONE_STREAM)
      for (let i = at; i < end; i++) args.push((request.renew[i] as LeaseRef).token)
      buffers[call] = args.buffer
      renewals.push(RENEW_CALL.callPacked(redis, 2 * (end - at), args))
    }
    // Fewer leases than before: the buffers of the calls no longer made go.
    buffers.length = renewals.length
    const pipeline = redis.pipeline() as unknown as ReturnType<Redis['pipeline']> & {
      mcpgwLeaseAcquire: (...args: Array<string | number>) => unknown
    }
    for (const { sessionId, token } of request.watch) {
      const k = this.#keys(sessionId)
      pipeline.set(k.attached, this.replicaId, 'PX', request.attachedMs)
      pipeline.mcpgwLeaseAcquire(k.lease, k.meta, token, request.ttlMs, STANDALONE_STREAM)
    }
    const recorders = request.recorders ?? []
    for (const replicaId of recorders) pipeline.exists(this.#o.aliveKey(replicaId))
    if (request.aliveMs !== undefined) pipeline.set(this.#o.aliveKey(this.replicaId), '1', 'PX', Math.max(1, request.aliveMs))
    const [replies, settled] = await Promise.all([
      pipeline.length > 0 ? pipeline.exec() : [],
      Promise.allSettled(renewals)
    ])
    const value = (i: number): unknown => {
      const [err, result] = replies?.[i] ?? [new Error('no reply')]
      if (err !== null && err !== undefined) throw err
      return result
    }
    const recordersAt = 2 * request.watch.length
    if (request.aliveMs !== undefined) value(recordersAt + recorders.length)
    const renew: RenewResult[] = []
    for (const outcome of settled) {
      if (outcome.status === 'rejected') throw outcome.reason
      for (const reply of outcome.value as number[]) renew.push(toRenewResult(reply))
    }
    return {
      renew,
      watch: request.watch.map(({ token }, i) => toAcquireResult(value(2 * i + 1) as AcquireReply, token)),
      recordersAlive: recorders.map((_, i) => value(recordersAt + i) === 1)
    }
  }

  async release (sessionId: string, token: string, live: boolean): Promise<boolean> {
    const k = this.#keys(sessionId)
    const message = controlMessage('released', this.replicaId)
    return await this.#redis.mcpgwLeaseRelease(k.lease, k.meta, token, live ? '1' : '0', STANDALONE_STREAM, k.channel, message) === 1
  }

  async releaseIfIdle (sessionId: string, token: string): Promise<number> {
    const k = this.#keys(sessionId)
    const message = controlMessage('released', this.replicaId)
    return await this.#redis.mcpgwLeaseReleaseIfIdle(k.lease, k.meta, k.attached, token, STANDALONE_STREAM, k.channel, message)
  }

  async markAttached (sessionId: string, ms: number): Promise<void> {
    await this.#redis.set(this.#keys(sessionId).attached, this.replicaId, 'PX', Math.max(1, ms))
  }

  async claimRequestStream (sessionId: string, streamId: string): Promise<void> {
    await this.#redis.mcpgwClaimRecorder(this.#keys(sessionId).meta, streamId, this.replicaId)
  }

  async requestStreamRecorder (sessionId: string, streamId: string): Promise<string | undefined> {
    return await this.#redis.hget(this.#keys(sessionId).meta, `w:${streamId}`) ?? undefined
  }

  async endOrphanedRequestStream (sessionId: string, streamId: string, recorder: string, answer: OrphanAnswer): Promise<boolean> {
    const k = this.#keys(sessionId)
    const { maxEvents, maxBytes, ttlMs } = this.#o.retention
    const reply = await this.#redis.mcpgwEndOrphaned(k.meta, k.stream(streamId), k.ledger(streamId),
      streamId, recorder, maxEvents, maxBytes, ttlMs, k.channel, this.replicaId, answer.data, answer.event ?? '')
    if (reply === null || reply === 0) return false
    const [epoch, seq] = reply
    // Local followers get the event itself, as with any append made here.
    this.#o.deliver(sessionId, epoch, { streamId, toSeq: seq, events: [{ seq, data: answer.data, event: answer.event }], ended: true })
    return true
  }

  async markAlive (ms: number): Promise<void> {
    await this.#redis.set(this.#o.aliveKey(this.replicaId), '1', 'PX', Math.max(1, ms))
  }

  async retire (): Promise<void> {
    await this.#redis.del(this.#o.aliveKey(this.replicaId))
  }

  /** The append script keeps the upstream's last id in the session hash already. */
  noteUpstreamId (): void {}

  forget (): void {}

  subscribeControl (sessionId: string, listener: ControlListener): ControlSubscription {
    return this.#subscribe(sessionId, listener)
  }

  async publish (sessionId: string, kind: ControlKind): Promise<void> {
    await this.#redis.publish(this.#keys(sessionId).channel, controlMessage(kind, this.replicaId))
  }
}
