import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { type WindowType, WINDOWS, rateLimitDecision, rateLimitHeaders, unverifiedBudgetHeaders, wholeSeconds, windowStart } from './rate-limit.js'

const RUNS = { numRuns: 1000 }
const windowType = fc.constantFrom(...(Object.keys(WINDOWS) as WindowType[]))
// Epoch milliseconds up to the year 2500, and some before 1970.
const now = fc.integer({ min: -1_000_000_000_000, max: 16_725_225_600_000 })

describe('rate-limit windows, property-based', () => {
  it('windowStart aligns: start <= now < start + window, start a multiple of the window', () => {
    fc.assert(
      fc.property(now, windowType, (t, type) => {
        const ms = WINDOWS[type]
        const start = windowStart(t, ms)
        expect(start).toBeLessThanOrEqual(t)
        expect(t).toBeLessThan(start + ms)
        expect(Math.abs(start % ms)).toBe(0)
        expect(windowStart(start, ms)).toBe(start)
        expect(windowStart(start + ms - 1, ms)).toBe(start)
      }),
      RUNS,
    )
  })

  it('decisions: remaining never negative, success iff count <= limit, reset > now, retryAfter >= 1', () => {
    fc.assert(
      fc.property(
        now,
        windowType,
        fc.integer({ min: 0, max: 1_000_000 }),
        fc.integer({ min: 1, max: 2_000_000 }),
        (t, type, limit, count) => {
          const ms = WINDOWS[type]
          const reset = windowStart(t, ms) + ms
          const result = rateLimitDecision(count, { limit, windowType: type }, reset, t)
          expect(result.remaining).toBeGreaterThanOrEqual(0)
          expect(result.remaining).toBeLessThanOrEqual(limit)
          expect(result.success).toBe(count <= limit)
          if (result.success) expect(result.remaining).toBe(limit - count)
          expect(result.reset).toBeGreaterThan(t)
          expect(result.resetAt * 1000).toBeGreaterThanOrEqual(result.reset)
          expect(result.resetAt * 1000 - result.reset).toBeLessThan(1000)
          expect(Number.isInteger(result.resetAt)).toBe(true)
          expect(Number.isInteger(result.retryAfter)).toBe(true)
          expect(result.retryAfter).toBeGreaterThanOrEqual(1)
          expect(result.retryAfter).toBeLessThanOrEqual(ms / 1000)
          // Waiting retryAfter seconds always reaches the next window.
          expect(t + result.retryAfter * 1000).toBeGreaterThanOrEqual(reset)
          expect(result.windowType).toBe(type)
        },
      ),
      RUNS,
    )
  })

  it('headers carry the same numbers as the decision', () => {
    fc.assert(
      fc.property(now, windowType, fc.nat(1000), fc.integer({ min: 1, max: 2000 }), (t, type, limit, count) => {
        const ms = WINDOWS[type]
        const result = rateLimitDecision(count, { limit, windowType: type }, windowStart(t, ms) + ms, t)
        const headers = rateLimitHeaders(result)
        expect(headers['ratelimit-policy']).toBe(`"${type}";q=${limit};w=${ms / 1000}`)
        expect(headers.ratelimit).toBe(`"${type}";r=${result.remaining};t=${result.retryAfter}`)
      }),
      RUNS,
    )
  })
})

/**
 * `wholeSeconds`: what every `Retry-After` and `data.retryAfter` of the layer goes through (RFC
 * 9110 section 10.2.3 delay-seconds, the spec's "at least 1"), on any value a validator or store
 * of the platform's own may hand it.
 */
describe('wholeSeconds, property-based', () => {
  const MAX = Number.MAX_SAFE_INTEGER
  /** Any number: integers, fractions, tiny and huge doubles, the edges, NaN and the infinities. */
  const anyNumber = fc.oneof(
    fc.integer(),
    fc.double(),
    fc.double({ min: -10, max: 10 }),
    fc.double({ min: MAX - 4096, max: MAX + 4096 }),
    fc.constantFrom(0, -0, 1, 1 + Number.EPSILON, 2 ** -1074, MAX, MAX + 1, MAX + 2, 2 ** 64, 1e21, Number.MAX_VALUE, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY),
  )
  /** The documented rule, stated apart: `seconds` rounded up when it is a number in (1, 2^53 - 1], else 1. */
  const model = (x: unknown) => (typeof x === 'number' && x > 1 && x <= MAX ? Math.ceil(x) : 1)

  it('any number: a safe integer from 1, written with digits only, rounded up from the input in (1, 2^53 - 1], else 1', () => {
    fc.assert(
      fc.property(anyNumber, (x) => {
        const s = wholeSeconds(x)
        expect(s).toBe(model(x))
        expect(Number.isSafeInteger(s)).toBe(true)
        expect(s).toBeGreaterThanOrEqual(1)
        // As `Retry-After` writes it: delay-seconds, no exponent, sign, point or NaN.
        expect(String(s)).toMatch(/^[1-9][0-9]*$/)
        if (x > 1 && x <= MAX) {
          // Never sooner than asked, and not a whole second later.
          expect(s).toBeGreaterThanOrEqual(x)
          expect(s - x).toBeLessThan(1)
        }
        // Idempotent: a whole number of seconds stays as it is.
        expect(wholeSeconds(s)).toBe(s)
      }),
      RUNS,
    )
  })

  it('monotone over the numbers it rounds: a longer wait never gives fewer seconds', () => {
    fc.assert(
      fc.property(fc.double({ min: 0, max: MAX, noNaN: true }), fc.double({ min: 0, max: MAX, noNaN: true }), (a, b) => {
        const [lo, hi] = a <= b ? [a, b] : [b, a]
        expect(wholeSeconds(lo)).toBeLessThanOrEqual(wholeSeconds(hi))
      }),
      RUNS,
    )
  })

  it('what is no number (undefined, null, a numeric string, a bigint, an object) gives 1', () => {
    fc.assert(
      fc.property(fc.oneof(fc.constant(undefined), fc.constant(null), fc.string(), fc.integer().map(String), fc.bigInt(), fc.object(), fc.boolean()), (x) => {
        expect(wholeSeconds(x as unknown as number)).toBe(1)
      }),
      RUNS,
    )
  })

  it("the unverified budget's RateLimit field carries the same whole seconds", () => {
    fc.assert(
      fc.property(anyNumber, fc.nat(1_000_000), windowType, (retryAfter, limit, type) => {
        const headers = unverifiedBudgetHeaders({ limit, retryAfter, windowType: type })
        expect(headers.ratelimit).toBe(`"unverified";r=0;t=${model(retryAfter)}`)
        expect(headers['ratelimit-policy']).toBe(`"unverified";q=${limit};w=${WINDOWS[type] / 1000}`)
      }),
      RUNS,
    )
  })
})
