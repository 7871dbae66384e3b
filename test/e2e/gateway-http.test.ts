// The gateway on the wire: raw HTTP (undici) against a real gateway, header by header
// and event by event, on both stores. The SDK example upstream covers the SSE paths;
// small hand-written upstreams (node:http) give the answers the SDK never gives
// (application/json, 405, the modern era, arbitrary paths, compressed streams).
import t from 'tap'
import type { Test } from 'tap'
import { createServer, request as nodeRequest } from 'node:http'
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { Readable } from 'node:stream'
import { setTimeout as sleep } from 'node:timers/promises'
import { gzipSync } from 'node:zlib'
import { createParser } from 'eventsource-parser'
import { fetch, request } from 'undici'
import type { Dispatcher } from 'undici'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startGateway, type RunningGateway, type StoreKind } from '../fixtures/gateway.js'
import { STANDALONE_STREAM, type EventStore } from '../../src/store/contract.js'
import { waitUntil } from '../fixtures/mcp-client.js'

const KINDS: StoreKind[] = ['memory', 'redis']
const ACCEPT_BOTH = 'application/json, text/event-stream'
const GAP_HEADER = 'x-mcp-gateway-gap'
/** Gap repair (568d8e4) answers resumes of sessions the gateway refuses with 200 instead of 404. */
/** Transports spec: event ids (like session ids) are visible ASCII. */
const VISIBLE_ASCII = /^[\x21-\x7e]+$/

type HeaderMap = Record<string, string | string[] | undefined>

interface SseEvent {
  id?: string
  event?: string
  data: string
}

interface HttpInit {
  method?: string
  headers?: Record<string, string>
  body?: string | Buffer
}

function header (headers: HeaderMap, name: string): string | undefined {
  const value = headers[name]
  return Array.isArray(value) ? value[0] : value
}

/** A JSON-RPC message event (not priming, not a gateway notice). */
function isMessage (e: SseEvent): boolean {
  return e.data !== '' && (e.event === undefined || e.event === 'message')
}

function jsonOf (e: SseEvent): Record<string, unknown> {
  return JSON.parse(e.data) as Record<string, unknown>
}

interface Sequenced { tool: string, tag?: string, seq: number }

/** The example server's sequence numbers in `events`, for one tool (and tag). */
function sequences (events: readonly SseEvent[], tool: string, tag?: string): number[] {
  const out: number[] = []
  for (const e of events) {
    if (!isMessage(e)) continue
    const message = jsonOf(e) as { method?: string, params?: { data?: Sequenced } }
    const data = message.params?.data
    if (message.method !== 'notifications/message' || data?.tool !== tool) continue
    if (tag !== undefined && data.tag !== tag) continue
    out.push(data.seq)
  }
  return out
}

function range (from: number, to: number): number[] {
  const out: number[] = []
  for (let i = from; i <= to; i++) out.push(i)
  return out
}

/** One whole (non-streaming) answer. */
interface Answer {
  status: number
  headers: HeaderMap
  body: Buffer
  text: string
}

async function send (url: string, init: HttpInit = {}): Promise<Answer> {
  const res = await request(url, { method: (init.method ?? 'GET') as Dispatcher.HttpMethod, headers: init.headers, body: init.body })
  const body = Buffer.from(await res.body.arrayBuffer())
  return { status: res.statusCode, headers: res.headers, body, text: body.toString('utf8') }
}

/** node:http, for request headers undici refuses to send (a Connection header naming other fields). */
async function sendWithNode (url: string, init: HttpInit): Promise<Answer> {
  return await new Promise((resolve, reject) => {
    const req = nodeRequest(url, { method: init.method ?? 'GET', headers: init.headers, agent: false }, res => {
      const chunks: Buffer[] = []
      res.on('data', (chunk: Buffer) => chunks.push(chunk))
      res.on('error', reject)
      res.on('end', () => {
        const body = Buffer.concat(chunks)
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body, text: body.toString('utf8') })
      })
    })
    req.on('error', reject)
    req.end(init.body)
  })
}

/**
 * A response body read incrementally as SSE (eventsource-parser), raw bytes kept.
 * Never waited to its end unless the stream should end; aborted at teardown.
 */
class SseReader {
  readonly status: number
  readonly headers: HeaderMap
  readonly events: SseEvent[] = []
  readonly retries: number[] = []
  raw = ''
  /** The server ended the body. */
  ended = false
  /** The body failed (aborted here, or reset). */
  failed = false
  readonly #abort: AbortController

  constructor (status: number, headers: HeaderMap, body: Readable, abort: AbortController) {
    this.status = status
    this.headers = headers
    this.#abort = abort
    const decoder = new TextDecoder()
    const parser = createParser({
      onEvent: ({ id, event, data }) => {
        this.events.push({ data, ...(id !== undefined && { id }), ...(event !== undefined && { event }) })
      },
      onRetry: ms => { this.retries.push(ms) }
    })
    body.on('data', (chunk: Buffer) => {
      const text = decoder.decode(chunk, { stream: true })
      this.raw += text
      parser.feed(text)
    })
    body.on('end', () => { this.ended = true })
    body.on('error', () => { this.failed = true })
  }

  get closed (): boolean { return this.ended || this.failed }
  get messages (): SseEvent[] { return this.events.filter(isMessage) }
  /** The last id this connection received (what a client would send as Last-Event-ID). */
  get lastId (): string | undefined { return this.events.findLast(e => e.id !== undefined)?.id }

  async waitFor (condition: (reader: this) => boolean, timeoutMs = 5000): Promise<boolean> {
    return await waitUntil(() => condition(this), timeoutMs)
  }

  async waitForEnd (timeoutMs = 5000): Promise<boolean> {
    return await this.waitFor(r => r.closed, timeoutMs)
  }

  abort (): void {
    if (!this.closed) this.#abort.abort()
  }
}

/** Opens a request whose answer is read as SSE; fails if no response head arrives in time. */
async function openSse (t: Test, url: string, init: HttpInit = {}, headTimeoutMs = 5000): Promise<SseReader> {
  const abort = new AbortController()
  const timer = setTimeout(() => abort.abort(new Error(`no response head within ${headTimeoutMs} ms`)), headTimeoutMs)
  try {
    const res = await request(url, { method: (init.method ?? 'GET') as Dispatcher.HttpMethod, headers: init.headers, body: init.body, signal: abort.signal })
    const reader = new SseReader(res.statusCode, res.headers, res.body, abort)
    t.teardown(() => reader.abort())
    return reader
  } finally {
    clearTimeout(timer)
  }
}

/** The first event block of a raw SSE body (up to the first blank line). */
function firstBlock (raw: string): string {
  return raw.split('\n\n')[0] ?? ''
}

function isPriming (reader: SseReader, e: SseEvent | undefined): boolean {
  return e !== undefined && e.id !== undefined && e.data === '' && reader.retries.length > 0
}

/** A raw Streamable HTTP client: JSON-RPC bodies and headers written by hand. */
class RawMcp {
  readonly url: string
  readonly version: string | null
  readonly extra: Record<string, string>
  readonly #t: Test
  sessionId: string | undefined
  #id = 0

  constructor (t: Test, url: string, version: string | null, extra: Record<string, string> = {}) {
    this.#t = t
    this.url = url
    this.version = version
    this.extra = extra
  }

  headers (more: Record<string, string> = {}): Record<string, string> {
    const h: Record<string, string> = { accept: ACCEPT_BOTH, 'content-type': 'application/json', ...this.extra }
    if (this.version !== null) h['mcp-protocol-version'] = this.version
    if (this.sessionId !== undefined) h['mcp-session-id'] = this.sessionId
    return { ...h, ...more }
  }

