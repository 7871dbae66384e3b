/**
 * The event store contract. Every implementation (memory, Redis Streams) passes
 * the same contract suite in test/fixtures/store-contract.ts.
 *
 * A session owns streams: the standalone stream (the session's GET stream) and
 * one request stream per POST answered with SSE. Each stream numbers its events
 * with a contiguous sequence starting at 1, so a gap is visible from the
 * numbers alone. Every session carries an epoch that changes when the store
 * loses the session's history; event ids carry it (see protocol/event-id.ts).
 */
import type { LeaseBackend } from '../cluster/lease.js'
import type { EventBatch } from './batch/event-batch.js'
import type { NumberedBatch } from './batch/numbered-batch.js'
import type { EventInput, StoredEvent } from './events.js'
import type { SessionStateChange } from '../protocol/session-state.js'

export type { EventInput, FrameEvent, StoredEvent, TextEvent } from './events.js'

/** Where a session lives upstream. */
export interface UpstreamPlacement {
  /**
   * The id the upstream knows the session by now, used toward the upstream
   * only (it changes when the gateway establishes the session again). A
   * record written without one reads as the session's own id.
   */
  readonly upstreamSessionId: string
  /** Which upstream endpoint holds the session, opaque to the store; undefined: the one upstream. */
  readonly endpoint?: string
}

export interface SessionRecord extends UpstreamPlacement {
  readonly epoch: string
  /** Hash of the principal (auth header) that created the session. */
  readonly principal: string
}

/**
 * What it takes to establish a session upstream again: the client's
 * initialize, what its result promised, and the requests since that set
 * session state, compacted (the last log level; the resources subscribed).
 */
export interface SessionRecipe {
  /** The client's initialize request body (JSON text). */
  readonly initialize: string
  /** The result's protocolVersion and capabilities, canonical JSON (see protocol/initialize.ts). */
  readonly initializeResult: string
  /** The body of the last logging/setLevel request. */
  readonly logLevel?: string
  /** Resource URIs subscribed to, in the order of their first subscription. */
  readonly subscriptions: readonly string[]
  /** false: the subscriptions went past SUBSCRIPTIONS_MAX, or state was set in a batch: the session cannot be established again. */
  readonly complete: boolean
}

export type { SessionStateChange } from '../protocol/session-state.js'

/**
 * A recipe's bound on subscriptions: past it the recipe stops recording
 * them and is marked incomplete (a client subscribing without end must not
 * grow a record without end).
 */
export const SUBSCRIPTIONS_MAX = { count: 256, bytes: 64 * 1024 } as const

/**
 * The largest initialize request a recipe keeps: a session whose initialize
 * is larger gets none (it cannot be established again), so that no client
 * can make every session it opens hold MAX_BODY_BYTES. Real ones are 0.3-2 KiB.
 */
export const RECIPE_INITIALIZE_MAX_BYTES = 64 * 1024

export interface CreateSessionOptions {
  /** Default: the session's own id, on the one upstream. */
  readonly placement?: UpstreamPlacement
  /** The recipe's initialize and its result; without one the session cannot be established again. */
  readonly recipe?: { readonly initialize: string, readonly initializeResult: string }
}

export interface StreamState {
  readonly epoch: string
  /** Sequence number of the newest event, 0 when none was appended. */
  readonly lastSeq: number
  /** Sequence number of the oldest retained event (lastSeq + 1 when empty). */
  readonly firstSeq: number
  /** The upstream answer behind this stream is complete: no event follows. */
  readonly ended: boolean
}

export interface ReadResult {
  readonly events: StoredEvent[]
  /**
   * The same events packed (the layout of batch/packed-layout.ts), when the
   * store gives them so: a reader that writes them out reads these, without
   * an object per event. Views of what the store keeps: read, never changed.
   */
  readonly batches?: readonly NumberedBatch[]
  readonly state: StreamState
}

/**
 * A notification that a stream grew. `events`, when present, are exactly the
 * events `fromSeq..toSeq` (the appending replica saves its own subscribers a
 * read); otherwise the subscriber reads them from the store.
 */
