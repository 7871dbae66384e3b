// A minimal Streamable-HTTP-shaped MCP upstream for the benchmark (node:http,
// no SDK: the source must never be the bottleneck). Run as a child process:
//   PORT=0 node bench/lib/upstream.mjs   -> prints {"port":N} on stdout
//
// POST /mcp initialize       -> JSON answer with Mcp-Session-Id
// POST /mcp notification     -> 202
// POST /mcp tools/call       -> SSE: arguments.count notifications (as fast as
//                               the socket takes them), then the result
// GET  /mcp (session)        -> SSE stream of notifications; x-bench-rate: 0 =
//                               as fast as the socket takes them, N = N events/s,
//                               absent = idle; x-bench-count caps the number sent
//                               x-bench-wait: 1 holds it silent until POST /bench/go,
//                               so every stream of a round starts at once.
//                               Paced streams (N > 0) start at spread phases of
//                               their period, so that N events/s over several
//                               streams is a steady rate; x-bench-lockstep: 1
//                               starts them all in phase (their events then come
//                               in bursts, one per stream at the same moment)
// DELETE /mcp (session)      -> ends the session's streams
// GET /bench/stats, POST /bench/go|stop|reset: control, never through a proxy
// GET /bench/ticks           -> how late the paced ticker's timer fired since
//                               the last call (a probe of the machine's stalls)
//
// Every notification is ~300 bytes of JSON-RPC and carries its send time
// ("t", ms of CLOCK_MONOTONIC with us precision: the same clock in every
// process of this machine) and its per-stream sequence number ("seq").
import http from 'node:http'
import { randomBytes } from 'node:crypto'

const MCP_PATH = '/mcp'
const EVENT_BYTES = Number(process.env.EVENT_BYTES ?? 300)
/** Events built into one write in flood mode (each stamped on its own). */
const FLOOD_BATCH = 16
/** Bytes written in one turn of the event loop before yielding to other streams. */
const FLOOD_TURN_BYTES = 256 * 1024

const nowMs = () => Number(process.hrtime.bigint()) / 1e6

const HEAD = '{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","logger":"bench","data":{"seq":'
// Pad so that `data:` carries about EVENT_BYTES bytes (seq and t vary a little).
const SAMPLE = `${HEAD}1000000,"t":12345678.123,"pad":""}}}`
const PAD = 'x'.repeat(Math.max(0, EVENT_BYTES - SAMPLE.length))
const TAIL = `,"pad":"${PAD}"}}}`

function frame (stream) {
  stream.seq++
  return `data: ${HEAD}${stream.seq},"t":${nowMs().toFixed(3)}${TAIL}\n\n`
}

/** sessionId -> Set of open streams */
const sessions = new Map()
const streams = new Set()
const rated = new Set()
/** Streams opened with x-bench-wait, started by POST /bench/go. */
const waiting = new Set()
let sentEvents = 0
let ticking = false
/**
 * How late the paced ticker's 1 ms timer fired (ms past 1 ms after the
 * previous tick), since the last GET /bench/ticks: the machine's own
 * scheduling stalls, seen from a process that every path shares.
 */
let tickLate = []
let lastTick = NaN

function openStream (sessionId, res, opts) {
  const stream = { sessionId, res, seq: 0, remaining: opts.count, rate: opts.rate, start: nowMs(), closed: false, onDone: opts.onDone }
  streams.add(stream)
  sessions.get(sessionId)?.add(stream)
  res.on('close', () => closeStream(stream))
  return stream
}

function closeStream (stream) {
  if (stream.closed) return
  stream.closed = true
  streams.delete(stream)
  rated.delete(stream)
  waiting.delete(stream)
  sessions.get(stream.sessionId)?.delete(stream)
  if (!stream.res.writableEnded) stream.res.end()
}

