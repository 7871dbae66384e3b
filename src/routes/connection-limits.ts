import { clientKey } from '../net/client-address.js'
import type { Server, Socket } from 'node:net'

export interface ConnectionLimits {
  readonly maxConnections: number
  readonly maxPerAddress: number
  /** Peers counted only against maxConnections (trusted proxies carry many clients). */
  readonly exempt: (address: string) => boolean
}

const REFUSAL_BODY = 'Too many connections from this address: MAX_CONNECTIONS_PER_ADDRESS. Retry later.\n'
const REFUSAL = 'HTTP/1.1 503 Service Unavailable\r\nretry-after: 1\r\ncontent-type: text/plain\r\n' +
  `content-length: ${Buffer.byteLength(REFUSAL_BODY)}\r\nconnection: close\r\n\r\n${REFUSAL_BODY}`

/**
 * Connection caps on a listener, applied when a connection is accepted,
 * before any byte of it is read: past the process cap Node closes the socket
 * itself; past the per-address cap the socket gets a fixed 503 and is closed.
 */
export function limitConnections (server: Server, limits: ConnectionLimits): void {
  server.maxConnections = limits.maxConnections
  const open = new Map<string, number>()
  server.on('connection', (socket: Socket) => {
    const address = socket.remoteAddress
    if (address === undefined || limits.exempt(address)) return
    // IPv6 peers by their /64: one host can take any address in it.
    const key = clientKey(address)
    const count = (open.get(key) ?? 0) + 1
    if (count > limits.maxPerAddress) {
      socket.end(REFUSAL)
      // A peer that never reads or closes must not keep even this socket; a second is ample to read one refusal.
      setTimeout(() => socket.destroy(), 1000).unref()
      return
    }
    open.set(key, count)
    socket.once('close', () => {
      const left = (open.get(key) ?? 1) - 1
      if (left === 0) open.delete(key)
      else open.set(key, left)
    })
  })
}
