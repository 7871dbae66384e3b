// The store reaches Redis through Sentinels. When its connections drop while a
// Sentinel answers, the commands waiting are sent again on the new ones. When
// none of them answers while
// the store's connections are down (a network cut to every Sentinel, all of
// them restarting). ioredis alone asks the Sentinels again and again within one
// connection attempt, and every command waits for that attempt: a request that
// needs the store would wait for ever. Now each round of questions that no
// Sentinel answers fails what waits (the request gets its 503), and the store
// asks again a moment later: once a Sentinel answers, commands and live notices
// work again.
import t from 'tap'
import type { Test } from 'tap'
import { createServer, type AddressInfo, type Socket } from 'node:net'
import { Redis } from 'ioredis'
import { setTimeout as sleep } from 'node:timers/promises'
import type { StreamNotice } from '../../src/store/contract.js'
import { RedisEventStore } from '../../src/store/redis/redis-store.js'
import { startRedisSentinel } from '../fixtures/redis-topologies.js'
import { externalTools } from '../fixtures/external-tools.js'
import { uniquePrefix } from '../fixtures/redis.js'

const ownRedis = await externalTools(['redis-server'])
const RETENTION = { maxEvents: 1000, maxBytes: 1 << 20, ttlMs: 60_000 }
const TIMEOUT_MS = 500

/** What `work` came to within `ms`: its value, its error, or `hung`. */
async function within<T> (ms: number, work: Promise<T>): Promise<{ value: T } | { error: unknown } | 'hung'> {
  return await Promise.race([work.then((value) => ({ value }), (error: unknown) => ({ error })), sleep(ms).then(() => 'hung' as const)])
}

/** A TCP listener that takes connections and never answers; counts them. */
async function blackHole (t: Test): Promise<{ port: number, asked: () => number }> {
  const sockets = new Set<Socket>()
  let accepted = 0
  const server = createServer((socket) => {
    accepted++
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => {})
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => {
    for (const socket of sockets) socket.destroy()
    await new Promise((resolve) => server.close(resolve))
  })
  return { port: (server.address() as AddressInfo).port, asked: () => accepted }
}

async function eventually (what: string, check: () => Promise<boolean> | boolean, ms: number): Promise<void> {
  const deadline = Date.now() + ms
  while (Date.now() < deadline) {
    if (await check()) return
    await sleep(50)
  }
  throw new Error(`not within ${ms} ms: ${what}`)
}

