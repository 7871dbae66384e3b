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
import { standStill } from '../fixtures/stand-still.js'

const TIMEOUT_MS = 1000
const CHUNK = Buffer.alloc(1 << 20, 'x')

/**
 * A client on a thread of its own (it reads while this one stands still), up to
 * about 12 MB/s: more in a stall than the kernel buffers between the two hold.
 * It counts what it read in shared memory, which this thread reads even while
 * its own loop stands still.
 */
const READER = `
const { get } = require('node:http')
const { workerData } = require('node:worker_threads')
const read = new Int32Array(workerData.read)
get(workerData.url, (res) => {
  res.on('data', (chunk) => {
    Atomics.add(read, 0, chunk.length)
    res.pause()
    setTimeout(() => res.resume(), 5)
  })
  res.on('error', () => {})
  res.on('close', () => Atomics.store(read, 1, 1))
})
`

/**
 * What the client must read in a stall for the test to judge: with less, the
 * kernel may not have made room for more (it tells a socket writable once a
 * third of its send buffer is free), a cut would be right, and the test could
 * not tell. The kernel buffers between the two hold some MiB on loopback.
 */
const ENOUGH_READ = 2 << 20

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
  const shared = new SharedArrayBuffer(8)
  const counters = new Int32Array(shared)
  const read = (): number => Atomics.load(counters, 0)
  const reader = new Worker(READER, { eval: true, workerData: { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/`, read: shared } })
  t.teardown(() => reader.terminate())
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
  t.ok(read() > 0, 'the client reads')
  const readInStalls: number[] = []
  for (let round = 0; round < 2; round++) {
    // A look now, then the loop held past the timeout, late in its turn (after the poll
    // phase, as a long callback would be): the next look is the overdue timer's, before
    // the loop writes again.
    await new Promise<void>((resolve) => setImmediate(() => {
      buffers.tick()
      const before = read()
      standStill(2 * TIMEOUT_MS)
      readInStalls.push(read() - before)
      resolve()
    }))
    await sleep(TIMEOUT_MS / 2)
    if (cut.length > 0) break
  }
  // Without it the client made no room, and a cut would be right: the test could not tell.
  t.ok(readInStalls.every((bytes) => bytes >= ENOUGH_READ), `the client read while the process stood still (${readInStalls.join(', ')} bytes; at least ${ENOUGH_READ} each)`)
  t.same(cut, [], 'not cut')
  t.equal(res.destroyed, false, 'the connection is open')
  const readAfter = read()
  await sleep(300)
  t.ok(read() > readAfter && Atomics.load(counters, 1) === 0, 'and the client goes on reading')
})
