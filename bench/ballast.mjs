#!/usr/bin/env node
// Does a process's latency tail on this machine depend on its resident memory
// alone, whatever work it does? The Node pass-through of the benchmark, started
// several times with different amounts of untouched resident memory (ballast:
// buffers filled once at start-up and never read again), measured side by side
// at 1,000 events/s (the lat1k scenario of bench/run.mjs), rounds alternating.
//
//   node bench/ballast.mjs [--mb=0,70,400] [--rounds=6]
//
// Same work per event, same code: only the ballast differs. A gateway holds
// 120-130 MB in those rounds where nginx holds 34 and the pass-through 55, so a
// tail that grows with resident memory is part of what "added p99" measures.
import http from 'node:http'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { start, stopAll } from './lib/procs.mjs'
import { latencyRound } from './lib/scenarios.mjs'
import { median } from './lib/stats.mjs'
import { parseArgs } from './lib/args.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const args = parseArgs(['mb', 'rounds'], import.meta.url)
const sizes = String(args.mb ?? '0,70,400').split(',').map(Number)
const rounds = Number(args.rounds ?? 6)
const SESSIONS = 10
const log = (...a) => process.stderr.write(`[ballast] ${a.join(' ')}\n`)

process.on('SIGINT', () => { stopAll().finally(() => process.exit(130)) })

const dir = mkdtempSync(join(os.tmpdir(), 'mcpgw-ballast-'))
const preload = join(dir, 'ballast.cjs')
writeFileSync(preload, [
  '// Resident memory the process never touches again.',
  'const mb = Number(process.env.BALLAST_MB || 0)',
  'globalThis.__ballast = []',
  'for (let i = 0; i < mb; i++) { const b = Buffer.allocUnsafeSlow(1 << 20); b.fill(i & 255); globalThis.__ballast.push(b) }',
  ''
].join('\n'))

try {
  const ctx = { controlAgent: new http.Agent({ keepAlive: true }) }
  const upstream = start('upstream', process.execPath, [join(here, 'lib/upstream.mjs')], { readyLine: true, env: { PORT: '0' } })
  ctx.upstreamPort = (await upstream.ready).port
  ctx.upstreamPid = upstream.pid
  const paths = []
  for (const mb of sizes) {
    const proc = start(`node-${mb}`, process.execPath, ['--require', preload, join(here, 'lib/node-proxy.mjs')], {
      readyLine: true, env: { PORT: '0', UPSTREAM_PORT: String(ctx.upstreamPort), BALLAST_MB: String(mb) }
    })
    paths.push({ id: `node-${mb}`, mb, port: (await proc.ready).port, pid: proc.pid, proc })
  }
  // Warm-up, as bench/run.mjs warms its fresh processes: one round at 10,000 events/s.
  for (const p of paths) await latencyRound(ctx, p, SESSIONS, 1000, { warmupMs: 500, windowMs: 1500 })
  const results = Object.fromEntries(paths.map(p => [p.id, []]))
  for (let r = 0; r < rounds; r++) {
    const order = paths.map((_, i) => paths[(i + r) % paths.length])
    for (const p of order) {
      const x = await latencyRound(ctx, p, SESSIONS, 1000 / SESSIONS, { warmupMs: 1000, windowMs: 4000 })
      results[p.id].push({ p99: x.p99, p50: x.p50, rssMb: x.proxyRssKb / 1024, cpuUs: x.cpuPct * 1e4 / x.eventsPerSec, lost: x.lost })
      log(`round ${r + 1}/${rounds} ${p.id}: p99 ${x.p99.toFixed(2)} ms, RSS ${(x.proxyRssKb / 1024).toFixed(0)} MB`)
    }
  }
  console.log(`Node pass-through at 1,000 events/s (${SESSIONS} sessions), medians of ${rounds} rounds, rounds alternating:`)
  console.log('ballast MB  RSS MB  p50 ms  p99 ms  CPU us/event  p99 of each round')
  for (const p of paths) {
    const rs = results[p.id]
    const m = field => median(rs.map(x => x[field]))
    console.log(`${String(p.mb).padStart(10)}  ${m('rssMb').toFixed(0).padStart(6)}  ${m('p50').toFixed(3).padStart(6)}  ${m('p99').toFixed(2).padStart(6)}  ${m('cpuUs').toFixed(0).padStart(12)}  ${rs.map(x => x.p99.toFixed(2)).join(' ')}`)
    if (rs.some(x => x.lost > 0)) console.log(`  (${p.id} lost events: ${rs.map(x => x.lost).join(' ')})`)
  }
} finally {
  await stopAll()
  rmSync(dir, { recursive: true, force: true })
}
process.exit(0)
