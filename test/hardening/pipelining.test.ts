// HTTP/1.1 pipelining: one connection writes many requests back to back.
// Node's server would dispatch them all at once; the gateway serves them one
// at a time (src/routes/pipelining.ts), so one connection holds at most one
// request at the upstream and one body in memory, and a connection with more
// than MAX_PIPELINED_WAITING requests waiting is closed. Pipelined requests
// that are answered are all answered, in order; one stuck connection is one
// write timeout, whatever it queued.
import t from 'tap'
import type { Test } from 'tap'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import { connect, type AddressInfo, type Socket } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { MAX_PIPELINED_WAITING } from '../../src/routes/pipelining.js'
import { startGateway } from '../fixtures/gateway.js'
import { metricSum, metrics, until } from '../fixtures/hardening.js'

t.setTimeout(60_000)

const WRITE_TIMEOUT_SECONDS = 1

/** What the upstream saw: requests in flight now, the most at once, and every path asked. */
interface UpstreamLog {
  inFlight: number
  peak: number
  readonly paths: string[]
}

/**
 * An upstream with three kinds of answers: /slow/<i> is held for `slowMs`,
 * /answer/<i> answers `answer-<i>` (after <i> ms x 50 for odd i, so a late
 * answer sits between quick ones), /big answers without end (64 KiB pieces, as
 * fast as the gateway takes them), /stream is an SSE answer that ends after
 * 300 ms, /mcp (the admin listener's probe) is refused after 100 ms.
 */
