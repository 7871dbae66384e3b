import { createHash } from 'node:crypto'
import type { IncomingHttpHeaders } from 'node:http'
import type { GatewayError } from '../errors.js'
import { headerValue } from '../upstream/headers.js'

/**
 * Who a request acts for, as the session binding sees it: a short hash that
 * is stored with the session and compared on every later request. Either the
 * identity, or the error the request gets when it needs one (a token that
 * failed verification never stands for anyone).
 */
export type Identity =
  | { readonly principal: string, readonly error?: undefined }
  | { readonly principal?: undefined, readonly error: GatewayError }

/** Turns a request's headers into the principal its session is bound to. */
export interface PrincipalResolver {
  /** How this resolver identifies callers, for logs and docs: 'header' or 'jwt'. */
  readonly kind: Exclude<PrincipalKind, 'anonymous'>
  identify (headers: IncomingHttpHeaders): Identity | Promise<Identity>
}

/**
 * What kind of credential a principal stands for. Every kind is hashed under
 * its own label, so no value of one kind can ever stand for a principal of
 * another (a header value spelled like a JWT principal's input is still a
 * header principal).
 */
export type PrincipalKind = 'header' | 'jwt' | 'anonymous'

/**
 * The stored form of an identity: never the credential itself, 22 characters
 * (132 bits: two principals never collide) of the SHA-256 of its kind and parts, each length-prefixed: ("a:b", "c") and
 * ("a", "b:c") never hash alike, nor do two kinds.
 */
export function principalHash (kind: PrincipalKind, ...parts: readonly string[]): string {
  const hash = createHash('sha256')
  for (const part of [kind, ...parts]) hash.update(`${Buffer.byteLength(part)}:${part}`)
  return hash.digest('base64url').slice(0, 22)
}

/** The principal of requests that carry no credential: all of them share it. */
export const ANONYMOUS_PRINCIPAL = principalHash('anonymous')

/** PRINCIPAL_HEADER's default, whose principals are hashed without the header's name. */
export const DEFAULT_PRINCIPAL_HEADER = 'authorization'

/**
 * Without an authorization server configured: the principal is the hash of
 * one request header (PRINCIPAL_HEADER, the Authorization value by default).
 * A new token is a new principal: a client whose access token is refreshed
 * loses access to the sessions it opened with the old one. A request without
 * the header (or with it empty) is the anonymous principal.
 *
 * The header's name is one of the parts (Authorization's aside, whose
 * sessions so carry over from releases that hashed the value alone): a value
 * sent in Authorization to a replica on the default binding never stands for
 * the principal an authenticating proxy's X-Authenticated-User of the same
 * value made on a replica bound to that header (a migration, a rollback).
 */
export class HeaderPrincipal implements PrincipalResolver {
  readonly kind = 'header' as const
  /** Lower case, as Node names headers. */
  readonly #header: string
  readonly #parts: readonly string[]

  constructor (header: string) {
    this.#header = header.toLowerCase()
    this.#parts = this.#header === DEFAULT_PRINCIPAL_HEADER ? [] : [this.#header]
  }

  identify (headers: IncomingHttpHeaders): Identity {
    const value = headerValue(headers[this.#header]) ?? ''
    return { principal: value === '' ? ANONYMOUS_PRINCIPAL : principalHash('header', ...this.#parts, value) }
  }
}
