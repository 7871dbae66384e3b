import { createHash } from 'node:crypto'
import type { Redis } from 'ioredis'
import { COMMANDS, type ScriptedConnection, type StoreCommands } from './lua.js'
import { bufferCommand, ScriptCall, transaction, type ScriptArg } from './script-call.js'

/**
 * How an append's bytes reach Redis, the one choice between two ways of
 * calling its scripts (append-5, append-split-6, unpark-2):
 * - `zero-copy` (the default): the arguments written to the socket as they
 *   are (script-call.ts, which relies on ioredis beyond its public API).
 *   ioredis's own commands copy every argument into one new buffer first, and
 *   the bytes the gateway allocates are what starts most of its full garbage
 *   collections: through ioredis's public API an append cost the gateway
 *   4-5% more CPU per event with 1 busy session and 12-34% more with 100
 *   (bench/run.mjs --only=thr1,thr100 against this path).
 * - `ioredis`: ioredis's public API (a defined command, multi()), for an
 *   ioredis release that breaks the first. The store contract suite runs on
 *   both (test/store/redis-store.test.ts).
 * On a connection cut after Redis ran an append, the two behave alike, and
 * test/hardening/append-confirm.test.ts's resent append runs on both:
 * ioredis's script command is what ScriptCall copies (EVAL first on a socket,
 * EVALSHA after, once more after NOSCRIPT), ioredis resends either after a
 * reconnect or fails it, and the recorder's resend of the same batch is
 * recognised by append-5 as applied whichever way it came.
 */
export type AppendWrite = 'zero-copy' | 'ioredis'

/** The append scripts' reply: epoch, the lastSeq before the batch, ended (1|0), already applied (1|0). */
export type AppendReply = [string, number, number, number]

/** One stream entry as XADD takes it after its key. */
export type EntryArgs = ReadonlyArray<string | number | Buffer>

export interface AppendWriter {
  /** append-5 with its keys and arguments. */
  append: (redis: ScriptedConnection, args: readonly ScriptArg[]) => Promise<AppendReply | null>
  /**
   * MULTI, append-split-6, an XADD to `aside` per entry, unpark-2, EXEC: each
   * command's reply (an Error for one that failed), or null when Redis did not
   * run the transaction. `reload`: the script was not loaded (NOSCRIPT) last time.
   */
  split: (redis: Redis & StoreCommands, splitArgs: readonly ScriptArg[], aside: string, entries: readonly EntryArgs[],
    unparkArgs: readonly string[], reload: boolean) => Promise<unknown[] | null>
}

const APPEND_CALL = new ScriptCall(COMMANDS.append.lua, 5)
const APPEND_SPLIT_CALL = new ScriptCall(COMMANDS.appendSplit.lua, 6)
const UNPARK_CALL = new ScriptCall(COMMANDS.unpark.lua, 2)

const zeroCopy: AppendWriter = {
  // Not an async function: the append's promise as ScriptCall made it, no second one per append.
  append: (redis, args) => APPEND_CALL.call(redis, args) as Promise<AppendReply | null>,
  async split (redis, splitArgs, aside, entries, unparkArgs, reload) {
    if (reload) APPEND_SPLIT_CALL.forget(redis)
    // unpark-2 as EVAL, never EVALSHA: a NOSCRIPT there would leave the stream aside.
    return await transaction(redis, [
      APPEND_SPLIT_CALL.command(splitArgs),
      ...entries.map(entry => bufferCommand('xadd', [aside, ...entry])),
      UNPARK_CALL.evalCommand(unparkArgs)
    ], 'utf8')
  }
}

const SPLIT_SHA = createHash('sha1').update(COMMANDS.appendSplit.lua).digest('hex')

const throughIoredis: AppendWriter = {
  append: async (redis, args) => await redis.mcpgwAppend(...args),
  async split (redis, splitArgs, aside, entries, unparkArgs, reload) {
    const multi = redis.multi()
    // A plain EVALSHA (EVAL after a NOSCRIPT), not a defined command: ioredis
    // would answer a NOSCRIPT by sending EVAL itself, outside the transaction.
    if (reload) multi.eval(COMMANDS.appendSplit.lua, 6, ...splitArgs)
    else multi.evalsha(SPLIT_SHA, 6, ...splitArgs)
    for (const entry of entries) multi.call('xadd', aside, ...entry)
    // EVAL, never EVALSHA: a NOSCRIPT here would leave the stream aside.
    multi.eval(COMMANDS.unpark.lua, 2, ...unparkArgs)
    const replies = await multi.exec()
    return replies === null ? null : replies.map(([err, value]) => err ?? value)
  }
}

export const APPEND_WRITERS: Readonly<Record<AppendWrite, AppendWriter>> = Object.freeze({ 'zero-copy': zeroCopy, ioredis: throughIoredis })
