/**
 * Waits, if need be, until the wall clock is at least `marginMs` before the end of its current
 * minute: for tests that send a few requests against a real fixed one-minute rate-limit window
 * and expect them counted in one window (a pair straddling the minute's end lands in two, and the
 * second is served instead of refused; seen once under load). Waits at most `marginMs` (plus a
 * few milliseconds).
 */
export async function awayFromMinuteEnd(marginMs = 10_000): Promise<void> {
  const intoMinute = Date.now() % 60_000
  if (intoMinute < 60_000 - marginMs) return
  await new Promise((resolve) => setTimeout(resolve, 60_000 - intoMinute + 20))
}

/**
 * A clock held at the middle of the wall clock's current minute, for a dispatcher (or a token
 * service, whose `unknownTokenBudget` counts on its clock) that several requests go through
 * against a fixed-window rate limit whose count a test reads: on the wall clock a minute can
 * turn between two of them and start a new window (CI once read `r=4;t=60` where `r=3` was
 * due). Held near the present, so what it stamps (a token's creation, a revocation) reads as now.
 */
export function midMinute(): () => number {
  const at = Math.floor(Date.now() / 60_000) * 60_000 + 30_000
  return () => at
}
