#!/usr/bin/env node
// Import cycles between the folders of src/ (madge --circular finds those
// between files): each folder is one node, each file at the top of src/ its
// own. Exits 1, naming the folders, when one imports another that imports it
// back, directly or through others.
import madge from 'madge'

const graph = (await madge('src', { fileExtensions: ['ts'], tsConfig: 'tsconfig.json' })).obj()
const nodeOf = file => file.includes('/') ? file.slice(0, file.indexOf('/')) : file
const edges = new Map()
for (const [from, targets] of Object.entries(graph)) {
  for (const to of targets) {
    const [a, b] = [nodeOf(from), nodeOf(to)]
    if (a === b) continue
    if (!edges.has(a)) edges.set(a, new Set())
    edges.get(a).add(b)
  }
}

// Strongly connected components (Tarjan): any with more than one node is a cycle.
const index = new Map()
const low = new Map()
const stack = []
const cycles = []
const visit = node => {
  index.set(node, index.size)
  low.set(node, index.get(node))
  stack.push(node)
  for (const next of edges.get(node) ?? []) {
    if (!index.has(next)) {
      visit(next)
      low.set(node, Math.min(low.get(node), low.get(next)))
    } else if (stack.includes(next)) {
      low.set(node, Math.min(low.get(node), index.get(next)))
    }
  }
  if (low.get(node) !== index.get(node)) return
  const component = []
  let member
  do {
    member = stack.pop()
    component.push(member)
  } while (member !== node)
  if (component.length > 1) cycles.push(component.sort())
}
for (const node of edges.keys()) if (!index.has(node)) visit(node)

if (cycles.length > 0) {
  for (const cycle of cycles) process.stderr.write(`folders importing each other: ${cycle.join(' <-> ')}\n`)
  process.exit(1)
}
process.stdout.write(`no import cycle between the folders of src/ (${edges.size} with imports)\n`)
