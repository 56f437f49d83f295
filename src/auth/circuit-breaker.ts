/**
 * A circuit breaker for calls to the authorization server (spec 5.1 step 8).
 *
 * `closed` lets every call through and counts consecutive failures; after `failureThreshold`
 * of them it turns `open` and refuses calls for `coolDownMs`; then the next caller gets a
 * single probe (`half-open`) while everyone else is still refused; the probe's success closes
 * the breaker, its failure opens it for another cool-down. Time comes from an injected clock,
 * so the breaker never owns a timer.
 *
 * A call reports with the permit it was given, so an answer that arrives after the breaker
 * changed state (a slow call let through before it opened) is not taken for news of the
 * server's health now: its success does not close an open breaker without the cool-down and
 * the probe, and its failure does not reopen a half-open one while the probe is out.
 * @module
 */
import { ignoreRejection } from '../core/thenable.js'
import { ConfigurationError, optionNames, refuseUnknownOptions } from '../errors.js'

/** State of a {@link CircuitBreaker}. */
export type BreakerState = 'closed' | 'open' | 'half-open'

/** A state change, as reported to `onStateChange`. */
export interface BreakerStateChange {
  /** The state it left. */
  readonly from: BreakerState
  /** The state it is in now. */
  readonly to: BreakerState
  /** When it happened, epoch ms (the injected clock). */
  readonly at: number
}

/** Options of {@link createCircuitBreaker}. */
export interface CircuitBreakerOptions {
  /** Consecutive failures that open the breaker. Default 5. */
  failureThreshold?: number | undefined
  /** How long an open breaker refuses calls before it lets one probe through. Default 30 s. */
  coolDownMs?: number | undefined
  /**
   * The longest a half-open probe can last before another is let through: one older is taken
   * for lost, as on runtimes that end a request's I/O with it (Cloudflare Workers), where a
   * probe whose request ended first never reports, and would leave the breaker refusing every
   * call for good. Default: no limit. The OAuth validator sets its `retry.deadlineMs` plus
   * `timeoutMs`, which no probe outlasts elsewhere.
   */
  probeMaxAgeMs?: number | undefined
  /**
   * Clock, epoch ms. Default: a monotonic clock for the cool-down and the probe's age, so a wall
   * clock stepped back cannot keep the breaker open longer, and `Date.now` for the `at` of
   * state changes.
   */
  now?: (() => number) | undefined
  /**
   * Called on every transition (metrics, logs). Exceptions it throws are ignored, and so is the
   * rejection of a promise it returns (an `async` function).
   */
  onStateChange?: ((change: BreakerStateChange) => void) | undefined
}

/** The answer of {@link CircuitBreaker.acquire}. */
export type BreakerPermit =
  | { readonly allowed: true; /** `true` for the single half-open probe. */ readonly probe: boolean }
  | { readonly allowed: false; /** Milliseconds until a call may be let through again. */ readonly retryAfterMs: number }

/**
 * A circuit breaker. Every allowed call must be followed by `success(permit)` or
 * `failure(permit)`, with the permit `acquire()` gave it.
 */
export interface CircuitBreaker {
  /** Current state; an open breaker whose cool-down is over reads as `half-open`. */
  readonly state: BreakerState
  /** Asks to make one call. */
  acquire(): BreakerPermit
  /**
   * The call got an answer that shows the server is healthy. With its `permit` (the object
   * `acquire()` returned, not a copy), the report is ignored if the breaker changed state since
   * the permit was given (a call that was under way when it opened, or closed); without one,
   * it is taken as current.
   */
  success(permit?: BreakerPermit): void
  /**
   * The call failed in a way that counts against the server (network, timeout, 5xx). With its
   * `permit`, ignored if the breaker changed state since the permit was given.
   */
  failure(permit?: BreakerPermit): void
  /** Milliseconds until an open breaker lets a probe through (0 when not open). */
  retryAfterMs(): number
}

/** Default consecutive failures before the breaker opens. */
export const DEFAULT_FAILURE_THRESHOLD = 5
/** Default cool-down of an open breaker. */
export const DEFAULT_COOL_DOWN_MS = 30_000
/** What a caller is told to wait while the half-open probe is under way. */
const PROBE_RETRY_AFTER_MS = 1_000

const BREAKER_OPTIONS = optionNames<CircuitBreakerOptions>({ failureThreshold: true, coolDownMs: true, probeMaxAgeMs: true, now: true, onStateChange: true })

