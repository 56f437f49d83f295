/**
 * Text a store keeps as given.
 *
 * @internal
 * @module
 */

const LONE_SURROGATE = /\p{Cs}/u

/**
 * Whether `text` holds a lone surrogate, which is no well-formed Unicode: it has no UTF-8, so
 * Redis and PostgreSQL clients write U+FFFD in its place, and two strings that differ only there
 * become one (two users' tokens, counters or subscriptions).
 */
export function hasLoneSurrogate(text: string): boolean {
  return LONE_SURROGATE.test(text)
}

/** A run of ASCII letters and digits as long as a secret's: see {@link looksSecret}. */
const LONG_RUN = /[A-Za-z0-9]{20,}/g
/** The same, allowing the `-` and `_` of base64url: see {@link looksSecret}. */
const LONG_RUN_URL_SAFE = /[A-Za-z0-9_-]{24,}/g
/** A URL whose authority names a user (`https://user:password@host`, `redis://:password@host`). */
const URL_CREDENTIALS = /:\/\/[^/?#\s@]*@/

/**
 * Whether `text` holds what looks like a secret:
 * - a run of 20 or more ASCII letters and digits with upper case, lower case and digits all in
 *   it, as an API token or a JWT's parts have;
 * - such a run of 24 or more that also holds `-` or `_` (base64url);
 * - a run of 64 or more ASCII letters and digits with a letter and a digit, in one case or both
 *   (a SHA-256 hex digest, as the stores keep; a git commit's 40 hex digits in a version's build
 *   metadata are quoted, as the part a caller must see);
 * - a URL with credentials (`https://user:password@host`).
 *
 * Addresses, CIDR ranges, most versions and field names match none of these (a long camelCase
 * or snake_case name with a digit, as `allowedIpAddressesV4`, does), so an error message that
 * would quote such a `text` (a token pasted into the wrong field) leaves it out: error bodies
 * end up in logs.
 */
export function looksSecret(text: string): boolean {
  if (URL_CREDENTIALS.test(text)) return true
  for (const [run] of text.matchAll(LONG_RUN_URL_SAFE)) {
    if (hasAllClasses(run)) return true
  }
  for (const [run] of text.matchAll(LONG_RUN)) {
    if (run.length >= 64 ? /[0-9]/.test(run) && /[A-Za-z]/.test(run) : hasAllClasses(run)) return true
  }
  return false
}

function hasAllClasses(run: string): boolean {
  return /[0-9]/.test(run) && /[a-z]/.test(run) && /[A-Z]/.test(run)
}

/** What an error message says in place of input that {@link looksSecret}. */
export const NOT_SHOWN = '[not shown: it looks like a secret]'

/**
 * `text` as an error message may quote it: its first `max` characters (code points: a surrogate
 * pair is one) and `…` when longer, so that a 16 KiB field name sent by a caller is not sent back
 * whole; {@link NOT_SHOWN} when it {@link looksSecret}.
 */
export function quotable(text: string, max = 64): string {
  if (looksSecret(text)) return NOT_SHOWN
  if (text.length <= max) return text
  let end = 0
  for (let count = 0; count < max && end < text.length; count++) {
    const unit = text.charCodeAt(end)
    const low = text.charCodeAt(end + 1)
    end += unit >= 0xd800 && unit <= 0xdbff && low >= 0xdc00 && low <= 0xdfff ? 2 : 1
  }
  return end >= text.length ? text : `${text.slice(0, end)}…`
}

/**
 * What `JSON.stringify` leaves as it is but a reader cannot see or a log line would break on:
 * C1 controls and DEL, format characters (bidi marks and overrides, zero-width spaces) and the
 * line and paragraph separators.
 */
const INVISIBLE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/gu

/** `\uXXXX` for each UTF-16 unit of `text`. */
function escaped(text: string): string {
  let out = ''
  for (let i = 0; i < text.length; i++) out += `\\u${text.charCodeAt(i).toString(16).padStart(4, '0')}`
  return out
}

/**
 * {@link quotable}, in JSON quotes, so spaces show, and control, format and separator characters
 * (and a lone surrogate) are written as `\uXXXX` escapes; or {@link NOT_SHOWN}.
 */
export function quoted(text: string, max = 64): string {
  const shown = quotable(text, max)
  return shown === NOT_SHOWN ? shown : JSON.stringify(shown).replace(INVISIBLE, escaped)
}

/**
 * `text` named in an error message: as {@link quotable} when it is all visible ASCII (a field
 * name as sent, `expiresAt`), else as {@link quoted}, so that a name holding a line break, a
 * space or an invisible character is seen for what it is, and cannot forge a log line.
 */
export function named(text: string, max = 64): string {
  return /^[\x21-\x7e]+$/.test(text) ? quotable(text, max) : quoted(text, max)
}

/**
 * A value named in an error message without its text, which may be anything: a number as it
 * is (`NaN`, `7`), `null`, `array`, else its type (`string`, `undefined`, `object`).
 * @internal
 */
export function kindOf(value: unknown): string {
  if (typeof value === 'number') return String(value)
  if (value === null) return 'null'
  return Array.isArray(value) ? 'array' : typeof value
}

/** Whether a `Content-Type` names an event stream (`text/event-stream`, any case, parameters or not). */
export function isEventStream(contentType: string | null | undefined): boolean {
  return contentType != null && /^[ \t]*text\/event-stream/i.test(contentType)
}
