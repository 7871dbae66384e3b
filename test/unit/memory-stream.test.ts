// One stream of the memory store (src/store/memory/memory-stream.ts): its
// numbering, reads by count and bytes across segments, per-stream retention,
// and the bytes each change adds or frees (the byte cap's bookkeeping).
import t from 'tap'
import { MemoryStream } from '../../src/store/memory/memory-stream.js'
import type { SegmentWeights } from '../../src/store/memory/segment.js'
import { EventBatch } from '../../src/store/batch/event-batch.js'
import { NumberedBatch } from '../../src/store/batch/numbered-batch.js'
import type { EventInput, RetentionLimits, StoredEvent } from '../../src/store/contract.js'

/** Event bytes alone: what a segment holds besides them is counted in segment.test.ts. */
const EVENT_BYTES_ONLY: SegmentWeights = { segment: 0, offset: 0, upstreamId: 0 }

const ROOMY: RetentionLimits = { maxEvents: 1_000_000, maxBytes: 1_000_000_000, ttlMs: 60_000 }
const frame = (text: string): EventInput => ({ frame: Buffer.from(text) })

/** Append events as one segment; the bytes it added. */
function append (stream: MemoryStream, events: EventInput[]): number {
  const batch = EventBatch.from(events)
  return stream.append(batch, new NumberedBatch(batch, stream.lastSeq + 1))
}

/** A read's events, from the batches it answers with. */
const read = (stream: MemoryStream, afterSeq: number, limit: number, maxBytes: number): StoredEvent[] =>
  stream.read(afterSeq, limit, maxBytes).flatMap(batch => batch.events)

const seqs = (stream: MemoryStream, afterSeq = 0, limit = Infinity, maxBytes = Infinity): number[] =>
  read(stream, afterSeq, limit, maxBytes).map(e => e.seq)

t.test('appends number events from 1 on and count their bytes', async t => {
  const stream = new MemoryStream('s', EVENT_BYTES_ONLY)
  t.same(stream.state('e'), { epoch: 'e', lastSeq: 0, firstSeq: 1, ended: false }, 'empty: firstSeq is lastSeq + 1')
  t.equal(append(stream, [frame('data: 1\n'), frame('data: 22\n')]), 17, 'plain frames: their bytes')
  t.equal(append(stream, [{ data: 'abc', event: 'gap', upstreamId: '9' }]), 7, 'text: data, type and id')
  t.equal(append(stream, []), 0, 'nothing appended: nothing added')
  t.equal(stream.bytes, 24)
  t.same(stream.state('e'), { epoch: 'e', lastSeq: 3, firstSeq: 1, ended: false })
  const events = read(stream, 0, Infinity, Infinity)
  t.same(events.map(e => e.frame?.toString() ?? e.data), ['data: 1\n', 'data: 22\n', 'abc'])
  t.same(events[2], { seq: 3, data: 'abc', event: 'gap', upstreamId: '9' })
})

t.test('reads start after a seq, stop at a count or a byte budget, and give at least one event', async t => {
  const stream = new MemoryStream('s', EVENT_BYTES_ONLY)
  for (let i = 0; i < 5; i++) append(stream, [frame('0123456789'), frame('0123456789')])
  t.same(seqs(stream, 3), [4, 5, 6, 7, 8, 9, 10], 'from the middle of a segment on')
  t.same(seqs(stream, 0, 3), [1, 2, 3], 'a count')
  t.same(seqs(stream, 4, Infinity, 25), [5, 6], 'a byte budget')
  t.same(seqs(stream, 4, Infinity, 1), [5], 'one event over the budget all the same')
  t.same(seqs(stream, 10), [], 'nothing after the newest')
  t.same(seqs(stream, 0, 0), [], 'a limit of 0')
})

t.test('trimming drops the oldest events beyond a count or bytes, never the newest, and frees their bytes', async t => {
  const stream = new MemoryStream('s', EVENT_BYTES_ONLY)
  for (let i = 0; i < 4; i++) append(stream, [frame('0123456789'), frame('0123456789')])
  t.equal(stream.trim({ ...ROOMY, maxEvents: 5 }), 30)
  t.same(seqs(stream), [4, 5, 6, 7, 8])
  t.equal(stream.state('e').firstSeq, 4)
  t.same(seqs(stream, 0, 1), [4], 'a read from before the first retained event starts there')
  t.equal(stream.trim({ ...ROOMY, maxBytes: 25 }), 30)
  t.same(seqs(stream), [7, 8])
  t.equal(stream.trim({ ...ROOMY, maxBytes: 1 }), 10, 'down to the newest event')
  t.same(seqs(stream), [8])
  t.equal(stream.bytes, 10)
  t.equal(stream.retained, 1)
})

t.test('dropping one event at a time walks across segments; compaction keeps reads right', async t => {
  const stream = new MemoryStream('s', EVENT_BYTES_ONLY)
  for (let i = 0; i < 300; i++) append(stream, [frame('x')])
  let freed = 0
  for (let i = 0; i < 250; i++) freed += stream.dropOldest()
  stream.compact()
  t.equal(freed, 250)
  t.same(seqs(stream, 0, 3), [251, 252, 253])
  t.same(seqs(stream, 298), [299, 300])
  append(stream, [frame('y')])
  t.equal(read(stream, 300, 1, Infinity)[0]?.frame?.toString(), 'y')
})

t.test('emptying frees every byte and keeps the numbering', async t => {
  const stream = new MemoryStream('s', EVENT_BYTES_ONLY)
  append(stream, [frame('abc'), frame('de')])
  t.equal(stream.empty(), 5)
  t.equal(stream.bytes, 0)
  t.same(stream.state('e'), { epoch: 'e', lastSeq: 2, firstSeq: 3, ended: false })
  append(stream, [frame('f')])
  t.same(seqs(stream), [3])
})
