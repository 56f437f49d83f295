/**
 * OAuth access-token validation against an authorization server (spec 4.5 and 5.1; DESIGN.md
 * "OAuth access tokens").
 *
 * One validator, three pluggable modes that share the cache, the single flight, the retries
 * and the circuit breaker:
 *
 * - `userinfo` (default, the spec's): the token is sent to the issuer's userinfo endpoint
 *   (OpenID Connect Core 5.3); 2xx gives the identity (`sub`), 401 refuses the token.
 * - `jwt`: the token is a JWT access token (RFC 9068) verified locally against the issuer's
 *   JWKS with `jose`; no call per token at all.
 * - `introspection`: the token is sent to the issuer's introspection endpoint (RFC 7662)
 *   with the resource server's client credentials.
 *
 * @module
 */
import {
  type JSONWebKeySet,
  type JWK,
  type JWTPayload,
  type JWTVerifyGetKey,
  createLocalJWKSet,
  decodeProtectedHeader,
  errors as joseErrors,
} from 'jose'
import { type JsonWebKeyInput, createPublicKey } from 'node:crypto'
import { B64TOKEN, bearerChallenges } from '../core/authorization-header.js'
import { sha256 } from '../core/sha256.js'
import { hasLoneSurrogate, quoted } from '../core/text.js'
import type { CacheStore, MaybePromise } from '../core/stores.js'
import { AuthorizationServerUnavailableError, ConfigurationError, TooManyValidationsError, logError, optionNames, refuseUnknownOptions, requireMethods } from '../errors.js'
import { fetchLettingGo } from '../fetch-let-go.js'
import { readTextUpTo } from '../read-text.js'
import { adoptThenable, ignoreRejection } from '../core/thenable.js'
import { createMemoryCacheStore } from '../stores/memory/index.js'
import {
  type AccessTokenContext,
  type AccessTokenInfo,
  type AccessTokenResult,
  type AccessTokenValidator,
  keepingOwnDeadline,
} from './access-token-validator.js'
import { DEFAULT_RETRY, type RetryOptions, computeBackoff } from './backoff.js'
import { type BreakerState, type CircuitBreakerOptions, createCircuitBreaker } from './circuit-breaker.js'
import { type BudgetCharge, type ClientBudgetOptions, createClientBudget } from './client-budget.js'
import {
  type AuthorizationServerMetadata,
  type DiscoveredEndpoint,
  checkAuthorizationServerMetadata,
  discoveryUrls,
  fallbackUserinfoEndpoint,
  hasCredentials,
  isHttpUrl,
  issuerProblem,
} from './discovery.js'
import { audienceList, audienceMatches, checkAccessTokenClaims, idTokenSigns, issuedSince, peekJwtClaims, resourceAudience, withResourceAudience } from './jwt-claims.js'
import { jwtVerifyWithKeySet } from './jwt-verify.js'
import { createSingleFlight } from './single-flight.js'
import { MAX_TIMER_MS, expireOnceRead, withTimeout } from '../timeout.js'
import { heldBack, lineGate } from '../line-gate.js'

// A subject holding a lone surrogate is refused: two such subjects would be one user's
// rate-limit counters, subscriptions and sessions (`hasLoneSurrogate`). So is one holding a
// NUL, which PostgreSQL cannot store as text (a platform's subscription lookup failing, 503,
// for every request of it) and which joins the parts of the dispatcher's rate-limit keys.
const SUBJECT_NOT_WELL_FORMED = 'token subject is not well-formed Unicode, or holds a NUL'

/** Whether a subject cannot name a user in the stores (see {@link SUBJECT_NOT_WELL_FORMED}). */
function unusableSubject(sub: string): boolean {
  return sub.includes('\0') || hasLoneSurrogate(sub)
}

/** How access tokens are validated. */
export type OAuthValidationMode = 'userinfo' | 'jwt' | 'introspection'

/** The upstream endpoints a validator calls. */
export type UpstreamEndpoint = 'discovery' | 'userinfo' | 'introspection' | 'jwks'

/** Timers the validator uses for per-call timeouts (injectable, so tests fire them by hand). */
export interface OAuthTimers {
  /** Calls `callback` once after `ms` milliseconds, as the global `setTimeout`; answers a handle for {@link clearTimeout}. */
  setTimeout(callback: () => void, ms: number): unknown
  /** Cancels the timer `handle` names, as the global `clearTimeout`. */
  clearTimeout(handle: unknown): void
}

/** A validation result as cached. Plain JSON, so a shared store (Redis) can hold it. */
export type CachedValidation =
  | {
      readonly active: true
      readonly info: AccessTokenInfo
      /** The token's audience, when known (JWT `aud`, introspection `aud`). */
      readonly audience?: readonly string[]
      /** Epoch ms after which the entry is not used, whatever the store's own TTL. */
      readonly validUntil: number
    }
  | {
      readonly active: false
      readonly reason: string
      readonly validUntil: number
      /**
       * The mark `forget` writes beside a token's entry (under `<key>:forgotten`, never read
       * as an answer): a validation that finds it after caching its answer deletes that
       * answer, on any instance sharing the cache.
       */
      readonly forgotten?: true
    }

/** What the validator reports through `onEvent` (metrics, logs). Never carries a token. */
export type OAuthValidatorEvent =
  | { readonly type: 'cache-hit'; readonly active: boolean }
  | { readonly type: 'cache-miss' }
  /** A request joined a validation already in flight for the same token. */
  | { readonly type: 'joined' }
  /**
   * Refused from the token's own claims, with no upstream call. `expected`: for an `audience
   * mismatch`, the audience the token was to name (the App address, by default), a copy of the
   * validator's own.
   */
  | { readonly type: 'rejected-locally'; readonly reason: string; readonly expected?: readonly string[] }
  | {
      readonly type: 'upstream'
      readonly endpoint: UpstreamEndpoint
      readonly outcome: 'ok' | 'failure'
      readonly status?: number
      readonly durationMs: number
      readonly error?: string
    }
  | { readonly type: 'retry'; readonly attempt: number; readonly delayMs: number; readonly error: string }
  | { readonly type: 'breaker'; readonly from: BreakerState; readonly to: BreakerState; readonly at: number }
  /** An uncached token was refused with 429: its client address spent its `clientBudget`. */
  | { readonly type: 'client-budget-spent'; readonly retryAfter: number }
  /** An uncached token was refused at once: `maxPendingValidations` were already waiting upstream. */
  | { readonly type: 'pending-limit'; readonly pending: number }
  /** An uncached token was refused at once because the breaker is open. */
  | { readonly type: 'fail-fast'; readonly retryAfter: number }
  /**
   * A validation ended in 503: retries spent, the server misbehaved, or (`jwt` mode) the key a
   * token names could not be had yet. A breaker already open is `fail-fast`, the pending bound
   * `pending-limit`.
   */
  | { readonly type: 'unavailable'; readonly retryAfter: number; readonly error: string }
  /**
   * (`jwt` mode) A 503 for a token naming a key the keys in hand do not have, issued (its `iat`)
   * since they were fetched: a key the issuer may have rotated in since, asked again once a
   * refetch is allowed. Judged by the token's own claims, so any client can cause it (a made-up
   * `kid`): not written by the default logger, unlike `unavailable`.
   */
  | { readonly type: 'unknown-key'; readonly retryAfter: number; readonly error: string }
  | { readonly type: 'store-error'; readonly operation: 'get' | 'set'; readonly error: unknown }

/** Options of {@link createOAuthValidator}. */
export interface OAuthValidatorOptions {
  /** The authorization server's issuer identifier, exactly as it publishes it. */
  issuer: string
  /** Validation mode. Default `userinfo` (spec 4.5). */
  mode?: OAuthValidationMode | undefined
  /**
   * Expected audience (RFC 8707 resource indicator, RFC 9068 `aud`): a value, a list, or a
   * function of the App the token is presented to (`({ resource }) => resource` binds each
   * token to its App). Checked on every request. In `jwt` and `introspection` modes the token
   * must name one of them; in `userinfo` mode it is checked when the token is a JWT (one made
   * to look like none, padded or in the standard base64 alphabet, is refused). A token for a
   * path inside an expected URL matches it too (`{base_url}/v1`, the URL a client calls), so
   * App addresses must not nest (`https://p.example.com` and `https://p.example.com/weather`).
   *
   * Default in `jwt` and `introspection` modes: the App the token is presented to
   * (`({ resource }) => resource`), as the MCP authorization spec requires (RFC 8707: a token
   * must have been issued for this server); `false` accepts any audience (not recommended:
   * a token issued for another service, or an ID token, is then taken). Default in
   * `userinfo` mode: no check. When there is an audience to check (in `userinfo` mode, one
   * given) and it cannot be computed (the function called without a context, or returning
   * anything but a non-empty string or a list of them: `undefined`, `null`, `''`, `[]`,
   * `['']`), the token is refused: never taken unchecked.
   */
  audience?: string | readonly string[] | ((context: AccessTokenContext) => string | readonly string[] | undefined) | false | undefined
  /** Userinfo endpoint; default from discovery, else `{issuer}/userinfo`. */
  userinfoEndpoint?: string | undefined
  /** `jwt` mode: a JWKS URL or a local key set; default the `jwks_uri` of discovery. */
  jwks?: string | JSONWebKeySet | undefined
  /**
   * `jwt` mode: accepted signing algorithms, among those `jose` verifies (`RS256`…`PS512`,
   * `ES256`…`ES512`, `EdDSA`, `Ed25519`, `HS256`…`HS512`, `ML-DSA-44`…`87`; a name outside them
   * is a `ConfigurationError`). Default: whatever the keys allow.
   */
  algorithms?: readonly string[] | undefined
  /** `introspection` mode: the resource server's client credentials (`client_secret_basic`). */
  introspection?: {
    /** The client id the platform is registered under at the authorization server. */
    clientId: string
    /** Its secret, sent in the `Authorization: Basic` of each introspection request (never logged). */
    clientSecret: string
    /** The RFC 7662 endpoint; default the `introspection_endpoint` of discovery. */
    endpoint?: string | undefined
  } | undefined
  /** Allowed clock skew for `exp` / `nbf`, at most 300,000 (five minutes). Default 0. */
  clockToleranceMs?: number | undefined
  /** Where results are cached; default in memory. Keys are hashes, never tokens. */
  cache?: CacheStore<CachedValidation> | undefined
  /**
   * How long an accepted token is cached, never past its own expiry. Default 5 minutes (spec 8);
   * at most 2^31 - 1 ms.
   */
  cacheTtlMs?: number | undefined
  /**
   * How long a refused token is cached, to shield the upstream. Default 30 s in `userinfo` and
   * `introspection` modes; 0 (none kept) in `jwt` mode, which calls no upstream per token, so
   * that made-up bearer strings cannot fill the cache. 0 disables.
   */
  rejectionTtlMs?: number | undefined
  /**
   * Prefix of cache keys (a string, `ConfigurationError` otherwise). Default `oauth:`. Keys also
   * hold a digest of the mode and issuer, so validators of different issuers never share entries.
   */
  cacheKeyPrefix?: string | undefined
  /** Timeout of one upstream call. Default 5 s. */
  timeoutMs?: number | undefined
  /** Retries of transient failures (network, timeout, 5xx, 429). */
  retry?: RetryOptions | undefined
  /**
   * `userinfo` and `introspection` modes: per client address (IPv6 by its /64), at most
   * `limit` upstream validations in flight or ended in a refusal per window; an accepted token
   * gives its unit back. Past it, uncached tokens from that address get
   * `TooManyValidationsError` (429) without an upstream call, while cached ones keep working,
   * so a flood of made-up bearer strings can neither load the authorization server nor open
   * the breaker for everyone. Needs the client address (the dispatcher passes it).
   * Default `{ limit: 60, windowType: 'minute', maxClients: 10_000 }`; `false` turns it off.
   */
  clientBudget?: ClientBudgetOptions | false | undefined
  /**
   * At most this many validations waiting on the authorization server at once, for the whole
   * process (every client address, and requests that have none). Past it, a token that would
   * need one more is refused at once with 503 (`AuthorizationServerUnavailableError`,
   * `Retry-After: 1`) and no upstream call, while cached tokens and validations already in
   * flight (joined) go on. A server that hangs can then hold at most this many requests, their
   * sockets and timers, for `timeoutMs`, whatever the rate of made-up tokens. A positive
   * integer; default 1,000.
   */
  maxPendingValidations?: number | undefined
  /** Circuit breaker (counts each failed upstream call); its `coolDownMs` at most an hour. */
  breaker?: Pick<CircuitBreakerOptions, 'failureThreshold' | 'coolDownMs'> | undefined
  /** `jwt` mode with a JWKS URL: keys are refetched after this age. Default 10 minutes. */
  jwksMaxAgeMs?: number | undefined
  /**
   * `jwt` mode: at most one JWKS refetch (for an unknown `kid`, or of keys past their age) per
   * this interval, counted from the last attempt, successful or not. Default 30 s.
   */
  jwksRefetchIntervalMs?: number | undefined
  /**
   * `fetch` to call the authorization server with. Default the global one. A call it fails is
   * reported (events, the 503's `cause`) by the error's name and its (or its cause's) code,
   * never its message, which may quote the request (the token, the client secret), unless the
   * message is one of the runtimes' own that quote nothing (`fetch failed`, `terminated`,
   * `Network connection lost.`, an abort's).
   */
  fetch?: typeof fetch | undefined
  /**
   * Clock, epoch ms. Drives cache, expiry, deadline and breaker. Default: `Date.now` for
   * absolute times (a JWT's `exp`, a cached result's `validUntil`) and a monotonic clock for
   * spans (the in-memory cache's TTL, call deadlines, the breaker's cool-down, the discovery and
   * key-set intervals), so a wall clock stepped back (NTP, a resumed VM) stretches none of them.
   */
  now?: (() => number) | undefined
  /** Waits between retries. Default a timer. */
  sleep?: ((ms: number) => Promise<void>) | undefined
  /** Timers for per-call timeouts. Default the global ones. */
  timers?: OAuthTimers | undefined
  /** Randomness for jitter, in [0, 1). Default `Math.random`. */
  random?: (() => number) | undefined
  /**
   * Observes the validator (metrics, logs), synchronously, in the request's path: keep it
   * cheap. Exceptions it throws are ignored, and so is the rejection of a promise it returns
   * (an `async` function sending to a metrics sink that is down). Default: the events an
   * operator must act on written by `logError` (one line on stderr), at most one line of each
   * kind per 10 s: `unavailable` (context `oauth unavailable`, naming what failed: a server
   * down, a discovery document naming another issuer), `pending-limit` (`oauth pending
   * limit`), the breaker opening and closing (`oauth breaker`, which stands for the 503s it
   * answers while open), and the cache store's failures (`oauth cache store`): no 503 of the
   * validator goes untold; and, while no token was accepted since its last line (or the start),
   * a token refused for its audience, its `nbf` or its issuer (`oauth refused`: a deployment that
   * refuses every token so, `baseUrl`'s scheme behind a proxy that ends TLS, a clock an hour
   * off). Given, it receives every event, and nothing is written.
   */
  onEvent?: ((event: OAuthValidatorEvent) => void) | undefined
  /**
   * Keeps the request that starts upstream work alive until that work ends, on runtimes that end
   * a request's I/O with it: on Cloudflare Workers, `waitUntil` of `cloudflare:workers` (or a
   * request's `ctx.waitUntil`). It is handed the refetch of a key set past its age (`jwt` mode)
   * and of a discovery document past its day, which run in the background, and each validation that requests may share, so that one whose
   * first request ends (its client left) still answers the others. Without it, on Workers, such
   * work ends with its request: keys past their age are refetched only for a token naming a key
   * the set lacks, a day-old discovery document's refresh may end with its request (it is tried
   * again 5 minutes later), and a request that shared a validation cut short validates again. Default:
   * none (Node, Bun and Deno need none).
   */
  waitUntil?: ((promise: Promise<unknown>) => void) | undefined
}

