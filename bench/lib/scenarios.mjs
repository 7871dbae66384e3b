// The measured scenarios. Each function measures ONE path once (one round);
// run.mjs interleaves paths and rounds and takes medians.
//
// A path is { id, port, pid, adminPort? }: the client talks to `port`, `pid`
// is the process whose CPU/RSS is read (the proxy; the upstream for 'direct').
import { execFile } from 'node:child_process'
import { mkdirSync, writeFileSync } from 'node:fs'
import { promisify } from 'node:util'
import { fileURLToPath } from 'node:url'
import { join } from 'node:path'
import os from 'node:os'
import { setTimeout as sleep } from 'node:timers/promises'
import v8 from 'node:v8'
import vm from 'node:vm'
import { FollowedStream, callTool, deleteSession, initialize, jsonAgent, nowMs, openStream, request } from './client.mjs'
import { gatewayMetrics } from './gateway.mjs'
import { commandStats, diffStats, redisCpuSeconds } from './redis.mjs'
import { cpuSeconds, rssKb, connectionsTo, fdCount, machineJiffies, minorFaults } from './procs.mjs'
import { mapLimit, mapSettled, summarize } from './stats.mjs'

v8.setFlagsFromString('--expose-gc')
/** A full collection in this (the benchmark's) process. */
export const collectGarbage = vm.runInNewContext('gc')

const execFileAsync = promisify(execFile)
/** Niceness of the fairness probes' process (see fairnessRound). */
const PROBE_PRIORITY = -15
const range = n => Array.from({ length: n }, (_, i) => i)
const debug = process.env.BENCH_DEBUG === '1' ? (...a) => process.stderr.write(`  [debug ${new Date().toISOString().slice(14, 23)}] ${a.join(' ')}\n`) : () => {}
const sum = (xs, f) => xs.reduce((a, x) => a + f(x), 0)
/**
 * Share of the streams a warm-up does not wait for. The benchmark's one
 * client process reads every stream, and under a flood a few of them fall
 * behind in its own socket buffers (megabytes of Recv-Q on its side while
 * the proxy's queues are empty, seen with ss): they would hold a warm-up
 * back for no reason of the proxy's.
 */
const FILL_STRAGGLERS = 0.05
/** A promise awaited later (allSettled): mark it handled now, so a early rejection is not "unhandled". */
const quiet = (p) => { p.catch(() => {}); return p }

/** Wait until the upstream holds no stream (everything of the last round is torn down). */
export async function waitUpstreamQuiet (ctx, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    const res = await request(ctx.upstreamPort, { path: '/bench/stats', agent: ctx.controlAgent })
    if (JSON.parse(res.text).streams === 0) return true
    await sleep(50)
  }
  return false
}

/** Wait until a process burns less than 5% of a core (a proxy still chewing buffered data). */
export async function waitCpuQuiet (pid, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    const a = cpuSeconds(pid)
    await sleep(100)
    if (cpuSeconds(pid) - a < 0.005) return true
  }
  return false
}

async function resetUpstream (ctx) {
  await request(ctx.upstreamPort, { method: 'POST', path: '/bench/reset', agent: ctx.controlAgent })
}

async function openSessions (path, count, agent, stream) {
  return await mapLimit(range(count), 32, () => initialize(path.port, agent, stream))
}

/** How late the upstream's paced ticker fired since the last call (see lib/upstream.mjs). */
async function tickStats (ctx) {
  const res = await request(ctx.upstreamPort, { path: '/bench/ticks', agent: ctx.controlAgent })
  return JSON.parse(res.text)
}

async function upstreamStats (ctx) {
  const res = await request(ctx.upstreamPort, { path: '/bench/stats', agent: ctx.controlAgent })
  return JSON.parse(res.text)
}

/**
 * Open every stream silent, then start them all at once (POST /bench/go on
 * the upstream) once the upstream holds every stream and every client has
 * its response head: a gateway opens a session's upstream GET at initialize,
 * so the upstream may hold every stream before the clients' own GETs are
 * served, and a GET that arrives in the middle of a flood measures how soon
 * a busy gateway answers a new request, not its throughput. A proxy that
 * holds the head of a silent stream back until its first write gets the
 * start after the deadline.
 */