export interface StreamNotice {
  readonly streamId: string
  readonly toSeq: number
  readonly events?: readonly StoredEvent[]
  /**
   * The same events packed, as the store took them (a local notice, see
   * BatchNotice): a listener that writes them out reads them from here, and
   * `events` is made from it only when asked for. Valid during the listener's
   * call only: once the append settles, its builder may fill the same bytes
   * with the next batch (EventBatch.release), and reading `batch` (or
   * `events`) from the notice then throws (NoticeSpentError). A listener that
   * keeps events past its call takes `events` during it: they keep the bytes
   * (their frames are views).
   */
  readonly batch?: NumberedBatch
  readonly ended: boolean
  /**
   * The session's epoch, when the store can change it under a live stream
   * (Redis, after it lost acknowledged writes): a follower whose client reads
   * another epoch closes it, so its resume is told of the gap.
   */
  readonly epoch?: string
}

export type NoticeListener = (notice: StreamNotice) => void

export interface AppendOptions {
  /** Mark the stream ended after these events (the upstream answer is complete). */
  readonly end?: boolean
  /**
   * Fencing token of the stream's lease (the standalone stream's upstream GET
   * is held under one). The append is refused with LeaseLostError when the
   * lease is held under another token. The embedded store (one process) ignores it.
   */
  readonly fence?: string
  /**
   * The upstream session the events were read from (the standalone stream's
   * upstream GET). Their last upstream event id is kept for a later holder
   * to resume that GET from only while the session's record still places it
   * in that upstream session: after a move to another (movePlacement), no
   * stream of the new upstream session issued it. The embedded store ignores
   * it (the id is kept with the lease, which a pump that moved away no longer
   * writes).
   */
  readonly readFrom?: string
}

/**
 * The standalone stream's lease, taken with a session recorded again
 * (adoptSession) for the replica whose upstream GET is still open: its
 * token, for how long.
 */
export interface LeaseHold {
  readonly token: string
  readonly ttlMs: number
}

/** How a session is recorded again (adoptSession). */
export interface AdoptOptions {
  /** Where it goes upstream (default: the session's own id). */
  readonly placement?: UpstreamPlacement
  /** The standalone stream's lease, taken with the record. */
  readonly hold?: LeaseHold
  /**
   * `confirmed`: the upstream is answering the session already (its
   * standalone GET, one of its answers being read). `pending`: a request on
   * its way to the upstream, whose answer settles it (settleAdoption).
   */
  readonly confirmation: 'confirmed' | 'pending'
}

/**
 * The upstream's word on a request that recorded a lost session again
 * (settleAdoption): `confirmed`, it answered with a 2xx; `refused`, it said it
 * does not know the session (a 404, or the SDK example servers' 400 that
 * names it); `unanswered`, no answer, or one that says nothing of the session
 * (a 5xx while it restarts, a 405 for a GET it does not serve, a 400 for a
 * garbled body).
 */
export type AdoptionVerdict = 'confirmed' | 'refused' | 'unanswered'

/**
 * What settleAdoption did with the record: `kept` it, `dropped` it (the
 * session as lost as before: its next request may record it again), or
 * `deleted` it (marked deleted, as deleteSession does).
 */
export type AdoptionSettlement = 'kept' | 'dropped' | 'deleted'

/** What adoptSession found or made. */
export interface Adoption {
  readonly record: SessionRecord
  /** This call recorded the session (false: the store had it already, from another adoption or creation). */
  readonly created: boolean
}

export interface EventStore {
  /** Human-readable name for logs: "memory" or "redis". */
  readonly kind: 'memory' | 'redis'

