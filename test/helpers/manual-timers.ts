import type { DispatcherTimers } from 'mcp-dispatch'

/** An interval set on {@link manualTimers}: what it calls, its period and when it is next due. */
export interface ManualInterval {
  callback: () => void
  /** Its period, as `setInterval` was given it (as Node takes it: below 1, above 2^31 - 1 or NaN is 1). */
  ms: number
  /** The clock's time of its next call. */
  due: number
}

/** Node's `setInterval`'s reading of a period: below 1, above 2^31 - 1 or not a number is 1 ms. */
const nodePeriod = (ms: number) => (ms >= 1 && ms <= 2 ** 31 - 1 ? ms : 1)

const settle = async () => {
  for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve))
}

/**
 * The dispatcher's interval timers (`timers`: its pins' keep-alive, its checks of open
 * responses) fired by hand, with the clock (`now`) they run on: a test says when time passes
 * (`tick`), so what a timer does comes before what the test does next, however loaded the
 * machine. Each interval keeps the period it was set with and fires only when that much of the
 * clock has passed, so a test that ticks through a TTL checks the dispatcher's own periods (a
 * keep-alive set too rarely lets the pin expire), not a fake's.
 *
 * `start`: the clock's time to begin with. `tickMs`: how far `tick()` moves it when not told.
 */
export function manualTimers({ start = Date.now(), tickMs }: { start?: number; tickMs: number }) {
  let clock = start
  let next = 1
  const active = new Map<number, ManualInterval>()
  const timers: DispatcherTimers = {
    setInterval(callback, ms) {
      const id = next++
      const period = nodePeriod(ms)
      active.set(id, { callback, ms: period, due: clock + period })
      return id
    },
    clearInterval(handle) {
      active.delete(handle as number)
    },
  }
  /**
   * `ms` pass: every interval due by then fires, once for each of its periods that ended, in the
   * order they came due (ties in the order set), the clock at each call's due time and what the
   * call started left to settle before the next; then the clock is at the end. An interval
   * cleared by an earlier call does not fire; one set by a call fires if due within `ms`. More
   * than 10,000 calls in one tick (a period far shorter than the test expects, or one Node reads
   * as 1 ms) throw rather than keep the test busy.
   */
  const tick = async (ms = tickMs) => {
    const end = clock + ms
    for (let calls = 0; ; calls++) {
      let first: [number, ManualInterval] | undefined
      for (const entry of active) if (entry[1].due <= end && (first === undefined || entry[1].due < first[1].due)) first = entry
      if (first === undefined) break
      const [, interval] = first
      if (calls === 10_000) throw new Error(`manualTimers: more than 10,000 calls in a tick of ${ms} ms (an interval of ${interval.ms} ms)`)
      clock = interval.due
      interval.due += interval.ms
      interval.callback()
      await settle()
    }
    clock = end
    await settle()
  }
  return { timers, tick, now: () => clock, active: active as ReadonlyMap<number, ManualInterval> }
}
