// A script call written to the socket without copying its arguments
// (src/store/redis/script-call.ts, which relies on ioredis's Command#toWritable
// and the connection's socket, under an exact version pin): the same bytes as
// ioredis would write, and the script loaded again when Redis has lost it.
// And its transaction() on a connection lost mid-way: what ioredis does with the
// commands it had sent depends on their pipelineIndex and inTransaction, set by hand
// there. These fail when an ioredis release changes what that module relies on. Runs
// on a private redis-server: SCRIPT FLUSH would disturb other tests' connections.
import { connect, createServer, type AddressInfo, type Socket } from 'node:net'
import t from 'tap'
import type { Test } from 'tap'
import { Command, Redis } from 'ioredis'
import { ScriptCall, transaction, writeCommand } from '../../src/store/redis/script-call.js'
import { countWritevs } from '../fixtures/net.js'
import { startRedisServer } from '../fixtures/redis.js'
import { externalTools } from '../fixtures/external-tools.js'

const ownRedis = await externalTools(['redis-server'])

/** A connection to a private redis-server, and its EVAL / EVALSHA counts so far. */
async function privateRedis (t: Test): Promise<{ redis: Redis, calls: () => Promise<Record<string, number>> }> {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const redis = new Redis(server.url)
  t.teardown(() => redis.disconnect())
  const calls = async (): Promise<Record<string, number>> => {
    const info = await redis.info('commandstats')
    const count = (name: string): number => Number(new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(info)?.[1] ?? 0)
    return { eval: count('eval'), evalsha: count('evalsha') }
  }
  return { redis, calls }
}

t.test('the command on the wire is what ioredis would write', async t => {
  const args = ['key', 42, Buffer.from('a\r\nb\0é'), Buffer.alloc(0), 'ü', Buffer.from('x'.repeat(70_000))]
  const parts: Array<string | Buffer> = []
  const tail = writeCommand({
    cork: () => t.fail('the caller corks'),
    uncork: () => t.fail('the caller uncorks'),
    write: (chunk) => { parts.push(chunk); return true }
  }, 'evalsha', args)
  const expected = new Command('evalsha', args).toWritable({}) as Buffer
  t.same(Buffer.concat([...parts, tail].map(p => typeof p === 'string' ? Buffer.from(p) : p)), expected, 'byte for byte, with the piece returned last')
  t.ok(parts.includes(args[5] as Buffer), 'a Buffer argument is written itself, not copied')
  t.ok(tail.length > 0 && parts.every(p => p.length > 0), 'no piece is empty')
  t.equal(writeCommand({ cork () {}, uncork () {}, write: () => t.fail('nothing to write') }, 'evalsha', ['sha', 0]),
    '*3\r\n$7\r\nevalsha\r\n$3\r\nsha\r\n$1\r\n0\r\n', 'a command of text only is all returned')
})

