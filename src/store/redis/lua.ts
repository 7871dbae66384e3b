import { readFileSync } from 'node:fs'
import type { Cluster, Redis } from 'ioredis'

/**
 * The Redis store's Lua scripts, one file each in commands/: `<name>-<keys>.lua`
 * takes that many keys; `<name>.lua` takes a number of keys given per call.
 * A line `--- @include "<part>"` stands for commands/includes/<part>.lua
 * (each part once per script, its own includes first). Read once, at start-up;
 * the build copies the folder next to this module. Every script is called
 * through ioredis's defineCommand (defineCommands) but the append's three,
 * which append-writes.ts sends.
 */
const COMMANDS_DIR = new URL('./commands/', import.meta.url)
const INCLUDE = /^--- @include "([a-z-]+)"$/gm

/** One script: its file's name and what ioredis's defineCommand takes. */
export interface LuaCommand {
  /** The file name without `.lua` (`append-5`). */
  readonly file: string
  /** The name ioredis gives the command on a connection (`mcpgwAppend`). */
  readonly name: string
  readonly lua: string
  /** From the file name; undefined: the caller passes the count first. */
  readonly numberOfKeys: number | undefined
}

/** The Lua source of `commands/<file>.lua`, its includes in place. */
export function loadLua (file: string, included = new Set<string>()): string {
  const source = readFileSync(new URL(`${file}.lua`, COMMANDS_DIR), 'utf8')
  return source.replace(INCLUDE, (_, part: string) => {
    if (included.has(part)) return `-- (${part}: included above)`
    included.add(part)
    return loadLua(`includes/${part}`, included).trimEnd()
  })
}

function command (file: string): LuaCommand {
  const match = /^([a-z-]+?)(?:-(\d+))?$/.exec(file)
  if (match === null) throw new Error(`Lua command file name ${file}: expected <name>-<keys>`)
  const name = 'mcpgw' + (match[1] as string).replace(/(^|-)([a-z])/g, (_, __, c: string) => c.toUpperCase())
  return Object.freeze({ file, name, lua: loadLua(file), numberOfKeys: match[2] === undefined ? undefined : Number(match[2]) })
}

export const COMMANDS = Object.freeze({
  append: command('append-5'),
  appendSplit: command('append-split-6'),
  unpark: command('unpark-2'),
  join: command('join'),
  open: command('open-2'),
  read: command('read-2'),
  readPlan: command('read-plan-3'),
  touch: command('touch-3'),
  adopt: command('adopt-6'),
  settleAdoption: command('settle-adoption-1'),
  movePlacement: command('move-placement-1'),
  sessionState: command('session-state-1'),
  fenceRelease: command('fence-release-1'),
  intact: command('intact-1'),
  saveCursor: command('save-cursor-3'),
  reset: command('reset'),
  leaseAcquire: command('lease-acquire-2'),
  leaseRenew: command('lease-renew'),
  leaseRelease: command('lease-release-2'),
  leaseReleaseIfIdle: command('lease-release-if-idle-3'),
  claimRecorder: command('claim-recorder-1'),
  endOrphaned: command('end-orphaned-3')
})

/** Commands whose number of keys comes with each call (see storeConnections). */
export const VARIABLE_KEY_COMMANDS: readonly string[] = Object.values(COMMANDS).filter(c => c.numberOfKeys === undefined).map(c => c.name)

/** Error reply prefixes of the append scripts (see append-5.lua, append-split-6.lua). */
export const FENCED = 'MCPGW_FENCED'
export const ROLLED_BACK = 'MCPGW_ROLLED_BACK'
export const UNSPLIT = 'MCPGW_UNSPLIT'

/** An error reply of one of the scripts. */
export function isReply (err: unknown, prefix: string): boolean {
  return err instanceof Error && err.name === 'ReplyError' && err.message.startsWith(prefix)
}

type Args = Array<string | number | Buffer>
type Reply<T> = Promise<T>
type Entries = Array<[Buffer, Buffer[]]>
/** A session record: epoch, principal, upstream session id, endpoint ('' for a field it lacks). */
export type RecordReply = [string, string, string, string]

