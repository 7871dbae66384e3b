// Clients that stop reading: one session records a large answer, many
// connections resume it from its start and never read. Each is cut within
// CLIENT_WRITE_TIMEOUT_SECONDS (whether the gateway still writes to it or
// not), the bytes waiting for clients stay within CLIENT_BUFFERS_MAX_BYTES and
// go back to 0, and concurrent replays of the stream are bounded by
// MAX_REPLAYS_PER_STREAM. Node cannot shrink a socket's receive buffer, so a
// client that never reads is a paused socket: the kernel then takes a few MiB
// per connection on loopback, and the answer is larger than that.
import t from 'tap'
import type { Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import { startGatewayWithLog, type LoggingGateway } from '../fixtures/gateway.js'
import { LARGE_ANSWER_BYTES, LARGE_ANSWER_EVENTS, startLargeAnswerUpstream, StuckReader } from '../fixtures/large-answer.js'
import { metricSum, metrics, rawInitialize, rawRequest, RawSse, until, type RawSession } from '../fixtures/hardening.js'

t.setTimeout(120_000)

const EVENTS = LARGE_ANSWER_EVENTS
const ANSWER_BYTES = LARGE_ANSWER_BYTES
const CONNECTIONS = 60
const WRITE_TIMEOUT_SECONDS = 2
const BUDGET = 16 * 1024 * 1024

/** A gateway with the answer recorded; the id of its first event (a resume from there replays the rest). */
async function recordedAnswer (t: Test, env: Record<string, string>): Promise<{ gw: LoggingGateway, session: RawSession, firstId: string }> {
  const gw = await startGatewayWithLog(t, await startLargeAnswerUpstream(t), { DRAIN_SPREAD_SECONDS: '0', SHUTDOWN_GRACE_SECONDS: '3', ...env })
  const session = await rawInitialize(`${gw.url}/mcp`)
  const call = new RawSse(gw.port, rawRequest('POST', '/mcp', Object.entries(session.headers()), '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"large","arguments":{}}}'))
  t.teardown(() => call.close())
  t.ok(await call.waitFor(s => s.ended, 30_000), 'the large answer is read in full through the gateway')
  t.equal(call.events.length, EVENTS + 1, `${EVENTS} notifications and the result, about ${ANSWER_BYTES >> 20} MiB`)
  return { gw, session, firstId: call.events[0]?.id as string }
}

/** Process memory (this process holds the gateway), in MiB, after a collection when exposed. */
// A full collection before each reading, so that what is measured is what the
// gateway still holds, not garbage a collection has not reached yet (tap runs
// the file without --expose-gc; the flag set now gives a fresh context its gc).
setFlagsFromString('--expose-gc')
const collect = runInNewContext('gc') as () => void

function memory (): { rss: number, external: number } {
  collect()
  const usage = process.memoryUsage()
  return { rss: usage.rss / 2 ** 20, external: usage.external / 2 ** 20 }
}

/**
 * memory() once what a collection found dead is also freed: the backing
 * stores of dead buffers are let go on a later turn, so a reading right after
 * one collection can still count them (Node 22 read the peak so, once in CI).
 */
async function settledMemory (): Promise<{ rss: number, external: number }> {
  collect()
  await sleep(50)
  return memory()
}

t.test('connections that resume a large answer and never read: cut within the write timeout, within the budget, memory handed back', async t => {
  const { gw, session, firstId } = await recordedAnswer(t, {
    CLIENT_WRITE_TIMEOUT_SECONDS: String(WRITE_TIMEOUT_SECONDS),
    CLIENT_BUFFERS_MAX_BYTES: String(BUDGET),
    // Every resume replays, to see the timeout and the budget (the bound has its own test).
    MAX_REPLAYS_PER_STREAM: String(CONNECTIONS)
  })
  // Every reading is settled: a reading right after a collection may still
  // count dead buffers, which is not what the gateway holds.
  const before = await settledMemory()
  const stuck: StuckReader[] = []
  for (let i = 0; i < CONNECTIONS; i++) stuck.push(new StuckReader(gw.port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders(firstId)))))
  t.teardown(() => { for (const client of stuck) client.socket.destroy() })
  const opened = Date.now()
  const buffered = async (): Promise<number> => metricSum(await metrics(gw.adminUrl), 'mcpgw_client_buffered_bytes')
  let peak = before
  let peakBuffered = 0
  const sample = async (): Promise<void> => {
    const now = await settledMemory()
    if (now.external > peak.external) peak = { ...peak, external: now.external }
    if (now.rss > peak.rss) peak = { ...peak, rss: now.rss }
    peakBuffered = Math.max(peakBuffered, await buffered())
  }
  // Every stream leaves the gateway: cut for want of progress, or closed for the budget.
  const allGone = await until(async () => {
    await sample()
    return gw.gateway.hub.clientCount === 0 && await buffered() === 0
  }, 30_000)
  const gone = Date.now() - opened
  t.ok(allGone, `every stream closed and nothing waits for a client, ${gone} ms after the ${CONNECTIONS} resumes began`)
  // Each is cut a timeout after its own last progress, and the replays reach that
  // point at different times (later on a busy machine): the exact timing is the
  // unit test's (test/unit/client-buffers.test.ts).
  t.comment(`all gone ${gone} ms after the resumes began (write timeout ${WRITE_TIMEOUT_SECONDS} s)`)
  const text = await metrics(gw.adminUrl)
  const timeouts = metricSum(text, 'mcpgw_client_write_timeouts_total')
  const full = metricSum(text, 'mcpgw_streams_closed_total', { outcome: 'buffers_full' })
  t.ok(timeouts >= 1, `cut by the write timeout: ${timeouts}`)
  t.equal(metricSum(text, 'mcpgw_streams_closed_total', { outcome: 'write_timeout' }) + full + metricSum(text, 'mcpgw_streams_closed_total', { outcome: 'superseded' }), CONNECTIONS,
    `each stream closed as write_timeout, buffers_full (${full}) or superseded by the next resume`)
  t.ok(peakBuffered <= BUDGET + 4 * 2 ** 20, `bytes waiting for clients peaked at ${(peakBuffered / 2 ** 20).toFixed(1)} MiB, within CLIENT_BUFFERS_MAX_BYTES (${BUDGET >> 20} MiB) and one write`)
  const stalledLogs = gw.lines.filter(l => typeof l.msg === 'string' && l.msg.startsWith('client accepted no bytes'))
  t.ok(stalledLogs.length >= 1 && stalledLogs.length <= timeouts, `logged with its context (${stalledLogs.length} line(s): the logger writes a repeated warning once per window)`)
  t.match(stalledLogs[0], { level: 'warn', streamId: String, waitingBytes: Number, timeoutSeconds: WRITE_TIMEOUT_SECONDS })
  // Handed back within a few seconds (memory() alone may still count buffers freed a turn later).
  let after = await settledMemory()
  for (const deadline = Date.now() + 3000; after.external - before.external >= 24 && Date.now() < deadline;) after = await settledMemory()

  // The clients look again: each stream was cut (the connection closed), or
  // ended cleanly with its retry hint (the connection kept alive, idle).
  for (const client of stuck) client.readAgain()
  t.ok(await until(() => stuck.every(c => c.closed || c.endedWithRetry), 10_000), 'each stream is cut or ended with a retry hint when its client reads again')
  t.equal(stuck.filter(c => c.closed).length, timeouts, 'the cut ones are the connections closed')
  t.comment(`${CONNECTIONS} stuck resumes of a ${(ANSWER_BYTES / 2 ** 20).toFixed(1)} MiB answer: RSS ${before.rss.toFixed(0)} -> peak ${peak.rss.toFixed(0)} -> after ${after.rss.toFixed(0)} MiB; external ${before.external.toFixed(0)} -> peak ${peak.external.toFixed(0)} -> after ${after.external.toFixed(0)} MiB; cut ${timeouts}, closed for the budget ${full}`)
  // Loose: the budget, the page pool's free pages (8 MiB), a replay page per resume being
  // framed (4 MiB at most, a few at once), and pages already dropped that V8 has not swept
  // yet (it frees them on a later collection, and under load a settled peak read 60 to 114
  // MiB). Without the budget, the resumes grow it by hundreds of MiB.
  t.ok(peak.external - before.external < (BUDGET >> 20) * 8, `external memory grew ${(peak.external - before.external).toFixed(0)} MiB at peak, bounded by the budget (${BUDGET >> 20} MiB) plus pages in flight`)
  t.ok(after.external - before.external < 24, `and ${(after.external - before.external).toFixed(0)} MiB after the clients are gone`)
})