/** As fast as the socket takes them: write while the buffer has room, then wait for 'drain'. */
function flood (stream) {
  const { res } = stream
  let turn = 0
  while (!stream.closed && stream.remaining > 0) {
    let batch = ''
    let n = 0
    while (n < FLOOD_BATCH && stream.remaining > 0) {
      batch += frame(stream)
      stream.remaining--
      n++
    }
    sentEvents += n
    turn += batch.length
    const room = res.write(batch)
    if (stream.remaining === 0) break
    if (!room) {
      // Go on in a later turn of the event loop, not in the 'drain' callback: a
      // reader fast enough that every write completes at once makes 'drain' come
      // from process.nextTick, and flooding from there never lets the loop reach
      // I/O (control requests like /bench/stop then time out).
      res.once('drain', () => setImmediate(flood, stream))
      return
    }
    if (turn >= FLOOD_TURN_BYTES) {
      setImmediate(() => flood(stream))
      return
    }
  }
  if (!stream.closed && stream.remaining === 0) stream.onDone?.(stream)
}

/** Paced streams share one ~1 ms ticker; each sends what its rate says is due, stamped when sent. */
function tick () {
  const now = nowMs()
  if (!Number.isNaN(lastTick) && tickLate.length < 1_000_000) tickLate.push(now - lastTick - 1)
  lastTick = now
  for (const stream of rated) {
    if (stream.closed || stream.res.writableNeedDrain) continue
    let due = Math.floor((now - stream.start) * stream.rate / 1000) - stream.seq
    if (due <= 0) continue
    if (due > stream.remaining) due = stream.remaining
    let text = ''
    for (let i = 0; i < due; i++) text += frame(stream)
    stream.remaining -= due
    sentEvents += due
    stream.res.write(text)
    if (stream.remaining === 0) {
      rated.delete(stream)
      stream.onDone?.(stream)
    }
  }
  if (rated.size > 0) setTimeout(tick, 1)
  else {
    ticking = false
    lastTick = NaN
  }
}

/** Lateness of the ticks since the last call (then forgotten): p50, p99, max, and how many were 2 and 5 ms late or more. */
function tickStats () {
  const late = Float64Array.from(tickLate).sort()
  tickLate = []
  const at = p => (late.length === 0 ? null : late[Math.min(late.length - 1, Math.ceil(p * late.length) - 1)])
  return { ticks: late.length, p50: at(0.5), p99: at(0.99), max: at(1), over2: late.filter(v => v >= 2).length, over5: late.filter(v => v >= 5).length }
}

function startRated (stream) {
  rated.add(stream)
  if (!ticking) {
    ticking = true
    setTimeout(tick, 1)
  }
}

function sseHead (res, extra = {}) {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', ...extra })
  res.flushHeaders()
}

function json (res, status, body, headers = {}) {
  const text = JSON.stringify(body)
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers })
  res.end(text)
}

function readBody (req) {
  return new Promise((resolve, reject) => {
    const chunks = []
    req.on('data', c => chunks.push(c))
    req.on('end', () => resolve(Buffer.concat(chunks).toString('utf8')))
    req.on('error', reject)
  })
}

function sessionOf (req) {
  const id = req.headers['mcp-session-id']
  return typeof id === 'string' && sessions.has(id) ? id : undefined
}

async function handlePost (req, res) {
  let msg
  try {
    msg = JSON.parse(await readBody(req))
  } catch {
    return json(res, 400, { jsonrpc: '2.0', id: null, error: { code: -32700, message: 'Parse error' } })
  }
  if (msg.method === 'initialize') {
    const sessionId = randomBytes(16).toString('hex')
    sessions.set(sessionId, new Set())
    return json(res, 200, {
      jsonrpc: '2.0',
      id: msg.id,
      result: { protocolVersion: msg.params?.protocolVersion ?? '2025-06-18', capabilities: { tools: {}, logging: {} }, serverInfo: { name: 'bench-upstream', version: '1.0.0' } }
    }, { 'mcp-session-id': sessionId })
  }
  const sessionId = sessionOf(req)
  if (sessionId === undefined) return json(res, 404, { jsonrpc: '2.0', id: msg.id ?? null, error: { code: -32001, message: 'Session not found' } })
  if (msg.id === undefined) {
    res.writeHead(202).end()
    return
  }
  if (msg.method === 'tools/call') {
    const args = msg.params?.arguments ?? {}
    const count = Number.isSafeInteger(args.count) ? args.count : 100
    const rate = Number(args.rate ?? 0)
    sseHead(res)
    const result = `data: ${JSON.stringify({ jsonrpc: '2.0', id: msg.id, result: { content: [{ type: 'text', text: `sent ${count}` }] } })}\n\n`
    const stream = openStream(sessionId, res, {
      count,
      rate,
      onDone: s => {
        s.res.end(result)
        closeStream(s)
      }
    })
    if (count === 0) stream.onDone(stream)
    else if (rate > 0) startRated(stream)
    else flood(stream)
    return
  }
  return json(res, 200, { jsonrpc: '2.0', id: msg.id, result: {} })
}

