import { createHash, randomBytes } from 'node:crypto'
import { setTimeout as sleep } from 'node:timers/promises'
import t from 'tap'
import fc from 'fast-check'
import type { Test } from 'tap'
import { Redis } from 'ioredis'
import { LeaseLostError, SessionGoneError } from '../../src/errors.js'
import type { RetentionLimits, StreamNotice } from '../../src/store/contract.js'
import { ENTRY_MAX_BYTES, RedisEventStore, SPLIT_MIN_BYTES, type AppendWrite } from '../../src/store/redis/redis-store.js'
import { prefixPattern, scanKeys, startRedisServer, useRedis } from '../fixtures/redis.js'
import type { TestRedis } from '../fixtures/redis.js'
import { storeContract } from '../fixtures/store-contract.js'
import { COMMANDS } from '../../src/store/redis/lua.js'
import { EventBatch, EventBatchBuilder } from '../../src/store/batch/event-batch.js'
import { startRedisCut, type RedisCut } from '../fixtures/redis-cut.js'
import { externalTools } from '../fixtures/external-tools.js'

const ownRedis = await externalTools(['redis-server'])

const RETENTION: RetentionLimits = { maxEvents: 1000, maxBytes: 1024 * 1024, ttlMs: 60_000 }

// Both ways appends reach Redis (src/store/redis/append-writes.ts) keep the contract.
for (const appendWrite of ['zero-copy', 'ioredis'] as const) {
  storeContract(t, `redis (appends: ${appendWrite})`, async (t, retention) => {
    const { url, prefix, redis } = await useRedis(t, 'contract')
    const open = (): Promise<RedisEventStore> => RedisEventStore.connect({ url, keyPrefix: prefix, retention, appendWrite })
    return {
      store: await open(),
      replica: open,
      lose: async (sessionId) => {
        const keys = await scanKeys(redis, prefixPattern(`${prefix}{${sessionId}}`))
        if (keys.length > 0) await redis.del(...keys)
      },
      // The deletion mark is what a deletion leaves on purpose (sessionDeleted).
      sessionKeys: async (sessionId) => (await scanKeys(redis, prefixPattern(`${prefix}{${sessionId}}`))).filter(key => !key.endsWith('}:del'))
    }
  })
}

async function storeFor (t: Test, env: TestRedis, retention: RetentionLimits = RETENTION, appendWrite: AppendWrite = 'zero-copy'): Promise<RedisEventStore> {
  const store = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention, appendWrite })
  t.teardown(() => store.close())
  return store
}

/** This replica's connections as CLIENT LIST shows them (RedisEventStore.connect names them). */
async function clientsOf (redis: Redis, replicaId: string): Promise<Array<Record<string, string>>> {
  const list = await redis.client('LIST') as string
  return list.split('\n')
    .map((line) => Object.fromEntries(line.trim().split(' ').map((pair) => {
      const at = pair.indexOf('=')
      return [pair.slice(0, at), pair.slice(at + 1)]
    })) as Record<string, string>)
    .filter((client) => client.name?.startsWith(`mcpgw-${replicaId}-`) === true)
}

