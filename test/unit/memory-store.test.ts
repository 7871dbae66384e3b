// The embedded store's own behaviour (src/store/memory/memory-store.ts), beyond
// the contract every store passes (test/fixtures/store-contract.ts): the
// process-wide byte cap and its eviction order, byte accounting, TTL with a
// fake clock, and array compaction under heavy trimming.
import t, { type Test } from 'tap'
import fc from 'fast-check'
import { setTimeout as sleep } from 'node:timers/promises'
import { MemoryEventStore, RECORD_BYTES, type MemoryStoreOptions } from '../../src/store/memory/memory-store.js'
import type { EventInput, RetentionLimits, StoredEvent } from '../../src/store/contract.js'
import { SessionGoneError } from '../../src/errors.js'
import { EventBatch, EventBatchBuilder } from '../../src/store/batch/event-batch.js'
import { SEGMENT_WEIGHTS } from '../../src/store/memory/segment.js'

const ROOMY: RetentionLimits = { maxEvents: 1_000_000, maxBytes: 1_000_000_000, ttlMs: 3_600_000 }

function makeStore (t: Test, options: Partial<MemoryStoreOptions> = {}): { store: MemoryEventStore, advance: (ms: number) => void } {
  let now = Date.UTC(2025, 0, 1)
  // Records and segments weigh nothing here: these tests are about event bytes (records and segments: the tests at the end).
  const store = new MemoryEventStore({ retention: ROOMY, maxBytes: 1000, now: () => now, recordBytes: { session: 0, stream: 0 }, segmentBytes: { segment: 0, offset: 0, upstreamId: 0 }, ...options })
  t.teardown(() => store.close())
  return { store, advance: (ms: number) => { now += ms } }
}

const ev = (bytes: number, tag = 'x'): EventInput => ({ data: tag.repeat(bytes) })
const seqs = (events: readonly StoredEvent[]): number[] => events.map(e => e.seq)

/** Everything retained in a stream, oldest first. */
async function all (store: MemoryEventStore, session: string, stream: string): Promise<StoredEvent[]> {
  return (await store.read(session, stream, 0, Number.MAX_SAFE_INTEGER))?.events ?? []
}

function bytesOf (e: EventInput): number {
  const upstreamId = e.upstreamId?.length ?? 0
  return e.frame !== undefined ? e.frame.length + upstreamId : Buffer.byteLength(e.data) + (e.event?.length ?? 0) + upstreamId
}

t.test('the byte cap evicts the least recently appended stream first', async (t) => {
  const { store } = makeStore(t)
  await store.createSession('A', 'p')
  await store.createSession('B', 'p')
  await store.append('A', 'a1', [ev(300)])
  await store.append('B', 'b1', [ev(300)])
  await store.append('A', 'a2', [ev(300)])
  await store.append('A', 'a1', [ev(100)])
  t.equal(store.totalBytes, 1000, 'at the cap: nothing evicted yet')
  t.equal((await all(store, 'B', 'b1')).length, 1)

  await store.append('B', 'b2', [ev(200)])
  t.equal(store.totalBytes, 900, 'b1 (300 bytes) evicted')
  t.same(await all(store, 'B', 'b1'), [], 'b1 emptied: it was appended to least recently')
  const b1 = await store.state('B', 'b1')
  t.same({ firstSeq: b1?.firstSeq, lastSeq: b1?.lastSeq }, { firstSeq: 2, lastSeq: 1 }, 'the gap is visible from the numbers')
  t.same(seqs(await all(store, 'A', 'a1')), [1, 2], 'a1 kept: appended to recently')
  t.same(seqs(await all(store, 'A', 'a2')), [1])
  t.same(seqs(await all(store, 'B', 'b2')), [1])
})

t.test('eviction stops as soon as the total is under the cap, oldest first', async (t) => {
  const { store } = makeStore(t)
  await store.createSession('S', 'p')
  for (const s of ['s1', 's2', 's3', 's4', 's5']) await store.append('S', s, [ev(200)])
  t.equal(store.totalBytes, 1000)
  await store.append('S', 's6', [ev(450)])
  t.equal(store.totalBytes, 850, 's1, s2 and s3 evicted (1450 - 600)')
  for (const s of ['s1', 's2', 's3']) t.same(await all(store, 'S', s), [], `${s} evicted`)
  for (const s of ['s4', 's5', 's6']) t.equal((await all(store, 'S', s)).length, 1, `${s} kept`)
})

t.test('appending moves a stream to the back of the eviction order', async (t) => {
  const { store } = makeStore(t)
  await store.createSession('S', 'p')
  await store.append('S', 's1', [ev(300)])
  await store.append('S', 's2', [ev(300)])
  await store.append('S', 's3', [ev(300)])
  await store.append('S', 's1', [ev(50)])
  await store.append('S', 's4', [ev(300)])
  t.same(await all(store, 'S', 's2'), [], 's2 is now the least recently appended')
  t.equal((await all(store, 'S', 's1')).length, 2, 's1 survives')
  t.equal((await all(store, 'S', 's3')).length, 1)
  t.equal(store.totalBytes, 950)
})

