// Faults end to end: what the gateway does when what it depends on fails,
// and what the client loses (nothing, or a signalled gap). The official SDK
// client (test/fixtures/mcp-client.ts) where a client's behaviour matters;
// raw sockets where the client must misbehave (stop reading) or come in
// numbers (1,000 reconnects).
import t from 'tap'
import { parseSessionId } from '../../src/protocol/session-id.js'
import type { Test } from 'tap'
import { spawn } from 'node:child_process'
import { existsSync } from 'node:fs'
import { createServer as createHttpServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net'
import { fileURLToPath } from 'node:url'
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises'
import { McpError } from '@modelcontextprotocol/sdk/types.js'
import { pino } from 'pino'
import { Agent } from 'undici'
import { startExampleServer, type ExampleServer } from '../../examples/mcp-server.js'
import { buildGateway } from '../../src/server.js'
import { decodeEventId } from '../../src/protocol/event-id.js'
import { SLOW_CLIENT_GRACE_MS } from '../../src/sse/client-stream.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { startGateway, testConfig } from '../fixtures/gateway.js'
import { answerInitialize, readMessage } from '../fixtures/hand-upstream.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil, type McpTestClient, type SseEventRecord } from '../fixtures/mcp-client.js'
import { startRedisServer, uniquePrefix } from '../fixtures/redis.js'
import { standaloneItems } from '../fixtures/standalone-log.js'
import {
  exchange, freePort, jsonRpcError, metricSum, metrics, rawInitialize, rawRequest, RawSse, startPersistentRedis, until,
  type RawSession
} from '../fixtures/hardening.js'
import { externalTools } from '../fixtures/external-tools.js'

const ownRedis = await externalTools(['redis-server'])

// Eleven scenarios, several of them restarting Redis or waiting out a grace: about
// 85-95 s on the project's 2-core machine, too close to .taprc's 120 s per file.
t.setTimeout(240_000)

/** Fast teardown: no drain spread, a short grace. */
const QUICK_CLOSE = { DRAIN_SPREAD_SECONDS: '0', SHUTDOWN_GRACE_SECONDS: '3' }
const RECONNECT = { initialReconnectionDelay: 200, maxReconnectionDelay: 1000, reconnectionDelayGrowFactor: 1.5, maxRetries: 20 }

async function standaloneOpen (mcp: McpTestClient): Promise<boolean> {
  return await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000)
}

/** The last gateway id the SDK client received on its standalone stream. */
function lastStandaloneId (mcp: McpTestClient): string | undefined {
  for (const exchange of [...mcp.exchanges].reverse()) {
    if (exchange.method !== 'GET') continue
    const id = exchange.events.findLast(e => e.id !== undefined && e.data !== '' && decodeEventId(e.id)?.streamId === 's')?.id
    if (id !== undefined) return id
  }
  return undefined
}

/** The broadcast sequence number of the event the SDK client received under `id`. */
function broadcastSeqOf (mcp: McpTestClient, id: string): number {
  for (const exchange of mcp.exchanges) {
    const event = exchange.events.find(e => e.id === id)
    if (event !== undefined) return (JSON.parse(event.data) as { params: { data: { seq: number } } }).params.data.seq
  }
  return Number.NaN
}

async function readiness (adminUrl: string): Promise<number | undefined> {
  return (await exchange(`${adminUrl}/readyz`, {}, 3000)).status
}

/** A gateway on a Redis the test controls (stop/start), with its own key prefix. */
async function redisGateway (t: Test, upstreamUrl: string, redisUrl: string, env: Record<string, string> = {}): Promise<{ url: string, adminUrl: string, store: RedisEventStore, gateway: Awaited<ReturnType<typeof buildGateway>> }> {
  const prefix = uniquePrefix('faults')
  const config = testConfig(upstreamUrl, { REDIS_URL: redisUrl, REDIS_KEY_PREFIX: prefix, ...QUICK_CLOSE, ...env })
  const store = await RedisEventStore.connect({ url: redisUrl, keyPrefix: prefix, retention: config.retention })
  const gateway = await buildGateway(config, { store, logger: pino({ level: process.env.TEST_LOG_LEVEL ?? 'silent' }) })
  const { url, adminUrl } = await gateway.listen()
  t.teardown(() => gateway.close())
  return { url, adminUrl, store, gateway }
}

/** The example server behind a gateway on `redisUrl`, an SDK client with its standalone stream open. */
async function exampleSessionOnRedis (t: Test, redisUrl: string): Promise<{ gw: Awaited<ReturnType<typeof redisGateway>>, mcp: McpTestClient }> {
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const gw = await redisGateway(t, upstream.url, redisUrl)
  const mcp = await connectClient(`${gw.url}/mcp`, { reconnectionOptions: RECONNECT })
  t.teardown(() => mcp.close())
  t.ok(await standaloneOpen(mcp), 'the standalone stream is open')
  return { gw, mcp }
}

