/**
 * Properties of the `RateLimit` fields of an unverified client's 429 (`unverifiedBudgetHeaders`)
 * and of the policy check (`assertRateLimitPolicy`):
 *
 * - For every budget a client budget can be built with (a whole limit from 1 to 10^15 - 1, a
 *   window, whole seconds to wait), both field values parse, with a reference parser of RFC 9651
 *   structured fields written here, as draft-ietf-httpapi-ratelimit-headers has them: one list
 *   member, the string `"unverified"`, with integer parameters `q` (the limit) and `w` (the
 *   window in seconds) in `RateLimit-Policy`, `r` (0) and `t` (the wait) in `RateLimit`. No CR,
 *   LF or other control character.
 * - `assertRateLimitPolicy` throws exactly when a reference check says the policy is unusable (a
 *   limit that is a number, whole, from 0 to 10^15 - 1; a window that is one of the four names,
 *   as a string), and then a `TypeError` whose message names the place it was given; a usable
 *   policy never throws, and its `RateLimit-Policy` value parses the same way.
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { MAX_RATE_LIMIT, type RateLimitPolicy, assertRateLimitPolicy, rateLimitPolicyValue, unverifiedBudgetHeaders } from './rate-limit.js'

const RUNS = { numRuns: 1000 }

const WINDOW_SECONDS: Record<string, number> = { second: 1, minute: 60, hour: 3600, day: 86400 }
const windowType = fc.constantFrom('second', 'minute', 'hour', 'day') as fc.Arbitrary<'second' | 'minute' | 'hour' | 'day'>

/**
 * A reference parser of an RFC 9651 List of one Item: an sf-string with parameters whose values
 * are sf-integers (`"name";key=1;key=2`). `null` when the text is not one.
 */
function parseItem(text: string): { name: string; params: Record<string, number> } | null {
  let i = 0
  if (text[i++] !== '"') return null
  let name = ''
  for (;;) {
    if (i >= text.length) return null
    const c = text[i]!
    const code = c.charCodeAt(0)
    if (c === '"') break
    if (c === '\\') {
      const next = text[i + 1]
      if (next !== '"' && next !== '\\') return null
      name += next
      i += 2
      continue
    }
    if (code < 0x20 || code > 0x7e) return null
    name += c
    i++
  }
  i++
  const params: Record<string, number> = {}
  while (i < text.length) {
    if (text[i++] !== ';') return null
    while (text[i] === ' ') i++
    // key = ( lcalpha / "*" ) *( lcalpha / DIGIT / "_" / "-" / "." / "*" )
    const start = i
    if (!/[a-z*]/.test(text[i] ?? '')) return null
    while (i < text.length && /[a-z0-9_\-.*]/.test(text[i]!)) i++
    const key = text.slice(start, i)
    if (text[i++] !== '=') return null
    // sf-integer = ["-"] 1*15DIGIT
    const digitsStart = i
    if (text[i] === '-') i++
    const first = i
    while (i < text.length && text[i]! >= '0' && text[i]! <= '9') i++
    if (i === first || i - first > 15) return null
    params[key] = Number(text.slice(digitsStart, i))
  }
  return { name, params }
}

/** A client budget as `createClientBudget` accepts it, and the wait it reports (whole seconds, within the window). */
const spent = windowType.chain((w) =>
  fc.record({
    limit: fc.oneof(fc.integer({ min: 1, max: 1000 }), fc.integer({ min: 1, max: MAX_RATE_LIMIT }), fc.constant(MAX_RATE_LIMIT)),
    retryAfter: fc.integer({ min: 1, max: WINDOW_SECONDS[w]! }),
    windowType: fc.constant(w),
  }),
)

