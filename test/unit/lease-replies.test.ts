// The lease scripts' replies as the Redis lease backend decodes them: every
// code a script's header documents means what the header says, the tables
// hold exactly the documented codes, and any other reply throws, naming the
// script and the code, rather than passing for one of them.
import t from 'tap'
import { readFileSync } from 'node:fs'
import {
  ACQUIRE_REPLIES, RELEASE_IF_IDLE_REPLIES, RELEASE_REPLIES, RENEW_REPLIES,
  toAcquireResult, toReleaseIfIdleResult, toReleaseResult, toRenewResult
} from '../../src/store/redis/lease-backend.js'

const DIR = new URL('../../src/store/redis/commands/', import.meta.url)

/** The codes a script's header comment documents, as matched by `pattern` (its first group). */
function documentedCodes (file: string, pattern: RegExp): string[] {
  const header = readFileSync(new URL(file, DIR), 'utf8').split('\n').filter(line => line.startsWith('--')).join(' ')
  return [...new Set([...header.matchAll(pattern)].map(m => m[1] as string))].sort()
}

const sorted = (table: object): string[] => Object.keys(table).sort()
const NOT_CODES: unknown[] = [-2, 4, 1.5, Number.NaN, '1', null, undefined]
/** The error a reply that is no code of `script` throws. */
const unknown = (script: string, reply: unknown): { message: string } =>
  ({ message: `lease: ${script} replied with an unknown code ${typeof reply === 'string' ? JSON.stringify(reply) : String(reply)}` })

t.test('lease-renew.lua: each documented code, and nothing else', async t => {
  t.same(sorted(RENEW_REPLIES), documentedCodes('lease-renew.lua', /(-?\d+) when/g), 'the table holds the codes the script documents')
  t.equal(toRenewResult(-1), 'gone', '-1: the session is unknown')
  t.equal(toRenewResult(0), 'lost', '0: another replica holds the lease')
  t.equal(toRenewResult(1), 'renewed', '1: renewed')
  t.equal(toRenewResult(2), 'renewed', '2: expired unclaimed, taken back')
  t.equal(toRenewResult(3), 'moved', '3: held, the record at another upstream session')
  for (const reply of NOT_CODES) {
    t.throws(() => toRenewResult(reply), unknown('lease-renew.lua', reply), `${String(reply)}: unknown, thrown`)
  }
})

t.test('lease-acquire-2.lua: each documented code, and nothing else', async t => {
  t.same(sorted(ACQUIRE_REPLIES), documentedCodes('lease-acquire-2.lua', /\{ (-?\d+)[ ,}]/g), 'the table holds the codes the script documents')
  t.equal(toAcquireResult([-1], 'tok'), 'gone', '{ -1 }: the session is unknown')
  t.same(toAcquireResult([0, 1234], 'tok'), { heldForMs: 1234 }, '{ 0, ms }: held elsewhere, for that long')
  t.same(toAcquireResult([0, -2], 'tok'), { heldForMs: 0 }, 'a lease that expired as it was read: held for no time')
  t.same(toAcquireResult([1, '1', 'u-7'], 'tok'), { token: 'tok', takeover: true, lastUpstreamId: 'u-7' }, '{ 1, \'1\', id }: taken over from a holder that did not end cleanly')
  t.same(toAcquireResult([1, '0', ''], 'tok'), { token: 'tok', takeover: false, lastUpstreamId: undefined }, '{ 1, \'0\', \'\' }: taken, no upstream id')
  for (const reply of NOT_CODES) {
    t.throws(() => toAcquireResult([reply as number], 'tok'), unknown('lease-acquire-2.lua', reply), `{ ${String(reply)} }: unknown, thrown`)
  }
})

t.test('lease-release-2.lua: each documented code, and nothing else', async t => {
  t.same(sorted(RELEASE_REPLIES), documentedCodes('lease-release-2.lua', /(-?\d+) when/g), 'the table holds the codes the script documents')
  t.equal(toReleaseResult(1), true, '1: released')
  t.equal(toReleaseResult(0), false, '0: not held under the token')
  for (const reply of [-1, 2, ...NOT_CODES]) {
    t.throws(() => toReleaseResult(reply), unknown('lease-release-2.lua', reply), `${String(reply)}: unknown, thrown`)
  }
})

t.test('lease-release-if-idle-3.lua: each documented code, a wait, and nothing else', async t => {
  t.same(sorted(RELEASE_IF_IDLE_REPLIES), documentedCodes('lease-release-if-idle-3.lua', /(-?\d+) when/g), 'the table holds the codes the script documents')
  t.same(toReleaseIfIdleResult(-1), { kind: 'lost' }, '-1: not held under the token')
  t.same(toReleaseIfIdleResult(0), { kind: 'released' }, '0: released')
  t.same(toReleaseIfIdleResult(1), { kind: 'attached', askAgainMs: 1 }, 'a positive integer: the milliseconds to wait')
  t.same(toReleaseIfIdleResult(1000), { kind: 'attached', askAgainMs: 1000 }, 'the attached marker without expiry: 1000 ms')
  // 4 is a wait here, not a code.
  for (const reply of NOT_CODES.filter(reply => reply !== 4)) {
    t.throws(() => toReleaseIfIdleResult(reply), unknown('lease-release-if-idle-3.lua', reply), `${String(reply)}: unknown, thrown`)
  }
})
