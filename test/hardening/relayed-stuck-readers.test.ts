// Clients that stop reading an answer the gateway relays as it is, unrecorded
// (a legacy JSON answer on a session, a modern-era request's stream, another
// path's answer): each connection is cut within a few multiples of
// CLIENT_WRITE_TIMEOUT_SECONDS, the upstream's answer is dropped with it (its
// response closed upstream, unfinished), the cut is counted like a recorded
// stream's, and the bytes waiting for it were counted toward
// CLIENT_BUFFERS_MAX_BYTES meanwhile. A client that reads slowly but steadily
// is not cut. The upstream sends far more than socket buffers hold (the
// kernel takes a few MiB for a paused connection on loopback).
import t from 'tap'
import type { Test } from 'tap'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGatewayWithLog, type LoggingGateway } from '../fixtures/gateway.js'
import { answerInitialize, readMessage } from '../fixtures/hand-upstream.js'
import { metricSum, metrics, rawInitialize, rawRequest, until, type RawSession } from '../fixtures/hardening.js'

t.setTimeout(120_000)

const WRITE_TIMEOUT_SECONDS = 2
/** Each answer: far more than the kernel and the gateway's buffers hold for a client that does not read. */
const ANSWER_BYTES = 256 * 1024 * 1024
const MODERN = '2026-07-28'
const CALL = '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"big","arguments":{}}}'

/** One upstream answer: whether it was written to its end, and when its connection closed. */
interface UpstreamAnswer {
  readonly path: string
  finished: boolean
  closed: boolean
}

/**
 * An upstream whose answers are endless in practice: tools/call answers with
 * a large JSON body (legacy era) or an SSE stream (modern era), any other
 * path with a large text body; each written as the gateway takes it.
 */
