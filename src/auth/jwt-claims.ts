/**
 * Claim checks for JWT access tokens (RFC 9068): issuer, expiry and audience / resource
 * indicator (RFC 8707), as pure functions. Used on verified claims in JWT mode, and on the
 * unverified claims of a JWT in the other modes, where they can only refuse a token early,
 * never accept one.
 * @module
 */
import { decodeJwt, type JWTPayload } from 'jose'
import { parseUrl } from '../core/url.js'

const COMPACT_JWS = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/

/**
 * The claims of a compact JWS JWT, without verifying anything, or `undefined` when the token
 * is not one (opaque tokens, JWE).
 *
 * @example
 * ```ts
 * peekJwtClaims('opaque-token') // undefined
 * peekJwtClaims(jwt)?.iss       // 'https://auth.example.com'
 * ```
 */
export function peekJwtClaims(token: string): JWTPayload | undefined {
  // An opaque token (no `.`) is refused before the pattern, which backtracks over all of it.
  if (token.indexOf('.') === -1 || !COMPACT_JWS.test(token)) return undefined
  try {
    return decodeJwt(token)
  } catch {
    return undefined
  }
}

/**
 * Whether a token of `iat` (whole seconds, as JWTs carry it) may have been issued at or after
 * `at` (epoch ms), given `toleranceMs` of clock skew: a token of `at`'s own second may be the
 * later. `false` without a numeric `iat`. The test of a token naming a key the set in hand
 * lacks: one issued since that set was fetched may be signed by a key published since.
 */
export function issuedSince(iat: unknown, at: number, toleranceMs: number): boolean {
  return typeof iat === 'number' && iat * 1000 + 1000 + toleranceMs > at
}

/** The start of an http(s) URL, any case: what is parsed as an address and normalized. */
const HTTP_URL = /^https?:\/\//i

/**
 * A resource indicator in comparable form: absolute http(s) URLs are normalized by the WHATWG
 * URL parser (lower-case scheme and host, default port dropped, `/` for an empty path), so
 * `https://App.example.com` and `https://app.example.com/` compare equal. Other strings are
 * kept as they are.
 *
 * @example
 * ```ts
 * normalizeResource('https://App.example.com:443') // 'https://app.example.com/'
 * normalizeResource('api://default')               // 'api://default'
 * ```
 */
export function normalizeResource(value: string): string {
  const url = HTTP_URL.test(value) ? parseUrl(value) : undefined
  return url === undefined ? value : url.href
}

/**
 * The audience of a token as a list (the `aud` claim may be a string or an array), or
 * `undefined` when absent or malformed.
 */
export function audienceList(aud: unknown): string[] | undefined {
  if (typeof aud === 'string') return [aud]
  if (Array.isArray(aud) && aud.length > 0 && aud.every((a) => typeof a === 'string')) return [...aud]
  return undefined
}

/**
 * Whether the token's audience names one of the expected resources. Values are compared after
 * {@link normalizeResource}; an expected http(s) URL also accepts an audience for a path inside
 * it (same origin, whole path segments), since a resource indicator may name a part of the
 * resource server: a token for `https://weather.example.com/v1` (asked for by a client that
 * names the URL it calls, as RFC 8707 allows) is a token for the App `https://weather.example.com`.
 *
 * @example
 * ```ts
 * audienceMatches(['https://weather.example.com'], ['https://weather.example.com/'])    // true
 * audienceMatches(['https://weather.example.com/v1'], ['https://weather.example.com'])  // true
 * audienceMatches(['https://weather.example.com'], ['https://weather.example.com/v1'])  // false
 * audienceMatches(['https://a.example.com/app-2'], ['https://a.example.com/app'])       // false
 * audienceMatches(['https://u@weather.example.com'], ['https://weather.example.com'])   // false
 * ```
 */
