import type { IncomingHttpHeaders } from 'node:http'
import { createRemoteJWKSet, errors as joseErrors, jwtVerify, type JWTVerifyGetKey } from 'jose'
import { errors, type GatewayError } from '../errors.js'
import { headerValue } from '../upstream/headers.js'
import { principalHash, type Identity, type PrincipalResolver } from './principal.js'

export interface JwtOptions {
  /** The authorization server's issuer identifier: tokens must carry it as `iss`. */
  readonly issuer: string
  /** Where its signing keys are published (a JWK Set). */
  readonly jwksUrl: URL
  /** Accepted `aud` values: this resource's identifier(s). */
  readonly audience: readonly string[]
  readonly clockToleranceSeconds: number
  /** How long a fetch of the key set may take before the request is answered 503. */
  readonly jwksTimeoutMs: number
  /** Longest a fetched key set is used before it is fetched again. */
  readonly jwksCacheMaxAgeMs: number
  /** Shortest time between two fetches of the key set (a token with an unknown key triggers one). */
  readonly jwksCooldownMs: number
  /** The protected resource metadata URL announced in WWW-Authenticate (MCP authorization spec), if any. */
  readonly resourceMetadataUrl?: string
}

/**
 * Verification failures that are the token's fault: the client gets 401 and
 * must get a new token. Anything else (the key set could not be fetched,
 * timed out, or is not a key set) is the gateway's problem: 503, retry.
 */
const TOKEN_FAULTS = new Set<string>([
  joseErrors.JWTExpired.code,
  joseErrors.JWTClaimValidationFailed.code,
  joseErrors.JWTInvalid.code,
  joseErrors.JWSInvalid.code,
  joseErrors.JWSSignatureVerificationFailed.code,
  joseErrors.JWKSNoMatchingKey.code,
  joseErrors.JWKSMultipleMatchingKeys.code,
  joseErrors.JOSEAlgNotAllowed.code,
  joseErrors.JOSENotSupported.code,
  joseErrors.JWEInvalid.code
])

/** RFC 6750 section 3: the challenge, with the MCP authorization spec's resource_metadata when configured. */
function challenge (resourceMetadataUrl: string | undefined, error?: { code: string, description: string }): string {
  const params: string[] = []
  if (resourceMetadataUrl !== undefined) params.push(`resource_metadata="${resourceMetadataUrl}"`)
  if (error !== undefined) params.push(`error="${error.code}"`, `error_description="${error.description}"`)
  return params.length === 0 ? 'Bearer' : `Bearer ${params.join(', ')}`
}

/**
 * With an authorization server configured: the principal is the token's
 * issuer and subject, verified against the server's published keys (jose).
 * A refreshed access token names the same subject, so sessions survive
 * refresh; nothing the client can write without the server's key counts.
 */
export class JwtPrincipal implements PrincipalResolver {
  readonly kind = 'jwt' as const
  readonly #options: JwtOptions
  readonly #keys: JWTVerifyGetKey

  constructor (options: JwtOptions, keys?: JWTVerifyGetKey) {
    this.#options = options
    this.#keys = keys ?? createRemoteJWKSet(options.jwksUrl, {
      timeoutDuration: options.jwksTimeoutMs,
      cacheMaxAge: options.jwksCacheMaxAgeMs,
      cooldownDuration: options.jwksCooldownMs
    })
  }

  /** 401 with RFC 6750's invalid_token: the client must get a new token. */
  #invalid (description: string): GatewayError {
    return errors.unauthorized(`Unauthorized: ${description.toLowerCase()}; get a new one from the authorization server.`,
      challenge(this.#options.resourceMetadataUrl, { code: 'invalid_token', description }))
  }

  async identify (headers: IncomingHttpHeaders): Promise<Identity> {
    const metadata = this.#options.resourceMetadataUrl
    const match = /^bearer +([\w\-.~+/]+=*) *$/i.exec(headerValue(headers.authorization) ?? '')
    if (match === null) {
      return { error: errors.unauthorized('Unauthorized: this endpoint needs an OAuth bearer access token in Authorization.', challenge(metadata)) }
    }
    try {
      const { payload } = await jwtVerify(match[1] as string, this.#keys, {
        issuer: this.#options.issuer,
        audience: [...this.#options.audience],
        clockTolerance: this.#options.clockToleranceSeconds,
        requiredClaims: ['sub', 'exp']
      })
      // RFC 7519 section 4.1.2: sub is a string. jose checks it is present only;
      // an empty one would make every such token one principal.
      if (typeof payload.sub !== 'string' || payload.sub === '' || typeof payload.iss !== 'string') {
        return { error: this.#invalid('The access token names no subject (sub)') }
      }
      return { principal: principalHash('jwt', payload.iss, payload.sub) }
    } catch (err) {
      const code = (err as { code?: unknown }).code
      if (typeof code === 'string' && TOKEN_FAULTS.has(code)) {
        const e = this.#invalid(code === joseErrors.JWTExpired.code ? 'The access token expired' : 'The access token is not valid for this resource')
        e.cause = err
        return { error: e }
      }
      const e = errors.authUnavailable()
      e.cause = err
      return { error: e }
    }
  }
}
