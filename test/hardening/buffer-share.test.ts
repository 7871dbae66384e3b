// Clients of one address that stop reading take no more than their share of
// CLIENT_BUFFERS_MAX_BYTES: a client elsewhere, reading, gets its whole
// answer while they sit on theirs. Without the share, an address that keeps a
// few connections barely reading (never cut by the write timeout) fills the
// budget, and every other client's stream is closed for it (buffers_full)
// and its relayed answers wait, as long as they keep it so.
import t from 'tap'
import { startGatewayWithLog } from '../fixtures/gateway.js'
import { LARGE_ANSWER_EVENTS, startLargeAnswerUpstream, StuckReader } from '../fixtures/large-answer.js'
import { metricSum, metrics, rawInitialize, rawRequest, RawSse } from '../fixtures/hardening.js'
import { setTimeout as sleep } from 'node:timers/promises'

t.setTimeout(120_000)

const BUDGET = 16 * 1024 * 1024
/** Calls of one address whose answers are never read: each leaves MiBs waiting (the kernel takes a few per connection). */
const STUCK = 6

function toolCall (id: number): string {
  return JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'large', arguments: {} } })
}

t.test('an address whose clients stop reading holds its share of the client buffers; another address\'s stream goes on', async t => {
  const gw = await startGatewayWithLog(t, await startLargeAnswerUpstream(t), {
    CLIENT_BUFFERS_MAX_BYTES: String(BUDGET),
    // Not cut while the test runs: a client that reads a byte now and then never is.
    CLIENT_WRITE_TIMEOUT_SECONDS: '120',
    DRAIN_SPREAD_SECONDS: '0',
    SHUTDOWN_GRACE_SECONDS: '3'
  })
  const mcpUrl = `${gw.url}/mcp`
  const idle = await rawInitialize(mcpUrl)
  const other = await rawInitialize(mcpUrl)
  const buffered = async (): Promise<number> => metricSum(await metrics(gw.adminUrl), 'mcpgw_client_buffered_bytes')

  // From 127.0.0.1: calls whose large answers nobody reads.
  const stuck: StuckReader[] = []
  for (let i = 0; i < STUCK; i++) stuck.push(new StuckReader(gw.port, rawRequest('POST', '/mcp', Object.entries(idle.headers()), toolCall(10 + i))))
  t.teardown(() => { for (const client of stuck) client.socket.destroy() })
  // Until what waits for them stops growing (every answer recorded, written as far as it goes).
  let peak = 0
  for (let last = -1, still = 0, deadline = Date.now() + 20_000; still < 4 && Date.now() < deadline; await sleep(250)) {
    const now = await buffered()
    peak = Math.max(peak, now)
    still = now === last ? still + 1 : 0
    last = now
  }
  t.ok(peak > 0, `the stuck clients have bytes waiting: ${(peak / 2 ** 20).toFixed(1)} MiB`)
  t.ok(peak <= BUDGET / 4 + 2 * 2 ** 20, `within their address's share (a quarter of ${BUDGET >> 20} MiB, and one write): ${(peak / 2 ** 20).toFixed(1)} MiB`)

  // From 127.0.0.2, reading: its answer in full, not closed for the others' buffers.
  const reader = new RawSse(gw.port, rawRequest('POST', '/mcp', Object.entries(other.headers()), toolCall(99)), '127.0.0.2')
  t.teardown(() => reader.close())
  t.ok(await reader.waitFor(s => s.ended || s.closed, 60_000), 'the other address\'s answer ends')
  t.equal(reader.status, 200)
  t.equal(reader.events.length, LARGE_ANSWER_EVENTS + 1, `every notification and the result (${reader.events.length} of ${LARGE_ANSWER_EVENTS + 1})`)
  t.match(reader.events.at(-1)?.data, /"id":99,"result"/, 'the last is the result')
  const text = await metrics(gw.adminUrl)
  const full = metricSum(text, 'mcpgw_streams_closed_total', { outcome: 'buffers_full' })
  t.ok(full >= 1 && full <= STUCK, `the streams closed for the budget are the stuck address's (${full} of ${STUCK}): they resume from the store`)
  t.ok(await buffered() <= BUDGET, 'the budget held')
})
