// The multi-replica resume scenario on each Redis deployment the gateway
// supports besides a plain URL: Redis Cluster (three masters: a session's keys
// share one hash tag, so every script runs in one slot) and Sentinel.
import t from 'tap'
import { Redis } from 'ioredis'
import { resumeAcrossReplicas } from '../fixtures/cluster-scenario.js'
import { startRedisCluster, startRedisSentinel } from '../fixtures/redis-topologies.js'

t.test('Redis Cluster (REDIS_CLUSTER_NODES): three masters', async (t) => {
  const nodes = await startRedisCluster(t)
  await resumeAcrossReplicas(t, {
    label: 'cluster',
    env: { REDIS_CLUSTER_NODES: nodes.map(n => `127.0.0.1:${n.port}`).join(',') }
  })
  const perNode = await Promise.all(nodes.map(async (node) => {
    const admin = new Redis({ port: node.port, host: '127.0.0.1' })
    try {
      const list = await admin.client('LIST') as string
      return list.split('\n').filter(line => / name=mcpgw-/.test(line)).length
    } finally {
      admin.disconnect()
    }
  }))
  t.comment(`cluster: gateway connections per node (3 replicas): ${perNode.join(', ')}`)
})

t.test('Redis Sentinel (REDIS_SENTINELS, REDIS_SENTINEL_NAME)', async (t) => {
  const { sentinel, name } = await startRedisSentinel(t)
  await resumeAcrossReplicas(t, {
    label: 'sentinel',
    env: { REDIS_SENTINELS: `127.0.0.1:${sentinel.port}`, REDIS_SENTINEL_NAME: name }
  })
})
