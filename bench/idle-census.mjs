#!/usr/bin/env node
// Where the memory of an idle stream goes: a heap census of the gateway
// holding N idle standalone streams (what bench/run.mjs's idle scenario
// measures as RSS per stream).
//
//   node bench/idle-census.mjs [--store=memory|redis] [--streams=2000] [--gateway=dist/src/main.js]
//                              [--by-owner] [--closures] [--top=40]
//
// Starts the bench upstream and the gateway (with a preload that writes a heap
// snapshot on SIGWINCH), opens 100 streams (warm-up), takes a snapshot, opens
// N more, takes another, and prints the heap growth per stream by object kind
// (V8 type, or constructor name for objects and closures). Snapshots go to a
// temp dir and are deleted at the end.
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import os from 'node:os'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { setTimeout as sleep } from 'node:timers/promises'
import { start, stopAll } from './lib/procs.mjs'
import { startGateway } from './lib/gateway.mjs'
import { initialize, jsonAgent, openStream } from './lib/client.mjs'
import { deletePrefix, connectRedis } from './lib/redis.mjs'
import { parseArgs } from './lib/args.mjs'

const here = dirname(fileURLToPath(import.meta.url))
const root = resolve(here, '..')
const args = parseArgs(['store', 'streams', 'gateway', 'by-owner', 'closures', 'top'], import.meta.url)
const byOwner = args['by-owner'] !== undefined
// --closures: closures told apart by where they were made (script id, line and column)
// and the variables of their context, which names an anonymous one.
const byClosure = args.closures !== undefined
const store = args.store ?? 'memory'
const N = Number(args.streams ?? 2000)
const redisUrl = process.env.BENCH_REDIS_URL ?? 'redis://127.0.0.1:6379'
const keyPrefix = `mcpgw-bench-census-${Date.now().toString(36)}:`
const dir = mkdtempSync(join(os.tmpdir(), 'mcpgw-census-'))
const preload = join(dir, 'snapshot-on-sigwinch.mjs')
writeFileSync(preload, [
  "import v8 from 'node:v8'",
  "process.on('SIGWINCH', () => { v8.writeHeapSnapshot(process.env.CENSUS_DIR + '/h-' + Date.now() + '.heapsnapshot') })",
  ''
].join('\n'))

process.on('SIGINT', () => { stopAll().finally(() => process.exit(130)) })

const upstream = start('upstream', process.execPath, [join(here, 'lib/upstream.mjs')], { readyLine: true, env: { PORT: '0' } })
const upstreamPort = (await upstream.ready).port
const gw = await startGateway({
  name: `gw-${store}`,
  main: resolve(root, args.gateway ?? 'dist/src/main.js'),
  upstreamPort,
  nodeArgs: [`--import=${preload}`],
  env: { CENSUS_DIR: dir },
  ...(store === 'redis' ? { redisUrl, keyPrefix } : {})
})
const agent = jsonAgent()
const held = []

async function open (n) {
  for (let i = 0; i < n; i++) {
    const id = await initialize(gw.port, agent)
    held.push(openStream(gw.port, id, { timeoutMs: 600_000 }).catch(e => e))
  }
  await sleep(2000)
}

/** Self size and count by kind, from a fresh heap snapshot (writing one runs a full GC first). */
async function census () {
  const before = readdirSync(dir).filter(f => f.endsWith('.heapsnapshot')).length
  process.kill(gw.pid, 'SIGWINCH')
  let file
  for (let i = 0; i < 120 && file === undefined; i++) {
    await sleep(500)
    const files = readdirSync(dir).filter(f => f.endsWith('.heapsnapshot')).sort()
    if (files.length > before) file = files.at(-1)
  }
  if (file === undefined) throw new Error('no heap snapshot was written')
  // The file appears as soon as writing starts: wait until it parses (a large heap takes a while).
  let snap
  for (let i = 0; snap === undefined; i++) {
    await sleep(1000)
    try {
      snap = JSON.parse(readFileSync(join(dir, file), 'utf8'))
    } catch (err) {
      if (i >= 120) throw err
    }
  }
  rmSync(join(dir, file))
  const meta = snap.snapshot.meta
  const width = meta.node_fields.length
  const types = meta.node_types[0]
  const iType = meta.node_fields.indexOf('type')
  const iName = meta.node_fields.indexOf('name')
  const iSize = meta.node_fields.indexOf('self_size')
  const where = byClosure ? closureSites(snap) : undefined
  const kindOf = (i) => {
    const type = types[snap.nodes[i + iType]]
    const kind = type === 'object' || type === 'closure' ? `${type} ${snap.strings[snap.nodes[i + iName]] || '(anonymous)'}` : `(${type})`
    return type === 'closure' && where !== undefined ? `${kind} ${where.get(i) ?? ''}` : kind
  }
  // --by-owner: internal arrays, closures, contexts and plain objects are told
  // apart by what holds them (the first strong reference found).
  const owner = byOwner ? ownersOf(snap) : undefined
  const kinds = new Map()
  for (let i = 0; i < snap.nodes.length; i += width) {
    let kind = kindOf(i)
    if (owner !== undefined && OWNED.test(kind)) {
      let o = owner[i / width]
      // A rope of concatenated strings: what holds the whole rope.
      let via = i / width
      while (o !== undefined && o >= 0 && kindOf(o * width) === '(concatenated string)') {
        via = o
        o = owner[o]
      }
      if (via !== i / width) kind += ' (rope)'
      if (o !== undefined && o >= 0) {
        kind += ` <- ${kindOf(o * width)}.${owner.edgeName[via]}`
        // A plain array or object says little by itself: name what holds it too.
        const oo = owner[o]
        if (/^object (Array|Object|Map|Set)$|^\(array\)$/.test(kindOf(o * width)) && oo !== undefined && oo >= 0) kind += ` <- ${kindOf(oo * width)}.${owner.edgeName[o]}`
      }
    }
    const entry = kinds.get(kind) ?? { count: 0, size: 0 }
    entry.count++
    entry.size += snap.nodes[i + iSize]
    kinds.set(kind, entry)
  }
  return kinds
}

