#!/usr/bin/env node
// The side-by-side benchmark (`npm run bench`): the gateway against a plain proxy.
//
// Starts everything it needs on 127.0.0.1 and measures, in one run, paths
// interleaved, median of several rounds:
//   direct     the upstream itself
//   nginx      plain pass-through baseline (Debian nginx, buffering off, one worker)
//   node       plain Node streaming pass-through (reference only, no target)
//   gw-memory  the gateway on its embedded store
//   gw-redis   the gateway on Redis (BENCH_REDIS_URL, default redis://127.0.0.1:6379;
//              a unix:// URL reaches it through its socket)
//
// Usage: node bench/run.mjs [--quick] [--only=thr1,thr100,fair,lat1k,lat1k-lockstep,lat10k,replay,idle]
//                           [--paths=direct,nginx,node,gw-memory,gw-redis]
//                           [--gateway=dist/src/main.js] [--label=<what that build is>]
//                           [--gateway-b=<another build's main.js> --label-b=<what it is>]
//                           [--out=bench/results] [--name=latest] [--nice=-5]
// --rounds=N overrides the number of rounds of every scenario (replay: 2N).
// --idle-rounds=N holds the idle streams N times through each proxy (default 1);
// with --gateway-b the two builds take turns going first.
// --replay-events=N resumes N events behind instead of 10,000 (the targets are
// for 10,000; a short resume shows what comes before the first page).
// --nice runs the benchmark and everything it starts at that niceness (negative
// needs root): on a shared machine it keeps other load from swamping latency.
// --quick shrinks everything to about a minute (smoke check); results then go
// to <out>/quick.* unless --name is given. Needs a build (npm run build).
// A round in which a path delivered no events is an error, not a figure: it is
// left out of the report, listed under its errors, and the run exits non-zero.
// Every table states the Node version, the cores and the load average.
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs'
import { execFileSync } from 'node:child_process'
import os from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'
import { request } from './lib/client.mjs'
import { envList, FILL_EVENTS, startGateway, startWordsFor } from './lib/gateway.mjs'
import { ensureNginx, nginxVersion, startNginx } from './lib/nginx.mjs'
import { connectionsTo, freePort, nicenessOf, nofileLimits, start, stop, stopAll, waitHttp } from './lib/procs.mjs'
import { commandStats, connectRedis, deletePrefix, diffStats, localRedisPid, redisVersion } from './lib/redis.mjs'
import { fairnessRound, idleRun, latencyRound, replayRound, throughputRound } from './lib/scenarios.mjs'
import { median } from './lib/stats.mjs'
import { evaluate, writeReports } from './lib/report.mjs'
import http from 'node:http'
import { parseArgs } from './lib/args.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')

const args = parseArgs(['quick', 'only', 'paths', 'gateway', 'label', 'gateway-b', 'label-b', 'out', 'name', 'nice', 'rounds', 'replay-events', 'idle-rounds'], import.meta.url)
const QUICK = args.quick === true
const ALL_PATHS = ['direct', 'nginx', 'node', 'gw-memory', 'gw-redis']
const ALL_SCENARIOS = ['thr1', 'thr100', 'fair', 'lat1k', 'lat1k-lockstep', 'lat10k', 'replay', 'idle']
const pathIds = args.paths === undefined ? ALL_PATHS : String(args.paths).split(',')
const scenarios = args.only === undefined ? ALL_SCENARIOS : String(args.only).split(',')
for (const [option, given, all] of [['--paths', pathIds, ALL_PATHS], ['--only', scenarios, ALL_SCENARIOS]]) {
  const unknown = given.filter(v => !all.includes(v))
  if (unknown.length > 0) {
    process.stderr.write(`${option}: unknown ${unknown.join(', ')} (one or more of ${all.join(',')})\n`)
    process.exit(2)
  }
}
const gatewayMain = resolve(root, args.gateway ?? 'dist/src/main.js')
// A second build measured side by side (before/after a change): paths gw-memory-b, gw-redis-b.
const gatewayMainB = args['gateway-b'] === undefined ? undefined : resolve(root, args['gateway-b'])
const outDir = resolve(root, args.out ?? 'bench/results')
const reportName = args.name ?? (QUICK ? 'quick' : 'latest')
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'
const nice = Number(args.nice ?? 0)
// Before anything is started: every process started from here inherits it.
if (nice !== 0) os.setPriority(nice)