async function eventually (what: string, check: () => boolean | Promise<boolean>, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`)
    await sleep(20)
  }
}

t.test('redis: two connections, whatever the number of subscribed sessions', async (t) => {
  const env = await useRedis(t, 'connections')
  const replicaId = `conn${randomBytes(4).toString('hex')}`
  const store = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention: RETENTION, replicaId })
  t.teardown(() => store.close())

  const ids = Array.from({ length: 200 }, (_, i) => `sess-${i}`)
  await Promise.all(ids.map((id) => store.createSession(id, 'p')))
  const offs = ids.flatMap((id) => [
    store.subscribe(id, 's', () => {}),
    store.subscribe(id, 's', () => {}),
    store.subscribe(id, 'r1', () => {})
  ])
  await Promise.all(ids.map((id) => store.append(id, 's', [{ data: 'x' }])))

  await eventually('200 subscriptions', async () => (await clientsOf(env.redis, replicaId)).some((c) => c.sub === '200'))
  const clients = await clientsOf(env.redis, replicaId)
  t.equal(clients.length, 2, 'one command and one subscriber connection')
  t.same(clients.map((c) => c.sub).sort(), ['0', '200'], 'one SUBSCRIBE per session, shared by its listeners and streams')

  for (const off of offs) off()
  await eventually('every UNSUBSCRIBE', async () => (await clientsOf(env.redis, replicaId)).every((c) => c.sub === '0'))
  t.equal((await clientsOf(env.redis, replicaId)).length, 2, 'still two')

  await store.close()
  await eventually('close to release both', async () => (await clientsOf(env.redis, replicaId)).length === 0)
  t.pass('close() quits both connections')
})

t.test('redis: one round trip per appended batch', async (t) => {
  const env = await useRedis(t, 'roundtrip')
  const redis = new Redis(env.url)
  const subscriber = new Redis(env.url)
  const store = new RedisEventStore({ redis, subscriber, keyPrefix: env.prefix, retention: RETENTION })
  t.teardown(() => store.close())

  // Each command sent, and how many replies had come back by then: all sent
  // before the first reply is one round trip.
  const sent: string[] = []
  let replies = 0
  const sendCommand = redis.sendCommand.bind(redis)
  redis.sendCommand = (command, stream) => {
    sent.push(`${command.name}@${replies}`)
    const reply = sendCommand(command, stream)
    command.promise.finally(() => { replies++ }).catch(() => {})
    return reply
  }
  await store.createSession('sess', 'p')
  await store.append('sess', 's', [{ data: 'warm-up' }]) // loads the script if Redis lacks it

  for (const size of [1, 10]) {
    sent.length = 0
    replies = 0
    await store.append('sess', 's', Array.from({ length: size }, (_, i) => ({ data: `e${i}`, event: 'message', upstreamId: String(i) })))
    t.same(sent, ['evalsha@0'], `a batch of ${size}: a single EVALSHA`)
  }
  sent.length = 0
  replies = 0
  const under = Math.floor((SPLIT_MIN_BYTES - 1) / 500)
  await store.append('sess', 's', Array.from({ length: under }, (_, i) => ({ data: `e${i}`.padEnd(500, '.') })))
  t.same(sent, ['evalsha@0'], `a batch of ${under} (just under SPLIT_MIN_BYTES): a single EVALSHA`)
  for (const size of [100, 1000]) {
    sent.length = 0
    replies = 0
    await store.append('sess', 's', Array.from({ length: size }, (_, i) => ({ data: `e${i}`.padEnd(500, '.') })))
    const entries = Math.ceil(size * 500 / ENTRY_MAX_BYTES)
    t.same(sent, ['multi', 'evalsha', ...Array(entries).fill('xadd'), 'eval', 'exec'].map(name => `${name}@0`),
      `a batch of ${size} (${entries} entries): the transaction of APPEND_SPLIT, sent at once`)
  }
  sent.length = 0
  replies = 0
  await store.end('sess', 's')
  t.same(sent, ['evalsha@0'], 'end: a single EVALSHA')
  t.same((await store.read('sess', 's', 0, 10_000))?.events.map(e => e.seq), Array.from({ length: 1000 }, (_, i) => i + 113 + under), 'the events kept (the newest 1,000), numbered in order both ways')
})

const READ_PLAN_SHA = createHash('sha1').update(COMMANDS.readPlan.lua).digest('hex')

/** A batch of `count` frames of 1,000 bytes (`tag` and the frame's number): over SPLIT_MIN_BYTES from 33 frames on. */
function frames (tag: string, count: number): Array<{ frame: Buffer }> {
  return Array.from({ length: count }, (_, i) => ({ frame: Buffer.from(`data: ${tag}${i}`.padEnd(999, '.') + '\n') }))
}
const tagsOf = (r: Awaited<ReturnType<RedisEventStore['read']>>): string[] => r?.events.map(e => e.frame?.toString().slice(6, e.frame.indexOf('.')) ?? '') ?? []

for (const appendWrite of ['zero-copy', 'ioredis'] as const) {
  t.test(`redis (appends: ${appendWrite}): a batch past Lua (APPEND_SPLIT) is refused without a trace, and the stream stays where it was`, async (t) => {
    const env = await useRedis(t, 'split')
    const store = await storeFor(t, env, RETENTION, appendWrite)
    const stream = `${env.prefix}{sess}:b:s`
    const aside = `${env.prefix}{sess}:aside`
    await store.createSession('sess', 'p')
    await store.append('sess', 's', frames('a', 50), { fence: 'A' })
    await store.append('sess', 's', frames('b', 50), { fence: 'A' })
    t.same(await env.redis.xrange(stream, '-', '+').then(rows => rows.map(([id]) => id)), ['1-50', '51-50'], 'the second batch, known to follow the first, went past Lua: an entry with the id the store chose')
    const before = await env.redis.xrange(stream, '-', '+')
    const ttl = await env.redis.pttl(stream)

    // Fenced: another replica holds the lease.
    await env.redis.set(`${env.prefix}{sess}:lease`, 'B')
    await t.rejects(store.append('sess', 's', frames('c', 50), { fence: 'A' }), LeaseLostError, 'a stale token is fenced off')
    t.same(await env.redis.xrange(stream, '-', '+'), before, 'nothing written by the XADDs that followed the refusal')
    t.equal(await env.redis.exists(aside), 0, 'the stream is under its name')
    t.ok(await env.redis.pttl(stream) > 0 && await env.redis.pttl(stream) <= ttl, 'with its expiry')
    t.same(await store.state('sess', 's'), { epoch: (await store.getSession('sess'))?.epoch, lastSeq: 100, firstSeq: 1, ended: false }, 'and its state')
    await env.redis.del(`${env.prefix}{sess}:lease`)

    // The script not loaded any more (SCRIPT FLUSH): refused as NOSCRIPT, then sent again with EVAL.
    await env.redis.script('FLUSH')
    t.same((await store.append('sess', 's', frames('d', 50), { fence: 'A' })).map(e => e.seq), Array.from({ length: 50 }, (_, i) => 101 + i), 'after NOSCRIPT, appended once')
    t.same((await env.redis.xrange(stream, '-', '+')).map(([id]) => id), ['1-50', '51-50', '101-50'], 'one entry, not two')

    // Another writer appended meanwhile (no fence): not where this store expects: through APPEND.
    const other = await storeFor(t, env, RETENTION, appendWrite)
    await other.append('sess', 's', frames('e', 50))
    t.same((await store.append('sess', 's', frames('f', 50))).map(e => e.seq)[0], 201, 'numbered after the other writer\'s batch')
    t.same(tagsOf(await store.read('sess', 's', 0, 1000)).filter((tag, i, all) => i === 0 || all[i - 1]?.[0] !== tag[0]), ['a0', 'b0', 'd0', 'e0', 'f0'], 'every batch once, in order')

    // The session gone: nothing written, no stream key made.
    await env.redis.del(`${env.prefix}{sess}:m`)
    await t.rejects(store.append('sess', 's', frames('g', 50)), SessionGoneError)
    t.equal((await env.redis.xrange(stream, '-', '+')).length, 5, 'no entry added to what the session left')
    t.equal(await env.redis.exists(aside), 0)
  })
}

t.test('redis: a lost session\'s record dropped by an unanswered settlement is marked deleted when another replica\'s adoption of its epoch was refused meanwhile', async (t) => {
  const env = await useRedis(t, 'settle-race')
  const store = await storeFor(t, env)
  const adoption = await store.adoptSession('lost', 'p', { confirmation: 'pending' })
  if (adoption === null) throw new Error('adopted expected')
  // What another replica's adoption and refusal of the same epoch leave in the record when they land
  // between this settlement's script and its drop (settle-adoption-1.lua, then reset.lua).
  await env.redis.hset(`${env.prefix}{lost}:m`, 'rd', '1')
  t.equal(await store.settleAdoption('lost', adoption.record.epoch, 'unanswered'), 'deleted', 'dropped, and marked: the upstream said elsewhere it does not know the session')
  t.equal(await store.sessionDeleted('lost'), true, 'as the embedded store ends in the same order')
})

t.test('redis: a page of large entries is read past Lua (READ_PLAN, then a plain XRANGE); small ones in one round trip', async (t) => {
  const env = await useRedis(t, 'read-plan')
  const redis = new Redis(env.url)
  const subscriber = new Redis(env.url)
  const store = new RedisEventStore({ redis, subscriber, keyPrefix: env.prefix, retention: { ...RETENTION, maxEvents: 10_000, maxBytes: 16 * 1024 * 1024 } })
  t.teardown(() => store.close())
  const sent: string[] = []
  /** Runs once between a READ_PLAN's reply and what the store sends next. */
  let between: (() => Promise<void>) | undefined
  const sendCommand = redis.sendCommand.bind(redis)
  redis.sendCommand = (command, stream) => {
    sent.push(command.name)
    const reply = sendCommand(command, stream)
    const hook = between
    if (hook === undefined || command.name !== 'evalsha' || command.args[0] !== READ_PLAN_SHA) return reply
    between = undefined
    // ioredis resolves the command's own promise; what the store awaits is that one.
    const original = command.resolve
    command.resolve = (value: unknown) => { hook().then(() => original(value), () => original(value)) }
    return reply
  }
  await store.createSession('sess', 'p')
  for (const tag of ['a', 'b', 'c', 'd', 'e']) await store.append('sess', 's', frames(tag, 100)) // entries of 100 KB
  sent.length = 0
  const page = await store.read('sess', 's', 150, 120)
  t.same(page?.events.map(e => e.seq), Array.from({ length: 120 }, (_, i) => 151 + i), 'from inside an entry, across into the next, cut at the limit')
  t.same(tagsOf(page).slice(0, 2), ['b50', 'b51'])
  t.ok(page?.events.every(e => e.frame?.length === 1000), 'every frame whole')
  t.same(sent, ['evalsha', 'multi', 'hget', 'xrange', 'exec'], 'the plan, then its entries in a MULTI with the epoch')
  t.same(page?.state.lastSeq, 500)

  sent.length = 0
  t.same((await store.read('sess', 's', 499, 10))?.events.map(e => e.seq), [500], 'a page within one entry')
  t.same(sent, ['evalsha', 'multi', 'hget', 'xrange', 'exec'], '(an entry of 100 KB: past Lua too)')

  // Entries trimmed between the plan and the XRANGE: READ's own way, whose answer agrees with the state then.
  between = async () => {
    await store.append('sess', 's', frames('f', 100))
    await env.redis.xtrim(`${env.prefix}{sess}:b:s`, 'MINID', '201-0')
  }
  sent.length = 0
  const after = await store.read('sess', 's', 0, 1000)
  t.same(sent.slice(-5), ['multi', 'hget', 'xrange', 'exec', 'evalsha'], 'the entries were not those any more: read again through READ')
  t.equal(after?.events.length, 400, 'what is left')
  t.same(after?.events[0]?.seq, 201)
  t.same([0, 100, 200, 300].map(i => tagsOf(after)[i]), ['c0', 'd0', 'e0', 'f0'], 'whole batches, in order')

  // Small entries: the plan script reads them itself.
  await store.createSession('small', 'p')
  for (let i = 0; i < 5; i++) await store.append('small', 's', frames(`s${i}`, 2))
  sent.length = 0
  t.same((await store.read('small', 's', 3, 100))?.events.map(e => e.seq), [4, 5, 6, 7, 8, 9, 10], 'a page of small entries')
  t.same(sent, ['evalsha'], 'in one round trip')
})

t.test('redis: READ_PLAN reads as READ where the ledger does not match the stream', async (t) => {
  const env = await useRedis(t, 'read-plan-ledger')
  const store = await storeFor(t, env)
  await store.createSession('sess', 'p')
  for (const tag of ['a', 'b', 'c']) await store.append('sess', 's', frames(tag, 100))
  await env.redis.del(`${env.prefix}{sess}:z:s`)
  t.same((await store.read('sess', 's', 50, 1000))?.events.map(e => e.seq), Array.from({ length: 250 }, (_, i) => 51 + i), 'every event after the cursor')
  await env.redis.rpush(`${env.prefix}{sess}:z:s`, '1-100 100000')
  t.same((await store.read('sess', 's', 150, 1000))?.events.map(e => e.seq), Array.from({ length: 150 }, (_, i) => 151 + i), 'a ledger shorter than the stream: the same')
  // As long as the stream, but naming entries it does not hold (small ones, read in the script).
  await store.createSession('small', 'p')
  for (const tag of ['a', 'b', 'c']) await store.append('small', 's', frames(tag, 2))
  await env.redis.del(`${env.prefix}{small}:z:s`)
  await env.redis.rpush(`${env.prefix}{small}:z:s`, '1-2 2000', '3-1 1000', '4-3 3000')
  t.same((await store.read('small', 's', 3, 1000))?.events.map(e => e.seq), [4, 5, 6], 'a ledger naming other entries: the events after the cursor, none skipped')
  t.same((await store.read('small', 's', 2, 1000))?.events.map(e => e.seq), [3, 4, 5, 6])
})

t.test('redis: a batch past Lua after the stream key expired, or that trims every entry before it', async (t) => {
  const env = await useRedis(t, 'split-trim')
  const store = await storeFor(t, env, { ...RETENTION, maxEvents: 50 })
  const stream = `${env.prefix}{sess}:b:s`
  await store.createSession('sess', 'p')
  await store.append('sess', 's', frames('a', 50))
  await env.redis.del(stream)
  t.same((await store.append('sess', 's', frames('b', 50))).map(e => e.seq)[0], 51, 'the key expired alone: appended after its history')
  t.same((await env.redis.xrange(stream, '-', '+')).map(([id]) => id), ['51-50'], 'into a new stream key')
  for (const tag of ['c', 'd']) await store.append('sess', 's', frames(tag, 50))
  t.same((await env.redis.xrange(stream, '-', '+')).map(([id]) => id), ['151-50'], 'each batch trims every entry before it')
  t.same(await env.redis.lrange(`${env.prefix}{sess}:z:s`, 0, -1), ['151-50 50000'], 'and the ledger with them')
  t.same(tagsOf(await store.read('sess', 's', 0, 1000)), Array.from({ length: 50 }, (_, i) => `d${i}`), 'the last batch, whole')
  t.ok(await env.redis.pttl(stream) > 0, 'the new key expires')
})

t.test('redis: every key carries a TTL', async (t) => {
  const env = await useRedis(t, 'ttl')
  const store = await storeFor(t, env, { ...RETENTION, ttlMs: 30_000 })
  await store.createSession('sess', 'p')
  await store.openStream('sess', 'r0')
  await store.append('sess', 's', [{ data: 'a' }, { data: 'b' }])
  await store.append('sess', 'r1', [{ data: 'c' }], { end: true })
  await store.end('sess', 'r2')
  await store.saveCursor('sess', 's', 1)
  await store.getSession('sess')

  const keys = await scanKeys(env.redis, prefixPattern(env.prefix))
  t.same(keys.sort(), [`${env.prefix}{sess}:b:r1`, `${env.prefix}{sess}:b:s`, `${env.prefix}{sess}:m`, `${env.prefix}{sess}:z:r1`, `${env.prefix}{sess}:z:s`], 'a hash, and a stream and its ledger per written stream')
  for (const key of keys) {
    const ttl = await env.redis.pttl(key)
    t.ok(ttl > 0 && ttl <= 30_000, `${key} expires (pttl ${ttl})`)
  }
  const entries = await env.redis.xrange(`${env.prefix}{sess}:b:r1`, '-', '+')
  t.same(entries, [['1-1', ['s', '1', 'l', '0 1 0 0 ', 'b', 'c']]], 'one entry per batch, id <first seq>-<count>: its size, layout and fields')
  const batch = await env.redis.xrange(`${env.prefix}{sess}:b:s`, '-', '+')
  t.same(batch.map(([id]) => id), ['1-2'], 'two events appended together are one entry')
  t.same(await env.redis.lrange(`${env.prefix}{sess}:z:s`, 0, -1), ['1-2 2'], 'the ledger names it, with its size')
})

t.test('redis: session ids with braces stay in their own hash tag', async (t) => {
  const env = await useRedis(t, 'braces')
  const store = await storeFor(t, env)
  const ids = ['a{b}c', 'x}', 'x%7D', '{', '%', '}{']
  for (const [i, id] of ids.entries()) {
    await store.createSession(id, 'p')
    await store.append(id, 's', Array.from({ length: i + 1 }, () => ({ data: id })))
  }
  for (const [i, id] of ids.entries()) {
    const read = await store.read(id, 's', 0, 100)
    t.equal(read?.state.lastSeq, i + 1, `${id}: its own stream`)
    t.ok(read?.events.every((e) => e.data === id), `${id}: its own events`)
  }
  const keys = await scanKeys(env.redis, prefixPattern(env.prefix))
  t.equal(keys.length, ids.length * 3, "per session: its hash, its stream and the stream's ledger")
  for (const key of keys) {
    const rest = key.slice(env.prefix.length)
    t.match(rest, /^\{[^{}]+\}:(m|[bz]:s)$/, `${key}: one hash tag, the whole session id`)
  }
  t.throws(() => new RedisEventStore({ redis: env.redis, subscriber: env.redis, keyPrefix: 'a{b}:', retention: RETENTION }), TypeError)
  t.throws(() => new RedisEventStore({ redis: env.redis, subscriber: env.redis, keyPrefix: 'p:', retention: { ...RETENTION, maxEvents: 0 } }), RangeError)
})

t.test('redis: a stream whose key expired alone reports its history as gone', async (t) => {
  const env = await useRedis(t, 'stream-expiry')
  const store = await storeFor(t, env)
  const { epoch } = await store.createSession('sess', 'p')
  await store.append('sess', 'r1', [{ data: 'a' }, { data: 'b' }, { data: 'c' }])
  await env.redis.del(`${env.prefix}{sess}:b:r1`) // what PEXPIRE does to an idle request stream
  t.same(await store.state('sess', 'r1'), { epoch, lastSeq: 3, firstSeq: 4, ended: false }, 'a resume after 0..2 sees the gap')
  t.same((await store.read('sess', 'r1', 1, 10))?.events, [])
  const next = await store.append('sess', 'r1', [{ data: 'd' }])
  t.same(next.map((e) => e.seq), [4], 'numbering continues')
  t.same(await store.state('sess', 'r1'), { epoch, lastSeq: 4, firstSeq: 4, ended: false })
})

t.test('redis: a move to another upstream session forgets the old one\'s last standalone event id', async (t) => {
  const env = await useRedis(t, 'move-upstream-id')
  const store = await storeFor(t, env)
  await store.createSession('sess', 'p', { placement: { upstreamSessionId: 'up-1' } })
  const meta = `${env.prefix}{sess}:m`
  await env.redis.hset(meta, 'u:s', 'event-of-up-1') // what an append of up-1's GET leaves
  await store.movePlacement('sess', 'up-0', { upstreamSessionId: 'up-9' })
  t.equal(await env.redis.hget(meta, 'u:s'), 'event-of-up-1', 'a move that does not apply changes nothing')
  await store.movePlacement('sess', 'up-1', { upstreamSessionId: 'up-2' })
  t.equal(await env.redis.hget(meta, 'u:s'), null, 'moved: the next holder opens up-2\'s GET afresh, not from an id up-2 never issued')
})

t.test('redis: a move that keeps the upstream session, naming the endpoint holding it, keeps its last standalone event id', async (t) => {
  const env = await useRedis(t, 'pin-upstream-id')
  const store = await storeFor(t, env)
  await store.createSession('sess', 'p', { placement: { upstreamSessionId: 'up-1' } })
  const meta = `${env.prefix}{sess}:m`
  await store.append('sess', 's', [{ data: 'x', upstreamId: 'ev-1' }], { readFrom: 'up-1' })
  const pinned = await store.movePlacement('sess', 'up-1', { upstreamSessionId: 'up-1', endpoint: 'http://a:1' })
  t.match(pinned, { upstreamSessionId: 'up-1', endpoint: 'http://a:1' }, 'the record names the endpoint')
  t.equal(await env.redis.hget(meta, 'u:s'), 'ev-1', 'the same upstream session\'s stream: its last event id kept')
  const grant = await store.leaseBackend().acquire('sess', 'tok', 5000)
  t.match(grant, { token: 'tok', lastUpstreamId: 'ev-1' }, 'the next holder resumes that GET from it')
  await store.append('sess', 's', [{ data: 'y', upstreamId: 'ev-2' }], { readFrom: 'up-1' })
  t.equal(await env.redis.hget(meta, 'u:s'), 'ev-2', 'and what that GET records next is kept')
  await store.movePlacement('sess', 'up-1', { upstreamSessionId: 'up-2', endpoint: 'http://a:1' })
  t.equal(await env.redis.hget(meta, 'u:s'), null, 'a new upstream session at the same endpoint: forgotten')
})

for (const appendWrite of ['zero-copy', 'ioredis'] as const) {
  t.test(`redis (${appendWrite}): an append read from an upstream session the record no longer places does not write its last event id back`, async (t) => {
    const env = await useRedis(t, `move-in-flight-${appendWrite}`)
    const store = await storeFor(t, env, RETENTION, appendWrite)
    await store.createSession('sess', 'p', { placement: { upstreamSessionId: 'up-1' } })
    const meta = `${env.prefix}{sess}:m`
    const small = (id: string): Array<{ data: string, upstreamId: string }> => [{ data: 'x', upstreamId: id }]
    // Large enough for the split path (append-split-6) once the stream's end is known here.
    const large = (id: string): Array<{ data: string, upstreamId: string }> =>
      Array.from({ length: Math.ceil(SPLIT_MIN_BYTES / 1000) + 1 }, (_, i) => ({ data: 'y'.repeat(1000), upstreamId: `${id}.${i}` }))
    await store.append('sess', 's', small('a1'), { readFrom: 'up-1' })
    t.equal(await env.redis.hget(meta, 'u:s'), 'a1', 'read from where the record places the session: kept')
    await store.movePlacement('sess', 'up-1', { upstreamSessionId: 'up-2' })
    await store.append('sess', 's', small('a2'), { readFrom: 'up-1' })
    t.equal(await env.redis.hget(meta, 'u:s'), null, 'an append of up-1\'s GET after the move (append-5): not written back')
    await store.append('sess', 's', large('a3'), { readFrom: 'up-1' })
    t.equal(await env.redis.hget(meta, 'u:s'), null, 'nor by the split append')
    await store.append('sess', 's', large('b1'), { readFrom: 'up-2' })
    t.equal(await env.redis.hget(meta, 'u:s'), `b1.${Math.ceil(SPLIT_MIN_BYTES / 1000)}`, 'up-2\'s own ids are kept (split append)')
    await store.append('sess', 's', small('b2'), { readFrom: 'up-2' })
    t.equal(await env.redis.hget(meta, 'u:s'), 'b2', 'and by append-5')
    await store.append('sess', 's', small('c1'))
    t.equal(await env.redis.hget(meta, 'u:s'), 'c1', 'a writer that does not say where it read (a request stream) is kept as before')
    t.same((await store.read('sess', 's', 0, 1000))?.events.length, 1 + 1 + large('').length * 2 + 2, 'every event is recorded: only the resume point is held back')

    await store.createSession('own', 'p')
    const ownMeta = `${env.prefix}{own}:m`
    await store.append('own', 's', small('o1'), { readFrom: 'own' })
    t.equal(await env.redis.hget(ownMeta, 'u:s'), 'o1', 'a record without a placement of its own is placed on its session id')
  })
}

t.test('redis: a lost session hash makes the session gone, and its id reusable', async (t) => {
  const env = await useRedis(t, 'lost-hash')
  const store = await storeFor(t, env)
  await store.createSession('sess', 'p')
  await store.append('sess', 's', [{ data: 'old1' }, { data: 'old2' }])
  await env.redis.del(`${env.prefix}{sess}:m`) // evicted under memory pressure
  t.equal(await store.getSession('sess'), null)
  await t.rejects(store.append('sess', 's', [{ data: 'x' }]), SessionGoneError)
  await store.createSession('sess', 'p')
  const stored = await store.append('sess', 's', [{ data: 'new' }])
  t.same(stored.map((e) => e.seq), [1], 'the stream key left by the old life does not collide')
  t.same((await store.read('sess', 's', 0, 10))?.events.map((e) => e.data), ['new'])
})

t.test('redis: a restart without persistence loses sessions; subscriptions come back', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const keyPrefix = 'restart:'
  const open = (): Promise<RedisEventStore> => RedisEventStore.connect({ url: server.url, keyPrefix, retention: RETENTION })
  const a = await open()
  const b = await open()
  t.teardown(() => Promise.all([a.close(), b.close()]))

  const before = await a.createSession('sess', 'p')
  await a.append('sess', 's', [{ data: 'x' }])
  const heard: StreamNotice[] = []
  a.subscribe('sess', 's', (n) => heard.push(n))
  await b.append('sess', 's', [{ data: 'y' }])
  await eventually('the notice before the restart', () => heard.some((n) => n.toSeq === 2))

  await server.stop()
  await server.start()
  await eventually('the store to reconnect', () => a.ping().then(() => true, () => false), 10_000)

  t.equal(await a.getSession('sess'), null, 'session gone')
  await t.rejects(a.append('sess', 's', [{ data: 'z' }]), SessionGoneError, 'append refuses')
  t.equal(await a.read('sess', 's', 0, 10), null, 'history gone')
  const after = await b.createSession('sess', 'p')
  t.not(after.epoch, before.epoch, 'new epoch')
  await eventually('b to reconnect', () => b.ping().then(() => true, () => false), 10_000)

  heard.length = 0
  await eventually('a notice over the resubscribed channel', async () => {
    await b.append('sess', 's', [{ data: 'again' }])
    await sleep(50)
    return heard.length > 0
  }, 10_000)
  t.ok(heard.every((n) => n.events === undefined), 'remote notices after the restart')
  t.equal((await a.read('sess', 's', 0, 1))?.events[0]?.seq, 1, 'the new life numbers from 1')
})

t.test('redis: a listener that unsubscribes while it is told does not keep the next one from being told', async (t) => {
  const env = await useRedis(t, 'unsubscribe-in-delivery')
  const a = await storeFor(t, env)
  const b = await storeFor(t, env)
  await a.createSession('sess', 'p')
  const heard: string[] = []
  const offFirst = a.subscribe('sess', 's', (n) => { heard.push(`first ${n.toSeq}`); offFirst() })
  a.subscribe('sess', 's', (n) => heard.push(`second ${n.toSeq}`))
  a.subscribe('sess', 's', (n) => heard.push(`third ${n.toSeq}`))
  await b.append('sess', 's', [{ data: 'remote' }])
  await eventually('the notice of another replica\'s append', () => heard.includes('third 1'))
  await a.append('sess', 's', [{ data: 'local' }])
  await eventually('the notice of a local append', () => heard.includes('third 2'))
  t.same(heard, ['first 1', 'second 1', 'third 1', 'second 2', 'third 2'], 'each told once per notice, the one gone told no more')
})

t.test('redis: after a reconnect each channel is subscribed again once, by the store (ioredis\'s own resubscription has no error handler)', { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const server = await startRedisServer()
  t.teardown(() => server.stop())
  const redis = new Redis(server.url)
  const subscriber = new Redis(server.url)
  const store = new RedisEventStore({ redis, subscriber, keyPrefix: 'resub:', retention: RETENTION })
  t.teardown(() => store.close())
  await store.createSession('sess', 'p')
  const heard: StreamNotice[] = []
  store.subscribe('sess', 's', (n) => heard.push(n))
  await eventually('subscribed', async () => (await redis.pubsub('NUMSUB', 'resub:{sess}:n') as [string, number])[1] === 1)
  // Redis counting the subscription does not mean every SUBSCRIBE was answered: a SUBSCRIBE
  // still unanswered when Redis goes is resent by ioredis (its own promise, which the store
  // handles), and would be counted below. The store subscribes once more on 'ready', which
  // ioredis emits on a later tick: let it, then PING; replies come in order, so once PING is
  // answered, every SUBSCRIBE was too.
  await eventually('the subscriber ready', () => subscriber.status === 'ready')
  await new Promise((resolve) => setImmediate(resolve))
  await subscriber.ping()

  const subscribes: string[][] = []
  const sendCommand = subscriber.sendCommand.bind(subscriber)
  subscriber.sendCommand = (command, stream) => {
    if (command.name === 'subscribe') subscribes.push(command.args.map(String))
    return sendCommand(command, stream)
  }
  await server.stop()
  await server.start()
  await eventually('the subscriber to reconnect', () => subscriber.ping().then(() => true, () => false), 10_000)
  await eventually('subscribed again', async () => (await redis.pubsub('NUMSUB', 'resub:{sess}:n') as [string, number])[1] === 1, 10_000)
  await sleep(100)
  // ioredis resubscribing too would leave a SUBSCRIBE whose promise nobody handles: closing before
  // its reply made an unhandled rejection (seen in test/hardening/faults.test.ts).
  t.same(subscribes, [['resub:{sess}:n']], 'one SUBSCRIBE, the store\'s')
})

t.test('redis: a killed subscriber connection catches up', async (t) => {
  const env = await useRedis(t, 'sub-kill')
  const replicaId = `kill${randomBytes(4).toString('hex')}`
  const a = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention: RETENTION, replicaId })
  const b = await storeFor(t, env)
  t.teardown(() => a.close())
  await a.createSession('sess', 'p')
  const heard: StreamNotice[] = []
  a.subscribe('sess', 's', (n) => heard.push(n))
  await b.append('sess', 's', [{ data: '1' }])
  await eventually('the first notice', () => heard.some((n) => n.toSeq === 1))

  const subscriberId = (await clientsOf(env.redis, replicaId)).find((c) => c.name?.endsWith('-sub') === true)?.id
  if (subscriberId === undefined) throw new Error('no subscriber connection in CLIENT LIST')
  await env.redis.client('KILL', 'ID', subscriberId)
  await b.append('sess', 's', [{ data: '2' }]) // most likely published while nobody listens
  await eventually('the missed append to be caught up', () => heard.some((n) => n.toSeq === 2))
  t.pass('the listener learnt of seq 2')
})

/** What is PUBLISHed on a channel, as seen by a plain subscriber (not a replica: in no audience). */
async function spyOn (t: Test, env: TestRedis, channel: string): Promise<{ notices: () => Array<{ o: string, t: number }>, settled: () => Promise<void> }> {
  const spy = new Redis(env.url)
  t.teardown(() => spy.disconnect())
  const messages: string[] = []
  spy.on('message', (_channel: string, message: string) => messages.push(message))
  await spy.subscribe(channel)
  let marks = 0
  return {
    notices: () => messages.filter((m) => !m.startsWith('mark:')).map((m) => JSON.parse(m) as { o: string, t: number }),
    // Redis delivers a channel's messages in order: once our own mark arrives, every earlier PUBLISH has.
    settled: async () => {
      const mark = `mark:${++marks}`
      await env.redis.publish(channel, mark)
      await eventually('the spy to hear its mark', () => messages.includes(mark))
    }
  }
}

t.test('redis: an append is PUBLISHed only while another replica listens to the session', async (t) => {
  const env = await useRedis(t, 'audience')
  const a = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention: RETENTION, replicaId: 'replica-a' })
  t.teardown(() => a.close())
  const audience = `${env.prefix}{sess}:aud`
  const spy = await spyOn(t, env, `${env.prefix}{sess}:n`)
  await a.createSession('sess', 'p')

  // The writer's own listener: its events come to it directly, nothing goes over Redis.
  const heardA: StreamNotice[] = []
  const offA = a.subscribe('sess', 's', (n) => heardA.push(n))
  await eventually('A in the audience', async () => (await env.redis.smembers(audience)).includes('replica-a'))
  for (const data of ['1', '2', '3']) await a.append('sess', 's', [{ data }])
  await spy.settled()
  t.same(heardA.map((n) => n.toSeq), [1, 2, 3], 'the writer\'s listener heard every append')
  t.same(spy.notices(), [], 'and nothing was published')

  // Another replica listens: now appends are announced, and it hears them.
  const b = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention: RETENTION, replicaId: 'replica-b' })
  t.teardown(() => b.close())
  const heardB: StreamNotice[] = []
  const offB = b.subscribe('sess', 's', (n) => heardB.push(n))
  await eventually('B in the audience', async () => (await env.redis.smembers(audience)).includes('replica-b'))
  const ttl = await env.redis.pttl(audience)
  t.ok(ttl > 0 && ttl <= 4 * 30_000, `the audience expires unless refreshed (pttl ${ttl})`)
  await a.append('sess', 's', [{ data: '4' }])
  await eventually('B to hear seq 4', () => heardB.some((n) => n.toSeq === 4))
  await spy.settled()
  t.same(spy.notices().map((n) => [n.o, n.t]), [['replica-a', 4]], 'the append was published, once')
  // Every stream has one writer: B writes another stream of the session, which A follows too.
  const heardAu: StreamNotice[] = []
  const offAu = a.subscribe('sess', 'u', (n) => heardAu.push(n))
  await b.append('sess', 'u', [{ data: 'u1' }])
  await eventually('A to hear B\'s append', () => heardAu.some((n) => n.toSeq === 1))

  // B leaves: the audience is A alone again, and appends go quiet.
  offB()
  await eventually('B out of the audience', async () => !(await env.redis.smembers(audience)).includes('replica-b'))
  await a.append('sess', 's', [{ data: '5' }])
  await spy.settled()
  t.same(spy.notices().map((n) => [n.o, n.t]), [['replica-a', 4], ['replica-b', 1]], 'nothing published after B left')
  t.same(heardA.map((n) => n.toSeq), [1, 2, 3, 4, 5], 'A heard each of its appends')
  offA()
  offAu()
  await eventually('A out of the audience', async () => (await env.redis.exists(audience)) === 0)
})

t.test('redis: a listener gone before its SUBSCRIBE took effect leaves the replica out of the audience', async (t) => {
  const env = await useRedis(t, 'audience-early')
  const a = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention: RETENTION, replicaId: 'replica-a' })
  t.teardown(() => a.close())
  const off = a.subscribe('sess', 's', () => {})
  off()
  // Another session's listener after it: its JOIN goes after any JOIN the first would make.
  a.subscribe('other', 's', () => {})
  await eventually('A in the other audience', async () => (await env.redis.smembers(`${env.prefix}{other}:aud`)).includes('replica-a'))
  t.equal(await env.redis.exists(`${env.prefix}{sess}:aud`), 0, 'no audience left for the session nobody here listens to')
})

t.test('redis: a replica missing from the audience (lost in Redis) is found on the refresh, and catches up', async (t) => {
  const env = await useRedis(t, 'audience-lost')
  const a = await storeFor(t, env)
  const b = await RedisEventStore.connect({ url: env.url, keyPrefix: env.prefix, retention: RETENTION, replicaId: 'replica-b', audienceRefreshMs: 200 })
  t.teardown(() => b.close())
  const audience = `${env.prefix}{sess}:aud`
  await a.createSession('sess', 'p')
  const heard: StreamNotice[] = []
  b.subscribe('sess', 's', (n) => heard.push(n))
  await eventually('B in the audience', async () => (await env.redis.smembers(audience)).includes('replica-b'))
  const ttl = await env.redis.pttl(audience)
  t.ok(ttl > 0 && ttl <= 800, `the audience lives four refreshes (pttl ${ttl})`)

  await env.redis.del(audience) // evicted, or lost in a failover
  await a.append('sess', 's', [{ data: '1' }, { data: '2' }]) // announced to nobody
  await eventually('the refresh to catch B up', () => heard.some((n) => n.toSeq === 2), 3000)
  t.same(await env.redis.smembers(audience), ['replica-b'], 'B is in the audience again')
  await a.append('sess', 's', [{ data: '3' }])
  await eventually('B to hear seq 3', () => heard.some((n) => n.toSeq === 3))
  t.pass('appends reach B again')
})

t.test('redis: batches are stored as whole entries, trimmed exactly by sequence and physically by entry', async (t) => {
  const env = await useRedis(t, 'batches')
  const store = await storeFor(t, env, { ...RETENTION, maxEvents: 5 })
  const { epoch } = await store.createSession('sess', 'p')
  for (let b = 0; b < 20; b++) {
    await store.append('sess', 's', [0, 1, 2].map(i => ({ frame: Buffer.from(`data: ${b * 3 + i + 1}\n`) })))
  }
  t.same(await store.state('sess', 's'), { epoch, lastSeq: 60, firstSeq: 56, ended: false }, 'the newest 5 events are retained, exactly')
  const key = `${env.prefix}{sess}:b:s`
  t.same((await env.redis.xrange(key, '-', '+')).map(([id]) => id), ['55-3', '58-3'], 'storage holds only the entries those events are in')
  const seqsOf = (r: Awaited<ReturnType<typeof store.read>>): number[] => r?.events.map(e => e.seq) ?? []
  const frames = (r: Awaited<ReturnType<typeof store.read>>): string[] => r?.events.map(e => e.frame?.toString() ?? '') ?? []
  t.same(seqsOf(await store.read('sess', 's', 0, 100)), [56, 57, 58, 59, 60], 'a read from before the window starts at its first event, not at its entry')
  t.same(frames(await store.read('sess', 's', 56, 2)), ['data: 57\n', 'data: 58\n'], 'a page across two entries, cut at the limit')
  t.same(seqsOf(await store.read('sess', 's', 59, 100)), [60], 'from inside the last entry')
  t.same(seqsOf(await store.read('sess', 's', 60, 100)), [], 'past the end')
})

t.test('redis: a batch larger than ENTRY_MAX_BYTES is several entries of one script call; entries trimmed at once are not written', async (t) => {
  const env = await useRedis(t, 'entries')
  const frame = (seq: number): Buffer => Buffer.from(`data: ${String(seq).padEnd(1000, '.')}\n`) // 1,007 bytes
  const perEntry = Math.floor(ENTRY_MAX_BYTES / 1007)
  const count = 2 * perEntry + 100
  const big = Array.from({ length: count }, (_, i) => ({ frame: frame(i + 1) }))
  const roomy = await storeFor(t, env)
  await roomy.createSession('big', 'p')
  await roomy.append('big', 's', big)
  const ids = (await env.redis.xrange(`${env.prefix}{big}:b:s`, '-', '+')).map(([id]) => id)
  t.same(ids, [`1-${perEntry}`, `${perEntry + 1}-${perEntry}`, `${2 * perEntry + 1}-100`], `${count} events of 1 KB: entries of at most ${perEntry} events`)
  const all = await roomy.read('big', 's', 0, 10_000)
  t.ok(all?.events.every((e, i) => e.seq === i + 1 && e.frame?.equals(frame(i + 1))), 'every event back, in order, intact')
  t.equal(all?.events.length, count)
  t.same((await roomy.read('big', 's', perEntry - 2, 4))?.events.map(e => e.seq), [perEntry - 1, perEntry, perEntry + 1, perEntry + 2], 'a page across two entries of one append')

  const tight = await storeFor(t, env, { ...RETENTION, maxEvents: 100 })
  await tight.createSession('trim', 'p')
  await tight.append('trim', 's', big)
  t.same(await tight.state('trim', 's'), { epoch: (await tight.getSession('trim'))?.epoch, lastSeq: count, firstSeq: count - 99, ended: false }, 'the newest 100 kept')
  t.same((await env.redis.xrange(`${env.prefix}{trim}:b:s`, '-', '+')).map(([id]) => id), [`${2 * perEntry + 1}-100`], 'only the entry holding them is written')
  t.equal(Number(await env.redis.hget(`${env.prefix}{trim}:m`, 'b:s')), 100 * 1007, 'the stream\'s bytes are those of what was written')
  t.same((await tight.read('trim', 's', 0, 10_000))?.events.map(e => e.seq), Array.from({ length: 100 }, (_, i) => count - 99 + i))
})

t.test('redis: retention matches its model over random batches and limits', async (t) => {
  // The model is the rule as documented (TRIM_FOR_BATCH in scripts.ts): the
  // first kept event is exact; storage goes by whole entries, dropped once all
  // their events are below it or while the stream is over the byte limit
  // (never the entry being added); a new batch alone over the limit hides its
  // oldest events.
  interface Entry { first: number, sizes: number[] }
  const env = await useRedis(t, 'retention-model')
  const seed = Number(process.env.RETENTION_SEED ?? Date.now() % 100_000)
  t.comment(`retention model seed ${seed} (rerun with RETENTION_SEED=${seed})`)
  const cases = fc.sample(fc.record({
    maxEvents: fc.integer({ min: 1, max: 12 }),
    maxBytes: fc.integer({ min: 0, max: 120 }),
    batches: fc.array(fc.array(fc.integer({ min: 1, max: 30 }), { minLength: 0, maxLength: 6 }), { minLength: 1, maxLength: 14 }),
    // Before which appends the ledger is lost (as if evicted): trimming must not depend on it.
    lose: fc.array(fc.nat(13), { maxLength: 2 })
  }), { numRuns: 60, seed })
  let run = 0
  for (const c of cases) {
    run++
    const store = await storeFor(t, env, { maxEvents: c.maxEvents, maxBytes: c.maxBytes, ttlMs: 60_000 })
    const session = `m${run}`
    await store.createSession(session, 'p')
    let entries: Entry[] = []
    let last = 0
    let first = 1
    const frames = new Map<number, Buffer>()
    const ledgerKey = `${env.prefix}{${session}}:z:s`
    for (const [b, batch] of c.batches.entries()) {
      if (c.lose.includes(b)) await env.redis.del(ledgerKey)
      const events = batch.map((size, i) => {
        const frame = Buffer.from(`data:${String(last + i + 1).padEnd(size, '.')}\n`)
        frames.set(last + i + 1, frame)
        return { frame }
      })
      const sizes = events.map(e => e.frame.length)
      await store.append(session, 's', events)
      if (sizes.length === 0) continue
      // The model.
      const newLast = last + sizes.length
      const sum = (xs: number[]): number => xs.reduce((a, b) => a + b, 0)
      let total = sum(entries.map(e => sum(e.sizes))) + sum(sizes)
      let keep = Math.max(first, newLast - c.maxEvents + 1)
      let exhausted = entries.length === 0
      while (entries.length > 0) {
        const e = entries[0] as Entry
        const elast = e.first + e.sizes.length - 1
        if (elast >= keep && total <= c.maxBytes) break
        total -= sum(e.sizes)
        keep = Math.max(keep, elast + 1)
        entries.shift()
        exhausted = entries.length === 0
      }
      if (exhausted && total > c.maxBytes) {
        let visible = total - sum(sizes.slice(0, keep - last - 1))
        while (keep < newLast && visible > c.maxBytes) visible -= sizes[(keep++) - last - 1] as number
      }
      entries = [...entries, { first: last + 1, sizes }]
      last = newLast
      first = keep
    }
    const state = await store.state(session, 's')
    const label = `case ${run} ${JSON.stringify(c)}`
    if (state === null) {
      t.equal(last, 0, `${label}: no state only when nothing was appended`)
      continue
    }
    if (state.lastSeq !== last || state.firstSeq !== first) {
      t.same({ first: state.firstSeq, last: state.lastSeq }, { first, last }, `${label}: first and last kept events`)
      break
    }
    const read = await store.read(session, 's', 0, 1000)
    const want = Array.from({ length: last - first + 1 }, (_, i) => first + i)
    const got = read?.events.map(e => e.seq) ?? []
    const intact = read?.events.every(e => e.frame?.equals(frames.get(e.seq) as Buffer) === true) ?? false
    const key = `${env.prefix}{${session}}:b:s`
    const ids = (await env.redis.xrange(key, '-', '+')).map(([id]) => id)
    const modelIds = last === 0 ? [] : entries.map(e => `${e.first}-${e.sizes.length}`)
    const bytes = Number(await env.redis.hget(`${env.prefix}{${session}}:m`, 'b:s'))
    const modelBytes = entries.reduce((a, e) => a + e.sizes.reduce((x, y) => x + y, 0), 0)
    if (JSON.stringify(got) !== JSON.stringify(want) || !intact || JSON.stringify(ids) !== JSON.stringify(modelIds) || bytes !== modelBytes) {
      t.same({ got, intact, ids, bytes }, { got: want, intact: true, ids: modelIds, bytes: modelBytes }, `${label}: events read, entries stored, bytes counted`)
      break
    }
    // The ledger names the newest entries, each with its size (all of them unless it was lost).
    const ledger = await env.redis.lrange(ledgerKey, 0, -1)
    const sizes = (await env.redis.xrange(key, '-', '+')).map(([id, fields]) => `${id} ${fields[1]}`)
    if (JSON.stringify(ledger) !== JSON.stringify(sizes.slice(sizes.length - ledger.length)) || (c.lose.length === 0 && ledger.length !== sizes.length)) {
      t.same(ledger, sizes, `${label}: the ledger matches the stream's newest entries`)
      break
    }
    await store.deleteSession(session)
  }
  t.equal(run, cases.length, `${cases.length} random histories agree with the model`)
})

