/**
 * `Authorization: Bearer` parsing (RFC 6750 section 2.1).
 * @module
 */

/** Result of {@link parseBearerToken}. */
export type BearerParseResult =
  | { readonly kind: 'missing' }
  | { readonly kind: 'invalid' }
  | { readonly kind: 'bearer'; readonly token: string }

const MISSING: BearerParseResult = Object.freeze({ kind: 'missing' })
const INVALID: BearerParseResult = Object.freeze({ kind: 'invalid' })
/**
 * RFC 6750 b64token: ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" followed by "="s; what
 * a token sent as `Bearer <token>` can be.
 * @internal
 */
export const B64TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/
/** Longest credential accepted; longer headers are refused before any work. */
export const MAX_BEARER_LENGTH = 8192
/**
 * Longest header looked at: the scheme, a credential of {@link MAX_BEARER_LENGTH} and spaces
 * around it. The credential's own bound is checked once the spaces are dropped, so a credential
 * of MAX_BEARER_LENGTH followed by a space is accepted like one without.
 */
const MAX_HEADER_LENGTH = 2 * MAX_BEARER_LENGTH

/**
 * Parses an `Authorization` header value. The scheme is case-insensitive; the credential
 * must be an RFC 6750 b64token of at most {@link MAX_BEARER_LENGTH} characters.
 *
 * @example
 * ```ts
 * parseBearerToken('Bearer svc_abc')   // { kind: 'bearer', token: 'svc_abc' }
 * parseBearerToken('Basic dXNlcg==')   // { kind: 'invalid' }
 * parseBearerToken(null)               // { kind: 'missing' }
 * ```
 */
export function parseBearerToken(header: string | null | undefined): BearerParseResult {
  if (header == null || header === '') return MISSING
  if (header.length > MAX_HEADER_LENGTH || header.length < 8) return INVALID
  const scheme = header.slice(0, 7)
  if (scheme !== 'Bearer ' && scheme.toLowerCase() !== 'bearer ') return INVALID
  let start = 7
  while (header.charCodeAt(start) === 32) start++
  let end = header.length
  while (end > start && header.charCodeAt(end - 1) === 32) end--
  const token = header.slice(start, end)
  if (token.length === 0 || token.length > MAX_BEARER_LENGTH || !B64TOKEN.test(token)) return INVALID
  return { kind: 'bearer', token }
}

/**
 * Whether an `Authorization` value (or several fields joined by `, `) presents a `Bearer`
 * credential, well formed or not, even an empty one: what tells a refused bearer token
 * (RFC 6750 `invalid_token`) from another scheme, which presented none. The value is split at
 * commas outside quoted strings (RFC 9110 section 11.2: `Digest username="a, Bearer b"`
 * presents none); a piece presents one when, after whitespace, it is `bearer` in any case,
 * then whitespace or its end. Refusals only: not on the path of an accepted request.
 * @internal
 */
export function presentsBearer(header: string | null | undefined): boolean {
  if (header == null) return false
  // One pass, no piece cut out: a header of 16,000 commas, an unauthenticated caller's, cost
  // 2 ms of CPU split into 16,000 trimmed strings (a denial-of-service audit).
  const end = header.length
  for (let i = 0; i <= end; i++) {
    while (i < end && isWhitespace(header.charCodeAt(i))) i++
    if (startsBearer(header, i)) return true
    let quoted = false
    for (; i < end; i++) {
      const c = header.charCodeAt(i)
      if (quoted) {
        if (c === 0x5c) i++ // a quoted-pair
        else if (c === 0x22) quoted = false
      } else if (c === 0x22) quoted = true
      else if (c === 0x2c) break
    }
  }
  return false
}

