// A gateway started against a Redis Cluster that is being created at the same
// moment (a fresh deployment: Redis pods and gateway pods start together): it
// says at warn why it waits, and listens within 2 s of the cluster being ready.
import t from 'tap'
import { Redis } from 'ioredis'
import { setTimeout as sleep } from 'node:timers/promises'
import { startExampleServer } from '../../examples/mcp-server.js'
import { startReplica } from '../fixtures/replica.js'
import { formCluster, startClusterNodes } from '../fixtures/redis-topologies.js'
import { externalTools } from '../fixtures/external-tools.js'

const ownCluster = await externalTools(['redis-server', 'redis-cli'])

/** Resolves once some client other than this one is connected to the node. */
async function someoneConnects (port: number): Promise<void> {
  const admin = new Redis({ port, host: '127.0.0.1' })
  try {
    for (let i = 0; i < 400; i++) {
      const list = await admin.client('LIST') as string
      if (list.trim().split('\n').length > 1) return
      await sleep(25)
    }
    throw new Error('the gateway never connected')
  } finally {
    admin.disconnect()
  }
}

t.test('a cluster formed while the gateway starts', { skip: ownCluster.skip }, async t => {
  if (!ownCluster.present(t)) return
  const upstream = await startExampleServer()
  t.teardown(() => upstream.close())
  const nodes = await startClusterNodes(t)
  const starting = startReplica(t, { upstreamUrl: upstream.url, env: { REDIS_CLUSTER_NODES: nodes.map(n => `127.0.0.1:${n.port}`).join(',') } })
  starting.catch(() => {})
  // The cluster is created as soon as the gateway first reaches a node: it sees nodes without slots.
  await someoneConnects((nodes[0] as { port: number }).port)
  await formCluster(nodes)
  const readyAt = Date.now()
  const replica = await starting
  const late = Date.now() - readyAt
  t.comment(`ready ${late} ms after the cluster`)
  t.ok(late < 2000, `listening and ready within 2 s of the cluster (${late} ms)`)
  const waits = replica.logged(/Redis Cluster not ready yet/)
  t.ok(waits.length > 0, 'each wait logged')
  t.equal(waits[0]?.level, 'warn')
  t.match(String(waits[0]?.reason), /cluster_state:fail, \d+ of 16384 slots assigned/, 'with its reason')
})
