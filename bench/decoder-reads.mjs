#!/usr/bin/env node
// CPU the SSE decoder spends on one large upstream event, by read size: the
// same bytes in one write and in small reads (a slow or hostile upstream).
// A decoder that re-copies what it holds on every read grows with the square
// of the event's size; one that keeps its reads in a list stays linear.
//
//   npm run build && node bench/decoder-reads.mjs [--bytes=4100000] [--reads=1000,16384] [--lines=1]
//   node bench/decoder-reads.mjs --module=/path/to/other/dist/src/sse/decoder.js   (another build)
//
// --lines: the event's data split over this many `data:` lines (1: one JSON line).
// Prints, per read size: reads, CPU ms (user+system) and wall ms to decode the event.
import { resolve } from 'node:path'
import { pathToFileURL, fileURLToPath } from 'node:url'
import { parseArgs } from './lib/args.mjs'

const args = parseArgs(['bytes', 'reads', 'lines', 'module'], import.meta.url)
const bytes = Number(args.bytes ?? 4_100_000)
const readSizes = String(args.reads ?? '1000,16384').split(',').map(Number)
const lines = Number(args.lines ?? 1)
const modulePath = typeof args.module === 'string' ? resolve(args.module) : fileURLToPath(new URL('../dist/src/sse/decoder.js', import.meta.url))
const { SseDecoder } = await import(pathToFileURL(modulePath).href)

function eventBytes () {
  const perLine = Math.max(1, Math.floor(bytes / lines) - 7)
  const body = Array.from({ length: lines }, (_, i) => `data: ${String.fromCharCode(97 + (i % 26)).repeat(perLine)}\n`).join('')
  return Buffer.from(`id: 1\nevent: message\n${body}\n`)
}

function decode (event, readSize) {
  const decoder = new SseDecoder(event.length + 1024)
  const cpu = process.cpuUsage()
  const started = performance.now()
  let events = 0
  let reads = 0
  for (let at = 0; at < event.length; at += readSize) {
    events += decoder.push(event.subarray(at, Math.min(at + readSize, event.length))).length
    reads++
  }
  const wallMs = performance.now() - started
  const used = process.cpuUsage(cpu)
  if (events !== 1) throw new Error(`decoded ${events} events, expected 1`)
  return { reads, cpuMs: (used.user + used.system) / 1000, wallMs }
}

const event = eventBytes()
process.stdout.write(`event: ${event.length} bytes, ${lines} data line(s); decoder: ${modulePath}\n`)
for (const readSize of [event.length, ...readSizes]) {
  const { reads, cpuMs, wallMs } = decode(event, readSize)
  process.stdout.write(`reads of ${String(readSize).padStart(8)} bytes: ${String(reads).padStart(6)} reads, ${cpuMs.toFixed(0).padStart(7)} ms CPU, ${wallMs.toFixed(0).padStart(7)} ms wall\n`)
}
