#!/usr/bin/env node
// Instructions the gateway executes per event, counted by valgrind's callgrind
// rather than timed: the same build, store and workload give the same count
// within a few tenths of a percent, whatever else the machine is doing, where
// CPU seconds per event move by a fifth between runs on a shared machine. For
// an A/B of a change on an event's path before (or instead of) a full
// `bench/run.mjs` run.
//
//   node bench/instructions.mjs [--store=memory|redis|both] [--sessions=1,100] [--events=100000]
//                               [--rounds=2] [--workload=get|call] [--gateway=dist/src/main.js]
//                               [--gateway-b=<other build's main.js>] [--keep]
//
// --keep: the callgrind files stay (their paths are printed), for
// `callgrind_annotate <file>`: native functions by instructions (V8's collector,
// Node's buffers, libc's copies; compiled JavaScript shows as addresses).
//
// For each store and build, each round starts the gateway afresh under
// `valgrind --tool=callgrind` (instrumentation off), warms it up with the same
// workload (V8 compiles the hot path meanwhile), switches instrumentation on
// (`callgrind_control`), runs the workload once more, and reads the count.
// Builds alternate round by round. The workloads, `events` notifications in all
// over `sessions` sessions at once, as fast as they go:
// - get (the default; what bench/run.mjs's throughput rounds measure): new
//   sessions, each with its standalone GET streaming events/sessions
//   notifications; counted from the moment all streams start (/bench/go) until
//   every client has all of its own;
// - call: the bench upstream's streaming tool (1 session: ten calls of
//   events/10; more: one call each), each call's events and result checked at
//   the client; the calls' own requests are counted too. Node runs with
// `--predictable` besides `npm start`'s flags: V8 then compiles and collects on
// the main thread, by counts rather than by measured speeds (without it, rounds
// of one build spread by a fifth). Rounds of one build agree within 1-3%; on
// Redis with one session within 8%: how the upstream's bytes split into reads,
// and so into batches, follows the timing (there, Redis's answer times).
//
// Counted: user-space instructions of the gateway process, all its threads (V8's
// compiler and collector threads included). Not counted: the kernel's share
// (socket writes are a fifth to a third of the gateway's CPU time, see
// bench/profile.mjs), waits, and anything the machine's load does to caches, so
// a lower count is a smaller cost of the gateway's own code, not a figure in
// microseconds. Nor V8's full collections: a flood run natively makes 10-12 a
// second and spends about 40% of the gateway's CPU collecting (docs/performance.md,
// Where an event's CPU goes), but under --predictable a measured window of
// 100,000 events holds one or none, by where V8's allocation counts happen to
// fall: a build that allocates a little more at start-up can have one land in its
// window and read 15% more per event, for the same hot path. So each count is
// split: the instructions of full collections (inclusive, from callgrind_annotate:
// V8's incremental marking steps and its mark-compact) are shown apart, and the
// builds are compared on the rest, which keeps young-generation collections (a
// cost per event). A change to what the gateway allocates is judged with
// bench/collections.mjs instead. Needs
// valgrind (Debian's package, installed when missing and root). The bench
// upstream and the client run natively.
import { execFileSync } from 'node:child_process'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import os from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'
import { startGateway } from './lib/gateway.mjs'
import { start, stop, stopAll } from './lib/procs.mjs'
import { connectRedis, deletePrefix } from './lib/redis.mjs'
import { FollowedStream, callTool, initialize, jsonAgent, request } from './lib/client.mjs'
import { parseArgs } from './lib/args.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const args = parseArgs(['store', 'sessions', 'events', 'rounds', 'workload', 'gateway', 'gateway-b', 'keep'], import.meta.url)
const workloadKind = args.workload ?? 'get'
if (workloadKind !== 'get' && workloadKind !== 'call') {
  process.stderr.write(`--workload=${workloadKind}: get or call\n`)
  process.exit(2)
}
const keep = args.keep !== undefined
const stores = args.store === undefined || args.store === 'both' ? ['memory', 'redis'] : [args.store]
const sessionCounts = String(args.sessions ?? '1,100').split(',').map(Number)
const events = Number(args.events ?? 100_000)
const rounds = Number(args.rounds ?? 2)
const builds = [{ id: 'A', main: resolve(root, args.gateway ?? 'dist/src/main.js') }]
if (args['gateway-b'] !== undefined) builds.push({ id: 'B', main: resolve(args['gateway-b']) })
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'
const log = (...a) => process.stderr.write(`[instructions] ${a.join(' ')}\n`)

for (const n of sessionCounts) {
  if (!Number.isSafeInteger(n) || n < 1 || events % (n === 1 ? 10 : n) !== 0) {
    process.stderr.write(`--events=${events} must split evenly over ${n === 1 ? 'ten calls' : `${n} sessions`}\n`)
    process.exit(2)
  }
}
for (const build of builds) {
  if (!existsSync(build.main)) {
    process.stderr.write(`no build at ${build.main} (npm run build in its checkout)\n`)
    process.exit(2)
  }
}
ensureValgrind()

process.on('SIGINT', () => { stopAll().finally(() => process.exit(130)) })

