// The packed-batch layout (src/store/batch/packed-layout.ts), the one codec
// every reader uses: its text form read back exactly as written, and events
// iterated from any position of a batch as the whole batch gives them.
import t from 'tap'
import { EventBatch } from '../../src/store/batch/event-batch.js'
import { decodeEvents, eventSize, eventStart, FLAG_FRAME, layoutText, parseLayoutText, plainFrames } from '../../src/store/batch/packed-layout.js'
import type { EventInput } from '../../src/store/contract.js'

const events: EventInput[] = [
  { frame: Buffer.from('data: {"a":1}\n') },
  { frame: Buffer.from('event: note\ndata: é\n'), upstreamId: 'up-1' },
  { data: 'gap ✓', event: 'gateway-gap' },
  { data: 'with id', upstreamId: 'ü-2' },
  { data: 'typed, with id', event: 'note', upstreamId: 'u-3' },
  { frame: Buffer.from('data: last\n'), upstreamId: '' },
  { frame: Buffer.from('data: plain\n') }
]

t.test('the text form is read back as it was written', async t => {
  const { layout } = EventBatch.from(events)
  t.same(parseLayoutText(layoutText(layout, 0, events.length)), layout, 'every event')
  t.same(parseLayoutText(layoutText(layout, 2, 5)), layout.subarray(8, 20), 'a run of them')
  const largest = new Uint32Array([FLAG_FRAME, 4294967295, 0, 10])
  t.same(parseLayoutText(layoutText(largest, 0, 1)), largest, 'the largest length, every digit')
  t.same(parseLayoutText(Buffer.alloc(0)), new Uint32Array(0), 'no events')
  t.throws(() => parseLayoutText(Buffer.from('4 8 0 ')), RangeError, 'not four numbers per event')
})

t.test('events are decoded from any position as the whole batch gives them', async t => {
  const batch = EventBatch.from(events)
  const whole = decodeEvents(batch.bytes, batch.layout, 10)
  t.same(whole.map(e => e.seq), events.map((_, i) => 10 + i), 'numbered from the first seq')
  for (const field of ['data', 'event', 'upstreamId'] as const) t.same(whole.map(e => e[field]), events.map(e => e[field]), `every ${field} as it was packed`)
  t.same(whole.map(e => e.frame?.toString()), events.map(e => e.frame?.toString()), 'every frame as it was packed')
  t.same(whole, batch.stored(10), 'the batch decodes through the codec')
  for (let from = 0; from <= events.length; from++) {
    for (let to = from; to <= events.length; to++) {
      t.same(decodeEvents(batch.bytes, batch.layout, 10, from, to), whole.slice(from, to), `events [${from}, ${to})`)
    }
  }
  t.equal(eventStart(batch.layout, 3), eventSize(batch.layout, 0) + eventSize(batch.layout, 1) + eventSize(batch.layout, 2))
  t.equal(eventStart(batch.layout, events.length), batch.bytes.length, 'the end of the last event is the end of the bytes')
})

t.test('plain frames: upstream frames without an upstream id, over a range', async t => {
  const { layout } = EventBatch.from(events)
  t.notOk(plainFrames(layout))
  t.ok(plainFrames(layout, 6), 'the last event alone')
  t.ok(plainFrames(layout, 0, 1), 'the first alone')
  t.notOk(plainFrames(layout, 5), 'a frame with an empty upstream id is not plain')
  t.ok(plainFrames(layout, 3, 3), 'no events')
})
