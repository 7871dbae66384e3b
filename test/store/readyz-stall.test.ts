// Readiness (/readyz) on a real Redis when the process itself stands still (a
// long collection, a starved CPU) while the store's PING waits: the PONG lands
// in the socket meanwhile, but the probe's overdue timer runs before the loop
// reads that socket. The store answered, so the probe must say ready; a store
// that answers nothing is still called down after the wait.
import t from 'tap'
import type { Test } from 'tap'
import { pino } from 'pino'
import { buildAdminServer } from '../../src/routes/admin.js'
import { GatewayMetrics } from '../../src/metrics/metrics.js'
import type { EventStore } from '../../src/store/contract.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { UpstreamClient } from '../../src/upstream/client.js'
import { testConfig } from '../fixtures/gateway.js'
import { requireRedis, uniquePrefix } from '../fixtures/redis.js'
import { standStill } from '../fixtures/stand-still.js'

const PING_TIMEOUT_MS = 200

/** The admin listener's routes over `store` (only its kind and ping are asked), probed without a socket. */
function admin (t: Test, store: Pick<EventStore, 'kind' | 'ping'>): (url: string) => Promise<{ status: number, body: unknown }> {
  const config = testConfig('http://127.0.0.1:9/mcp')
  const upstream = new UpstreamClient({ origin: new URL('http://127.0.0.1:9'), headersTimeoutMs: 1000 })
  t.teardown(() => upstream.close())
  const server = buildAdminServer(pino({ level: 'silent' }), config.adminAllowedHosts, {
    store: store as EventStore,
    metrics: new GatewayMetrics({ version: 'test', store: store.kind, defaultMetrics: false }),
    isDraining: () => false,
    pingTimeoutMs: PING_TIMEOUT_MS,
    upstream,
    mcpPath: config.mcpPath
  })
  t.teardown(() => server.close())
  return async url => {
    const res = await server.inject({ url, headers: { host: '127.0.0.1' } })
    return { status: res.statusCode, body: res.json() }
  }
}

t.test('a store that answered while the process stood still past the wait: ready', async t => {
  const url = await requireRedis(t)
  const prefix = uniquePrefix('readyz-stall')
  const store = await RedisEventStore.connect({ url, keyPrefix: prefix, retention: testConfig('http://127.0.0.1:9/mcp').retention })
  t.teardown(() => store.close())
  // Rounds in which the process stood still with the answer not yet read (each must be one).
  let raced = 0
  const probe = admin(t, {
    kind: store.kind,
    ping: async () => {
      let stood = false
      const answered = store.ping().then(() => { if (stood) raced++ })
      // The PING is written; the loop is held right after this turn's code has set the
      // probe's timer, before any socket is read again: that timer is overdue, and the
      // loop runs it before it reads the answer.
      queueMicrotask(() => { standStill(3 * PING_TIMEOUT_MS); stood = true })
      await answered
    }
  })
  for (let round = 0; round < 3; round++) {
    // Each probe starts in the same place of the loop's turn (its check phase).
    await new Promise(resolve => setImmediate(resolve))
    const ready = await probe('/readyz')
    t.equal(ready.status, 200, `round ${round + 1}: ready`)
    t.same(ready.body, { status: 'ready', store: 'redis' })
  }
  t.equal(raced, 3, 'in every round the answer was read after the process stood still')
})

t.test('a store that answers nothing is still called down after the wait', async t => {
  const probe = admin(t, { kind: 'redis', ping: async () => { await new Promise(() => {}) } })
  const started = Date.now()
  const down = await probe('/readyz')
  t.equal(down.status, 503)
  t.same(down.body, { status: 'store_unavailable', store: 'redis' })
  t.ok(Date.now() - started >= PING_TIMEOUT_MS, `after the wait (${Date.now() - started} ms)`)
})
