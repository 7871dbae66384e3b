// Resolving the names of UPSTREAM_URL again as their DNS answers age
// (src/upstream/discovery.ts), with a resolver the test controls: the TTL
// decides when (bounded by UPSTREAM_RESOLVE_SECONDS), a failed resolution
// keeps the endpoints of the last answer, stop() ends it.
import t from 'tap'
import { setTimeout as sleep } from 'node:timers/promises'
import { UpstreamDiscovery, type ResolvedAddress } from '../../src/upstream/discovery.js'
import { EndpointSet } from '../../src/upstream/endpoint-set.js'
import { targetOfUrl } from '../../src/upstream/upstream-url.js'

function setup (answers: Array<ResolvedAddress[] | Error>, maxAgeMs: number): { discovery: UpstreamDiscovery, endpoints: EndpointSet, asked: number[], warnings: string[] } {
  const name = targetOfUrl(new URL('http://mcp.test:3000/mcp'))
  const literal = targetOfUrl(new URL('http://127.0.0.1:3001/mcp'))
  const endpoints = new EndpointSet([name, literal], { setAsideMs: 1000 })
  const asked: number[] = []
  const warnings: string[] = []
  const started = Date.now()
  const discovery = new UpstreamDiscovery({
    targets: [name, literal],
    endpoints,
    maxAgeMs,
    resolver: async hostname => {
      t.equal(hostname, 'mcp.test', 'only the name is resolved, never an IP address')
      asked.push(Date.now() - started)
      const answer = answers[Math.min(asked.length - 1, answers.length - 1)] as ResolvedAddress[] | Error
      if (answer instanceof Error) throw answer
      return answer
    },
    log: { info () {}, warn (_obj, msg) { warnings.push(msg) } }
  })
  return { discovery, endpoints, asked, warnings }
}

const keys = (endpoints: EndpointSet): string[] => endpoints.snapshot().filter(v => v.state !== 'leaving').map(v => v.endpoint)

t.test('the TTL decides when the name is resolved again; a failure keeps the last answer', async t => {
  const { discovery, endpoints, asked, warnings } = setup([
    [{ address: '10.0.0.1', ttl: 1 }, { address: '10.0.0.2', ttl: 3 }],
    new Error('SERVFAIL'),
    [{ address: '10.0.0.2', ttl: 60 }]
  ], 2000)
  t.teardown(() => discovery.stop())
  await discovery.start()
  t.same(keys(endpoints), ['http://127.0.0.1:3001', 'http://10.0.0.1:3000', 'http://10.0.0.2:3000'], 'the addresses, beside the literal entry')
  await sleep(1150)
  t.equal(asked.length, 2, 'again after the shortest TTL (1 s)')
  t.same(keys(endpoints), ['http://127.0.0.1:3001', 'http://10.0.0.1:3000', 'http://10.0.0.2:3000'], 'a failed resolution changes nothing')
  t.match(warnings, [/could not resolve/])
  await sleep(2100)
  t.equal(asked.length, 3, 'a failure is retried after UPSTREAM_RESOLVE_SECONDS')
  t.same(keys(endpoints), ['http://127.0.0.1:3001', 'http://10.0.0.2:3000'])
})

t.test('without a TTL, UPSTREAM_RESOLVE_SECONDS; stop() ends the resolutions', async t => {
  const { discovery, asked } = setup([[{ address: '10.0.0.1' }]], 1000)
  await discovery.start()
  await sleep(1150)
  t.equal(asked.length, 2)
  discovery.stop()
  await sleep(1150)
  t.equal(asked.length, 2, 'none after stop()')
})
