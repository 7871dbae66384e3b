import { Type, type Static } from '@sinclair/typebox'

/**
 * Every environment variable the gateway reads. The descriptions and defaults
 * here are the configuration reference: test/packaging/config-reference.test.ts
 * keeps config/REFERENCE.md in step with this schema.
 */
export const ConfigSchema = Type.Object({
  UPSTREAM_URL: Type.String({ description: 'The upstream MCP endpoint (Streamable HTTP), e.g. http://mcp:3000/mcp. The gateway serves the MCP endpoint at the same path and proxies every other path of that origin unchanged.' }),
  HOST: Type.String({ default: '0.0.0.0', description: 'Address the MCP listener binds.' }),
  PORT: Type.Integer({ default: 8080, minimum: 0, maximum: 65535, description: 'Port of the MCP listener (clients connect here).' }),
  ADMIN_HOST: Type.String({ default: '0.0.0.0', description: 'Address the admin listener (/healthz, /readyz, /metrics) binds.' }),
  ADMIN_PORT: Type.Integer({ default: 9090, minimum: 0, maximum: 65535, description: 'Port of the admin listener; kept apart so it never shadows an upstream path.' }),
  LOG_LEVEL: Type.Unsafe<'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent'>({ type: 'string', enum: ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'], default: 'info', description: 'pino log level: fatal, error, warn, info, debug, trace or silent.' }),

  REDIS_URL: Type.Optional(Type.String({ description: 'Redis for the event store: redis:// or rediss:// (with password if any), or unix:///path/to/redis.sock for a Redis on the same host (replicas share it only if they run there too). Unset: the embedded in-memory store, single process and not durable.' })),
  REDIS_CLUSTER_NODES: Type.Optional(Type.String({ description: 'Redis Cluster seed nodes, host:port,host:port,... (instead of REDIS_URL). Password and TLS from REDIS_PASSWORD / REDIS_TLS.' })),
  REDIS_SENTINELS: Type.Optional(Type.String({ description: 'Redis Sentinel addresses, host:port,host:port,... (instead of REDIS_URL); needs REDIS_SENTINEL_NAME.' })),
  REDIS_SENTINEL_NAME: Type.Optional(Type.String({ description: 'Name of the master the Sentinels watch.' })),
  REDIS_PASSWORD: Type.Optional(Type.String({ description: 'Password for Redis Cluster nodes or the Sentinel-managed master, and for REDIS_URL when the URL carries none (a password in REDIS_URL wins; a warning says so).' })),
  REDIS_TLS: Type.Boolean({ default: false, description: 'Use TLS for REDIS_CLUSTER_NODES / REDIS_SENTINELS connections (REDIS_URL uses rediss:// instead).' }),
  REDIS_KEY_PREFIX: Type.String({ default: 'mcpgw:', description: 'Prefix of every Redis key the gateway writes.' }),

  RETENTION_MAX_EVENTS: Type.Integer({ default: 10000, minimum: 1, description: 'Events kept per stream; older events are trimmed and a client resuming before them is told about the gap.' }),
  RETENTION_MAX_BYTES: Type.Integer({ default: 16777216, minimum: 1024, description: 'Bytes of event data kept per stream (16 MiB).' }),
  RETENTION_TTL_SECONDS: Type.Integer({ default: 3600, minimum: 1, description: 'A session\'s records expire after this long without activity.' }),
  MEMORY_STORE_MAX_BYTES: Type.Integer({ default: 268435456, minimum: 1048576, description: 'Embedded store only: process-wide cap (256 MiB) on stored event bytes plus 512 bytes per session and 256 per stream record. Over it, the least recently appended streams lose their events first (a finished answer\'s stream goes altogether), then the least recently used sessions go.' }),
  MAX_EVENT_BYTES: Type.Integer({ default: 4194304, minimum: 1024, description: 'Largest single upstream SSE event accepted, in bytes as sent (all its field lines; 4 MiB). A larger event is not recorded; its stream is closed and the gap is signalled.' }),
  MAX_BODY_BYTES: Type.Integer({ default: 4194304, minimum: 1024, description: 'Largest client request body forwarded upstream (4 MiB); larger bodies get 413.' }),
  CLIENT_BUFFER_MAX_BYTES: Type.Integer({ default: 8388608, minimum: 65536, description: 'Bytes that may wait in one client connection\'s send buffer. A slower client gets nothing more: its stream ends after what waits, with a retry hint (cut off if that is not read within 10 s), and it resumes from the store.' }),
  MAX_SESSIONS: Type.Integer({ default: 10000, minimum: 1, description: 'Sessions with a live upstream GET stream held by this process; beyond it a new standalone stream gets 503 with Retry-After.' }),

  STANDALONE_HOLD_SECONDS: Type.Integer({ default: 120, minimum: 0, description: 'How long a session\'s upstream GET stream stays open, still recording, after its last client left.' }),
  KEEPALIVE_INTERVAL_SECONDS: Type.Integer({ default: 15, minimum: 1, description: 'Longest silence on a client stream: one that carried nothing for this long gets an SSE keep-alive comment (well under common 60 s proxy idle limits). Streams carrying events get none.' }),
  SSE_RETRY_MS: Type.Integer({ default: 1000, minimum: 0, description: 'The SSE retry hint sent to clients: how long they wait before reconnecting.' }),
  UPSTREAM_HEADERS_TIMEOUT_SECONDS: Type.Integer({ default: 300, minimum: 1, description: 'How long the upstream may take to send response headers. SSE bodies have no read timeout.' }),

  PRINCIPAL_HEADER: Type.String({ default: 'authorization', description: 'Request header whose hash identifies the principal a session is bound to.' }),
  RECOVER_LOST_SESSIONS: Type.Boolean({ default: true, description: 'After the store lost its records (Redis restarted empty, or the embedded store\'s process restarted), a session it no longer knows is recorded again, under a new epoch, by the first request that comes back with it within RETENTION_TTL_SECONDS, bound to that request\'s principal; the upstream still decides whether the session exists. false: such a session gets 404 and its clients must initialize again.' }),
  ALLOWED_ORIGINS: Type.Optional(Type.String({ description: 'Comma-separated Origin allow-list; a request with another Origin gets 403. Unset: any Origin is accepted (a warning is logged).' })),
  LEASE_TTL_MS: Type.Integer({ default: 5000, minimum: 500, description: 'Lease on a session\'s upstream GET stream, and liveness of the replicas recording POST answers: renewed every third of this; another replica takes over (or ends the answers a dead replica was recording) this long after the holder dies.' }),
  DRAIN_SPREAD_SECONDS: Type.Integer({ default: 5, minimum: 0, description: 'On SIGTERM, client streams are closed spread over this window so clients do not all reconnect at once.' }),
  MAX_HEADER_BYTES: Type.Integer({ default: 16384, minimum: 1024, description: 'Largest request header block accepted (431 beyond).' }),
  SESSION_REQUESTS_PER_SECOND: Type.Integer({ default: 100, minimum: 1, description: 'Requests per second one session may make through this replica (bursts of twice that); beyond it 429 with Retry-After.' }),
  SHUTDOWN_GRACE_SECONDS: Type.Integer({ default: 25, minimum: 1, description: 'On SIGTERM, how long to finish in-flight upstream answers before exiting.' })
})

export type RawConfig = Static<typeof ConfigSchema>
