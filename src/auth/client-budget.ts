/**
 * A per-client-address budget of upstream token validations (`createOAuthValidator`'s
 * `clientBudget`), and of store lookups of unknown API tokens (`createTokenService`'s
 * `unknownTokenBudget`).
 *
 * Every bearer string that is not an API token goes to the OAuth validator, and one that is
 * not cached costs an upstream call. Random strings are never cached twice, so without a
 * bound one client could drive the authorization server as hard as it can send requests,
 * until the server throttles (429) or fails and the circuit breaker, which every caller
 * shares, opens for all new tokens. The budget counts, per client address and fixed window,
 * the upstream validations in flight or ended in a refusal; an accepted token (or a failure
 * of the server's own) gives its unit back, so clients whose tokens are good are never held
 * up. IPv6 addresses count by their /64, which one host usually holds whole.
 * @module
 */
import { LRUCache } from 'lru-cache'
import { entriesOption } from '../stores/lru-clock.js'
import { type IpWords, parseIp } from '../core/ip.js'
import { sha256 } from '../core/sha256.js'
import { MAX_RATE_LIMIT, WINDOWS, type WindowType, windowStart, windowStillCounts } from '../core/rate-limit.js'
import { ConfigurationError, TooManyValidationsError, optionNames, refuseUnknownOptions } from '../errors.js'

/** Options of the client budget. */
export interface ClientBudgetOptions {
  /**
   * Units per client address and window: upstream validations in flight or refused (OAuth,
   * default 60), or store lookups of tokens not known to be stored (API tokens, default 600).
   */
  readonly limit?: number | undefined
  /** The window. Default `minute`. */
  readonly windowType?: WindowType | undefined
  /** Client addresses remembered at most (least recently used forgotten first). Default 10,000. */
  readonly maxClients?: number | undefined
}

/** A charge taken from a client's budget; `refund` gives it back (at most once). */
export interface BudgetCharge {
  refund(): void
}

/** The budget of one validator. */
export interface ClientBudget {
  /**
   * Takes one unit from the client's budget, or throws {@link TooManyValidationsError} when
   * the window's units are spent. A request without a known client address is not counted.
   */
  charge(clientAddress: string | undefined): BudgetCharge
}

interface Window {
  start: number
  used: number
  /** When it began, on the `elapsed` clock ({@link BudgetClocks}). */
  began: number
}

const NO_CHARGE: BudgetCharge = Object.freeze({ refund() {} })

/**
 * The key a client address counts under: IPv4 whole, IPv6 by its /64. Text that is no address
 * (a platform's own label, or what a client put in `X-Forwarded-For` where it picks the hop
 * taken) counts under its hash, apart from every address's key: a key is 45 characters at most
 * and holds nothing of the text, so made-up hops cannot fill the budget's memory by their
 * length (kept as given, 10,000 hops of 15 kB held about 150 MB; a short hop kept as given held the
 * whole header it was cut from).
 */
export function budgetKey(address: string): string {
  const words: IpWords | null = parseIp(address)
  if (!words) return `#:${sha256(address, 'base64url')}`
  if (words[0] === 0 && words[1] === 0 && words[2] === 0xffff) return `4:${words[3]}`
  return `6:${words[0]}:${words[1]}`
}

const BUDGET_OPTIONS = optionNames<ClientBudgetOptions>({ limit: true, windowType: true, maxClients: true })

/**
 * The clocks of a budget: `now`, the wall clock its windows start on (minutes, hours, days);
 * `elapsed`, the one how long a window has lived is read on (monotonic, unless the caller's
 * clock is injected), so a wall clock stepped back across a window's start keeps counting
 * against the window it left ({@link windowStillCounts}; a step back of half a second once
 * gave a fresh budget, and another when the clock caught up).
 */
export interface BudgetClocks {
  readonly now: () => number
  readonly elapsed: () => number
}

/**
 * Creates a client budget; `false` creates one that never refuses. `name`: the option, for
 * errors; `defaultLimit`: the limit when the options name none.
 */
export function createClientBudget(
  options: ClientBudgetOptions | false | undefined,
  { now, elapsed }: BudgetClocks,
  name = 'clientBudget',
  defaultLimit = 60,
): ClientBudget {
  if (options === false) return { charge: () => NO_CHARGE }
  if (options !== undefined && (options === null || typeof options !== 'object')) {
    throw new ConfigurationError(name, 'must be an object or false')
  }
  if (options !== undefined) refuseUnknownOptions(options, BUDGET_OPTIONS, `the ${name} option`, undefined, `${name}.`)
  const limit = options?.limit ?? defaultLimit
  // At most what a structured-field integer carries: the limit goes into the 429's RateLimit fields.
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_RATE_LIMIT) {
    throw new ConfigurationError(`${name}.limit`, `must be an integer from 1 to ${MAX_RATE_LIMIT}`)
  }
  const windowType = options?.windowType ?? 'minute'
  if (!Object.hasOwn(WINDOWS, windowType)) {
    throw new ConfigurationError(`${name}.windowType`, `must be one of ${Object.keys(WINDOWS).join(', ')}`)
  }
  const maxClients = entriesOption(options?.maxClients, 10_000, `${name}.maxClients`)
  const windowMs = WINDOWS[windowType]
  const windows = new LRUCache<string, Window>({ max: maxClients })
  /** A window later than the clock's (it stepped back across the window's start) that still counts. */
  const steppedBack = (window: Window, start: number) => window.start > start && windowStillCounts(elapsed() - window.began, windowMs)

  return {
    charge(clientAddress) {
      // `null` too: a platform's JavaScript passing what a header lookup gave.
      if (!clientAddress) return NO_CHARGE
      const key = budgetKey(clientAddress)
      const at = now()
      const start = windowStart(at, windowMs)
      let window = windows.get(key)
      if (window === undefined || (window.start !== start && !steppedBack(window, start))) {
        window = { start, used: 0, began: elapsed() }
        windows.set(key, window)
      }
      if (window.used >= limit) {
        const reset = window.start + windowMs
        throw new TooManyValidationsError({
          limit,
          resetAt: Math.ceil(reset / 1000),
          retryAfter: Math.max(1, Math.ceil((reset - at) / 1000)),
          windowType,
        })
      }
      window.used++
      const charged = window
      let refunded = false
      return {
        refund() {
          if (refunded) return
          refunded = true
          // A unit of a window that has ended is not given back to the next one.
          if (charged.used > 0) charged.used--
        },
      }
    },
  }
}
