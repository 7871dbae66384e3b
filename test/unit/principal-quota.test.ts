// MAX_SESSIONS_PER_PRINCIPAL's accounting (src/sessions/principal-quota.ts):
// a new stream past its principal's share is refused, a stream taken over
// from another replica is counted and never refused, places come back once.
import t from 'tap'
import { GatewayError } from '../../src/errors.js'
import { PrincipalQuota } from '../../src/sessions/principal-quota.js'

/** Sessions a1..a9 are alice's, b1.. bob's; `lost` is unknown; `broken` fails to be read. */
function quota (max: number): PrincipalQuota {
  return new PrincipalQuota({
    maxPerPrincipal: max,
    principalOf: async sessionId => {
      if (sessionId === 'broken') throw new Error('store unavailable')
      if (sessionId === 'lost') return undefined
      return sessionId.startsWith('a') ? 'alice' : 'bob'
    }
  })
}

async function refusal (promise: Promise<void>): Promise<string | undefined> {
  try {
    await promise
    return undefined
  } catch (err) {
    return err instanceof GatewayError ? `${err.statusCode} ${err.code}` : String(err)
  }
}

t.test('a new stream past its principal\'s share is refused with 429, for that principal only', async t => {
  const q = quota(2)
  await q.admit('a1')
  await q.admit('a2')
  t.equal(await refusal(q.admit('a3')), '429 MCPGW_TOO_MANY_PRINCIPAL_SESSIONS')
  t.equal(q.held('alice'), 2)
  await q.admit('b1')
  t.equal(q.held('bob'), 1, 'another principal is not affected')
  await q.admit('a1')
  t.equal(q.held('alice'), 2, 'admitting a session that holds its place already counts it once')
})

t.test('a stream taken over is counted and never refused; new ones wait until the principal is back under', async t => {
  const q = quota(2)
  await q.admit('a1')
  await q.admit('a2', 'takeover')
  await q.admit('a3', 'takeover')
  await q.admit('a4', 'takeover')
  t.equal(q.held('alice'), 4, 'over the share after a failover')
  t.equal(await refusal(q.admit('a5')), '429 MCPGW_TOO_MANY_PRINCIPAL_SESSIONS', 'a new stream is refused')
  q.release('a2')
  q.release('a3')
  t.equal(await refusal(q.admit('a5')), '429 MCPGW_TOO_MANY_PRINCIPAL_SESSIONS', 'still at its share')
  q.release('a4')
  await q.admit('a5')
  t.equal(q.held('alice'), 2, 'back under: a new stream is admitted')
})

t.test('a place comes back once; sessions whose principal is unknown or unreadable hold none', async t => {
  const q = quota(1)
  await q.admit('a1')
  q.release('a1')
  q.release('a1')
  t.equal(q.held('alice'), 0, 'released twice, freed once')
  await q.admit('a2')
  t.equal(await refusal(q.admit('a3')), '429 MCPGW_TOO_MANY_PRINCIPAL_SESSIONS', 'the second release did not free another place')
  q.release('never-admitted')
  t.equal(q.held('alice'), 1, 'releasing a session that holds no place changes nothing')
  await q.admit('lost')
  await q.admit('broken')
  t.equal(q.held('alice') + q.held('bob'), 1, 'unknown and unreadable sessions are let through uncounted (MAX_SESSIONS still bounds them)')
})
