// The write timeout and the budget of client buffers, on a fake clock and
// fake connections: what counts as progress, who is cut, what is charged.
// (test/unit/client-buffers-stall.test.ts: the same on a real connection, with the process standing still.)
import t from 'tap'
import { ClientBuffers, type WaitingConnection } from '../../src/sse/client-buffers.js'

/** A client's socket; its handle's libuv queue the test sets. */
class FakeSocket {
  destroyed = false
  readonly _handle = { writeQueueSize: 0 }
  destroy (): void { this.destroyed = true }
}

/**
 * A connection whose bytes waiting and libuv queue the test sets. `queuedOn`:
 * an answer pipelined behind another on that socket (its own socket is null
 * until its turn, and destroying it then destroys nothing yet, as in Node).
 */
class FakeConnection implements WaitingConnection {
  writableLength = 0
  destroyed = false
  readonly socket: FakeSocket | null
  readonly handle: { writeQueueSize: number }
  readonly req: { readonly socket: FakeSocket }
  #onClose: Array<() => void> = []

  constructor (queuedOn?: FakeSocket) {
    const socket = queuedOn ?? new FakeSocket()
    this.socket = queuedOn === undefined ? socket : null
    this.handle = socket._handle
    this.req = { socket }
  }

  destroy (): void {
    this.destroyed = true
    if (this.socket === null) return
    this.socket.destroy()
    for (const listener of this.#onClose) listener()
  }

  once (_event: 'close', listener: () => void): this {
    this.#onClose.push(listener)
    return this
  }
}

const TIMEOUT = 10_000

/** The timer's look, then the loop's next poll phase, after which a cut it found due is made. */
async function look (buffers: ClientBuffers): Promise<void> {
  buffers.tick()
  await new Promise((resolve) => setImmediate(resolve))
}

interface Connection {
  raw: FakeConnection
  cut: number[]
  address: string
  account: ReturnType<ClientBuffers['connection']>
  write: (bytes: number) => void
}

/** `connection()`: a client connection, of an address of its own unless one is given. */
function setup (maxBytes = 1000): { buffers: ClientBuffers, clock: { now: number }, connection: (queuedOn?: FakeSocket, address?: string) => Connection } {
  const clock = { now: 0 }
  const buffers = new ClientBuffers({ maxBytes, writeTimeoutMs: TIMEOUT, now: () => clock.now, timer: false })
  let clients = 0
  return {
    buffers,
    clock,
    connection: (queuedOn?: FakeSocket, address = `192.0.2.${++clients}`) => {
      const raw = new FakeConnection(queuedOn)
      const cut: number[] = []
      const account = buffers.connection(raw, { writeTimedOut: waiting => { cut.push(waiting) } }, address)
      return { raw, cut, address, account, write: (bytes: number) => { raw.writableLength += bytes; account.wrote(bytes) } }
    }
  }
}

t.test('an idle stream with nothing waiting is never watched nor cut', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, account } = connection()
  // Its writes go straight to the kernel: writableLength back to 0 at once.
  account.wrote(0)
  for (clock.now = 0; clock.now < 10 * TIMEOUT; clock.now += 1000) await look(buffers)
  t.same(cut, [])
  t.equal(raw.destroyed, false)
  t.equal(buffers.watched, 0, 'it costs the timer nothing')
})

t.test('bytes waiting that never drain: cut once the timeout passes, whether written to or not', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, write } = connection()
  raw.handle.writeQueueSize = 300
  write(300)
  t.equal(buffers.waitingBytes, 300, 'charged to the budget')
  clock.now = TIMEOUT - 1
  await look(buffers)
  t.same(cut, [], 'not before the timeout')
  clock.now = TIMEOUT
  await look(buffers)
  t.same(cut, [300], 'cut at the timeout, told what waited')
  t.equal(raw.destroyed, true, 'the connection is destroyed')
  t.equal(buffers.waitingBytes, 0, 'its bytes leave the budget')
  t.equal(buffers.watched, 0)
  await look(buffers)
  t.same(cut, [300], 'cut once')
})