function ensureValgrind () {
  const found = (cmd) => { try { execFileSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }); return true } catch { return false } }
  if (found('valgrind') && found('callgrind_control')) return
  if (process.getuid?.() !== 0) {
    process.stderr.write('valgrind is not installed: apt-get install valgrind (as root)\n')
    process.exit(2)
  }
  log('installing valgrind (Debian package)')
  execFileSync('apt-get', ['install', '-y', '-q', 'valgrind'], { stdio: 'inherit' })
}

/**
 * New sessions' standalone GETs, `events` notifications in all; `around` runs
 * the flood (instrumentation on before /bench/go, the dump once every client has its share).
 */
async function getWorkload (ctx, port, n, around) {
  const agent = jsonAgent()
  const count = events / n
  const ids = []
  for (let i = 0; i < n; i++) ids.push(await initialize(port, agent, { rate: 0, count, wait: true }))
  const streams = ids.map(id => new FollowedStream(port, id, { rate: 0, count, wait: true, timeoutMs: 600_000 }))
  try {
    await Promise.all(streams.map(s => s.open()))
    for (const s of streams) if (s.status !== 200) throw new Error(`a GET was answered ${s.status}`)
    // The upstream holds every stream silent until /bench/go.
    for (let i = 0; i < 6000; i++) {
      const stats = JSON.parse((await request(ctx.upstreamPort, { path: '/bench/stats', agent: ctx.controlAgent })).text)
      if (stats.waiting >= n) break
      await sleep(50)
    }
    return await around(async () => {
      await request(ctx.upstreamPort, { method: 'POST', path: '/bench/go', agent: ctx.controlAgent })
      while (streams.some(s => s.events < count)) {
        const over = streams.find(s => s.ended && s.events < count)
        if (over !== undefined) throw new Error(`a stream ended after ${over.events} of ${count} events`)
        await sleep(20)
      }
      const delivered = streams.reduce((sum, s) => sum + s.events, 0)
      if (delivered !== events) throw new Error(`delivered ${delivered} of ${events} events`)
      return delivered
    })
  } finally {
    for (const s of streams) s.close()
    agent.destroy()
  }
}

/** Ten calls of events/10 for one session, one call each for several: `events` in all. */
async function callWorkload (port, ids) {
  const calls = ids.length === 1 ? 10 : 1
  const count = events / ids.length / calls
  let delivered = 0
  for (let c = 0; c < calls; c++) {
    const streams = await Promise.all(ids.map(id => callTool(port, id, { count, timeoutMs: 600_000 })))
    await Promise.all(streams.map(s => s.finished()))
    for (const s of streams) {
      if (s.status !== 200 || s.events !== count || s.results !== 1) {
        throw new Error(`a call delivered ${s.events} of ${count} events and ${s.results} results (status ${s.status})`)
      }
      delivered += s.events
    }
  }
  return delivered
}

/**
 * valgrind and callgrind_control name their rendezvous after the user and host
 * in their environments (LOGNAME, HOST): the same for both, whatever the shell
 * exports. HOST is the gateway's own setting too, which startGateway sets to this.
 */
const VGDB_NAMES = { LOGNAME: 'mcpgw-bench', HOST: '127.0.0.1' }

/** Tell the gateway's callgrind `cmd` (instrumentation on or off, or a dump of the counts since the last). */
function control (dir, pid, ...cmd) {
  const said = execFileSync('callgrind_control', [`--vgdb-prefix=${join(dir, 'vgdb')}`, ...cmd, String(pid)],
    { encoding: 'utf8', timeout: 120_000, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...VGDB_NAMES } })
  if (!/\bOK\b/.test(said)) throw new Error(`callgrind_control ${cmd.join(' ')}: ${said.trim()}`)
}

/**
 * The functions whose inclusive counts make up V8's full collections: marking
 * steps (incremental, run on the main thread under --predictable) and the
 * mark-compact that ends them. Neither calls the other.
 */
const FULL_COLLECTION_FUNCTIONS = ['v8::internal::IncrementalMarking::Step(', 'v8::internal::Heap::MarkCompact()']

/** All instructions of a dump, and those of V8's full collections within them. */
async function countsOfDump (dir, pid, index) {
  const file = join(dir, `cg.${pid}.${index}`)
  for (let i = 0; i < 600 && !existsSync(file); i++) await sleep(100)
  const text = readFileSync(file, 'utf8')
  const m = /^totals:\s+(\d+)/m.exec(text) ?? /^summary:\s+(\d+)/m.exec(text)
  if (m === null) throw new Error(`no totals in ${file}`)
  const annotated = execFileSync('callgrind_annotate', ['--inclusive=yes', '--threshold=100', file], { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 })
  let full = 0
  for (const line of annotated.split('\n')) {
    if (!FULL_COLLECTION_FUNCTIONS.some(name => line.includes(name))) continue
    const count = /^\s*([\d,]+)\s/.exec(line)
    if (count !== null) full += Number(count[1].replaceAll(',', ''))
  }
  return { total: Number(m[1]), full }
}

