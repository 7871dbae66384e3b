// The benchmark's MCP client: plain node:http, cheap enough per event that it
// is never the measured path's bottleneck. Counting uses Buffer.indexOf on a
// marker; latency mode parses each event's send stamp.
import http from 'node:http'

export const PROTOCOL_VERSION = '2025-06-18'
export const MCP_PATH = '/mcp'

/** ms of CLOCK_MONOTONIC, the clock the upstream stamps events with. */
export const nowMs = () => Number(process.hrtime.bigint()) / 1e6

/** Short JSON requests (initialize, DELETE, tools/call setup) share keep-alive connections. */
export function jsonAgent () {
  return new http.Agent({ keepAlive: true, maxSockets: 64, maxFreeSockets: 64 })
}
/** Each SSE stream gets its own connection. */
const streamAgent = new http.Agent({ keepAlive: false, maxSockets: Infinity })

export function request (port, { method = 'GET', path = MCP_PATH, headers = {}, body, agent, timeoutMs = 30_000 }) {
  return new Promise((resolve, reject) => {
    const payload = body === undefined ? undefined : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body))
    const req = http.request({
      host: '127.0.0.1',
      port,
      method,
      path,
      agent,
      headers: {
        ...(payload === undefined ? {} : { 'content-type': 'application/json', 'content-length': payload.length }),
        ...headers
      }
    }, res => {
      const chunks = []
      res.on('data', c => chunks.push(c))
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, text: Buffer.concat(chunks).toString('utf8') }))
      res.on('error', reject)
    })
    req.setTimeout(timeoutMs, () => req.destroy(new Error(`${method} ${path} timed out`)))
    req.on('error', reject)
    req.end(payload)
  })
}

let nextId = 1

/**
 * initialize: returns the session id the upstream issued (through whatever
 * proxy `port` is). `stream`: the options of the session's standalone stream
 * (as openStream takes them), sent as headers here too: a gateway opens the
 * session's upstream GET as soon as initialize answers, with the headers of
 * that request, before the client's own GET arrives.
 */
export async function initialize (port, agent, stream = {}) {
  const res = await request(port, {
    method: 'POST',
    agent,
    headers: { accept: 'application/json, text/event-stream', ...streamHeaders(stream) },
    body: { jsonrpc: '2.0', id: nextId++, method: 'initialize', params: { protocolVersion: PROTOCOL_VERSION, capabilities: {}, clientInfo: { name: 'bench', version: '1' } } }
  })
  const sessionId = res.headers['mcp-session-id']
  if (res.status !== 200 || typeof sessionId !== 'string') throw new Error(`initialize failed: ${res.status} ${res.text.slice(0, 200)}`)
  return sessionId
}

export async function deleteSession (port, sessionId, agent) {
  const res = await request(port, { method: 'DELETE', agent, headers: { 'mcp-session-id': sessionId, 'mcp-protocol-version': PROTOCOL_VERSION } })
  return res.status
}

const NOTIFICATION = Buffer.from('"method":"notifications/message"')
const RESULT = Buffer.from('"result":')
const GAP = Buffer.from('event: gateway-gap')
const ID = Buffer.from('id: ')
const TAIL = 128

/**
 * Counts markers across chunk boundaries and remembers the last complete
 * `id:` line. `full` also counts results and gap notices (three scans per
 * chunk instead of one; the hot throughput streams only need notifications).
 */
