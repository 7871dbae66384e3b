#!/usr/bin/env node
// What V8's garbage collector does in the gateway during a flood, and why.
//
//   node bench/collections.mjs [--store=memory|redis] [--sessions=1] [--seconds=6]
//                              [--node-args="--flag ..."] [--gateway=dist/src/main.js]
//
// Starts the bench upstream and the gateway (node with `npm start`'s flags, then
// --node-args, then --trace-gc and --trace-incremental-marking), runs the throughput
// scenario of bench/run.mjs once to warm up and fill retention, then once more for
// --seconds, and prints for that second round: events/s and the gateway's CPU per
// event, the young- and old-generation collections (count, pause time, and the
// full collections' incremental steps), what started each incremental marking (V8's
// own reason: an allocation limit, a task, external memory), and the process's peak
// RSS. Run it twice with different --node-args to compare heap flags side by side;
// a single run is one sample on a shared machine.
import http from 'node:http'
import { readFileSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { FILL_EVENTS, startGateway } from './lib/gateway.mjs'
import { CLK_TCK, start, stop, stopAll } from './lib/procs.mjs'
import { connectRedis, deletePrefix } from './lib/redis.mjs'
import { throughputRound } from './lib/scenarios.mjs'
import { parseArgs } from './lib/args.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const args = parseArgs(['store', 'sessions', 'seconds', 'node-args', 'gateway'], import.meta.url)
const store = args.store ?? 'memory'
if (store !== 'memory' && store !== 'redis') throw new Error(`--store is memory or redis, not ${store}`)
const sessions = Number(args.sessions ?? 1)
const seconds = Number(args.seconds ?? 6)
const extraArgs = String(args['node-args'] ?? '').split(' ').filter(Boolean)
const gatewayMain = resolve(root, args.gateway ?? 'dist/src/main.js')
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'

process.on('SIGINT', () => { stopAll().finally(() => process.exit(130)) })

/** The trace lines V8 writes, each with the process's uptime in ms. */
const TIMED = /^\[\d+:0x[0-9a-f]+(?::\d+)?\]\s+(\d+) ms: (.*)$/
const PAUSE = /^(Scavenge|Mark-Compact|Minor Mark-Sweep)\b.*?, ([\d.]+) \/ [\d.]+ ms\s+(?:\(\+ ([\d.]+) ms in \d+ steps)?/
const START = /^\[IncrementalMarking\] Start \(([^)]+)\)/

function summarize (trace, fromMs) {
  const kinds = new Map()
  const starts = new Map()
  for (const line of trace.split('\n')) {
    const m = TIMED.exec(line)
    if (m === null || Number(m[1]) < fromMs) continue
    const text = m[2]
    const pause = PAUSE.exec(text)
    if (pause !== null) {
      const k = kinds.get(pause[1]) ?? { count: 0, pauseMs: 0, stepsMs: 0 }
      k.count++
      k.pauseMs += Number(pause[2])
      k.stepsMs += Number(pause[3] ?? 0)
      kinds.set(pause[1], k)
      continue
    }
    const started = START.exec(text)
    if (started !== null) starts.set(started[1], (starts.get(started[1]) ?? 0) + 1)
  }
  return { kinds, starts }
}

const ctx = { controlAgent: new http.Agent({ keepAlive: true, maxSockets: 4 }) }
const keyPrefix = `mcpgw-bench-gc-${Date.now().toString(36)}:`
let trace = ''
try {
  if (store === 'redis') {
    ctx.redis = await connectRedis(redisUrl)
    ctx.redisPort = Number(new URL(redisUrl).port || 6379)
  }
  const upstream = start('upstream', process.execPath, [join(here, 'lib/upstream.mjs')], { readyLine: true, env: { PORT: '0' } })
  ctx.upstreamPort = (await upstream.ready).port
  const gw = await startGateway({
    name: `gw-${store}`,
    main: gatewayMain,
    upstreamPort: ctx.upstreamPort,
    nodeArgs: [...extraArgs, '--trace-gc', '--trace-incremental-marking'],
    ...(store === 'redis' ? { redisUrl, keyPrefix } : {})
  })
  // The trace goes to stdout; procs.mjs keeps only its tail, so collect it all here.
  gw.proc.child.stdout.on('data', chunk => { trace += chunk.toString() })
  const path = { id: `gw-${store}`, store, port: gw.port, pid: gw.pid, adminPort: gw.adminPort }
  await throughputRound(ctx, path, sessions, { warmupMs: 1000, windowMs: 2000, fillEvents: FILL_EVENTS, fillCapMs: 20_000 })
  // The trace's times count from the process's start: the measured round starts at its age now.
  const startedTicks = Number(readFileSync(`/proc/${gw.pid}/stat`, 'utf8').split(') ')[1].split(' ')[19])
  const from = Number(readFileSync('/proc/uptime', 'utf8').split(' ')[0]) * 1000 - startedTicks * 1000 / CLK_TCK
  const r = await throughputRound(ctx, path, sessions, { warmupMs: 500, windowMs: seconds * 1000, fillEvents: 0, fillCapMs: 0 })
  const status = readFileSync(`/proc/${gw.pid}/status`, 'utf8')
  const peakKb = Number(/VmHWM:\s+(\d+)/.exec(status)[1])
  await stop(gw.proc, 20_000)
  const { kinds, starts } = summarize(trace, from)
  const window = seconds + 0.5
  const lines = [
    `gateway (${store} store, ${sessions} session(s)), node flags of npm start${extraArgs.length > 0 ? ` + ${extraArgs.join(' ')}` : ''}, Node ${process.version}`,
    `  ${Math.round(r.eventsPerSec)} events/s, ${r.cpuUsPerEvent.toFixed(2)} us gateway CPU per event, peak RSS ${Math.round(peakKb / 1024)} MB`,
    `  collections in the measured round (${window} s):`,
    ...[...kinds].map(([kind, k]) => `    ${kind}: ${k.count} (${(k.count / window).toFixed(1)}/s), pauses ${k.pauseMs.toFixed(0)} ms${k.stepsMs > 0 ? ` + incremental steps ${k.stepsMs.toFixed(0)} ms` : ''}`),
    '  incremental marking started by:',
    ...[...starts].sort((a, b) => b[1] - a[1]).map(([reason, n]) => `    ${reason}: ${n}`)
  ]
  process.stdout.write(lines.join('\n') + '\n')
} finally {
  await stopAll()
  if (ctx.redis !== undefined) {
    await deletePrefix(ctx.redis, keyPrefix).catch(() => {})
    ctx.redis.disconnect()
  }
  ctx.controlAgent.destroy()
}