t.test('concurrent resumes of one stream: at most MAX_REPLAYS_PER_STREAM replay, the rest get 429 with Retry-After', async t => {
  const { gw, session, firstId } = await recordedAnswer(t, { CLIENT_WRITE_TIMEOUT_SECONDS: String(WRITE_TIMEOUT_SECONDS), MAX_REPLAYS_PER_STREAM: '3' })
  const clients: RawSse[] = []
  for (let i = 0; i < 12; i++) {
    const client = new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders(firstId))))
    // The first piece read (the head, and for a replay the start of the history), then no more.
    client.socket.once('data', () => client.pause())
    clients.push(client)
  }
  t.teardown(() => { for (const client of clients) client.close() })
  t.ok(await until(() => clients.every(c => c.status !== undefined), 5000), 'every request is answered')
  const refused = clients.filter(c => c.status === 429)
  t.equal(clients.filter(c => c.status === 200).length, 3, 'three replay (the bound), superseding each other')
  t.equal(refused.length, 9, 'the others are refused before anything is read')
  t.equal(refused[0]?.headers['retry-after'], '1', 'with Retry-After')
  t.equal(metricSum(await metrics(gw.adminUrl), 'mcpgw_requests_refused_total', { reason: 'too_many_replays' }), 9, 'counted as refusals')
  // Once those replays are gone (cut, as they never read), the stream can be resumed again.
  t.ok(await until(() => gw.gateway.hub.clientCount === 0, (WRITE_TIMEOUT_SECONDS + 4) * 1000), 'the stuck replays are cut')
  const again = new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders(firstId))))
  t.teardown(() => again.close())
  t.ok(await again.waitFor(s => s.ended, 20_000), 'a resume that reads gets the whole answer')
  t.equal(again.status, 200)
  t.equal(again.events.length, EVENTS, 'everything after the first event, the result included')
})