t.test('progress: a write finished, or the write in flight shrinking, restarts the clock', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, account, write } = connection()
  raw.handle.writeQueueSize = 600
  write(600)
  // The kernel takes a piece of the write in flight.
  clock.now = TIMEOUT - 1000
  raw.handle.writeQueueSize = 500
  await look(buffers)
  clock.now = 2 * TIMEOUT - 1001
  await look(buffers)
  t.same(cut, [], 'a partial write is progress')
  // The write in flight finishes, and another is written: less waits than was seen plus written.
  raw.writableLength = 0
  raw.handle.writeQueueSize = 0
  write(400)
  raw.handle.writeQueueSize = 400
  t.equal(buffers.waitingBytes, 400, 'the charge follows what waits')
  clock.now = 3 * TIMEOUT - 1002
  await look(buffers)
  t.same(cut, [], 'a finished write is progress')
  // New writes are not progress: nothing was accepted.
  write(300)
  clock.now = 3 * TIMEOUT
  await look(buffers)
  account.settle()
  clock.now = 4 * TIMEOUT - 1002
  await look(buffers)
  t.same(cut, [700], 'writing more to a client that takes nothing does not keep it alive: cut a timeout after its last progress')
})

t.test('a look that finds the timeout run out cuts only if the next poll phase brings no progress either', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, write } = connection()
  write(300)
  raw.handle.writeQueueSize = 300
  // The process stood still past the timeout; its client read meanwhile, and the loop
  // hands the kernel more only in its poll phase, after the look.
  clock.now = TIMEOUT
  buffers.tick()
  raw.handle.writeQueueSize = 200
  await new Promise((resolve) => setImmediate(resolve))
  t.same(cut, [], 'not cut: the write in flight shrank before the verdict')
  t.equal(raw.destroyed, false)
  clock.now = 2 * TIMEOUT - 1
  await look(buffers)
  t.same(cut, [], 'the clock started again at that progress')
  // Two looks before the verdict: one cut.
  clock.now = 2 * TIMEOUT
  buffers.tick()
  buffers.tick()
  t.equal(raw.destroyed, false, 'not before the poll phase')
  await new Promise((resolve) => setImmediate(resolve))
  t.same(cut, [300], 'cut once, a timeout after the last progress, when the poll phase brought none: told what waited')
  t.equal(raw.destroyed, true)
})

t.test('a connection that drains before the verdict, and is written to again, keeps a clock of its own', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, address, account, write } = connection()
  write(300)
  raw.handle.writeQueueSize = 300
  clock.now = TIMEOUT
  buffers.tick()
  // Before the verdict: the client takes everything, and the stream writes its next page.
  raw.writableLength = 0
  raw.handle.writeQueueSize = 0
  t.equal(buffers.room(500, address, account), true)
  write(500)
  raw.handle.writeQueueSize = 500
  await new Promise((resolve) => setImmediate(resolve))
  t.same(cut, [], 'not cut for a wait that ended')
  clock.now = 2 * TIMEOUT - 1
  await look(buffers)
  t.same(cut, [], 'its clock started at the new page')
  clock.now = 2 * TIMEOUT
  await look(buffers)
  t.same(cut, [500], 'and it is cut a timeout after it, when nothing more was taken')
})

t.test('stop(): a verdict already waiting is not given', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, write } = connection()
  write(300)
  clock.now = TIMEOUT
  buffers.tick()
  buffers.stop()
  await new Promise((resolve) => setImmediate(resolve))
  t.same(cut, [])
  t.equal(raw.destroyed, false)
})

t.test('drained: the connection leaves the watch; bytes waiting later start a new clock', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, account, write } = connection()
  write(100)
  clock.now = TIMEOUT - 1
  raw.writableLength = 0
  account.settle()
  t.equal(buffers.watched, 0)
  t.equal(buffers.waitingBytes, 0)
  write(100)
  clock.now = 2 * TIMEOUT - 2
  await look(buffers)
  t.same(cut, [], 'the clock started at the new bytes')
  clock.now = 2 * TIMEOUT
  await look(buffers)
  t.same(cut, [100])
})