t.test('openStream, end, read and getSession do not count as appends', async (t) => {
  const { store } = makeStore(t)
  await store.createSession('S', 'p')
  await store.append('S', 's1', [ev(400)])
  await store.append('S', 's2', [ev(400)])
  await store.openStream('S', 's1')
  await store.read('S', 's1', 0, 10)
  await store.end('S', 's1')
  await store.getSession('S')
  await store.append('S', 's3', [ev(400)])
  t.same(await all(store, 'S', 's1'), [], 's1 is still the oldest append')
  t.equal((await all(store, 'S', 's2')).length, 1)
})

t.test('the stream being written is never evicted for others', async (t) => {
  const { store } = makeStore(t)
  await store.createSession('S', 'p')
  await store.append('S', 'big', [ev(900)])
  await store.append('S', 'cur', [ev(200)])
  t.same(await all(store, 'S', 'big'), [], 'the older stream goes, however large')
  t.same(seqs(await all(store, 'S', 'cur')), [1])
  t.equal(store.totalBytes, 200)
})

t.test('a stream that alone exceeds the cap loses its own older events, never its newest', async (t) => {
  const { store } = makeStore(t)
  await store.createSession('S', 'p')
  await store.append('S', 'other', [ev(100)])
  const stored = await store.append('S', 'cur', [ev(300, 'a'), ev(300, 'b'), ev(300, 'c'), ev(300, 'd')])
  t.same(seqs(stored), [1, 2, 3, 4], 'the append returns every event it numbered')
  t.same(await all(store, 'S', 'other'), [], 'others are evicted first')
  const kept = await all(store, 'S', 'cur')
  t.same(seqs(kept), [2, 3, 4], 'then the oldest events of the stream itself')
  t.equal(kept[2]?.data, 'd'.repeat(300))
  t.equal(store.totalBytes, 900)

  await store.append('S', 'cur', [ev(1500)])
  t.same(seqs(await all(store, 'S', 'cur')), [5], 'a single event above the cap is kept alone')
  t.equal(store.totalBytes, 1500, 'the cap is exceeded by that one event only')

  await store.append('S', 'next', [ev(10)])
  t.same(await all(store, 'S', 'cur'), [], 'the next append to another stream evicts it')
  t.equal(store.totalBytes, 10)
})

t.test('the cap applies across sessions', async (t) => {
  const { store } = makeStore(t)
  for (const s of ['A', 'B', 'C']) await store.createSession(s, 'p')
  await store.append('A', 's', [ev(400)])
  await store.append('B', 's', [ev(400)])
  await store.append('C', 's', [ev(400)])
  t.same(await all(store, 'A', 's'), [], 'the oldest session\'s stream goes')
  t.not(await store.getSession('A'), null, 'its session record stays')
  t.equal(store.totalBytes, 800)
})

t.test('an evicted stream keeps its numbering and can be appended to again', async (t) => {
  const { store } = makeStore(t)
  await store.createSession('S', 'p')
  await store.append('S', 'old', [ev(100), ev(100), ev(100)])
  await store.append('S', 'new', [ev(900)])
  t.same(await all(store, 'S', 'old'), [])
  const stored = await store.append('S', 'old', [ev(50)])
  t.same(seqs(stored), [4], 'sequence continues after eviction')
  const state = await store.state('S', 'old')
  t.equal(state?.firstSeq, 4, 'events 1-3 are gone: a client at seq 1 sees the gap')
  t.equal(state?.lastSeq, 4)
  t.same(seqs((await store.read('S', 'old', 1, 10))?.events ?? []), [4])
  t.equal((await all(store, 'S', 'new')).length, 1, '950 bytes in all: under the cap, nothing more evicted')
  t.equal(store.totalBytes, 950)
  await store.append('S', 'old', [ev(100)])
  t.same(await all(store, 'S', 'new'), [], 'now new is the least recently appended')
  t.same(seqs(await all(store, 'S', 'old')), [4, 5])
  t.equal(store.totalBytes, 150)
})