/** A store whose connections go through a relay that can cut one (see fixtures/redis-cut.ts). */
async function storeBehindCut (t: Test, name: string): Promise<{ env: TestRedis, cut: RedisCut, store: RedisEventStore }> {
  const env = await useRedis(t, name)
  const cut = await startRedisCut(env.url)
  t.teardown(() => cut.close())
  const store = await RedisEventStore.connect({ url: cut.url, keyPrefix: env.prefix, retention: RETENTION })
  t.teardown(() => store.close())
  return { env, cut, store }
}

t.test('redis: after an append that failed but was applied, only an identical resend counts as applied', async (t) => {
  const { cut, store } = await storeBehindCut(t, 'uncertain')
  await store.createSession('sess', 'p')
  const batch = (tag: string): Array<{ data: string }> => [{ data: `${tag}1` }, { data: `${tag}2` }]
  await store.append('sess', 's', batch('a'))
  // Redis runs the append carrying "b-cut", then the connection dies with its reply.
  const b = batch('b-cut')
  cut.arm('b-cut1', 'after', 1500)
  await t.rejects(store.append('sess', 's', b), 'the append fails at the client')
  t.equal(cut.fired, 1, 'cut after Redis ran it')
  await sleep(1600)
  t.same((await store.append('sess', 's', b)).map(e => e.seq), [3, 4], 'the identical resend is recognised as applied')
  // Another batch of the same length must be appended, not taken for that one.
  const c = await store.append('sess', 's', batch('c'))
  t.same(c.map(e => e.seq), [5, 6], 'a new batch is numbered after it')
  t.same((await store.read('sess', 's', 0, 100))?.events.map(e => e.data), ['a1', 'a2', 'b-cut1', 'b-cut2', 'c1', 'c2'], 'each batch stored once, none dropped')

  // The same after a failure that is not resent: the next, different batch is stored.
  cut.arm('d-cut1', 'after', 1500)
  await t.rejects(store.append('sess', 's', batch('d-cut')))
  await sleep(1600)
  t.same((await store.append('sess', 's', batch('e'))).map(e => e.seq), [9, 10], 'numbered after the applied batch')
  t.same((await store.read('sess', 's', 6, 100))?.events.map(e => e.data), ['d-cut1', 'd-cut2', 'e1', 'e2'], 'the batch after an unconfirmed one is not dropped')
})

