import t from 'tap'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import { storeContract } from '../fixtures/store-contract.js'

storeContract(t, 'memory', async (_t, retention) => {
  // A fake clock: the TTL test moves time instead of sleeping.
  let now = Date.UTC(2025, 0, 1)
  const store = new MemoryEventStore({ retention, maxBytes: 64 * 1024 * 1024, now: () => now })
  return { store, advance: (ms: number) => { now += ms } }
})