t.test('byte accounting', async (t) => {
  t.test('data bytes are UTF-8; event type and upstream id count too', async (t) => {
    const { store } = makeStore(t, { maxBytes: 1_000_000 })
    await store.createSession('S', 'p')
    await store.append('S', 's', [{ data: 'ab€' }])
    t.equal(store.totalBytes, 5, '"ab€" is 5 bytes')
    await store.append('S', 's', [{ data: '\u{1f600}', event: 'message', upstreamId: 'u1' }])
    t.equal(store.totalBytes, 5 + 4 + 7 + 2)
    await store.append('S', 's', [{ data: '' }])
    t.equal(store.totalBytes, 18, 'an empty event costs nothing')
  })

  t.test('returns to 0 after deleteSession', async (t) => {
    const { store } = makeStore(t, { maxBytes: 1_000_000 })
    await store.createSession('A', 'p')
    await store.createSession('B', 'p')
    await store.append('A', 's', [ev(100), ev(100)])
    await store.append('A', 'r1', [ev(50)])
    await store.append('B', 's', [ev(70)])
    t.equal(store.totalBytes, 320)
    await store.deleteSession('A')
    t.equal(store.totalBytes, 70)
    await store.deleteSession('A')
    t.equal(store.totalBytes, 70, 'deleting twice changes nothing')
    await store.deleteSession('B')
    t.equal(store.totalBytes, 0)
    await store.deleteSession('never-existed')
    t.equal(store.totalBytes, 0)
  })

  t.test('returns to 0 after eviction and deletion of everything', async (t) => {
    const { store } = makeStore(t)
    await store.createSession('A', 'p')
    await store.createSession('B', 'p')
    await store.append('A', 's', [ev(600)])
    await store.append('B', 's', [ev(600)])
    t.equal(store.totalBytes, 600, 'A evicted')
    await store.deleteSession('A')
    t.equal(store.totalBytes, 600, 'deleting an evicted session does not subtract twice')
    await store.deleteSession('B')
    t.equal(store.totalBytes, 0)
  })

  t.test('per-stream retention trims are subtracted', async (t) => {
    const { store } = makeStore(t, { retention: { maxEvents: 3, maxBytes: 250, ttlMs: 60_000 }, maxBytes: 1_000_000 })
    await store.createSession('S', 'p')
    for (let i = 0; i < 10; i++) await store.append('S', 's', [ev(60)])
    t.equal(store.totalBytes, 180, 'three events kept by count')
    await store.append('S', 's', [ev(200)])
    t.equal(store.totalBytes, 200, 'only the newest fits the stream\'s 250 bytes')
    await store.append('S', 's', [ev(400)])
    t.equal(store.totalBytes, 400, 'the newest is kept even above the stream limit')
  })

  t.test('createSession on an existing id releases its bytes', async (t) => {
    const { store } = makeStore(t, { maxBytes: 1_000_000 })
    await store.createSession('S', 'p')
    await store.append('S', 's', [ev(100)])
    await store.createSession('S', 'p')
    t.equal(store.totalBytes, 0)
    await store.append('S', 's', [ev(10)])
    t.equal(store.totalBytes, 10)
  })

  t.test('close releases everything', async (t) => {
    const { store } = makeStore(t, { maxBytes: 1_000_000 })
    await store.createSession('S', 'p')
    await store.append('S', 's', [ev(100)])
    await store.close()
    t.equal(store.totalBytes, 0)
    t.equal(await store.getSession('S'), null)
  })
})

t.test('TTL with an injected clock', async (t) => {
  const retention = { ...ROOMY, ttlMs: 1000 }

  t.test('expires exactly ttlMs after the last activity', async (t) => {
    const { store, advance } = makeStore(t, { retention })
    await store.createSession('S', 'p')
    advance(999)
    t.not(await store.getSession('S'), null, 'alive 1 ms before the deadline (and refreshed)')
    advance(999)
    await store.append('S', 's', [ev(10)])
    advance(999)
    t.not(await store.read('S', 's', 0, 10), null, 'append refreshed it')
    advance(1)
    t.equal(await store.getSession('S'), null, 'expired at exactly ttlMs')
  })

  t.test('an expired session reads as gone everywhere and releases its bytes', async (t) => {
    const { store, advance } = makeStore(t, { retention, maxBytes: 1_000_000 })
    await store.createSession('S', 'p')
    await store.append('S', 's', [ev(100)])
    await store.saveCursor('S', 's', 1)
    t.equal(store.totalBytes, 100)
    advance(1000)
    t.equal(await store.read('S', 's', 0, 10), null, 'read')
    t.equal(store.totalBytes, 0, 'dropped on access')
    t.equal(await store.state('S', 's'), null, 'state')
    t.equal(await store.loadCursor('S', 's'), 0, 'cursor')
    await t.rejects(store.append('S', 's', [ev(1)]), SessionGoneError, 'append')
    await t.rejects(store.openStream('S', 's'), SessionGoneError, 'openStream')
    await t.rejects(store.end('S', 's'), SessionGoneError, 'end')
    t.equal(store.totalBytes, 0)
  })

  t.test('read, state and cursors do not refresh the TTL', async (t) => {
    const { store, advance } = makeStore(t, { retention })
    await store.createSession('S', 'p')
    await store.append('S', 's', [ev(1)])
    for (let i = 0; i < 3; i++) {
      advance(300)
      await store.read('S', 's', 0, 10)
      await store.state('S', 's')
      await store.saveCursor('S', 's', 1)
      await store.loadCursor('S', 's')
    }
    advance(100)
    t.equal(await store.getSession('S'), null, 'passive reads are not activity')
  })

  t.test('the sweeper releases expired sessions without any access', async (t) => {
    const { store, advance } = makeStore(t, { retention, maxBytes: 1_000_000, sweepIntervalMs: 5 })
    await store.createSession('A', 'p')
    await store.createSession('B', 'p')
    await store.append('A', 's', [ev(100)])
    advance(500)
    await store.append('B', 's', [ev(30)])
    advance(500)
    await sleep(50)
    t.equal(store.totalBytes, 30, 'A swept, B (refreshed later) kept')
    advance(500)
    await sleep(50)
    t.equal(store.totalBytes, 0, 'B swept too')
  })

  t.test('an expired session does not shield live streams from eviction order', async (t) => {
    const { store, advance } = makeStore(t, { retention })
    await store.createSession('A', 'p')
    await store.append('A', 's', [ev(500)])
    advance(1000)
    await store.createSession('B', 'p')
    await store.append('B', 's', [ev(600)])
    t.equal(await store.getSession('A'), null)
    t.equal((await all(store, 'B', 's')).length, 1, 'B kept: A\'s dead bytes went first')
    t.equal(store.totalBytes, 600)
  })
})

