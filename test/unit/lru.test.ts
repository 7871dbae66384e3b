// boundedLru (src/lru.ts): the same bound and eviction as lru-cache's `max`,
// with storage that grows with the entries held instead of being allocated
// for the whole bound up front.
import t from 'tap'
import { boundedLru } from '../../src/lru.js'

t.test('at most maxEntries; the least recently used go first', async t => {
  const cache = boundedLru<string, number>(3)
  cache.set('a', 1)
  cache.set('b', 2)
  cache.set('c', 3)
  t.equal(cache.get('a'), 1, 'a read makes a the most recent')
  cache.set('d', 4)
  t.equal(cache.size, 3)
  t.notOk(cache.has('b'), 'b, the least recent, went')
  t.same([...cache.keys()], ['d', 'a', 'c'], 'most recent first')
  for (let i = 0; i < 100; i++) cache.set(`k${i}`, i)
  t.equal(cache.size, 3, 'the bound holds through many sets')
  t.same([...cache.keys()], ['k99', 'k98', 'k97'])
})

t.test('slots freed by deletes are reused: the bound holds through churn', async t => {
  const cache = boundedLru<string, number>(2)
  for (let i = 0; i < 1000; i++) {
    cache.set(`x${i}`, i)
    if (i % 3 === 0) cache.delete(`x${i}`)
  }
  t.ok(cache.size <= 2)
  t.equal(cache.get('x998'), 998)
})

t.test('ttl keeps its meaning', async t => {
  const cache = boundedLru<string, number>(10, { ttl: 30 })
  cache.set('a', 1)
  t.equal(cache.get('a'), 1)
  await new Promise(resolve => setTimeout(resolve, 60))
  t.equal(cache.get('a'), undefined, 'expired after its ttl')
})

t.test('a large bound allocates nothing up front', async t => {
  // lru-cache's `max` of two million allocates two arrays of two million
  // slots (32 MB) before the first entry; here the storage follows the entries.
  const before = process.memoryUsage().heapUsed
  const cache = boundedLru<string, number>(2_000_000)
  const grown = process.memoryUsage().heapUsed - before
  t.ok(grown < 4_000_000, `heap grew by ${grown} bytes`)
  cache.set('a', 1)
  t.equal(cache.get('a'), 1)
})