// With re-establishment (the default) the session goes on upstream; without it the
// client is told the session is gone. Either way the call the restart cut gets the
// gateway's error answer, never silence.
for (const reestablish of [true, false]) {
  t.test(`upstream restart mid-stream, REESTABLISH_UPSTREAM_SESSIONS=${reestablish}`, async t => {
    let upstream: ExampleServer = await startExampleServer()
    t.teardown(() => upstream.close())
    const port = Number(new URL(upstream.url).port)
    const gw = await startGateway(t, 'memory', upstream.url, { ...QUICK_CLOSE, REESTABLISH_UPSTREAM_SESSIONS: String(reestablish) })
    const mcp = await connectClient(`${gw.url}/mcp`, { reconnectionOptions: { ...RECONNECT, maxRetries: 3 } })
    t.teardown(() => mcp.close())
    t.ok(await standaloneOpen(mcp), 'the standalone stream is open')
    const sessionId = mcp.sessionId as string

    const started = Date.now()
    const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: 1000, intervalMs: 10 } }, undefined, { timeout: 60_000 })
    call.catch(() => {})
    t.ok(await waitUntil(() => sequencesOf(mcp.notifications, 'stream_notifications').length >= 20, 10_000), 'the tool call is streaming')
    const gets = mcp.exchanges.filter(e => e.method === 'GET').length
    await upstream.close()
    upstream = await startExampleServer({ port })
    const restartedAt = Date.now()

    const outcome = await call.then(() => 'resolved', (err: unknown) => err)
    const elapsed = Date.now() - started
    t.type(outcome, McpError, 'the call fails with a JSON-RPC error')
    t.match((outcome as Error).message, /MCP gateway: the response to this request was lost/, 'the gateway\'s error answer')
    t.ok(Date.now() - restartedAt < 5000, `it fails fast (${elapsed} ms after the call began), not at the 60 s timeout`)
    t.comment(`upstream restart: the call failed with "${(outcome as Error).message}"`)

    // The standalone stream: closed with a retry hint when its upstream GET ended; the client reconnects.
    const reconnects = (): typeof mcp.exchanges => mcp.exchanges.filter(e => e.method === 'GET').slice(gets).filter(e => e.lastEventId?.includes('.s.') === true)
    t.ok(await waitUntil(() => reconnects().some(e => e.status !== undefined), 8000), 'the standalone stream reconnects with Last-Event-ID')
    t.comment(`standalone reconnects after the restart: ${reconnects().map(e => `${e.status ?? e.error ?? '?'}`).join(', ')}`)
    t.ok(reconnects().every(e => e.status === undefined || e.status < 500), 'never a 5xx')
    if (reestablish) {
      t.ok(await waitUntil(() => reconnects().some(e => e.status === 200), 8000), 'the standalone stream opens again: the session was established upstream again')
      t.not(await gw.gateway.store.getSession(sessionId), null, 'the session\'s records stay')
      const echo = await mcp.client.callTool({ name: 'echo', arguments: { text: 'same session' } })
      t.same(echo.content, [{ type: 'text', text: 'same session' }], 'the same session goes on after the restart')
      return
    }
    t.ok(reconnects().some(e => e.status === 404), 'the client is told the session is gone (404), so it can start a new one')
    t.equal(await gw.gateway.store.getSession(sessionId), null, 'the records of the session the upstream no longer knows are dropped')

    const fresh = await connectClient(`${gw.url}/mcp`)
    t.teardown(() => fresh.close())
    const echo = await fresh.client.callTool({ name: 'echo', arguments: { text: 'after restart' } })
    t.same(echo.content, [{ type: 'text', text: 'after restart' }], 'a new session works through the gateway')
  })
}

t.test('an upstream that hangs', async t => {
  t.test('accepts connections and never answers: 504 with a JSON-RPC error after UPSTREAM_HEADERS_TIMEOUT_SECONDS', async t => {
    const sockets = new Set<Socket>()
    const hang = createNetServer(socket => {
      sockets.add(socket)
      socket.resume() // read and discard, so a close by the gateway is seen
      socket.on('close', () => sockets.delete(socket))
      socket.on('error', () => {})
    })
    await new Promise<void>(resolve => hang.listen(0, '127.0.0.1', resolve))
    t.teardown(async () => {
      for (const s of sockets) s.destroy()
      await new Promise(resolve => hang.close(resolve))
    })
    const upstreamUrl = `http://127.0.0.1:${(hang.address() as AddressInfo).port}/mcp`
    const gw = await startGateway(t, 'memory', upstreamUrl, { UPSTREAM_HEADERS_TIMEOUT_SECONDS: '1', ...QUICK_CLOSE })
    const body = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'raw', version: '0' } } })
    let started = Date.now()
    const raw = await exchange(`${gw.url}/mcp`, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body }, 10_000)
    const rawMs = Date.now() - started
    t.equal(raw.status, 504, `504 after ${rawMs} ms`)
    t.ok(rawMs >= 900 && rawMs < 4000, 'after about the configured second')
    t.match(jsonRpcError(raw.text), { id: 1, message: /Gateway Timeout/ }, 'a JSON-RPC error body, under the request\'s id')

    started = Date.now()
    const connected = await connectClient(`${gw.url}/mcp`).then(async mcp => { await mcp.close(); return 'connected' }, (err: unknown) => err)
    const sdkMs = Date.now() - started
    t.type(connected, Error, 'the SDK client\'s connect fails')
    t.match(String(connected), /Gateway Timeout/, `with the gateway's 504 error (${String(connected).slice(0, 120)})`)
    t.ok(sdkMs < 5000, `fast: ${sdkMs} ms`)
    t.ok(await until(() => sockets.size === 0, 3000), 'the gateway gave up its upstream connections')
  })

  t.test('answers initialize, then hangs on a tool call: the SDK call fails fast with 504', async t => {
    const held = new Set<ServerResponse>()
    const upstream = createHttpServer((req: IncomingMessage, res: ServerResponse) => {
      if (req.method === 'GET') { res.writeHead(405).end(); return }
      if (req.method === 'DELETE') { res.writeHead(200).end(); return }
      readMessage(req).then(message => {
        if (message.method === 'initialize') {
          answerInitialize(res, message, 'hang-1', '2025-06-18', { tools: {} })
          return
        }
        if (message.id === undefined) { res.writeHead(202).end(); return }
        held.add(res) // never answered
        res.on('close', () => held.delete(res))
      }, () => res.writeHead(400).end())
    })
    await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
    t.teardown(async () => {
      upstream.closeAllConnections()
      await new Promise(resolve => upstream.close(resolve))
    })
    const gw = await startGateway(t, 'memory', `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/mcp`, { UPSTREAM_HEADERS_TIMEOUT_SECONDS: '1', ...QUICK_CLOSE })
    const mcp = await connectClient(`${gw.url}/mcp`)
    t.teardown(() => mcp.close())
    const started = Date.now()
    const outcome = await mcp.client.callTool({ name: 'anything', arguments: {} }, undefined, { timeout: 60_000 }).then(() => 'resolved', (err: unknown) => err)
    const ms = Date.now() - started
    t.type(outcome, Error, 'the call fails')
    t.match(String(outcome), /Gateway Timeout/, `with the gateway's 504 error (${String(outcome).slice(0, 140)})`)
    t.ok(ms < 5000, `after ${ms} ms, not the 60 s timeout`)
    t.ok(await until(() => held.size === 0, 3000), 'the hung upstream request was abandoned')
  })
})