  /** Record a new session bound to `principal`; a fresh epoch is chosen. */
  createSession (sessionId: string, principal: string, options?: CreateSessionOptions): Promise<SessionRecord>
  /** The session's record, refreshing its time to live; null when unknown or lost. */
  getSession (sessionId: string): Promise<SessionRecord | null>
  /** Drop every record of the session. Resolves only once they are gone. */
  deleteSession (sessionId: string): Promise<void>
  /**
   * Whether deleteSession dropped the session within the retention TTL (and
   * it was not created again since): a session whose records are found gone
   * was deleted, not lost by the store, and must not be recorded again.
   * Written with the deletion itself, so every replica sees it.
   */
  sessionDeleted (sessionId: string): Promise<boolean>
  /**
   * Record the session unless the store has it already: returns the record it
   * has (whatever its principal), or a new one bound to `principal` with a
   * fresh epoch, at `options.placement`; null, recording nothing, when it
   * has none and was deleted (sessionDeleted), checked in the same step. For
   * sessions the store lost (see intactSince). An adopted session has no recipe. When the record is
   * `principal`'s, the adoption counts toward it, for every replica: a
   * pending one until settled (settleAdoption), a confirmed one for good.
   * `options.hold`: the lease of its standalone stream is taken with the
   * record, for the holder whose upstream GET is open, if free, in the same
   * step: taken after, it would be free for a moment to a replica watching
   * the session. A store whose leases live elsewhere (no leaseBackend)
   * ignores it.
   */
  adoptSession (sessionId: string, principal: string, options: AdoptOptions): Promise<Adoption | null>
  /**
   * The upstream's word on a pending adoption of the session in `epoch`:
   * `confirmed` confirms the record for good. Otherwise the record is dropped
   * once no adoption of that epoch, on any replica, was confirmed or still
   * waits for its answer: as deleteSession does (marked deleted) when any of
   * them was `refused`; when all went `unanswered`, without the mark, so the
   * session is as lost as it was and its next request may record it again.
   * A refusal counts for the epoch whichever settlement drops the record.
   * Nothing is done (`kept`) once the record is gone or in another epoch.
   */
  settleAdoption (sessionId: string, epoch: string, verdict: AdoptionVerdict): Promise<AdoptionSettlement>
  /**
   * Move the session to a new upstream placement, only if its upstream id is
   * still `expected` (compare and set: a replica that re-established the
   * session from a stale record cannot overwrite a newer one). Returns the
   * record as it is after the call (check its upstreamSessionId to see which
   * won); null when the session is unknown. A move to another upstream
   * session forgets the standalone stream's last upstream event id kept for
   * a later holder of its GET (see AppendOptions.readFrom); one that keeps
   * the upstream session id, naming only the endpoint holding it, keeps it.
   * (The embedded store keeps no such id: its process's leases do, and
   * forget it likewise, SessionHub.reopen.)
   */
  movePlacement (sessionId: string, expected: string, next: UpstreamPlacement): Promise<SessionRecord | null>
  /**
   * A short fence on one session, so that at most one replica at a time
   * establishes it upstream again: taken with a token for `ttlMs` unless
   * another holds it. True when taken.
   */
  acquireSessionFence (sessionId: string, token: string, ttlMs: number): Promise<boolean>
  /** Release the fence if it is still held under `token`. */
  releaseSessionFence (sessionId: string, token: string): Promise<void>
  /** The session's recipe; null when the session is unknown or was recorded without one. */
  recipe (sessionId: string): Promise<SessionRecipe | null>
  /** Keep a request that set session state in the recipe (compacted; see SUBSCRIPTIONS_MAX). No-op without a recipe. */
  recordSessionState (sessionId: string, change: SessionStateChange): Promise<void>
  /**
   * Since when (ms since the Unix epoch) this store holds everything it was
   * given: its own start (embedded store; 0 once its cap evicted a session,
   * see MemoryEventStore), or the moment it was first found without its
   * records (Redis restarted empty, or a new Redis). A session the store does
   * not know may have been lost only if it is older than this; one it dropped
   * under a bound (TTL, the embedded store's cap) was not lost.
   */
  intactSince (): Promise<number>

  /**
   * Create a stream's record (sequence 0, not ended) if it does not exist, and
   * return its state. A stream must be opened before its first id is handed
   * out, so that id can be resumed even before any event is appended.
   * Fails with SessionGoneError when the session is unknown.
   */
  openStream (sessionId: string, streamId: string): Promise<StreamState>

