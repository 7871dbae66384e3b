// A client that refreshed its token keeps its standalone stream when the
// upstream ends the session's GET: the gateway's own upstream GET that resumes
// it carries the token of the client's latest request, not the one of the GET
// it opened with, which the authorization server has revoked since. Real parts:
// a gateway verifying JWTs (AUTH_JWT_*), the SDK client, and an SDK server
// (with an event store only for the long call) behind a check of its own that answers 401 unless the
// bearer token is one it accepts now. The token goes from token1 to token2 and
// token1 is revoked (another subject's request naming the session meanwhile
// is refused, and changes nothing); the upstream then ends the GET (its
// transport's own close) and notifies on the standalone stream. Likewise for a
// long call's answer that the upstream ends (SEP-1699 polling) after the refresh:
// the gateway resumes it with the new token. Both stores.
import t from 'tap'
import { randomUUID } from 'node:crypto'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { InMemoryEventStore } from '@modelcontextprotocol/sdk/examples/shared/inMemoryEventStore.js'
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js'
import { setTimeout as sleep } from 'node:timers/promises'
import { startAuthServer } from '../fixtures/jwt.js'
import { startGateway, type StoreKind } from '../fixtures/gateway.js'
import { connectClient, waitUntil } from '../fixtures/mcp-client.js'
import { readJsonBody } from '../fixtures/hand-upstream.js'

/** A GET the upstream got: the bearer token it carried, and the status answered (undefined until its head is written). */
interface SeenGet {
  readonly token: string | undefined
  readonly lastEventId: string | undefined
  readonly status: () => number | undefined
}

interface GuardedUpstream {
  url: string
  /** The bearer tokens it accepts now: any other gets 401. */
  readonly valid: Set<string>
  /** Every GET, in arrival order. */
  readonly gets: SeenGet[]
  /** Ends each session's standalone GET cleanly (the SDK transport's closeStandaloneSSEStream). */
  endStandaloneGets: () => void
  /** A notification on each session's standalone stream (related to no request: dropped where no GET is open). */
  notify: (data: string) => Promise<void>
  close: () => Promise<void>
}

function bearerOf (req: IncomingMessage): string | undefined {
  return /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1]
}

/**
 * `polling`: each session keeps an event store, and its tool `long` waits for
 * `polling.release`, then ends its SSE answer (SEP-1699: the client is to come
 * back with GET + Last-Event-ID) and answers once the stream is resumed.
 */
