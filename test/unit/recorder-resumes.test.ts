// An upstream answer resumed upstream again and again (SEP-1699 polling: the
// upstream ends every GET after an event, and the gateway resumes it with
// Last-Event-ID) is read on under the recording's one promise
// (src/recording/recorder.ts). Resumes that each awaited a recording of their
// own kept every resume's promise and frame until the stream ended, which a
// standalone stream never does while its session lives. Real recorder and
// embedded store; the upstream's answers are streams made here.
import t from 'tap'
import { createHook } from 'node:async_hooks'
import { PassThrough, type Readable } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import pino from 'pino'
import { recordUpstreamStream } from '../../src/recording/recorder.js'
import { ReadAheadBudget } from '../../src/recording/read-ahead.js'
import { GatewayMetrics } from '../../src/metrics/metrics.js'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import { STANDALONE_STREAM } from '../../src/store/contract.js'

/** Promises made and not yet settled in this process, from now on. */
function pendingPromises (): { count: () => number, stop: () => void } {
  const pending = new Set<number>()
  const hook = createHook({
    init (id, type) { if (type === 'PROMISE') pending.add(id) },
    promiseResolve (id) { pending.delete(id) },
    destroy (id) { pending.delete(id) }
  }).enable()
  return { count: () => pending.size, stop: () => { hook.disable() } }
}

t.test('a standalone stream resumed upstream 30 times holds no more promises than after 5', async t => {
  const store = new MemoryEventStore({ retention: { maxEvents: 1000, maxBytes: 1 << 20, ttlMs: 60_000 }, maxBytes: 1 << 24 })
  await store.createSession('S', 'p')
  let answers = 0
  /** One upstream answer: an event with an id, then its end (the upstream polls). */
  const answer = (): Readable => {
    const n = ++answers
    const body = new PassThrough()
    body.end(`id: up-${n}\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"n":${n}}}\n\n`)
    return body
  }
  /** The upstream refuses the resume after this many answers: the recording concludes. */
  const stopAt = 30
  const recording = recordUpstreamStream({
    store,
    metrics: new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false }),
    log: pino({ level: 'silent' }),
    sessionId: 'S',
    streamId: STANDALONE_STREAM,
    body: answer(),
    maxEventBytes: 1 << 20,
    readAhead: new ReadAheadBudget(),
    endStreamOnFinish: false,
    resumeBounds: { withoutProgress: 10, maxMs: 3_600_000 },
    // Refused once enough answers were read: the recording concludes.
    resumeUpstream: async () => answers >= stopAt ? undefined : answer()
  })
  const until = async (n: number): Promise<void> => {
    for (let i = 0; i < 200; i++) {
      if (answers >= n) return
      await sleep(25)
    }
  }
  await until(5)
  await sleep(20)
  const tracked = pendingPromises()
  t.teardown(tracked.stop)
  const at5 = tracked.count()
  await until(30)
  await sleep(20)
  const at30 = tracked.count()
  t.equal(answers, 30, 'the upstream was asked 30 times')
  t.ok(at30 - at5 < 10, `25 more resumes leave at most a few more promises pending (after 5: ${at5}, after 30: ${at30})`)
  t.equal(await recording, 'completed', 'and the recording concludes once the upstream refuses')
  t.equal((await store.state('S', STANDALONE_STREAM))?.lastSeq, 30, 'with every answer\'s event recorded')
})
