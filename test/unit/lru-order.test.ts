// The recency order under the memory store's byte cap
// (src/store/memory/lru-order.ts): oldest first, a touch moves a key to the
// end, and the cap may delete keys while it walks.
import t from 'tap'
import fc from 'fast-check'
import { LruOrder } from '../../src/store/memory/lru-order.js'

const keys = (order: LruOrder<string, number>): string[] => [...order].map(([key]) => key)

t.test('keys come oldest first; a touch moves a key to the newest end', async t => {
  const order = new LruOrder<string, number>()
  order.touch('a', 1)
  order.touch('b', 2)
  order.touch('c', 3)
  t.same(keys(order), ['a', 'b', 'c'])
  order.touch('a', 10)
  t.same(keys(order), ['b', 'c', 'a'], 'a touched: newest')
  t.equal(order.get('a'), 10, 'the touch set its value')
  t.equal(order.size, 3)
  t.equal(order.delete('c'), true)
  t.equal(order.delete('c'), false, 'deleting a missing key says so')
  t.equal(order.get('c'), undefined)
  t.same(keys(order), ['b', 'a'])
  order.clear()
  t.equal(order.size, 0)
  t.same(keys(order), [])
})

t.test('deleting during a walk: the current key goes on, a key not reached yet is skipped', async t => {
  const order = new LruOrder<string, number>()
  for (const [i, key] of ['a', 'b', 'c', 'd'].entries()) order.touch(key, i)
  const seen: string[] = []
  for (const [key] of order) {
    seen.push(key)
    order.delete(key)
    if (key === 'b') order.delete('c')
  }
  t.same(seen, ['a', 'b', 'd'])
  t.equal(order.size, 0)
})

t.test('matches a list model under any touches and deletes', async t => {
  const op = fc.tuple(fc.boolean(), fc.constantFrom('a', 'b', 'c', 'd', 'e'), fc.integer())
  fc.assert(fc.property(fc.array(op, { maxLength: 40 }), ops => {
    const order = new LruOrder<string, number>()
    let model: Array<[string, number]> = []
    for (const [touch, key, value] of ops) {
      model = model.filter(([k]) => k !== key)
      if (touch) {
        model.push([key, value])
        order.touch(key, value)
      } else {
        order.delete(key)
      }
    }
    t.same([...order], model)
    t.equal(order.size, model.length)
  }))
})
