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

/**
 * Whether `text` holds what looks like a secret: a run of 20 or more ASCII letters and digits
 * with upper case, lower case and digits all in it, as an API token or a JWT's parts have (a
 * hex or single-case secret does not match). Addresses, CIDR ranges, most versions and field names
 * have none (a long camelCase name with a digit, as `allowedIpAddressesV4`, does), so an error
 * message that would quote such a `text` (a token pasted into the wrong field) leaves it out:
 * error bodies end up in logs.
 */
export function looksSecret(text: string): boolean {
  for (const [run] of text.matchAll(LONG_RUN)) {
    if (/[0-9]/.test(run) && /[a-z]/.test(run) && /[A-Z]/.test(run)) return true
  }
  return false
}

/** What an error message says in place of input that {@link looksSecret}. */
export const NOT_SHOWN = '[not shown: it looks like a secret]'

/**
 * `text` as an error message may quote it: its first `max` UTF-16 units (a surrogate pair kept
 * whole) and `…` when longer, so that a 16 KiB field name sent by a caller is not sent back
 * whole; {@link NOT_SHOWN} when it {@link looksSecret}.
 */
export function quotable(text: string, max = 64): string {
  if (looksSecret(text)) return NOT_SHOWN
  if (text.length <= max) return text
  const last = text.charCodeAt(max - 1)
  const end = last >= 0xd800 && last <= 0xdbff ? max - 1 : max
  return `${text.slice(0, end)}…`
}

/** {@link quotable}, in JSON quotes (so spaces and control characters show), or {@link NOT_SHOWN}. */
export function quoted(text: string, max = 64): string {
  const shown = quotable(text, max)
  return shown === NOT_SHOWN ? shown : JSON.stringify(shown)
}