/**
 * A hand-written upstream whose standalone stream carries notifications of a
 * chosen size on demand (the example server's broadcasts are a few hundred
 * bytes: filling the kernel's socket buffers with them takes tens of thousands).
 */
async function startPadUpstream (t: Test): Promise<{ url: string, emit: (count: number, bytes: number) => Promise<void>, readonly sent: number }> {
  let stream: ServerResponse | undefined
  let sent = 0
  const upstream = createHttpServer((req, res) => {
    if (req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.flushHeaders()
      stream = res
      return
    }
    if (req.method === 'DELETE') { res.writeHead(200).end(); return }
    readMessage(req).then(message => {
      if (message.method === 'initialize') {
        answerInitialize(res, message, 'pad-1', '2025-06-18')
        return
      }
      res.writeHead(202).end()
    }, () => res.writeHead(400).end())
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => {
    upstream.closeAllConnections()
    await new Promise(resolve => upstream.close(resolve))
  })
  return {
    url: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/mcp`,
    get sent () { return sent },
    async emit (count, bytes) {
      if (!await until(() => stream !== undefined, 3000)) throw new Error('no upstream GET stream to write to')
      for (let i = 0; i < count; i++) {
        stream?.write(`data: ${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: { seq: sent++, pad: 'p'.repeat(bytes) } } })}\n\n`)
        // One event per read at the gateway: each reaches the client as a write of its own.
        await nextTurn()
      }
    }
  }
}

const seqOf = (data: string): number => (JSON.parse(data) as { params: { data: { seq: number } } }).params.data.seq

/**
 * A standalone stream whose client reads `readFirst` events, then stops
 * reading while 1 KiB events pour in, until the gateway counts it a slow client.
 */
async function overflowPausedClient (t: Test, bufferBytes: number, readFirst: number): Promise<{ upstream: Awaited<ReturnType<typeof startPadUpstream>>, gw: Awaited<ReturnType<typeof startGateway>>, session: RawSession, client: RawSse }> {
  const upstream = await startPadUpstream(t)
  const gw = await startGateway(t, 'memory', upstream.url, { CLIENT_BUFFER_MAX_BYTES: String(bufferBytes), ...QUICK_CLOSE })
  const session = await rawInitialize(`${gw.url}/mcp`)
  const client = new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders())))
  t.teardown(() => client.close())
  t.ok(await client.waitFor(s => s.status === 200), 'the standalone stream is open')
  if (readFirst > 0) {
    await upstream.emit(readFirst, 1024)
    t.ok(await client.waitFor(s => s.events.length >= readFirst), 'the client reads the first events')
  }
  client.pause()
  const disconnects = async (): Promise<number> => metricSum(await metrics(gw.adminUrl), 'mcpgw_slow_client_disconnects_total')
  const before = await disconnects()
  let after = before
  while (upstream.sent < 40_000 && after === before) {
    await upstream.emit(500, 1024)
    after = await disconnects()
  }
  t.equal(after, before + 1, `mcpgw_slow_client_disconnects_total went up, after ${upstream.sent} events of 1 KiB`)
  t.ok(await until(() => gw.gateway.hub.clientCount === 0, 3000), 'the gateway let the connection go')
  return { upstream, gw, session, client }
}

t.test('a slow client: closed past CLIENT_BUFFER_MAX_BYTES, resumes from the store without loss', async t => {
  // 1 KiB events and a 1 MiB bound: a replay page (500 events) fits in the bound (see the next test for why that matters).
  const { upstream, gw, session, client: slow } = await overflowPausedClient(t, 1024 * 1024, 5)
  await upstream.emit(20, 1024) // more while the client is away
  const total = upstream.sent
  slow.resume()
  t.ok(await slow.waitFor(s => s.ended, 10_000), 'the client reads what was buffered for it, then the stream ends (cleanly: the last chunk)')
  t.ok(slow.retries.length >= 1, `after the buffered events, a retry hint (${slow.retries.join(', ')} ms)`)
  const seen = slow.events.map(e => seqOf(e.data))
  const lastId = slow.lastId as string
  t.comment(`slow client: read ${seen.length} of ${total} events before the cut (last id ${lastId})`)

  // The client resumes from its last id, and again from the newest one if that connection is cut too.
  const resumed: number[] = []
  let from = lastId
  let connections = 0
  while (connections < 10 && (resumed.at(-1) ?? seen.at(-1)) !== total - 1) {
    connections++
    const resume = new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders(from))))
    await resume.waitFor(s => s.closed || (s.events.length > 0 && seqOf(s.events.at(-1)?.data ?? '') === total - 1), 10_000)
    resume.close()
    resumed.push(...resume.events.map(e => seqOf(e.data)))
    from = resume.lastId ?? from
  }
  t.equal(resumed.at(-1), total - 1, `the resumes deliver up to the last event (${connections} connection(s))`)
  t.equal(resumed[0], (seen.at(-1) ?? -1) + 1, 'the first resume starts right after the client\'s last id')
  const report = checkDelivery([...seen, ...resumed], total)
  t.comment(`slow client: resumed ${resumed.length} over ${connections} connection(s); lost ${report.lost.length} [${formatRanges(report.lost)}], duplicated ${report.duplicated.length}`)
  t.ok(report.ok, 'every event exactly once, in order, across the cut')
  t.equal(connections, 1, 'one resume connection is enough for a client that now reads promptly')
})

t.test('a slow client that stops reading altogether is cut off after the grace, dropping what waited for it', async t => {
  const { client: stuck } = await overflowPausedClient(t, 256 * 1024, 0)
  const closedAt = Date.now()
  await sleep(SLOW_CLIENT_GRACE_MS + 1000)
  stuck.resume()
  t.ok(await stuck.waitFor(s => s.closed, 10_000), `the connection is gone when the client looks again, ${Date.now() - closedAt} ms later`)
  t.notOk(stuck.ended, 'cut off: the stream never got to its clean end (what waited for it was dropped)')
})

t.test('a client that reads promptly, and one write larger than CLIENT_BUFFER_MAX_BYTES', async t => {
  const upstream = await startPadUpstream(t)
  const gw = await startGateway(t, 'memory', upstream.url, { CLIENT_BUFFER_MAX_BYTES: '65536', ...QUICK_CLOSE })
  const session = await rawInitialize(`${gw.url}/mcp`)
  const first = new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders())))
  t.teardown(() => first.close())
  await upstream.emit(1, 16)
  t.ok(await first.waitFor(s => s.events.length === 1), 'attached, one small event read')
  first.close()
  t.ok(await until(() => gw.gateway.hub.clientCount === 0, 3000), 'the client went away')

  /** Resumes (reading at once, everything) up to 3 times; how far it got. */
  const catchUp = async (lastSeq: number): Promise<{ got: boolean, attempts: number, disconnects: number, bytes: number }> => {
    const before = metricSum(await metrics(gw.adminUrl), 'mcpgw_slow_client_disconnects_total')
    let from = first.lastId
    let attempts = 0
    let got = false
    let bytes = 0
    while (attempts < 3 && !got) {
      attempts++
      const resume = new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders(from))))
      await resume.waitFor(s => s.closed || s.events.some(e => seqOf(e.data) === lastSeq), 2000)
      got = resume.events.some(e => seqOf(e.data) === lastSeq)
      resume.close()
      bytes += resume.bytes
      from = resume.lastId ?? from
    }
    return { got, attempts, bytes, disconnects: metricSum(await metrics(gw.adminUrl), 'mcpgw_slow_client_disconnects_total') - before }
  }

  t.test('one event of 256 KiB (MAX_EVENT_BYTES is 4 MiB)', async t => {
    await upstream.emit(1, 256 * 1024)
    const r = await catchUp(upstream.sent - 1)
    t.comment(`256 KiB event, CLIENT_BUFFER_MAX_BYTES=64 KiB: received ${String(r.got)} after ${r.attempts} resume(s), ${r.bytes} body bytes; slow-client disconnects +${r.disconnects}`)
    t.ok(r.got, 'the client gets the event')
    t.equal(r.disconnects, 0, 'and is not counted as a slow client')
  })

  t.test('a backlog of 100 events of 2 KiB: one replay page of 200 KiB', async t => {
    await upstream.emit(100, 2048)
    const r = await catchUp(upstream.sent - 1)
    t.comment(`backlog of 200 KiB, CLIENT_BUFFER_MAX_BYTES=64 KiB: caught up ${String(r.got)} after ${r.attempts} resume(s), ${r.bytes} body bytes; slow-client disconnects +${r.disconnects}`)
    t.ok(r.got, 'the client catches up')
    t.equal(r.disconnects, 0, 'and is not counted as a slow client')
  })
})

// Through a URL, or through Sentinels none of which answers (ioredis alone would ask them for ever).
for (const variable of ['REDIS_URL', 'REDIS_SENTINELS'] as const) {
  t.test(`Redis unreachable at start (${variable})`, async t => {
    const main = fileURLToPath(new URL('../../src/main.ts', import.meta.url))
    // The gateway runs from its sources, with the TypeScript loader tap itself uses.
    const loader = process.execArgv.filter(a => a.startsWith('--import=') && a.includes('@tapjs/typescript'))
    const dist = fileURLToPath(new URL('../../dist/src/main.js', import.meta.url))
    const args = loader.length > 0 ? [...loader, main] : existsSync(dist) ? [dist] : undefined
    if (args === undefined) {
      t.fail('no TypeScript loader and no dist/ build to run src/main.ts with')
      return
    }
    const deadPort = await freePort()
    const child = spawn(process.execPath, args, {
      env: {
        PATH: process.env.PATH ?? '',
        TS_NODE_TRANSPILE_ONLY: '1',
        UPSTREAM_URL: 'http://127.0.0.1:9/mcp',
        ...(variable === 'REDIS_URL' ? { REDIS_URL: `redis://127.0.0.1:${deadPort}` } : { REDIS_SENTINELS: `127.0.0.1:${deadPort}`, REDIS_SENTINEL_NAME: 'mcpgw' }),
        HOST: '127.0.0.1',
        ADMIN_HOST: '127.0.0.1',
        PORT: '0',
        ADMIN_PORT: '0',
        LOG_LEVEL: 'info'
      },
      stdio: ['ignore', 'pipe', 'pipe']
    })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (chunk: Buffer) => { stdout += chunk.toString() })
    child.stderr.on('data', (chunk: Buffer) => { stderr += chunk.toString() })
    const started = Date.now()
    const exit = await Promise.race([
      new Promise<number | null>(resolve => child.once('exit', code => resolve(code))),
      sleep(30_000).then(() => 'timeout' as const)
    ])
    if (exit === 'timeout') child.kill('SIGKILL')
    const ms = Date.now() - started
    t.comment(`redis unreachable at start (${variable}): exit ${String(exit)} after ${ms} ms; stderr: ${stderr.trim().split('\n')[0] ?? ''}`)
    t.not(exit, 'timeout', 'the process ends by itself (defined behaviour: exit, so the orchestrator restarts it)')
    t.ok(typeof exit === 'number' && exit !== 0, `a non-zero exit code (${String(exit)})`)
    t.notMatch(stdout, /gateway listening/, 'it never listened')
    t.match(stderr, /cannot reach the event store/, 'it says it cannot reach the event store')
    t.match(stdout + stderr, new RegExp(`redis[^\\n]*127\\.0\\.0\\.1:${deadPort}|127\\.0\\.0\\.1:${deadPort}[^\\n]*redis`, 'i'), 'the log names Redis and the address it could not reach')
    t.match(stderr.split('\n').find(line => line.startsWith('mcp-resumable-gateway:')) ?? '', variable, `the fatal message names ${variable} (what to fix)`)
    t.notMatch(stderr, new RegExp(['REDIS_URL', 'REDIS_SENTINELS'].filter(other => other !== variable).join('|')), 'and no variable that was not set')
  })
}

