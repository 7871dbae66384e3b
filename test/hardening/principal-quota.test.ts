// One principal cannot exhaust MAX_SESSIONS for everyone: the attack of
// opening sessions, each with its standalone GET, and leaving (each upstream
// GET then held STANDALONE_HOLD_SECONDS). Real gateway (embedded store) in
// front of the SDK example upstream, raw HTTP.
import t from 'tap'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startGateway } from '../fixtures/gateway.js'
import { exchange, rawInitialize, type Answer, type RawSession } from '../fixtures/hardening.js'

const MAX_SESSIONS = 50
const CYCLES = 55
/** The default: a tenth of MAX_SESSIONS. */
const PER_PRINCIPAL = 5

/**
 * initialize, open the standalone GET, disconnect after `readMs` (the gateway
 * keeps holding the upstream GET). 2025-11-25: the stream starts with a
 * priming event, so its status is known at once.
 */
async function cycle (mcpUrl: string, auth?: string, readMs = 1500): Promise<{ session: RawSession, get: Answer }> {
  const session = await rawInitialize(mcpUrl, { version: '2025-11-25', headers: auth === undefined ? {} : { authorization: auth } })
  const get = await exchange(mcpUrl, { headers: session.getHeaders() }, readMs)
  return { session, get }
}

t.test(`${CYCLES} initialize+GET+disconnect cycles of one principal leave others their sessions`, async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, { MAX_SESSIONS: String(MAX_SESSIONS), STANDALONE_HOLD_SECONDS: '120', SESSION_REQUESTS_PER_SECOND: '1000' })
  const mcpUrl = `${gw.url}/mcp`

  const statuses: number[] = []
  const sessions: RawSession[] = []
  for (let i = 0; i < CYCLES; i += 11) {
    const batch = await Promise.all(Array.from({ length: Math.min(11, CYCLES - i) }, async () => await cycle(mcpUrl, 'Bearer mallory')))
    for (const { session, get } of batch) {
      statuses.push(get.status ?? 0)
      sessions.push(session)
    }
  }
  const held = statuses.filter(s => s === 200).length
  t.comment(statuses.join(' '))
  t.equal(held, PER_PRINCIPAL, `mallory got ${PER_PRINCIPAL} standalone streams (MAX_SESSIONS_PER_PRINCIPAL defaults to MAX_SESSIONS / 10)`)
  t.same(statuses.filter(s => s !== 200).map(String), Array(CYCLES - PER_PRINCIPAL).fill('429'), 'every further one: 429')
  t.equal(gw.gateway.hub.pumpCount, PER_PRINCIPAL, 'upstream GETs held: her share only')

  for (const user of ['alice', 'bob', 'carol']) {
    const { get } = await cycle(mcpUrl, `Bearer ${user}`)
    t.equal(get.status, 200, `${user}: a standalone stream, not 503`)
  }

  // A place comes back when one of mallory's sessions ends.
  const ended = sessions[statuses.indexOf(200)] as RawSession
  const del = await exchange(mcpUrl, { method: 'DELETE', headers: ended.headers() })
  t.equal(del.status, 200, 'mallory ends one session')
  const { get } = await cycle(mcpUrl, 'Bearer mallory')
  t.equal(get.status, 200, 'and may open one stream again')
})

t.test('requests without credentials share one principal, which the quota leaves alone', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, { MAX_SESSIONS: '20', MAX_SESSIONS_PER_PRINCIPAL: '2', SESSION_REQUESTS_PER_SECOND: '1000' })
  const mcpUrl = `${gw.url}/mcp`
  const answers = await Promise.all(Array.from({ length: 4 }, async () => await cycle(mcpUrl)))
  t.same(answers.map(a => a.get.status), [200, 200, 200, 200], 'anonymous users: bounded by MAX_SESSIONS only')
})