t.test('compaction keeps reads correct after many trims', async (t) => {
  t.test('5000 single appends with maxEvents 100, read in pages', async (t) => {
    const { store } = makeStore(t, { retention: { ...ROOMY, maxEvents: 100 }, maxBytes: 1_000_000 })
    await store.createSession('S', 'p')
    let checked = 0
    for (let i = 1; i <= 5000; i++) {
      await store.append('S', 's', [{ data: `e${i}` }])
      // Check around the points where trimming has shifted 1024, 2048... slots.
      if (i % 997 === 0 || (i > 1100 && i < 1130) || i === 2148 || i === 2149) {
        const page = (await store.read('S', 's', i - 5, 10))?.events ?? []
        if (seqs(page).join() !== [i - 4, i - 3, i - 2, i - 1, i].join()) t.fail(`after ${i} appends: ${seqs(page).join()}`)
        checked++
      }
    }
    t.ok(checked > 30, `${checked} intermediate reads were correct`)
    const state = await store.state('S', 's')
    t.same({ firstSeq: state?.firstSeq, lastSeq: state?.lastSeq }, { firstSeq: 4901, lastSeq: 5000 })

    const paged: StoredEvent[] = []
    let after = 4900
    for (;;) {
      const page = (await store.read('S', 's', after, 7))?.events ?? []
      if (page.length === 0) break
      paged.push(...page)
      after = (page[page.length - 1] as StoredEvent).seq
    }
    t.same(seqs(paged), Array.from({ length: 100 }, (_, i) => 4901 + i), 'pages of 7 cover 4901..5000 exactly')
    t.ok(paged.every(e => e.data === `e${e.seq}`), 'each seq carries its own data')
    t.same(seqs((await store.read('S', 's', 0, 3))?.events ?? []), [4901, 4902, 4903], 'from before the window: the oldest retained')
    t.same(seqs((await store.read('S', 's', 4950, 3))?.events ?? []), [4951, 4952, 4953])
    t.same(seqs((await store.read('S', 's', 4999, 10))?.events ?? []), [5000])
    t.same((await store.read('S', 's', 5000, 10))?.events, [])
    t.same((await store.read('S', 's', 9999, 10))?.events, [])
    t.same(seqs((await store.read('S', 's', -5, 2))?.events ?? []), [4901, 4902], 'a negative position reads from the start')
    t.equal(store.totalBytes, paged.reduce((n, e) => n + bytesOf(e), 0))
  })

  t.test('large batches with maxEvents 100', async (t) => {
    const { store } = makeStore(t, { retention: { ...ROOMY, maxEvents: 100 }, maxBytes: 10_000_000 })
    await store.createSession('S', 'p')
    for (let b = 0; b < 5; b++) {
      const batch = Array.from({ length: 1500 }, (_, i) => ({ data: `b${b}-${i}` }))
      const stored = await store.append('S', 's', batch)
      t.equal(stored.length, 1500, 'every event is numbered and returned')
      const kept = await all(store, 'S', 's')
      t.same(seqs(kept), Array.from({ length: 100 }, (_, i) => (b + 1) * 1500 - 99 + i), `batch ${b}: the newest 100`)
      t.equal(kept[99]?.data, `b${b}-1499`)
    }
  })

  t.test('byte-trimmed streams compact too', async (t) => {
    const { store } = makeStore(t, { retention: { ...ROOMY, maxBytes: 1024 }, maxBytes: 1_000_000 })
    await store.createSession('S', 'p')
    for (let i = 1; i <= 3000; i++) await store.append('S', 's', [{ data: String(i).padStart(100, '0') }])
    const kept = await all(store, 'S', 's')
    t.same(seqs(kept), Array.from({ length: 10 }, (_, i) => 2991 + i), 'ten 100-byte events fit 1024 bytes')
    t.ok(kept.every(e => Number(e.data) === e.seq))
    t.equal(store.totalBytes, 1000)
  })

  t.test('a long stream evicted as a whole, then appended again', async (t) => {
    const { store } = makeStore(t, { maxBytes: 100_000 })
    await store.createSession('S', 'p')
    await store.append('S', 'long', Array.from({ length: 3000 }, (_, i) => ({ data: `${i + 1}`.padStart(20, '0') })))
    t.equal((await all(store, 'S', 'long')).length, 3000)
    await store.append('S', 'other', [ev(99_000)])
    t.same(await all(store, 'S', 'long'), [], 'evicted entirely')
    for (let i = 0; i < 5; i++) await store.append('S', 'long', [{ data: `again${i}` }])
    const again = await all(store, 'S', 'long')
    t.same(seqs(again), [3001, 3002, 3003, 3004, 3005])
    t.same(again.map(e => e.data), ['again0', 'again1', 'again2', 'again3', 'again4'])
    t.same(seqs((await store.read('S', 'long', 3002, 2))?.events ?? []), [3003, 3004])
  })
})

