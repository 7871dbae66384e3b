// UPSTREAM_URL as the endpoints of one server (src/upstream/upstream-url.ts,
// through loadConfig): a list of URLs of one scheme and path, or one URL;
// anything else refused at start, with every problem and the form to write.
import t from 'tap'
import { loadConfig } from '../../src/config/load.js'
import { problemsOf } from '../fixtures/config-problems.js'

const FORM = /http:\/\/mcp-0:3000\/mcp,http:\/\/mcp-1:3000\/mcp/

t.test('two URLs separated by a comma are two endpoints of one MCP path, not the path "/mcp,http://b:3000/mcp"', async t => {
  const config = loadConfig({ UPSTREAM_URL: 'http://a:3000/mcp,http://b:3000/mcp' })
  t.equal(config.mcpPath, '/mcp')
  t.same(config.upstreamTargets.map(u => u.origin), ['http://a:3000', 'http://b:3000'])
  t.same(config.upstreamTargets.map(u => u.resolvable), [true, true], 'names are resolved')
  t.equal(config.upstreamUrl.href, 'http://a:3000/mcp', 'upstreamUrl: the first entry')
})

t.test('spaces around entries, IP literals and localhost need no DNS', async t => {
  const config = loadConfig({ UPSTREAM_URL: ' http://127.0.0.1:3001/mcp , http://[::1]:3002/mcp,http://localhost:3003/mcp' })
  t.same(config.upstreamTargets.map(u => [u.origin, u.hostname, u.port, u.resolvable]), [
    ['http://127.0.0.1:3001', '127.0.0.1', 3001, false],
    ['http://[::1]:3002', '::1', 3002, false],
    ['http://localhost:3003', 'localhost', 3003, false]
  ])
  t.same(loadConfig({ UPSTREAM_URL: 'https://mcp.example/mcp' }).upstreamTargets.map(u => [u.port, u.resolvable]), [[443, true]], 'the default port')
})

t.test('a malformed list is refused, each problem with the form to write', async t => {
  const cases: Array<[string, RegExp]> = [
    ['http://a:3000/mcp,v2', /entry 2 "v2" is not an absolute URL \(a path cannot hold a comma\)/],
    ['http://a:3000/mcp,', /entry 2 is empty/],
    [',http://a:3000/mcp', /entry 1 is empty/],
    ['http://a:3000/mcp,,http://b:3000/mcp', /entry 2 is empty/],
    ['http://a:3000/mcp http://b:3000/mcp', /has a path holding a second URL/],
    ['http://a:3000/mcp,http://b:3000/other', /different paths \(\/mcp, \/other\)/],
    ['http://a:3000/mcp,https://b:3000/mcp', /mix http: and https:/]
  ]
  for (const [value, pattern] of cases) {
    const problems = problemsOf({ UPSTREAM_URL: value })
    t.equal(problems.length, 1, `${value}: ${JSON.stringify(problems)}`)
    t.match(problems[0], /^UPSTREAM_URL: /)
    t.match(problems[0], pattern, value)
    t.match(problems[0], FORM, 'gives the form')
  }
  t.match(problemsOf({ UPSTREAM_URL: 'http://a:3000/mcp,http://a:3000/mcp' }), [/http:\/\/a:3000 is listed more than once/])
  t.match(problemsOf({ UPSTREAM_URL: 'http://a:3000/mcp,http://b:3000' }), [/has no path/], 'every entry needs its path')
})

t.test('list problems are reported with the other problems, all at once', async t => {
  const problems = problemsOf({ UPSTREAM_URL: 'http://a:3000/mcp,,ftp://c/mcp', PORT: 'abc', UPSTREAM_SET_ASIDE_SECONDS: '0' })
  t.same(problems.map(p => p.slice(0, p.indexOf(':'))).sort(), ['PORT', 'UPSTREAM_SET_ASIDE_SECONDS', 'UPSTREAM_URL', 'UPSTREAM_URL'])
})

t.test('resolution and set-aside settings', async t => {
  const config = loadConfig({ UPSTREAM_URL: 'http://mcp:3000/mcp' })
  t.equal(config.upstreamResolveMs, 30_000)
  t.equal(config.upstreamSetAsideMs, 5000)
  const set = loadConfig({ UPSTREAM_URL: 'http://mcp:3000/mcp', UPSTREAM_RESOLVE_SECONDS: '5', UPSTREAM_SET_ASIDE_SECONDS: '2' })
  t.equal(set.upstreamResolveMs, 5000)
  t.equal(set.upstreamSetAsideMs, 2000)
})
