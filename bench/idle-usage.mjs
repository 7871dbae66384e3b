#!/usr/bin/env node
// What an idle stream costs a proxy, split the way Node sees its memory: RSS
// against V8's heap (used, and reserved), memory outside it that V8 is told
// about (external, ArrayBuffers), and the rest (native: sockets, parsers,
// libuv handles, malloc's own overhead and free lists).
//
//   node bench/idle-usage.mjs [--path=node|gw-memory|gw-redis] [--streams=3000] [--gc]
//                             [--gateway=dist/src/main.js] [--node-args="--flag ..."] [--settle=3] [--spaces]
//                             [--watch=<seconds>]
//
// Starts the bench upstream and one proxy (the plain Node pass-through or the
// gateway, on the node running this script, the gateway with `npm start`'s
// flags), opens 100 streams and closes them (warm-up), reads the proxy's
// memory, opens N idle streams, waits (--settle seconds), reads it again and prints the growth
// per stream. --gc runs a full collection in the proxy before each reading (a
// diagnostic: it separates the live heap from garbage not yet collected).
// --spaces adds V8's heap spaces, the brk heap (glibc's main malloc arena, where
// Node's native objects such as its HTTP parsers live) and cppgc's heap.
// --node-args are added after the start script's flags (so
// `--memory-reducer --heap-growing-percent=0` undoes them). Environment such as
// MALLOC_ARENA_MAX is passed to the proxy as it is. --watch keeps the streams open
// that many seconds more after the reading and prints RSS, heap and native growth
// per stream every 10 s: whether an idle proxy's memory stays where it settled.
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from 'node:fs'
import os from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'
import { rssKb, start, stopAll } from './lib/procs.mjs'
import { startGateway } from './lib/gateway.mjs'
import { deleteSession, initialize, jsonAgent, openStream } from './lib/client.mjs'
import { connectRedis, deletePrefix } from './lib/redis.mjs'
import { parseArgs } from './lib/args.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const args = parseArgs(['path', 'streams', 'gc', 'gateway', 'node-args', 'settle', 'spaces', 'watch'], import.meta.url)
const pathId = args.path ?? 'node'
const N = Number(args.streams ?? 3000)
const withGc = args.gc !== undefined
const extraArgs = String(args['node-args'] ?? '').split(' ').filter(Boolean)
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'
const keyPrefix = `mcpgw-bench-usage-${Date.now().toString(36)}:`
const dir = mkdtempSync(join(os.tmpdir(), 'mcpgw-usage-'))
const preload = join(dir, 'usage-on-sigwinch.mjs')
// On SIGWINCH the proxy writes what process.memoryUsage() says (after a full collection with --gc).
writeFileSync(preload, [
  "import { renameSync, writeFileSync } from 'node:fs'",
  "import v8 from 'node:v8'",
  "process.on('SIGWINCH', () => {",
  "  if (typeof globalThis.gc === 'function') globalThis.gc()",
  "  writeFileSync(process.env.USAGE_FILE + '.tmp', JSON.stringify({ ...process.memoryUsage(), spaces: v8.getHeapSpaceStatistics(), cppgc: v8.getCppHeapStatistics?.('brief').resident_size_bytes ?? 0 }))",
  "  renameSync(process.env.USAGE_FILE + '.tmp', process.env.USAGE_FILE)",
  '})',
  ''
].join('\n'))
const usageFile = join(dir, 'usage.json')
const nodeArgs = [`--import=${preload}`, ...(withGc ? ['--expose-gc'] : []), ...extraArgs]

process.on('SIGINT', () => { stopAll().finally(() => process.exit(130)) })

const upstream = start('upstream', process.execPath, [join(here, 'lib/upstream.mjs')], { readyLine: true, env: { PORT: '0' } })
const upstreamPort = (await upstream.ready).port
let proxy
if (pathId === 'node') {
  const proc = start('node-proxy', process.execPath, [...nodeArgs, join(here, 'lib/node-proxy.mjs')], { readyLine: true, env: { PORT: '0', UPSTREAM_PORT: String(upstreamPort), USAGE_FILE: usageFile } })
  proxy = { port: (await proc.ready).port, pid: proc.pid }
} else {
  const store = pathId === 'gw-redis' ? 'redis' : 'memory'
  const gw = await startGateway({
    name: pathId,
    main: resolve(root, args.gateway ?? 'dist/src/main.js'),
    upstreamPort,
    nodeArgs,
    env: { USAGE_FILE: usageFile },
    ...(store === 'redis' ? { redisUrl, keyPrefix } : {})
  })
  proxy = { port: gw.port, pid: gw.pid }
}

const agent = jsonAgent()

/** Open n idle streams (sessions first, then GETs), resolved once every head is in. */
async function open (n) {
  const ids = []
  for (let i = 0; i < n; i += 100) {
    ids.push(...await Promise.all(Array.from({ length: Math.min(100, n - i) }, () => initialize(proxy.port, agent))))
  }
  const streams = []
  for (let i = 0; i < ids.length; i += 200) {
    streams.push(...await Promise.all(ids.slice(i, i + 200).map(id => openStream(proxy.port, id, { timeoutMs: 600_000 }))))
  }
  return { ids, streams }
}

