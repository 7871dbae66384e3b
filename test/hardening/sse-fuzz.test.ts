// Property-based fuzz of the gateway's SSE handling. A hand-written upstream
// answers each POST with a random, mutated SSE byte stream (LF/CRLF/CR mixes,
// comments, retry and id lines, unknown fields, giant lines, invalid UTF-8,
// NULs), written in random chunks. The oracle is eventsource-parser's parse of
// the same bytes. Properties, end to end through a real gateway (embedded
// store): status 200 and a body that ends cleanly (never a reset after the
// head); every event forwarded carries a gateway id (contiguous sequence);
// the forwarded events are the upstream's, data and type unchanged, in order;
// the request gets its answer (the upstream's, or the gateway's JSON-RPC error
// when it never came or an event broke MAX_EVENT_BYTES); resuming from any
// forwarded id yields exactly the rest. The same streams also go through the
// decoder alone (src/sse/decoder.ts), with exact chunk boundaries.
//
// FUZZ_SEED reruns a printed seed; FUZZ_RUNS changes the number of end-to-end runs.
import t from 'tap'
import type { Test } from 'tap'
import fc from 'fast-check'
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http'
import type { AddressInfo } from 'node:net'
import { setImmediate as nextTurn, setTimeout as sleep } from 'node:timers/promises'
import { createParser } from 'eventsource-parser'
import { request } from 'undici'
import { isJSONRPCResultResponse } from '@modelcontextprotocol/sdk/types.js'
import { SseDecoder, type UpstreamEvent } from '../../src/sse/decoder.js'
import { EventTooLargeError } from '../../src/sse/event-too-large.js'
import { decodeEventId } from '../../src/protocol/event-id.js'
import { startGateway } from '../fixtures/gateway.js'
import { answerInitialize, readMessage } from '../fixtures/hand-upstream.js'
import { exchange, rawInitialize, sseEvents, type RawSession } from '../fixtures/hardening.js'
import { dataOf, eventOf } from '../fixtures/events.js'

const SEED = Number(process.env.FUZZ_SEED ?? (Date.now() % 2_147_483_647))
const E2E_RUNS = Number(process.env.FUZZ_RUNS ?? 260)
const DECODER_RUNS = 1500
/** MAX_EVENT_BYTES of the gateway under test, and of the decoder-only runs. */
const E2E_MAX = 4096
const DECODER_MAX = 1024
/** src/sse/decoder.ts FIELD_SLACK_BYTES: a pending block may pass the event bound by this much. */
const FIELD_SLACK = 4096
const RESPONSE_TOKEN = '\u0000RESPONSE\u0000'

t.comment(`sse-fuzz seed ${SEED} (rerun with FUZZ_SEED=${SEED}), ${E2E_RUNS} end-to-end runs`)

// ---------------------------------------------------------------------------
// Generated streams

interface FuzzCase {
  /** The stream as text with RESPONSE_TOKEN where the JSON-RPC response goes (mutations then apply to bytes). */
  readonly text: string
  readonly mutations: ReadonlyArray<{ at: number, op: string }>
  readonly split: { kind: 'random', at: number[] } | { kind: 'lines' } | { kind: 'bytes', size: number }
}

