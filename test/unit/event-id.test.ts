// Gateway event ids (src/protocol/event-id.ts): every id the gateway issues
// decodes back to its position, and anything else a client may send in
// Last-Event-ID decodes to null.
import t from 'tap'
import fc from 'fast-check'
import {
  MAX_EVENT_ID_LENGTH, decodeEventId, encodeEventId, encodePrimingId, randomToken, writeBase36, type EventPosition
} from '../../src/protocol/event-id.js'

const ALPHABET = '0123456789abcdefghijklmnopqrstuvwxyz'
const token = (minLength: number, maxLength: number): fc.Arbitrary<string> =>
  fc.string({ unit: fc.constantFrom(...ALPHABET.split('')), minLength, maxLength })
const epochArb = token(1, 16)
const streamIdArb = token(1, 32)
const seqArb = fc.oneof(
  fc.constantFrom(0, 1, 35, 36, 2 ** 31, 2 ** 32, Number.MAX_SAFE_INTEGER - 1, Number.MAX_SAFE_INTEGER),
  fc.nat(),
  fc.maxSafeNat()
)
const positionArb: fc.Arbitrary<EventPosition> = fc.record({ epoch: epochArb, streamId: streamIdArb, seq: seqArb })

/** A fake random source cycling through fixed byte values, for exact expectations. */
function bytesOf (...values: number[]): (size: number) => Uint8Array {
  return (size: number) => Uint8Array.from({ length: size }, (_, i) => values[i % values.length] as number)
}

t.test('encode then decode is the identity', async (t) => {
  t.same(decodeEventId(encodeEventId({ epoch: 'e1', streamId: 's', seq: 0 })), { epoch: 'e1', streamId: 's', seq: 0 })
  t.same(decodeEventId(encodeEventId({ epoch: 'e1', streamId: 's', seq: 1 })), { epoch: 'e1', streamId: 's', seq: 1 })
  t.equal(encodeEventId({ epoch: 'abc', streamId: 's', seq: 35 }), 'abc.s.z')
  t.equal(encodeEventId({ epoch: 'abc', streamId: 's', seq: 36 }), 'abc.s.10')
  const max = { epoch: 'z'.repeat(16), streamId: '9'.repeat(32), seq: Number.MAX_SAFE_INTEGER }
  const id = encodeEventId(max)
  t.equal(id, `${'z'.repeat(16)}.${'9'.repeat(32)}.2gosa7pa2gv`)
  t.ok(id.length <= MAX_EVENT_ID_LENGTH, 'the longest issuable id fits the bound')
  t.same(decodeEventId(id), max)
})

t.test('property: every position round-trips', async (t) => {
  fc.assert(fc.property(positionArb, (position) => {
    const decoded = decodeEventId(encodeEventId(position))
    return decoded !== null &&
      decoded.epoch === position.epoch &&
      decoded.streamId === position.streamId &&
      decoded.seq === position.seq
  }), { numRuns: 2000 })
  t.pass('2000 random positions round-tripped')
})

t.test('property: an encoded id is visible ASCII, within MAX_EVENT_ID_LENGTH, SSE-safe', async (t) => {
  fc.assert(fc.property(positionArb, (position) => {
    const id = encodeEventId(position)
    return id.length > 0 &&
      id.length <= MAX_EVENT_ID_LENGTH &&
      /^[\x21-\x7e]+$/.test(id) &&
      /^[0-9a-z.]+$/.test(id) &&
      !id.includes('\0') && !id.includes('\r') && !id.includes('\n') && !id.includes(' ')
  }), { numRuns: 2000 })
  t.pass('2000 random ids checked')
})

t.test('property: distinct positions give distinct ids', async (t) => {
  fc.assert(fc.property(positionArb, positionArb, (a, b) => {
    const same = a.epoch === b.epoch && a.streamId === b.streamId && a.seq === b.seq
    return same === (encodeEventId(a) === encodeEventId(b))
  }), { numRuns: 2000 })
  t.pass('ids are injective')
})

t.test('property: decoding is canonical (a decoded string is exactly the id of its position, or a priming id)', async (t) => {
  // Strings over the id alphabet plus some hostile characters, so that both
  // valid and invalid ids are generated often. A priming id is its position's
  // id plus `_<nonce>` (encodePrimingId): the one other spelling that decodes.
  const canonical = (s: string): boolean => {
    const decoded = decodeEventId(s)
    if (decoded === null) return true
    const id = encodeEventId(decoded)
    return s === id || (s.startsWith(`${id}_`) && /^[0-9a-z]{1,8}$/.test(s.slice(id.length + 1)))
  }
  const chars = fc.constantFrom(...'0123456789abcz.AZ -+_\n\r\0é'.split(''))
  fc.assert(fc.property(fc.string({ unit: chars, maxLength: 70 }), canonical), { numRuns: 5000 })
  fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 80 }), canonical), { numRuns: 2000 })
  t.ok(canonical('0.0.0_0'), 'a priming id (the counterexample CI found when this property ignored them)')
  t.equal(decodeEventId('0.0.00_0'), null, 'while a non-canonical sequence stays refused, nonce or not')
  t.pass('no two spellings decode to one position, priming ids aside')
})

