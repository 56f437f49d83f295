/**
 * A deadline for a promise, shared by the dispatcher (its `storeTimeoutMs`) and the Redis
 * stores (their per-command `timeoutMs`).
 * @module
 */

/**
 * Settles as `pending` does, or rejects with `Error("<what> did not answer within <ms> ms")`
 * once `ms` have passed, whichever comes first. The timer is cleared as soon as `pending`
 * settles and never keeps a process alive on its own; a late answer after the deadline goes
 * nowhere (a late rejection is not reported as unhandled).
 *
 * @example
 * ```ts
 * const pin = await withTimeout(sessions.get(id, ttl), 1_000, 'sessions')
 * ```
 */
export function withTimeout<T>(pending: Promise<T>, ms: number, what: string): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} did not answer within ${ms} ms`)), ms)
    // Node timers have `unref`; other runtimes return a number, which keeps nothing alive.
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
