import type { FastifyInstance, FastifyReply, FastifyRequest, HookHandlerDoneFunction } from 'fastify'
import type { Socket } from 'node:net'

/**
 * Pipelined requests (RFC 9112 section 9.3.2) waiting behind the one being
 * served on their connection, past which the connection is closed. Clients
 * that pipeline keep a few requests outstanding; each waiting request holds
 * its header block and at most one socket read of body (64 KiB), so 8 keep a
 * connection's extra memory well under a MiB whatever it sends.
 */
export const MAX_PIPELINED_WAITING = 8

/**
 * Serve the requests of one connection one at a time, as nginx does.
 *
 * Node's server parses and dispatches every request a connection sends,
 * without waiting for the previous answer (it pauses the socket only on the
 * volume of answers waiting to be written); it queues the answers in order
 * and hands the socket to the next answer when the previous one finishes. A
 * request whose answer has no socket yet therefore waits here until it gets
 * one: its body is not read meanwhile, so Node stops reading the connection
 * (backpressure) and parses no further request. One client connection thus
 * holds at most one request at the upstream and one body in memory, which
 * MAX_CONNECTIONS_PER_ADDRESS and MAX_BODY_BYTES bound.
 *
 * A waiting request is released when the answer before it finishes (a
 * stream's too) or when the connection closes; in the second case it is
 * dropped unserved. Nothing is kept for a connection with no request waiting
 * (an idle stream).
 */
export function servePipelinedInTurn (app: FastifyInstance): void {
  const waitingOn = new WeakMap<Socket, number>()

  app.addHook('onRequest', (request: FastifyRequest, reply: FastifyReply, done: HookHandlerDoneFunction) => {
    const res = reply.raw
    // The common case: the answer has the connection (the first request on it, or its turn came at once).
    if (res.socket !== null) {
      done()
      return
    }
    const socket = request.raw.socket
    const waiting = (waitingOn.get(socket) ?? 0) + 1
    if (waiting > MAX_PIPELINED_WAITING) {
      request.log.info({ waiting: MAX_PIPELINED_WAITING }, 'too many pipelined requests waiting on one connection: connection closed')
      reply.hijack()
      socket.destroy()
      done()
      return
    }
    waitingOn.set(socket, waiting)
    const release = (): void => {
      res.off('socket', release)
      request.raw.off('close', release)
      const left = (waitingOn.get(socket) ?? 1) - 1
      if (left === 0) waitingOn.delete(socket)
      else waitingOn.set(socket, left)
      // The connection closed before this request's turn: nobody reads its answer.
      if (res.socket === null || socket.destroyed) reply.hijack()
      done()
    }
    res.once('socket', release)
    request.raw.once('close', release)
  })
}
