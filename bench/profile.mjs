#!/usr/bin/env node
// CPU profile of the gateway under the throughput scenario of bench/run.mjs.
//
//   node bench/profile.mjs [--store=memory|redis|both] [--seconds=8] [--sessions=1,100]
//                          [--rate=1000] [--replay=20] [--gateway=dist/src/main.js] [--out=bench/results]
//
// Starts the bench upstream and the gateway under `node --cpu-prof`, floods
// 1 and 100 sessions (as fast as the socket takes them), or with --rate
// sends that many events/s in all over each session count (the latency
// scenario, where each upstream read carries one event), or with --replay
// resumes that many times 10,000 events behind (the replay scenario), stops the gateway
// (SIGTERM: the profile is written at exit) and prints where the time went:
// self time by function, by file/package, and inclusive time of the
// gateway's own functions. The raw .cpuprofile (open it in Chrome DevTools or
// speedscope) and the summary go to <out>/profiles/.
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import http from 'node:http'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { FILL_EVENTS, startGateway } from './lib/gateway.mjs'
import { start, stop, stopAll } from './lib/procs.mjs'
import { connectRedis, deletePrefix } from './lib/redis.mjs'
import { latencyRound, replayRound, throughputRound } from './lib/scenarios.mjs'
import { analyze } from './lib/cpuprofile.mjs'
import { parseArgs } from './lib/args.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const args = parseArgs(['store', 'seconds', 'sessions', 'rate', 'replay', 'gateway', 'out'], import.meta.url)
const stores = args.store === undefined || args.store === 'both' ? ['memory', 'redis'] : [args.store]
const seconds = Number(args.seconds ?? 8)
const rate = args.rate === undefined ? undefined : Number(args.rate)
const replays = args.replay === undefined ? undefined : Number(args.replay)
const sessionCounts = String(args.sessions ?? (rate === undefined ? '1,100' : '10')).split(',').map(Number)
const gatewayMain = resolve(root, args.gateway ?? 'dist/src/main.js')
const outDir = join(resolve(root, args.out ?? 'bench/results'), 'profiles')
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'
const log = (...a) => process.stderr.write(`[profile] ${a.join(' ')}\n`)

process.on('SIGINT', () => { stopAll().finally(() => process.exit(130)) })

async function profileStore (store, upstreamPort, ctx) {
  const dir = join(os.tmpdir(), `mcpgw-prof-${store}-${Date.now()}`)
  mkdirSync(dir, { recursive: true })
  const keyPrefix = `mcpgw-bench-prof-${Date.now().toString(36)}:`
  const gw = await startGateway({
    name: `gw-${store}`,
    main: gatewayMain,
    upstreamPort,
    nodeArgs: ['--cpu-prof', `--cpu-prof-dir=${dir}`, '--cpu-prof-interval=250'],
    ...(store === 'redis' ? { redisUrl, keyPrefix } : {})
  })
  const path = { id: `gw-${store}`, port: gw.port, pid: gw.pid, adminPort: gw.adminPort }
  const results = {}
  try {
    if (replays !== undefined) {
      const rounds = []
      for (let i = 0; i < replays; i++) rounds.push(await replayRound(ctx, path, 10_000))
      const perSec = rounds.map(r => r.eventsPerSec).sort((a, b) => a - b)
      const firstByte = rounds.map(r => r.firstByteMs).sort((a, b) => a - b)
      log(`${store}, ${replays} replays of 10,000 events: median ${Math.round(perSec[perSec.length >> 1])} events/s, first byte ${firstByte[firstByte.length >> 1].toFixed(2)} ms`)
    }
    for (const n of replays === undefined ? sessionCounts : []) {
      if (rate !== undefined) {
        const r = await latencyRound(ctx, path, n, rate / n, { warmupMs: 1000, windowMs: seconds * 1000 })
        r.cpuUsPerEvent = r.cpuPct * 1e4 / r.eventsPerSec
        results[n] = r
        log(`${store}, ${n} session(s) at ${rate} events/s: ${Math.round(r.eventsPerSec)} events/s, gateway ${r.cpuUsPerEvent.toFixed(1)} us CPU per event, p50 ${r.p50.toFixed(3)} ms, p99 ${r.p99.toFixed(2)} ms`)
        continue
      }
      // The same warm-up as run.mjs: the events/s printed are of the steady state (the profile covers the warm-up too).
      const r = await throughputRound(ctx, path, n, { warmupMs: 1000, windowMs: seconds * 1000, fillEvents: FILL_EVENTS, fillCapMs: 20_000 })
      results[n] = r
      log(`${store}, ${n} session(s): ${Math.round(r.eventsPerSec)} events/s, gateway ${r.cpuUsPerEvent.toFixed(2)} us CPU per event${r.redis ? `, ${r.redis.eventsPerAppend.toFixed(0)} events per append` : ''} (after a warm-up of ${(r.warmedMs / 1000).toFixed(1)} s)`)
    }
  } finally {
    await stop(gw.proc, 20_000)
    if (store === 'redis' && ctx.redis !== undefined) await deletePrefix(ctx.redis, keyPrefix).catch(() => {})
  }
  const file = readdirSync(dir).find(f => f.endsWith('.cpuprofile'))
  if (file === undefined) throw new Error(`no profile written in ${dir} (gateway exit ${gw.proc.exitCode})`)
  const raw = readFileSync(join(dir, file), 'utf8')
  mkdirSync(outDir, { recursive: true })
  const target = join(outDir, `gateway-${store}.cpuprofile`)
  writeFileSync(target, raw)
  const scenario = replays !== undefined ? `${replays} replays of 10,000 events` : rate === undefined ? 'the throughput scenario' : `${rate} events/s`
  const summary = [replays !== undefined ? `Gateway (${store} store) under ${scenario}` : `Gateway (${store} store) under ${scenario}: ${sessionCounts.join(' and ')} session(s), ${seconds} s each`,
    ...Object.entries(results).map(([n, r]) => `  ${n} session(s): ${Math.round(r.eventsPerSec)} events/s, ${r.cpuUsPerEvent.toFixed(2)} us gateway CPU per event`),
    '', analyze(JSON.parse(raw))].join('\n')
  writeFileSync(join(outDir, `gateway-${store}.txt`), summary + '\n')
  process.stdout.write(`\n===== ${store} =====\n${summary}\n`)
  return target
}

const ctx = { controlAgent: new http.Agent({ keepAlive: true, maxSockets: 4 }) }
try {
  if (stores.includes('redis')) {
    ctx.redis = await connectRedis(redisUrl)
    ctx.redisPort = Number(new URL(redisUrl).port || 6379)
  }
  const upstream = start('upstream', process.execPath, [join(here, 'lib/upstream.mjs')], { readyLine: true, env: { PORT: '0' } })
  ctx.upstreamPort = (await upstream.ready).port
  for (const store of stores) log(`wrote ${await profileStore(store, ctx.upstreamPort, ctx)}`)
} finally {
  await stopAll()
  ctx.redis?.disconnect()
  ctx.controlAgent.destroy()
}
