// Summary of a V8 .cpuprofile: self time by package/file and function, inclusive time of the gateway's functions.

/** Where a frame comes from: the gateway's own file, a package, or Node itself. */
function origin (url) {
  if (url === '') return '(native/V8)'
  if (url.startsWith('node:')) return url
  const nm = url.lastIndexOf('/node_modules/')
  if (nm !== -1) {
    const rest = url.slice(nm + 14).split('/')
    return rest[0].startsWith('@') ? `${rest[0]}/${rest[1]}` : rest[0]
  }
  const src = url.indexOf('/dist/src/')
  if (src !== -1) return `gateway:${url.slice(src + 10)}`
  return url.replace(/^file:\/\//, '')
}

export function analyze (profile, top = 40) {
  const byId = new Map(profile.nodes.map(n => [n.id, n]))
  const parent = new Map()
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id)
  const self = new Map()
  let total = 0
  for (let i = 0; i < profile.samples.length; i++) {
    const dt = profile.timeDeltas[i] ?? 0
    self.set(profile.samples[i], (self.get(profile.samples[i]) ?? 0) + dt)
    total += dt
  }
  const key = n => `${n.callFrame.functionName || '(anonymous)'} ${origin(n.callFrame.url)}:${n.callFrame.lineNumber + 1}`
  const selfBy = new Map()
  const fileBy = new Map()
  const inclusive = new Map()
  for (const [id, us] of self) {
    const n = byId.get(id)
    selfBy.set(key(n), (selfBy.get(key(n)) ?? 0) + us)
    const o = ['(idle)', '(program)', '(garbage collector)'].includes(n.callFrame.functionName) ? n.callFrame.functionName : origin(n.callFrame.url)
    fileBy.set(o, (fileBy.get(o) ?? 0) + us)
    // Inclusive: every distinct gateway function on the stack gets the sample once.
    const seen = new Set()
    for (let at = id; at !== undefined; at = parent.get(at)) {
      const f = byId.get(at)
      if (!f.callFrame.url.includes('/dist/src/')) continue
      const k = key(f)
      if (seen.has(k)) continue
      seen.add(k)
      inclusive.set(k, (inclusive.get(k) ?? 0) + us)
    }
  }
  const idle = fileBy.get('(idle)') ?? 0
  const busy = total - idle
  const rank = (map) => [...map.entries()].sort((a, b) => b[1] - a[1])
  const pct = us => `${(us / busy * 100).toFixed(1).padStart(5)}%`
  const lines = [`${(total / 1e6).toFixed(1)} s sampled, ${(busy / 1e6).toFixed(1)} s busy (percentages are of busy time)`, '', 'Self time by file / package:']
  for (const [k, us] of rank(fileBy).filter(([k]) => k !== '(idle)').slice(0, 25)) lines.push(`  ${pct(us)}  ${k}`)
  lines.push('', 'Self time by function:')
  for (const [k, us] of rank(selfBy).filter(([k]) => !k.startsWith('(idle)')).slice(0, top)) lines.push(`  ${pct(us)}  ${k}`)
  lines.push('', 'Inclusive time of gateway functions:')
  for (const [k, us] of rank(inclusive).slice(0, 30)) lines.push(`  ${pct(us)}  ${k}`)
  return lines.join('\n')
}