const EOL = fc.constantFrom('\n', '\r\n', '\r')
const safeText = fc.string({ unit: 'binary', maxLength: 30 }).map(s => s.replace(/[\r\n]/g, ''))
const jsonText = fc.jsonValue({ maxDepth: 2 }).map(v => JSON.stringify(v) ?? 'null').filter(s => s.length <= 300)
const value = fc.oneof(
  { weight: 3, arbitrary: jsonText },
  { weight: 2, arbitrary: safeText },
  { weight: 1, arbitrary: fc.constantFrom('', ' ', '\u0000', 'data: nested', '\ufeff', 'ï»¿', '\u2028', 'x\u0000y') }
)
const space = fc.constantFrom('', ' ', '  ')
const line = fc.oneof(
  { weight: 8, arbitrary: fc.tuple(space, value).map(([s, v]) => `data:${s}${v}`) },
  { weight: 2, arbitrary: fc.tuple(space, fc.constantFrom('message', '', 'progress', 'gateway-gap', 'x y', 'a\u0000b', 'ü', ' lead')).map(([s, v]) => `event:${s}${v}`) },
  { weight: 1, arbitrary: fc.tuple(space, value).map(([s, v]) => `id:${s}${v}`) },
  { weight: 1, arbitrary: fc.oneof(fc.nat(99_999).map(String), safeText).map(v => `retry: ${v}`) },
  { weight: 1, arbitrary: value.map(v => `:${v}`) },
  { weight: 1, arbitrary: fc.constantFrom('data', 'event', 'id', 'retry', ':', 'data :x', 'DATA: x', 'foo: bar', '\ufeffdata: bom') }
)
const eventFrame = fc.tuple(fc.array(fc.tuple(line, EOL), { minLength: 1, maxLength: 4 }), EOL).map(([lines, end]) => lines.map(([l, e]) => l + e).join('') + end)
const frame = fc.oneof(
  { weight: 12, arbitrary: eventFrame },
  { weight: 2, arbitrary: fc.tuple(line, EOL).map(([l, e]) => l + e) },
  { weight: 1, arbitrary: fc.tuple(EOL, EOL).map(([a, b]) => a + b) }
)

function caseArbitrary (max: number, maxFrames: number): fc.Arbitrary<FuzzCase> {
  const giant = fc.tuple(fc.constantFrom('data: ', ': ', 'id: ', 'data:'), fc.integer({ min: max + FIELD_SLACK + 500, max: max + FIELD_SLACK + 4000 }), EOL, EOL)
    .map(([prefix, size, a, b]) => `${prefix}${'g'.repeat(size)}${a}${b}`)
  return fc.record({
    bom: fc.oneof({ weight: 1, arbitrary: fc.constant(true) }, { weight: 15, arbitrary: fc.constant(false) }),
    frames: fc.array(frame, { maxLength: maxFrames, size: 'medium' }),
    response: fc.oneof({ weight: 6, arbitrary: fc.constant('end') }, { weight: 1, arbitrary: fc.constant('middle') }, { weight: 3, arbitrary: fc.constant('none') }),
    responseEol: fc.tuple(EOL, EOL),
    giant: fc.oneof({ weight: 6, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.tuple(giant, fc.nat()) }),
    tail: fc.oneof({ weight: 6, arbitrary: fc.constant('') }, { weight: 1, arbitrary: line }),
    mutations: fc.array(fc.record({ at: fc.nat(), op: fc.constantFrom('ins-ff', 'ins-c3', 'ins-e282', 'ins-nul', 'ins-cr', 'ins-lf', 'del', 'dup') }), { maxLength: 3 }),
    split: fc.oneof(
      { weight: 6, arbitrary: fc.array(fc.nat(), { maxLength: 40 }).map(at => ({ kind: 'random' as const, at })) },
      { weight: 2, arbitrary: fc.constant({ kind: 'lines' as const }) },
      { weight: 1, arbitrary: fc.integer({ min: 1, max: 3 }).map(size => ({ kind: 'bytes' as const, size })) }
    )
  }).map(c => {
    const frames = [...c.frames]
    const response = `data: ${RESPONSE_TOKEN}${c.responseEol[0]}${c.responseEol[1]}`
    if (c.response === 'middle') frames.splice(Math.floor(frames.length / 2), 0, response)
    if (c.giant !== null) frames.splice(c.giant[1] % (frames.length + 1), 0, c.giant[0])
    if (c.response === 'end') frames.push(response)
    return { text: (c.bom ? '\ufeff' : '') + frames.join('') + c.tail, mutations: c.mutations, split: c.split }
  })
}

