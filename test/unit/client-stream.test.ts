// One client SSE connection (src/sse/client-stream.ts), over a real socket:
// a batch as the store took it (NumberedBatch, written without an object per
// event), or a read's page of batches, reaches the client byte for byte as its
// events written one by one do.
import http from 'node:http'
import t, { type Test } from 'tap'
import { serveClientStream } from '../fixtures/client-stream-app.js'
import { EventBatch } from '../../src/store/batch/event-batch.js'
import { NumberedBatch } from '../../src/store/batch/numbered-batch.js'
import type { EventInput } from '../../src/store/contract.js'

const BOM = '\uFEFF'
const frame = (text: string): EventInput => ({ frame: Buffer.from(text) })

interface Case {
  readonly events: readonly EventInput[]
  readonly firstSeq: number
  /** The client's position when the stream opens (events at or before it are not written). */
  readonly position: number
}

/** A gateway-shaped app whose GET /?case=N&as=batch|events writes case N's events, then ends. */
async function serve (t: Test, cases: readonly Case[]): Promise<{ body: (n: number, as: 'batch' | 'events' | 'page') => Promise<string>, delivered: () => Promise<number> }> {
  const { url, metrics } = await serveClientStream(t, { kind: 'standalone', epoch: 'ep', maxBufferBytes: 1 << 20 }, (stream, request) => {
    const { case: n, as } = request.query as { case: string, as: string }
    const c = cases[Number(n)] as Case
    stream.open({}, c.position)
    const numbered = new NumberedBatch(EventBatch.from(c.events), c.firstSeq)
    if (as === 'page') {
      // A read's page: the events in batches of two (the last may be one), written at once.
      const page: NumberedBatch[] = []
      for (let i = 0; i < c.events.length; i += 2) page.push(new NumberedBatch(EventBatch.from(c.events.slice(i, i + 2)), c.firstSeq + i))
      t.ok(stream.writeBatches(page, true), 'written')
    } else {
      t.ok(stream.writeEvents(as === 'batch' ? numbered : numbered.events), 'written')
    }
    t.equal(stream.lastSeq, Math.max(c.position, numbered.lastSeq), 'lastSeq is the batch\'s last')
    stream.end('completed')
  })
  return {
    body: async (n, as) => await (await fetch(`${url}/?case=${n}&as=${as}`)).text(),
    delivered: async () => (await metrics.eventsDelivered.get()).values[0]?.value ?? 0
  }
}

t.test('a batch of upstream frames is written as its events are, ids in base 36', async t => {
  const frames = Array.from({ length: 10 }, (_, i) => frame(`data: {"i":${i}}\n`))
  const cases: Case[] = [
    // 30..39: the id crosses from one base-36 digit ("z" = 35) to two ("10" = 36).
    { events: frames, firstSeq: 30, position: 29 },
    // The client has 30..33 already: 34..39 only.
    { events: frames, firstSeq: 30, position: 33 },
    // It has them all: nothing.
    { events: frames, firstSeq: 30, position: 39 },
    // Frames starting with a byte order mark, first and in the middle; multi-line frames.
    { events: [frame(`${BOM}data: a\n`), frame('event: x\ndata: b\ndata: c\n'), frame(`${BOM}data: d\n`)], firstSeq: 1, position: 0 },
    // Not plain frames (an upstream id, a text event): the general path.
    { events: [frame('data: a\n'), { frame: Buffer.from('data: b\n'), upstreamId: 'u-1' }, { data: 'made here', event: 'gap' }], firstSeq: 5, position: 4 },
    { events: [frame('data: a\n'), { frame: Buffer.from('data: b\n'), upstreamId: 'u-1' }, frame('data: c\n')], firstSeq: 1, position: 0 }
  ]
  const { body, delivered } = await serve(t, cases)
  for (let n = 0; n < cases.length; n++) {
    t.equal(await body(n, 'batch'), await body(n, 'events'), `case ${n}: the same bytes`)
  }
  for (let n = 0; n < cases.length; n++) {
    t.equal(await body(n, 'page'), await body(n, 'events'), `case ${n}: the same bytes as a page of batches`)
  }
  t.equal(await body(1, 'batch'), frames.slice(4).map((f, i) => `${String(f.frame)}id: ep.s.${(34 + i).toString(36)}\n\n`).join(''), 'frame, id line, blank line; events the client has are skipped')
  t.equal(await body(2, 'batch'), '', 'nothing when the client has every event')
  t.equal(await body(3, 'batch'), `:\n${BOM}data: a\nid: ep.s.1\n\nevent: x\ndata: b\ndata: c\nid: ep.s.2\n\n:\n${BOM}data: d\nid: ep.s.3\n\n`,
    'a frame starting with a byte order mark gets an empty comment line before it')
  t.equal(await body(5, 'batch'), 'data: a\nid: ep.s.1\n\ndata: b\nid: ep.s.2\n\ndata: c\nid: ep.s.3\n\n', 'upstream ids are the store\'s, never written')
  // Each case once per path, events twice more for the pages, plus the checks above: 10 + 6 + 0 + 3 + 3 + 3 per path.
  t.equal(await delivered(), 4 * (10 + 6 + 0 + 3 + 3 + 3) + 6 + 0 + 3 + 3, 'delivered events counted once each')
})

