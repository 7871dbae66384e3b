// Pure pieces of re-establishment: reading an answer up to its JSON-RPC response
// (bytes kept for the client), what an initialize result promised, and which
// requests set session state.
import t from 'tap'
import { Readable } from 'node:stream'
import { canonicalJson, initializePromise } from '../../src/protocol/initialize.js'
import { sessionStateChange } from '../../src/protocol/session-state.js'
import { readJsonRpcAnswer } from '../../src/recording/json-rpc-answer.js'
import type { UpstreamResponse } from '../../src/upstream/client.js'

async function text (body: Readable): Promise<string> {
  const chunks: Buffer[] = []
  for await (const chunk of body) chunks.push(Buffer.from(chunk as Buffer))
  return Buffer.concat(chunks).toString('utf8')
}

t.test('readJsonRpcAnswer: SSE read until the response, every byte passed on', async t => {
  const events = [
    'event: message\ndata: {"jsonrpc":"2.0","method":"notifications/message","params":{}}\n\n',
    'id: 7\ndata: {"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{}}}\n\n',
    'data: {"after":true}\n\n'
  ]
  const parts = events.join('').match(/[\s\S]{1,13}/g) as string[]
  let pulled = 0
  const body = new Readable({ read () { if (pulled < parts.length) this.push(Buffer.from(parts[pulled++] as string)); else this.push(null) } })
  const answer = await readJsonRpcAnswer(body, 'sse', 1, 1 << 20)
  t.match(answer.response, { id: 1, result: { protocolVersion: '2025-06-18' } }, 'the response found')
  t.equal(await text(answer.body), events.join(''), 'the answer passed on whole, in order')
})

t.test('readJsonRpcAnswer: JSON bodies, other ids, errors and the bound', async t => {
  const json = '{"jsonrpc":"2.0","id":"a","result":{"ok":1}}'
  const found = await readJsonRpcAnswer(Readable.from([Buffer.from(json)]), 'json', 'a', 1024)
  t.same(found.response, { jsonrpc: '2.0', id: 'a', result: { ok: 1 } })
  t.equal(await text(found.body), json)
  t.equal((await readJsonRpcAnswer(Readable.from([Buffer.from(json)]), 'json', 'b', 1024)).response, undefined, 'another id')
  t.match((await readJsonRpcAnswer(Readable.from([Buffer.from('{"jsonrpc":"2.0","id":2,"error":{"code":-1}}')]), 'json', 2, 1024)).response, { error: { code: -1 } }, 'an error is a response')
  t.equal((await readJsonRpcAnswer(Readable.from([Buffer.from('not json')]), 'json', 2, 1024)).response, undefined)
  const big = `data: ${'x'.repeat(100)}\n\ndata: {"jsonrpc":"2.0","id":3,"result":{}}\n\n`
  const bounded = await readJsonRpcAnswer(Readable.from([Buffer.from(big.slice(0, 60)), Buffer.from(big.slice(60))]), 'sse', 3, 50)
  t.equal(bounded.response, undefined, 'past the bound: not looked for further')
  t.equal(await text(bounded.body), big, 'and the answer still passed on whole')
  const failing = new Readable({ read () { this.destroy(new Error('cut')) } })
  await t.rejects(readJsonRpcAnswer(failing, 'sse', 1, 1024), /cut/, 'a broken answer fails')
})

t.test('initializePromise: version and capabilities, canonical', async t => {
  const a = initializePromise({ protocolVersion: '2025-06-18', capabilities: { tools: { listChanged: true }, logging: {} }, serverInfo: { name: 'x' } })
  const b = initializePromise({ serverInfo: { name: 'y' }, capabilities: { logging: {}, tools: { listChanged: true } }, protocolVersion: '2025-06-18' })
  t.equal(a, b, 'key order and serverInfo do not matter')
  t.not(initializePromise({ protocolVersion: '2025-03-26', capabilities: { logging: {}, tools: { listChanged: true } } }), a, 'another version')
  t.not(initializePromise({ protocolVersion: '2025-06-18', capabilities: { logging: {} } }), a, 'other capabilities')
  for (const bad of [undefined, null, 'x', {}, { protocolVersion: 1, capabilities: {} }, { protocolVersion: 'v', capabilities: null }]) t.equal(initializePromise(bad), undefined)
  t.equal(canonicalJson({ b: [{ d: 1, c: 2 }], a: null }), '{"a":null,"b":[{"c":2,"d":1}]}')
})