/** Where a heap snapshot keeps what: the widths of its node and edge records and the offsets of their fields. */
function fieldsOf (snap) {
  const meta = snap.snapshot.meta
  const width = meta.node_fields.length
  const edgeWidth = meta.edge_fields.length
  const iEdges = meta.node_fields.indexOf('edge_count')
  const eType = meta.edge_fields.indexOf('type')
  const eName = meta.edge_fields.indexOf('name_or_index')
  const eTo = meta.edge_fields.indexOf('to_node')
  const edgeTypes = meta.edge_types[0]
  return { meta, width, edgeWidth, iEdges, eType, eName, eTo, edgeTypes }
}

/** For each closure (by node offset): where it was made and the variables its context holds. */
function closureSites (snap) {
  const { meta, width, edgeWidth, iEdges, eType, eName, eTo, edgeTypes } = fieldsOf(snap)
  const firstEdge = []
  for (let n = 0, e = 0; n < snap.nodes.length; n += width) {
    firstEdge.push(e)
    e += snap.nodes[n + iEdges] * edgeWidth
  }
  const edgesOf = function * (offset) {
    const start = firstEdge[offset / width]
    for (let k = 0, e = start; k < snap.nodes[offset + iEdges]; k++, e += edgeWidth) yield { type: edgeTypes[snap.edges[e + eType]], name: snap.edges[e + eName], to: snap.edges[e + eTo] }
  }
  const sites = new Map()
  const loc = snap.locations ?? []
  const locWidth = meta.location_fields?.length ?? 4
  for (let i = 0; i < loc.length; i += locWidth) sites.set(loc[i], `@${loc[i + 1]}:${loc[i + 2] + 1}:${loc[i + 3] + 1}`)
  for (const [offset, site] of sites) {
    const context = [...edgesOf(offset)].find(e => e.type === 'internal' && snap.strings[e.name] === 'context')
    const vars = context === undefined ? [] : [...edgesOf(context.to)].filter(e => e.type === 'context').map(e => snap.strings[e.name])
    sites.set(offset, `${site} {${vars.slice(0, 6).join(',')}}`)
  }
  return sites
}

/** Kinds worth telling apart by owner. */
const OWNED = /^\((array|hidden|concatenated string|string|object shape)\)$|^object (Object|Array|Map|Set|system \/ Context)$|^closure /

/** For each node, the index of one node holding it by a strong edge (-1 if none), and that edge's name. */
function ownersOf (snap) {
  const { width, edgeWidth, iEdges, eType, eName, eTo, edgeTypes } = fieldsOf(snap)
  const count = snap.nodes.length / width
  const owner = new Int32Array(count).fill(-1)
  owner.edgeName = new Array(count)
  let e = 0
  for (let n = 0; n < count; n++) {
    const edges = snap.nodes[n * width + iEdges]
    for (let k = 0; k < edges; k++, e += edgeWidth) {
      const type = edgeTypes[snap.edges[e + eType]]
      if (type === 'weak' || type === 'shortcut') continue
      const to = snap.edges[e + eTo] / width
      if (owner[to] !== -1) continue
      owner[to] = n
      const name = snap.edges[e + eName]
      owner.edgeName[to] = type === 'element' || type === 'hidden' ? `[${type}]` : String(snap.strings[name])
    }
  }
  return owner
}

try {
  await open(100)
  const a = await census()
  await open(N)
  const b = await census()
  const rows = [...b].map(([kind, e]) => {
    const p = a.get(kind) ?? { count: 0, size: 0 }
    return { kind, bytes: (e.size - p.size) / N, count: (e.count - p.count) / N }
  }).sort((x, y) => y.bytes - x.bytes)
  const heap = rows.reduce((sum, r) => sum + r.bytes, 0)
  // (RSS is left out: writing a snapshot grows the process by far more than the streams do.)
  console.log(`gateway (${store} store), ${N} idle streams: live heap +${(heap / 1024).toFixed(1)} KB per stream`)
  console.log('\n  bytes  count  kind (per stream)')
  for (const r of rows.slice(0, Number(args.top ?? 40))) console.log(`${r.bytes.toFixed(0).padStart(7)} ${r.count.toFixed(2).padStart(6)}  ${r.kind.slice(0, 90)}`)
} finally {
  for (const s of await Promise.allSettled(held)) if (s.status === 'fulfilled' && typeof s.value?.close === 'function') s.value.close()
  await stopAll()
  if (store === 'redis') {
    const redis = await connectRedis(redisUrl)
    await deletePrefix(redis, keyPrefix)
    redis.disconnect()
  }
  rmSync(dir, { recursive: true, force: true })
}
process.exit(0)
