import type { EventInput } from '../store/contract.js'

/** The clients attached to a stream in this process, as the recorder sees them in degraded mode. */
export interface LiveClients {
  /**
   * Events the store refused, handed over so that a client attached to this
   * process still gets them live (without an id: they cannot be replayed).
   * Once the store answers again a gap marker is recorded first, so clients
   * resuming across the outage are told.
   */
  writeUnrecorded: (events: readonly EventInput[]) => void
  /**
   * Once the store answers again: events (afterSeq, throughSeq] were passed
   * on unrecorded, but the store holds them after all (it applied an append
   * whose reply was lost). A client here that got them without ids must not
   * get them again from the store.
   */
  storedAfterAll: (afterSeq: number, throughSeq: number) => void
}