t.test('redis: a batch past Lua whose transaction ran but whose reply was lost: the identical resend counts as applied', async (t) => {
  const { env, cut, store } = await storeBehindCut(t, 'uncertain-split')
  await store.createSession('sess', 'p')
  await store.append('sess', 's', frames('a', 50))
  await store.append('sess', 's', frames('b', 50))
  const c = frames('cutafter', 50)
  cut.arm('cutafter0', 'after', 1500)
  await t.rejects(store.append('sess', 's', c), 'the append fails at the client')
  t.equal(cut.fired, 1, 'cut after Redis ran it')
  await sleep(1600)
  t.same((await store.append('sess', 's', c)).map(e => e.seq)[0], 101, 'the identical resend is recognised as applied')
  t.same((await store.append('sess', 's', frames('d', 50))).map(e => e.seq)[0], 151, 'the next batch is numbered after it')
  const d = frames('cutbefore', 50)
  cut.arm('cutbefore0', 'before', 1500)
  await t.rejects(store.append('sess', 's', d))
  await sleep(1600)
  t.same((await store.append('sess', 's', d)).map(e => e.seq)[0], 201, 'a transaction that never reached Redis: the resend is appended')
  t.same((await env.redis.xrange(`${env.prefix}{sess}:b:s`, '-', '+')).map(([id]) => id), ['1-50', '51-50', '101-50', '151-50', '201-50'], 'each batch stored once')
  t.equal(await env.redis.exists(`${env.prefix}{sess}:aside`), 0, 'no stream left aside')
})

