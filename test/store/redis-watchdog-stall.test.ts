// The Redis connection watchdog (src/store/redis/watchdog.ts) on a real
// connection, when the process itself stands still (a long collection, a
// starved CPU) while a PING waits: the PONG arrives in the socket meanwhile,
// but the watchdog's overdue timer runs before the loop reads that socket. The
// connection is healthy and must be kept; one that truly answers nothing is
// still closed (test/unit/redis-watchdog.test.ts has the turn-by-turn rules).
import t from 'tap'
import type { Test } from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { Redis } from 'ioredis'
import type { StoreLogger } from '../../src/store/redis/connection.js'
import { ConnectionWatchdog } from '../../src/store/redis/watchdog.js'
import { waitUntil } from '../fixtures/mcp-client.js'
import { requireRedis, uniquePrefix } from '../fixtures/redis.js'
import { standStill } from '../fixtures/stand-still.js'

const TIMEOUT_MS = 200

/** A ready connection of its own, checked by a watchdog that the test turns itself, or its timer. */
async function watched (t: Test, logger?: StoreLogger): Promise<{ connection: Redis, socket: unknown, watchdog: ConnectionWatchdog }> {
  const url = await requireRedis(t)
  const connection = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1 })
  t.teardown(() => connection.disconnect())
  await connection.connect()
  const watchdog = new ConnectionWatchdog({ connections: () => [connection], timeoutMs: TIMEOUT_MS, logger })
  t.teardown(() => watchdog.close())
  return { connection, socket: connection.stream, watchdog }
}

t.test('a PING answered while the process stood still past the timeout keeps its connection', async (t) => {
  const warnings: unknown[] = []
  const { connection, socket, watchdog } = await watched(t, { warn: (fields: unknown) => { warnings.push(fields) } })
  for (let round = 0; round < 3; round++) {
    // A PING goes out now; its answer lands in the socket while the loop is held, late in
    // its turn (after the poll phase, as a long callback would be). The watchdog's
    // overdue timer runs next, before the loop reads the socket again.
    await new Promise<void>((resolve) => setImmediate(() => {
      watchdog.check()
      standStill(5 * TIMEOUT_MS)
      resolve()
    }))
    await sleep(TIMEOUT_MS / 2)
  }
  t.same(watchdog.replaced(), { ping: 0, handshake: 0 }, 'no connection taken for dead')
  t.same(warnings, [], 'nothing logged')
  t.equal(connection.stream, socket, 'the same socket')
  t.equal(await connection.ping(), 'PONG', 'and it answers')
})

t.test('a connection whose PING truly goes unanswered is still closed, once the loop has read its socket', async (t) => {
  const { connection, socket, watchdog } = await watched(t)
  // A blocking read holds the connection: Redis answers its next command, the PING, only after it.
  connection.blpop(`${uniquePrefix('watchdog-stall')}list`, 1).catch(() => {})
  await sleep(20)
  watchdog.check()
  standStill(2 * TIMEOUT_MS)
  t.ok(await waitUntil(() => watchdog.replaced().ping === 1, 2000), 'taken for dead')
  // The read is sent again on the new connection and holds it as long again: no more turns.
  watchdog.close()
  t.ok(await waitUntil(() => connection.stream !== socket && connection.status === 'ready', 2000), 'a new connection, ready')
  t.equal(await connection.ping(), 'PONG', 'which answers')
})