async function openAndGo (ctx, path, ids, opts) {
  const streams = ids.map(id => new FollowedStream(path.port, id, { ...opts, wait: true }))
  let settled = 0
  let refused
  const heads = streams.map(s => s.open().then(() => {
    settled++
    if (s.status !== 200) refused ??= `status ${s.status}`
  }, err => {
    settled++
    refused ??= err.message
  }))
  const deadline = Date.now() + 15_000
  for (;;) {
    // `refused` is set by the head callbacks above while this loop waits.
    if (Date.now() >= deadline || refused !== undefined) break
    if (settled >= ids.length && (await upstreamStats(ctx)).waiting >= ids.length) break
    await sleep(20)
  }
  await request(ctx.upstreamPort, { method: 'POST', path: '/bench/go', agent: ctx.controlAgent })
  await Promise.all(heads)
  if (refused !== undefined) {
    for (const s of streams) s.close()
    throw new Error(`streams refused: ${refused} (${settled} settled)`)
  }
  return streams
}

async function teardown (ctx, path, sessionIds, streams, agent) {
  debug(path.id, 'teardown: closing clients')
  // Close first: an upstream stream ending is a following client's cue to resume.
  for (const s of streams) s.close()
  // Then end the upstream streams at the source, so a busy proxy stops at once.
  await request(ctx.upstreamPort, { method: 'POST', path: '/bench/stop', agent: ctx.controlAgent })
  debug(path.id, 'teardown: upstream stopped, deleting sessions')
  await mapLimit(sessionIds, 32, id => deleteSession(path.port, id, agent).catch(() => 0))
  debug(path.id, 'teardown: deleted')
  if (!await waitUpstreamQuiet(ctx)) await resetUpstream(ctx)
  agent.destroy()
  debug(path.id, 'teardown: upstream quiet')
  if (path.pid !== undefined && path.id !== 'direct') await waitCpuQuiet(path.pid)
  debug(path.id, 'teardown: proxy quiet')
}

async function snapshot (ctx, path, streams) {
  const own = process.cpuUsage()
  const snap = { t: nowMs(), events: sum(streams, s => s.events), cpu: cpuSeconds(path.pid), client: (own.user + own.system) / 1e6, machine: machineJiffies() }
  if (ctx.upstreamPid !== undefined) snap.upstream = cpuSeconds(ctx.upstreamPid)
  if (ctx.redisPid !== undefined) snap.redisFaults = minorFaults(ctx.redisPid)
  if (path.adminPort !== undefined) snap.gw = await gatewayMetrics(path.adminPort).catch(() => undefined)
  if (ctx.redis !== undefined) snap.redisCpu = await redisCpuSeconds(ctx.redis).catch(() => NaN)
  if (path.store === 'redis' && ctx.redis !== undefined) snap.redis = await commandStats(ctx.redis).catch(() => undefined)
  return snap
}

