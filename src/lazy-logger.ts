import type { FastifyBaseLogger } from 'fastify'
import type { Bindings, ChildLoggerOptions, LogFn } from 'pino'

/** pino's levels that write lines, most severe first. */
const LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace'] as const
type Level = typeof LEVELS[number]
/** What LOG_LEVEL may be: a level, or silent. */
export const LOG_LEVELS = [...LEVELS, 'silent'] as const

/** What a parent may tell about its level without logging (pino's loggers and LazyChildLogger can). */
interface LevelAware { isLevelEnabled?: (level: string) => boolean }

/**
 * A child logger that becomes one (the parent's `child()`) only when it
 * first writes a line. Every request and every client stream has a child
 * logger with its bindings (request id, session hash, stream id), and most
 * never write a line; a pino child is an object whose prototype is its
 * parent, so each one costs a hidden class of its own on top of the object:
 * about 1 KB per idle stream, measured with bench/idle-census.mjs. This one
 * is one small object holding the parent and the bindings until then.
 * A line at a disabled level makes nothing.
 */
export class LazyChildLogger implements FastifyBaseLogger {
  readonly #parent: FastifyBaseLogger
  readonly #bindings: Bindings
  readonly #options: ChildLoggerOptions | undefined
  #logger: FastifyBaseLogger | undefined

  declare fatal: LogFn
  declare error: LogFn
  declare warn: LogFn
  declare info: LogFn
  declare debug: LogFn
  declare trace: LogFn
  declare silent: LogFn

  constructor (parent: FastifyBaseLogger, bindings: Bindings, options?: ChildLoggerOptions) {
    this.#parent = parent
    this.#bindings = bindings
    this.#options = options
  }

  /** Fastify's `childLoggerFactory`: request loggers are lazy too. */
  static factory (this: unknown, logger: FastifyBaseLogger, bindings: Bindings, options: ChildLoggerOptions): FastifyBaseLogger {
    return new LazyChildLogger(logger, bindings, Object.keys(options).length === 0 ? undefined : options)
  }

  /** Has the real child been made (something was logged, or the level was set)? */
  get materialized (): boolean { return this.#logger !== undefined }

  get level (): string { return this.#logger?.level ?? this.#options?.level ?? this.#parent.level }
  set level (level: string) { this.#real().level = level }

  isLevelEnabled (level: string): boolean {
    // A level of its own (a route's) is the real child's to judge.
    const logger = (this.#logger ?? (this.#options?.level === undefined ? this.#parent : this.#real())) as LevelAware
    return logger.isLevelEnabled?.(level) ?? true
  }

  child (bindings: Bindings, options?: ChildLoggerOptions): FastifyBaseLogger {
    return new LazyChildLogger(this, bindings, options)
  }

  #real (): FastifyBaseLogger {
    if (this.#logger === undefined) {
      // A lazy parent's child() would be lazy again: its real logger makes the real child.
      const parent = this.#parent instanceof LazyChildLogger ? this.#parent.#real() : this.#parent
      this.#logger = parent.child(this.#bindings, this.#options)
    }
    return this.#logger
  }

  /** Used by the level methods. */
  logAt (level: Level, args: unknown[]): void {
    if (this.#logger === undefined && !this.isLevelEnabled(level)) return
    (this.#real()[level] as (...a: unknown[]) => void)(...args)
  }
}

for (const level of LEVELS) {
  Object.defineProperty(LazyChildLogger.prototype, level, {
    value: function (this: LazyChildLogger, ...args: unknown[]): void { this.logAt(level, args) },
    writable: true,
    configurable: true
  })
}
Object.defineProperty(LazyChildLogger.prototype, 'silent', { value: () => {}, writable: true, configurable: true })
