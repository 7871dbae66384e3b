// Child loggers made on their first line (src/lazy-logger.ts): what they
// write is what pino's own children write, and a child that writes nothing
// (most request and stream loggers) never becomes a pino child.
import t from 'tap'
import pino from 'pino'
import { Writable } from 'node:stream'
import type { FastifyBaseLogger } from 'fastify'
import { LazyChildLogger } from '../../src/lazy-logger.js'

function capture (level = 'info'): { root: FastifyBaseLogger, lines: Array<Record<string, unknown>>, children: () => number } {
  const lines: Array<Record<string, unknown>> = []
  const sink = new Writable({
    write (chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>)
      done()
    }
  })
  const root = pino({ level, base: undefined, timestamp: false }, sink)
  // Count the pino children made (a pino child inherits `child` from its parent: all are counted).
  let made = 0
  const child = root.child
  root.child = function (this: typeof root, ...args: Parameters<typeof child>) {
    made++
    return child.apply(this, args)
  } as typeof child
  return { root, lines, children: () => made }
}

const flush = async (): Promise<void> => await new Promise(resolve => setImmediate(resolve))

t.test('nothing logged: no pino child is made', async t => {
  const { root, children } = capture()
  const request = LazyChildLogger.factory(root, { reqId: 'r1' }, {})
  const stream = request.child({ sessionHash: 'abc', streamId: '_' })
  stream.debug('below the level')
  stream.trace({ x: 1 }, 'below the level')
  t.equal(children(), 0, 'a line at a disabled level makes nothing')
  t.equal((stream as LazyChildLogger).materialized, false)
  t.equal(stream.level, 'info', 'the level is the parent\'s')
})

t.test('the first line makes the child: bindings of every ancestor, as pino writes them', async t => {
  const { root, lines, children } = capture()
  const request = LazyChildLogger.factory(root, { reqId: 'r1' }, {})
  const stream = request.child({ sessionHash: 'abc', streamId: '_' })
  stream.warn({ n: 1 }, 'first')
  stream.info('second %s', 'line')
  request.error('from the request')
  await flush()
  t.equal(children(), 2, 'two pino children: the request\'s, and the stream\'s of it')
  t.match(lines, [
    { level: 40, reqId: 'r1', sessionHash: 'abc', streamId: '_', n: 1, msg: 'first' },
    { level: 30, reqId: 'r1', sessionHash: 'abc', streamId: '_', msg: 'second line' },
    { level: 50, reqId: 'r1', msg: 'from the request' }
  ])
  t.notOk('sessionHash' in (lines[2] ?? {}), 'the request\'s line has only its own bindings')
  t.equal((stream as LazyChildLogger).materialized, true)
})

t.test('levels: set on a lazy child, it applies to that child only; silent writes nothing', async t => {
  const { root, lines } = capture()
  const quiet = LazyChildLogger.factory(root, { reqId: 'q' }, {})
  const loud = LazyChildLogger.factory(root, { reqId: 'l' }, {})
  loud.level = 'debug'
  loud.debug('shown')
  quiet.debug('hidden')
  quiet.silent('never')
  await flush()
  t.same(lines.map(l => l.msg), ['shown'])
  t.equal(quiet.level, 'info')
  t.equal(loud.level, 'debug')
  t.equal((quiet as LazyChildLogger).isLevelEnabled('debug'), false)
  t.equal((loud as LazyChildLogger).isLevelEnabled('debug'), true)
})

t.test('options given to the factory (a route\'s level) reach the child', async t => {
  const { root, lines } = capture()
  const routed = LazyChildLogger.factory(root, { reqId: 'o' }, { level: 'debug' })
  routed.debug('route level')
  await flush()
  t.same(lines.map(l => l.msg), ['route level'])
})
