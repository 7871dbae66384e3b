// Requests the server sends the client (sampling, elicitation, roots) complete
// through the gateway in front of an SDK server without an event store: on the
// standalone stream, which the gateway holds from initialize on (the SDK server
// drops what it sends while no GET is open), also when the client's GET comes
// late, and on the tool call's own stream; also when the client's connection is
// cut while its handler runs. Both stores.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema } from '@modelcontextprotocol/sdk/types.js'
import { startAskingServer, type AskKind } from '../fixtures/asking-server.js'
import { startCutProxy, type CutProxy } from '../fixtures/cut-proxy.js'
import { connectClient, type ConnectOptions, type McpTestClient } from '../fixtures/mcp-client.js'
import { startGateway, type StoreKind } from '../fixtures/gateway.js'

const KINDS: AskKind[] = ['sampling', 'elicitation', 'roots']
const EXPECTED: Record<AskKind, string> = {
  sampling: 'sampled: {"type":"text","text":"ok"}',
  elicitation: 'elicited: {"name":"ada"}',
  roots: 'roots: [{"uri":"file:///work","name":"work"}]'
}

/** A client that answers every server request, after `handlerMs` (cutting its connections meanwhile when `proxy` is given). */
async function askingClient (url: string, options: ConnectOptions & { handlerMs?: number, proxy?: CutProxy } = {}): Promise<McpTestClient & { cuts: () => number }> {
  let cuts = 0
  const mcp = await connectClient(url, {
    ...options,
    capabilities: { sampling: {}, elicitation: { form: {} }, roots: { listChanged: false } }
  })
  const handling = async (): Promise<void> => {
    if (options.proxy !== undefined) cuts += options.proxy.cutAll()
    await sleep(options.handlerMs ?? 0)
  }
  mcp.client.setRequestHandler(CreateMessageRequestSchema, async () => {
    await handling()
    return { role: 'assistant', content: { type: 'text', text: 'ok' }, model: 'test' }
  })
  mcp.client.setRequestHandler(ElicitRequestSchema, async () => {
    await handling()
    return { action: 'accept', content: { name: 'ada' } }
  })
  mcp.client.setRequestHandler(ListRootsRequestSchema, async () => {
    await handling()
    return { roots: [{ uri: 'file:///work', name: 'work' }] }
  })
  return Object.assign(mcp, { cuts: () => cuts })
}

async function ask (mcp: McpTestClient, kind: AskKind, onRequestStream: boolean): Promise<string> {
  const result = await mcp.client.callTool({ name: 'ask', arguments: { kind, onRequestStream } }, undefined, { timeout: 15_000 })
  return (result.content as Array<{ text: string }>)[0]?.text ?? JSON.stringify(result)
}

for (const kind of ['memory', 'redis'] as StoreKind[]) {
  t.test(`${kind} store`, async (t) => {
    const upstream = await startAskingServer()
    t.teardown(() => upstream.close())
    const { url, port } = await startGateway(t, kind, upstream.url)
    const proxy = await startCutProxy(port)
    t.teardown(() => proxy.close())

    for (const stream of ['standalone', 'request'] as const) {
      t.test(`${stream} stream: the tool call right after connecting`, async (t) => {
        const mcp = await askingClient(`${url}/mcp`)
        t.teardown(() => mcp.close())
        for (const k of KINDS) t.equal(await ask(mcp, k, stream === 'request'), EXPECTED[k], `${k} answered`)
      })
    }

    t.test('standalone stream: the client\'s GET comes 300 ms after the tool call', async (t) => {
      const mcp = await askingClient(`${url}/mcp`, { delayFirstGetMs: 300 })
      t.teardown(() => mcp.close())
      for (const k of KINDS) {
        const answered = ask(mcp, k, false)
        if (k === 'sampling') {
          await sleep(100)
          t.notOk(mcp.exchanges.some(e => e.method === 'GET' && e.status !== undefined), 'no client GET yet while the server asked')
        }
        t.equal(await answered, EXPECTED[k], `${k} answered`)
      }
    })

    for (const stream of ['standalone', 'request'] as const) {
      t.test(`${stream} stream: the client's connections are cut while its handler runs`, async (t) => {
        const mcp = await askingClient(proxy.url('/mcp'), { handlerMs: 200, proxy })
        t.teardown(() => mcp.close())
        for (const k of KINDS) t.equal(await ask(mcp, k, stream === 'request'), EXPECTED[k], `${k} answered`)
        t.ok(mcp.cuts() > 0, 'connections were cut')
      })
    }

    t.test('the upstream dropped nothing', async (t) => {
      t.same(upstream.failures, [])
    })
  })
}
