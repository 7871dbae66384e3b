// Packed event batches (src/store/batch/event-batch.ts): what the recorder hands the
// stores, and the form Redis keeps. Packing must give back every event as
// it was appended, in the layout text the Redis scripts parse.
import t from 'tap'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { EventBatch, EventBatchBuilder } from '../../src/store/batch/event-batch.js'
import type { EventInput } from '../../src/store/contract.js'
import { SseDecoder } from '../../src/sse/decoder.js'
import { isResumableUpstreamId, MAX_UPSTREAM_ID_LENGTH, TOO_LONG_UPSTREAM_ID } from '../../src/protocol/upstream-event-id.js'

// V8 gives a context made after the flag is set its gc (the file runs without --expose-gc).
setFlagsFromString('--expose-gc')
const collect = runInNewContext('gc') as () => void

const frame = (text: string, upstreamId?: string): EventInput =>
  upstreamId === undefined ? { frame: Buffer.from(text) } : { frame: Buffer.from(text), upstreamId }

t.test('every form of event comes back as it went in, numbered from the first seq', async t => {
  const events: EventInput[] = [
    frame('data: {"a":1}\n'),
    frame('event: note\ndata: é\n', 'up-1'),
    { data: 'gap ✓', event: 'gateway-gap' },
    { data: 'plain' },
    { data: 'with id', upstreamId: 'ü-2' },
    frame('data: last\n', '')
  ]
  const batch = EventBatch.from(events)
  t.equal(batch.length, 6)
  const stored = batch.stored(41)
  t.same(stored.map(e => e.seq), [41, 42, 43, 44, 45, 46])
  t.same(stored.map(e => e.frame?.toString()), ['data: {"a":1}\n', 'event: note\ndata: é\n', undefined, undefined, undefined, 'data: last\n'])
  t.same(stored.map(e => e.data), [undefined, undefined, 'gap ✓', 'plain', 'with id', undefined])
  t.same(stored.map(e => e.event), [undefined, undefined, 'gateway-gap', undefined, undefined, undefined])
  t.same(stored.map(e => e.upstreamId), [undefined, 'up-1', undefined, undefined, 'ü-2', ''])
  t.same(batch.toArray(), stored.map(({ seq: _seq, ...e }) => e), 'toArray is the same events without numbers')
  t.equal(batch.lastUpstreamId, 'ü-2', 'the last upstream id that is not empty')
  t.equal(batch.dataBytes, Buffer.byteLength('data: {"a":1}\nevent: note\ndata: é\ngap ✓plainwith iddata: last\n'), 'data bytes leave types and ids out')
  t.notOk(batch.plainFrames)
  t.ok(EventBatch.from([frame('data: 1\n'), frame('data: 2\n')]).plainFrames, 'frames without ids are plain')
})

t.test('an upstream id too long to keep: the event keeps it, the batch\'s last id to resume from does not', async t => {
  const long = 'x'.repeat(MAX_UPSTREAM_ID_LENGTH + 1)
  const batch = EventBatch.from([frame('data: 1\n', 'up-1'), frame('data: 2\n', long)])
  t.equal(batch.stored(1)[1]?.upstreamId, long, 'the event as it came')
  t.equal(batch.lastUpstreamId, TOO_LONG_UPSTREAM_ID, 'the batch keeps a marker in its place, not the earlier id')
  t.notOk(isResumableUpstreamId(batch.lastUpstreamId), 'which reads as not resumable')
  t.notOk(isResumableUpstreamId(long), 'as does the long id itself')
  t.equal(EventBatch.from([frame('data: 1\n', 'x'.repeat(MAX_UPSTREAM_ID_LENGTH))]).lastUpstreamId.length, MAX_UPSTREAM_ID_LENGTH, 'one of the longest kept is kept')
})

