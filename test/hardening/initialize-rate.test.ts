// INITIALIZES_PER_MINUTE_PER_ADDRESS holds whatever the gateway can read of
// the body: an initialize the upstream reads as one (a byte order mark,
// UTF-16, as express.json() decodes them) or a session the upstream issues
// under the 2026-07-28 revision is counted where the session is issued, and
// refused past the limit with its upstream session ended; a compressed body
// is refused before it goes anywhere. A real gateway in front of a
// hand-written upstream that reads bodies as express.json() does, raw HTTP.
import { createServer } from 'node:http'
import { gzipSync } from 'node:zlib'
import t from 'tap'
import type { Test } from 'tap'
import type { MemoryEventStore } from '../../src/store/memory/memory-store.js'
import { startGateway } from '../fixtures/gateway.js'
import { exchange, jsonRpcError, until, type Answer } from '../fixtures/hardening.js'
import { listenUntilEnd, readMessageAsExpress } from '../fixtures/hand-upstream.js'

const LIMIT = 5
const ATTEMPTS = 8
const INIT = JSON.stringify({ jsonrpc: '2.0', id: 0, method: 'initialize', params: { protocolVersion: '2025-11-25', capabilities: {}, clientInfo: { name: 'flood', version: '0' } } })

/** An upstream that makes a session for every session-less initialize it can read, and holds every GET. */
async function startUpstream (t: Test): Promise<{ url: string, issued: string[], deleted: string[], gets: () => number, posts: Array<string | undefined> }> {
  const issued: string[] = []
  const deleted: string[] = []
  const posts: Array<string | undefined> = []
  let gets = 0
  const server = createServer((req, res) => {
    const sessionId = req.headers['mcp-session-id'] as string | undefined
    if (req.method === 'GET') {
      gets++
      res.writeHead(200, { 'content-type': 'text/event-stream' })
      res.flushHeaders()
      return
    }
    if (req.method === 'DELETE') {
      if (sessionId !== undefined) deleted.push(sessionId)
      res.writeHead(200).end()
      return
    }
    posts.push(req.headers['content-encoding'])
    readMessageAsExpress(req).then(message => {
      if (message.method === 'initialize' && sessionId === undefined) {
        const id = `up-${issued.length + 1}`
        issued.push(id)
        res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': id })
        res.end(JSON.stringify({ jsonrpc: '2.0', id: message.id, result: { protocolVersion: '2025-11-25', capabilities: {}, serverInfo: { name: 'x', version: '1' } } }))
        return
      }
      res.writeHead(202).end()
    }, () => res.writeHead(400).end())
  })
  const url = await listenUntilEnd(t, server)
  return { url, issued, deleted, gets: () => gets, posts }
}

