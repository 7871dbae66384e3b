import type { Redis } from 'ioredis'
import { FLAG_EVENT, FLAG_FRAME, FLAG_UPSTREAM_ID } from '../batch/layout-flags.js'
import type { ReadResult, StoredEvent, StreamState } from '../contract.js'
import type { KeyLayout } from './key-layout.js'
import type { StoreConnections } from './connection.js'
import type { ScriptedConnection } from './lua.js'
import type { StreamStanding } from './notice-bus.js'

/**
 * Pages whose entries come to at least this many bytes are read past
 * Redis's Lua (read-plan-3.lua, then a plain XRANGE: a second round trip),
 * so a live follower's small reads stay one round trip.
 */
export const READ_SPLIT_MIN_BYTES = 64 * 1024

type Entries = Array<[Buffer, Buffer[]]>
type ReadReply = [epoch: string, lastSeq: number, firstSeq: number, ended: number, entries: Entries] | null

/** Replay pages and stream states, from the stream entries (batches) the appends wrote. */
export class Reader {
  readonly #redis: ScriptedConnection
  readonly #connections: StoreConnections
  readonly #keys: KeyLayout

  constructor (connections: StoreConnections, keys: KeyLayout) {
    this.#redis = connections.redis
    this.#connections = connections
    this.#keys = keys
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

  /** Where a stream stands, for the notice bus's catch-up. */
  async standing (sessionId: string, streamId: string): Promise<StreamStanding | null> {
    const reply = await this.#read(sessionId, streamId, 0, 0, 0)
    return reply === null ? null : [reply[0], reply[1], reply[3] === 1]
  }

  async #read (sessionId: string, streamId: string, afterSeq: number, limit: number, maxBytes: number): Promise<ReadReply> {
    const keys = this.#keys.session(sessionId, streamId)
    const stream = keys.stream(streamId)
    // Lua numbers are doubles: no limit is the largest safe integer.
    const bound = Math.min(maxBytes, Number.MAX_SAFE_INTEGER)
    const redis = this.#redis
    const oneNode = this.#connections.oneNode
    if (oneNode !== undefined && limit > 0) {
      const plan = await oneNode.mcpgwReadPlanBuffer(keys.meta, stream, keys.ledger(streamId), streamId, afterSeq, limit, bound, READ_SPLIT_MIN_BYTES)
      if (plan === null) return null
      const epoch = plan[0].toString()
      if (plan.length === 5) return [epoch, plan[1], plan[2], plan[3], plan[4]]
      const rows = await readEntries(oneNode, keys.meta, stream, epoch, plan[5], plan[6], plan[7])
      // Trimmed or reset between the two round trips: read-2's own way.
      if (rows !== undefined) return [epoch, plan[1], plan[2], plan[3], rows]
    }
    const reply = await redis.mcpgwReadBuffer(keys.meta, stream, streamId, afterSeq, limit, bound)
    return reply === null ? null : [reply[0].toString(), reply[1], reply[2], reply[3], reply[4]]
  }
}

/**
 * The entries a read-plan-3 named, read plainly: MULTI, HGET epoch, XRANGE,
 * EXEC. Undefined when they are not those any more (the session reset, an
 * entry trimmed since the plan).
 */
async function readEntries (redis: Redis, meta: string, stream: string, epoch: string,
  firstId: Buffer, lastId: Buffer, count: number): Promise<Entries | undefined> {
  const replies = await redis.multi().hgetBuffer(meta, 'epoch').xrangeBuffer(stream, firstId, lastId).exec()
  if (replies === null) return undefined
  const [[epochErr, current], [rowsErr, rows]] = replies as [[Error | null, Buffer | null], [Error | null, Entries]]
  if (epochErr !== null || rowsErr !== null) throw epochErr ?? rowsErr
  if (current === null || current.toString() !== epoch || !Array.isArray(rows) || rows.length !== count) return undefined
  if (rows[0]?.[0].equals(firstId) !== true || rows[count - 1]?.[0].equals(lastId) !== true) return undefined
  return rows
}

/**
 * The events of stream entries (batches, see docs/redis.md) numbered from
 * `from`, at most `limit`, and as many as fit in `maxBytes` (the first always).
 */
function unpackEntries (rows: Entries, from: number, limit: number, maxBytes: number): StoredEvent[] {
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
