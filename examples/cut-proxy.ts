// A TCP proxy that can cut every connection at once, to simulate a network drop
// between an MCP client and whatever it talks to (the upstream directly, or the
// gateway). Bytes the proxy has read but not yet written are gone, as on a real drop.
import { connect, createServer } from 'node:net'
import type { AddressInfo, Socket } from 'node:net'

/**
 * - `both`: reset both sockets of each pair: the client's stream fails and the server
 *   sees its connection close at once.
 * - `client`: reset only the client's socket and leave the server's open but never
 *   read again, as when a route is black-holed: the server still believes the stream
 *   is alive (its writes land in socket buffers) until it closes it itself. This is
 *   the "half-dead socket" that makes a reconnect collide with the old stream.
 */
export type CutMode = 'both' | 'client'

export interface CutProxy {
  port: number
  /** http://127.0.0.1:<proxy port><path> */
  url (path: string): string
  /** Cuts every open socket pair; returns how many pairs were cut. */
  cutAll (mode?: CutMode): number
  /** Socket pairs open right now (half-open ones excluded). */
  readonly connections: number
  /** Server-side sockets left open by `cutAll('client')` and not closed since. */
  readonly halfOpen: number
  /** Socket pairs accepted since start. */
  readonly accepted: number
  /** Pairs cut since start. */
  readonly cut: number
  close (): Promise<void>
}

interface SocketPair {
  client: Socket
  target: Socket
}

function reset (socket: Socket): void {
  // RST rather than FIN: an abrupt failure, never mistaken for a clean end of stream.
  if (socket.destroyed) return
  if (socket.readyState === 'open') socket.resetAndDestroy()
  else socket.destroy()
}

/** `listenPort`: 0 (the default) picks a free port; a port given is listened on again after close(). */
export async function startCutProxy (targetPort: number, targetHost = '127.0.0.1', listenPort = 0): Promise<CutProxy> {
  const pairs = new Set<SocketPair>()
  const halfOpen = new Set<Socket>()
  let accepted = 0
  let cut = 0

  const server = createServer((client) => {
    accepted++
    client.setNoDelay(true)
    const target = connect({ port: targetPort, host: targetHost, noDelay: true })
    const pair: SocketPair = { client, target }
    pairs.add(pair)
    const drop = () => {
      if (!pairs.delete(pair)) return
      client.destroy()
      target.destroy()
    }
    // Errors are expected (resets); either side closing closes the pair.
    client.on('error', drop)
    target.on('error', drop)
    client.on('close', drop)
    target.on('close', drop)
    client.pipe(target)
    target.pipe(client)
  })

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(listenPort, '127.0.0.1', () => {
      server.off('error', reject)
      resolve()
    })
  })
  const { port } = server.address() as AddressInfo

  function keepHalfOpen ({ client, target }: SocketPair): void {
    target.unpipe(client)
    client.unpipe(target)
    // Stop reading: the server's writes pile up in the socket buffers unnoticed.
    target.pause()
    halfOpen.add(target)
    target.once('close', () => halfOpen.delete(target))
    reset(client)
  }

  return {
    port,
    url: (path) => `http://127.0.0.1:${port}${path}`,
    cutAll (mode = 'both') {
      const open = [...pairs]
      pairs.clear()
      for (const pair of open) {
        if (mode === 'client') {
          keepHalfOpen(pair)
        } else {
          reset(pair.client)
          reset(pair.target)
        }
      }
      cut += open.length
      return open.length
    },
    get connections () { return pairs.size },
    get halfOpen () { return halfOpen.size },
    get accepted () { return accepted },
    get cut () { return cut },
    async close () {
      for (const { client, target } of pairs) {
        client.destroy()
        target.destroy()
      }
      pairs.clear()
      for (const target of halfOpen) target.destroy()
      halfOpen.clear()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    }
  }
}
