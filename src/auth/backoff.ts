/**
 * Exponential backoff with jitter, as a pure function (spec 5.1 step 8: transient errors are
 * retried with backoff).
 * @module
 */

/** Retry policy for transient upstream failures (network, timeout, 5xx, 429). */
export interface RetryOptions {
  /** Most attempts per validation, the first included. Default 3; 1 disables retries. */
  attempts?: number | undefined
  /** Delay before the first retry, before jitter. Default 100 ms. */
  baseDelayMs?: number | undefined
  /** Upper bound of any delay. Default 2 s. */
  maxDelayMs?: number | undefined
  /**
   * Budget for one validation, attempts and delays included. No retry starts (and no attempt
   * outlives it) once it is spent. Default 10 s.
   */
  deadlineMs?: number | undefined
}

/** {@link RetryOptions} with every default filled in. */
export type ResolvedRetryOptions = Required<RetryOptions>

/** Defaults of {@link RetryOptions}. */
export const DEFAULT_RETRY: ResolvedRetryOptions = Object.freeze({
  attempts: 3,
  baseDelayMs: 100,
  maxDelayMs: 2_000,
  deadlineMs: 10_000,
})

/**
 * The delay before retry number `retry` (1 for the first retry): exponential growth capped at
 * `maxDelayMs`, with "equal jitter" (half fixed, half random), so delays grow for sure and
 * concurrent callers still spread out. Whole milliseconds, never above `maxDelayMs`, finite for
 * any retry number; a draw of `random` outside [0, 1] (or NaN) counts as its nearer end (0).
 *
 * @example
 * ```ts
 * computeBackoff(1, { baseDelayMs: 100, maxDelayMs: 2000 }, () => 0) // 50
 * computeBackoff(3, { baseDelayMs: 100, maxDelayMs: 2000 }, () => 1) // 400
 * ```
 */
export function computeBackoff(
  retry: number,
  options: { baseDelayMs: number; maxDelayMs: number },
  random: () => number = Math.random,
): number {
  const { baseDelayMs: base, maxDelayMs: max } = options
  // A zero base stays zero (`0 * 2 ** 1024` is NaN); a huge retry number reaches the cap.
  const ceiling = base > 0 ? Math.min(max, base * 2 ** Math.max(0, retry - 1)) : 0
  const draw = random()
  const jitter = draw > 0 ? Math.min(1, draw) : 0 // NaN too
  // Rounded, and still within a cap that is not a whole number of milliseconds.
  return Math.min(Math.round(ceiling / 2 + (ceiling / 2) * jitter), Math.floor(max))
}