t.test('property: byte accounting and the cap hold under random operations', async (t) => {
  const CAP = 1000
  type Op =
    | { kind: 'append', session: number, stream: number, sizes: number[], end: boolean }
    | { kind: 'delete', session: number }
    | { kind: 'create', session: number }
    | { kind: 'advance', ms: number }
  const opArb: fc.Arbitrary<Op> = fc.oneof(
    { weight: 8, arbitrary: fc.record({ kind: fc.constant('append' as const), session: fc.nat(2), stream: fc.nat(3), sizes: fc.array(fc.nat(450), { minLength: 1, maxLength: 5 }), end: fc.boolean() }) },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('delete' as const), session: fc.nat(2) }) },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('create' as const), session: fc.nat(2) }) },
    { weight: 1, arbitrary: fc.record({ kind: fc.constant('advance' as const), ms: fc.nat(700) }) }
  )
  await fc.assert(fc.asyncProperty(fc.array(opArb, { maxLength: 60 }), fc.nat(5), async (ops, maxEventsExtra) => {
    let now = 0
    const retention = { maxEvents: 3 + maxEventsExtra, maxBytes: 700, ttlMs: 1000 }
    const store = new MemoryEventStore({ retention, maxBytes: CAP, now: () => now, recordBytes: { session: 0, stream: 0 }, segmentBytes: { segment: 0, offset: 0, upstreamId: 0 } })
    // The model: per live session, each stream's count of appended events.
    const lastSeq = new Map<string, Map<string, number>>()
    const lastActive = new Map<string, number>()
    /** Streams appended to with end: true ("<session> <stream>"): the cap may drop them altogether. */
    const ended = new Set<string>()
    const forgetEnded = (s: string): void => { for (const key of ended) if (key.startsWith(`${s} `)) ended.delete(key) }
    /** Sessions the model says have expired; the store drops them lazily, on access. */
    const expire = async (): Promise<boolean> => {
      for (const [s, at] of [...lastActive]) {
        if (at + retention.ttlMs > now) continue
        forgetEnded(s)
        lastSeq.delete(s)
        lastActive.delete(s)
        if (await store.getSession(s) !== null) return false
      }
      return true
    }
    try {
      for (const op of ops) {
        let current: [string, string] | undefined
        if (op.kind === 'advance') {
          now += op.ms
          if (!await expire()) return false
        } else if (op.kind === 'create') {
          const s = `S${op.session}`
          await store.createSession(s, 'p')
          forgetEnded(s)
          lastSeq.set(s, new Map())
          lastActive.set(s, now)
        } else if (op.kind === 'delete') {
          const s = `S${op.session}`
          await store.deleteSession(s)
          forgetEnded(s)
          lastSeq.delete(s)
          lastActive.delete(s)
        } else {
          const s = `S${op.session}`
          const st = `r${op.stream}`
          if (!lastSeq.has(s)) {
            await store.createSession(s, 'p')
            lastSeq.set(s, new Map())
            lastActive.set(s, now)
          }
          const inputs = op.sizes.map((n, i) => i % 2 === 0 ? ev(n) : { data: '€'.repeat(Math.floor(n / 3)), event: 'e', upstreamId: 'u' })
          const stored = await store.append(s, st, inputs, { end: op.end })
          const streams = lastSeq.get(s) as Map<string, number>
          const before = streams.get(st) ?? 0
          if (seqs(stored).join() !== inputs.map((_, i) => before + i + 1).join()) return false
          streams.set(st, before + inputs.length)
          if (op.end) ended.add(`${s} ${st}`)
          lastActive.set(s, now)
          current = [s, st]
        }
        // Invariants, checked against what the store reads back.
        let sum = 0
        let nonEmpty = 0
        let currentKept = 0
        for (const [s, streams] of lastSeq) {
          for (const [st, last] of streams) {
            const result = await store.read(s, st, 0, Number.MAX_SAFE_INTEGER)
            if (result === null && ended.has(`${s} ${st}`) && !(current !== undefined && s === current[0] && st === current[1])) {
              // A finished answer evicted by the cap: its record went too; a new one starts from 1.
              streams.delete(st)
              ended.delete(`${s} ${st}`)
              continue
            }
            if (result === null) return false
            const got = seqs(result.events)
            if (result.state.lastSeq !== last) return false
            if (got.length !== last - result.state.firstSeq + 1) return false
            if (got.some((q, i) => q !== result.state.firstSeq + i)) return false
            if (got.length > retention.maxEvents) return false
            sum += result.events.reduce((n, e) => n + bytesOf(e), 0)
            if (got.length > 0) nonEmpty++
            if (current !== undefined && s === current[0] && st === current[1]) {
              currentKept = got.length
              if (got[got.length - 1] !== last) return false
            }
          }
        }
        if (store.totalBytes !== sum) return false
        if (current !== undefined && currentKept < 1) return false
        if (sum > CAP && !(nonEmpty === 1 && currentKept === 1)) return false
      }
      return true
    } finally {
      await store.close()
    }
  }), { numRuns: 300 })
  t.pass('300 random operation sequences kept totalBytes exact and within the cap')
})

