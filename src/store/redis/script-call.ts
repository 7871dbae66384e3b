import { createHash } from 'node:crypto'
import { Command } from 'ioredis'
import type { Cluster, Redis } from 'ioredis'

export type ScriptArg = string | number | Buffer

/**
 * Arguments put in RESP as they are added, into a buffer off the JS heap
 * that the caller may keep and hand in again, for script calls with
 * thousands of small ones (a lease tick renews every lease this replica
 * holds). Made by ioredis, each key name a string of its own, the argument
 * arrays and the command text came to about 1.4 KB of heap per lease and
 * tick, and what a scavenge found still in use mid-tick went to old space: a
 * gateway at rest with 10,000 streams grew by about 1 MB/s. A fresh buffer
 * per call instead is freed only by a collection, which at rest comes late.
 */
export class RespArgs {
  #buffer: Buffer
  #length = 0
  #count = 0

  constructor (buffer: Buffer = Buffer.allocUnsafeSlow(4096)) {
    this.#buffer = buffer
  }

  /** Where the arguments are: the buffer given, or a larger one if they did not fit. */
  get buffer (): Buffer { return this.#buffer }
  get count (): number { return this.#count }
  /** The arguments in RESP (bulk strings). */
  get bytes (): Buffer { return this.#buffer.subarray(0, this.#length) }

  push (value: string | number): this {
    return this.pushParts(typeof value === 'number' ? String(value) : value)
  }

  /** One argument given in pieces (a key's prefix, session id, suffix), without joining them first. */
  pushParts (a: string, b = '', c = '', d = ''): this {
    const size = Buffer.byteLength(a) + Buffer.byteLength(b) + Buffer.byteLength(c) + Buffer.byteLength(d)
    this.#reserve(size + 16)
    const buffer = this.#buffer
    let at = this.#length
    buffer[at++] = 0x24 // $
    at += buffer.write(String(size), at, 'latin1')
    buffer[at++] = 0x0d
    buffer[at++] = 0x0a
    at += buffer.write(a, at)
    if (b !== '') at += buffer.write(b, at)
    if (c !== '') at += buffer.write(c, at)
    if (d !== '') at += buffer.write(d, at)
    buffer[at++] = 0x0d
    buffer[at++] = 0x0a
    this.#length = at
    this.#count++
    return this
  }

  #reserve (size: number): void {
    if (this.#length + size <= this.#buffer.length) return
    const grown = Buffer.allocUnsafeSlow(Math.max(2 * this.#buffer.length, this.#length + size))
    grown.set(this.#buffer.subarray(0, this.#length))
    this.#buffer = grown
  }
}

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
   * Call the script with arguments already in RESP, `numberOfKeys` of them
   * keys. Not on Cluster: the command names no keys for routing.
   */
  async callPacked (connection: Redis, numberOfKeys: number, args: RespArgs): Promise<unknown> {
    try {
      return await connection.sendCommand(this.#command([], numberOfKeys, args))
    } catch (err) {
      if (!isNoScript(err)) throw err
      return await connection.sendCommand(this.#command([], numberOfKeys, args))
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

  /** The script is no longer loaded on `connection` (a NOSCRIPT reply): EVAL next time. */
  forget (connection: Redis): void {
    const socket: unknown = connection.stream
    if (isSocket(socket)) this.#loaded.delete(socket)
  }

  #command (args: readonly ScriptArg[], numberOfKeys = this.#numberOfKeys, packed?: RespArgs): Command {
    const loaded = this.#loaded
    const lua = this.#lua
    const sha = this.#sha
    const command = new Command('evalsha', [sha, numberOfKeys, ...args], { replyEncoding: 'utf8' })
    const toWritable = command.toWritable.bind(command)
    command.toWritable = (socket: unknown): string | Buffer => {
      if (!isSocket(socket)) {
        if (packed === undefined) return toWritable(socket as object)
        // Not the connection's socket (a pipeline's): whether the script is loaded there is unknown.
        return Buffer.concat([Buffer.from(packedHead('eval', lua, numberOfKeys, packed)), packed.bytes])
      }
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
      if (packed !== undefined) {
        socket.write(packedHead(command.name, command.args[0] as string, numberOfKeys, packed))
        return packed.bytes
      }
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

/** EVAL or EVALSHA in RESP up to its packed arguments. */
function packedHead (name: string, script: string, numberOfKeys: number, packed: RespArgs): string {
  const keys = String(numberOfKeys)
  return `*${packed.count + 3}\r\n$${name.length}\r\n${name}\r\n$${Buffer.byteLength(script)}\r\n${script}\r\n$${keys.length}\r\n${keys}\r\n`
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
