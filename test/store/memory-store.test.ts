import t from 'tap'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import { storeContract } from '../fixtures/store-contract.js'

storeContract(t, 'memory', async (_t, retention) => {
  // A fake clock: the TTL test moves time instead of sleeping.
  let now = Date.UTC(2025, 0, 1)
  const store = new MemoryEventStore({ retention, maxBytes: 64 * 1024 * 1024, now: () => now })
  return {
    store,
    advance: (ms: number) => { now += ms },
    lose: async (id: string) => {
      await store.deleteSession(id)
      now += retention.ttlMs + 1
    }
  }
})

t.test('memory: intact since the process made it (what a restart lost came before)', async (t) => {
  let now = Date.UTC(2026, 0, 1)
  const store = new MemoryEventStore({ retention: { maxEvents: 10, maxBytes: 1 << 20, ttlMs: 60_000 }, maxBytes: 1 << 20, now: () => now })
  t.teardown(() => store.close())
  now += 5000
  t.equal(await store.intactSince(), Date.UTC(2026, 0, 1), 'its construction time, not the time asked')
})
