// The product's promise, end to end: the official SDK client talks to an SDK
// upstream WITHOUT an event store, through the gateway, across a proxy that cuts
// every connection several times. Every notification and the tool result arrive
// exactly once and in order, on both stores. test/e2e/direct-loss.test.ts runs the
// same harness without the gateway and shows the loss.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startCutProxy } from '../fixtures/cut-proxy.js'
import { checkDelivery, connectClient, formatRanges, sequencesOf, waitUntil } from '../fixtures/mcp-client.js'
import { startGateway, type StoreKind } from '../fixtures/gateway.js'

const COUNT = 300
const INTERVAL_MS = 5
const CUTS = 3

for (const kind of ['memory', 'redis'] as StoreKind[]) {
  t.test(`${kind} store`, async (t) => {
    const upstream = await startExampleServer()
    t.teardown(() => upstream.close())
    const { port } = await startGateway(t, kind, upstream.url)
    const proxy = await startCutProxy(port)
    t.teardown(() => proxy.close())

    t.test('standalone stream: nothing sent during the gaps is lost', async (t) => {
      // The SDK client's defaults: 2 reconnection attempts, the server's retry hint.
      const mcp = await connectClient(proxy.url('/mcp'))
      t.teardown(() => mcp.close())
      t.ok(await waitUntil(() => mcp.exchanges.some(e => e.method === 'GET' && e.status === 200), 5000), 'standalone GET open')
      await mcp.client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: INTERVAL_MS } })
      const received = (): number[] => sequencesOf(mcp.notifications, 'broadcast')
      let cuts = 0
      for (let i = 0; i < CUTS; i++) {
        const target = Math.floor(COUNT * (i + 1) / (CUTS + 1))
        await waitUntil(() => received().length >= target, 10_000)
        cuts += proxy.cutAll()
      }
      await waitUntil(() => received().length >= COUNT, 20_000)
      await sleep(200) // a duplicate would arrive now
      const report = checkDelivery(received(), COUNT)
      t.comment(`${kind}/standalone: sent ${COUNT}, received ${report.received}, connections cut ${cuts}, lost ${report.lost.length} [${formatRanges(report.lost)}], duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}`)
      t.ok(cuts >= CUTS, 'connections were cut')
      t.same(report.lost, [], 'nothing lost')
      t.same(report.duplicated, [], 'nothing duplicated')
      t.equal(report.outOfOrder, 0, 'in order')
      t.ok(mcp.exchanges.some(e => e.method === 'GET' && e.lastEventId !== undefined && e.status === 200), 'the client resumed with Last-Event-ID')
    })

    t.test('request stream: notifications and the tool result survive the cuts', async (t) => {
      const mcp = await connectClient(proxy.url('/mcp'))
      t.teardown(() => mcp.close())
      const received = (): number[] => sequencesOf(mcp.notifications, 'stream_notifications')
      const call = mcp.client.callTool({ name: 'stream_notifications', arguments: { count: COUNT, intervalMs: INTERVAL_MS } }, undefined, { timeout: 60_000 })
      let cuts = 0
      for (let i = 0; i < CUTS; i++) {
        const target = Math.floor(COUNT * (i + 1) / (CUTS + 1))
        await waitUntil(() => received().length >= target, 10_000)
        cuts += proxy.cutAll()
      }
      const result = await call
      t.same(result.content, [{ type: 'text', text: `done ${COUNT}` }], 'the tool result arrived')
      await sleep(200)
      const report = checkDelivery(received(), COUNT)
      t.comment(`${kind}/request: sent ${COUNT}, received ${report.received}, connections cut ${cuts}, lost ${report.lost.length} [${formatRanges(report.lost)}], duplicated ${report.duplicated.length}, out of order ${report.outOfOrder}`)
      t.ok(cuts >= CUTS, 'connections were cut')
      t.same(report.lost, [], 'nothing lost')
      t.same(report.duplicated, [], 'nothing duplicated')
      t.equal(report.outOfOrder, 0, 'in order')
      t.ok(mcp.exchanges.some(e => e.method === 'GET' && e.lastEventId !== undefined && !e.lastEventId.includes('.s.')), 'the request stream was resumed by GET + Last-Event-ID')
    })
  })
}