const CFG = QUICK
  ? {
      rounds: 1,
      latRounds: 1,
      thr: { warmupMs: 300, windowMs: 700, fillEvents: FILL_EVENTS, fillCapMs: 5000 },
      lat: { warmupMs: 300, windowMs: 1000 },
      latSessions: 10,
      replayRounds: 2,
      replayWarmup: 2,
      replayEvents: 10_000,
      fair: { warmupMs: 1000, probes: 20, gapMs: 50 },
      idleStreams: 1000,
      idle: { settleMs: 1000, cpuWindowMs: 1000, warmup: 50 },
      idleGatewayEnv: {},
      noiseMs: 1000,
      warmupMs: 300
    }
  : {
      rounds: 5,
      latRounds: 3,
      thr: { warmupMs: 1000, windowMs: 2000, fillEvents: FILL_EVENTS, fillCapMs: 20_000 },
      lat: { warmupMs: 1000, windowMs: 4000 },
      latSessions: 10,
      // A replay of 10,000 events lasts tens of milliseconds, where one collection or
      // one descheduling shows: more rounds than the other scenarios, for a steadier median.
      replayRounds: 10,
      replayWarmup: 10,
      replayEvents: 10_000,
      fair: { warmupMs: 2000, probes: 50, gapMs: 50 },
      idleStreams: 10_000,
      idle: { settleMs: 3000, cpuWindowMs: 5000, warmup: 200 },
      idleGatewayEnv: {},
      noiseMs: 3000,
      warmupMs: 1500
    }

if (args.rounds !== undefined) {
  CFG.rounds = CFG.latRounds = Number(args.rounds)
  CFG.replayRounds = 2 * CFG.rounds
}
if (args['replay-events'] !== undefined) CFG.replayEvents = Number(args['replay-events'])

const log = (...a) => process.stderr.write(`[bench ${((Date.now() - t0) / 1000).toFixed(0).padStart(4)}s] ${a.join(' ')}\n`)
const t0 = Date.now()
const loadAtStart = os.loadavg().map(v => v.toFixed(1)).join(' ')
const runId = `${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`
const keyPrefix = `mcpgw-bench-${runId}:`
const tmp = mkdtempSync(join(os.tmpdir(), 'mcpgw-bench-'))

const ctx = { controlAgent: new http.Agent({ keepAlive: true, maxSockets: 4 }) }
const results = { firstFlood: {}, thr1: {}, thr100: {}, lat1kLoaded: {}, lat1k: {}, lat1kLockstep: {}, lat10k: {}, replayFirst: {}, replay: {}, fair: {}, idle: {} }
const errors = []
let nginxBin

// A hard bound on the whole run: whatever happens, everything is stopped.
// A quick run takes 3-4 minutes on a busy 2-core machine (load average 20); a full one about 12.
const HARD_LIMIT_MS = (QUICK ? 10 : 20) * 60_000
const hardStop = setTimeout(() => {
  log(`run exceeded ${HARD_LIMIT_MS / 60_000} minutes: stopping everything`)
  cleanup().finally(() => process.exit(3))
}, HARD_LIMIT_MS)
hardStop.unref()

let cleaned = false
async function cleanup () {
  if (cleaned) return
  cleaned = true
  await stopAll()
  if (ctx.redis !== undefined) {
    try {
      const removed = await deletePrefix(ctx.redis, keyPrefix)
      log(`redis: removed ${removed} keys under ${keyPrefix}`)
    } catch (err) { log(`redis cleanup failed: ${err.message}`) }
    ctx.redis.disconnect()
  }
  ctx.controlAgent.destroy()
  rmSync(tmp, { recursive: true, force: true })
}
// A stray rejection (a socket reset somewhere in 10,000 streams) is recorded, never fatal.
process.on('unhandledRejection', (err) => {
  errors.push({ scenario: 'unhandled', error: String(err?.stack ?? err) })
  log(`unhandled rejection: ${err?.message ?? err}`)
})
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    log(`${sig}: stopping everything`)
    cleanup().finally(() => process.exit(130))
  })
}

