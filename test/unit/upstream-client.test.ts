// The upstream HTTP client (src/upstream/client.ts) against a real socket: an
// answer the gateway stops reading is dropped without an uncaught error.
import t from 'tap'
import { createServer, type ServerResponse } from 'node:http'
import { once } from 'node:events'
import { setTimeout as sleep } from 'node:timers/promises'
import type { AddressInfo } from 'node:net'
import { discardBody, UpstreamAbort, UpstreamClient } from '../../src/upstream/client.js'

for (const answer of ['refused', 'streaming'] as const) {
  t.test(`discardBody: an answer dropped unread (${answer}) is released, its abort not uncaught`, async t => {
    const open = new Set<ServerResponse>()
    const server = createServer((_req, res) => {
      open.add(res)
      if (answer === 'refused') {
      // Complete, never read: undici reports destroying it as an abort (the crash seen in CI).
        res.writeHead(409, { 'content-type': 'application/json' })
        res.end('{"jsonrpc":"2.0","error":{"code":-32000,"message":"Conflict"},"id":null}')
        return
      }
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.write('data: {"n":1}\n\n')
    })
    server.listen(0, '127.0.0.1')
    await once(server, 'listening')
    t.teardown(() => {
      for (const res of open) res.destroy()
      server.close()
    })
    const client = new UpstreamClient({ origin: new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}`), headersTimeoutMs: 2000 })
    t.teardown(() => client.close())

    const res = await client.request({ method: 'GET', path: '/mcp', headers: {} })
    t.equal(res.statusCode, answer === 'refused' ? 409 : 200, 'answered')
    t.equal(res.body.listenerCount('error'), 0, 'nobody listens for its errors (the case that crashed the process)')
    const errors: unknown[] = []
    const spy = (err: unknown): void => { errors.push(err) }
    // tap fails the test on an uncaught exception; this spy only shows what was kept.
    process.prependListener('uncaughtException', spy)
    t.teardown(() => process.off('uncaughtException', spy))
    discardBody(res.body)
    await sleep(50)
    t.ok(res.body.destroyed, 'the body is released')
    t.same(errors, [], 'no uncaught error')
  })
}

t.test('discardBody: a listener the caller had and removes later does not leave the error uncaught', async t => {
  const { PassThrough } = await import('node:stream')
  const body = new PassThrough()
  const temporary = (): void => {}
  body.on('error', temporary)
  discardBody(body)
  body.off('error', temporary) // e.g. a finished() handler cleaned up afterwards
  t.ok(body.destroyed, 'destroyed')
  body.emit('error', new Error('late abort'))
  t.pass('the late error is kept (tap fails the test on an uncaught one)')
})

t.test('UpstreamAbort ends a request before its answer and a stream in the middle of it', async t => {
  const closed: string[] = []
  const server = createServer((req, res) => {
    req.socket.once('close', () => closed.push(req.url ?? ''))
    if (req.url === '/silent') return // no head: the request waits
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.write('data: {"n":1}\n\n')
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  t.teardown(() => { server.closeAllConnections(); server.close() })
  const client = new UpstreamClient({ origin: new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}`), headersTimeoutMs: 10_000 })
  t.teardown(() => client.close())

  const early = new UpstreamAbort()
  const pending = client.request({ method: 'GET', path: '/silent', headers: {}, signal: early })
  await sleep(50)
  early.abort()
  await t.rejects(pending, { name: 'AbortError' }, 'a request waiting for its head is aborted')

  const late = new UpstreamAbort()
  const res = await client.request({ method: 'GET', path: '/stream', headers: {}, signal: late })
  const ended = new Promise<Error | undefined>(resolve => {
    res.body.once('error', resolve)
    res.body.once('end', () => resolve(undefined))
  })
  res.body.resume()
  late.abort()
  late.abort()
  t.match(await ended, { name: 'AbortError' }, 'a streaming answer ends in an abort')
  for (let i = 0; i < 100 && closed.length < 2; i++) await sleep(10)
  t.same(closed.sort(), ['/silent', '/stream'], 'both upstream connections closed')
  t.equal(late.listenerCount('abort'), 0, 'undici let go of the signal')
})
