// INITIALIZES_PER_MINUTE_PER_ADDRESS (src/routes/mcp/initialize-rate.ts): the bucket, and what counts as initialize.
import t from 'tap'
import { InitializeRate, isInitializeRequest } from '../../src/routes/mcp/initialize-rate.js'

t.test('a minute\'s worth at once, then one every 60/rate seconds; IPv6 by /64', async t => {
  let now = 0
  const rate = new InitializeRate({ perMinute: 6, maxEntries: 100, now: () => now })
  for (let i = 0; i < 6; i++) t.equal(rate.take('198.51.100.1'), 0)
  t.equal(rate.take('198.51.100.1'), 10, 'the seventh waits 10 s')
  t.equal(rate.take('198.51.100.2'), 0, 'another address has its own')
  now += 10_000
  t.equal(rate.take('198.51.100.1'), 0, 'one more after 10 s')
  for (let i = 0; i < 6; i++) t.equal(rate.take(`2001:db8::${i}`), 0)
  t.ok(rate.take('2001:db8::ffff') > 0, 'a seventh address of the same /64 waits')
})

t.test('a request is counted once: before the upstream, or where the upstream issues its session', async t => {
  const rate = new InitializeRate({ perMinute: 3, maxEntries: 100, now: () => 0 })
  const plain = { ip: '198.51.100.1' }
  t.equal(rate.beforeUpstream(plain), 0, 'a plain initialize, counted before the upstream')
  t.equal(rate.sessionIssued(plain), 0, 'its session is not counted again')
  // A body the gateway does not read as an initialize (a byte order mark, UTF-16, another
  // protocol revision): counted when the upstream issues its session.
  t.equal(rate.sessionIssued({ ip: '198.51.100.1' }), 0, 'the second session')
  t.equal(rate.sessionIssued({ ip: '198.51.100.1' }), 0, 'the third')
  t.ok(rate.sessionIssued({ ip: '198.51.100.1' }) > 0, 'a fourth session from the address waits')
  const refused = { ip: '198.51.100.1' }
  t.ok(rate.beforeUpstream(refused) > 0, 'a plain one is refused before the upstream')
  t.ok(rate.sessionIssued(refused) > 0, 'and a request refused there is not taken for paid')
  t.equal(rate.sessionIssued({ ip: '198.51.100.2' }), 0, 'another address has its own')
})

t.test('isInitializeRequest', async t => {
  t.ok(isInitializeRequest(Buffer.from('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}')))
  t.notOk(isInitializeRequest(Buffer.from('{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"initialize"}}')))
  t.notOk(isInitializeRequest(Buffer.from('{"method":"initialize"')), 'not JSON')
  t.notOk(isInitializeRequest(undefined))
  // What the upstream's JSON.parse reads as an initialize is one, however it is spelt.
  t.ok(isInitializeRequest(Buffer.from('{"jsonrpc":"2.0","id":1,"method":"\\u0069nitialize","params":{}}')), 'the method spelt with an escape')
  t.ok(isInitializeRequest(Buffer.from('{"jsonrpc":"2.0","id":1,"method":"initializ\\u0065"}')), 'escaped at its end')
  t.ok(isInitializeRequest(Buffer.from('[{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}]')), 'in a batch')
  t.notOk(isInitializeRequest(Buffer.from('[{"jsonrpc":"2.0","id":1,"method":"ping"}, 3, null]')), 'a batch without one')
  t.notOk(isInitializeRequest(Buffer.from('{"jsonrpc":"2.0","id":1,"method":"t\\u006fols/list"}')), 'another method, escaped')
})
