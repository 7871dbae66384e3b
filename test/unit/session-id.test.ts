// The gateway's session ids: their form, and the tag that binds them to the principal that created them.
import t from 'tap'
import { parseSessionId, SESSION_ID_MAX, SessionIdIssuer, UPSTREAM_SESSION_ID_MAX } from '../../src/protocol/session-id.js'

const VISIBLE_ASCII = /^[\x21-\x7e]+$/

t.test('an issued id: visible ASCII, fixed-length tag, the first upstream id at its end', async t => {
  const issuer = new SessionIdIssuer('k'.repeat(32))
  for (const upstream of ['a', '2f1c6f6e-7a3e-4d0b-9d7e-3f0b6f8e1a2b', 'x.y.z', '{odd}%', '~'.repeat(UPSTREAM_SESSION_ID_MAX)]) {
    const id = issuer.issue('alice', upstream)
    t.match(id, VISIBLE_ASCII, 'visible ASCII')
    t.ok(id.length <= SESSION_ID_MAX, 'within the longest id accepted')
    const parsed = parseSessionId(id)
    t.equal(parsed.kind, 'bound')
    if (parsed.kind !== 'bound') continue
    t.equal(parsed.firstUpstreamId, upstream, `parses back to ${upstream.slice(0, 20)}`)
    t.equal(parsed.tag.length, 22)
    t.ok(issuer.verify(parsed, 'alice'), 'the creator verifies')
    t.notOk(issuer.verify(parsed, 'mallory'), 'another principal does not')
  }
  t.equal(issuer.issue('alice', 'u'), issuer.issue('alice', 'u'), 'deterministic: any replica with the key checks it')
})

t.test('the tag binds principal, upstream id and key', async t => {
  const issuer = new SessionIdIssuer('k'.repeat(32))
  const id = issuer.issue('alice', 'up-1')
  const bound = (s: string): ReturnType<typeof parseSessionId> & { kind: 'bound' } => {
    const parsed = parseSessionId(s)
    if (parsed.kind !== 'bound') throw new Error(`not bound: ${s}`)
    return parsed
  }
  t.notOk(issuer.verify(bound(id.replace('up-1', 'up-2')), 'alice'), 'another upstream id under the same tag')
  t.notOk(new SessionIdIssuer('j'.repeat(32)).verify(bound(id), 'alice'), 'another key')
  t.notOk(new SessionIdIssuer(undefined).verify(bound(id), 'alice'), 'the built-in key is another key')
  t.ok(new SessionIdIssuer(undefined).verify(bound(new SessionIdIssuer(undefined).issue('alice', 'up-1')), 'alice'), 'the built-in key binds too')
  // Every other spelling of the tag, one character at a time: none verifies.
  const tagAt = 4
  let forged = 0
  for (let i = tagAt; i < tagAt + 22; i++) {
    for (const c of ['A', 'B', 'Q', 'g', 'w', '-', '_']) {
      if (id[i] === c) continue
      const altered = id.slice(0, i) + c + id.slice(i + 1)
      if (issuer.verify(bound(altered), 'alice')) forged++
    }
  }
  t.equal(forged, 0, 'no altered tag verifies (the last character\'s spare bits included)')
  t.notOk(issuer.verify(bound(id), 'alicf'), 'a principal one character off')
  t.notOk(issuer.verify(bound(issuer.issue('al', 'ice:up-1')), 'alice'), 'length-prefixed parts: no shifting between them')
})

t.test('anything else is unbound', async t => {
  for (const id of ['2f1c6f6e-7a3e-4d0b', 'mg1.', 'mg1.short.x', `mg1.${'a'.repeat(22)}`, `mg1.${'a'.repeat(22)}.`, `mg1.${'a'.repeat(21)}=.x`, `mg1.${'a'.repeat(22)}-x`, `MG1.${'a'.repeat(22)}.x`]) {
    t.equal(parseSessionId(id).kind, 'unbound', id)
  }
})

t.test('the same id for the same key, principal and upstream id, in every version: replicas of two versions check each other\'s ids', async t => {
  t.equal(new SessionIdIssuer('a deployment key').issue('alice', 'up-1'), 'mg1.g-1a3KKgN5AVhWCpgrybaA.up-1')
})