/** A store behind a relay whose open connections can be stalled, with its watchdog's timeout at `timeoutMs`. */
async function storeBehindStall (t: Test, name: string, timeoutMs: number): Promise<{ env: TestRedis, cut: RedisCut, store: RedisEventStore }> {
  const env = await useRedis(t, name)
  const cut = await startRedisCut(env.url)
  t.teardown(() => cut.close())
  const store = await RedisEventStore.connect({ url: cut.url, keyPrefix: env.prefix, retention: RETENTION, socketTimeoutMs: timeoutMs })
  t.teardown(() => store.close())
  return { env, cut, store }
}

/** What `work` came to within `ms`: its value, its error, or `hung`. */
async function within<T> (ms: number, work: Promise<T>): Promise<{ value: T } | { error: unknown } | 'hung'> {
  return await Promise.race([work.then((value) => ({ value }), (error: unknown) => ({ error })), sleep(ms).then(() => 'hung' as const)])
}

t.test('redis: a command connection that stops answering is closed and opened again after the socket timeout', async (t) => {
  const { cut, store } = await storeBehindStall(t, 'stalled-commands', 500)
  await store.createSession('sess', 'p')
  await store.append('sess', 's', [{ data: 'a' }])
  t.equal(cut.stall(), 2, 'both connections stall, open')
  const started = Date.now()
  const outcome = await within(5000, store.read('sess', 's', 0, 10))
  const tookMs = Date.now() - started
  t.comment(`the command waiting: ${outcome === 'hung' ? 'hung' : 'value' in outcome ? 'answered (resent over the new connection)' : `failed: ${String(outcome.error)}`}`)
  t.not(outcome, 'hung', 'a command waiting on the stalled connection is settled')
  t.ok(tookMs >= 400 && tookMs < 4000, `after the timeout, not at once (${tookMs} ms)`)
  t.same(await within(5000, store.read('sess', 's', 0, 10).then((r) => r?.events.map((e) => e.data))), { value: ['a'] }, 'the store answers over a new connection')
  t.same(store.connectionsReplaced(), { ping: 2, handshake: 0 }, 'both connections counted as replaced, for the metrics')
})

