/**
 * Error classes of mcp-dispatch.
 *
 * Every error the library throws on purpose extends {@link DispatchError}, which carries a
 * stable string `code`, the HTTP `status` an adapter should answer with, and the JSON-RPC
 * `rpcCode` of the body. Adapters only serialize; they never decide.
 *
 * Misconfiguration (bad options at construction) throws {@link ConfigurationError}, a coded
 * `TypeError`, when the middleware is created. What only a running system can tell (an
 * unusable signing key, a pooler sharing PostgreSQL connections, an Express mount path the
 * token API's `basePath` misses) is told by the first call that meets it, with the same class.
 *
 * @example
 * ```ts
 * try {
 *   await tokens.update(userId, id, { allowedIps: ['10.0.0.0/33'] })
 * } catch (err) {
 *   if (err instanceof InvalidInputError) {
 *     // err.code === 'ERR_INVALID_INPUT', err.status === 400, err.field === 'allowedIps.0'
 *   }
 * }
 * ```
 * @module
 */
import type { WindowType } from './core/rate-limit.js'

/** Stable codes of the errors thrown by mcp-dispatch. */
export type DispatchErrorCode =
  | 'ERR_INVALID_INPUT'
  | 'ERR_NOT_FOUND'
  | 'ERR_FORBIDDEN'
  | 'ERR_UNAUTHORIZED'
  | 'ERR_CSRF'
  | 'ERR_TOKEN_INACTIVE'
  | 'ERR_CONFLICT'
  | 'ERR_DEPLOY_REFUSED'
  | 'ERR_STORE_UNAVAILABLE'
  | 'ERR_AUTHORIZATION_SERVER_UNAVAILABLE'
  | 'ERR_JWKS_UNAVAILABLE'
  | 'ERR_TOO_MANY_VALIDATIONS'
  | 'ERR_UPSTREAM'

/** Base class of every error mcp-dispatch throws on purpose. */
export class DispatchError extends Error {
  /** Stable, machine-readable code. */
  readonly code: DispatchErrorCode
  /** HTTP status an adapter answers with. */
  readonly status: number
  /** JSON-RPC error code used where the error becomes a JSON-RPC body. */
  readonly rpcCode: number

  constructor(code: DispatchErrorCode, status: number, rpcCode: number, message: string, options?: { cause?: unknown }) {
    super(message, options)
    this.name = new.target.name
    this.code = code
    this.status = status
    this.rpcCode = rpcCode
  }
}

/** Bad input to a library call or the token API: 400, names the offending field. */
export class InvalidInputError extends DispatchError {
  /**
   * Dotted path of the offending field, as the caller named it: `allowedIps.1` from the token
   * service, `allowed_ips.1` from the token API (JSON in snake_case).
   */
  readonly field: string
  constructor(field: string, message: string) {
    super('ERR_INVALID_INPUT', 400, -32602, `${field}: ${message}`)
    this.field = field
  }
}

/** A record (token, App, session) does not exist or is not visible to the caller: 404. */
export class NotFoundError extends DispatchError {
  constructor(message = 'Not found') {
    super('ERR_NOT_FOUND', 404, -32004, message)
  }
}

/** The caller is authenticated but may not perform this operation: 403. */
export class ForbiddenError extends DispatchError {
  constructor(message = 'Forbidden') {
    super('ERR_FORBIDDEN', 403, -32003, message)
  }
}

/** The caller is not authenticated: 401. */
export class UnauthorizedError extends DispatchError {
  constructor(message = 'Unauthorized') {
    super('ERR_UNAUTHORIZED', 401, -32001, message)
  }
}

/** A cookie-authenticated write failed the platform's CSRF check: 403. */
export class CsrfError extends DispatchError {
  constructor() {
    super('ERR_CSRF', 403, -32003, 'CSRF check failed')
  }
}

/**
 * The token is expired or revoked, so it cannot be changed any more: 409. `expiring`: it is
 * still active, but so close to its expiry (within `storeTimeoutMs`) that an edit of the expiry
 * could land after it, and is refused as one made after it would be.
 */
export class TokenInactiveError extends DispatchError {
  constructor(state: 'expired' | 'revoked' | 'expiring') {
    super('ERR_TOKEN_INACTIVE', 409, -32600, state === 'expiring' ? 'Token is about to expire: its expiry can no longer be changed' : `Token is ${state}`)
  }
}