t.test('the layout text is four decimal numbers per event, each followed by a space', async t => {
  const batch = EventBatch.from([frame('data: x\n'), { data: 'héllo', event: 'gap', upstreamId: '7' }, frame('data: 1234567890\n', '')])
  t.equal(batch.layoutText().toString(), '4 8 0 0 3 6 3 1 6 17 0 0 ')
  t.equal(new EventBatch(Buffer.alloc(0), new Uint32Array([0, 4294967295, 10, 100]), '').layoutText().toString(), '0 4294967295 10 100 ', 'every digit of the largest length')
  t.equal(EventBatch.EMPTY.layoutText().length, 0, 'an empty batch has an empty layout')
})

t.test('a builder grows past its first buffer and layout, and a batch taken is never touched again', async t => {
  const builder = new EventBatchBuilder()
  const read = Buffer.from('xx' + 'data: '.padEnd(3000, 'y') + '\nzz')
  const expected: string[] = []
  for (let i = 0; i < 100; i++) {
    const text = `data: ${i}\n`
    builder.add(frame(text))
    expected.push(text)
  }
  builder.addFrame(read, 2, read.length - 2, 'big')
  expected.push(read.toString('utf8', 2, read.length - 2))
  t.equal(builder.length, 101)
  const first = builder.take()
  t.equal(builder.length, 0, 'the builder starts over')
  t.equal(builder.byteLength, 0)
  t.same(first.stored(1).map(e => e.frame?.toString()), expected, 'a hundred small frames and a large one, in order')
  t.equal(first.stored(1)[100]?.upstreamId, 'big')
  const snapshot = Buffer.from(first.bytes)
  builder.add(frame('data: next\n'))
  builder.add({ data: 'more' })
  const second = builder.take()
  t.same(first.bytes, snapshot, 'packing the next batch leaves the first as it was')
  t.same(second.toArray(), [frame('data: next\n'), { data: 'more', event: undefined, upstreamId: undefined }])
  t.equal(builder.take(), EventBatch.EMPTY, 'nothing added: the empty batch')
})

t.test('frames of one read are copied together: lines between them left out, upstream ids and other reads in order, the read free after flush', async t => {
  const builder = new EventBatchBuilder()
  // Frames as the decoder hands them: spans of the read, with blank lines and comments between.
  const read = Buffer.from('data: a\n\n: note\n\ndata: b\r\n\r\nid: 7\ndata: c\n\ndata: d\n\n')
  const span = (text: string): [number, number] => {
    const start = read.indexOf(text)
    return [start, start + text.length]
  }
  builder.addFrame(read, ...span('data: a\n'))
  builder.addFrame(read, ...span('data: b\r\n'))
  builder.addFrame(read, ...span('id: 7\ndata: c\n'), '7')
  builder.addFrame(read, ...span('data: d\n'))
  const other = Buffer.from('data: e\n')
  builder.addFrame(other, 0, other.length)
  // Back to the first read, before its pending frames: copied apart, not as one piece.
  builder.addFrame(read, ...span('data: a\n'))
  builder.flush()
  read.fill(0x21)
  other.fill(0x21)
  const batch = builder.take()
  t.same(batch.stored(1).map(e => [e.frame?.toString(), e.upstreamId]), [
    ['data: a\n', undefined], ['data: b\r\n', undefined], ['id: 7\ndata: c\n', '7'], ['data: d\n', undefined], ['data: e\n', undefined], ['data: a\n', undefined]
  ], 'every frame whole and in order, though the reads changed after flush()')
  t.equal(batch.bytes.length, batch.stored(1).reduce((n, e) => n + (e.frame?.length ?? 0), 0) + 1, 'only the frames and the upstream id are kept')
  // A frame added and the builder grown before it is flushed (the first buffer is 4 KiB).
  const big = Buffer.from('data: x\n\n' + 'data: '.padEnd(9000, 'y') + '\n\n')
  builder.addFrame(big, 0, 8)
  builder.addFrame(big, 9, big.length - 1)
  t.same(builder.take().stored(1).map(e => e.frame?.length), [8, big.length - 10], 'pending frames survive the buffer growing')
  // Two small frames far apart in one read: the piece copied at once is larger than the first buffer.
  const apart = Buffer.from('data: a\n\n: ' + 'z'.repeat(5000) + '\n\ndata: b\n\n')
  const fresh = new EventBatchBuilder()
  fresh.addFrame(apart, 0, 8)
  fresh.addFrame(apart, apart.length - 9, apart.length - 1)
  // The same read again, from an earlier place: a new piece.
  fresh.addFrame(apart, 0, 8)
  t.same(fresh.take().stored(1).map(e => e.frame?.toString()), ['data: a\n', 'data: b\n', 'data: a\n'], 'frames far apart, then an earlier one again')
  // The decoder copies a read's frames out before handing the read back.
  const decoder = new SseDecoder(1 << 20)
  const chunk = Buffer.from('data: 1\n\ndata: 2\n\ndata: 3')
  decoder.pushInto(chunk, builder)
  chunk.fill(0x21)
  t.same(builder.take().stored(1).map(e => e.frame?.toString()), ['data: 1\n', 'data: 2\n'], 'the decoder flushes at the end of each read')
})

