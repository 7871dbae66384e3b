// Redis restarted empty (or flushed) while a tool call streams its answer, for
// a client without a standalone GET: nothing else recovers the session, so the
// request stream's recorder records it again under a new epoch and goes on
// (src/recording/stream-appender.ts recoverSession). The official SDK client with its
// default options gets the result; its resume is told of the gap (epoch) and
// is never answered 404.
import t from 'tap'
import type { Test } from 'tap'
import { createServer, request as httpRequest } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import { pino } from 'pino'
import { startExampleServer } from '../../examples/mcp-server.js'
import { buildGateway } from '../../src/server.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { testConfig } from '../fixtures/gateway.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { metricSum, metrics } from '../fixtures/hardening.js'
import { startRedisServer, uniquePrefix } from '../fixtures/redis.js'
import { externalTools } from '../fixtures/external-tools.js'

const ownRedis = await externalTools(['redis-server'])

const COUNT = 300

/**
 * In front of the gateway: a client that never holds a standalone GET. Its
 * GET without Last-Event-ID gets 405 (the SDK goes on without the stream);
 * everything else, resumes included, passes unchanged.
 */
async function withoutStandaloneGet (t: Test, gatewayUrl: string): Promise<string> {
  const target = new URL(gatewayUrl)
  const server = createServer((req, res) => {
    if (req.method === 'GET' && req.headers['last-event-id'] === undefined) {
      res.writeHead(405, { allow: 'POST, DELETE' }).end()
      return
    }
    const upstream = httpRequest({ host: target.hostname, port: target.port, method: req.method, path: req.url, headers: req.headers }, (answer) => {
      res.writeHead(answer.statusCode ?? 502, answer.headers)
      answer.pipe(res)
    })
    upstream.on('error', () => res.destroy())
    res.on('close', () => upstream.destroy())
    req.pipe(upstream)
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => { server.closeAllConnections(); server.close(() => resolve()) }))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

for (const loss of ['FLUSHALL', 'restart'] as const) {
  t.test(`Redis emptied mid-call (${loss}), no standalone GET: the result arrives, the gap is told, no 404`, { skip: ownRedis.skip }, async (t) => {
    if (!ownRedis.present(t)) return
    const redis = await startRedisServer()
    t.teardown(() => redis.stop())
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    const prefix = uniquePrefix('lost-mid-call')
    // The client resumes after the gateway's 2 s cache of verified sessions expired:
    // only the store can then say whether the session exists.
    const config = testConfig(upstream.url, { REDIS_URL: redis.url, REDIS_KEY_PREFIX: prefix, SSE_RETRY_MS: '2500' })
    const store = await RedisEventStore.connect({ url: redis.url, keyPrefix: prefix, retention: config.retention })
    const gateway = await buildGateway(config, { store, logger: pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' }) })
    const { url, adminUrl } = await gateway.listen()
    t.teardown(() => gateway.close())

    const mcp = await connectClient(`${await withoutStandaloneGet(t, url)}/mcp`)
    t.teardown(() => mcp.close())
    t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 405), 5000), 'the client has no standalone GET open')

    const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: COUNT, intervalMs: 10, tag: 'lost' } }, undefined, { timeout: 30_000 })
      .then(result => ({ result }), (err: unknown) => ({ err }))
    const received = (): number[] => sequencesOf(mcp.notifications, 'stream_notifications', 'lost')
    t.ok(await waitUntil(() => received().length >= 80, 15_000), 'the call is streaming')

    if (loss === 'FLUSHALL') {
      const admin = new Redis(redis.url)
      await admin.flushall()
      admin.disconnect()
    } else {
      await redis.stop()
      await sleep(300)
      await redis.start()
    }

    const outcome = await call
    const delivery = checkDelivery(received(), COUNT)
    const resumes = mcp.exchanges.filter(e => e.method === 'GET' && e.lastEventId !== undefined)
    const exposition = await metrics(adminUrl)
    const gaps = metricSum(exposition, 'mcpgw_gaps_total', { reason: 'epoch' })
    t.comment(`${loss}: sent ${COUNT}, received ${delivery.received}, lost ${delivery.lost.length} [${formatRanges(delivery.lost)}], duplicated ${delivery.duplicated.length}; ` +
      `resumes ${resumes.map(e => e.status ?? e.error).join(',') || 'none'}; epoch gaps counted ${gaps}`)
    t.same('result' in outcome ? outcome.result.content : String(outcome.err), [{ type: 'text', text: `done ${COUNT}` }], 'the client gets the tool\'s result')
    t.ok(resumes.length > 0, 'the client resumed its request stream')
    t.same(resumes.filter(e => e.status !== 200).map(e => e.status), [], 'no resume got 404 (or anything but 200)')
    t.ok(resumes.some(e => e.events.some(ev => ev.event === 'gateway-gap' && ev.data.includes('"epoch"'))), 'a resume was told of the gap: the store lost the history (a new epoch)')
    t.ok(gaps >= 1, 'the gap is counted (mcpgw_gaps_total{reason="epoch"})')
    t.equal(metricSum(exposition, 'mcpgw_sessions_recovered_total'), 1, 'the session was recorded again, once (mcpgw_sessions_recovered_total)')
    t.same(delivery.duplicated, [], 'nothing twice')
    t.equal(delivery.outOfOrder, 0, 'in order')
    t.ok(delivery.received >= COUNT - 50, 'at most what the store held undelivered at the loss is missing')

    const echo = await mcp.client.callTool({ name: 'echo', arguments: { text: 'same session' } })
    t.same(echo.content, [{ type: 'text', text: 'same session' }], 'the session goes on')
  })
}
