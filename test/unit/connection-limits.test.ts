// MAX_CONNECTIONS_PER_ADDRESS (src/routes/connection-limits.ts), with sockets
// stood in for: many addresses of one IPv6 /64 are one client.
import t from 'tap'
import { EventEmitter } from 'node:events'
import type { Server } from 'node:net'
import { limitConnections } from '../../src/routes/connection-limits.js'

class FakeSocket extends EventEmitter {
  refused = false
  constructor (readonly remoteAddress: string) { super() }
  end (): void { this.refused = true }
  destroy (): void {}
}

function listener (maxPerAddress: number): (address: string) => FakeSocket {
  const server = new EventEmitter() as unknown as Server
  limitConnections(server, { maxConnections: 1000, maxPerAddress, exempt: () => false })
  return address => {
    const socket = new FakeSocket(address)
    server.emit('connection', socket)
    return socket
  }
}

t.test('addresses of one IPv6 /64 share the per-address cap', async t => {
  const connect = listener(3)
  const held = [1, 2, 3].map(i => connect(`2001:db8:1:2::${i}`))
  t.notOk(held.some(s => s.refused), 'three from the /64')
  t.ok(connect('2001:db8:1:2:aaaa::9').refused, 'a fourth, from another address of the same /64: refused')
  t.notOk(connect('2001:db8:1:3::1').refused, 'another /64: served')
  held[0]?.emit('close')
  t.notOk(connect('2001:db8:1:2::77').refused, 'one closed: room again')
})

t.test('IPv4 peers are counted by address', async t => {
  const connect = listener(1)
  t.notOk(connect('203.0.113.7').refused)
  t.ok(connect('::ffff:203.0.113.7').refused, 'the same address, IPv4-mapped')
  t.notOk(connect('203.0.113.8').refused)
})