t.test('hostile input decodes to null', async (t) => {
  const valid = encodeEventId({ epoch: 'ep0ch', streamId: 's', seq: 42 })
  t.not(decodeEventId(valid), null, 'the baseline id is valid')
  const cases: Array<[string, string]> = [
    ['empty', ''],
    ['one dot', '.'],
    ['two dots', '..'],
    ['missing epoch', '.s.1'],
    ['missing stream', 'e..1'],
    ['missing seq', 'e.s.'],
    ['two parts', 'e.1'],
    ['one part', 'abc'],
    ['extra dots', 'e.s.1.2'],
    ['trailing dot', `${valid}.`],
    ['leading dot', `.${valid}`],
    ['double dot inside', 'e..s.1'],
    ['too long overall', 'a'.repeat(MAX_EVENT_ID_LENGTH + 1)],
    ['too long, valid-looking', `${'a'.repeat(16)}.${'b'.repeat(32)}.${'1'.repeat(14)}`],
    ['epoch too long', `${'a'.repeat(17)}.s.1`],
    ['stream id too long', `e.${'b'.repeat(33)}.1`],
    ['seq too long (12 digits)', 'e.s.100000000000'],
    ['trailing LF', `${valid}\n`],
    ['trailing CR', `${valid}\r`],
    ['CRLF inside', 'e.s\r\n.1'],
    ['header injection', `${valid}\r\nX-Evil: 1`],
    ['NUL', `${valid}\0`],
    ['NUL inside', 'e.s\0.1'],
    ['unicode letter', 'é.s.1'],
    ['unicode digit', 'e.s.\u0661'],
    ['fullwidth digit', 'e.s.\uff11'],
    ['emoji', 'e.\u{1f600}.1'],
    ['leading space', ` ${valid}`],
    ['trailing space', `${valid} `],
    ['space inside', 'e. s.1'],
    ['tab', 'e.s.1\t'],
    ['uppercase epoch', 'E.s.1'],
    ['uppercase stream', 'e.S.1'],
    ['uppercase seq', 'e.s.A'],
    ['non-canonical seq 0a', 'e.s.0a'],
    ['non-canonical seq 00', 'e.s.00'],
    ['non-canonical seq 01', 'e.s.01'],
    ['negative seq', 'e.s.-1'],
    ['plus sign', 'e.s.+1'],
    ['fraction', 'e.s.1.5'],
    ['underscore', 'e_1.s.1'],
    ['hyphen', 'e-1.s.1'],
    ['seq = MAX_SAFE_INTEGER + 1', `e.s.${(2 ** 53).toString(36)}`],
    ['seq far beyond safe', 'e.s.zzzzzzzzzzz'],
    ['slash', 'e/s/1'],
    ['percent-encoded', 'e.s.%31']
  ]
  for (const [name, input] of cases) {
    t.equal(decodeEventId(input), null, name)
  }
})

t.test('the last safe sequence number decodes; the next one does not', async (t) => {
  const last = Number.MAX_SAFE_INTEGER.toString(36)
  t.equal(decodeEventId(`e.s.${last}`)?.seq, Number.MAX_SAFE_INTEGER)
  t.equal(decodeEventId(`e.s.${(2 ** 53).toString(36)}`), null)
  t.equal(decodeEventId(`e.s.${(2 ** 53 + 2).toString(36)}`), null)
})

t.test('non-string input decodes to null', async (t) => {
  t.equal(decodeEventId(undefined), null, 'undefined')
  t.equal(decodeEventId(null), null, 'null')
  // Header values can arrive as arrays (repeated headers) or anything at all from JSON.
  const hostile: unknown[] = [['e.s.1'], ['e.s.1', 'e.s.2'], [], 42, 0, true, {}, { toString: () => 'e.s.1' }, Symbol('x'), 1n, () => 'e.s.1']
  for (const value of hostile) {
    t.equal(decodeEventId(value as string), null, `${typeof value} ${Array.isArray(value) ? 'array' : ''}`)
  }
})

