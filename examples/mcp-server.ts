// The bundled example upstream: a plain Streamable HTTP MCP server built with the
// official SDK and deliberately WITHOUT an event store, so it cannot resume a stream
// by itself. Whatever it sends while a client is disconnected is lost, unless the
// gateway sits in front of it. Every notification carries a sequence number so a test
// can count exactly what was lost, duplicated or reordered.
import { randomUUID } from 'node:crypto'
import { createServer } from 'node:http'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setImmediate as nextTick, setTimeout as sleep } from 'node:timers/promises'
import { realpathSync } from 'node:fs'
import { fileURLToPath } from 'node:url'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js'
import { z } from 'zod'

export const MCP_PATH = '/mcp'
export const HEALTH_PATH = '/healthz'
export const RESOURCE_METADATA_PATH = '/.well-known/oauth-protected-resource'

const MAX_BODY_BYTES = 4 * 1024 * 1024
const DEFAULT_INTERVAL_MS = 5

/** pino-compatible subset; the default is silent so tests stay quiet. */
export interface ExampleServerLogger {
  debug (obj: object, msg?: string): void
  info (obj: object, msg?: string): void
  warn (obj: object, msg?: string): void
  error (obj: object, msg?: string): void
}

export interface ExampleServerOptions {
  /** 0 (the default) picks a free port. */
  port?: number
  /** Defaults to 127.0.0.1 (the script entry point binds 0.0.0.0). */
  host?: string
  logger?: ExampleServerLogger
  /**
   * Answer every POST with one application/json body instead of an SSE stream (the
   * SDK's enableJsonResponse, chosen per transport, so per server here). Request-
   * related notifications are then dropped by the SDK: use it only to exercise the
   * JSON answer path.
   */
  jsonResponse?: boolean
}

export interface ExampleServer {
  /** The MCP endpoint, for example http://127.0.0.1:41234/mcp */
  url: string
  /** Ends every session and connection, then stops listening. */
  close (): Promise<void>
}

/** `data` of every `notifications/message` the example tools send. */
export interface SequencedData {
  tool: 'stream_notifications' | 'broadcast'
  /** Free label from the tool call, to tell concurrent runs apart. */
  tag?: string
  /** 0-based position in the run. */
  seq: number
  count: number
}

const silentLogger: ExampleServerLogger = {
  debug () {},
  info () {},
  warn () {},
  error () {}
}

const sequenceArgs = {
  count: z.number().int().min(0).max(100_000).describe('How many notifications to send'),
  intervalMs: z.number().int().min(0).max(60_000).optional()
    .describe(`Delay between two notifications (default ${DEFAULT_INTERVAL_MS}; 0 = next event-loop turn)`),
  tag: z.string().max(200).optional().describe('Label copied into every notification')
}

interface Session {
  transport: StreamableHTTPServerTransport
  server: McpServer
  /** Aborts the background broadcasts when the session ends. */
  broadcasts: AbortController
}

function pause (intervalMs: number): Promise<unknown> {
  return intervalMs === 0 ? nextTick() : sleep(intervalMs)
}

function sequencedMessage (data: SequencedData) {
  return {
    method: 'notifications/message' as const,
    params: { level: 'info' as const, logger: data.tool, data }
  }
}

function buildMcpServer (log: ExampleServerLogger, broadcasts: AbortSignal): McpServer {
  const server = new McpServer(
    { name: 'example-mcp-server', version: '0.1.0' },
    { capabilities: { logging: {} } }
  )

  // Related to the request, so the SDK writes them on that POST's SSE stream.
  server.registerTool('stream_notifications', {
    description: 'Sends `count` logging notifications on this request\'s stream, then returns "done <count>"',
    inputSchema: sequenceArgs
  }, async ({ count, intervalMs = DEFAULT_INTERVAL_MS, tag }, extra) => {
    for (let seq = 0; seq < count && !extra.signal.aborted; seq++) {
      await pause(intervalMs)
      await extra.sendNotification(sequencedMessage({ tool: 'stream_notifications', tag, seq, count }))
    }
    log.info({ sessionId: extra.sessionId, requestId: extra.requestId, count }, 'stream_notifications finished')
    return { content: [{ type: 'text', text: `done ${count}` }] }
  })

  // No relatedRequestId: the SDK routes these to the standalone GET stream and drops
  // them silently when no GET stream is open (it has no event store to keep them).
  server.registerTool('broadcast', {
    description: 'Starts sending `count` logging notifications on the standalone stream and returns at once',
    inputSchema: sequenceArgs
  }, async ({ count, intervalMs = DEFAULT_INTERVAL_MS, tag }, extra) => {
    const run = async () => {
      for (let seq = 0; seq < count && !broadcasts.aborted; seq++) {
        await pause(intervalMs)
        if (broadcasts.aborted) break
        await server.server.notification(sequencedMessage({ tool: 'broadcast', tag, seq, count }))
      }
      log.info({ sessionId: extra.sessionId, count }, 'broadcast finished')
    }
    run().catch((err: unknown) => log.warn({ err, sessionId: extra.sessionId }, 'broadcast stopped'))
    return { content: [{ type: 'text', text: `broadcasting ${count}` }] }
  })

  server.registerTool('echo', {
    description: 'Returns the text',
    inputSchema: { text: z.string() }
  }, async ({ text }) => ({ content: [{ type: 'text', text }] }))

  return server
}

function sendJson (res: ServerResponse, status: number, body: unknown): void {
  const payload = JSON.stringify(body)
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) })
  res.end(payload)
}

