// The write timeout and the budget of client buffers, on a fake clock and
// fake connections: what counts as progress, who is cut, what is charged.
import t from 'tap'
import { ClientBuffers, type WaitingConnection } from '../../src/sse/client-buffers.js'

/** A connection whose bytes waiting and libuv queue the test sets. */
class FakeConnection implements WaitingConnection {
  writableLength = 0
  destroyed = false
  readonly handle = { writeQueueSize: 0 }
  readonly socket = { _handle: this.handle }
  #onClose: Array<() => void> = []
  destroy (): void {
    this.destroyed = true
    for (const listener of this.#onClose) listener()
  }

  once (_event: 'close', listener: () => void): this {
    this.#onClose.push(listener)
    return this
  }
}

const TIMEOUT = 10_000

function setup (maxBytes = 1000): { buffers: ClientBuffers, clock: { now: number }, connection: () => { raw: FakeConnection, cut: number[], account: ReturnType<ClientBuffers['connection']> } } {
  const clock = { now: 0 }
  const buffers = new ClientBuffers({ maxBytes, writeTimeoutMs: TIMEOUT, now: () => clock.now, timer: false })
  return {
    buffers,
    clock,
    connection: () => {
      const raw = new FakeConnection()
      const cut: number[] = []
      return { raw, cut, account: buffers.connection(raw, waiting => cut.push(waiting)) }
    }
  }
}

t.test('an idle stream with nothing waiting is never watched nor cut', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, account } = connection()
  account.wrote()
  for (clock.now = 0; clock.now < 10 * TIMEOUT; clock.now += 1000) buffers.tick()
  t.same(cut, [])
  t.equal(raw.destroyed, false)
  t.equal(buffers.watched, 0, 'it costs the timer nothing')
})

t.test('bytes waiting that never drain: cut once the timeout passes, whether written to or not', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, account } = connection()
  raw.writableLength = 300
  raw.handle.writeQueueSize = 300
  account.wrote()
  t.equal(buffers.waitingBytes, 300, 'charged to the budget')
  clock.now = TIMEOUT - 1
  buffers.tick()
  t.same(cut, [], 'not before the timeout')
  clock.now = TIMEOUT
  buffers.tick()
  t.same(cut, [300], 'cut at the timeout, told what waited')
  t.equal(raw.destroyed, true, 'the connection is destroyed')
  t.equal(buffers.waitingBytes, 0, 'its bytes leave the budget')
  t.equal(buffers.watched, 0)
  buffers.tick()
  t.same(cut, [300], 'cut once')
})

t.test('progress: a write finished, or the write in flight shrinking, restarts the clock', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, account } = connection()
  raw.writableLength = 600
  raw.handle.writeQueueSize = 600
  account.wrote()
  // The kernel takes a piece of the write in flight.
  clock.now = TIMEOUT - 1000
  raw.handle.writeQueueSize = 500
  buffers.tick()
  clock.now = 2 * TIMEOUT - 1001
  buffers.tick()
  t.same(cut, [], 'a partial write is progress')
  // A write finishes (its callback), another one waits.
  raw.writableLength = 400
  raw.handle.writeQueueSize = 400
  account.afterWrite()
  t.equal(buffers.waitingBytes, 400, 'the charge follows what waits')
  clock.now = 3 * TIMEOUT - 1002
  buffers.tick()
  t.same(cut, [], 'a finished write is progress')
  // New writes are not progress: nothing was accepted.
  raw.writableLength = 700
  account.wrote()
  clock.now = 4 * TIMEOUT
  buffers.tick()
  t.same(cut, [700], 'writing more to a client that takes nothing does not keep it alive')
})

t.test('drained: the connection leaves the watch; bytes waiting later start a new clock', async t => {
  const { buffers, clock, connection } = setup()
  const { raw, cut, account } = connection()
  raw.writableLength = 100
  account.wrote()
  clock.now = TIMEOUT - 1
  raw.writableLength = 0
  account.afterWrite()
  t.equal(buffers.watched, 0)
  t.equal(buffers.waitingBytes, 0)
  raw.writableLength = 100
  account.wrote()
  clock.now = 2 * TIMEOUT - 2
  buffers.tick()
  t.same(cut, [], 'the clock started at the new bytes')
  clock.now = 2 * TIMEOUT
  buffers.tick()
  t.same(cut, [100])
})

t.test('a connection closed by its client leaves the budget at once', async t => {
  const { buffers, connection } = setup()
  const { raw, account } = connection()
  raw.writableLength = 100
  account.wrote()
  raw.destroy()
  t.equal(buffers.waitingBytes, 0)
  t.equal(buffers.watched, 0)
})

t.test('the budget: a write that would pass it is refused; one alone always goes', async t => {
  const { buffers, connection } = setup(1000)
  const a = connection()
  const b = connection()
  t.ok(a.account.room(5000), 'nothing waits anywhere: one write larger than the budget goes')
  a.raw.writableLength = 700
  a.account.wrote()
  t.ok(b.account.room(300), 'up to the budget')
  t.notOk(b.account.room(301), 'not past it')
  // a's client reads some: the charge follows at its next write's end or tick.
  a.raw.writableLength = 200
  a.account.afterWrite()
  t.ok(b.account.room(800))
  t.equal(buffers.waitingBytes, 200)
})
