// The recorder's read-ahead (src/recording/read-ahead.ts): upstream reads that
// arrive while an append is at the store are decoded and handed over together
// as the next batch, in order, with a bound on what waits.
import t from 'tap'
import { PassThrough } from 'node:stream'
import { setImmediate as nextTurn } from 'node:timers/promises'
import { READ_AHEAD_BYTES, READ_AHEAD_MAX_BYTES, readAhead, TURN_BYTES, ReadAheadBudget, type ReadAheadSink } from '../../src/recording/read-ahead.js'

/** One gateway's budget, shared by the streams of these tests. */
const budget = new ReadAheadBudget()
import { SseDecoder } from '../../src/sse/decoder.js'
import type { EventBatch } from '../../src/store/batch/event-batch.js'
import { EventTooLargeError } from '../../src/sse/event-too-large.js'
import { dataOf } from '../fixtures/events.js'

const ev = (i: number): string => `data: {"i":${i}}\n\n`
const data = (batch: EventBatch): string[] => batch.toArray().map(dataOf)

type Outcome = { ended: true } | { error: unknown }

/** A sink that holds each batch, as an append at the store would, until the test lets it go. */
class HeldSink implements ReadAheadSink {
  readonly batches: EventBatch[] = []
  /** Pieces of the body read (read() calls). */
  reads = 0
  /** Resolves with end() or fail(), whichever readAhead calls. */
  readonly outcome: Promise<Outcome>
  over = false
  #taken = 0
  #arrived: (() => void) | undefined
  #held: { resolve: (done: boolean) => void, reject: (err: unknown) => void } | undefined
  #finish: (outcome: Outcome) => void = () => {}

