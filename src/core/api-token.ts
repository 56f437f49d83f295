/**
 * API-token format (spec 2.1, 5.2, 8; DESIGN.md "API tokens").
 *
 * A token is `prefix + random base62 + checksum`, 48 characters in all. The checksum is the
 * CRC32 of the rest (the 42 characters before it, prefix included: DESIGN.md), written as 6
 * base62 digits, so a mistyped or forged token is refused without a store lookup and a secret
 * scanner can verify a match offline. The display prefix is the first 12 characters.
 * @module
 */
import { createHmac, randomBytes } from 'node:crypto'
import { sha256 } from './sha256.js'

/** Total length of an API token, prefix included (spec section 8). */
export const API_TOKEN_LENGTH = 48
/** Number of leading characters shown in the dashboard (spec section 8). */
export const DISPLAY_PREFIX_LENGTH = 12
/** Default token prefix (spec 5.2). */
export const DEFAULT_TOKEN_PREFIX = 'svc_'
/** Length of the base62 CRC32 checksum at the end of every token. */
export const CHECKSUM_LENGTH = 6

const BASE62 = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'
const PREFIX_PATTERN = /^[a-z][a-z0-9]{0,14}_$/

// Lookup tables built once: CRC32 (IEEE) and base62 digit values.
const CRC_TABLE = (() => {
  const table = new Int32Array(256)
  for (let n = 0; n < 256; n++) {
    let c = n
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1
    table[n] = c
  }
  return table
})()
const BASE62_VALUE = (() => {
  const values = new Int8Array(128).fill(-1)
  for (let i = 0; i < BASE62.length; i++) values[BASE62.charCodeAt(i)] = i
  return values
})()

/**
 * CRC32 (IEEE 802.3) of the characters `from..to` of an ASCII string.
 * @internal
 */
export function crc32(text: string, from = 0, to = text.length): number {
  let crc = -1
  for (let i = from; i < to; i++) crc = CRC_TABLE[(crc ^ text.charCodeAt(i)) & 0xff]! ^ (crc >>> 8)
  return (crc ^ -1) >>> 0
}

/** Writes `value` as exactly `width` base62 digits, most significant first. @internal */
export function toBase62(value: number, width: number): string {
  let out = ''
  for (let i = 0; i < width; i++) {
    out = BASE62[value % 62]! + out
    value = Math.floor(value / 62)
  }
  return out
}

/**
 * What is wrong with `prefix` as a token prefix (lowercase letters/digits ending in `_`), or
 * `null` when it is valid.
 * @internal
 */
export function tokenPrefixProblem(prefix: string): string | null {
  return PREFIX_PATTERN.test(prefix)
    ? null
    : `must match ${PREFIX_PATTERN} (a lowercase letter, up to 14 lowercase letters or digits, then "_"), got ${JSON.stringify(prefix)}`
}

/** Throws unless `prefix` is a valid token prefix (lowercase letters/digits ending in `_`). */
export function assertTokenPrefix(prefix: string): void {
  const problem = tokenPrefixProblem(prefix)
  if (problem !== null) throw new TypeError(`mcp-dispatch: token prefix ${problem}`)
}

/** Draws of random bytes {@link generateApiToken} makes before it calls the source broken. */
const MAX_DRAWS = 64

/** Source of random bytes; injectable for tests. */
export type RandomBytes = (size: number) => Uint8Array

/**
 * Generates a new API token: `prefix` + random base62 + 6-digit base62 CRC32 checksum of
 * the 42 characters before it (prefix and random part), 48 characters. Base62 digits are
 * drawn by rejection sampling, so every digit is uniform.
 *
 * @example
 * ```ts
 * const token = generateApiToken()                           // 'svc_3xK…': 48 characters
 * parseApiToken(token)?.displayPrefix === token.slice(0, 12) // true: what the dashboard shows
 * ```
 *
 * @throws TypeError when `prefix` is not a lowercase letter, up to 14 lowercase letters or
 *   digits, then `_` (as `svc_`); when `random` answers anything but the bytes asked for, or
 *   bytes that never make a token (only values from 248 on, which rejection sampling drops):
 *   a broken source is refused, never waited on for ever.
 */
export function generateApiToken(prefix: string = DEFAULT_TOKEN_PREFIX, random: RandomBytes = randomBytes): string {
  assertTokenPrefix(prefix)
  const want = API_TOKEN_LENGTH - prefix.length - CHECKSUM_LENGTH
  let body = ''
  // Each draw of want * 2 bytes keeps about 97 % of them: one draw almost always suffices, and
  // MAX_DRAWS failing in a row has a probability below 10^-100 from a working source.
  for (let draws = 0; body.length < want; draws++) {
    if (draws === MAX_DRAWS) throw new TypeError('mcp-dispatch: the random source gave no usable bytes (only values from 248 on)')
    const bytes = random(want * 2)
    if (!(bytes instanceof Uint8Array) || bytes.length !== want * 2) {
      throw new TypeError(`mcp-dispatch: the random source must answer the ${want * 2} bytes asked for in a Uint8Array`)
    }
    for (let i = 0; i < bytes.length && body.length < want; i++) {
      const b = bytes[i]!
      if (b < 248) body += BASE62[b % 62] // 248 = 4 * 62: unbiased
    }
  }
  const head = prefix + body
  return head + toBase62(crc32(head), CHECKSUM_LENGTH)
}