  nextId (): number { return ++this.#id }

  /** initialize (read to its end) and notifications/initialized; returns the initialize answer. */
  async initialize (): Promise<SseReader> {
    const body = JSON.stringify({
      jsonrpc: '2.0',
      id: this.nextId(),
      method: 'initialize',
      params: { protocolVersion: this.version ?? '2025-03-26', capabilities: {}, clientInfo: { name: 'raw-http-test', version: '0.0.0' } }
    })
    const answer = await openSse(this.#t, this.url, { method: 'POST', headers: this.headers(), body })
    if (!await answer.waitForEnd()) throw new Error('initialize answer did not end')
    this.sessionId = header(answer.headers, 'mcp-session-id')
    if (answer.status !== 200 || this.sessionId === undefined) throw new Error(`initialize failed: ${answer.status} ${answer.raw}`)
    const ack = await send(this.url, { method: 'POST', headers: this.headers(), body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }) })
    if (ack.status !== 202) throw new Error(`notifications/initialized: ${ack.status} ${ack.text}`)
    return answer
  }

  /** tools/call; the answer is read incrementally. */
  async callTool (name: string, args: Record<string, unknown>, more: Record<string, string> = {}): Promise<{ reader: SseReader, id: number }> {
    const id = this.nextId()
    const body = JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name, arguments: args } })
    return { reader: await openSse(this.#t, this.url, { method: 'POST', headers: this.headers(more), body }), id }
  }

  /** broadcast on the standalone stream; its own answer is read to the end. */
  async broadcast (count: number, tag: string, intervalMs = 0): Promise<void> {
    const { reader } = await this.callTool('broadcast', { count, tag, intervalMs })
    if (!await reader.waitForEnd() || reader.status !== 200) throw new Error(`broadcast failed: ${reader.status} ${reader.raw}`)
  }

  getHeaders (lastEventId?: string, more: Record<string, string> = {}): Record<string, string> {
    const h = this.headers({ accept: 'text/event-stream', ...(lastEventId !== undefined && { 'last-event-id': lastEventId }), ...more })
    delete h['content-type']
    return h
  }

  async get (lastEventId?: string, more: Record<string, string> = {}, headTimeoutMs?: number): Promise<SseReader> {
    return await openSse(this.#t, this.url, { method: 'GET', headers: this.getHeaders(lastEventId, more) }, headTimeoutMs)
  }
}

/** The final JSON-RPC answer to request `id` among `events`, if it arrived. */
function responseTo (events: readonly SseEvent[], id: number): Record<string, unknown> | undefined {
  for (const e of events) {
    if (!isMessage(e)) continue
    const message = jsonOf(e)
    if (message.id === id && (message.result !== undefined || message.error !== undefined)) return message
  }
  return undefined
}

/** `id`: the JSON-RPC id of the request's body, which the error answer carries (null without one). */
function isJsonRpcError (t: Test, answer: Answer, status: number, what: string, todo?: string, id: string | number | null = null): void {
  const extra = todo === undefined ? {} : { todo }
  t.equal(answer.status, status, `${what}: HTTP ${status}`, extra)
  t.match(header(answer.headers, 'content-type') ?? '', /^application\/json/, `${what}: JSON body`, extra)
  let body: { jsonrpc?: unknown, id?: unknown, error?: { code?: unknown, message?: unknown } } = {}
  try {
    body = JSON.parse(answer.text) as typeof body
  } catch {
    t.fail(`${what}: the body is JSON (got ${answer.text.slice(0, 80).replace(/\n/g, '\\n')})`, extra)
    return
  }
  t.equal(body.jsonrpc, '2.0', `${what}: a JSON-RPC message`, extra)
  t.equal(body.id, id, `${what}: id ${String(id)}`, extra)
  t.type(body.error?.code, 'number', `${what}: error.code`, extra)
  t.type(body.error?.message, 'string', `${what}: error.message`, extra)
}

/** Parts of a gateway event id: <epoch>.<stream>.<seq base 36> (src/protocol/event-id.ts). */
function idParts (id: string): { epoch: string, stream: string, seq: number } {
  const [epoch = '', stream = '', seq = ''] = id.split('.')
  return { epoch, stream, seq: Number.parseInt(seq, 36) }
}

function otherToken (token: string): string {
  return (token.startsWith('a') ? 'b' : 'a') + token.slice(1)
}

async function metricsText (gw: RunningGateway): Promise<string> {
  return (await send(`${gw.adminUrl}/metrics`)).text
}

function metricValue (text: string, name: string): number {
  const match = new RegExp(`^${name} (\\S+)$`, 'm').exec(text)
  return match === null ? Number.NaN : Number(match[1])
}

/** Resumes observed in mcpgw_replay_events, their events, resumes timed, and mcpgw_events_replayed_total; since `before` when given. */
async function replayMetrics (gw: RunningGateway, before?: number[]): Promise<number[]> {
  const text = await metricsText(gw)
  const now = ['mcpgw_replay_events_count', 'mcpgw_replay_events_sum', 'mcpgw_replay_duration_seconds_count', 'mcpgw_events_replayed_total'].map(name => metricValue(text, name))
  return before === undefined ? now : now.map((v, i) => v - (before[i] as number))
}

/**
 * Opens the standalone GET without waiting for its response head, and resolves
 * once the gateway has attached it (the upstream GET is then held, so a
 * broadcast is recorded). Returns the pending answer (wrapped: an async function
 * returning a promise would wait for it).
 */
async function attachStandalone (gw: RunningGateway, mcp: RawMcp, headTimeoutMs?: number): Promise<{ pending: Promise<SseReader> }> {
  const before = gw.gateway.hub.clientCount
  const pending = mcp.get(undefined, {}, headTimeoutMs)
  pending.catch(() => {})
  if (!await waitUntil(() => gw.gateway.hub.clientCount > before, 5000)) throw new Error('the gateway never attached the standalone GET')
  return { pending }
}

// ---------------------------------------------------------------------------
// A hand-written upstream

interface SeenRequest {
  method: string
  url: string
  headers: IncomingHttpHeaders
  body: string
}

interface FakeUpstream {
  /** http://127.0.0.1:<port>/mcp */
  url: string
  origin: string
  seen: SeenRequest[]
  /** Requests whose connection closed before the upstream finished its answer. */
  cutShort: string[]
  close (): Promise<void>
}

const FAKE_INIT_BODY = '{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"fake","version":"1"}}}  \n'
const MODERN = '2026-07-28'
const MODERN_SSE = 'id: up-1\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"one"}}\n\n' +
  'data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"two"}}\n\n' +
  'id: up-3\ndata: {"jsonrpc":"2.0","id":7,"result":{"content":[]}}\n\n'
const PLAIN_SSE = 'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"zipped"}}\n\n' +
  'event: message\ndata: {"jsonrpc":"2.0","id":5,"result":{"content":[]}}\n\n'

async function startFakeUpstream (t: Test): Promise<FakeUpstream> {
  const seen: SeenRequest[] = []
  const cutShort: string[] = []
  let sessions = 0

  const handle = (req: IncomingMessage, res: ServerResponse, body: string): void => {
    const path = new URL(req.url ?? '/', 'http://x').pathname
    const version = header(req.headers, 'mcp-protocol-version')
    if (path !== '/mcp') {
      const echo = JSON.stringify({ method: req.method, url: req.url, body })
      res.writeHead(200, { 'content-type': 'application/json', 'x-echo': 'yes' })
      res.end(echo)
      return
    }
    if (req.method === 'GET') {
      res.writeHead(405, { allow: 'POST, DELETE', 'content-type': 'application/json', 'x-upstream': 'fake' })
      res.end('{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Method not allowed."}}')
      return
    }
    if (req.method === 'DELETE') {
      res.writeHead(200).end()
      return
    }
    const message = (body === '' ? {} : JSON.parse(body)) as { id?: number, method?: string, params?: { name?: string } }
    if (version !== undefined && version >= MODERN) {
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
      if (message.params?.name === 'hold') {
        // Streams one event, then waits: only the client going away ends it.
        res.write('id: up-1\ndata: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progress":1}}\n\n')
        res.on('close', () => { if (!res.writableFinished) cutShort.push('hold') })
        return
      }
      res.end(MODERN_SSE)
      return
    }
    if (message.method === 'initialize') {
      res.writeHead(200, {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(FAKE_INIT_BODY),
        'mcp-session-id': `fake-session-${++sessions}`,
        connection: 'x-custom',
        'x-custom': 'hop-by-hop',
        'x-end-to-end': 'kept'
      })
      res.end(FAKE_INIT_BODY)
      return
    }
    if (message.id === undefined) {
      res.writeHead(202).end()
      return
    }
    if (message.params?.name === 'gzip') {
      // As an upstream behind compression middleware does when the client accepts gzip.
      const gzip = /\bgzip\b/.test(header(req.headers, 'accept-encoding') ?? '')
      res.writeHead(200, { 'content-type': 'text/event-stream', ...(gzip && { 'content-encoding': 'gzip' }) })
      // Answers the request's own id (the gateway checks that the response is there).
      const sse = PLAIN_SSE.replace('"id":5', `"id":${JSON.stringify(message.id)}`)
      res.end(gzip ? gzipSync(sse) : sse)
      return
    }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ jsonrpc: '2.0', id: message.id, result: {} }))
  }

  const server = createServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (chunk: Buffer) => chunks.push(chunk))
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8')
      seen.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body })
      handle(req, res, body)
    })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  const origin = `http://127.0.0.1:${port}`
  const upstream: FakeUpstream = {
    url: `${origin}/mcp`,
    origin,
    seen,
    cutShort,
    async close () {
      server.closeAllConnections()
      await new Promise<void>(resolve => server.close(() => resolve()))
    }
  }
  t.teardown(() => upstream.close())
  return upstream
}