/** An OAuth access-token validator. */
export interface OAuthValidator extends AccessTokenValidator {
  /** The mode it validates with. */
  readonly mode: OAuthValidationMode
  /** The circuit breaker's state now. */
  readonly breakerState: BreakerState
  /** Drops a token's cached result (after the platform learns it was revoked). */
  forget(token: string): Promise<void>
}

/** Default lifetime of a cached validation (spec 5.1 step 6, spec 8). */
export const DEFAULT_OAUTH_CACHE_TTL_MS = 300_000
/** Default lifetime of a cached rejection. */
export const DEFAULT_OAUTH_REJECTION_TTL_MS = 30_000
/** The longest `breaker.coolDownMs` of a validator: an hour. */
const MAX_OAUTH_COOL_DOWN_MS = 3_600_000
/** Default timeout of one upstream call. */
export const DEFAULT_OAUTH_TIMEOUT_MS = 5_000

const MODES: readonly OAuthValidationMode[] = ['userinfo', 'jwt', 'introspection']
const REJECTED_UPSTREAM = 'rejected by the authorization server'

/** How long a complete discovery document is believed before it is fetched again (a day). */
const METADATA_TTL_MS = 24 * 3600_000

/**
 * How long a discovery answer short of a complete document (none, one without the mode's
 * endpoint, a failure beside a document kept) is believed, and the least time between two
 * discoveries asked for by a discovered endpoint answering 404 or 410: 5 minutes.
 */
const REDISCOVERY_INTERVAL_MS = 300_000

/**
 * How far an authorization server's clock may run ahead of this one before a token whose key is
 * not known is refused for its `iat` alone (5 minutes, a common JWT clock-skew allowance). A
 * server a second or two ahead stamps every token of a newly rotated key with an `iat` to come:
 * refused outright, such a token would get 401 for every new sign-in until the keys in hand
 * aged out, with no refetch.
 */
const ISSUER_CLOCK_AHEAD_MS = 5 * 60_000

/**
 * The refusals of a token (401) that, when no token is accepted, are the deployment's, not the
 * clients': what each tells the operator to check. Every token refused for its audience is the
 * App address the platform computes (`baseUrl` answering `http://` behind a proxy that ends TLS),
 * for its `nbf` this host's clock, for its issuer the `issuer` option.
 */
const REFUSALS_TOLD: Readonly<Record<string, string>> = Object.freeze({
  'audience mismatch': 'the App address every token must name (baseUrl, its scheme behind a proxy that ends TLS), the audience option, and the resource clients ask the authorization server for',
  'token not yet valid': 'this host\'s clock against the authorization server\'s (nbf to come)',
  'claim check failed: nbf': 'this host\'s clock against the authorization server\'s (nbf to come)',
  'issuer mismatch': 'the issuer option against the iss of the tokens',
  'claim check failed: iss': 'the issuer option against the iss of the tokens',
})

/** How often the default `onEvent` writes a line of one kind at most (ms). */
const OPERATOR_LOG_INTERVAL_MS = 10_000

/**
 * The default `onEvent`: the events an operator must act on, through `logError`, at most one
 * line of each kind per {@link OPERATOR_LOG_INTERVAL_MS} on `now` (a 503 for every uncached
 * token while the authorization server is down is one line, not one per request); the first
 * line after a quiet interval is written at once, and names how many of its kind came since
 * the line before. A clock stepped back counts as a quiet interval. The breaker's changes are
 * written whenever it goes the other way than the last line said: only repeats wait. A refusal
 * of {@link REFUSALS_TOLD} is written only when `accepted` (tokens accepted) did not move since
 * the last line of its kind: any client can send such a token; a deployment that refuses every
 * token so tells no one otherwise.
 */
function operatorLog(now: () => number, accepted: { count: number }): (event: OAuthValidatorEvent) => void {
  const gate = lineGate(OPERATOR_LOG_INTERVAL_MS, now)
  // Tokens accepted when a line of each refusal's kind was last let through.
  const acceptedAt = new Map<string, number>()
  let breakerSaid: BreakerState | undefined
  /** Writes `error` under `context`, unless a line of `kind` went out less than the interval ago. */
  const write = (kind: string, context: string, error: unknown, always = false) => {
    const held = gate(kind, always)
    if (held !== undefined) logError(error, heldBack(context, held))
  }
  return (event) => {
    if (event.type === 'unavailable') {
      write(event.type, 'oauth unavailable', new Error(`a token was answered 503 (retry after ${event.retryAfter} s): ${event.error}`))
    } else if (event.type === 'pending-limit') {
      write(event.type, 'oauth pending limit', new Error(`${event.pending} validations were already waiting for the authorization server (maxPendingValidations): an uncached token was answered 503`))
    } else if (event.type === 'breaker' && event.to !== 'half-open') {
      const turned = event.to !== breakerSaid
      breakerSaid = event.to
      const message =
        event.to === 'open'
          ? 'the circuit breaker opened: uncached tokens get 503 until a probe of the authorization server succeeds'
          : 'the circuit breaker closed: the authorization server answers again'
      write(`breaker ${event.to}`, 'oauth breaker', new Error(message), turned)
    } else if (event.type === 'store-error') {
      write(event.type, 'oauth cache store', event.error)
    } else if (event.type === 'rejected-locally' && Object.hasOwn(REFUSALS_TOLD, event.reason)) {
      // A client can send such a token at will, so one refused so is nothing to act on while
      // others are accepted; with none accepted since the last line (or the start), every token
      // may be (a deployment wrong for all: an App address of the wrong scheme, a clock an hour
      // off), which a 401 for each told no one.
      const kind = `refused ${event.reason}`
      const held = gate(kind)
      if (held === undefined) return
      const none = accepted.count === (acceptedAt.get(kind) ?? 0)
      acceptedAt.set(kind, accepted.count)
      if (!none) return
      const expected = event.expected ? ` (expected ${event.expected.slice(0, 3).map((value) => JSON.stringify(value.slice(0, 200))).join(' or ')})` : ''
      logError(
        new Error(`a token was refused (401): ${event.reason}${expected}, and no token was accepted since the last such line (or the start): if every token is refused so, check ${REFUSALS_TOLD[event.reason]}`),
        heldBack('oauth refused', held),
      )
    }
  }
}

/** Why an upstream exchange failed. Messages name the endpoint and status, never a token. */
class UpstreamFailure extends Error {
  constructor(
    message: string,
    /** Worth retrying after a backoff (network, timeout, 5xx, a 429 that names no wait). */
    readonly transient: boolean,
    /** Milliseconds the breaker asks to wait, when it refused the call. */
    readonly breakerRetryAfterMs?: number,
    /** Milliseconds the server asked to wait (`Retry-After` of a 429 or 503), when it said. */
    readonly serverRetryAfterMs?: number,
    /**
     * The server answered about this token (a 4xx a made-up string can provoke, an answer a
     * user's profile grew too large): the client keeps the unit of its budget it spent. Every
     * other failure is the server's own, or its setup's, and gives the unit back.
     */
    readonly aboutToken = false,
  ) {
    super(message)
    this.name = 'UpstreamFailure'
  }
}

/** Statuses of an endpoint that is not where the validator calls it: the setup's fault, not the token's. */
const SETUP_STATUSES: ReadonlySet<number> = new Set([404, 405, 410])

/**
 * A judge turns a response into a value, or throws a failure that `counts` against the server.
 * One that does not count is an answer of a healthy server, by default about this token
 * (`aboutToken`); a refusal of the resource server's own credentials is not.
 */
class BadAnswer extends Error {
  constructor(
    message: string,
    readonly counts: boolean,
    readonly aboutToken = !counts,
  ) {
    super(message)
  }
}

interface UpstreamResponse {
  readonly status: number
  readonly body: string
  /** `Content-Type`, lower case, without parameters (`''` when absent). */
  readonly contentType: string
  /** The same as sent (its case kept), for messages: see {@link typeShown}. */
  readonly mediaType: string
  /** `WWW-Authenticate`, where the answer has one (`null` otherwise). */
  readonly challenge: string | null
}

/** RFC 6750 section 3.1's errors about the token. */
const TOKEN_ERRORS: ReadonlySet<string> = new Set(['invalid_request', 'invalid_token', 'insufficient_scope'])

/**
 * Whether a `WWW-Authenticate` value (one field, or several joined with `, `) holds a Bearer
 * challenge whose own `error` parameter is an RFC 6750 error about the token, wherever that
 * challenge stands among others (`DPoP …, Bearer error="insufficient_scope"`). Commas inside
 * quoted strings do not split; an `error` of another challenge, or inside a quoted value,
 * does not count.
 */
export function bearerTokenError(header: string): boolean {
  return bearerChallenges(header).some((params) => params.some(([name, value]) => name === 'error' && TOKEN_ERRORS.has(value)))
}

/**
 * Most bytes read of one answer: userinfo and introspection answers are a few hundred bytes,
 * discovery documents and key sets a few kilobytes. A larger one is refused unread, rather
 * than held in memory whole (an answer a user can grow, a profile claim, must not cost the
 * process its memory).
 */
const MAX_ANSWER_BYTES: Readonly<Record<UpstreamEndpoint, number>> = {
  userinfo: 256 * 1024,
  introspection: 256 * 1024,
  discovery: 1024 * 1024,
  jwks: 1024 * 1024,
}

/**
 * A 5xx: the server failed (retried, counted against the breaker). A status past 599, which
 * Node's `fetch` passes on, is none: it is judged as any other unexpected status (not retried).
 */
function isServerError(status: number): boolean {
  return status >= 500 && status <= 599
}

/**
 * The three forms of an HTTP-date (RFC 9110 section 5.6.7), all in GMT: IMF-fixdate
 * (`Sun, 06 Nov 1994 08:49:37 GMT`), rfc850-date (`Sunday, 06-Nov-94 08:49:37 GMT`), and
 * asctime-date (`Sun Nov  6 08:49:37 1994`), which names no zone: `Date.parse` reads that one,
 * and any other date without a zone, in the process's time zone (`TZ`), so under
 * `TZ=America/St_Johns` a wait of 30 s became the hour's cap, and east of GMT none.
 */
