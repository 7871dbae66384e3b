// SSE framing (src/sse/frame.ts) checked against an independent parser
// (eventsource-parser), and the upstream decoder (src/sse/decoder.ts) checked
// on line endings, chunk boundaries and its size bound.
import t from 'tap'
import fc from 'fast-check'
import { createParser, type EventSourceMessage } from 'eventsource-parser'
import {
  GAP_EVENT, formatComment, formatEvent, formatGap, formatPriming, formatRetry, frameWithoutId
} from '../../src/sse/frame.js'
import { SseDecoder, type UpstreamEvent } from '../../src/sse/decoder.js'
import { EventTooLargeError } from '../../src/sse/event-too-large.js'
import { encodeEventId } from '../../src/protocol/event-id.js'
import { dataOf, eventOf } from '../fixtures/events.js'

interface Parsed {
  events: EventSourceMessage[]
  retries: number[]
  comments: string[]
  errors: Error[]
}

/** Parse a complete SSE text with eventsource-parser, as a client would. */
function parse (text: string, chunkSize = Infinity): Parsed {
  const out: Parsed = { events: [], retries: [], comments: [], errors: [] }
  const parser = createParser({
    onEvent: (e) => { out.events.push(e) },
    onRetry: (ms) => { out.retries.push(ms) },
    onComment: (c) => { out.comments.push(c) },
    onError: (err) => { out.errors.push(err) }
  })
  if (chunkSize === Infinity) {
    parser.feed(text)
  } else {
    for (let i = 0; i < text.length; i += chunkSize) parser.feed(text.slice(i, i + chunkSize))
  }
  return out
}

const utf8 = (text: string): Uint8Array => new TextEncoder().encode(text)

/** Feed chunks to a decoder, collecting every batch; end() included. */
function decodeChunks (chunks: Uint8Array[], maxEventBytes = 1024 * 1024): { batches: UpstreamEvent[][], events: UpstreamEvent[], decoder: SseDecoder } {
  const decoder = new SseDecoder(maxEventBytes)
  const batches: UpstreamEvent[][] = []
  for (const chunk of chunks) batches.push(decoder.push(chunk))
  batches.push(decoder.end())
  return { batches, events: batches.flat(), decoder }
}

function byteByByte (bytes: Uint8Array): Uint8Array[] {
  return Array.from(bytes, (b) => Uint8Array.of(b))
}

/** Events as plain objects, for t.same (undefined fields removed). */
function plain (events: readonly UpstreamEvent[]): Array<Record<string, string>> {
  return events.map((e) => {
    const o: Record<string, string> = { data: dataOf(e) }
    const event = eventOf(e)
    if (event !== undefined) o.event = event
    if (e.upstreamId !== undefined) o.id = e.upstreamId
    return o
  })
}

const ID = encodeEventId({ epoch: 'ep0ch', streamId: 's', seq: 7 })

t.test('formatEvent: exact wire text', async (t) => {
  t.equal(formatEvent('a.s.1', '{"x":1}'), 'id: a.s.1\ndata: {"x":1}\n\n')
  t.equal(formatEvent('a.s.1', '{"x":1}', 'message'), 'id: a.s.1\ndata: {"x":1}\n\n', 'event: message is omitted')
  t.equal(formatEvent('a.s.1', '{"x":1}', ''), 'id: a.s.1\ndata: {"x":1}\n\n', 'an empty type is omitted')
  t.equal(formatEvent('a.s.1', 'x', 'custom'), 'id: a.s.1\nevent: custom\ndata: x\n\n')
  t.equal(formatEvent('a.s.1', 'l1\nl2'), 'id: a.s.1\ndata: l1\ndata: l2\n\n')
  t.equal(formatEvent('a.s.1', ''), 'id: a.s.1\ndata: \n\n')
})