// ---------------------------------------------------------------------------
// The SDK example upstream, on both stores

for (const kind of KINDS) {
  t.test(`${kind} store`, async t => {
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    const gw = await startGateway(t, kind, upstream.url)
    const mcpUrl = `${gw.url}/mcp`
    /** Every session id this gateway saw, for the metrics check. */
    const sessionIds: string[] = []
    const session = async (t: Test, version: string | null, extra: Record<string, string> = {}): Promise<RawMcp> => {
      const mcp = new RawMcp(t, mcpUrl, version, extra)
      await mcp.initialize()
      sessionIds.push(mcp.sessionId as string)
      return mcp
    }

    t.test('initialize via POST: the upstream answer, under the gateway\'s session id', async t => {
      const mcp = new RawMcp(t, mcpUrl, '2025-06-18')
      const answer = await mcp.initialize()
      sessionIds.push(mcp.sessionId as string)
      t.equal(answer.status, 200)
      t.match(header(answer.headers, 'content-type') ?? '', /^text\/event-stream/)
      t.match(mcp.sessionId, /^mg1\.[\w-]{22}\.[0-9a-f-]{36}$/, 'the gateway\'s id, around the upstream\'s first id')
      const record = await gw.gateway.store.getSession(mcp.sessionId as string)
      t.match(record?.upstreamSessionId, /^[0-9a-f-]{36}$/, 'the upstream\'s id is kept in the record')
      t.ok((mcp.sessionId as string).endsWith(record?.upstreamSessionId as string), 'the same the id carries')
      t.ok(answer.ended, 'the initialize stream ends after its response')
      const result = responseTo(answer.events, 1)?.result as { protocolVersion?: string, serverInfo?: { name?: string } } | undefined
      t.equal(result?.protocolVersion, '2025-06-18')
      t.equal(result?.serverInfo?.name, 'example-mcp-server', 'the upstream answered')
    })

    t.test('priming', async t => {
      for (const version of ['2025-11-25', '2025-06-18', '2025-03-26', null]) {
        t.test(`MCP-Protocol-Version ${version ?? '(absent)'}`, async t => {
          const priming = version === '2025-11-25'
          const mcp = await session(t, version)
          const calls = await mcp.callTool('stream_notifications', { count: 3, intervalMs: 0, tag: 'p' })
          t.ok(await calls.reader.waitForEnd(), 'the request stream ends')
          const firstNotification = calls.reader.messages[0]?.id as string
          const resumed = await mcp.get(firstNotification)
          t.ok(await resumed.waitForEnd(), 'the resumed request stream ends')
          const { pending } = await attachStandalone(gw, mcp)
          await mcp.broadcast(3, 'p')
          const standalone = await pending
          t.ok(await standalone.waitFor(r => r.messages.length >= 3), 'standalone events arrive')
          standalone.abort()
          const streams = { 'POST answer': calls.reader, 'standalone GET': standalone, 'resume GET': resumed }
          for (const [name, reader] of Object.entries(streams)) {
            t.equal(reader.status, 200, `${name}: 200`)
            if (priming) {
              t.ok(isPriming(reader, reader.events[0]), `${name}: starts with a priming event (id, empty data, retry)`)
              t.match(firstBlock(reader.raw), /^retry: \d+$/m, `${name}: the retry hint is in the priming event`)
              t.equal(reader.events.filter(e => e.data === '').length, 1, `${name}: one priming event only`)
            } else {
              t.same(reader.events.filter(e => e.data === ''), [], `${name}: no event with empty data`)
            }
            t.ok(reader.messages.length > 0 && reader.messages.every(e => e.id !== undefined && e.id !== ''), `${name}: every message event has an id`)
          }
          t.same(sequences(resumed.events, 'stream_notifications', 'p'), [1, 2], 'the resume replays after the given id')
          t.ok(responseTo(resumed.events, calls.id), 'the resume ends with the tool result')
        })
      }
    })

    t.test('event ids: visible ASCII, unique in the session, per stream', async t => {
      const mcp = await session(t, '2025-11-25')
      const standalone = await mcp.get()
      const first = await mcp.callTool('stream_notifications', { count: 5, intervalMs: 0, tag: 'a' })
      const second = await mcp.callTool('stream_notifications', { count: 5, intervalMs: 0, tag: 'b' })
      await mcp.broadcast(5, 'ids')
      t.ok(await first.reader.waitForEnd() && await second.reader.waitForEnd(), 'both request streams end')
      t.ok(await standalone.waitFor(r => r.messages.length >= 5), 'the broadcast arrives')
      standalone.abort()
      const streams = [standalone, first.reader, second.reader]
      const all: string[] = []
      for (const reader of streams) {
        const ids = reader.events.map(e => e.id).filter(id => id !== undefined)
        t.ok(ids.every(id => VISIBLE_ASCII.test(id)), `visible ASCII: ${ids.slice(0, 2).join(' ')} ...`)
        t.equal(new Set(ids).size, ids.length, 'unique within the stream (priming included)')
        all.push(...ids)
      }
      t.equal(new Set(all).size, all.length, 'unique across the session\'s streams')
      const standaloneIds = new Set(standalone.events.map(e => e.id))
      t.notOk(first.reader.events.some(e => standaloneIds.has(e.id)), 'request stream ids differ from the standalone stream\'s')

      // Reconnects: each new connection opens with a priming event of its own.
      t.ok(await waitUntil(() => gw.gateway.hub.clientCount === 0, 2000), 'the gateway saw the drop')
      const reconnect = await mcp.get()
      const resume = await mcp.get(first.reader.messages[1]?.id)
      t.ok(await reconnect.waitFor(r => r.events.length > 0) && await resume.waitForEnd(), 'both answer')
      reconnect.abort()
      const primingIds = [reconnect.events[0]?.id, resume.events[0]?.id]
      t.ok(primingIds.every(id => id !== undefined && VISIBLE_ASCII.test(id)), 'priming ids on reconnects')
      t.same(primingIds.filter(id => all.includes(id as string)), [], 'a reconnect\'s priming event does not reuse the id of an event already sent')
    })

    t.test('a POST stream dropped mid-way resumes by GET + Last-Event-ID: the rest, live, then the response, then the end', async t => {
      const mcp = await session(t, '2025-11-25')
      // 1.5 s of notifications: the tool must still be running when the resume has its history.
      const COUNT = 100
      const call = await mcp.callTool('stream_notifications', { count: COUNT, intervalMs: 15, tag: 'r' })
      t.ok(await call.reader.waitFor(r => sequences(r.events, 'stream_notifications').length >= 5), 'first notifications arrive')
      call.reader.abort()
      const seen = sequences(call.reader.events, 'stream_notifications')
      const lastId = call.reader.lastId as string
      t.ok(seen.length < COUNT, `dropped after ${seen.length} of ${COUNT}`)
      await sleep(100)
      const before = await replayMetrics(gw)
      const resumed = await mcp.get(lastId)
      t.equal(resumed.status, 200)
      t.equal(header(resumed.headers, GAP_HEADER), undefined, 'no gap')
      t.ok(await resumed.waitFor(r => r.messages.length > 0), 'events arrive')
      t.ok(isPriming(resumed, resumed.events[0]), 'priming first')
      t.ok(!resumed.closed && sequences(resumed.events, 'stream_notifications').length < COUNT - seen.length, 'the history comes at once, the rest live: the tool is still running')
      t.ok(await resumed.waitForEnd(10_000), 'the resumed stream ends')
      t.notOk(resumed.failed, 'a clean end, not a reset')
      t.same(sequences(resumed.events, 'stream_notifications'), range(seen.length, COUNT - 1), 'exactly the events after the id, in order')
      const last = resumed.messages.at(-1)
      t.same(last === undefined ? undefined : jsonOf(last), { jsonrpc: '2.0', id: call.id, result: { content: [{ type: 'text', text: `done ${COUNT}` }] } }, 'the JSON-RPC response comes last')
      const sent = new Set(call.reader.events.map(e => e.id))
      t.notOk(resumed.messages.some(e => sent.has(e.id)), 'nothing the client saw is sent again')
      const [resumes, events, timed, replayedTotal] = await replayMetrics(gw, before)
      t.equal(resumes, 1, 'mcpgw_replay_events: one resume observed')
      t.equal(timed, 1, 'mcpgw_replay_duration_seconds: one resume observed')
      t.ok((events as number) > 0, `mcpgw_replay_events: the history was replayed (${events} events)`)
      t.equal(events, replayedTotal, 'the events it observed are those counted replayed')
    })

    t.test('GET without Last-Event-ID after a drop gets what was recorded meanwhile (no priming)', async t => {
      const mcp = await session(t, '2025-03-26')
      const { pending } = await attachStandalone(gw, mcp)
      await mcp.broadcast(30, 'gap', 20)
      const reader = await pending
      t.ok(await reader.waitFor(r => r.messages.length >= 5), 'first broadcasts arrive')
      reader.abort()
      const before = sequences(reader.events, 'broadcast', 'gap')
      t.ok(await waitUntil(() => gw.gateway.hub.clientCount === 0, 2000), 'the gateway saw the drop')
      await sleep(800) // the broadcast runs on with no client attached
      const again = await mcp.get()
      t.equal(again.status, 200)
      t.ok(await again.waitFor(r => sequences(r.events, 'broadcast', 'gap').includes(29), 5000), 'the reconnect receives up to the last broadcast')
      again.abort()
      const after = sequences(again.events, 'broadcast', 'gap')
      const lastBefore = before.at(-1) ?? -1
      t.comment(`before the drop: 0-${lastBefore}; after the reconnect: ${after[0]}-${after.at(-1)}`)
      t.same(after, range(after[0] ?? 0, 29), 'contiguous, in order')
      // The cursor is the last event written to the dropped connection: what was in flight
      // to the client is not sent again (one event, or a few when a slow store append let
      // 20 ms broadcasts arrive together and go out in one write).
      t.ok((after[0] ?? 99) > lastBefore && (after[0] ?? 99) <= lastBefore + 5, 'it continues where the dropped connection stopped (what was in flight aside)')
      t.same(again.events.filter(e => e.data === ''), [], 'no empty-data event for a 2025-03-26 client')
    })

    t.test('gaps and refused resumes', async t => {
      const gap = await startGateway(t, kind, upstream.url, { RETENTION_MAX_EVENTS: '10' })
      const url = `${gap.url}/mcp`
      const a = new RawMcp(t, url, '2025-11-25')
      await a.initialize()
      const standalone = await a.get()
      await a.broadcast(50, 'A')
      t.ok(await standalone.waitFor(r => r.messages.length >= 50), '50 broadcasts arrive')
      standalone.abort()
      const firstId = standalone.messages[0]?.id as string
      const { epoch } = idParts(firstId)
      const call = await a.callTool('stream_notifications', { count: 3, intervalMs: 0, tag: 'A' })
      t.ok(await call.reader.waitForEnd(), 'a request stream of session A')
      const requestId = call.reader.messages[0]?.id as string

      t.test('Last-Event-ID older than retention: gap header, gateway-gap event first, then the retained events', async t => {
        const before = await replayMetrics(gap)
        const reader = await a.get(firstId)
        t.equal(reader.status, 200)
        t.equal(header(reader.headers, GAP_HEADER), 'trimmed')
        t.ok(await reader.waitFor(r => r.messages.length >= 10), 'the retained events arrive')
        await sleep(100)
        reader.abort()
        t.equal(reader.events[0]?.event, 'gateway-gap', 'the gap notice comes first')
        const notice = JSON.parse(reader.events[0]?.data ?? '{}') as Record<string, unknown>
        t.match(notice, { reason: 'trimmed', missingFrom: 2, missingTo: 40 }, 'the notice names the missing range')
        t.same(sequences(reader.events, 'broadcast', 'A'), range(40, 49), 'then exactly the retained events')
        t.same(await replayMetrics(gap, before), [1, 10, 1, 10], 'the standalone resume observed in the replay histograms: 10 events')
      })

      t.test('unknown stream', async t => {
        const reader = await a.get(`${epoch}.zzzzzzzzzzzz.1`)
        t.equal(reader.status, 200)
        t.equal(header(reader.headers, GAP_HEADER), 'unknown_stream')
        t.ok(await reader.waitForEnd(), 'the stream ends')
        t.equal(reader.events[0]?.event, 'gateway-gap')
        t.match(JSON.parse(reader.events[0]?.data ?? '{}'), { reason: 'unknown_stream' })
        t.same(reader.messages, [], 'nothing replayed')
      })

      t.test('wrong epoch', async t => {
        const reader = await a.get(`${otherToken(epoch)}.s.5`)
        t.equal(reader.status, 200)
        t.equal(header(reader.headers, GAP_HEADER), 'epoch')
        t.ok(await reader.waitFor(r => r.messages.length >= 10), 'what the store holds is replayed')
        reader.abort()
        t.equal(reader.events[0]?.event, 'gateway-gap')
        t.match(JSON.parse(reader.events[0]?.data ?? '{}'), { reason: 'epoch' })
        t.same(sequences(reader.events, 'broadcast', 'A'), range(40, 49))

        const onRequest = await a.get(`${otherToken(epoch)}.${idParts(requestId).stream}.1`)
        t.equal(header(onRequest.headers, GAP_HEADER), 'epoch', 'a request stream id with a wrong epoch too')
        t.ok(await onRequest.waitForEnd(), 'the (ended) request stream ends')
      })

      t.test('an id beyond the stream\'s end', async t => {
        const reader = await a.get(`${epoch}.s.${(5000).toString(36)}`)
        t.equal(header(reader.headers, GAP_HEADER), 'future_id')
        reader.abort()
      })

      t.test('malformed Last-Event-ID: 400 with a JSON-RPC error', async t => {
        for (const bad of ['garbage', 'a.b', `${epoch}.s.01`, 'x'.repeat(80), `${epoch}.s.-1`]) {
          const answer = await send(url, { headers: a.getHeaders(bad) })
          isJsonRpcError(t, answer, 400, `Last-Event-ID ${bad.slice(0, 20)}`)
        }
      })

      t.test('an id of another session never replays that session\'s events', async t => {
        const ofA = new Set([...standalone.messages, ...call.reader.messages].map(e => e.data))
        const b = new RawMcp(t, url, '2025-11-25')
        await b.initialize()
        const viaStandalone = await b.get(firstId)
        t.equal(viaStandalone.status, 200)
        t.equal(header(viaStandalone.headers, GAP_HEADER), 'epoch', 'told the id is not of this session\'s history')
        const viaRequest = await b.get(requestId)
        t.equal(header(viaRequest.headers, GAP_HEADER), 'unknown_stream')
        t.ok(await viaRequest.waitForEnd(), 'the resume of a stream B does not have ends')
        await sleep(300)
        viaStandalone.abort()
        t.notOk(viaStandalone.events.some(e => ofA.has(e.data)), 'nothing of A on B\'s standalone resume')
        t.notOk(viaRequest.events.some(e => ofA.has(e.data)), 'nothing of A on B\'s request-stream resume')
        t.notOk(viaRequest.messages.some(e => JSON.stringify(jsonOf(e)).includes('done 3')), 'not A\'s tool result')
      })
    })

    t.test('DELETE', async t => {
      t.test('passes through, then the records are gone', async t => {
        const mcp = await session(t, '2025-11-25')
        const call = await mcp.callTool('stream_notifications', { count: 3, intervalMs: 0 })
        t.ok(await call.reader.waitForEnd())
        const lastId = call.reader.messages[0]?.id as string
        const check = await mcp.get(lastId)
        t.ok(await check.waitForEnd(), 'resumable before the DELETE')
        t.ok(check.messages.length >= 2, 'replayed before the DELETE')
        const deleted = await send(mcp.url, { method: 'DELETE', headers: mcp.headers() })
        t.equal(deleted.status, 200, 'the upstream\'s answer')
        t.equal(await gw.gateway.store.getSession(mcp.sessionId as string), null, 'the store holds no record of the session')
        isJsonRpcError(t, await send(mcp.url, { headers: mcp.getHeaders() }), 404, 'standalone GET after DELETE')
        // The gateway's own 404 (the session is deleted, not lost: nothing goes upstream), for request 98.
        isJsonRpcError(t, await send(mcp.url, { method: 'POST', headers: mcp.headers(), body: '{"jsonrpc":"2.0","id":98,"method":"ping"}' }), 404, 'POST after DELETE', undefined, 98)
        isJsonRpcError(t, await send(mcp.url, { headers: mcp.getHeaders(lastId) }), 404, 'resume after DELETE')
      })

      t.test('an upstream 404 for the session: established upstream again, the request answered, the history kept', async t => {
        const mcp = await session(t, '2025-11-25')
        const call = await mcp.callTool('stream_notifications', { count: 2, intervalMs: 0 })
        t.ok(await call.reader.waitForEnd())
        const firstId = call.reader.messages[0]?.id as string
        // The upstream forgets the session behind the gateway's back (a restart, an expiry).
        const upstreamId = (await gw.gateway.store.getSession(mcp.sessionId as string))?.upstreamSessionId as string
        const direct = await send(upstream.url, { method: 'DELETE', headers: { ...mcp.headers(), 'mcp-session-id': upstreamId } })
        t.equal(direct.status, 200, '(ended at the upstream directly)')
        const answered = await send(mcp.url, { method: 'POST', headers: mcp.headers(), body: '{"jsonrpc":"2.0","id":99,"method":"ping"}' })
        t.equal(answered.status, 200, 'the request is answered, on a new upstream session')
        const moved = (await gw.gateway.store.getSession(mcp.sessionId as string))?.upstreamSessionId
        t.ok(moved !== undefined && moved !== upstreamId, 'the record points at the new upstream session')
        t.equal(header(answered.headers, 'mcp-session-id') ?? mcp.sessionId, mcp.sessionId, 'the client\'s session id is unchanged')
        const resumed = await mcp.get(firstId)
        t.ok(await resumed.waitForEnd(), 'a resume of the earlier answer is still served from the store')
        t.ok(resumed.messages.length >= 1, 'with its events')
      })

      t.test('unknown session: 404 with a JSON-RPC error', async t => {
        const mcp = new RawMcp(t, mcpUrl, '2025-11-25')
        mcp.sessionId = 'no-such-session'
        isJsonRpcError(t, await send(mcp.url, { method: 'DELETE', headers: mcp.headers() }), 404, 'DELETE of an unknown session')
      })

      t.test('another principal: 404, nothing replayed, nothing deleted', async t => {
        const alice = await session(t, '2025-11-25', { authorization: 'Bearer alice' })
        const call = await alice.callTool('stream_notifications', { count: 3, intervalMs: 0, tag: 'alice' })
        t.ok(await call.reader.waitForEnd())
        const firstId = call.reader.messages[0]?.id as string
        const mallory = new RawMcp(t, mcpUrl, '2025-11-25', { authorization: 'Bearer mallory' })
        mallory.sessionId = alice.sessionId
        const resume = await send(mcpUrl, { headers: mallory.getHeaders(firstId) })
        isJsonRpcError(t, resume, 404, 'resume by another principal')
        t.notMatch(resume.text, 'alice', 'nothing of the session in the answer')
        t.notMatch(resume.text, 'done 3', 'not its tool result')
        isJsonRpcError(t, await send(mcpUrl, { headers: mallory.getHeaders() }), 404, 'standalone GET by another principal')
        isJsonRpcError(t, await send(mcpUrl, { method: 'DELETE', headers: mallory.headers() }), 404, 'DELETE by another principal')
        const noAuth = new RawMcp(t, mcpUrl, '2025-11-25')
        noAuth.sessionId = alice.sessionId
        const anonymous = await send(mcpUrl, { headers: noAuth.getHeaders(firstId) })
        isJsonRpcError(t, anonymous, 404, 'resume without credentials')
        t.notMatch(anonymous.text, 'alice', 'nothing of the session in that answer either')
        const still = await alice.get(firstId)
        t.ok(await still.waitForEnd(), 'the owner still resumes')
        t.same(sequences(still.events, 'stream_notifications', 'alice'), [1, 2], 'the owner\'s records are intact')
      })
    })

    t.test('a new connection to a stream supersedes the older one (no 409)', async t => {
      const mcp = await session(t, '2025-11-25')
      const older = await mcp.get()
      t.ok(await older.waitFor(r => r.events.length >= 1), 'the first standalone connection is open')
      const newer = await mcp.get()
      t.equal(newer.status, 200, 'the second standalone GET is accepted')
      t.ok(await older.waitForEnd(2000), 'the older connection ends')
      await mcp.broadcast(3, 'sup')
      t.ok(await newer.waitFor(r => r.messages.length >= 3), 'the newer one carries the stream')
      newer.abort()

      const call = await mcp.callTool('stream_notifications', { count: 30, intervalMs: 15 })
      t.ok(await call.reader.waitFor(r => r.messages.length >= 3))
      call.reader.abort()
      const firstResume = await mcp.get(call.reader.lastId)
      t.ok(await firstResume.waitFor(r => r.messages.length >= 2), 'a first resume is live')
      const secondResume = await mcp.get(firstResume.lastId)
      t.equal(secondResume.status, 200, 'a second resume of the same request stream is accepted')
      t.ok(await firstResume.waitForEnd(2000), 'the first resume ends')
      t.ok(await secondResume.waitForEnd(5000), 'the second resume runs to the end of the stream')
      t.ok(responseTo(secondResume.events, call.id), 'and delivers the tool result')
    })

    t.test('admin endpoints', async t => {
      const health = await send(`${gw.adminUrl}/healthz`)
      t.equal(health.status, 200)
      const ready = await send(`${gw.adminUrl}/readyz`)
      t.equal(ready.status, 200)
      t.match(JSON.parse(ready.text), { status: 'ready', store: kind })
      const metrics = await metricsText(gw)
      t.ok(metricValue(metrics, 'mcpgw_events_recorded_total') > 0, 'mcpgw_events_recorded_total counts the recorded events')
      t.ok(metricValue(metrics, 'mcpgw_upstream_reads_total') > 0, 'mcpgw_upstream_reads_total counts the upstream reads')
      t.ok(sessionIds.length > 3, `${sessionIds.length} sessions were made`)
      t.same(sessionIds.filter(id => metrics.includes(id)), [], 'no session id anywhere in the metrics')
      t.notMatch(metrics, /alice|mallory|Bearer/, 'no credentials in the metrics')

      const mcp = await session(t, '2025-11-25')
      const open = await mcp.get()
      t.ok(await open.waitFor(r => r.events.length >= 1))
      await gw.gateway.drain()
      const draining = await send(`${gw.adminUrl}/readyz`)
      t.equal(draining.status, 503, 'readyz 503 while draining')
      t.match(JSON.parse(draining.text), { status: 'draining' })
      t.ok(await open.waitForEnd(2000), 'open client streams are closed')
      t.ok(open.retries.length >= 2, 'with a retry hint')
      const refused = await send(mcpUrl, { method: 'POST', headers: mcp.headers(), body: '{"jsonrpc":"2.0","id":9,"method":"ping"}' })
      isJsonRpcError(t, refused, 503, 'a request while draining')
      t.ok(header(refused.headers, 'retry-after'), 'with Retry-After')
    })
  })
}