function handleGet (req, res) {
  const sessionId = sessionOf(req)
  if (sessionId === undefined) return json(res, 404, { jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } })
  const rateHeader = req.headers['x-bench-rate']
  const countHeader = req.headers['x-bench-count']
  const count = countHeader === undefined ? Number.MAX_SAFE_INTEGER : Number(countHeader)
  sseHead(res)
  if (rateHeader === undefined) {
    openStream(sessionId, res, { count: 0, rate: 0 }) // idle: held open, nothing sent
    return
  }
  const rate = Number(rateHeader)
  // After `count` events the stream stays open and idle (a held standalone stream).
  const stream = openStream(sessionId, res, { count, rate })
  stream.lockstep = req.headers['x-bench-lockstep'] === '1'
  if (req.headers['x-bench-wait'] === '1') waiting.add(stream)
  else go(stream)
}

/** Where in its period the next paced stream starts: golden-ratio steps spread any number of streams evenly. */
let phase = 0

function go (stream) {
  stream.start = nowMs()
  if (stream.rate > 0 && !stream.lockstep) {
    phase = (phase + 0.6180339887) % 1
    stream.start -= phase * 1000 / stream.rate
  }
  if (stream.rate > 0) startRated(stream)
  else flood(stream)
}

function handleDelete (req, res) {
  const sessionId = sessionOf(req)
  if (sessionId === undefined) return json(res, 404, { jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } })
  for (const stream of [...sessions.get(sessionId)]) closeStream(stream)
  sessions.delete(sessionId)
  res.writeHead(200).end()
}

const server = http.createServer({ keepAliveTimeout: 60_000, requestTimeout: 0, headersTimeout: 60_000 }, (req, res) => {
  const path = req.url.split('?')[0]
  if (path === MCP_PATH) {
    if (req.method === 'POST') {
      handlePost(req, res).catch(err => { res.destroy(err) })
      return
    }
    if (req.method === 'GET') return handleGet(req, res)
    if (req.method === 'DELETE') return handleDelete(req, res)
    res.writeHead(405).end()
    return
  }
  if (path === '/bench/stats') return json(res, 200, { sessions: sessions.size, streams: streams.size, waiting: waiting.size, sent: sentEvents })
  if (path === '/bench/ticks') return json(res, 200, tickStats())
  if (path === '/bench/go' && req.method === 'POST') {
    const started = waiting.size
    for (const stream of [...waiting]) {
      waiting.delete(stream)
      if (!stream.closed) go(stream)
    }
    return json(res, 200, { started })
  }
  if (path === '/bench/stop' && req.method === 'POST') {
    // Reset, not end: megabytes a flooded proxy has not read yet are dropped
    // with the connection instead of being chewed through before the next round.
    const stopped = streams.size
    for (const stream of [...streams]) {
      closeStream(stream)
      stream.res.socket?.resetAndDestroy()
    }
    return json(res, 200, { stopped })
  }
  if (path === '/bench/reset' && req.method === 'POST') {
    for (const stream of [...streams]) closeStream(stream)
    sessions.clear()
    return json(res, 200, { ok: true })
  }
  res.writeHead(404).end()
})
server.maxConnections = 100_000

server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', 4096, () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n')
})
process.on('SIGTERM', () => {
  for (const stream of [...streams]) closeStream(stream)
  server.close()
  server.closeAllConnections()
  setTimeout(() => process.exit(0), 200).unref()
})
