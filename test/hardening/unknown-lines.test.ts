// Upstream events of millions of short lines the gateway does not know
// (`x`, one letter, no value), within MAX_EVENT_BYTES. The SSE parser clients
// use makes an error object of each such line; where the gateway reads an
// event's data (whether a call's event answers it, the result a resume ends
// with, an initialize's result), feeding it such an event held the whole
// process for seconds: every client, /healthz and the store waited. Each must
// now be read in one pass. Hand-written upstream (node:http), embedded store,
// a raw client that parses nothing itself.
import t from 'tap'
import type { Test } from 'tap'
import { createServer } from 'node:http'
import { connect } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGateway, type RunningGateway } from '../fixtures/gateway.js'
import { listenUntilEnd, postsOnly } from '../fixtures/hand-upstream.js'
import { ACCEPT_BOTH, rawInitialize, rawRequest, type RawSession } from '../fixtures/hardening.js'

t.setTimeout(120_000)

const VERSION = '2025-06-18'
/** About 3.8 MB of one-letter lines: under MAX_EVENT_BYTES (4 MiB). */
const PADDING = Buffer.alloc(2 * 1_900_000, 'x\n')
/**
 * The old gateway stood still 10-12 s on one such event (on a quiet machine); a
 * pass over it takes tens of milliseconds there, and up to a second beside the
 * other test files of a CI run on two cores.
 */
const STALL_BOUND_MS = 3000

/** An event whose data is `message`, with an upstream id, padded after its data line. */
function paddedEvent (message: unknown, upstreamId: string): Buffer {
  return Buffer.concat([Buffer.from(`id: ${upstreamId}\ndata: ${JSON.stringify(message)}\n`), PADDING, Buffer.from('\n')])
}

/** The longest the event loop was held while `work` ran (sampled every 20 ms). */
async function worstStall<T> (work: () => Promise<T>): Promise<{ result: T, worstMs: number }> {
  let worst = 0
  let last = performance.now()
  const sampler = setInterval(() => {
    const now = performance.now()
    worst = Math.max(worst, now - last - 20)
    last = now
  }, 20)
  try {
    return { result: await work(), worstMs: worst }
  } finally {
    clearInterval(sampler)
  }
}

/** Sends `bytes` on a raw socket and collects the answer until `done` says so (or 60 s). */
async function rawExchange (t: Test, port: number, bytes: Buffer, done: (received: Buffer) => boolean): Promise<Buffer> {
  const socket = connect({ port, host: '127.0.0.1' })
  t.teardown(() => socket.destroy())
  const chunks: Buffer[] = []
  let tail = Buffer.alloc(0)
  const finished = new Promise<void>(resolve => {
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk)
      tail = Buffer.concat([tail, chunk]).subarray(-4096)
      if (done(tail)) resolve()
    })
    socket.on('close', () => resolve())
  })
  socket.on('error', () => {})
  socket.write(bytes)
  const giveUp = new AbortController()
  try {
    await Promise.race([finished, sleep(60_000, undefined, { signal: giveUp.signal })])
  } finally {
    giveUp.abort()
  }
  return Buffer.concat(chunks)
}

/** The end of a chunked answer: the upstream ended its answer after the padded event, and so does the gateway. */
function answerEnded (tail: Buffer): boolean {
  return tail.subarray(-5).toString('latin1') === '0\r\n\r\n'
}

function callTool (session: RawSession, id: number): Buffer {
  return rawRequest('POST', '/mcp', Object.entries(session.headers()), JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'x', arguments: {} } }))
}

