// 1,000 concurrent sessions on one replica, each with its standalone stream
// open (so the replica holds 1,000 upstream GETs under 1,000 leases, renewed
// every tick): the replica's Redis connections do not grow.
import t from 'tap'
import { Redis } from 'ioredis'
import { Agent, request } from 'undici'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startRedisProcess } from '../fixtures/redis-topologies.js'
import { startReplica } from '../fixtures/replica.js'
import { externalTools } from '../fixtures/external-tools.js'

const ownRedis = await externalTools(['redis-server'])

const SESSIONS = 1000
const BATCH = 100
const LEASE_TTL_MS = 1500

async function gatewayConnections (redis: Redis): Promise<number> {
  const list = await redis.client('LIST') as string
  return list.split('\n').filter(line => / name=mcpgw-/.test(line)).length
}

t.test(`${SESSIONS} concurrent sessions on one replica: constant Redis connections`, { skip: ownRedis.skip }, async (t) => {
  if (!ownRedis.present(t)) return
  const server = await startRedisProcess(t, [], 'connections')
  const admin = new Redis({ port: server.port, host: '127.0.0.1' })
  t.teardown(() => admin.disconnect())
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const replica = await startReplica(t, {
    upstreamUrl: upstream.url,
    // Every session's stream comes from 127.0.0.1: above the default per-address connection cap.
    env: { REDIS_URL: `redis://127.0.0.1:${server.port}`, LEASE_TTL_MS: String(LEASE_TTL_MS), LOG_LEVEL: 'warn', MAX_CONNECTIONS_PER_ADDRESS: String(SESSIONS * 2), INITIALIZES_PER_MINUTE_PER_ADDRESS: String(SESSIONS * 2) }
  })
  const agent = new Agent({ connections: null, keepAliveTimeout: 60_000 })
  t.teardown(() => agent.destroy())
  const idle = await gatewayConnections(admin)

  const mcp = `${replica.url}/mcp`
  const headers = { 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18' }
  const open = async (i: number): Promise<void> => {
    const init = await request(mcp, {
      dispatcher: agent,
      method: 'POST',
      headers,
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: `c${i}`, version: '0' } } })
    })
    await init.body.text()
    const sessionId = init.headers['mcp-session-id'] as string
    const session = { ...headers, 'mcp-session-id': sessionId }
    await (await request(mcp, { dispatcher: agent, method: 'POST', headers: session, body: '{"jsonrpc":"2.0","method":"notifications/initialized"}' })).body.text()
    const get = await request(mcp, { dispatcher: agent, method: 'GET', headers: { ...session, accept: 'text/event-stream' } })
    if (get.statusCode !== 200) throw new Error(`GET ${get.statusCode}`)
    get.body.on('data', () => {})
    get.body.on('error', () => {})
  }
  const started = Date.now()
  for (let i = 0; i < SESSIONS; i += BATCH) {
    await Promise.all(Array.from({ length: Math.min(BATCH, SESSIONS - i) }, async (_, j) => await open(i + j)))
  }
  const openMs = Date.now() - started
  const held = await replica.metric('mcpgw_upstream_streams_open', { kind: 'standalone' })
  const clients = await replica.metric('mcpgw_client_streams_open')
  // Let several renewal ticks (one pipeline each for 1,000 leases) go by.
  await sleep(LEASE_TTL_MS * 2)
  const busy = await gatewayConnections(admin)
  const leases = (await admin.keys('*:lease')).length
  t.comment(`connections: ${SESSIONS} sessions opened in ${openMs} ms; ${held} upstream GETs held, ${clients} client streams; Redis connections of the replica: ${idle} idle, ${busy} with ${SESSIONS} sessions; ${leases} leases live after ${Math.round(LEASE_TTL_MS * 2 / (LEASE_TTL_MS / 3))} renewal ticks`)
  t.equal(held, SESSIONS, 'the replica holds every upstream GET')
  t.equal(leases, SESSIONS, 'every lease is alive (renewed)')
  t.equal(idle, 2, 'two connections at rest: commands and subscriptions')
  t.equal(busy, idle, 'the same two with 1,000 sessions')
})
