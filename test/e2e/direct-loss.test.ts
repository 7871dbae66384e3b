// Control experiment: the official SDK client talks to the example upstream DIRECTLY,
// through a proxy that cuts the connections. No gateway: this measures the loss the
// gateway exists to remove, and proves the harness detects it (a harness that saw no
// loss here could not prove anything about the gateway).
import t from 'tap'
import { ErrorCode, McpError } from '@modelcontextprotocol/sdk/types.js'
import { startExampleServer } from '../../examples/mcp-server.js'
import type { ExampleServerLogger } from '../../examples/mcp-server.js'
import { startCutProxy } from '../fixtures/cut-proxy.js'
import type { CutProxy } from '../fixtures/cut-proxy.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import type { HttpExchange, McpTestClient } from '../fixtures/mcp-client.js'

const COUNT = 300
const INTERVAL_MS = 5
// Shorter than the SDK's 1 s default so three cuts and their reconnects fit inside
// one ~1.6 s broadcast; the SDK's own logic (attempts, maxRetries 2) is unchanged.
const reconnectionOptions = {
  initialReconnectionDelay: 100,
  maxReconnectionDelay: 1000,
  reconnectionDelayGrowFactor: 1.5,
  maxRetries: 2
}

interface LogEntry { level: string, msg: string, err?: string }

function recordingLogger (entries: LogEntry[]): ExampleServerLogger {
  const record = (level: string) => (obj: object, msg = '') => {
    const { err } = obj as { err?: unknown }
    entries.push({ level, msg, ...(err !== undefined && { err: String(err) }) })
  }
  return { debug: record('debug'), info: record('info'), warn: record('warn'), error: record('error') }
}

interface Setup {
  proxy: CutProxy
  mcp: McpTestClient
  serverLog: LogEntry[]
}

/** The part of a tap test `setup` needs. */
interface Owner { teardown (fn: () => unknown): void }

async function setup (t: Owner): Promise<Setup> {
  const serverLog: LogEntry[] = []
  const upstream = await startExampleServer({ logger: recordingLogger(serverLog) })
  const proxy = await startCutProxy(Number(new URL(upstream.url).port))
  const mcp = await connectClient(proxy.url('/mcp'), { reconnectionOptions }).catch(async (err: unknown) => {
    await proxy.close()
    await upstream.close()
    throw err
  })
  // Client first, so it does not try to reconnect to a server going away.
  t.teardown(async () => {
    await mcp.close()
    await proxy.close()
    await upstream.close()
  })
  return { proxy, mcp, serverLog }
}

const gets = (mcp: McpTestClient): HttpExchange[] => mcp.exchanges.filter((e) => e.method === 'GET')

/** The standalone stream the client is reading right now, if any. */
function liveGet (mcp: McpTestClient): HttpExchange | undefined {
  return gets(mcp).find((e) => e.status === 200 && !e.ended)
}

/** Contiguous runs in an ascending list. */
function holes (lost: readonly number[]): number {
  return lost.filter((seq, i) => i === 0 || lost[i - 1] !== seq - 1).length
}

t.test('standalone stream: notifications sent while the GET is down are lost', async (t) => {
  const { proxy, mcp, serverLog } = await setup(t)
  t.equal(mcp.protocolVersion, '2025-11-25', 'the SDK client negotiates its latest version')
  t.ok(await waitUntil(() => liveGet(mcp) !== undefined, 2000), 'the client opened the standalone GET stream')

  const result = await mcp.client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: INTERVAL_MS } })
  t.same(result.content, [{ type: 'text', text: `broadcasting ${COUNT}` }])

  const received = () => sequencesOf(mcp.notifications, 'broadcast')
  const cuts: { afterSeq: number | undefined, pairs: number }[] = []
  const alreadyCut = new Set<HttpExchange>()
  for (let i = 0; i < 3; i++) {
    // Cut only a stream that is live, new (a cut one ends asynchronously) and has
    // carried some of the broadcast.
    let stream: HttpExchange | undefined
    const live = await waitUntil(() => {
      stream = liveGet(mcp)
      return stream !== undefined && !alreadyCut.has(stream) && stream.events.length >= 30
    }, 5000)
    if (!live || stream === undefined) break
    alreadyCut.add(stream)
    cuts.push({ afterSeq: received().at(-1), pairs: proxy.cutAll() })
  }
  t.equal(cuts.length, 3, 'three cuts happened while the broadcast was running')
  t.ok(cuts.every(({ afterSeq }) => afterSeq !== undefined && afterSeq < COUNT - 1), 'every cut fell inside the broadcast')

  await waitUntil(() => received().includes(COUNT - 1), 5000)
  await waitUntil(() => serverLog.some((e) => e.msg === 'broadcast finished'), 2000)
  const report = checkDelivery(received(), COUNT)
  t.comment(`direct, standalone stream: sent ${report.sent}, received ${report.received}, lost ${report.lost.length} ` +
    `(${formatRanges(report.lost)}), duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}, ` +
    `cuts ${cuts.length} (after seq ${cuts.map((c) => c.afterSeq).join(', ')}; pairs ${cuts.map((c) => c.pairs).join(', ')})`)

  t.ok(report.lost.length > 0, 'notifications were lost')
  t.equal(holes(report.lost), cuts.length, 'each cut made exactly one hole: what was sent during the reconnect gap')
  t.same(report.duplicated, [], 'nothing is replayed, so nothing is duplicated')
  t.equal(report.outOfOrder, 0)

  // Without event ids there is nothing to resume: every reconnect is a fresh GET,
  // and the server drops what it sends meanwhile without a word.
  const standalone = gets(mcp)
  t.comment(`GET exchanges: ${standalone.map((g) => `${g.status ?? 'failed'}${g.error !== undefined ? ' (cut)' : ''}`).join(', ')}`)
  t.equal(standalone.length, cuts.length + 1, 'the SDK reopened the GET stream after each cut')
  t.ok(standalone.every((g) => g.status === 200), 'the server accepted every reconnect: a reset closes its side at once, so no 409')
  t.ok(standalone.every((g) => g.lastEventId === undefined), 'no Last-Event-ID was ever sent')
  t.ok(standalone.every((g) => g.events.every((e) => e.id === undefined)), 'the server sent no event ids')
  t.equal(mcp.errors.filter((e) => e.message.startsWith('SSE stream disconnected')).length, cuts.length,
    'the client reported each drop as "SSE stream disconnected"')
  t.same(serverLog.filter((e) => e.level === 'warn' || e.level === 'error'), [], 'the server noticed no loss')
})

