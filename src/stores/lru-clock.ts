/**
 * An injected clock: the check of the `now` option, and the `lru-cache` options that read it,
 * shared by the stores that keep entries in process (the in-memory stores, the local cache in
 * front of the Redis cache, the token service's caches) and the dispatcher.
 * @module
 */
import { ConfigurationError } from '../errors.js'

/**
 * The most entries an in-process bound (`max`, `maxPerSubject`, `maxClients`, `localMax`) may
 * name: `lru-cache` allocates its index for all of them up front, so `1e12` threw its own
 * `RangeError` and `1e9` would take gigabytes before the first entry.
 */
const MAX_LRU_ENTRIES = 16_777_216

/**
 * An in-process bound (`max`, `maxClients`…): an integer from 1 to {@link MAX_LRU_ENTRIES} (0
 * would mean unbounded to `lru-cache`), or `fallback` when absent (`undefined` or `null`).
 *
 * @throws {ConfigurationError} naming `option` otherwise.
 * @internal
 */
export function entriesOption(value: unknown, fallback: number, option: string): number {
  if (value == null) return fallback
  if (!Number.isSafeInteger(value) || (value as number) < 1 || (value as number) > MAX_LRU_ENTRIES) {
    throw new ConfigurationError(option, `must be an integer from 1 to ${MAX_LRU_ENTRIES}`)
  }
  return value as number
}

/**
 * The `now` option, checked when a store or service is made: a function, or absent. Taken as it
 * is, a number (`Date.now()` for `Date.now`) would throw at every use, which the callers treat
 * as a store failing: a rate limit served unlimited, an OAuth token asked about every time.
 *
 * @throws {ConfigurationError} naming `now` when it is given and is not a function.
 */
export function clockOption<C extends () => number>(now: C | undefined): C | undefined {
  if (now !== undefined && typeof now !== 'function') throw new ConfigurationError('now', 'must be a function answering epoch ms')
  return now
}

/**
 * The `perf` and `ttlResolution` options that make `lru-cache` read `now` on every check, or
 * nothing (its own clock) when `now` is absent.
 *
 * lru-cache reuses a clock reading for `ttlResolution` ms of real time (default 1), so an
 * injected clock that jumps would not be seen: read it on every check instead. It also treats
 * a start time of 0 as "no TTL", so a clock that starts at 0 is shifted by 1 ms (differences,
 * and so TTLs, are unchanged).
 */
export function lruClock(now: (() => number) | undefined): { perf?: { now: () => number }; ttlResolution?: number } {
  return now ? { perf: { now: () => now() + 1 }, ttlResolution: 0 } : {}
}
