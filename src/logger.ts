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

/** A repeated message within its window: how many were left out, and the last of them. */
interface Repeats {
  readonly until: number
  suppressed: number
  /** The last call left out, written with `repeated` once the window ends. */
  last?: { readonly logger: unknown, readonly method: (...args: unknown[]) => void, readonly args: unknown[], readonly levelValue: number }
}

/** The gateway's logger, and what it writes before the process exits. */
export type GatewayLogger = Logger & {
  /** Write the counts of repeats whose windows have not ended yet (at shutdown: their timers would never fire). */
  readonly writeRepeats: () => void
}

/**
 * The gateway's logger: JSON lines with level names and ISO times (what log
 * tools index without a mapping), credentials redacted, and two things that
 * keep an outage readable: a warning or error repeated within the window is
 * counted, not written (when the window ends, the last one left out is
 * written with how many were), and lines below error level carry an error's
 * type, message and code but no stack (they are expected conditions: a store
 * or upstream that is down).
 */
export function createLogger (level: string, options: LoggerOptions = {}): GatewayLogger {
  // 30 s: an outage's warning is written about twice a minute, not once per request.
  const windowMs = options.repeatWindowMs ?? 30_000
  const now = options.now ?? Date.now
  const recent = new Map<string, Repeats>()

  /** A call's arguments as written: an error below error level loses its stack. */
  function shaped (args: unknown[], levelValue: number): unknown[] {
    const first = args[0]
    const err = typeof first === 'object' && first !== null ? (first as Record<string, unknown>).err : undefined
    if (levelValue >= ERROR || levelValue <= DEBUG || !(err instanceof Error)) return args
    const stackless = new StacklessError(err.name, err.message, (err as NodeJS.ErrnoException).code)
    return [{ ...(first as Record<string, unknown>), err: stackless }, ...args.slice(1)]
  }

  /** `args` with `repeated: count` in its fields (added in front when it has none). */
  function withRepeated (args: unknown[], count: number): unknown[] {
    const first = args[0]
    return typeof first === 'object' && first !== null ? [{ ...first, repeated: count }, ...args.slice(1)] : [{ repeated: count }, ...args]
  }

  /** The window of `message` ended: the last call left out is written, with the count. */
  function windowEnded (message: string, repeats: Repeats): void {
    if (recent.get(message) !== repeats || repeats.last === undefined) return
    recent.delete(message)
    const { logger, method, args, levelValue } = repeats.last
    method.apply(logger, withRepeated(shaped(args, levelValue), repeats.suppressed))
  }

  /** Every window not ended yet is ended now: its count written, if it has one. */
  function endAllWindows (): void {
    for (const [message, repeats] of recent) windowEnded(message, repeats)
    recent.clear()
  }

  const logger = pino({
    level,
    redact: { paths: REDACT_PATHS, censor: '[redacted]' },
    formatters: { level: label => ({ level: label }) },
    serializers: { err: serializeError },
    timestamp: stdTimeFunctions.isoTime,
    hooks: {
      logMethod (args, method, levelValue) {
        // Shaped only when written: a call left out (an outage's flood of them) costs no copy.
        let out: unknown[] = args
        if (levelValue >= WARN && levelValue <= ERROR) {
          const first = args[0] as unknown
          const message = `${levelValue} ${String(typeof first === 'object' && first !== null ? args[1] : first)}`
          const seen = recent.get(message)
          const at = now()
          if (seen !== undefined && at < seen.until) {
            if (seen.suppressed++ === 0) setTimeout(() => { windowEnded(message, seen) }, seen.until - at).unref()
            seen.last = { logger: this, method: method as (...args: unknown[]) => void, args, levelValue }
            return
          }
          // A window over but not written yet (its timer comes later): its count goes with
          // this line, so it is taken out before an overflow would write it too.
          if (seen !== undefined) {
            recent.delete(message)
            if (seen.suppressed > 0) out = withRepeated(out, seen.suppressed)
          }
          if (recent.size >= MAX_REMEMBERED) endAllWindows()
          recent.set(message, { until: at + windowMs, suppressed: 0 })
        }
        method.apply(this, shaped(out, levelValue) as Parameters<typeof method>)
      }
    }
  }, options.destination)
  return Object.assign(logger, { writeRepeats: endAllWindows })
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