/**
 * Redis stopped under a live standalone stream and started again. Without
 * persistence Redis comes back empty; with `appendonly yes` it comes back
 * with everything it acknowledged.
 */
async function redisOutage (t: Test, redis: { url: string, stop: () => Promise<void>, start: () => Promise<void> }, persistent: boolean): Promise<void> {
  const { gw, mcp } = await exampleSessionOnRedis(t, redis.url)
  const COUNT = 1500
  await mcp.client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: 10 } })
  const received = (): number[] => sequencesOf(mcp.notifications, 'broadcast')
  t.ok(await waitUntil(() => received().length >= 60, 10_000), 'the broadcast is flowing')
  const idBefore = lastStandaloneId(mcp) as string
  t.ok(decodeEventId(idBefore), `an id from before the outage: ${idBefore}`)
  const seqAtIdBefore = broadcastSeqOf(mcp, idBefore)

  await redis.stop()
  const stoppedAt = Date.now()
  const atStop = received().length
  t.ok(await until(async () => await readiness(gw.adminUrl) === 503, 6000), `readiness turns 503 (after ${Date.now() - stoppedAt} ms)`)
  // Past the recorder's confirm window (a failed append is resent for 2 s before its
  // events are passed on unrecorded, src/recording/stream-appender.ts), degraded mode: each failed
  // append waits for ioredis' reconnect attempts (maxRetriesPerRequest 3, its backoff
  // growing) before the next read, so live events arrive in bursts, seconds apart.
  const flowing = await waitUntil(() => received().length - atStop >= 10, 10_000)
  t.ok(flowing, `the live client keeps receiving while Redis is down (${received().length - atStop} notifications ${Date.now() - stoppedAt} ms after the stop)`)
  await redis.start()
  t.ok(await until(async () => await readiness(gw.adminUrl) === 200, 10_000), `readiness is back (${Date.now() - stoppedAt} ms after the stop)`)

  const unrecorded = metricSum(await metrics(gw.adminUrl), 'mcpgw_events_unrecorded_total')
  t.ok(unrecorded > 0, `events passed on unrecorded meanwhile: ${unrecorded}`)
  // To the end of the broadcast, or until nothing more arrives (the session may be gone).
  // Quiet for 5 s, not less: after a volatile Redis the client is closed with a retry
  // hint (SSE_RETRY_MS, 1 s) and reconnects into a recovered session, a silence of
  // about 1.5 s when the machine is slow.
  for (let last = -1, progressAt = Date.now(); !received().includes(COUNT - 1) && Date.now() - progressAt < 5000; await sleep(100)) {
    if (received().length !== last) [last, progressAt] = [received().length, Date.now()]
  }
  await sleep(300)
  const live = checkDelivery(received(), COUNT)
  t.comment(`${persistent ? 'persistent' : 'volatile'} redis, live client: sent ${COUNT}, received ${live.received}, lost ${live.lost.length} [${formatRanges(live.lost)}], duplicated ${live.duplicated.length}, out of order ${live.outOfOrder}; errors: ${[...new Set(mcp.errors.map(e => e.message.slice(0, 80)))].join(' | ')}`)
  t.same(live.duplicated, [], 'the live client got nothing twice')
  t.equal(live.outOfOrder, 0, 'in order')
  await mcp.close()

  // A second client resumes across the outage from an id it had before it.
  const headers = { accept: 'text/event-stream', 'mcp-session-id': mcp.sessionId as string, 'mcp-protocol-version': mcp.protocolVersion ?? '2025-11-25', 'last-event-id': idBefore }
  const resume = new RawSse(Number(new URL(gw.url).port), rawRequest('GET', '/mcp', Object.entries(headers)))
  t.teardown(() => resume.close())
  await resume.waitFor(s => s.status !== undefined, 5000)
  t.ok(resume.status !== undefined && resume.status < 500, `the resume is answered without a 5xx (${resume.status ?? 'none'})`)
  if (!persistent) {
    // Redis came back without the session: the gateway records it again under a
    // new epoch (RECOVER_LOST_SESSIONS), the upstream session goes on.
    t.equal(resume.status, 200, 'the resume is served: the session goes on')
    t.ok(await resume.waitFor(s => s.events.some(e => e.event === 'gateway-gap'), 3000), 'the resume is told about the gap')
    const gapEvent = resume.events.find(e => e.event === 'gateway-gap')
    t.match(gapEvent?.data, /"reason":"epoch"/, 'reason: the store lost the history (a new epoch)')
    t.ok(received().includes(COUNT - 1), 'the live client reconnected into the same session and reached the end of the broadcast')
    t.ok(metricSum(await metrics(gw.adminUrl), 'mcpgw_sessions_recovered_total') >= 1, 'the recovery is counted (mcpgw_sessions_recovered_total)')
    const fresh = await connectClient(`${gw.url}/mcp`)
    t.teardown(() => fresh.close())
    const echo = await fresh.client.callTool({ name: 'echo', arguments: { text: 'after the outage' } })
    t.same(echo.content, [{ type: 'text', text: 'after the outage' }], 'a new session works after Redis is back')
    return
  }
  t.equal(resume.status, 200, 'the resume is served')
  t.ok(await resume.waitFor(s => s.events.some(e => e.data.includes(`"seq":${COUNT - 1},`)), 10_000), 'it runs to the end of the broadcast')
  resume.close()
  const items = standaloneItems([{ method: 'GET', events: resume.events, ended: true, startedAt: 0 }])
  const gaps = items.filter(i => i.kind === 'gap')
  t.comment(`persistent redis, resume across the outage: ${items.length} items, gaps ${JSON.stringify(gaps)}`)
  t.equal(gaps.length, 1, 'exactly one gap marker')
  const gap = gaps[0]
  t.match(gap, { kind: 'gap', reason: 'store_unavailable' }, 'a gateway-gap event with reason store_unavailable')
  const gapEvent = resume.events.find(e => e.event === 'gateway-gap')
  t.ok(gapEvent?.id !== undefined, 'the marker is a recorded event (it has an id)')
  const at = items.findIndex(i => i.kind === 'gap')
  const seqs = (list: typeof items): number[] => list.flatMap(i => i.kind === 'seq' ? [i.seq] : [])
  const before = seqs(items.slice(0, at))
  const after = seqs(items.slice(at + 1))
  t.same(before, Array.from({ length: before.length }, (_, i) => seqAtIdBefore + 1 + i), 'before the marker: exactly what followed the id, up to the outage')
  const lastBefore = before.at(-1) ?? seqAtIdBefore
  const missing = (after[0] ?? COUNT) - lastBefore - 1
  t.equal(missing, (gap?.kind === 'gap' ? Number(gap.data.unrecorded) : NaN), `the marker counts exactly what is missing (${missing} notifications, ${formatRanges(Array.from({ length: Math.max(0, missing) }, (_, i) => lastBefore + 1 + i))})`)
  t.same(after, Array.from({ length: after.length }, (_, i) => (after[0] ?? 0) + i), 'after the marker: contiguous to the end')
  const union = checkDelivery([...new Set([...received(), ...before, ...after])].sort((a, b) => a - b), COUNT)
  t.same(union.lost, [], 'nothing lost overall: what the store missed, the live client got live')
}