describe('unverifiedBudgetHeaders, property-based', () => {
  it('gives RateLimit-Policy "unverified";q=<limit>;w=<seconds> and RateLimit "unverified";r=0;t=<wait>, as structured fields', () => {
    const seen = { fifteenDigits: 0, second: 0, day: 0 }
    fc.assert(
      fc.property(spent, (s) => {
        const headers = unverifiedBudgetHeaders(s)
        expect(Object.keys(headers).sort()).toEqual(['ratelimit', 'ratelimit-policy'])
        for (const value of Object.values(headers)) expect(value).toMatch(/^[\x20-\x7e]*$/)
        expect(parseItem(headers['ratelimit-policy']!)).toEqual({ name: 'unverified', params: { q: s.limit, w: WINDOW_SECONDS[s.windowType] } })
        expect(parseItem(headers.ratelimit!)).toEqual({ name: 'unverified', params: { r: 0, t: s.retryAfter } })
        if (String(s.limit).length === 15) seen.fifteenDigits++
        if (s.windowType === 'second') seen.second++
        if (s.windowType === 'day') seen.day++
      }),
      RUNS,
    )
    // About 570 with 15 digits, 230 per window.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(100)
  })
})

/** Anything a platform's `rateLimit.policy` callback could return in these two fields. */
const anyLimit = fc.oneof(
  { weight: 3, arbitrary: fc.integer({ min: 0, max: MAX_RATE_LIMIT }) },
  { weight: 2, arbitrary: fc.constantFrom(0, -0, 1, MAX_RATE_LIMIT, MAX_RATE_LIMIT + 1, Number.MAX_SAFE_INTEGER, -1, 0.5, 1.5, 1e21, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY, Number.EPSILON) },
  { weight: 2, arbitrary: fc.double() },
  { weight: 1, arbitrary: fc.integer({ min: -1000, max: -1 }) },
  { weight: 1, arbitrary: fc.constantFrom<unknown>('5', '', null, undefined, true, 5n, [5], {}) },
)
const anyWindow = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom('second', 'minute', 'hour', 'day') },
  { weight: 2, arbitrary: fc.constantFrom<unknown>('Minute', 'MINUTE', 'week', 'minutes', '', ' minute', 'toString', 'constructor', '__proto__', 'hasOwnProperty', 'valueOf', 60_000, null, undefined) },
  { weight: 1, arbitrary: fc.string({ maxLength: 8 }) },
)

/** The reference: what a usable policy is, without the code's checks. */
function usable(limit: unknown, window: unknown): boolean {
  const wholeNumber = typeof limit === 'number' && Number.isFinite(limit) && Math.floor(limit) === limit
  return wholeNumber && limit >= 0 && limit <= 999_999_999_999_999 && typeof window === 'string' && ['second', 'minute', 'hour', 'day'].includes(window)
}

describe('assertRateLimitPolicy, property-based', () => {
  it('throws a TypeError naming the place exactly for unusable policies; a usable one never throws, and its RateLimit-Policy parses', () => {
    const seen = { usable: 0, badLimit: 0, badWindow: 0, boundary: 0 }
    fc.assert(
      fc.property(anyLimit, anyWindow, fc.option(fc.constantFrom('rateLimit.policy result', 'App "x" rate limit'), { nil: undefined }), (limit, window, where) => {
        const policy = { limit, windowType: window } as unknown as RateLimitPolicy
        let error: unknown
        try {
          assertRateLimitPolicy(policy, where)
        } catch (caught) {
          error = caught
        }
        if (usable(limit, window)) {
          expect(error).toBeUndefined()
          const parsed = parseItem(rateLimitPolicyValue(policy))
          expect(parsed).toEqual({ name: window, params: { q: limit === 0 ? 0 : limit, w: WINDOW_SECONDS[window as string] } })
          seen.usable++
        } else {
          expect(error).toBeInstanceOf(TypeError)
          expect((error as Error).message.startsWith(`mcp-dispatch: ${where ?? 'rate limit'} `)).toBe(true)
          if (!usable(limit, 'minute')) seen.badLimit++
          else seen.badWindow++
        }
        if (limit === MAX_RATE_LIMIT || limit === MAX_RATE_LIMIT + 1 || limit === 0) seen.boundary++
      }),
      RUNS,
    )
    // About 190 usable, 610 with a bad limit, 190 with a good limit and a bad window, 60 at the boundaries.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(25)
  })
})