/** Run `fn(path, round)` for every path, `rounds` times, the path order rotated each round. */
async function interleaved (name, paths, rounds, fn) {
  const perPath = Object.fromEntries(paths.map(p => [p.id, []]))
  for (let r = 0; r < rounds; r++) {
    const order = paths.map((_, i) => paths[(i + r) % paths.length])
    for (const path of order) {
      try {
        const value = await fn(path, r)
        // A path that delivered nothing measured nothing (a stream never started, a
        // proxy that stopped forwarding): its round is an error, never a figure.
        if (value.eventsPerSec !== undefined && !(value.eventsPerSec > 0)) throw new Error(`delivered ${value.eventsPerSec} events/s: nothing measured, not reported`)
        perPath[path.id].push(value)
        log(`${name} round ${r + 1}/${rounds} ${path.id}: ${brief(value)}`)
      } catch (err) {
        errors.push({ scenario: name, path: path.id, round: r, error: err.message })
        log(`${name} round ${r + 1}/${rounds} ${path.id}: ERROR ${err.message}`)
      }
    }
  }
  return perPath
}

function brief (v) {
  if (v.eventsPerSec !== undefined && v.p99 !== undefined) return `p50 ${v.p50.toFixed(2)} ms p99 ${v.p99.toFixed(2)} ms max ${v.max.toFixed(1)} ms (${Math.round(v.eventsPerSec)} ev/s), proxy cpu ${v.cpuPct.toFixed(0)}%, machine busy ${v.machineBusyPct.toFixed(0)}%, timer late p99 ${v.timerLateP99?.toFixed(2)} max ${v.timerLateMax?.toFixed(1)} ms${Number.isFinite(v.redisCpuPct) && v.redisCpuPct > 0 ? `, redis ${v.redisCpuPct.toFixed(0)}%` : ''}${v.lost ? `, ${v.lost} LOST` : ''}${v.reconnects ? `, ${v.reconnects} reconnects` : ''}`
  if (v.headP99 !== undefined) return `head p50 ${v.headP50.toFixed(1)} p99 ${v.headP99.toFixed(1)} max ${v.headMax.toFixed(1)} ms, /healthz p50 ${v.healthP50.toFixed(1)} p99 ${v.healthP99.toFixed(1)} max ${v.healthMax.toFixed(1)} ms, flood ${Math.round(v.eventsPerSec)} ev/s, load ${v.loadavg1.toFixed(1)}`
  if (v.firstByteMs !== undefined) return `${v.replayed} events, first byte ${v.firstByteMs.toFixed(2)} ms, ${Math.round(v.eventsPerSec)} ev/s`
  if (v.eventsPerSec !== undefined) return `${Math.round(v.eventsPerSec)} ev/s, proxy cpu ${v.cpuPct.toFixed(0)}% (${v.cpuUsPerEvent.toFixed(2)} us/ev), client ${v.clientCpuPct.toFixed(0)}% (${v.clientCpuUsPerEvent.toFixed(2)} us/ev), machine busy ${v.machineBusyPct.toFixed(0)}%${v.redis ? `, redis ${v.redisCpuPct.toFixed(0)}%` : ''}, warm-up ${(v.warmedMs / 1000).toFixed(1)} s${v.filled === 0 ? ' (cap reached: streams not past retention)' : ''}${v.reconnects ? `, ${v.reconnects} reconnects` : ''}${v.closedEarly ? `, ${v.closedEarly} closed early` : ''}`
  return JSON.stringify(v)
}