t.test('redis: a connection busy with a long queue of replies is not taken for stalled, however long its PING waits', async (t) => {
  const timeoutMs = 500
  const { cut, store } = await storeBehindStall(t, 'slow-replies', timeoutMs)
  await store.createSession('sess', 'p')
  const big = 'x'.repeat(200 * 1024)
  for (let i = 0; i < 4; i++) await store.append('sess', 's', [{ data: `${i}${big}` }])
  const before = cut.accepted
  // 800 KB of replies at 200 KB/s: several timeouts during which every PING waits behind them.
  cut.throttle(200 * 1024)
  const started = Date.now()
  const outcome = await within(20_000, store.read('sess', 's', 0, 100).then((r) => r?.events.map((e) => e.data?.slice(0, 1))))
  const tookMs = Date.now() - started
  cut.throttle(undefined)
  t.same(outcome, { value: ['0', '1', '2', '3'] }, 'the read is answered')
  t.ok(tookMs > 3 * timeoutMs, `its replies took several timeouts to arrive (${tookMs} ms)`)
  t.equal(cut.accepted - before, 0, 'on the same connection: it was never closed')
})

t.test('redis: close() of a store whose Redis answers nothing ends within the timeout', async (t) => {
  const timeoutMs = 500
  const { cut, store } = await storeBehindStall(t, 'close-stalled', timeoutMs)
  await store.createSession('sess', 'p')
  t.equal(cut.stall(), 2, 'both connections stall, open')
  const started = Date.now()
  const outcome = await within(5000, store.close())
  t.not(outcome, 'hung', 'closed')
  t.ok(Date.now() - started < 2 * timeoutMs, `within the timeout and the close's own wait (${Date.now() - started} ms)`)
})

