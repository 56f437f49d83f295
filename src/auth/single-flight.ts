/**
 * Single flight: concurrent callers with the same key share one in-flight promise (spec 5.1
 * step 6: the first request with a new token is validated upstream once, however many arrive
 * together).
 * @module
 */
import { MAX_TIMER_MS, withTimeout } from '../timeout.js'

/** Shares in-flight work by key. */
export interface SingleFlight<T> {
  /**
   * Runs `work` unless a call with the same `key` is in flight, in which case its promise is
   * shared. `joined` tells the caller which happened.
   */
  run(key: string, work: () => Promise<T>): { promise: Promise<T>; joined: boolean }
  /** Whether a call with this key is in flight (and not older than `maxAgeMs`). */
  has(key: string): boolean
  /** Keys in flight now, those past `maxAgeMs` included until {@link SingleFlight.prune}. */
  readonly size: number
  /** Forgets the calls older than `maxAgeMs`. */
  prune(): void
}

/** Options of {@link createSingleFlight}. */
export interface SingleFlightOptions {
  /** Clock, ms. Default a monotonic clock (`performance.now`), which a wall clock stepped back cannot stretch. */
  now?: (() => number) | undefined
  /**
   * The longest a call can last. One older is taken for lost (below): not joined, not counted
   * once pruned. Default: no limit.
   */
  maxAgeMs?: number | undefined
}

type Outcome<T> = { readonly ok: true; readonly value: T } | { readonly ok: false; readonly error: unknown }

interface Flight<T> {
  /** Settles as the work did, and never rejects: a rejection comes from the runtime alone. */
  readonly outcome: Promise<Outcome<T>>
  readonly since: number
}

const unwrap = <T>(outcome: Outcome<T>): T => {
  if (outcome.ok) return outcome.value
  throw outcome.error
}

/**
 * Creates a single-flight group. Keys must not be secrets (use a hash).
 *
 * A call can be lost where a runtime ties work to the request that started it: Cloudflare
 * Workers cancel a request's I/O when it ends, and the promise of its work then never settles
 * (workerd rejects it in the requests that wait on it; older workerd builds, and compatibility dates
 * before 2024-10-14, leave them waiting for ever). A caller that joined such a call runs the work
 * itself (later callers join it) when it is rejected or has not settled `maxAgeMs` after it
 * began, and a call older than `maxAgeMs` is not joined.
 *
 * @example
 * ```ts
 * const flights = createSingleFlight<Result>({ maxAgeMs: 15_000 })
 * const { promise } = flights.run(tokenHash, () => callUserinfo(token))
 * ```
 */
export function createSingleFlight<T>(options: SingleFlightOptions = {}): SingleFlight<T> {
  const now = options.now ?? (() => performance.now())
  const maxAgeMs = options.maxAgeMs ?? Infinity
  const inFlight = new Map<string, Flight<T>>()

  function lead(key: string, work: () => Promise<T>): Promise<T> {
    const flight: { outcome: Promise<Outcome<T>>; since: number } = { outcome: undefined!, since: now() }
    // In the map before the work starts: work that fails at once must find itself there to leave.
    inFlight.set(key, flight)
    flight.outcome = (async (): Promise<Outcome<T>> => {
      try {
        return { ok: true, value: await work() }
      } catch (error) {
        return { ok: false, error }
      } finally {
        // A call taken for lost may still end (a slow one): the one that replaced it stays.
        if (inFlight.get(key) === flight) inFlight.delete(key)
      }
    })()
    return flight.outcome.then(unwrap)
  }

  /**
   * Waits for `current`, a call another caller leads, and does the work itself where that call
   * was lost: rejected by the runtime (its request ended), or not settled within `maxAgeMs` of
   * its start (a runtime that leaves it pending for ever). The wait is timed on this caller's own
   * timer, which lives as long as this caller's request does.
   */
  function join(key: string, work: () => Promise<T>, current: Flight<T>): Promise<T> {
    const takeOver = () => {
      if (inFlight.get(key) === current) inFlight.delete(key)
      return group.run(key, work).promise
    }
    const waited =
      maxAgeMs === Infinity
        ? current.outcome
        : withTimeout(current.outcome, Math.min(Math.max(0, current.since + maxAgeMs - now()) + 1, MAX_TIMER_MS), 'a shared call')
    // The work's own failure is `unwrap`'s to throw, to every caller alike; only the runtime's
    // rejection, or the wait running out, makes this caller do the work.
    return waited.then(unwrap, takeOver)
  }

  const group: SingleFlight<T> = {
    run(key, work) {
      const current = inFlight.get(key)
      if (current === undefined || now() - current.since > maxAgeMs) return { promise: lead(key, work), joined: false }
      return { promise: join(key, work, current), joined: true }
    },
    has(key) {
      const current = inFlight.get(key)
      return current !== undefined && now() - current.since <= maxAgeMs
    },
    get size() {
      return inFlight.size
    },
    prune() {
      const at = now()
      for (const [key, flight] of inFlight) if (at - flight.since > maxAgeMs) inFlight.delete(key)
    },
  }
  return group
}
