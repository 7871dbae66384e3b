import t from 'tap'
import { SessionRateLimiter } from '../../src/routes/mcp/rate-limit.js'
import { SessionCache } from '../../src/routes/mcp/session-cache.js'

t.test('SessionCache: fresh, then stale, then gone', async (t) => {
  let now = 0
  const cache = new SessionCache({ freshMs: 100, staleMs: 1000, maxEntries: 10, now: () => now })
  const record = { epoch: 'e', principal: 'p', upstreamSessionId: 's' }
  cache.set('s', record)
  t.equal(cache.fresh('s'), record)
  now = 100
  t.equal(cache.fresh('s'), undefined, 'no longer fresh')
  t.equal(cache.stale('s'), record, 'still usable while the store fails')
  now = 1000
  t.equal(cache.stale('s'), undefined)
  cache.set('s', record)
  cache.delete('s')
  t.equal(cache.stale('s'), undefined, 'deleted')
})

t.test('SessionCache: bounded; the least recently verified go first, a check does not renew', async (t) => {
  const cache = new SessionCache({ freshMs: 100, staleMs: 1000, maxEntries: 2, now: () => 0 })
  const record = { epoch: 'e', principal: 'p', upstreamSessionId: 'u' }
  cache.set('a', record)
  cache.set('b', record)
  t.equal(cache.fresh('a'), record)
  cache.set('c', record)
  t.equal(cache.stale('a'), undefined, 'a was verified first, and reading it did not keep it')
  t.equal(cache.stale('b'), record)
  cache.set('b', record)
  cache.set('d', record)
  t.equal(cache.stale('c'), undefined, 'b verified again outlives c')
  t.equal(cache.stale('b'), record)
})

t.test('SessionRateLimiter: bursts of twice the rate, then the wait in seconds', async (t) => {
  let now = 0
  const limiter = new SessionRateLimiter({ ratePerSecond: 2, maxEntries: 10, now: () => now })
  for (let i = 0; i < 4; i++) t.equal(limiter.take('k'), 0, `burst ${i}`)
  t.equal(limiter.take('k'), 1, 'the burst is spent')
  now = 500
  t.equal(limiter.take('k'), 0, 'one token back after half a second')
  t.equal(limiter.take('k'), 1)
  t.equal(limiter.take('other'), 0, 'another key has its own bucket')
})

t.test('SessionRateLimiter: bounded; the least recently used bucket goes first', async (t) => {
  const limiter = new SessionRateLimiter({ ratePerSecond: 1, maxEntries: 2, now: () => 0 })
  limiter.take('a')
  limiter.take('a')
  t.equal(limiter.take('a'), 1, 'a is spent')
  limiter.take('b')
  limiter.take('a')
  limiter.take('c')
  t.equal(limiter.size, 2)
  t.equal(limiter.take('a'), 1, 'a, used after b, was kept (still spent)')
  t.equal(limiter.take('b'), 0, 'b was dropped: a fresh bucket')
})
