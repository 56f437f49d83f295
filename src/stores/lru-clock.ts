/**
 * `lru-cache` options for an injected clock, shared by the stores that keep entries in
 * process (the in-memory stores, the local cache in front of the Redis cache).
 * @module
 */

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
