import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { type WindowType, WINDOWS, rateLimitDecision, rateLimitHeaders, windowStart } from './rate-limit.js'

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
