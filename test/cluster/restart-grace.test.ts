// A tool call that outlasts SHUTDOWN_GRACE_SECONDS when a single gateway
// process restarts: the drain cuts it, and the client, coming back to the new
// process, gets the gateway's JSON-RPC error for its request at once, on both
// stores, instead of waiting for its own timeout.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { connectClient, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startReplica, stopped } from '../fixtures/replica.js'

const RESTART_DELAY_MS = 2000
// A busy test machine can take several seconds to start a process.
const DRAIN_RETRY_MS = '8000'

for (const kind of ['redis', 'memory'] as const) {
  t.test(`${kind} store: a tool call that outlasts the grace period ends with an error answer, not a hang`, async t => {
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    const env: Record<string, string> = { DRAIN_SPREAD_SECONDS: '0', DRAIN_RETRY_MS, SHUTDOWN_GRACE_SECONDS: '4' }
    if (kind === 'redis') {
      const redis = await useRedis(t, 'restart-cut')
      Object.assign(env, { REDIS_URL: redis.url, REDIS_KEY_PREFIX: redis.prefix })
    }
    const first = await startReplica(t, { upstreamUrl: upstream.url, env, name: 'first' })
    const mcp = await connectClient(`${first.url}${new URL(upstream.url).pathname}`)
    t.teardown(() => mcp.close())
    const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: 1000, intervalMs: 20 } }, undefined, { timeout: 60_000 })
      .then(result => ({ result }), (err: unknown) => ({ err: err as Error }))
    t.ok(await waitUntil(() => sequencesOf(mcp.notifications, 'stream_notifications').length >= 20, 10_000), 'the tool call streams')
    first.kill('SIGTERM')
    const stopMs = await stopped(first, 10_000)
    // Not by its own hard stop (2 s after the grace period, exit code 1): the cut answer does not hold the exit up.
    t.equal((await first.exited).code, 0, `the old process exited cleanly (${stopMs} ms after SIGTERM)`)
    t.ok(stopMs < 4000, 'within the grace period')
    await sleep(RESTART_DELAY_MS)
    await startReplica(t, { upstreamUrl: upstream.url, env: { ...env, PORT: String(first.port) }, name: 'second' })
    const started = Date.now()
    const outcome = await call
    t.comment(`${kind}: ${JSON.stringify('err' in outcome ? outcome.err.message : outcome.result).slice(0, 200)} after ${sequencesOf(mcp.notifications, 'stream_notifications').length} notifications, ${Date.now() - started} ms after the new process was ready`)
    t.ok('err' in outcome && /lost|broke off|went away/i.test(outcome.err.message), 'the call fails with the gateway\'s error answer')
    t.ok(Date.now() - started < 2 * Number(DRAIN_RETRY_MS) + 5000, 'promptly, not at the client\'s timeout')
  })
}