/**
 * A change that conflicts with the state of the user's tokens: a rotation that lost to another
 * rotation of the token made at the same time (the owner's: rotate again; the token's own: try
 * again in a few seconds), or a creation past `maxActiveTokensPerUser` (revoke one first): 409.
 */
export class ConflictError extends DispatchError {
  constructor(message: string) {
    super('ERR_CONFLICT', 409, -32600, message)
  }
}

/** The versions rule refused a deploy (lower or equal patch, invalid version): 409. */
export class DeployRefusedError extends DispatchError {
  /** The version that was refused. */
  readonly version: string
  constructor(version: string, message: string) {
    super('ERR_DEPLOY_REFUSED', 409, -32600, message)
    this.version = version
  }
}

/** A store needed to decide could not answer: 503, never a silent allow. */
export class StoreUnavailableError extends DispatchError {
  constructor(store: string, options?: { cause?: unknown }) {
    super('ERR_STORE_UNAVAILABLE', 503, -32005, `${store} store unavailable`, options)
  }
}

/** The authorization server is unhealthy (breaker open, retries spent): 503. */
export class AuthorizationServerUnavailableError extends DispatchError {
  /** Seconds after which a retry may succeed. */
  readonly retryAfter: number
  constructor(retryAfter: number, options?: { cause?: unknown }) {
    super('ERR_AUTHORIZATION_SERVER_UNAVAILABLE', 503, -32005, 'Authorization server unavailable', options)
    this.retryAfter = retryAfter
  }
}

/**
 * The platform's JWKS could not be had (`createIdentityVerifier` with a JWKS URL): the fetch
 * failed or timed out, the answer was not 200, or not a JWKS. The App cannot tell a genuine
 * identity token from a forged one until it can: answer 503 (try again), not the 401 of an
 * invalid token. `cause` holds the error.
 */
export class JwksUnavailableError extends DispatchError {
  constructor(options?: { cause?: unknown }) {
    super('ERR_JWKS_UNAVAILABLE', 503, -32005, 'Identity keys (JWKS) unavailable', options)
  }
}

/**
 * A client address has used up its budget of upstream token validations that did not end in
 * an accepted token (`createOAuthValidator`'s `clientBudget`), or of store lookups of API
 * tokens that are not stored (`createTokenService`'s `unknownTokenBudget`): 429 with the
 * section 7 body. Shields the authorization server, the circuit breaker every caller shares,
 * and the token store from a flood of made-up bearer strings.
 */
export class TooManyValidationsError extends DispatchError {
  /** Validations (or lookups) allowed per window and client address. */
  readonly limit: number
  /** End of the window, Unix seconds. */
  readonly resetAt: number
  /** Seconds until the window ends, at least 1. */
  readonly retryAfter: number
  /** The window's name. */
  readonly windowType: WindowType
  constructor(info: { limit: number; resetAt: number; retryAfter: number; windowType: WindowType }) {
    super('ERR_TOO_MANY_VALIDATIONS', 429, -32000, 'Too many unverified access tokens from this client address')
    this.limit = info.limit
    this.resetAt = info.resetAt
    this.retryAfter = info.retryAfter
    this.windowType = info.windowType
  }
}

/** An upstream App (proxy handler) failed or timed out: 502 or 504. */
export class UpstreamError extends DispatchError {
  constructor(status: 502 | 504, message: string, options?: { cause?: unknown }) {
    super('ERR_UPSTREAM', status, -32000, message, options)
  }
}

/** Codes of {@link ConfigurationError}. */
export type ConfigurationErrorCode = 'ERR_INVALID_OPTION'

/**
 * Thrown at construction time when options are missing or invalid. A `TypeError`, so it is
 * a programming mistake, not a request failure. What only a running system can tell comes
 * with the first call that meets it: the identity signer (`mcp-dispatch/proxy`) rejects its
 * first `sign` or `jwks` when its keys turn out unusable, and the signer or verifier a call
 * whose `now` returned no finite number; the PostgreSQL token store with `preparedStatements`
 * behind a pooler that shares connections rejects the refused query; the Express
 * `serveTokenApi` under a mount path its `basePath` misses passes one to `next`.
 */
