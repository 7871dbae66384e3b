// The gap markers a recorder stores where events are missing (src/recording/gap-markers.ts).
import t from 'tap'
import { readFile } from 'node:fs/promises'
import { join } from 'node:path'
import { GAP_REASONS } from '../../src/gaps.js'
import { epochGap, eventTooLargeGap, storeUnavailableGap, upstreamHandoverGap } from '../../src/recording/gap-markers.js'
import type { TextEvent } from '../../src/store/contract.js'
import { GAP_EVENT } from '../../src/sse/frame.js'

const ROOT = join(import.meta.dirname, '..', '..')

t.test('each marker is a gap event saying why', async t => {
  const cases: Array<[TextEvent, unknown]> = [
    [storeUnavailableGap(3), { reason: 'store_unavailable', unrecorded: 3 }],
    [epochGap('s1'), { reason: 'epoch', streamId: 's1' }],
    [eventTooLargeGap(1024), { reason: 'event_too_large', limit: 1024 }],
    [upstreamHandoverGap('_'), { reason: 'upstream_handover', streamId: '_' }]
  ]
  for (const [marker, data] of cases) {
    t.equal(marker.event, GAP_EVENT)
    t.same(JSON.parse(marker.data), data)
  }
})

t.test('docs/resumption.md describes every gap reason, and no other', async t => {
  const doc = await readFile(join(ROOT, 'docs', 'resumption.md'), 'utf8')
  const list = doc.slice(doc.indexOf('can read it. Reasons:'), doc.indexOf('Each gap is logged'))
  const documented = [...list.matchAll(/^- `(\w+)`:/gm)].map(m => m[1])
  t.same(documented, [...GAP_REASONS], 'one item per reason, in the order of GAP_REASONS')
})