/** Medians over rounds of every numeric field. */
function medians (rounds) {
  if (rounds.length === 0) return null
  const out = { rounds: rounds.length }
  for (const key of Object.keys(rounds[0])) {
    if (typeof rounds[0][key] === 'number') out[key] = median(rounds.map(r => r[key]))
  }
  if (rounds[0].max !== undefined) out.worstMax = Math.max(...rounds.map(r => r.max))
  if (rounds.some(r => r.redis !== undefined)) {
    const withCost = rounds.filter(r => r.redis !== undefined).map(r => r.redis)
    out.redis = {}
    for (const key of Object.keys(withCost[0])) {
      if (typeof withCost[0][key] === 'number') out.redis[key] = median(withCost.map(c => c[key]))
    }
    out.redis.commandsCorrected = withCost[withCost.length >> 1].commandsCorrected
  }
  return out
}

async function main () {
  if (!existsSync(gatewayMain)) throw new Error(`${gatewayMain} not found: build first (npm run build)`)
  mkdirSync(outDir, { recursive: true })
  const limits = nofileLimits()
  log(`run ${runId}${QUICK ? ' (quick)' : ''}; fd limit soft ${limits.soft} hard ${limits.hard}`)

  const want = new Set(pathIds)
  if (want.has('nginx')) nginxBin = ensureNginx(log)

  if (want.has('gw-redis')) {
    try {
      ctx.redis = await connectRedis(redisUrl)
      // Connections are counted in /proc/net/tcp: not for a Unix socket.
      if (!redisUrl.startsWith('unix:')) ctx.redisPort = Number(new URL(redisUrl).port || 6379)
      ctx.redisPid = await localRedisPid(ctx.redis)
    } catch (err) {
      log(`redis at ${redisUrl} unavailable (${err.message}): gw-redis skipped`)
      errors.push({ scenario: 'setup', path: 'gw-redis', error: `redis unavailable: ${err.message}` })
      want.delete('gw-redis')
    }
  }

  const upstream = start('upstream', process.execPath, [join(here, 'lib/upstream.mjs')], { readyLine: true, env: { PORT: '0' } })
  ctx.upstreamPort = (await upstream.ready).port
  ctx.upstreamPid = upstream.pid
  sameNiceness('upstream', upstream.pid)
  const paths = []
  for (const id of launchOrder(want)) paths.push(await launch(id, limits))
  log(`paths: ${paths.map(p => `${p.id}:${p.port}`).join(' ')}`)

  // Other users of a shared Redis show up in INFO commandstats: measure that background first.
  if (ctx.redis !== undefined) {
    const a = await commandStats(ctx.redis)
    await sleep(CFG.noiseMs)
    const d = diffStats(a, await commandStats(ctx.redis))
    delete d.info
    ctx.redisNoisePerSec = Object.fromEntries(Object.entries(d).map(([k, v]) => [k, v / (CFG.noiseMs / 1000)]))
    results.redisNoisePerSec = ctx.redisNoisePerSec
  }

  // Warm-up (JIT, pools), not in the medians. Then a flood of 100 sessions: the
  // first one a fresh process sees grows its memory to its working size, every
  // page of it a first-touch fault (about 11 us each on the VMs here), and
  // would weigh on whichever measured round came first. It is reported apart.
  for (const path of paths) {
    await throughputRound(ctx, path, 4, { warmupMs: CFG.warmupMs, windowMs: 200 }).catch(err => log(`warm-up ${path.id}: ${err.message}`))
  }
  if (scenarios.some(s => s !== 'idle')) {
    for (const path of paths) {
      try {
        const value = await throughputRound(ctx, path, 100, { ...CFG.thr, fillEvents: 0 })
        if (!(value.eventsPerSec > 0)) throw new Error(`delivered ${value.eventsPerSec} events/s: nothing measured, not reported`)
        results.firstFlood[path.id] = value
        log(`first flood (warm-up) ${path.id}: ${brief(value)}`)
      } catch (err) {
        errors.push({ scenario: 'first flood', path: path.id, error: err.message })
        log(`first flood (warm-up) ${path.id}: ${err.message}`)
      }
    }
  }
  const gwRedis = paths.find(p => p.id === 'gw-redis')
  if (gwRedis !== undefined && ctx.redisPort !== undefined) results.redisConnectionsAtRest = connectionsTo(gwRedis.pid, ctx.redisPort).length

  if (scenarios.includes('thr1')) {
    log('throughput, 1 session')
    results.thr1 = await interleaved('thr1', paths, CFG.rounds, p => throughputRound(ctx, p, 1, CFG.thr))
  }
  if (scenarios.includes('thr100')) {
    log('throughput, 100 sessions')
    results.thr100 = await interleaved('thr100', paths, CFG.rounds, p => throughputRound(ctx, p, 100, CFG.thr))
  }
  if (scenarios.includes('fair')) {
    log(`fairness: new clients (initialize + GET head, /healthz) during a 100-session flood; Node ${process.version}, load average ${os.loadavg().map(v => v.toFixed(1)).join(' ')}`)
    results.fair = await interleaved('fair', paths.filter(p => p.id !== 'direct'), CFG.rounds, async p => ({ ...await fairnessRound(ctx, p, 100, CFG.fair), loadavg1: os.loadavg()[0] }))
  }
  if (['lat1k', 'lat1k-lockstep', 'lat10k', 'replay'].some(sc => scenarios.includes(sc))) {
    if (scenarios.includes('lat1k')) {
      // The proxies as the floods left them: a gateway then holds a full embedded
      // store's worth of memory (RSS in the hundreds of MB, mostly garbage
      // awaiting a major GC), and on the VMs here DAMON's sampling stalls a
      // process longer the more memory it maps. Shown apart, not a target.
      log('latency at 1,000 events/s on the proxies as the throughput runs left them (one round each)')
      results.lat1kLoaded = await interleaved('lat1k-loaded', paths, 1, p => latencyRound(ctx, p, CFG.latSessions, 1000 / CFG.latSessions, CFG.lat))
    }
    // Latency and replay are measured on fresh processes, every path alike, warmed at 10,000 events/s.
    log('restarting every proxy for the latency and replay scenarios')
    for (const path of paths) {
      if (path.proc === undefined) continue
      await stop(path.proc)
      Object.assign(path, await launch(path.id, limits))
    }
    for (const path of paths) {
      await latencyRound(ctx, path, CFG.latSessions, 10_000 / CFG.latSessions, CFG.lat).catch(err => log(`latency warm-up ${path.id}: ${err.message}`))
    }
  }
  if (scenarios.includes('lat1k')) {
    log(`latency at 1,000 events/s (${CFG.latSessions} sessions)`)
    results.lat1k = await interleaved('lat1k', paths, CFG.latRounds, p => latencyRound(ctx, p, CFG.latSessions, 1000 / CFG.latSessions, CFG.lat))
  }
  if (scenarios.includes('lat1k-lockstep')) {
    log(`latency at 1,000 events/s, streams in lockstep (${CFG.latSessions} sessions: bursts of ${CFG.latSessions} events)`)
    results.lat1kLockstep = await interleaved('lat1k-lockstep', paths, CFG.latRounds, p => latencyRound(ctx, p, CFG.latSessions, 1000 / CFG.latSessions, CFG.lat, { lockstep: true }))
  }
  if (scenarios.includes('lat10k')) {
    log(`latency at 10,000 events/s (${CFG.latSessions} sessions)`)
    results.lat10k = await interleaved('lat10k', paths, CFG.latRounds, p => latencyRound(ctx, p, CFG.latSessions, 10_000 / CFG.latSessions, CFG.lat))
  }
  if (scenarios.includes('replay')) {
    const gateways = paths.filter(p => p.id.startsWith('gw-'))
    // The warm-up above never reads history back: a fresh process's first replays run
    // before V8 has compiled the replay path, and grow its memory to its working size
    // (every page the process touches first costs a fault, about 11 us on these VMs),
    // taking two to four times the CPU of later ones for the first ten or so. The first
    // is shown apart, like the first flood; then `replayWarmup` more, unreported, so the
    // medians measure a gateway that has served replays before, as a running one has.
    log(`replay of ${CFG.replayEvents} events: the first of each fresh process (shown apart), then ${CFG.replayWarmup} to warm up`)
    results.replayFirst = await interleaved('replay-first', gateways, 1, p => replayRound(ctx, p, CFG.replayEvents))
    for (let i = 0; i < CFG.replayWarmup; i++) {
      for (const p of gateways) await replayRound(ctx, p, CFG.replayEvents).catch(err => log(`replay warm-up ${p.id}: ${err.message}`))
    }
    log(`replay of ${CFG.replayEvents} events`)
    results.replay = await interleaved('replay', gateways, CFG.replayRounds, p => replayRound(ctx, p, CFG.replayEvents))
  }

  // The shared long-running proxies are done; idle capacity uses fresh ones (RSS from a clean start).
  for (const p of paths) if (p.proc !== undefined) await stop(p.proc)
  if (scenarios.includes('idle')) {
    // Each idle stream costs a proxy two descriptors (client + upstream socket), and
    // pooled keep-alive connections (from the initialize POSTs) need room too.
    const fit = Math.floor((limits.hard - 600) / 2)
    const count = Math.min(CFG.idleStreams, fit)
    results.idleNote = count < CFG.idleStreams
      ? `${count} streams instead of ${CFG.idleStreams}: the hard RLIMIT_NOFILE here is ${limits.hard} and each stream costs a proxy 2 descriptors, plus room for pooled connections (raising the hard limit needs CAP_SYS_RESOURCE)`
      : undefined
    if (results.idleNote !== undefined) log(results.idleNote)
    // With --gateway-b each gateway path is followed by the other build's, the pair's order
    // swapped every other round (--idle-rounds), so drift on the machine falls on both.
    const idleRounds = Number(args['idle-rounds'] ?? 1)
    const idleOrder = round => ['nginx', 'node', 'gw-memory', 'gw-redis'].filter(i => want.has(i)).flatMap(id =>
      gatewayMainB === undefined || !id.startsWith('gw-') ? [id] : round % 2 === 0 ? [id, `${id}-b`] : [`${id}-b`, id])
    for (const id of Array.from({ length: idleRounds }, (_, round) => idleOrder(round)).flat()) {
      let path
      try {
        path = await launch(id, limits, CFG.idleGatewayEnv)
        log(`idle: ${count} streams through ${id}`)
        const value = await idleRun(ctx, path, count, CFG.idle)
        ;(results.idle[id] ??= []).push(value)
        log(`idle ${id}: ${value.accepted}/${value.attempted} accepted, ${value.kbPerStream.toFixed(1)} KB/stream, cpu at rest ${value.cpuPctAtRest.toFixed(2)}%, opened in ${value.openSeconds.toFixed(1)} s`)
      } catch (err) {
        errors.push({ scenario: 'idle', path: id, error: err.message })
        log(`idle ${id}: ERROR ${err.message}`)
      } finally {
        if (path?.proc !== undefined) await stop(path.proc, 10_000)
        await request(ctx.upstreamPort, { method: 'POST', path: '/bench/reset', agent: ctx.controlAgent }).catch(() => {})
        await sleep(500)
      }
    }
  }
  await stop(upstream)
}

