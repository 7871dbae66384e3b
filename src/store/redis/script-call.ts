// The one module that relies on ioredis beyond its public API: Command#toWritable
// and #reject, the connection's socket, and a command's inTransaction and
// pipelineIndex. Appends write their events' bytes to the socket as they are,
// where ioredis's own commands would copy them all into one new buffer first:
// that copy cost the gateway 4-34% more CPU per event (append-writes.ts), so
// package.json pins ioredis exactly, and test/store/script-call.test.ts fails
// when what this relies on changes. Only append-writes.ts uses it.
import { createHash } from 'node:crypto'
import { Command } from 'ioredis'
import type { Cluster, Redis } from 'ioredis'

export type ScriptArg = string | number | Buffer

/** What ioredis writes commands to: the connection's socket (TCP or TLS). */
interface Socket {
  cork: () => void
  uncork: () => void
  write: (chunk: string | Buffer) => boolean
}

const isSocket = (value: unknown): value is Socket =>
  typeof value === 'object' && value !== null && typeof (value as Partial<Socket>).cork === 'function' &&
  typeof (value as Partial<Socket>).uncork === 'function' && typeof (value as Partial<Socket>).write === 'function'

/**
 * A Lua script whose arguments are written to the connection as they are.
 * ioredis copies every argument of a command into one new buffer before
 * writing it (Command#toWritable): for APPEND, every event's bytes once more.
 * The gateway's ArrayBuffer allocations are what starts most of V8's full
 * garbage collections ("external memory pressure"), so here the command's
 * header and each argument go to the corked socket in turn, and leave in one
 * writev: ioredis writes the command's last piece itself (what toWritable
 * returns), and the socket is uncorked as soon as the code running now is
 * done (process.nextTick, before any other I/O callback), so calls issued
 * together share that writev.
 *
 * Like ioredis's own script commands: EVAL the first time on a connection
 * (which loads the script), EVALSHA after, and the call once more after
 * NOSCRIPT (Redis restarted empty, or SCRIPT FLUSH).
 */
export class ScriptCall {
  readonly #lua: string
  readonly #sha: string
  readonly #numberOfKeys: number
  /** Sockets that have been sent the script. */
  readonly #loaded = new WeakSet<Socket>()

  constructor (lua: string, numberOfKeys: number) {
    this.#lua = lua
    this.#sha = createHash('sha1').update(lua).digest('hex')
    this.#numberOfKeys = numberOfKeys
  }

  /**
   * Call the script on `connection` (keys first, then the other arguments);
   * replies as text. On Cluster the command goes to the node of its keys
   * (ioredis's auto-pipelining, by contrast, routes a script command by its
   * first argument, which for a variable number of keys is that number).
   */
  async call (connection: Redis | Cluster, args: readonly ScriptArg[], numberOfKeys = this.#numberOfKeys): Promise<unknown> {
    try {
      return await connection.sendCommand(this.#command(args, numberOfKeys))
    } catch (err) {
      if (!isNoScript(err)) throw err
      return await connection.sendCommand(this.#command(args, numberOfKeys))
    }
  }

  /**
   * The call as a command to send as part of something larger (a MULTI): EVAL
   * or EVALSHA as for call(), but a NOSCRIPT comes back inside the EXEC's
   * reply, not here: the caller then calls forget() and sends it again.
   */
  command (args: readonly ScriptArg[], numberOfKeys = this.#numberOfKeys): Command {
    return this.#command(args, numberOfKeys)
  }

  /**
   * The call as EVAL with the script's text whatever the connection has
   * loaded, as a command to send as part of something larger: for a script
   * in a MULTI whose NOSCRIPT nothing could follow up.
   */
  evalCommand (args: readonly ScriptArg[], numberOfKeys = this.#numberOfKeys): Command {
    return bufferCommand('eval', [this.#lua, numberOfKeys, ...args])
  }

  /** The script is no longer loaded on `connection` (a NOSCRIPT reply): EVAL next time. */
  forget (connection: Redis): void {
    const socket: unknown = connection.stream
    if (isSocket(socket)) this.#loaded.delete(socket)
  }

  #command (args: readonly ScriptArg[], numberOfKeys = this.#numberOfKeys): Command {
    const loaded = this.#loaded
    const lua = this.#lua
    const sha = this.#sha
    const command = new Command('evalsha', [sha, numberOfKeys, ...args], { replyEncoding: 'utf8' })
    const toWritable = command.toWritable.bind(command)
    command.toWritable = (socket: unknown): string | Buffer => {
      if (!isSocket(socket)) return toWritable(socket as object)
      if (!loaded.has(socket)) {
        loaded.add(socket)
        command.name = 'eval'
        command.args[0] = lua
      } else if (command.name === 'eval') {
        command.name = 'evalsha'
        command.args[0] = sha
      }
      const reject = command.reject
      command.reject = (err: Error) => {
        if (isNoScript(err)) loaded.delete(socket)
        reject.call(command, err)
      }
      socket.cork()
      process.nextTick(uncork, socket)
      // ioredis writes what this returns, to the corked socket: returning '' (with the
      // whole command written here) would cost an empty write, a system call of its own.
      return writeCommand(socket, command.name, command.args as ScriptArg[])
    }
    return command
  }
}

/**
 * A command whose Buffer arguments go to the connection as they are, like
 * ScriptCall's (ioredis would copy them all into one new buffer first).
 */
export function bufferCommand (name: string, args: readonly ScriptArg[]): Command {
  const command = new Command(name, args as Array<string | number | Buffer>, { replyEncoding: 'utf8' })
  const toWritable = command.toWritable.bind(command)
  command.toWritable = (socket: unknown): string | Buffer => {
    if (!isSocket(socket)) return toWritable(socket as object)
    socket.cork()
    process.nextTick(uncork, socket)
    return writeCommand(socket, command.name, args)
  }
  return command
}

/**
 * Hold what is written to `connection` until the code running now is done,
 * so that commands sent together leave in one write (ioredis writes each
 * command as it is sent).
 */
export function corkForTurn (connection: Redis): void {
  const socket: unknown = connection.stream
  if (!isSocket(socket)) return
  socket.cork()
  process.nextTick(uncork, socket)
}

export function isNoScript (err: unknown): boolean {
  return err instanceof Error && err.message.includes('NOSCRIPT')
}

function uncork (socket: Socket): void {
  socket.uncork()
}

/**
 * The command in RESP, its Buffer arguments written as they are (no copy),
 * all but its last piece of text, which is returned for the caller to write.
 * The caller corks the socket first and uncorks it after that last write, so
 * the pieces leave in one writev.
 */
export function writeCommand (socket: Socket, name: string, args: readonly ScriptArg[]): string {
  let text = `*${args.length + 1}\r\n$${Buffer.byteLength(name)}\r\n${name}\r\n`
  for (const arg of args) {
    if (Buffer.isBuffer(arg)) {
      socket.write(`${text}$${arg.length}\r\n`)
      if (arg.length > 0) socket.write(arg)
      text = '\r\n'
    } else {
      const value = String(arg)
      text += `$${Buffer.byteLength(value)}\r\n${value}\r\n`
    }
  }
  return text
}

/**
 * `commands` in MULTI ... EXEC, written at once; EXEC's replies (in
 * `encoding`: null for Buffers), or null when Redis aborted the transaction
 * (a WATCH; EXECABORT is thrown). Sent as ioredis sends its own pipelines: a
 * connection lost midway rejects the rest instead of sending it again
 * outside the transaction.
 */
export async function transaction (redis: Redis, commands: readonly Command[], encoding: 'utf8' | null): Promise<unknown[] | null> {
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