async function startLargeUpstream (t: Test): Promise<{ url: string, answers: UpstreamAnswer[] }> {
  const answers: UpstreamAnswer[] = []
  const send = (req: IncomingMessage, res: ServerResponse, type: string, piece: () => Buffer): void => {
    const answer: UpstreamAnswer = { path: req.url ?? '', finished: false, closed: false }
    answers.push(answer)
    res.on('close', () => { answer.closed = true })
    res.writeHead(200, { 'content-type': type })
    let sent = 0
    const go = (): void => {
      while (sent < ANSWER_BYTES) {
        const bytes = piece()
        sent += bytes.length
        if (!res.write(bytes)) {
          res.once('drain', go)
          return
        }
      }
      answer.finished = true
      res.end()
    }
    go()
  }
  const block = Buffer.alloc(64 * 1024, 0x61)
  let seq = 0
  const event = (): Buffer => Buffer.from(`data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":{"seq":${seq++},"pad":"${'p'.repeat(4000)}"}}}\n\n`)
  const upstream = createServer((req, res) => {
    if (req.url?.startsWith('/mcp') !== true) {
      req.resume()
      send(req, res, 'text/plain', () => block)
      return
    }
    if (req.method !== 'POST') { res.writeHead(405).end(); return }
    readMessage(req).then(message => {
      if (message.method === 'initialize') answerInitialize(res, message, 'relay-1', '2025-06-18')
      else if (message.method !== 'tools/call') res.writeHead(202).end()
      else if (req.headers['mcp-protocol-version'] === MODERN) send(req, res, 'text/event-stream', event)
      else send(req, res, 'application/json', () => block)
    }, () => res.writeHead(400).end())
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => {
    upstream.closeAllConnections()
    await new Promise(resolve => upstream.close(resolve))
  })
  return { url: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/mcp`, answers }
}

/** A client that sends its request, reads the response head, then stops reading (a paused socket). */
class StoppedReader {
  readonly socket: Socket
  status: number | undefined
  closed = false
  #head = ''

  constructor (port: number, request: Buffer) {
    this.socket = connect(port, '127.0.0.1')
    this.socket.on('error', () => {})
    this.socket.on('close', () => { this.closed = true })
    const onData = (chunk: Buffer): void => {
      this.#head += chunk.toString('latin1')
      if (!this.#head.includes('\r\n\r\n')) return
      this.status = Number(/^HTTP\/1\.1 (\d{3})/.exec(this.#head)?.[1])
      this.socket.off('data', onData)
      this.socket.pause()
    }
    this.socket.on('data', onData)
    this.socket.write(request)
  }
}

/**
 * A client that reads `bytesPerTick` every `everyMs`, and no more: slower
 * than the upstream sends, and steady. (Fast enough to empty the kernel's
 * receive buffer within the write timeout: the gateway sees progress only
 * when the client's TCP window opens again.)
 */
class SlowReader {
  readonly socket: Socket
  bytes = 0
  closed = false
  readonly #timer: NodeJS.Timeout
  #tick = 0

  constructor (port: number, request: Buffer, everyMs: number, bytesPerTick: number) {
    this.socket = connect(port, '127.0.0.1')
    this.socket.on('error', () => {})
    this.socket.on('close', () => { this.closed = true })
    this.socket.on('data', (chunk: Buffer) => {
      this.bytes += chunk.length
      this.#tick += chunk.length
      if (this.#tick >= bytesPerTick) this.socket.pause()
    })
    this.socket.write(request)
    this.#timer = setInterval(() => {
      this.#tick = 0
      this.socket.resume()
    }, everyMs)
  }

  close (): void {
    clearInterval(this.#timer)
    this.socket.destroy()
  }
}

interface Setup {
  gw: LoggingGateway
  session: RawSession
  answers: UpstreamAnswer[]
}

async function setup (t: Test): Promise<Setup> {
  const { url, answers } = await startLargeUpstream(t)
  const gw = await startGatewayWithLog(t, url, { CLIENT_WRITE_TIMEOUT_SECONDS: String(WRITE_TIMEOUT_SECONDS), SHUTDOWN_GRACE_SECONDS: '1', DRAIN_SPREAD_SECONDS: '0' })
  const session = await rawInitialize(`${gw.url}/mcp`)
  return { gw, session, answers }
}

const timeouts = async (gw: LoggingGateway): Promise<number> => metricSum(await metrics(gw.adminUrl), 'mcpgw_client_write_timeouts_total')
const buffered = async (gw: LoggingGateway): Promise<number> => metricSum(await metrics(gw.adminUrl), 'mcpgw_client_buffered_bytes')

/** The requests whose answers are relayed, each on the gateway's session. */
const relayed: ReadonlyArray<{ name: string, request: (session: RawSession) => Buffer, upstreamPath: string }> = [
  {
    name: 'a legacy JSON answer on a session',
    request: session => rawRequest('POST', '/mcp', Object.entries(session.headers()), CALL),
    upstreamPath: '/mcp'
  },
  {
    name: 'a modern-era request\'s SSE answer',
    request: session => rawRequest('POST', '/mcp', Object.entries({ ...session.headers(), 'mcp-protocol-version': MODERN }), CALL),
    upstreamPath: '/mcp'
  },
  {
    name: 'another path\'s answer',
    request: session => rawRequest('GET', '/files/big', Object.entries(session.getHeaders())),
    upstreamPath: '/files/big'
  }
]

t.test('a client that stops reading a relayed answer is cut within the write timeout, and the upstream answer with it', async t => {
  const { gw, session, answers } = await setup(t)
  for (const { name, request, upstreamPath } of relayed) {
    await t.test(name, async t => {
      const before = await timeouts(gw)
      const answersBefore = answers.length
      const client = new StoppedReader(gw.port, request(session))
      t.teardown(() => client.socket.destroy())
      t.ok(await until(() => client.status !== undefined, 10_000), 'the response head arrives')
      t.equal(client.status, 200)
      const headAt = Date.now()
      const answer = answers[answersBefore]
      t.equal(answer?.path.startsWith(upstreamPath), true, 'the upstream answers it')
      // What the kernel does not take waits in the gateway, counted toward the budget.
      t.ok(await until(async () => await buffered(gw) > 0, WRITE_TIMEOUT_SECONDS * 1000), 'bytes waiting for the client are counted in mcpgw_client_buffered_bytes')
      // Cut a timeout after the client's last progress (the kernel's buffers filling,
      // a fraction of a second), found by a timer's look (a quarter of the timeout).
      const bound = WRITE_TIMEOUT_SECONDS * 3
      t.ok(await until(async () => await timeouts(gw) === before + 1, bound * 1000), `cut within ${bound} s of the head, counted in mcpgw_client_write_timeouts_total`)
      t.comment(`${name}: cut ${Date.now() - headAt} ms after the head (write timeout ${WRITE_TIMEOUT_SECONDS} s)`)
      t.ok(await until(() => answer?.closed === true, 2000), 'the upstream\'s response is closed')
      t.equal(answer?.finished, false, 'before its end: dropped, not read out')
      // (A paused socket does not see its connection close: the client reads what the kernel holds, then the end.)
      client.socket.on('data', () => {})
      client.socket.resume()
      t.ok(await until(() => client.closed, 5000), 'the client\'s connection is closed')
      t.ok(await until(async () => await buffered(gw) === 0, 3000), 'nothing waits for a client any more')
    })
  }
  t.equal(await timeouts(gw), relayed.length, 'one cut each')
  const logged = gw.lines.filter(l => typeof l.msg === 'string' && l.msg.startsWith('client accepted no bytes of a relayed answer'))
  t.ok(logged.length >= 1 && logged.length <= relayed.length, `logged with its context (${logged.length} line(s): the logger writes a repeated warning once per window)`)
  t.match(logged[0], { level: 'warn', statusCode: 200, waitingBytes: Number, upstreamEnded: false, timeoutSeconds: WRITE_TIMEOUT_SECONDS })
})

t.test('a client that reads a relayed answer slowly but steadily is not cut', async t => {
  const { gw, session, answers } = await setup(t)
  const clients = relayed.map(({ request }) => new SlowReader(gw.port, request(session), 100, 256 * 1024))
  t.teardown(() => { for (const client of clients) client.close() })
  // Long enough for the kernel's buffers to fill, then several write timeouts of slow reading.
  await sleep(WRITE_TIMEOUT_SECONDS * 4 * 1000)
  const read = clients.map(c => c.bytes)
  t.ok(await buffered(gw) > 0, 'bytes wait in the gateway for them (the kernel\'s buffers are full)')
  await sleep(WRITE_TIMEOUT_SECONDS * 1000)
  relayed.forEach(({ name }, i) => {
    const client = clients[i] as SlowReader
    t.notOk(client.closed, `${name}: still open`)
    t.ok(client.bytes > (read[i] as number), `${name}: still reading (${client.bytes} bytes so far)`)
  })
  t.equal(await timeouts(gw), 0, 'none cut')
  t.ok(answers.every(a => !a.closed), 'every upstream answer still being relayed')
})
