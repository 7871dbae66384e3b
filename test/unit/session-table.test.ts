// The memory store's sessions (src/store/memory/session-table.ts): expiry on
// the store's clock, lazily on access and by the sweep, the order they were
// used in, and a release for every session dropped.
import t, { type Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { type MemorySession, SessionTable } from '../../src/store/memory/session-table.js'

const RETENTION = { maxEvents: 10, maxBytes: 1000, ttlMs: 1000 }

function makeTable (t: Test, sweepIntervalMs = 60_000): { table: SessionTable, dropped: string[], advance: (ms: number) => void } {
  let now = 0
  const dropped: string[] = []
  const table = new SessionTable({ retention: RETENTION, now: () => now, sweepIntervalMs, onDrop: s => dropped.push(s.id) })
  t.teardown(() => table.close())
  return { table, dropped, advance: ms => { now += ms } }
}

const ids = (table: SessionTable): string[] => [...table].map(([id]) => id)
const record = { epoch: 'e', principal: 'p', upstreamSessionId: 'u' }

t.test('a session expires exactly at its TTL unless touched, and is released when dropped', async t => {
  const { table, dropped, advance } = makeTable(t)
  const a = table.add('A', record)
  table.add('B', record)
  advance(999)
  table.touch(a)
  t.same(ids(table), ['B', 'A'], 'touched: most recently used')
  advance(1)
  t.equal(table.live('B'), undefined, 'B expired at its TTL')
  t.same(dropped, ['B'], 'and was released')
  t.equal(table.live('A'), a, 'A was touched: still live')
  t.equal(table.size, 1)
  advance(999)
  t.equal(table.live('A'), undefined)
  table.drop('A')
  t.same(dropped, ['B', 'A'], 'a session is released once')
})

t.test('the sweep drops expired sessions nobody asks for', async t => {
  const { table, dropped, advance } = makeTable(t, 5)
  table.add('A', record)
  const b: MemorySession = table.add('B', record)
  advance(500)
  table.touch(b)
  advance(500)
  await sleep(30)
  t.same(dropped, ['A'])
  t.same(ids(table), ['B'])
})

t.test('closing forgets every session without releasing them', async t => {
  const { table, dropped } = makeTable(t)
  table.add('A', record)
  table.close()
  t.equal(table.size, 0)
  t.same(dropped, [])
})
