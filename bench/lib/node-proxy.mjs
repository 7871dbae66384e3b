// A plain Node streaming pass-through (node:http both ways, bodies piped,
// nothing parsed or recorded): the reference for what any Node proxy costs.
//   UPSTREAM_PORT=N PORT=0 node bench/lib/node-proxy.mjs  -> prints {"port":N}
import http from 'node:http'

const upstreamPort = Number(process.env.UPSTREAM_PORT)
const agent = new http.Agent({ keepAlive: true, maxSockets: Infinity, maxFreeSockets: 256 })
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'host'])

function endToEnd (headers) {
  const out = {}
  for (const [name, value] of Object.entries(headers)) if (!HOP_BY_HOP.has(name)) out[name] = value
  return out
}

const server = http.createServer({ keepAliveTimeout: 60_000, requestTimeout: 0 }, (req, res) => {
  // Its own answer, as nginx's: the counterpart of the gateway's /healthz in the fairness scenario.
  if (req.url === '/healthz') {
    res.end('ok')
    return
  }
  let complete = false
  const upstreamReq = http.request({
    host: '127.0.0.1', port: upstreamPort, method: req.method, path: req.url, headers: endToEnd(req.headers), agent
  }, upstreamRes => {
    res.writeHead(upstreamRes.statusCode, endToEnd(upstreamRes.headers))
    res.flushHeaders()
    upstreamRes.on('end', () => { complete = true })
    upstreamRes.pipe(res)
  })
  upstreamReq.on('error', () => { if (!res.headersSent) res.writeHead(502); res.end() })
  // The client went away mid-answer: release the upstream request (a pass-through records nothing).
  res.on('close', () => { if (!complete) upstreamReq.destroy() })
  req.pipe(upstreamReq)
})
server.maxConnections = 100_000
server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', 4096, () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n')
})
process.on('SIGTERM', () => {
  server.close()
  server.closeAllConnections()
  setTimeout(() => process.exit(0), 200).unref()
})