t.test('answers pipelined on one stuck connection: the connection is cut once, counted once', async t => {
  const { buffers, clock, connection } = setup()
  const first = connection()
  const socket = first.raw.socket!
  const queued = [connection(socket), connection(socket)]
  first.write(100)
  // Answers written before their turn wait in their own queue, not the socket's.
  for (const answer of queued) answer.write(200)
  clock.now = TIMEOUT
  await look(buffers)
  t.equal(socket.destroyed, true, 'the connection\'s socket is destroyed')
  t.same([first, ...queued].map(answer => answer.cut), [[100], [], []], 'one cut counted: the queued answers leave with their connection')
  t.equal(buffers.waitingBytes, 0, 'none of their bytes stay charged')
  t.equal(buffers.watched, 0)
})

t.test('a queued answer stuck on its own cuts its request\'s socket', async t => {
  const { buffers, clock, connection } = setup()
  const socket = connection().raw.socket!
  const queued = connection(socket)
  queued.write(200)
  clock.now = TIMEOUT
  await look(buffers)
  t.equal(socket.destroyed, true, 'destroyed now, not when Node would hand the socket over')
  t.same(queued.cut, [200])
})

t.test('a connection closed by its client leaves the budget at once', async t => {
  const { buffers, connection } = setup()
  const { raw, write } = connection()
  write(100)
  raw.destroy()
  t.equal(buffers.waitingBytes, 0)
  t.equal(buffers.watched, 0)
})

t.test('the budget: a write that would pass it is refused; one alone always goes', async t => {
  const { buffers, connection } = setup(1000)
  const a = connection()
  const b = connection()
  t.ok(buffers.room(5000, a.address, undefined), 'nothing waits anywhere: one write larger than the budget goes')
  a.write(700)
  t.ok(buffers.room(300, b.address, b.account), 'up to the budget')
  t.notOk(buffers.room(301, b.address, b.account), 'not past it')
  // a's client reads some: seen at a's next write or the next tick, or when a write would be refused.
  a.raw.writableLength = 200
  t.equal(buffers.waitingBytes, 700, 'not seen yet')
  t.ok(buffers.room(800, b.address, b.account), 'seen before refusing')
  t.equal(buffers.waitingBytes, 200)
  t.notOk(buffers.room(801, b.address, b.account))
  // A connection's own charge is brought up to date before its write is judged.
  a.raw.writableLength = 0
  t.ok(buffers.room(1000, a.address, a.account))
})

t.test('an address\'s share: its connections together have at most a quarter of the budget waiting; another address has the rest', async t => {
  const { buffers, connection } = setup(1000)
  t.equal(buffers.maxBytesPerAddress, 250)
  const x1 = connection(undefined, '198.51.100.7')
  const x2 = connection(undefined, '198.51.100.7')
  const y = connection(undefined, '203.0.113.9')
  t.ok(buffers.room(600, x1.address, undefined), 'nothing waits for the address: one write larger than its share goes')
  x1.write(200)
  t.equal(buffers.waitingFor(x1.address), 200)
  t.ok(buffers.room(50, x2.address, x2.account), 'its other connection: up to the share')
  t.notOk(buffers.room(51, x2.address, x2.account), 'not past it, whichever connection of the address writes')
  t.notOk(buffers.room(51, x1.address, undefined), 'nor a connection with no account yet')
  t.ok(buffers.room(800, y.address, y.account), 'another address: up to the budget')
  t.notOk(buffers.room(801, y.address, y.account), 'and not past the budget')
  // x1's client reads: seen before refusing, as for the budget.
  x1.raw.writableLength = 0
  t.ok(buffers.room(250, x2.address, x2.account), 'the share comes back as its clients read')
  t.equal(buffers.waitingFor(x1.address), 0)
  x2.write(240)
  x2.raw.destroy()
  t.equal(buffers.waitingFor(x2.address), 0, 'a connection gone takes its bytes off its address')
  t.equal(buffers.waitingBytes, 0, 'and off the budget')
})
