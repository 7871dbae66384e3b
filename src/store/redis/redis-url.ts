// REDIS_URL's forms. redis:// and rediss:// go to ioredis as they are. A
// unix:// URL names a Redis on the same host as the gateway, reached through
// its socket file (a Redis with no TCP listener at all). ioredis would take
// such a URL's whole text for the path, so it is read here.

/** What a unix:// URL says: ioredis connection options. */
export interface UnixSocketOptions {
  readonly path: string
  readonly db?: number
  readonly username?: string
  readonly password?: string
}

const UNIX_FORM = 'unix:///path/to/redis.sock (credentials: unix://user:password@localhost/path/to/redis.sock; database: ?db=N)'

/** The problem with a REDIS_URL, or undefined when it can be used. */
export function redisUrlProblem (raw: string): string | undefined {
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    return `REDIS_URL: must be a URL such as redis://redis:6379 or ${UNIX_FORM}`
  }
  if (url.protocol === 'unix:') {
    const parsed = parseUnixUrl(url)
    return typeof parsed === 'string' ? `REDIS_URL: ${parsed}` : undefined
  }
  if (url.protocol !== 'redis:' && url.protocol !== 'rediss:') return `REDIS_URL: must use redis://, rediss:// or unix://, got ${url.protocol}`
  if (url.hostname === '') return 'REDIS_URL: must name a host, e.g. redis://redis:6379'
  return undefined
}

/** ioredis's arguments for a REDIS_URL that redisUrlProblem accepted. */
export function redisUrlOptions (raw: string): string | UnixSocketOptions {
  const url = new URL(raw)
  if (url.protocol !== 'unix:') return raw
  const parsed = parseUnixUrl(url)
  if (typeof parsed === 'string') throw new TypeError(`REDIS_URL: ${parsed}`)
  return parsed
}

/** A unix:// URL as connection options, or what is wrong with it. */
export function parseUnixUrl (url: URL): UnixSocketOptions | string {
  if (url.hostname !== '' && url.hostname !== 'localhost') return `a unix:// URL names no host (got ${url.hostname}); write ${UNIX_FORM}`
  if (url.port !== '') return `a unix:// URL has no port; write ${UNIX_FORM}`
  if (url.pathname === '' || url.pathname === '/') return `a unix:// URL needs the socket file's absolute path; write ${UNIX_FORM}`
  if (url.hash !== '') return 'a unix:// URL carries no fragment'
  let db: number | undefined
  for (const [name, value] of url.searchParams) {
    if (name !== 'db') return `unknown parameter ${name} in a unix:// URL (only db)`
    if (!/^\d+$/.test(value)) return `db must be a database number, got ${JSON.stringify(value)}`
    db = Number(value)
  }
  return {
    path: decodeURIComponent(url.pathname),
    ...(db !== undefined && { db }),
    ...(url.username !== '' && { username: decodeURIComponent(url.username) }),
    ...(url.password !== '' && { password: decodeURIComponent(url.password) })
  }
}
