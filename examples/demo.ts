// `npm run demo`: the gateway's promise in under a minute, on the embedded store.
//
// It starts the bundled example MCP server (official SDK, no event store), runs
// the real gateway process in front of it (`node dist/src/main.js`), and drives
// the official SDK client through a TCP relay that drops the connection in the
// middle of two streams: a tool call streaming notifications on its POST answer,
// and a broadcast on the standalone GET stream. It then runs the same client
// against the upstream directly for contrast. It prints what was sent, received,
// lost and duplicated, and exits 0 only when nothing was lost through the gateway.
import { spawn, type ChildProcess } from 'node:child_process'
import { createServer as createNetServer, type AddressInfo } from 'node:net'
import { setTimeout as sleep } from 'node:timers/promises'
import { fileURLToPath } from 'node:url'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { Notification } from '@modelcontextprotocol/sdk/types.js'
import { startExampleServer } from './mcp-server.js'
import { startCutProxy, type CutProxy } from './cut-proxy.js'

const COUNT = 200
const INTERVAL_MS = 10
const CUTS = 2

interface Row { path: string, stream: string, sent: number, received: number, lost: number, duplicated: number, cuts: number, result: string }

async function freePort (): Promise<number> {
  const server = createNetServer()
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as AddressInfo
  await new Promise<void>(resolve => server.close(() => resolve()))
  return port
}

async function waitFor (condition: () => boolean | Promise<boolean>, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    if (await condition()) return true
    if (Date.now() > deadline) return false
    await sleep(20)
  }
}

function sequences (notifications: Notification[], tool: string): number[] {
  const out: number[] = []
  for (const n of notifications) {
    const data = n.params?.data as { tool?: string, seq?: number } | undefined
    if (n.method === 'notifications/message' && data?.tool === tool && typeof data.seq === 'number') out.push(data.seq)
  }
  return out
}

function tally (received: number[], sent: number): { lost: number, duplicated: number } {
  const seen = new Set(received)
  let lost = 0
  for (let i = 0; i < sent; i++) if (!seen.has(i)) lost++
  return { lost, duplicated: received.length - seen.size }
}

/** Runs both streams through `proxy`, cutting every connection CUTS times during each. */
async function exercise (label: string, proxy: CutProxy, callTimeoutMs: number): Promise<Row[]> {
  const notifications: Notification[] = []
  const client = new Client({ name: 'gateway-demo', version: '1.0.0' })
  client.fallbackNotificationHandler = async n => { notifications.push(n) }
  client.onerror = () => {}
  await client.connect(new StreamableHTTPClientTransport(new URL(proxy.url('/mcp'))))
  const rows: Row[] = []
  try {
    // 1. A tool call whose answer streams notifications, then its result.
    let cuts = 0
    const call = client.callTool({ name: 'stream_notifications', arguments: { count: COUNT, intervalMs: INTERVAL_MS } }, undefined, { timeout: callTimeoutMs })
      .then(r => (r.content as Array<{ text?: string }>)[0]?.text ?? 'no text', (err: Error) => `failed: ${err.message.slice(0, 40)}`)
    for (let i = 1; i <= CUTS; i++) {
      await waitFor(() => sequences(notifications, 'stream_notifications').length >= COUNT * i / (CUTS + 1), 10_000)
      cuts += proxy.cutAll()
    }
    const result = await call
    await sleep(300)
    const toolSeqs = sequences(notifications, 'stream_notifications')
    rows.push({ path: label, stream: 'tool call (POST stream)', sent: COUNT, received: toolSeqs.length, ...tally(toolSeqs, COUNT), cuts, result })

    // 2. A broadcast on the standalone GET stream.
    cuts = 0
    await client.callTool({ name: 'broadcast', arguments: { count: COUNT, intervalMs: INTERVAL_MS } })
    for (let i = 1; i <= CUTS; i++) {
      await waitFor(() => sequences(notifications, 'broadcast').length >= COUNT * i / (CUTS + 1), 10_000)
      cuts += proxy.cutAll()
    }
    // Until everything arrived, or nothing new came for 1.5 s (what was lost stays lost).
    let last = -1
    let lastChange = Date.now()
    await waitFor(() => {
      const n = sequences(notifications, 'broadcast').length
      if (n !== last) { last = n; lastChange = Date.now() }
      return n >= COUNT || Date.now() - lastChange > 1500
    }, 10_000)
    await sleep(300)
    const broadcastSeqs = sequences(notifications, 'broadcast')
    rows.push({ path: label, stream: 'broadcast (GET stream)', sent: COUNT, received: broadcastSeqs.length, ...tally(broadcastSeqs, COUNT), cuts, result: '-' })
  } finally {
    await client.close().catch(() => {})
  }
  return rows
}