/** A syntactically valid API token, split into its parts. */
export interface ParsedApiToken {
  /** The whole token (a secret: never log it). */
  readonly token: string
  /** The prefix, e.g. `svc_`. */
  readonly prefix: string
  /** First 12 characters, safe to display (spec 2.1 `prefix`). */
  readonly displayPrefix: string
}

/** Why {@link parseApiToken} refused a string. */
export type ApiTokenFormatError = 'prefix' | 'length' | 'charset' | 'checksum'

/**
 * Checks the format of an API token without any store lookup: prefix, length (48), base62
 * alphabet and CRC32 checksum. Returns the reason on failure.
 *
 * @example
 * ```ts
 * checkApiTokenFormat('svc_abc') // 'length'
 * ```
 */
export function checkApiTokenFormat(token: string, prefix: string = DEFAULT_TOKEN_PREFIX): ApiTokenFormatError | null {
  if (!token.startsWith(prefix)) return 'prefix'
  if (token.length !== API_TOKEN_LENGTH) return 'length'
  const end = API_TOKEN_LENGTH - CHECKSUM_LENGTH
  // The checksum covers the prefix too: a secret scanner checks the 42 characters before it.
  let crc = -1
  for (let i = 0; i < prefix.length; i++) crc = CRC_TABLE[(crc ^ token.charCodeAt(i)) & 0xff]! ^ (crc >>> 8)
  // One pass over the random part: alphabet check and CRC32 together (hot path).
  for (let i = prefix.length; i < end; i++) {
    const c = token.charCodeAt(i)
    if (c > 127 || BASE62_VALUE[c] === -1) return 'charset'
    crc = CRC_TABLE[(crc ^ c) & 0xff]! ^ (crc >>> 8)
  }
  let checksum = 0
  for (let i = end; i < API_TOKEN_LENGTH; i++) {
    const c = token.charCodeAt(i)
    const digit = c > 127 ? -1 : BASE62_VALUE[c]!
    if (digit === -1) return 'charset'
    checksum = checksum * 62 + digit
  }
  return checksum === (crc ^ -1) >>> 0 ? null : 'checksum'
}

/**
 * Parses an API token; `null` when it is malformed (wrong prefix, length, alphabet or
 * checksum). A malformed token is refused without a store lookup (DESIGN.md).
 *
 * @example
 * ```ts
 * const parsed = parseApiToken(header.slice(7))
 * if (!parsed) return unauthorizedReply({ resourceMetadataUrl, invalidToken: true })
 * ```
 */
export function parseApiToken(token: string, prefix: string = DEFAULT_TOKEN_PREFIX): ParsedApiToken | null {
  if (checkApiTokenFormat(token, prefix) !== null) return null
  return { token, prefix, displayPrefix: token.slice(0, DISPLAY_PREFIX_LENGTH) }
}

/**
 * First 12 characters of a token, the part shown in the dashboard (spec 2.1).
 *
 * @example
 * ```ts
 * displayPrefix('svc_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefgh') // 'svc_AbCdEfGh'
 * ```
 */
export function displayPrefix(token: string): string {
  return token.slice(0, DISPLAY_PREFIX_LENGTH)
}

/**
 * Hash of a token as stored at rest: SHA-256, or HMAC-SHA-256 with a server-side pepper,
 * as lowercase hex. The clear token is never stored.
 *
 * @example
 * ```ts
 * hashApiToken('svc_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefgh')          // SHA-256, 64 hex digits
 * hashApiToken('svc_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefgh', pepper) // HMAC-SHA-256 with the pepper
 * ```
 */
export function hashApiToken(token: string, pepper?: string | Uint8Array): string {
  if (pepper !== undefined) return createHmac('sha256', pepper).update(token).digest('hex')
  return sha256(token, 'hex')
}

/**
 * Compares two digests in constant time: every UTF-16 code unit is compared whatever the
 * first difference (different lengths are unequal at once, which reveals only the length).
 * Full code units, not bytes: '\u0161' and 'a' differ. Allocates nothing, unlike
 * `timingSafeEqual` on fresh buffers, because it runs on every authenticated request.
 *
 * @example
 * ```ts
 * const token = generateApiToken()
 * hashesEqual(hashApiToken(token), hashApiToken(token)) // true
 * hashesEqual('ab', 'ac')                               // false, after comparing every character
 * ```
 */
export function hashesEqual(a: string, b: string): boolean {
  if (a.length !== b.length) return false
  let diff = 0
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i)
  return diff === 0
}
