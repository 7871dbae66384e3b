// What a draining process still serves: GETs of a session's streams on the MCP
// endpoint; everything else goes to a ready replica (503).
import t from 'tap'
import { servedWhileDraining } from '../../src/lifecycle/drain.js'

const MCP = '/mcp'

t.test('a GET of a session on the MCP endpoint is served', async t => {
  t.ok(servedWhileDraining({ method: 'GET', routeUrl: MCP, sessionId: 'abc' }, MCP), 'a resume or the standalone stream')
})

t.test('everything else is refused', async t => {
  const refused: Array<[string, Parameters<typeof servedWhileDraining>[0]]> = [
    ['a POST', { method: 'POST', routeUrl: MCP, sessionId: 'abc' }],
    ['a DELETE', { method: 'DELETE', routeUrl: MCP, sessionId: 'abc' }],
    ['a GET without a session', { method: 'GET', routeUrl: MCP, sessionId: undefined }],
    ['a GET with the session header repeated', { method: 'GET', routeUrl: MCP, sessionId: ['a', 'b'] }],
    ['a GET of another path of the upstream', { method: 'GET', routeUrl: '/*', sessionId: 'abc' }],
    ['a request no route matched', { method: 'GET', routeUrl: undefined, sessionId: 'abc' }],
    ['a HEAD', { method: 'HEAD', routeUrl: MCP, sessionId: 'abc' }]
  ]
  for (const [what, request] of refused) t.notOk(servedWhileDraining(request, MCP), what)
})