// ---------------------------------------------------------------------------
// Memory store only: the hand-written upstream and the configuration bounds

for (const kind of KINDS) {
  t.test(`${kind} store: a resume asks for its first page with the stream's state, not after it`, async t => {
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    const calls: string[] = []
    const gw = await startGateway(t, kind, upstream.url, {}, store => {
      const state = store.state.bind(store)
      const read = store.read.bind(store)
      store.state = async (sessionId, streamId) => {
        calls.push(`state ${streamId}`)
        const answer = await state(sessionId, streamId)
        calls.push(`state answered ${streamId}`)
        return answer
      }
      store.read = async (sessionId, streamId, afterSeq, limit, maxBytes) => {
        calls.push(`read ${streamId} after ${afterSeq}`)
        return await read(sessionId, streamId, afterSeq, limit, maxBytes)
      }
    })
    const mcp = new RawMcp(t, `${gw.url}/mcp`, '2025-11-25')
    await mcp.initialize()
    const call = await mcp.callTool('stream_notifications', { count: 20, intervalMs: 0, tag: 'f' })
    t.ok(await call.reader.waitForEnd(), 'the tool call ends')
    const from = call.reader.messages[4]?.id as string
    const { stream, seq } = idParts(from)
    calls.length = 0
    const resumed = await mcp.get(from)
    t.ok(await resumed.waitForEnd(), 'the resume ends')
    t.same(sequences(resumed.events, 'stream_notifications', 'f'), range(5, 19), 'exactly the events after the id')
    t.ok(responseTo(resumed.events, call.id), 'then the tool result')
    const readAt = calls.indexOf(`read ${stream} after ${seq}`)
    const answeredAt = calls.indexOf(`state answered ${stream}`)
    t.ok(readAt >= 0 && answeredAt >= 0 && readAt < answeredAt, `the first page was asked for before the state came back (${calls.slice(0, 4).join(', ')})`)
    // The page was written: the follower's reads start after it, not at the resumed id again.
    const reads = calls.filter(c => c.startsWith(`read ${stream} after `)).map(c => Number(c.split(' ').at(-1)))
    t.equal(reads.filter(after => after === seq).length, 1, 'one read from the resumed id: the early one')
    t.ok(reads.length > 1 && reads.slice(1).every(after => after > seq), `the follower read on from past the first page (reads after ${reads.join(', ')})`)
  })
}

