// The endpoints of the upstream server (src/upstream/endpoint-set.ts and the
// pure modules under it): placement of new sessions, round robin for requests
// without one, set-aside after a refused connection, DNS answers coming and
// going. A fake clock and a seeded random source: every run the same.
import t from 'tap'
import { betterOfTwo, RoundRobin } from '../../src/upstream/balance.js'
import { isConnectFailure } from '../../src/upstream/connect-failure.js'
import { EndpointSet } from '../../src/upstream/endpoint-set.js'
import { LEAVING_MAX_COUNT, LEAVING_MAX_MS, SET_ASIDE_MAX_FACTOR } from '../../src/upstream/endpoint-state.js'
import { targetOfUrl, type UpstreamTarget } from '../../src/upstream/upstream-url.js'
import { prng } from '../fixtures/hardening.js'

const refusal = Object.assign(new Error('connect ECONNREFUSED 10.0.0.1:3000'), { code: 'ECONNREFUSED' })
const target = (url: string): UpstreamTarget => targetOfUrl(new URL(url))
const three = ['http://10.0.0.1:3000/mcp', 'http://10.0.0.2:3000/mcp', 'http://10.0.0.3:3000/mcp'].map(target)

function clock (): { now: () => number, advance: (ms: number) => void } {
  let now = 1_000_000
  return { now: () => now, advance: ms => { now += ms } }
}

t.test('betterOfTwo: the draw with fewer sessions; every candidate reachable; one candidate, none', async t => {
  const random = prng(1)
  const candidates = [{ id: 'a', placed: 5 }, { id: 'b', placed: 0 }, { id: 'c', placed: 5 }]
  const wins = new Map<string, number>()
  for (let i = 0; i < 3000; i++) {
    const chosen = betterOfTwo(candidates, random) as { id: string }
    wins.set(chosen.id, (wins.get(chosen.id) ?? 0) + 1)
  }
  // b is in 2 of the 3 possible pairs, and wins both: 2/3 of the draws.
  t.ok(Math.abs((wins.get('b') ?? 0) / 3000 - 2 / 3) < 0.05, `b wins two pairs of three: ${JSON.stringify([...wins])}`)
  t.ok((wins.get('a') ?? 0) > 0 && (wins.get('c') ?? 0) > 0, 'a and c each win their pair')
  t.equal(betterOfTwo([{ placed: 9 }], random)?.placed, 9)
  t.equal(betterOfTwo([], random), undefined)
})

t.test('RoundRobin: in turn, over a list that changes', async t => {
  const rr = new RoundRobin()
  t.same([1, 2, 3, 4].map(() => rr.pick(['a', 'b', 'c'])), ['a', 'b', 'c', 'a'])
  t.equal(rr.pick(['x', 'y']), 'x', 'a shorter list: still in range')
  t.equal(rr.pick([]), undefined)
})

t.test('place: new sessions spread evenly over the endpoints, the same for the same seed', async t => {
  const run = (seed: number): number[] => {
    const set = new EndpointSet(three, { setAsideMs: 1000, random: prng(seed) })
    for (let i = 0; i < 300; i++) set.sessionPlaced(set.place())
    return set.snapshot().map(v => v.sessionsPlaced)
  }
  const counts = run(42)
  t.same(run(42), counts, 'deterministic under a seed')
  t.equal(counts.reduce((a, b) => a + b), 300)
  t.ok(Math.max(...counts) - Math.min(...counts) <= 3, `within a few sessions of each other: ${counts.join(', ')}`)
})

t.test('pick: round robin over the endpoints in rotation', async t => {
  const set = new EndpointSet(three, { setAsideMs: 1000 })
  t.same([1, 2, 3, 4, 5, 6].map(() => set.pick()), ['http://10.0.0.1:3000', 'http://10.0.0.2:3000', 'http://10.0.0.3:3000', 'http://10.0.0.1:3000', 'http://10.0.0.2:3000', 'http://10.0.0.3:3000'])
})

