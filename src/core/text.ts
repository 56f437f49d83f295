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

/**
 * `text` as an error message may quote it: its first `max` UTF-16 units (a surrogate pair kept
 * whole) and `…` when longer, so that a 16 KiB field name sent by a caller is not sent back whole.
 */
export function quotable(text: string, max = 64): string {
  if (text.length <= max) return text
  const last = text.charCodeAt(max - 1)
  const end = last >= 0xd800 && last <= 0xdbff ? max - 1 : max
  return `${text.slice(0, end)}…`
}
