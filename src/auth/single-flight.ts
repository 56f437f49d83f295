/**
 * Single flight: concurrent callers with the same key share one in-flight promise (spec 5.1
 * step 6: the first request with a new token is validated upstream once, however many arrive
 * together).
 * @module
 */

/** Shares in-flight work by key. */
export interface SingleFlight<T> {
  /**
   * Runs `work` unless a call with the same `key` is in flight, in which case its promise is
   * shared. `joined` tells the caller which happened.
   */
  run(key: string, work: () => Promise<T>): { promise: Promise<T>; joined: boolean }
  /** Whether a call with this key is in flight. */
  has(key: string): boolean
  /** Keys in flight now. */
  readonly size: number
}

/**
 * Creates a single-flight group. Keys must not be secrets (use a hash).
 *
 * @example
 * ```ts
 * const flights = createSingleFlight<Result>()
 * const { promise } = flights.run(tokenHash, () => callUserinfo(token))
 * ```
 */
export function createSingleFlight<T>(): SingleFlight<T> {
  const inFlight = new Map<string, Promise<T>>()
  return {
    run(key, work) {
      const current = inFlight.get(key)
      if (current) return { promise: current, joined: true }
      const promise = (async () => {
        try {
          return await work()
        } finally {
          inFlight.delete(key)
        }
      })()
      inFlight.set(key, promise)
      return { promise, joined: false }
    },
    has(key) {
      return inFlight.has(key)
    },
    get size() {
      return inFlight.size
    },
  }
}
