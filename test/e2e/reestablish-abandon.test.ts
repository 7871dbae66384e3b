// An upstream session established again but not recorded (another replica's
// was recorded first) is deleted upstream, best effort: an SDK server keeps
// a session until told, so each one left behind would stay for the server's
// life (src/sessions/reestablish.ts #abandon). Real gateway (embedded store),
// a hand-written upstream that moves the record itself at the moment a second
// replica would, raw HTTP.
import t from 'tap'
import { createServer, type Server } from 'node:http'
import { request } from 'undici'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, listenUntilEnd, readMessage } from '../fixtures/hand-upstream.js'
import { rawInitialize, until } from '../fixtures/hardening.js'

const VERSION = '2025-06-18'

/**
 * An upstream that keeps sessions in memory: `known` the sessions it holds (a
 * test makes it forget one), `deleted` each DELETE's session; a call is
 * answered with the session it ran in. `holdDelete`: the answer to a DELETE
 * of that session waits for `release()`; `holdInitialize`: so does the
 * answer to that initialize (1 for the first). `onInitialize`: runs before
 * the answer to each initialize, with its count. `resetGet`: the connection
 * of a standalone GET of that session is reset before any answer (its session
 * lives on); the GET of any other session it holds is answered with an open
 * event stream.
 */
function sessionUpstream (options: { holdDelete?: string, holdInitialize?: number, resetGet?: string, onInitialize?: (count: number) => Promise<void> }): { server: Server, known: Set<string>, deleted: string[], initializes: () => number, release: () => void } {
  let initializes = 0
  const known = new Set<string>()
  const deleted: string[] = []
  let release: () => void = () => {}
  const held = new Promise<void>(resolve => { release = resolve })
  const server = createServer((req, res) => {
    const session = req.headers['mcp-session-id'] as string | undefined
    if (req.method === 'DELETE') {
      deleted.push(String(session))
      if (session === options.holdDelete) held.then(() => res.writeHead(404).end(), () => {})
      else res.writeHead(known.delete(String(session)) ? 200 : 404).end()
      return
    }
    if (req.method === 'GET' && session === options.resetGet) {
      req.socket.resetAndDestroy()
      return
    }
    if (req.method === 'GET' && session !== undefined && known.has(session)) {
      res.writeHead(200, { 'content-type': 'text/event-stream' }).flushHeaders()
      return
    }
    if (req.method !== 'POST') {
      res.writeHead(405).end()
      return
    }
    readMessage(req).then(async message => {
      if (message.method === 'initialize') {
        const id = `up-${++initializes}`
        if (initializes === options.holdInitialize) await held
        await options.onInitialize?.(initializes)
        known.add(id)
        answerInitialize(res, message, id, VERSION)
      } else if (message.id === undefined) {
        res.writeHead(202).end()
      } else if (session !== undefined && known.has(session)) {
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ jsonrpc: '2.0', id: message.id, result: { tools: [], session } }))
      } else {
        res.writeHead(404).end()
      }
    }, () => res.writeHead(400).end())
  })
  return { server, known, deleted, initializes: () => initializes, release: () => { release() } }
}