t.test('a refused connection sets the endpoint aside: no sessions, no requests, its sessions sent elsewhere; then on trial; backoff doubles', async t => {
  const c = clock()
  const set = new EndpointSet(three, { setAsideMs: 1000, now: c.now, random: prng(7) })
  const dead = 'http://10.0.0.2:3000'
  t.ok(set.resolve(dead), 'reachable at first')
  t.equal(set.reportFailure(dead, new Error('socket hang up')), false, 'any other error: not set aside (the request may have run)')
  t.equal(set.reportFailure(dead, refusal), true, 'refused: set aside')
  t.equal(set.resolve(dead), undefined, 'its sessions go elsewhere')
  for (let i = 0; i < 50; i++) {
    t.not(set.pick(), dead)
    t.not(set.place(), dead)
  }
  t.match(set.snapshot().find(v => v.endpoint === dead), { state: 'set_aside', until: c.now() + 1000, refusals: 1 })
  c.advance(1000)
  t.match(set.snapshot().find(v => v.endpoint === dead), { state: 'on_trial', refusals: 1 }, 'its time is over: on trial')
  t.ok(set.resolve(dead), 'reachable on trial')
  t.ok([1, 2, 3].map(() => set.pick()).includes(dead), 'picked again')
  set.reportFailure(dead, refusal)
  t.match(set.snapshot().find(v => v.endpoint === dead), { state: 'set_aside', until: c.now() + 2000, refusals: 2 }, 'refused again on trial: twice as long')
  for (let i = 0; i < 10; i++) {
    c.advance(100_000)
    set.reportFailure(dead, refusal)
  }
  t.match(set.snapshot().find(v => v.endpoint === dead), { until: c.now() + 1000 * SET_ASIDE_MAX_FACTOR }, 'bounded')
  c.advance(100_000)
  set.reportAnswer(dead)
  t.match(set.snapshot().find(v => v.endpoint === dead), { state: 'healthy' }, 'an answer on trial: healthy, the count of refusals gone')
  set.reportFailure(dead, refusal)
  t.match(set.snapshot().find(v => v.endpoint === dead), { until: c.now() + 1000 }, 'back to the base time')
})

t.test('every endpoint set aside: place and pick answer the one back soonest', async t => {
  const c = clock()
  const set = new EndpointSet(three, { setAsideMs: 1000, now: c.now })
  set.reportFailure('http://10.0.0.1:3000', refusal)
  c.advance(10)
  set.reportFailure('http://10.0.0.3:3000', refusal)
  c.advance(10)
  set.reportFailure('http://10.0.0.2:3000', refusal)
  t.equal(set.pick(), 'http://10.0.0.1:3000')
  t.equal(set.place(), 'http://10.0.0.1:3000')
})

t.test('a lone endpoint is never set aside: there is nowhere else to go', async t => {
  const set = new EndpointSet([target('http://127.0.0.1:3000/mcp')], { setAsideMs: 1000 })
  t.equal(set.reportFailure('http://127.0.0.1:3000', refusal), false)
  t.match(set.snapshot(), [{ endpoint: 'http://127.0.0.1:3000', state: 'healthy' }])
  t.ok(set.resolve('http://127.0.0.1:3000'))
})

t.test('a name: connected as written until it resolves; each address an endpoint, with the name as Host; addresses leaving and joining', async t => {
  const c = clock()
  const name = target('http://mcp.ns.svc.cluster.local:3000/mcp')
  const set = new EndpointSet([name], { setAsideMs: 1000, now: c.now, random: prng(3) })
  t.same(set.snapshot().map(v => v.endpoint), ['http://mcp.ns.svc.cluster.local:3000'], 'the name as written before any answer')
  set.update(name, ['10.0.0.7', '10.0.0.8'])
  t.same(set.snapshot().map(v => [v.endpoint, v.state]), [
    ['http://10.0.0.7:3000', 'healthy'],
    ['http://10.0.0.8:3000', 'healthy']
  ], 'the name, with no session placed there, gives way to its addresses at once')
  t.same(set.resolve('http://10.0.0.7:3000'), { origin: 'http://10.0.0.7:3000', host: 'mcp.ns.svc.cluster.local:3000', servername: undefined }, 'connect by address, the name as Host')
  for (let i = 0; i < 10; i++) set.sessionPlaced(set.place())

  set.update(name, ['10.0.0.8', '10.0.0.9'])
  const views = new Map(set.snapshot().map(v => [v.endpoint, v]))
  t.equal(views.get('http://10.0.0.7:3000')?.state, 'leaving', 'gone from the answer: leaving')
  t.ok(set.resolve('http://10.0.0.7:3000'), 'its sessions go on there')
  for (let i = 0; i < 10; i++) t.not(set.place(), 'http://10.0.0.7:3000', 'nothing new on a leaving endpoint')
  const level = views.get('http://10.0.0.8:3000')?.sessionsPlaced as number
  t.ok(level >= 4, `10.0.0.8 holds sessions (${level})`)
  for (let i = 0; i < 20; i++) set.sessionPlaced(set.place())
  const joined = set.snapshot().find(v => v.endpoint === 'http://10.0.0.9:3000')?.sessionsPlaced as number
  t.ok(joined >= 9 && joined <= 11, `a new endpoint starts level with the fewest, not at 0: it gets half the next 20 sessions (${joined}), not all`)
  t.equal(set.reportFailure('http://10.0.0.7:3000', refusal), true)
  t.equal(set.resolve('http://10.0.0.7:3000'), undefined, 'a leaving endpoint that refuses is forgotten')
  t.notOk(set.snapshot().some(v => v.endpoint === 'http://10.0.0.7:3000'))

  set.update(name, [])
  t.equal(set.snapshot().filter(v => v.state === 'healthy').length, 2, 'an empty answer changes nothing')
  c.advance(LEAVING_MAX_MS)
  set.update(name, ['10.0.0.8', '10.0.0.9'])
  t.same(set.snapshot().map(v => v.endpoint), ['http://10.0.0.8:3000', 'http://10.0.0.9:3000'], 'leaving endpoints forgotten after LEAVING_MAX_MS')
  set.update(name, ['10.0.0.9'])
  t.equal(set.snapshot().find(v => v.endpoint === 'http://10.0.0.8:3000')?.state, 'leaving')
  set.update(name, ['10.0.0.8', '10.0.0.9'])
  t.equal(set.snapshot().find(v => v.endpoint === 'http://10.0.0.8:3000')?.state, 'healthy', 'listed again: back in rotation')
})