async function startGuardedUpstream (valid: Set<string>, polling?: { readonly started: () => void, readonly release: Promise<void> }): Promise<GuardedUpstream> {
  const sessions = new Map<string, { transport: StreamableHTTPServerTransport, server: McpServer }>()
  const gets: SeenGet[] = []

  async function handle (req: IncomingMessage, res: ServerResponse): Promise<void> {
    const token = bearerOf(req)
    const lastEventId = req.headers['last-event-id'] as string | undefined
    if (req.method === 'GET') gets.push({ token, lastEventId, status: () => res.headersSent ? res.statusCode : undefined })
    if (token === undefined || !valid.has(token)) {
      req.resume()
      res.writeHead(401, { 'www-authenticate': 'Bearer error="invalid_token"', 'content-type': 'application/json' })
      res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'invalid token' } }))
      return
    }
    const body = await readJsonBody(req)
    const sessionId = req.headers['mcp-session-id'] as string | undefined
    const session = sessionId === undefined ? undefined : sessions.get(sessionId)
    if (session !== undefined) {
      await session.transport.handleRequest(req, res, body)
      return
    }
    if (sessionId === undefined && req.method === 'POST' && isInitializeRequest(body)) {
      const server = new McpServer({ name: 'guarded-server', version: '0.1.0' }, { capabilities: { logging: {} } })
      if (polling !== undefined) {
        server.registerTool('long', { description: 'Ends its answer stream once released, then answers' }, async extra => {
          polling.started()
          await polling.release
          extra.closeSSEStream?.()
          await sleep(300)
          return { content: [{ type: 'text', text: 'done' }] }
        })
      }
      const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: randomUUID,
        ...(polling !== undefined && { eventStore: new InMemoryEventStore(), retryInterval: 100 }),
        onsessioninitialized: id => { sessions.set(id, { transport, server }) }
      })
      transport.onclose = () => { if (transport.sessionId !== undefined) sessions.delete(transport.sessionId) }
      await server.connect(transport)
      await transport.handleRequest(req, res, body)
      return
    }
    res.writeHead(sessionId === undefined ? 400 : 404, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'no session' } }))
  }

  const http = createServer((req, res) => {
    handle(req, res).catch(() => { if (!res.headersSent) res.writeHead(500).end(); else res.destroy() })
  })
  await new Promise<void>(resolve => http.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${(http.address() as AddressInfo).port}/mcp`,
    valid,
    gets,
    endStandaloneGets: () => { for (const { transport } of sessions.values()) transport.closeStandaloneSSEStream() },
    notify: async data => {
      for (const { server } of sessions.values()) await server.server.notification({ method: 'notifications/message', params: { level: 'info', data } })
    },
    close: async () => {
      for (const { transport } of sessions.values()) await transport.close().catch(() => {})
      http.closeAllConnections()
      await new Promise<void>(resolve => http.close(() => resolve()))
    }
  }
}

for (const kind of ['memory', 'redis'] as StoreKind[]) {
  t.test(`${kind} store: the upstream GET resumed after a token refresh carries the new token, and the client's stream goes on`, async t => {
    const auth = await startAuthServer(t)
    const token1 = await auth.token('alice', { jti: 'token1' })
    const token2 = await auth.token('alice', { jti: 'token2' })
    const upstream = await startGuardedUpstream(new Set([token1]))
    t.teardown(() => upstream.close())
    const { url } = await startGateway(t, kind, upstream.url, auth.env)
    // The SDK client reads these at each request: changed below, as a client's token refresh does.
    const headers = { authorization: `Bearer ${token1}` }
    const mcp = await connectClient(`${url}/mcp`, { headers })
    t.teardown(() => mcp.close())
    const clientGets = (): typeof mcp.exchanges => mcp.exchanges.filter(e => e.method === 'GET')
    t.ok(await waitUntil(() => clientGets()[0]?.status === 200, 10_000), 'the client\'s GET is open')
    t.ok(await waitUntil(() => upstream.gets.some(g => g.status() === 200), 10_000), 'and the gateway\'s upstream GET')

    // The token refresh: token2 issued, token1 revoked; the client's next request carries token2.
    upstream.valid.add(token2)
    upstream.valid.delete(token1)
    headers.authorization = `Bearer ${token2}`
    await mcp.client.ping()
    // Then another subject's token, valid upstream too, naming the session: refused, it changes nothing.
    const intruder = await auth.token('mallory', { jti: 'intruder' })
    upstream.valid.add(intruder)
    const foreign = await fetch(`${url}/mcp`, {
      method: 'POST',
      headers: { authorization: `Bearer ${intruder}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-session-id': mcp.sessionId ?? '', 'mcp-protocol-version': mcp.protocolVersion ?? '' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 99, method: 'ping' })
    })
    await foreign.body?.cancel()
    t.equal(foreign.status, 404, 'another principal\'s request on the session gets 404')

    const before = upstream.gets.length
    upstream.endStandaloneGets()
    t.ok(await waitUntil(() => upstream.gets[before]?.status() !== undefined, 10_000), 'the gateway asked the upstream for the session\'s GET again')
    const resumed = upstream.gets[before]
    t.equal(resumed?.token, token2, 'with the refreshed token')
    t.equal(resumed?.status(), 200, 'which the upstream accepted')
    t.equal(upstream.gets.filter(g => g.status() === 401).length, 0, 'the upstream answered no GET 401')

    await upstream.notify('after the refresh')
    t.ok(await waitUntil(() => mcp.notifications.some(n => n.params?.data === 'after the refresh'), 5000), 'the client got the notification sent after the resume')
    const gets = clientGets()
    t.equal(gets.length, 1, 'on its first GET: it never had to reconnect')
    t.notOk(gets[0]?.ended, 'which is still open')

    await mcp.close()
    await upstream.close()
  })
}

for (const kind of ['memory', 'redis'] as StoreKind[]) {
  t.test(`${kind} store: a long call's answer the upstream ends is resumed with the token refreshed since the call`, async t => {
    const auth = await startAuthServer(t)
    const token1 = await auth.token('alice', { jti: 'token1' })
    const token2 = await auth.token('alice', { jti: 'token2' })
    let release = (): void => {}
    let started = false
    const upstream = await startGuardedUpstream(new Set([token1]), { started: () => { started = true }, release: new Promise<void>(resolve => { release = resolve }) })
    t.teardown(() => { release(); return upstream.close() })
    const { url } = await startGateway(t, kind, upstream.url, auth.env)
    const headers = { authorization: `Bearer ${token1}` }
    const mcp = await connectClient(`${url}/mcp`, { headers })
    t.teardown(() => mcp.close())

    const call = mcp.client.callTool({ name: 'long', arguments: {} }, undefined, { timeout: 15_000 })
    t.ok(await waitUntil(() => started, 10_000), 'the call runs upstream')
    // The token refresh while the call runs: the client's next request carries token2.
    upstream.valid.add(token2)
    upstream.valid.delete(token1)
    headers.authorization = `Bearer ${token2}`
    await mcp.client.ping()

    const before = upstream.gets.length
    release()
    const outcome = await call.then(result => (result.content as Array<{ text: string }>)[0]?.text, (err: Error) => `failed: ${err.message}`)
    t.equal(outcome, 'done', 'the call\'s result arrived')
    const resumes = upstream.gets.slice(before).filter(g => g.lastEventId !== undefined)
    t.ok(resumes.length > 0, 'the gateway resumed the answer upstream')
    t.same(resumes.map(g => g.token), resumes.map(() => token2), 'with the refreshed token')
    t.same(resumes.map(g => g.status()), resumes.map(() => 200), 'which the upstream accepted')
    t.notOk(mcp.exchanges.some(e => e.method === 'GET' && e.lastEventId?.includes('.s.') === false), 'the client never had to resume the answer itself')
  })
}
