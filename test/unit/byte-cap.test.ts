// The memory store's byte cap (src/store/memory/byte-cap.ts): what it counts,
// and what it evicts in which order to get back under the cap.
import t, { type Test } from 'tap'
import { ByteCap } from '../../src/store/memory/byte-cap.js'
import { MemoryStream } from '../../src/store/memory/memory-stream.js'
import type { SegmentWeights } from '../../src/store/memory/segment.js'
import { type MemorySession, SessionTable } from '../../src/store/memory/session-table.js'
import { EventBatch } from '../../src/store/batch/event-batch.js'
import { NumberedBatch } from '../../src/store/batch/numbered-batch.js'

/** Event bytes alone: what a segment holds besides them is counted in segment.test.ts. */
const EVENT_BYTES_ONLY: SegmentWeights = { segment: 0, offset: 0, upstreamId: 0 }

const RETENTION = { maxEvents: 1000, maxBytes: 100_000, ttlMs: 60_000 }

function makeCap (t: Test, maxBytes: number, records = { session: 0, stream: 0 }): { cap: ByteCap, sessions: SessionTable } {
  const cap = new ByteCap(maxBytes, records)
  const sessions = new SessionTable({ retention: RETENTION, now: () => 0, sweepIntervalMs: 60_000, onDrop: s => cap.release(s) })
  t.teardown(() => sessions.close())
  return { cap, sessions }
}

function session (cap: ByteCap, sessions: SessionTable, id: string): MemorySession {
  const s = sessions.add(id, { epoch: 'e', principal: 'p', upstreamSessionId: id })
  cap.sessionAdded()
  return s
}

/** Append `count` events of 10 bytes to a stream of `s` (made on first use), as the store does. */
function append (cap: ByteCap, sessions: SessionTable, s: MemorySession, streamId: string, count: number): MemoryStream {
  let stream = s.streams.get(streamId)
  if (stream === undefined) {
    stream = new MemoryStream(streamId, EVENT_BYTES_ONLY)
    s.streams.set(streamId, stream)
    cap.streamAdded()
  }
  const batch = EventBatch.from(Array.from({ length: count }, () => ({ frame: Buffer.from('0123456789') })))
  cap.eventsAdded(stream.append(batch, new NumberedBatch(batch, stream.lastSeq + 1)))
  cap.appended(stream, s)
  cap.evict(stream, s, sessions)
  return stream
}

t.test('over the cap, the least recently appended streams are emptied first, never the current one', async t => {
  const { cap, sessions } = makeCap(t, 60)
  const A = session(cap, sessions, 'A')
  const B = session(cap, sessions, 'B')
  const a1 = append(cap, sessions, A, 'a1', 2)
  const b1 = append(cap, sessions, B, 'b1', 2)
  const a2 = append(cap, sessions, A, 'a2', 1)
  append(cap, sessions, A, 'a1', 1)
  t.equal(cap.heldBytes, 60)
  const b2 = append(cap, sessions, B, 'b2', 3)
  t.equal(b1.retained, 0, 'b1, appended to least recently, emptied')
  t.equal(a2.retained, 0, 'then a2')
  t.equal(a1.retained, 3, 'a1 fits: kept')
  t.equal(b2.retained, 3)
  t.equal(cap.heldBytes, 60)
  t.same(cap.evicted(), { stream: 2, events: 0, session: 0 })
  t.equal(B.streams.get('b1'), b1, 'an emptied stream that did not end stays in its session')
})

t.test('an ended stream goes from its session; the current stream is cut to its newest event', async t => {
  const { cap, sessions } = makeCap(t, 30, { session: 0, stream: 5 })
  const A = session(cap, sessions, 'A')
  const done = append(cap, sessions, A, 'done', 1)
  done.ended = true
  const big = append(cap, sessions, A, 'big', 4)
  t.equal(A.streams.has('done'), false, 'the ended stream went, record and all')
  t.equal(big.retained, 2, 'the current stream lost its oldest events until under the cap')
  t.equal(cap.heldBytes, 25)
  append(cap, sessions, A, 'big', 9)
  t.equal(big.retained, 2, 'as many of its newest as fit')
  t.same(cap.evicted(), { stream: 1, events: 11, session: 0 })
  const tiny = makeCap(t, 5)
  const T = session(tiny.cap, tiny.sessions, 'T')
  const only = append(tiny.cap, tiny.sessions, T, 'only', 3)
  t.equal(only.retained, 1, 'never its newest event, even over the cap')
  t.equal(tiny.cap.heldBytes, 10)
})

t.test('records alone over the cap: the least recently used sessions go, never the current one', async t => {
  const { cap, sessions } = makeCap(t, 20, { session: 10, stream: 0 })
  const A = session(cap, sessions, 'A')
  const B = session(cap, sessions, 'B')
  sessions.touch(A)
  const C = session(cap, sessions, 'C')
  cap.evict(undefined, C, sessions)
  t.same([...sessions].map(([id]) => id), ['A', 'C'], 'B, used least recently, went')
  t.equal(cap.evictedSessions, 1)
  t.equal(cap.heldBytes, 20)
  sessions.drop(A.id)
  t.equal(cap.heldBytes, 10, 'a dropped session releases its record')
  t.equal(B.streams.size, 0)
})

t.test('release gives back a session\'s events and records; clear forgets all but the counts', async t => {
  const { cap, sessions } = makeCap(t, 1000, { session: 7, stream: 3 })
  const A = session(cap, sessions, 'A')
  append(cap, sessions, A, 's', 2)
  append(cap, sessions, A, 't', 1)
  t.equal(cap.eventBytes, 30)
  t.equal(cap.heldBytes, 30 + 7 + 6)
  sessions.drop('A')
  t.equal(cap.heldBytes, 0)
  const B = session(cap, sessions, 'B')
  append(cap, sessions, B, 's', 1)
  cap.clear()
  t.equal(cap.heldBytes, 0)
  t.equal(cap.maxBytes, 1000)
})