  constructor () {
    this.outcome = new Promise(resolve => { this.#finish = resolve })
  }

  batch (events: EventBatch): Promise<boolean> {
    if (this.#held !== undefined) throw new Error('a batch came while the previous one was held')
    this.batches.push(events)
    this.#arrived?.()
    return new Promise<boolean>((resolve, reject) => { this.#held = { resolve, reject } })
  }

  read (): void { this.reads++ }

  end (): void { this.#over({ ended: true }) }
  fail (error: unknown): void { this.#over({ error }) }

  #over (outcome: Outcome): void {
    if (this.over) throw new Error('end() or fail() called twice')
    if (this.#held !== undefined) throw new Error('over while a batch was held')
    this.over = true
    this.#finish(outcome)
  }

  /** The next batch handed over, waited for. */
  async next (): Promise<string[]> {
    while (this.batches.length <= this.#taken) await new Promise<void>(resolve => { this.#arrived = resolve })
    return data(this.batches[this.#taken++] as EventBatch)
  }

  /** The held batch is stored: the next may come (with `done`, its buffers may take the next events). */
  release (done = false): void {
    const held = this.#held
    this.#held = undefined
    held?.resolve(done)
  }

  /** The store refused the held batch for good. */
  refuse (err: Error): void {
    const held = this.#held
    this.#held = undefined
    held?.reject(err)
  }

  /** Releases batch after batch until readAhead is over: the events of the batches taken meanwhile. */
  async drain (): Promise<string[]> {
    const events: string[] = []
    for (;;) {
      this.release()
      const next = await Promise.race([this.next(), this.outcome.then(() => null)])
      if (next === null) return events
      events.push(...next)
    }
  }
}

t.test('reads that arrive while a batch is being worked on come out together, in order', async t => {
  const body = new PassThrough()
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(1024), sink, budget)
  body.write(ev(1))
  t.same(await sink.next(), ['{"i":1}'], 'the first read is a batch of its own')
  // The sink is "at the store": three reads arrive meanwhile, one event split across two of them.
  body.write(ev(2))
  body.write(ev(3) + 'data: {"i"')
  body.write(':4}\n\n')
  await nextTurn()
  t.equal(sink.batches.length, 1, 'nothing more is handed over while a batch is held')
  sink.release()
  t.same(await sink.next(), ['{"i":2}', '{"i":3}', '{"i":4}'], 'the next batch holds all three reads')
  t.equal(sink.reads, 4, 'every read is counted, one call each: four reads, two batches')
  body.end()
  await nextTurn()
  t.notOk(sink.over, 'not over while a batch is at the store, though the body ended')
  sink.release()
  t.same(await sink.outcome, { ended: true }, 'ends with the body, once the last batch settled')
})

t.test('what waits is bounded: the upstream is paused, then resumed once the batch is taken', async t => {
  const body = new PassThrough({ highWaterMark: 16 })
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(1024), sink, 64)
  body.write(ev(0))
  t.same(await sink.next(), ['{"i":0}'], 'the first event')
  // The sink is at the store while 19 more events (13 bytes each) arrive.
  for (let i = 1; i < 20; i++) body.write(ev(i))
  await nextTurn()
  await nextTurn()
  t.ok(body.isPaused(), 'paused once 64 bytes of events wait')
  sink.release()
  const waiting = await sink.next()
  t.ok(waiting.length >= 5 && waiting.length < 19, `a bounded batch (${waiting.length} events), not all the rest`)
  t.notOk(body.isPaused(), 'reading resumes when the batch is taken')
  body.end()
  const rest = await sink.drain()
  t.same([...waiting, ...rest], Array.from({ length: 19 }, (_, i) => `{"i":${i + 1}}`), 'nothing lost across the pause, in order')
  t.same(await sink.outcome, { ended: true })
})

t.test('the default bound is a share of a budget: one busy stream reads far ahead, many busy streams get the floor each', async t => {
  t.equal(budget.limit(), READ_AHEAD_MAX_BYTES, 'no stream waiting: a stream would get the most')
  const kb = `data: ${'x'.repeat(1016)}\n\n` // 1 KB events
  /** Writes 1 KB events to `body` until it pauses (or `max` KB); returns the KB written. */
  const fill = async (body: PassThrough, max: number): Promise<number> => {
    let written = 0
    while (written < max) {
      // Paused for a later turn of the event loop (TURN_BYTES) is not paused for good: look again after one.
      if (body.isPaused()) {
        await nextTurn()
        if (body.isPaused()) break
      }
      body.write(kb)
      written++
      if (written % 64 === 0) await nextTurn()
    }
    await nextTurn()
    return written
  }
  const lone = new PassThrough()
  const loneSink = new HeldSink()
  readAhead(lone, new SseDecoder(4096), loneSink, budget)
  lone.write(kb)
  await loneSink.next() // held ("at the store") while more arrives
  const loneKb = await fill(lone, 4096)
  t.ok(loneKb * 1024 > READ_AHEAD_BYTES + 64 * 1024, `one stream alone read ${loneKb} KB ahead, past the floor`)
  t.ok(lone.isPaused() && loneKb * 1024 <= READ_AHEAD_MAX_BYTES + 64 * 1024, 'and paused at the most a stream may hold')

  // 99 more streams with events waiting: the budget split 100 ways is below the floor.
  const others = Array.from({ length: 99 }, () => ({ body: new PassThrough(), sink: new HeldSink() }))
  for (const { body, sink } of others) {
    readAhead(body, new SseDecoder(4096), sink, budget)
    body.write(kb)
    await sink.next()
    body.write(kb) // waits: counted
  }
  await nextTurn()
  t.equal(budget.limit(), READ_AHEAD_BYTES, '100 streams waiting: each gets the floor')
  const crowded = (others[0] as { body: PassThrough }).body
  const crowdedKb = await fill(crowded, 4096)
  t.ok(crowded.isPaused() && (crowdedKb + 1) * 1024 >= READ_AHEAD_BYTES && crowdedKb * 1024 <= READ_AHEAD_BYTES + 64 * 1024, `a stream among them paused after ${crowdedKb} KB`)

  // Streams that end, or whose sink stops them, no longer count (ten left counted would hold the share below the most).
  const ending = others.slice(0, 10)
  for (const { body, sink } of ending) {
    body.end()
    await sink.drain()
  }
  t.same(await Promise.all(ending.map(async ({ sink }) => await sink.outcome)), ending.map(() => ({ ended: true })), 'ten streams ended')
  for (const { sink } of [...others.slice(10), { sink: loneSink }]) {
    sink.refuse(new Error('stop'))
    await sink.outcome
  }
  t.equal(budget.limit(), READ_AHEAD_MAX_BYTES, 'all gone: back to the most')
})

t.test('an event still arriving is not held back by the bound', async t => {
  const body = new PassThrough()
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(4096), sink, 16)
  const big = `data: ${'x'.repeat(1000)}\n\n`
  for (let i = 0; i < big.length; i += 10) body.write(big.slice(i, i + 10))
  t.equal((await sink.next())[0]?.length, 1000, 'a 1,000-byte event in 10-byte reads passes a 16-byte bound')
  body.end()
  await sink.drain()
})

t.test('the body\'s error comes after the batches read before it', async t => {
  const body = new PassThrough()
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(1024), sink, budget)
  body.write(ev(1))
  t.same(await sink.next(), ['{"i":1}'])
  // While the sink is at the store: two events, then the connection breaks.
  body.write(ev(2) + ev(3))
  await nextTurn()
  body.destroy(new Error('upstream reset'))
  await nextTurn()
  t.notOk(sink.over, 'not over while a batch is at the store')
  sink.release()
  t.same(await sink.next(), ['{"i":2}', '{"i":3}'], 'the events first')
  await nextTurn()
  t.notOk(sink.over, 'still not over: that batch is at the store')
  sink.release()
  const outcome = await sink.outcome
  t.match(outcome, { error: { message: 'upstream reset' } }, 'then the error')
})

t.test('an oversized event: the batches before it, the events of its own read before it, then EventTooLargeError', async t => {
  const body = new PassThrough()
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(64), sink, budget)
  body.write(ev(1))
  t.same(await sink.next(), ['{"i":1}'], 'the earlier read is a batch')
  // While the sink is at the store: one read with an event, an oversized one, another event.
  body.write(ev(2) + `data: ${'x'.repeat(100)}\n\n` + ev(3))
  await nextTurn()
  t.ok(body.isPaused(), 'reading stops at the oversized event')
  sink.release()
  t.same(await sink.next(), ['{"i":2}'], 'then what completed before the oversized event')
  sink.release()
  const outcome = await sink.outcome
  t.ok('error' in outcome && outcome.error instanceof EventTooLargeError, 'then the decoder\'s error')
  t.ok(body.destroyed, 'and the body is released')
})

t.test('a sink that stops early: no listener left, the body released, its late errors not uncaught', async t => {
  const body = new PassThrough()
  const before = body.listenerCount('data')
  body.write(ev(1))
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(1024), sink, budget)
  t.same(await sink.next(), ['{"i":1}'], 'one batch taken')
  body.write(ev(2))
  await nextTurn()
  sink.refuse(new Error('the store refused'))
  t.match(await sink.outcome, { error: { message: 'the store refused' } }, 'fail() gets the reason')
  t.equal(sink.batches.length, 1, 'what waited is not handed over after the refusal')
  t.equal(body.listenerCount('data'), before, 'the data listener is gone')
  t.ok(body.destroyed, 'the body is released')
  // undici reports a body destroyed later as aborted: that error must not be uncaught.
  body.emit('error', new Error('late abort'))
  await nextTurn()
  t.pass('a late error after the sink stopped is not uncaught')
})

t.test('an unterminated last event is dropped at the end, as SSE says', async t => {
  const body = new PassThrough()
  body.end(ev(1) + 'data: partial')
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(1024), sink, budget)
  t.same(await sink.drain(), ['{"i":1}'])
  t.same(await sink.outcome, { ended: true })
})

t.test('a body that ends without an event: over at once, nothing handed over', async t => {
  const body = new PassThrough()
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(1024), sink, budget)
  body.end()
  t.same(await sink.outcome, { ended: true })
  t.equal(sink.batches.length, 0)
})

t.test('a body closed before its end (a connection cut without an error): the events read, then a premature close', async t => {
  const body = new PassThrough()
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(1024), sink, budget)
  body.write(ev(1) + ev(2))
  t.same(await sink.next(), ['{"i":1}', '{"i":2}'])
  body.destroy()
  sink.release()
  t.match(await sink.outcome, { error: { code: 'ERR_STREAM_PREMATURE_CLOSE' } }, 'reported as stream.finished() would')
})

t.test('a body already over when it is handed over: told at once, not waited for', async t => {
  const aborted = new PassThrough()
  aborted.on('error', () => {}) // its owner's listener, as undici's request has
  aborted.destroy(new Error('aborted before'))
  await nextTurn()
  const sink = new HeldSink()
  readAhead(aborted, new SseDecoder(1024), sink, budget)
  t.match(await sink.outcome, { error: { message: 'aborted before' } }, 'a destroyed body: its error')

  const cut = new PassThrough()
  cut.destroy()
  await nextTurn()
  const cutSink = new HeldSink()
  readAhead(cut, new SseDecoder(1024), cutSink, budget)
  t.match(await cutSink.outcome, { error: { code: 'ERR_STREAM_PREMATURE_CLOSE' } }, 'destroyed without an error: a premature close')
  t.equal(cut.listenerCount('close'), 0, 'no listener left behind')
})

t.test('a batch the sink is done with (it resolved true) takes the events after the next; one it resolved false is left alone', async t => {
  const body = new PassThrough()
  const sink = new HeldSink()
  readAhead(body, new SseDecoder(1024), sink, budget)
  const handed = async (n: number): Promise<EventBatch> => {
    while (sink.batches.length < n) await nextTurn()
    return sink.batches[n - 1] as EventBatch
  }
  body.write(ev(1))
  const first = await handed(1)
  const firstBytes = first.bytes.buffer
  body.write(ev(2))
  await nextTurn()
  sink.release(true)
  const second = await handed(2)
  body.write(ev(3))
  await nextTurn()
  sink.release(false)
  const third = await handed(3)
  t.equal(third.bytes.buffer, firstBytes, 'the third batch is packed into the first one\'s buffer (events waited when it came back)')
  t.not(second.bytes.buffer, firstBytes, 'the second, which waited meanwhile, has its own')
  body.write(ev(4))
  await nextTurn()
  sink.release(true)
  const fourth = await handed(4)
  t.not(fourth.bytes.buffer, second.bytes.buffer, 'a batch resolved false is not packed into again')
  t.same([second, third, fourth].map(data), [['{"i":2}'], ['{"i":3}'], ['{"i":4}']], 'every batch holds its own events')
  body.end()
  sink.release(true)
  t.same(await sink.outcome, { ended: true })
})

t.test('a turn of the event loop handles TURN_BYTES of all streams\' reads: past it a stream pauses until a later turn', async t => {
  const shared = new ReadAheadBudget()
  const kb = `data: ${'x'.repeat(1016)}\n\n` // 1 KB events
  const taken: number[] = []
  let reads = 0
  /** A store that takes every batch at once (the embedded store). */
  const fastSink = (i: number): ReadAheadSink => ({
    batch: async (events: EventBatch) => { taken[i] = (taken[i] ?? 0) + events.length; return false },
    read: () => { reads++ },
    end: () => {},
    fail: () => {}
  })
  const bodies = [new PassThrough(), new PassThrough()]
  bodies.forEach((body, i) => readAhead(body, new SseDecoder(4096), fastSink(i), shared))
  // Both upstreams send a lot within one turn (no await: the loop does not move on).
  const perStream = 2 * TURN_BYTES / 1024
  for (let k = 0; k < perStream; k++) for (const body of bodies) body.write(kb)
  t.ok(bodies.every(body => body.isPaused()), 'both paused within the turn')
  // One read per 1 KB write here: read within the turn, the rest waits in the bodies.
  t.ok(reads * 1024 >= TURN_BYTES - 1024 && reads * 1024 <= TURN_BYTES + 1024, `a turn's share read in that turn (${reads} KB of ${2 * perStream} KB sent)`)
  for (let turns = 0; turns < 100 && (taken[0] ?? 0) + (taken[1] ?? 0) < 2 * perStream; turns++) await nextTurn()
  t.same(taken, [perStream, perStream], 'later turns take the rest of both, nothing lost')
  for (const body of bodies) body.end()
})

t.test('the count starts again every turn: a stream that reads under TURN_BYTES in each turn is never paused, however much it reads in all', async t => {
  const shared = new ReadAheadBudget()
  const kb = `data: ${'x'.repeat(1016)}\n\n` // 1 KB events
  let taken = 0
  const body = new PassThrough()
  readAhead(body, new SseDecoder(4096), {
    batch: async (events: EventBatch) => { taken += events.length; return false },
    end: () => {},
    fail: () => {}
  }, shared)
  const perTurn = TURN_BYTES / 1024 / 4
  const turns = 12
  const pausedIn: number[] = []
  for (let turn = 0; turn < turns; turn++) {
    for (let k = 0; k < perTurn; k++) body.write(kb)
    if (body.isPaused()) pausedIn.push(turn)
    await nextTurn()
  }
  t.same(pausedIn, [], `a quarter of TURN_BYTES per turn, ${turns / 4} times TURN_BYTES in all: never paused`)
  t.equal(taken, perTurn * turns, 'every event handed over')
  body.end()
})
