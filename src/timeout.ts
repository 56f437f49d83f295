/**
 * A deadline for a promise, shared by the dispatcher (its `storeTimeoutMs`) and the Redis
 * stores (their per-command `timeoutMs`), and the check of every option that becomes a timer's
 * delay.
 * @module
 */
import { ConfigurationError } from './errors.js'

/**
 * Calls `callback` once the I/O event of the moment has run its course (its ticks and
 * microtasks) and this process has read its sockets: `setImmediate`, where the runtime has it
 * (Node, Bun, Deno 2); a timer of 0 elsewhere (Workers without `nodejs_compat` v2).
 */
export const afterThisTurn: (callback: () => void) => void =
  typeof setImmediate === 'function' ? (callback) => void setImmediate(callback) : (callback) => void setTimeout(callback, 0)

/**
 * How late past its deadline a timer may fire and still count as noticed on time (the event
 * loop was free): later, this process was busy, and an answer may be waiting unread (or a
 * command its client held back until the next turn has only just gone out).
 */
export const NOTICED_LATE_MS = 20

/**
 * Calls `expire` for a deadline whose timer fired `lateMs` after it was due, once this process
 * has read its sockets. Node runs the timers that are due before it reads what came meanwhile,
 * so after its event loop was held (a GC pause, a synchronous parse of a large body, a resumed
 * VM) an answer that came in time may be waiting unread: judged at once, the deadline failed a
 * call that had its answer (a store answered in 1 ms, a request answered 503; five OAuth calls
 * so failed opened the breaker for its cool-down). Noticed on time, `expire` runs after one turn
 * ({@link afterThisTurn}); noticed late, {@link NOTICED_LATE_MS} later and after a turn, the
 * slack a deadline noticed on time has. `expire` itself tells whether the answer came meanwhile
 * (a promise settled before it is not rejected by it).
 */
export function expireOnceRead(lateMs: number, expire: () => void): void {
  if (!(lateMs >= NOTICED_LATE_MS)) {
    afterThisTurn(expire)
    return
  }
  const timer = setTimeout(() => afterThisTurn(expire), NOTICED_LATE_MS)
  ;(timer as { unref?: () => void }).unref?.()
}

/** Longest delay a timer takes (2^31 - 1 ms, about 24.8 days); past it Node fires at once. */
export const MAX_TIMER_MS = 2_147_483_647

/**
 * `value`, an option that becomes a timer's delay, checked: a positive number of milliseconds,
 * at most {@link MAX_TIMER_MS} (a longer one, `Infinity` included, would fire at once, so every
 * deadline would pass at once). Otherwise a `ConfigurationError` naming `option`.
 */
export function timerOption(option: string, value: unknown): number {
  if (typeof value !== 'number' || !(value > 0 && value <= MAX_TIMER_MS)) {
    throw new ConfigurationError(option, `must be a positive number of milliseconds, at most ${MAX_TIMER_MS}`)
  }
  return value
}

/**
 * Whether this runtime runs a request's timers only while the request lives: Cloudflare Workers
 * (their `navigator.userAgent`), where a timer set while one request is served never fires once
 * that request has ended. A timer that must outlive requests is then set per request.
 */
export function timersEndWithRequest(): boolean {
  return (globalThis as { navigator?: { userAgent?: unknown } }).navigator?.userAgent === 'Cloudflare-Workers'
}

/**
 * Settles as `pending` does, or rejects with `Error("<what> did not answer within <ms> ms")`
 * once `ms` have passed, whichever comes first: judged once this process has read its sockets
 * ({@link expireOnceRead}), so an answer that came in time while the event loop was held still
 * counts. The timer is cleared as soon as `pending` settles and never keeps a process alive on
 * its own; a late answer after the deadline goes nowhere (a late rejection is not reported as
 * unhandled).
 *
 * @example
 * ```ts
 * const pin = await withTimeout(sessions.get(id, ttl), 1_000, 'sessions')
 * ```
 */
export function withTimeout<T>(pending: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const due = performance.now() + ms
    const timer = setTimeout(() => expireOnceRead(performance.now() - due, () => reject(new Error(`${what} did not answer within ${ms} ms`))), ms)
    // Node's, Bun's and Deno 2's timers have `unref`; Workers' are numbers, and a Worker's
    // timers never keep anything alive.
    ;(timer as { unref?: () => void }).unref?.()
    pending.then(
      (value) => {
        clearTimeout(timer)
        resolve(value)
      },
      (error: unknown) => {
        clearTimeout(timer)
        reject(error)
      },
    )
  })
}