t.test('Redis stopped mid-stream and started again', { skip: ownRedis.skip }, async t => {
  if (!ownRedis.present(t)) return
  t.test('without persistence (comes back empty)', async t => {
    const redis = await startRedisServer()
    t.teardown(() => redis.stop())
    await redisOutage(t, redis, false)
  })
  t.test('with persistence (appendonly yes, appendfsync always)', async t => {
    const redis = await startPersistentRedis(t)
    await redisOutage(t, redis, true)
  })
})

/**
 * A tool call whose answer ends while the client is away and Redis is down.
 * `longOutage`: Redis stays down until the final append (end of stream) has
 * failed too.
 */
async function answerEndsDuringOutage (t: Test, longOutage: boolean): Promise<void> {
  const redis = await startPersistentRedis(t)
  let pending: ServerResponse | undefined
  const upstream = createHttpServer((req, res) => {
    if (req.method !== 'POST') { res.writeHead(req.method === 'GET' ? 405 : 200).end(); return }
    readMessage(req).then(message => {
      if (message.method === 'initialize') {
        answerInitialize(res, message, 'end-1', '2025-06-18')
        return
      }
      if (message.id === undefined) { res.writeHead(202).end(); return }
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      for (let i = 0; i < 3; i++) res.write(`data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":${i}}}\n\n`)
      pending = res // the response comes later
    }, () => res.writeHead(400).end())
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => {
    upstream.closeAllConnections()
    await new Promise(resolve => upstream.close(resolve))
  })
  const gw = await redisGateway(t, `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/mcp`, redis.url)
  const port = Number(new URL(gw.url).port)
  const session = await rawInitialize(`${gw.url}/mcp`)
  const call = new RawSse(port, rawRequest('POST', '/mcp', Object.entries(session.headers()), '{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"slow","arguments":{}}}'))
  t.teardown(() => call.close())
  t.ok(await call.waitFor(s => s.events.length === 3), 'three notifications arrive')
  const lastId = call.lastId as string
  call.close() // the client's connection drops
  await redis.stop()
  pending?.end('data: {"jsonrpc":"2.0","id":5,"result":{"content":[]}}\n\n')
  const text = async (): Promise<string> => await metrics(gw.adminUrl)
  // Once degraded, an append attempt asks the store where the stream stands first (src/recording/stream-appender.ts, reconcile).
  const appendErrors = async (): Promise<number> => {
    const m = await text()
    return metricSum(m, 'mcpgw_store_errors_total', { op: 'append' }) + metricSum(m, 'mcpgw_store_errors_total', { op: 'state' })
  }
  // The response's append is resent for the recorder's confirm window (2 s) before it is passed on unrecorded.
  t.ok(await until(async () => metricSum(await text(), 'mcpgw_events_unrecorded_total') >= 1, 20_000), 'the response could not be recorded (the store is down)')
  if (longOutage) {
    const before = await appendErrors()
    t.ok(await until(async () => await appendErrors() > before, 20_000), 'and then the end of the stream could not be recorded either')
  }
  await redis.start()
  t.ok(await until(async () => await readiness(gw.adminUrl) === 200, 10_000), 'Redis is back')

  const resume = new RawSse(port, rawRequest('GET', '/mcp', Object.entries(session.getHeaders(lastId))))
  t.teardown(() => resume.close())
  t.ok(await resume.waitFor(s => s.status !== undefined, 5000), `the resume is answered (${resume.status ?? '-'})`)
  const ended = await resume.waitFor(s => s.ended || s.closed, 4000)
  const answer = resume.events.find(e => /"id":5/.test(e.data))
  const state = await gw.store.state(session.sessionId, decodeEventId(lastId)?.streamId ?? '')
  t.comment(`response lost in the outage${longOutage ? ', end of stream too' : ''}: resume HTTP ${resume.status ?? '-'}, events ${JSON.stringify(resume.events).slice(0, 200)}, ended ${String(ended)}; stored stream ${JSON.stringify(state)}`)
  t.ok(answer !== undefined, 'the resuming client gets the response, or the gateway\'s JSON-RPC error for request 5')
  t.ok(resume.events.some(e => e.event === 'gateway-gap'), 'it is told about the gap')
  t.ok(ended, 'the resumed stream ends')
}

t.test('Redis down when a tool call\'s answer ends (the client is away)', { skip: ownRedis.skip }, async t => {
  if (!ownRedis.present(t)) return
  t.test('Redis back before the stream\'s end is recorded', async t => { await answerEndsDuringOutage(t, false) })
  t.test('Redis still down when the stream\'s end is recorded', async t => { await answerEndsDuringOutage(t, true) })
})

t.test('1,000 clients reconnecting at once', async t => {
  const N = Number(process.env.RECONNECT_CLIENTS ?? 1000)
  // A light upstream (no SDK server per session): the load is the gateway's, not the upstream's.
  const streams = new Map<string, ServerResponse>()
  let sessions = 0
  const upstream = createHttpServer((req, res) => {
    const sessionId = req.headers['mcp-session-id'] as string | undefined
    if (req.method === 'GET' && sessionId !== undefined) {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.flushHeaders()
      streams.set(sessionId, res)
      res.on('close', () => { if (streams.get(sessionId) === res) streams.delete(sessionId) })
      return
    }
    if (req.method !== 'POST') { res.writeHead(200).end(); return }
    readMessage(req).then(message => {
      if (message.method === 'initialize') {
        answerInitialize(res, message, `storm-${++sessions}`, '2025-06-18')
        return
      }
      res.writeHead(202).end()
    }, () => res.writeHead(400).end())
  })
  upstream.maxConnections = N * 3
  await new Promise<void>(resolve => upstream.listen({ port: 0, host: '127.0.0.1', backlog: 4096 }, resolve))
  t.teardown(async () => {
    upstream.closeAllConnections()
    await new Promise(resolve => upstream.close(resolve))
  })
  /** `sessionId`: the client's (the gateway's); the upstream holds the stream under the id it issued, which the gateway's carries. */
  const emit = (sessionId: string, n: number): void => {
    const parsed = parseSessionId(sessionId)
    streams.get(parsed.kind === 'bound' ? parsed.firstUpstreamId : sessionId)?.write(`data: ${JSON.stringify({ jsonrpc: '2.0', method: 'notifications/message', params: { level: 'info', data: { n } } })}\n\n`)
  }
  // Every client connects from 127.0.0.1: above the default per-address connection cap.
  const gw = await startGateway(t, 'memory', `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/mcp`, {
    ...QUICK_CLOSE,
    MAX_CONNECTIONS_PER_ADDRESS: String(N * 3),
    // N sessions from one address and one (anonymous) principal: a reconnect storm, not an initialize flood.
    INITIALIZES_PER_MINUTE_PER_ADDRESS: String(N * 2),
    MAX_SESSIONS_PER_PRINCIPAL: String(N * 2)
  })
  const agent = new Agent({ connections: 32 })
  t.teardown(() => agent.close())

  let started = Date.now()
  const list: RawSession[] = []
  for (let i = 0; i < N; i += 100) {
    list.push(...await Promise.all(Array.from({ length: Math.min(100, N - i) }, async () => await rawInitialize(`${gw.url}/mcp`, { dispatcher: agent }))))
  }
  t.comment(`${N} sessions initialised in ${Date.now() - started} ms (raw initialize + notifications/initialized; a light upstream)`)
  const nOf = (data: string): number => (JSON.parse(data) as { params: { data: { n: number } } }).params.data.n

  // Each client attaches once and receives one event; then every connection drops.
  const first = list.map(s => new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(s.getHeaders()))))
  t.teardown(() => { for (const c of first) c.close() })
  t.ok(await until(() => streams.size === N && gw.gateway.hub.clientCount === N, 20_000), `${N} standalone streams attached (${gw.gateway.hub.clientCount})`)
  for (const s of list) emit(s.sessionId, 1)
  t.ok(await until(() => first.every(c => c.events.length >= 1), 20_000), 'each got its first event')
  const ids = first.map(c => c.lastId as string)
  for (const c of first) c.close()
  t.ok(await until(() => gw.gateway.hub.clientCount === 0, 10_000), 'every connection dropped')
  for (const s of list) { emit(s.sessionId, 2); emit(s.sessionId, 3) }
  await sleep(500) // recorded by the held upstream GETs while nobody is attached

  // The storm: all reconnect at once with Last-Event-ID.
  const rssBefore = process.memoryUsage().rss
  let rssPeak = rssBefore
  const sampler = setInterval(() => { rssPeak = Math.max(rssPeak, process.memoryUsage().rss) }, 50)
  started = Date.now()
  const storm = list.map((s, i) => new RawSse(gw.port, rawRequest('GET', '/mcp', Object.entries(s.getHeaders(ids[i])))))
  t.teardown(() => { for (const c of storm) c.close() })
  const answered = await until(() => storm.every(c => c.status !== undefined), 30_000)
  const answeredMs = Date.now() - started
  const complete = await until(() => storm.every(c => c.events.length >= 2), 30_000)
  const completeMs = Date.now() - started
  clearInterval(sampler)
  const statuses = new Map<string, number>()
  for (const c of storm) statuses.set(String(c.status), (statuses.get(String(c.status)) ?? 0) + 1)
  t.comment(`reconnect storm: ${N} GETs with Last-Event-ID; all answered in ${answeredMs} ms, all caught up in ${completeMs} ms; statuses ${JSON.stringify(Object.fromEntries(statuses))}; RSS ${Math.round(rssBefore / 1048576)} MiB -> peak ${Math.round(rssPeak / 1048576)} MiB`)
  t.ok(answered, 'every reconnect was answered')
  t.same([...statuses.keys()], ['200'], 'all 200: no 5xx, no refusal')
  t.ok(complete, 'every client caught up')
  const wrong = storm.filter(c => JSON.stringify(c.events.map(e => nOf(e.data))) !== '[2,3]')
  t.equal(wrong.length, 0, `each got exactly what it missed, events 2 and 3 (${wrong.length} did not${wrong[0] === undefined ? '' : `: ${JSON.stringify(wrong[0].events.map(e => e.data.slice(0, 60)))}`})`)
  t.ok(rssPeak - rssBefore < 256 * 1048576, `RSS bounded during the storm (+${Math.round((rssPeak - rssBefore) / 1048576)} MiB, test process included)`)
  t.equal((await exchange(`${gw.adminUrl}/healthz`)).status, 200, 'the gateway still answers /healthz')
})

