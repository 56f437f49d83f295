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
