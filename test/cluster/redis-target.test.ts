// Which Redis deployment the configuration names, and how it is logged.
import t from 'tap'
import { describeTarget, redactUrl, redisTarget } from '../../src/store/create.js'
import { testConfig } from '../fixtures/gateway.js'

const UPSTREAM = 'http://127.0.0.1:1/mcp'

t.test('REDIS_URL, REDIS_CLUSTER_NODES, REDIS_SENTINELS', async (t) => {
  t.equal(redisTarget(testConfig(UPSTREAM)), undefined, 'none: the embedded store')
  const url = redisTarget(testConfig(UPSTREAM, { REDIS_URL: 'rediss://:s3cret@redis:6380/2' }))
  t.same(url, { url: 'rediss://:s3cret@redis:6380/2' })
  t.equal(describeTarget(url as never), 'rediss://:***@redis:6380/2', 'no password in logs')
  const cluster = redisTarget(testConfig(UPSTREAM, { REDIS_CLUSTER_NODES: 'a:7000,b:7001', REDIS_PASSWORD: 'pw', REDIS_TLS: 'true' }))
  t.same(cluster, { cluster: [{ host: 'a', port: 7000 }, { host: 'b', port: 7001 }], password: 'pw', tls: true })
  t.equal(describeTarget(cluster as never), 'cluster a:7000,b:7001 (tls)')
  const sentinel = redisTarget(testConfig(UPSTREAM, { REDIS_SENTINELS: 's1:26379,s2:26379', REDIS_SENTINEL_NAME: 'main' }))
  t.same(sentinel, { sentinels: [{ host: 's1', port: 26379 }, { host: 's2', port: 26379 }], name: 'main', password: undefined, tls: false })
  t.equal(describeTarget(sentinel as never), 'sentinel main@s1:26379,s2:26379')
  t.equal(describeTarget({ url: 'unix://:s3cret@localhost/run/redis/redis.sock?db=1' }), 'unix://:***@localhost/run/redis/redis.sock?db=1', 'nor for a Unix socket')
  t.equal(redactUrl('not a url'), '[unparseable]')
})
