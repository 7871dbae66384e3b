// An upstream that is resumable itself (the SDK server with an event store)
// and closes its SSE streams after asking the client (SEP-1699 polling: the
// client is expected to come back with GET + Last-Event-ID). The gateway
// resumes the upstream's streams itself, honouring its retry hint, so the
// client sees one continuous stream, with the gateway's ids only. Both stores.
import t from 'tap'
import { CreateMessageRequestSchema, ElicitRequestSchema, ListRootsRequestSchema } from '@modelcontextprotocol/sdk/types.js'
import { decodeEventId } from '../../src/protocol/event-id.js'
import { startAskingServer, TestEventStore, type AskKind } from '../fixtures/asking-server.js'
import { connectClient } from '../fixtures/mcp-client.js'
import { startGateway, type StoreKind } from '../fixtures/gateway.js'

const EXPECTED: Record<AskKind, string> = {
  sampling: 'sampled: {"type":"text","text":"ok"}',
  elicitation: 'elicited: {"name":"ada"}',
  roots: 'roots: [{"uri":"file:///work","name":"work"}]'
}

for (const kind of ['memory', 'redis'] as StoreKind[]) {
  for (const onRequestStream of [true, false]) {
    t.test(`${kind} store: the upstream closes its streams after asking on the ${onRequestStream ? 'request' : 'standalone'} stream`, async (t) => {
      const upstream = await startAskingServer({ eventStore: new TestEventStore(), retryInterval: 200, closeAfterAsk: true })
      const { url } = await startGateway(t, kind, upstream.url)
      const mcp = await connectClient(`${url}/mcp`, { capabilities: { sampling: {}, elicitation: { form: {} }, roots: {} } })
      mcp.client.setRequestHandler(CreateMessageRequestSchema, async () => ({ role: 'assistant', content: { type: 'text', text: 'ok' }, model: 'm' }))
      mcp.client.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { name: 'ada' } }))
      mcp.client.setRequestHandler(ListRootsRequestSchema, async () => ({ roots: [{ uri: 'file:///work', name: 'work' }] }))
      // Both streams are closed after each ask: the next ask finds them resumed upstream.
      // The SDK server gives its GET stream no priming event: until its first event the
      // stream has no id to resume from, and what it stores while no GET is open is out
      // of reach (a direct client loses it too). So the session asks there first.
      const warmUp = await mcp.client.callTool({ name: 'ask', arguments: { kind: 'roots', onRequestStream: false } }, undefined, { timeout: 15_000 })
      t.equal((warmUp.content as Array<{ text: string }>)[0]?.text, EXPECTED.roots, 'first ask on the standalone stream')
      for (const k of ['sampling', 'elicitation', 'roots'] as AskKind[]) {
        for (const related of [onRequestStream, !onRequestStream]) {
          const result = await mcp.client.callTool({ name: 'ask', arguments: { kind: k, onRequestStream: related } }, undefined, { timeout: 15_000 })
          t.equal((result.content as Array<{ text: string }>)[0]?.text, EXPECTED[k], `${k} (${related ? 'request' : 'standalone'} stream): the tool result arrived, not the gateway's error`)
        }
      }
      const ids = mcp.exchanges.flatMap(e => e.events.map(ev => ev.id)).filter((id): id is string => id !== undefined)
      t.ok(ids.length > 0, 'events carried ids')
      t.same(ids.filter(id => decodeEventId(id) === null), [], 'every id the client saw is the gateway\'s')
      const posts = mcp.exchanges.filter(e => e.method === 'POST' && e.contentType?.includes('text/event-stream') === true)
      for (const post of posts) {
        t.ok(post.events.filter(ev => ev.data === '').length <= 1, 'no upstream priming event passed on (the gateway\'s own opens the stream)')
      }
      t.notOk(mcp.exchanges.some(e => e.method === 'GET' && e.lastEventId !== undefined && !e.lastEventId.includes('.s.')), 'the client never had to resume a request stream itself')
      // The upstream goes before the gateway (its teardown, from startGateway): the
      // upstream's resumed streams stay open until it goes.
      await mcp.close()
      await upstream.close()
    })
  }
}