t.test('formatEvent round-trips through eventsource-parser', async (t) => {
  const cases: Array<[string, string, string | undefined]> = [
    ['json', '{"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}', undefined],
    ['multi-line data', 'line one\nline two\nline three', undefined],
    ['empty lines inside data', 'a\n\nb\n\n\nc', undefined],
    ['data ending with a line break', 'a\n', undefined],
    ['data of line breaks only', '\n\n', undefined],
    ['empty data', '', undefined],
    ['unicode', 'héllo wörld \u4e16\u754c \u{1f600} \u0000 \u2028\u2029', undefined],
    ['leading spaces', '   three spaces', undefined],
    ['one leading space', ' x', undefined],
    ['leading spaces on every line', ' a\n  b\n   c', undefined],
    ['looks like a field', 'id: forged\nevent: forged\nretry: 1', undefined],
    ['looks like a comment', ': not a comment', undefined],
    ['colon first', ':x', undefined],
    ['custom event type', '{"a":1}', 'custom'],
    ['event type with spaces', 'x', 'my event']
  ]
  for (const [name, data, event] of cases) {
    const parsed = parse(formatEvent(ID, data, event))
    t.equal(parsed.events.length, 1, `${name}: one event`)
    const [e] = parsed.events
    t.equal(e?.id, ID, `${name}: id`)
    t.equal(e?.data, data, `${name}: data`)
    t.equal(e?.event, event, `${name}: event`)
    t.same(parsed.errors, [], `${name}: no parse errors`)
  }
})

t.test('event: message is omitted, and the parser reports the default type', async (t) => {
  const text = formatEvent(ID, 'x', 'message')
  t.notMatch(text, /event:/)
  const [e] = parse(text).events
  t.equal(e?.event, undefined, 'no type: a client treats it as "message"')
  t.equal(e?.data, 'x')
})

t.test('many events in one stream, parsed in small chunks', async (t) => {
  const events = Array.from({ length: 50 }, (_, i) => ({
    id: encodeEventId({ epoch: 'e', streamId: 's', seq: i + 1 }),
    data: i % 3 === 0 ? `multi\nline ${i}` : JSON.stringify({ i }),
    event: i % 7 === 0 ? 'custom' : undefined
  }))
  const text = events.map(e => formatEvent(e.id, e.data, e.event)).join('')
  for (const size of [1, 3, 17, Infinity]) {
    const parsed = parse(text, size)
    t.same(parsed.events.map(e => ({ id: e.id, data: e.data, event: e.event })), events, `chunk size ${size}`)
  }
})

t.test('priming event: an id, empty data and the retry hint', async (t) => {
  const text = formatPriming(ID, 2500)
  t.equal(text, `id: ${ID}\nretry: 2500\ndata: \n\n`)
  const parsed = parse(text)
  t.same(parsed.retries, [2500])
  t.equal(parsed.events.length, 1, 'dispatched: it has a data line')
  t.equal(parsed.events[0]?.id, ID)
  t.equal(parsed.events[0]?.data, '')
  t.equal(parsed.events[0]?.event, undefined)
  t.same(parse(formatPriming(ID, 0)).retries, [0], 'retry 0')
})

t.test('retry frame', async (t) => {
  t.equal(formatRetry(1000), 'retry: 1000\n\n')
  const parsed = parse(formatRetry(1000))
  t.same(parsed.retries, [1000])
  t.same(parsed.events, [], 'no event is dispatched')
})

t.test('gap event: type gateway-gap, JSON data, no id', async (t) => {
  t.equal(GAP_EVENT, 'gateway-gap')
  const notice = { reason: 'trimmed' as const, streamId: 'multi\nline\r\n"quoted"', missingFrom: 1, missingTo: 40 }
  const text = formatGap(notice)
  t.notMatch(text, /^id:/m, 'no id line: the client\'s resume position does not move')
  const parsed = parse(text)
  t.equal(parsed.events.length, 1)
  const [e] = parsed.events
  t.equal(e?.event, GAP_EVENT)
  t.equal(e?.id, undefined)
  t.not(e?.data, '', 'non-empty data: never mistaken for priming')
  t.same(JSON.parse(e?.data ?? ''), notice, 'JSON data survives, line breaks escaped')
  t.same(parse(formatGap({ reason: 'epoch', streamId: 's' })).events[0]?.data, '{"reason":"epoch","streamId":"s"}')
})