t.test('sessionStateChange: the requests a recipe keeps', async t => {
  const body = (o: unknown): Buffer => Buffer.from(JSON.stringify(o))
  const level = body({ jsonrpc: '2.0', id: 1, method: 'logging/setLevel', params: { level: 'debug' } })
  t.same(sessionStateChange(level), { kind: 'log_level', request: level.toString() })
  t.same(sessionStateChange(body({ jsonrpc: '2.0', id: 2, method: 'resources/subscribe', params: { uri: 'file:///a' } })), { kind: 'subscribe', uri: 'file:///a' })
  t.same(sessionStateChange(body({ jsonrpc: '2.0', id: 3, method: 'resources/unsubscribe', params: { uri: 'file:///a' } })), { kind: 'unsubscribe', uri: 'file:///a' })
  for (const other of [undefined, body({ method: 'tools/call', params: { name: 'logging/setLevel' } }), Buffer.from('logging/setLevel'), body([{ method: 'tools/list' }, 1]), body({ method: 'resources/subscribe', params: {} })]) {
    t.equal(sessionStateChange(other), undefined)
  }
})

t.test('sessionStateChange: what the upstream reads as a state request is one; only what replaying it needs is kept', async t => {
  // PHP's json_encode writes "/" as "\/" by default.
  t.same(sessionStateChange(Buffer.from('{"jsonrpc":"2.0","id":2,"method":"resources\\/subscribe","params":{"uri":"file:\\/\\/\\/a"}}')), { kind: 'subscribe', uri: 'file:///a' }, 'escaped slashes')
  t.same(sessionStateChange(Buffer.from('{"jsonrpc":"2.0","id":3,"method":"logging\\/setLevel","params":{"level":"info"}}')), { kind: 'log_level', request: '{"jsonrpc":"2.0","id":3,"method":"logging/setLevel","params":{"level":"info"}}' })
  const padded = Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: 'x', method: 'logging/setLevel', params: { level: 'error', _meta: { pad: 'p'.repeat(100_000) } } }))
  t.same(sessionStateChange(padded), { kind: 'log_level', request: '{"jsonrpc":"2.0","id":"x","method":"logging/setLevel","params":{"level":"error"}}' }, 'the level, not the body')
  t.equal(sessionStateChange(Buffer.from('{"jsonrpc":"2.0","id":4,"method":"logging/setLevel","params":{"level":"verbose"}}')), undefined, 'a level the specification does not have')
  const batch = Buffer.from(JSON.stringify([{ jsonrpc: '2.0', id: 5, method: 'tools/list' }, { jsonrpc: '2.0', id: 6, method: 'resources/subscribe', params: { uri: 'file:///b' } }]))
  t.same(sessionStateChange(batch), { kind: 'untracked' }, 'a batch that sets state: the recipe cannot follow it')
})

t.test('lostSession: 404, or a short 400 that speaks of the session id; any other answer handed on whole', async t => {
  const { lostSession } = await import('../../src/sessions/reestablish.js')
  const answer = (statusCode: number, body: string, pieces = 1, length = true): UpstreamResponse => {
    const bytes = Buffer.from(body)
    const size = Math.ceil(bytes.length / pieces)
    const chunks = Array.from({ length: pieces }, (_, i) => bytes.subarray(i * size, (i + 1) * size))
    return { statusCode, headers: length ? { 'content-length': String(bytes.length) } : {}, body: Readable.from(chunks) }
  }
  const sdkExample = '{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}'
  t.equal((await lostSession(answer(404, 'Session not found'))).lost, true, '404: lost')
  const told = await lostSession(answer(400, sdkExample))
  t.equal(told.lost, true, 'the SDK example\'s 400: lost')
  t.equal(await text(told.res.body), sdkExample, 'its body handed on whole')
  t.equal((await lostSession(answer(400, 'Invalid or missing session ID', 3, false))).lost, true, 'a chunked one too (the example\'s GET answer)')
  t.equal((await lostSession(answer(400, '{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}'))).lost, true, 'a new process of a one-session SDK server: lost')
  const parse = '{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}'
  const other = await lostSession(answer(400, parse))
  t.equal(other.lost, false, 'a 400 about something else: not lost')
  t.equal(await text(other.res.body), parse, 'its body handed on whole')
  const long = `{"message":"session ${'x'.repeat(5000)}"}`
  const longTold = await lostSession(answer(400, long, 7, false))
  t.equal(longTold.lost, false, 'a long 400 is not such an error')
  t.equal(await text(longTold.res.body), long, 'and is handed on whole, what was read first included')
  t.equal((await lostSession(answer(500, 'session'))).lost, false, 'another status: not lost')

  // A long 400 whose reader stops early: the upstream's body goes too.
  const source = Readable.from((function * () { for (let i = 0; i < 100; i++) yield Buffer.alloc(1000, 0x61) })())
  const passed = await lostSession({ statusCode: 400, headers: {}, body: source })
  passed.res.body.destroy()
  await new Promise(resolve => setImmediate(resolve))
  t.ok(source.destroyed, 'a long 400 handed on and dropped by its reader: the upstream body is let go')
})