/**
 * A tool call POSTed while Redis is down, Redis started again `downMs` after
 * the call went out (undefined: once it ended). Redis keeps its data
 * (appendonly), as a restart or failover does.
 */
async function toolCallInOutage (t: Test, tag: string, downMs?: number): Promise<{ result: string, elapsed: number, copies: SseEventRecord[], metricsText: string }> {
  const redis = await startPersistentRedis(t)
  const { gw, mcp } = await exampleSessionOnRedis(t, redis.url)
  await redis.stop()
  const started = Date.now()
  const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: 20, intervalMs: 10, tag } }, undefined, { timeout: 20_000 })
    .then(r => JSON.stringify(r.content), (err: unknown) => `failed: ${String(err)}`)
  if (downMs !== undefined) {
    await sleep(downMs)
    await redis.start()
  }
  const result = await call
  const elapsed = Date.now() - started
  if (downMs === undefined) await redis.start()
  const copies = mcp.exchanges.filter(e => e.method === 'POST').flatMap(e => e.events).filter(ev => ev.data.includes(`"${tag}"`))
  const metricsText = await metrics(gw.adminUrl)
  t.comment(`tool call, Redis ${downMs === undefined ? 'down throughout' : `down ${downMs} ms`}: ${result} after ${elapsed} ms; ${copies.length} notifications, ${copies.filter(ev => ev.id === undefined).length} without an id; mcpgw_events_unrecorded_total ${metricSum(metricsText, 'mcpgw_events_unrecorded_total')}, open_stream errors ${metricSum(metricsText, 'mcpgw_store_errors_total', { op: 'open_stream' })}`)
  t.equal(result, JSON.stringify([{ type: 'text', text: 'done 20' }]), 'the call ends with its result (not at its timeout)')
  t.equal(copies.length, 20, 'every notification arrived')
  return { result, elapsed, copies, metricsText }
}

