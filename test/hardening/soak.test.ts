// A bounded soak on the Redis store: workers churn sessions for SOAK_SECONDS
// (default 75). Each iteration creates a session, opens its standalone stream,
// streams a broadcast and a tool call, cuts both connections mid-stream,
// resumes both with Last-Event-ID (checking exactly-once delivery), and
// deletes the session. Meanwhile RSS, active handles and the Redis keys under
// the gateway's prefix are sampled. Asserted: RSS flat after warm-up (median of
// the last third within a generous bound of the first third's), handles back
// to baseline at the end, every key seen had a TTL, no key left once every
// session is deleted.
//
// SOAK_SECONDS=600 runs it for ten minutes (tap's per-file timeout is raised to match;
// if your tap run passes --timeout, make it larger than SOAK_SECONDS + 60).
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { pino } from 'pino'
import { Agent } from 'undici'
import { startExampleServer } from '../../examples/mcp-server.js'
import { buildGateway } from '../../src/server.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { testConfig } from '../fixtures/gateway.js'
import { prefixPattern, scanKeys, useRedis } from '../fixtures/redis.js'
import { exchange, rawInitialize, rawRequest, RawSse, type RawSession, type SseEvent } from '../fixtures/hardening.js'

const SOAK_SECONDS = Number(process.env.SOAK_SECONDS ?? 75)
const WORKERS = 3
const COUNT = 20
t.setTimeout((SOAK_SECONDS + 90) * 1000)

// A real full GC before each heap sample, so the heap curve shows retained memory, not GC laziness.
setFlagsFromString('--expose-gc')
const collect = runInNewContext('gc') as () => void

function activeHandles (): number {
  return (process as unknown as { _getActiveHandles: () => unknown[] })._getActiveHandles().length
}

function median (values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.floor(sorted.length / 2)] ?? Number.NaN
}

const MiB = 1048576

interface Sequenced { tool?: string, tag?: string, seq?: number }

/** Sequence numbers of the example server's notifications for one tool and tag. */
function seqs (events: readonly SseEvent[], tool: string, tag: string): number[] {
  const out: number[] = []
  for (const e of events) {
    if (e.data === '' || (e.event !== undefined && e.event !== 'message')) continue
    const data = (JSON.parse(e.data) as { params?: { data?: Sequenced } }).params?.data
    if (data?.tool === tool && data.tag === tag && typeof data.seq === 'number') out.push(data.seq)
  }
  return out
}

function exactlyOnce (received: readonly number[], count: number): string | undefined {
  const expected = Array.from({ length: count }, (_, i) => i)
  return JSON.stringify(received) === JSON.stringify(expected) ? undefined : `got [${received.join(',')}]`
}

