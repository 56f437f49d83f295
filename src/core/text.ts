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