for (const kind of KINDS) {
  t.test(`${kind} store: an event appended between a resume's first page and its subscription still reaches the client`, async t => {
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    // Armed below: the next read of the standalone stream appends an event once it
    // has its page, so the page misses it and it lands before the follower subscribes.
    let inject: ((store: EventStore, sessionId: string) => Promise<void>) | undefined
    /** Subscriptions to the standalone stream so far: the early read comes before the follower's. */
    let subscriptions = 0
    const gw = await startGateway(t, kind, upstream.url, {}, store => {
      const subscribe = store.subscribe.bind(store)
      store.subscribe = (sessionId, streamId, listener) => {
        if (streamId === STANDALONE_STREAM) subscriptions++
        return subscribe(sessionId, streamId, listener)
      }
      const read = store.read.bind(store)
      store.read = async (sessionId, streamId, afterSeq, limit, maxBytes) => {
        const page = await read(sessionId, streamId, afterSeq, limit, maxBytes)
        const then = streamId === STANDALONE_STREAM ? inject : undefined
        inject = undefined
        await then?.(store, sessionId)
        return page
      }
    })
    const mcp = new RawMcp(t, `${gw.url}/mcp`, '2025-11-25')
    await mcp.initialize()
    const { pending } = await attachStandalone(gw, mcp)
    await mcp.broadcast(10, 'w')
    const first = await pending
    t.ok(await first.waitFor(r => sequences(r.events, 'broadcast', 'w').length >= 10), 'ten broadcasts arrive')
    first.abort()
    t.ok(await waitUntil(() => gw.gateway.hub.clientCount === 0, 2000), 'the gateway saw the drop')
    const from = first.messages[4]?.id as string
    const injected = JSON.stringify({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: 'appended in the window' } })
    let appended = false
    const subscribedBefore = subscriptions
    let subscribedWhenAppended = -1
    inject = async (store, sessionId) => {
      subscribedWhenAppended = subscriptions
      await store.append(sessionId, STANDALONE_STREAM, [{ frame: Buffer.from(`data: ${injected}\n`) }])
      appended = true
    }
    const resumed = await mcp.get(from)
    t.ok(await resumed.waitFor(r => r.messages.some(e => e.data === injected), 5000), 'the event appended in the window arrives')
    resumed.abort()
    t.ok(appended, 'the event was appended after the first page was read')
    t.equal(subscribedWhenAppended, subscribedBefore, 'by the early read, before the resume\'s follower subscribed')
    t.same(sequences(resumed.events, 'broadcast', 'w'), range(5, 9), 'the rest of the broadcasts, once each')
    t.equal(resumed.messages.at(-1)?.data, injected, 'then the appended event')
    const ids = resumed.messages.map(e => e.id)
    t.equal(new Set(ids).size, ids.length, 'no event twice')
  })
}