function redisCost (ctx, a, b, seconds) {
  if (a.redis === undefined || b.redis === undefined || a.gw === undefined || b.gw === undefined) return undefined
  const commands = diffStats(a.redis, b.redis)
  delete commands.info // the observer's own
  const noise = ctx.redisNoisePerSec ?? {}
  const corrected = {}
  for (const [name, calls] of Object.entries(commands)) corrected[name] = Math.max(0, calls - (noise[name] ?? 0) * seconds)
  const recorded = b.gw.eventsRecorded - a.gw.eventsRecorded
  const ops = {}
  for (const [op, n] of Object.entries(b.gw.storeOps)) {
    const d = n - (a.gw.storeOps[op] ?? 0)
    if (d > 0) ops[op] = d
  }
  const appends = ops.append
  // The recording path's round trips: appends, one each (its commands
  // pipelined; a resent one counts again), against the upstream reads they
  // carried (the gateway's own count). The rest serve clients: a stream
  // opening, or a client cut off as slow (its send buffer over
  // CLIENT_BUFFER_MAX_BYTES) that resumes and reads its way back.
  const recordingRoundTrips = ops.append ?? 0
  const upstreamReads = b.gw.upstreamReads - a.gw.upstreamReads
  const storeRoundTrips = sum(Object.values(ops), x => x)
  const allCommands = sum(Object.values(corrected), x => x)
  // Commands a client sends itself (round trips); everything else runs inside the scripts.
  const topLevel = (corrected.evalsha ?? 0) + (corrected.eval ?? 0)
  return {
    eventsRecorded: recorded,
    appends,
    eventsPerAppend: appends > 0 ? recorded / appends : NaN,
    readsPerAppend: appends > 0 ? upstreamReads / appends : NaN,
    storeOps: ops,
    upstreamReads,
    roundTripsPerUpstreamRead: upstreamReads > 0 ? recordingRoundTrips / upstreamReads : NaN,
    roundTripsPerEvent: recorded > 0 ? storeRoundTrips / recorded : NaN,
    deliveryRoundTrips: storeRoundTrips - recordingRoundTrips,
    evalshaPerEvent: recorded > 0 ? topLevel / recorded : NaN,
    commandsPerEvent: recorded > 0 ? allCommands / recorded : NaN,
    commandsRaw: commands,
    commandsCorrected: corrected
  }
}

/** Events/s end to end, `sessions` concurrent standalone streams, upstream as fast as the socket takes them. */
export async function throughputRound (ctx, path, sessions, { warmupMs, windowMs, fillEvents = 0, fillCapMs = 0 }) {
  const agent = jsonAgent()
  const ids = await openSessions(path, sessions, agent, { rate: 0, wait: true })
  let streams = []
  try {
    debug(path.id, 'sessions open')
    streams = await openAndGo(ctx, path, ids, { rate: 0 })
    debug(path.id, 'streams open and started')
    const started = nowMs()
    await sleep(warmupMs)
    const filled = await untilFilled(streams, fillEvents, started + fillCapMs)
    const warmedMs = nowMs() - started
    const a = await snapshot(ctx, path, streams)
    await sleep(windowMs)
    const b = await snapshot(ctx, path, streams)
    const seconds = (b.t - a.t) / 1000
    const events = b.events - a.events
    const out = {
      eventsPerSec: events / seconds,
      cpuPct: (b.cpu - a.cpu) / seconds * 100,
      cpuUsPerEvent: events > 0 ? (b.cpu - a.cpu) * 1e6 / events : NaN,
      closedEarly: streams.filter(s => s.ended && s.endedAt <= b.t).length,
      reconnects: sum(streams, s => s.reconnects),
      clientCpuPct: (b.client - a.client) / seconds * 100,
      clientCpuUsPerEvent: events > 0 ? (b.client - a.client) * 1e6 / events : NaN,
      upstreamCpuUsPerEvent: events > 0 && a.upstream !== undefined ? (b.upstream - a.upstream) * 1e6 / events : NaN,
      machineBusyPct: (b.machine.busy - a.machine.busy) / (b.machine.total - a.machine.total) * 100,
      redisCpuPct: (b.redisCpu - a.redisCpu) / seconds * 100,
      warmedMs,
      filled: filled ? 1 : 0
    }
    if (a.gw !== undefined && b.gw !== undefined) out.slowClientDisconnects = b.gw.slowClients - a.gw.slowClients
    const cost = redisCost(ctx, a, b, seconds)
    if (cost !== undefined) {
      cost.redisCpuUsPerEvent = events > 0 ? (b.redisCpu - a.redisCpu) * 1e6 / events : NaN
      cost.redisFaultsPerEvent = events > 0 ? (b.redisFaults - a.redisFaults) / events : NaN
      out.redis = cost
    }
    if (path.store === 'redis' && ctx.redisPort !== undefined) out.redisConnections = connectionsTo(path.pid, ctx.redisPort).length
    return out
  } finally {
    await teardown(ctx, path, ids, streams, agent)
  }
}