export class ConfigurationError extends TypeError {
  readonly code: ConfigurationErrorCode = 'ERR_INVALID_OPTION'
  /** The option at fault, dotted. */
  readonly option: string
  constructor(option: string, message: string, options?: { cause?: unknown }) {
    super(`mcp-dispatch: option "${option}" ${message}`, options)
    this.name = 'ConfigurationError'
    this.option = option
  }
}

/**
 * Checks that option `option` is an object with each of `methods` (own or inherited): a store,
 * a bus or a service given as something else (`{}`, a string, the factory instead of what it
 * makes) is refused at creation, naming the option, rather than failing every call at run time.
 * `undefined` ("is required") and `null` are refused too: call it for an option that is
 * required, or given.
 * @internal
 */
export function requireMethods(option: string, value: unknown, what: string, methods: readonly string[]): void {
  if (value === null || (typeof value !== 'object' && typeof value !== 'function')) {
    throw new ConfigurationError(option, value === undefined ? 'is required' : `must be ${what} (an object with ${methods.join(', ')} methods)`)
  }
  const missing = methods.filter((name) => typeof (value as Record<string, unknown>)[name] !== 'function')
  if (missing.length > 0) {
    throw new ConfigurationError(option, `must be ${what} (an object with ${methods.join(', ')} methods): it has no ${missing.join(', ')}`)
  }
}

/** Every key of `T`, of each member where `T` is a union. @internal */
type KeysOf<T> = T extends unknown ? keyof T & string : never

/**
 * The names of `T`'s options, written `{ name: true, … }`: the compiler holds the list to `T`
 * (a name missing or extra fails the build), so it never falls behind the type it checks.
 * @internal
 */
export function optionNames<T>(names: Record<KeysOf<T>, true>): readonly string[] {
  return Object.freeze(Object.keys(names))
}

/**
 * Refuses a key of `options` that `known` does not name: a misspelt option (`ratelimit`,
 * `trustproxy`), or one given to the wrong function (`allowedOrigins` beside an adapter's
 * `dispatcher` rather than in it), would otherwise be ignored in silence and its default served
 * (no rate limit, every origin), which TypeScript catches only in an object literal. `where`
 * names the function (`createDispatcher`) and `path` the object in it (`rateLimit.`); `elsewhere`
 * says where a key that belongs to another function goes. The message suggests a known name
 * spelt alike, or lists them all. Own enumerable string keys only, any value (`undefined` too).
 * @internal
 */
export function refuseUnknownOptions(
  options: object,
  known: readonly string[],
  where: string,
  elsewhere: (key: string) => string | undefined = () => undefined,
  path = '',
): void {
  for (const key of Object.keys(options)) {
    if (known.includes(key)) continue
    const hint = elsewhere(key)
    const alike = hint === undefined ? known.find((name) => spelledAlike(key, name)) : undefined
    const said = hint ?? (alike !== undefined ? `did you mean "${path}${alike}"?` : `its options are ${known.join(', ')}`)
    throw new ConfigurationError(`${path}${key}`, `is not an option of ${where}: ${said}`)
  }
}

/** Whether `given` is `name` misspelt: the same but for case, or at most two edits apart (one for short names). */
function spelledAlike(given: string, name: string): boolean {
  const a = given.toLowerCase()
  const b = name.toLowerCase()
  if (a === b) return true
  const most = Math.min(a.length, b.length) < 6 ? 1 : 2
  if (Math.abs(a.length - b.length) > most) return false
  // Levenshtein distance, one row at a time.
  let row = Array.from({ length: b.length + 1 }, (_, j) => j)
  for (let i = 1; i <= a.length; i++) {
    const next = [i]
    for (let j = 1; j <= b.length; j++) next[j] = Math.min(row[j]! + 1, next[j - 1]! + 1, row[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1))
    row = next
  }
  return row[b.length]! <= most
}

/**
 * The default `onError` of the dispatcher, the adapters, the token service, the token API,
 * the proxy and the Redis invalidation bus: one line on stderr, `[mcp-dispatch] <context>:
 * <name>: <message>`, so a failure that clients see only as a status (a store outage, a rate
 * limit served open, a failed broadcast) is never silent. The causes it wraps are named by
 * their class and code (`(cause: error 42P01: PostgreSQL undefined_table: a table is missing
 * (the token store's: run its migrate() …))`: a PostgreSQL table that was never migrated, with
 * what to do about it; `(cause: Error ECONNREFUSED)`), never by their message, which a database driver or a
 * parser may fill with what it read. The library never puts a secret in an error it makes;
 * pass an `onError` of your own to send these, causes whole, to your logger instead.
 */
