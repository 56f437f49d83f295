/**
 * Authorization-server discovery for the resource-server side: where the userinfo, JWKS and
 * introspection endpoints of an issuer are (OpenID Connect Discovery 1.0, RFC 8414).
 * @module
 */

import { withoutTrailingSlashes } from '../core/trailing-slash.js'
import { parseUrl } from '../core/url.js'

/** The fields of an authorization server's metadata that validation uses. */
export interface AuthorizationServerMetadata {
  /** Must equal the configured issuer exactly (RFC 8414 section 3.3, OIDC Discovery 4.3). */
  readonly issuer: string
  readonly userinfo_endpoint?: string
  readonly jwks_uri?: string
  readonly introspection_endpoint?: string
  readonly [field: string]: unknown
}

/**
 * The discovery documents of an issuer, in the order they are tried: OpenID Connect
 * (`{issuer}/.well-known/openid-configuration`), then RFC 8414
 * (`/.well-known/oauth-authorization-server` inserted before the issuer's path).
 *
 * @example
 * ```ts
 * discoveryUrls('https://auth.example.com/tenant')
 * // ['https://auth.example.com/tenant/.well-known/openid-configuration',
 * //  'https://auth.example.com/.well-known/oauth-authorization-server/tenant']
 * ```
 */
export function discoveryUrls(issuer: string): [string, string] {
  const url = new URL(issuer)
  const path = withoutTrailingSlashes(url.pathname)
  return [
    `${url.origin}${path}/.well-known/openid-configuration`,
    `${url.origin}/.well-known/oauth-authorization-server${path}`,
  ]
}

/**
 * The userinfo endpoint to use when the issuer publishes no discovery document: `{issuer}/userinfo`.
 *
 * @example
 * ```ts
 * fallbackUserinfoEndpoint('https://auth.example.com/') // 'https://auth.example.com/userinfo'
 * ```
 */
export function fallbackUserinfoEndpoint(issuer: string): string {
  return `${withoutTrailingSlashes(issuer)}/userinfo`
}

/** The endpoint fields of a discovery document that a validator may call. */
export type DiscoveredEndpoint = 'userinfo_endpoint' | 'jwks_uri' | 'introspection_endpoint'

const DISCOVERED_ENDPOINTS: readonly DiscoveredEndpoint[] = ['userinfo_endpoint', 'jwks_uri', 'introspection_endpoint']

/**
 * Checks a parsed discovery document: a JSON object whose `issuer` is exactly the expected
 * one and whose endpoint fields, when present, are absolute http(s) URLs; the ones named in
 * `called` (the endpoints the validator will call: by default all three) https ones when the
 * issuer is https (OIDC Discovery section 3, RFC 8414 section 2, RFC 7662 section 4: the token
 * and the client's credentials go there, and keys fetched in clear could be swapped). Returns
 * the reason it is refused, or `undefined` when it is fine.
 *
 * @example
 * ```ts
 * checkAuthorizationServerMetadata({ issuer: 'https://a.example' }, 'https://a.example') // undefined
 * checkAuthorizationServerMetadata({ issuer: 'https://b.example' }, 'https://a.example') // 'issuer mismatch…'
 * ```
 */
export function checkAuthorizationServerMetadata(
  doc: unknown,
  issuer: string,
  called: readonly DiscoveredEndpoint[] = DISCOVERED_ENDPOINTS,
): string | undefined {
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) return 'discovery document is not a JSON object'
  const metadata = doc as Record<string, unknown>
  if (metadata.issuer !== issuer) {
    return `issuer mismatch: discovery names ${JSON.stringify(metadata.issuer)}, expected ${JSON.stringify(issuer)}`
  }
  const secure = /^https:/i.test(issuer)
  for (const field of DISCOVERED_ENDPOINTS) {
    const value = metadata[field]
    if (value === undefined) continue
    if (!isHttpUrl(value)) {
      return `discovery field ${field} is not an http(s) URL`
    }
    if (secure && called.includes(field) && !/^https:/i.test(value)) return `discovery field ${field} is not an https URL, and the issuer is`
    // `fetch` refuses to call a URL with credentials (Node's error then quotes it).
    if (hasCredentials(value)) return `discovery field ${field} holds a user name or password`
  }
  return undefined
}

/** Whether `url` is an absolute http(s) URL (an issuer is one, RFC 8414 section 2). @internal */
export function isHttpUrl(url: unknown): url is string {
  return typeof url === 'string' && /^https?:\/\//i.test(url) && parseUrl(url) !== undefined
}

/**
 * Why `url` is no issuer identifier (RFC 8414 section 2: an http(s) URL with no query or
 * fragment), as a `ConfigurationError` phrases it, or `undefined` when it is one. Read in the
 * string: an empty query or fragment (`…/t#`) parses to none, and the URL parser drops spaces
 * and control characters that an `iss` compared exactly, or a document served as given, keeps.
 * @internal
 */
export function issuerProblem(url: unknown): string | undefined {
  if (!isHttpUrl(url)) return 'must be an absolute http(s) URL'
  if (url.includes('?') || url.includes('#')) return 'must have no query or fragment'
  for (let i = 0; i < url.length; i++) {
    const c = url.charCodeAt(i)
    if (c <= 0x20 || c === 0x7f) return 'must not contain spaces or control characters'
  }
  if (hasCredentials(url)) return 'must hold no user name or password (fetch refuses to call such a URL, and the metadata would publish it)'
  return undefined
}

/** Whether `url` (one `URL` parses) names a user or a password. @internal */
export function hasCredentials(url: string): boolean {
  const parsed = new URL(url)
  return parsed.username !== '' || parsed.password !== ''
}
