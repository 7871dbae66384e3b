// What readiness means: the gateway's own ability to serve (not draining, its
// event store answers), never the upstream's health, which every replica
// shares; that one is reported apart by /upstreamz.
import t from 'tap'
import { createServer, type Server } from 'node:http'
import { once } from 'node:events'
import type { AddressInfo } from 'node:net'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startGateway } from '../fixtures/gateway.js'
import { freePort } from '../fixtures/net.js'

async function getJson (url: string): Promise<{ status: number, body: Record<string, unknown> }> {
  const res = await fetch(url)
  return { status: res.status, body: await res.json() as Record<string, unknown> }
}

async function listen (server: Server): Promise<number> {
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  return (server.address() as AddressInfo).port
}

t.test('an upstream refusing connections: ready, and /upstreamz says unreachable', async t => {
  const port = await freePort()
  const gw = await startGateway(t, 'memory', `http://127.0.0.1:${port}/mcp`)
  const ready = await getJson(`${gw.adminUrl}/readyz`)
  t.equal(ready.status, 200, 'readiness stays true: the replica itself can serve')
  t.match(ready.body, { status: 'ready' })
  const upstream = await getJson(`${gw.adminUrl}/upstreamz`)
  t.equal(upstream.status, 503, '/upstreamz 503')
  t.match(upstream.body, { status: 'unreachable', code: 'MCPGW_UPSTREAM_UNAVAILABLE' })

  // The same port, now with an MCP server on it.
  const server = await startExampleServer({ port })
  t.teardown(() => server.close())
  const up = await getJson(`${gw.adminUrl}/upstreamz`)
  t.equal(up.status, 200, '/upstreamz 200 once the upstream answers')
  t.match(up.body, { status: 'reachable', statusCode: Number })
  t.equal((await getJson(`${gw.adminUrl}/readyz`)).status, 200, 'still ready')
})

t.test('an upstream answering 5xx, or not answering in time, is reported; readiness unchanged', async t => {
  const failing = createServer((_req, res) => { res.writeHead(503).end('down for maintenance') })
  const failingPort = await listen(failing)
  t.teardown(() => { failing.closeAllConnections(); failing.close() })
  const gw = await startGateway(t, 'memory', `http://127.0.0.1:${failingPort}/mcp`)
  const failed = await getJson(`${gw.adminUrl}/upstreamz`)
  t.equal(failed.status, 503)
  t.match(failed.body, { status: 'unreachable', code: 'upstream_error_status', statusCode: 503 })
  t.equal((await getJson(`${gw.adminUrl}/readyz`)).status, 200, 'ready')

  const silent = createServer(() => {})
  const silentPort = await listen(silent)
  t.teardown(() => { silent.closeAllConnections(); silent.close() })
  const gw2 = await startGateway(t, 'memory', `http://127.0.0.1:${silentPort}/mcp`)
  const started = Date.now()
  const slow = await getJson(`${gw2.adminUrl}/upstreamz`)
  t.equal(slow.status, 503)
  t.match(slow.body, { status: 'unreachable', code: 'timeout' })
  t.ok(Date.now() - started < 4000, 'within the probe timeout')
})

t.test('draining: not ready, whatever the upstream', async t => {
  const server = await startExampleServer()
  t.teardown(() => server.close())
  const gw = await startGateway(t, 'memory', server.url)
  t.equal((await getJson(`${gw.adminUrl}/upstreamz`)).status, 200)
  await gw.gateway.drain()
  const ready = await getJson(`${gw.adminUrl}/readyz`)
  t.equal(ready.status, 503)
  t.match(ready.body, { status: 'draining' })
})
