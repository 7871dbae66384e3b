// A resume past the end of a finished request stream: the official SDK client
// resuming a tool call with the last resumption token it saved (as an app that
// restarted would) gets the call's response again, on an SSE stream (a GET is
// answered with text/event-stream or 405 only), and does not loop.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js'
import { startExampleServer } from '../../examples/mcp-server.js'
import { connectClient } from '../fixtures/mcp-client.js'
import { startGateway, type StoreKind } from '../fixtures/gateway.js'

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
