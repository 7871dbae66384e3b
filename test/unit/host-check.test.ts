// Host checks (src/net/host-policy.ts): the pure policy behind DNS-rebinding
// protection, for every kind of listener.
import t from 'tap'
import { allowListEntry, defaultHostPolicy, hostAllowed, hostName } from '../../src/net/host-policy.js'

t.test('hostName: the name of a Host value, or undefined when malformed', async t => {
  t.equal(hostName('LocalHost:8080'), 'localhost')
  t.equal(hostName('localhost.'), 'localhost', 'a trailing dot is the same name')
  t.equal(hostName('[::1]:3000'), '::1')
  t.equal(hostName('127.0.0.1'), '127.0.0.1')
  for (const bad of [undefined, '', 'user@localhost', 'localhost/x', 'a b', 'localhost:', 'localhost:99999x', '[::1', 'evil.com\\@localhost', ':80']) {
    t.equal(hostName(bad), undefined, `${String(bad)}: malformed`)
  }
})

t.test('a loopback listener serves the SDKs\' names only', async t => {
  for (const bind of ['127.0.0.1', 'localhost', '::1', '127.0.0.2']) {
    const policy = defaultHostPolicy(bind)
    for (const ok of ['localhost', 'localhost:8080', '127.0.0.1:1', '[::1]:8080']) t.ok(hostAllowed(policy, ok), `${bind}: ${ok}`)
    for (const no of ['evil.example.com', 'evil.example.com:8080', 'localhost.evil.example.com', '10.0.0.5', 'gateway', undefined]) {
      t.notOk(hostAllowed(policy, no), `${bind}: ${String(no)} refused`)
    }
  }
})

t.test('a wildcard or other listener serves names public DNS cannot point at it', async t => {
  for (const bind of ['0.0.0.0', '::', '10.0.0.5']) {
    const policy = defaultHostPolicy(bind)
    t.same(policy, { kind: 'non-public' })
    for (const ok of ['localhost:8080', '127.0.0.1', '10.0.0.5:8080', '[fd00::1]:80', 'gateway:8080', 'mcp-gateway', 'gw.ns.svc', 'gw.ns.svc.cluster.local', 'box.local', 'api.internal', 'nas.home.arpa', 'app.localhost']) {
      t.ok(hostAllowed(policy, ok), `${bind}: ${ok}`)
    }
    for (const no of ['evil.example.com', 'mcp.example.com:443', '7f000001.rbndr.us', 'localhost.evil.com', 'svc.evil.com', 'x.local.evil.com', undefined, '']) {
      t.notOk(hostAllowed(policy, no), `${bind}: ${String(no)} refused`)
    }
  }
})

t.test('a list: exact names and *. subdomains; any: everything', async t => {
  const names = ['mcp.example.com', '*.corp.example', '::1'].map(e => allowListEntry(e) as string)
  const policy = { kind: 'list', names } as const
  t.ok(hostAllowed(policy, 'MCP.example.com:8443'))
  t.ok(hostAllowed(policy, 'a.corp.example'))
  t.ok(hostAllowed(policy, '[::1]:80'))
  t.notOk(hostAllowed(policy, 'corp.example'))
  t.notOk(hostAllowed(policy, 'evilcorp.example'))
  t.notOk(hostAllowed(policy, 'mcp.example.com.evil.example'))
  t.ok(hostAllowed({ kind: 'any' }, undefined), 'any: even no Host')
})
