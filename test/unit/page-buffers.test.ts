// The buffers framed pages are lent from (src/sse/page-buffers.ts): reused
// once given back, bounded, and a page given back while not on loan is
// refused, since reusing it would frame over bytes a socket still holds.
import t from 'tap'
import { PAGE_POOL_MAX_BYTES, PAGE_POOLED_MAX_BYTES, PAGE_POOLED_MIN_BYTES, PageBuffers, PageOwnershipError } from '../../src/sse/page-buffers.js'

t.test('a page given back is the memory of the next page of its size', async t => {
  const pages = new PageBuffers()
  const first = pages.take(40_000)
  t.equal(first.length, 40_000, 'exactly the size asked')
  t.ok(pages.pooled(first), 'lent')
  const second = pages.take(40_000)
  t.not(second.buffer, first.buffer, 'a page on loan is never lent twice')
  pages.give(first)
  t.equal(pages.freeBytes, 64 * 1024, 'kept, in a 64 KB buffer')
  t.notOk(pages.pooled(first), 'no longer on loan')
  const third = pages.take(60_000)
  t.equal(third.buffer, first.buffer, 'the same memory, for a page of the same size class')
  t.equal(pages.freeBytes, 0, 'taken out of the free bytes')
  const larger = pages.take(100_000)
  t.not(larger.buffer, second.buffer, 'a larger class is its own')
  t.equal(larger.buffer.byteLength, 128 * 1024, 'rounded up to a power of two')
})

t.test('pages the pool does not keep: small ones from Node\'s pool, huge ones alone', async t => {
  const pages = new PageBuffers()
  const small = pages.take(PAGE_POOLED_MIN_BYTES - 1)
  const huge = pages.take(PAGE_POOLED_MAX_BYTES + 1)
  t.equal(small.length, PAGE_POOLED_MIN_BYTES - 1)
  t.equal(huge.length, PAGE_POOLED_MAX_BYTES + 1)
  t.notOk(pages.pooled(small), 'not lent')
  t.notOk(pages.pooled(huge), 'not lent')
  pages.give(small)
  pages.give(huge)
  pages.give(small)
  t.equal(pages.freeBytes, 0, 'given back, let go')
})

t.test('breaking the ownership rule is caught: a page given back twice, or never lent', async t => {
  const pages = new PageBuffers()
  const page = pages.take(50_000)
  pages.give(page)
  t.throws(() => { pages.give(page) }, PageOwnershipError, 'given back twice')
  t.throws(() => { pages.give(Buffer.allocUnsafeSlow(50_000)) }, PageOwnershipError, 'a buffer of a pooled size that was never lent')
  t.equal(pages.freeBytes, 64 * 1024, 'the free list holds the page once')
  const a = pages.take(50_000)
  const b = pages.take(50_000)
  t.not(a.buffer, b.buffer, 'so two pages never share memory')
})

t.test('the free pages stay within PAGE_POOL_MAX_BYTES', async t => {
  const pages = new PageBuffers()
  const lent = Array.from({ length: 2 * PAGE_POOL_MAX_BYTES / PAGE_POOLED_MAX_BYTES + 1 }, () => pages.take(PAGE_POOLED_MAX_BYTES))
  for (const page of lent) pages.give(page)
  t.equal(pages.freeBytes, PAGE_POOL_MAX_BYTES, 'as many as fit, the rest let go')
  for (let i = 0; i < lent.length; i++) pages.take(PAGE_POOLED_MAX_BYTES)
  t.equal(pages.freeBytes, 0, 'all reused before any new one is made')
})
