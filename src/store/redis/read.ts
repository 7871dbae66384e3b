import type { Redis } from 'ioredis'
import { EventBatch } from '../batch/event-batch.js'
import { NumberedBatch } from '../batch/numbered-batch.js'
import { eventSize, NUMBERS_PER_EVENT, parseLayoutText } from '../batch/packed-layout.js'
import { ReadPage } from '../batch/read-page.js'
import type { ReadResult, StreamState } from '../contract.js'
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
    return new ReadPage(unpackEntries(rows, Math.max(afterSeq + 1, firstSeq), limit, maxBytes), { epoch, lastSeq, firstSeq, ended: ended === 1 })
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
    const topology = this.#connections.topology
    if (topology.kind === 'one-node' && limit > 0) {
      const oneNode = topology.redis
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
 * `from`, at most `limit`, and as many as fit in `maxBytes` (the first always):
 * views of the entries, one batch per entry.
 */
function unpackEntries (rows: Entries, from: number, limit: number, maxBytes: number): NumberedBatch[] {
  const batches: NumberedBatch[] = []
  let bytes = 0
  let count = 0
  for (const [id, fields] of rows) {
    const firstSeq = Number.parseInt(id.toString(), 10)
    let layout: Uint32Array | undefined
    let blob: Buffer | undefined
    for (let i = 0; i + 1 < fields.length; i += 2) {
      const name = (fields[i] as Buffer)[0]
      if (name === 0x6c) layout = parseLayoutText(fields[i + 1] as Buffer) // l
      else if (name === 0x62) blob = fields[i + 1] as Buffer // b
    }
    if (layout === undefined || blob === undefined) continue
    const length = layout.length / NUMBERS_PER_EVENT
    let i = 0
    let start = 0
    for (; i < length && firstSeq + i < from; i++) start += eventSize(layout, i)
    const first = i
    let end = start
    for (; i < length; i++) {
      const size = eventSize(layout, i)
      bytes += size
      if (count === limit || (bytes > maxBytes && count > 0)) break
      end += size
      count++
    }
    if (i > first) batches.push(new NumberedBatch(new EventBatch(blob.subarray(start, end), layout.subarray(NUMBERS_PER_EVENT * first, NUMBERS_PER_EVENT * i), ''), firstSeq + first))
    if (i < length) break
  }
  return batches
}
