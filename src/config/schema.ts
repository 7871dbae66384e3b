import { Type, type Static } from '@sinclair/typebox'

/**
 * Every environment variable the gateway reads. The descriptions and defaults
 * here are the configuration reference: test/packaging/config-reference.test.ts
 * keeps config/REFERENCE.md in step with this schema.
 */
export const ConfigSchema = Type.Object({
  UPSTREAM_URL: Type.String({ description: 'The upstream MCP endpoint (Streamable HTTP), e.g. http://mcp:3000/mcp, path included. The gateway serves the MCP endpoint at the same path and proxies every other path of that origin unchanged. A URL without a path is refused; write http://mcp:3000/ only if the server\'s MCP endpoint really is /.' }),
  HOST: Type.String({ default: '0.0.0.0', description: 'Address the MCP listener binds.' }),
  PORT: Type.Integer({ default: 8080, minimum: 0, maximum: 65535, description: 'Port of the MCP listener (clients connect here).' }),
  ADMIN_HOST: Type.String({ default: '127.0.0.1', description: 'Address the admin listener (/healthz, /readyz, /metrics) binds. It has no access control, so by default only this host (or pod, or container) reaches it; set 0.0.0.0 where probes or Prometheus come from outside (Kubernetes probes use the pod IP) and keep the port off public Services.' }),
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

  MAX_SESSIONS_PER_PRINCIPAL: Type.Optional(Type.Integer({ minimum: 1, description: 'Sessions with a live upstream GET stream held by this process for one principal (streams kept STANDALONE_HOLD_SECONDS after their client left count); beyond it that principal\'s new standalone stream gets 429 with Retry-After, other principals are unaffected. Unset: a tenth of MAX_SESSIONS, rounded up. Requests without PRINCIPAL_HEADER share one principal, which this limit does not apply to.' })),
  STANDALONE_HOLD_SECONDS: Type.Integer({ default: 120, minimum: 0, description: 'How long a session\'s upstream GET stream stays open, still recording, after its last client left.' }),
  KEEPALIVE_INTERVAL_SECONDS: Type.Integer({ default: 15, minimum: 1, description: 'Longest silence on a client stream: one that carried nothing for this long gets an SSE keep-alive comment (well under common 60 s proxy idle limits). Streams carrying events get none.' }),
  SSE_RETRY_MS: Type.Integer({ default: 1000, minimum: 0, description: 'The SSE retry hint sent to clients: how long they wait before reconnecting.' }),
  UPSTREAM_HEADERS_TIMEOUT_SECONDS: Type.Integer({ default: 300, minimum: 1, description: 'How long the upstream may take to send response headers. SSE bodies have no read timeout.' }),

  PRINCIPAL_HEADER: Type.String({ default: 'authorization', description: 'Request header whose hash identifies the principal a session is bound to.' }),
  AUTH_JWT_ISSUER: Type.Optional(Type.String({ description: 'The OAuth authorization server\'s issuer identifier. Set with AUTH_JWKS_URL and AUTH_JWT_AUDIENCE: the MCP endpoint then verifies bearer JWTs (signature, iss, aud, exp, nbf) and binds sessions to the token\'s iss + sub, so they survive token refresh; a missing or invalid token gets 401. Unset: sessions are bound to the hash of PRINCIPAL_HEADER, and a refreshed token loses its sessions.' })),
  AUTH_JWKS_URL: Type.Optional(Type.String({ description: 'The authorization server\'s JWK Set URL (its jwks_uri), https:// (http:// only on loopback). Fetched on first use and cached; see AUTH_JWKS_CACHE_SECONDS.' })),
  AUTH_JWT_AUDIENCE: Type.Optional(Type.String({ description: 'Comma-separated audiences a token must name in aud: this MCP server\'s resource identifier (its canonical URL, RFC 8707).' })),
  AUTH_JWT_CLOCK_TOLERANCE_SECONDS: Type.Integer({ default: 30, minimum: 0, maximum: 300, description: 'Clock skew allowed when checking a token\'s exp and nbf.' }),
  AUTH_JWKS_TIMEOUT_MS: Type.Integer({ default: 5000, minimum: 100, description: 'Longest wait for the JWK Set; a request that needs it meanwhile gets 503 with Retry-After once it runs out.' }),
  AUTH_JWKS_CACHE_SECONDS: Type.Integer({ default: 600, minimum: 1, description: 'A fetched JWK Set is used this long, then fetched again before the next verification (if that fetch fails, requests needing a session get 503 until it succeeds).' }),
  AUTH_JWKS_COOLDOWN_SECONDS: Type.Integer({ default: 30, minimum: 0, description: 'A token signed by a key the cached set lacks triggers a new fetch at most this often (key rotation without letting clients make the gateway fetch at will).' }),
  AUTH_RESOURCE_METADATA_URL: Type.Optional(Type.String({ description: 'The protected resource metadata URL (RFC 9728) announced as resource_metadata in the WWW-Authenticate of the gateway\'s 401 answers. Unset: clients find it at the well-known path, proxied to the upstream.' })),
  RECOVER_LOST_SESSIONS: Type.Boolean({ default: true, description: 'After the store lost its records (Redis restarted empty, or the embedded store\'s process restarted), a session it no longer knows is recorded again, under a new epoch, by the first request that comes back with it within RETENTION_TTL_SECONDS, bound to that request\'s principal; the upstream still decides whether the session exists. false: such a session gets 404 and its clients must initialize again.' }),
  ALLOWED_HOSTS: Type.Optional(Type.String({ description: 'Comma-separated Host allow-list (host names or IP addresses without port; *.example.com for subdomains) checked on every request before anything reaches the upstream: DNS-rebinding protection. Another Host gets 403. * turns the check off. Unset: on a loopback HOST, localhost, 127.0.0.1 and [::1]; on any other HOST (0.0.0.0 included), names no public DNS can answer for (IP addresses, single-label names such as gateway, and names under .localhost, .local, .internal, .home.arpa, .svc); a public name such as mcp.example.com must be listed.' })),
  TRUSTED_PROXIES: Type.Optional(Type.String({ description: 'Comma-separated addresses or CIDR ranges (or loopback, linklocal, uniquelocal) of outer proxies whose X-Forwarded-For/-Proto/-Host and Forwarded headers are believed. Unset: such headers from clients are dropped and the gateway sets X-Forwarded-For/-Proto/-Host from what it saw. Trusted peers are also exempt from MAX_CONNECTIONS_PER_ADDRESS.' })),
  REQUEST_READ_TIMEOUT_SECONDS: Type.Integer({ default: 60, minimum: 1, description: 'Time a client has to send a whole request, headers and body; beyond it 408 and the connection is closed (a stalled body never holds memory longer). Answers, streamed or not, have no such limit.' }),
  MAX_CONNECTIONS: Type.Integer({ default: 16384, minimum: 1, description: 'Client connections this process accepts at once on the MCP listener; beyond it new connections are closed at once.' }),
  MAX_CONNECTIONS_PER_ADDRESS: Type.Integer({ default: 256, minimum: 1, description: 'Client connections one peer address may hold at once; beyond it a new connection gets 503 and is closed. Peers in TRUSTED_PROXIES are only counted against MAX_CONNECTIONS.' }),
  ALLOWED_ORIGINS: Type.Optional(Type.String({ description: 'Comma-separated Origin allow-list; a request with another Origin gets 403. Unset: any Origin is accepted (a warning is logged).' })),
  LEASE_TTL_MS: Type.Integer({ default: 5000, minimum: 500, description: 'Lease on a session\'s upstream GET stream, and liveness of the replicas recording POST answers: renewed every third of this; another replica takes over (or ends the answers a dead replica was recording) this long after the holder dies.' }),
  DRAIN_SPREAD_SECONDS: Type.Integer({ default: 5, minimum: 0, description: 'On SIGTERM, client streams are closed spread over this window so clients do not all reconnect at once.' }),
  DRAIN_RETRY_MS: Type.Integer({ default: 5000, minimum: 0, description: 'The SSE retry hint given by a draining process, as it exits, to the client streams it still serves: the resumes that came back to it while it drained (a single instance, or a balancer still sending to it). Clients with the official SDK\'s defaults try twice, this long apart, so twice this covers the restart of a single instance. See docs/operations-restarts.md.' }),
  MAX_HEADER_BYTES: Type.Integer({ default: 16384, minimum: 1024, description: 'Largest request header block accepted (431 beyond).' }),
  SESSION_REQUESTS_PER_SECOND: Type.Integer({ default: 100, minimum: 1, description: 'Requests per second one session may make through this replica (bursts of twice that); beyond it 429 with Retry-After.' }),
  SHUTDOWN_GRACE_SECONDS: Type.Integer({ default: 25, minimum: 1, description: 'On SIGTERM, how long to finish in-flight upstream answers before exiting.' })
})

export type RawConfig = Static<typeof ConfigSchema>