t.test('a tool call POSTed while Redis is down for about a second: its answer is recorded, not passed through', { skip: ownRedis.skip }, async t => {
  if (!ownRedis.present(t)) return
  // Opening the request stream in the store is retried like an append (the
  // recorder's confirm window): a short outage only delays the answer, which
  // stays resumable. Passed through unrecorded, a connection cut mid-answer
  // would leave the call to its timeout (no id to resume from).
  const r = await toolCallInOutage(t, 'short-outage', 1000)
  t.same(r.copies.filter(ev => ev.id === undefined).map(ev => ev.data.slice(0, 60)), [], 'each with an id (recorded, resumable)')
  t.equal(metricSum(r.metricsText, 'mcpgw_events_unrecorded_total'), 0, 'nothing passed through unrecorded')
})

t.test('a tool call POSTed while Redis stays down: its answer is passed through unrecorded, the result arrives', { skip: ownRedis.skip }, async t => {
  if (!ownRedis.present(t)) return
  const r = await toolCallInOutage(t, 'long-outage')
  t.equal(r.copies.filter(ev => ev.id === undefined).length, 20, 'without ids: passed through, not recorded')
  t.ok(r.elapsed >= 2000, `after the store was retried for the confirm window (${r.elapsed} ms)`)
  t.equal(metricSum(r.metricsText, 'mcpgw_events_unrecorded_total', { reason: 'store_error' }), 1, 'the answer passed through unrecorded is counted')
})