export function audienceMatches(actual: readonly string[], expected: readonly string[]): boolean {
  const wanted = expected.map(normalizeResource)
  return actual.some((raw) => {
    // An http(s) `aud` with an ASCII character no URI or IRI has (RFC 3986, RFC 3987: a tab, a
    // line break, `\`, a space) is no resource indicator (RFC 8707 section 2), though the URL
    // parser would clean it into the App's address (`https://app.example\@evil.example` into a
    // path of the App, where other parsers read the host `evil.example`): only equal text
    // matches. Letters past ASCII are an internationalized name's, matched as its A-label.
    if (!URI_TEXT.test(raw) && /^https?:/i.test(raw)) return expected.includes(raw)
    const a = normalizeResource(raw)
    return wanted.some((w) => a === w || isPathInside(a, w))
  })
}

/** The characters of an RFC 3986 URI (unreserved, reserved, `%` of its escapes) and those past ASCII of an RFC 3987 IRI. */
const URI_TEXT = /^[A-Za-z0-9\-._~:/?#[\]@!$&'()*+,;=%\u00a1-\uffff]*$/

function isPathInside(candidate: string, base: string): boolean {
  // An `aud` is the token's to say, before any signature is checked: one that looks like a URL
  // and is none (`https://[::1`) names no resource, and must refuse the token, not throw.
  if (!HTTP_URL.test(base) || !HTTP_URL.test(candidate)) return false
  const c = parseUrl(candidate)
  const b = parseUrl(base)
  if (c === undefined || b === undefined) return false
  // An origin leaves out userinfo: `https://u@app.example.com` has the App's origin, but it is
  // no address of the App (a resource indicator has none), so it names something else.
  if (c.username || c.password) return false
  if (c.origin !== b.origin || c.search || c.hash || b.search || b.hash) return false
  const basePath = b.pathname.endsWith('/') ? b.pathname : `${b.pathname}/`
  const path = c.pathname.endsWith('/') ? c.pathname : `${c.pathname}/`
  return path.startsWith(basePath)
}

/**
 * The claims only an OpenID Connect ID token carries (OpenID Connect Core 1.0, sections
 * 3.1.3.6, 3.3.2.11; `s_hash` of FAPI): hashes of what was issued beside it, never an access
 * token's (RFC 9068 section 2.2).
 */
const ID_TOKEN_HASHES = ['at_hash', 'c_hash', 's_hash'] as const

/**
 * Whether a JWT not typed `at+jwt` (or an introspection answer) shows itself an OpenID Connect
 * ID token, which an authorization server issues to the client, about the user, whatever its
 * audience:
 * - it carries a hash only an ID token has (`at_hash`, `c_hash`, `s_hash`), Keycloak's
 *   `typ` claim of an ID token (`"ID"`; its access tokens say `"Bearer"`), or Cognito's
 *   `token_use` of one (`"id"`; its access tokens say `"access"`);
 * - it carries a `nonce` and names no client (`azp`, `client_id`, or a provider's own claim
 *   for it: `cid`, `appid`, `applicationId`): an ID token's `nonce` is the client's, and
 *   Keycloak before version 24 copied it into access tokens too, which always name their
 *   client in `azp`, so `nonce` alone refuses nothing.
 *
 * A token typed `at+jwt` says what it is and is not judged here. An ID token's audience is its
 * client: {@link resourceAudience} keeps a client's own id from naming an App.
 *
 * @example
 * ```ts
 * idTokenSigns({ aud: 'client-1', at_hash: 'x6mBGlvPxuCgHFzIcZFuSw' })  // true
 * idTokenSigns({ aud: 'https://app.example', azp: 'client-1', nonce: 'n' }) // false
 * ```
 */
export function idTokenSigns(claims: JWTPayload): boolean {
  if (ID_TOKEN_HASHES.some((name) => claims[name] !== undefined)) return true
  if (typeof claims.typ === 'string' && claims.typ.toLowerCase() === 'id') return true
  if (claims.token_use === 'id') return true
  return claims.nonce !== undefined && !CLIENT_CLAIMS.some((name) => typeof claims[name] === 'string')
}

/**
 * Claims by which access tokens name their client: `azp` and RFC 9068's `client_id`, and the
 * providers' own (Okta `cid`, Entra v1 `appid`, FusionAuth `applicationId`).
 */
const CLIENT_CLAIMS = ['azp', 'client_id', 'cid', 'appid', 'applicationId'] as const

/**
 * The audience of a token (its `aud` claim, or an introspection answer's) as far as it names
 * resources: less any value that is the client's own id (`azp`, `client_id`) where that id is
 * an http(s) URL, compared after {@link normalizeResource}. A client id names the client, never
 * an App; but an ID token's audience is its client, and a client whose id is a URL at or under
 * an App's address (a Client ID Metadata Document hosted there) would otherwise have its ID
 * tokens taken there as access tokens. Client ids that are no URL (`client-1`, a GUID: Entra,
 * where an API may be its own client) are no App address, and are left. `undefined` when the
 * audience is absent or malformed; `[]` when it named only the client.
 *
 * @example
 * ```ts
 * resourceAudience({ aud: ['https://app.example/c.json', 'https://api.example'], azp: 'https://app.example/c.json' }) // ['https://api.example']
 * resourceAudience({ aud: 'b8c1…', azp: 'b8c1…' })                                                                     // ['b8c1…']
 * ```
 */
export function resourceAudience(claims: { readonly aud?: unknown; readonly azp?: unknown; readonly client_id?: unknown }): string[] | undefined {
  const aud = audienceList(claims.aud)
  if (!aud) return undefined
  const own = [claims.azp, claims.client_id].filter(isUrlClientId).map(normalizeResource)
  return own.length === 0 ? aud : aud.filter((a) => !own.includes(normalizeResource(a)))
}

/** Whether a client id claim is an http(s) URL, which {@link resourceAudience} keeps from naming an App. */
function isUrlClientId(id: unknown): id is string {
  return typeof id === 'string' && HTTP_URL.test(id)
}

/**
 * `claims` with the audience {@link resourceAudience} gives, for checking: the claims
 * themselves when they name no client id that is a URL (no copy made).
 */
export function withResourceAudience(claims: JWTPayload): JWTPayload {
  return isUrlClientId(claims.azp) || isUrlClientId(claims.client_id) ? { ...claims, aud: resourceAudience(claims) ?? claims.aud } : claims
}

/** What {@link checkAccessTokenClaims} checks against. */
export interface ClaimExpectations {
  /** The configured issuer; `iss` must equal it when `requireIssuer` or when present. */
  readonly issuer: string
  /** Refuse a token that has no `iss` (JWT mode). */
  readonly requireIssuer: boolean
  /** Now, epoch ms. */
  readonly now: number
  /** Allowed clock skew for `exp` / `nbf`, ms. */
  readonly clockToleranceMs: number
  /** Expected audiences, when configured; the token must name one of them. */
  readonly audience?: readonly string[] | undefined
}

/**
 * Checks `iss`, `exp`, `nbf` and, when expected, `aud` of JWT claims. Returns the reason the
 * token is refused, or `undefined` when the claims pass. The reason never contains the token.
 *
 * @example
 * ```ts
 * checkAccessTokenClaims({ iss: 'https://a.example', exp: 1 }, { issuer: 'https://a.example', requireIssuer: true, now: Date.now(), clockToleranceMs: 0 })
 * // 'token expired'
 * ```
 */
export function checkAccessTokenClaims(claims: JWTPayload, expect: ClaimExpectations): string | undefined {
  if (claims.iss === undefined ? expect.requireIssuer : claims.iss !== expect.issuer) return 'issuer mismatch'
  const nowSeconds = expect.now / 1000
  const tolerance = expect.clockToleranceMs / 1000
  if (claims.exp !== undefined && (typeof claims.exp !== 'number' || claims.exp <= nowSeconds - tolerance)) {
    return 'token expired'
  }
  if (claims.nbf !== undefined && (typeof claims.nbf !== 'number' || claims.nbf > nowSeconds + tolerance)) {
    return 'token not yet valid'
  }
  if (expect.audience) {
    const aud = audienceList(claims.aud)
    if (!aud || !audienceMatches(aud, expect.audience)) return 'audience mismatch'
  }
  return undefined
}