async function measure (build, store, ctx, redis) {
  const upstreamPort = ctx.upstreamPort
  const dir = mkdtempSync(join(os.tmpdir(), 'mcpgw-instr-'))
  const keyPrefix = `mcpgw-bench-instr-${Date.now().toString(36)}:`
  const gw = await startGateway({
    name: `gw-${store}-${build.id}`,
    main: build.main,
    upstreamPort,
    launcher: ['valgrind', '--tool=callgrind', '--instr-atstart=no', '--smc-check=all-non-file', `--callgrind-out-file=${join(dir, 'cg.%p')}`,
      `--vgdb-prefix=${join(dir, 'vgdb')}`],
    env: { LOGNAME: VGDB_NAMES.LOGNAME },
    // V8 without its timing-driven choices (concurrent compilation and collection, heuristics by
    // measured speed): without it, runs of one build differed by a fifth.
    nodeArgs: ['--predictable'],
    readyTimeoutMs: 300_000,
    ...(store === 'redis' ? { redisUrl, keyPrefix } : {})
  }).catch((err) => {
    rmSync(dir, { recursive: true, force: true })
    throw err
  })
  const out = {}
  try {
    let dumps = 0
    for (const n of sessionCounts) {
      const counted = async (run) => {
        control(dir, gw.pid, '-i', 'on')
        const delivered = await run()
        control(dir, gw.pid, '-d')
        control(dir, gw.pid, '-i', 'off')
        return delivered
      }
      let delivered
      if (workloadKind === 'get') {
        await getWorkload(ctx, gw.port, n, async (run) => await run())
        delivered = await getWorkload(ctx, gw.port, n, counted)
      } else {
        const agent = jsonAgent()
        const ids = []
        for (let i = 0; i < n; i++) ids.push(await initialize(gw.port, agent))
        await callWorkload(gw.port, ids)
        delivered = await counted(async () => await callWorkload(gw.port, ids))
        agent.destroy()
      }
      const { total, full } = await countsOfDump(dir, gw.pid, ++dumps)
      out[n] = { perEvent: (total - full) / delivered, fullPerEvent: full / delivered }
    }
  } finally {
    await stop(gw.proc, 60_000)
    if (redis !== undefined) await deletePrefix(redis, keyPrefix).catch(() => {})
    if (keep) log(`callgrind files kept in ${dir}`)
    else rmSync(dir, { recursive: true, force: true })
  }
  return out
}

const results = {}
let redis
const ctx = { upstreamPort: 0, controlAgent: jsonAgent() }
try {
  if (stores.includes('redis')) redis = await connectRedis(redisUrl)
  const upstream = start('upstream', process.execPath, [join(here, 'lib/upstream.mjs')], { readyLine: true, env: { PORT: '0' } })
  ctx.upstreamPort = (await upstream.ready).port
  for (const store of stores) {
    for (let r = 0; r < rounds; r++) {
      for (const build of r % 2 === 0 ? builds : [...builds].reverse()) {
        const counts = await measure(build, store, ctx, store === 'redis' ? redis : undefined)
        for (const [n, count] of Object.entries(counts)) {
          ((results[store] ??= {})[n] ??= {})[build.id] ??= []
          results[store][n][build.id].push(count)
          log(`${store}, ${n} session(s), build ${build.id}, round ${r + 1}: ${Math.round(count.perEvent)} instructions per event, and ${Math.round(count.fullPerEvent)} in full collections`)
        }
      }
    }
  }
} finally {
  await stopAll()
  redis?.disconnect()
  ctx.controlAgent.destroy()
}

const lines = [`Gateway instructions per event (callgrind, workload ${workloadKind}, ${events} events per measurement, ${rounds} fresh process(es) per build; Node ${process.version}),`,
  'outside V8\'s full collections; in brackets, those of the full collections that fell in the window (by chance: see the script\'s header)']
for (const build of builds) lines.push(`  build ${build.id}: ${build.main}`)
lines.push('', '| store | sessions | ' + builds.map(b => `build ${b.id}, by round`).join(' | ') + (builds.length > 1 ? ' | B / A (medians) |' : ' |'))
lines.push('|---|---|' + builds.map(() => '---|').join('') + (builds.length > 1 ? '---|' : ''))
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s.length % 2 === 1 ? s[s.length >> 1] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2 }
for (const [store, byN] of Object.entries(results)) {
  for (const [n, byBuild] of Object.entries(byN)) {
    const figure = (x) => Math.round(x).toLocaleString('en-US')
    const cells = builds.map(b => byBuild[b.id].map(c => c.fullPerEvent >= 0.5 ? `${figure(c.perEvent)} (+${figure(c.fullPerEvent)})` : figure(c.perEvent)).join(', '))
    const medianOf = (id) => median(byBuild[id].map(c => c.perEvent))
    const ratio = builds.length > 1 ? ` | ${(medianOf('B') / medianOf('A')).toFixed(3)}` : ''
    lines.push(`| ${store} | ${n} | ${cells.join(' | ')}${ratio} |`)
  }
}
process.stdout.write(lines.join('\n') + '\n')