t.test('EVAL on a new connection, EVALSHA after, and EVAL again after NOSCRIPT', { skip: ownRedis.skip }, async t => {
  if (!ownRedis.present(t)) return
  const { redis, calls } = await privateRedis(t)
  const script = new ScriptCall('redis.call("SET", KEYS[1], ARGV[2]) return {KEYS[1], ARGV[1], redis.call("STRLEN", KEYS[1])}', 1)
  const payload = Buffer.concat([Buffer.from('\r\n$3\r\n'), Buffer.alloc(100_000, 0xff)])
  await redis.ping()
  const written: unknown[] = []
  const socket = redis.stream
  const write = socket.write.bind(socket) as (chunk: unknown) => boolean
  socket.write = ((chunk: unknown) => { written.push(chunk); return write(chunk) }) as typeof socket.write
  const writevs = countWritevs(socket)
  t.same(await script.call(redis, ['k', 'text', payload]), ['k', 'text', payload.length], 'the first call')
  socket.write = write as typeof socket.write
  t.ok(written.includes(payload), 'the argument went to the socket itself, not a copy of it')
  t.notOk(written.some(chunk => (chunk as string | Buffer).length === 0), 'no empty write (each is a system call)')
  t.equal(writevs(), 1, 'the command left in one write')
  t.same(await redis.getBuffer('k'), payload, 'binary bytes arrive as they were')
  t.same(await calls(), { eval: 1, evalsha: 0 }, 'EVAL the first time on this connection')
  await script.call(redis, ['k', 'again', 'short'])
  t.same(await calls(), { eval: 1, evalsha: 1 }, 'EVALSHA after')
  await redis.script('FLUSH')
  t.same(await script.call(redis, ['k', 'flushed', 'v']), ['k', 'flushed', 1], 'answered after the script was flushed')
  t.same(await calls(), { eval: 2, evalsha: 2 }, 'EVALSHA refused (NOSCRIPT), then EVAL')
  await t.rejects(script.call(redis, []), /Lua|script|ERR/i, 'a script error is the caller\'s')
  // Calls issued in the same turn share the socket's writes.
  const counted = countWritevs(socket)
  t.same(await Promise.all([script.call(redis, ['k1', 'a', 'x']), script.call(redis, ['k2', 'b', 'yy'])]), [['k1', 'a', 1], ['k2', 'b', 2]], 'two calls in one turn')
  t.equal(counted(), 1, 'two calls in one turn leave in one write')
})

/**
 * A relay to Redis that, once armed, passes the reply to the next MULTI on
 * only as far as MULTI's own +OK and then closes the connection: Redis ran
 * the whole transaction, the client heard only that it began. Connections
 * after that pass unchanged.
 */
async function replyCutAfterMulti (t: Test, redisUrl: string): Promise<{ url: string, arm: () => void }> {
  const target = new URL(redisUrl)
  let armed = false
  const sockets = new Set<Socket>()
  const server = createServer((client) => {
    const redis = connect({ port: Number(target.port), host: target.hostname })
    for (const socket of [client, redis]) {
      sockets.add(socket)
      socket.on('close', () => sockets.delete(socket))
      socket.on('error', () => {})
    }
    client.on('close', () => redis.destroy())
    redis.on('close', () => client.destroy())
    let cutting = false
    client.on('data', (chunk: Buffer) => {
      if (armed && chunk.includes('multi')) {
        armed = false
        cutting = true
      }
      redis.write(chunk)
    })
    redis.on('data', (chunk: Buffer) => {
      if (!cutting) { client.write(chunk); return }
      client.end(chunk.subarray(0, '+OK\r\n'.length))
      redis.destroy()
    })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  t.teardown(async () => {
    for (const socket of sockets) socket.destroy()
    await new Promise(resolve => server.close(resolve))
  })
  return { url: `redis://127.0.0.1:${(server.address() as AddressInfo).port}`, arm: () => { armed = true } }
}

t.test('transaction(): a connection lost before EXEC\'s reply rejects it, and nothing of it is sent again outside MULTI', { skip: ownRedis.skip }, async t => {
  if (!ownRedis.present(t)) return
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const relay = await replyCutAfterMulti(t, server.url)
  const direct = new Redis(server.url)
  t.teardown(() => direct.disconnect())
  const redis = new Redis(relay.url)
  t.teardown(() => redis.disconnect())
  redis.on('error', () => {})
  t.same(await transaction(redis, [new Command('incr', ['n']), new Command('incr', ['n'])], 'utf8'), [1, 2], 'a transaction answers with its commands\' replies')

  relay.arm()
  const sent = transaction(redis, [new Command('incr', ['n']), new Command('incr', ['n'])], 'utf8')
  await t.rejects(sent, /aborted|closed/i, 'rejected: the client cannot know whether Redis ran it')
  await redis.ping() // reconnected: what ioredis kept to resend has been sent
  t.equal(await direct.get('n'), '4', 'Redis ran the transaction once, and its commands were not resent on their own')
  t.same(await transaction(redis, [new Command('incr', ['n'])], 'utf8'), [5], 'the connection serves transactions again')
})