t.test('initializes the gateway cannot read as such are counted where the upstream issues their session', async t => {
  const upstream = await startUpstream(t)
  // The test stands for a trusted proxy: X-Forwarded-For says which client each request is.
  const gw = await startGateway(t, 'memory', upstream.url, {
    MAX_SESSIONS: '20', TRUSTED_PROXIES: 'loopback', INITIALIZES_PER_MINUTE_PER_ADDRESS: String(LIMIT), SESSION_REQUESTS_PER_SECOND: '1000'
  })
  const mcpUrl = `${gw.url}/mcp`
  const store = gw.store as MemoryEventStore
  const flood = async (address: string, headers: Record<string, string>, body: Buffer): Promise<Answer[]> => {
    const answers: Answer[] = []
    for (let i = 0; i < ATTEMPTS; i++) {
      answers.push(await exchange(mcpUrl, {
        method: 'POST',
        headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-protocol-version': '2025-11-25', 'x-forwarded-for': address, authorization: `Bearer rotating-${address}-${i}`, ...headers },
        body
      }))
    }
    return answers
  }
  const variants: Array<{ name: string, address: string, headers: Record<string, string>, body: Buffer, sessions: number }> = [
    { name: 'with a UTF-8 byte order mark', address: '198.51.100.1', headers: {}, body: Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(INIT)]), sessions: LIMIT },
    { name: 'in UTF-16', address: '198.51.100.2', headers: { 'content-type': 'application/json; charset=utf-16' }, body: Buffer.from(`\ufeff${INIT}`, 'utf16le'), sessions: LIMIT },
    // The 2026-07-28 revision is proxied transparently: the gateway records no session, the upstream made one.
    { name: 'under MCP-Protocol-Version 2026-07-28', address: '198.51.100.3', headers: { 'mcp-protocol-version': '2026-07-28' }, body: Buffer.from(INIT), sessions: 0 }
  ]
  for (const variant of variants) {
    const before = { issued: upstream.issued.length, sessions: store.sessionCount }
    const answers = await flood(variant.address, variant.headers, variant.body)
    t.same(answers.map(a => a.status), [...Array(LIMIT).fill(200), ...Array(ATTEMPTS - LIMIT).fill(429)], `${variant.name}: ${LIMIT} served, then 429`)
    const refused = answers.slice(LIMIT)
    t.ok(refused.every(a => Number(a.headers['retry-after']) >= 1), `${variant.name}: with Retry-After`)
    t.ok(refused.every(a => jsonRpcError(a.text)?.message.includes('INITIALIZES_PER_MINUTE_PER_ADDRESS') === true), `${variant.name}: the initialize limit's error`)
    t.equal(upstream.issued.length - before.issued, ATTEMPTS, `${variant.name}: the upstream read each as an initialize`)
    t.equal(store.sessionCount - before.sessions, variant.sessions, `${variant.name}: the refused left no session in the gateway`)
    const refusedUpstream = upstream.issued.slice(before.issued + LIMIT)
    t.ok(await until(() => refusedUpstream.every(id => upstream.deleted.includes(id)), 5000), `${variant.name}: the refused sessions were deleted upstream`)
    t.notOk(upstream.issued.slice(before.issued, before.issued + LIMIT).some(id => upstream.deleted.includes(id)), `${variant.name}: the served ones were not`)
  }
  // Only the served legacy sessions opened an upstream GET (the rest would have held MAX_SESSIONS' 20).
  t.ok(await until(() => upstream.gets() === 2 * LIMIT, 5000), 'the served sessions\' upstream GETs open')
  await new Promise(resolve => setTimeout(resolve, 200))
  t.equal(upstream.gets(), 2 * LIMIT, `upstream GETs: ${2 * LIMIT}, for the served legacy sessions only`)

  // A plain initialize counted before the upstream is not counted again where its session is issued.
  const plain = await flood('198.51.100.4', {}, Buffer.from(INIT))
  t.same(plain.map(a => a.status), [...Array(LIMIT).fill(200), ...Array(ATTEMPTS - LIMIT).fill(429)], `plain: ${LIMIT} served, then 429`)
})

t.test('a compressed body is refused with 415 before it reaches the upstream', async t => {
  const upstream = await startUpstream(t)
  const gw = await startGateway(t, 'memory', upstream.url, { TRUSTED_PROXIES: 'loopback', INITIALIZES_PER_MINUTE_PER_ADDRESS: String(LIMIT) })
  const mcpUrl = `${gw.url}/mcp`
  const answers: Answer[] = []
  for (let i = 0; i < ATTEMPTS; i++) {
    answers.push(await exchange(mcpUrl, {
      method: 'POST',
      headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-protocol-version': '2025-11-25', 'content-encoding': 'gzip', 'x-forwarded-for': '198.51.100.9', authorization: `Bearer gz-${i}` },
      body: gzipSync(INIT)
    }))
  }
  t.same(answers.map(a => a.status), Array(ATTEMPTS).fill(415), 'every gzip initialize: 415')
  t.equal(answers[0]?.headers['accept-encoding'], 'identity', 'naming the coding accepted')
  t.match(jsonRpcError(answers[0]?.text ?? '')?.message, /not compressed/)
  // Nothing compressed reaches the upstream: it would inflate past MAX_BODY_BYTES there.
  t.same(upstream.posts, [], 'no POST reached the upstream')
  t.equal((gw.store as MemoryEventStore).sessionCount, 0, 'no session')

  const identity = await exchange(mcpUrl, {
    method: 'POST',
    headers: { accept: 'application/json, text/event-stream', 'content-type': 'application/json', 'mcp-protocol-version': '2025-11-25', 'content-encoding': 'identity' },
    body: INIT
  })
  t.equal(identity.status, 200, 'Content-Encoding: identity is served')
})
