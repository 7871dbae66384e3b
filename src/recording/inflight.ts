/**
 * Upstream answers still being read and recorded. Shutdown waits for them
 * (within its grace period) so a tool result in flight is stored before exit.
 */
export class InFlight {
  readonly #pending = new Set<Promise<unknown>>()

  get size (): number { return this.#pending.size }

  track<T> (work: Promise<T>): Promise<T> {
    this.#pending.add(work)
    const forget = (): void => { this.#pending.delete(work) }
    work.then(forget, forget)
    return work
  }

  /** Resolves true when everything finished, false when `timeoutMs` ran out first. */
  async settle (timeoutMs: number): Promise<boolean> {
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<false>(resolve => { timer = setTimeout(() => resolve(false), timeoutMs) })
    try {
      while (this.#pending.size > 0) {
        const done = await Promise.race([Promise.allSettled([...this.#pending]).then(() => true as const), timeout])
        if (!done) return false
      }
      return true
    } finally {
      clearTimeout(timer)
    }
  }
}