t.test('hand-written upstream (memory store)', async t => {
  const fake = await startFakeUpstream(t)
  const gw = await startGateway(t, 'memory', fake.url)
  const mcpUrl = `${gw.url}/mcp`
  const initBody = '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}'

  t.test('a JSON answer passes through unchanged; hop-by-hop headers do not', async t => {
    const direct = await send(fake.url, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH }, body: initBody })
    const via = await send(mcpUrl, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH }, body: initBody })
    t.equal(via.status, 200)
    t.ok(via.body.equals(Buffer.from(FAKE_INIT_BODY)), 'body bytes unchanged')
    t.equal(header(via.headers, 'content-type'), 'application/json')
    t.equal(header(via.headers, 'content-length'), String(Buffer.byteLength(FAKE_INIT_BODY)))
    t.match(header(direct.headers, 'mcp-session-id'), /^fake-session-\d+$/, '(the upstream issues a session)')
    t.match(header(via.headers, 'mcp-session-id'), /^mg1\.[\w-]{22}\.fake-session-\d+$/, 'the client gets the gateway\'s session id for it')
    t.equal(header(via.headers, 'x-end-to-end'), 'kept', 'end-to-end headers pass')
    t.equal(header(direct.headers, 'x-custom'), 'hop-by-hop', '(the upstream does send X-Custom)')
    t.equal(header(via.headers, 'x-custom'), undefined, 'a header named in the upstream\'s Connection is dropped')
    t.notMatch(header(via.headers, 'connection') ?? '', /x-custom/, 'the upstream\'s Connection is not forwarded')
  })

  t.test('request headers: Authorization forwarded, Connection-named ones not', async t => {
    const sent = fake.seen.length
    const answer = await sendWithNode(mcpUrl, {
      method: 'POST',
      headers: {
        'content-type': 'application/json',
        accept: ACCEPT_BOTH,
        authorization: 'Bearer token-1',
        connection: 'x-drop-me, keep-alive',
        'x-drop-me': 'secret',
        'x-kept': 'yes',
        'keep-alive': 'timeout=5',
        'proxy-authorization': 'Basic cHJveHk6cHJveHk='
      },
      body: initBody
    })
    t.equal(answer.status, 200)
    // The POST itself (the session's upstream GET, opened at initialize, may come in between).
    const seen = fake.seen.slice(sent).find(r => r.method === 'POST')
    t.equal(seen?.headers.authorization, 'Bearer token-1', 'Authorization forwarded')
    t.equal(seen?.headers['x-kept'], 'yes', 'end-to-end headers forwarded')
    t.equal(seen?.headers['x-drop-me'], undefined, 'a header named in Connection is dropped')
    t.notMatch(seen?.headers.connection ?? '', /x-drop-me/, 'Connection itself is not forwarded')
    t.equal(seen?.headers['keep-alive'], undefined, 'Keep-Alive is not forwarded')
    t.equal(seen?.headers['proxy-authorization'], undefined, 'Proxy-Authorization is not forwarded')
    t.ok(seen?.headers['x-forwarded-for'], 'X-Forwarded-For says who the client was')

    const other = await sendWithNode(`${gw.url}/elsewhere`, { method: 'POST', headers: { authorization: 'Bearer token-2', connection: 'x-drop-me', 'x-drop-me': 'secret' }, body: 'x' })
    t.equal(other.status, 200)
    const forwarded = fake.seen.at(-1)
    t.equal(forwarded?.headers.authorization, 'Bearer token-2', 'other paths: Authorization forwarded')
    t.equal(forwarded?.headers['x-drop-me'], undefined, 'other paths: Connection-named header dropped')
  })

  t.test('a 202 answer passes through', async t => {
    const init = await send(mcpUrl, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH }, body: initBody })
    const sessionId = header(init.headers, 'mcp-session-id') as string
    const ack = await send(mcpUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' },
      body: '{"jsonrpc":"2.0","method":"notifications/initialized"}'
    })
    t.equal(ack.status, 202)
    t.equal(ack.body.length, 0)
  })

  t.test('upstream 405 on GET passes through', async t => {
    const init = await send(mcpUrl, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH }, body: initBody })
    const sessionId = header(init.headers, 'mcp-session-id') as string
    const headers = { accept: 'text/event-stream', 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }
    for (const attempt of [1, 2]) {
      const answer = await send(mcpUrl, { headers })
      t.equal(answer.status, 405, `attempt ${attempt}: 405`)
      t.equal(header(answer.headers, 'allow'), 'POST, DELETE', 'Allow passes')
      t.equal(header(answer.headers, 'x-upstream'), 'fake')
      t.match(JSON.parse(answer.text), { error: { message: 'Method not allowed.' } }, 'the upstream\'s body')
    }
  })

  t.test('a compressing upstream: the SSE answer reaches a fetch client readable', async t => {
    const init = await send(mcpUrl, { method: 'POST', headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH }, body: initBody })
    const sessionId = header(init.headers, 'mcp-session-id') as string
    const headers = { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'mcp-session-id': sessionId, 'mcp-protocol-version': '2025-06-18' }
    const body = '{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"gzip","arguments":{}}}'
    // fetch (what the SDK client uses) sends Accept-Encoding and decodes what the Content-Encoding says.
    const res = await fetch(mcpUrl, { method: 'POST', headers, body })
    let text: string
    try {
      text = await res.text()
    } catch (err) {
      text = `the body failed: ${String((err as Error).cause ?? err)}`
    }
    // The gateway parses recorded answers, so it asks the upstream for no content coding.
    t.equal(header(fake.seen.at(-1)?.headers ?? {}, 'accept-encoding'), 'identity', 'the upstream is asked for identity encoding')
    t.equal(res.status, 200)
    t.match(text, /"data":"zipped"/, `the notification arrives (got: ${text.slice(0, 100)})`)
    t.match(text, /"id":5,"result"/, 'the tool result arrives')

    const raw = await openSse(t, mcpUrl, { method: 'POST', headers: { ...headers, 'accept-encoding': 'gzip' }, body: body.replace('"id":5', '"id":6') })
    t.ok(await raw.waitForEnd(), 'the stream ends')
    t.equal(header(raw.headers, 'content-encoding'), undefined, 'the re-framed stream carries no Content-Encoding it did not apply')
    const answer = responseTo(raw.events, 6)
    t.ok(answer?.result, `the tool result is recorded (got: ${JSON.stringify(answer ?? null).slice(0, 160)})`)
  })

  t.test('modern era: a transparent streaming proxy', async t => {
    const recordedBefore = metricValue(await metricsText(gw), 'mcpgw_events_recorded_total')
    const reader = await openSse(t, mcpUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'mcp-protocol-version': MODERN },
      body: '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"quick","arguments":{}}}'
    })
    t.ok(await reader.waitForEnd(), 'the answer ends')
    t.equal(reader.raw, MODERN_SSE, 'the body is the upstream\'s, byte for byte')
    t.same(reader.events.map(e => e.id), ['up-1', undefined, 'up-3'], 'event ids are the upstream\'s or absent: none injected')
    t.same(reader.events.filter(e => e.data === ''), [], 'no priming injected')
    t.equal(reader.retries.length, 0, 'no retry hint injected')

    const seen = fake.seen.length
    const get = await send(mcpUrl, { headers: { accept: 'text/event-stream', 'mcp-protocol-version': MODERN, 'last-event-id': 'up-1' } })
    t.equal(get.status, 405, 'the upstream\'s answer to GET')
    t.equal(fake.seen[seen]?.headers['last-event-id'], 'up-1', 'Last-Event-ID forwarded unchanged')
    const weird = await send(mcpUrl, { headers: { accept: 'text/event-stream', 'mcp-protocol-version': MODERN, 'last-event-id': 'not a gateway id' } })
    t.equal(weird.status, 405, 'a Last-Event-ID the gateway never issued is not refused in this era')
    t.equal(fake.seen.at(-1)?.headers['last-event-id'], 'not a gateway id')

    const recordedAfter = metricValue(await metricsText(gw), 'mcpgw_events_recorded_total')
    t.equal(recordedAfter, recordedBefore, 'nothing recorded')

    const hold = await openSse(t, mcpUrl, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: ACCEPT_BOTH, 'mcp-protocol-version': MODERN },
      body: '{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"hold","arguments":{}}}'
    })
    t.ok(await hold.waitFor(r => r.events.length >= 1), 'the first event streams through before the answer ends')
    t.same(fake.cutShort, [], '(the upstream is still answering)')
    hold.abort()
    t.ok(await waitUntil(() => fake.cutShort.includes('hold'), 2000), 'a client disconnect aborts the upstream request')
  })

  t.test('other paths are proxied unchanged', async t => {
    const post = await send(`${gw.url}/some/path?x=1&y=%20z&x=2`, { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'hello body' })
    t.equal(post.status, 200)
    t.equal(header(post.headers, 'x-echo'), 'yes')
    t.same(JSON.parse(post.text), { method: 'POST', url: '/some/path?x=1&y=%20z&x=2', body: 'hello body' }, 'method, path, query and body')
    const big = Buffer.alloc(200_000, 'b').toString()
    const put = await send(`${gw.url}/upload`, { method: 'PUT', headers: { 'content-type': 'application/octet-stream' }, body: big })
    t.same(JSON.parse(put.text), { method: 'PUT', url: '/upload', body: big }, 'a larger PUT body')
    const get = await send(`${gw.url}/q?only=query`)
    t.same(JSON.parse(get.text), { method: 'GET', url: '/q?only=query', body: '' })
    const options = await send(`${mcpUrl}?probe=1`, { method: 'OPTIONS' })
    t.equal(options.status, 202, 'OPTIONS on the MCP path gets the upstream\'s answer')
    t.match(fake.seen.at(-1), { method: 'OPTIONS', url: '/mcp?probe=1' }, 'with its query string')
  })
})