function printTable (rows: Row[]): void {
  const header = ['path', 'stream', 'sent', 'received', 'lost', 'duplicated', 'cuts', 'tool result']
  const cells = rows.map(r => [r.path, r.stream, String(r.sent), String(r.received), String(r.lost), String(r.duplicated), String(r.cuts), r.result])
  const widths = header.map((h, i) => Math.max(h.length, ...cells.map(c => (c[i] as string).length)))
  const line = (c: string[]): string => c.map((v, i) => v.padEnd(widths[i] as number)).join('  ')
  console.log(line(header))
  console.log(widths.map(w => '-'.repeat(w)).join('  '))
  for (const c of cells) console.log(line(c))
}

async function main (): Promise<number> {
  const started = Date.now()
  const upstream = await startExampleServer()
  console.log(`example MCP server (official SDK, no event store): ${upstream.url}`)
  const port = await freePort()
  const adminPort = await freePort()
  const mainJs = fileURLToPath(new URL('../src/main.js', import.meta.url))
  const gateway: ChildProcess = spawn(process.execPath, [mainJs], {
    env: { ...process.env, UPSTREAM_URL: upstream.url, HOST: '127.0.0.1', PORT: String(port), ADMIN_HOST: '127.0.0.1', ADMIN_PORT: String(adminPort), LOG_LEVEL: 'warn', REDIS_URL: '' },
    stdio: ['ignore', 'pipe', 'inherit']
  })
  gateway.stdout?.on('data', (chunk: Buffer) => {
    for (const line of chunk.toString().split('\n').filter(Boolean)) {
      try {
        const entry = JSON.parse(line) as { msg?: string }
        console.log(`  [gateway] ${entry.msg ?? line}`)
      } catch {
        console.log(`  [gateway] ${line}`)
      }
    }
  })
  const proxies: CutProxy[] = []
  try {
    const ready = await waitFor(async () => {
      try { return (await fetch(`http://127.0.0.1:${adminPort}/readyz`)).ok } catch { return false }
    }, 15_000)
    if (!ready) throw new Error('the gateway did not become ready')
    console.log(`gateway (embedded store): http://127.0.0.1:${port}/mcp, admin http://127.0.0.1:${adminPort}`)
    console.log(`each stream sends ${COUNT} notifications ${INTERVAL_MS} ms apart; the connection is cut ${CUTS} times during each\n`)

    const throughGateway = await startCutProxy(port)
    proxies.push(throughGateway)
    const direct = await startCutProxy(Number(new URL(upstream.url).port))
    proxies.push(direct)
    const rows = [
      ...await exercise('via gateway', throughGateway, 20_000),
      // Directly, a cut tool call never completes: give up after 5 s instead of the SDK's 60.
      ...await exercise('direct', direct, 5_000)
    ]
    printTable(rows)
    const gatewayRows = rows.filter(r => r.path === 'via gateway')
    const ok = gatewayRows.every(r => r.lost === 0 && r.duplicated === 0 && r.cuts > 0) && gatewayRows[0]?.result === `done ${COUNT}`
    console.log(`\n${ok ? 'OK' : 'FAILED'}: through the gateway ${ok ? 'nothing was lost or duplicated' : 'messages were lost or duplicated'}; ` +
      `directly, ${rows.filter(r => r.path === 'direct').reduce((n, r) => n + r.lost, 0)} notifications were lost. (${((Date.now() - started) / 1000).toFixed(1)} s)`)
    return ok ? 0 : 1
  } finally {
    for (const p of proxies) await p.close()
    gateway.kill('SIGTERM')
    await new Promise(resolve => gateway.once('exit', resolve))
    await upstream.close()
  }
}

main().then(code => process.exit(code), (err: unknown) => {
  console.error(err)
  process.exit(1)
})
