/**
 * Properties of `retryAfterMs`, the reading of an authorization server's `Retry-After` (a 429 or
 * 503, docs/oauth.md "Retries"): RFC 9110 section 10.2.3 makes it delay-seconds or an HTTP-date
 * (section 5.6.7: IMF-fixdate, and the obsolete rfc850-date and asctime-date a recipient must also
 * accept, all three in GMT whatever the process's time zone, `TZ`), and
 * the validator waits that long, at most an hour, before asking again. Whatever the server sends,
 * the wait is `undefined` or a whole, finite number of milliseconds from 0 to an hour: a timer
 * is set from it.
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { retryAfterMs } from './oauth-validator.js'

const RUNS = { numRuns: 1_000 }
const HOUR = 3_600_000
const clamp = (ms: number) => Math.min(Math.max(ms, 0), HOUR)

/** Epoch milliseconds from 2000 to 2040: two-digit years of rfc850-date name one century there. */
const at = fc.integer({ min: Date.UTC(2000, 0, 3), max: Date.UTC(2040, 0, 1) })
/** Optional whitespace around a field value (what `Headers` strips is SP and HTAB). */
const ows = fc.constantFrom('', ' ', '\t', '  ', ' \t')

const DAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat']
const LONG_DAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday']
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec']
const two = (n: number) => String(n).padStart(2, '0')

/** An HTTP-date of `ms` (whole seconds), written by hand from the grammar of RFC 9110 section 5.6.7. */
function httpDate(ms: number, format: 'imf' | 'rfc850' | 'asctime'): string {
  const d = new Date(ms)
  const time = `${two(d.getUTCHours())}:${two(d.getUTCMinutes())}:${two(d.getUTCSeconds())}`
  if (format === 'asctime') return `${DAYS[d.getUTCDay()]} ${MONTHS[d.getUTCMonth()]} ${String(d.getUTCDate()).padStart(2, ' ')} ${time} ${d.getUTCFullYear()}`
  return format === 'imf'
    ? `${DAYS[d.getUTCDay()]}, ${two(d.getUTCDate())} ${MONTHS[d.getUTCMonth()]} ${d.getUTCFullYear()} ${time} GMT`
    : `${LONG_DAYS[d.getUTCDay()]}, ${two(d.getUTCDate())}-${MONTHS[d.getUTCMonth()]}-${two(d.getUTCFullYear() % 100)} ${time} GMT`
}

