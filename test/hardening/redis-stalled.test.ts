// The gateway's connections to Redis stall mid-stream and are never closed (a
// Redis host gone without closing them, a network cut; new connections pass),
// through a relay in front of the test Redis. With REDIS_SOCKET_TIMEOUT_MS the
// gateway takes them for dead, opens new ones and goes on: the broadcast in
// progress reaches the client to its end, exactly once and in order, and a new
// client starts a session at once; the metrics count the replaced connections.
// Without the timeout the appends wait on the stalled connection for ever, and
// so does everything behind them.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { metrics } from '../fixtures/hardening.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startRedisCut } from '../fixtures/redis-cut.js'
import { metricValue, startReplica } from '../fixtures/replica.js'
import { standaloneItems } from '../fixtures/standalone-log.js'

const COUNT = 300
const INTERVAL_MS = 10
const TIMEOUT_MS = 500

t.test('Redis connections stalled mid-broadcast: replaced after REDIS_SOCKET_TIMEOUT_MS, nothing lost, new sessions served', async (t) => {
  const { url: redisUrl, prefix } = await useRedis(t, 'redis-stalled')
  const relay = await startRedisCut(redisUrl)
  t.teardown(() => relay.close())
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const replica = await startReplica(t, {
    upstreamUrl: upstream.url,
    env: { REDIS_URL: relay.url, REDIS_KEY_PREFIX: prefix, REDIS_SOCKET_TIMEOUT_MS: String(TIMEOUT_MS), SSE_RETRY_MS: '200' },
    name: 'stalled'
  })
  const mcp = await connectClient(`${replica.url}/mcp`)
  t.teardown(() => mcp.close())
  t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'standalone GET open')
  await mcp.client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: INTERVAL_MS } })
  const received = (): number[] => sequencesOf(mcp.notifications, 'broadcast')
  t.ok(await waitUntil(() => received().length >= 50, 10_000), 'the broadcast is flowing')

  t.equal(relay.stall(), 2, 'both of the gateway\'s connections stall, open')
  const stalledAt = Date.now()
  const fresh = await connectClient(`${replica.url}/mcp`)
  t.teardown(() => fresh.close())
  const startedMs = Date.now() - stalledAt
  t.ok(startedMs < 4 * TIMEOUT_MS + 2000, `a new client starts a session meanwhile (${startedMs} ms)`)

  t.ok(await waitUntil(() => received().includes(COUNT - 1), 20_000), 'the broadcast reaches the client to its end')
  await sleep(200)
  const report = checkDelivery(received(), COUNT)
  t.comment(`stalled: received ${report.received} of ${COUNT}, lost ${report.lost.length} [${formatRanges(report.lost)}], duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}; new session after ${startedMs} ms`)
  t.ok(report.ok, 'exactly once, in order')
  t.same(standaloneItems(mcp.exchanges).filter(i => i.kind === 'gap'), [], 'no gap: every append went through on a new connection')
  const scraped = await metrics(replica.adminUrl)
  const replaced = metricValue(scraped, 'mcpgw_store_connections_replaced_total', { waited: 'ping' })
  t.ok(replaced >= 2, `both replacements counted for the operator (${replaced})`)
})
