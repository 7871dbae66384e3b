import closeWithGrace from 'close-with-grace'
import { ConfigError, loadConfig, type GatewayConfig } from './config/load.js'
import { describeConfig } from './config/describe.js'
import { createLogger, routeConsoleTo } from './logger.js'
import { buildGateway } from './server.js'
import { tracingWanted } from './tracing/wanted.js'
import { createStore, describeTarget, redisTarget } from './store/create.js'
import type { FastifyBaseLogger } from 'fastify'
import { VERSION } from './version.js'

/** Entry point: load config, build, listen; SIGTERM/SIGINT drain and exit. */
async function main (): Promise<void> {
  let config: GatewayConfig
  try {
    config = loadConfig(process.env)
  } catch (err) {
    if (err instanceof ConfigError) {
      process.stderr.write(`mcp-resumable-gateway: ${err.message}\n`)
      process.exit(2)
    }
    throw err
  }
  const logger = createLogger(config.logLevel)
  const log = logger as unknown as FastifyBaseLogger
  routeConsoleTo(logger)
  log.info({ version: VERSION, config: describeConfig(config) }, 'effective configuration')
  for (const warning of config.warnings) log.warn(warning)
  let store
  try {
    store = await createStore(config, log)
  } catch (err) {
    // Only a Redis target can fail to connect.
    const target = redisTarget(config) ?? { url: '' }
    const variable = 'url' in target ? 'REDIS_URL' : 'cluster' in target ? 'REDIS_CLUSTER_NODES' : 'REDIS_SENTINELS'
    const where = `${variable} ${describeTarget(target)}`
    process.stderr.write(`mcp-resumable-gateway: cannot reach the event store (${where}): ${(err as Error).message}\n` +
      `Check that Redis is running and reachable from here, or unset ${variable} to use the embedded store.\n`)
    process.exit(1)
  }
  // The SDK is loaded only when tracing is on.
  const tracing = tracingWanted(process.env) ? (await import('./tracing/tracing.js')).startTracing(process.env, VERSION) : undefined
  if (tracing !== undefined) log.info('tracing: spans exported over OTLP/HTTP as the OTEL_* variables say')
  const gateway = await buildGateway(config, { store, logger, ...(tracing !== undefined && { tracer: tracing.tracer }) })
  if (config.allowedOrigins === null) log.warn('ALLOWED_ORIGINS is not set: requests from any Origin are accepted')
  if (config.sessionBindingKey === undefined) {
    log.warn(`SESSION_BINDING_KEY is not set: session ids are bound to their principal under a built-in key, against which whoever holds an id can test guesses of a weak credential offline${config.recoverLostSessions ? ', and sessions the event store loses are not recovered (RECOVER_LOST_SESSIONS needs a key of this deployment\'s own): their clients initialize again' : ''}`)
  }

  // The grace period covers the drain; close-with-grace exits non-zero if it runs out.
  // 2 s beyond it: the drain ends 1.5 s before the grace, and the closes after it must not be cut.
  closeWithGrace({ delay: config.shutdownGraceMs + 2000, logger: log }, async ({ signal, err }) => {
    if (err !== undefined) log.error({ err }, 'fatal error: shutting down')
    log.info({ signal }, 'shutting down')
    try {
      await gateway.close()
      await tracing?.shutdown()
    } finally {
      logger.writeRepeats()
    }
  })

  const { url, adminUrl } = await gateway.listen()
  log.info({ url, adminUrl, upstream: config.upstreamUrl.origin + config.mcpPath, store: store.kind, version: VERSION }, 'gateway listening')
}

main().catch((err: unknown) => {
  process.stderr.write(`mcp-resumable-gateway: failed to start: ${(err as Error).stack ?? String(err)}\n`)
  process.exit(1)
})
