// A script call written to the socket without copying its arguments
// (src/store/redis/script-call.ts): the same bytes as ioredis would write, and
// the script loaded again when Redis has lost it. Runs on a private
// redis-server: SCRIPT FLUSH would disturb other tests' connections.
import t from 'tap'
import { Command, Redis } from 'ioredis'
import { ScriptCall, writeCommand } from '../../src/store/redis/script-call.js'
import { startRedisServer } from '../fixtures/redis.js'

t.test('the command on the wire is what ioredis would write', async t => {
  const args = ['key', 42, Buffer.from('a\r\nb\0é'), Buffer.alloc(0), 'ü', Buffer.from('x'.repeat(70_000))]
  const parts: Array<string | Buffer> = []
  let corked = 0
  writeCommand({
    cork: () => { corked++ },
    uncork: () => { corked-- },
    write: (chunk) => { parts.push(chunk); return true }
  }, 'evalsha', args)
  t.equal(corked, 0, 'corked while writing, uncorked after')
  const expected = new Command('evalsha', args).toWritable({}) as Buffer
  t.same(Buffer.concat(parts.map(p => typeof p === 'string' ? Buffer.from(p) : p)), expected, 'byte for byte')
  t.ok(parts.includes(args[5] as Buffer), 'a Buffer argument is written itself, not copied')
})

t.test('EVAL on a new connection, EVALSHA after, and EVAL again after NOSCRIPT', async t => {
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const redis = new Redis(server.url)
  t.teardown(() => redis.disconnect())
  const script = new ScriptCall('redis.call("SET", KEYS[1], ARGV[2]) return {KEYS[1], ARGV[1], redis.call("STRLEN", KEYS[1])}', 1)
  const calls = async (): Promise<Record<string, number>> => {
    const info = await redis.info('commandstats')
    const count = (name: string): number => Number(new RegExp(`cmdstat_${name}:calls=(\\d+)`).exec(info)?.[1] ?? 0)
    return { eval: count('eval'), evalsha: count('evalsha') }
  }
  const payload = Buffer.concat([Buffer.from('\r\n$3\r\n'), Buffer.alloc(100_000, 0xff)])
  await redis.ping()
  const written: unknown[] = []
  const socket = redis.stream
  const write = socket.write.bind(socket) as (chunk: unknown) => boolean
  socket.write = ((chunk: unknown) => { written.push(chunk); return write(chunk) }) as typeof socket.write
  t.same(await script.call(redis, ['k', 'text', payload]), ['k', 'text', payload.length], 'the first call')
  socket.write = write as typeof socket.write
  t.ok(written.includes(payload), 'the argument went to the socket itself, not a copy of it')
  t.same(await redis.getBuffer('k'), payload, 'binary bytes arrive as they were')
  t.same(await calls(), { eval: 1, evalsha: 0 }, 'EVAL the first time on this connection')
  await script.call(redis, ['k', 'again', 'short'])
  t.same(await calls(), { eval: 1, evalsha: 1 }, 'EVALSHA after')
  await redis.script('FLUSH')
  t.same(await script.call(redis, ['k', 'flushed', 'v']), ['k', 'flushed', 1], 'answered after the script was flushed')
  t.same(await calls(), { eval: 2, evalsha: 2 }, 'EVALSHA refused (NOSCRIPT), then EVAL')
  await t.rejects(script.call(redis, []), /Lua|script|ERR/i, 'a script error is the caller\'s')
})