t.test('comments are ignored by parsers and never carry CR or LF', async (t) => {
  t.equal(formatComment('keep-alive'), ': keep-alive\n\n')
  const hostile = ['keep-alive', '', 'a\nb', 'a\rb', 'a\r\nb', '\n\n\n', 'x\ndata: forged\n\nid: 1', 'a\r\rdata: y']
  for (const text of hostile) {
    const frame = formatComment(text)
    t.ok(frame.startsWith(':'), `${JSON.stringify(text)}: starts with a colon`)
    t.ok(frame.endsWith('\n\n'), `${JSON.stringify(text)}: ends the block`)
    const body = frame.slice(0, -2)
    t.notOk(/[\r\n]/.test(body), `${JSON.stringify(text)}: no CR/LF inside`)
    const parsed = parse(frame)
    t.same(parsed.events, [], `${JSON.stringify(text)}: no event`)
    t.same(parsed.retries, [], `${JSON.stringify(text)}: no retry`)
    t.equal(parsed.comments.length, 1, `${JSON.stringify(text)}: one comment`)
  }
  fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 60 }), (text) => {
    const frame = formatComment(text)
    const parsed = parse(frame + formatEvent(ID, 'after'))
    return !/[\r\n]/.test(frame.slice(0, -2)) && parsed.events.length === 1 && parsed.events[0]?.data === 'after'
  }), { numRuns: 1000 })
})

t.test('a comment between events does not disturb them', async (t) => {
  const text = formatEvent('a.s.1', 'one') + formatComment('ping') + formatEvent('a.s.2', 'two')
  const parsed = parse(text)
  t.same(parsed.events.map(e => [e.id, e.data]), [['a.s.1', 'one'], ['a.s.2', 'two']])
})

t.test('property: formatEvent then parse is the identity', async (t) => {
  const data = fc.string({ unit: 'binary', maxLength: 200 }).map(s => s.replace(/\r/g, ''))
  const eventType = fc.option(fc.string({ unit: 'grapheme-ascii', maxLength: 12 }).map(s => s.replace(/[\r\n]/g, '')), { nil: undefined })
  fc.assert(fc.property(data, eventType, (d, ev) => {
    const [e, ...rest] = parse(formatEvent(ID, d, ev)).events
    const expectedType = ev === '' || ev === 'message' ? undefined : ev
    return rest.length === 0 && e !== undefined && e.id === ID && e.data === d && e.event === expectedType
  }), { numRuns: 3000 })
  t.pass('3000 random events round-tripped')
})