const IMF_OR_RFC850_DATE = /^[A-Za-z]{3,9}, \d{2}[ -][A-Za-z]{3}[ -]\d{2,4} \d{2}:\d{2}:\d{2} GMT$/
const ASCTIME_DATE = /^[A-Za-z]{3} [A-Za-z]{3} [ \d]\d \d{2}:\d{2}:\d{2} \d{4}$/

/**
 * Milliseconds of a `Retry-After` value (delta-seconds or an HTTP date, RFC 9110 section
 * 10.2.3), at most an hour; `undefined` when absent or not one of those. The same in every
 * time zone: only the HTTP-date forms are read, as GMT ({@link IMF_OR_RFC850_DATE}).
 * @internal
 */
export function retryAfterMs(value: string | null, at: number): number | undefined {
  if (value === null) return undefined
  const text = value.trim()
  const date = IMF_OR_RFC850_DATE.test(text) ? text : ASCTIME_DATE.test(text) ? `${text} GMT` : undefined
  const ms = /^\d+$/.test(text) ? Number(text) * 1000 : date === undefined ? Number.NaN : Date.parse(date) - at
  return Number.isFinite(ms) ? Math.min(Math.max(ms, 0), 3_600_000) : undefined
}

/** What one validation found, before it is cached. */
type Outcome =
  | {
      readonly active: true
      readonly info: AccessTokenInfo
      readonly audience?: readonly string[]
      readonly expiresAt?: number
      /** Not worth remembering (verified with keys past their age: the key may be withdrawn). */
      readonly uncacheable?: boolean
    }
  | {
      readonly active: false
      readonly reason: string
      /** Not worth remembering (the answer may change within the rejection TTL). */
      readonly uncacheable?: boolean
    }

/** A JSON Web Key Set as loaded for verification. */
interface KeySet {
  readonly getKey: JWTVerifyGetKey
  /** The `kid`s of the keys verification uses. */
  readonly kids: ReadonlySet<string>
  /** The `kid`s of keys left out as unusable (and of no usable key). */
  readonly unusableKids: ReadonlySet<string>
}

/**
 * Loads the members of a JSON Web Key Set, leaving out those no signature can be verified
 * with: an RSA, EC or OKP key that does not import (a modulus of one byte, a point off its
 * curve), an RSA key under 2048 bits (which `jose` refuses at verification) or with a public
 * exponent past 2^32 - 1 (whose every verification is costly), and a private key.
 * Kept, each would fail with a `TypeError` every token naming it, and one bad key must not cost
 * the tokens of the good ones. Keys of other types are left to `jose`. `undefined` when the
 * set has members and none is usable.
 */
function loadKeySet(members: readonly unknown[]): KeySet | undefined {
  const usable: JWK[] = []
  const kids = new Set<string>()
  const unusableKids = new Set<string>()
  for (const member of members) {
    if (member === null || typeof member !== 'object' || Array.isArray(member)) continue
    const jwk = member as JWK
    if (usableKey(jwk)) {
      usable.push(jwk)
      if (typeof jwk.kid === 'string') kids.add(jwk.kid)
    } else if (typeof jwk.kid === 'string') unusableKids.add(jwk.kid)
  }
  if (usable.length === 0 && members.length > 0) return undefined
  for (const kid of kids) unusableKids.delete(kid)
  return { getKey: createLocalJWKSet({ keys: usable }), kids, unusableKids }
}

/** The largest RSA public exponent taken (2^32 - 1, as FIPS 186 and Go's `crypto/rsa` bound it). */
const MAX_RSA_EXPONENT = 0xffff_ffffn

function usableKey(jwk: JWK): boolean {
  if (jwk.kty !== 'RSA' && jwk.kty !== 'EC' && jwk.kty !== 'OKP') return true
  if (jwk.d !== undefined) return false
  try {
    const key = createPublicKey({ key: jwk, format: 'jwk' } as JsonWebKeyInput)
    if (jwk.kty !== 'RSA') return true
    const details = key.asymmetricKeyDetails
    // Keys use 65537 (or 3); an exponent of thousands of bits, which OpenSSL takes under a
    // 3072-bit modulus, made each made-up JWT cost milliseconds of CPU to refuse.
    return (details?.modulusLength ?? 0) >= 2048 && (details?.publicExponent ?? 0n) <= MAX_RSA_EXPONENT
  } catch {
    return false
  }
}

/** Signature bytes of the JWS algorithms whose size is fixed (RFC 7518 section 3.4, RFC 8037). */
const SIGNATURE_BYTES: Readonly<Record<string, readonly number[]>> = {
  ES256: [64],
  ES384: [96],
  ES512: [132],
  Ed25519: [64],
  EdDSA: [64, 114],
}

/**
 * Whether a base64url signature has a size its algorithm's signatures have: RSA ones are as
 * long as the modulus (2048 to 16384 bits), ECDSA and EdDSA ones fixed. Algorithms this does
 * not know are left to the key.
 */
function signatureFits(alg: unknown, signature: string): boolean {
  if (typeof alg !== 'string') return false
  const bytes = Math.floor((signature.length * 3) / 4)
  if (/^(?:RS|PS)(?:256|384|512)$/.test(alg)) return bytes >= 256 && bytes <= 2048
  return Object.hasOwn(SIGNATURE_BYTES, alg) ? SIGNATURE_BYTES[alg]!.includes(bytes) : true
}

function positive(name: string, value: number | undefined, fallback: number, allowZero = false, max = Number.MAX_VALUE, why = 'the longest delay a timer takes'): number {
  if (value === undefined) return fallback
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || (!allowZero && value === 0)) {
    throw new ConfigurationError(name, `must be a ${allowZero ? 'non-negative' : 'positive'} number`)
  }
  if (value > max) throw new ConfigurationError(name, `must be at most ${max} (${why})`)
  return value
}

/** The largest `clockToleranceMs`: five minutes, as the identity verifier of `mcp-dispatch/proxy` allows. */
const MAX_CLOCK_TOLERANCE_MS = 300_000

/** The JWS algorithms `jose` verifies (RFC 7518, RFC 8037, the ML-DSA draft): `algorithms` may name these only. */
const JWS_ALGORITHMS: readonly string[] = [
  'RS256', 'RS384', 'RS512', 'PS256', 'PS384', 'PS512', 'ES256', 'ES384', 'ES512', 'EdDSA', 'Ed25519',
  'HS256', 'HS384', 'HS512', 'ML-DSA-44', 'ML-DSA-65', 'ML-DSA-87',
]

/** A delay that goes to a timer: past 2^31 - 1 ms Node fires it at once (every call would time out). */
function timerDelay(name: string, value: number | undefined, fallback: number, allowZero = false): number {
  return positive(name, value, fallback, allowZero, MAX_TIMER_MS)
}

function checkHttpUrl(name: string, value: string | undefined): void {
  if (value === undefined) return
  if (!isHttpUrl(value)) {
    throw new ConfigurationError(name, 'must be an absolute http(s) URL')
  }
  if (hasCredentials(value)) throw new ConfigurationError(name, credentialsInUrl(name))
}

/** Why a URL with a user name or password is refused (Node's error then quotes it, password and all). */
function credentialsInUrl(option: string): string {
  const hint = option === 'introspection.endpoint' ? '; give the credentials as clientId and clientSecret' : ''
  return `must hold no user name or password (fetch refuses to call such a URL${hint})`
}

function parseJsonObject(body: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(body)
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined
  } catch {
    return undefined
  }
}

/**
 * An answer's media type as a message names it: `untyped` for none; as sent, quoted, when it is
 * a media type of a registered top-level type that shares no 8 characters in a row with the
 * token (and `quoted` hides it still where it looks like a secret); else `of a type not shown`.
 * An upstream (or a proxy before it) that echoes the request's Authorization into the header
 * would otherwise have the token, or most of it, in a log line: a UUID or a hex token does not
 * look like a secret (`looksSecret`).
 */
function typeShown(mediaType: string, token: string): string {
  if (mediaType === '') return 'untyped'
  return MEDIA_TYPE.test(mediaType) && !sharesRun(mediaType.toLowerCase(), token.toLowerCase(), 8) ? quoted(mediaType) : 'of a type not shown'
}

/** Whether `text` holds `length` characters in a row of `secret` (all of it, when shorter). */
function sharesRun(text: string, secret: string, length: number): boolean {
  if (secret.length <= length) return text.includes(secret)
  for (let i = 0; i + length <= secret.length; i++) if (text.includes(secret.slice(i, i + length))) return true
  return false
}

/**
 * The scopes a token's claims grant: `scope`, space-separated (RFC 9068 section 2.2.3, RFC 7662
 * section 2.2), else `scp`, as Okta (an array) and Entra ID (space-separated) name them;
 * `undefined` when neither is readable.
 */
function scopesOf(claims: Record<string, unknown>): string[] | undefined {
  const granted = typeof claims.scope === 'string' ? claims.scope : claims.scp
  if (typeof granted === 'string') return granted.split(' ').filter(Boolean)
  // An entry holding spaces is a list of its own (RFC 6749 section 3.3), never one scope.
  return Array.isArray(granted) && granted.every((scope) => typeof scope === 'string') ? granted.flatMap((scope) => scope.split(' ')).filter(Boolean) : undefined
}