/**
 * Until all but FILL_STRAGGLERS of the streams still open have delivered
 * `fillEvents` (or `deadline`, a nowMs() time, passed): whether they did. A
 * store keeps a number of events per stream (RETENTION_MAX_EVENTS); until a
 * stream has passed it the store only grows, every new page of its memory a
 * first-touch fault, and from then on it trims as much as it takes, as in
 * any flood longer than a few seconds. The throughput rounds measure that
 * steady state.
 */
async function untilFilled (streams, fillEvents, deadline) {
  const open = streams.filter(s => !s.ended)
  for (;;) {
    const behind = open.filter(s => s.events < fillEvents)
    if (behind.length <= Math.floor(open.length * FILL_STRAGGLERS)) return true
    if (nowMs() >= deadline) {
      debug(`warm-up cap: ${behind.length} stream(s) behind, events ${behind.slice(0, 5).map(s => s.events).join(' ')}`)
      return false
    }
    await sleep(50)
  }
}

/**
 * One-way latency at a set aggregate rate: `sessions` streams at
 * `ratePerSession` events/s each, at spread phases (a steady rate), or with
 * `lockstep` all in phase (bursts of one event per stream).
 */
export async function latencyRound (ctx, path, sessions, ratePerSession, { warmupMs, windowMs }, { lockstep = false } = {}) {
  const agent = jsonAgent()
  const ids = await openSessions(path, sessions, agent, { rate: ratePerSession, wait: true, lockstep })
  let streams = []
  try {
    streams = await openAndGo(ctx, path, ids, { rate: ratePerSession, mode: 'latency', lockstep })
    await sleep(warmupMs)
    const a = await snapshot(ctx, { ...path, store: undefined }, [])
    await tickStats(ctx) // forget the warm-up's ticks
    for (const s of streams) s.recording = true
    const t0 = nowMs()
    await sleep(windowMs)
    for (const s of streams) s.recording = false
    const seconds = (nowMs() - t0) / 1000
    const ticks = await tickStats(ctx)
    const b = await snapshot(ctx, { ...path, store: undefined }, [])
    const proxyRssKb = rssKb(path.pid)
    const all = []
    for (const s of streams) for (const v of s.latencies) all.push(v)
    const stats = summarize(all)
    if (process.env.BENCH_RAW_DIR) dumpSamples(process.env.BENCH_RAW_DIR, `${path.id}-${Math.round(ratePerSession * sessions)}`, streams)
    return {
      ...stats,
      eventsPerSec: stats.n / seconds,
      cpuPct: (b.cpu - a.cpu) / seconds * 100,
      proxyRssKb,
      clientCpuPct: (b.client - a.client) / seconds * 100,
      machineBusyPct: (b.machine.busy - a.machine.busy) / (b.machine.total - a.machine.total) * 100,
      redisCpuPct: (b.redisCpu - a.redisCpu) / seconds * 100,
      // The upstream's 1 ms timer over the same window: how late it fired (the machine's stalls, whatever the path).
      timerLateP99: ticks.p99 ?? NaN,
      timerLateMax: ticks.max ?? NaN,
      timerLate2msPerSec: ticks.over2 / seconds,
      lost: sum(streams, s => s.lost),
      duplicated: sum(streams, s => s.duplicated),
      closedEarly: streams.filter(s => s.ended).length,
      reconnects: sum(streams, s => s.reconnects),
      gaps: sum(streams, s => s.gaps)
    }
  } finally {
    await teardown(ctx, path, ids, streams, agent)
  }
}

/**
 * BENCH_RAW_DIR=dir: every recorded event of a latency round as a line
 * `session sentAtMs latencyMs`, to study a tail's shape (one stall or many,
 * all sessions at once or one).
 */
function dumpSamples (dir, name, streams) {
  mkdirSync(dir, { recursive: true })
  const lines = []
  streams.forEach((s, i) => {
    const sent = s.sentAt
    s.latencies.forEach((v, j) => lines.push(`${i} ${sent[j].toFixed(3)} ${v.toFixed(3)}`))
  })
  writeFileSync(join(dir, `${name}-${Date.now()}.txt`), lines.join('\n') + '\n')
}

/**
 * Replay: a tool call streams `events` notifications and its result (all
 * recorded); a client then resumes from the id of the first event, so
 * `events` events (the rest of the notifications and the result) are behind.
 */