function sendRpcError (res: ServerResponse, status: number, code: number, message: string): void {
  sendJson(res, status, { jsonrpc: '2.0', error: { code, message }, id: null })
}

async function readJsonBody (req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = []
  let size = 0
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length
    if (size > MAX_BODY_BYTES) throw new RangeError('request body too large')
    chunks.push(chunk)
  }
  return JSON.parse(Buffer.concat(chunks).toString('utf8'))
}

function headerValue (req: IncomingMessage, name: string): string | undefined {
  const value = req.headers[name]
  return Array.isArray(value) ? value[0] : value
}

export async function startExampleServer (options: ExampleServerOptions = {}): Promise<ExampleServer> {
  const log = options.logger ?? silentLogger
  const sessions = new Map<string, Session>()

  async function handleMcp (req: IncomingMessage, res: ServerResponse): Promise<void> {
    const sessionId = headerValue(req, 'mcp-session-id')
    const session = sessionId === undefined ? undefined : sessions.get(sessionId)

    if (req.method === 'POST') {
      let body: unknown
      try {
        body = await readJsonBody(req)
      } catch (err) {
        log.debug({ err }, 'unreadable POST body')
        sendRpcError(res, 400, -32700, 'Parse error')
        return
      }
      if (session !== undefined) {
        await session.transport.handleRequest(req, res, body)
        return
      }
      if (sessionId === undefined && isInitializeRequest(body)) {
        await initializeSession(req, res, body)
        return
      }
    } else if (session !== undefined) {
      // GET opens the standalone stream (409 if one is already open), DELETE ends the session.
      await session.transport.handleRequest(req, res)
      return
    }

    if (sessionId !== undefined) {
      sendRpcError(res, 404, -32001, 'Session not found')
    } else {
      sendRpcError(res, 400, -32000, 'Bad Request: No valid session ID provided')
    }
  }

  async function initializeSession (req: IncomingMessage, res: ServerResponse, body: unknown): Promise<void> {
    const broadcasts = new AbortController()
    const server = buildMcpServer(log, broadcasts.signal)
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: randomUUID,
      // SSE answers by default, so request-related notifications travel on the POST stream.
      enableJsonResponse: options.jsonResponse ?? false,
      onsessioninitialized: (id) => {
        sessions.set(id, { transport, server, broadcasts })
        log.info({ sessionId: id }, 'session initialized')
      }
    })
    transport.onclose = () => {
      broadcasts.abort()
      const id = transport.sessionId
      if (id !== undefined && sessions.delete(id)) log.info({ sessionId: id }, 'session closed')
    }
    // Transport and protocol errors both land here, among them the undeliverable tool
    // result of a cut POST stream ("Failed to send response: ... No connection
    // established for request ID") and a refused second GET ("Conflict: Only one SSE
    // stream is allowed per session").
    server.server.onerror = (err) => log.warn({ err, sessionId: transport.sessionId }, 'mcp error')
    await server.connect(transport)
    await transport.handleRequest(req, res, body)
  }

  const httpServer = createServer((req, res) => {
    const path = new URL(req.url ?? '/', 'http://localhost').pathname
    let handling: Promise<void> | undefined
    if (path === MCP_PATH) {
      handling = handleMcp(req, res)
    } else if (req.method === 'GET' && path === HEALTH_PATH) {
      sendJson(res, 200, { status: 'ok' })
    } else if (req.method === 'GET' && path === RESOURCE_METADATA_PATH) {
      const origin = `http://${req.headers.host ?? 'localhost'}`
      sendJson(res, 200, {
        resource: `${origin}${MCP_PATH}`,
        authorization_servers: [],
        bearer_methods_supported: ['header']
      })
    } else {
      sendJson(res, 404, { error: 'not found' })
    }
    handling?.catch((err: unknown) => {
      log.error({ err }, 'request failed')
      if (!res.headersSent) sendRpcError(res, 500, -32603, 'Internal server error')
      else res.destroy()
    })
  })

  const host = options.host ?? '127.0.0.1'
  await new Promise<void>((resolve, reject) => {
    httpServer.once('error', reject)
    httpServer.listen(options.port ?? 0, host, () => {
      httpServer.off('error', reject)
      resolve()
    })
  })
  const { port } = httpServer.address() as AddressInfo
  const urlHost = host === '0.0.0.0' || host === '::' ? '127.0.0.1' : host.includes(':') ? `[${host}]` : host
  const url = `http://${urlHost}:${port}${MCP_PATH}`
  log.info({ url }, 'example MCP server listening')

  let closing: Promise<void> | undefined
  return {
    url,
    close () {
      closing ??= (async () => {
        // Closing a session's server closes its transport, whose onclose forgets it.
        await Promise.allSettled([...sessions.values()].map(async ({ server }) => server.close()))
        const closed = new Promise<void>((resolve) => httpServer.close(() => resolve()))
        httpServer.closeAllConnections()
        await closed
      })()
      return closing
    }
  }
}

function isMain (): boolean {
  const entry = process.argv[1]
  if (entry === undefined) return false
  try {
    return realpathSync(entry) === realpathSync(fileURLToPath(import.meta.url))
  } catch {
    return false
  }
}

if (isMain()) {
  const { pino } = await import('pino')
  const logger = pino({ name: 'example-mcp-server' })
  const server = await startExampleServer({
    port: Number(process.env.PORT ?? 3000),
    host: process.env.HOST ?? '0.0.0.0',
    logger
  })
  const stop = () => {
    server.close().then(() => process.exit(0), (err: unknown) => {
      logger.error({ err }, 'close failed')
      process.exit(1)
    })
  }
  process.once('SIGINT', stop)
  process.once('SIGTERM', stop)
}