export function logError(error: unknown, context: string): void {
  let text: string
  try {
    text = error instanceof Error ? `${error.name}: ${error.message}${causes(error)}` : String(error)
  } catch {
    // What a store rejected with may have no string form (`Object.create(null)`, a getter that
    // throws): its kind, rather than a throw where an error is being reported; not even that of
    // a Proxy whose traps throw, or one revoked.
    try {
      text = Object.prototype.toString.call(error)
    } catch {
      text = `a thrown ${typeof error} that cannot be read`
    }
  }
  console.error(`[mcp-dispatch] ${context}: ${text}`)
}

/**
 * The `onError` option of a component: the function given, else {@link logError}. Anything
 * else is a `ConfigurationError` at creation, not a failure that surfaces only when an error
 * is to be reported (an unanswered request, an unhandled rejection). A function that throws,
 * or returns a promise that rejects, hands its report to `logError` instead, with its own
 * failure (context `onError failed`).
 * @internal
 */
export function reporterOption(given: unknown): (error: unknown, context: string) => void {
  if (given === undefined) return logError
  if (typeof given !== 'function') throw new ConfigurationError('onError', 'must be a function')
  const report = given as (error: unknown, context: string) => void
  // A reporter that throws (a logger that is down) must not fail the request it reports on:
  // what it was handed goes to the default logger instead, and is not lost.
  const fallBack = (error: unknown, context: string, thrown: unknown) => {
    logError(error, context)
    logError(thrown, 'onError failed')
  }
  return (error, context) => {
    try {
      const answer: unknown = report(error, context)
      // An async reporter's rejection too: not left unhandled (which ends a Node process).
      if (typeof (answer as PromiseLike<unknown> | undefined)?.then === 'function') {
        ;(answer as PromiseLike<unknown>).then(undefined, (thrown: unknown) => fallBack(error, context, thrown))
      }
    } catch (thrown) {
      fallBack(error, context, thrown)
    }
  }
}

/** ` (cause: <name> <code>)` for each cause down the chain, at most three. */
function causes(error: Error): string {
  let text = ''
  let cause: unknown = error.cause
  for (let depth = 0; depth < 3 && cause instanceof Error; depth++) {
    const code = (cause as { code?: unknown }).code
    const shown = typeof code === 'string' || typeof code === 'number' ? ` ${String(code).slice(0, 40)}` : ''
    const hint = typeof code === 'string' && Object.hasOwn(SQLSTATE_HINTS, code) ? `: ${SQLSTATE_HINTS[code]}${missingRelation(code, cause.message)}` : ''
    text += ` (cause: ${cause.name.slice(0, 60)}${shown}${hint})`
    cause = cause.cause
  }
  return text
}

/**
 * The table a 42P01 names (`relation "public.mcp_dispatch_api_tokens" does not exist`): a name
 * from the store's own SQL, not from anything it read, so it is said, and an operator who runs
 * `migrate()` on a store given the wrong `schema` sees which table was looked for. Nothing for any
 * other message.
 */
function missingRelation(code: string, message: string): string {
  if (code !== '42P01') return ''
  const named = /^relation ("[^"\n]{1,128}") does not exist$/.exec(message)
  return named ? `; looked for: ${named[1]!}` : ''
}

/**
 * What an operator does about the PostgreSQL errors a store meets first (SQLSTATE, PostgreSQL's
 * appendix A), said beside the code, since the message (which names the table) is not
 * printed: a store never migrated, or a role without its grants. Worded for any store on
 * PostgreSQL (a platform's own app or subscription store too), with the token store's remedy.
 */
const SQLSTATE_HINTS: Readonly<Record<string, string>> = Object.freeze({
  '42P01': 'PostgreSQL undefined_table: a table is missing (the token store\'s: run its migrate(), docs/stores.md "Migration")',
  '42703': 'PostgreSQL undefined_column: a column is missing (the token store\'s: run its migrate(), docs/stores.md "Migration")',
  '42501': 'PostgreSQL insufficient_privilege: the role lacks a grant (the token store\'s: docs/stores.md "Migration" lists them)',
})
