// Resuming an upstream answer that ended early (src/relay/upstream-resume.ts):
// the upstream's position across its answers, and when to stop asking.
import t from 'tap'
import { UpstreamResumes } from '../../src/relay/upstream-resume.js'
import { DEFAULT_UPSTREAM_RETRY_MS, MAX_UPSTREAM_RETRY_MS, UPSTREAM_RESUMES_WITHOUT_PROGRESS } from '../../src/protocol/upstream-event-id.js'

t.test('the last id and retry hint carry over answers that give none', async t => {
  const resumes = new UpstreamResumes()
  t.equal(resumes.lastId, undefined)
  t.equal(resumes.delayMs, DEFAULT_UPSTREAM_RETRY_MS, 'no hint: the default wait')
  resumes.answerEnded('a-1', 300, false)
  t.equal(resumes.lastId, 'a-1')
  t.equal(resumes.delayMs, 300)
  t.ok(resumes.progressed, 'a new id is progress')
  resumes.answerEnded(undefined, undefined, false)
  t.equal(resumes.lastId, 'a-1', 'an answer without ids keeps the last one')
  t.equal(resumes.delayMs, 300, 'and the last hint')
  t.notOk(resumes.progressed, 'nothing new')
  resumes.answerEnded(undefined, 60_000, true)
  t.ok(resumes.progressed, 'events recorded are progress, without a new id')
  t.equal(resumes.delayMs, MAX_UPSTREAM_RETRY_MS, 'a long hint is capped')
})

t.test('resumed again and again without anything new: stalled', async t => {
  const resumes = new UpstreamResumes()
  resumes.answerEnded('x', undefined, true)
  t.equal(resumes.verdict(), 'resume')
  for (let i = 1; i < UPSTREAM_RESUMES_WITHOUT_PROGRESS; i++) {
    resumes.answerEnded('x', undefined, false)
    t.equal(resumes.verdict(), 'resume', `${i} without progress`)
    t.equal(resumes.withoutProgress, i)
  }
  resumes.answerEnded('x', undefined, false)
  t.equal(resumes.verdict(), 'stalled')
})

t.test('progress starts the count again', async t => {
  const resumes = new UpstreamResumes()
  for (let i = 1; i < UPSTREAM_RESUMES_WITHOUT_PROGRESS; i++) {
    resumes.answerEnded(undefined, undefined, false)
    t.equal(resumes.verdict(), 'resume')
  }
  resumes.answerEnded('y', undefined, false)
  t.equal(resumes.verdict(), 'resume')
  t.equal(resumes.withoutProgress, 0)
})

t.test('an id no header can carry is not resumable', async t => {
  const resumes = new UpstreamResumes()
  resumes.answerEnded('bad\nid', undefined, true)
  t.equal(resumes.verdict(), 'unresumable_id')
  t.equal(resumes.withoutProgress, 0, 'not counted as a resume')
})
