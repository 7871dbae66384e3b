// SSE field lines (src/sse/lines.ts) and what a client makes of a frame
// (parseFrame): lines kept in runs whatever their line breaks, and an event's
// data and type read without the lines that change neither.
import t from 'tap'
import { isField, keptLines } from '../../src/sse/lines.js'
import { parseFrame } from '../../src/sse/frame.js'

const notId = (buf: Buffer, start: number, end: number): boolean => !isField(buf, start, end, 'id')

t.test('isField: the name alone or followed by a colon', async t => {
  const line = (text: string): [Buffer, number, number] => [Buffer.from(text), 0, Buffer.byteLength(text)]
  t.ok(isField(...line('data'), 'data'))
  t.ok(isField(...line('data:'), 'data'))
  t.ok(isField(...line('data: x'), 'data'))
  t.notOk(isField(...line('datax: y'), 'data'), 'a longer name')
  t.notOk(isField(...line('dat'), 'data'), 'a shorter one')
  t.notOk(isField(...line(' data: x'), 'data'), 'a leading space is part of the name')
})

t.test('keptLines: every line break spelling; a dropped line takes its break along', async t => {
  for (const br of ['\n', '\r', '\r\n']) {
    const text = ['id: 1', 'data: a', 'data: b', 'id: 2', 'event: e', 'id: 3'].join(br) + br
    const kept = keptLines(Buffer.from(text), 0, Buffer.byteLength(text), notId)
    t.equal(kept.toString(), ['data: a', 'data: b', 'event: e'].join(br) + br, `breaks ${JSON.stringify(br)}`)
  }
  const last = Buffer.from('data: a\nid: 9')
  t.equal(keptLines(last, 0, last.length, notId).toString(), 'data: a\n', 'a last line without a break')
  const within = Buffer.from('xxdata: a\nid: 1\ndata: b\nyy')
  t.equal(keptLines(within, 2, within.length - 2, notId).toString(), 'data: a\ndata: b\n', 'within a range of a larger buffer')
})

t.test('keptLines: a view when every line is kept, runs of kept lines copied whole', async t => {
  const all = Buffer.from('data: a\r\ndata: b\n')
  const view = keptLines(all, 0, all.length, notId)
  t.equal(view.buffer, all.buffer, 'nothing dropped: a view, no copy')
  t.equal(view.toString(), all.toString())
  const concat = Buffer.concat
  let pieces = 0
  Buffer.concat = function (list: readonly Uint8Array[], totalLength?: number) {
    pieces += list.length
    return concat.call(Buffer, list, totalLength)
  } as typeof Buffer.concat
  t.teardown(() => { Buffer.concat = concat })
  const many = Buffer.from(`id: 1\n${'data: x\n'.repeat(10_000)}id: 2\n${'data: y\n'.repeat(10_000)}`)
  t.equal(keptLines(many, 0, many.length, notId).length, many.length - 12, 'both id lines dropped')
  t.equal(pieces, 2, 'two runs of 10,000 lines: two pieces, not 20,000')
})

t.test('parseFrame: data and type as a client reads them, other lines ignored', async t => {
  t.same(parseFrame(Buffer.from('event: e\r\nid: 4\nretry: x\nfoo: bar\n: comment\ndata: {"a":1}\rdata: 2')), { data: '{"a":1}\n2', event: 'e' })
  t.same(parseFrame(Buffer.from('data\n')), { data: '', event: undefined }, 'a data field without a colon is empty data')
  t.equal(parseFrame(Buffer.from('foo: bar\nid: 1\n')), undefined, 'no data: no event')
  t.equal(parseFrame(Buffer.from('\ufeffdata: x\n')), undefined, 'a byte order mark within a stream names another field')
  const padded = Buffer.concat([Buffer.from('data: {"id":1,"result":{}}\n'), Buffer.alloc(400_000, 'x\n')])
  t.same(parseFrame(padded), { data: '{"id":1,"result":{}}', event: undefined }, '200,000 unknown lines after the data')
})
