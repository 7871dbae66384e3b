/**
 * The steps every resume shares: telling the client of a gap, the first page
 * of history read ahead of the follower, and the replay's metrics.
 */
import type { FastifyBaseLogger as Logger } from 'fastify'
import { errors } from '../../errors.js'
import type { EventPosition } from '../../protocol/event-id.js'
import { nextPageBytes, writePage } from '../../sessions/follower.js'
import type { ClientStream } from '../../sse/client-stream.js'
import type { ReadResult } from '../../store/contract.js'
import type { McpContext, ReplayPages } from './context.js'
import { gapNotice, type StartPoint } from './resume-point.js'

/** Header carrying the gap reason when a resume cannot be served in full. */
export const GAP_HEADER = 'x-mcp-gateway-gap'

/**
 * A resume of (session, stream) begins replaying: its release (call it once
 * caught up, or gone), or 429 when MAX_REPLAYS_PER_STREAM run already.
 */
export function enterReplay (ctx: McpContext, sessionId: string, streamId: string): () => void {
  const release = ctx.replays.enter(sessionId, streamId)
  if (release !== undefined) return release
  ctx.deps.metrics.resumes.inc({ outcome: 'refused' })
  throw errors.tooManyReplays()
}

/** Open the client's stream at `start`, with the gap header and notice when history cannot fill it. */
export function openWithGap (ctx: McpContext, client: ClientStream, log: Logger, position: EventPosition | null, start: StartPoint): void {
  if (position !== null) ctx.deps.metrics.resumes.inc({ outcome: start.gap === undefined ? 'replayed' : 'gap' })
  if (start.gap !== undefined) {
    ctx.deps.metrics.countGap(start.gap.reason)
    log.warn({ gap: start.gap }, 'gap: history cannot fill this resume; the client is told')
    client.open({ [GAP_HEADER]: start.gap.reason }, start.after, gapNotice(start.gap, client.streamId))
  } else {
    client.open({}, start.after)
  }
}

/**
 * A resume's first page of history, read while the route still asks the
 * store about the stream; null when the read failed (the follower then reads
 * it, and fails or not, as it would have).
 */
export async function readFirstPage (ctx: McpContext, sessionId: string, streamId: string, afterSeq: number): Promise<ReadResult | null> {
  const { pageSize, pageBytes } = ctx.replayPages
  try {
    return await ctx.deps.metrics.timeStore('read', () => ctx.deps.store.read(sessionId, streamId, afterSeq, pageSize, pageBytes))
  } catch {
    return null
  }
}

/**
 * Write the first page when it continues exactly where the client stands
 * (same epoch, no event missing in between); otherwise leave it all to the
 * follower. It was read before the follower subscribed, so the follower
 * still reads from the client's new position after subscribing: whatever
 * was appended in between is found there, as on any resume. The follower
 * reads its first page while this one goes out, and writes it once this one
 * has. Returns the follower's pages: after a page short of the end, the next
 * size up, as if the follower had read it.
 */
export function writeFirstPage (pages: ReplayPages, client: ClientStream, page: ReadResult | null): ReplayPages {
  if (page === null || page.state.epoch !== client.epoch || firstSeqOf(page) !== client.lastSeq + 1) return pages
  writePage(client, page, true)
  if (client.lastSeq >= page.state.lastSeq) return pages
  return { ...pages, pageBytes: nextPageBytes(pages.pageBytes, pages.pageMaxBytes) }
}

/** Sequence number of a page's first event (undefined when it has none). */
function firstSeqOf (page: ReadResult): number | undefined {
  if (page.batches === undefined) return page.events[0]?.seq
  const first = page.batches.find(batch => batch.length > 0)
  return first?.firstSeq
}

/**
 * A resume's replay, when the store had the stream's history (resumes
 * answered 204 or with only a gap are not observed): the events written from
 * history, and the time from its first store request until the follower
 * caught up (or the stream ended, or the client left).
 */
export function observeReplay (ctx: McpContext, client: ClientStream, startedAt: number): void {
  ctx.deps.metrics.replayEvents.observe(client.replayed)
  ctx.deps.metrics.replayDuration.observe((performance.now() - startedAt) / 1000)
}