/**
 * Creates a circuit breaker on an injected clock.
 *
 * @example
 * ```ts
 * const breaker = createCircuitBreaker({ failureThreshold: 3, coolDownMs: 10_000, onStateChange: console.log })
 * const permit = breaker.acquire()
 * if (!permit.allowed) throw new AuthorizationServerUnavailableError(Math.ceil(permit.retryAfterMs / 1000))
 * try { await call(); breaker.success(permit) } catch (e) { breaker.failure(permit); throw e }
 * ```
 *
 * @throws {ConfigurationError} with a `failureThreshold` that is not a positive integer, a
 * negative `coolDownMs`, a `probeMaxAgeMs` that is not positive, or a `now` or `onStateChange`
 * that is not a function (named `breaker.…`, as the OAuth validator's `breaker` option passes
 * them).
 */
export function createCircuitBreaker(options: CircuitBreakerOptions = {}): CircuitBreaker {
  if (options === null || typeof options !== 'object') throw new ConfigurationError('breaker', 'must be an object')
  refuseUnknownOptions(options, BREAKER_OPTIONS, 'createCircuitBreaker', undefined, 'breaker.')
  const threshold = options.failureThreshold ?? DEFAULT_FAILURE_THRESHOLD
  const coolDownMs = options.coolDownMs ?? DEFAULT_COOL_DOWN_MS
  if (!Number.isInteger(threshold) || threshold < 1) {
    throw new ConfigurationError('breaker.failureThreshold', 'must be a positive integer')
  }
  if (typeof coolDownMs !== 'number' || !(coolDownMs >= 0) || !Number.isFinite(coolDownMs)) {
    throw new ConfigurationError('breaker.coolDownMs', 'must be a non-negative number of milliseconds')
  }
  for (const fn of ['now', 'onStateChange'] as const) {
    if (options[fn] !== undefined && typeof options[fn] !== 'function') throw new ConfigurationError(`breaker.${fn}`, 'must be a function')
  }
  const now = options.now ?? (() => performance.now())
  const wallClock = options.now ?? Date.now
  const onStateChange = options.onStateChange

  let state: BreakerState = 'closed'
  let failures = 0
  let openedAt = 0
  let probing = false
  let probeAt = 0
  const probeMaxAgeMs = options.probeMaxAgeMs ?? Infinity
  if (typeof probeMaxAgeMs !== 'number' || !(probeMaxAgeMs > 0)) throw new ConfigurationError('breaker.probeMaxAgeMs', 'must be a positive number of milliseconds')

  // Counts the state changes: a permit carries the count at which it was given (`issued`).
  let generation = 0
  const issued = new WeakMap<BreakerPermit, number>()
  const permit = (probe: boolean): BreakerPermit => {
    const given = { allowed: true, probe } as const
    issued.set(given, generation)
    return given
  }
  /**
   * A report of a call given its permit before the last state change. A permit this breaker
   * did not give (a copy) counts as no permit: taken as current, never silently ignored.
   */
  const stale = (given: BreakerPermit | undefined) => {
    const at = given === undefined ? undefined : issued.get(given)
    return at !== undefined && at !== generation
  }

  function move(to: BreakerState): void {
    if (to === state) return
    generation++
    const from = state
    state = to
    try {
      // An async observer's rejection too: ignored, not left unhandled (which ends a Node process).
      ignoreRejection(onStateChange?.({ from, to, at: wallClock() }))
    } catch {
      // Metrics must never break validation.
    }
  }

  function open(): void {
    openedAt = now()
    probing = false
    move('open')
  }

  function remaining(): number {
    return Math.max(0, openedAt + coolDownMs - now())
  }

  return {
    get state() {
      return state === 'open' && remaining() === 0 ? 'half-open' : state
    },
    acquire() {
      if (state === 'closed') return permit(false)
      if (state === 'open') {
        const wait = remaining()
        if (wait > 0) return { allowed: false, retryAfterMs: wait }
        move('half-open')
      }
      if (probing && !(now() - probeAt > probeMaxAgeMs)) return { allowed: false, retryAfterMs: PROBE_RETRY_AFTER_MS }
      probing = true
      probeAt = now()
      return permit(true)
    },
    success(given) {
      if (stale(given)) return
      failures = 0
      probing = false
      move('closed')
    },
    failure(given) {
      if (stale(given)) return
      if (state === 'half-open') return open()
      if (state === 'open') return
      failures += 1
      if (failures >= threshold) {
        failures = 0
        open()
      }
    },
    retryAfterMs() {
      return state === 'open' ? remaining() : 0
    },
  }
}