/** The stream's bytes for one request id, mutations applied. */
function bytesOf (c: FuzzCase, requestId: number): Buffer {
  let bytes: Buffer = Buffer.from(c.text.split(RESPONSE_TOKEN).join(JSON.stringify({ jsonrpc: '2.0', id: requestId, result: { fuzz: true } })), 'utf8')
  for (const { at, op } of c.mutations) {
    const i = bytes.length === 0 ? 0 : at % bytes.length
    const insert = (extra: number[]): Buffer => Buffer.concat([bytes.subarray(0, i), Buffer.from(extra), bytes.subarray(i)])
    switch (op) {
      case 'ins-ff': bytes = insert([0xff]); break
      case 'ins-c3': bytes = insert([0xc3]); break
      case 'ins-e282': bytes = insert([0xe2, 0x82]); break
      case 'ins-nul': bytes = insert([0x00]); break
      case 'ins-cr': bytes = insert([0x0d]); break
      case 'ins-lf': bytes = insert([0x0a]); break
      case 'del': bytes = Buffer.concat([bytes.subarray(0, i), bytes.subarray(i + 1 + (at % 7))]); break
      case 'dup': bytes = Buffer.concat([bytes.subarray(0, i), bytes.subarray(i, i + 1 + (at % 64)), bytes.subarray(i)]); break
    }
  }
  return bytes
}

function chunksOf (bytes: Buffer, split: FuzzCase['split']): Buffer[] {
  const cuts = new Set<number>()
  if (split.kind === 'random') {
    for (const at of split.at) if (bytes.length > 0) cuts.add(at % bytes.length)
  } else if (split.kind === 'bytes') {
    for (let i = split.size; i < bytes.length; i += split.size) cuts.add(i)
  } else {
    // One write per line: every CR or LF ends a chunk (a blank line is a chunk of its own).
    bytes.forEach((b, i) => { if (b === 0x0a || b === 0x0d) cuts.add(i + 1) })
  }
  const sorted = [...cuts].filter(c => c > 0 && c < bytes.length).sort((a, b) => a - b)
  const chunks: Buffer[] = []
  let from = 0
  for (const cut of [...sorted, bytes.length]) {
    chunks.push(bytes.subarray(from, cut))
    from = cut
  }
  return chunks.filter(c => c.length > 0)
}

// ---------------------------------------------------------------------------
// The oracle

interface Ev { data: string, type: string }

interface Reference {
  events: Ev[]
  /** Character offset (in the decoded text) where each event was dispatched. */
  ends: number[]
  /** Character ranges of lines longer than the bound: a cut there is the line bound, not a bug. */
  giants: Array<[number, number]>
  /** The decoded text, to measure event blocks. */
  text: string
}

const typeOf = (event: string | undefined): string => event === undefined || event === '' ? 'message' : event

/**
 * eventsource-parser over the whole stream decoded at once (TextDecoder, as
 * the gateway does), plus the spec's rule that a final CR ends its line.
 */
function reference (bytes: Buffer, max: number): Reference {
  const text = new TextDecoder().decode(bytes)
  const events: Ev[] = []
  const whole = createParser({ onEvent: e => { events.push({ data: e.data, type: typeOf(e.event) }) } })
  whole.feed(text)
  if (text.endsWith('\r')) whole.feed('\n')
  // Where each event ends: the same text fed line by line (positions only).
  const ends: number[] = []
  let at = 0
  const byLine = createParser({ onEvent: () => { ends.push(at) } })
  for (const match of text.matchAll(/[^\r\n]*(?:\r\n|\r|\n|$)/g)) {
    if (match[0] === '') continue
    at = match.index + match[0].length
    // A lone CR ends its line (the pattern takes CRLF whole), but the parser holds a
    // CR that ends a feed until it sees what follows: as LF, the event ends here.
    byLine.feed(match[0].endsWith('\r') ? match[0].slice(0, -1) + '\n' : match[0])
  }
  while (ends.length < events.length) ends.push(text.length)
  const giants: Array<[number, number]> = []
  for (const match of text.matchAll(/[^\r\n]+/g)) {
    if (Buffer.byteLength(match[0]) > max) giants.push([match.index, match.index + match[0].length])
  }
  // Events with empty data (priming) are never dispatched by a client: the gateway drops them.
  const kept = events.map(e => e.data !== '')
  return { events: events.filter((_, i) => kept[i]), ends: ends.filter((_, i) => kept[i]), giants, text }
}