t.test('a re-establishment that loses the race to record its session deletes that session upstream', async t => {
  let sessionId = ''
  const { server, known, deleted } = sessionUpstream({
    onInitialize: async count => {
      if (count !== 2) return
      // Another replica established the session first and recorded it: up-other.
      known.add('up-other')
      await gw.store.movePlacement(sessionId, 'up-1', { upstreamSessionId: 'up-other' })
    }
  })
  const gw = await startGateway(t, 'memory', await listenUntilEnd(t, server))
  const mcpUrl = `${gw.url}/mcp`
  const client = await rawInitialize(mcpUrl, { version: VERSION })
  sessionId = client.sessionId
  known.delete('up-1')

  const call = await request(mcpUrl, { method: 'POST', headers: client.headers(), body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' })
  t.equal(call.statusCode, 200, 'the call is answered')
  t.match(await call.body.text(), /up-other/, 'on the upstream session the record points at')
  t.ok(await until(() => deleted.includes('up-2'), 3000), 'the session established for nothing is deleted upstream')
  t.notOk(deleted.includes('up-other'), 'the recorded one is not')
})

t.test('a DELETE that meets a re-establishment of its session ends the upstream session that re-establishment leaves', async t => {
  // The upstream forgot up-1 (restarted): the client's DELETE reaches it, and is held there while
  // the client's next request meets the 404 and has the session established again (up-2). Had the
  // DELETE read the record before the re-establishment moved it, up-2 would stay open upstream.
  const { server, known, deleted, initializes, release } = sessionUpstream({ holdDelete: 'up-1' })
  t.teardown(release)
  const gw = await startGateway(t, 'memory', await listenUntilEnd(t, server))
  const mcpUrl = `${gw.url}/mcp`
  const client = await rawInitialize(mcpUrl, { version: VERSION })
  known.delete('up-1')

  const deleting = request(mcpUrl, { method: 'DELETE', headers: client.headers() })
  t.ok(await until(() => deleted.includes('up-1'), 3000), 'the DELETE is at the upstream, held there')
  const calling = request(mcpUrl, { method: 'POST', headers: client.headers(), body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' })
  // Long enough for a re-establishment to run (a few local round trips) if nothing holds it back.
  await until(() => initializes() > 1, 1000)
  release()
  const [deleteAnswer, callAnswer] = await Promise.all([deleting, calling])
  await Promise.all([deleteAnswer.body.dump(), callAnswer.body.dump()])
  t.comment(`DELETE ${deleteAnswer.statusCode}, request ${callAnswer.statusCode}; established ${initializes()}, deleted upstream [${deleted.join(', ')}]`)
  t.ok(await until(() => [...known].every(id => deleted.includes(id)), 3000), `no upstream session outlives the DELETE (open: ${[...known].join(', ') || 'none'})`)
  t.equal(callAnswer.statusCode, 404, 'the request waited for the DELETE and found the session gone')
})

t.test('a DELETE sent while its session is being established upstream again waits for it, and ends the new upstream session', async t => {
  // The upstream forgot up-1; the client's request has it established again, and the upstream
  // holds the answer to that initialize while the client's DELETE comes.
  const { server, known, deleted, initializes, release } = sessionUpstream({ holdInitialize: 2 })
  t.teardown(release)
  const gw = await startGateway(t, 'memory', await listenUntilEnd(t, server))
  const mcpUrl = `${gw.url}/mcp`
  const client = await rawInitialize(mcpUrl, { version: VERSION })
  known.delete('up-1')

  const calling = request(mcpUrl, { method: 'POST', headers: client.headers(), body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' })
  t.ok(await until(() => initializes() === 2, 3000), 'the session is being established upstream again')
  const deleting = request(mcpUrl, { method: 'DELETE', headers: client.headers() })
  await until(() => deleted.length > 0, 300)
  t.same(deleted, [], 'the DELETE waits')
  release()
  const [callAnswer, deleteAnswer] = await Promise.all([calling, deleting])
  await Promise.all([deleteAnswer.body.dump(), callAnswer.body.dump()])
  t.equal(callAnswer.statusCode, 200, 'the request is answered in the new upstream session')
  t.same(deleted, ['up-2'], 'the DELETE ends the new upstream session')
  t.equal(deleteAnswer.statusCode, 200, 'and relays its answer')
  t.equal(known.size, 0, 'no upstream session left open')
})

t.test('a session established again on the same upstream after a reset connection has the upstream session it replaced deleted there, once calls still running in it have had their time', async t => {
  // One upstream, whose process lives on: the connection of the session's standalone GET is
  // reset before any answer. Nothing says the upstream lost up-1, the session is established
  // again there (up-2), and up-1 would stay open upstream for the server's life if not deleted;
  // a call still running in it would be cut if it were deleted at once.
  const { server, known, deleted, initializes } = sessionUpstream({ resetGet: 'up-1' })
  const gw = await startGateway(t, 'memory', await listenUntilEnd(t, server), { REESTABLISH_DELETE_AFTER_SECONDS: '1', UPSTREAM_SET_ASIDE_SECONDS: '1' })
  const mcpUrl = `${gw.url}/mcp`
  const client = await rawInitialize(mcpUrl, { version: VERSION })
  const stop = new AbortController()
  t.teardown(() => { stop.abort() })

  const get = await request(mcpUrl, { method: 'GET', headers: client.getHeaders(), signal: stop.signal })
  const movedAt = Date.now()
  t.equal(get.statusCode, 200, 'the client\'s GET is answered')
  t.equal(initializes(), 2, 'after the session was established again upstream')
  await until(() => deleted.length > 0, 500)
  t.same(deleted, [], 'not deleted at once')
  t.ok(await until(() => deleted.includes('up-1'), 5000), 'the upstream session it replaced is deleted there')
  const after = Date.now() - movedAt
  t.ok(after >= 900, `after REESTABLISH_DELETE_AFTER_SECONDS (${after} ms)`)
  t.same([...known], ['up-2'], 'only the session in use stays open upstream')
  t.notOk(deleted.includes('up-2'), 'the one in use is not deleted')
})
