// A large event arriving in small reads: the decoder's work must grow with the
// event's size, not with its square. Counted, not timed: every byte the
// decoder copies goes through Buffer.concat or Buffer.from, which are wrapped
// here to add up what they copy. (bench/decoder-reads.mjs measures the time.)
import t from 'tap'
import type { Test } from 'tap'
import { SseDecoder } from '../../src/sse/decoder.js'

function countCopies (t: Test): { readonly bytes: number } {
  const counter = { bytes: 0 }
  const concat = Buffer.concat
  const from = Buffer.from
  Buffer.concat = function (list: readonly Uint8Array[], totalLength?: number) {
    const out = concat.call(Buffer, list, totalLength)
    counter.bytes += out.length
    return out
  } as typeof Buffer.concat
  Buffer.from = function (this: typeof Buffer, ...args: Parameters<typeof Buffer.from>) {
    const out = (from as (...a: unknown[]) => Buffer).apply(Buffer, args)
    // A view of an ArrayBuffer copies nothing.
    if (!(args[0] instanceof ArrayBuffer)) counter.bytes += out.length
    return out
  } as typeof Buffer.from
  t.teardown(() => {
    Buffer.concat = concat
    Buffer.from = from
  })
  return counter
}

function decodeInReads (event: Buffer, readSize: number): { frames: string[], ids: Array<string | undefined> } {
  const decoder = new SseDecoder(event.length + 1024)
  const frames: string[] = []
  const ids: Array<string | undefined> = []
  for (let at = 0; at < event.length; at += readSize) {
    for (const e of decoder.push(event.subarray(at, at + readSize))) {
      frames.push(e.frame?.toString() ?? '')
      ids.push(e.upstreamId)
    }
  }
  return { frames, ids }
}

const SIZE = 400_000

const shapes: Array<[string, string]> = [
  ['one data line', `data: ${'x'.repeat(SIZE)}\n`],
  ['400 data lines', Array.from({ length: 400 }, (_, i) => `data: ${String(i % 10).repeat(SIZE / 400)}\n`).join('')],
  ['a long id line and a long event line', `id: ${'i'.repeat(SIZE / 2)}\nevent: ${'e'.repeat(SIZE / 4)}\ndata: {}\n`],
  ['CRLF line ends', `retry: 10\r\n${Array.from({ length: 100 }, () => `data: ${'c'.repeat(SIZE / 100)}\r\n`).join('')}`]
]

for (const [name, body] of shapes) {
  t.test(`${name}, in 1,000-byte reads: bytes copied grow linearly`, async t => {
    const event = Buffer.from(`${body}\n`)
    const expected = decodeInReads(event, event.length)
    const copies = countCopies(t)
    const { frames, ids } = decodeInReads(event, 1000)
    t.same(frames, expected.frames, 'the same event as from one read')
    t.same(ids, expected.ids, 'the same upstream id')
    t.equal(frames.length, 1)
    // Linear: each read kept once, each block joined once, a few lines joined once.
    // Re-joining what is held on every read copies ~reads/2 times the event (here ~200 times).
    t.ok(copies.bytes <= 4 * event.length, `copied ${copies.bytes} bytes for a ${event.length}-byte event (at most 4 times its size)`)
  })
}

/** Adds up the bytes Buffer's indexOf scans (from where it starts to what it finds, or to the end) while the test runs. */
function countSearches (t: Test): { readonly bytes: number } {
  const counter = { bytes: 0 }
  const indexOf = Buffer.prototype.indexOf
  Buffer.prototype.indexOf = function (this: Buffer, value: Parameters<Buffer['indexOf']>[0], byteOffset?: number | BufferEncoding, encoding?: BufferEncoding) {
    const found = indexOf.call(this, value, byteOffset as number, encoding)
    counter.bytes += (found === -1 ? this.length : found + 1) - (typeof byteOffset === 'number' ? byteOffset : 0)
    return found
  }
  t.teardown(() => { Buffer.prototype.indexOf = indexOf })
  return counter
}

t.test('a read of many LF lines and one CR at its end: searched once, not once a line', async t => {
  const read = Buffer.from(`${'data: x\n'.repeat(8000)}\r\n`)
  const decoder = new SseDecoder(4 * 1024 * 1024)
  const searches = countSearches(t)
  const frames = decoder.push(read)
  t.equal(frames.length, 1, 'one event')
  t.equal(frames[0]?.frame?.toString(), 'data: x\n'.repeat(8000).slice(0, -1) + '\n', 'its lines as sent, without the blank line')
  // Searching for the next CR from every line again would scan about 8,000 / 2 times the read.
  t.ok(searches.bytes <= 4 * read.length, `scanned ${searches.bytes} bytes for a ${read.length}-byte read (at most 4 times its size)`)
})
