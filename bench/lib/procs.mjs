// Child processes of the benchmark: started with the file-descriptor limit
// raised to its hard limit, tracked, and always stopped (also on error or
// Ctrl-C). Plus what /proc says about a process (RSS, CPU, sockets).
import { spawn, execFileSync } from 'node:child_process'
import { appendFileSync, readFileSync, readdirSync, readlinkSync } from 'node:fs'
import net from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'

// A child inherits the niceness of the thread that starts it: run.mjs --nice sets
// the benchmark's own, and every process started here runs at that same niceness.
// (`nice -n` on top would add to it, and the proxies would outrank the clients that
// read them.)
const children = new Set()

export const CLK_TCK = (() => {
  try { return Number(execFileSync('getconf', ['CLK_TCK']).toString().trim()) || 100 } catch { return 100 }
})()

/** The hard RLIMIT_NOFILE of this shell's children (what `ulimit -n` can be raised to without privileges). */
export function nofileLimits () {
  const out = execFileSync('bash', ['-c', 'echo "$(ulimit -Sn) $(ulimit -Hn)"']).toString().trim().split(' ')
  const num = v => (v === 'unlimited' ? Infinity : Number(v))
  return { soft: num(out[0]), hard: num(out[1]) }
}

/**
 * Start `cmd args` through a shell that first raises the soft fd limit to
 * the hard one, then execs (so the pid is the program's own).
 */
export function start (name, cmd, args, { env = {}, cwd, readyLine = false } = {}) {
  const child = spawn('bash', ['-c', 'ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$0" "$@"', cmd, ...args], {
    cwd,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe']
  })
  const proc = { name, child, pid: child.pid, stderr: '', stdout: '', exited: false, exitCode: null }
  children.add(proc)
  const keep = (field) => (chunk) => {
    proc[field] += chunk.toString()
    if (proc[field].length > 20_000) proc[field] = proc[field].slice(-10_000)
  }
  child.stdout.on('data', keep('stdout'))
  if (process.env.BENCH_STDOUT_DIR) child.stdout.on('data', chunk => appendFileSync(`${process.env.BENCH_STDOUT_DIR}/${name}-${child.pid}.txt`, chunk))
  child.stderr.on('data', keep('stderr'))
  proc.done = new Promise(resolve => child.on('exit', (code, signal) => {
    proc.exited = true
    proc.exitCode = code ?? signal
    children.delete(proc)
    resolve()
  }))
  if (readyLine) {
    // The child prints one JSON line (e.g. {"port":N}) once it listens.
    proc.ready = new Promise((resolve, reject) => {
      let buf = ''
      const onData = (chunk) => {
        buf += chunk.toString()
        const nl = buf.indexOf('\n')
        if (nl === -1) return
        child.stdout.off('data', onData)
        try { resolve(JSON.parse(buf.slice(0, nl))) } catch (err) { reject(err) }
      }
      child.stdout.on('data', onData)
      proc.done.then(() => reject(new Error(`${name} exited (${proc.exitCode}) before it was ready: ${proc.stderr.slice(-2000)}`)))
    })
  }
  return proc
}

/** SIGTERM, then SIGKILL after `graceMs`; resolves once the process is gone. */
export async function stop (proc, graceMs = 5000) {
  if (proc === undefined || proc.exited) return
  proc.child.kill('SIGTERM')
  const timer = setTimeout(() => { if (!proc.exited) proc.child.kill('SIGKILL') }, graceMs)
  await proc.done
  clearTimeout(timer)
}

export async function stopAll () {
  await Promise.all([...children].map(p => stop(p, 3000)))
}

// Last resort: nothing the benchmark started outlives it.
process.on('exit', () => {
  for (const proc of children) {
    try { proc.child.kill('SIGKILL') } catch {}
  }
})

export async function freePort () {
  return await new Promise((resolve, reject) => {
    const srv = net.createServer()
    srv.unref()
    srv.on('error', reject)
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address()
      srv.close(() => resolve(port))
    })
  })
}

/** Poll `url` until it answers `status` (default 200) or `timeoutMs` passes. */
export async function waitHttp (url, { timeoutMs = 20_000, status = 200, proc } = {}) {
  const deadline = Date.now() + timeoutMs
  let last
  while (Date.now() < deadline) {
    if (proc?.exited) throw new Error(`${proc.name} exited (${proc.exitCode}): ${proc.stderr.slice(-2000)}`)
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(2000) })
      await res.arrayBuffer()
      if (res.status === status) return
      last = `status ${res.status}`
    } catch (err) {
      last = err.message
    }
    await sleep(100)
  }
  throw new Error(`${url} not ready after ${timeoutMs} ms (${last})${proc === undefined ? '' : `: ${proc.stderr.slice(-2000)}`}`)
}

/** A "Name:  N kB" line of /proc/<pid>/status, in KiB; NaN when it is missing. */
export function statusKb (pid, name) {
  const m = new RegExp(`^${name}:\\s+(\\d+)\\s+kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'))
  return m === null ? NaN : Number(m[1])
}

/** Resident set size in KiB (VmRSS of /proc/<pid>/status). */
export function rssKb (pid) {
  return statusKb(pid, 'VmRSS')
}

/**
 * /proc/<pid>/stat read once: a function giving field `n`, numbered as in
 * stat(5) (the command's parentheses may hold spaces).
 */
function statFields (pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  // The text after the command starts at field 3.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  return n => Number(fields[n - 3])
}

/** utime + stime of a process, in seconds (fields 14 and 15 of stat(5)). */
export function cpuSeconds (pid) {
  const field = statFields(pid)
  return (field(14) + field(15)) / CLK_TCK
}

/** Minor page faults of a process so far (field 10 of stat(5)); NaN when it cannot be read (not on this machine). */
export function minorFaults (pid) {
  try {
    return statFields(pid)(10)
  } catch {
    return NaN
  }
}

/** The niceness of a process's main thread (field 19 of stat(5)). */
export function nicenessOf (pid) {
  return statFields(pid)(19)
}

/** How long ago a process started, in ms (its start time is field 22 of stat(5)). */
export function ageMs (pid) {
  return Number(readFileSync('/proc/uptime', 'utf8').split(' ')[0]) * 1000 - statFields(pid)(22) * 1000 / CLK_TCK
}

/** Busy and total jiffies of the whole machine (/proc/stat), to tell how loaded it was. */
export function machineJiffies () {
  const cols = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number)
  const total = cols.reduce((a, b) => a + b, 0)
  const idle = cols[3] + (cols[4] ?? 0)
  return { busy: total - idle, total }
}

/** Number of open file descriptors of a process. */
export function fdCount (pid) {
  try { return readdirSync(`/proc/${pid}/fd`).length } catch { return NaN }
}

/** Established TCP connections of a process to `remotePort` (from its socket inodes and /proc/net/tcp*). */
export function connectionsTo (pid, remotePort) {
  const inodes = new Set()
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(readlinkSync(`/proc/${pid}/fd/${fd}`))
      if (m !== null) inodes.add(m[1])
    } catch {}
  }
  const out = []
  for (const table of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text
    try { text = readFileSync(table, 'utf8') } catch { continue }
    for (const line of text.split('\n').slice(1)) {
      const cols = line.trim().split(/\s+/)
      if (cols.length < 10) continue
      const [, local, remote, st] = cols
      const inode = cols[9]
      if (st !== '01' || !inodes.has(inode)) continue
      if (parseInt(remote.split(':')[1], 16) === remotePort) out.push(parseInt(local.split(':')[1], 16))
    }
  }
  return out
}
