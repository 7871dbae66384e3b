#!/usr/bin/env node
// What V8's garbage collector does in the gateway during a flood, and why.
//
//   node bench/collections.mjs [--store=memory|redis] [--sessions=1,100] [--seconds=6] [--rounds=1]
//                              [--node-args="--flag ..."] [--gateway=dist/src/main.js]
//                              [--node-args-b="--flag ..."] [--gateway-b=<other build's dist/src/main.js>]
//
// Starts the bench upstream and, for each session count and round, a fresh gateway
// (node with `npm start`'s flags, then --node-args, then --trace-gc and
// --trace-incremental-marking). It runs the throughput scenario of bench/run.mjs
// once to warm up and fill retention, then once more for --seconds, and reports for
// that second round:
// - events/s and the gateway's CPU per event;
// - the young- and old-generation collections: count, pause time, and the full
//   collections' incremental steps;
// - what started each incremental marking (V8's own reason: an allocation limit, a
//   task, external memory pressure);
// - the process's peak RSS.
//
// With --node-args-b or --gateway-b, a second gateway (B) runs beside it, the two
// alternating round by round, and the table gives B's figures as ratios to A's: a
// comparison of heap flags or builds within one run. Medians of the rounds.
import http from 'node:http'
import os from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { FILL_EVENTS, startGateway } from './lib/gateway.mjs'
import { ageMs, start, statusKb, stop, stopAll } from './lib/procs.mjs'
import { connectRedis, deletePrefix } from './lib/redis.mjs'
import { throughputRound } from './lib/scenarios.mjs'
import { parseArgs } from './lib/args.mjs'
import { median } from './lib/stats.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const args = parseArgs(['store', 'sessions', 'seconds', 'rounds', 'node-args', 'gateway', 'node-args-b', 'gateway-b'], import.meta.url)
const store = args.store ?? 'memory'
if (store !== 'memory' && store !== 'redis') {
  process.stderr.write(`--store is memory or redis, not ${store}\n`)
  process.exit(2)
}
const sessionCounts = String(args.sessions ?? '1,100').split(',').map(Number)
const seconds = Number(args.seconds ?? 6)
const rounds = Number(args.rounds ?? 1)
const words = (text) => String(text ?? '').split(' ').filter(Boolean)
const variants = [{ label: 'A', main: resolve(root, args.gateway ?? 'dist/src/main.js'), nodeArgs: words(args['node-args']) }]
if (args['node-args-b'] !== undefined || args['gateway-b'] !== undefined) {
  variants.push({ label: 'B', main: resolve(root, args['gateway-b'] ?? args.gateway ?? 'dist/src/main.js'), nodeArgs: words(args['node-args-b']) })
}
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'
const log = (...a) => process.stderr.write(`[collections] ${a.join(' ')}\n`)

process.on('SIGINT', () => { stopAll().finally(() => process.exit(130)) })

/** The trace lines V8 writes, each with the process's uptime in ms. */
const TIMED = /^\[\d+:0x[0-9a-f]+(?::\d+)?\]\s+(\d+) ms: (.*)$/
const PAUSE = /^(Scavenge|Mark-Compact|Minor Mark-Sweep)\b.*?, ([\d.]+) \/ [\d.]+ ms\s+(?:\(\+ ([\d.]+) ms in \d+ steps)?/
const START = /^\[IncrementalMarking\] Start \(([^)]+)\)/

/** Collections by kind and marking starts by reason, in the trace from `fromMs` of the process's life on. */
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

async function measure (ctx, variant, sessions) {
  const keyPrefix = `mcpgw-bench-gc-${Date.now().toString(36)}:`
  let trace = ''
  const gw = await startGateway({
    name: `gw-${store}-${variant.label}`,
    main: variant.main,
    upstreamPort: ctx.upstreamPort,
    nodeArgs: [...variant.nodeArgs, '--trace-gc', '--trace-incremental-marking'],
    ...(store === 'redis' ? { redisUrl, keyPrefix } : {})
  })
  try {
    // The trace goes to stdout; procs.mjs keeps only its tail, so it is collected here.
    gw.proc.child.stdout.on('data', chunk => { trace += chunk.toString() })
    const path = { id: `gw-${store}`, store, port: gw.port, pid: gw.pid, adminPort: gw.adminPort }
    await throughputRound(ctx, path, sessions, { warmupMs: 1000, windowMs: 2000, fillEvents: FILL_EVENTS, fillCapMs: 20_000 })
    // The trace's times count from the process's start: the measured round starts at its age now.
    const from = ageMs(gw.pid)
    const r = await throughputRound(ctx, path, sessions, { warmupMs: 500, windowMs: seconds * 1000, fillEvents: 0, fillCapMs: 0 })
    const peakKb = statusKb(gw.pid, 'VmHWM')
    await stop(gw.proc, 20_000)
    const { kinds, starts } = summarize(trace, from)
    const windowS = seconds + 0.5
    const full = kinds.get('Mark-Compact') ?? { count: 0, pauseMs: 0, stepsMs: 0 }
    const young = [...kinds].filter(([kind]) => kind !== 'Mark-Compact').reduce((n, [, k]) => n + k.count, 0)
    const result = {
      eventsPerSec: r.eventsPerSec,
      cpuUsPerEvent: r.cpuUsPerEvent,
      fullPerSec: full.count / windowS,
      fullMsPerSec: (full.pauseMs + full.stepsMs) / windowS,
      youngPerSec: young / windowS,
      peakMb: peakKb / 1024,
      starts
    }
    log(`${variant.label}, ${sessions} session(s): ${Math.round(result.eventsPerSec)} events/s, ${result.cpuUsPerEvent.toFixed(2)} us/event, ${result.fullPerSec.toFixed(1)} full collections/s (${result.fullMsPerSec.toFixed(0)} ms/s), peak RSS ${result.peakMb.toFixed(0)} MB`)
    return result
  } finally {
    await stop(gw.proc, 20_000)
    if (store === 'redis' && ctx.redis !== undefined) await deletePrefix(ctx.redis, keyPrefix).catch(() => {})
  }
}