/** The paths wanted, in the order they are started. */
function launchOrder (want) {
  const ids = ['direct', 'nginx', 'node'].filter(id => want.has(id))
  for (const suffix of gatewayMainB === undefined ? [''] : ['', '-b']) {
    for (const id of ['gw-memory', 'gw-redis']) if (want.has(id)) ids.push(`${id}${suffix}`)
  }
  return ids
}

let launches = 0
/**
 * Start the proxy of one path (for 'direct', the shared upstream is the path):
 * at the start, again to restart it fresh, and for each idle test. `env` is
 * added to a gateway's environment.
 */
/**
 * The clients run in this process: a proxy or upstream scheduled ahead of them
 * would measure the clients' wait for a core, not the proxy. Throws when `pid`
 * does not run at this process's niceness.
 */
function sameNiceness (id, pid) {
  const own = nicenessOf(process.pid)
  const theirs = nicenessOf(pid)
  if (theirs !== own) throw new Error(`${id} runs at niceness ${theirs}, the benchmark at ${own}`)
}

async function launch (id, limits, env = {}) {
  const path = await launchPath(id, limits, env)
  sameNiceness(id, path.pid)
  return path
}

async function launchPath (id, limits, env) {
  launches++
  if (id === 'direct') return { id, port: ctx.upstreamPort, pid: ctx.upstreamPid }
  if (id === 'nginx') {
    const port = await freePort()
    const proc = startNginx({ bin: nginxBin, dir: join(tmp, `nginx-${launches}`), port, upstreamPort: ctx.upstreamPort, nofile: limits.hard })
    await waitHttp(`http://127.0.0.1:${port}/bench/stats`, { proc })
    return { id, port, pid: proc.pid, proc }
  }
  if (id === 'node') {
    const proc = start('node-proxy', process.execPath, [join(here, 'lib/node-proxy.mjs')], { readyLine: true, env: { PORT: '0', UPSTREAM_PORT: String(ctx.upstreamPort) } })
    return { id, port: (await proc.ready).port, pid: proc.pid, proc }
  }
  const b = id.endsWith('-b')
  const main = b ? gatewayMainB : gatewayMain
  if (!existsSync(main)) throw new Error(`${main} not found`)
  const store = id.startsWith('gw-redis') ? 'redis' : 'memory'
  const gw = await startGateway({
    name: id,
    main,
    upstreamPort: ctx.upstreamPort,
    env: { ...(b ? envList(process.env.BENCH_GATEWAY_B_ENV) : {}), ...env },
    ...(store === 'redis' ? { redisUrl, keyPrefix } : {})
  })
  return { id, store, port: gw.port, pid: gw.pid, adminPort: gw.adminPort, proc: gw.proc }
}