function isResponseTo (data: string, id: number): boolean {
  try {
    const m = JSON.parse(data) as { id?: unknown, result?: unknown, error?: unknown }
    return m.id === id && (m.result !== undefined || m.error !== undefined)
  } catch {
    return false
  }
}

function gatewayError (data: string): string | undefined {
  try {
    const m = JSON.parse(data) as { error?: { message?: unknown } }
    const message = m.error?.message
    return typeof message === 'string' && message.startsWith('MCP gateway: the response to this request was lost') ? message : undefined
  } catch {
    return undefined
  }
}

type Note = 'line_bound' | 'split_terminators' | 'answer_after_response'
type Verdict = { ok: true, note?: Note } | { ok: false, why: string }

/**
 * Judges what a client received (upstream events, then possibly the
 * gateway's error answer) against the oracle.
 */
function judge (ref: Reference, delivered: readonly Ev[], cutReason: 'none' | 'too_large' | 'broke_off', requestId: number | undefined, max: number, errorAnswer = true): Verdict {
  for (let i = 0; i < delivered.length; i++) {
    const want = ref.events[i]
    const got = delivered[i] as Ev
    if (want === undefined || want.data !== got.data || want.type !== got.type) {
      return { ok: false, why: `event ${i}: expected ${JSON.stringify(want)}, got ${JSON.stringify(got)}` }
    }
  }
  const k = delivered.length
  const oversized = ref.events.findIndex(e => Buffer.byteLength(e.data) > max)
  const answered = requestId !== undefined && delivered.some(e => isResponseTo(e.data, requestId))
  if (oversized !== -1 && k > oversized) return { ok: false, why: `event ${oversized} (${Buffer.byteLength(ref.events[oversized]?.data ?? '')} bytes) passed MAX_EVENT_BYTES` }
  if (cutReason !== 'too_large') {
    if (oversized !== -1) return { ok: false, why: `event ${oversized} is over MAX_EVENT_BYTES but the stream was not cut (${cutReason})` }
    if (k !== ref.events.length) return { ok: false, why: `${k} of ${ref.events.length} events delivered, without a cut` }
    if (requestId !== undefined && answered === (cutReason === 'broke_off')) {
      return { ok: false, why: answered ? 'an error answer after the upstream\'s response' : 'no answer for the request' }
    }
    return { ok: true }
  }
  // Cut as too large: right at the oversized event, or at a line longer than the bound.
  const from = k === 0 ? 0 : ref.ends[k - 1] as number
  const to = k < ref.events.length ? ref.ends[k] as number : Number.POSITIVE_INFINITY
  // (An event completed by the read that carried a giant line counts as ending with it: +2 for its line break.)
  const lineBound = ref.giants.some(([start, end]) => end + 2 >= from && start < to)
  // The bound is on an event's bytes on the wire (all its lines, ignored fields too):
  // a block that large may be cut even if its data is small.
  const blockBound = Buffer.byteLength(ref.text.slice(from, Math.min(to, ref.text.length))) > max
  if (k !== oversized && !lineBound && !blockBound) return { ok: true, note: 'split_terminators' }
  if (answered && errorAnswer) return { ok: true, note: 'answer_after_response' }
  return { ok: true, ...(k !== oversized && { note: 'line_bound' as const }) }
}

// ---------------------------------------------------------------------------
// The decoder alone, exact chunk boundaries

function runDecoder (chunks: readonly Buffer[], max: number): { events: Ev[], tooLarge: boolean } {
  const decoder = new SseDecoder(max)
  const events: Ev[] = []
  const take = (batch: readonly UpstreamEvent[]): void => {
    for (const e of batch) events.push({ data: dataOf(e), type: typeOf(eventOf(e)) })
  }
  try {
    for (const chunk of chunks) take(decoder.push(chunk))
    take(decoder.end())
    return { events, tooLarge: false }
  } catch (err) {
    if (!(err instanceof EventTooLargeError)) throw err
    take(err.completed)
    return { events, tooLarge: true }
  }
}

