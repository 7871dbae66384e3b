// A session's upstream GET opened anew: its client left, the hold ended (the
// gateway's GET closed), and the client came back. Against a store-less SDK
// server with the SDK's example event store, as server-everything and many
// servers ship it, a GET resumed with Last-Event-ID on the standalone stream is
// filed under no stream, and the server sends nothing on it for the rest of the
// session. By default the gateway opens it afresh, and what the upstream sends
// next reaches the client. With STANDALONE_REOPEN_FROM_LAST_ID=true and an
// upstream whose store resumes the standalone stream, it resumes from the
// upstream's last event id. Both stores.
import t, { type Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGateway, startGatewayOnRedis, type RunningGateway } from '../fixtures/gateway.js'
import { exchange, rawInitialize, type RawSession } from '../fixtures/hardening.js'
import { useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream, type EventStoreKind, type RestartableUpstream } from '../fixtures/restartable-upstream.js'

const HOLD = { STANDALONE_HOLD_SECONDS: '1', STANDALONE_EARLY_HOLD_SECONDS: '1' }

/** What the session's standalone stream carries while the upstream is asked to send `text` on it. */
async function standaloneDuring (gw: RunningGateway, session: RawSession, text: string): Promise<string> {
  const get = exchange(`${gw.url}/mcp`, { headers: session.getHeaders() }, 3000)
  // The client's GET attached, the gateway's upstream GET open.
  await sleep(800)
  const body = JSON.stringify({ jsonrpc: '2.0', id: text, method: 'tools/call', params: { name: 'notify_standalone', arguments: { text } } })
  await exchange(`${gw.url}/mcp`, { method: 'POST', headers: session.headers(), body })
  return (await get).text
}

function upstreamGets (upstream: RestartableUpstream): Array<{ lastEventId?: string }> {
  return upstream.life.requests.filter(r => r.method === 'GET')
}

type Start = (t: Test, upstreamUrl: string, env: Record<string, string>) => Promise<RunningGateway>

async function reopened (t: Test, start: Start, eventStore: EventStoreKind, env: Record<string, string>): Promise<{ upstream: RestartableUpstream, second: string }> {
  const upstream = await startRestartableUpstream({ eventStore })
  t.teardown(() => upstream.close())
  const gw = await start(t, upstream.url, { ...HOLD, ...env })
  const session = await rawInitialize(`${gw.url}/mcp`)
  t.match(await standaloneDuring(gw, session, 'first'), /"first"/, 'the first GET carries what the upstream sends')
  // The client left: the hold ends, and the gateway's upstream GET with it.
  await sleep(2500)
  const second = await standaloneDuring(gw, session, 'second')
  t.equal(upstreamGets(upstream).length, 2, 'the gateway opened the upstream GET again for the client that came back')
  return { upstream, second }
}

const stores: Array<[string, (t: Test) => Promise<Start>]> = [
  ['embedded store', async () => async (t, url, env) => await startGateway(t, 'memory', url, env)],
  ['Redis', async t => {
    const redis = await useRedis(t, 'standalone-reopen')
    return async (t, url, env) => await startGatewayOnRedis(t, redis, url, env)
  }]
]

for (const [name, store] of stores) {
  t.test(`${name}: against the SDK's example event store, the GET opened again is fresh, and the upstream's next notification arrives`, async t => {
    const { upstream, second } = await reopened(t, await store(t), 'sdk-example', {})
    t.equal(upstreamGets(upstream)[1]?.lastEventId, undefined, 'opened without Last-Event-ID')
    t.match(second, /"second"/, 'what the upstream sends after it reaches the client')
  })

  t.test(`${name}: STANDALONE_REOPEN_FROM_LAST_ID=true, an upstream whose store resumes it: the GET resumes from the upstream's last event id`, async t => {
    const { upstream, second } = await reopened(t, await store(t), true, { STANDALONE_REOPEN_FROM_LAST_ID: 'true' })
    t.not(upstreamGets(upstream)[1]?.lastEventId, undefined, 'opened with Last-Event-ID')
    t.match(second, /"second"/, 'what the upstream sends after it reaches the client')
  })
}
