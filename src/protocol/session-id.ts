/**
 * The session ids the gateway issues to clients. The upstream's own id never
 * reaches a client: the gateway's id stays the same for the session's whole
 * life, whichever upstream session stands behind it now, and it carries a
 * keyed binding to the principal that created it:
 *
 *   mg1.<tag>.<upstream's first session id>
 *
 * The tag is the first 16 bytes of HMAC-SHA256(key, label, principal, first
 * upstream id), base64url (22 characters, fixed length: the id parses from
 * the left whatever the upstream's id holds). A request naming the session
 * must produce the same tag from its own principal, before the store is
 * asked: the binding holds with no record at all (after a flush or a
 * restart of the store), so only the creating principal can have a lost
 * session recorded again. The first upstream id inside lets the gateway
 * continue a session whose record the store lost.
 *
 * Transports spec: a session id is visible ASCII (0x21-0x7E); so are the
 * prefix, the tag and the upstream's id.
 */
import { createHmac, createSecretKey, timingSafeEqual, type KeyObject } from 'node:crypto'

const PREFIX = 'mg1.'
/** 128 bits of HMAC-SHA256, half its output (RFC 2104 keeps at least half): a forged binding takes 2^128 guesses. */
const TAG_BYTES = 16
/** base64url of TAG_BYTES bytes, without padding. */
const TAG_CHARS = 22
/** Domain separation: the key may serve other purposes, its tags never stand for these. */
const LABEL = 'mcpgw session binding v1'
/** Longest upstream session id recorded (the spec sets none; ids are meant to be short). */
export const UPSTREAM_SESSION_ID_MAX = 256
/** Longest session id a client may send: the gateway's own, around the longest upstream id. */
export const SESSION_ID_MAX = PREFIX.length + TAG_CHARS + 1 + UPSTREAM_SESSION_ID_MAX

/**
 * The key when SESSION_BINDING_KEY is unset. The binding of an issued id
 * still holds (a request's principal must produce its tag), but the key is
 * no secret: anyone can make an id of their own, bound to themselves, that
 * names another's upstream session, and test guesses of a low-entropy
 * credential offline against an id they hold. So an id under this key is
 * never taken for a session the store lost (SessionGuard), and a
 * deployment whose principals are not strong secrets sets its own key.
 */
export const BUILT_IN_BINDING_KEY = 'mcpgw built-in session binding key: set SESSION_BINDING_KEY'

/** What a client session id names. */
export type ParsedSessionId =
  /** Issued by the gateway: bound to a principal by its tag. */
  | { readonly kind: 'bound', readonly tag: string, readonly firstUpstreamId: string }
  /** Anything else (an upstream's id, from sessions recorded before the gateway issued its own): no binding of its own. */
  | { readonly kind: 'unbound' }

export function parseSessionId (sessionId: string): ParsedSessionId {
  if (!sessionId.startsWith(PREFIX) || sessionId.length < PREFIX.length + TAG_CHARS + 2) return { kind: 'unbound' }
  const tag = sessionId.slice(PREFIX.length, PREFIX.length + TAG_CHARS)
  if (sessionId[PREFIX.length + TAG_CHARS] !== '.' || !/^[\w-]+$/.test(tag)) return { kind: 'unbound' }
  return { kind: 'bound', tag, firstUpstreamId: sessionId.slice(PREFIX.length + TAG_CHARS + 1) }
}

/** Issues and checks the gateway's session ids under one key. */
export class SessionIdIssuer {
  /** Imported once: an HMAC made from a Buffer imports its key each time, four times the cost of the MAC (about 20 against 5 us). */
  readonly #key: KeyObject

  constructor (key: string | undefined) {
    this.#key = createSecretKey(Buffer.from(key ?? BUILT_IN_BINDING_KEY, 'utf8'))
  }

  /** The client's session id for an upstream session created by `principal`. */
  issue (principal: string, firstUpstreamId: string): string {
    return `${PREFIX}${this.#tag(principal, firstUpstreamId)}.${firstUpstreamId}`
  }

  /** Whether `principal` created the session a bound id names (constant time in the tag). */
  verify (parsed: ParsedSessionId & { kind: 'bound' }, principal: string): boolean {
    // Compared as text: base64url's last character has bits the bytes do not
    // hold, and an id is one spelling only (it is the store's key).
    const given = Buffer.from(parsed.tag, 'latin1')
    const expected = Buffer.from(this.#tag(principal, parsed.firstUpstreamId), 'latin1')
    return given.length === expected.length && timingSafeEqual(given, expected)
  }

  #tag (principal: string, firstUpstreamId: string): string {
    const mac = createHmac('sha256', this.#key)
    // Length-prefixed: no two (principal, id) pairs feed the same bytes.
    for (const part of [LABEL, principal, firstUpstreamId]) mac.update(`${Buffer.byteLength(part)}:${part}`)
    return mac.digest().subarray(0, TAG_BYTES).toString('base64url')
  }
}