t.test(`soak: ${SOAK_SECONDS} s of session churn on the Redis store`, async t => {
  const redis = await useRedis(t, 'soak')
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const config = testConfig(upstream.url, {
    REDIS_URL: redis.url,
    REDIS_KEY_PREFIX: redis.prefix,
    DRAIN_SPREAD_SECONDS: '0',
    SHUTDOWN_GRACE_SECONDS: '3',
    // Churn from one address, not a flood: the per-address initialize rate is tested elsewhere.
    INITIALIZES_PER_MINUTE_PER_ADDRESS: '100000'
  })
  const store = await RedisEventStore.connect({ url: redis.url, keyPrefix: redis.prefix, retention: config.retention })
  const gateway = await buildGateway(config, { store, logger: pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' }) })
  const { url, adminUrl } = await gateway.listen()
  t.teardown(() => gateway.close())
  const port = Number(new URL(url).port)
  const mcpUrl = `${url}/mcp`
  const agent = new Agent({ connections: 8 })

  const baselineHandles = activeHandles()
  const problems: string[] = []
  const keysSeen = new Set<string>()
  const keysWithoutTtl = new Set<string>()
  const samples: Array<{ at: number, rss: number, handles: number }> = []
  const heap: Array<{ at: number, used: number }> = []
  let iterations = 0
  let events = 0

  /** Every key under the prefix, and whether each has a TTL. */
  const checkTtls = async (keys: string[]): Promise<void> => {
    if (keys.length === 0) return
    const ttls = await redis.redis.pipeline(keys.map(key => ['pttl', key])).exec() ?? []
    keys.forEach((key, i) => { if (ttls[i]?.[1] === -1) keysWithoutTtl.add(`:del (${key.slice(redis.prefix.length, redis.prefix.length + 14)}...)`) })
  }
  /** Keys under the prefix, less the marks a deletion leaves on purpose (each with a TTL, checked like every key). */
  const checkKeys = async (): Promise<number> => {
    const all = await scanKeys(redis.redis, prefixPattern(redis.prefix))
    const keys = all.filter(key => !key.endsWith('}:del'))
    if (all.length > keys.length) keysSeen.add(':del')
    await checkTtls(all.filter(key => key.endsWith('}:del')))
    if (keys.length === 0) return 0
    const ttls = await redis.redis.pipeline(keys.map(key => ['pttl', key])).exec() ?? []
    keys.forEach((key, i) => {
      const suffix = key.slice(key.lastIndexOf('}') + 1)
      const kind = /^:[bz]:/.test(suffix) && suffix.slice(3) !== 's' ? `${suffix.slice(0, 3)}<request stream>` : suffix
      keysSeen.add(kind)
      // -2: deleted between SCAN and PTTL; -1: no TTL.
      if (ttls[i]?.[1] === -1) keysWithoutTtl.add(`${kind} (${key.slice(redis.prefix.length, redis.prefix.length + 14)}...)`)
    })
    return keys.length
  }

  const iteration = async (worker: number, n: number): Promise<void> => {
    const tag = `w${worker}i${n}`
    const session: RawSession = await rawInitialize(mcpUrl, { headers: { authorization: `Bearer soak-${worker}` }, dispatcher: agent })
    const sockets: RawSse[] = []
    const open = (method: string, headers: Record<string, string>, body?: string): RawSse => {
      const sse = new RawSse(port, rawRequest(method, '/mcp', Object.entries(headers), body))
      sockets.push(sse)
      return sse
    }
    try {
      // The standalone stream: a broadcast, cut after a few events, resumed.
      const standalone = open('GET', session.getHeaders())
      if (!await standalone.waitFor(s => s.status === 200, 5000)) throw new Error(`standalone GET: ${standalone.status ?? 'no answer'}`)
      const broadcast = await exchange(mcpUrl, { method: 'POST', headers: session.headers(), body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name: 'broadcast', arguments: { count: COUNT, intervalMs: 3, tag } } }), dispatcher: agent })
      if (broadcast.status !== 200) throw new Error(`broadcast: ${broadcast.status ?? '-'}`)
      // The tool call's stream, at the same time: cut after a few events, resumed.
      const call = open('POST', session.headers(), JSON.stringify({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'stream_notifications', arguments: { count: COUNT, intervalMs: 3, tag } } }))
      await standalone.waitFor(s => seqs(s.events, 'broadcast', tag).length >= 3, 5000)
      standalone.close()
      await call.waitFor(s => seqs(s.events, 'stream_notifications', tag).length >= 3, 5000)
      call.close()

      const standaloneAgain = open('GET', session.getHeaders(standalone.lastId))
      const callAgain = open('GET', session.getHeaders(call.lastId))
      await standaloneAgain.waitFor(s => seqs(s.events, 'broadcast', tag).length + seqs(standalone.events, 'broadcast', tag).length >= COUNT, 5000)
      await callAgain.waitFor(s => s.ended || s.closed, 5000)
      const broadcastSeen = [...seqs(standalone.events, 'broadcast', tag), ...seqs(standaloneAgain.events, 'broadcast', tag)]
      const callSeen = [...seqs(call.events, 'stream_notifications', tag), ...seqs(callAgain.events, 'stream_notifications', tag)]
      events += broadcastSeen.length + callSeen.length
      const lostBroadcast = exactlyOnce(broadcastSeen, COUNT)
      const lostCall = exactlyOnce(callSeen, COUNT)
      if (lostBroadcast !== undefined) problems.push(`${tag} standalone: ${lostBroadcast}`)
      if (lostCall !== undefined) problems.push(`${tag} tool call: ${lostCall}`)
      // The result may have come before the cut already (then the resume is answered 204).
      if (![...call.events, ...callAgain.events].some(e => e.data.includes('"id":2') && e.data.includes(`done ${COUNT}`))) {
        problems.push(`${tag}: the tool result did not arrive (resume HTTP ${callAgain.status ?? '-'}, ended ${String(callAgain.ended)}, closed ${String(callAgain.closed)})`)
      }
    } finally {
      for (const s of sockets) s.close()
      const deleted = await exchange(mcpUrl, { method: 'DELETE', headers: session.headers(), dispatcher: agent })
      if (deleted.status !== 200) problems.push(`${tag}: DELETE ${deleted.status ?? '-'}`)
    }
    iterations++
  }

  const started = Date.now()
  const deadline = started + SOAK_SECONDS * 1000
  const sampler = (async () => {
    let tick = 0
    while (Date.now() < deadline) {
      samples.push({ at: Date.now() - started, rss: process.memoryUsage().rss, handles: activeHandles() })
      if (tick++ % 5 === 0) {
        await checkKeys()
        collect()
        heap.push({ at: Date.now() - started, used: process.memoryUsage().heapUsed })
      }
      await sleep(1000)
    }
  })()
  await Promise.all(Array.from({ length: WORKERS }, async (_, worker) => {
    for (let n = 0; Date.now() < deadline; n++) {
      try {
        await iteration(worker, n)
      } catch (err) {
        problems.push(`w${worker}i${n}: ${(err as Error).message}`)
      }
    }
  }))
  await sampler
  const elapsed = (Date.now() - started) / 1000

  // Every session was deleted: nothing of them may remain.
  await agent.close()
  const settled = await (async () => {
    for (let i = 0; i < 50; i++) {
      if (activeHandles() <= baselineHandles + 2 && gateway.hub.clientCount === 0 && gateway.hub.pumpCount === 0) return true
      await sleep(200)
    }
    return false
  })()
  const keysLeft = await checkKeys()

  const after = samples.filter(s => s.at >= SOAK_SECONDS * 1000 * 0.2)
  const third = Math.max(1, Math.floor(after.length / 3))
  const early = median(after.slice(0, third).map(s => s.rss))
  const late = median(after.slice(-third).map(s => s.rss))
  const peakHandles = Math.max(...samples.map(s => s.handles))
  const heapAfter = heap.filter(h => h.at >= SOAK_SECONDS * 1000 * 0.2)
  const heapThird = Math.max(1, Math.floor(heapAfter.length / 3))
  const heapEarly = median(heapAfter.slice(0, heapThird).map(h => h.used))
  const heapLate = median(heapAfter.slice(-heapThird).map(h => h.used))
  t.comment(`soak: ${iterations} sessions in ${elapsed.toFixed(0)} s (${(iterations / elapsed).toFixed(1)}/s), ${events} notifications checked; RSS median ${(early / MiB).toFixed(0)} MiB (first third after warm-up) -> ${(late / MiB).toFixed(0)} MiB (last third), max ${(Math.max(...samples.map(s => s.rss)) / MiB).toFixed(0)} MiB; heap after a full GC ${(heapEarly / MiB).toFixed(1)} -> ${(heapLate / MiB).toFixed(1)} MiB (${heap.map(h => (h.used / MiB).toFixed(0)).join(' ')}); handles baseline ${baselineHandles}, peak ${peakHandles}, end ${activeHandles()}; Redis key kinds seen ${[...keysSeen].join(' ')}`)
  t.ok(iterations >= WORKERS * 5, `the soak made progress (${iterations} sessions)`)
  t.same(problems.slice(0, 10), [], `every session: exactly-once delivery across the cuts, deleted (${problems.length} problems)`)
  t.ok(late <= early * 1.25 + 32 * MiB, `RSS flat: ${(late / MiB).toFixed(0)} MiB late vs ${(early / MiB).toFixed(0)} MiB early`)
  t.ok(heapLate <= heapEarly * 1.15 + 8 * MiB, `heap after a full GC flat: ${(heapLate / MiB).toFixed(1)} MiB late vs ${(heapEarly / MiB).toFixed(1)} MiB early`)
  t.ok(settled, `no leaked handles: back to ${activeHandles()} (baseline ${baselineHandles}); no client stream (${gateway.hub.clientCount}) or upstream GET (${gateway.hub.pumpCount}) left`)
  t.same([...keysWithoutTtl], [], 'every Redis key seen during the run had a TTL')
  t.equal(keysLeft, 0, 'no key under the prefix once every session is deleted, but the deletion marks (which expire)')
  t.equal((await exchange(`${adminUrl}/healthz`)).status, 200, 'the gateway still answers /healthz')
})
