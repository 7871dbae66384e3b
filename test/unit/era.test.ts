// Protocol era of a request (src/protocol/era.ts), decided from its
// MCP-Protocol-Version header alone.
import t from 'tap'
import fc from 'fast-check'
import {
  DEFAULT_PROTOCOL_VERSION, MODERN_SINCE, PRIMING_SINCE, protocolInfo
} from '../../src/protocol/era.js'

t.test('the constants name the revisions of the spec', async (t) => {
  t.equal(DEFAULT_PROTOCOL_VERSION, '2025-03-26')
  t.equal(PRIMING_SINCE, '2025-11-25')
  t.equal(MODERN_SINCE, '2026-07-28')
})

t.test('an absent header means 2025-03-26: legacy, no priming', async (t) => {
  const expected = { version: '2025-03-26', era: 'legacy', priming: false }
  t.same(protocolInfo(undefined), expected, 'undefined')
  t.same(protocolInfo(''), expected, 'empty string')
})

t.test('legacy revisions', async (t) => {
  t.same(protocolInfo('2024-11-05'), { version: '2024-11-05', era: 'legacy', priming: false }, 'the HTTP+SSE era revision')
  t.same(protocolInfo('2025-03-26'), { version: '2025-03-26', era: 'legacy', priming: false })
  t.same(protocolInfo('2025-06-18'), { version: '2025-06-18', era: 'legacy', priming: false })
  t.same(protocolInfo('2025-11-24'), { version: '2025-11-24', era: 'legacy', priming: false }, 'the day before priming')
})

t.test('2025-11-25 is legacy with priming', async (t) => {
  t.same(protocolInfo('2025-11-25'), { version: '2025-11-25', era: 'legacy', priming: true })
  t.same(protocolInfo('2026-01-01'), { version: '2026-01-01', era: 'legacy', priming: true }, 'a draft between the two')
  t.same(protocolInfo('2026-07-27'), { version: '2026-07-27', era: 'legacy', priming: true }, 'the day before modern')
})

t.test('2026-07-28 and later are modern', async (t) => {
  for (const version of ['2026-07-28', '2026-07-29', '2026-12-31', '2027-01-01', '2030-06-15', '9999-12-31']) {
    const info = protocolInfo(version)
    t.equal(info?.era, 'modern', version)
    t.equal(info?.version, version)
    t.equal(info?.priming, true, `${version} expects priming too (by date)`)
  }
})

t.test('surrounding whitespace is trimmed', async (t) => {
  t.same(protocolInfo(' 2025-06-18 '), { version: '2025-06-18', era: 'legacy', priming: false })
  t.same(protocolInfo('\t2026-07-28'), { version: '2026-07-28', era: 'modern', priming: true })
})

t.test('malformed headers give null', async (t) => {
  const cases = [
    'garbage',
    ' ',
    '2025-1-1',
    '2025-01-1',
    '25-06-18',
    '2025/06/18',
    '2025-06-18T00:00:00Z',
    '20250618',
    '2025-06-18,2025-03-26',
    '2025-06-18, 2025-03-26',
    '2025-06-18;q=1',
    '2025-06-18\r\nX-Injected: 1',
    '2025-06-18\nX-Injected: 1',
    '2025-06-18\0',
    "2025-06-18' OR '1'='1",
    '<script>alert(1)</script>',
    '$' + '{jndi:ldap://x/a}',
    '../../etc/passwd',
    '２０２５-０６-１８',
    '\u0662\u0660\u0662\u0665-\u0660\u0666-\u0661\u0668',
    'v2025-06-18',
    '2025-06-18a',
    '-2025-06-18',
    '+2025-06-18',
    '2025-06-18'.repeat(100),
    'latest',
    'null',
    'undefined'
  ]
  for (const header of cases) {
    t.equal(protocolInfo(header), null, JSON.stringify(header).slice(0, 60))
  }
})

t.test('repeated headers (arrays) give null', async (t) => {
  t.equal(protocolInfo([]), null, 'empty array')
  t.equal(protocolInfo(['2025-06-18']), null, 'one element')
  t.equal(protocolInfo(['2025-06-18', '2025-06-18']), null, 'the same value twice')
  t.equal(protocolInfo(['2025-06-18', '2026-07-28']), null, 'conflicting values')
})

t.test('property: the era is a pure function of the date', async (t) => {
  const pad = (n: number, width: number): string => String(n).padStart(width, '0')
  const date = fc.tuple(fc.integer({ min: 0, max: 9999 }), fc.integer({ min: 1, max: 12 }), fc.integer({ min: 1, max: 28 }))
    .map(([y, m, d]) => `${pad(y, 4)}-${pad(m, 2)}-${pad(d, 2)}`)
  fc.assert(fc.property(date, (version) => {
    const info = protocolInfo(version)
    if (info === null || info.version !== version) return false
    const byDate = new Date(`${version}T00:00:00Z`).getTime()
    const modern = byDate >= Date.parse('2026-07-28T00:00:00Z')
    const priming = byDate >= Date.parse('2025-11-25T00:00:00Z')
    return info.era === (modern ? 'modern' : 'legacy') && info.priming === priming
  }), { numRuns: 3000 })
  t.pass('string comparison agrees with date comparison')
})

t.test('property: arbitrary strings never throw and are null unless YYYY-MM-DD', async (t) => {
  fc.assert(fc.property(fc.string({ unit: 'binary', maxLength: 40 }), (header) => {
    const info = protocolInfo(header)
    if (header === '') return info !== null && info.version === DEFAULT_PROTOCOL_VERSION
    if (info === null) return true
    return /^\d{4}-\d{2}-\d{2}$/.test(info.version) && info.version === header.trim()
  }), { numRuns: 3000 })
  t.pass('no crash, no false positive')
})
