// A single gateway process (a sidecar, a container with a restart policy)
// restarted with SIGTERM while a tool call streams: the draining process keeps
// serving the client's resumes, tells it to come back after the restart, and a
// new process on the same port takes over. The client is the official SDK's
// with its DEFAULT reconnection options (two attempts, the server's `retry`
// hint apart): it must get every notification and the result, and its
// standalone stream must still deliver afterwards.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { useRedis } from '../fixtures/redis.js'
import { startReplica, stopped } from '../fixtures/replica.js'
import { standaloneItems } from '../fixtures/standalone-log.js'

const COUNT = 300
const INTERVAL_MS = 20
const GRACE_SECONDS = 20
const AFTER = 5
const RESTART_DELAY_MS = 2000
// Longer than the default (5 s): a busy test machine can take several seconds to
// start a process. The SDK client tries at 1x and 2x the hint after the exit.
const DRAIN_RETRY_MS = 8000

for (const kind of ['redis', 'memory'] as const) {
  t.test(`${kind} store: a single instance restarted while a tool call streams`, async t => {
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    const env: Record<string, string> = {
      DRAIN_SPREAD_SECONDS: '1',
      DRAIN_RETRY_MS: String(DRAIN_RETRY_MS),
      SHUTDOWN_GRACE_SECONDS: String(GRACE_SECONDS)
    }
    if (kind === 'redis') {
      const redis = await useRedis(t, 'restart')
      Object.assign(env, { REDIS_URL: redis.url, REDIS_KEY_PREFIX: redis.prefix })
    }
    const first = await startReplica(t, { upstreamUrl: upstream.url, env, name: 'first' })
    const mcpPath = new URL(upstream.url).pathname
    // Default reconnection options: nothing passed.
    const mcp = await connectClient(`${first.url}${mcpPath}`)
    t.teardown(() => mcp.close())
    t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'standalone GET open')

    const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: COUNT, intervalMs: INTERVAL_MS } }, undefined, { timeout: 60_000 })
    const received = (): number[] => sequencesOf(mcp.notifications, 'stream_notifications')
    t.ok(await waitUntil(() => received().length >= 20, 10_000), 'the tool call streams')

    const sigterm = Date.now()
    first.kill('SIGTERM')
    t.comment(`${kind}: SIGTERM at ${received().length} of ${COUNT} notifications`)
    const drainMs = await stopped(first, (GRACE_SECONDS + 5) * 1000)
    const exitedAt = Date.now()
    t.equal((await first.exited).code, 0, 'the old process exited cleanly')
    // As a restart policy would: the same command on the same port, once the old
    // process is gone, after a delay (a policy's back-off, a slow start) longer
    // than the SDK's two attempts at the ordinary SSE_RETRY_MS (1 s) cover.
    await sleep(RESTART_DELAY_MS)
    const second = await startReplica(t, { upstreamUrl: upstream.url, env: { ...env, PORT: String(first.port) }, name: 'second' })
    const startedAt = Date.now()
    t.equal(second.port, first.port, 'the new process listens on the same port')
    t.comment(`${kind}: drain ${drainMs} ms, new process ready ${startedAt - exitedAt} ms after the exit`)

    const result = await call
    t.same(result.content, [{ type: 'text', text: `done ${COUNT}` }], 'the tool result arrived')
    await sleep(200)
    const report = checkDelivery(received(), COUNT)
    t.comment(`${kind}: tool call sent ${COUNT}, received ${report.received}, lost ${report.lost.length} [${formatRanges(report.lost)}], duplicated ${report.duplicated.length}`)
    t.same(report.lost, [], 'no notification lost')
    t.same(report.duplicated, [], 'none duplicated')
    t.equal(report.outOfOrder, 0, 'in order')

    const whileDraining = mcp.exchanges.filter(e => e.startedAt >= sigterm && e.startedAt < exitedAt)
    t.ok(whileDraining.some(e => e.method === 'GET' && e.lastEventId !== undefined && e.status === 200), 'the draining process served the client\'s resumes')
    t.same(mcp.exchanges.filter(e => e.status === 503).length, 0, 'no request was refused with 503')
    const exitHints = whileDraining.filter(e => e.method === 'GET' && e.status === 200 && e.retry !== undefined).map(e => e.retry)
    t.ok(exitHints.includes(DRAIN_RETRY_MS), `a stream served while draining was closed with the restart's retry hint, DRAIN_RETRY_MS (hints seen: ${exitHints.join(', ')})`)

    // The standalone stream comes back to the new process, which holds the upstream GET again.
    t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200 && e.startedAt >= startedAt && e.lastEventId?.includes('.s.') === true), 2 * DRAIN_RETRY_MS + 5000),
      'the standalone stream resumed on the new process')
    await sleep(300)
    await mcp.client.callTool({ name: 'broadcast', arguments: { count: AFTER, intervalMs: 10, tag: 'after' } })
    t.ok(await waitUntil(() => sequencesOf(mcp.notifications, 'broadcast', 'after').length >= AFTER, 10_000), 'the standalone stream delivers after the restart')
    t.same(sequencesOf(mcp.notifications, 'broadcast', 'after'), [0, 1, 2, 3, 4], 'every broadcast after the restart, in order')
    const gaps = standaloneItems(mcp.exchanges).filter(i => i.kind === 'gap')
    t.comment(`${kind}: standalone gap markers: ${gaps.map(g => g.kind === 'gap' ? g.reason : '').join(', ') || 'none'}`)
    // The upstream GET was closed by the old process and opened again by the new
    // one: what the upstream sent in between may be lost, and the client is told.
    if (kind === 'redis') t.same(gaps.map(g => g.kind === 'gap' ? g.reason : ''), ['upstream_handover'], 'Redis: the history survived (no epoch gap); the reopened upstream GET is marked')
    else t.ok(gaps.some(g => g.kind === 'gap' && g.reason === 'epoch'), 'embedded store: the client is told the history is gone (epoch gap)')
    t.notOk(mcp.errors.some(e => /Maximum reconnection attempts/.test(e.message)), 'the client never gave up reconnecting')
  })
}
