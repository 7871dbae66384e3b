#!/usr/bin/env node
// Re-render the reports (table, Markdown, chart) of a saved run, e.g. after a
// change to bench/lib/report.mjs:  node bench/render.mjs bench/results/latest.json
import { readFileSync } from 'node:fs'
import { basename, dirname, resolve } from 'node:path'
import { evaluate, writeReports } from './lib/report.mjs'

const file = resolve(process.argv[2] ?? 'bench/results/latest.json')
const report = JSON.parse(readFileSync(file, 'utf8'))
report.targets = evaluate(report.summary)
const files = await writeReports(report, dirname(file), basename(file, '.json'), (...a) => process.stderr.write(a.join(' ') + '\n'))
process.stderr.write(`wrote ${files.join(', ')}\n`)