async function gatewayBefore (t: Test, answerCall: (id: number | string) => Buffer, answerInitialize?: (id: number | string) => Buffer): Promise<RunningGateway> {
  const upstreamUrl = await listenUntilEnd(t, createServer(postsOnly((message, _req, res) => {
    if (message.method === 'initialize') {
      const id = message.id as number
      if (answerInitialize !== undefined) {
        res.writeHead(200, { 'content-type': 'text/event-stream', 'mcp-session-id': 'padded-session-01' })
        res.end(answerInitialize(id))
        return
      }
      res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 'padded-session-01' })
      res.end(JSON.stringify({ jsonrpc: '2.0', id, result: { protocolVersion: VERSION, capabilities: {}, serverInfo: { name: 'x', version: '1' } } }))
    } else if (message.id === undefined) {
      res.writeHead(202).end()
    } else {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.end(answerCall(message.id as number))
    }
  })))
  return await startGateway(t, 'memory', upstreamUrl)
}

t.test('a call\'s result padded with a million unknown lines: answered, and resumed past its end, without holding the process', async t => {
  const gw = await gatewayBefore(t, id => paddedEvent({ jsonrpc: '2.0', id, result: { content: [] } }, 'u-1'))
  const session = await rawInitialize(`${gw.url}/mcp`, { version: VERSION })
  const RESULT = Buffer.from('"id":7,"result"')
  const call = await worstStall(async () => await rawExchange(t, gw.port, callTool(session, 7), answerEnded))
  t.ok(call.result.includes(RESULT), 'the client gets the result')
  t.ok(call.result.length > PADDING.length, 'with its event as the upstream sent it')
  t.ok(call.worstMs < STALL_BOUND_MS, `the process never stood still for seconds (worst ${Math.round(call.worstMs)} ms)`)

  // The result's gateway id: the id line after the padding.
  const idAt = call.result.lastIndexOf('\nid: ')
  const resultId = call.result.subarray(idAt + 5, call.result.indexOf('\n', idAt + 1)).toString()
  t.match(resultId, /\S+/, 'the result carries a gateway id')
  // A resume from the result itself: the stream is over, and the gateway checks that its last event is the result.
  const headers = Object.entries(session.getHeaders(resultId))
  const resume = await worstStall(async () => await rawExchange(t, gw.port, rawRequest('GET', '/mcp', headers), received => received.includes('\r\n\r\n')))
  t.match(resume.result.toString('latin1', 0, 12), /^HTTP\/1\.1 \d{3}/, 'the resume is answered')
  t.ok(resume.worstMs < STALL_BOUND_MS, `the process never stood still for seconds (worst ${Math.round(resume.worstMs)} ms)`)
})

t.test('an initialize answered over SSE with its result padded: the session keeps the result, without holding the process', async t => {
  const gw = await gatewayBefore(t, id => Buffer.from(`data: ${JSON.stringify({ jsonrpc: '2.0', id, result: {} })}\n\n`), id =>
    paddedEvent({ jsonrpc: '2.0', id, result: { protocolVersion: VERSION, capabilities: {}, serverInfo: { name: 'padded', version: '1' } } }, 'u-0'))
  const init = rawRequest('POST', '/mcp', [['accept', ACCEPT_BOTH], ['content-type', 'application/json'], ['mcp-protocol-version', VERSION]],
    JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: VERSION, capabilities: {}, clientInfo: { name: 'padded', version: '0' } } }))
  const SERVER = Buffer.from('"serverInfo":{"name":"padded"')
  const answer = await worstStall(async () => await rawExchange(t, gw.port, init, answerEnded))
  t.ok(answer.result.includes(SERVER), 'the client gets the result')
  t.ok(answer.worstMs < STALL_BOUND_MS, `the process never stood still for seconds (worst ${Math.round(answer.worstMs)} ms)`)
  const sessionId = /mcp-session-id: (\S+)\r\n/i.exec(answer.result.toString('latin1', 0, 2048))?.[1]
  t.type(sessionId, 'string', 'a session was issued')
  const recipe = await gw.store.recipe(sessionId as string)
  t.ok(recipe?.initializeResult.includes(VERSION), 'the gateway found the result in the event: the session has its recipe')
})