const ctx = { controlAgent: new http.Agent({ keepAlive: true, maxSockets: 4 }) }
try {
  if (store === 'redis') {
    ctx.redis = await connectRedis(redisUrl)
    ctx.redisPort = Number(new URL(redisUrl).port || 6379)
  }
  const loadBefore = os.loadavg().map(x => x.toFixed(1)).join(' ')
  const upstream = start('upstream', process.execPath, [join(here, 'lib/upstream.mjs')], { readyLine: true, env: { PORT: '0' } })
  ctx.upstreamPort = (await upstream.ready).port
  const results = new Map()
  for (const sessions of sessionCounts) {
    for (let round = 0; round < rounds; round++) {
      // Alternate which goes first, so neither always meets the machine as the other left it.
      const order = round % 2 === 0 ? variants : [...variants].reverse()
      for (const v of order) {
        const key = `${v.label}:${sessions}`
        if (!results.has(key)) results.set(key, [])
        results.get(key).push(await measure(ctx, v, sessions))
      }
    }
  }
  const loadAfter = os.loadavg().map(x => x.toFixed(1)).join(' ')
  const describe = (v) => `${v.label}: ${v.main === resolve(root, 'dist/src/main.js') ? 'dist/src/main.js' : v.main}, npm start's node flags${v.nodeArgs.length > 0 ? ` + ${v.nodeArgs.join(' ')}` : ''}`
  const out = [
    `Gateway (${store} store) under the throughput scenario, ${seconds} s measured after a warm-up round; medians of ${rounds} round(s)${variants.length > 1 ? ', A and B alternating' : ''}.`,
    `Node ${process.version}, ${os.cpus().length} cores, load average (1, 5, 15 min) ${loadBefore} at the start and ${loadAfter} at the end.`,
    ...variants.map(describe),
    '',
    '| gateway, sessions | events/s | CPU per event | full collections a second | their pauses + steps, ms a second | young collections a second | peak RSS | markings started by (last round) |',
    '|---|---:|---:|---:|---:|---:|---:|---|'
  ]
  for (const sessions of sessionCounts) {
    const base = results.get(`A:${sessions}`)
    for (const v of variants) {
      const rs = results.get(`${v.label}:${sessions}`)
      const m = (f) => median(rs.map(f))
      const ratio = (f) => v === variants[0] ? '' : ` (${(m(f) / median(base.map(f))).toFixed(2)}x)`
      const starts = [...rs[rs.length - 1].starts].sort((a, b) => b[1] - a[1]).map(([reason, n]) => `${reason} ${n}`).join(', ')
      out.push(`| ${v.label}, ${sessions} | ${Math.round(m(r => r.eventsPerSec)).toLocaleString('en-US')}${ratio(r => r.eventsPerSec)} | ${m(r => r.cpuUsPerEvent).toFixed(2)} us${ratio(r => r.cpuUsPerEvent)} | ${m(r => r.fullPerSec).toFixed(1)}${ratio(r => r.fullPerSec)} | ${m(r => r.fullMsPerSec).toFixed(0)}${ratio(r => r.fullMsPerSec)} | ${m(r => r.youngPerSec).toFixed(1)} | ${Math.round(m(r => r.peakMb)).toLocaleString('en-US')} MB${ratio(r => r.peakMb)} | ${starts || 'none'} |`)
    }
  }
  process.stdout.write(out.join('\n') + '\n')
} finally {
  await stopAll()
  ctx.redis?.disconnect()
  ctx.controlAgent.destroy()
}