class MarkerCounter {
  #tail = null
  #full
  notifications = 0
  results = 0
  gaps = 0
  lastId
  constructor (full) { this.#full = full }

  #count (marker, chunk) {
    let n = 0
    // Matches straddling the previous chunk and this one: search tail + head only.
    if (this.#tail !== null) {
      const seam = Buffer.concat([this.#tail, chunk.subarray(0, marker.length - 1)])
      let i = Math.max(0, this.#tail.length - marker.length + 1)
      while ((i = seam.indexOf(marker, i)) !== -1) { n++; i += marker.length }
    }
    let i = 0
    while ((i = chunk.indexOf(marker, i)) !== -1) { n++; i += marker.length }
    return n
  }

  feed (chunk) {
    this.notifications += this.#count(NOTIFICATION, chunk)
    if (this.#full) {
      this.results += this.#count(RESULT, chunk)
      this.gaps += this.#count(GAP, chunk)
    }
    // The last complete id line (an id split over chunks is picked up by the next chunk).
    let at = chunk.length
    while (at > 0 && (at = chunk.lastIndexOf(ID, at - 1)) !== -1) {
      if (at > 0 && chunk[at - 1] !== 10) continue
      const end = chunk.indexOf(10, at)
      if (end !== -1) {
        this.lastId = chunk.toString('latin1', at + ID.length, end)
        break
      }
    }
    this.#tail = chunk.length >= TAIL ? Buffer.from(chunk.subarray(chunk.length - TAIL)) : Buffer.concat([this.#tail ?? Buffer.alloc(0), chunk]).subarray(-TAIL)
  }
}

/** Parses whole events: send stamp, sequence number, gateway id. */
class EventParser {
  #carry = ''
  feed (chunk, onEvent) {
    const text = this.#carry + chunk.toString('latin1')
    let start = 0
    let end
    while ((end = text.indexOf('\n\n', start)) !== -1) {
      onEvent(text, start, end)
      start = end + 2
    }
    this.#carry = text.slice(start)
  }
}

function numberAfter (text, key, from, to) {
  const at = text.indexOf(key, from)
  if (at === -1 || at > to) return NaN
  let end = at + key.length
  while (end < to) {
    const c = text.charCodeAt(end)
    if (c === 44 || c === 125) break // , }
    end++
  }
  return Number(text.slice(at + key.length, end))
}

/**
 * An open SSE response. mode 'count' counts notifications only; 'full' also
 * results and gap notices; 'latency' is 'full' and also records
 * now - t for every event while `recording` is true and checks that sequence
 * numbers arrive contiguous (losses, duplicates); 'replay' counts as 'full'
 * does, once the response has ended.
 */
export class SseStream {
  status = 0
  firstId
  headersAt = NaN
  firstByteAt = NaN
  lastByteAt = NaN
  endedAt = NaN
  headers = {}
  ended = false
  recording = false
  latencies = []
  /** Send times (ms, the upstream's clock) of the recorded latencies, same order. */
  sentAt = []
  lost = 0
  duplicated = 0
  #counter
  #parser = new EventParser()
  #lastSeq = 0
  #req
  #onEnd = []

  get events () { return this.#counter?.notifications ?? 0 }
  get results () { return this.#counter?.results ?? 0 }
  get gaps () { return this.#counter?.gaps ?? 0 }
  get lastId () { return this.#counter?.lastId }

  /** Resolves when the response ends (or at once if it has). */
  finished () {
    if (this.ended) return Promise.resolve()
    return new Promise(resolve => this.#onEnd.push(resolve))
  }

  close () {
    this.#req?.destroy()
  }

  /** A resumed connection continues the sequence check of the one it replaces. */
  continueFrom (previous) {
    this.#lastSeq = previous.lastSeqSeen
  }

  get lastSeqSeen () { return this.#lastSeq }

  _attach (req, res, mode) {
    this.#counter = new MarkerCounter(mode !== 'count')
    this.#req = req
    this.status = res.statusCode
    this.headers = res.headers
    this.headersAt = nowMs()
    // 'replay': the chunks are counted once the response is over, so the time to its
    // last byte measures the proxy, not this process's counting (which took more CPU
    // than the gateway's replay itself).
    const held = mode === 'replay' ? [] : undefined
    const end = () => {
      if (this.ended) return
      this.ended = true
      this.endedAt = nowMs()
      if (held !== undefined) for (const chunk of held.splice(0)) this.#counter.feed(chunk)
      for (const f of this.#onEnd.splice(0)) f()
    }
    res.on('end', end)
    res.on('close', end)
    res.on('error', end)
    res.on('data', chunk => {
      this.lastByteAt = nowMs()
      if (Number.isNaN(this.firstByteAt)) {
        this.firstByteAt = this.lastByteAt
        const m = /^id: ([^\n]+)$/m.exec(chunk.subarray(0, 512).toString('latin1'))
        if (m !== null) this.firstId = m[1]
      }
      if (held !== undefined) held.push(chunk)
      else this.#counter.feed(chunk)
      if (mode === 'latency') this.#latency(chunk)
    })
  }

  #latency (chunk) {
    const now = nowMs()
    this.#parser.feed(chunk, (text, from, to) => {
      const seq = numberAfter(text, '"seq":', from, to)
      if (Number.isNaN(seq)) return
      if (seq !== this.#lastSeq + 1) {
        if (seq <= this.#lastSeq) this.duplicated++
        else this.lost += seq - this.#lastSeq - 1
      }
      if (seq > this.#lastSeq) this.#lastSeq = seq
      if (!this.recording) return
      const t = numberAfter(text, '"t":', from, to)
      if (!Number.isNaN(t)) {
        this.latencies.push(now - t)
        this.sentAt.push(t)
      }
    })
  }
}

/** The bench upstream's stream options as request headers (see lib/upstream.mjs). */
function streamHeaders ({ rate, count, wait = false, lockstep = false }) {
  const headers = {}
  if (rate !== undefined) headers['x-bench-rate'] = String(rate)
  if (count !== undefined) headers['x-bench-count'] = String(count)
  if (wait) headers['x-bench-wait'] = '1'
  if (lockstep) headers['x-bench-lockstep'] = '1'
  return headers
}

/**
 * GET the session's standalone stream (x-bench-rate: 0 = as fast as the
 * socket takes them, N = N events/s, undefined = idle). Resolves once the
 * response head arrived.
 */
export function openStream (port, sessionId, { rate, count, wait = false, lockstep = false, mode = 'count', lastEventId, timeoutMs = 30_000 } = {}) {
  const headers = {
    accept: 'text/event-stream',
    'mcp-session-id': sessionId,
    'mcp-protocol-version': PROTOCOL_VERSION
  }
  Object.assign(headers, streamHeaders({ rate, count, wait, lockstep }))
  if (lastEventId !== undefined) headers['last-event-id'] = lastEventId
  return sseRequest(port, { method: 'GET', headers, mode, timeoutMs })
}

/**
 * A standalone stream followed the way an MCP client does it: when the
 * connection ends before we close it (the gateway cuts a client that fell
 * too far behind), reconnect at once with Last-Event-ID. Counts add up over
 * the connections.
 */
export class FollowedStream {
  #port
  #sessionId
  #opts
  #done = []
  #current
  #closed = false
  reconnects = 0
  failed = 0
  endedAt = NaN

  constructor (port, sessionId, opts) {
    this.#port = port
    this.#sessionId = sessionId
    this.#opts = opts
  }

  get status () { return this.#current?.status ?? 0 }
  get ended () { return this.#current?.ended === true && !Number.isNaN(this.endedAt) }
  #sum (f) { return this.#done.reduce((a, s) => a + f(s), 0) + (this.#current === undefined ? 0 : f(this.#current)) }
  get events () { return this.#sum(s => s.events) }
  get results () { return this.#sum(s => s.results) }
  get gaps () { return this.#sum(s => s.gaps) }
  get lost () { return this.#sum(s => s.lost) }
  get duplicated () { return this.#sum(s => s.duplicated) }
  get latencies () { return [...this.#done.map(s => s.latencies), this.#current?.latencies ?? []].flat() }
  get sentAt () { return [...this.#done.map(s => s.sentAt), this.#current?.sentAt ?? []].flat() }
  get recording () { return this.#recording }
  set recording (on) {
    this.#recording = on
    if (this.#current !== undefined) this.#current.recording = on
  }

  #recording = false

  async open () {
    this.#current = await openStream(this.#port, this.#sessionId, this.#opts)
    this.#watch(this.#current)
    return this
  }

  #watch (stream) {
    stream.finished().then(() => {
      if (this.#closed || stream.status !== 200) {
        if (!this.#closed) this.endedAt = stream.endedAt
        return
      }
      const lastEventId = stream.lastId
      if (lastEventId === undefined || this.reconnects >= 1000) {
        this.endedAt = stream.endedAt
        return
      }
      this.reconnects++
      openStream(this.#port, this.#sessionId, { mode: this.#opts.mode, lastEventId }).then(next => {
        next.recording = this.#recording
        next.continueFrom(stream)
        this.#done.push(stream)
        this.#current = next
        if (this.#closed) next.close()
        else this.#watch(next)
      }, () => {
        this.failed++
        this.endedAt = stream.endedAt
      })
    })
  }

  close () {
    this.#closed = true
    this.#current?.close()
  }
}

/** POST tools/call answered with SSE: `count` notifications then the result. */
export function callTool (port, sessionId, { count, rate = 0, mode = 'full', timeoutMs = 60_000 }) {
  const body = JSON.stringify({ jsonrpc: '2.0', id: nextId++, method: 'tools/call', params: { name: 'stream', arguments: { count, rate } } })
  const headers = {
    accept: 'application/json, text/event-stream',
    'content-type': 'application/json',
    'content-length': Buffer.byteLength(body),
    'mcp-session-id': sessionId,
    'mcp-protocol-version': PROTOCOL_VERSION
  }
  return sseRequest(port, { method: 'POST', headers, body, mode, timeoutMs })
}

function sseRequest (port, { method, headers, body, mode, timeoutMs }) {
  const stream = new SseStream()
  stream.startedAt = nowMs()
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path: MCP_PATH, agent: streamAgent, headers }, res => {
      clearTimeout(timer)
      stream._attach(req, res, mode)
      resolve(stream)
    })
    const timer = setTimeout(() => req.destroy(new Error(`${method} stream: no response head within ${timeoutMs} ms`)), timeoutMs)
    req.on('error', err => { clearTimeout(timer); reject(err) })
    req.end(body)
  })
}