async function usage () {
  rmSync(usageFile, { force: true })
  process.kill(proxy.pid, 'SIGWINCH')
  for (let i = 0; i < 200 && !existsSync(usageFile); i++) await sleep(50)
  const u = JSON.parse(readFileSync(usageFile, 'utf8'))
  const anon = /^Anonymous:\s+(\d+)/m.exec(readFileSync(`/proc/${proxy.pid}/smaps_rollup`, 'utf8'))
  const spaces = Object.fromEntries(u.spaces.map(s => [s.space_name, { size: s.space_size, used: s.space_used_size }]))
  // The brk heap: glibc's main malloc arena.
  const brk = /\[heap\]\n(?:.*\n)*?Rss:\s+(\d+)/.exec(readFileSync(`/proc/${proxy.pid}/smaps`, 'utf8'))
  return { spaces, cppgc: u.cppgc, brk: Number(brk?.[1] ?? 0) * 1024, rss: rssKb(proxy.pid) * 1024, heapTotal: u.heapTotal, heapUsed: u.heapUsed, external: u.external, arrayBuffers: u.arrayBuffers, anon: Number(anon?.[1] ?? NaN) * 1024 }
}

try {
  const warm = await open(100)
  for (const s of warm.streams) s.close()
  await Promise.all(warm.ids.map(id => deleteSession(proxy.port, id, agent).catch(() => 0)))
  await sleep(1500)
  const a = await usage()
  const t0 = Date.now()
  const held = await open(N)
  const openSeconds = (Date.now() - t0) / 1000
  await sleep(Number(args.settle ?? 3) * 1000)
  const b = await usage()
  const ok = held.streams.filter(s => s.status === 200).length
  const per = k => (b[k] - a[k]) / ok / 1024
  const native = ((b.rss - a.rss) - (b.heapTotal - a.heapTotal) - (b.external - a.external)) / ok / 1024
  const row = {
    node: process.version,
    path: pathId,
    streams: ok,
    gc: withGc,
    nodeArgs: extraArgs.join(' '),
    malloc: process.env.MALLOC_ARENA_MAX === undefined ? '' : `MALLOC_ARENA_MAX=${process.env.MALLOC_ARENA_MAX}`,
    rssKb: per('rss'),
    anonKb: per('anon'),
    heapTotalKb: per('heapTotal'),
    heapUsedKb: per('heapUsed'),
    externalKb: per('external'),
    arrayBuffersKb: per('arrayBuffers'),
    nativeKb: native,
    openSeconds
  }
  console.log(`${row.node} ${row.path} ${row.streams} streams${row.gc ? ' (gc)' : ''} ${row.nodeArgs} ${row.malloc}: RSS ${row.rssKb.toFixed(1)} KB/stream = heap reserved ${row.heapTotalKb.toFixed(1)} (used ${row.heapUsedKb.toFixed(1)}) + external ${row.externalKb.toFixed(1)} (ArrayBuffers ${row.arrayBuffersKb.toFixed(1)}) + native ${row.nativeKb.toFixed(1)}; anonymous ${row.anonKb.toFixed(1)}; opened in ${openSeconds.toFixed(1)} s`)
  console.log(JSON.stringify(row))
  if (args.spaces !== undefined) console.log(`  cppgc ${per('cppgc').toFixed(1)} KB/stream, malloc main arena (brk) ${per('brk').toFixed(1)} KB/stream`)
  if (args.spaces !== undefined) for (const [name, s] of Object.entries(b.spaces)) console.log(`  ${name.padEnd(28)} size ${(((s.size - (a.spaces[name]?.size ?? 0))) / ok / 1024).toFixed(1).padStart(6)} used ${(((s.used - (a.spaces[name]?.used ?? 0))) / ok / 1024).toFixed(1).padStart(6)} KB/stream (total size ${(s.size / 2 ** 20).toFixed(1)} MB)`)
  const watchS = Number(args.watch ?? 0)
  for (let t = 10; t <= watchS; t += 10) {
    await sleep(10_000)
    const c = await usage()
    const grown = k => (c[k] - a[k]) / ok / 1024
    const cNative = ((c.rss - a.rss) - (c.heapTotal - a.heapTotal) - (c.external - a.external)) / ok / 1024
    console.log(`  +${t} s: RSS ${grown('rss').toFixed(1)} KB/stream = heap reserved ${grown('heapTotal').toFixed(1)} (used ${grown('heapUsed').toFixed(1)}) + native ${cNative.toFixed(1)}; streams open ${held.streams.filter(s => !s.ended).length}`)
  }
  for (const s of held.streams) s.close()
} finally {
  agent.destroy()
  await stopAll()
  if (pathId === 'gw-redis') {
    const redis = await connectRedis(redisUrl)
    await deletePrefix(redis, keyPrefix)
    redis.disconnect()
  }
  rmSync(dir, { recursive: true, force: true })
}
process.exit(0)