t.test('no Sentinel answers while the connections are down: commands fail instead of waiting, and the store comes back with them', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const { master, sentinel, name } = await startRedisSentinel(t)
  // A Sentinel that takes connections and never answers, first in the list: each question to it costs the timeout.
  const hole = await blackHole(t)
  const keyPrefix = uniquePrefix('sentinels-unreachable')
  const warnings: string[] = []
  const logger = { warn: (...args: unknown[]) => { warnings.push(String(args[1])) } }
  const store = await RedisEventStore.connect({ sentinels: [{ host: '127.0.0.1', port: hole.port }, { host: '127.0.0.1', port: sentinel.port }], name, keyPrefix, retention: RETENTION, socketTimeoutMs: TIMEOUT_MS, logger })
  t.teardown(() => store.close())
  // Another replica, reaching the master directly: its appends reach this store as notices.
  const writer = await RedisEventStore.connect({ url: `redis://127.0.0.1:${master.port}`, keyPrefix, retention: RETENTION })
  t.teardown(() => writer.close())
  const admin = new Redis({ port: master.port, host: '127.0.0.1' })
  t.teardown(() => admin.disconnect())

  await store.createSession('sess', 'p')
  await store.openStream('sess', 's')
  const heard: number[] = []
  const unsubscribe = store.subscribe('sess', 's', (notice: StreamNotice) => { heard.push(notice.toSeq) })
  t.teardown(unsubscribe)
  await eventually('a notice before the trouble', async () => {
    await writer.append('sess', 's', [{ data: 'before' }])
    return heard.length > 0
  }, 5000)

  await sentinel.stop()
  const askedBefore = hole.asked()
  // The store's connections drop; opening them again needs a Sentinel.
  const killed = await admin.client('KILL', 'TYPE', 'normal', 'SKIPME', 'yes') as number + (await admin.client('KILL', 'TYPE', 'pubsub') as number)
  t.ok(killed >= 2, `the store's connections closed (${killed} clients)`)
  // Issued at once: it waits for the connection being opened again, through the Sentinels.
  const started = Date.now()
  const outcome = await within(10_000, store.read('sess', 's', 0, 10))
  const tookMs = Date.now() - started
  t.not(outcome, 'hung', 'a command waiting for the connection settles while no Sentinel answers')
  t.ok(outcome !== 'hung' && 'error' in outcome, 'it fails: the request that needs it gets its 503')
  t.ok(tookMs < 3 * TIMEOUT_MS, `within one round of questions, one timeout for the silent Sentinel (${tookMs} ms)`)
  await sleep(2500)
  const again = await within(3000, store.getSession('sess'))
  t.ok(again !== 'hung' && 'error' in again, 'and so does one that comes while none answers')
  const rounds = warnings.filter((message) => message.includes('no Redis Sentinel answered')).length
  const asked = hole.asked() - askedBefore
  t.ok(rounds >= 4, `the log says so at each round (${rounds} rounds, of both connections)`)
  // A round in progress on each connection may have asked it already.
  t.ok(asked <= rounds + 2, `each round asks each Sentinel once (the silent one asked ${asked} times in ${rounds} rounds)`)

  await sentinel.start()
  await eventually('the store answers once a Sentinel does', async () => {
    const read = await within(1000, store.read('sess', 's', 0, 10))
    return read !== 'hung' && 'value' in read && read.value !== null
  }, 15_000)
  const seen = heard.length
  await eventually('live notices again', async () => {
    await writer.append('sess', 's', [{ data: 'after' }])
    return heard.length > seen
  }, 10_000)
  t.pass('commands and live notices work again')
})

t.test('the connections drop while the Sentinel answers: the commands issued meanwhile are answered on the new ones', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const { master, sentinel, name } = await startRedisSentinel(t)
  const keyPrefix = uniquePrefix('sentinel-reconnect')
  const warnings: unknown[] = []
  const logger = { warn: (...args: unknown[]) => { warnings.push(args) } }
  const store = await RedisEventStore.connect({ sentinels: [{ host: '127.0.0.1', port: sentinel.port }], name, keyPrefix, retention: RETENTION, socketTimeoutMs: TIMEOUT_MS, logger })
  t.teardown(() => store.close())
  const admin = new Redis({ port: master.port, host: '127.0.0.1' })
  t.teardown(() => admin.disconnect())
  await store.createSession('sess', 'p')
  await store.append('sess', 's', [{ data: 'kept' }])
  // Each attempt after the first starts where the last one stopped: at the end of the list.
  for (let drop = 1; drop <= 3; drop++) {
    await admin.client('KILL', 'TYPE', 'normal', 'SKIPME', 'yes')
    const read = await within(5000, store.read('sess', 's', 0, 10).then((r) => r?.events.map((e) => e.data)))
    t.same(read, { value: ['kept'] }, `drop ${drop}: the read waits for the new connection and is answered`)
  }
  // The master frozen longer than the timeout: the watchdog replaces both connections.
  const frozen = master.freeze(3 * TIMEOUT_MS)
  const read = await within(10_000, store.read('sess', 's', 0, 10).then((r) => r?.events.map((e) => e.data)))
  await frozen
  t.same(read, { value: ['kept'] }, 'a read waiting on a connection the watchdog replaced is sent again and answered')
  t.ok(store.connectionsReplaced().ping >= 1, 'the watchdog did replace it')
  t.same(warnings.filter((args) => String((args as unknown[])[1]).includes('Sentinel')), [], 'no round of Sentinels failed')
})
