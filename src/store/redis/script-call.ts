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

  /** Call the script on `connection` (keys first, then the other arguments); replies as text. */
  async call (connection: Redis | Cluster, args: readonly ScriptArg[]): Promise<unknown> {
    try {
      return await connection.sendCommand(this.#command(args))
    } catch (err) {
      if (!isNoScript(err)) throw err
      return await connection.sendCommand(this.#command(args))
    }
  }

  #command (args: readonly ScriptArg[]): Command {
    const loaded = this.#loaded
    const lua = this.#lua
    const sha = this.#sha
    const command = new Command('evalsha', [sha, this.#numberOfKeys, ...args], { replyEncoding: 'utf8' })
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

function isNoScript (err: unknown): boolean {
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
