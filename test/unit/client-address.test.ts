// The key a client is counted under (src/net/client-address.ts): IPv6 by /64.
import t from 'tap'
import { clientKey } from '../../src/net/client-address.js'

t.test('IPv4 as it is, IPv4-mapped IPv6 as IPv4', async t => {
  t.equal(clientKey('203.0.113.7'), '203.0.113.7')
  t.equal(clientKey('::ffff:203.0.113.7'), '203.0.113.7')
  t.equal(clientKey('::ffff:cb00:7107'), '203.0.113.7')
})

t.test('IPv6 by its /64, however spelled', async t => {
  const key = clientKey('2001:db8:1:2::1')
  t.equal(key, '2001:db8:1:2::/64')
  for (const same of ['2001:db8:1:2:ffff:ffff:ffff:ffff', '2001:0db8:0001:0002:0:0:0:9', '2001:DB8:1:2::abcd', '2001:db8:1:2::1%eth0', '2001:db8:1:2:0:0:1.2.3.4']) {
    t.equal(clientKey(same), key, same)
  }
  t.not(clientKey('2001:db8:1:3::1'), key, 'the next /64 is another client')
  t.equal(clientKey('::1'), '0:0:0:0::/64')
  t.equal(clientKey('fe80::1'), 'fe80:0:0:0::/64')
})
