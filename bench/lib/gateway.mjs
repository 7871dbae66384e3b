// Start the gateway (dist build) as a child process and read its metrics.
import { existsSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { readStartScript } from '../../scripts/start-script.mjs'
import { freePort, start, waitHttp } from './procs.mjs'

/** This checkout's start script. */
const START = readStartScript(fileURLToPath(new URL('../../package.json', import.meta.url)))

/**
 * The start script of the build `main` belongs to (another checkout's, for
 * --gateway-b: each build runs as its own `npm start` would run it), or this
 * checkout's when no package.json is found above it.
 */
export function startFor (main) {
  for (let dir = dirname(main); dir !== dirname(dir); dir = dirname(dir)) {
    const candidate = join(dir, 'package.json')
    if (existsSync(candidate)) return readStartScript(candidate)
  }
  return START
}

/** The start script as words, for a report. */
export function startWordsFor (main) {
  const { env, flags } = startFor(main)
  return [...Object.entries(env).map(([k, v]) => `${k}=${v}`), 'node', ...flags].join(' ')
}

/**
 * Events a gateway keeps per stream (RETENTION_MAX_EVENTS, its default, set
 * explicitly): the throughput rounds measure once 95% of the streams are past
 * it (see untilFilled in scenarios.mjs). A larger one in BENCH_GATEWAY_ENV
 * would make them measure before the store trims.
 */
export const RETENTION_EVENTS = 10_000
/** Events every stream but a few stragglers delivers in a throughput round's warm-up: past RETENTION_EVENTS. */
export const FILL_EVENTS = Math.round(RETENTION_EVENTS * 1.2)

/**
 * store: 'memory' | 'redis'. Extra env (e.g. MAX_SESSIONS) and node flags
 * (e.g. --cpu-prof) are passed through; node runs with the start script's flags
 * (those of the build's own checkout: see startFor), under `launcher` when given.
 */
export async function startGateway ({ name, main, upstreamPort, redisUrl, keyPrefix, env = {}, nodeArgs = [], launcher = [], readyTimeoutMs = 30_000 }) {
  const port = await freePort()
  const adminPort = await freePort()
  const { env: startEnv, flags: startFlags } = startFor(main)
  const gatewayEnv = {
    // The environment `npm start` sets (GLIBC_TUNABLES), then the bench's own.
    ...startEnv,
    UPSTREAM_URL: `http://127.0.0.1:${upstreamPort}/mcp`,
    HOST: '127.0.0.1',
    PORT: String(port),
    ADMIN_HOST: '127.0.0.1',
    ADMIN_PORT: String(adminPort),
    LOG_LEVEL: 'warn',
    // The idle scenario holds 10,000 sessions; the default cap is exactly that.
    MAX_SESSIONS: '100000',
    // Every bench client connects from loopback: the per-address cap would refuse most idle streams.
    MAX_CONNECTIONS: '100000',
    MAX_CONNECTIONS_PER_ADDRESS: '100000',
    // and its sessions come from one address, all without credentials (one principal).
    INITIALIZES_PER_MINUTE_PER_ADDRESS: '1000000',
    MAX_SESSIONS_PER_PRINCIPAL: '100000',
    RETENTION_MAX_EVENTS: String(RETENTION_EVENTS),
    // BENCH_GATEWAY_ENV="NAME=value ...": environment for the gateways only (not the other paths).
    ...envList(process.env.BENCH_GATEWAY_ENV),
    ...env
  }
  if (redisUrl !== undefined) {
    gatewayEnv.REDIS_URL = redisUrl
    gatewayEnv.REDIS_KEY_PREFIX = keyPrefix
  } else {
    gatewayEnv.REDIS_URL = ''
  }
  // The node flags of `npm start` (what production runs), then BENCH_GATEWAY_NODE_ARGS (to try others).
  const extra = (process.env.BENCH_GATEWAY_NODE_ARGS ?? '').split(' ').filter(Boolean)
  const nodeWords = [process.execPath, ...startFlags, ...extra, ...nodeArgs, main]
  // launcher: a command node runs under, with its arguments (bench/instructions.mjs: valgrind).
  const [cmd, ...words] = [...launcher, ...nodeWords]
  const proc = start(name, cmd, words, { env: gatewayEnv })
  await waitHttp(`http://127.0.0.1:${adminPort}/readyz`, { proc, timeoutMs: readyTimeoutMs })
  return { proc, pid: proc.pid, port, adminPort }
}

/** "NAME=value NAME2=value2" as an object (values without spaces). */
export function envList (text = '') {
  return Object.fromEntries(text.split(' ').filter(kv => kv.includes('=')).map(kv => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]))
}

/** The gateway's counters that the benchmark needs, from /metrics. */
export async function gatewayMetrics (adminPort) {
  const res = await fetch(`http://127.0.0.1:${adminPort}/metrics`, { signal: AbortSignal.timeout(5000) })
  const text = await res.text()
  const sum = (re) => {
    let total = 0
    let found = false
    for (const m of text.matchAll(re)) { total += Number(m[1]); found = true }
    return found ? total : NaN
  }
  const storeOps = {}
  for (const m of text.matchAll(/^mcpgw_store_operation_duration_seconds_count\{[^}]*op="([^"]+)"[^}]*\} (\S+)$/gm)) {
    storeOps[m[1]] = (storeOps[m[1]] ?? 0) + Number(m[2])
  }
  return {
    eventsRecorded: sum(/^mcpgw_events_recorded_total(?:\{[^}]*\})? (\S+)$/gm),
    eventsDelivered: sum(/^mcpgw_events_delivered_total(?:\{[^}]*\})? (\S+)$/gm),
    upstreamReads: sum(/^mcpgw_upstream_reads_total(?:\{[^}]*\})? (\S+)$/gm),
    slowClients: sum(/^mcpgw_slow_client_disconnects_total(?:\{[^}]*\})? (\S+)$/gm),
    storeOps
  }
}
