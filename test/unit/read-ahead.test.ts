// The recorder's read-ahead (src/relay/read-ahead.ts): upstream reads that
// arrive while an append is at the store are decoded and handed over together
// as the next batch, in order, with a bound on what waits.
import t from 'tap'
import { PassThrough } from 'node:stream'
import { setImmediate as nextTurn } from 'node:timers/promises'
import { READ_AHEAD_BYTES, READ_AHEAD_MAX_BYTES, readAhead, readAheadLimit } from '../../src/relay/read-ahead.js'
import { SseDecoder } from '../../src/sse/decoder.js'
import type { EventBatch } from '../../src/store/batch.js'
import { EventTooLargeError } from '../../src/errors.js'
import { dataOf } from '../fixtures/events.js'

const ev = (i: number): string => `data: {"i":${i}}\n\n`
const data = (batch: EventBatch): string[] => batch.toArray().map(dataOf)

t.test('reads that arrive while a batch is being worked on come out together, in order', async t => {
  const body = new PassThrough()
  const it = readAhead(body, new SseDecoder(1024))
  body.write(ev(1))
  const first = await it.next()
  t.same(data(first.value as EventBatch), ['{"i":1}'], 'the first read is a batch of its own')
  // The consumer is "at the store": three reads arrive meanwhile, one event split across two of them.
  body.write(ev(2))
  body.write(ev(3) + 'data: {"i"')
  body.write(':4}\n\n')
  await nextTurn()
  const second = await it.next()
  t.same(data(second.value as EventBatch), ['{"i":2}', '{"i":3}', '{"i":4}'], 'the next batch holds all three reads')
  body.end()
  t.same(await it.next(), { done: true, value: undefined }, 'ends with the body')
})

t.test('what waits is bounded: the upstream is paused, then resumed once the batch is taken', async t => {
  const body = new PassThrough({ highWaterMark: 16 })
  const it = readAhead(body, new SseDecoder(1024), 64)
  const first = it.next()
  body.write(ev(0))
  t.same(data((await first).value as EventBatch), ['{"i":0}'], 'the first event')
  // The consumer is at the store while 19 more events (13 bytes each) arrive.
  for (let i = 1; i < 20; i++) body.write(ev(i))
  await nextTurn()
  await nextTurn()
  t.ok(body.isPaused(), 'paused once 64 bytes of events wait')
  const waiting = data((await it.next()).value as EventBatch)
  t.ok(waiting.length >= 5 && waiting.length < 19, `a bounded batch (${waiting.length} events), not all the rest`)
  t.notOk(body.isPaused(), 'reading resumes when the batch is taken')
  body.end()
  const rest: string[] = []
  for (let r = await it.next(); r.done !== true; r = await it.next()) rest.push(...data(r.value))
  t.same([...waiting, ...rest], Array.from({ length: 19 }, (_, i) => `{"i":${i + 1}}`), 'nothing lost across the pause, in order')
})

t.test('the default bound is a share of a budget: one busy stream reads far ahead, many busy streams get the floor each', async t => {
  t.equal(readAheadLimit(), READ_AHEAD_MAX_BYTES, 'no stream waiting: a stream would get the most')
  const kb = `data: ${'x'.repeat(1016)}\n\n` // 1 KB events
  /** Writes 1 KB events to `body` until it pauses (or `max` KB); returns the KB written. */
  const fill = async (body: PassThrough, max: number): Promise<number> => {
    let written = 0
    while (!body.isPaused() && written < max) {
      body.write(kb)
      written++
      if (written % 64 === 0) await nextTurn()
    }
    await nextTurn()
    return written
  }
  const lone = new PassThrough()
  const loneIt = readAhead(lone, new SseDecoder(4096))
  const first = loneIt.next()
  lone.write(kb)
  await first // the consumer holds this batch ("at the store") while more arrives
  const loneKb = await fill(lone, 4096)
  t.ok(loneKb * 1024 > READ_AHEAD_BYTES + 64 * 1024, `one stream alone read ${loneKb} KB ahead, past the floor`)
  t.ok(lone.isPaused() && loneKb * 1024 <= READ_AHEAD_MAX_BYTES + 64 * 1024, 'and paused at the most a stream may hold')

  // 99 more streams with events waiting: the budget split 100 ways is below the floor.
  const others = Array.from({ length: 99 }, () => new PassThrough())
  const iterators = others.map(body => readAhead(body, new SseDecoder(4096)))
  for (const [i, body] of others.entries()) {
    const next = (iterators[i] as AsyncGenerator<EventBatch>).next()
    body.write(kb)
    await next
    body.write(kb) // waits: counted
  }
  await nextTurn()
  t.equal(readAheadLimit(), READ_AHEAD_BYTES, '100 streams waiting: each gets the floor')
  const crowded = others[0] as PassThrough
  const crowdedKb = await fill(crowded, 4096)
  t.ok(crowded.isPaused() && (crowdedKb + 1) * 1024 >= READ_AHEAD_BYTES && crowdedKb * 1024 <= READ_AHEAD_BYTES + 64 * 1024, `a stream among them paused after ${crowdedKb} KB`)

  // Streams that end (or whose consumer stops) no longer count.
  for (const it of iterators) await it.return(undefined)
  await loneIt.return(undefined)
  t.equal(readAheadLimit(), READ_AHEAD_MAX_BYTES, 'all gone: back to the most')
})

