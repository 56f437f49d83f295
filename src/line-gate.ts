/**
 * The default logger's guard against a line per request or per reconnection: lines of one kind
 * written at most once per interval. Not an entry point.
 * @module
 */

/**
 * A gate for log lines: `gate(kind)` answers how many lines of `kind` it held back since the
 * last one it let through, when one may be written now, else `undefined` (and counts it). One
 * of each kind is let through per `intervalMs` on `now`; the first after a quiet interval at
 * once, and a clock stepped back counts as a quiet interval (a wall clock given as `now` does
 * not silence a kind for as long as it stepped). `always` lets one through whatever the time.
 */
export function lineGate(intervalMs: number, now: () => number = () => performance.now()): (kind: string, always?: boolean) => number | undefined {
  const last = new Map<string, { at: number; held: number }>()
  return (kind, always = false) => {
    const at = now()
    const before = last.get(kind)
    if (!always && before !== undefined && at >= before.at && at - before.at < intervalMs) {
      before.held++
      return undefined
    }
    last.set(kind, { at, held: 0 })
    return before?.held ?? 0
  }
}

/** `context` of a line let through by a {@link lineGate}, naming the lines held back before it. */
export function heldBack(context: string, held: number): string {
  return held === 0 ? context : `${context}; ${held} more since the last line`
}