t.test('request stream: a cut loses the rest of the stream and the tool result', async (t) => {
  const { proxy, mcp, serverLog } = await setup(t)
  const timeoutMs = 3000
  const received = () => sequencesOf(mcp.notifications, 'stream_notifications')

  const startedAt = Date.now()
  const call = mcp.client.callTool(
    { name: 'stream_notifications', arguments: { count: COUNT, intervalMs: INTERVAL_MS } },
    undefined,
    { timeout: timeoutMs }
  )
  const outcome = call.then((result) => ({ result }), (err: unknown) => ({ err }))
  t.ok(await waitUntil(() => received().length >= 60, 5000), 'the call is streaming')
  const cutAfterSeq = received().at(-1)
  const pairs = proxy.cutAll()

  const settled = await outcome
  const elapsedMs = Date.now() - startedAt
  const report = checkDelivery(received(), COUNT)
  t.comment(`direct, request stream: sent ${report.sent}, received ${report.received}, lost ${report.lost.length} ` +
    `(${formatRanges(report.lost)}), duplicated ${report.duplicated.length}, cut after seq ${cutAfterSeq} (${pairs} pairs), ` +
    `call settled after ${elapsedMs} ms: ${'err' in settled ? String(settled.err) : 'resolved'}`)

  // The SDK client does not resume a POST stream that carried no event id: the
  // request stays pending until its own timeout.
  t.ok('err' in settled, 'the call failed')
  if ('err' in settled) {
    t.ok(settled.err instanceof McpError && settled.err.code === ErrorCode.RequestTimeout,
      'with the client-side request timeout, not with a transport error')
  }
  t.ok(elapsedMs >= timeoutMs, 'only when the timeout expired')
  t.same(received(), [...Array(report.received).keys()], 'what arrived is an in-order prefix')
  t.ok(report.lost.length > 0 && report.lost.at(-1) === COUNT - 1, 'everything after the cut was lost')
  t.equal(mcp.exchanges.filter((e) => e.lastEventId !== undefined).length, 0, 'the client never tried to resume')
  t.ok(mcp.errors.some((e) => e.message.startsWith('SSE stream disconnected')), 'the client saw the drop')

  // The server is not told: the tool runs to completion and only the response fails.
  t.ok(serverLog.some((e) => e.msg === 'stream_notifications finished'), 'the tool ran to completion server-side')
  const failures = serverLog.filter((e) => e.level === 'warn').map((e) => e.err)
  t.comment(`server errors: ${failures.join(' | ')}`)
  t.ok(failures.some((err) => err?.includes('No connection established for request ID')),
    'the server could not deliver the result')
})

t.test('half-dead socket: the server refuses the reconnect with 409 and the client gives up', async (t) => {
  const { proxy, mcp, serverLog } = await setup(t)
  t.ok(await waitUntil(() => liveGet(mcp) !== undefined, 2000), 'the client opened the standalone GET stream')
  await mcp.client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: INTERVAL_MS } })

  const received = () => sequencesOf(mcp.notifications, 'broadcast')
  t.ok(await waitUntil(() => received().length >= 30, 5000), 'the broadcast is flowing')
  // The client loses its socket; the server's side stays open and unread.
  const pairs = proxy.cutAll('client')
  const cutAfterSeq = received().at(-1)

  const gaveUp = await waitUntil(() => mcp.errors.some((e) => e.message.includes('Maximum reconnection attempts')), 5000)
  t.ok(gaveUp, 'the client stopped reconnecting after maxRetries')
  await waitUntil(() => serverLog.some((e) => e.msg === 'broadcast finished'), 3000)
  const report = checkDelivery(received(), COUNT)
  const standalone = gets(mcp)
  t.comment(`direct, half-dead socket: sent ${report.sent}, received ${report.received}, lost ${report.lost.length} ` +
    `(${formatRanges(report.lost)}), cut after seq ${cutAfterSeq} (${pairs} pairs, ${proxy.halfOpen} left half-open), ` +
    `GET statuses ${standalone.map((g) => g.status ?? 'failed').join(', ')}`)
  t.comment(`client errors: ${mcp.errors.map((e) => e.message).join(' | ')}`)

  t.same(standalone.map((g) => g.status), [200, 409, 409], 'both reconnects were refused with 409 Conflict')
  t.ok(serverLog.some((e) => e.err?.includes('Conflict: Only one SSE stream is allowed per session')),
    'the server still held the dead GET stream')
  t.ok(report.lost.length > 0 && report.lost.at(-1) === COUNT - 1, 'everything after the cut was lost')
  t.same(received(), [...Array(report.received).keys()], 'what arrived is an in-order prefix')

  // The session itself survives: only the standalone stream is gone for good.
  const echo = await mcp.client.callTool({ name: 'echo', arguments: { text: 'still here' } })
  t.same(echo.content, [{ type: 'text', text: 'still here' }], 'requests still work without a standalone stream')
})