export async function replayRound (ctx, path, events) {
  const agent = jsonAgent()
  const sessionId = await initialize(path.port, agent)
  try {
    const post = await callTool(path.port, sessionId, { count: events })
    await post.finished()
    if (post.events !== events || post.results !== 1) throw new Error(`tool call delivered ${post.events} notifications and ${post.results} results, expected ${events} and 1`)
    if (post.firstId === undefined) throw new Error('no event id in the tool call answer')
    await waitCpuQuiet(path.pid, 2000)
    // This process's own garbage (the tool call's counting) collected before the clock
    // starts, not during the tens of milliseconds a replay lasts.
    collectGarbage()
    const t0 = nowMs()
    const resume = await openStream(path.port, sessionId, { lastEventId: post.firstId, mode: 'replay' })
    await resume.finished()
    const replayed = resume.events + resume.results
    const seconds = (resume.lastByteAt - t0) / 1000
    return {
      replayed,
      expected: events,
      gap: resume.headers?.['x-mcp-gateway-gap'] ?? null,
      status: resume.status,
      headersMs: resume.headersAt - t0,
      firstByteMs: resume.firstByteAt - t0,
      totalMs: resume.lastByteAt - t0,
      eventsPerSec: replayed / seconds
    }
  } finally {
    await deleteSession(path.port, sessionId, agent).catch(() => 0)
    agent.destroy()
  }
}

/**
 * Idle capacity: `count` sessions, each with its standalone GET stream held
 * open and silent, through one freshly started proxy. RSS per stream from
 * /proc/<pid>/status before and after; CPU at rest from /proc/<pid>/stat.
 */
export async function idleRun (ctx, path, count, { settleMs, cpuWindowMs, concurrency = 200, warmup = 200 }) {
  const agent = jsonAgent()
  // Warm-up (pools, JIT), then the baseline RSS.
  // Upstream streams counted from before initialize: a gateway opens each session's upstream GET then.
  const warmBase = (await upstreamStats(ctx)).streams
  const warmIds = (await mapSettled(range(warmup), 50, () => initialize(path.port, agent))).filter(o => o.ok).map(o => o.value)
  const warm = warmIds.map(id => quiet(openStream(path.port, id, { timeoutMs: 60_000 })))
  const warmDeadline = Date.now() + 20_000
  while (Date.now() < warmDeadline && (await upstreamStats(ctx)).streams < warmBase + warmIds.length) await sleep(25)
  await mapLimit(warmIds, 50, id => deleteSession(path.port, id, agent).catch(() => 0))
  for (const w of await Promise.allSettled(warm)) if (w.status === 'fulfilled') w.value.close()
  await sleep(1000)
  const redisBefore = path.store === 'redis' && ctx.redisPort !== undefined ? connectionsTo(path.pid, ctx.redisPort).length : undefined
  const rssBefore = rssKb(path.pid)
  const fdsBefore = fdCount(path.pid)
  const t0 = nowMs()
  // Sessions first, then the GETs in batches: a batch is done when the
  // upstream holds its streams (the response heads may come later: a proxy
  // can hold back the head of a silent stream until its first write).
  const base = (await upstreamStats(ctx)).streams
  const sessions = await mapSettled(range(count), concurrency, () => initialize(path.port, agent))
  const errors = {}
  const fail = (message) => { errors[message] = (errors[message] ?? 0) + 1 }
  for (const o of sessions) if (!o.ok) fail(`initialize: ${o.error.message}`)
  const ids = sessions.filter(o => o.ok).map(o => o.value)
  const heads = []
  const BATCH = 500
  for (let i = 0; i < ids.length; i += BATCH) {
    for (const id of ids.slice(i, i + BATCH)) heads.push(quiet(openStream(path.port, id, { timeoutMs: 120_000 })))
    const want = base + Math.min(ids.length, i + BATCH)
    const deadline = Date.now() + 60_000
    while (Date.now() < deadline && (await upstreamStats(ctx)).streams < want) await sleep(25)
  }
  const upstreamHeld = (await upstreamStats(ctx)).streams - base
  const openMs = nowMs() - t0
  const opened = await Promise.allSettled(heads)
  const headsMs = nowMs() - t0
  const streams = []
  for (const o of opened) {
    if (o.status === 'rejected') fail(o.reason.message)
    else if (o.value.status !== 200) { o.value.close(); fail(`status ${o.value.status}`) } else streams.push(o.value)
  }
  try {
    await sleep(settleMs)
    const rssAfter = rssKb(path.pid)
    const fdsAfter = fdCount(path.pid)
    const c0 = cpuSeconds(path.pid)
    const tc = nowMs()
    await sleep(cpuWindowMs)
    const cpuPct = (cpuSeconds(path.pid) - c0) / ((nowMs() - tc) / 1000) * 100
    const stillOpen = streams.filter(s => !s.ended).length
    const out = {
      attempted: count,
      accepted: streams.length,
      stillOpen,
      errors,
      openSeconds: openMs / 1000,
      allHeadsSeconds: headsMs / 1000,
      upstreamHeld,
      rssBeforeKb: rssBefore,
      rssAfterKb: rssAfter,
      kbPerStream: streams.length > 0 ? (rssAfter - rssBefore) / streams.length : NaN,
      fdsBefore,
      fdsAfter,
      cpuPctAtRest: cpuPct
    }
    if (redisBefore !== undefined) {
      out.redisConnectionsBefore = redisBefore
      out.redisConnectionsAfter = connectionsTo(path.pid, ctx.redisPort).length
    }
    return out
  } finally {
    for (const s of streams) s.close()
    agent.destroy()
  }
}