t.test('a quick look for a needle in the bytes', async t => {
  const batch = EventBatch.from([frame('data: {"id":1,"result":{}}\n'), { data: 'x' }])
  t.ok(batch.includes('"result"'))
  t.notOk(batch.includes('"error"'))
})

t.test('runs: whole events, at most maxBytes each (a larger event alone), together the whole batch', async t => {
  const sizes = [40, 30, 30, 100, 10, 10, 150, 5]
  const batch = EventBatch.from(sizes.map((n, i) => i === 2 ? { data: 'x'.repeat(n - 4), event: 'type' } : { frame: Buffer.alloc(n, 97 + i) }))
  const runs = batch.runs(100)
  t.same(runs.map(r => r.count), [3, 1, 2, 1, 1], '40+30+30 | 100 | 10+10 | 150 alone | 5')
  t.same(runs.map(r => r.bytes.length), [100, 100, 20, 150, 5])
  t.equal(Buffer.concat(runs.map(r => r.bytes)).toString(), batch.bytes.toString(), 'the bytes, in order')
  t.equal(runs.map(r => r.layout.toString()).join(''), batch.layoutText().toString(), 'the layouts, in order')
  t.same(batch.runs(1000).map(r => r.count), [8], 'a batch within the bound is one run')
  t.same(EventBatch.EMPTY.runs(100), [], 'an empty batch has none')
})

t.test('a batch the store is done with takes the next batch, whether its events waited during the append or came after it', async t => {
  const builder = new EventBatchBuilder()
  const f = (i: number): EventInput => frame(`data: ${i}\n`)
  builder.add(f(1))
  const a = builder.take()
  const aBytes = a.bytes.buffer
  const aLayout = a.layout.buffer
  // a is at the store while the next events arrive: they need a buffer of their own.
  builder.add(f(2))
  builder.recycle(a)
  const b = builder.take()
  t.not(b.bytes.buffer, aBytes, 'events that waited during the append are in their own buffer')
  builder.add(f(3))
  builder.add(f(4))
  const c = builder.take()
  t.equal(c.bytes.buffer, aBytes, 'the batch after them is packed into the returned buffer')
  t.equal(c.layout.buffer, aLayout, 'and into its layout')
  t.same(c.toArray(), [f(3), f(4)], 'holding exactly its own events')
  t.equal(a.release(), undefined, 'a batch is released once')
  // b comes back while nothing waits: held weakly, it takes the next batch.
  const bBytes = b.bytes.buffer
  builder.recycle(b)
  builder.add(f(5))
  const d = builder.take()
  t.equal(d.bytes.buffer, bBytes, 'a buffer returned while nothing waited takes the next batch')
  t.same(d.toArray(), [f(5)])
})

