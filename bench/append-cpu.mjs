#!/usr/bin/env node
// The Redis store's append path alone: the gateway process's CPU per event
// appended (user+system, Redis's own not counted), for two builds (and the
// ioredis append path of the first) in one process, in alternating bursts so
// that the machine's load falls on each alike. The full benchmark (run.mjs)
// measures the whole gateway; this isolates what the store costs per event.
//
//   npm run build && node bench/append-cpu.mjs --gateway-b=/path/to/other/dist/src/main.js [--rounds=9] [--ioredis] [--redis=redis://127.0.0.1:6379]
//
// --ioredis: also this build's appends through ioredis's public API (appendWrite:
// 'ioredis'; it shares this build's code, so it runs in a process of its own better).
//
// Two shapes: one stream of large batches (200 frames of 300 bytes: 60 KB,
// past Lua from the second on), and 100 sessions appending 20 frames each at
// once. Prints each variant's median CPU us per event and its ratio to the
// first build's zero-copy appends, median to median and least to least (on a
// busy machine the least is the one least disturbed).
import { dirname, resolve } from 'node:path'
import { pathToFileURL, fileURLToPath } from 'node:url'
import { Redis } from 'ioredis'
import { parseArgs } from './lib/args.mjs'

const args = parseArgs(['gateway-b', 'rounds', 'redis', 'ioredis'], import.meta.url)
const rounds = Number(args.rounds ?? 9)
const redisUrl = args.redis ?? 'redis://127.0.0.1:6379'
const storeModule = (main) => pathToFileURL(resolve(dirname(main), 'store/redis/redis-store.js')).href
const mainA = fileURLToPath(new URL('../dist/src/main.js', import.meta.url))
const variants = [{ label: 'this build', main: mainA, options: {} }]
if (args.ioredis !== undefined) variants.push({ label: 'this build, appendWrite ioredis', main: mainA, options: { appendWrite: 'ioredis' } })
if (typeof args['gateway-b'] === 'string') variants.push({ label: 'build B', main: resolve(args['gateway-b']), options: {} })

const retention = { maxEvents: 10_000, maxBytes: 16 * 1024 * 1024, ttlMs: 60_000 }
const prefix = `bench-append-${process.pid}:`
const frames = (n, tag) => Array.from({ length: n }, (_, i) => ({ frame: Buffer.from(`data: ${tag}${i}`.padEnd(299, '.') + '\n') }))

for (const v of variants) {
  const { RedisEventStore } = await import(storeModule(v.main))
  v.store = await RedisEventStore.connect({ url: redisUrl, keyPrefix: `${prefix}${variants.indexOf(v)}:`, retention, ...v.options })
  for (let s = 0; s < 100; s++) await v.store.createSession(`s${s}`, 'p')
  v.results = { one: [], hundred: [] }
}

async function measure (run) {
  const cpu = process.cpuUsage()
  const events = await run()
  const used = process.cpuUsage(cpu)
  return (used.user + used.system) / events
}

const oneStream = (store) => measure(async () => {
  for (let i = 0; i < 100; i++) await store.append('s0', 'one', frames(200, 'o'), { fence: 'f' })
  return 100 * 200
})
const hundredSessions = (store) => measure(async () => {
  for (let i = 0; i < 20; i++) await Promise.all(Array.from({ length: 100 }, (_, s) => store.append(`s${s}`, 'h', frames(20, 'h'))))
  return 20 * 100 * 20
})

for (let r = 0; r < rounds + 1; r++) {
  const order = r % 2 === 0 ? variants : [...variants].reverse()
  for (const v of order) {
    const one = await oneStream(v.store)
    const hundred = await hundredSessions(v.store)
    // The first round warms each variant up.
    if (r > 0) { v.results.one.push(one); v.results.hundred.push(hundred) }
  }
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]
const base = variants[0].results
for (const v of variants) {
  const one = median(v.results.one)
  const hundred = median(v.results.hundred)
  const least = (xs) => Math.min(...xs)
  console.log(`${v.label.padEnd(34)} 1 stream ${one.toFixed(2)} us/event (${(one / median(base.one)).toFixed(2)}x, least ${(least(v.results.one) / least(base.one)).toFixed(2)}x)   ` +
    `100 sessions ${hundred.toFixed(2)} us/event (${(hundred / median(base.hundred)).toFixed(2)}x, least ${(least(v.results.hundred) / least(base.hundred)).toFixed(2)}x)`)
}

const cleanup = new Redis(redisUrl)
let cursor = '0'
do {
  const [next, keys] = await cleanup.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000)
  cursor = next
  if (keys.length > 0) await cleanup.del(...keys)
} while (cursor !== '0')
cleanup.disconnect()
await Promise.all(variants.map(v => v.store.close()))