t.test('upstream frames are kept packed per append: trimming inside a batch, reads across batches', async (t) => {
  const { store } = makeStore(t, { retention: { ...ROOMY, maxEvents: 7 }, maxBytes: 1_000_000 })
  await store.createSession('S', 'p')
  const frame = (n: number): EventInput => n % 4 === 0 ? { frame: Buffer.from(`data: ${n}\n`), upstreamId: `u${n}` } : { frame: Buffer.from(`data: ${n}\n`) }
  const batch = (from: number, count: number): EventInput[] => Array.from({ length: count }, (_, i) => frame(from + i))
  await store.append('S', 's', batch(1, 5))
  await store.append('S', 's', batch(6, 5))
  await store.append('S', 's', [{ data: 'marker', event: 'gateway-gap' }])
  const kept = await all(store, 'S', 's')
  t.same(seqs(kept), [5, 6, 7, 8, 9, 10, 11], 'the newest 7, the first batch trimmed inside')
  t.same(kept.slice(0, 6).map(e => e.frame?.toString()), ['data: 5\n', 'data: 6\n', 'data: 7\n', 'data: 8\n', 'data: 9\n', 'data: 10\n'], 'frames intact')
  t.same(kept.map(e => e.upstreamId), [undefined, undefined, undefined, 'u8', undefined, undefined, undefined], 'upstream ids at their positions')
  t.equal(kept[6]?.data, 'marker', 'a text event among frame batches')
  t.equal(store.totalBytes, kept.reduce((sum, e) => sum + bytesOf(e), 0), 'bytes accounted per event, also after trimming inside a batch')
  const page = await store.read('S', 's', 5, 3)
  t.same(seqs(page?.events ?? []), [6, 7, 8], 'a page starting inside a batch, cut at the limit')
  t.same(seqs((await store.read('S', 's', 9, 100))?.events ?? []), [10, 11], 'a page across the last frame batch into a text batch')
  t.same(seqs((await store.read('S', 's', 1, 100))?.events ?? []), [5, 6, 7, 8, 9, 10, 11], 'a resume before the window starts at its first event')
})

