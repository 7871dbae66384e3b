// The late-GET race, measured: a fresh SDK client connects through the gateway
// (Redis store) and calls, at once, a tool whose server asks the client
// (sampling/createMessage) on the standalone stream, with no related request.
// The client's GET and the tool call's POST go out together (see oneTry); an
// SDK server without an event store drops a request it sends while no
// GET is open. A try whose request never reaches the client is counted lost.
//
//   npm run build && node bench/late-get-race.mjs [--tries 100] [--get-after-ms 0] [--redis redis://127.0.0.1:6379] [--dist <dir>]
//
// --dist points at another build of the gateway (a `dist/` directory) to
// compare two versions on the same machine.
import { randomBytes, randomUUID } from 'node:crypto'
import { createServer } from 'node:http'
import { resolve } from 'node:path'
import { parseArgs } from 'node:util'
import { pathToFileURL } from 'node:url'
import { pino } from 'pino'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { CreateMessageRequestSchema, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js'

const { values: args } = parseArgs({
  options: {
    tries: { type: 'string', default: '100' },
    redis: { type: 'string', default: process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379' },
    dist: { type: 'string', default: 'dist' },
    'ask-timeout-ms': { type: 'string', default: '1500' },
    // The client's GET goes this long after the tool call (0: together).
    'get-after-ms': { type: 'string', default: '0' }
  }
})
const tries = Number(args.tries)
const askTimeoutMs = Number(args['ask-timeout-ms'])
const getAfterMs = Number(args['get-after-ms'])
const dist = pathToFileURL(resolve(args.dist)).href
const { loadConfig } = await import(`${dist}/src/config/load.js`)
const { buildGateway } = await import(`${dist}/src/server.js`)
const { RedisEventStore } = await import(`${dist}/src/store/redis/redis-store.js`)

/** An SDK upstream without an event store; its tool asks the client on the standalone stream. */
async function startUpstream () {
  const transports = new Map()
  const http = createServer(async (req, res) => {
    const chunks = []
    for await (const chunk of req) chunks.push(chunk)
    const body = chunks.length === 0 ? undefined : JSON.parse(Buffer.concat(chunks).toString('utf8'))
    const existing = transports.get(req.headers['mcp-session-id'])
    if (existing !== undefined) return await existing.handleRequest(req, res, body)
    if (req.method !== 'POST' || !isInitializeRequest(body)) return res.writeHead(404).end()
    const server = new McpServer({ name: 'late-get-race', version: '0.1.0' })
    server.registerTool('ask', { description: 'sampling on the standalone stream' }, async () => {
      const answer = await server.server.createMessage({ messages: [{ role: 'user', content: { type: 'text', text: '?' } }], maxTokens: 1 }, { timeout: askTimeoutMs })
      return { content: [{ type: 'text', text: answer.model }] }
    })
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: randomUUID, onsessioninitialized: id => transports.set(id, transport) })
    transport.onclose = () => transports.delete(transport.sessionId)
    await server.connect(transport)
    await transport.handleRequest(req, res, body)
  })
  await new Promise(resolve => http.listen(0, '127.0.0.1', resolve))
  return {
    url: `http://127.0.0.1:${http.address().port}/mcp`,
    close: async () => {
      for (const t of transports.values()) await t.close().catch(() => {})
      http.closeAllConnections()
      await new Promise(resolve => http.close(resolve))
    }
  }
}

async function oneTry (url) {
  const client = new Client({ name: 'late-get-race', version: '0.1.0' }, { capabilities: { sampling: {} } })
  client.setRequestHandler(CreateMessageRequestSchema, async () => ({ role: 'assistant', content: { type: 'text', text: 'ok' }, model: 'answered' }))
  // The SDK client sends its GET right after initialize, a moment before the
  // tool call; a client (or network) that is a little slower sends them
  // together: the GET is held until the tool call goes out, then both race.
  let callSent
  const callGoes = new Promise(resolve => { callSent = resolve })
  const racingFetch = async (input, init) => {
    if (init?.method === 'GET' && !new Headers(init.headers).has('last-event-id')) {
      await Promise.race([callGoes, new Promise(resolve => setTimeout(resolve, 2000))])
      if (getAfterMs > 0) await new Promise(resolve => setTimeout(resolve, getAfterMs))
    } else if (typeof init?.body === 'string' && init.body.includes('"tools/call"')) {
      setImmediate(callSent)
    }
    return await fetch(input, init)
  }
  const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: racingFetch })
  try {
    await client.connect(transport)
    // No wait: the client's GET (opened after initialize) and this POST race.
    // A tool that failed (its request timed out upstream) answers isError, not a throw.
    const result = await client.callTool({ name: 'ask', arguments: {} }, undefined, { timeout: askTimeoutMs + 2000 })
    return result.isError !== true && result.content?.[0]?.text === 'answered'
  } catch {
    return false
  } finally {
    await transport.terminateSession().catch(() => {})
    await client.close().catch(() => {})
  }
}

const upstream = await startUpstream()
const config = loadConfig({ UPSTREAM_URL: upstream.url, HOST: '127.0.0.1', ADMIN_HOST: '127.0.0.1', PORT: '0', ADMIN_PORT: '0', LOG_LEVEL: 'silent' })
const store = await RedisEventStore.connect({ url: args.redis, keyPrefix: `late-get-race:${randomBytes(4).toString('hex')}:`, retention: config.retention })
const gateway = await buildGateway(config, { store, logger: pino({ level: 'silent' }) })
const { url } = await gateway.listen()
let lost = 0
for (let i = 0; i < tries; i++) if (!(await oneTry(`${url}/mcp`))) lost++
console.log(JSON.stringify({ gateway: args.dist, store: 'redis', getAfterMs, tries, lost }))
await gateway.close()
await upstream.close()
