/**
 * Fixed-window rate-limit math (spec section 7 429 body, section 8), as pure functions.
 * A store counts; these functions decide. Time is always passed in, never read.
 * @module
 */

/** Window names and their length in milliseconds. `minute` is the one the spec shows. */
export const WINDOWS = {
  second: 1_000,
  minute: 60_000,
  hour: 3_600_000,
  day: 86_400_000,
} as const

/** A window name of {@link WINDOWS}. */
export type WindowType = keyof typeof WINDOWS

/** A limit: `limit` requests per `windowType` window. */
export interface RateLimitPolicy {
  /** Requests allowed per window: a whole number from 0 (every request refused) to {@link MAX_RATE_LIMIT}. */
  readonly limit: number
  /** The window: `second`, `minute` (the spec's), `hour` or `day`. */
  readonly windowType: WindowType
}

/**
 * Start (ms) of the fixed window that contains `now`: windows are aligned to the epoch, so
 * every instance computes the same one.
 *
 * @example
 * ```ts
 * windowStart(1_700_000_123_456, WINDOWS.minute) // 1_700_000_100_000
 * ```
 */
export function windowStart(now: number, windowMs: number): number {
  return now - (((now % windowMs) + windowMs) % windowMs)
}

/**
 * Whether a window whose counting began `livedMs` ago (on a monotonic clock, or an injected
 * one) still takes what a wall clock stepped back across its start stamps with an earlier
 * window: for one window of that time, so a step back does not give a fresh limit (and another
 * when the clock catches up); after that, or for a step back of more than a window, a new
 * window starts, rather than refusing for the size of the step. The memory rate-limit store and
 * the per-address budgets share it.
 * @internal
 */
export function windowStillCounts(livedMs: number, windowMs: number): boolean {
  return livedMs < windowMs && livedMs > -windowMs
}

/** Result of one rate-limit decision. A value, never an exception. */
export interface RateLimitResult {
  /** `true` when the request may proceed. */
  readonly success: boolean
  /** Requests allowed per window (the policy's `limit`): the 429 body's `limit`. */
  readonly limit: number
  /** Requests left in the window after this one (never below 0). */
  readonly remaining: number
  /** End of the window, epoch milliseconds. */
  readonly reset: number
  /** `reset` as Unix seconds, rounded up: the 429 body's `resetAt`. */
  readonly resetAt: number
  /** Whole seconds until the window ends, at least 1: the 429 body's `retryAfter`. */
  readonly retryAfter: number
  /** The window counted in (the policy's): the 429 body's `windowType`. */
  readonly windowType: WindowType
}

/**
 * Decides from the count of requests in the window, this one included.
 *
 * @example
 * ```ts
 * const now = 1_700_000_129_500
 * const start = windowStart(now, WINDOWS.minute) // 1_700_000_100_000
 * rateLimitDecision(61, { limit: 60, windowType: 'minute' }, start + 60_000, now)
 * // { success: false, limit: 60, remaining: 0, reset: 1_700_000_160_000, resetAt: 1_700_000_160,
 * //   retryAfter: 31, windowType: 'minute' }
 * ```
 */
export function rateLimitDecision(
  count: number,
  policy: RateLimitPolicy,
  reset: number,
  now: number,
): RateLimitResult {
  const msLeft = Math.max(0, reset - now)
  return {
    success: count <= policy.limit,
    limit: policy.limit,
    remaining: Math.max(0, policy.limit - count),
    reset,
    resetAt: Math.ceil(reset / 1000),
    retryAfter: Math.max(1, Math.ceil(msLeft / 1000)),
    windowType: policy.windowType,
  }
}

/**
 * IETF `RateLimit` and `RateLimit-Policy` header fields
 * (draft-ietf-httpapi-ratelimit-headers): `"minute";q=60;w=60` and `"minute";r=12;t=31`.
 *
 * @example
 * ```ts
 * const result = rateLimitDecision(13, { limit: 60, windowType: 'minute' }, 1_700_000_160_000, 1_700_000_129_500)
 * rateLimitHeaders(result)
 * // { 'ratelimit-policy': '"minute";q=60;w=60', ratelimit: '"minute";r=47;t=31' }
 * ```
 */
export function rateLimitHeaders(result: RateLimitResult): Record<string, string> {
  return { 'ratelimit-policy': rateLimitPolicyValue(result), ratelimit: rateLimitValue(result) }
}

/** The `RateLimit-Policy` value of a policy: the same for every request under it. */
export function rateLimitPolicyValue(policy: RateLimitPolicy): string {
  return `"${policy.windowType}";q=${policy.limit};w=${WINDOWS[policy.windowType] / 1000}`
}

/** The `RateLimit` value of one decision. */
export function rateLimitValue(result: RateLimitResult): string {
  return `"${result.windowType}";r=${result.remaining};t=${result.retryAfter}`
}

/**
 * `seconds` as `Retry-After` takes it (RFC 9110 section 10.2.3: a whole number) and the spec's
 * `retryAfter` says it (at least 1): rounded up, and 1 for anything that is no positive
 * number up to 2^53 - 1 (`NaN`, `undefined`, `0`, negative, `Infinity`), so a validator or
 * store of the platform's own can never put `Retry-After: NaN` on the wire. Internal: not
 * exported by the package.
 */
export function wholeSeconds(seconds: number): number {
  return typeof seconds === 'number' && seconds > 1 && seconds <= Number.MAX_SAFE_INTEGER ? Math.ceil(seconds) : 1
}

/**
 * The `RateLimit` fields of a 429 for a client address that spent its budget of tokens that
 * could not be verified (`unknownTokenBudget`, `clientBudget`): a policy named `"unverified"`,
 * so a client can tell it from the App's own limit, whose body it shares.
 */
export function unverifiedBudgetHeaders(spent: { limit: number; retryAfter: number; windowType: WindowType }): Record<string, string> {
  return {
    'ratelimit-policy': `"unverified";q=${spent.limit};w=${WINDOWS[spent.windowType] / 1000}`,
    ratelimit: `"unverified";r=0;t=${wholeSeconds(spent.retryAfter)}`,
  }
}

/**
 * The highest limit a policy may have: the largest integer a structured field carries
 * (RFC 9651 section 3.3.1, 15 digits), so `q=` and `r=` stay valid header values.
 */
export const MAX_RATE_LIMIT = 999_999_999_999_999

/** Throws a `TypeError` unless `policy` is a usable limit. */
export function assertRateLimitPolicy(policy: RateLimitPolicy, where = 'rate limit'): void {
  if (!Number.isSafeInteger(policy.limit) || policy.limit < 0 || policy.limit > MAX_RATE_LIMIT) {
    throw new TypeError(`mcp-dispatch: ${where} must have an integer limit from 0 to ${MAX_RATE_LIMIT}, got ${typeof policy.limit === 'number' ? policy.limit : `a value of type ${typeof policy.limit}`}`)
  }
  if (!Object.hasOwn(WINDOWS, policy.windowType)) {
    throw new TypeError(`mcp-dispatch: ${where} windowType must be one of ${Object.keys(WINDOWS).join(', ')}`)
  }
}