t.test('a page still waiting in the socket is never framed over: its buffer comes back only when written', async t => {
  // Pages of about 2.5 MB (events of ~310 bytes), written at once to a client
  // that reads nothing for a while: each waits in the socket while the next is
  // framed, and the client must get every event, in order, as it was sent.
  const pageEvents = 8000
  const pagesWritten = 6
  const pad = 'x'.repeat(280)
  const { url } = await serveClientStream(t, { kind: 'standalone', epoch: 'ep', maxBufferBytes: 1 << 30 }, stream => {
    stream.open({}, 0)
    for (let p = 0; p < pagesWritten; p++) {
      const events = Array.from({ length: pageEvents }, (_, i) => frame(`data: {"n":${p * pageEvents + i},"pad":"${pad}"}\n`))
      t.ok(stream.writeBatches([new NumberedBatch(EventBatch.from(events), p * pageEvents + 1)]), `page ${p} written`)
    }
    stream.end('completed')
  })
  const text = await new Promise<string>((resolve, reject) => {
    http.get(url, res => {
      res.pause()
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('end', () => { resolve(Buffer.concat(chunks).toString('utf8')) })
      res.on('error', reject)
      setTimeout(() => res.resume(), 300)
    }).on('error', reject)
  })
  const blocks = text.split('\n\n').filter(block => block !== '')
  t.equal(blocks.length, pageEvents * pagesWritten, 'every event')
  const wrong = blocks.findIndex((block, i) => block !== `data: {"n":${i},"pad":"${pad}"}\nid: ep.s.${(i + 1).toString(36)}`)
  t.equal(wrong, -1, 'each in order, with its own bytes and id')
})

t.test('closed by the gateway before its head was sent: the head still goes out as SSE, then the retry hint and the end', async t => {
  const told: string[] = []
  const { url, metrics } = await serveClientStream(t, { kind: 'standalone', epoch: 'ep', maxBufferBytes: 1 << 20 }, stream => {
    stream.onClose(outcome => { told.push(outcome) })
    stream.close('draining', 2500)
    t.ok(stream.closed, 'closed for writers at once')
    t.notOk(stream.writeEvents([{ seq: 1, data: 'x' }]), 'nothing is written before the head')
    t.same(told, [], 'its listeners are told once it is over, not before its head')
    stream.open({ 'x-head': 'yes' }, 0)
  })
  const res = await fetch(`${url}/`)
  t.equal(res.status, 200)
  t.equal(res.headers.get('content-type'), 'text/event-stream', 'an SSE head')
  t.equal(res.headers.get('x-head'), 'yes', 'with the headers open() was given')
  t.equal(await res.text(), 'retry: 2500\n\n', 'then the retry hint, and the end')
  t.same(told, ['draining'], 'its listeners told once, with the gateway\'s outcome')
  t.equal((await metrics.streamsClosed.get()).values.find(v => v.labels.outcome === 'draining')?.value, 1, 'counted as closed for draining')
})

t.test('a client stream is opened once: a second open() is a bug, and says so', async t => {
  let openedAgain: unknown
  const { url } = await serveClientStream(t, { kind: 'standalone', epoch: 'ep', maxBufferBytes: 1 << 20 }, stream => {
    stream.open({}, 0)
    try {
      stream.open({}, 0)
    } catch (err) {
      openedAgain = err
    }
    stream.end('completed')
  })
  t.equal((await fetch(`${url}/`)).status, 200)
  t.match(openedAgain, /opened once/)
})

t.test('a client gone while the route was still awaiting: the stream is closed at once, and a listener added later is told', async t => {
  const told: string[] = []
  let gone: () => void = () => {}
  const left = new Promise<void>(resolve => { gone = resolve })
  let closedAtOnce: boolean | undefined
  const { metrics } = await serveClientStream(t, {
    kind: 'resume',
    epoch: 'ep',
    maxBufferBytes: 1 << 20,
    before: async () => { await left }
  }, stream => {
    closedAtOnce = stream.closed
    stream.onClose(outcome => { told.push(outcome) })
    gone()
  }).then(async app => {
    const aborted = new AbortController()
    const request = fetch(`${app.url}/`, { signal: aborted.signal }).catch(() => {})
    await new Promise(resolve => setTimeout(resolve, 100))
    aborted.abort()
    await request
    await new Promise(resolve => setTimeout(resolve, 100))
    gone()
    return app
  })
  await left
  await new Promise(resolve => setTimeout(resolve, 50))
  t.equal(closedAtOnce, true, 'closed as it is made')
  t.same(told, ['client_gone'], 'a listener added after is told at once')
  t.equal((await metrics.clientStreamsOpen.get()).values.find(v => v.labels.kind === 'resume')?.value ?? 0, 0, 'not counted as open')
})
