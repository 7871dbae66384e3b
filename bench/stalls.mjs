#!/usr/bin/env node
// The shape of a latency tail: one long stall or many short ones, every
// session at once (the machine, or a pause of the whole proxy) or one.
//
//   BENCH_RAW_DIR=/tmp/raw node bench/run.mjs --only=lat1k ...
//   node bench/stalls.mjs --dir=/tmp/raw [--over=3]
//
// Reads the per-event dumps of the latency rounds (`session sentAtMs
// latencyMs` lines) and, per round: the p99, the events at least `--over` ms
// late, grouped into stalls (late events sent less than 30 ms apart), how
// many of the round's sessions each stall reached, and the median time
// between stalls that reached them all: a steady period points at something
// periodic (a timer, or a kernel thread such as DAMON's kdamond).
import { readFileSync, readdirSync } from 'node:fs'
import { join } from 'node:path'
import { parseArgs } from './lib/args.mjs'
import { median } from './lib/stats.mjs'

const args = parseArgs(['dir', 'over'], import.meta.url)
const dir = args.dir
if (typeof dir !== 'string') {
  process.stderr.write('usage: node bench/stalls.mjs --dir=<BENCH_RAW_DIR> [--over=3]\n')
  process.exit(2)
}
const over = Number(args.over ?? 3)
const GAP_MS = 30

for (const file of readdirSync(dir).filter(f => f.endsWith('.txt')).sort()) {
  const rows = readFileSync(join(dir, file), 'utf8').trim().split('\n').map(line => line.split(' ').map(Number))
  rows.sort((a, b) => a[1] - b[1])
  const sessions = new Set(rows.map(r => r[0])).size
  const latencies = Float64Array.from(rows, r => r[2]).sort()
  const p99 = latencies[Math.max(0, Math.ceil(0.99 * latencies.length) - 1)]
  const stalls = []
  for (const row of rows) {
    if (row[2] < over) continue
    const last = stalls.at(-1)
    if (last !== undefined && row[1] - last.lastSent < GAP_MS) {
      last.events++
      last.sessions.add(row[0])
      last.lastSent = row[1]
      last.max = Math.max(last.max, row[2])
    } else {
      stalls.push({ at: row[1], lastSent: row[1], events: 1, sessions: new Set([row[0]]), max: row[2] })
    }
  }
  const whole = stalls.filter(s => s.sessions.size === sessions)
  const period = median(whole.slice(1).map((s, i) => s.at - whole[i].at))
  const late = stalls.reduce((n, s) => n + s.events, 0)
  process.stdout.write(`${file}: ${rows.length} events, p99 ${p99.toFixed(2)} ms; ${late} at least ${over} ms late in ${stalls.length} stalls, ` +
    `${whole.length} of them reaching all ${sessions} sessions (${whole.reduce((n, s) => n + s.events, 0)} events)` +
    `${Number.isFinite(period) ? `, median ${period.toFixed(0)} ms apart` : ''}\n`)
  const t0 = rows[0][1]
  process.stdout.write(`  ${stalls.map(s => `@${(s.at - t0).toFixed(0)} ${s.events}ev/${s.sessions.size}s max ${s.max.toFixed(1)}`).join('; ')}\n`)
}