t.test('a batch of upstream frames: its buffer is kept when at least half full, its room counted; copied to its size when mostly empty', async (t) => {
  const { store } = makeStore(t, { maxBytes: 10_000_000, retention: { ...ROOMY, maxEvents: 100 } })
  await store.createSession('S', 'p')
  const frames = (count: number, size: number): EventInput[] => Array.from({ length: count }, (_, i) => ({ frame: Buffer.from(`data: ${String(i).padStart(size - 7, '0')}\n`) }))
  // 9 frames of 512 bytes: 4.5 KB in the builder's 8 KB buffer, kept as it is.
  const half = EventBatch.from(frames(9, 512))
  t.equal(half.bytes.buffer.byteLength, 8192, 'the batch\'s buffer')
  await store.append('S', 'half', half)
  const kept = await all(store, 'S', 'half')
  t.equal(kept.length, 9)
  t.ok(kept.every(e => e.frame?.buffer === half.bytes.buffer), 'the events are views of the batch\'s own buffer: no copy')
  t.equal(store.totalBytes, 8192, 'the whole buffer is counted: the events and the room they leave')
  // 3 frames of 2 KB in an 8 KB buffer (the builder sized for more): copied.
  const sparse = EventBatch.from(frames(3, 2048))
  const room = Buffer.allocUnsafeSlow(4 * sparse.bytes.length)
  sparse.bytes.copy(room)
  const mostlyEmpty = new EventBatch(room.subarray(0, sparse.bytes.length), sparse.layout, '')
  await store.append('S', 'sparse', mostlyEmpty)
  const copied = await all(store, 'S', 'sparse')
  t.ok(copied.every(e => e.frame !== undefined && e.frame.buffer !== room.buffer && e.frame.buffer.byteLength === 3 * 2048), 'copied into a buffer of the batch\'s size')
  t.same([...kept, ...copied].map(e => e.frame?.toString()), [...frames(9, 512), ...frames(3, 2048)].map(e => e.frame?.toString()), 'every frame intact')
  t.equal(store.totalBytes, 8192 + 3 * 2048, 'a copy counts its events alone')
  // Trimming inside a kept batch frees its events' bytes; its room goes with its last event.
  const one = makeStore(t, { maxBytes: 10_000_000, retention: { ...ROOMY, maxEvents: 1 } })
  await one.store.createSession('T', 'p')
  await one.store.append('T', 's', EventBatch.from(frames(9, 512)))
  t.same(seqs(await all(one.store, 'T', 's')), [9], 'trimmed to the newest event')
  t.equal(one.store.totalBytes, 512 + 8192 - 9 * 512, 'which carries the buffer\'s room: the buffer is still held')
  await one.store.append('T', 's', EventBatch.from(frames(1, 100)))
  t.same(seqs(await all(one.store, 'T', 's')), [10])
  t.equal(one.store.totalBytes, 100, 'the batch gone, its room with it')
})

t.test('records weigh against the cap: a flood of sessions evicts the least recently used, which are gone like expired ones', async (t) => {
  const cap = 20 * RECORD_BYTES.session
  const { store, advance } = makeStore(t, { maxBytes: cap, recordBytes: RECORD_BYTES })
  const start = await store.intactSince()
  await store.createSession('keep', 'p')
  for (let i = 0; i < 100; i++) {
    advance(1)
    await store.createSession(`s${i}`, 'p')
    if (i % 10 === 0) await store.getSession('keep')
  }
  t.ok(store.heldBytes <= cap, `held within the cap (${store.heldBytes} of ${cap} bytes)`)
  t.equal(store.sessionCount, 20, 'as many sessions as their records fit')
  t.not(await store.getSession('keep'), null, 'a session in use stays')
  t.equal(await store.getSession('s0'), null, 'the least recently used went first')
  t.not(await store.getSession('s99'), null, 'the newest is there')
  t.ok(start > 0, 'before: intact since the store started')
  t.equal(await store.intactSince(), 0, 'after an eviction the store claims no loss: a flood does not make evicted sessions recoverable by whoever comes back with their id')
})

t.test('recipes weigh against the cap: what sessions keep to be established again is counted, and given back with them', async (t) => {
  const weights = { session: 100, stream: 100 }
  const { store } = makeStore(t, { maxBytes: 100_000, recordBytes: weights })
  const initialize = JSON.stringify({ method: 'initialize', params: { clientInfo: { name: 'n'.repeat(10_000) } } })
  await store.createSession('a', 'p', { recipe: { initialize, initializeResult: '{"v":1}' } })
  t.equal(store.heldBytes, 100 + initialize.length + 7, 'the record, its initialize and the promised result')
  await store.recordSessionState('a', { kind: 'subscribe', uri: 'file:///é' })
  await store.recordSessionState('a', { kind: 'log_level', request: '{"level":"debug"}' })
  t.equal(store.heldBytes, 100 + initialize.length + 7 + Buffer.byteLength('file:///é') + 17, 'subscriptions and the level too')
  await store.recordSessionState('a', { kind: 'unsubscribe', uri: 'file:///é' })
  t.equal(store.heldBytes, 100 + initialize.length + 7 + 17, 'an unsubscribe gives its bytes back')
  for (let i = 0; i < 20; i++) await store.createSession(`s${i}`, 'p', { recipe: { initialize, initializeResult: '{}' } })
  t.ok(store.heldBytes <= 100_000, `a flood of large recipes stays within the cap (${store.heldBytes})`)
  t.ok(store.sessionCount < 21, `by evicting sessions (${store.sessionCount} kept)`)
  const before = store.heldBytes
  await store.deleteSession('s19')
  t.equal(store.heldBytes, before - 100 - initialize.length - 2, 'a session dropped gives its recipe\'s bytes back')
})

