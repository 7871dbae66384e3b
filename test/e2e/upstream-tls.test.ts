// An upstream over https, named in UPSTREAM_URL by a host name the gateway
// resolves and connects to by address: the TLS handshake must still name the
// host (SNI) and check the certificate against it. A real SDK server
// (StreamableHTTPServerTransport, sessions in memory) behind node:https, the
// official SDK client through the gateway. The certificate is a self-signed one
// for mcp.test kept for tests (test/fixtures/tls, valid for a century), trusted
// in this process only; the name is resolved by the gateway's resolver hook.
import t from 'tap'
import type { Test } from 'tap'
import { randomUUID } from 'node:crypto'
import { readFileSync } from 'node:fs'
import { createServer, type Server } from 'node:https'
import type { AddressInfo } from 'node:net'
import tls from 'node:tls'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js'
import { pino } from 'pino'
import { z } from 'zod'
import { buildGateway } from '../../src/server.js'
import { makeStore, testConfig } from '../fixtures/gateway.js'
import { readJsonBody } from '../fixtures/hand-upstream.js'
import { connectClient } from '../fixtures/mcp-client.js'

const TLS_DIR = new URL('../fixtures/tls/', import.meta.url)
const cert = readFileSync(new URL('mcp.test.crt', TLS_DIR), 'utf8')
const key = readFileSync(new URL('mcp.test.key', TLS_DIR), 'utf8')

/** The default CA certificates, read and replaced (Node 22.19+ and 24.5+, newer than this project's type definitions). */
const trust = tls as typeof tls & {
  getCACertificates?: (type: 'default') => string[]
  setDefaultCACertificates?: (certs: readonly string[]) => void
}
const { getCACertificates, setDefaultCACertificates } = trust
const cannotTrust = getCACertificates === undefined || setDefaultCACertificates === undefined
  ? `Node ${process.version} cannot trust a certificate in-process (tls.setDefaultCACertificates: Node 22.19+, 24.5+)`
  : false

/** An SDK server over https for mcp.test: one tool, `count`, which sends `n` notifications before its result. */
async function httpsUpstream (t: Test): Promise<{ port: number, servernames: Array<string | undefined> }> {
  const transports = new Map<string, StreamableHTTPServerTransport>()
  const servernames: Array<string | undefined> = []
  const server: Server = createServer({ cert, key }, (req, res) => {
    (async () => {
      const body = req.method === 'POST' ? await readJsonBody(req) : undefined
      const sessionId = req.headers['mcp-session-id']
      let transport = typeof sessionId === 'string' ? transports.get(sessionId) : undefined
      if (transport === undefined && isInitializeRequest(body)) {
        const mcp = new McpServer({ name: 'tls-upstream', version: '1.0.0' }, { capabilities: { logging: {} } })
        mcp.registerTool('count', { inputSchema: { n: z.number().int() } }, async ({ n }, extra) => {
          for (let i = 0; i < n; i++) await extra.sendNotification({ method: 'notifications/message', params: { level: 'info', data: { i } } })
          return { content: [{ type: 'text', text: `counted ${n}` }] }
        })
        const fresh = new StreamableHTTPServerTransport({ sessionIdGenerator: randomUUID, onsessioninitialized: id => { transports.set(id, fresh) } })
        await mcp.connect(fresh)
        transport = fresh
      }
      if (transport === undefined) {
        res.writeHead(404).end()
        return
      }
      await transport.handleRequest(req, res, body)
    })().catch(() => { if (!res.headersSent) res.writeHead(500).end() })
  })
  server.on('secureConnection', socket => { servernames.push((socket as tls.TLSSocket & { servername?: string | false }).servername || undefined) })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(() => new Promise<void>(resolve => { server.closeAllConnections(); server.close(() => resolve()) }))
  return { port: (server.address() as AddressInfo).port, servernames }
}

t.test('an https upstream by name, connected to by address: SNI and the certificate\'s name are the host\'s', { skip: cannotTrust }, async t => {
  if (getCACertificates === undefined || setDefaultCACertificates === undefined) return
  const defaults = getCACertificates('default')
  setDefaultCACertificates([...defaults, cert])
  t.teardown(() => { setDefaultCACertificates(defaults) })

  const upstream = await httpsUpstream(t)
  const config = testConfig(`https://mcp.test:${upstream.port}/mcp`)
  const store = await makeStore(t, 'memory', config)
  const resolved: string[] = []
  const gateway = await buildGateway(config, {
    store,
    logger: pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' }),
    resolveHost: async name => { resolved.push(name); return [{ address: '127.0.0.1', ttl: 60 }] }
  })
  t.teardown(() => gateway.close())
  const { url } = await gateway.listen()

  const client = await connectClient(`${url}/mcp`)
  t.teardown(() => client.close())
  const result = await client.client.callTool({ name: 'count', arguments: { n: 5 } })
  t.same(result.content, [{ type: 'text', text: 'counted 5' }], 'the call is answered through TLS')
  t.equal(client.notifications.filter(n => n.method === 'notifications/message').length, 5, 'with its notifications')
  t.ok(resolved.includes('mcp.test'), 'the gateway resolved the name itself')
  t.ok(upstream.servernames.length > 0, 'the upstream saw TLS connections')
  t.same([...new Set(upstream.servernames)], ['mcp.test'], 'each named the host, not the address')
})
