import { describe, expect, it } from 'vitest'
import {
  WINDOWS,
  assertRateLimitPolicy,
  rateLimitDecision,
  rateLimitHeaders,
  windowStart,
} from './rate-limit.js'

const MINUTE = WINDOWS.minute
const policy = { limit: 60, windowType: 'minute' } as const
// 2023-11-14T22:13:20.000Z: a whole minute plus 20 s.
const T = 1_700_000_000_000

describe('windowStart', () => {
  it('aligns to the start of the fixed window', () => {
    expect(windowStart(T, MINUTE)).toBe(T - 20_000)
    expect(windowStart(T - 20_000, MINUTE)).toBe(T - 20_000)
    expect(windowStart(T - 20_001, MINUTE)).toBe(T - 80_000)
    expect(windowStart(T + 39_999, MINUTE)).toBe(T - 20_000)
    expect(windowStart(T + 40_000, MINUTE)).toBe(T + 40_000)
  })

  it('works for every window length', () => {
    for (const ms of Object.values(WINDOWS)) {
      const start = windowStart(T, ms)
      expect(start % ms).toBe(0)
      expect(start).toBeLessThanOrEqual(T)
      expect(T - start).toBeLessThan(ms)
    }
  })

  it('works for 0 and negative clocks', () => {
    expect(windowStart(0, MINUTE)).toBe(0)
    expect(windowStart(-1, MINUTE)).toBe(-MINUTE)
    expect(windowStart(-MINUTE, MINUTE)).toBe(-MINUTE)
  })
})

describe('rateLimitDecision', () => {
  const start = windowStart(T, MINUTE)
  const reset = start + MINUTE // 40 s after T

  it('succeeds up to the limit, with remaining counting down', () => {
    expect(rateLimitDecision(1, policy, reset, T)).toMatchObject({ success: true, remaining: 59 })
    expect(rateLimitDecision(59, policy, reset, T)).toMatchObject({ success: true, remaining: 1 })
    expect(rateLimitDecision(60, policy, reset, T)).toMatchObject({ success: true, remaining: 0 })
  })

  it('fails over the limit, with remaining 0', () => {
    expect(rateLimitDecision(61, policy, reset, T)).toMatchObject({ success: false, remaining: 0 })
    expect(rateLimitDecision(1000, policy, reset, T)).toMatchObject({ success: false, remaining: 0 })
  })

  it('a limit of 0 refuses every request', () => {
    expect(rateLimitDecision(1, { limit: 0, windowType: 'minute' }, reset, T).success).toBe(false)
  })

  it('reports the reset as epoch ms and as Unix seconds (spec 7 resetAt)', () => {
    const result = rateLimitDecision(61, policy, reset, T)
    expect(result.reset).toBe(reset)
    expect(result.resetAt).toBe(reset / 1000)
    expect(result.limit).toBe(60)
    expect(result.windowType).toBe('minute')
  })

  it('resetAt rounds up to the next whole second', () => {
    expect(rateLimitDecision(1, policy, 1_500, 0).resetAt).toBe(2)
    expect(rateLimitDecision(1, policy, 2_000, 0).resetAt).toBe(2)
    expect(rateLimitDecision(1, policy, 2_001, 0).resetAt).toBe(3)
  })

  it('retryAfter is the whole seconds left, rounded up, at least 1', () => {
    expect(rateLimitDecision(61, policy, reset, T).retryAfter).toBe(40)
    expect(rateLimitDecision(61, policy, reset, T + 39_001).retryAfter).toBe(1)
    expect(rateLimitDecision(61, policy, reset, T + 39_999).retryAfter).toBe(1)
    expect(rateLimitDecision(61, policy, reset, T + 38_999).retryAfter).toBe(2)
    expect(rateLimitDecision(61, policy, reset, reset).retryAfter).toBe(1)
    expect(rateLimitDecision(61, policy, reset, reset + 5_000).retryAfter).toBe(1)
    expect(rateLimitDecision(61, policy, reset, start).retryAfter).toBe(60)
  })

  it('every number in a 429 body is an integer', () => {
    const result = rateLimitDecision(61, policy, start + MINUTE, T + 123)
    for (const n of [result.limit, result.resetAt, result.retryAfter]) expect(Number.isInteger(n)).toBe(true)
  })
})

describe('rateLimitHeaders (draft-ietf-httpapi-ratelimit-headers)', () => {
  it('names the policy and what is left', () => {
    const result = rateLimitDecision(48, policy, T + 31_000, T)
    expect(rateLimitHeaders(result)).toEqual({
      'ratelimit-policy': '"minute";q=60;w=60',
      ratelimit: '"minute";r=12;t=31',
    })
  })

  it('uses the window length in seconds', () => {
    const result = rateLimitDecision(1, { limit: 1000, windowType: 'hour' }, T + 1000, T)
    expect(rateLimitHeaders(result)['ratelimit-policy']).toBe('"hour";q=1000;w=3600')
  })

  it('r is 0 when over the limit', () => {
    const result = rateLimitDecision(99, policy, T + 1000, T)
    expect(rateLimitHeaders(result).ratelimit).toBe('"minute";r=0;t=1')
  })
})

describe('assertRateLimitPolicy', () => {
  it('accepts integer limits >= 0 and known windows', () => {
    expect(() => assertRateLimitPolicy({ limit: 0, windowType: 'minute' })).not.toThrow()
    expect(() => assertRateLimitPolicy({ limit: 10, windowType: 'day' })).not.toThrow()
  })

  it('refuses bad limits and unknown windows with a TypeError', () => {
    for (const limit of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) {
      expect(() => assertRateLimitPolicy({ limit, windowType: 'minute' })).toThrow(TypeError)
    }
    expect(() => assertRateLimitPolicy({ limit: 1, windowType: 'week' as never })).toThrow(/windowType/)
    expect(() => assertRateLimitPolicy({ limit: 1, windowType: 'toString' as never })).toThrow(/windowType/)
  })

  it.each([
    ['a Symbol', Symbol('limit'), 'symbol'],
    ['a null-prototype object', Object.create(null) as unknown, 'object'],
  ])('names the type of a limit that cannot be printed (%s), in its own message (regression: the message threw)', (_name, limit, type) => {
    expect(() => assertRateLimitPolicy({ limit, windowType: 'minute' } as never, 'rateLimit.policy result')).toThrow(
      `mcp-dispatch: rateLimit.policy result must have an integer limit from 0 to 999999999999999, got a value of type ${type}`,
    )
  })
})