/** `type/subtype` of a registered top-level type (RFC 6838 section 4.2), any case. */
const MEDIA_TYPE = /^(?:application|audio|font|haptics|image|message|model|multipart|text|video)\/[a-z0-9!#$&^_.+-]{1,127}$/i

/** RFC 7662 section 2.2 (and RFC 6839 for the `+json` suffix): a JSON media type. */
function isJsonType(contentType: string): boolean {
  return contentType === 'application/json' || /^application\/[!#$&^_.+\w-]+\+json$/.test(contentType)
}

function seconds(ms: number): number {
  return Math.max(1, Math.ceil(ms / 1000))
}

/**
 * The `rejected-locally` event of a refusal for `reason`; for an `audience mismatch`, with the
 * audience the token was to name (a copy: an observer may keep or change it).
 */
function rejectedLocally(reason: string, audience: readonly string[] | undefined): OAuthValidatorEvent {
  return { type: 'rejected-locally', reason, ...(reason === 'audience mismatch' && audience && { expected: [...audience] }) }
}

/** The default `fetch`'s failure on a runtime without a global one (Node 20 run with `--no-experimental-fetch`). */
const NO_GLOBAL_FETCH = 'this runtime has no global fetch: give createOAuthValidator a fetch option'

/**
 * Messages of failed calls that name nothing of the request, kept as they are: Node's `fetch`
 * (`fetch failed`; `terminated`, a reset mid-body), workerd's (`Network connection lost.`), and
 * the abort messages of `AbortController` (`This operation was aborted`, `The operation was
 * aborted.`), and the default `fetch`'s when the runtime has none. Any other message may quote
 * the request (a `fetch` of the platform's, or one that replaced the global, may build its
 * message from its arguments, the token and the client secret included), and is left out.
 */
const SAFE_CALL_MESSAGES: ReadonlySet<string> = new Set(['fetch failed', 'terminated', 'Network connection lost.', 'The operation was aborted.', 'This operation was aborted', NO_GLOBAL_FETCH])

/**
 * A failed call in words that hold nothing of the request: the error's name, or its message
 * when it is one of {@link SAFE_CALL_MESSAGES}, and its cause's (or its own) code
 * (`TypeError (ECONNREFUSED)`, `fetch failed (ECONNREFUSED)`). Read off any object, an error
 * of another realm's too; one whose properties throw is `a thrown object`.
 */
function describeCallFailure(error: unknown): string {
  if (error === null || typeof error !== 'object') return `a thrown ${error === null ? 'null' : typeof error}`
  try {
    const { name, message, code: own, cause } = error as { name?: unknown; message?: unknown; code?: unknown; cause?: { code?: unknown } }
    const code = (cause !== null && typeof cause === 'object' ? cause.code : undefined) ?? own
    const said =
      typeof message === 'string' && SAFE_CALL_MESSAGES.has(message)
        ? message
        : typeof name === 'string' && /^[A-Za-z]{1,40}$/.test(name)
          ? name
          : 'Error'
    return typeof code === 'string' && /^[A-Z][A-Z0-9_]{0,39}$/.test(code) ? `${said} (${code})` : said
  } catch {
    return 'a thrown object'
  }
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const code = (error.cause as { code?: unknown } | undefined)?.code
    return typeof code === 'string' ? `${error.message} (${code})` : error.message
  }
  return String(error)
}

/** Three dot-separated segments in either base64 alphabet, padded or not: the shape of a compact JWS. */
const LOOSE_JWS = /^[A-Za-z0-9_+/-]+=*\.[A-Za-z0-9_+/-]+=*\.[A-Za-z0-9_+/-]*=*$/

/**
 * Whether a token that is no compact JWS is one all the same, read leniently: its shape, and a
 * first segment that decodes (either alphabet, padded or not) to a JOSE header naming an `alg`.
 * An opaque token with dots (`ya29.…`) is none.
 */
function disguisedJws(token: string): boolean {
  if (!LOOSE_JWS.test(token)) return false
  try {
    const segment = token.slice(0, token.indexOf('.')).replace(/=+$/, '').replace(/-/g, '+').replace(/_/g, '/')
    const header: unknown = JSON.parse(atob(segment))
    return typeof header === 'object' && header !== null && typeof (header as { alg?: unknown }).alg === 'string'
  } catch {
    return false
  }
}

/** An expected audience as a list: a non-empty string, or a non-empty list of them; else `undefined`. */
function audienceListOf(value: unknown): readonly string[] | undefined {
  const list: unknown = typeof value === 'string' ? [value] : value
  return Array.isArray(list) && list.length > 0 && list.every((a) => typeof a === 'string' && a !== '') ? list : undefined
}

function formEncode(value: string): string {
  return encodeURIComponent(value).replace(/%20/g, '+')
}

const OAUTH_VALIDATOR_OPTIONS = optionNames<OAuthValidatorOptions>({
  issuer: true,
  mode: true,
  userinfoEndpoint: true,
  introspection: true,
  jwks: true,
  audience: true,
  algorithms: true,
  clockToleranceMs: true,
  cache: true,
  cacheTtlMs: true,
  rejectionTtlMs: true,
  cacheKeyPrefix: true,
  timeoutMs: true,
  retry: true,
  breaker: true,
  clientBudget: true,
  maxPendingValidations: true,
  jwksMaxAgeMs: true,
  jwksRefetchIntervalMs: true,
  fetch: true,
  sleep: true,
  timers: true,
  random: true,
  now: true,
  waitUntil: true,
  onEvent: true,
})
const RETRY_OPTIONS = optionNames<RetryOptions>({ attempts: true, baseDelayMs: true, maxDelayMs: true, deadlineMs: true })
const OAUTH_BREAKER_OPTIONS = optionNames<NonNullable<OAuthValidatorOptions['breaker']>>({ failureThreshold: true, coolDownMs: true })
const INTROSPECTION_OPTIONS = optionNames<NonNullable<OAuthValidatorOptions['introspection']>>({ clientId: true, clientSecret: true, endpoint: true })

/**
 * Creates an OAuth access-token validator for the dispatcher's `oauth` option.
 *
 * Accepted tokens are cached for `cacheTtlMs` (5 minutes), never past the token's own expiry
 * when it is known (JWT `exp`, introspection `exp`); refused ones for `rejectionTtlMs`. Keys
 * are SHA-256 hashes of the token. Concurrent first requests with one token share one
 * upstream call. Transient failures are retried with exponential backoff and jitter inside
 * a deadline; a circuit breaker opens after repeated failures, and while it is open uncached
 * tokens fail fast with `AuthorizationServerUnavailableError` (503 + `Retry-After`) while
 * cached ones keep working. Misconfiguration throws a `ConfigurationError` here, not on the
 * first request.
 *
 * @example
 * ```ts
 * const oauth = createOAuthValidator({ issuer: 'https://auth.example.com' })                 // userinfo
 * const jwt = createOAuthValidator({ issuer, mode: 'jwt' }) // audience: the App's address (needs baseUrl)
 * const rfc7662 = createOAuthValidator({ issuer, mode: 'introspection', introspection: { clientId, clientSecret } })
 * const dispatcher = createDispatcher({ apps, subscriptions, tokens, oauth, authorizationServers: [issuer] })
 * const checked = createDispatcher({ apps, subscriptions, tokens, oauth: jwt, baseUrl: (_request, app) => `https://${app.slug}.apps.example.com` })
 * ```
 */
export function createOAuthValidator(options: OAuthValidatorOptions): OAuthValidator {
  if (!options || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  refuseUnknownOptions(options, OAUTH_VALIDATOR_OPTIONS, 'createOAuthValidator')
  const issuer = options.issuer
  const issuerRefused = issuerProblem(issuer)
  if (issuerRefused !== undefined) throw new ConfigurationError('issuer', issuerRefused.replace(/^must have no query or fragment$/, '$& (RFC 8414)'))
  const mode = options.mode ?? 'userinfo'
  if (!MODES.includes(mode)) throw new ConfigurationError('mode', `must be one of ${MODES.join(', ')}`)
  checkHttpUrl('userinfoEndpoint', options.userinfoEndpoint)
  const intro = options.introspection
  if (intro != null && typeof intro === 'object') refuseUnknownOptions(intro, INTROSPECTION_OPTIONS, 'createOAuthValidator', undefined, 'introspection.')
  // Credentials given with another mode would be ignored: the default mode is userinfo, so a
  // platform that set them and forgot `mode` would validate tokens another way, unawares.
  if (intro != null && mode !== 'introspection') {
    throw new ConfigurationError('introspection', `is used in introspection mode only (mode is ${mode}): give mode: 'introspection' too, or leave it out`)
  }
  if (mode === 'introspection') {
    // An empty secret too (`CLIENT_SECRET=` unset in the environment): every introspection
    // would be refused, and every token answered 503, where the start could have failed.
    if (!intro || typeof intro.clientId !== 'string' || !intro.clientId || typeof intro.clientSecret !== 'string' || !intro.clientSecret) {
      throw new ConfigurationError('introspection', 'needs a non-empty clientId and clientSecret in introspection mode')
    }
    checkHttpUrl('introspection.endpoint', intro.endpoint)
  }
  const jwksOption = options.jwks
  let localKeys: KeySet | undefined
  if (typeof jwksOption === 'string') checkHttpUrl('jwks', jwksOption)
  else if (jwksOption !== undefined) {
    if (!jwksOption || !Array.isArray(jwksOption.keys)) throw new ConfigurationError('jwks', 'must be a URL or a JSON Web Key Set')
    localKeys = jwksOption.keys.length === 0 ? undefined : loadKeySet(jwksOption.keys)
    // An empty set too: every token would be refused, and its client sign in again and again.
    if (!localKeys) throw new ConfigurationError('jwks', 'holds no key that can verify a signature')
  }
  const audienceGiven = options.audience
  const audienceOption =
    audienceGiven === false
      ? undefined
      : (audienceGiven ?? (mode === 'userinfo' ? undefined : ({ resource }: AccessTokenContext) => resource))
  // A fixed audience, checked and made a list once; a function's answer is checked per call.
  const fixedAudience = audienceOption === undefined || typeof audienceOption === 'function' ? undefined : audienceListOf(audienceOption)
  if (audienceOption !== undefined && typeof audienceOption !== 'function' && fixedAudience === undefined) {
    throw new ConfigurationError('audience', 'must be a non-empty string, a list of them, or a function')
  }
  // A skew of more than five minutes is a clock to fix (NTP), not one to tolerate: past it, a
  // token that expired long ago would still be accepted.
  const clockToleranceMs = positive('clockToleranceMs', options.clockToleranceMs, 0, true, MAX_CLOCK_TOLERANCE_MS, 'five minutes: a larger skew is a clock to fix')
  const cacheTtlMs = positive('cacheTtlMs', options.cacheTtlMs, DEFAULT_OAUTH_CACHE_TTL_MS, false, MAX_TIMER_MS, 'about 24 days; spec 8 caches for 5 minutes')
  // `jwt` mode refuses locally, at the cost of a signature check, which shields no upstream: a
  // refusal kept would only let made-up bearer strings fill the cache (a shared one, on Redis,
  // by as many keys as a client sends strings in 30 s), so by default none is kept.
  const rejectionTtlMs = positive('rejectionTtlMs', options.rejectionTtlMs, mode === 'jwt' ? 0 : DEFAULT_OAUTH_REJECTION_TTL_MS, true, MAX_TIMER_MS, 'about 24 days')
  const timeoutMs = timerDelay('timeoutMs', options.timeoutMs, DEFAULT_OAUTH_TIMEOUT_MS)
  const maxPendingValidations = positive('maxPendingValidations', options.maxPendingValidations, 1_000)
  // A count of calls: 1.5 would let two wait, as 2 does.
  if (!Number.isSafeInteger(maxPendingValidations)) throw new ConfigurationError('maxPendingValidations', 'must be a positive integer')
  const jwksMaxAgeMs = positive('jwksMaxAgeMs', options.jwksMaxAgeMs, 600_000)
  const jwksRefetchIntervalMs = positive('jwksRefetchIntervalMs', options.jwksRefetchIntervalMs, 30_000, true)
  for (const [key, known] of [['retry', RETRY_OPTIONS], ['breaker', OAUTH_BREAKER_OPTIONS]] as const) {
    const given: unknown = options[key]
    if (given == null) continue
    if (typeof given !== 'object') throw new ConfigurationError(key, 'must be an object')
    refuseUnknownOptions(given, known, 'createOAuthValidator', undefined, `${key}.`)
  }
  const retry = {
    attempts: positive('retry.attempts', options.retry?.attempts, DEFAULT_RETRY.attempts),
    baseDelayMs: timerDelay('retry.baseDelayMs', options.retry?.baseDelayMs, DEFAULT_RETRY.baseDelayMs, true),
    maxDelayMs: timerDelay('retry.maxDelayMs', options.retry?.maxDelayMs, DEFAULT_RETRY.maxDelayMs, true),
    deadlineMs: timerDelay('retry.deadlineMs', options.retry?.deadlineMs, DEFAULT_RETRY.deadlineMs),
  }
  if (!Number.isInteger(retry.attempts)) throw new ConfigurationError('retry.attempts', 'must be a positive integer')
  for (const fn of ['fetch', 'now', 'sleep', 'random', 'onEvent', 'waitUntil'] as const) {
    if (options[fn] !== undefined && typeof options[fn] !== 'function') throw new ConfigurationError(fn, 'must be a function')
  }
  // Checked here, not on the first request: a string would be spread into letters, an object
  // without the methods would fail every validation.
  if (options.algorithms !== undefined) {
    const algorithms: unknown = options.algorithms
    if (!Array.isArray(algorithms) || algorithms.length === 0 || !algorithms.every((a) => typeof a === 'string' && a !== '')) {
      throw new ConfigurationError('algorithms', 'must be a non-empty list of JWS algorithm names, e.g. ["RS256"]')
    }
    // A misspelt name (`RS265`, `rs256`) would refuse every token, and its client sign in again
    // and again; `none` is no signature.
    const unknown = algorithms.find((a: string) => !JWS_ALGORITHMS.includes(a))
    if (unknown !== undefined) {
      throw new ConfigurationError('algorithms', `holds ${JSON.stringify(unknown.slice(0, 40))}, not a JWS signature algorithm that can be verified (${JWS_ALGORITHMS.join(', ')})`)
    }
  }
  // A number or an object would be written into every key (`5…`, `[object Object]…`), and
  // validators given different ones would share entries.
  if (options.cacheKeyPrefix !== undefined && typeof options.cacheKeyPrefix !== 'string') {
    throw new ConfigurationError('cacheKeyPrefix', 'must be a string')
  }
  if (options.timers !== undefined) requireMethods('timers', options.timers, 'a set of timers', ['setTimeout', 'clearTimeout'])
  if (options.cache !== undefined) requireMethods('cache', options.cache, 'a CacheStore', ['get', 'set', 'delete'])

  // Absolute times (a JWT's `exp`, a cached result's `validUntil`, which instances sharing a
  // cache compare) are on the wall clock; spans (call deadlines, the breaker's cool-down, the
  // discovery and key-set intervals, the in-memory cache's TTL) on a monotonic one unless a
  // clock is injected, so a wall clock stepped back (NTP, a resumed VM) stretches none of them:
  // a result is never trusted past `cacheTtlMs` of real time.
  const now = options.now ?? Date.now
  const elapsed = options.now ?? (() => performance.now())
  // The global one read at each call (a polyfill installed after creation is used). A runtime
  // without one (Node 20 run with `--no-experimental-fetch`) says so: its TypeError, reported by
  // name alone, told the operator only `discovery: TypeError`.
  const fetchImpl: typeof fetch =
    options.fetch ??
    ((input, init) => {
      if (typeof globalThis.fetch !== 'function') throw new TypeError(NO_GLOBAL_FETCH)
      return globalThis.fetch(input, init)
    })
  const timers: OAuthTimers = options.timers ?? {
    setTimeout: (callback, ms) => setTimeout(callback, ms),
    clearTimeout: (handle) => clearTimeout(handle as ReturnType<typeof setTimeout>),
  }
  const sleep = options.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)))
  const random = options.random ?? Math.random
  // Tokens accepted, for the default logger: a refusal of every token is told, one client's is not.
  const accepted = { count: 0 }
  const onEvent = options.onEvent ?? operatorLog(elapsed, accepted)
  const emit = (event: OAuthValidatorEvent) => {
    try {
      // An async observer's rejection too: ignored, not left unhandled (which ends a Node process).
      ignoreRejection(onEvent(event))
    } catch {
      // Metrics must never break validation.
    }
  }
  const cache = options.cache ?? createMemoryCacheStore<CachedValidation>({ now: options.now })
  // A probe lasts at most a validation (a call within the deadline, bounded by the timeout); one
  // older was cut short with its request (Workers) and would never report.
  // Longer than an hour, and one outage of the authorization server would answer every OAuth
  // request 503 for that long (`1e15`: until a restart).
  const coolDownMs: unknown = options.breaker?.coolDownMs
  if (typeof coolDownMs === 'number' && coolDownMs > MAX_OAUTH_COOL_DOWN_MS) {
    throw new ConfigurationError('breaker.coolDownMs', `must be at most ${MAX_OAUTH_COOL_DOWN_MS} milliseconds (an hour)`)
  }
  const breaker = createCircuitBreaker({ probeMaxAgeMs: retry.deadlineMs + timeoutMs, ...options.breaker, now: options.now, onStateChange: (change) => emit({ type: 'breaker', ...change }) })
  const waitUntil = options.waitUntil
  // The longest a validation lasts: calls within the deadline, each bounded by the timeout. One
  // older was cut short with the request that started it (Workers) and is not waited for.
  const flightOptions = { now: options.now, maxAgeMs: retry.deadlineMs + timeoutMs }
  const flights = createSingleFlight<CachedValidation>(flightOptions)
  // `jwt` mode calls nothing per token; the budget is checked at creation all the same.
  const clientBudget = createClientBudget(options.clientBudget, { now, elapsed })
  const budgeted = mode !== 'jwt'
  // Results depend on the issuer and the mode, so validators that share a store never read
  // each other's entries.
  const keyPrefix =
    (options.cacheKeyPrefix ?? 'oauth:') +
    sha256(`${mode}\n${issuer}`, 'base64url').slice(0, 10) +
    ':'
  const audienceRequired = mode !== 'userinfo'

  function expectedAudience(context: AccessTokenContext | undefined): readonly string[] | undefined {
    if (typeof audienceOption !== 'function') return fixedAudience
    // What the function gives is checked as the option is: `null`, `false`, `''` or `[]` (a
    // lookup that found nothing, in untyped code) is no audience to compare with.
    return context ? audienceListOf(audienceOption(context)) : undefined
  }

  /** One HTTP exchange with the authorization server: breaker permit, timeout, health report. */
  async function call<T>(
    endpoint: UpstreamEndpoint,
    url: string,
    init: RequestInit,
    deadline: number,
    judge: (response: UpstreamResponse) => T,
  ): Promise<T> {
    const permit = breaker.acquire()
    if (!permit.allowed) {
      throw new UpstreamFailure('circuit breaker open', false, permit.retryAfterMs)
    }
    const started = elapsed()
    const controller = new AbortController()
    const budget = Math.max(1, Math.min(timeoutMs, deadline - started))
    let timedOut = false
    let done = false
    // Judged once this process has read its sockets (see `expireOnceRead`): after a hold of its
    // event loop, the answer may be there unread, and a call so failed counted against the server.
    const timer = timers.setTimeout(() => {
      expireOnceRead(elapsed() - started - budget, () => {
        if (done) return
        timedOut = true
        controller.abort()
      })
    }, budget)
    let response: UpstreamResponse
    let waitMs: number | undefined
    try {
      const res = await fetchLettingGo(fetchImpl, url, { ...init, redirect: 'manual' }, controller)
      waitMs = res.status === 429 || res.status === 503 ? retryAfterMs(res.headers.get('retry-after'), now()) : undefined
      // The status of these says all; their bodies (an HTML error page) are not read.
      const judged = res.status !== 429 && !isServerError(res.status)
      if (!judged) void res.body?.cancel().catch(() => {})
      const body = judged ? await readTextUpTo(res, MAX_ANSWER_BYTES[endpoint]) : ''
      if (body === null) {
        // Not worth retrying. From userinfo or introspection the server is up and the answer is
        // this token's (a user's profile can grow it): not counted. A discovery document or key
        // set that large is the server's own failure, as any other bad answer of those.
        const message = `${endpoint}: answer over ${MAX_ANSWER_BYTES[endpoint]} bytes`
        const aboutToken = endpoint === 'userinfo' || endpoint === 'introspection'
        if (aboutToken) breaker.success(permit)
        else breaker.failure(permit)
        emit({ type: 'upstream', endpoint, outcome: 'failure', status: res.status, durationMs: elapsed() - started, error: message })
        throw new UpstreamFailure(message, false, undefined, undefined, aboutToken)
      }
      const mediaType = (res.headers.get('content-type') ?? '').split(';')[0]!.trim()
      response = { status: res.status, body, contentType: mediaType.toLowerCase(), mediaType, challenge: res.headers.get('www-authenticate') }
    } catch (error) {
      if (error instanceof UpstreamFailure) throw error
      const message = timedOut ? `${endpoint}: timed out after ${Math.round(budget)} ms` : `${endpoint}: ${describeCallFailure(error)}`
      breaker.failure(permit)
      emit({ type: 'upstream', endpoint, outcome: 'failure', durationMs: elapsed() - started, error: message })
      throw new UpstreamFailure(message, true)
    } finally {
      done = true
      timers.clearTimeout(timer)
    }
    const durationMs = elapsed() - started
    if (response.status === 429) {
      // Slow down, from a server that is up: often a limit per user or per client (Auth0's
      // userinfo limit is per user), so it does not count against the server, or one user's
      // limit would open the breaker for everyone; nor for it (a server shedding load may mix
      // 429s with 503s). A half-open probe that gets one has not shown the server ready: the
      // breaker opens again. Retried only as soon as it says.
      const message = `${endpoint}: HTTP 429`
      if (permit.probe) breaker.failure(permit)
      emit({ type: 'upstream', endpoint, outcome: 'failure', status: 429, durationMs, error: message })
      throw new UpstreamFailure(message, waitMs === undefined, undefined, waitMs)
    }
    if (isServerError(response.status)) {
      const message = `${endpoint}: HTTP ${response.status}`
      breaker.failure(permit)
      emit({ type: 'upstream', endpoint, outcome: 'failure', status: response.status, durationMs, error: message })
      throw new UpstreamFailure(message, true, undefined, waitMs)
    }
    try {
      const value = judge(response)
      breaker.success(permit)
      emit({ type: 'upstream', endpoint, outcome: 'ok', status: response.status, durationMs })
      return value
    } catch (error) {
      const bad = error instanceof BadAnswer ? error : new BadAnswer(describe(error), true)
      const message = `${endpoint}: ${bad.message}`
      // An answer that shows a healthy server (an unexpected 4xx for this token) does not count.
      if (bad.counts) breaker.failure(permit)
      else breaker.success(permit)
      emit({ type: 'upstream', endpoint, outcome: 'failure', status: response.status, durationMs, error: message })
      throw new UpstreamFailure(message, false, undefined, undefined, bad.aboutToken)
    }
  }

  // Discovery: shared by concurrent validations. Without a document in hand a failure is not
  // remembered; with one, it keeps that document for 5 more minutes.
  let metadata: AuthorizationServerMetadata | null | undefined
  // "No document" (404 at both addresses), or a document without the endpoint this mode needs,
  // is believed for 5 minutes only: an authorization server that was not up yet behind its
  // proxy, or not yet set up for this mode, publishes a better one later. A complete document
  // is believed for a day (`METADATA_TTL_MS`), then fetched again in the background while it
  // serves, and kept if that fails: a server that moves an endpoint is followed without a restart.
  let metadataUntil = Infinity
  // When discovery was last asked for, and whether an endpoint of the document in hand has
  // since answered 404 or 410 (moved): the next validation then waits for the document again,
  // at most once per `REDISCOVERY_INTERVAL_MS`.
  let discoveryAskedAt = -Infinity
  let endpointMoved = false
  const discovering = createSingleFlight<AuthorizationServerMetadata | null>(flightOptions)
  const lacksEndpoint = (doc: AuthorizationServerMetadata) =>
    (mode === 'jwt' && jwksOption === undefined && !doc.jwks_uri) ||
    (mode === 'introspection' && !intro?.endpoint && !doc.introspection_endpoint)

  // The endpoint this mode takes from discovery, which must be https when the issuer is: a
  // plain http one the validator never calls is no reason to refuse the document.
  const calledFromDiscovery: readonly DiscoveredEndpoint[] =
    mode === 'jwt'
      ? jwksOption === undefined ? ['jwks_uri'] : []
      : mode === 'introspection'
        ? intro?.endpoint ? [] : ['introspection_endpoint']
        : options.userinfoEndpoint ? [] : ['userinfo_endpoint']

  async function discover(deadline: number): Promise<AuthorizationServerMetadata | null> {
    if (metadata !== undefined && elapsed() < metadataUntil) return metadata
    // A complete document in hand: kept whatever its refetch brings.
    const kept = metadata && !lacksEndpoint(metadata) ? metadata : undefined
    if (kept && !endpointMoved) {
      // Past its day: the document in hand serves while it is fetched again, with a deadline
      // of its own, and only while the breaker is closed (a half-open breaker's one probe is
      // the token's call). Not asked again for 5 minutes, however this fetch ends (a runtime
      // may cut it short, and it then never settles).
      if (breaker.state === 'closed') {
        metadataUntil = elapsed() + REDISCOVERY_INTERVAL_MS
        const refresh = fetchMetadata(elapsed() + retry.deadlineMs, kept).catch(() => {})
        waitUntil?.(refresh)
      }
      return kept
    }
    return fetchMetadata(deadline, kept)
  }

  /**
   * Fetches the discovery document once for all callers. With `kept` (a complete document in
   * hand), a failure or no document at all keeps it for 5 minutes more: a server that is down,
   * or no longer publishes discovery, takes nothing away.
   */
  function fetchMetadata(deadline: number, kept: AuthorizationServerMetadata | undefined): Promise<AuthorizationServerMetadata | null> {
    return discovering.run('discovery', async () => {
      discoveryAskedAt = elapsed()
      try {
        for (const url of discoveryUrls(issuer)) {
          const doc = await call('discovery', url, { headers: { accept: 'application/json' } }, deadline, (res) => {
            if (res.status === 404 || res.status === 410) return null
            if (res.status < 200 || res.status >= 300) throw new BadAnswer(`HTTP ${res.status}`, true)
            const parsed = parseJsonObject(res.body)
            const problem = checkAuthorizationServerMetadata(parsed, issuer, calledFromDiscovery)
            if (problem) throw new BadAnswer(problem, true)
            return parsed as AuthorizationServerMetadata
          })
          if (doc && !(kept && lacksEndpoint(doc))) {
            metadataUntil = elapsed() + (lacksEndpoint(doc) ? REDISCOVERY_INTERVAL_MS : METADATA_TTL_MS)
            return (metadata = doc)
          }
        }
      } catch (error) {
        if (!kept) throw error
      } finally {
        // Cleared once the document is in (or kept): validations that came meanwhile joined
        // this fetch rather than calling the old address.
        endpointMoved = false
      }
      metadataUntil = elapsed() + REDISCOVERY_INTERVAL_MS
      return (metadata = kept ?? null)
    }).promise
  }

  /**
   * An endpoint discovery named answered 404 or 410: the server may have moved it. The next
   * validation that needs the document waits for it again (at most once per
   * `REDISCOVERY_INTERVAL_MS`), rather than calling the old address until the day is out.
   */
  function discoveredEndpointGone(status: number): void {
    if ((status === 404 || status === 410) && metadata && elapsed() - discoveryAskedAt >= REDISCOVERY_INTERVAL_MS) {
      endpointMoved = true
      metadataUntil = elapsed()
    }
  }

  /**
   * Why the endpoint `field` of discovery (`jwks_uri`, `introspection_endpoint`) is not known:
   * the document lacks it, or there is no document at all (404 or 410 at both discovery
   * addresses), most often an `issuer` that is not the server's (a realm or tenant path left
   * out, a typo). The second names the addresses asked: "publishes no jwks_uri" alone sent the
   * operator to the server's document, which does publish one, at the right issuer.
   */
  function noEndpoint(endpoint: UpstreamEndpoint, field: string, doc: AuthorizationServerMetadata | null | undefined): string {
    return doc ? `${endpoint}: the issuer publishes no ${field}` : `${endpoint}: ${undiscovered()}`
  }

  /** That discovery found no document, where it asked, and the option to check. */
  function undiscovered(): string {
    return `no discovery document at ${discoveryUrls(issuer).map((url) => JSON.stringify(url)).join(' or ')} (HTTP 404 or 410): is the issuer ${JSON.stringify(issuer)} the server's own?`
  }

  async function validateAtUserinfo(token: string, claims: JWTPayload | undefined, deadline: number): Promise<Outcome> {
    const doc = options.userinfoEndpoint === undefined ? await discover(deadline) : undefined
    const discovered = doc?.userinfo_endpoint
    // With no discovery document, the endpoint is a guess (`{issuer}/userinfo`): one that is not
    // there says so, rather than a bare `userinfo: HTTP 404` at an address no one configured.
    const guessed = options.userinfoEndpoint === undefined && discovered === undefined && doc === null
    const endpoint = options.userinfoEndpoint ?? discovered ?? fallbackUserinfoEndpoint(issuer)
    const headers = { authorization: `Bearer ${token}`, accept: 'application/json' }
    return call('userinfo', endpoint, { method: 'GET', headers }, deadline, (res): Outcome => {
      if (discovered !== undefined) discoveredEndpointGone(res.status)
      if (res.status === 401) return { active: false, reason: REJECTED_UPSTREAM }
      // An answer about this token (RFC 6750 section 3.1: 400 invalid_request, 403
      // insufficient_scope, for a token granted without `openid`), which says so in its Bearer
      // challenge: refused, and remembered as a refusal; the server is healthy. A 400 or 403
      // without one (a gateway's, a firewall's) is not about the token: an upstream failure.
      if ((res.status === 400 || res.status === 403) && res.challenge !== null && bearerTokenError(res.challenge)) {
        return { active: false, reason: `${REJECTED_UPSTREAM} (HTTP ${res.status})` }
      }
      // Not counted against the server, which answered. A 4xx may be about the token (one a
      // made-up string provokes, 431 for an oversized header): the client's budget unit is
      // kept. A redirect or an endpoint that is not there (404, 405, 410) is the setup's: given back.
      if (guessed && SETUP_STATUSES.has(res.status)) {
        throw new BadAnswer(`HTTP ${res.status} at ${JSON.stringify(endpoint)}, tried for want of a discovery document; ${undiscovered()}`, false, false)
      }
      if (res.status < 200 || res.status >= 300) throw new BadAnswer(`HTTP ${res.status}`, false, res.status >= 400 && !SETUP_STATUSES.has(res.status))
      // OIDC Core section 5.3.2: the claims as JSON, or as a signed JWT (`application/jwt`) when
      // the client registered `userinfo_signed_response_alg`. The answer comes straight from the
      // endpoint this validator called, so its claims are read as a JSON answer's are.
      const signed = res.contentType === 'application/jwt'
      const body = signed ? (peekJwtClaims(res.body.trim()) as Record<string, unknown> | undefined) : parseJsonObject(res.body)
      // A success that is no JSON object (an HTML sign-in page, a web app's catch-all at
      // `{issuer}/userinfo`, a firewall's block page served with 200 for one client's token)
      // is taken as one without `sub`, below: a token can provoke it, so it must not open the
      // breaker for everyone, and the client's budget unit is kept.
      if (!signed && body === undefined) throw new BadAnswer(`answer is not a JSON object (${typeShown(res.mediaType, token)})`, false)
      // An answer that names its issuer names the one that issued the token (OIDC Core section
      // 5.3.2 for a signed one); another issuer's token (a userinfo endpoint several tenants or
      // issuers share, which takes each one's tokens) is not a token of this issuer (spec 5.1
      // step 5), and its `sub` is another namespace's: refused, as in introspection mode.
      if (body !== undefined && body.iss !== undefined && body.iss !== issuer) return { active: false, reason: 'issuer mismatch' }
      const sub = body?.sub
      // A healthy server's answer this validator cannot use (an encrypted userinfo JWT, a body
      // without `sub`): 503 for this token, not counted against the server, since one user's
      // client registration can cause it and must not open the breaker for everyone.
      if (typeof sub !== 'string' || sub === '') throw new BadAnswer('answer has no sub', false)
      if (unusableSubject(sub)) throw new BadAnswer('answer has a sub that is not well-formed Unicode, or holds a NUL', false)
      const expiresAt = typeof claims?.exp === 'number' ? claims.exp * 1000 : undefined
      const audience = audienceList(claims?.aud)
      return {
        active: true,
        info: { subject: sub, ...(expiresAt !== undefined && { expiresAt }) },
        ...(audience && { audience }),
        ...(expiresAt !== undefined && { expiresAt }),
      }
    })
  }

  async function validateByIntrospection(token: string, claims: JWTPayload | undefined, deadline: number): Promise<Outcome> {
    const client = intro!
    const doc = client.endpoint === undefined ? await discover(deadline) : undefined
    const endpoint = client.endpoint ?? doc?.introspection_endpoint
    if (!endpoint) throw new UpstreamFailure(noEndpoint('introspection', 'introspection_endpoint', doc), false)
    const credentials = Buffer.from(`${formEncode(client.clientId)}:${formEncode(client.clientSecret)}`).toString('base64')
    const init: RequestInit = {
      method: 'POST',
      headers: {
        authorization: `Basic ${credentials}`,
        'content-type': 'application/x-www-form-urlencoded',
        accept: 'application/json',
      },
      body: new URLSearchParams({ token, token_type_hint: 'access_token' }).toString(),
    }
    return call('introspection', endpoint, init, deadline, (res): Outcome => {
      if (client.endpoint === undefined) discoveredEndpointGone(res.status)
      // The server is up (not counted) but refused the resource server, whatever the token:
      // not an answer about the token, so the client's budget unit goes back.
      if (res.status === 401 || res.status === 403) {
        throw new BadAnswer(`HTTP ${res.status}: the introspection endpoint refused the client credentials`, false, false)
      }
      // RFC 7009 section 2.2.1's error, which providers also give at introspection for a token
      // of a kind they will not introspect (oidc-provider, for an ID token): the token is
      // refused, the server is healthy.
      if (res.status === 400 && parseJsonObject(res.body)?.error === 'unsupported_token_type') {
        return { active: false, reason: 'unsupported token type' }
      }
      // As at userinfo: a 4xx may be about the token, a redirect or a missing endpoint is the setup's.
      if (res.status < 200 || res.status >= 300) throw new BadAnswer(`HTTP ${res.status}`, false, res.status >= 400 && !SETUP_STATUSES.has(res.status))
      // RFC 7662 section 2.2: the answer is `application/json`. Anything else (an HTML page a
      // proxy or login front end put there, whatever it holds) is no introspection answer.
      if (!isJsonType(res.contentType)) throw new BadAnswer(`answer is ${typeShown(res.mediaType, token)}, not JSON`, true)
      const body = parseJsonObject(res.body)
      if (!body || typeof body.active !== 'boolean') throw new BadAnswer('answer has no boolean active', true)
      if (!body.active) return { active: false, reason: 'inactive token' }
      // Times are NumericDates (RFC 7662 section 2.2, RFC 7519 section 2): one present in
      // another form cannot be checked, so the token is refused, as `jwt` mode refuses such a
      // claim; an `exp` that is not read would keep a token cached past its end.
      for (const claim of ['exp', 'nbf', 'iat'] as const) {
        if (body[claim] !== undefined && typeof body[claim] !== 'number') return { active: false, reason: `malformed ${claim}` }
      }
      if (body.iss !== undefined && body.iss !== issuer) return { active: false, reason: 'issuer mismatch' }
      const tokenType = body.token_type
      if (tokenType !== undefined && (typeof tokenType !== 'string' || tokenType.toLowerCase() !== 'bearer')) {
        return { active: false, reason: 'not a bearer access token' }
      }
      // Sender-constrained tokens (DPoP, mTLS) need a proof this layer does not check.
      if (body.cnf !== undefined) return { active: false, reason: 'sender-constrained token' }
      if (typeof body.nbf === 'number' && body.nbf * 1000 > now() + clockToleranceMs) return { active: false, reason: 'token not yet valid', uncacheable: true }
      const sub = body.sub
      if (typeof sub !== 'string' || sub === '') return { active: false, reason: 'token has no subject' }
      if (unusableSubject(sub)) return { active: false, reason: SUBJECT_NOT_WELL_FORMED }
      // A JWT's own `exp` bounds it too (RFC 7662 makes `exp` optional, and a provider may
      // answer a later one): the cache, in Redis as in memory, never keeps it past either.
      const answered = typeof body.exp === 'number' ? body.exp * 1000 : undefined
      const own = typeof claims?.exp === 'number' ? claims.exp * 1000 : undefined
      const expiresAt = answered === undefined ? own : own === undefined ? answered : Math.min(answered, own)
      // An ID token some servers answer active (Keycloak: `typ: "ID"` and the token's claims
      // copied into the answer) is refused as in `jwt` mode; the client's own id in its audience
      // names the client, never an App (an ID token's audience is its client), so it is no match.
      if (idTokenSigns(body)) return { active: false, reason: 'not an access token (ID token)' }
      const audience = resourceAudience(body)
      const scopes = scopesOf(body)
      return {
        active: true,
        info: {
          subject: sub,
          ...(typeof body.client_id === 'string' && { clientId: body.client_id }),
          ...(scopes && { scopes }),
          ...(expiresAt !== undefined && { expiresAt }),
        },
        ...(audience && { audience }),
        ...(expiresAt !== undefined && { expiresAt }),
      }
    })
  }

  // JWKS for `jwt` mode: a local set, or fetched (and refetched) through the breaker.
  // `fetchedAt` (wall clock) is compared with a token's `iat`; `fetchedSince` (the span clock)
  // times the set's age and the refetch interval.
  let remoteKeys: (KeySet & { readonly fetchedAt: number; readonly fetchedSince: number; suspect?: boolean }) | undefined
  const fetchingKeys = createSingleFlight<KeySet>(flightOptions)
  // When the JWKS was last asked for, whatever came of it: a refetch (for an unknown `kid`, or
  // of keys past their age) is bounded by attempts, not by successes, so a JWKS endpoint that
  // fails is not asked again for every token.
  let jwksAskedAt = -Infinity

  async function keys(deadline: number, refresh: boolean): Promise<KeySet> {
    if (localKeys) return localKeys
    if (remoteKeys && !refresh) {
      // Keys past their age are used while the refetch runs: a slow or hung JWKS endpoint
      // must not make every new token wait for its timeout.
      if (keysStale(remoteKeys) && elapsed() - jwksAskedAt >= jwksRefetchIntervalMs) {
        // Never rejects (the keys in hand stay), unless the runtime cut it short.
        const refetch = fetchKeys(deadline).catch(() => {})
        waitUntil?.(refetch)
      }
      return remoteKeys
    }
    return fetchKeys(deadline)
  }

  function keysStale(set: { readonly fetchedSince: number; suspect?: boolean }): boolean {
    return set.suspect === true || elapsed() - set.fetchedSince >= jwksMaxAgeMs
  }

  /** Fetches the JWKS once for all callers; on failure, the keys in hand (if any) stay. */
  function fetchKeys(deadline: number): Promise<KeySet> {
    return fetchingKeys.run('jwks', async () => {
      jwksAskedAt = elapsed()
      try {
        const doc = typeof jwksOption === 'string' ? undefined : await discover(deadline)
        const url = typeof jwksOption === 'string' ? jwksOption : doc?.jwks_uri
        if (!url) throw new UpstreamFailure(noEndpoint('jwks', 'jwks_uri', doc), false)
        const loaded = await call('jwks', url, { headers: { accept: 'application/json' } }, deadline, (res) => {
          if (typeof jwksOption !== 'string') discoveredEndpointGone(res.status)
          if (res.status < 200 || res.status >= 300) throw new BadAnswer(`HTTP ${res.status}`, true)
          const set = parseJsonObject(res.body)
          if (!set || !Array.isArray(set.keys)) throw new BadAnswer('answer is not a JSON Web Key Set', true)
          // A set whose every key is unusable, or an empty one while no keys are in hand (an
          // issuer not set up yet), is a bad answer like any other: counted, and not kept, so
          // the next token asks again (bounded by the breaker) rather than the set failing every
          // token until it is past its age. An empty set replacing keys in hand withdraws them
          // (a compromised key pulled with no successor yet): it is kept, and verifies nothing.
          if (set.keys.length === 0 && !remoteKeys) throw new BadAnswer('the key set has no keys', true)
          const keySet = loadKeySet(set.keys)
          if (!keySet) throw new BadAnswer('no key of the set can verify a signature', true)
          return keySet
        })
        remoteKeys = { ...loaded, fetchedAt: now(), fetchedSince: elapsed() }
        return remoteKeys
      } catch (error) {
        // Stale keys beat no keys while the server is sick.
        if (remoteKeys) return remoteKeys
        throw error
      }
    }).promise
  }

  /**
   * Why a token naming a `kid` the keys in hand lack is refused before any thought of a key
   * rotation, from what it says of itself (unverified): it would be refused once its key was
   * known (another issuer, expired, not yet valid, for another audience, no subject, a `cnf`), its
   * signature cannot be one of its algorithm's (a few bytes of junk), or it claims to be issued
   * further ahead of now than an issuer's clock runs (`ISSUER_CLOCK_AHEAD_MS`: no key could
   * have been rotated in for it yet). Such a token must get 401,
   * not the 503 and the JWKS refetch a rotated key is worth.
   */
  function unknownKeyRefusal(
    claims: JWTPayload,
    alg: unknown,
    token: string,
    audience: readonly string[] | undefined,
    keysFetched = true,
  ): Outcome | undefined {
    const reason =
      checkAccessTokenClaims(claims, { issuer, requireIssuer: true, now: now(), clockToleranceMs, audience }) ??
      (typeof claims.exp !== 'number' ? 'claim check failed: exp' : undefined) ??
      (typeof claims.sub !== 'string' || claims.sub === '' ? 'token has no subject' : undefined) ??
      // Sender-constrained: refused once its key is known too (`validateJwt`), whatever signed it.
      (claims.cnf !== undefined ? 'sender-constrained token' : undefined) ??
      (signatureFits(alg, token.slice(token.lastIndexOf('.') + 1)) ? undefined : 'invalid signature or token') ??
      // No key published since the last fetch can have signed a token issued later than an
      // issuer's clock can be ahead of this one; with no fetch yet, nothing is known of the
      // keys, and an `iat` to come is no reason to refuse. (Within `ISSUER_CLOCK_AHEAD_MS` it is
      // judged as a recent `iat`: a rotation since the fetch, not refused while none can show it.)
      (keysFetched && typeof claims.iat === 'number' && claims.iat * 1000 > now() + clockToleranceMs + ISSUER_CLOCK_AHEAD_MS
        ? 'no matching key'
        : undefined)
    if (reason === undefined) return undefined
    // The audience depends on the App it was presented to, `nbf` and `iat` pass: not remembered.
    const uncacheable = reason === 'audience mismatch' || reason === 'token not yet valid' || reason === 'no matching key'
    return { active: false, reason, ...(uncacheable && { uncacheable }) }
  }

  /**
   * Whether the keys in hand refused a token (`error`) in a way a key rotated in since they
   * were fetched would explain: it names a `kid` no key of the set has, or it names none and no
   * key of the set verifies it (or none is of its algorithm).
   */
  function mayBeRotatedIn(error: unknown, kid: unknown, set: KeySet): boolean {
    if (kid === undefined) {
      return error instanceof joseErrors.JWKSNoMatchingKey || error instanceof joseErrors.JWSSignatureVerificationFailed
    }
    return typeof kid === 'string' && error instanceof joseErrors.JWKSNoMatchingKey && !set.kids.has(kid)
  }

  /**
   * The 503 for a token whose `kid` the keys in hand cannot verify yet: asked again once a JWKS
   * refetch is allowed. For a reason of the server's (a key it publishes unusable, a refetch
   * that failed) it is `unavailable`; judged by the token's own `iat` alone (issued since the
   * keys were fetched: a key the issuer may have rotated in since), `unknown-key`, which no
   * operator can act on and any client can cause (a made-up `kid` and a fresh `iat`), so the
   * default logger writes nothing of it.
   */
  function keyNotYetUsable(kid: string | undefined, why: string, serversOwn: boolean): AuthorizationServerUnavailableError {
    const retryAfter = seconds(Math.max(jwksRefetchIntervalMs - (elapsed() - jwksAskedAt), 1000))
    const named = kid === undefined ? 'no kid' : `kid ${JSON.stringify(kid.slice(0, 64))}`
    emit(serversOwn ? { type: 'unavailable', retryAfter, error: `jwks: the set ${why} (${named})` } : { type: 'unknown-key', retryAfter, error: `jwks: the set ${why} (${named})` })
    return new AuthorizationServerUnavailableError(retryAfter)
  }

  async function validateJwt(token: string, deadline: number, audience: readonly string[] | undefined): Promise<Outcome> {
    let header
    let claims: JWTPayload | undefined
    try {
      claims = peekJwtClaims(token)
      if (!claims) throw new Error('not a JWT')
      header = decodeProtectedHeader(token)
    } catch {
      return { active: false, reason: 'not a JWT access token' }
    }
    // RFC 9068 section 4: a JWT typed as another kind (an ID token typed `id_token+jwt`, a
    // logout token, a `secevent+jwt`) is no access token. `at+jwt` is the profile's; untyped
    // and plain `JWT` are taken, since common providers issue their access tokens so.
    // A `typ` that is no string (`["id_token+jwt"]`) types nothing the profile knows: refused.
    const typ = header.typ === undefined ? undefined : typeof header.typ === 'string' ? header.typ.toLowerCase().replace(/^application\//, '') : ''
    if (typ !== undefined && typ !== 'at+jwt' && typ !== 'jwt') return { active: false, reason: 'not an access token (typ)' }
    // An ID token untyped or typed plain `JWT` (as most providers issue them) says what it is by
    // its claims: refused whatever its audience, before any key is looked for.
    if (typ !== 'at+jwt' && idTokenSigns(claims)) return { active: false, reason: 'not an access token (ID token)' }
    // An expired token is refused whatever its signature, so without checking it: a client
    // that keeps sending its token past `exp` (refused ones are not cached in this mode by
    // default) costs a decode, not a signature check each time. The boundary is `jose`'s, which
    // would refuse it after the signature: `exp` at or before now (whole seconds, rounded down)
    // less the tolerance. (Its reason is then `token expired` even for a forged signature.)
    if (typeof claims.exp === 'number' && claims.exp <= Math.floor(now() / 1000) - clockToleranceMs / 1000) {
      return { active: false, reason: 'token expired' }
    }
    // No keys in hand yet (none fetched since start, every fetch so far failed): a token its own
    // claims refuse is refused without them, as one naming a key not yet known is (below), so
    // an expired or foreign token gets its 401 while the JWKS endpoint fails, and no fetch.
    if (!localKeys && remoteKeys === undefined) {
      const refusal = unknownKeyRefusal(claims, header.alg, token, audience, false)
      if (refusal) return refusal
    }
    const verifyOptions = {
      issuer,
      // RFC 9068 section 2.2: an access token expires; one without `exp` would be taken until
      // its key is withdrawn.
      requiredClaims: ['exp'],
      currentDate: new Date(now()),
      clockTolerance: clockToleranceMs / 1000,
      ...(options.algorithms && { algorithms: [...options.algorithms] }),
    }
    // Keys past their age still verify while the refetch runs, but what they accept is not
    // cached: the refetch may show the key withdrawn.
    let stale = false as boolean
    // Refused for a key the set may hold later (see `mayBeRotatedIn`): not remembered.
    let keyMayComeLater = false as boolean
    const verify = async (refresh: boolean) => {
      stale = !refresh && !localKeys && remoteKeys !== undefined && keysStale(remoteKeys)
      return jwtVerifyWithKeySet(token, (await keys(deadline, refresh)).getKey, verifyOptions)
    }
    let payload: JWTPayload
    try {
      try {
        payload = await verify(false)
      } catch (error) {
        // A key rotated since the last fetch: refetch once per interval, so unknown `kid`s
        // cannot make the validator hammer the JWKS endpoint. Only for a `kid` no key of the
        // set has (one the set holds for another algorithm, an ES256 token naming an RSA key,
        // is refused as it is), or for a token naming no key that no key of the set verifies:
        // an issuer that leaves `kid` out rotates its keys all the same.
        if (localKeys || !remoteKeys || !mayBeRotatedIn(error, header.kid, remoteKeys)) throw error
        const kid = header.kid as string | undefined
        keyMayComeLater = true
        const refusal = unknownKeyRefusal(claims, header.alg, token, audience)
        if (refusal) return refusal
        // A token issued since the keys in hand were fetched may be signed with a key the issuer
        // rotated in meanwhile: not refused while no fetch could show it (a 401 would send the
        // client to refresh, into a token signed the same way) but answered 503, and asked again
        // once a refetch is allowed. One issued before that fetch names a key the set did not
        // hold then (an issuer publishes a key before it signs with it): refused, not cached. A
        // key the set publishes unusable is the server's failure whatever the `iat`. `iat` is in
        // whole seconds: a token of the fetch's own second may be the later.
        const unusable = (set: KeySet) => kid !== undefined && set.unusableKids.has(kid)
        const serversFault = (set: KeySet & { readonly fetchedAt: number }) => unusable(set) || issuedSince(claims.iat, set.fetchedAt, clockToleranceMs)
        // A refetch in flight (of keys past their age, maybe started by this very request) is
        // waited for rather than refused: it may bring the key. Where a refetch in the background
        // ends with the request that started it (Workers without `waitUntil`), the refetch a
        // request waits for is the only one that gets an answer.
        if (elapsed() - jwksAskedAt < jwksRefetchIntervalMs && !fetchingKeys.has('jwks')) {
          // The server's own when it publishes the key unusable, or its last refetch failed.
          if (serversFault(remoteKeys)) throw keyNotYetUsable(kid, 'holds no usable key for it', unusable(remoteKeys) || remoteKeys.fetchedSince < jwksAskedAt)
          throw error
        }
        try {
          payload = await verify(true)
        } catch (refetched) {
          // A refetch that failed leaves the keys fetched before it was asked: judged as within
          // the interval. One that answered without the key refuses the token, unless it
          // publishes the key unusable.
          const kept = remoteKeys
          if (kept && mayBeRotatedIn(refetched, kid, kept)) {
            const failed = kept.fetchedSince < jwksAskedAt
            if (failed ? serversFault(kept) : unusable(kept)) {
              throw keyNotYetUsable(kid, failed ? 'could not be refetched' : 'holds no usable key for it', failed || unusable(kept))
            }
          }
          throw refetched
        }
      }
    } catch (error) {
      if (error instanceof UpstreamFailure || error instanceof AuthorizationServerUnavailableError) throw error
      if (!(error instanceof joseErrors.JOSEError)) {
        // `jose` refuses whatever a token can be wrong with as a JOSE error; anything else
        // comes from a key that would not import or verify (one `loadKeySet` did not catch).
        // A local set is the platform's configuration: the error goes as it is. A fetched one
        // is a bad answer of the authorization server: 503, counted by the breaker once per
        // set, and the set refetched as soon as a refetch is allowed rather than trusted for its
        // age. Once, not per token: the token chooses the key it names, so a client sending
        // junk that names such a key (an ML-DSA key on a runtime without ML-DSA) would
        // otherwise open the breaker for everyone in as many requests as its threshold.
        if (localKeys || !remoteKeys) throw error
        const message = `jwks: a key of the set cannot be used (${describe(error)})`
        if (!remoteKeys.suspect) {
          remoteKeys.suspect = true
          breaker.failure()
          emit({ type: 'upstream', endpoint: 'jwks', outcome: 'failure', durationMs: 0, error: message })
        }
        throw new UpstreamFailure(message, false)
      }
      if (error instanceof joseErrors.JWTExpired) return { active: false, reason: 'token expired' }
      if (error instanceof joseErrors.JWTClaimValidationFailed) {
        // A token refused for its `nbf` becomes good when that passes: not remembered, as in
        // introspection mode.
        return { active: false, reason: `claim check failed: ${error.claim}`, ...(error.claim === 'nbf' && { uncacheable: true }) }
      }
      // Not cached: the key may appear at the next JWKS refetch.
      if (error instanceof joseErrors.JWKSNoMatchingKey) return { active: false, reason: 'no matching key', uncacheable: true }
      return { active: false, reason: 'invalid signature or token', ...(keyMayComeLater && { uncacheable: true }) }
    }
    // Sender-constrained (RFC 9449 section 6.1 `cnf.jkt`, RFC 8705 section 3.1 `cnf.x5t#S256`):
    // bound to a key this layer checks no proof of, so it is no bearer token here, as in
    // introspection mode. Taken as one, a stolen DPoP- or mTLS-bound token would pass.
    if (payload.cnf !== undefined) return { active: false, reason: 'sender-constrained token' }
    const sub = payload.sub
    if (typeof sub !== 'string' || sub === '') return { active: false, reason: 'token has no subject' }
    if (unusableSubject(sub)) return { active: false, reason: SUBJECT_NOT_WELL_FORMED }
    const expiresAt = typeof payload.exp === 'number' ? payload.exp * 1000 : undefined
    // What is cached, and checked against each App it is presented to: never the client's own id.
    const tokenAudience = resourceAudience(payload)
    const clientId = typeof payload.client_id === 'string' ? payload.client_id : typeof payload.azp === 'string' ? payload.azp : undefined
    const scopes = scopesOf(payload)
    return {
      active: true,
      info: {
        subject: sub,
        ...(clientId !== undefined && { clientId }),
        ...(scopes && { scopes }),
        ...(expiresAt !== undefined && { expiresAt }),
      },
      ...(tokenAudience && { audience: tokenAudience }),
      ...(expiresAt !== undefined && { expiresAt }),
      ...(stale && { uncacheable: true }),
    }
  }

  /**
   * The last `forget` of each cache key, for as long as a validation may last (a validation
   * in flight when one came in for its token does not cache its answer, which it may have got
   * before the revocation the platform just learnt of). Per key, so that forgetting one token
   * leaves every other token's caching and single flight alone. Oldest first: pruned as they
   * expire. Generations come from one counter that only grows, so a key pruned and forgotten
   * again never gets a number an older validation still holds. Past the map's bound the
   * `<key>:forgotten` mark in the cache still guards the write.
   */
  const forgets = new Map<string, { generation: number; until: number }>()
  const MAX_FORGETS = 100_000
  let forgetSequence = 0
  function generation(key: string): number {
    return forgets.get(key)?.generation ?? 0
  }
  function noteForget(key: string, forMs: number): void {
    // A span: on the monotonic clock, so a wall clock stepped forward prunes no record early
    // (the cache's mark, on the wall clock, would then have passed too, and a validation in
    // flight would cache an answer from before the revocation).
    const at = elapsed()
    forgets.delete(key)
    forgets.set(key, { generation: ++forgetSequence, until: at + forMs })
    for (const [k, entry] of forgets) {
      if (entry.until > at && forgets.size <= MAX_FORGETS) break
      forgets.delete(k)
    }
  }

  async function remember(key: string, outcome: Outcome, asked: number): Promise<CachedValidation> {
    const at = now()
    let entry: CachedValidation
    if (outcome.active) {
      const expiresAt = outcome.expiresAt
      if (expiresAt !== undefined && expiresAt + clockToleranceMs <= at) {
        entry = { active: false, reason: 'token expired', validUntil: at + rejectionTtlMs }
      } else {
        const validUntil = outcome.uncacheable
          ? at
          : Math.min(at + cacheTtlMs, expiresAt === undefined ? Infinity : expiresAt + clockToleranceMs)
        entry = { active: true, info: outcome.info, ...(outcome.audience && { audience: outcome.audience }), validUntil }
      }
    } else {
      entry = { active: false, reason: outcome.reason, validUntil: at + (outcome.uncacheable ? 0 : rejectionTtlMs) }
    }
    const ttl = entry.validUntil - at
    if (ttl > 0 && asked === generation(key)) {
      try {
        await cacheCall(() => cache.set(key, entry, ttl))
        // Checked after the write: a `forget` that came before it (on any instance) left its
        // mark first, and the entry goes again; one that comes after deletes it itself. One
        // on this instance is known here without the mark, which a stalled Redis holds up.
        if (asked !== generation(key) || (await forgottenMeanwhile(key))) await cacheCall(() => cache.delete(key))
      } catch (error) {
        emit({ type: 'store-error', operation: 'set', error })
        // A write that failed may still be kept in this instance's local copy
        // (`createRedisCacheStore`); after a `forget` here, which deletes only once its mark
        // is written or refused (up to `timeoutMs` on a stalled Redis), it goes now.
        if (asked !== generation(key)) {
          try {
            await cacheCall(() => cache.delete(key))
          } catch {
            // The store is failing, as reported; `forget` deletes it again.
          }
        }
      }
    }
    return entry
  }

  /**
   * Whether `forget` marked the key (on any instance sharing the cache) since a validation
   * started: the mark lives as long as a validation can, by the cache's own TTL. Its
   * `validUntil` is not compared with this instance's clock: it is the forgetting instance's
   * time, and a clock ahead of that one by more than the mark's life read a live mark as
   * expired, cached the answer it had from before the revocation, and every instance served
   * the revoked token from the shared cache for `cacheTtlMs`. A cache that cannot answer says no.
   */
  async function forgottenMeanwhile(key: string): Promise<boolean> {
    try {
      const value = (await cacheCall(() => cache.get(markKey(key)))) as Partial<CachedValidation> | undefined
      return value?.active === false && value.forgotten === true
    } catch {
      return false
    }
  }

  async function validateUpstream(
    token: string,
    key: string,
    claims: JWTPayload | undefined,
    audience: readonly string[] | undefined,
  ): Promise<CachedValidation> {
    const deadline = elapsed() + retry.deadlineMs
    const asked = generation(key)
    for (let attempt = 1; ; attempt++) {
      try {
        const outcome =
          mode === 'userinfo'
            ? await validateAtUserinfo(token, claims, deadline)
            : mode === 'introspection'
              ? await validateByIntrospection(token, claims, deadline)
              : await validateJwt(token, deadline, audience)
        return await remember(key, outcome, asked)
      } catch (error) {
        if (!(error instanceof UpstreamFailure)) throw error
        if (error.breakerRetryAfterMs !== undefined) {
          const retryAfter = seconds(error.breakerRetryAfterMs)
          emit({ type: 'fail-fast', retryAfter })
          throw new AuthorizationServerUnavailableError(retryAfter, { cause: error })
        }
        // A server that said how long to wait (`Retry-After` of a 429 or 503) is asked again no
        // sooner, and only if that fits in the deadline; otherwise the client is told its wait.
        const serverWait = error.serverRetryAfterMs
        if ((error.transient || serverWait !== undefined) && attempt < retry.attempts && breaker.state === 'closed') {
          // Never sooner than the backoff (a `Retry-After: 0` must not mean back-to-back calls),
          // and, after a server's wait, with time left for the call itself.
          const backoff = computeBackoff(attempt, retry, random)
          const delayMs = serverWait === undefined ? backoff : Math.max(serverWait, backoff)
          const callRoom = serverWait === undefined ? 0 : Math.min(timeoutMs, 1000)
          if (elapsed() + delayMs + callRoom < deadline) {
            emit({ type: 'retry', attempt, delayMs, error: error.message })
            await sleep(delayMs)
            continue
          }
        }
        const open = breaker.retryAfterMs()
        const retryAfter = seconds(open > 0 ? open : Math.max(serverWait ?? 0, 1000))
        emit({ type: 'unavailable', retryAfter, error: error.message })
        throw new AuthorizationServerUnavailableError(retryAfter, { cause: error })
      }
    }
  }

  function isCachedValidation(value: unknown): value is CachedValidation {
    if (value === null || typeof value !== 'object') return false
    const v = value as Record<string, unknown>
    if (typeof v.validUntil !== 'number') return false
    if (v.active === false) return typeof v.reason === 'string'
    return v.active === true && typeof (v.info as { subject?: unknown } | undefined)?.subject === 'string'
  }

  /**
   * The cached validation of a key, if usable. A cache that answers synchronously (the
   * in-memory one) is read at once, with no promise: a cached token then costs `validate` no
   * `await`. A promise (or thenable) is awaited. A cache that fails is a miss (reported).
   */
  function readCache(key: string): MaybePromise<CachedValidation | undefined> {
    let value: unknown
    try {
      value = adoptThenable(cache.get(key))
    } catch (error) {
      return cacheReadFailed(error)
    }
    if (value instanceof Promise) return bounded(value).then(usable, cacheReadFailed)
    return usable(value)
  }

  /**
   * A cache's promise, bounded by `timeoutMs`: a cache of the platform's own that hangs (the
   * Redis store has its own deadline) would otherwise hold the request for ever, since the
   * dispatcher leaves this validator's deadlines to it.
   */
  function bounded<T>(pending: Promise<T>): Promise<T> {
    return withTimeout(pending, timeoutMs, 'the validation cache')
  }

  /** A cache call, {@link bounded} when it answers with a promise; a synchronous one (the in-memory cache) costs no timer. */
  function cacheCall<T>(call: () => T | Promise<T>): Promise<T> {
    const value = adoptThenable(call())
    return value instanceof Promise ? bounded(value as Promise<T>) : Promise.resolve(value as T)
  }

  function usable(value: unknown): CachedValidation | undefined {
    return isCachedValidation(value) && value.validUntil > now() ? value : undefined
  }

  function cacheReadFailed(error: unknown): undefined {
    emit({ type: 'store-error', operation: 'get', error })
    return undefined
  }

  function answer(entry: CachedValidation, audience: readonly string[] | undefined): AccessTokenResult {
    if (!entry.active) return { active: false, reason: entry.reason }
    const expiresAt = entry.info.expiresAt
    if (expiresAt !== undefined && expiresAt + clockToleranceMs <= now()) return { active: false, reason: 'token expired' }
    if (audience && audienceRequired && !(entry.audience && audienceMatches(entry.audience, audience))) {
      return { active: false, reason: 'audience mismatch' }
    }
    return { active: true, info: entry.info }
  }

  /** Where `forget` leaves its mark for a key: beside the entry, never in its place. */
  function markKey(key: string): string {
    return `${key}:forgotten`
  }

  /** A unit of the client's budget, or `TooManyValidationsError` (reported) when it is spent. */
  function chargeBudget(clientAddress: string | undefined): BudgetCharge {
    try {
      return clientBudget.charge(clientAddress)
    } catch (error) {
      if (error instanceof TooManyValidationsError) emit({ type: 'client-budget-spent', retryAfter: error.retryAfter })
      throw error
    }
  }

  function hashKey(token: string): string {
    return keyPrefix + sha256(token, 'base64url')
  }

  return keepingOwnDeadline({
    mode,
    issuer,
    // The default, or a function of the caller's: it is handed `resource`, which without
    // `baseUrl` follows the `Host` (a function that does not read it is asked for one anyway).
    checksAppAddress: typeof audienceOption === 'function',
    get breakerState() {
      return breaker.state
    },
    async forget(token) {
      // A mark, not a delete: another instance sharing the cache may be validating this token
      // now, and must not cache the answer it got before the revocation.
      const key = hashKey(token)
      const markMs = retry.deadlineMs + timeoutMs
      noteForget(key, markMs)
      const mark: CachedValidation = { active: false, reason: 'forgotten', validUntil: now() + markMs, forgotten: true }
      // The entry is deleted even when the mark cannot be written (Redis down): a store with a
      // local copy (`createRedisCacheStore`) drops it at once, rather than serving the revoked
      // token from it. The failure is then passed on, so the platform knows.
      try {
        await cacheCall(() => cache.set(markKey(key), mark, markMs))
      } finally {
        await cacheCall(() => cache.delete(key))
      }
    },
    async validate(token, context) {
      if (typeof token !== 'string' || token === '') return { active: false, reason: 'empty token' }
      const audience = expectedAudience(context)
      if (audience === undefined && audienceOption !== undefined) {
        // An audience to check (the default in jwt and introspection modes, one given in any
        // mode), and none to compare with (no context for the App function, or the function
        // gave nothing usable): refused, never taken unchecked.
        const reason = 'no expected audience'
        emit({ type: 'rejected-locally', reason })
        return { active: false, reason }
      }
      let claims: JWTPayload | undefined
      if (mode !== 'jwt') {
        // Unverified claims can only refuse a token early, never accept it. The client's own id
        // names no App here either (userinfo mode has no other audience check).
        claims = peekJwtClaims(token)
        if (claims) {
          const reason = checkAccessTokenClaims(withResourceAudience(claims), {
            issuer,
            requireIssuer: false,
            now: now(),
            clockToleranceMs,
            audience,
          })
          if (reason) {
            emit(rejectedLocally(reason, audience))
            return { active: false, reason }
          }
        } else if (mode === 'userinfo' && audience && disguisedJws(token)) {
          // A JWT made to look like none (padded, `+` or `/` for `-` or `_`), which a lenient
          // userinfo endpoint may still take: its audience, the only check of it in this mode,
          // cannot be read, so it is refused rather than sent on unchecked.
          const reason = 'malformed JWT'
          emit({ type: 'rejected-locally', reason })
          return { active: false, reason }
        }
      }
      const key = hashKey(token)
      let cached = readCache(key)
      if (cached instanceof Promise) cached = await cached
      if (cached) {
        emit({ type: 'cache-hit', active: cached.active })
        const result = answer(cached, audience)
        if (result.active) accepted.count++
        return result
      }
      // Nothing else can be sent as `Bearer <token>`: refused before any request is built (a
      // header value with a newline would fail in `fetch`, whose message repeats the value).
      // Checked here, on the way upstream only: the dispatcher's bearer parser has already
      // checked what it passes, and a cached answer needs no check.
      if (!B64TOKEN.test(token)) return { active: false, reason: 'not an RFC 6750 bearer token' }
      emit({ type: 'cache-miss' })
      // A request after a `forget` never joins a validation that began before it (whose
      // answer may predate the revocation): flights are per forget generation.
      // In `jwt` mode the audience of the request that leads can decide the answer (a token
      // naming a key not fetched yet is refused for another App's audience before any refetch):
      // there a validation is shared only by requests for the same audience.
      const flightKey = mode === 'jwt' && audience ? `${key}#${generation(key)}#${JSON.stringify(audience)}` : `${key}#${generation(key)}`
      const leads = !flights.has(flightKey)
      if (leads && flights.size >= maxPendingValidations) {
        // Validations cut short with their requests (Workers) are not waiting on anything.
        flights.prune()
        if (flights.size >= maxPendingValidations) {
          // The process's own bound: a hung authorization server holds at most this many.
          emit({ type: 'pending-limit', pending: flights.size })
          throw new AuthorizationServerUnavailableError(1)
        }
      }
      // The leader of a new validation pays a unit of its address's budget; joiners do not.
      const charge = budgeted && leads ? chargeBudget(context?.clientAddress) : undefined
      const flight = flights.run(flightKey, () => validateUpstream(token, key, claims, audience))
      if (flight.joined) emit({ type: 'joined' })
      else waitUntil?.(flight.promise.catch(() => {}))
      let entry: CachedValidation
      try {
        entry = await flight.promise
      } catch (error) {
        // Only an answer about this token keeps the unit: a 4xx other than 401 (which a made-up
        // string can provoke, e.g. with an oversized header), a userinfo success too large, with
        // no `sub` or no JSON object (a firewall's block page for this token). Every other failure
        // is the server's (network, timeout, 5xx, 429, breaker open, an introspection answer that
        // is no JSON) or its setup's (introspection refusing the resource server's credentials,
        // an endpoint that is not there): not the client's.
        const cause = (error as { cause?: unknown }).cause
        if (!(cause instanceof UpstreamFailure && cause.aboutToken)) charge?.refund()
        throw error
      }
      if (entry.active) charge?.refund()
      const result = answer(entry, audience)
      // In `jwt` mode a token is refused here, from itself and the keys (its signature, its key,
      // its claims, its audience), never upstream: told as such, once, by the request that led.
      if (mode === 'jwt' && !result.active && !flight.joined) {
        emit(rejectedLocally(result.reason, audience))
      }
      if (result.active) accepted.count++
      return result
    },
  })
}
