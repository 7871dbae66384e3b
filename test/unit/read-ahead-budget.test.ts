// Each gateway has its own read-ahead budget: streams waiting in one gateway
// do not shrink what another gateway in the same process lets its streams read.
import t from 'tap'
import { READ_AHEAD_BUDGET_BYTES, READ_AHEAD_BYTES, READ_AHEAD_MAX_BYTES, ReadAheadBudget, TURN_BYTES } from '../../src/recording/read-ahead.js'

t.test('two budgets share nothing', async t => {
  const busy = new ReadAheadBudget()
  const quiet = new ReadAheadBudget()
  for (let i = 0; i < 100; i++) busy.enter()
  t.equal(busy.limit(), READ_AHEAD_BYTES, '100 streams waiting in one gateway: each gets the floor')
  t.equal(quiet.limit(), READ_AHEAD_MAX_BYTES, 'a stream of another gateway still gets the most')
  for (let i = 0; i < 92; i++) busy.leave()
  t.equal(busy.limit(), Math.min(READ_AHEAD_MAX_BYTES, READ_AHEAD_BUDGET_BYTES / 8), '8 left: a share of the budget')
})

t.test('a flood that never lets every waiting stream through in one turn: the turn queue stays as large as the streams waiting', async t => {
  const budget = new ReadAheadBudget()
  // Ten streams, each reading half a turn when resumed, then waiting again at once.
  let turns = 0
  let mostSlots = 0
  let flooding = true
  const waiter = { resumeTurn: (): number => { if (flooding) budget.waitTurn(waiter); return TURN_BYTES / 2 } }
  for (let i = 0; i < 10; i++) budget.waitTurn(waiter)
  await new Promise<void>(resolve => {
    const check = (): void => {
      mostSlots = Math.max(mostSlots, budget.queueSlots)
      if (++turns < 5000) {
        setImmediate(check)
        return
      }
      // The flood ends: the streams read once more and stop waiting.
      flooding = false
      resolve()
    }
    setImmediate(check)
  })
  t.ok(mostSlots <= 2 * 1024 + 20, `at most twice the compaction's threshold (most: ${mostSlots} slots over ${turns} turns, two streams resumed a turn)`)
  for (let i = 0; i < 20 && budget.queueSlots > 0; i++) await new Promise(resolve => { setImmediate(resolve) })
  t.equal(budget.queueSlots, 0, 'and empty once the flood is over')
})
