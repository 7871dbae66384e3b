import { format } from 'node:util'
import { pino, stdSerializers, stdTimeFunctions, type DestinationStream, type Logger } from 'pino'

/** Fields never logged in clear: credentials travel through the gateway. */
export const REDACT_PATHS = [
  'req.headers.authorization', 'req.headers.cookie', 'req.headers["proxy-authorization"]',
  'req.headers["x-api-key"]', 'res.headers["set-cookie"]', '*.authorization', '*.cookie'
]

/** pino's level numbers. */
const ERROR = 50
const WARN = 40
const DEBUG = 20

export interface LoggerOptions {
  /** Where lines go (stdout by default). */
  readonly destination?: DestinationStream
  /** A warning or error with the same message is written once per window (30 s by default). */
  readonly repeatWindowMs?: number
  readonly now?: () => number
}

/** An error as logged below error level: what it is, not where it came from. */
class StacklessError {
  constructor (readonly type: string, readonly message: string, readonly code: unknown) {}
}

/** pino's error serializer, but a StacklessError goes as it is. */
function serializeError (err: unknown): unknown {
  if (err instanceof StacklessError) return { type: err.type, message: err.message, ...(err.code !== undefined && { code: err.code }) }
  return stdSerializers.err(err as Error)
}

/** Messages remembered at most: they are constants in the code, this only bounds a surprise. */
const MAX_REMEMBERED = 1000

/**
 * The gateway's logger: JSON lines with level names and ISO times (what log
 * tools index without a mapping), credentials redacted, and two things that
 * keep an outage readable: a warning or error repeated within the window is
 * counted, not written (the next one written says how many were left out),
 * and lines below error level carry an error's type, message and code but no
 * stack (they are expected conditions: a store or upstream that is down).
 */
export function createLogger (level: string, options: LoggerOptions = {}): Logger {
  // 30 s: an outage's warning is written about twice a minute, not once per request.
  const windowMs = options.repeatWindowMs ?? 30_000
  const now = options.now ?? Date.now
  const recent = new Map<string, { until: number, suppressed: number }>()
  return pino({
    level,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    formatters: { level: label => ({ level: label }) },
    serializers: { err: serializeError },
    timestamp: stdTimeFunctions.isoTime,
    hooks: {
      logMethod (args, method, levelValue) {
        const first = args[0] as unknown
        const fields = typeof first === 'object' && first !== null ? first as Record<string, unknown> : undefined
        let out: unknown[] = args
        if (levelValue >= WARN && levelValue <= ERROR) {
          const message = `${levelValue} ${String(fields === undefined ? first : args[1])}`
          const seen = recent.get(message)
          const at = now()
          if (seen !== undefined && at < seen.until) {
            seen.suppressed++
            return
          }
          if (recent.size >= MAX_REMEMBERED) recent.clear()
          recent.set(message, { until: at + windowMs, suppressed: 0 })
          if (seen !== undefined && seen.suppressed > 0) {
            out = [{ ...fields, repeated: seen.suppressed }, ...(fields === undefined ? args : args.slice(1))]
          }
        }
        const err = fields?.err
        if (levelValue < ERROR && levelValue > DEBUG && err instanceof Error) {
          const stackless = new StacklessError(err.name, err.message, (err as NodeJS.ErrnoException).code)
          out = [{ ...(out[0] as Record<string, unknown>), err: stackless }, ...out.slice(1)]
        }
        method.apply(this, out as Parameters<typeof method>)
      }
    }
  }, options.destination)
}

/**
 * Route what libraries print with console.warn / console.error (ioredis warns
 * that way, for instance when a password is given to a Redis that needs none)
 * through the logger, so every line of the process is JSON.
 */
export function routeConsoleTo (logger: Logger): void {
  console.warn = (...args: unknown[]) => { logger.warn({ source: 'console' }, format(...args)) }
  console.error = (...args: unknown[]) => { logger.error({ source: 'console' }, format(...args)) }
}