/** The fairness rounds of one path: the worst of each latency figure, the median flood rate. */
function worstFair (rounds) {
  if (rounds.length === 0) return null
  const out = medians(rounds)
  for (const key of ['headP50', 'headP99', 'headMax', 'healthP50', 'healthP99', 'healthMax']) out[key] = Math.max(...rounds.map(r => r[key]))
  return out
}

function meanBusy () {
  const all = []
  for (const scen of ['thr1', 'thr100', 'lat1k', 'lat1kLockstep', 'lat10k']) {
    for (const rounds of Object.values(results[scen])) for (const r of rounds) if (Number.isFinite(r.machineBusyPct)) all.push(r.machineBusyPct)
  }
  return all.length === 0 ? undefined : all.reduce((a, b) => a + b, 0) / all.length
}

function machine () {
  const git = (...a) => { try { return execFileSync('git', ['-C', root, ...a], { stdio: ['ignore', 'pipe', 'ignore'] }).toString().trim() } catch { return '' } }
  return {
    cpu: os.cpus()[0]?.model ?? 'unknown',
    cores: os.cpus().length,
    memoryGiB: Math.round(os.totalmem() / 2 ** 30),
    kernel: os.release(),
    node: process.version,
    nginx: nginxBin === undefined ? undefined : nginxVersion(nginxBin),
    gatewayCommit: args.label ?? git('rev-parse', '--short', 'HEAD'),
    gatewayDirty: args.label === undefined && git('status', '--porcelain', '--', 'src').length > 0,
    gatewayMain: gatewayMain.replace(root + '/', ''),
    gatewayFlags: startWordsFor(gatewayMain),
    ...(gatewayMainB === undefined ? {} : { gatewayB: gatewayMainB.replace(root + '/', ''), gatewayBLabel: args['label-b'] ?? 'B', gatewayBFlags: startWordsFor(gatewayMainB) }),
    loadAtStart,
    loadAtEnd: os.loadavg().map(v => v.toFixed(1)).join(' '),
    busyPctMean: meanBusy(),
    damon: damon()
  }
}

