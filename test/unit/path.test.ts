import t from 'tap'
import { canonicalPath, disguisesMcpPath } from '../../src/routes/path.js'

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
