import type { Redis } from 'ioredis'
import { boundedLru } from '../../lru.js'
import { LeaseLostError, SessionGoneError } from '../../errors.js'
import { EventBatch } from '../batch/event-batch.js'
import { NumberedBatch } from '../batch/numbered-batch.js'
import { BatchNotice } from '../batch/batch-notice.js'
import type { AppendOptions, EventInput, RetentionLimits } from '../contract.js'
import type { KeyLayout, SessionKeys } from './key-layout.js'
import type { StoreConnections } from './connection.js'
import { FENCED, isReply, UNSPLIT, type StoreCommands } from './lua.js'
import { isNoScript } from './script-call.js'
import { APPEND_WRITERS, type AppendReply, type AppendWrite, type AppendWriter, type EntryArgs } from './append-writes.js'
import type { NoticeBus } from './notice-bus.js'

/**
 * Largest stream entry an append writes (a batch larger than this becomes
 * several entries, still in one script call). A replay page reads whole
 * entries, so a page of a few hundred events must not read megabytes: one
 * entry per append of up to 2 MiB had cut replay to 51,000 events/s, entries
 * of at most 512 KiB brought it to 201,000. Above the read-ahead's floor
 * (256 KiB and the read that passed it), so that many busy streams still
 * append one entry each.
 */
export const ENTRY_MAX_BYTES = 384 * 1024

/**
 * Batches of at least this many bytes go to Redis past its Lua
 * (append-split-6.lua), where that is possible: Redis's Lua hashes every byte
 * of a script's arguments (about 1.5 ns a byte), which made passing a batch's
 * bytes most of Redis's CPU per event. The transaction costs the gateway five
 * commands and their replies instead of one, about what 32 KiB of bytes cost
 * Redis in that hash; the gateway is the busier of the two, so only from there.
 */
export const SPLIT_MIN_BYTES = 32 * 1024

/** Sessions whose write marks are kept (the least recently written are forgotten first). */
const WRITE_MARK_SESSIONS = 50_000

/** Where this replica left a stream it writes: the next append expects it (see append-5.lua). */
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

export interface AppenderOptions {
  readonly connections: StoreConnections
  /** How the scripts are called (append-writes.ts). */
  readonly write: AppendWrite
  readonly keys: KeyLayout
  readonly retention: RetentionLimits
  readonly replicaId: string
  readonly bus: NoticeBus
}

/**
 * Appends, with the write marks: per stream this replica writes, where it
 * left it. The next append carries that expectation, so that the script can
 * tell a lost write (Redis behind it) and a resent one (already applied).
 */
export class Appender {
  readonly #o: AppenderOptions
  readonly #writer: AppendWriter
  readonly #marks = boundedLru<string, Map<string, WriteMark>>(WRITE_MARK_SESSIONS)

  constructor (options: AppenderOptions) {
    this.#o = options
    this.#writer = APPEND_WRITERS[options.write]
  }

  /** What this replica knew of the session's writes is history (a new record, a reset). */
  forget (sessionId: string): void {
    this.#marks.delete(sessionId)
  }

  async append (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options: AppendOptions): Promise<NumberedBatch> {
    const batch = events instanceof EventBatch ? events : EventBatch.from(events)
    const keys = this.#o.keys.session(sessionId, streamId)
    const { maxEvents, maxBytes, ttlMs } = this.#o.retention
    const ending = options.end === true
    const fence = options.fence ?? ''
    const mark = this.#marks.peek(sessionId)?.get(streamId)
    // A mark left under another lease says nothing: someone else wrote since.
    const known = mark !== undefined && mark.fence === fence && (mark.uncertain === undefined || mark.uncertain === events)
    const head: Array<string | number> = [
      streamId, maxEvents, maxBytes, ttlMs, ending ? '1' : '0', keys.channel, this.#o.replicaId,
      fence, known ? mark.seq : -1, known ? mark.epoch : '', options.readFrom ?? '', sessionId, batch.lastUpstreamId, batch.length
    ]
    // Cut so that no entry is much larger than ENTRY_MAX_BYTES.
    const runs = batch.runs(ENTRY_MAX_BYTES)
    let reply: AppendReply | null | undefined
    try {
      // The split transaction is a MULTI: on one node only (see StoreConnections).
      const topology = this.#o.connections.topology
      if (known && topology.kind === 'one-node' && batch.bytes.length >= SPLIT_MIN_BYTES &&
        batch.length <= maxEvents && batch.bytes.length <= maxBytes) {
        reply = await appendSplit(this.#writer, topology.redis, keys, streamId, head, runs, mark.seq + 1)
      }
      if (reply === undefined) {
        // The batch as append-5 takes it: after the head, each entry's count, layout and bytes.
        const args: Array<string | number | Buffer> = [keys.meta, keys.stream(streamId), keys.lease, keys.ledger(streamId), keys.audience, ...head]
        for (const run of runs) args.push(run.count, run.layout, run.bytes)
        reply = await this.#writer.append(this.#o.connections.redis, args)
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
      const notice = new BatchNotice(streamId, stored.lastSeq, ended === 1, stored, epoch)
      this.#o.bus.deliver(sessionId, epoch, notice)
      notice.spend()
    }
    return stored
  }

  /** Remember where this replica left a stream it writes (undefined: forget it). */
  #mark (sessionId: string, streamId: string, mark: WriteMark | undefined): void {
    const streams = this.#marks.peek(sessionId)
    if (mark === undefined) {
      streams?.delete(streamId)
      if (streams?.size === 0) this.#marks.delete(sessionId)
      return
    }
    // Most recently written last: the oldest are forgotten first.
    const marks = streams ?? new Map<string, WriteMark>()
    this.#marks.set(sessionId, marks)
    marks.set(streamId, mark)
  }
}

/**
 * A batch appended past Redis's Lua: append-split-6 in a MULTI with the
 * batch's XADDs and unpark-2 (see append-split-6.lua). The entries' ids start
 * at `firstSeq`, where the caller expects the stream to go on. Undefined when
 * the script refused (MCPGW_UNSPLIT): the caller appends through append-5.
 */
async function appendSplit (writer: AppendWriter, redis: Redis & StoreCommands, keys: SessionKeys, streamId: string, head: ReadonlyArray<string | number>,
  runs: ReturnType<EventBatch['runs']>, firstSeq: number): Promise<AppendReply | null | undefined> {
  const stream = keys.stream(streamId)
  const aside = keys.aside
  const args: Array<string | number> = [keys.meta, stream, keys.lease, keys.ledger(streamId), keys.audience, aside, ...head]
  for (const run of runs) args.push(run.count, run.bytes.length)
  const entries: EntryArgs[] = []
  let seq = firstSeq
  for (const run of runs) {
    entries.push(['NOMKSTREAM', `${seq}-${run.count}`, 's', run.bytes.length, 'l', run.layout, 'b', run.bytes])
    seq += run.count
  }
  for (let attempt = 0; ; attempt++) {
    const replies = await writer.split(redis, args, aside, entries, [aside, stream], attempt > 0)
    if (replies === null) throw new Error('Redis did not run the append transaction')
    const reply = replies[0]
    if (reply instanceof Error) {
      if (isReply(reply, UNSPLIT)) return undefined
      // Not run at all: nothing was put aside, the XADDs found no key.
      if (isNoScript(reply) && attempt === 0) continue
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
