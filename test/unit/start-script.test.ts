// How the benchmark and the packaging tests read `npm start` (scripts/start-script.mjs).
import t from 'tap'
import { parseStartScript } from '../../scripts/start-script.mjs'

t.test('the environment, node flags and script of a start script', async t => {
  t.same(parseStartScript('A=1 B=x=y node --f --g=2 dist/src/main.js'), { env: { A: '1', B: 'x=y' }, flags: ['--f', '--g=2'], main: 'dist/src/main.js' })
  t.same(parseStartScript('node dist/src/main.js'), { env: {}, flags: [], main: 'dist/src/main.js' })
})

t.test('a start script it cannot read is refused, not guessed at', async t => {
  t.throws(() => parseStartScript('tsx src/main.ts'), /does not run node/)
  t.throws(() => parseStartScript('export A=1 node x.js'), /NAME=value before node, not export/)
  t.throws(() => parseStartScript('node --inspect'), /names no script/)
})
