// The Host check's decision (src/net/request-authority.ts): Host always,
// trusted forwarded entries all, one name and scheme passed on.
import t from 'tap'
import { defaultHostPolicy, hostName } from '../../src/net/host-policy.js'
import { headerLines, requestAuthority, type AuthorityInput } from '../../src/net/request-authority.js'

const loopback = defaultHostPolicy('127.0.0.1')
const direct: AuthorityInput = { hosts: ['localhost:8080'], trustedPeer: false, protocol: 'http' }
const proxied: AuthorityInput = { ...direct, trustedPeer: true }

t.test('one Host, well formed and allowed', async t => {
  t.same(requestAuthority(loopback, direct), { kind: 'served', host: 'localhost:8080', protocol: 'http' })
  t.same(requestAuthority(loopback, { ...direct, hosts: ['localhost', 'localhost'] }).kind, 'malformed', 'two Host lines, even equal ones')
  t.same(requestAuthority(loopback, { ...direct, hosts: ['localhost:99999'] }).kind, 'malformed')
  t.same(requestAuthority(loopback, { ...direct, hosts: ['localhost:65535'] }).kind, 'served')
  t.same(requestAuthority(loopback, { ...direct, hosts: ['evil.example.com'] }).kind, 'forbidden')
  t.same(requestAuthority(loopback, { ...direct, hosts: [] }).kind, 'forbidden', 'no Host (HTTP/1.0)')
  t.same(requestAuthority({ kind: 'any' }, { ...direct, hosts: ['a', 'b'] }).kind, 'malformed', 'ALLOWED_HOSTS=* still wants one Host')
  t.same(requestAuthority(loopback, { ...direct, targetAuthority: 'evil.example.com' }).kind, 'forbidden', 'an absolute-form authority')
})

t.test('forwarded headers: ignored from an untrusted peer, checked and reduced to one from a trusted one', async t => {
  const forged = { forwardedHost: 'evil.example.com', forwardedProto: 'gopher' }
  t.same(requestAuthority(loopback, { ...direct, ...forged }), { kind: 'served', host: 'localhost:8080', protocol: 'http' }, 'untrusted: not read at all')
  t.same(requestAuthority(loopback, { ...proxied, hosts: ['evil.example.com'], forwardedHost: 'evil.example.com, localhost' }).kind, 'forbidden')
  t.same(requestAuthority(loopback, { ...proxied, forwardedHost: 'evil.example.com, localhost' }).kind, 'forbidden')
  t.same(requestAuthority(loopback, { ...proxied, forwardedHost: 'localhost, evil.example.com' }).kind, 'forbidden')
  t.same(requestAuthority(loopback, { ...proxied, forwardedHost: 'localhost,' }).kind, 'malformed', 'an empty entry')
  t.same(requestAuthority(loopback, { ...proxied, forwardedHost: '127.0.0.1, LOCALHOST:1', forwardedProto: 'HTTPS, http' }), { kind: 'served', host: '127.0.0.1', protocol: 'https' })
  for (const proto of ['ftp', '', 'https,', 'http https']) t.same(requestAuthority(loopback, { ...proxied, forwardedProto: proto }).kind, 'malformed', `proto ${JSON.stringify(proto)}`)
})

t.test('Forwarded (RFC 7239) from a trusted peer: every host checked like Host, every proto http or https', async t => {
  t.same(requestAuthority(loopback, { ...direct, forwarded: 'host=evil.example.com;proto=gopher' }).kind, 'served', 'untrusted: not read (and not passed on)')
  t.same(requestAuthority(loopback, { ...proxied, forwarded: 'for=192.0.2.1;host="localhost:8080";proto=https' }), { kind: 'served', host: 'localhost:8080', protocol: 'http' }, 'allowed: served; the name and scheme passed on stay those of Host and X-Forwarded-*')
  t.same(requestAuthority(loopback, { ...proxied, forwarded: 'for=192.0.2.1;host=evil.example.com' }).kind, 'forbidden', 'a host the policy does not serve')
  t.same(requestAuthority(loopback, { ...proxied, forwarded: 'host=localhost, for=192.0.2.1;host=evil.example.com' }).kind, 'forbidden', 'in any element, not only the first')
  t.same(requestAuthority(loopback, { ...proxied, forwarded: 'host="[::1]:8080";proto=HTTPS, for=10.0.0.1' }).kind, 'served', 'a quoted IPv6 host, a proto in capitals')
  t.same(requestAuthority(loopback, { ...proxied, forwarded: 'host="localhost:99999"' }).kind, 'malformed', 'a host that is not a host[:port]')
  t.same(requestAuthority(loopback, { ...proxied, forwarded: 'proto=javascript' }).kind, 'malformed', 'a proto other than http or https')
  // A value with ':' (a port, IPv6) must be quoted.
  for (const bad of ['host', 'host=', 'host=a b', ';;', 'host="unterminated', 'host=localhost:8080']) {
    t.same(requestAuthority(loopback, { ...proxied, forwarded: bad }).kind, 'malformed', `does not parse: ${JSON.stringify(bad)}`)
  }
})

t.test('headerLines and ports', async t => {
  t.same(headerLines(['Host', 'a', 'X', 'y', 'HOST', 'b'], 'host'), ['a', 'b'])
  t.equal(hostName('[::1]:99999'), undefined)
  t.equal(hostName('[::1]:443'), '::1')
})
