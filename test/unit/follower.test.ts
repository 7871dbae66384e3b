// Catching a client up from the store (src/sessions/follower.ts), over a real
// socket and the embedded store: pages start small and double up to their
// largest size, and a page cut by its bytes is not mistaken for the end.
import t, { type Test } from 'tap'
import http from 'node:http'
import { once } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import { StreamFollower } from '../../src/sessions/follower.js'
import { serveClientStream } from '../fixtures/client-stream-app.js'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import type { EventInput } from '../../src/store/contract.js'

const EVENT_BYTES = 1000

/** A stream of `count` 1,000-byte frames, in batches of 100, ended. Returns the session's epoch. */
async function fill (store: MemoryEventStore, count: number): Promise<string> {
  const { epoch } = await store.createSession('S', 'p')
  for (let first = 1; first <= count; first += 100) {
    const batch: EventInput[] = Array.from({ length: 100 }, (_, i) => ({ frame: Buffer.from(`data: ${String(first + i).padStart(EVENT_BYTES - 7, '0')}\n`) }))
    await store.append('S', 's', batch)
  }
  await store.end('S', 's')
  return epoch
}

/** A gateway-shaped GET that follows stream s of session S from position 0 until it ended. */
async function serve (t: Test, store: MemoryEventStore, epoch: string, pages: { pageSize: number, pageBytes: number, pageMaxBytes: number }): Promise<string> {
  const { url } = await serveClientStream(t, { kind: 'resume', epoch, maxBufferBytes: 8 << 20 }, async (client, _request, { metrics, log }) => {
    client.open({}, 0)
    await new StreamFollower({ store, metrics, log, client, sessionId: 'S', untilEnded: true, ...pages }).start()
  })
  return await (await fetch(url)).text()
}

/** The store, with the page bounds of every read it was asked for. */
function recordingStore (): { store: MemoryEventStore, reads: Array<{ limit: number, maxBytes: number | undefined }> } {
  const store = new MemoryEventStore({ retention: { maxEvents: 100_000, maxBytes: 1 << 30, ttlMs: 60_000 }, maxBytes: 1 << 30 })
  const reads: Array<{ limit: number, maxBytes: number | undefined }> = []
  const read = store.read.bind(store)
  store.read = async (sessionId, streamId, afterSeq, limit, maxBytes) => {
    reads.push({ limit, maxBytes })
    return await read(sessionId, streamId, afterSeq, limit, maxBytes)
  }
  return { store, reads }
}

function seqsOf (body: string): number[] {
  return [...body.matchAll(/^id: [^.\n]+\.s\.([0-9a-z]+)$/gm)].map(m => Number.parseInt(m[1] as string, 36))
}

t.test('a long catch-up reads pages that double in bytes, up to the largest, and delivers every event once', async t => {
  const { store, reads } = recordingStore()
  t.teardown(() => store.close())
  const body = await serve(t, store, await fill(store, 3000), { pageSize: 10_000, pageBytes: 64 * 1024, pageMaxBytes: 512 * 1024 })
  t.same(seqsOf(body), Array.from({ length: 3000 }, (_, i) => i + 1), 'all 3,000 events, in order, once each')
  const KiB = 1024
  t.same(reads.map(r => r.maxBytes), [64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, 512 * KiB, 512 * KiB, 512 * KiB, 512 * KiB], 'pages of 64, 128, 256 KiB, then 512 KiB until the end')
  t.ok(reads.every(r => r.limit === 10_000), 'the event limit is passed on')
})

t.test('a page cut by its bytes, not its event count, is followed by the next', async t => {
  const { store, reads } = recordingStore()
  t.teardown(() => store.close())
  // 16 KiB pages hold 16 events: far below the 10,000-event limit, never at it.
  const body = await serve(t, store, await fill(store, 500), { pageSize: 10_000, pageBytes: 16 * 1024, pageMaxBytes: 16 * 1024 })
  t.same(seqsOf(body), Array.from({ length: 500 }, (_, i) => i + 1), 'every event, though no page was full by count')
  t.equal(reads.length, Math.ceil(500 / 16), 'one read per 16 events')
})

t.test('the next page is read while the client reads the last one, and written only once it has: at most one page is held', async t => {
  const { store, reads } = recordingStore()
  t.teardown(() => store.close())
  const epoch = await fill(store, 12_000)
  const { url } = await serveClientStream(t, { kind: 'resume', epoch, maxBufferBytes: 8 << 20 }, async (client, _request, { metrics, log }) => {
    client.open({}, 0)
    // 4 MiB pages: more than the connection's socket buffers take from a client that reads nothing.
    await new StreamFollower({ store, metrics, log, client, sessionId: 'S', untilEnded: true, pageSize: 10_000, pageBytes: 4 << 20, pageMaxBytes: 4 << 20 }).start()
  })
  const response = await new Promise<http.IncomingMessage>((resolve, reject) => http.get(url, resolve).on('error', reject))
  response.pause()
  // The client reads nothing: the first page waits for it, the second is read meanwhile.
  const deadline = Date.now() + 10_000
  while (reads.length < 2 && Date.now() < deadline) await sleep(10)
  await sleep(200)
  t.equal(reads.length, 2, 'the second page was read while the first waits, and no third')
  const chunks: Buffer[] = []
  response.on('data', (chunk: Buffer) => chunks.push(chunk))
  response.resume()
  await once(response, 'end')
  t.same(seqsOf(Buffer.concat(chunks).toString()), Array.from({ length: 12_000 }, (_, i) => i + 1), 'then every event, in order, once each')
})

t.test('a follower started for a client already gone subscribes to nothing', async t => {
  const store = new MemoryEventStore({ retention: { maxEvents: 100, maxBytes: 1 << 20, ttlMs: 60_000 }, maxBytes: 1 << 20 })
  t.teardown(() => store.close())
  const epoch = await fill(store, 100)
  let subscribed = 0
  let unsubscribed = 0
  const subscribe = store.subscribe.bind(store)
  store.subscribe = (sessionId, streamId, listener) => {
    subscribed++
    const unsubscribe = subscribe(sessionId, streamId, listener)
    return () => { unsubscribed++; unsubscribe() }
  }
  let closedBeforeStart = false
  const { url } = await serveClientStream(t, { kind: 'resume', epoch, maxBufferBytes: 8 << 20 }, async (client, _request, { metrics, log }) => {
    client.open({}, 0)
    client.end('client_gone')
    closedBeforeStart = client.closed
    await new StreamFollower({ store, metrics, log, client, sessionId: 'S', untilEnded: true, pageSize: 100, pageBytes: 1 << 20, pageMaxBytes: 1 << 20 }).start()
  })
  await (await fetch(url)).text()
  t.ok(closedBeforeStart, 'the client was closed before the follower started')
  t.equal(subscribed - unsubscribed, 0, 'no subscription is left behind')
})
