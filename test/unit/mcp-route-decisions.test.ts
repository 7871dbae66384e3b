import t from 'tap'
import fc from 'fast-check'
import type { FastifyRequest } from 'fastify'
import { replayPagesFor } from '../../src/routes/mcp/context.js'
import { sessionGone } from '../../src/routes/mcp/delete.js'
import { acceptsEventStream, isIdentityCoded, isUpstreamSessionId, offeredVersion, sessionIdOf } from '../../src/routes/mcp/request-headers.js'
import { SESSION_ID_MAX } from '../../src/protocol/session-id.js'
import { LOST_PHRASES, requestResumePosition, resumePoint } from '../../src/routes/mcp/resume-point.js'
import { orphanAnswer } from '../../src/routes/mcp/resume.js'
import type { StreamState } from '../../src/store/contract.js'

const record = { epoch: 'e1', principal: 'p', upstreamSessionId: 'u' }
const state = (over: Partial<StreamState> = {}): StreamState => ({ epoch: 'e1', firstSeq: 1, lastSeq: 10, ended: false, ...over })
const at = (seq: number, epoch = 'e1', streamId = 's') => ({ epoch, streamId, seq })

t.test('resumePoint: a position in the retained history resumes right after it', async (t) => {
  t.same(resumePoint(state(), at(4), record, 0), { after: 4 })
  t.same(resumePoint(state(), at(0), record, 0), { after: 0 }, 'from the start')
  t.same(resumePoint(state(), at(10), record, 0), { after: 10 }, 'at the end: nothing to replay, no gap')
  t.same(resumePoint(state({ firstSeq: 5 }), at(4), record, 0), { after: 4 }, 'the next event is the oldest retained')
})

t.test('resumePoint: each gap reason', async (t) => {
  t.same(resumePoint(state(), at(3, 'e0'), record, 0), { after: 0, gap: { reason: 'epoch' } }, 'an id of another epoch')
  t.same(resumePoint(state({ epoch: 'e2', firstSeq: 3 }), at(3, 'e2'), record, 0), { after: 2, gap: { reason: 'epoch' } },
    'the stream in an epoch the session record does not have')
  t.same(resumePoint(state(), at(11), record, 0), { after: 10, gap: { reason: 'future_id' } })
  t.same(resumePoint(state({ firstSeq: 6 }), at(2), record, 0), { after: 5, gap: { reason: 'trimmed', missingFrom: 3, missingTo: 5 } })
})

t.test('resumePoint: a standalone stream without a position starts at its cursor, within what is retained', async (t) => {
  t.same(resumePoint(state(), null, record, 7), { after: 7 })
  t.same(resumePoint(state({ firstSeq: 5 }), null, record, 2), { after: 4 }, 'a cursor in trimmed history: from the oldest retained')
  t.same(resumePoint(state(), null, record, 99), { after: 10 }, 'a cursor past the end: from the end')
  t.same(resumePoint(state({ firstSeq: 11, lastSeq: 10 }), null, record, 0), { after: 10 }, 'an empty stream')
})

t.test('resumePoint property: the replay never starts before the retained history nor after its end', async (t) => {
  fc.assert(fc.property(fc.nat(1000), fc.nat(1000), fc.nat(1200), fc.boolean(), (first, len, seq, standalone) => {
    const s = state({ firstSeq: first + 1, lastSeq: first + len })
    const start = resumePoint(s, standalone ? null : at(seq), record, seq)
    const inRange = start.after >= s.firstSeq - 1 && start.after <= s.lastSeq
    // No gap means the client misses nothing: it continues exactly where it stood.
    const exact = start.gap !== undefined || standalone || start.after === seq
    return inRange && exact
  }), { numRuns: 2000 })
  t.pass('in range, and without a gap the client continues where it stood')
})

t.test('requestResumePosition: past the end of a finished stream, the last event once more', async (t) => {
  t.same(requestResumePosition(state({ ended: true }), at(10)), at(9))
  t.same(requestResumePosition(state({ ended: false }), at(10)), at(10), 'a stream still recording is followed from there')
  t.same(requestResumePosition(state({ ended: true }), at(9)), at(9), 'before the end')
  t.same(requestResumePosition(state({ ended: true, lastSeq: 0, firstSeq: 1 }), at(0)), at(0), 'an empty stream')
  t.same(requestResumePosition(state({ ended: true }), at(10, 'e0')), at(10, 'e0'), 'another epoch: a gap, not a repeat')
  t.same(requestResumePosition(null, at(10)), at(10), 'no history')
})

