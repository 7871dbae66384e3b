/**
 * Pure: which endpoint gets a new session, and which a request without one.
 *
 * A new session goes to the better of two endpoints drawn at random: the one
 * this replica placed fewer sessions on (ties: the first drawn). Unlike
 * "fewest sessions", replicas that each count only their own placements do
 * not all pick the same endpoint at the same moment, and one endpoint's count
 * lagging does not send it every new session (Mitzenmacher, "The Power of Two
 * Choices in Randomized Load Balancing", 2001).
 *
 * A request without a session (initialize probes, 2026-07-28-era requests,
 * other paths) is balanced round robin: it leaves nothing behind to count.
 */

export interface Placeable {
  readonly placed: number
}

/** The better of two random draws; undefined only for no candidates. `random` is in [0, 1). */
export function betterOfTwo<T extends Placeable> (candidates: readonly T[], random: () => number): T | undefined {
  const n = candidates.length
  if (n <= 1) return candidates[0]
  const i = Math.floor(random() * n)
  let j = Math.floor(random() * (n - 1))
  if (j >= i) j++
  const a = candidates[i] as T
  const b = candidates[j] as T
  return b.placed < a.placed ? b : a
}

/** Round robin over a list that may change between calls. */
export class RoundRobin {
  #next = 0

  pick<T> (candidates: readonly T[]): T | undefined {
    if (candidates.length === 0) return undefined
    const chosen = candidates[this.#next % candidates.length]
    this.#next = (this.#next + 1) % Number.MAX_SAFE_INTEGER
    return chosen
  }
}