t.test('other paths of the example upstream are proxied unchanged', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url)
  const path = '/.well-known/oauth-protected-resource'
  const direct = await send(new URL(path, upstream.url).href)
  const via = await send(`${gw.url}${path}`)
  t.equal(via.status, 200)
  t.ok(via.body.equals(direct.body), 'the same bytes as from the upstream directly')
  t.equal(header(via.headers, 'content-type'), 'application/json')
  const missing = await send(`${gw.url}/nowhere?x=1`)
  t.equal(missing.status, 404, 'the upstream\'s 404')
  t.same(JSON.parse(missing.text), { error: 'not found' })
})

t.test('streams without priming get their response head at once', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url)
  const mcp = new RawMcp(t, `${gw.url}/mcp`, '2025-06-18')
  await mcp.initialize()
  const timed = async (open: () => Promise<SseReader>): Promise<{ reader?: SseReader, ms: number }> => {
    const started = Date.now()
    try {
      return { reader: await open(), ms: Date.now() - started }
    } catch {
      return { ms: Date.now() - started }
    }
  }
  const [get, post] = await Promise.all([
    timed(async () => await mcp.get(undefined, {}, 1500)),
    // A slow tool: its first (and only) event comes after 2.5 s.
    timed(async () => await openSse(t, mcp.url, { method: 'POST', headers: mcp.headers(), body: '{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"stream_notifications","arguments":{"count":1,"intervalMs":2500}}}' }, 1500))
  ])
  t.equal(get.reader?.status, 200, `standalone GET: response head within 1.5 s (${get.ms} ms)`)
  t.equal(post.reader?.status, 200, `POST answered with SSE: response head within 1.5 s (${post.ms} ms)`)
  const call = await mcp.callTool('echo', { text: 'hi' })
  t.ok(await call.reader.waitForEnd(), 'the session works meanwhile')
})