t.test('the length bound is checked before the pattern', async (t) => {
  // A megabyte of valid-alphabet characters is rejected promptly.
  const huge = `e.s.${'1'.repeat(1024 * 1024)}`
  const started = process.hrtime.bigint()
  t.equal(decodeEventId(huge), null)
  t.ok(process.hrtime.bigint() - started < 50_000_000n, 'rejected in well under 50 ms')
  t.equal(decodeEventId('.'.repeat(1024 * 1024)), null)
})

t.test('randomToken', async (t) => {
  t.test('length and alphabet with the real random source', async (t) => {
    const { randomBytes } = await import('node:crypto')
    for (const length of [0, 1, 8, 16, 32, 100]) {
      const tok = randomToken(length, randomBytes)
      t.equal(tok.length, length, `length ${length}`)
      t.match(tok, /^[0-9a-z]*$/, `alphabet at length ${length}`)
    }
    const many = new Set(Array.from({ length: 1000 }, () => randomToken(8, randomBytes)))
    t.equal(many.size, 1000, '1000 random 8-character tokens are distinct')
  })

  t.test('every byte value maps into the alphabet', async (t) => {
    const all = Uint8Array.from({ length: 256 }, (_, i) => i)
    const tok = randomToken(256, () => all)
    t.equal(tok.length, 256)
    t.match(tok, /^[0-9a-z]+$/)
    t.equal(new Set(tok).size, 36, 'all 36 characters are reachable')
    t.equal(tok.slice(0, 36), ALPHABET, 'byte i maps to ALPHABET[i % 36]')
  })

  t.test('asks the source for exactly `length` bytes', async (t) => {
    const asked: number[] = []
    randomToken(12, (size) => { asked.push(size); return new Uint8Array(size) })
    t.same(asked, [12])
    t.equal(randomToken(4, bytesOf(0)), '0000')
    t.equal(randomToken(4, bytesOf(35, 36, 255)), 'z03z')
  })

  t.test('property: tokens are valid epochs and stream ids', async (t) => {
    fc.assert(fc.property(fc.uint8Array({ minLength: 32, maxLength: 32 }), fc.integer({ min: 1, max: 32 }), (bytes, length) => {
      const tok = randomToken(length, () => bytes)
      const epoch = tok.slice(0, 16)
      return tok.length === length &&
        decodeEventId(encodeEventId({ epoch, streamId: tok, seq: 7 })) !== null
    }), { numRuns: 1000 })
    t.pass('random tokens make decodable ids')
  })
})

t.test('stream ids inside event ids', async (t) => {
  const streamIdOf = (id: string): string | undefined => decodeEventId(`e.${id}.1`)?.streamId
  for (const ok of ['s', '0', 'abc123', 'z'.repeat(32)]) t.equal(streamIdOf(ok), ok, ok)
  for (const bad of ['', 'z'.repeat(33), 'S', 'a.b', 'a b', 'a\n', 'é', '-', 'a_b']) t.equal(streamIdOf(bad), undefined, JSON.stringify(bad))
  fc.assert(fc.property(streamIdArb, (id) => streamIdOf(id) === id))
})

t.test('priming ids resume from their position and never equal an event id', async (t) => {
  const position = { epoch: 'e1', streamId: 's', seq: 41 }
  const priming = encodePrimingId(position, 'k3x9z0')
  t.equal(priming, 'e1.s.15_k3x9z0')
  t.not(priming, encodeEventId(position), 'distinct from the id of the event at that position')
  t.same(decodeEventId(priming), position, 'decodes to the same position')
  t.ok(priming.length <= MAX_EVENT_ID_LENGTH)
  for (const bad of ['e1.s.15_', 'e1.s.15_K', 'e1.s.15_123456789', 'e1.s.15_ab_cd', 'e1.s.15-ab']) {
    t.equal(decodeEventId(bad), null, `refused: ${bad}`)
  }
})

t.test('writeBase36 writes what toString(36) spells, for every safe integer', async (t) => {
  const spelled = (n: number): string => {
    const out = Buffer.alloc(16, 0x2e)
    const end = writeBase36(out, 2, n)
    return out.toString('latin1', 2, end) + (out[end] === 0x2e && out[1] === 0x2e ? '' : '!overwrote')
  }
  for (const n of [0, 1, 35, 36, 1295, 1296, 2 ** 31, 2 ** 52 - 1, Number.MAX_SAFE_INTEGER, Number.MAX_SAFE_INTEGER - 35]) t.equal(spelled(n), n.toString(36), String(n))
  fc.assert(fc.property(fc.maxSafeNat(), n => spelled(n) === n.toString(36)), { numRuns: 20_000 })
  t.pass('20,000 random safe integers')
})