interface Tally { runs: number, lines: number, events: number, notes: Map<string, { count: number, example: string }> }

function note (tally: Tally, kind: string, example: string): void {
  const entry = tally.notes.get(kind)
  if (entry === undefined) tally.notes.set(kind, { count: 1, example })
  else if (++entry.count > 0 && example.length < entry.example.length) entry.example = example
}

function reportNotes (t: Test, tally: Tally, label: string, endToEnd: boolean): void {
  const count = (kind: string): number => tally.notes.get(kind)?.count ?? 0
  t.comment(`${label}: ${tally.runs} runs, ${tally.lines} SSE lines, ${tally.events} events; cuts at a giant line ${count('line_bound')}, false "too large" ${count('split_terminators')}, answers after the response ${count('answer_after_response')}`)
  for (const [kind, { example }] of tally.notes) {
    if (kind !== 'line_bound') t.comment(`${label}: smallest ${kind} example: ${process.env.FUZZ_VERBOSE === undefined ? example.slice(0, 300) : example}`)
  }
  t.equal(count('split_terminators'), 0, `${label}: no stream of small events is cut as too large`)
  if (endToEnd) t.equal(count('answer_after_response'), 0, `${label}: no request gets an error answer after its response`)
}

t.test('the decoder alone: random streams, exact chunk boundaries', async t => {
  const tally: Tally = { runs: 0, lines: 0, events: 0, notes: new Map() }
  fc.assert(fc.property(caseArbitrary(DECODER_MAX, 80), c => {
    const bytes = bytesOf(c, 1)
    const ref = reference(bytes, DECODER_MAX)
    const chunks = chunksOf(bytes, c.split)
    const { events, tooLarge } = runDecoder(chunks, DECODER_MAX)
    const verdict = judge(ref, events, tooLarge ? 'too_large' : 'none', undefined, DECODER_MAX)
    tally.runs++
    tally.lines += c.text.split(/\r\n|\r|\n/).length
    tally.events += events.length
    if (!verdict.ok) throw new Error(`${verdict.why}\nbytes: ${JSON.stringify(bytes.toString('latin1').slice(0, 400))}`)
    if (verdict.note !== undefined) note(tally, verdict.note, JSON.stringify({ split: c.split.kind, text: bytes.toString('latin1') }))
  }), { numRuns: DECODER_RUNS, seed: SEED, interruptAfterTimeLimit: 20_000 })
  t.pass(`${tally.runs} streams decoded as the oracle says`)
  reportNotes(t, tally, 'decoder', false)
})

t.test('the decoder alone: small events whose blank line comes in its own chunk', async t => {
  const decoder = new SseDecoder(DECODER_MAX)
  let delivered = 0
  let error: unknown
  try {
    for (let i = 0; i < 1000; i++) {
      delivered += decoder.push(Buffer.from(`data: {"i":${i}}\n`)).length
      delivered += decoder.push(Buffer.from('\n')).length
    }
  } catch (err) {
    error = err
  }
  t.equal(error, undefined, `1,000 events of 10 bytes pass a 1 KiB bound (cut after ${delivered})`)
  for (const [name, terminator] of [['LF CR', '\n\r'], ['CRLF CR', '\r\n\r']] as const) {
    const other = new SseDecoder(DECODER_MAX)
    let n = 0
    let failed = false
    try {
      for (let i = 0; i < 1000; i++) n += other.push(Buffer.from(`data: {"i":${i}}${terminator}`)).length
    } catch {
      failed = true
    }
    t.notOk(failed, `1,000 events ended by ${name} (a valid SSE blank line) pass (cut after ${n})`)
  }
})

