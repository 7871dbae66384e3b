// The upstream answers a session's GET 409 while another GET of that session is
// open there (one per session). That other GET belongs to a holder that is
// letting go of it: a replica closing it after a takeover, or one that lost its
// lease with the store's records and lets go at its next renewal, up to a third
// of LEASE_TTL_MS later. The client's GET waits for it instead of being refused:
// an SDK client whose first GET is refused has no standalone stream for the rest
// of its session.
import t from 'tap'
import { request } from 'undici'
import { startGateway } from '../fixtures/gateway.js'
import { rawInitialize, until } from '../fixtures/hardening.js'
import { startRestartableUpstream } from '../fixtures/restartable-upstream.js'

const HELD_MS = 2500

for (const kind of ['memory', 'redis'] as const) {
  t.test(`${kind}: a GET the upstream refuses with 409 for ${HELD_MS} ms opens once the other GET goes`, async (t) => {
    const upstream = await startRestartableUpstream()
    t.teardown(() => upstream.close())
    // The GET the gateway opens when initialize answers goes after a second without a client GET.
    const gw = await startGateway(t, kind, upstream.url, { STANDALONE_EARLY_HOLD_SECONDS: '1' })
    const session = await rawInitialize(`${gw.url}/mcp`)
    const upstreamId = upstream.life.initialized[0]
    if (upstreamId === undefined) throw new Error('the upstream initialized no session')

    // Another GET of the upstream session, as a holder that has not let go yet keeps it
    // (opened once the gateway's own early GET went).
    const other = new AbortController()
    const open = async (): Promise<boolean> => {
      const res = await request(upstream.url, { headers: { accept: 'text/event-stream', 'mcp-session-id': upstreamId, 'mcp-protocol-version': '2025-06-18' }, signal: other.signal })
      res.body.on('error', () => {})
      if (res.statusCode !== 200) res.body.destroy()
      return res.statusCode === 200
    }
    t.ok(await until(open, 5000), 'the other GET is open upstream')
    const letGo = setTimeout(() => other.abort(), HELD_MS)
    t.teardown(() => clearTimeout(letGo))

    const started = performance.now()
    const res = await request(`${gw.url}/mcp`, { headers: session.getHeaders(), signal: AbortSignal.timeout(10_000) })
    const waitedMs = performance.now() - started
    res.body.on('error', () => {}).destroy()
    t.equal(res.statusCode, 200, 'the client\'s GET opens')
    t.ok(waitedMs >= HELD_MS - 200, `once the other GET went (after ${Math.round(waitedMs)} ms)`)
  })
}