/** Whether `bearer`, in any ASCII case, stands at `i`, then whitespace, a comma or the end. */
function startsBearer(header: string, i: number): boolean {
  if (i + 6 > header.length) return false
  for (let k = 0; k < 6; k++) {
    // `| 0x20` lowers an ASCII capital; of the other characters only the lower-case letter itself gives it.
    if ((header.charCodeAt(i + k) | 0x20) !== BEARER_CODES[k]) return false
  }
  const next = header.charCodeAt(i + 6)
  return i + 6 === header.length || next === 0x2c || isWhitespace(next)
}

const BEARER_CODES = [...'bearer'].map((c) => c.charCodeAt(0))
const WHITESPACE = /\s/

/** ECMAScript's white space and line terminators, what `\s` and `trim` know. */
function isWhitespace(c: number): boolean {
  return c === 0x20 || (c >= 0x09 && c <= 0x0d) || (c >= 0x80 && WHITESPACE.test(String.fromCharCode(c)))
}

/**
 * The elements of a header's comma-separated list (RFC 9110 section 5.6.1), trimmed: split at
 * commas outside quoted strings, a backslash inside one taking the next character as it is; a
 * quoted string never closed runs to the end. Empty elements are kept (as `''`).
 * @internal
 */
export function headerListElements(header: string): string[] {
  const elements: string[] = []
  let start = 0
  let quoted = false
  for (let i = 0; i < header.length; i++) {
    const c = header.charCodeAt(i)
    if (quoted) {
      if (c === 0x5c) i++ // a quoted-pair
      else if (c === 0x22) quoted = false
    } else if (c === 0x22) quoted = true
    else if (c === 0x2c) {
      elements.push(header.slice(start, i).trim())
      start = i + 1
    }
  }
  elements.push(header.slice(start).trim())
  return elements
}

// One element of a `WWW-Authenticate` list (RFC 9110 section 11.6.1): `scheme`, `scheme param…`,
// `scheme token68`, or a further `param=value` of the challenge before it.
const CHALLENGE_START = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+)(?:[ \t]+(.*))?$/s
// No whitespace after the value: elements come trimmed, and a run there beside the one after
// `=` (an empty value between them) backtracked quadratically over an authorization server's
// header (`error=` and 16,000 spaces before a stray `"`: 128 ms of a blocked event loop).
const AUTH_PARAM = /^([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*=[ \t]*(?:"((?:[^"\\]|\\.)*)"|([!#$%&'*+.^_`|~0-9A-Za-z-]*))$/s

/** An auth-param of a challenge: its name in lower case, and its value (a quoted one unescaped). */
export type AuthParam = readonly [name: string, value: string]

/**
 * The auth-params of each `Bearer` challenge of a `WWW-Authenticate` value (one field, or several
 * joined with `, `), in order, wherever the challenge stands among other schemes' challenges
 * (`DPoP …, Bearer error="insufficient_scope"`); a repeated name is kept each time (what to make
 * of it is the caller's). Commas inside quoted strings do not split; a parameter of another
 * scheme's challenge, or inside a quoted value, is none of a Bearer challenge's.
 * @internal
 */
export function bearerChallenges(header: string): AuthParam[][] {
  const challenges: AuthParam[][] = []
  let current: AuthParam[] | undefined
  const param = (match: RegExpExecArray): AuthParam => [match[1]!.toLowerCase(), match[2] !== undefined ? match[2].replace(/\\(.)/gs, '$1') : match[3]!]
  for (const element of headerListElements(header)) {
    if (element === '') continue
    const continued = AUTH_PARAM.exec(element)
    // A `name=value` element continues the challenge before it; anything else starts one.
    const start = continued === null ? CHALLENGE_START.exec(element) : null
    if (start !== null) {
      current = start[1]!.toLowerCase() === 'bearer' ? [] : undefined
      if (current === undefined) continue
      challenges.push(current)
      const first = start[2] === undefined ? null : AUTH_PARAM.exec(start[2])
      if (first !== null) current.push(param(first))
    } else if (continued !== null) current?.push(param(continued))
    else current = undefined
  }
  return challenges
}