t.test('under the cap a finished answer\'s stream goes altogether, an open stream keeps its record', async (t) => {
  const { store } = makeStore(t, { maxBytes: 2048, recordBytes: { session: 100, stream: 100 } })
  await store.createSession('S', 'p')
  await store.append('S', 'done', [ev(500)], { end: true })
  await store.append('S', 'open', [ev(500)])
  t.equal(store.heldBytes, 100 + 2 * 100 + 1000, 'records and events counted')
  await store.append('S', 'idle', [ev(500)])
  await store.append('S', 'new', [ev(500)])
  t.equal(await store.state('S', 'done'), null, 'the finished answer, least recently appended, is gone with its record')
  t.equal((await store.state('S', 'open'))?.lastSeq, 1, 'the open stream is next in line but the cap was met first')
  await store.append('S', 'newer', [ev(500)])
  const open = await store.state('S', 'open')
  t.same(open && { lastSeq: open.lastSeq, firstSeq: open.firstSeq }, { lastSeq: 1, firstSeq: 2 }, 'an open stream loses its events, never its record (a resume is told of the gap)')
  t.ok(store.heldBytes <= 2048, `within the cap (${store.heldBytes})`)
})

t.test('a stream larger than the cap trims itself: no other session is evicted for it', async (t) => {
  const cap = 8 * 1024
  const { store, advance } = makeStore(t, { maxBytes: cap, recordBytes: RECORD_BYTES, retention: { ...ROOMY, maxBytes: 1 << 20 } })
  for (const id of ['a', 'b', 'c']) {
    await store.createSession(id, 'p')
    await store.append(id, 's', [ev(100)])
  }
  const since = await store.intactSince()
  advance(1000) // an eviction now would show in intactSince
  await store.createSession('big', 'p')
  for (let i = 0; i < 5; i++) await store.append('big', 's', [ev(1500), ev(1500)])
  t.ok(store.heldBytes <= cap, `within the cap (${store.heldBytes})`)
  t.equal(store.sessionCount, 4, 'every session is still there')
  t.equal(await store.intactSince(), since, 'nothing lost: intactSince stays')
  const big = await store.state('big', 's')
  t.equal(big?.lastSeq, 10, 'the big stream numbered on')
  t.ok(big !== null && big.lastSeq - big.firstSeq + 1 < 10, 'and kept only its newest events')
})

t.test('a batch whose buffer the store keeps as it is is retained: its builder never packs into it again', async (t) => {
  const { store } = makeStore(t, { maxBytes: 1_000_000 })
  await store.createSession('S', 'p')
  // Exactly 4 KiB: the builder's buffer is full, so the store keeps it rather than a copy.
  const frameOf = (fill: string): Buffer => Buffer.from('data: ' + fill.repeat(4089) + '\n')
  const builder = new EventBatchBuilder()
  const first = frameOf('a')
  builder.addFrame(first, 0, first.length)
  const kept = builder.take()
  await store.appendBatch('S', 's', kept)
  // The stream is busy: the next events wait when the append comes back.
  const second = frameOf('b')
  builder.addFrame(second, 0, second.length)
  builder.recycle(kept)
  await store.appendBatch('S', 's', builder.take())
  const third = frameOf('c')
  builder.addFrame(third, 0, third.length)
  await store.appendBatch('S', 's', builder.take())
  const frames = (await all(store, 'S', 's')).map(e => e.frame?.toString())
  t.same(frames, [first.toString(), second.toString(), third.toString()], 'every stored event as it was appended')
})

t.test('tiny events appended one at a time: what each append\'s segment holds counts against the cap', async (t) => {
  // An upstream sending 7-byte events, each read on its own (one append, one segment each).
  const cap = 200_000
  const { store } = makeStore(t, { maxBytes: cap, segmentBytes: SEGMENT_WEIGHTS })
  await store.createSession('S', 'p')
  const tiny = EventBatch.from([{ frame: Buffer.from('data:x\n'), upstreamId: '1234' }])
  for (let i = 0; i < 10_000; i++) await store.appendBatch('S', 's', tiny)
  const kept = (await all(store, 'S', 's')).length
  const perAppend = 7 + 4 + SEGMENT_WEIGHTS.segment + SEGMENT_WEIGHTS.offset + SEGMENT_WEIGHTS.upstreamId
  t.ok(store.totalBytes <= cap, `within the cap (${store.totalBytes} bytes counted)`)
  t.equal(kept, Math.floor(cap / perAppend), `${kept} events kept: the cap over ${perAppend} bytes an append, not over the 11 bytes of the event alone`)
})
