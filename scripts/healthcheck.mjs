// Container health probe. The runtime image has no curl or wget, so node itself
// asks the gateway's admin listener for /healthz (liveness). With a URL argument it
// probes that instead (docker-compose uses this for the example upstream).
// Exit 0: healthy; exit 1: anything else, including a timeout.

const TIMEOUT_MS = 2000

function adminUrl (env) {
  const port = env.ADMIN_PORT || '9090'
  // A wildcard bind is reachable on loopback; a specific address must be used as is.
  const bound = env.ADMIN_HOST || '0.0.0.0'
  const host = bound === '0.0.0.0' || bound === '::' ? '127.0.0.1' : bound
  return `http://${host.includes(':') ? `[${host}]` : host}:${port}/healthz`
}

const url = process.argv[2] ?? adminUrl(process.env)

try {
  const res = await fetch(url, { signal: AbortSignal.timeout(TIMEOUT_MS) })
  await res.body?.cancel()
  process.exit(res.ok ? 0 : 1)
} catch {
  process.exit(1)
}