  /**
   * Append events to a stream in one atomic step (one round trip on Redis) and
   * return them numbered lastSeq+1, lastSeq+2, ... Events come as an array or
   * packed (EventBatch, see batch/event-batch.ts: the recorder's form). The stream is opened if
   * needed. Retention (count, bytes, TTL) is applied in the same step; the
   * newest event is never trimmed. Subscribers of the stream get a notice.
   * A packed batch stays the caller's: once the append has settled, the
   * caller may refill its buffers with the next events (the recorder does:
   * EventBatchBuilder.recycle()), unless the store called `batch.retain()`.
   * So a store that keeps the bytes, or any view of them, past its answer
   * (the embedded store keeps a big batch's buffer as it is; events whose
   * frames are views of it) calls retain() before answering; otherwise it
   * keeps copies. After a failed append the caller never refills them (a
   * connection may still hold them to resend).
   * The store contract suite refills the buffers after each append.
   * Fails with SessionGoneError when the session is unknown (expired or lost).
   */
  append (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options?: AppendOptions): Promise<StoredEvent[]>
  /** append(), answering with the batch as stored (no object per event: the recorder's form). */
  appendBatch (sessionId: string, streamId: string, events: readonly EventInput[] | EventBatch, options?: AppendOptions): Promise<NumberedBatch>
  /** Mark a stream ended without appending. */
  end (sessionId: string, streamId: string): Promise<void>

  /**
   * Up to `limit` retained events with seq > afterSeq, oldest first, and the
   * stream's state; null when the session or stream is unknown. Events trimmed
   * by retention are simply absent: the caller compares afterSeq + 1 with
   * state.firstSeq to see a gap. With `maxBytes`, the page also stops before
   * the event that would take its bytes (as retention counts them) past it,
   * but always holds the first event when there is one. A store that keeps
   * events in batches may end a page sooner, at the end of a batch, when its
   * events are of uneven sizes: a page short of the end is not the end.
   */
  read (sessionId: string, streamId: string, afterSeq: number, limit: number, maxBytes?: number): Promise<ReadResult | null>
  /** The stream's state, or null when the store has no record of it. */
  state (sessionId: string, streamId: string): Promise<StreamState | null>

  /** Where the last client connection of a stream stopped (for clients resuming without an id). */
  saveCursor (sessionId: string, streamId: string, seq: number): Promise<void>
  loadCursor (sessionId: string, streamId: string): Promise<number>

  /** Live notices for one stream. Returns the function that unsubscribes. */
  subscribe (sessionId: string, streamId: string, listener: NoticeListener): () => void

  /**
   * Where the leases on upstream GETs live, for a store whose sessions other
   * replicas share (Redis: next to the sessions, on the store's connections).
   * A store without one serves one process, whose leases stay local.
   */
  leaseBackend?: () => LeaseBackend

  /**
   * Room and evictions of a store that holds its events in this process under
   * a byte cap (the embedded store), read by metrics at each scrape.
   */
  usage?: () => StoreUsage

  /**
   * Connections to a store server closed and opened again since start
   * because they answered nothing (Redis: REDIS_SOCKET_TIMEOUT_MS), by what
   * waited unanswered; read by metrics at each scrape.
   */
  connectionsReplaced?: () => Readonly<Record<StalledWait, number>>

  /** The store answers (used by readiness). */
  ping (): Promise<void>
  close (): Promise<void>
}

export interface RetentionLimits {
  /** Events kept per stream; older ones are trimmed. */
  readonly maxEvents: number
  /** Bytes of event data kept per stream (the embedded store counts the memory that holds them); older events are trimmed. */
  readonly maxBytes: number
  /** Records of an idle session expire after this many milliseconds. */
  readonly ttlMs: number
}

/** The id of a session's standalone (GET) stream. Request streams use random ids. */
export const STANDALONE_STREAM = 's'

/** What a store in this process tells about its room. */
export interface StoreUsage {
  /** Bytes counted against the cap (event data plus records). */
  readonly heldBytes: number
  readonly maxBytes: number
  readonly sessions: number
  /** Since start, by EvictionKind. */
  readonly evicted: Readonly<Record<EvictionKind, number>>
}

/**
 * What a store's memory cap evicts: a stream emptied, events dropped from the
 * stream being appended to, a whole session.
 */
export const EVICTION_KINDS = ['stream', 'events', 'session'] as const
export type EvictionKind = typeof EVICTION_KINDS[number]

/**
 * What a store connection taken for dead waited for: the answer to a `PING`
 * (`ping`), or the end of its handshake once connected (`handshake`).
 */
export const STALLED_WAITS = ['ping', 'handshake'] as const
export type StalledWait = typeof STALLED_WAITS[number]
