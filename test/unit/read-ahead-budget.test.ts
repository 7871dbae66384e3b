// Each gateway has its own read-ahead budget: streams waiting in one gateway
// do not shrink what another gateway in the same process lets its streams read.
import t from 'tap'
import { READ_AHEAD_BUDGET_BYTES, READ_AHEAD_BYTES, READ_AHEAD_MAX_BYTES, ReadAheadBudget } from '../../src/recording/read-ahead.js'

t.test('two budgets share nothing', async t => {
  const busy = new ReadAheadBudget()
  const quiet = new ReadAheadBudget()
  for (let i = 0; i < 100; i++) busy.enter()
  t.equal(busy.limit(), READ_AHEAD_BYTES, '100 streams waiting in one gateway: each gets the floor')
  t.equal(quiet.limit(), READ_AHEAD_MAX_BYTES, 'a stream of another gateway still gets the most')
  for (let i = 0; i < 92; i++) busy.leave()
  t.equal(busy.limit(), Math.min(READ_AHEAD_MAX_BYTES, READ_AHEAD_BUDGET_BYTES / 8), '8 left: a share of the budget')
})
