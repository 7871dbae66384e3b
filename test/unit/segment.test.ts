// How the memory store keeps one append's events (src/store/memory/segment.ts):
// small frames as one string, large ones as one buffer (the batch's own when it
// is at least half full), anything else as the events; each comes back as
// it went in, at the size retention counts for it.
import t, { type Test } from 'tap'
import { eventAt, eventBytes, heldAt, SEGMENT_WEIGHTS, segmentOf, sizeAt } from '../../src/store/memory/segment.js'
import { EventBatch } from '../../src/store/batch/event-batch.js'
import { NumberedBatch } from '../../src/store/batch/numbered-batch.js'
import type { EventInput } from '../../src/store/contract.js'

function segment (events: EventInput[], first = 7): { segment: ReturnType<typeof segmentOf>, batch: EventBatch } {
  const batch = EventBatch.from(events)
  return { segment: segmentOf(first, batch, batch.plainFrames, new NumberedBatch(batch, first)), batch }
}

const frames = (count: number, size: number): EventInput[] =>
  Array.from({ length: count }, (_, i) => ({ frame: Buffer.alloc(size, 97 + i % 26) }))

function roundTrip (t: Test, events: EventInput[], s: ReturnType<typeof segmentOf>): void {
  t.equal(s.count, events.length)
  for (const [i, e] of events.entries()) {
    const back = eventAt(s, i)
    t.equal(back.seq, s.first + i)
    t.same(back.frame, e.frame)
    t.equal(back.data, e.data)
    t.equal(back.upstreamId, e.upstreamId)
    t.equal(sizeAt(s, i), eventBytes(e), 'counted at the bytes retention counts')
  }
}

t.test('small plain frames are one string', async t => {
  const events = frames(3, 10)
  const { segment: s } = segment(events)
  t.type(s.events === undefined && s.blob, 'string')
  roundTrip(t, events, s)
})

t.test('large plain frames: the batch\'s own buffer when at least half full (and the batch is retained, its room counted), else a copy', async t => {
  const tightEvents = frames(16, 512)
  const tight = segment(tightEvents)
  t.equal(tight.segment.events === undefined && tight.segment.blob, tight.batch.bytes, 'kept as it is')
  t.equal(tight.batch.release(), undefined, 'retained: its builder never packs into it again')
  t.equal(tight.segment.overhead, SEGMENT_WEIGHTS.segment + 16 * SEGMENT_WEIGHTS.offset, 'no room left: the segment\'s own objects only')
  roundTrip(t, tightEvents, tight.segment)
  const halfEvents = frames(9, 512)
  const half = segment(halfEvents)
  t.equal(half.segment.events === undefined && half.segment.blob, half.batch.bytes, '4.5 KB in an 8 KB buffer: kept as it is')
  const own = SEGMENT_WEIGHTS.segment + 9 * SEGMENT_WEIGHTS.offset
  t.equal(half.segment.overhead, own + 8192 - 9 * 512, 'its room counted, with the segment\'s own objects')
  t.equal(heldAt(half.segment, 8), 512 + own + 8192 - 9 * 512, 'with its last event')
  t.equal(heldAt(half.segment, 0), 512)
  roundTrip(t, halfEvents, half.segment)
  const sparseEvents = frames(3, 2048)
  const packed = EventBatch.from(sparseEvents)
  const room = Buffer.allocUnsafeSlow(4 * packed.bytes.length)
  packed.bytes.copy(room)
  const sparse = new EventBatch(room.subarray(0, packed.bytes.length), packed.layout, '')
  const copied = segmentOf(7, sparse, true, new NumberedBatch(sparse, 7))
  const blob = copied.events === undefined ? copied.blob : undefined
  t.ok(Buffer.isBuffer(blob) && blob.buffer !== room.buffer && blob.buffer.byteLength === 3 * 2048, 'a quarter full: a copy of the exact size')
  t.equal(copied.overhead, SEGMENT_WEIGHTS.segment + 3 * SEGMENT_WEIGHTS.offset, 'no room to count')
  roundTrip(t, sparseEvents, copied)
})

t.test('frames with upstream ids keep their ids by position; text events are kept as events', async t => {
  const withIds: EventInput[] = [{ frame: Buffer.from('data: 1\n'), upstreamId: 'u1' }, { frame: Buffer.from('data: 2\n') }]
  const ids = segment(withIds)
  t.type(ids.segment.events === undefined && ids.segment.blob, 'string')
  roundTrip(t, withIds, ids.segment)
  const mixed: EventInput[] = [{ frame: Buffer.from('data: 1\n') }, { data: 'gap', event: 'gateway-gap', upstreamId: 'x' }]
  const m = segment(mixed)
  t.ok(m.segment.events !== undefined, 'kept as event objects')
  roundTrip(t, mixed, m.segment)
  t.equal(eventAt(m.segment, 1).event, 'gateway-gap')
})
