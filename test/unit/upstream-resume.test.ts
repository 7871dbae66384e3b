// Resuming an upstream answer that ended early (src/recording/upstream-resume.ts):
// the upstream's position across its answers, the wait before each resume,
// and when to stop asking.
import t from 'tap'
import { MAX_UPSTREAM_RETRY_MS, RESUME_BACKOFF_FIRST_MS, RESUME_BACKOFF_MAX_MS, UpstreamResumes } from '../../src/recording/upstream-resume.js'

const BOUNDS = { withoutProgress: 5, maxMs: 60_000 }

function clock (): { now: () => number, advance: (ms: number) => void } {
  let at = 1000
  return { now: () => at, advance: ms => { at += ms } }
}

t.test('the last id and retry hint carry over answers that give none', async t => {
  const resumes = new UpstreamResumes(BOUNDS, true, clock().now)
  t.equal(resumes.lastId, undefined)
  resumes.answerEnded('a-1', 300, true, 10)
  t.equal(resumes.lastId, 'a-1')
  t.equal(resumes.delayMs, 300, 'the upstream\'s hint, events having come')
  t.ok(resumes.progressed, 'events are progress')
  resumes.answerEnded(undefined, undefined, false, 10)
  t.equal(resumes.lastId, 'a-1', 'an answer without ids keeps the last one')
  t.equal(resumes.delayMs, 300, 'and the last hint')
  t.notOk(resumes.progressed, 'nothing new')
  resumes.answerEnded('a-2', undefined, false, 10)
  t.notOk(resumes.progressed, 'a new id on an empty priming event is no progress')
  resumes.answerEnded(undefined, 10 * MAX_UPSTREAM_RETRY_MS, true, 10)
  t.equal(resumes.delayMs, MAX_UPSTREAM_RETRY_MS, 'a very long hint is capped')
})

t.test('the wait: the upstream\'s retry as a floor, a backoff it cannot push under', async t => {
  const resumes = new UpstreamResumes({ withoutProgress: 100, maxMs: 1e9 }, true, clock().now)
  resumes.answerEnded('x', 0, false, 0)
  t.equal(resumes.delayMs, RESUME_BACKOFF_FIRST_MS, 'retry: 0 does not make it sooner than the first backoff')
  const waits = [resumes.delayMs]
  for (let i = 0; i < 12; i++) {
    resumes.answerEnded(`x${i}`, 0, false, 0)
    waits.push(resumes.delayMs)
  }
  t.same(waits.slice(0, 6), [100, 200, 400, 800, 1600, 3200], 'doubling while answers bring nothing')
  t.equal(waits.at(-1), RESUME_BACKOFF_MAX_MS, 'up to the longest backoff')
  resumes.answerEnded('y', 5000, true, 0)
  t.equal(resumes.delayMs, 5000, 'events start it again; a longer retry hint is waited for')
  resumes.answerEnded('z', undefined, false, 150)
  t.equal(resumes.delayMs, 5000, 'the hint counts from the answer\'s end')
  const quick = new UpstreamResumes(BOUNDS, true, clock().now)
  quick.answerEnded('x', undefined, false, 0)
  quick.answerEnded('x', undefined, false, 0)
  quick.answerEnded('x', undefined, false, 150)
  t.equal(quick.delayMs, 250, 'the backoff counts from the answer\'s start (400 ms, 150 of them held open)')
})

t.test('answers in a row without an event: stalled', async t => {
  const resumes = new UpstreamResumes(BOUNDS, true, clock().now)
  resumes.answerEnded('x', undefined, true, 10)
  t.equal(resumes.verdict(), 'resume')
  for (let i = 1; i < BOUNDS.withoutProgress; i++) {
    resumes.answerEnded(`x${i}`, 0, false, 10)
    t.equal(resumes.verdict(), 'resume', `${i} without an event (each with a new id)`)
    t.equal(resumes.withoutProgress, i)
  }
  resumes.answerEnded('x-last', 0, false, 10)
  t.equal(resumes.verdict(), 'stalled')
})

t.test('events start the count again; an answer held open long is no loop', async t => {
  const resumes = new UpstreamResumes(BOUNDS, true, clock().now)
  for (let i = 1; i < BOUNDS.withoutProgress; i++) {
    resumes.answerEnded(undefined, undefined, false, 10)
    t.equal(resumes.verdict(), 'resume')
  }
  resumes.answerEnded('y', undefined, true, 10)
  t.equal(resumes.verdict(), 'resume')
  t.equal(resumes.withoutProgress, 0)
  for (let i = 0; i < 3 * BOUNDS.withoutProgress; i++) resumes.answerEnded('y', undefined, false, RESUME_BACKOFF_MAX_MS)
  t.equal(resumes.withoutProgress, 0, 'answers held open the longest backoff are not counted')
  t.equal(resumes.verdict(), 'resume')
  t.equal(resumes.delayMs, 0, 'and resumed at once')
})

t.test('request streams: resumed for maxMs at most, events or not; the standalone stream has no deadline', async t => {
  const c = clock()
  const request = new UpstreamResumes(BOUNDS, true, c.now)
  const standalone = new UpstreamResumes(BOUNDS, false, c.now)
  for (const r of [request, standalone]) r.answerEnded('a', 1000, true, 10)
  c.advance(BOUNDS.maxMs - 2000)
  for (const r of [request, standalone]) r.answerEnded('b', 1000, true, 10)
  t.equal(request.verdict(), 'resume', 'within maxMs')
  c.advance(1500)
  for (const r of [request, standalone]) r.answerEnded('c', 1000, true, 10)
  t.equal(request.verdict(), 'expired', 'the next resume would come after maxMs')
  t.equal(standalone.verdict(), 'resume')
})

t.test('how long until a request stream\'s resumes run out, whatever its next answer does', async t => {
  const c = clock()
  const request = new UpstreamResumes(BOUNDS, true, c.now)
  const standalone = new UpstreamResumes(BOUNDS, false, c.now)
  t.equal(request.msUntilExpired, undefined, 'nothing before the first early end')
  for (const r of [request, standalone]) r.answerEnded('a', 0, true, 10)
  t.equal(standalone.msUntilExpired, undefined, 'the standalone stream has no deadline')
  c.advance(1000)
  const left = request.msUntilExpired as number
  t.equal(left, BOUNDS.maxMs - 1000 + 1, 'maxMs from the first early end, and a millisecond past it')
  // An answer held open until then, with events all along, ends: the verdict is expired.
  c.advance(left)
  request.answerEnded('b', 0, true, left)
  t.equal(request.delayMs, 0, 'even with nothing to wait before resuming')
  t.equal(request.verdict(), 'expired')
  t.equal(request.msUntilExpired, 1, 'past it: at once')
})

t.test('an id no header can carry is not resumable', async t => {
  const resumes = new UpstreamResumes(BOUNDS, true, clock().now)
  resumes.answerEnded('bad\nid', undefined, true, 10)
  t.equal(resumes.verdict(), 'unresumable_id')
})
