import { IDLE_LOST, IDLE_RELEASED, type AcquireResult, type ControlKind, type ControlListener, type ControlSubscription, type IdleRelease, type LeaseBackend, type TickRequest, type TickResult } from './lease.js'

interface LocalLease {
  holder: string | undefined
  live: boolean
  upstreamId: string | undefined
}

/**
 * Sessions remembered by the local backend (the least recently used are
 * forgotten first, never one held): ten times MAX_SESSIONS' default.
 */
const LOCAL_SESSIONS = 100_000

/**
 * One process, the embedded store: the lease is always this process's, so it
 * never expires, is never taken over and fencing has nothing to guard. It
 * still remembers whether the last upstream GET ended cleanly and the
 * upstream's last id, so a reopen behaves as across replicas.
 */
export class LocalLeaseBackend implements LeaseBackend {
  readonly replicaId = 'local'
  readonly shared = false
  readonly #sessions = new Map<string, LocalLease>()
  readonly #listeners = new Map<string, Set<ControlListener>>()

  async acquire (sessionId: string, token: string): Promise<AcquireResult> {
    return this.#acquire(sessionId, token)
  }

  async tick (request: TickRequest): Promise<TickResult> {
    return {
      renew: request.renew.map(({ sessionId, token }) => this.#sessions.get(sessionId)?.holder === token ? 'renewed' : 'lost'),
      watch: request.watch.map(({ sessionId, token }) => this.#acquire(sessionId, token)),
      recordersAlive: (request.recorders ?? []).map(() => true)
    }
  }

  // One process: a recorder cannot die while this process lives, so no stream is ever orphaned.
  async claimRequestStream (): Promise<void> {}
  async requestStreamRecorder (): Promise<string | undefined> { return undefined }
  async endOrphanedRequestStream (): Promise<boolean> { return false }
  async markAlive (): Promise<void> {}
  async retire (): Promise<void> {}

  async release (sessionId: string, token: string, live: boolean): Promise<boolean> {
    const lease = this.#sessions.get(sessionId)
    if (lease?.holder !== token) return false
    lease.holder = undefined
    lease.live = live
    this.#emit(sessionId, 'released')
    return true
  }

  async releaseIfIdle (sessionId: string, token: string): Promise<IdleRelease> {
    return await this.release(sessionId, token, false) ? IDLE_RELEASED : IDLE_LOST
  }

  async markAttached (): Promise<void> {}

  noteUpstreamId (sessionId: string, id: string): void {
    this.#entry(sessionId).upstreamId = id === '' ? undefined : id
  }

  forget (sessionId: string): void {
    this.#sessions.delete(sessionId)
  }

  subscribeControl (sessionId: string, listener: ControlListener): ControlSubscription {
    let set = this.#listeners.get(sessionId)
    if (set === undefined) {
      set = new Set()
      this.#listeners.set(sessionId, set)
    }
    set.add(listener)
    return {
      ready: Promise.resolve(),
      off: () => {
        set.delete(listener)
        if (set.size === 0 && this.#listeners.get(sessionId) === set) this.#listeners.delete(sessionId)
      }
    }
  }

  async publish (sessionId: string, kind: ControlKind): Promise<void> {
    this.#emit(sessionId, kind)
  }

  #acquire (sessionId: string, token: string): AcquireResult {
    const lease = this.#entry(sessionId)
    if (lease.holder !== undefined) return { heldForMs: Number.MAX_SAFE_INTEGER }
    lease.holder = token
    const takeover = lease.live
    lease.live = true
    return { token, takeover, lastUpstreamId: lease.upstreamId }
  }

  #entry (sessionId: string): LocalLease {
    let lease = this.#sessions.get(sessionId)
    if (lease === undefined) {
      lease = { holder: undefined, live: false, upstreamId: undefined }
      if (this.#sessions.size >= LOCAL_SESSIONS) {
        for (const [id, old] of this.#sessions) {
          if (old.holder === undefined) {
            this.#sessions.delete(id)
            break
          }
        }
      }
    } else {
      this.#sessions.delete(sessionId)
    }
    this.#sessions.set(sessionId, lease)
    return lease
  }

  /** Local messages come from this process: the coordinator ignores its own, as over Redis. */
  #emit (sessionId: string, kind: ControlKind): void {
    for (const listener of [...this.#listeners.get(sessionId) ?? []]) listener({ kind, origin: this.replicaId })
  }
}
