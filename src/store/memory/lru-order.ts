/**
 * Keys in least-recently-used order, oldest first: a Map, whose iteration
 * follows insertion order, where a use moves the key to the end. The memory
 * store keeps its streams in the order they were appended to and its
 * sessions in the order they were used, and its byte cap walks each from the
 * oldest end.
 *
 * Not lru-cache, because the cap is not a cache's bound:
 * - it counts more than these entries (session and stream records weigh on it
 *   too), so the store decides when to evict, not a maxSize;
 * - the stream being appended to is never evicted, but cut down to its newest
 *   event, and an evicted stream is emptied but stays in its session;
 * - a stream's weight also changes outside a set (its own retention trims it),
 *   and lru-cache measures weight only on set, refusing an entry heavier than
 *   maxSize altogether;
 * - a session expires exactly at its TTL by the store's clock, and only some
 *   calls refresh it; lru-cache's TTL expires after it, on a cached clock.
 * Used as a mere ordered map instead, lru-cache needs a bound and adds its
 * bookkeeping to every append.
 */
export class LruOrder<K, V> {
  readonly #entries = new Map<K, V>()

  get size (): number { return this.#entries.size }

  get (key: K): V | undefined {
    return this.#entries.get(key)
  }

  /** Add the key, or move it, to the most recently used end. */
  touch (key: K, value: V): void {
    this.#entries.delete(key)
    this.#entries.set(key, value)
  }

  delete (key: K): boolean {
    return this.#entries.delete(key)
  }

  clear (): void {
    this.#entries.clear()
  }

  /**
   * Oldest first. Keys may be deleted during the walk: a deleted key that was
   * not reached yet is not visited.
   */
  [Symbol.iterator] (): MapIterator<[K, V]> {
    return this.#entries.entries()
  }
}