t.test('a buffer returned while nothing waits is held weakly: a stream that went quiet keeps nothing from the collector', async t => {
  const builder = new EventBatchBuilder()
  let probe: WeakRef<ArrayBufferLike> | undefined
  // In a function of its own, so that nothing here holds the batch afterwards.
  const packAndReturn = (): void => {
    builder.add(frame('data: '.padEnd(100_000, 'q') + '\n'))
    const batch = builder.take()
    probe = new WeakRef(batch.bytes.buffer)
    builder.recycle(batch)
  }
  packAndReturn()
  // A WeakRef keeps its target until the end of the job that made it.
  await new Promise(resolve => setImmediate(resolve))
  collect()
  t.equal(probe?.deref(), undefined, 'a full collection freed the returned buffer')
  builder.add(frame('data: after\n'))
  const next = builder.take()
  t.same(next.toArray(), [frame('data: after\n')], 'the next batch packs into a new buffer')
})

t.test('a batch that was retained, or whose events were made, is never packed into again', async t => {
  const builder = new EventBatchBuilder()
  const f = (i: number): EventInput => frame(`data: ${i}\n`)
  builder.add(f(1))
  const kept = builder.take()
  kept.retain()
  builder.add(f(2))
  builder.recycle(kept)
  builder.take()
  builder.add(f(3))
  t.not(builder.take().bytes.buffer, kept.bytes.buffer, 'a retained batch (a store keeps its bytes)')
  builder.add(f(4))
  const viewed = builder.take()
  const events = viewed.stored(1)
  builder.add(f(5))
  builder.recycle(viewed)
  builder.take()
  builder.add(f(6))
  t.not(builder.take().bytes.buffer, viewed.bytes.buffer, 'a batch whose events were made (their frames are views of it)')
  t.same(events.map(e => e.frame?.toString()), ['data: 4\n'], 'those events are as they were')
})

t.test('a returned buffer too small for the next event gives way to a new one; its layout is still used', async t => {
  const builder = new EventBatchBuilder()
  builder.add(frame('data: small\n'))
  const small = builder.take()
  const big = 'data: '.padEnd(10_000, 'y') + '\n'
  builder.add(frame(big))
  builder.recycle(small)
  builder.take()
  builder.add(frame(big))
  const next = builder.take()
  t.not(next.bytes.buffer, small.bytes.buffer, 'a new buffer for a frame larger than the returned one')
  t.equal(next.layout.buffer, small.layout.buffer, 'the returned layout')
  t.same(next.toArray(), [frame(big)])
})

t.test('a batch is packed into a buffer sized for the largest of the last few, grown by half, back to small once a stream went quiet', async t => {
  const builder = new EventBatchBuilder()
  const event = 'data: '.padEnd(299, 'e') + '\n'
  const batchOf = (events: number): EventBatch => {
    for (let i = 0; i < events; i++) builder.add(frame(event))
    return builder.take()
  }
  const capacity = (batch: EventBatch): number => batch.bytes.buffer.byteLength

  const first = batchOf(1000)
  t.equal(first.bytes.length, 300_000)
  t.ok(capacity(first) < 300_000 * 1.5 + 4096, `grown by half, not doubled: ${capacity(first)} bytes for 300,000`)
  const same = batchOf(1000)
  t.ok(capacity(same) >= 300_000 && capacity(same) <= 300_000 * 17 / 16 + 4096,
    `the next batch the same size fits the buffer it starts with, a sixteenth larger: ${capacity(same)}`)
  const small = batchOf(10)
  t.equal(capacity(small), capacity(same), 'a small batch right after a large one gets a buffer for a large one')
  const largeAgain = batchOf(1000)
  t.equal(capacity(largeAgain), capacity(same), 'so the large batch after it needs no regrowth')
  const sizes = [1, 2, 3, 4, 5].map(() => capacity(batchOf(10)))
  t.same(sizes.slice(0, 4), [1, 2, 3, 4].map(() => capacity(same)), 'large buffers for four small batches after a large one')
  t.equal(sizes[4], 4096, 'small again after four small batches in a row')
  t.same(batchOf(3).toArray(), [frame(event), frame(event), frame(event)], 'the events as they were added')
})
