// The bound of a re-establishment: an upstream that accepts the recorded initialize
// and never answers must not hold the client's request (and the session's fence)
// past the fence's time. The re-establisher itself, on the embedded store, against a
// real upstream socket that reads the request and says nothing.
import t, { type Test } from 'tap'
import { once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import pino from 'pino'
import { GatewayMetrics } from '../../src/metrics/metrics.js'
import { SessionReestablisher } from '../../src/sessions/reestablish.js'
import { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import { UpstreamClient } from '../../src/upstream/client.js'

const FENCE_MS = 400
const INITIALIZE = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 't', version: '0' } } })

t.test('an upstream that never answers the new initialize: unavailable within the fence\'s time, its request aborted, the session kept', async t => {
  const held: ServerResponse[] = []
  const aborted = { count: 0 }
  const upstream = createServer((req, res) => {
    req.resume()
    held.push(res)
    res.on('close', () => { aborted.count++ })
  })
  upstream.listen(0, '127.0.0.1')
  await once(upstream, 'listening')
  t.teardown(() => { for (const res of held) res.destroy(); upstream.close() })
  const client = new UpstreamClient({ origin: new URL(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`), headersTimeoutMs: 60_000 })
  t.teardown(() => client.close())
  const store = new MemoryEventStore({ retention: { maxEvents: 100, maxBytes: 1 << 20, ttlMs: 60_000 }, maxBytes: 1 << 24 })
  const stale = await store.createSession('session-1', 'principal', {
    placement: { upstreamSessionId: 'old' },
    recipe: { initialize: INITIALIZE, initializeResult: '{"capabilities":{},"protocolVersion":"2025-11-25"}' }
  })
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const reestablisher = new SessionReestablisher({ store, upstream: client, metrics, mcpPath: '/mcp', maxAnswerBytes: 1 << 20, fenceMs: FENCE_MS, concurrency: 4 })

  const started = Date.now()
  const result = await Promise.race([
    reestablisher.reestablish('session-1', stale, {}, 'answered', pino({ level: 'silent' })),
    new Promise<{ outcome: string }>(resolve => setTimeout(() => resolve({ outcome: 'still waiting after 5 s' }), 5000).unref())
  ])
  const took = Date.now() - started
  t.equal(result.outcome, 'unavailable', 'not the upstream\'s last word: the session is kept for the next request')
  t.ok(took >= FENCE_MS - 50 && took < FENCE_MS + 1500, `given up after the fence's time (${took} ms)`)
  t.equal(held.length, 1, 'the upstream got the initialize')
  for (let i = 0; i < 50 && aborted.count < 1; i++) await new Promise(resolve => setTimeout(resolve, 20))
  t.equal(aborted.count, 1, 'and its request was aborted')
  t.equal((await store.getSession('session-1'))?.upstreamSessionId, 'old', 'the record is where it was')
  t.ok(await store.acquireSessionFence('session-1', 'next', 1000), 'the fence was let go')
})

/**
 * An upstream that holds each initialize until the test lets it go, then
 * establishes a session; notifications/initialized is accepted at once.
 */
async function holdingUpstream (t: Test): Promise<{ client: UpstreamClient, waiting: Array<() => void>, initializes: { count: number, most: number }, deleted: string[] }> {
  const waiting: Array<() => void> = []
  const initializes = { count: 0, most: 0, now: 0 }
  const deleted: string[] = []
  const upstream = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      if (req.method === 'DELETE') {
        deleted.push(String(req.headers['mcp-session-id']))
        res.writeHead(200).end()
        return
      }
      const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { id?: unknown, method: string }
      if (body.method !== 'initialize') {
        res.writeHead(202).end()
        return
      }
      initializes.count++
      initializes.now++
      initializes.most = Math.max(initializes.most, initializes.now)
      // Answered, or given up by the gateway: no longer at the upstream.
      res.on('close', () => { initializes.now-- })
      waiting.push(() => {
        res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': `up-${initializes.count}-${waiting.length}` })
        res.end(JSON.stringify({ jsonrpc: '2.0', id: body.id, result: { protocolVersion: '2025-11-25', capabilities: {}, serverInfo: { name: 'held', version: '0' } } }))
      })
    })
  })
  upstream.listen(0, '127.0.0.1')
  await once(upstream, 'listening')
  t.teardown(() => { upstream.closeAllConnections(); upstream.close() })
  const client = new UpstreamClient({ origin: new URL(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`), headersTimeoutMs: 60_000 })
  t.teardown(() => client.close())
  return { client, waiting, initializes, deleted }
}

async function sessionsToEstablish (count: number): Promise<{ store: MemoryEventStore, stale: Array<Awaited<ReturnType<MemoryEventStore['createSession']>>> }> {
  const store = new MemoryEventStore({ retention: { maxEvents: 100, maxBytes: 1 << 20, ttlMs: 60_000 }, maxBytes: 1 << 24 })
  const stale = []
  for (let i = 0; i < count; i++) {
    stale.push(await store.createSession(`session-${i}`, 'principal', {
      placement: { upstreamSessionId: `old-${i}` },
      recipe: { initialize: INITIALIZE, initializeResult: '{"capabilities":{},"protocolVersion":"2025-11-25"}' }
    }))
  }
  return { store, stale }
}

t.test('REESTABLISH_CONCURRENCY: at most that many sessions are established upstream again at once; the others wait their turn', async t => {
  const { client, waiting, initializes } = await holdingUpstream(t)
  const { store, stale } = await sessionsToEstablish(5)
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const reestablisher = new SessionReestablisher({ store, upstream: client, metrics, mcpPath: '/mcp', maxAnswerBytes: 1 << 20, fenceMs: 10_000, concurrency: 2 })
  const log = pino({ level: 'silent' })
  const results = stale.map(async (record, i) => await reestablisher.reestablish(`session-${i}`, record, {}, 'answered', log))
  await new Promise(resolve => setTimeout(resolve, 300))
  t.equal(initializes.count, 2, 'two initializes reached the upstream')
  t.same(reestablisher.load, { running: 2, waiting: 3 }, 'three wait their turn')
  for (let released = 0; released < 5; released++) {
    for (let i = 0; i < 100 && waiting.length === 0; i++) await new Promise(resolve => setTimeout(resolve, 10))
    waiting.shift()?.()
  }
  const outcomes = (await Promise.all(results)).map(r => r.outcome)
  t.same(outcomes, Array(5).fill('reestablished'), 'each established again in its turn')
  t.equal(initializes.most, 2, 'never more than two at once upstream')
})

t.test('REESTABLISH_CONCURRENCY: a turn that does not come within the fence\'s time: busy, nothing sent upstream, the session kept', async t => {
  const { client, initializes } = await holdingUpstream(t)
  const { store, stale } = await sessionsToEstablish(3)
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const reestablisher = new SessionReestablisher({ store, upstream: client, metrics, mcpPath: '/mcp', maxAnswerBytes: 1 << 20, fenceMs: FENCE_MS, concurrency: 1 })
  const log = pino({ level: 'silent' })
  // The first holds the one turn until its own bound (the upstream never answers it): the third cannot get it in time.
  const outcomes = (await Promise.all(stale.map(async (record, i) => await reestablisher.reestablish(`session-${i}`, record, {}, 'answered', log)))).map(r => r.outcome)
  t.comment(`outcomes: ${outcomes.join(', ')}`)
  t.equal(outcomes[0], 'unavailable', 'the first: its upstream never answered')
  t.equal(outcomes[2], 'busy', 'the last: no turn in time')
  t.equal(initializes.count, outcomes.filter(o => o !== 'busy').length, 'a session that got no turn sent nothing upstream')
  t.equal(initializes.most, 1, 'one at a time')
  t.equal((await store.getSession('session-2'))?.upstreamSessionId, 'old-2', 'its record is where it was')
  t.ok(await store.acquireSessionFence('session-2', 'next', 1000), 'and its fence was never taken')
})

t.test('a session deleted while it is being established again: gone, and the upstream session established for it deleted', async t => {
  const { client, waiting, deleted } = await holdingUpstream(t)
  const { store, stale } = await sessionsToEstablish(1)
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const reestablisher = new SessionReestablisher({ store, upstream: client, metrics, mcpPath: '/mcp', maxAnswerBytes: 1 << 20, fenceMs: 10_000, concurrency: 2 })
  const result = reestablisher.reestablish('session-0', stale[0] as NonNullable<typeof stale[0]>, {}, 'answered', pino({ level: 'silent' }))
  for (let i = 0; i < 100 && waiting.length === 0; i++) await new Promise(resolve => setTimeout(resolve, 10))
  t.equal(waiting.length, 1, 'the upstream got the initialize')
  await store.deleteSession('session-0')
  waiting.shift()?.()
  t.equal((await result).outcome, 'gone', 'not incompatible: nothing the upstream promised changed')
  for (let i = 0; i < 100 && deleted.length === 0; i++) await new Promise(resolve => setTimeout(resolve, 10))
  t.same(deleted, ['up-1-0'], 'the new upstream session, which no record names, was deleted upstream')
  t.match(await metrics.registry.metrics(), /mcpgw_upstream_sessions_reestablished_total\{outcome="gone"\} 1/, 'counted as gone')
})

t.test('a session deleted while another replica holds its fence: gone, nothing sent upstream', async t => {
  const { client, initializes } = await holdingUpstream(t)
  const { store, stale } = await sessionsToEstablish(1)
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const reestablisher = new SessionReestablisher({ store, upstream: client, metrics, mcpPath: '/mcp', maxAnswerBytes: 1 << 20, fenceMs: 10_000, concurrency: 2 })
  t.ok(await store.acquireSessionFence('session-0', 'another replica', 10_000), 'another replica establishes it')
  const result = reestablisher.reestablish('session-0', stale[0] as NonNullable<typeof stale[0]>, {}, 'answered', pino({ level: 'silent' }))
  await store.deleteSession('session-0')
  t.equal((await result).outcome, 'gone', 'the wait ends as soon as the record is gone')
  t.equal(initializes.count, 0, 'nothing was sent upstream')
})

t.test('excluding: waits for a re-establishment\'s fence, and not at all when the store cannot be asked', async t => {
  const store = new MemoryEventStore({ retention: { maxEvents: 100, maxBytes: 1 << 20, ttlMs: 60_000 }, maxBytes: 1 << 24 })
  const metrics = new GatewayMetrics({ version: 'test', store: 'memory', defaultMetrics: false })
  const client = new UpstreamClient({ origin: new URL('http://127.0.0.1:9'), headersTimeoutMs: 1000 })
  t.teardown(() => client.close())
  const log = pino({ level: 'silent' })
  const reestablisher = new SessionReestablisher({ store, upstream: client, metrics, mcpPath: '/mcp', maxAnswerBytes: 1 << 20, fenceMs: FENCE_MS, concurrency: 4 })

  // A re-establishment holds the fence, and lets it go 100 ms later.
  t.ok(await store.acquireSessionFence('s', 'other', FENCE_MS), 'the fence is another\'s')
  setTimeout(() => { store.releaseSessionFence('s', 'other').catch(() => {}) }, 100)
  let started = Date.now()
  const during = await reestablisher.excluding('s', log, async () => await store.acquireSessionFence('s', 'third', FENCE_MS))
  t.ok(Date.now() - started >= 90, `the task waited for the fence to go (${Date.now() - started} ms)`)
  t.equal(during, false, 'and ran under it: nobody else could take it meanwhile')
  t.equal(await store.acquireSessionFence('s', 'third', FENCE_MS), true, 'released after the task')
  await store.releaseSessionFence('s', 'third')

  // A store that cannot be asked: the task runs at once, and meets the failure itself.
  const failing = Object.create(store) as MemoryEventStore
  failing.acquireSessionFence = async () => { throw new Error('store down') }
  const blind = new SessionReestablisher({ store: failing, upstream: client, metrics, mcpPath: '/mcp', maxAnswerBytes: 1 << 20, fenceMs: FENCE_MS, concurrency: 4 })
  started = Date.now()
  t.equal(await blind.excluding('s', log, async () => 'ran'), 'ran', 'the task runs without the fence')
  t.ok(Date.now() - started < FENCE_MS, `without waiting (${Date.now() - started} ms)`)
})