t.test('an event still arriving is not held back by the bound', async t => {
  const body = new PassThrough()
  const it = readAhead(body, new SseDecoder(4096), 16)
  const big = `data: ${'x'.repeat(1000)}\n\n`
  const next = it.next()
  for (let i = 0; i < big.length; i += 10) body.write(big.slice(i, i + 10))
  t.equal(data((await next).value as EventBatch)[0]?.length, 1000, 'a 1,000-byte event in 10-byte reads passes a 16-byte bound')
  body.end()
})

t.test('the body\'s error comes after the batches read before it', async t => {
  const body = new PassThrough()
  const it = readAhead(body, new SseDecoder(1024))
  const first = it.next()
  body.write(ev(1))
  t.same(data((await first).value as EventBatch), ['{"i":1}'])
  // While the consumer is at the store: two events, then the connection breaks.
  body.write(ev(2) + ev(3))
  await nextTurn()
  body.destroy(new Error('upstream reset'))
  await nextTurn()
  t.same(data((await it.next()).value as EventBatch), ['{"i":2}', '{"i":3}'], 'the events first')
  await t.rejects(it.next(), /upstream reset/, 'then the error')
})

t.test('an oversized event: the batches before it, the events of its own read before it, then EventTooLargeError', async t => {
  const body = new PassThrough()
  const it = readAhead(body, new SseDecoder(64))
  const first = it.next()
  body.write(ev(1))
  t.same(data((await first).value as EventBatch), ['{"i":1}'], 'the earlier read is a batch')
  // While the consumer is at the store: one read with an event, an oversized one, another event.
  body.write(ev(2) + `data: ${'x'.repeat(100)}\n\n` + ev(3))
  await nextTurn()
  t.same(data((await it.next()).value as EventBatch), ['{"i":2}'], 'then what completed before the oversized event')
  const err = await it.next().then(() => undefined, (e: unknown) => e)
  t.ok(err instanceof EventTooLargeError, 'then the decoder\'s error')
  t.ok(body.isPaused(), 'and reading stops')
})

t.test('a consumer that stops early: no listener left, the body released, its late errors not uncaught', async t => {
  const body = new PassThrough()
  const before = body.listenerCount('data')
  body.write(ev(1))
  const it = readAhead(body, new SseDecoder(1024))
  t.equal(((await it.next()).value as EventBatch).length, 1, 'one batch taken')
  await it.return() // what a for-await loop does on break or throw
  t.equal(body.listenerCount('data'), before, 'the data listener is gone')
  t.ok(body.destroyed, 'the body is released, as a for-await loop over it would')
  // undici reports a body destroyed later as aborted: that error must not be uncaught.
  body.emit('error', new Error('late abort'))
  await nextTurn()
  t.pass('a late error after the consumer stopped is not uncaught')
})

t.test('an unterminated last event is dropped at the end, as SSE says', async t => {
  const body = new PassThrough()
  body.end(ev(1) + 'data: partial')
  const batches: string[][] = []
  for await (const batch of readAhead(body, new SseDecoder(1024))) batches.push(data(batch))
  t.same(batches, [['{"i":1}']])
})
