#!/usr/bin/env node
// Gateway CPU per replay: a resume 10,000 events behind, as in the replay
// scenario of bench/run.mjs, with the gateway's own CPU time over the resume
// (from /proc), which a loaded machine disturbs far less than wall time.
//
//   node bench/replay-cpu.mjs [--rounds=10] [--store=memory|redis|both]
//                             [--gateway=dist/src/main.js] [--gateway-b=<another build>]
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from './lib/args.mjs'
import { callTool, deleteSession, initialize, jsonAgent, nowMs, openStream } from './lib/client.mjs'
import { startGateway } from './lib/gateway.mjs'
import { cpuSeconds, start, stopAll } from './lib/procs.mjs'
import { connectRedis, deletePrefix } from './lib/redis.mjs'
import { collectGarbage, waitCpuQuiet } from './lib/scenarios.mjs'
import { median } from './lib/stats.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const args = parseArgs(['rounds', 'store', 'gateway', 'gateway-b', 'events'], import.meta.url)
const rounds = Number(args.rounds ?? 10)
const events = Number(args.events ?? 10_000)
const stores = args.store === undefined || args.store === 'both' ? ['memory', 'redis'] : [args.store]
const builds = [['a', resolve(root, args.gateway ?? 'dist/src/main.js')]]
if (args['gateway-b'] !== undefined) builds.push(['b', resolve(root, args['gateway-b'])])
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'

async function round (path) {
  const agent = jsonAgent()
  const sessionId = await initialize(path.port, agent)
  try {
    const post = await callTool(path.port, sessionId, { count: events })
    await post.finished()
    await waitCpuQuiet(path.pid, 2000)
    collectGarbage()
    const cpu0 = cpuSeconds(path.pid)
    const t0 = nowMs()
    const resume = await openStream(path.port, sessionId, { lastEventId: post.firstId, mode: 'replay' })
    await resume.finished()
    const replayed = resume.events + resume.results
    if (replayed !== events) throw new Error(`replayed ${replayed} of ${events}`)
    return { cpuMs: (cpuSeconds(path.pid) - cpu0) * 1000, evs: replayed / ((resume.lastByteAt - t0) / 1000), firstByteMs: resume.firstByteAt - t0 }
  } finally {
    await deleteSession(path.port, sessionId, agent).catch(() => 0)
    agent.destroy()
  }
}

const redis = stores.includes('redis') ? await connectRedis(redisUrl) : undefined
const prefix = `mcpgw-bench-cpu-${Date.now().toString(36)}:`
try {
  const upstream = start('upstream', process.execPath, [join(here, 'lib/upstream.mjs')], { readyLine: true, env: { PORT: '0' } })
  const upstreamPort = (await upstream.ready).port
  const paths = []
  for (const store of stores) {
    for (const [label, main] of builds) {
      const gw = await startGateway({ name: `gw-${store}-${label}`, main, upstreamPort, ...(store === 'redis' ? { redisUrl, keyPrefix: `${prefix}${label}:` } : {}) })
      paths.push({ id: `${store}-${label}`, port: gw.port, pid: gw.pid, results: [] })
    }
  }
  for (const p of paths) await round(p) // warm-up
  for (let i = 0; i < rounds; i++) for (const p of paths) p.results.push(await round(p))
  process.stdout.write(`node ${process.version}, ${rounds} rounds, ${events} events, load ${(await import('node:os')).loadavg()[0].toFixed(1)}\n`)
  for (const p of paths) {
    const m = k => median(p.results.map(r => r[k]))
    // CPU time is counted in clock ticks (10 ms): the mean over the rounds, not their median.
    const cpuMs = p.results.reduce((sum, r) => sum + r.cpuMs, 0) / p.results.length
    process.stdout.write(`${p.id.padEnd(10)} CPU ${cpuMs.toFixed(1)} ms per replay (mean), ${Math.round(m('evs'))} ev/s, first byte ${m('firstByteMs').toFixed(2)} ms\n`)
  }
} finally {
  await stopAll()
  if (redis !== undefined) await deletePrefix(redis, prefix).catch(() => {})
  redis?.disconnect()
}
