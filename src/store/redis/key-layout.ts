/**
 * Where the Redis store keeps a session: every key of a session under the
 * hash tag `{<session>}` (so one script touches one slot: Redis Cluster
 * compatible), after the configured prefix. The full layout, field by field,
 * is in docs/redis.md; in short:
 *
 *   <tag>:m              session hash: epoch, principal, and per stream q: (lastSeq),
 *                        f: (firstSeq), b: (bytes), e: (ended), c: (cursor),
 *                        u: (upstream's last id), h: (held under a lease), w: (recorder);
 *                        the session's upstream placement and recipe (RECORD_FIELDS);
 *                        after a store loss rp (adoptions pending), rc (one confirmed),
 *                        rd (one refused)
 *   <tag>:b:<stream>     the stream: one entry per appended batch, id <first seq>-<count>,
 *                        fields s (size), l (layout), b (bytes)
 *   <tag>:z:<stream>     its ledger: "<entry id> <size>" per entry, oldest first
 *   <tag>:n              the session's notice channel (PUBLISH)
 *   <tag>:lease          the token of the replica holding the upstream GET
 *   <tag>:att            a client is attached on a replica without the lease
 *   <tag>:del            the session was deleted (for RETENTION_TTL_SECONDS after)
 *   <tag>:aud            the replicas subscribed to the channel
 *   <tag>:aside          a stream put aside within one append transaction
 *   <tag>:re             the token of the replica establishing the session upstream again
 *   <prefix>intact       when the store was first found without this key
 *   <prefix>r:<id>:alive a replica's liveness
 *
 * The names, fields and one-letter field names are a stored format: a
 * running Redis keeps them across upgrades, so they do not change.
 */
/**
 * The session hash's fields for where the session lives upstream and how to
 * establish it again (see SessionRecord, SessionRecipe); the Lua scripts
 * spell them too. A record without `up` is on the upstream under its own id.
 */
export const RECORD_FIELDS = Object.freeze({
  upstreamSessionId: 'up',
  endpoint: 'ep',
  initialize: 'ri',
  initializeResult: 'rr',
  logLevel: 'rl',
  /** JSON array of resource URIs. */
  subscriptions: 'rs',
  /** Present: the subscriptions went past their bound. */
  incomplete: 'rx'
})

export class KeyLayout {
  readonly #prefix: string

  constructor (prefix: string) {
    if (prefix.includes('{') || prefix.includes('}')) {
      throw new TypeError('RedisEventStore: keyPrefix must not contain "{" or "}" (the hash tag is the session id)')
    }
    this.#prefix = prefix
  }

  /** The keys of one session (and checks the ids). */
  session (sessionId: string, streamId?: string): SessionKeys {
    if (typeof sessionId !== 'string' || sessionId.length === 0) throw new TypeError('session id must be a non-empty string')
    if (streamId !== undefined && (typeof streamId !== 'string' || streamId.length === 0)) {
      throw new TypeError('stream id must be a non-empty string')
    }
    return new SessionKeys(`${this.#prefix}{${escapeTag(sessionId)}}`)
  }

  /** No hash tag or TTL: Redis restarted empty (or a new Redis) has none. */
  get intact (): string { return `${this.#prefix}intact` }

  /** A replica's liveness key (not a session's: no hash tag). */
  alive (replicaId: string): string { return `${this.#prefix}r:${replicaId}:alive` }
}

/**
 * The keys of one session. Names are made when asked for: a call uses a few
 * of them, and a listener keeps only its channel's name, not these.
 */
export class SessionKeys {
  readonly #tag: string
  constructor (tag: string) { this.#tag = tag }
  get meta (): string { return `${this.#tag}:m` }
  get channel (): string { return `${this.#tag}:n` }
  get lease (): string { return `${this.#tag}:lease` }
  get attached (): string { return `${this.#tag}:att` }
  get deleted (): string { return `${this.#tag}:del` }
  get audience (): string { return `${this.#tag}:aud` }
  get fence (): string { return `${this.#tag}:re` }
  stream (streamId: string): string { return `${this.#tag}:b:${streamId}` }
  ledger (streamId: string): string { return `${this.#tag}:z:${streamId}` }
  /** Where append-split-6 puts a stream aside, only within its transaction. */
  get aside (): string { return `${this.#tag}:aside` }
}

/**
 * Session ids come from the upstream (visible ASCII). Braces would move the
 * hash tag, so they are percent-escaped (with `%` itself, to stay reversible).
 */
function escapeTag (sessionId: string): string {
  return sessionId.replace(/[%{}]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`)
}
