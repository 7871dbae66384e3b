// Two gateway replicas on one Redis, a store-less SDK upstream restarted under a
// session. A call through replica B establishes the session upstream again; the
// client's DELETE then goes through replica A, which verified the session moments
// before (a replica keeps a verified record for two seconds). The DELETE must end
// the upstream session the record names now: sent to the old one (gone with the
// restart), the client would be told 404 and the new one would stay upstream for
// the server's life.
import t from 'tap'
import { startGatewayOnRedis } from '../fixtures/gateway.js'
import { exchange, rawInitialize } from '../fixtures/hardening.js'
import { useRedis } from '../fixtures/redis.js'
import { startRestartableUpstream } from '../fixtures/restartable-upstream.js'

function call (id: number): string {
  return JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'echo', arguments: { text: `call ${id}` } } })
}

t.test('a DELETE through a replica that verified the session before another replica moved it ends the new upstream session', async t => {
  const upstream = await startRestartableUpstream()
  t.teardown(() => upstream.close())
  const redis = await useRedis(t, 'delete-moved')
  const a = await startGatewayOnRedis(t, redis, upstream.url)
  const b = await startGatewayOnRedis(t, redis, upstream.url)
  const session = await rawInitialize(`${a.url}/mcp`)
  const oldId = upstream.life.initialized[0]

  t.equal((await exchange(`${a.url}/mcp`, { method: 'POST', headers: session.headers(), body: call(1) })).status, 200, 'a call through replica A')
  const verifiedAt = performance.now()
  await upstream.restart()
  t.equal((await exchange(`${b.url}/mcp`, { method: 'POST', headers: session.headers(), body: call(2) })).status, 200, 'a call through replica B after the restart is answered')
  const newId = upstream.life.initialized[0]
  t.ok(newId !== undefined && newId !== oldId, 'B established the session upstream again')

  const deleted = await exchange(`${a.url}/mcp`, { method: 'DELETE', headers: session.headers() })
  t.comment(`the DELETE went through A ${Math.round(performance.now() - verifiedAt)} ms after A verified the session`)
  t.equal(deleted.status, 200, 'the DELETE through A is answered by the new upstream session')
  t.same(upstream.life.requests.filter(r => r.method === 'DELETE').map(r => r.sessionId), [newId], 'the new upstream session, and only it, was deleted')
  t.equal(await a.store.getSession(session.sessionId), null, 'the session\'s records are gone')
  t.equal((await exchange(`${b.url}/mcp`, { method: 'POST', headers: session.headers(), body: call(3) })).status, 404, 'the session is over on every replica')
})
