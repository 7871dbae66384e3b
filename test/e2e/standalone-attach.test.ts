// A client's standalone GET is answered in two steps: the session's upstream
// GET is made sure of, then the client's position is read from the store and
// the client attached. The upstream GET's hold can run out between the two
// (the early hold of a session opened at initialize, or a short
// STANDALONE_HOLD_SECONDS): the client must keep its stream, and what the
// upstream sends after it must reach the client. The store's cursor read is
// held back to open that window wide. Real gateway (embedded store) in front
// of the SDK example upstream, raw HTTP.
import t from 'tap'
import type { Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from 'undici'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startGateway } from '../fixtures/gateway.js'
import { exchange, rawInitialize, sseEvents, until, type RawSession } from '../fixtures/hardening.js'
import type { EventStore } from '../../src/store/contract.js'
import type { SessionHub } from '../../src/sessions/session-hub.js'

const VERSION = '2025-11-25'
/** How long the first cursor read after arming waits: past the 1 s hold. */
const STALL_MS = 1600

/** The store's next loadCursor waits STALL_MS once `arm()` was called. */
function stallNextCursorRead (store: EventStore): { arm: () => void } {
  let armed = false
  const loadCursor = store.loadCursor.bind(store)
  store.loadCursor = async (sessionId, streamId) => {
    if (armed) {
      armed = false
      await sleep(STALL_MS)
    }
    return await loadCursor(sessionId, streamId)
  }
  return { arm: () => { armed = true } }
}

/** Broadcast sequence numbers and gap reasons of a standalone stream's text, in order. */
function read (text: string): { seqs: number[], gaps: string[] } {
  const seqs: number[] = []
  const gaps: string[] = []
  for (const e of sseEvents(text)) {
    if (e.event === 'gateway-gap') gaps.push(String((JSON.parse(e.data) as { reason?: string }).reason))
    if (e.data === '' || e.event === 'gateway-gap') continue
    const seq = (JSON.parse(e.data) as { params?: { data?: { tool?: string, seq?: number } } }).params?.data
    if (seq?.tool === 'broadcast' && typeof seq.seq === 'number') seqs.push(seq.seq)
  }
  return { seqs, gaps }
}

async function broadcast (mcpUrl: string, session: RawSession, count: number): Promise<void> {
  const body = JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'broadcast', arguments: { count, intervalMs: 20 } } })
  const answer = await request(mcpUrl, { method: 'POST', headers: session.headers(), body })
  await answer.body.text()
}

/**
 * The example upstream behind a gateway whose early hold is 1 s and whose
 * hold is `holdSeconds`, and a session whose upstream GET initialize opened.
 */
async function sessionWithHold (t: Test, holdSeconds: number): Promise<{ hub: SessionHub, mcpUrl: string, session: RawSession, stall: { arm: () => void } }> {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  let stall!: { arm: () => void }
  const gw = await startGateway(t, 'memory', upstream.url, { STANDALONE_EARLY_HOLD_SECONDS: '1', STANDALONE_HOLD_SECONDS: String(holdSeconds) }, store => { stall = stallNextCursorRead(store) })
  const hub = gw.gateway.hub
  const mcpUrl = `${gw.url}/mcp`
  const session = await rawInitialize(mcpUrl, { version: VERSION })
  t.ok(await until(() => hub.pumpCount === 1, 2000), 'initialize opened the upstream GET')
  return { hub, mcpUrl, session, stall }
}

t.test('the early hold runs out while a client GET is on its way: the upstream GET is kept for it', async t => {
  const { hub, mcpUrl, session, stall } = await sessionWithHold(t, 120)
  stall.arm()
  const get = exchange(mcpUrl, { headers: session.getHeaders() }, 6000)
  // Watch the upstream GET while the client's position is read and past the early hold.
  let released = false
  const watching = (async () => {
    const end = Date.now() + STALL_MS + 500
    while (Date.now() < end) {
      if (hub.pumpCount === 0) released = true
      await sleep(20)
    }
  })()
  await watching
  t.ok(await until(() => hub.clientCount === 1, 2000), 'the client is attached')
  t.notOk(released, 'the upstream GET was never released under the client on its way')
  await broadcast(mcpUrl, session, 3)
  const answer = await get
  t.equal(answer.status, 200)
  const { seqs, gaps } = read(answer.text)
  t.same(seqs, [0, 1, 2], 'what the upstream sent after the attach reached the client')
  t.same(gaps, [], 'and nothing was marked missing: the upstream GET never stopped')
})

t.test('the hold runs out while a client GET is on its way: the upstream GET is opened again for it', async t => {
  const { hub, mcpUrl, session, stall } = await sessionWithHold(t, 1)
  stall.arm()
  const started = Date.now()
  let endedAt = 0
  const get = exchange(mcpUrl, { headers: session.getHeaders() }, 8000).finally(() => { endedAt = Date.now() })
  t.ok(await until(() => hub.pumpCount === 0, STALL_MS), 'the hold released the upstream GET while the client\'s position was read')
  t.ok(await until(() => hub.clientCount === 1, 3000), 'the client attached after it')
  t.ok(await until(() => hub.pumpCount === 1, 4000), 'and the upstream GET was opened again for it')
  await broadcast(mcpUrl, session, 3)
  const answer = await get
  t.equal(answer.status, 200)
  t.ok(endedAt - started >= 7500, `the stream stayed open for the whole read window (${endedAt - started} ms)`)
  t.same(read(answer.text).seqs, [0, 1, 2], 'what the upstream sent after the reopening reached the client')
})
