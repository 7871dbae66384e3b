/**
 * Buffers for framed pages (page-frames.ts), lent to client connections and
 * given back once their write is done, so that the next page is framed into
 * memory that is still in the CPU's cache instead of a fresh allocation.
 * Framing into new buffers cost a flooded gateway its allocation, a copy into
 * memory not yet cached (about a tenth of the speed of a copy into a buffer
 * just written) and the garbage collections that the churn of large buffers
 * brings.
 *
 * Ownership: a page taken here belongs to the client connection that writes
 * it, and to its socket from the write on; it comes back (give()) only when the
 * socket is done with it: from the write's callback, which Node calls once
 * the bytes went to the kernel or were dropped with the connection, or at once
 * when the page was never written. A page given back early would be framed
 * over while the kernel still has to read it: give() refuses a page that is
 * not out on loan (given back twice, or never taken).
 */

/** Smaller pages come from Node's shared pool (Buffer.allocUnsafe), already cheap. */
export const PAGE_POOLED_MIN_BYTES = 32 * 1024
/** Larger pages (a rare replay page of big events) are allocated and left to the collector. */
export const PAGE_POOLED_MAX_BYTES = 4 * 1024 * 1024
/**
 * Bytes of pages kept free for reuse, all sizes together. A flood's pages
 * come back within a turn or two, so a few per size do; what passes this is
 * let go.
 */
export const PAGE_POOL_MAX_BYTES = 8 * 1024 * 1024

/** A page was given back that was not out on loan: the caller broke the ownership rule above. */
export class PageOwnershipError extends Error {
  constructor () {
    super('page buffer given back while not on loan (given back twice, or never taken from this pool)')
    this.name = 'PageOwnershipError'
  }
}

export class PageBuffers {
  /** Free buffers by capacity (powers of two), most recently given back last. */
  readonly #free = new Map<number, Buffer[]>()
  /** The pages out on loan: their memory, to the whole buffer it is. */
  readonly #lent = new WeakMap<object, Buffer>()
  #freeBytes = 0

  /** Bytes kept free for reuse. */
  get freeBytes (): number { return this.#freeBytes }

  /**
   * `size` bytes to frame a page into: a view over a pooled buffer (to be
   * given back, see the ownership rule) or, for sizes the pool does not
   * keep, a buffer of its own (give() takes it too, and lets it go).
   */
  readonly take = (size: number): Buffer => {
    if (size < PAGE_POOLED_MIN_BYTES || size > PAGE_POOLED_MAX_BYTES) return Buffer.allocUnsafe(size)
    let capacity = PAGE_POOLED_MIN_BYTES
    while (capacity < size) capacity *= 2
    let whole = this.#free.get(capacity)?.pop()
    if (whole !== undefined) this.#freeBytes -= capacity
    // Never from Node's shared pool: the whole buffer is the page's to lend.
    else whole = Buffer.allocUnsafeSlow(capacity)
    this.#lent.set(whole.buffer, whole)
    return whole.subarray(0, size)
  }

  /** Is `page` a view over a pooled buffer (one that comes back with give())? */
  pooled (page: Buffer): boolean {
    return this.#lent.has(page.buffer)
  }

  /** A page its socket is done with (see the ownership rule). */
  give (page: Buffer): void {
    if (page.length < PAGE_POOLED_MIN_BYTES || page.length > PAGE_POOLED_MAX_BYTES) return
    const whole = this.#lent.get(page.buffer)
    if (whole === undefined) throw new PageOwnershipError()
    this.#lent.delete(page.buffer)
    const capacity = whole.length
    if (this.#freeBytes + capacity > PAGE_POOL_MAX_BYTES) return
    let free = this.#free.get(capacity)
    if (free === undefined) this.#free.set(capacity, free = [])
    free.push(whole)
    this.#freeBytes += capacity
  }
}