t.test('keep-alive comments on idle streams', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, { KEEPALIVE_INTERVAL_SECONDS: '1' })
  const mcp = new RawMcp(t, `${gw.url}/mcp`, '2025-11-25')
  await mcp.initialize()
  const standalone = await mcp.get()
  const slow = await mcp.callTool('stream_notifications', { count: 1, intervalMs: 2500 })
  await sleep(2300)
  t.match(standalone.raw, /^:.*\n/m, 'the idle standalone stream carries comment lines')
  t.equal(standalone.messages.length, 0, '(it was idle)')
  t.match(slow.reader.raw, /^:.*\n/m, 'the idle request stream carries comment lines')
  t.ok(await slow.reader.waitForEnd(), 'the request stream still ends with its result')
  t.ok(responseTo(slow.reader.events, slow.id), 'with the result')
  standalone.abort()
})

t.test('Origin allow-list', async t => {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await startGateway(t, 'memory', upstream.url, { ALLOWED_ORIGINS: 'https://ok.example' })
  const mcpUrl = `${gw.url}/mcp`
  const initBody = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '0' } } })
  const headers = { 'content-type': 'application/json', accept: ACCEPT_BOTH }
  isJsonRpcError(t, await send(mcpUrl, { method: 'POST', headers: { ...headers, origin: 'https://evil.example' }, body: initBody }), 403, 'a foreign Origin')
  isJsonRpcError(t, await send(`${gw.url}/.well-known/oauth-protected-resource`, { headers: { origin: 'https://evil.example' } }), 403, 'a foreign Origin on another path')
  for (const origin of [undefined, 'https://ok.example']) {
    const reader = await openSse(t, mcpUrl, { method: 'POST', headers: { ...headers, ...(origin !== undefined && { origin }) }, body: initBody })
    t.equal(reader.status, 200, `Origin ${origin ?? '(none)'} passes`)
    t.ok(await reader.waitForEnd())
  }
})

t.test('bounds: bad MCP-Protocol-Version, oversized bodies', async t => {
  const fake = await startFakeUpstream(t)
  const gw = await startGateway(t, 'memory', fake.url, { MAX_BODY_BYTES: '1024' })
  const mcpUrl = `${gw.url}/mcp`
  const headers = { 'content-type': 'application/json', accept: ACCEPT_BOTH }
  for (const version of ['banana', '2025-6-18', '2025-06-18x']) {
    isJsonRpcError(t, await send(mcpUrl, { method: 'POST', headers: { ...headers, 'mcp-protocol-version': version }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' }), 400, `POST with MCP-Protocol-Version ${version}`, undefined, 1)
  }
  isJsonRpcError(t, await send(mcpUrl, { headers: { accept: 'text/event-stream', 'mcp-protocol-version': 'banana' } }), 400, 'GET with a bad MCP-Protocol-Version')

  const big = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'ping', params: { pad: 'x'.repeat(2000) } })
  const seen = fake.seen.length
  isJsonRpcError(t, await send(mcpUrl, { method: 'POST', headers, body: big }), 413, 'a body over MAX_BODY_BYTES')
  const chunked = await request(mcpUrl, { method: 'POST', headers, body: Readable.from([Buffer.from(big)]) })
  t.equal(chunked.statusCode, 413, 'a chunked body over MAX_BODY_BYTES')
  await chunked.body.dump()
  t.equal(fake.seen.length, seen, 'nothing reached the upstream')
  const small = await send(mcpUrl, { method: 'POST', headers, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' })
  t.equal(small.status, 200, 'a body under the bound passes')

  const other = await send(`${gw.url}/upload`, { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'y'.repeat(4000) })
  t.equal(other.status, 413, 'a body over MAX_BODY_BYTES to another path')
})
