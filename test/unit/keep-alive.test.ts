// Keep-alive comments (src/sse/keep-alive.ts, src/sse/client-stream.ts), over
// a real socket: one ticker for every stream; a stream that wrote nothing for
// an interval gets a comment, one that carries events gets none, and a stream
// with bytes still waiting for its client gets nothing added.
import t from 'tap'
import http from 'node:http'
import { once } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import { serveClientStream } from '../fixtures/client-stream-app.js'
import { KeepAliveTicker, TICKS_PER_INTERVAL } from '../../src/sse/keep-alive.js'
import { EventBatch } from '../../src/store/batch/event-batch.js'
import { NumberedBatch } from '../../src/store/batch/numbered-batch.js'
import type { ClientStream } from '../../src/sse/client-stream.js'

const COMMENT = ': keep-alive\n\n'
/** A ticker whose own timer never fires within a test: the test ticks it. */
const manualTicker = (): KeepAliveTicker => new KeepAliveTicker(3_600_000)
const write = (stream: ClientStream, seq: number, text: string): boolean =>
  stream.writeEvents(new NumberedBatch(EventBatch.from([{ frame: Buffer.from(`data: ${text}\n`) }]), seq))

t.test('a stream silent for an interval gets a comment; one that wrote since does not', async t => {
  const ticker = manualTicker()
  t.teardown(() => ticker.stop())
  const sizes: number[] = []
  const { url } = await serveClientStream(t, { kind: 'standalone', epoch: 'ep', maxBufferBytes: 1 << 20, keepAlive: ticker }, async (stream) => {
    sizes.push(ticker.size)
    stream.open({}, 0)
    sizes.push(ticker.size)
    // A pause after each step: a write has left for the client before the next tick looks.
    const ticks = async (n: number): Promise<void> => {
      for (let i = 0; i < n; i++) ticker.tick()
      await sleep(20)
    }
    await ticks(TICKS_PER_INTERVAL - 1) // silent, but not yet for an interval: nothing
    await ticks(1) // silent since it opened, an interval ago: a comment
    await ticks(TICKS_PER_INTERVAL / 2)
    write(stream, 1, 'one')
    await ticks(TICKS_PER_INTERVAL - 1) // the event was less than an interval ago: nothing
    await ticks(1) // a comment
    await ticks(TICKS_PER_INTERVAL - 1) // the comment counts as a write: nothing
    write(stream, 2, 'two')
    await ticks(TICKS_PER_INTERVAL - 1) // nothing
    stream.end('completed')
    sizes.push(ticker.size)
  })
  const body = await (await fetch(url)).text()
  t.equal(body, `${COMMENT}data: one\nid: ep.s.1\n\n${COMMENT}data: two\nid: ep.s.2\n\n`, 'a comment only after an interval of silence')
  t.same(sizes, [0, 1, 0], 'kept alive from its head on, and let go when it closes')
})

t.test('a stream with bytes still waiting for its client gets no comment', async t => {
  const ticker = manualTicker()
  t.teardown(() => ticker.stop())
  const big = 'x'.repeat(32 << 20)
  let waiting = -1
  const { url } = await serveClientStream(t, { kind: 'standalone', epoch: 'ep', maxBufferBytes: 64 << 20, keepAlive: ticker }, (stream, request) => {
    stream.open({}, 0)
    // 32 MiB cannot all leave at once; the client has not started reading.
    write(stream, 1, big)
    waiting = request.raw.socket.writableLength
    // An interval later, its bytes are still waiting: nothing is added.
    for (let i = 0; i < TICKS_PER_INTERVAL; i++) ticker.tick()
    stream.end('completed')
  })
  const body = await (await fetch(url)).text()
  t.ok(waiting > 0, `bytes were waiting when the ticker looked (${waiting})`)
  t.equal(body, `data: ${big}\nid: ep.s.1\n\n`, 'the event alone')
})

t.test('a stream its client closes is let go', async t => {
  const ticker = manualTicker()
  t.teardown(() => ticker.stop())
  let opened!: () => void
  const open = new Promise<void>(resolve => { opened = resolve })
  const { url } = await serveClientStream(t, { kind: 'standalone', epoch: 'ep', maxBufferBytes: 1 << 20, keepAlive: ticker }, (stream) => {
    stream.open({}, 0)
    opened()
  })
  // node:http rather than fetch: undici's pool would keep the server from closing for its keep-alive timeout.
  const req = http.get(url, { agent: false })
  await once(req, 'response')
  await open
  t.equal(ticker.size, 1, 'kept alive while open')
  req.destroy()
  for (let i = 0; i < 100 && ticker.size > 0; i++) await sleep(20)
  t.equal(ticker.size, 0, 'let go once the client is gone')
})

t.test('the ticker ticks TICKS_PER_INTERVAL times an interval by itself, until stopped', async t => {
  const ticker = new KeepAliveTicker(50 * TICKS_PER_INTERVAL)
  const seen: number[] = []
  ticker.add({ keepAliveTick: (now) => { seen.push(now) } })
  await sleep(290)
  const ticks = seen.length
  t.ok(ticks >= 3 && ticks <= 6, `about every 50 ms (${ticks} ticks in 290 ms)`)
  t.same(seen, Array.from({ length: ticks }, (_, i) => i + 1), 'counting up from 1')
  t.equal(ticker.now, ticks, 'now is the last tick')
  ticker.stop()
  const stopped = seen.length
  await sleep(150)
  t.equal(seen.length, stopped, 'no tick after stop()')
  t.equal(ticker.size, 0, 'and it holds no stream')
})
