// REDIS_URL's forms: redis:// and rediss:// pass to ioredis untouched; unix://
// is read into a socket path, database and credentials (ioredis 5 would take the
// whole URL for the path).
import t from 'tap'
import { parseUnixUrl, redisUrlOptions, redisUrlProblem } from '../../src/store/redis/redis-url.js'

t.test('redis:// and rediss:// go to ioredis as they are', async (t) => {
  for (const url of ['redis://redis:6379', 'rediss://:pw@redis:6380/2', 'redis://user:p%40ss@10.0.0.5']) {
    t.equal(redisUrlProblem(url), undefined, url)
    t.equal(redisUrlOptions(url), url, url)
  }
})

t.test('unix://: path, database and credentials', async (t) => {
  t.same(redisUrlOptions('unix:///run/redis/redis.sock'), { path: '/run/redis/redis.sock' })
  t.same(redisUrlOptions('unix:///var/run/redis.sock?db=4'), { path: '/var/run/redis.sock', db: 4 })
  t.same(redisUrlOptions('unix://localhost/tmp/r.sock'), { path: '/tmp/r.sock' }, 'localhost is the same host')
  t.same(redisUrlOptions('unix://:s%3Acret@localhost/tmp/r.sock'), { path: '/tmp/r.sock', password: 's:cret' }, 'a password, percent-decoded')
  t.same(redisUrlOptions('unix://gw:pw@localhost/tmp/r.sock?db=0'), { path: '/tmp/r.sock', db: 0, username: 'gw', password: 'pw' }, 'an ACL user')
  t.same(redisUrlOptions('unix:///tmp/with%20space/r.sock'), { path: '/tmp/with space/r.sock' }, 'the path percent-decoded')
  t.equal(redisUrlProblem('unix:///run/redis/redis.sock?db=1'), undefined)
})

t.test('unix:// URLs that cannot name a socket are refused, saying how to write one', async (t) => {
  const cases: Array<[string, RegExp]> = [
    ['unix://redis.sock', /names no host \(got redis\.sock\)/],
    ['unix://redis:6379/x.sock', /names no host \(got redis\)/],
    ['unix://localhost:6379/x.sock', /has no port/],
    ['unix://', /absolute path/],
    ['unix:///', /absolute path/],
    ['unix:///x.sock#frag', /no fragment/],
    ['unix:///x.sock?db=two', /db must be a database number, got "two"/],
    ['unix:///x.sock?db=-1', /db must be a database number/],
    ['unix:///x.sock?timeout=5', /unknown parameter timeout/]
  ]
  for (const [url, pattern] of cases) {
    const problem = redisUrlProblem(url)
    t.match(problem, /^REDIS_URL: /, url)
    t.match(problem, pattern, url)
    t.type(parseUnixUrl(new URL(url)), 'string', `${url}: no options`)
    t.throws(() => redisUrlOptions(url), { name: 'TypeError', message: pattern }, `${url}: redisUrlOptions refuses it too`)
  }
  t.match(redisUrlProblem('unix://redis.sock'), /write unix:\/\/\/path\/to\/redis\.sock/, 'the form is shown')
})

t.test('other schemes and non-URLs', async (t) => {
  t.match(redisUrlProblem('http://redis:6379'), /must use redis:\/\/, rediss:\/\/ or unix:\/\/, got http:/)
  t.match(redisUrlProblem('/run/redis.sock'), /must be a URL such as redis:\/\/redis:6379 or unix:\/\/\//, 'a bare path is not a URL: say unix://')
  t.match(redisUrlProblem('redis:6379'), /must name a host/)
})