async function startUpstream (t: Test, slowMs = 20_000): Promise<{ url: string, log: UpstreamLog }> {
  const log: UpstreamLog = { inFlight: 0, peak: 0, paths: [] }
  const timers = new Set<NodeJS.Timeout>()
  const later = (ms: number, fn: () => void): void => {
    const timer = setTimeout(() => { timers.delete(timer); fn() }, ms)
    timers.add(timer)
  }
  const block = Buffer.alloc(64 * 1024, 0x61)
  const upstream = createServer((req: IncomingMessage, res: ServerResponse) => {
    const path = req.url ?? ''
    log.paths.push(path)
    log.inFlight++
    log.peak = Math.max(log.peak, log.inFlight)
    res.on('close', () => { log.inFlight-- })
    req.resume()
    if (path.startsWith('/slow/')) {
      later(slowMs, () => res.end('slow\n'))
    } else if (path.startsWith('/answer/')) {
      const i = Number(path.slice('/answer/'.length))
      later(i % 2 === 1 ? i * 50 : 0, () => res.end(`answer-${i}\n`))
    } else if (path === '/stream') {
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write('data: first\n\n')
      later(300, () => res.end('data: last\n\n'))
    } else if (path === '/big') {
      res.writeHead(200, { 'content-type': 'application/octet-stream' })
      const go = (): void => {
        while (res.write(block));
        res.once('drain', go)
      }
      go()
    } else if (path === '/mcp') {
      // The admin listener's /upstreamz probe: a GET without a session, refused after a moment.
      later(100, () => res.writeHead(405).end())
    } else {
      res.writeHead(404).end()
    }
  })
  await new Promise<void>(resolve => upstream.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => {
    for (const timer of timers) clearTimeout(timer)
    upstream.closeAllConnections()
    await new Promise(resolve => upstream.close(resolve))
  })
  return { url: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/mcp`, log }
}

/** A keep-alive request, to be written back to back with others on one connection. */
function pipelined (method: string, path: string, body?: Buffer): Buffer {
  const head = `${method} ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\n` +
    (body === undefined ? '' : `content-type: application/octet-stream\r\ncontent-length: ${body.length}\r\n`) + '\r\n'
  return Buffer.concat([Buffer.from(head, 'latin1'), body ?? Buffer.alloc(0)])
}

/** One connection that writes `requests` at once; it reads what comes only if `reading`. */
class PipeliningClient {
  readonly socket: Socket
  received = ''
  closed = false

  constructor (t: Test, port: number, requests: Buffer[], reading: boolean) {
    this.socket = connect(port, '127.0.0.1')
    this.socket.on('error', () => {})
    this.socket.on('close', () => { this.closed = true })
    if (reading) this.socket.on('data', (chunk: Buffer) => { this.received += chunk.toString('latin1') })
    else this.socket.pause()
    this.socket.write(Buffer.concat(requests))
    t.teardown(() => this.socket.destroy())
  }

  /** The status lines received so far. */
  statuses (): string[] {
    return this.received.match(/HTTP\/1\.1 \d{3} /g) ?? []
  }
}

t.test('pipelined slow requests reach the upstream one at a time; the connection is closed past the bound', async t => {
  const { url, log } = await startUpstream(t)
  const gw = await startGateway(t, 'memory', url)
  const client = new PipeliningClient(t, gw.port, [pipelined('GET', '/slow/0')], true)
  t.ok(await until(() => log.paths.length === 1, 5000), 'the first request reaches the upstream')
  // Up to the bound, the requests wait behind it: nothing more reaches the upstream.
  client.socket.write(Buffer.concat(Array.from({ length: MAX_PIPELINED_WAITING }, (_, i) => pipelined('GET', `/slow/${i + 1}`))))
  await sleep(500)
  t.equal(client.closed, false, `${MAX_PIPELINED_WAITING} waiting: the connection stays open`)
  t.same(log.paths, ['/slow/0'], 'the waiting requests are not forwarded')
  const more = 200
  client.socket.write(Buffer.concat(Array.from({ length: more }, (_, i) => pipelined('GET', `/slow/${i + 1 + MAX_PIPELINED_WAITING}`))))
  t.ok(await until(() => client.closed, 5000), `${more} more pipelined requests: the connection is closed`)
  await sleep(200)
  t.comment(`upstream: ${log.paths.length} requests seen, at most ${log.peak} at once (${1 + MAX_PIPELINED_WAITING + more} pipelined)`)
  t.equal(log.peak, 1, 'never more than one request of the connection at the upstream')
  t.same(log.paths, ['/slow/0'], 'only the first was forwarded')
  t.ok(await until(() => log.inFlight === 0, 2000), 'the forwarded one is dropped with the connection')
})

t.test('pipelined request bodies are read one at a time: the connection is not read ahead', async t => {
  const { url, log } = await startUpstream(t)
  const gw = await startGateway(t, 'memory', url)
  // Well within the bound: the connection stays open, held by backpressure alone.
  const body = Buffer.alloc(4 * 1024 * 1024, 0x20)
  const count = MAX_PIPELINED_WAITING
  const client = new PipeliningClient(t, gw.port, Array.from({ length: count }, (_, i) => pipelined('POST', `/slow/${i}`, body)), false)
  t.ok(await until(() => log.paths.length === 1, 5000), 'the first request reaches the upstream')
  await sleep(1000)
  t.comment(`upstream: ${log.paths.length} requests seen, at most ${log.peak} at once; client bytes not taken by the gateway: ${client.socket.writableLength}`)
  t.equal(log.peak, 1, 'one request of the connection at the upstream')
  t.equal(client.closed, false, 'the connection stays open')
  // Without the fix the gateway reads every body at once; with it, the kernel's buffers fill and the rest waits in the client.
  t.ok(client.socket.writableLength > body.length, `the gateway stopped reading the connection: ${client.socket.writableLength} bytes still in the client`)
})

t.test('pipelined requests that are answered are all answered, in order, after a stream that ends', async t => {
  const { url, log } = await startUpstream(t)
  const gw = await startGateway(t, 'memory', url)
  const count = 6
  const requests = [pipelined('GET', '/stream'), ...Array.from({ length: count }, (_, i) => pipelined('GET', `/answer/${i}`))]
  const client = new PipeliningClient(t, gw.port, requests, true)
  t.ok(await until(() => client.statuses().length === count + 1 && client.received.includes(`answer-${count - 1}\n`), 10_000), 'every request is answered')
  t.same(client.statuses(), Array(count + 1).fill('HTTP/1.1 200 '), 'all with 200')
  const positions = [client.received.indexOf('data: last'), ...Array.from({ length: count }, (_, i) => client.received.indexOf(`answer-${i}\n`))]
  t.ok(positions.every((at, i) => at > 0 && (i === 0 || at > positions[i - 1]!)), `answers in the order asked: ${positions.join(' ')}`)
  t.equal(log.peak, 1, 'one at a time at the upstream')
  t.equal(client.closed, false, 'the connection stays open for more')
})

t.test('the admin listener: pipelined /upstreamz probes reach the upstream one at a time', async t => {
  const { url, log } = await startUpstream(t)
  const gw = await startGateway(t, 'memory', url)
  const count = 5
  const client = new PipeliningClient(t, Number(new URL(gw.adminUrl).port), Array.from({ length: count }, () => pipelined('GET', '/upstreamz')), true)
  t.ok(await until(() => client.statuses().length === count, 10_000), 'every probe is answered')
  t.same(client.statuses(), Array(count).fill('HTTP/1.1 200 '), 'all with 200')
  t.equal(log.peak, 1, `one probe at a time at the upstream (of ${log.paths.length})`)
})

t.test('a request waiting behind a stream is dropped unserved when the connection closes', async t => {
  const { url, log } = await startUpstream(t)
  const gw = await startGateway(t, 'memory', url)
  const client = new PipeliningClient(t, gw.port, [pipelined('GET', '/big'), pipelined('GET', '/answer/0')], false)
  t.ok(await until(() => log.paths.length === 1, 5000), 'the stream is forwarded')
  client.socket.destroy()
  t.ok(await until(() => log.inFlight === 0, 5000), 'the stream is dropped upstream')
  await sleep(300)
  t.same(log.paths, ['/big'], 'the waiting request never reaches the upstream')
})

t.test('a stuck connection with pipelined requests counts one write timeout', async t => {
  const { url } = await startUpstream(t)
  const gw = await startGateway(t, 'memory', url, { CLIENT_WRITE_TIMEOUT_SECONDS: String(WRITE_TIMEOUT_SECONDS) })
  const timeouts = async (): Promise<number> => metricSum(await metrics(gw.adminUrl), 'mcpgw_client_write_timeouts_total')
  const before = await timeouts()
  const queued = 4
  const client = new PipeliningClient(t, gw.port, Array.from({ length: queued + 1 }, () => pipelined('GET', '/big')), false)
  // The client does not read, so it does not see the cut: the gateway's count shows it.
  t.ok(await until(async () => await timeouts() > before, WRITE_TIMEOUT_SECONDS * 5000), 'the connection is cut for want of progress')
  // Every queued answer would have timed out by now too (each is looked at on the same timer).
  await sleep(WRITE_TIMEOUT_SECONDS * 3000)
  t.equal(client.socket.writableLength, 0, 'the client wrote every request')
  const counted = await timeouts() - before
  t.comment(`mcpgw_client_write_timeouts_total +${counted} for one connection with ${queued} pipelined requests queued`)
  t.equal(counted, 1, 'counted once: connections, not queued answers')
})