/**
 * Fairness under a flood: `sessions` streams flood at full speed while, one
 * after another, `probes` new clients each send initialize then GET (timed
 * until the GET's response head) and /healthz is asked (on the gateway's
 * admin listener; nginx answers its own /healthz). A proxy that does
 * unbounded work per turn of its event loop keeps them waiting for seconds.
 * The flood's events/s over the same window are counted: a round whose flood
 * delivered nothing measured an idle proxy and is refused.
 */
export async function fairnessRound (ctx, path, sessions, { warmupMs, probes, gapMs }) {
  const agent = jsonAgent()
  const ids = await openSessions(path, sessions, agent, { rate: 0, wait: true })
  let streams = []
  try {
    streams = await openAndGo(ctx, path, ids, { rate: 0 })
    await sleep(warmupMs)
    const a = await snapshot(ctx, { ...path, adminPort: undefined, store: undefined }, streams)
    // The new clients come from a process of their own: this one is busy reading the flood.
    const probe = fileURLToPath(new URL('./probe.mjs', import.meta.url))
    const running = execFileAsync(process.execPath, [probe, String(path.port), String(path.adminPort ?? path.port), String(probes), String(gapMs)], { timeout: 180_000 })
    // Ahead of the flood on the CPU (where allowed: root), as a client on a machine of
    // its own would be: its clock then times the proxy, not its own wait for a core.
    try { os.setPriority(running.child.pid, PROBE_PRIORITY) } catch {}
    const { stdout } = await running
    const { heads, health } = JSON.parse(stdout)
    const b = await snapshot(ctx, { ...path, adminPort: undefined, store: undefined }, streams)
    const seconds = (b.t - a.t) / 1000
    const eventsPerSec = (b.events - a.events) / seconds
    if (!(eventsPerSec > 0)) throw new Error(`the flood delivered ${eventsPerSec} events/s during the probes: nothing measured`)
    const h = summarize(heads)
    const z = summarize(health)
    return {
      headP50: h.p50,
      headP99: h.p99,
      headMax: h.max,
      healthP50: z.p50,
      healthP99: z.p99,
      healthMax: z.max,
      probes: heads.length,
      eventsPerSec,
      cpuPct: (b.cpu - a.cpu) / seconds * 100,
      machineBusyPct: (b.machine.busy - a.machine.busy) / (b.machine.total - a.machine.total) * 100
    }
  } finally {
    await teardown(ctx, path, ids, streams, agent)
  }
}