/**
 * The kernel's DAMON monitors, when any runs (sysfs admin interface, read
 * only): its kdamond thread samples page access bits at every sample
 * interval, holding a CPU for milliseconds each time on a virtual machine.
 */
function damon () {
  const base = '/sys/kernel/mm/damon/admin/kdamonds'
  const read = file => { try { return readFileSync(file, 'utf8').trim() } catch { return undefined } }
  const on = []
  let entries = []
  try { entries = readdirSync(base).filter(e => /^\d+$/.test(e)) } catch { return undefined }
  for (const k of entries) {
    if (read(`${base}/${k}/state`) !== 'on') continue
    const sampleUs = Number(read(`${base}/${k}/contexts/0/monitoring_attrs/intervals/sample_us`))
    const action = read(`${base}/${k}/contexts/0/schemes/0/action`)
    on.push(`kdamond ${k}: sample every ${Number.isFinite(sampleUs) ? `${sampleUs / 1000} ms` : '?'}${action === undefined ? '' : `, scheme ${action}`}`)
  }
  return on.length === 0 ? undefined : on.join('; ')
}

let exitCode = 0
try {
  await main()
} catch (err) {
  exitCode = 1
  errors.push({ scenario: 'run', error: err.stack ?? err.message })
  log(`FAILED: ${err.stack ?? err.message}`)
} finally {
  const redisVer = ctx.redis !== undefined ? await redisVersion(ctx.redis).catch(() => 'unknown') : undefined
  await cleanup()
  clearTimeout(hardStop)
  const summary = {
    firstFlood: results.firstFlood,
    thr1: Object.fromEntries(Object.entries(results.thr1).map(([k, v]) => [k, medians(v)])),
    thr100: Object.fromEntries(Object.entries(results.thr100).map(([k, v]) => [k, medians(v)])),
    lat1kLoaded: Object.fromEntries(Object.entries(results.lat1kLoaded).map(([k, v]) => [k, medians(v)])),
    lat1k: Object.fromEntries(Object.entries(results.lat1k).map(([k, v]) => [k, medians(v)])),
    lat1kLockstep: Object.fromEntries(Object.entries(results.lat1kLockstep).map(([k, v]) => [k, medians(v)])),
    lat10k: Object.fromEntries(Object.entries(results.lat10k).map(([k, v]) => [k, medians(v)])),
    replay: Object.fromEntries(Object.entries(results.replay).map(([k, v]) => [k, medians(v)])),
    replayFirst: Object.fromEntries(Object.entries(results.replayFirst).map(([k, v]) => [k, medians(v)])),
    // The worst round, not the median: a stall in one round of few is the finding.
    fair: Object.fromEntries(Object.entries(results.fair).map(([k, v]) => [k, worstFair(v)])),
    // The round of median RSS per stream (one round: that one).
    idle: Object.fromEntries(Object.entries(results.idle).map(([k, v]) => [k, [...v].sort((a, b) => a.kbPerStream - b.kbPerStream)[Math.floor((v.length - 1) / 2)]])),
    idleNote: results.idleNote,
    labelB: args['label-b'],
    redisConnectionsAtRest: results.redisConnectionsAtRest
  }
  const report = {
    name: reportName,
    date: new Date().toISOString(),
    quick: QUICK,
    durationSeconds: Math.round((Date.now() - t0) / 1000),
    machine: { ...machine(), redis: redisVer },
    config: { ...CFG, nice, paths: pathIds, scenarios, redisUrl: redisUrl.replace(/\/\/[^@]*@/, '//***@'), keyPrefix, latencyClock: 'CLOCK_MONOTONIC (process.hrtime), shared by all processes' },
    summary,
    targets: evaluate(summary),
    rounds: results,
    errors
  }
  const files = await writeReports(report, outDir, reportName, log)
  log(`wrote ${files.join(', ')}`)
  if (errors.length > 0) exitCode ||= 1
  process.exit(exitCode)
}
