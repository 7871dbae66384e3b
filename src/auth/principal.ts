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
  readonly kind: 'header' | 'jwt'
  identify (headers: IncomingHttpHeaders): Identity | Promise<Identity>
}

/** The stored form of an identity: never the credential itself, 22 characters of its SHA-256. */
export function principalHash (...parts: readonly string[]): string {
  const hash = createHash('sha256')
  // Length-prefixed: ("a:b", "c") and ("a", "b:c") never hash alike.
  for (const part of parts) hash.update(`${Buffer.byteLength(part)}:${part}`)
  return hash.digest('base64url').slice(0, 22)
}

/**
 * Without an authorization server configured: the principal is the hash of
 * one request header (PRINCIPAL_HEADER, the Authorization value by default).
 * A new token is a new principal: a client whose access token is refreshed
 * loses access to the sessions it opened with the old one.
 */
export class HeaderPrincipal implements PrincipalResolver {
  readonly kind = 'header' as const
  readonly #header: string

  constructor (header: string) {
    this.#header = header
  }

  identify (headers: IncomingHttpHeaders): Identity {
    const value = headerValue(headers[this.#header]) ?? ''
    return { principal: createHash('sha256').update(value).digest('base64url').slice(0, 22) }
  }
}
