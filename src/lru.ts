import { LRUCache } from 'lru-cache'

/** What boundedLru returns: lru-cache's map, through its public API. */
export type BoundedLru<K extends {}, V extends {}> = LRUCache<K, V>

/**
 * A least-recently-used map of at most `maxEntries` entries whose storage
 * grows with what it holds. lru-cache's own `max` allocates its key and value
 * arrays for `max` entries up front: the gateway's bounds scale with
 * MAX_SESSIONS (four entries per session for some), so a large setting meant
 * arrays of hundreds of thousands of slots, mostly empty, that V8's collector
 * walks at every full collection, a cost paid per event under load. Bounded
 * by a count (`maxSize` with every entry weighing 1) instead, the arrays grow
 * as entries come and their slots are reused, up to the same bound, with the
 * same eviction: the least recently used go first. `ttl` keeps its meaning.
 * The price is paid only when full: about 40 bytes more an entry (untyped
 * link arrays, and a weight per entry; 92 bytes against 53 for the map's
 * own storage, keys and values aside).
 */
export function boundedLru<K extends {}, V extends {}> (maxEntries: number, options: { ttl?: number } = {}): BoundedLru<K, V> {
  return new LRUCache<K, V>({ maxSize: maxEntries, sizeCalculation: entryWeight, ...options })
}

const entryWeight = (): number => 1