t.test('redis: close() during an outage, with commands queued while the connections wait to reconnect, ends within the timeout', async (t) => {
  const timeoutMs = 500
  const env = await useRedis(t, 'close-outage')
  const cut = await startRedisCut(env.url)
  t.teardown(() => cut.close())
  // A steady retry delay longer than the timeout: the connection is still waiting to reconnect when close() gives up on QUIT.
  const store = await RedisEventStore.connect({ url: cut.url, keyPrefix: env.prefix, retention: RETENTION, socketTimeoutMs: timeoutMs, redisOptions: { retryStrategy: () => 2000 } })
  await store.createSession('sess', 'p')
  // The connection carrying this command is cut before Redis gets it, and Redis refuses connections for a while.
  cut.arm('sess-cut', 'before', 10_000)
  store.getSession('sess-cut').catch(() => {})
  await sleep(100)
  t.equal(cut.fired, 1, 'the command connection is cut')
  // Queued while the connection waits to reconnect.
  store.getSession('sess').catch(() => {})
  const started = Date.now()
  const outcome = await within(5000, store.close())
  t.not(outcome, 'hung', 'closed')
  t.ok(Date.now() - started < 2 * timeoutMs, `within the timeout (${Date.now() - started} ms)`)
})

// ioredis 5's own socketTimeout kept the closed connection's timer, which then closed the
// new one; the watchdog forgets a connection's PING when it closes.
t.test('redis: after a connection closed with a command waiting, the new one is not taken for stalled', async (t) => {
  const timeoutMs = 500
  const { cut, store } = await storeBehindStall(t, 'closed-waiting', timeoutMs)
  await store.createSession('sess', 'p')
  const before = cut.accepted
  // Closed before Redis got it (a restart, a failover): ioredis opens a new connection and sends it there.
  cut.arm('sess-cut', 'before', 0)
  t.equal(await store.getSession('sess-cut'), null, 'the command is answered over a new connection')
  t.equal(cut.fired, 1)
  // The new connection answers everything, for several timeouts.
  const until = Date.now() + 3 * timeoutMs
  while (Date.now() < until) {
    await store.getSession('sess')
    await sleep(50)
  }
  t.equal(cut.accepted - before, 1, 'one new connection, kept: the old one\'s timer did not close it')
})