describe('retryAfterMs (Retry-After of the authorization server), property-based', () => {
  it('any value: undefined, or a whole number of milliseconds from 0 to an hour; absent is undefined', () => {
    const piece = fc.oneof(
      fc.constantFrom('0', '1', '9', '-', '+', '.', 'e', ',', ':', ' ', '\t', 'GMT', 'Sun', 'Nov', '-Nov-', '1994', '9999', '99999999999999999999', 'T', 'Z', 'x'),
      fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)),
    )
    fc.assert(
      fc.property(fc.option(fc.string({ unit: piece, maxLength: 20 }), { nil: null }), at, (value, now) => {
        const ms = retryAfterMs(value, now)
        if (value === null) expect(ms).toBeUndefined()
        if (ms === undefined) return
        expect(Number.isInteger(ms)).toBe(true)
        expect(ms).toBeGreaterThanOrEqual(0)
        expect(ms).toBeLessThanOrEqual(HOUR)
      }),
      { numRuns: 3_000 },
    )
    expect(retryAfterMs(null, Date.UTC(2026, 0, 1))).toBeUndefined()
  })

  it('delay-seconds (any number of digits, leading zeros included, whitespace around): that many seconds, at most an hour, whenever asked', () => {
    fc.assert(
      fc.property(fc.stringMatching(/^[0-9]{1,30}$/), ows, ows, at, at, (digits, before, after, now, later) => {
        const expected = Number(BigInt(digits) * 1000n < BigInt(HOUR) ? BigInt(digits) * 1000n : BigInt(HOUR))
        const value = `${before}${digits}${after}`
        expect(retryAfterMs(value, now)).toBe(expected)
        // A delay is counted from the answer: the clock does not enter.
        expect(retryAfterMs(value, later)).toBe(expected)
      }),
      RUNS,
    )
  })

  it('an HTTP-date (IMF-fixdate, rfc850-date): the time until it, 0 for one past, at most an hour', () => {
    // Dates near the clock (a server's wait is seconds to minutes) and far on either side.
    const offset = fc.oneof(fc.integer({ min: -7_200_000, max: 7_200_000 }), fc.integer({ min: -3 * 86_400_000, max: 3 * 86_400_000 }))
    fc.assert(
      fc.property(at, offset, fc.constantFrom('imf' as const, 'rfc850' as const, 'asctime' as const), ows, ows, (now, delta, format, before, after) => {
        const when = Math.floor((now + delta) / 1000) * 1000
        const value = `${before}${httpDate(when, format)}${after}`
        expect(retryAfterMs(value, now)).toBe(clamp(when - now))
      }),
      RUNS,
    )
  })

  it('an asctime-date (GMT, though it names no zone): the time until it, in any time zone of the process (TZ)', () => {
    const zone = process.env.TZ
    try {
      // Zones west and east of GMT, one of them +13:45 and one -03:30, and one a day ahead.
      for (const tz of ['UTC', 'America/St_Johns', 'Pacific/Chatham', 'Etc/GMT-14']) {
        process.env.TZ = tz
        fc.assert(
          fc.property(at, fc.integer({ min: -7_200_000, max: 7_200_000 }), ows, ows, (now, delta, before, after) => {
            const when = Math.floor((now + delta) / 1000) * 1000
            expect(retryAfterMs(`${before}${httpDate(when, 'asctime')}${after}`, now), tz).toBe(clamp(when - now))
          }),
          { numRuns: 300 },
        )
        // Nor is any form of the date read in the process's zone: the wait is the same in every one.
        expect(retryAfterMs('Sun Nov  6 08:49:37 1994', Date.UTC(1994, 10, 6, 8, 49, 7)), tz).toBe(30_000)
      }
    } finally {
      if (zone === undefined) delete process.env.TZ
      else process.env.TZ = zone
    }
  })

  it('a date that is no HTTP-date (ISO 8601, a zone-less date Date.parse reads in the process\'s time zone) is undefined, as any other value that is neither', () => {
    for (const value of ['2026-01-01T00:00:30', '2026-01-01T00:00:30Z', '2026/01/01 00:00:30', 'Jan 1 2026 00:00:30', 'Thu, 01 Jan 2026 00:00:30']) {
      expect(retryAfterMs(value, Date.UTC(2026, 0, 1)), value).toBeUndefined()
    }
  })

  it('the same HTTP-date read later never asks for a longer wait', () => {
    fc.assert(
      fc.property(at, fc.integer({ min: -7_200_000, max: 7_200_000 }), fc.nat(7_200_000), fc.constantFrom('imf' as const, 'rfc850' as const), (now, delta, elapsed, format) => {
        const value = httpDate(Math.floor((now + delta) / 1000) * 1000, format)
        const first = retryAfterMs(value, now)!
        const second = retryAfterMs(value, now + elapsed)!
        expect(second).toBeLessThanOrEqual(first)
        expect(first - second).toBeLessThanOrEqual(elapsed)
      }),
      RUNS,
    )
  })

  it('a value without a digit (no seconds, no date) is undefined', () => {
    const noDigit = fc.oneof(
      fc.constantFrom('Sun', 'Sunday', 'Nov', 'GMT', ', ', '-', ':', ' ', 'now', 'soon', 'later', 'Infinity', 'NaN', 'T', 'Z', 'e'),
      fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)).filter((c) => !/[0-9]/.test(c)),
    )
    fc.assert(
      fc.property(fc.string({ unit: noDigit, maxLength: 12 }), at, (value, now) => {
        expect(retryAfterMs(value, now)).toBeUndefined()
      }),
      RUNS,
    )
  })
})