t.test('an address leaving where this replica placed nothing: leaving all the same, its sessions still routed there (another replica, or this one before a restart, placed them)', async t => {
  const c = clock()
  const name = target('http://mcp.ns.svc.cluster.local:3000/mcp')
  const set = new EndpointSet([name], { setAsideMs: 1000, now: c.now, random: prng(5) })
  set.update(name, ['10.0.0.7', '10.0.0.8'])
  set.update(name, ['10.0.0.8'])
  t.match(set.snapshot().find(v => v.endpoint === 'http://10.0.0.7:3000'), { state: 'leaving', sessionsPlaced: 0 })
  t.same(set.resolve('http://10.0.0.7:3000'), { origin: 'http://10.0.0.7:3000', host: 'mcp.ns.svc.cluster.local:3000', servername: undefined }, 'a session recorded there goes on there')
  for (let i = 0; i < 10; i++) t.equal(set.place(), 'http://10.0.0.8:3000', 'nothing new on it')
  c.advance(LEAVING_MAX_MS - 1)
  t.ok(set.resolve('http://10.0.0.7:3000'), 'until LEAVING_MAX_MS')
  c.advance(1)
  t.equal(set.resolve('http://10.0.0.7:3000'), undefined, 'then forgotten')
})

t.test('addresses churning: at most LEAVING_MAX_COUNT leaving endpoints, those leaving longest forgotten first', async t => {
  const c = clock()
  const name = target('http://mcp.ns.svc.cluster.local:3000/mcp')
  const set = new EndpointSet([name], { setAsideMs: 1000, now: c.now })
  const address = (n: number): string => `10.${n >> 16 & 255}.${n >> 8 & 255}.${n & 255}`
  const answers = LEAVING_MAX_COUNT * 3
  // Each answer a new pair of addresses: every address listed once, then leaving.
  for (let n = 0; n < answers; n++) {
    set.update(name, [address(2 * n), address(2 * n + 1)])
    c.advance(100)
  }
  const views = set.snapshot()
  t.equal(views.filter(v => v.state === 'leaving').length, LEAVING_MAX_COUNT, `bounded: ${views.length} endpoints after ${answers * 2} addresses`)
  t.equal(views.filter(v => v.state === 'healthy').length, 2, 'the addresses listed now')
  t.ok(set.resolve(`http://${address(2 * answers - 3)}:3000`), 'the last to leave is kept')
  t.equal(set.resolve(`http://${address(0)}:3000`), undefined, 'the first to leave is forgotten')
})

t.test('https by address: the name is the TLS server name; IPv6 addresses in brackets', async t => {
  const name = target('https://mcp.example:8443/mcp')
  const set = new EndpointSet([name], { setAsideMs: 1000 })
  set.update(name, ['2001:db8::1'])
  t.same(set.resolve('https://[2001:db8::1]:8443'), { origin: 'https://[2001:db8::1]:8443', host: 'mcp.example:8443', servername: 'mcp.example' })
})

t.test('isConnectFailure: connection refused, unreachable, connect timeout, and happy eyeballs\' list of them', async t => {
  t.ok(isConnectFailure(refusal))
  t.ok(isConnectFailure(Object.assign(new Error('x'), { code: 'UND_ERR_CONNECT_TIMEOUT' })))
  t.ok(isConnectFailure(Object.assign(new Error('wrapped'), { cause: { code: 'EHOSTUNREACH' } })))
  t.ok(isConnectFailure(new AggregateError([refusal, Object.assign(new Error('v6'), { code: 'ENETUNREACH' })])))
  t.notOk(isConnectFailure(Object.assign(new Error('reset'), { code: 'ECONNRESET' })), 'a reset: the request may have reached the upstream')
  t.notOk(isConnectFailure(Object.assign(new Error('x'), { code: 'UND_ERR_HEADERS_TIMEOUT' })))
  t.notOk(isConnectFailure(undefined))
})