/** The scripts as commands of a connection (defineCommands), with their replies' types. */
export interface StoreCommands {
  /** Defined only for the ioredis append path (see append-writes.ts). */
  mcpgwAppend: (...args: Args) => Reply<[string, number, number, number] | null>
  mcpgwJoin: (numberOfKeys: number, ...args: Args) => Reply<number[]>
  mcpgwOpen: (...args: Args) => Reply<[string, number, number, number] | null>
  /** Binary replies: frames are the upstream's bytes, whatever their encoding. */
  mcpgwReadBuffer: (...args: Args) => Reply<[Buffer, number, number, number, Entries] | null>
  /** READ's reply, or the same with the page's entries to read (first id, last id, count) instead of them. */
  mcpgwReadPlanBuffer: (...args: Args) => Reply<[Buffer, number, number, number, Entries] | [Buffer, number, number, number, [], Buffer, Buffer, number] | null>
  mcpgwTouch: (...args: Args) => Reply<RecordReply | null>
  mcpgwSaveCursor: (...args: Args) => Reply<number>
  mcpgwAdopt: (...args: Args) => Reply<RecordReply | null>
  mcpgwSettleAdoption: (...args: Args) => Reply<number>
  mcpgwMovePlacement: (...args: Args) => Reply<RecordReply | null>
  mcpgwSessionState: (...args: Args) => Reply<number>
  mcpgwFenceRelease: (...args: Args) => Reply<number>
  mcpgwIntact: (...args: Args) => Reply<string>
  mcpgwReset: (numberOfKeys: number, ...args: Args) => Reply<number>
  mcpgwLeaseAcquire: (...args: Args) => Reply<[number, (string | number)?, string?]>
  mcpgwLeaseRenew: (numberOfKeys: number, ...args: Args) => Reply<number[]>
  /** join and lease-renew for one session's keys (see ONE_SESSION_FORMS). */
  mcpgwJoinOne: (...args: Args) => Reply<number[]>
  mcpgwLeaseRenewOne: (...args: Args) => Reply<number[]>
  mcpgwLeaseRelease: (...args: Args) => Reply<number>
  mcpgwLeaseReleaseIfIdle: (...args: Args) => Reply<number>
  mcpgwClaimRecorder: (...args: Args) => Reply<number>
  mcpgwEndOrphaned: (...args: Args) => Reply<[string, number] | 0 | null>
}

/**
 * join and lease-renew take the keys of any number of sessions, but on
 * Cluster a call carries one session's (keys of one slot): there they also
 * go as commands of that fixed count, routed by their first key, in the
 * pipelines of node-pipelines.ts.
 */
const ONE_SESSION_FORMS: ReadonlyArray<readonly [LuaCommand, number]> = [[COMMANDS.join, 1], [COMMANDS.leaseRenew, 2]]

/**
 * Scripts that append.ts sends itself (see append-writes.ts), never defined as
 * commands: append-5 is defined only for the ioredis append path.
 */
const SENT_BY_APPENDS: ReadonlySet<LuaCommand> = new Set([COMMANDS.append, COMMANDS.appendSplit, COMMANDS.unpark])

export type ScriptedConnection = (Redis | Cluster) & StoreCommands

/**
 * The scripts as commands of `connection` (ioredis's defineCommand: EVALSHA,
 * EVAL when the script is not loaded on the connection yet). `append`: define
 * append-5 too (mcpgwAppend), for the ioredis append path.
 */
export function defineCommands (connection: Redis | Cluster, { append }: { append: boolean }): ScriptedConnection {
  for (const script of Object.values(COMMANDS)) {
    if (SENT_BY_APPENDS.has(script) && !(append && script === COMMANDS.append)) continue
    const { name, lua, numberOfKeys } = script
    connection.defineCommand(name, numberOfKeys === undefined ? { lua } : { lua, numberOfKeys })
  }
  for (const [{ name, lua }, numberOfKeys] of ONE_SESSION_FORMS) connection.defineCommand(`${name}One`, { lua, numberOfKeys })
  return connection as ScriptedConnection
}
