// Several gateway replicas sharing one Redis, as real processes behind a
// round-robin balancer: any replica serves any request of a session.
import t from 'tap'
import { useRedis } from '../fixtures/redis.js'
import { resumeAcrossReplicas } from '../fixtures/cluster-scenario.js'

t.test('initialize on A, GET on B, tool call on C, resume on A: exactly once, in order', async (t) => {
  const redis = await useRedis(t, 'replicas')
  await resumeAcrossReplicas(t, { label: 'redis', env: { REDIS_URL: redis.url, REDIS_KEY_PREFIX: redis.prefix } })
})