t.test('every gap reason has a phrase for the lost response', async (t) => {
  for (const reason of ['epoch', 'unknown_stream'] as const) t.match(LOST_PHRASES[reason], /\w+ \w+/, reason)
})

t.test('orphanAnswer: the error answer of the request, else a gap marker', async (t) => {
  const answer = orphanAnswer('abcdefghn7')
  t.equal(answer.event, undefined)
  t.match(JSON.parse(answer.data), { jsonrpc: '2.0', id: 7, error: { code: -32000 } })
  const marker = orphanAnswer('abcdefgh')
  t.equal(marker.event, 'gateway-gap')
  t.same(JSON.parse(marker.data), { reason: 'recorder_lost', streamId: 'abcdefgh' })
})

const requestWith = (headers: Record<string, string | string[]>): FastifyRequest => ({ headers }) as unknown as FastifyRequest

t.test('sessionIdOf: one value of visible ASCII, else 400', async (t) => {
  t.equal(sessionIdOf(requestWith({})), undefined)
  t.equal(sessionIdOf(requestWith({ 'mcp-session-id': 'abc-123_!~' })), 'abc-123_!~')
  t.equal(sessionIdOf(requestWith({ 'mcp-session-id': 'x'.repeat(SESSION_ID_MAX) })), 'x'.repeat(SESSION_ID_MAX), 'up to the gateway\'s longest id')
  for (const bad of ['', 'a b', 'é', 'x'.repeat(SESSION_ID_MAX + 1), ['a', 'b']]) {
    t.throws(() => sessionIdOf(requestWith({ 'mcp-session-id': bad })), { name: 'GatewayError', statusCode: 400, code: 'MCPGW_BAD_SESSION_ID' }, JSON.stringify(bad))
  }
  t.ok(isUpstreamSessionId('x'.repeat(256)), 'an upstream id up to 256 characters')
  t.notOk(isUpstreamSessionId('x'.repeat(257)), 'longer: not recorded (the gateway\'s id around it would pass the bound)')
  t.notOk(isUpstreamSessionId('a\tb'))
})

t.test('acceptsEventStream', async (t) => {
  for (const ok of [undefined, 'text/event-stream', '*/*', 'text/*', 'application/json, text/event-stream']) t.ok(acceptsEventStream(ok), String(ok))
  for (const bad of ['application/json', 'text/html', '']) t.notOk(acceptsEventStream(bad), bad)
})

t.test('isIdentityCoded: a body as sent (no Content-Encoding, or identity alone), else 415', async (t) => {
  for (const value of [undefined, '', 'identity', 'IDENTITY', ' identity ', 'identity, identity', ['identity']]) t.ok(isIdentityCoded(value), JSON.stringify(value))
  for (const value of ['gzip', 'x-gzip', 'deflate', 'br', 'zstd', 'identity, gzip', 'gzip, identity', ['identity', 'gzip'], 'identityx']) t.notOk(isIdentityCoded(value), JSON.stringify(value))
})

t.test('offeredVersion: a plain token from an initialize body, else nothing', async (t) => {
  const body = (v: unknown): Buffer => Buffer.from(JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: v } }))
  t.equal(offeredVersion(body('2025-06-18')), '2025-06-18')
  t.equal(offeredVersion(undefined), undefined)
  t.equal(offeredVersion(Buffer.from('not json')), undefined)
  t.equal(offeredVersion(body(20250618)), undefined, 'not a string')
  t.equal(offeredVersion(body('2025 06 18')), undefined, 'not a token')
  t.equal(offeredVersion(body('x'.repeat(33))), undefined, 'too long')
})

t.test('sessionGone: a DELETE answered 2xx or 404 ends the session here too', async (t) => {
  for (const status of [200, 202, 204, 404]) t.ok(sessionGone(status), String(status))
  for (const status of [400, 401, 405, 500, 503]) t.notOk(sessionGone(status), String(status))
})

t.test('replayPagesFor: a page never exceeds what a client may have unsent', async (t) => {
  t.same(replayPagesFor(64 * 1024 * 1024), { pageSize: 10_000, pageBytes: 128 * 1024, pageMaxBytes: 4 * 1024 * 1024 })
  t.same(replayPagesFor(64 * 1024), { pageSize: 10_000, pageBytes: 64 * 1024, pageMaxBytes: 64 * 1024 })
})
