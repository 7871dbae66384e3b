// A resume past the end of a finished request stream: the official SDK client
// resuming a tool call with the last resumption token it saved (as an app that
// restarted would) gets the call's response again, on an SSE stream (a GET is
// answered with text/event-stream or 405 only), and does not loop. A request
// answered with an error: the SDK client resumes its stream by itself (it stops
// only at a result), gets the error again on a stream held open, and does not
// loop either; past the bound of such streams per session, 429 ends its retries.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { CallToolResultSchema, EmptyResultSchema, McpError } from '@modelcontextprotocol/sdk/types.js'
import { startExampleServer } from '../../examples/mcp-server.js'
import { connectClient } from '../fixtures/mcp-client.js'
import { startGateway, type StoreKind } from '../fixtures/gateway.js'
import { ANSWERED_HOLDS_PER_SESSION } from '../../src/routes/mcp/answered-holds.js'

for (const kind of ['memory', 'redis'] as StoreKind[]) {
  t.test(`${kind} store`, async (t) => {
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    const { url } = await startGateway(t, kind, upstream.url)
    const mcp = await connectClient(`${url}/mcp`)
    t.teardown(() => mcp.close())
    const call = { method: 'tools/call' as const, params: { name: 'stream_notifications', arguments: { count: 3, intervalMs: 1 } } }
    let token: string | undefined
    const first = await mcp.client.request(call, CallToolResultSchema, { onresumptiontoken: (id) => { token = id } })
    t.ok(token !== undefined, 'the client saved a resumption token')
    const again = await mcp.client.request(call, CallToolResultSchema, { resumptionToken: token as string, timeout: 5000 })
    t.same(again.content, first.content, 'the resume past the end gets the response again')
    await sleep(1500) // a reconnection loop would show now
    const resumes = mcp.exchanges.filter(e => e.method === 'GET' && e.lastEventId === token)
    t.equal(resumes.length, 1, 'one resume, no reconnection loop')
    t.equal(resumes[0]?.status, 200)
    t.match(resumes[0]?.contentType ?? '', /^text\/event-stream/, 'an SSE stream, not 204')
  })
}

for (const kind of ['memory', 'redis'] as StoreKind[]) {
  t.test(`${kind} store: requests answered with an error`, async (t) => {
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    const { url } = await startGateway(t, kind, upstream.url)
    const mcp = await connectClient(`${url}/mcp`)
    t.teardown(() => mcp.close())
    const failing = async (): Promise<unknown> => await mcp.client.request({ method: 'tools/nonexistent' }, EmptyResultSchema, { timeout: 5000 })
      .then(() => 'a result', (err: unknown) => err instanceof McpError ? err.code : err)
    const resumes = (): typeof mcp.exchanges => mcp.exchanges.filter(e => e.method === 'GET' && e.lastEventId !== undefined)

    t.equal(await failing(), -32601, 'the upstream answers with an error')
    // The SDK client resumes the stream 1 s after it ended; a stream that ends again is resumed again.
    await sleep(3500)
    const [held, ...more] = resumes()
    t.equal(more.length, 0, `one resume of the answered request, no reconnection loop (${resumes().length})`)
    t.equal(held?.status, 200)
    t.equal(held?.ended, false, 'held open')
    const messages = held?.events.filter(e => e.data !== '').map(e => JSON.parse(e.data) as unknown)
    t.match(messages, [{ error: { code: -32601 } }], 'with the error once more')

    const bound = ANSWERED_HOLDS_PER_SESSION
    for (let i = 1; i <= bound; i++) t.equal(await failing(), -32601, `error ${i + 1}`)
    await sleep(5000)
    const settled = resumes()
    t.equal(settled.filter(e => e.status === 200 && !e.ended).length, bound, `${bound} held open, one per session at most`)
    const refused = settled.filter(e => e.status === 429)
    t.ok(refused.length >= 1 && refused.length <= 2, `the next refused (${refused.length} tries: the SDK client gives up after its retries)`)
    t.equal(settled.length, bound + refused.length, 'nothing else')
    await sleep(2500)
    t.equal(resumes().length, settled.length, 'and quiet since')
  })
}