t.test('the decoder alone: a CR blank line at the end of a read, then an unterminated line', async t => {
  const decoder = new SseDecoder(DECODER_MAX)
  const first = decoder.push(Buffer.from('data: {"jsonrpc":"2.0","id":1,"result":{}}\r\r'))
  // eventsource-parser holds a final CR until it sees whether LF follows, so a
  // CR-terminated event comes out with the next read (or at the end of the body).
  t.same(first.map(dataOf), ['{"jsonrpc":"2.0","id":1,"result":{}}'], 'the event is complete when its blank line arrives')
  const rest = [...decoder.push(Buffer.from('data: partial')), ...decoder.end()]
  t.same([...first, ...rest].map(dataOf), ['{"jsonrpc":"2.0","id":1,"result":{}}'], 'and it is not lost when the body ends with an unterminated line')
})

// ---------------------------------------------------------------------------
// End to end

interface FuzzUpstream {
  url: string
  /** The next tools/call with this JSON-RPC id is answered with these chunks (`gapMs` apart, else one loop turn). */
  plan: (requestId: number, chunks: Buffer[], gapMs?: number) => void
  close: () => Promise<void>
}

async function startFuzzUpstream (t: Test): Promise<FuzzUpstream> {
  const plans = new Map<number, { chunks: Buffer[], gapMs: number }>()
  let sessions = 0
  const answer = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (req.method === 'GET') {
      res.writeHead(405, { allow: 'POST' }).end()
      return
    }
    if (req.method === 'DELETE') {
      res.writeHead(200).end()
      return
    }
    const message = await readMessage(req)
    if (message.method === 'initialize') {
      answerInitialize(res, message, `fuzz-${++sessions}`, '2025-06-18')
      return
    }
    if (message.id === undefined) {
      res.writeHead(202).end()
      return
    }
    const { chunks, gapMs } = plans.get(message.id) ?? { chunks: [], gapMs: 0 }
    plans.delete(message.id)
    res.writeHead(200, { 'content-type': 'text/event-stream' })
    res.flushHeaders()
    for (const chunk of chunks) {
      if (res.destroyed) return
      res.write(chunk)
      // A turn of the event loop between writes: the gateway reads them as separate chunks.
      if (gapMs > 0) await sleep(gapMs)
      else await nextTurn()
    }
    res.end()
  }
  const server = createServer((req, res) => { answer(req, res).catch(() => res.destroy()) })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`
  const close = async (): Promise<void> => {
    server.closeAllConnections()
    await new Promise<void>(resolve => server.close(() => resolve()))
  }
  t.teardown(close)
  return { url, plan: (id, chunks, gapMs = 0) => plans.set(id, { chunks, gapMs }), close }
}

interface Received {
  status: number
  /** The body ended cleanly (no reset after the head). */
  clean: boolean
  /** Still open when `holdMs` ran out (then closed here, not counted as a reset). */
  held: boolean
  events: Array<Ev & { id?: string }>
}

/** `holdMs`: how long a stream may stay open before it is taken as held and closed here. */
async function receive (url: string, init: { method: string, headers: Record<string, string>, body?: string }, holdMs = 15_000): Promise<Received> {
  const abort = new AbortController()
  let held = false
  const timer = setTimeout(() => { held = true; abort.abort() }, holdMs)
  try {
    const res = await request(url, { method: init.method as 'GET', headers: init.headers, body: init.body, signal: abort.signal })
    let text = ''
    let clean = true
    const decoder = new TextDecoder()
    try {
      for await (const chunk of res.body) text += decoder.decode(chunk as Buffer, { stream: true })
    } catch {
      clean = held
    }
    return { status: res.statusCode, clean, held, events: sseEvents(text).map(e => ({ data: e.data, type: typeOf(e.event), ...(e.id !== undefined && { id: e.id }) })) }
  } finally {
    clearTimeout(timer)
  }
}

/** A JSON-RPC result as the official SDK client reads one: what it stops resuming a stream at. */
function isSdkResult (event: Ev): boolean {
  if (event.type !== 'message') return false
  try {
    return isJSONRPCResultResponse(JSON.parse(event.data))
  } catch {
    return false
  }
}

t.test('end to end: random SSE answers through the gateway', async t => {
  const upstream = await startFuzzUpstream(t)
  const gw = await startGateway(t, 'memory', upstream.url, { MAX_EVENT_BYTES: String(E2E_MAX), SESSION_REQUESTS_PER_SECOND: '100000' })
  const mcpUrl = `${gw.url}/mcp`
  const session: RawSession = await rawInitialize(mcpUrl)
  const tally: Tally = { runs: 0, lines: 0, events: 0, notes: new Map() }
  let requestId = 1000
  let resumes = 0
  const started = Date.now()

  await fc.assert(fc.asyncProperty(caseArbitrary(E2E_MAX, 40), fc.array(fc.nat(), { minLength: 1, maxLength: 2 }), async (c, picks) => {
    const id = ++requestId
    const bytes = bytesOf(c, id)
    const ref = reference(bytes, E2E_MAX)
    upstream.plan(id, chunksOf(bytes, c.split))
    const got = await receive(mcpUrl, {
      method: 'POST',
      headers: session.headers(),
      body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'fuzz', arguments: {} } })
    })
    const fail = (why: string): never => { throw new Error(`${why}\nbytes: ${JSON.stringify(bytes.toString('latin1').slice(0, 600))}\nsplit: ${JSON.stringify(c.split)}`) }
    if (got.status !== 200) fail(`HTTP ${got.status}`)
    if (!got.clean) fail('the answer was reset after its head')
    // Every event carries a gateway id: one stream, sequence 1..n.
    const positions = got.events.map(e => decodeEventId(e.id))
    positions.forEach((p, i) => {
      if (p === null || p.seq !== i + 1 || p.streamId !== positions[0]?.streamId || p.epoch !== positions[0]?.epoch) fail(`event ${i} has id ${got.events[i]?.id ?? '(none)'}`)
    })
    // The gateway ends a cut answer with a gap marker (too large) and, when the response
    // had not come yet, its JSON-RPC error answer.
    let tail = got.events
    const last = tail.at(-1)
    const errorMessage = last === undefined ? undefined : gatewayError(last.data)
    if (errorMessage !== undefined) tail = tail.slice(0, -1)
    const marker = tail.at(-1)?.type === 'gateway-gap' && /"event_too_large"/.test(tail.at(-1)?.data ?? '')
    const upstreamEvents = marker ? tail.slice(0, -1) : tail
    const cut = marker || (errorMessage !== undefined && /MAX_EVENT_BYTES/.test(errorMessage)) ? 'too_large' : errorMessage === undefined ? 'none' : 'broke_off'
    const verdict = judge(ref, upstreamEvents, cut, id, E2E_MAX, errorMessage !== undefined)
    if (!verdict.ok) fail(verdict.why)
    if (verdict.ok && verdict.note !== undefined) note(tally, verdict.note, JSON.stringify({ split: c.split, text: bytes.toString('latin1') }))
    tally.runs++
    tally.lines += c.text.split(/\r\n|\r|\n/).length
    tally.events += got.events.length

    // Resuming from any forwarded id yields exactly the rest.
    for (const pick of picks) {
      if (got.events.length === 0) break
      const from = pick % got.events.length
      const rest = got.events.slice(from + 1)
      // Past the end of a finished stream: its last event once more, then the end after a
      // result, else held open (an SDK client resuming a stream that ends without a result
      // would reconnect for ever); held here for a moment, then closed.
      const pastEnd = rest.length === 0
      const resumed = await receive(mcpUrl, { method: 'GET', headers: session.getHeaders(got.events[from]?.id) }, pastEnd ? 300 : 15_000)
      resumes++
      if (pastEnd) {
        const lastEvent = got.events[from] as Ev
        if (resumed.status !== 200 || JSON.stringify(resumed.events) !== JSON.stringify(got.events.slice(from))) {
          fail(`resume past the end: HTTP ${resumed.status}, ${JSON.stringify(resumed.events).slice(0, 300)}`)
        }
        if (resumed.held === isSdkResult(lastEvent)) fail(`resume past the end: ${resumed.held ? 'held open after a result' : 'ended after no result'}`)
        continue
      }
      if (resumed.status !== 200 || !resumed.clean || resumed.held) fail(`resume from event ${from}: HTTP ${resumed.status}, clean ${String(resumed.clean)}, held ${String(resumed.held)}`)
      if (JSON.stringify(resumed.events) !== JSON.stringify(rest)) {
        fail(`resume from event ${from}: expected ${rest.length} events, got ${resumed.events.length}: ${JSON.stringify(resumed.events).slice(0, 300)}`)
      }
    }
  }), { numRuns: E2E_RUNS, seed: SEED, timeout: 20_000, endOnFailure: true, interruptAfterTimeLimit: 75_000 })
  // Bounded in time as well as in runs (interruptAfterTimeLimit): on a loaded machine
  // fewer runs fit in the file's timeout, but never too few to mean anything.
  t.ok(tally.runs >= Math.min(E2E_RUNS, 50), `at least 50 end-to-end runs (${tally.runs})`)
  t.pass(`${tally.runs} answers, ${resumes} resumes, as the oracle says (${Date.now() - started} ms)`)
  reportNotes(t, tally, 'end to end', true)
  t.equal((await exchange(`${gw.adminUrl}/healthz`)).status, 200, 'the gateway still answers /healthz')
})

t.test('end to end: the deterministic cases behind the known failures', async t => {
  const upstream = await startFuzzUpstream(t)
  const gw = await startGateway(t, 'memory', upstream.url, { MAX_EVENT_BYTES: String(E2E_MAX) })
  const mcpUrl = `${gw.url}/mcp`
  const session = await rawInitialize(mcpUrl)
  const call = async (id: number, chunks: Buffer[], gapMs = 0): Promise<Received> => {
    upstream.plan(id, chunks, gapMs)
    return await receive(mcpUrl, { method: 'POST', headers: session.headers(), body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'fuzz', arguments: {} } }) })
  }

  t.test('an upstream that writes the blank line after each event separately', async t => {
    const chunks: Buffer[] = []
    for (let i = 0; i < 600; i++) chunks.push(Buffer.from(`data: {"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":${i}}}\n`), Buffer.from('\n'))
    chunks.push(Buffer.from('data: {"jsonrpc":"2.0","id":1,"result":{}}\n'), Buffer.from('\n'))
    const got = await call(1, chunks)
    t.equal(got.status, 200)
    t.ok(got.clean, 'the body ends cleanly')
    const errors = got.events.filter(e => gatewayError(e.data) !== undefined)
    t.comment(`forwarded ${got.events.length - errors.length} of 601 events${errors[0] === undefined ? '' : `, then: ${errors[0].data}`}`)
    t.equal(got.events.length, 601, 'all 600 notifications and the response arrive')
    t.same(errors, [], 'no error answer')
  })

  t.test('the response ended by CR CR, then an unterminated line', async t => {
    // 50 ms apart, so the gateway reads them apart.
    const got = await call(3, [Buffer.from('data: {"jsonrpc":"2.0","id":3,"result":{"ok":true}}\r\r'), Buffer.from('data: partial')], 50)
    t.equal(got.status, 200)
    const answers = got.events.filter(e => isResponseTo(e.data, 3))
    t.comment(`answers for request 3: ${answers.map(a => a.data).join(' | ')}`)
    t.ok(answers.length === 1 && gatewayError(answers[0]?.data ?? '') === undefined, 'the upstream\'s response arrives')
  })

  t.test('the response, then an event over MAX_EVENT_BYTES', async t => {
    const got = await call(2, [
      Buffer.from('data: {"jsonrpc":"2.0","id":2,"result":{"ok":true}}\n\n'),
      Buffer.from(`data: ${'x'.repeat(E2E_MAX + 10)}\n\n`)
    ])
    t.equal(got.status, 200)
    const answers = got.events.filter(e => isResponseTo(e.data, 2))
    t.ok(isResponseTo(answers[0]?.data ?? '', 2) && JSON.parse(answers[0]?.data ?? '{}').result?.ok === true, 'the upstream\'s response arrives first')
    t.equal(answers.length, 1, `exactly one answer for request 2 (got ${answers.length}: ${answers.map(a => a.data.slice(0, 80)).join(' | ')})`)
  })
})
