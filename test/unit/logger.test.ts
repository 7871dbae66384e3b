// The gateway's logger (src/logger.ts): level names and ISO times, repeats
// of a warning counted instead of written, no stack below error level,
// credentials redacted, and console output of libraries routed into it.
import t from 'tap'
import { Writable } from 'node:stream'
import { createLogger, routeConsoleTo } from '../../src/logger.js'

function capture (options: { level?: string, clock?: { now: number }, windowMs?: number } = {}): { log: ReturnType<typeof createLogger>, lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = []
  const destination = new Writable({
    write (chunk: Buffer, _enc, done) {
      for (const line of chunk.toString().split('\n')) if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>)
      done()
    }
  })
  const clock = options.clock
  const log = createLogger(options.level ?? 'info', { destination, repeatWindowMs: options.windowMs ?? 1000, ...(clock !== undefined && { now: () => clock.now }) })
  return { log, lines }
}

const flush = async (): Promise<void> => await new Promise(resolve => setImmediate(resolve))

t.test('level names and ISO time', async t => {
  const { log, lines } = capture()
  log.info({ a: 1 }, 'hello')
  log.child({ reqId: 'r' }).warn('child')
  await flush()
  t.match(lines, [{ level: 'info', a: 1, msg: 'hello' }, { level: 'warn', reqId: 'r', msg: 'child' }])
  t.match(String(lines[0]?.time), /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
})

t.test('a warning repeated within the window is counted, and the next one written says how many', async t => {
  const clock = { now: 0 }
  const { log, lines } = capture({ clock })
  const child = log.child({ sessionHash: 'x' })
  for (let i = 0; i < 5; i++) child.warn({ i }, 'store down')
  log.warn('another message')
  log.info('info lines are never held back')
  log.info('info lines are never held back')
  clock.now = 1500
  log.warn({ i: 99 }, 'store down')
  log.error('failed')
  log.error('failed')
  await flush()
  t.match(lines.map(l => [l.msg, l.i, l.repeated]), [
    ['store down', 0, undefined],
    ['another message', undefined, undefined],
    ['info lines are never held back', undefined, undefined],
    ['info lines are never held back', undefined, undefined],
    ['store down', 99, 4],
    ['failed', undefined, undefined]
  ])
})

t.test('the count of a repeated warning is written when its window ends, with no later line needed', async t => {
  const { log, lines } = capture({ windowMs: 150 })
  const child = log.child({ sessionHash: 'x' })
  const err = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' })
  for (let i = 0; i < 4; i++) child.warn({ i, err }, 'store down')
  child.warn({ i: 9 }, 'upstream down')
  await flush()
  t.same(lines.map(l => l.msg), ['store down', 'upstream down'], 'only the first of each within the window')
  await new Promise(resolve => setTimeout(resolve, 400))
  t.match(lines.slice(2), [
    { level: 'warn', msg: 'store down', sessionHash: 'x', i: 3, repeated: 3, err: { type: 'Error', code: 'ECONNREFUSED' } }
  ], 'the last one left out, with how many were, once the window ended')
  t.equal(lines.length, 3, 'nothing for a message that was not repeated')
  t.notOk('stack' in (lines[2]?.err as object), 'still without a stack')
  child.warn({ i: 10 }, 'store down')
  await flush()
  t.match(lines[3], { msg: 'store down', i: 10 }, 'the next one is written at once')
  t.notOk('repeated' in (lines[3] as object), 'without a count already written')
})

t.test('counts not yet written are written when the remembered messages overflow, and at shutdown', async t => {
  const { log, lines } = capture({ windowMs: 60_000 })
  log.warn({ i: 0 }, 'store down')
  log.warn({ i: 1 }, 'store down')
  log.warn({ i: 2 }, 'store down')
  // 1,000 other messages: the bound on what is remembered (messages are constants; this is a surprise).
  for (let m = 0; m < 1000; m++) log.warn(`message ${m}`)
  await flush()
  t.match(lines.filter(l => l.msg === 'store down'), [{ i: 0 }, { i: 2, repeated: 2 }], 'the overflow wrote the count it forgot')
  log.warn({ i: 3 }, 'upstream down')
  log.warn({ i: 4 }, 'upstream down')
  log.writeRepeats()
  await flush()
  t.match(lines.filter(l => l.msg === 'upstream down'), [{ i: 3 }, { i: 4, repeated: 1 }], 'writeRepeats wrote the window not ended yet')
  log.writeRepeats()
  await flush()
  t.equal(lines.filter(l => l.msg === 'upstream down').length, 2, 'and only once')
})

t.test('a window ended but not yet written, met by the overflow: its count is written once', async t => {
  const clock = { now: 0 }
  const { log, lines } = capture({ clock })
  log.warn({ i: 0 }, 'store down')
  log.warn({ i: 1 }, 'store down')
  log.warn({ i: 2 }, 'store down')
  for (let m = 0; m < 999; m++) log.warn(`message ${m}`)
  clock.now = 1500 // the window is over; its timer (real time) has not fired
  log.warn({ i: 3 }, 'store down')
  await flush()
  const written = lines.filter(l => l.msg === 'store down')
  t.equal(written.reduce((n, l) => n + 1 + (typeof l.repeated === 'number' ? l.repeated : 0), 0), 4, `4 lines counted in all (${JSON.stringify(written)})`)
  t.match(written.at(-1), { i: 3, repeated: 2 }, 'the count goes with the next line')
})

t.test('below error level an error carries its type, message and code, not its stack', async t => {
  const { log, lines } = capture({ level: 'debug' })
  const err = Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' })
  log.warn({ err }, 'expected')
  log.info({ err }, 'also expected')
  log.error({ err }, 'unexpected')
  log.debug({ err }, 'debugging')
  await flush()
  t.same(lines[0]?.err, { type: 'Error', message: 'connect ECONNREFUSED', code: 'ECONNREFUSED' })
  t.same(lines[1]?.err, { type: 'Error', message: 'connect ECONNREFUSED', code: 'ECONNREFUSED' })
  t.match(lines[2]?.err, { type: 'Error', stack: /at / }, 'an error keeps its stack')
  t.match(lines[3]?.err, { stack: /at / }, 'and debug lines too')
})

t.test('credentials in request headers are redacted', async t => {
  const { log, lines } = capture()
  log.info({ req: { headers: { authorization: 'Bearer s3cret', cookie: 'a=b', accept: '*/*' } } }, 'request')
  await flush()
  t.same(lines[0]?.req, { headers: { authorization: '[redacted]', cookie: '[redacted]', accept: '*/*' } })
})

t.test('console.warn and console.error of libraries become JSON lines', async t => {
  const { log, lines } = capture()
  const saved = { warn: console.warn, error: console.error }
  t.teardown(() => Object.assign(console, saved))
  routeConsoleTo(log)
  console.warn('[WARN] This Redis server\'s `default` user does not require a password, but a password was supplied')
  console.error('[ioredis] Unhandled error event:', 'Error: boom')
  await flush()
  t.match(lines, [
    { level: 'warn', source: 'console', msg: /does not require a password/ },
    { level: 'error', source: 'console', msg: '[ioredis] Unhandled error event: Error: boom' }
  ])
})
