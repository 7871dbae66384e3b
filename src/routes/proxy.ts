import type { FastifyInstance } from 'fastify'
import type { Readable } from 'node:stream'
import type { GatewayConfig } from '../config/load.js'
import { errors } from '../errors.js'
import { isPublicPath, pathTrick } from '../net/request-path.js'
import type { SessionRecord } from '../store/contract.js'
import { forwardTransparently, ROUTED_METHODS, type ForwardDeps } from './forward.js'
import type { SessionGuard } from './mcp/session-guard.js'
import { disguisesMcpPath } from './path.js'

type ProxyConfig = Pick<GatewayConfig, 'mcpPath' | 'publicPaths'>

/**
 * Every other path of the upstream origin, proxied as it is, streamed, after
 * the MCP endpoint's checks: an upstream may serve MCP on more paths than one.
 */
export async function registerProxyRoute (app: FastifyInstance, config: ProxyConfig, deps: ForwardDeps & { guard: SessionGuard }): Promise<void> {
  const { guard } = deps
  await app.register(async proxy => {
    proxy.removeAllContentTypeParsers()
    proxy.addContentTypeParser('*', (_req, payload, done) => { done(null, payload) })
    proxy.route({
      method: [...ROUTED_METHODS],
      url: '/*',
      handler: async (request, reply) => {
        // RFC 9110 section 9.3.7: OPTIONS * asks about the server, not a resource:
        // the gateway answers for itself (the upstream would get "*" as a path).
        if (request.url === '*' && request.method === 'OPTIONS') return await reply.code(204).header('allow', ROUTED_METHODS.join(', ')).send()
        const trick = pathTrick(request.url)
        if (trick !== undefined) throw errors.badPath(trick)
        if (disguisesMcpPath(request.url, config.mcpPath)) throw errors.nonCanonicalMcpPath(config.mcpPath)
        const sessionId = request.headers['mcp-session-id']
        // PUBLIC_PATHS (OAuth metadata: fetched before a token exists) need no
        // principal; a request naming a session needs its own, on any path, and
        // goes upstream under the id the upstream knows it by, like the MCP path's.
        let session: SessionRecord | undefined
        if (sessionId !== undefined || !isPublicPath(request.url, config.publicPaths)) {
          await guard.verifiedPrincipalOf(request)
          if (sessionId !== undefined) session = await guard.requireKnownSessionOrStateless(String(sessionId), request)
        }
        return await forwardTransparently(deps, request, reply, request.body as Readable | undefined, session)
      }
    })
  })
}