t.test('redis: a subscriber connection that stops answering is found by its ping, and what was published meanwhile is caught up', async (t) => {
  const { env, cut, store: reader } = await storeBehindStall(t, 'stalled-subscriber', 500)
  const writer = await storeFor(t, env)
  await writer.createSession('sess', 'p')
  const heard: number[] = []
  reader.subscribe('sess', 's', (n) => heard.push(n.toSeq))
  await eventually('the first notice', async () => {
    if (heard.length === 0) await writer.append('sess', 's', [{ data: 'first' }])
    await sleep(50)
    return heard.length > 0
  })
  const before = Math.max(...heard)
  t.equal(cut.stall(), 2, 'both connections stall, open')
  // Nothing waits on the reader's connections now: only the ping finds the subscriber dead.
  const stored = await writer.append('sess', 's', [{ data: 'while stalled' }])
  const seq = stored[0]?.seq ?? 0
  t.ok(seq > before, 'appended after the last notice heard')
  await eventually('the notice of the append made while the subscriber was stalled', () => heard.some((s) => s >= seq), 6000)
  await writer.append('sess', 's', [{ data: 'after' }])
  await eventually('notices over the new connection', () => heard.some((s) => s > seq), 3000)
})

t.test('redis: intactSince moves to the moment a replica finds Redis without its mark (restarted empty)', async (t) => {
  const env = await useRedis(t, 'intact')
  const store = await storeFor(t, env)
  const first = await store.intactSince()
  t.equal(await env.redis.get(`${env.prefix}intact`), String(first), 'the mark is one key under the prefix')
  await sleep(5)
  await env.redis.del(`${env.prefix}intact`) // what a restart without persistence does to it
  const wipedAt = Date.now()
  const after = await store.intactSince()
  t.ok(after >= wipedAt, `intact only since the store was found empty (${after - first} ms later)`)
  const other = await storeFor(t, env)
  t.equal(await other.intactSince(), after, 'another replica sees the same moment')
})

t.test('redis: a batch whose append failed is retained (the connection may still hold its bytes); one that went through is not', async (t) => {
  const env = await useRedis(t, 'retain-failed')
  const store = await storeFor(t, env)
  await store.createSession('sess', 'p')
  const batchOf = (tag: string): EventBatch => {
    const builder = new EventBatchBuilder()
    for (const e of frames(tag, 5)) builder.add(e)
    return builder.take()
  }
  const stored = batchOf('a')
  await store.appendBatch('sess', 's', stored, { fence: 'A' })
  t.not(stored.release(), undefined, 'an append that went through leaves the batch free for its builder')
  await env.redis.set(`${env.prefix}{sess}:lease`, 'B')
  const refused = batchOf('b')
  await t.rejects(store.appendBatch('sess', 's', refused, { fence: 'A' }), LeaseLostError)
  t.equal(refused.release(), undefined, 'a failed one is never reused')
})
