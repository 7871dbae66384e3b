import t from 'tap'
import { canonicalPath, disguisesMcpPath } from '../../src/routes/path.js'
import { isPublicPath, pathTrick } from '../../src/net/request-path.js'

t.test('spellings that lenient servers route to the MCP endpoint are caught', async (t) => {
  for (const spelling of ['/./mcp', '/x/../mcp', '/%2e/mcp', '/%2E%2E/mcp', '/MCP', '/mcp/', '//mcp', '///x/../mcp', '/%6dcp', '/mcp;jsessionid=1', '/mcp//']) {
    t.ok(disguisesMcpPath(spelling, '/mcp'), spelling)
  }
})

t.test('the exact path and other paths are not', async (t) => {
  for (const path of ['/mcp', '/mcp?x=1', '/other', '/mcpx', '/mc', '/.well-known/oauth-protected-resource', '/a//b', '/mcp/tools']) {
    t.notOk(disguisesMcpPath(path, '/mcp'), path)
  }
  t.notOk(disguisesMcpPath('/api/mcp', '/api/mcp'))
  t.ok(disguisesMcpPath('/api/./mcp', '/api/mcp'))
})

t.test('canonical form', async (t) => {
  t.equal(canonicalPath('/A/./b/../C//'), '/a/c')
  t.equal(canonicalPath('/'), '/')
  t.equal(canonicalPath('/%7Euser'), '/~user')
  t.equal(canonicalPath('/%2Fx'), '/%2fx', 'an encoded slash stays encoded (it is not a separator)')
})

t.test('path tricks: what servers behind the gateway would read as another route', async (t) => {
  for (const path of ['/mcp%2F', '/mcp%2e', '/%2fmcp', '/mcp%00', '/mcp%5c', '/mcp%5C', '/a%0d%0ab', '/x%7f', '/mcp%252F', '/mcp%2520',
    '/mcp\\', '/a\\b', '/mcp\x00', '/./mcp', '/x/../mcp', '/x/..;/mcp', '/..', '/.well-known/../mcp', 'mcp', '*']) {
    t.ok(pathTrick(path) !== undefined, JSON.stringify(path))
  }
  for (const path of ['/mcp', '/mcp?x=%2F', '/a.b/c', '/.well-known/oauth-protected-resource', '/x/...', '/%7Euser', '/a%20b', '/mcp?q=..']) {
    t.equal(pathTrick(path), undefined, path)
  }
})

t.test('trailing dots and spaces of a segment are disguises of the MCP path', async (t) => {
  for (const spelling of ['/mcp.', '/mcp%20', '/mcp..', '/mcp. ', '/MCP.']) t.ok(disguisesMcpPath(spelling, '/mcp'), spelling)
})

t.test('public paths: exact, or everything under a prefix ending in /', async (t) => {
  const pub = ['/.well-known/', '/oauth/token']
  t.ok(isPublicPath('/.well-known/oauth-protected-resource', pub))
  t.ok(isPublicPath('/.well-known/x?y=1', pub))
  t.ok(isPublicPath('/oauth/token', pub))
  t.notOk(isPublicPath('/oauth/token/x', pub))
  t.notOk(isPublicPath('/.well-known', pub))
  t.notOk(isPublicPath('/other', pub))
  t.notOk(isPublicPath('/.well-known/x', []))
})
