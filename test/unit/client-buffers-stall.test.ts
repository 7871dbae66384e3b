// The client write timeout (src/sse/client-buffers.ts) on a real connection,
// when the gateway's process itself stands still (a long collection, a starved
// CPU) past the timeout while its client goes on reading: the kernel drains
// the socket meanwhile, but the loop has not written more yet when the overdue
// timer comes. The client made progress and must not be cut; the turn-by-turn
// rules are in test/unit/client-buffers.test.ts.
import t from 'tap'
import { once } from 'node:events'
import { createServer, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { Worker } from 'node:worker_threads'
import { ClientBuffers } from '../../src/sse/client-buffers.js'

const TIMEOUT_MS = 1000
const CHUNK = Buffer.alloc(1 << 20, 'x')

/** Holds this thread's event loop: nothing is read or written meanwhile. */
function standStill (ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms)
}

/** A client on a thread of its own (it reads while this one stands still), about 10 MB/s: more in a stall than the kernel buffers between the two hold. */
const READER = `
const { get } = require('node:http')
const { workerData, parentPort } = require('node:worker_threads')
get(workerData.url, (res) => {
  let read = 0
  res.on('data', (chunk) => {
    read += chunk.length
    res.pause()
    setTimeout(() => res.resume(), 5)
  })
  setInterval(() => parentPort.postMessage(read), 100).unref()
  res.on('error', () => {})
  res.on('close', () => parentPort.postMessage('closed'))
})
`

t.test('a client that reads while the process stands still past the write timeout is not cut', async (t) => {
  const buffers = new ClientBuffers({ maxBytes: 256 << 20, writeTimeoutMs: TIMEOUT_MS })
  t.teardown(() => buffers.stop())
  const cut: number[] = []
  let onAnswer: (res: ServerResponse) => void = () => {}
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream' })
    onAnswer(res)
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => { server.closeAllConnections(); server.close() })
  const reader = new Worker(READER, { eval: true, workerData: { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/` } })
  t.teardown(() => reader.terminate())
  let read = 0
  let closed = false
  reader.on('message', (message: number | 'closed') => { if (message === 'closed') closed = true; else read = message })
  const res = await new Promise<ServerResponse>((resolve) => { onAnswer = resolve })
  const account = buffers.connection(res, { writeTimedOut: (waiting) => { cut.push(waiting) } }, '127.0.0.1')
  // Far more than the reader takes in the test's time: bytes wait all along.
  for (let i = 0; i < 96; i++) {
    const before = res.writableLength
    res.write(CHUNK)
    account.wrote(res.writableLength - before)
  }
  t.ok(buffers.watched === 1 && buffers.waitingBytes > 0, 'bytes wait for the client')
  await sleep(300)
  const readBefore = read
  t.ok(readBefore > 0, 'the client reads')
  for (let round = 0; round < 2; round++) {
    // A look now, then the loop held past the timeout, late in its turn (after the poll
    // phase, as a long callback would be): the next look is the overdue timer's, before
    // the loop writes again.
    await new Promise<void>((resolve) => setImmediate(() => {
      buffers.tick()
      standStill(1.5 * TIMEOUT_MS)
      resolve()
    }))
    await sleep(TIMEOUT_MS / 2)
  }
  t.same(cut, [], 'not cut')
  t.equal(res.destroyed, false, 'the connection is open')
  await sleep(300)
  t.ok(read > readBefore && !closed, 'and the client goes on reading')
})
