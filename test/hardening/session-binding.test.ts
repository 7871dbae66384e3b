// The binding of a session to its principal outlives the store's records
// (src/protocol/session-id.ts): after the store lost everything (the embedded
// store's process restarted; Redis flushed), another principal naming the
// session gets 404 on POST and GET, and the session's creator is still served.
// A session id with an altered tag is nobody's.
import t from 'tap'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startGateway, startGatewayOnRedis, type RunningGateway } from '../fixtures/gateway.js'
import { ACCEPT_BOTH, exchange, jsonRpcError, rawInitialize, type Answer } from '../fixtures/hardening.js'
import { deleteKeys, useRedis } from '../fixtures/redis.js'

const VERSION = '2025-06-18'
const ECHO = '{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"mine"}}}'

async function post (gw: RunningGateway, sessionId: string, who: string): Promise<Answer> {
  return await exchange(`${gw.url}/mcp`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'mcp-protocol-version': VERSION, 'mcp-session-id': sessionId, authorization: `Bearer ${who}` },
    body: ECHO
  })
}

async function get (gw: RunningGateway, sessionId: string, who: string): Promise<Answer> {
  return await exchange(`${gw.url}/mcp`, {
    headers: { accept: 'text/event-stream', 'mcp-protocol-version': VERSION, 'mcp-session-id': sessionId, authorization: `Bearer ${who}` }
  }, 500)
}

/** Another spelling of the id's tag (its first character changed). */
function alteredTag (sessionId: string): string {
  const at = 'mg1.'.length
  return sessionId.slice(0, at) + (sessionId[at] === 'A' ? 'B' : 'A') + sessionId.slice(at + 1)
}

for (const kind of ['memory', 'redis'] as const) {
  t.test(`${kind} store: after the store lost its records, only the session's creator gets it back`, async t => {
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    let first: RunningGateway
    let second: RunningGateway
    let lose: () => Promise<void>
    if (kind === 'memory') {
      first = await startGateway(t, 'memory', upstream.url)
      second = first
      // The embedded store's process restarts: a new gateway, an empty store.
      lose = async () => {
        await first.close()
        second = await startGateway(t, 'memory', upstream.url)
      }
    } else {
      // Two replicas: alice's on one, the attempts on the other, which never saw her session.
      const redis = await useRedis(t, 'binding')
      first = await startGatewayOnRedis(t, redis, upstream.url)
      second = await startGatewayOnRedis(t, redis, upstream.url)
      lose = async () => { t.ok(await deleteKeys(redis.redis, redis.prefix) > 0, 'every key of the gateway flushed') }
    }
    const alice = await rawInitialize(`${first.url}/mcp`, { version: VERSION, headers: { authorization: 'Bearer alice' } })
    t.equal((await post(first, alice.sessionId, 'alice')).status, 200, 'alice is served')
    t.equal((await post(first, alice.sessionId, 'mallory')).status, 404, 'before the loss, mallory gets 404')
    await lose()

    const malloryPost = await post(second, alice.sessionId, 'mallory')
    t.equal(malloryPost.status, 404, 'after the loss, mallory\'s POST with alice\'s session id: 404')
    t.match(jsonRpcError(malloryPost.text), { code: -32001 }, 'the gateway\'s own answer: nothing reached the upstream')
    t.equal((await get(second, alice.sessionId, 'mallory')).status, 404, 'mallory\'s GET: 404')
    t.equal(await second.store.getSession(alice.sessionId), null, 'nothing recorded for mallory')
    t.equal((await post(second, alteredTag(alice.sessionId), 'alice')).status, 404, 'an altered tag: 404, even for alice')

    const served = await post(second, alice.sessionId, 'alice')
    t.equal(served.status, 200, 'alice keeps her session')
    t.match(served.text, /mine/, 'served by the upstream')
    t.equal((await second.store.getSession(alice.sessionId))?.principal !== undefined, true, 'recorded again, for alice')
    t.equal((await post(second, alice.sessionId, 'mallory')).status, 404, 'and mallory still gets 404')
  })
}