t.test('SseDecoder', async (t) => {
  t.test('LF, CRLF and CR line endings', async (t) => {
    const expected = [{ data: 'a', id: '1' }, { data: 'b\nc', event: 'x' }]
    for (const [name, eol] of [['LF', '\n'], ['CRLF', '\r\n'], ['CR', '\r']] as const) {
      const text = `id: 1${eol}data: a${eol}${eol}event: x${eol}data: b${eol}data: c${eol}${eol}data: trailing${eol}${eol}`
      const { events } = decodeChunks([utf8(text)])
      t.same(plain(events).slice(0, 2), expected, `${name}`)
      const split = decodeChunks(byteByByte(utf8(text)))
      t.same(plain(split.events).slice(0, 2), expected, `${name}, byte by byte`)
    }
  })

  t.test('mixed line endings in one stream', async (t) => {
    const text = 'data: a\r\n\ndata: b\n\r\ndata: c\r\n\r\n'
    t.same(plain(decodeChunks([utf8(text)]).events), [{ data: 'a' }, { data: 'b' }, { data: 'c' }])
  })

  t.test('a CRLF split between two chunks is one line ending', async (t) => {
    const { events } = decodeChunks([utf8('data: a\r'), utf8('\n\r'), utf8('\ndata: b\r\n\r\n')])
    t.same(plain(events), [{ data: 'a' }, { data: 'b' }])
  })

  t.test('an event ended by CR CR at the end of a read is delivered with that read', async (t) => {
    const decoder = new SseDecoder(1024)
    t.same(plain(decoder.push(utf8('data: a\r\r'))), [{ data: 'a' }], 'not held back for the next read')
    // The LF that may follow belongs to the blank line (CRLF): it starts nothing new.
    t.same(plain(decoder.push(utf8('\ndata: b\r\r'))), [{ data: 'b' }])
    t.same(plain(decoder.push(utf8('\n\ndata: c\n\n'))), [{ data: 'c' }], 'an LF after that is a blank line of its own (nothing to dispatch)')
    t.same(decoder.end(), [])
  })

  t.test('comments are ignored', async (t) => {
    const text = ': hello\n\n:\n\ndata: a\n: inside an event\ndata: b\n\n: bye\n\n'
    const { events } = decodeChunks([utf8(text)])
    t.same(plain(events), [{ data: 'a\nb' }])
  })

  t.test('retry lines set decoder.retry', async (t) => {
    const decoder = new SseDecoder(1024)
    t.equal(decoder.retry, undefined, 'none before the upstream sends one')
    t.same(decoder.push(utf8('retry: 3000\n\n')), [], 'a retry block is not an event')
    t.equal(decoder.retry, 3000)
    decoder.push(utf8('retry: 500\ndata: x\n\n'))
    t.equal(decoder.retry, 500, 'the latest wins')
    decoder.push(utf8('retry: soon\n\nretry: -1\n\nretry: 1.5\n\n'))
    t.equal(decoder.retry, 500, 'invalid values are ignored')
    decoder.push(utf8('retry: 0\n\n'))
    t.equal(decoder.retry, 0)
  })

  t.test('ids belong to their own event only', async (t) => {
    const text = 'id: up-1\ndata: a\n\ndata: b\n\nid: up-2\nevent: message\ndata: c\n\nid\ndata: d\n\n'
    const { events } = decodeChunks([utf8(text)])
    t.same(events.map(e => e.upstreamId), ['up-1', undefined, 'up-2', ''])
    t.same(events.map(eventOf), [undefined, undefined, 'message', undefined], 'the upstream\'s type is kept as sent')
    t.same(events.map(dataOf), ['a', 'b', 'c', 'd'])
  })

  t.test('frames keep the event\'s lines as sent, less id and retry fields', async (t) => {
    const { events, decoder } = decodeChunks([utf8('id: u1\r\n: note\nretry: 30000\nevent: message\rdata: {"a":1}\nretry\r\ndata: x\n\n')])
    t.same(events.map(e => e.frame.toString()), [': note\nevent: message\rdata: {"a":1}\ndata: x\n'], 'comments and types stay; id and retry lines go (the gateway\'s ids and hint are the ones clients follow)')
    t.same(plain(events), [{ data: '{"a":1}\nx', event: 'message', id: 'u1' }])
    t.equal(decoder.retry, 30000, 'the upstream\'s hint is still read')
  })

  t.test('frameWithoutId ends each frame with exactly one blank line, whatever its line endings', async (t) => {
    for (const text of ['data: a\n', 'data: a\r\n', 'data: a\r', 'event: x\rdata: a\r']) {
      const parsed: Array<{ data: string, id: string | undefined }> = []
      const parser = createParser({ onEvent: e => { parsed.push({ data: e.data, id: e.id }) } })
      parser.feed(Buffer.concat([frameWithoutId(Buffer.from(text)), frameWithoutId(Buffer.from('data: b\n'))]).toString())
      t.same(parsed, [{ data: 'a', id: undefined }, { data: 'b', id: undefined }], JSON.stringify(text))
    }
  })

  t.test('an id containing NUL is ignored', async (t) => {
    const { events } = decodeChunks([utf8('id: a\0b\ndata: x\n\n')])
    t.same(plain(events), [{ data: 'x' }])
  })

  t.test('blocks without data are not events', async (t) => {
    const { events } = decodeChunks([utf8('id: 1\n\nevent: x\n\n\n\n\ndata: y\n\n')])
    t.same(plain(events), [{ data: 'y' }])
  })

  t.test('field parsing follows the SSE spec', async (t) => {
    const text = 'data:no-space\n\ndata:  two spaces\n\ndata\n\nunknown: x\ndata: z\n\n'
    const { events } = decodeChunks([utf8(text)])
    t.same(events.map(dataOf), ['no-space', ' two spaces', 'z'], 'an event with empty data is not dispatched (SSE spec)')
  })

  t.test('multi-line data', async (t) => {
    const text = 'data: {\ndata:   "a": 1\ndata: }\n\ndata:\ndata:\n\n'
    const { events } = decodeChunks([utf8(text)])
    t.same(events.map(dataOf), ['{\n  "a": 1\n}', '\n'])
  })

  t.test('a byte order mark at the start is skipped', async (t) => {
    const bytes = new Uint8Array([0xef, 0xbb, 0xbf, ...utf8('data: a\n\n')])
    t.same(plain(decodeChunks([bytes]).events), [{ data: 'a' }])
    t.same(plain(decodeChunks(byteByByte(bytes)).events), [{ data: 'a' }], 'byte by byte')
  })

  t.test('UTF-8 multibyte characters split across chunks, byte by byte', async (t) => {
    const data = 'é \u4e16\u754c \u{1f600}\u{1f4a9} \u2028 end'
    const text = `id: \u00e9\ndata: ${data}\n\n`
    const { events, batches } = decodeChunks(byteByByte(utf8(text)))
    t.same(plain(events), [{ data, id: '\u00e9' }])
    t.notOk(events.some(e => dataOf(e).includes('\ufffd')), 'no replacement characters')
    t.equal(batches.filter(b => b.length > 0).length, 1, 'delivered once, by the chunk that ended it')
  })

  t.test('every split point of a multibyte stream decodes the same', async (t) => {
    const bytes = utf8('data: \u{1f600}\u4e16\n\ndata: \u00e9\u00e9\n\n')
    for (let i = 0; i <= bytes.length; i++) {
      const { events } = decodeChunks([bytes.subarray(0, i), bytes.subarray(i)])
      t.same(events.map(dataOf), ['\u{1f600}\u4e16', '\u00e9\u00e9'], `split at ${i}`)
    }
  })

  t.test('many events in one chunk come back as one batch', async (t) => {
    const text = Array.from({ length: 100 }, (_, i) => `id: ${i}\ndata: ${i}\n\n`).join('')
    const decoder = new SseDecoder(1024)
    const batch = decoder.push(utf8(text))
    t.equal(batch.length, 100)
    t.same(batch.map(dataOf), Array.from({ length: 100 }, (_, i) => String(i)))
    t.same(decoder.push(utf8('')), [], 'an empty chunk completes nothing')
    t.same(decoder.end(), [])
  })

  t.test('an event split over chunks is returned by the chunk that completes it', async (t) => {
    const decoder = new SseDecoder(1024)
    t.same(decoder.push(utf8('id: 1\nda')), [])
    t.same(decoder.push(utf8('ta: hel')), [])
    t.same(decoder.push(utf8('lo\n')), [], 'a line is not an event')
    t.same(decoder.push(utf8('data: world\n')), [])
    t.same(plain(decoder.push(utf8('\ndata: next'))), [{ data: 'hello\nworld', id: '1' }])
    t.same(plain(decoder.push(utf8('\n\n'))), [{ data: 'next' }])
  })

  t.test('end(): an unterminated final event is discarded', async (t) => {
    for (const tail of ['data: partial', 'data: partial\n', 'id: 9\ndata: a\ndata: b\n', 'data: \u{1f600}'.slice(0, -1)]) {
      const decoder = new SseDecoder(1024)
      t.same(plain(decoder.push(utf8(`data: done\n\n${tail}`))), [{ data: 'done' }])
      t.same(decoder.end(), [], `discarded: ${JSON.stringify(tail)}`)
    }
    const empty = new SseDecoder(1024)
    t.same(empty.end(), [], 'end() on an empty body')
  })

  t.test('end(): a terminated last event split from its blank line is kept', async (t) => {
    const decoder = new SseDecoder(1024)
    t.same(decoder.push(utf8('data: last\n')), [])
    t.same(plain(decoder.push(utf8('\n'))), [{ data: 'last' }])
    t.same(decoder.end(), [])
  })

  t.test('EventTooLargeError', async (t) => {
    t.test('one event larger than the limit, in one chunk', async (t) => {
      const decoder = new SseDecoder(1024)
      t.throws(() => decoder.push(utf8(`data: ${'a'.repeat(1025)}\n\n`)), EventTooLargeError)
    })

    t.test('an event of exactly the limit, in bytes on the wire, is accepted; one byte more is not', async (t) => {
      // "data: " + 1017 bytes + "\n" is 1,024 bytes; the blank line after it does not count.
      const decoder = new SseDecoder(1024)
      const [e] = decoder.push(utf8(`data: ${'a'.repeat(1017)}\n\n`))
      t.equal((e === undefined ? undefined : dataOf(e).length), 1017)
      t.equal(e?.frame.length, 1024)
      t.throws(() => new SseDecoder(1024).push(utf8(`data: ${'a'.repeat(1018)}\n\n`)), EventTooLargeError)
    })

    t.test('one large event spread over many chunks', async (t) => {
      const decoder = new SseDecoder(1024)
      decoder.push(utf8('data: '))
      let thrown: unknown
      try {
        for (let i = 0; i < 100; i++) decoder.push(utf8('a'.repeat(100)))
      } catch (err) {
        thrown = err
      }
      t.type(thrown, EventTooLargeError)
      t.match((thrown as Error).message, /MAX_EVENT_BYTES \(1024\)/)
    })

    t.test('an unterminated line longer than the limit (plus the 4096-byte field slack)', async (t) => {
      const decoder = new SseDecoder(1024)
      t.throws(() => decoder.push(utf8('x'.repeat(6000))), EventTooLargeError, 'no line ending at all')
      const slow = new SseDecoder(1024)
      t.throws(() => { for (let i = 0; i < 6000; i++) slow.push(utf8('d')) }, EventTooLargeError, 'byte by byte')
    })

    t.test('a multi-line event whose lines sum past the limit', async (t) => {
      const decoder = new SseDecoder(1024)
      const lines = Array.from({ length: 20 }, () => `data: ${'b'.repeat(60)}\n`).join('')
      t.throws(() => decoder.push(utf8(`${lines}\n`)), EventTooLargeError)
    })

    t.test('many small events add up to more than the limit without error', async (t) => {
      const decoder = new SseDecoder(1024)
      const text = Array.from({ length: 200 }, (_, i) => `data: ${'c'.repeat(50)}${i}\n\n`).join('')
      t.equal(decoder.push(utf8(text)).length, 200, 'in one chunk')
      let total = 0
      for (let i = 0; i < 200; i++) total += decoder.push(utf8(`data: ${'c'.repeat(50)}\n\n`)).length
      t.equal(total, 200, 'in many chunks')
    })

    t.test('keep-alive comments do not count towards the limit', async (t) => {
      const decoder = new SseDecoder(1024)
      t.doesNotThrow(() => {
        for (let i = 0; i < 200; i++) decoder.push(utf8(': keep-alive\n\n'))
      }, '200 pings of 14 bytes (2800 bytes in all) with a 1024-byte limit')
      const retry = new SseDecoder(1024)
      t.doesNotThrow(() => {
        for (let i = 0; i < 200; i++) retry.push(utf8('retry: 1000\n\n'))
      }, '200 retry blocks')
      const idOnly = new SseDecoder(1024)
      t.doesNotThrow(() => {
        for (let i = 0; i < 200; i++) idOnly.push(utf8(`id: ${i}\n\n`))
      }, '200 data-less blocks')
    })

    t.test('the limit is in bytes (UTF-8), not UTF-16 code units', async (t) => {
      const decoder = new SseDecoder(1024)
      t.throws(() => decoder.push(utf8(`data: ${'€'.repeat(600)}\n\n`)), EventTooLargeError, '1800 bytes of data in one chunk')
    })

    t.test('the verdict on one event does not depend on how it was chunked', async (t) => {
      const text = `data: ${'a'.repeat(1017)}\n\n`
      const whole = new SseDecoder(1024)
      const wholeOk = (() => { try { whole.push(utf8(text)); return true } catch { return false } })()
      const split = new SseDecoder(1024)
      const splitOk = (() => { try { split.push(utf8(text.slice(0, -2))); split.push(utf8('\n\n')); return true } catch { return false } })()
      t.equal(wholeOk, true, 'accepted in one chunk')
      t.equal(splitOk, wholeOk, 'the same verdict when the blank line comes in a second chunk')
    })

    t.test('an unterminated tail after a complete event is counted', async (t) => {
      const decoder = new SseDecoder(1024)
      decoder.push(utf8(`data: x\n\ndata: ${'a'.repeat(1000)}`))
      t.doesNotThrow(() => decoder.push(utf8('a'.repeat(18))), 'a block of 1,024 bytes so far is within the bound')
      t.throws(() => decoder.push(utf8('a')), EventTooLargeError, 'one byte more, before the event is even complete, is not')
    })

    t.test('a byte order mark starting the stream is dropped, even split across reads', async (t) => {
      const bom = Buffer.from([0xef, 0xbb, 0xbf])
      t.same(plain(decodeChunks([bom.subarray(0, 1), bom.subarray(1), utf8('data: a\n\n')]).events), [{ data: 'a' }])
      const frames = decodeChunks([Buffer.concat([bom, utf8('data: b\n\n')])]).events.map(e => e.frame.toString())
      t.same(frames, ['data: b\n'], 'the frame holds the field lines only')
      t.same(plain(decodeChunks([utf8('data: c\n\n'), bom, utf8('data: d\n\n')]).events).map(e => e.data), ['c'], 'later, it is part of a line (an unknown field)')
    })

    t.test('events completed before an oversized one in the same chunk are not lost', async (t) => {
      const decoder = new SseDecoder(1024)
      const chunk = utf8(`data: before\n\ndata: ${'z'.repeat(2000)}\n\n`)
      let delivered: UpstreamEvent[] = []
      try {
        delivered = decoder.push(chunk)
      } catch (err) {
        t.type(err, EventTooLargeError, 'the oversized event is refused')
        delivered = [...(err as EventTooLargeError).completed]
      }
      t.same(delivered.map(dataOf), ['before'], 'the preceding event is carried by the error')
    })
  })

  t.test('property: formatted events split into random chunks decode to exactly those events', async (t) => {
    const dataArb = fc.string({ unit: 'binary', maxLength: 80 })
      .map(s => new TextDecoder().decode(new TextEncoder().encode(s)).replace(/\r/g, ''))
    const eventArb = fc.record({
      id: fc.record({ epoch: fc.constantFrom('e', 'ep0ch'), streamId: fc.constantFrom('s', 'r1x'), seq: fc.maxSafeNat() }).map(encodeEventId),
      data: dataArb,
      event: fc.option(fc.constantFrom('message', 'custom', GAP_EVENT, 'x y', 'ü'), { nil: undefined })
    })
    fc.assert(fc.property(
      fc.array(eventArb, { maxLength: 20 }),
      fc.array(fc.nat(), { maxLength: 30 }),
      (events, cuts) => {
        const bytes = utf8(events.map(e => formatEvent(e.id, e.data, e.event)).join(''))
        const points = [...new Set(cuts.map(c => bytes.length === 0 ? 0 : c % (bytes.length + 1)))].sort((a, b) => a - b)
        const chunks: Uint8Array[] = []
        let from = 0
        for (const p of points) { chunks.push(bytes.subarray(from, p)); from = p }
        chunks.push(bytes.subarray(from))
        const decoded = decodeChunks(chunks).events
        // Empty data: never dispatched (priming events), so not kept.
        const dispatched = events.filter(e => e.data !== '')
        if (decoded.length !== dispatched.length) return false
        return dispatched.every((e, i) => {
          const d = decoded[i] as UpstreamEvent
          const type = e.event === 'message' ? undefined : e.event
          return d.upstreamId === e.id && dataOf(d) === e.data && eventOf(d) === type
        })
      }
    ), { numRuns: 1000 })
    t.pass('1000 random event sequences and chunkings decoded exactly')
  })
})
