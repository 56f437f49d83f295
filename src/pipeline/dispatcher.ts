/**
 * The dispatch pipeline (DESIGN.md "Request pipeline"; spec sections 4.1, 5, 7, 9).
 *
 * `decide` takes the method, path, headers and client address of a request (never the body)
 * and returns a value: either a {@link Reply} to send as is, or the context to dispatch
 * with, plus the headers to stamp on the handler's response. Adapters only translate.
 * @module
 */
import { type AccessTokenInfo, type AccessTokenResult, type AccessTokenValidator, FOREIGN_VALIDATOR_DEADLINE_MS, keepsOwnDeadline } from '../auth/access-token-validator.js'
import { isHttpUrl, issuerProblem } from '../auth/discovery.js'
import { parseBearerToken, presentsBearer } from '../core/authorization-header.js'
import { ALLOW_HEADERS, preflightAllowHeaders } from '../core/cors.js'
import { checkScope } from '../core/scope.js'
import { checkIpAllowlist } from '../core/ip.js'
import { kindOf, quoted } from '../core/text.js'
import { adoptThenable } from '../core/thenable.js'
import {
  PROTECTED_RESOURCE_METADATA_PATH,
  type ProtectedResourceMetadata,
  SCOPES_REFUSED,
  checkIssuers,
  checkedScopes,
  metadataDocument,
} from '../core/metadata.js'
import {
  type RateLimitPolicy,
  type RateLimitResult,
  WINDOWS,
  assertRateLimitPolicy,
  rateLimitDecision,
  rateLimitHeaders,
  rateLimitPolicyValue,
  rateLimitValue,
  unverifiedBudgetHeaders,
  windowStart,
} from '../core/rate-limit.js'
import {
  type Reply,
  SCOPE_TOKEN,
  VARY_ORIGIN,
  authorizationServerUnavailableReply,
  forbiddenReply,
  ipNotAllowedReply,
  methodNotAllowedReply,
  notFoundReply,
  originNotAllowedReply,
  paymentRequiredReply,
  rateLimitedReply,
  serviceUnavailableReply,
  sessionNotFoundReply,
  unauthorizedReply,
  versionNotFoundReply,
} from '../core/reply.js'
import {
  APP_SLUG,
  type ApiTokenRecord,
  type AppRecord,
  type AppStore,
  type MaybePromise,
  type RateLimitCount,
  type RateLimitStore,
  type SessionPin,
  type SessionStore,
  type SubscriptionStore,
} from '../core/stores.js'
import {
  type VersionIndex,
  type VersionSelector,
  compileVersions,
  formatSelector,
  isExactVersion,
  isPreRelease,
  parseVersionPath,
  resolveVersion,
} from '../core/versions.js'
import { AuthorizationServerUnavailableError, ConfigurationError, TooManyValidationsError, optionNames, refuseUnknownOptions, reporterOption, requireMethods } from '../errors.js'
import { createMemoryRateLimitStore, createMemorySessionStore } from '../stores/memory/index.js'
import { clockOption } from '../stores/lru-clock.js'
import { MAX_TIMER_MS, timerOption, timersEndWithRequest, withTimeout } from '../timeout.js'
import type { TokenAuthResult, TokenService } from '../tokens/token-service.js'
import { withoutTrailingSlashes } from '../core/trailing-slash.js'
import { parseUrl } from '../core/url.js'

/** A request as the dispatcher sees it: no body, ever. */
export interface DispatchRequest {
  /** HTTP method, upper case. */
  readonly method: string
  /** Path of the request URL (no query string), including any mount `basePath`. */
  readonly path: string
  /** `Host` of the request, with port (`weather.localhost:8787`). */
  readonly host: string | undefined
  /** Scheme and host as the client addressed them: `https://weather.example.com`. */
  readonly origin: string
  /** Header lookup by lower-case name (`Headers` fits). */
  readonly headers: { get(name: string): string | null | undefined }
  /** Address of the client, already resolved through trusted proxies by the adapter. */
  readonly clientAddress: string | undefined
}

/** Who is calling, once authenticated. */
export interface Identity {
  /** User id: an API token's owner or the OAuth `sub`. Used for 402, rate limits, pins. */
  readonly subject: string
  /** How the caller authenticated. */
  readonly method: 'api_token' | 'oauth'
  /** API-token id, for `method: 'api_token'`. */
  readonly tokenId?: string | undefined
  /** OAuth client id, when known. */
  readonly clientId?: string | undefined
  /** OAuth scopes, when known. */
  readonly scopes?: readonly string[] | undefined
}

/** What the handler of a dispatched request is told. */
export interface DispatchContext {
  /** The App the request is for (from its `Host`, by `resolveApp`). */
  readonly app: AppRecord
  /** Who is calling: an API token's owner or an OAuth token's subject (`subject`, `method`, …). */
  readonly identity: Identity
  /** The version to serve (`X-MCP-Version`). */
  readonly version: string
  /** Latest deployed version of the App (`X-MCP-Latest-Version`). */
  readonly latestVersion: string
  /** `Mcp-Session-Id` of the request, when it belongs to a session. */
  readonly sessionId: string | undefined
  /** The App address (`{base_url}`), as used in the metadata `resource`. */
  readonly baseUrl: string
  /** The rate-limit decision, when a limit applies. */
  readonly rateLimit: RateLimitResult | undefined
}

/** What happened to a dispatched request, reported by the adapter after the handler answered. */
export interface DispatchOutcome {
  /** Status of the handler's response. */
  readonly status: number
  /** `Mcp-Session-Id` header of the handler's response, if any. */
  readonly sessionId: string | null | undefined
  /**
   * How to learn that the response has ended, for a response that may stay open (an event
   * stream): registers `listener`, to be called exactly once when the response ends (written
   * to the end, or its client gone), or at once when it already has. The adapters pass it for
   * responses of MCP sessions. With it, a session whose answer stays open (a GET stream, a long
   * tool call) is not idle: its pin's idle TTL is restarted when its head comes a while after the
   * request looked the pin up, every third of `sessionTtlMs` while the answer is open, and once
   * more when it ends after a while, so the pin lasts as long as the App's session does. Without
   * it, only requests restart the TTL.
   */
  readonly whenClosed?: ((listener: () => void) => void) | undefined
  /**
   * Ends the response before its time (a Node response: `end()`ed, with an `error` listener so
   * the handler's later writes fail quietly, its connection left usable; a Web body: closed, the
   * handler's stream cancelled), for a response that may stay open, given with `whenClosed`. The dispatcher
   * calls it, at most once, when the credential the response was opened with no longer passes
   * (`reauthorizeEveryMs`: revoked, expired, rotated away, its subscription ended, or its
   * address taken off the token's allowlist), so that an event stream does not outlive the
   * access that opened it. Must not throw; without it, open responses are not checked again.
   */
  readonly close?: (() => void) | undefined
  /**
   * For a 404 of a request in a session: the `Content-Type` of the answer (`null` when it has
   * none, or when it is not the MCP handler's: a framework's not-found for a method no route
   * takes). Only a JSON 404, the MCP transport's `Session not found`, ends the session's pin;
   * a framework's HTML or text 404 leaves it (a platform that routes only `POST` would otherwise
   * lose the session to the client's `GET` stream). Left out (an adapter of your own), any 404
   * ends the pin.
   */
  readonly contentType?: string | null | undefined
}

/** A JSON media type (`application/json`, `application/problem+json`), parameters aside. */
const JSON_MEDIA_TYPE = /^\s*application\/(?:[!#$%&'*.^`|~\w-]+\+)?json\s*(?:;|$)/i

/**
 * A store or validator call made for open responses: none is sent beside one still unanswered,
 * unless that one was lost ({@link waitsFor}).
 */
interface InFlight {
  /** A call sent and not yet answered. */
  pending: boolean
  /** When (`now()`) that call was sent. */
  pendingSince: number
}

/**
 * Whether a call still unanswered at `at` holds back another. One unanswered a whole interval
 * (`everyMs`) after it was sent was lost with the request that sent it (Workers: its I/O and its
 * timeout's timer end with that request, so it never settles): another is sent, or the other
 * open responses it stands for would never be served by the timer again.
 */
function waitsFor(call: InFlight, at: number, everyMs: number): boolean {
  return call.pending && at - call.pendingSince < everyMs
}

/** Marks `call` pending from `at` until `settled` settles, unless a later call was sent since. */
function pendingUntil(call: InFlight, at: number, settled: Promise<unknown>): void {
  call.pending = true
  call.pendingSince = at
  settled.finally(() => {
    // A call taken for lost that ends late leaves the one sent after it pending.
    if (call.pendingSince === at) call.pending = false
  })
}

/** A session with responses open on this instance (the dispatcher's keep-alive). */
interface KeptSession extends InFlight {
  readonly id: string
  /** How many of its responses are open here. */
  count: number
  /** When (`now()`) its pin's idle TTL was last restarted. */
  restarted: number
}

/** Open responses that share a credential, App and client address (`reauthorizeEveryMs`). */
interface Watched extends InFlight {
  readonly key: string
  /** The `Authorization` field they were opened with. Never logged. */
  readonly header: string
  readonly clientAddress: string | undefined
  readonly app: AppRecord
  /** The user they were opened for: a credential now of another is refused. */
  readonly subject: string
  /** The App address, the OAuth validator's `resource`. */
  readonly resource: string
  /** How to end each of them. */
  readonly closes: Set<() => void>
}

/** `value`, or its promise's, through `next`, without a microtask for a synchronous one. */
function then<T, U>(value: MaybePromise<T>, next: (value: T) => MaybePromise<U>): MaybePromise<U> {
  return value instanceof Promise ? value.then(next) : next(value)
}

/** The decision for one request. */
export type Decision =
  | { readonly type: 'reply'; readonly reply: Reply }
  | {
      readonly type: 'dispatch'
      readonly context: DispatchContext
      /** Headers to add to the handler's response (version, rate limit, CORS). */
      readonly headers: Readonly<Record<string, string>>
      /**
       * Must be called once the handler's response head is known: pins a new session to the
       * version, ends the pin after DELETE or the handler's JSON 404 (see
       * {@link DispatchOutcome.contentType}). Returns `undefined` when the session store answered
       * synchronously (or there was nothing to do); otherwise a promise to await before sending
       * the response, so the next request of the session finds the pin on every instance.
       * Never throws or rejects: store failures go to `onError`. When an asynchronous store
       * could not store a new session's pin, the promise resolves to a {@link Reply}, the 503 of
       * a failed store, to send in place of the handler's response, whose head waited for it:
       * the client would otherwise hold a session whose every request is refused.
       */
      complete(outcome: DispatchOutcome): void | Promise<Reply | void>
      /**
       * For adapters whose handlers write the head themselves, later (Node's `writeHead`): for a
       * GET, starts checking the request's credential again (`reauthorizeEveryMs`) and keeping
       * its session's pin from now, not from the head, which a handler may hold back until its
       * first event (Fastify's `reply.send(stream)`, a stream piped to the response): a
       * credential revoked meanwhile ends the response (`close`) before anything the App sends
       * later reaches the client, and an idle stream's pin does not expire under it. `complete`
       * then does neither again. Other methods: nothing. Absent on decisions of dispatchers not
       * made by `createDispatcher`.
       */
      watchFromStart?(whenClosed: (listener: () => void) => void, close: () => void): void
      /**
       * `true` when the session store is synchronous (`SessionStore.synchronous`): `complete`
       * then never returns a promise, and adapters need not hold the response for it.
       */
      readonly synchronousPins: boolean
    }

/**
 * The interval timers of the dispatcher's session keep-alive and of its checks of open
 * responses' credentials (`DispatcherOptions.timers`).
 */
export interface DispatcherTimers {
  /**
   * Calls `callback` every `ms` milliseconds, as the global `setInterval`; answers a handle, which
   * {@link clearInterval} is given to stop it: any value (the interval shared by open responses
   * is unref'd when its handle has an `unref` method). The dispatcher ignores the calls of an
   * interval it has stopped: a timer whose handle cannot name the interval (`undefined`) may
   * keep calling it, at the cost of a call.
   */
  setInterval(callback: () => void, ms: number): unknown
  /** Stops the interval `handle` names, as the global `clearInterval`. */
  clearInterval(handle: unknown): void
}

/** Options of {@link createDispatcher}. */
export interface DispatcherOptions {
  /** Apps and live versions. */
  apps: AppStore
  /** Active subscriptions (402). */
  subscriptions: SubscriptionStore
  /** API tokens (`svc_…`). */
  tokens: TokenService
  /** OAuth access-token validation; without it, OAuth tokens are refused with 401. */
  oauth?: AccessTokenValidator | undefined
  /**
   * Authorization servers named in the metadata (spec 2.2). Default: the `issuer` of `oauth`
   * (as `createOAuthValidator` sets it), else none (the document then leaves
   * `authorization_servers` out, RFC 9728 section 3.2). With `oauth`, at least one is required
   * (`ConfigurationError`): MCP clients sign in where the metadata sends them. Each is an
   * http(s) URL (an issuer is one, RFC 8414). An array without the `issuer` of `oauth` is
   * served, and told to `onError` once at creation (context `configuration`): clients would
   * sign in where the validator's tokens do not come from. A function is asked for each
   * document; one that answers anything but an array of http(s) URLs, or an empty one with
   * `oauth`, fails it (503, `callback failed` to `onError`).
   */
  authorizationServers?: readonly string[] | ((app: AppRecord) => readonly string[]) | undefined
  /**
   * `scopes_supported` of the metadata; default `['openid', 'profile', 'email']`. An array of
   * scope names (RFC 6749 section 3.3: printable ASCII, no spaces, double quotes or
   * backslashes; `ConfigurationError` otherwise), copied when the dispatcher is created. `[]`
   * leaves `scopes_supported` out of the document (RFC 9728 section 3.2). `offline_access` among
   * them is served, and told to `onError` once at creation (context `configuration`): MCP
   * servers should not name it (SEP-2207, MCP 2026-07-28), clients ask for it themselves.
   */
  scopesSupported?: readonly string[] | undefined
  /**
   * Scopes the 401's challenge names: `WWW-Authenticate: Bearer resource_metadata="…",
   * scope="openid mcp:tools"` (RFC 6750 section 3). The MCP authorization specification
   * (2025-11-25) asks servers to name the scopes a resource needs there (SHOULD), and clients
   * to ask for those, before the metadata's `scopes_supported`, so a client asks for no more
   * than it needs. One list for every App the dispatcher serves. Default none (`null` too):
   * the challenge of spec 5.1, naming the metadata alone. At least one scope name, as for
   * `scopesSupported`, and `openid` among them with a `createOAuthValidator` in `userinfo`
   * mode (the userinfo endpoint refuses tokens granted without it) (`ConfigurationError`
   * otherwise); copied when the dispatcher is created. Name scopes the authorization server
   * issues: one that does not know a scope may refuse the client's registration.
   * `offline_access` is told to `onError` once at creation, as in `scopesSupported`.
   */
  challengeScope?: readonly string[] | null | undefined
  /**
   * Finds the App of a request. Default: the first label of the host is the App slug
   * (`weather.example.com` → `weather`), whatever the rest of the host; a host of one label
   * (`weather`, `localhost:8080`) is no App (404): in development, use `weather.localhost`. A
   * name ending in a dot (`weather.example.com.`, the same name as DNS reads it) is no App: it
   * would be a second address of the App, with a metadata `resource` of its own, which a token
   * bound to the first does not name. Asked for requests under `basePath`, and for one outside
   * it whose path starts with `/.well-known/oauth-protected-resource/` (the metadata's RFC 9728
   * address), or, when `baseUrl` is given too, ends with `/.well-known/oauth-protected-resource`
   * (see `baseUrl`). Without `baseUrl`, not asked for a request that names no host (HTTP/1.0,
   * an empty `Host`): that is 404 `not_found`, since the App address is made from the host.
   */
  resolveApp?: ((request: DispatchRequest) => MaybePromise<AppRecord | undefined>) | undefined
  /**
   * The App address for a request (the metadata's `resource`; what OAuth audiences are compared
   * with). Default: `origin + basePath`. A trailing slash is dropped. The 401 sends clients to
   * `{baseUrl}/.well-known/oauth-protected-resource` (spec 4.2): the dispatcher serves the
   * document under `basePath`, and, for an address whose path is not `basePath` (no path, with
   * the endpoint at `/mcp`), at that address's path too, for requests that reach it there
   * (matched as sent, as under `basePath`: no percent-decoding, no dot segments). For an
   * address with a path (`https://p.example.com/mcp`), also at RFC 9728's address for it
   * (section 3.1): `/.well-known/oauth-protected-resource/mcp`, and with a path the App serves
   * after it (`…/mcp/v1`), the same document. A callback
   * that answers anything but an http(s) URL without query, fragment or spaces (RFC 8707: a
   * resource identifier has none), or one with credentials (`https://user:password@…`, which
   * every caller would be shown), fails the request (503, reported to `onError` as `callback
   * failed`, the URL not quoted).
   */
  baseUrl?: ((request: DispatchRequest, app: AppRecord) => string) | undefined
  /**
   * Path the MCP endpoint is mounted under (default `''`); versions follow it. Matched as sent
   * (no percent-decoding), so written as requests carry it: `/caf%C3%A9`, not `/café`. The
   * metadata is served under it and at RFC 9728's address for the App's,
   * `/.well-known/oauth-protected-resource/mcp` (see `baseUrl`), to the requests that reach the
   * dispatch layer there (route that path to it too under a framework mount).
   */
  basePath?: string | undefined
  /**
   * Session pins; default in memory (`createMemorySessionStore`, its idle TTL on the monotonic
   * clock unless `now` is given). Use a shared store when instances share sessions.
   */
  sessions?: SessionStore | undefined
  /**
   * Idle lifetime of a session pin, in whole milliseconds from 1 to 2^53 - 1
   * (`Number.MAX_SAFE_INTEGER`): the session store sends it as it is (Redis: `PX`, which takes
   * whole milliseconds only), so `Infinity`, a fraction or a string is refused when the
   * dispatcher is created. Default 1 hour.
   */
  sessionTtlMs?: number | undefined
  /** Rate limiting; no limit when absent. */
  rateLimit?: {
    /** Counters; default in memory. Not a store (no `increment`): a `ConfigurationError`. */
    store?: RateLimitStore | undefined
    /**
     * The limit for a caller on an App, or `undefined` (or `null`) for none. Any other answer
     * that is no policy (`false`, `0`, a limit that is no whole number, an unknown `windowType`),
     * a throw or a rejection, is a failed callback: 503, reported to `onError`.
     */
    policy: (identity: Identity, app: AppRecord) => MaybePromise<RateLimitPolicy | null | undefined>
    /**
     * Serve when the counter store fails, or the clock (`now`) answers no time (default `true`,
     * reported through `onError`: each request to a function given, at most a line per 10 s to
     * the default logger); `false`: 503. A boolean (a string is a `ConfigurationError`).
     */
    failOpen?: boolean | undefined
  } | undefined
  /**
   * Allowed `Origin` values: a list (`['https://app.example']`), or a function that answers
   * `true` for an allowed one (`(origin) => origin.endsWith('.app.example')`: parse it with
   * `URL` rather than matching text; a function that throws refuses, and is reported). When
   * set, a request whose `Origin` is not allowed gets 403 (MCP transport, DNS rebinding).
   * Requests without `Origin` are not browser requests and pass. List entries are compared as
   * browsers send `Origin`: an http(s) entry without case, default port or a lone trailing `/`;
   * `*`, a wildcard host (`https://*.app.example`: give a function), a path, query, fragment or
   * credentials, or what is no URL, is a `ConfigurationError`.
   */
  allowedOrigins?: readonly string[] | ((origin: string) => boolean) | undefined
  /**
   * Send CORS headers so browser-based MCP clients can read responses. Default `true`.
   * `false` leaves CORS to the platform's own layer: no answer carries an `Access-Control-*`
   * header, the metadata document and preflights included (an `OPTIONS` gets 204 with `Allow`
   * alone). `allowedOrigins` still applies.
   */
  cors?: boolean | undefined
  /**
   * Clock, epoch ms. Default `Date.now`. A call answering no finite number fails the request's
   * rate-limit count (`rateLimit.failOpen` decides), reported. Given, it also times the default
   * rate-limit counters' life and the default session store's idle TTL, which the monotonic
   * clock times otherwise.
   */
  now?: (() => number) | undefined
  /**
   * The interval timers that keep the pins of sessions with a response open (they restart their
   * idle TTL every third of `sessionTtlMs`) and check the credentials of open responses
   * (`reauthorizeEveryMs`). Default the global `setInterval` / `clearInterval`;
   * inject one to drive it from a test, as `now` drives the clock.
   */
  timers?: DispatcherTimers | undefined
  /**
   * How often the credential of a response that stays open (an MCP session's event stream: the
   * client's GET stream, a long tool call's answer) is checked again, in milliseconds: its
   * token authenticated anew (an API token: state, allowlist, scope; an OAuth token: the
   * validator, through its cache), and its subscription to the App. One that no longer passes
   * ends the response (`DispatchOutcome.close`): a revoked or expired token, a password reset,
   * a rotation, an ended subscription reaches open streams within this interval of reaching
   * requests (spec 3: revocation takes effect within 10 minutes), instead of never. A check
   * that cannot tell (a store down or slow, the authorization server unavailable) leaves the
   * response open and goes to `onError`. Open responses that share a credential, App and client
   * address are checked once per interval; checks are not rate-limited, and an API token's
   * count as a use (`last_used_at`). A positive number of milliseconds, at most 2^31 - 1, or
   * `false` for no checks. Default 60 seconds.
   */
  reauthorizeEveryMs?: number | false | undefined
  /**
   * Errors that did not fail the request loudly (store outages, fail-open, callbacks). Default
   * `logError` (stderr), which hears of a rate-limit store failing open at most once every 10
   * seconds, with the count of the requests served without a count meanwhile (one line per
   * request would flood stderr while Redis is down); a function given here hears every one.
   * The second argument names what failed (`token failed`, `apps failed`, `session store`,
   * `rate-limit store failed; serving (failOpen)`, …): the table of docs/pipeline.md.
   */
  onError?: ((error: unknown, context: string) => void) | undefined
  /**
   * Longest wait for a store or the rate-limit policy when it answers with a promise. Past it
   * the request is answered 503 (a hung store never hangs a request; the rate-limit counter
   * follows `failOpen`), and the timeout goes to `onError`. Synchronous answers are not timed.
   * `createOAuthValidator`'s validators are not timed here: they keep their own deadline
   * (retries included) and answer 503 themselves; a validator of your own gets 30 seconds, then
   * the request is answered 503 and `onError` hears `oauth failed`. A positive number of
   * milliseconds, at most 2^31 - 1 (about 24.8 days, the longest delay a timer takes: past it
   * Node fires at once, and every store call would time out). Default 5 seconds.
   */
  storeTimeoutMs?: number | undefined
}

/** The dispatch pipeline. Create with {@link createDispatcher}. */
export interface Dispatcher {
  /**
   * Decides what to do with one request (DESIGN.md pipeline, steps 1 to 6). Never throws or
   * rejects: a failing store or callback gives a 503 reply and goes to `onError`.
   *
   * When every store answers synchronously (the in-memory ones), the decision is returned
   * at once, with no promise and no microtask; otherwise a promise of it. `await` takes
   * both. Call `complete` as a method of the decision (`decision.complete(outcome)`).
   */
  decide(request: DispatchRequest): MaybePromise<Decision>
  /**
   * The protected-resource metadata of an App at a base URL (spec 2.2), to serve it where the
   * dispatch layer does not see the requests (a `baseUrl` outside a framework mount, RFC 9728's
   * `/.well-known/oauth-protected-resource/mcp` when the platform routes it elsewhere). `baseUrl` is the App address (`resource`), as the
   * `baseUrl` option gives it: trailing slashes are dropped.
   * @throws {TypeError} when `baseUrl` is no http(s) URL without query, fragment, credentials
   *   or spaces, or when an `authorizationServers` function answers anything but an array
   *   of URLs for `app` (the dispatcher's own document is then a 503), or whatever it throws.
   */
  metadata(app: AppRecord, baseUrl: string): ProtectedResourceMetadata
  /** The path the dispatcher is mounted under. */
  readonly basePath: string
}

/** The MCP path's methods (`HEAD` is answered after authentication: see `withApp`). */
const ALLOWED_METHODS = 'GET, POST, DELETE, OPTIONS'
/**
 * `allowedOrigins` as one function, or `undefined` when every origin is allowed. A string would
 * be taken as a set of its characters, and every Origin refused: refused here instead.
 */
function originCheck(
  allowed: DispatcherOptions['allowedOrigins'],
  report: (error: unknown) => void,
): ((origin: string) => boolean) | undefined {
  if (allowed === undefined) return undefined
  if (typeof allowed === 'function') {
    return (origin) => {
      try {
        return allowed(origin) === true
      } catch (error) {
        report(error)
        return false
      }
    }
  }
  if (!Array.isArray(allowed) || allowed.some((o) => typeof o !== 'string')) {
    throw new ConfigurationError('allowedOrigins', 'must be an array of origins ("https://app.example"), or a function of one')
  }
  const set = new Set(allowed.map((entry: string, i) => originEntry(entry, `allowedOrigins.${i}`)))
  return (origin) => set.has(origin)
}

/**
 * An `allowedOrigins` entry as a browser serializes the origin in `Origin` (compared as a
 * string): an http(s) entry loses its case, a default port and a lone `/`
 * (`https://App.Example:443/` is `https://app.example`); one with a path, query, fragment or
 * credentials, or `*`, or a wildcard host (`https://*.example.com`), could never match and is
 * refused. Other schemes
 * (`chrome-extension://…`) and `null` are kept as written.
 * @internal
 */
export function originEntry(entry: string, option: string): string {
  if (entry === '*') throw new ConfigurationError(option, 'cannot be "*": leave allowedOrigins out to allow every origin')
  if (entry === 'null') return entry
  let url: URL
  try {
    url = new URL(entry)
  } catch {
    throw new ConfigurationError(option, `must be an origin such as "https://app.example" (got ${quoted(entry, 100)})`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') return entry
  // Browsers send no `*` in a host: `https://*.example.com` matches no origin, silently.
  if (url.hostname.includes('*')) {
    throw new ConfigurationError(option, `cannot hold a wildcard (${quoted(entry, 100)}): list each origin, or give allowedOrigins as a function (origin) => boolean`)
  }
  if (url.pathname !== '/' || url.search !== '' || url.hash !== '' || url.username !== '' || url.password !== '' || entry.endsWith('?') || entry.endsWith('#')) {
    throw new ConfigurationError(option, `must be an origin, scheme, host and port only: ${JSON.stringify(url.origin)}, not ${quoted(entry, 100)}`)
  }
  return url.origin
}

/** What the protected-resource metadata answers (spec 4.2): read-only. */
const METADATA_METHODS = 'GET, HEAD, OPTIONS'
/** The start of RFC 9728's metadata address for a resource with a path (section 3.1). */
const METADATA_PATH_INSERTED = `${PROTECTED_RESOURCE_METADATA_PATH}/`
const EXPOSE_HEADERS = 'WWW-Authenticate, Mcp-Session-Id, X-MCP-Version, X-MCP-Latest-Version, Retry-After, RateLimit, RateLimit-Policy, Allow'
/**
 * The metadata path's answers (the document and its 405): readable by any origin, with the
 * exposed headers of every answer of the dispatcher a page may read (DESIGN.md, Adapters),
 * though none of them is on these answers, so a client that reads its headers finds one list.
 */
const METADATA_CORS = { 'access-control-allow-origin': '*', 'access-control-expose-headers': EXPOSE_HEADERS } as const
const SESSION_ID = /^[\x21-\x7e]{1,256}$/

// Refusals that carry nothing of the request: one frozen object each.
const IP_NOT_ALLOWED = Object.freeze({ reply: Object.freeze(ipNotAllowedReply()) })
const FORBIDDEN = Object.freeze({ reply: Object.freeze(forbiddenReply()) })

/**
 * Longest key the maps of request-derived strings (hosts, paths, App addresses) keep: a name of
 * DNS (253 characters), its port and a `basePath` fit. A longer one is worked out again on every
 * request: 1,000 keys of a whole request line's length each (16 kB in Node) would hold tens of
 * megabytes.
 */
const MAX_KEY_LENGTH = 512

/**
 * A copy of `text`, to keep as a key across requests, or `undefined` when it is too long to
 * keep. A copy, because a string cut from a request (a path sliced out of the URL) can hold its
 * whole source in memory (V8 slices share it): a short key would keep a long query string.
 */
function keyOf(text: string): string | undefined {
  return text.length > MAX_KEY_LENGTH ? undefined : (JSON.parse(JSON.stringify(text)) as string)
}

/** `map.set(key, value)`, clearing the map first when it holds 1,000 entries. `key` comes from {@link keyOf}. */
function remember<V>(map: Map<string, V>, key: string, value: V): void {
  if (map.size >= 1000) map.clear()
  map.set(key, value)
}

/** What the default logger hears of a rate-limit store that failed, the request served. */
const FAIL_OPEN_CONTEXT = 'rate-limit store failed; serving (failOpen)'
/**
 * Shortest time between two lines of the default logger about the rate-limit store failing
 * open: a Redis that is down fails every request, and a line per request would flood stderr.
 */
const FAIL_OPEN_LOG_INTERVAL_MS = 10_000
/** The default logger's throttle of fail-open lines: the last line's time, and the failures since. */
interface FailOpenLog {
  at: number
  unlogged: number
  /** The last failure not written, passed on as the cause of a `rate-limit store recovered` line. */
  last: unknown
}

/** A policy as checked by the dispatcher, with its `RateLimit-Policy` value. */
interface CheckedPolicy {
  readonly policy: RateLimitPolicy
  readonly header: string
}

function isDataProperty(object: object, key: string): boolean {
  const descriptor = Object.getOwnPropertyDescriptor(object, key)
  return descriptor !== undefined && 'value' in descriptor
}

class StoreFailure {
  constructor(
    readonly store: string,
    readonly error: unknown,
  ) {}
}

/**
 * Throws (a 503 reported to `onError`) for an accepted token's record whose owner is no
 * non-empty string or whose scope is no array, as a token service of the platform's own may
 * answer (a column mapped as `user_id`, a scope left as JSON text): an owner of `undefined`
 * would be every such token's, sharing sessions and counters across users, and a scope of text
 * would let in every App whose id is part of it. `createTokenService` checks its records so.
 */
function checkAcceptedRecord(record: ApiTokenRecord): void {
  const userId: unknown = record?.userId
  const servers: unknown = record?.servers
  const wrong =
    typeof userId !== 'string' || userId === ''
      ? `userId is ${userId === '' ? 'empty' : kindOf(userId)}, not a non-empty string`
      : !Array.isArray(servers)
        ? `servers is ${kindOf(servers)}, not an array of App ids`
        : undefined
  if (wrong !== undefined) throw new StoreFailure('token', new TypeError(`mcp-dispatch: the token service accepted a token whose record's ${wrong}`))
}

/**
 * What is wrong with an OAuth validator's answer, or `undefined` when it is one of the two it
 * may give: `{ active: false }`, or `{ active: true, info }` with an `info.subject` that is a
 * non-empty string, a `clientId` that is a string or absent, and `scopes` that are an array of
 * strings or absent (the identity handed to the App).
 */
function oauthAnswerProblem(result: AccessTokenResult): string | undefined {
  const active: unknown = result?.active
  if (active === false) return undefined
  if (active !== true) return `answered active: ${kindOf(active)}, not a boolean`
  const info: Partial<Record<keyof AccessTokenInfo, unknown>> | undefined = (result as Extract<AccessTokenResult, { active: true }>).info
  const subject = info?.subject
  if (typeof subject !== 'string' || subject === '') return `accepted a token whose info.subject is ${subject === '' ? 'empty' : kindOf(subject)}, not a non-empty string`
  // `null` is absent (`clientId: claims.azp ?? null`): neither field grants anything.
  const { clientId, scopes } = info!
  if (clientId != null && typeof clientId !== 'string') return `accepted a token whose info.clientId is ${kindOf(clientId)}, not a string`
  if (scopes != null && !isStringArray(scopes)) return `accepted a token whose info.scopes are ${kindOf(scopes)}, not an array of strings (split a space-separated scope claim)`
  return undefined
}

/** Whether `value` is an array of strings, holes counted as what they are (`every` skips them). */
function isStringArray(value: unknown): boolean {
  if (!Array.isArray(value)) return false
  for (let i = 0; i < value.length; i++) if (typeof value[i] !== 'string') return false
  return true
}

/**
 * A whole number as a database's driver may hand one back: a number as it is, a `bigint` or a
 * decimal string of digits (`'3'`, node-postgres's `bigint`, a Redis reply) as its number;
 * anything else `NaN`.
 */
function wholeNumber(value: unknown): number {
  if (typeof value === 'number') return value
  if (typeof value === 'bigint') return Number(value)
  return typeof value === 'string' && /^(?:0|[1-9]\d{0,15})$/.test(value) ? Number(value) : Number.NaN
}

/**
 * `value instanceof type`; false for what has no prototype to read (a Proxy whose trap throws,
 * one revoked), which a store or validator of the platform's may throw.
 */
function isInstance<T>(value: unknown, type: abstract new (...args: never[]) => T): value is T {
  try {
    return value instanceof type
  } catch {
    return false
  }
}

/** {@link DispatcherOptions}' names, and `rateLimit`'s. @internal */
export const DISPATCHER_OPTIONS = optionNames<DispatcherOptions>({
  apps: true,
  subscriptions: true,
  tokens: true,
  oauth: true,
  authorizationServers: true,
  scopesSupported: true,
  challengeScope: true,
  resolveApp: true,
  baseUrl: true,
  basePath: true,
  sessions: true,
  sessionTtlMs: true,
  rateLimit: true,
  allowedOrigins: true,
  cors: true,
  now: true,
  timers: true,
  reauthorizeEveryMs: true,
  onError: true,
  storeTimeoutMs: true,
})
const RATE_LIMIT_OPTIONS = optionNames<NonNullable<DispatcherOptions['rateLimit']>>({ store: true, policy: true, failOpen: true })

/** Where a policy's field given to `rateLimit` itself goes. */
function limitOption(key: string): string | undefined {
  return ['limit', 'windowMs', 'window', 'windowType', 'max', 'points'].includes(key)
    ? `the limits come from rateLimit.policy, a function of the caller and the App answering { limit, windowType } (docs/pipeline.md)`
    : undefined
}

/** Where an adapter's option given to the dispatcher goes. */
function adapterOption(key: string): string | undefined {
  if (key === 'trustProxy') return "it is one of the adapter's, given beside the dispatcher: mcpDispatch({ dispatcher, trustProxy })"
  // Only the Web adapter takes a handler; behind Express and Fastify, the MCP routes follow the middleware.
  if (key === 'handler') return "it is the Web adapter's, given beside the dispatcher: mcpDispatch({ dispatcher, handler }); Express and Fastify take none (the MCP routes follow them)"
  return undefined
}

/**
 * Creates the dispatch pipeline.
 *
 * @example
 * ```ts
 * const dispatcher = createDispatcher({ apps, subscriptions, tokens, authorizationServers: ['https://auth.example.com'] })
 * // A DispatchRequest ({ method, path, host, origin, headers, clientAddress }); the adapters
 * // build it from the framework's request (mcp-dispatch/web, /express, /fastify)
 * const decision = await dispatcher.decide(request)
 * if (decision.type === 'reply') return send(decision.reply)
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} when an option cannot work: a missing store, or an `apps`, `subscriptions`, `tokens` or `oauth` without the methods the dispatcher calls, a `basePath` without a leading `/` or that no request's path can be (not percent-encoded, or with a dot segment, backslash, query or fragment), an `authorizationServers` entry that is not an issuer identifier (an http(s) URL with no query, fragment, credentials, space or control character), a `scopesSupported` that is not an array of scope names, a `challengeScope` that is not a non-empty one (or, with a `userinfo`-mode `createOAuthValidator` as `oauth`, one without `openid`), `oauth` with no authorization server to name (no `authorizationServers`, and no `issuer` on the validator), `allowedOrigins` that is neither an array nor a function or an entry of it that is no origin, a validator whose audience follows the `Host` without `baseUrl`, a `sessionTtlMs` that is not a whole number of milliseconds (`Infinity`), a `storeTimeoutMs` out of range, a `now`, `onError`, `resolveApp` or `baseUrl` that is not a function, `sessions` that is no session store, a `cors` or `rateLimit.failOpen` that is not a boolean, a `rateLimit.store` without `increment`…
 */
export function createDispatcher(options: DispatcherOptions): Dispatcher {
  if (options === null || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  refuseUnknownOptions(options, DISPATCHER_OPTIONS, 'createDispatcher', adapterOption)
  // The methods each request calls, checked here, not left to fail every request with a 503.
  requireMethods('apps', options.apps, 'an AppStore', options.resolveApp == null ? ['getAppBySlug', 'getLiveVersions'] : ['getLiveVersions'])
  requireMethods('subscriptions', options.subscriptions, 'a SubscriptionStore', ['isActive'])
  requireMethods('tokens', options.tokens, 'a TokenService (createTokenService)', ['authenticate'])
  // (`null`, as `undefined`, is no OAuth: API tokens only.)
  if (options.oauth != null) requireMethods('oauth', options.oauth, 'an AccessTokenValidator (createOAuthValidator)', ['validate'])
  const { apps, subscriptions, tokens } = options
  const oauth = options.oauth ?? undefined
  if (oauth?.checksAppAddress === true && options.resolveApp == null && options.baseUrl == null) {
    // The default resolveApp takes the first label of any Host, and the App address is then
    // the request's origin: an audience check against it would accept a token issued to a
    // look-alike host (`weather.evil.example`) sent with that Host.
    throw new ConfigurationError(
      'baseUrl',
      'is required when the OAuth validator checks token audiences against the App address (jwt and introspection modes, or an audience function): give baseUrl (your domain), or a resolveApp that refuses hosts outside it, so the address a token must name is not the Host a caller sends',
    )
  }
  clockOption(options.now)
  // Checked here, not left to fail every request with a 503 (or every pin, unnoticed).
  // (`null`, as `undefined`, is the default, as `??` below reads it.)
  for (const key of ['resolveApp', 'baseUrl'] as const) {
    if (options[key] != null && typeof options[key] !== 'function') throw new ConfigurationError(key, 'must be a function')
  }
  if (options.sessions != null) requireMethods('sessions', options.sessions, 'a SessionStore', ['get', 'set', 'delete'])
  if (options.basePath != null && typeof options.basePath !== 'string') throw new ConfigurationError('basePath', 'must be a path starting with "/"')
  if (options.cors != null && typeof options.cors !== 'boolean') throw new ConfigurationError('cors', 'must be true or false')
  const now = options.now ?? Date.now
  if (options.timers !== undefined) requireMethods('timers', options.timers, 'a set of timers', ['setInterval', 'clearInterval'])
  const timers: DispatcherTimers = options.timers ?? { setInterval: (callback, ms) => setInterval(callback, ms), clearInterval: (handle) => clearInterval(handle as ReturnType<typeof setInterval>) }
  const onError = reporterOption(options.onError)
  // The default pins' idle TTL runs on the monotonic clock, as the counters' life does, unless a
  // clock is given: a wall clock stepped forward by `sessionTtlMs` would end every pin at once.
  const sessions = options.sessions ?? createMemorySessionStore(options.now ? { now } : {})
  const synchronousPins = sessions.synchronous === true
  const sessionTtlMs = options.sessionTtlMs ?? 3_600_000
  // Stores send it as it is: Redis refuses `PX Infinity` or a fraction, and no pin would be
  // written (every session's next request: 404), where memory would keep pins for ever.
  if (!Number.isSafeInteger(sessionTtlMs) || sessionTtlMs < 1) {
    throw new ConfigurationError('sessionTtlMs', `must be a whole number of milliseconds from 1 to ${Number.MAX_SAFE_INTEGER}`)
  }
  const storeTimeoutMs = timerOption('storeTimeoutMs', options.storeTimeoutMs ?? 5_000)
  const reauthorizeEveryMs = options.reauthorizeEveryMs === false ? false : timerOption('reauthorizeEveryMs', options.reauthorizeEveryMs ?? 60_000)
  const basePath = withoutTrailingSlashes(options.basePath ?? '')
  if (basePath !== '' && !basePath.startsWith('/')) throw new ConfigurationError('basePath', 'must start with "/"')
  // Matched as sent with each request's path, and the App address is made from it: a path no
  // request's can be (`/my mcp`, `/café`, `/a/../mcp`, `/mcp?v=1`) would 404 every request,
  // silently, and name an address with a space, query or fragment. Refused as the token API's is.
  const parsedBasePath = basePath === '' ? '' : new URL(`http://base-path.invalid${basePath}`).pathname
  if (parsedBasePath !== basePath) {
    throw new ConfigurationError(
      'basePath',
      `must be a URL path as requests carry it: percent-encoded, with no dot segment, backslash, query or fragment (${JSON.stringify(options.basePath)} is read as ${JSON.stringify(parsedBasePath)})`,
    )
  }
  const rateLimit = options.rateLimit
  // Any falsy value is none, as before (`rateLimit: limited && { policy }` in JavaScript).
  if (rateLimit && typeof rateLimit !== 'object') throw new ConfigurationError('rateLimit', 'must be an object with a policy function')
  if (rateLimit) refuseUnknownOptions(rateLimit, RATE_LIMIT_OPTIONS, 'createDispatcher', limitOption, 'rateLimit.')
  if (rateLimit && typeof rateLimit.policy !== 'function') {
    throw new ConfigurationError('rateLimit.policy', 'must be a function')
  }
  // Checked here, not at the first request: a store without `increment` failed every request
  // open, and a `failOpen` read from the environment as "false" is truthy.
  if (rateLimit?.store !== undefined) requireMethods('rateLimit.store', rateLimit.store, 'a RateLimitStore', ['increment'])
  if (rateLimit?.failOpen !== undefined && typeof rateLimit.failOpen !== 'boolean') {
    throw new ConfigurationError('rateLimit.failOpen', 'must be true or false')
  }
  // The default counters time their windows' life on the monotonic clock, unless a clock is given.
  const counters = rateLimit ? (rateLimit.store ?? createMemoryRateLimitStore(options.now ? { now } : {})) : undefined
  const failOpen = rateLimit?.failOpen ?? true
  // A platform's `onError` hears every request served without a count (it may count them); the
  // default logger (stderr) at most a line per 10 s (`logFailOpen`).
  const failOpenLogged: FailOpenLog | undefined = options.onError === undefined ? { at: Number.NEGATIVE_INFINITY, unlogged: 0, last: undefined } : undefined
  const cors = options.cors ?? true
  const allowedOrigins = originCheck(options.allowedOrigins, (error) => onError(error, 'allowedOrigins'))
  // An MCP client signs in where the metadata sends it (spec 5.1 step 2): with `oauth`, the
  // metadata must name a server, by default the validator's issuer. Without one a client takes
  // the App's own origin for the authorization server and fails there, with no hint why.
  // Copied, checked and frozen: what was checked is what every document serves.
  const scopesSupported = options.scopesSupported === undefined ? undefined : Object.freeze(checkedScopes(options.scopesSupported))
  const givenChallengeScope: unknown = options.challengeScope
  let challengeScope: string | undefined
  // `null` (a config loader's unset value) is none, the default.
  if (givenChallengeScope !== undefined && givenChallengeScope !== null) {
    const scopes: unknown[] = Array.isArray(givenChallengeScope) ? Array.from(givenChallengeScope as unknown[]) : []
    if (scopes.length === 0 || scopes.some((scope) => typeof scope !== 'string' || !SCOPE_TOKEN.test(scope))) {
      throw new ConfigurationError('challengeScope', `${SCOPES_REFUSED}, at least one (leave the option out for none)`)
    }
    // Once each: a client asks for the list as given, and a name twice is no more scope.
    challengeScope = [...new Set(scopes as string[])].join(' ')
    // The userinfo endpoint answers only tokens granted `openid` (OpenID Connect Core 5.3), and
    // a client asks for the challenge's scopes alone: without it, every token it gets is
    // refused there, and it signs in again for ever.
    if (oauth !== undefined && keepsOwnDeadline(oauth) && (oauth as { mode?: unknown }).mode === 'userinfo' && !scopes.includes('openid')) {
      throw new ConfigurationError(
        'challengeScope',
        'must name "openid" with a validator in userinfo mode: clients ask for these scopes alone, and the userinfo endpoint refuses a token granted without it',
      )
    }
  }
  // A refresh token is the client's business with its authorization server (it asks for
  // `offline_access` there when that server lists it): resource servers SHOULD NOT name it in
  // the metadata or the challenge (MCP 2026-07-28, SEP-2207). Told once, not refused: an
  // authorization server that grants it only when asked for alongside the rest may need it.
  for (const [option, scopes] of [
    ['scopesSupported', scopesSupported ?? []],
    ['challengeScope', challengeScope?.split(' ') ?? []],
  ] as const) {
    if (scopes.includes('offline_access')) {
      onError(
        new ConfigurationError(
          option,
          'names "offline_access", which MCP servers should not (SEP-2207, MCP 2026-07-28): a client that wants refresh tokens asks its authorization server for that scope itself',
        ),
        'configuration',
      )
    }
  }
  // `createOAuthValidator`'s keep a deadline of their own; a platform's own is timed here.
  const timedValidator = oauth !== undefined && !keepsOwnDeadline(oauth)
  const givenServers = options.authorizationServers ?? (oauth?.issuer !== undefined ? [oauth.issuer] : [])
  if (!Array.isArray(givenServers) && typeof givenServers !== 'function') {
    throw new ConfigurationError('authorizationServers', 'must be an array of http(s) URLs, or a function of the App answering one')
  }
  // An array is copied and frozen, as the scopes are: checked below, served as checked.
  const authServers = Array.isArray(givenServers) ? Object.freeze([...(givenServers as readonly string[])]) : givenServers
  if (oauth && Array.isArray(authServers) && authServers.length === 0) {
    throw new ConfigurationError(
      'authorizationServers',
      'must name the authorization server(s) MCP clients sign in at when oauth is given (spec 2.2), e.g. [issuer]; a validator with an issuer of its own names it by default',
    )
  }
  if (typeof authServers !== 'function') {
    // Issuer identifiers (RFC 9728 section 2, RFC 8414 section 2), as the validator's `issuer`
    // is checked: a trailing newline from a secret file, a query or a password in one would be
    // published as given.
    checkIssuers(authServers)
    // MCP clients sign in where the metadata sends them: at a server whose tokens the validator
    // refuses, every sign-in ends in a 401 loop. Told once (a platform may mean it: a validator
    // of its own that takes another issuer's tokens too), not refused.
    const issuer = oauth?.issuer
    if (issuer !== undefined && authServers.length > 0 && !authServers.includes(issuer)) {
      // Quoted only as an issuer identifier (a validator of the platform's own is not checked:
      // a password or a query in it is not printed).
      const named = typeof issuer === 'string' && issuerProblem(issuer) === undefined ? `, ${JSON.stringify(issuer)}` : ''
      onError(
        new ConfigurationError(
          'authorizationServers',
          `does not name the issuer of oauth${named}: MCP clients sign in where the metadata sends them, and the validator refuses tokens of any other issuer (identifiers compare exactly, RFC 8414 section 3.3: a trailing slash makes another one)`,
        ),
        'configuration',
      )
    }
  }
  // Per-request parsing that depends only on a short string repeats for every request of a
  // host or a path: remembered, in maps bounded because hosts and paths come from requests.
  const slugs = new Map<string, string | null>()
  const selectors = new Map<string, VersionSelector | null>()
  const resolveApp =
    options.resolveApp ??
    ((request: DispatchRequest) => {
      const host = request.host
      if (!host) return undefined
      let slug = slugs.get(host)
      if (slug === undefined) {
        // Worked out from the copy, so the slug (a slice of it) holds nothing of the request.
        const key = keyOf(host)
        const name = key ?? host
        const dot = name.indexOf('.')
        const label = dot <= 0 || endsWithDot(name) ? '' : name.slice(0, dot).toLowerCase()
        slug = APP_SLUG.test(label) ? label : null
        if (key !== undefined) remember(slugs, key, slug)
      }
      return slug === null ? undefined : apps.getAppBySlug(slug)
    })
  // The address as `resource` and the 401's `resource_metadata` URL are built from it: with no
  // trailing slash, which the metadata path follows (`https://a.example/` named
  // `https://a.example//.well-known/…`, where nothing is served).
  // `null` is no `baseUrl`, as one left out (a config loader's unset value).
  const givenBaseUrl = options.baseUrl ?? undefined
  const baseUrlOf = givenBaseUrl
    ? (request: DispatchRequest, app: AppRecord) => {
        // Whatever step asks for the address, and whether it then goes on synchronously or not,
        // its failure is reported as the callback's (`callback failed`).
        let url: unknown
        try {
          url = givenBaseUrl(request, app)
        } catch (error) {
          throw new StoreFailure('callback', error)
        }
        if (typeof url !== 'string') {
          throw new StoreFailure('callback', new TypeError(`mcp-dispatch: the baseUrl option answered ${url === null ? 'null' : typeof url}, not a string`))
        }
        // The App address clients are sent to and tokens are bound to: never `weather` or
        // `javascript:…` (a pattern, not the URL parser: this runs on every request).
        // Nor one with a query or fragment: RFC 8707 and 9728 resource identifiers have none, and
        // the metadata URL put after it would land in them.
        if (!APP_ADDRESS.test(url)) {
          throw new StoreFailure('callback', new TypeError('mcp-dispatch: the baseUrl option answered a string that is no http(s) URL without query, fragment, credentials or spaces'))
        }
        return withoutTrailingSlashes(url)
      }
    : (request: DispatchRequest) => request.origin + basePath
  const indexes = new WeakMap<readonly string[], VersionIndex>()
  // A checked copy of each policy object and its `RateLimit-Policy` value (frozen ones only).
  const checkedPolicies = new WeakMap<RateLimitPolicy, CheckedPolicy>()

  function indexOf(live: readonly string[], appId: string): VersionIndex {
    let index = indexes.get(live)
    // A new array after each deploy is the contract (docs/stores.md); an array the store changed
    // in place is compiled again when its length changed (a version pushed, or spliced out).
    if (!index || index.live.length !== live.length) {
      // Named, so the row to mend is found: one bad version fails every request to the App.
      const answered = `mcp-dispatch: the App store's getLiveVersions(${JSON.stringify(appId.slice(0, 64))}) answered`
      if (!Array.isArray(live)) throw new TypeError(`${answered} ${live === null ? 'null' : typeof live}, not an array of versions`)
      try {
        index = compileVersions(live)
      } catch (error) {
        // Anything else is an array no version can be read from at all (one with holes).
        if (!(error instanceof RangeError)) throw new TypeError(`${answered} an array that holds something other than version strings (such as a hole)`, { cause: error })
        throw new RangeError(`${answered} ${error.message.slice(0, 200)}`, { cause: error })
      }
      indexes.set(live, index)
    }
    return index
  }

  /** What an `authorizationServers` function answered for `app`, checked as the array is at creation. */
  function authServersOf(app: AppRecord, of: (app: AppRecord) => readonly string[]): readonly string[] {
    const answered: unknown = of(app)
    if (!Array.isArray(answered)) {
      throw new TypeError(`mcp-dispatch: the authorizationServers option answered ${answered === null ? 'null' : typeof answered}, not an array of URLs`)
    }
    // Read by index, holes included (`every` skips them: `new Array(2)` would pass), into the
    // copy that is served, so what was checked is what goes out.
    const urls: string[] = []
    for (let i = 0; i < answered.length; i++) {
      const url: unknown = answered[i]
      if (!isHttpUrl(url)) {
        throw new TypeError('mcp-dispatch: the authorizationServers option answered an array holding something that is no http(s) URL, not an array of URLs')
      }
      const refused = issuerProblem(url)
      if (refused !== undefined) {
        throw new TypeError(`mcp-dispatch: the authorizationServers option answered an array holding a URL that is no issuer identifier (RFC 8414 section 2: it ${refused}), not an array of issuer URLs`)
      }
      urls.push(url)
    }
    // With `oauth`, a document naming no server leaves clients nowhere to sign in (spec 2.2).
    if (oauth && urls.length === 0) throw new TypeError('mcp-dispatch: the authorizationServers option answered an empty array, and oauth is given')
    return urls
  }

  function metadata(app: AppRecord, baseUrl: string): ProtectedResourceMetadata {
    return metadataDocument({
      resource: baseUrl,
      authorizationServers: typeof authServers === 'function' ? authServersOf(app, authServers) : authServers,
      resourceName: app.name,
      ...(scopesSupported && { scopesSupported: scopesSupported as readonly string[] }),
    })
  }

  /**
   * A store's answer: a synchronous one as it is (in-memory stores cost no microtask); a
   * promise bounded by `storeTimeoutMs`, its rejection becoming a StoreFailure naming the
   * store. Synchronous throws reach the catch of `decide`, which names the current stage.
   */
  function settle<T>(answer: MaybePromise<T>, store: string): MaybePromise<T> {
    const value = adoptThenable(answer)
    if (!(value instanceof Promise)) return value
    return bounded(value, store).catch((error: unknown) => {
      throw new StoreFailure(store, error)
    })
  }

  /** `pending`, or a rejection once `storeTimeoutMs` has passed without an answer. */
  function bounded<T>(pending: Promise<T>, what: string): Promise<T> {
    return withTimeout(pending, storeTimeoutMs, what)
  }

  /** CORS headers for a request, or `undefined` when none are due. */
  function corsHeaders(origin: string | null | undefined): Readonly<Record<string, string>> | undefined {
    if (!cors || !origin) return undefined
    // A page of an origin that is not allowed reads nothing, not even a 404 (whether an App
    // or path exists); `Vary` still tells a cache the answer depends on the origin.
    if (allowedOrigins && !allowedOrigins(origin)) return VARY_ORIGIN
    return allowedOrigins
      ? { 'access-control-allow-origin': origin, vary: 'Origin', 'access-control-expose-headers': EXPOSE_HEADERS }
      : { 'access-control-allow-origin': '*', 'access-control-expose-headers': EXPOSE_HEADERS }
  }

  function reply(reply: Reply, origin: string | null | undefined): Decision {
    return { type: 'reply', reply: withCors(reply, origin) }
  }

  /** `reply` with the CORS headers due to a request from `origin`. */
  function withCors(reply: Reply, origin: string | null | undefined): Reply {
    // A 404 or 405 may be stored by a cache with no freshness given (RFC 9111 section 4.2.2):
    // one answered without CORS headers (no `Origin`) says it varies by `Origin`, so a shared
    // cache does not hand it to a browser page that sent one and needs them.
    const extra = corsHeaders(origin) ?? (cors && (reply.status === 404 || reply.status === 405) ? VARY_ORIGIN : undefined)
    return extra ? { ...reply, headers: { ...reply.headers, ...extra } } : reply
  }

  function metadataReply(request: DispatchRequest, app: AppRecord): Reply {
    if (request.method === 'OPTIONS') return preflight('*', request, METADATA_METHODS)
    if (request.method !== 'GET' && request.method !== 'HEAD') {
      // Readable by any origin, as the document itself is, so a browser client sees why.
      const refused = methodNotAllowedReply(METADATA_METHODS)
      return cors ? { ...refused, headers: { ...refused.headers, ...METADATA_CORS } } : refused
    }
    let doc: ProtectedResourceMetadata
    try {
      doc = metadata(app, baseUrlOf(request, app))
    } catch (error) {
      // The platform's `authorizationServers` function (or `baseUrl`): the callback's failure.
      throw isInstance(error, StoreFailure) ? error : new StoreFailure('callback', error)
    }
    // Its URLs and scopes are strings, checked: only the App store's record could fail here.
    const body = JSON.stringify(doc)
    return {
      status: 200,
      headers: {
        'content-type': 'application/json',
        'cache-control': 'public, max-age=3600',
        ...(cors && METADATA_CORS),
      },
      // Also for HEAD: every adapter sends its length, and not the body.
      body,
    }
  }

  /**
   * A CORS preflight. The allowed request headers are the MCP ones, plus the `Mcp-Param-*`
   * headers asked for (their names come from the App's tools); when those are in the answer,
   * it varies with `Access-Control-Request-Headers`. `methods`: those of the path asked about,
   * also in `Allow`, for an `OPTIONS` that is no preflight (RFC 9110 section 9.3.7). With
   * `cors: false`, the `Allow` alone: the platform's own CORS layer answers preflights, and one
   * that lets this answer through adds its headers to it (a second `Access-Control-Allow-Origin`
   * would make the browser refuse it).
   */
  function preflight(origin: string, request: DispatchRequest, methods = ALLOWED_METHODS): Reply {
    if (!cors) return { status: 204, headers: { allow: methods }, body: null }
    const allowHeaders = preflightAllowHeaders(request.headers.get('access-control-request-headers'))
    const varies = allowHeaders !== ALLOW_HEADERS ? ['Access-Control-Request-Headers'] : []
    if (origin !== '*') varies.unshift('Origin')
    return {
      status: 204,
      headers: {
        'access-control-allow-origin': origin,
        'access-control-allow-methods': methods,
        'access-control-allow-headers': allowHeaders,
        'access-control-expose-headers': EXPOSE_HEADERS,
        'access-control-max-age': '86400',
        allow: methods,
        ...(varies.length > 0 && { vary: varies.join(', ') }),
      },
      body: null,
    }
  }

  function pinMatches(pin: SessionPin, app: AppRecord, identity: Identity, selector: VersionSelector): boolean {
    if (pin.appId !== app.id || pin.subject !== identity.subject) return false
    switch (selector.kind) {
      case 'exact':
        return pin.version === selector.version
      case 'latest':
        // A pre-release is reached only by its exact URL, pinned or not.
        return !isPreRelease(pin.version)
      default: {
        const version = pin.version
        if (isPreRelease(version)) return false
        // The first two dot-separated fields as numbers (`split('.', 2).map(Number)`), without
        // the arrays and the callback: this runs on every request of a session.
        const dot = version.indexOf('.')
        if (Number(dot === -1 ? version : version.slice(0, dot)) !== selector.major) return false
        if (selector.kind === 'major') return true
        if (dot === -1) return false
        const next = version.indexOf('.', dot + 1)
        return Number(next === -1 ? version.slice(dot + 1) : version.slice(dot + 1, next)) === selector.minor
      }
    }
  }

  type AuthOutcome = { readonly identity: Identity; readonly reply?: undefined } | { readonly reply: Reply; readonly identity?: undefined }

  // 401 decisions per (App address, refused or missing): built once, since refusals are the
  // path an attacker can drive hardest. Bounded: the address comes from the request's host.
  const challenges = new Map<string, AuthOutcome>()
  function challenge(request: DispatchRequest, app: AppRecord, invalidToken: boolean): AuthOutcome {
    const resourceMetadataUrl = baseUrlOf(request, app) + PROTECTED_RESOURCE_METADATA_PATH
    let outcome = challenges.get(invalidToken ? `1${resourceMetadataUrl}` : `0${resourceMetadataUrl}`)
    if (outcome === undefined) {
      // Built from the copy, so the reply kept (its header holds the URL) holds nothing of the request.
      const url = keyOf(resourceMetadataUrl)
      const built = unauthorizedReply({ resourceMetadataUrl: url ?? resourceMetadataUrl, invalidToken, scope: challengeScope })
      // Shared between requests: frozen, so no adapter can write into it.
      outcome = Object.freeze({ reply: Object.freeze({ ...built, headers: Object.freeze({ ...built.headers }) }) })
      if (url !== undefined) remember(challenges, invalidToken ? `1${url}` : `0${url}`, outcome)
    }
    return outcome
  }

  /** Steps 2 and 3. Synchronous for API tokens on synchronous stores. */
  function authenticate(request: DispatchRequest, app: AppRecord): MaybePromise<AuthOutcome> {
    const header = request.headers.get('authorization')
    const parsed = parseBearerToken(header)
    if (parsed.kind === 'missing') return challenge(request, app, false)
    // RFC 6750 section 3.1: another scheme (Basic, …) presented no bearer token, so no error code.
    // `Bearer` with a malformed or empty credential is a refused token, as the MCP SDK's
    // `requireBearerAuth` answers it.
    // Fields joined (`Basic x, Bearer y`: two `Authorization` fields) count as presented when one is `Bearer`.
    if (parsed.kind === 'invalid') return challenge(request, app, presentsBearer(header))
    const token = parsed.token
    if (!token.startsWith(tokens.prefix)) return authenticateOAuth(request, app, token)
    let pending: MaybePromise<TokenAuthResult>
    try {
      pending = settle(tokens.authenticate(token, request.clientAddress), 'token')
    } catch (error) {
      // The client's lookups of tokens that are not stored are spent (`unknownTokenBudget`).
      if (isInstance(error, TooManyValidationsError)) return { reply: rateLimitedReply(error, unverifiedBudgetHeaders(error)) }
      throw error
    }
    return pending instanceof Promise
      ? pending.then(
          (auth) => judgeApiToken(request, app, auth),
          // A token service of the platform's own may reject with it instead of throwing.
          (failure: unknown) => {
            const error = isInstance(failure, StoreFailure) ? failure.error : failure
            if (isInstance(error, TooManyValidationsError)) return { reply: rateLimitedReply(error, unverifiedBudgetHeaders(error)) }
            throw failure
          },
        )
      : judgeApiToken(request, app, pending)
  }

  /**
   * An API token's identity, one per token record, shared by its requests (records are
   * immutable); it also remembers the token's rate-limit counter key, so the key string (and
   * its hash) is built once, not per request.
   */
  class Accepted {
    readonly reply?: undefined
    rateKey: string | undefined = undefined
    rateKeyApp: string | undefined = undefined
    rateKeyWindow: string | undefined = undefined
    constructor(readonly identity: Identity) {}
  }
  const identities = new WeakMap<ApiTokenRecord, Accepted>()

  /**
   * Whether a token service's answer accepts the token: only `ok: true` does. Any other answer
   * refuses (401; an open stream is ended), and one that is no boolean (`'false'`, `0`, from a
   * token service of the platform's own) is reported to `onError` too: never a caller let in.
   */
  function tokenAccepted(auth: TokenAuthResult): auth is Extract<TokenAuthResult, { ok: true }> {
    const ok: unknown = auth?.ok
    if (ok === true) return true
    if (ok !== false) onError(new TypeError(`mcp-dispatch: the token service's authenticate answered ok: ${kindOf(ok)}, not a boolean: refused (401)`), 'token answer')
    return false
  }

  /**
   * The user an OAuth validator's answer accepts: its `info.subject` when `active` is `true`
   * and the `info` is as documented; else `undefined`, a refusal (401; an open stream is
   * ended). An answer other than the two a validator may give (`active: 'false'` or `0`, a
   * token accepted without a subject, from a validator of the platform's own) is reported to
   * `onError` too: never a caller let in.
   */
  function acceptedSubject(result: AccessTokenResult): string | undefined {
    const problem = oauthAnswerProblem(result)
    if (problem !== undefined) {
      onError(new TypeError(`mcp-dispatch: the OAuth validator ${problem}: refused (401)`), 'oauth answer')
      return undefined
    }
    return result.active ? result.info.subject : undefined
  }

  /** Step 3 for API tokens: state, then IP allowlist, then scope. */
  function judgeApiToken(request: DispatchRequest, app: AppRecord, auth: TokenAuthResult): AuthOutcome {
    if (!tokenAccepted(auth)) return challenge(request, app, true)
    const record = auth.record
    let outcome = identities.get(record)
    if (outcome === undefined) {
      checkAcceptedRecord(record)
      outcome = new Accepted(Object.freeze({ subject: record.userId, method: 'api_token', tokenId: record.id }))
      identities.set(record, outcome)
    }
    const refused = apiTokenRefusal(auth, request.clientAddress, app.id)
    if (refused !== undefined) return refused
    return outcome
  }

  /**
   * Step 3's refusal of a live API token at `appId` from `clientAddress`, the IP allowlist
   * first, then the scope; `undefined` when it may be used. The request path and the re-check of
   * open streams (`stillAllowed`) both judge by it.
   */
  function apiTokenRefusal(auth: Extract<TokenAuthResult, { ok: true }>, clientAddress: string | undefined, appId: string): AuthOutcome | undefined {
    if (!checkIpAllowlist(clientAddress, auth.allowlist)) return IP_NOT_ALLOWED
    if (!checkScope(auth.record.servers, appId)) return FORBIDDEN
    return undefined
  }

  /**
   * The `oauth` validator's verdict on a `token` for `appId` at `resource`, from
   * `clientAddress` (`undefined` without `oauth`); a validator of the platform's own gets
   * `FOREIGN_VALIDATOR_DEADLINE_MS`, so one that never settles cannot hold a request or a
   * re-check for ever. The request path and `stillAllowed` both ask through it.
   */
  const validateOAuth =
    oauth &&
    ((token: string, resource: string, appId: string, clientAddress: string | undefined) => {
      const context = clientAddress === undefined ? { resource, appId } : { resource, appId, clientAddress }
      const validating = adoptThenable(oauth.validate(token, context))
      return timedValidator && validating instanceof Promise ? withTimeout(validating, FOREIGN_VALIDATOR_DEADLINE_MS, 'the OAuth validator') : validating
    })

  async function authenticateOAuth(request: DispatchRequest, app: AppRecord, token: string): Promise<AuthOutcome> {
    if (!validateOAuth) return challenge(request, app, true)
    let result
    // Outside the `try`: a failing `baseUrl` is the platform's callback, not the validator.
    const resource = baseUrlOf(request, app)
    try {
      result = await validateOAuth(token, resource, app.id, request.clientAddress)
    } catch (error) {
      if (isInstance(error, AuthorizationServerUnavailableError)) {
        return { reply: authorizationServerUnavailableReply(error.retryAfter) }
      }
      if (isInstance(error, TooManyValidationsError)) return { reply: rateLimitedReply(error, unverifiedBudgetHeaders(error)) }
      throw new StoreFailure('oauth', error)
    }
    const subject = acceptedSubject(result)
    if (subject === undefined) return challenge(request, app, true)
    const info = (result as Extract<AccessTokenResult, { active: true }>).info
    return {
      identity: {
        subject,
        method: 'oauth',
        ...(info.clientId != null && { clientId: info.clientId }),
        ...(info.scopes != null && { scopes: info.scopes }),
      },
    }
  }

  function applyRateLimit(flow: Flow): MaybePromise<RateLimitResult | Reply | undefined> {
    if (!rateLimit || !counters) return undefined
    const policy = adoptThenable(rateLimit.policy(flow.auth.identity, flow.app))
    if (!(policy instanceof Promise)) return countRequest(flow, policy)
    return bounded(policy, 'rate-limit policy')
      .then((p) => countRequest(flow, p))
      .catch((error: unknown) => {
        throw isInstance(error, StoreFailure) ? error : new StoreFailure('rate-limit policy', error)
      })
  }

  /** The counter key of (App, user, window): remembered on an API token's identity. */
  function rateKeyOf(flow: Flow, windowType: string): string {
    const { app, auth } = flow
    if (auth instanceof Accepted) {
      if (auth.rateKeyApp === app.id && auth.rateKeyWindow === windowType) return auth.rateKey!
      auth.rateKey = `${app.id}\u0000${auth.identity.subject}\u0000${windowType}`
      auth.rateKeyApp = app.id
      auth.rateKeyWindow = windowType
      return auth.rateKey
    }
    return `${app.id}\u0000${auth.identity.subject}\u0000${windowType}`
  }

  /**
   * The policy as checked: a copy, so an object the platform changes in place (or a getter)
   * cannot change the limit between the check and the decision, which may be a store round
   * trip later. Kept per policy object when it is frozen with plain data properties.
   */
  function checkPolicy(policy: RateLimitPolicy): CheckedPolicy {
    if (typeof policy !== 'object') {
      throw new TypeError(`mcp-dispatch: rateLimit.policy result must be an object { limit, windowType }, or undefined or null for no limit; got ${kindOf(policy)}`)
    }
    let checked = checkedPolicies.get(policy)
    if (checked !== undefined) return checked
    const copy: RateLimitPolicy = Object.freeze({ limit: policy.limit, windowType: policy.windowType })
    assertRateLimitPolicy(copy, 'rateLimit.policy result')
    checked = { policy: copy, header: rateLimitPolicyValue(copy) }
    // Policies are usually a few shared objects: check each once.
    if (Object.isFrozen(policy) && isDataProperty(policy, 'limit') && isDataProperty(policy, 'windowType')) {
      checkedPolicies.set(policy, checked)
    }
    return checked
  }

  function countRequest(flow: Flow, policy: RateLimitPolicy | null | undefined): MaybePromise<RateLimitResult | Reply | undefined> {
    // No limit: `undefined`, or `null`. Any other answer that is no policy (`false`, `0`, `NaN`)
    // is a failed callback (503, reported), never a silent "no limit".
    if (policy === undefined || policy === null) return undefined
    const checked = checkPolicy(policy)
    flow.policyHeader = checked.header
    const windowMs = WINDOWS[checked.policy.windowType]
    const at = now()
    // A clock that answers no time would start a window of NaN (every request counted alone,
    // and `t=NaN` in the header): a failure of the counting, as a store's.
    if (!Number.isFinite(at)) return rateLimitStoreFailed(new TypeError(`mcp-dispatch: the dispatcher's now() answered ${kindOf(at)}, not epoch ms: not counted`))
    const start = windowStart(at, windowMs)
    let count: MaybePromise<number | RateLimitCount>
    try {
      count = adoptThenable(counters!.increment(rateKeyOf(flow, checked.policy.windowType), start, windowMs))
    } catch (error) {
      return rateLimitStoreFailed(error)
    }
    return count instanceof Promise
      ? bounded(count, 'rate-limit').then((c) => judgeCount(c, checked.policy, start, windowMs, at), rateLimitStoreFailed)
      : judgeCount(count, checked.policy, start, windowMs, at)
  }

  function judgeCount(
    answer: number | RateLimitCount,
    policy: RateLimitPolicy,
    start: number,
    windowMs: number,
    at: number,
  ): RateLimitResult | Reply | undefined {
    let count = answer as number
    let reset = start + windowMs
    // Counted in another instance's (later) window: the reset is that window's end, which is
    // on that instance's clock: never told as more than one window from now (a counter counts
    // requests of older windows no longer than that), nor as past.
    if (typeof answer === 'object' && answer !== null) {
      let windowStart: number
      try {
        count = answer.count
        windowStart = wholeNumber(answer.windowStart)
      } catch (error) {
        // An answer that cannot be read (a getter that throws) is the store's failure.
        return rateLimitStoreFailed(error)
      }
      if (!Number.isSafeInteger(windowStart)) count = Number.NaN
      reset = Math.min(Math.max(windowStart + windowMs, at), at + windowMs)
    }
    // A count is a whole number from 1 (this request), as a database's driver may hand it back
    // too (`'3'`, `3n`): anything else is a broken store, which fails open (or not) like a store
    // that threw, never a 429 for everyone.
    if (typeof count !== 'number') count = wholeNumber(count)
    if (!Number.isSafeInteger(count) || count < 1) {
      return rateLimitStoreFailed(new TypeError(`mcp-dispatch: the rate-limit store answered ${kindOf(answer)}, not a count >= 1`))
    }
    if (failOpenLogged !== undefined && failOpenLogged.unlogged > 0) failOpenEnded(failOpenLogged)
    const result = rateLimitDecision(count, policy, reset, at)
    return result.success ? result : rateLimitedReply(result, rateLimitHeaders(result))
  }

  function rateLimitStoreFailed(error: unknown): undefined {
    if (!failOpen) throw new StoreFailure('rate-limit', error)
    if (failOpenLogged === undefined) onError(error, FAIL_OPEN_CONTEXT)
    else logFailOpen(failOpenLogged, error)
    return undefined
  }

  /**
   * The default logger's account of a failing rate-limit store: at most one line per
   * {@link FAIL_OPEN_LOG_INTERVAL_MS} (on the monotonic clock), a store failing now and then (a
   * Redis Cluster shard down, timeouts under load) included. A failure after a quiet interval
   * is written at once; the others are counted, and the next line names how many requests
   * were served without a count since the line before: a failure's, or, when the store
   * counts again, one saying so, with the last of those failures as its cause (logError
   * writes its name and code): an outage that began and ended between two lines is not only
   * a count.
   */
  function logFailOpen(state: FailOpenLog, error: unknown): void {
    const at = performance.now()
    if (at - state.at < FAIL_OPEN_LOG_INTERVAL_MS) {
      state.unlogged++
      state.last = error
      return
    }
    const unlogged = state.unlogged
    state.at = at
    state.unlogged = 0
    state.last = undefined
    onError(error, unlogged === 0 ? FAIL_OPEN_CONTEXT : `${FAIL_OPEN_CONTEXT}; ${unlogged} more served without a count since the last line`)
  }

  function failOpenEnded(state: FailOpenLog): void {
    const at = performance.now()
    if (at - state.at < FAIL_OPEN_LOG_INTERVAL_MS) return
    const { unlogged, last } = state
    state.at = at
    state.unlogged = 0
    state.last = undefined
    const message = `the rate-limit store counts again; ${unlogged} more requests were served without a count since the last line`
    onError(last instanceof Error ? new Error(message, { cause: last }) : new Error(message), 'rate-limit store recovered')
  }


  // ---------------------------------------------------------------------------------------
  // The decision. Every step runs at once when its store answered synchronously (in-memory
  // stores: the whole decision is one synchronous call, no promise, no microtask); the first
  // store that answers with a promise turns the rest into a promise chain. So `decide`
  // returns a Decision or a Promise of one.
  //
  // What a synchronous throw is blamed on: the store (or callback) being called. One variable
  // serves every request: a synchronous stretch sets it before each call and reads it in its
  // own catch, and nothing else runs in between.
  let stage = 'callback'

  /** The 503 for a failed store or callback (named in `onError`). */
  function failed(error: unknown, store: string, flow: Flow | undefined, origin = flow?.origin): Decision {
    const failure = isInstance(error, StoreFailure) ? error : new StoreFailure(store, error)
    onError(failure.error, `${failure.store} failed`)
    // Once counted (step 6's stores and callbacks), with the `RateLimit` fields of the unit it spent.
    return flow === undefined ? reply(serviceUnavailableReply(), origin) : counted(flow, serviceUnavailableReply())
  }

  /**
   * Goes on with `next` once `value` is there: at once when it is not a promise. A rejection
   * is a failure of `store`; a throw in a later synchronous stretch is caught here too.
   */
  function proceed<T>(
    flow: Flow,
    value: MaybePromise<T>,
    store: string,
    next: (flow: Flow, value: T) => MaybePromise<Decision>,
  ): MaybePromise<Decision> {
    if (!(value instanceof Promise)) return next(flow, value)
    return value.then(
      (settled) => {
        stage = 'callback'
        try {
          return next(flow, settled)
        } catch (error) {
          return failed(error, stage, flow)
        }
      },
      (error: unknown) => failed(error, store, flow),
    )
  }

  /** What the steps learn about one request, as they go. */
  class Flow {
    app!: AppRecord
    selector!: VersionSelector
    /** Who is calling, once step 2 accepted them (an API token's is shared: `Accepted`). */
    auth!: { readonly identity: Identity }
    limited: RateLimitResult | undefined = undefined
    policyHeader = ''
    index!: VersionIndex
    sessionId: string | undefined = undefined
    /** When (`now()`) step 6 asked for the session's pin, which restarts its idle TTL. */
    lookedUpAt = 0
    constructor(
      readonly request: DispatchRequest,
      readonly origin: string | null | undefined,
      readonly path: string,
    ) {}
  }

  /**
   * A dispatched request: the decision the adapters act on. The request and its `Origin` are
   * held in private fields (`#`), which `util.inspect` and a logger of the decision do not show:
   * the request's headers hold the caller's credential.
   */
  class Dispatch {
    readonly type = 'dispatch' as const
    readonly #request: DispatchRequest
    readonly #origin: string | null | undefined
    readonly #lookedUpAt: number
    /**
     * Watched from before its head (`watchFromStart`): `complete` does not watch again, and ends
     * what is not needed once the head is known (`#unwatch`, `#unkeep`).
     */
    #watching = false
    #unwatch: (() => void) | undefined = undefined
    #unkeep: (() => void) | undefined = undefined
    constructor(
      readonly context: DispatchContext,
      readonly headers: Readonly<Record<string, string>>,
      request: DispatchRequest,
      origin: string | null | undefined,
      lookedUpAt: number,
    ) {
      this.#request = request
      this.#origin = origin
      this.#lookedUpAt = lookedUpAt
    }

    readonly synchronousPins = synchronousPins

    watchFromStart(whenClosed: (listener: () => void) => void, close: () => void): void {
      if (this.#request.method !== 'GET' || this.#watching) return
      this.#watching = true
      this.#unwatch = watchWhileOpen(this.context, this.#request, whenClosed, close)
      const sessionId = this.context.sessionId
      if (sessionId !== undefined) this.#unkeep = keepWhileOpen(sessionId, whenClosed, this.#lookedUpAt)
    }

    complete(outcome: DispatchOutcome): void | Promise<Reply | void> {
      const { sessionId, app, identity, version } = this.context
      let pinning = false
      try {
        // A response that may stay open is checked again while it is (`reauthorizeEveryMs`).
        const { close, whenClosed } = outcome
        const stays = close !== undefined && whenClosed !== undefined && outcome.status < 300 && this.#request.method !== 'DELETE'
        if (this.#watching) {
          // Watched from its dispatch: a head that is no event stream (a body of a declared
          // length, never cut short; a refusal of the App's) is not watched any more, nor is
          // the pin of an answer that is no 2xx kept by it.
          if (!stays) this.#unwatch?.()
          if (!(outcome.whenClosed && outcome.status < 300)) this.#unkeep?.()
        } else if (stays) watchWhileOpen(this.context, this.#request, whenClosed!, close!)
        let pending: MaybePromise<void | boolean> | undefined
        if (sessionId === undefined) {
          const assigned = outcome.sessionId
          if (assigned && outcome.status < 300) {
            if (!SESSION_ID.test(assigned)) unpinnable(assigned)
            else {
              pinning = true
              pending = adoptThenable(sessions.set(assigned, { appId: app.id, version, subject: identity.subject }, sessionTtlMs))
              const whenClosed = outcome.whenClosed
              // Kept alive only once the pin is this session's: a live pin of another session
              // under the id must not be kept by this one's stream.
              // `null` and `0` too: what Redis's `SET … NX` and `SETNX` answer when the key is there.
              const stored = (answer: void | boolean) => {
                if (answer === false || (answer as unknown) === null || (answer as unknown) === 0) pinTaken()
                else if (whenClosed) keepWhileOpen(assigned, whenClosed)
              }
              if (pending instanceof Promise) return bounded(pending, 'sessions').then(stored, (error: unknown) => this.unpinned(error))
              stored(pending)
            }
          }
        } else if (outcome.sessionId && outcome.sessionId !== sessionId && outcome.status < 300 && this.#request.method !== 'DELETE') {
          // A session opened on a request of another: not pinned (the Node adapters hold no
          // answer of a request in a session for a pin), and said so rather than left to 404s.
          newSessionInSession()
        } else if ((this.#request.method === 'DELETE' && outcome.status < 300) || (outcome.status === 404 && handlerForgot(outcome.contentType))) {
          // DELETE ended the session, or the handler no longer knows it: end the pin too.
          pending = adoptThenable(sessions.delete(sessionId))
        } else if (outcome.whenClosed && outcome.status < 300 && !this.#watching) {
          keepWhileOpen(sessionId, outcome.whenClosed, this.#lookedUpAt)
        }
        // Synchronous stores finish here: the adapter then writes the response at once.
        if (pending instanceof Promise) return bounded(pending, 'sessions').then(undefined, pinFailed)
      } catch (error) {
        // An asynchronous store that throws rather than rejects: its answer waits for the pin,
        // as for a rejection. A store declared synchronous has the adapters write the head at
        // once (head.ts), so its answer goes out and the failure is reported, everywhere.
        if (pinning && !synchronousPins) return Promise.resolve(this.unpinned(error))
        pinFailed(error)
      }
      return undefined
    }

    /**
     * A new session's pin that an asynchronous store could not store: every request of the
     * session would be refused (404 once the store is back), so the answer that opened it is the
     * 503 of a failed store, held until now; the client opens another session later.
     */
    private unpinned(error: unknown): Reply {
      pinFailed(error)
      // The request was counted: its `RateLimit` fields, as every answer after the count.
      return withCors(withRateLimitFields(serviceUnavailableReply(), this.headers['ratelimit-policy'], this.headers.ratelimit), this.#origin)
    }
  }

  /** Whether a 404 of a request in a session is the MCP handler's `Session not found`. */
  function handlerForgot(contentType: string | null | undefined): boolean {
    return contentType === undefined || (contentType !== null && JSON_MEDIA_TYPE.test(contentType))
  }

  function pinFailed(error: unknown): void {
    onError(error, 'session store')
  }

  /**
   * The handler assigned a session id no request may carry here (not visible ASCII, or past 256
   * characters): nothing is pinned, and every request of the session will be 404.
   */
  function unpinnable(assigned: string): void {
    onError(
      new Error(
        `mcp-dispatch: the MCP handler assigned a session id that is not 1 to 256 visible ASCII characters (${assigned.length} characters); it is not pinned, and requests that carry it are 404 session_not_found: have the App assign shorter ids (a UUID, as the MCP SDK does)`,
      ),
      'session store',
    )
  }

  /** The handler opened a session on a request of another session: not pinned, and said so. */
  function newSessionInSession(): void {
    onError(
      new Error(
        'mcp-dispatch: the MCP handler opened a session on a request that carries the id of another (a client initializing again with its old Mcp-Session-Id); the new session is not pinned, and requests that carry its id are 404 session_not_found, after which MCP clients initialize without one',
      ),
      'session store',
    )
  }

  /** The handler assigned a session id that a live pin already holds: that pin is kept. */
  function pinTaken(): void {
    onError(
      new Error(
        'mcp-dispatch: the MCP handler assigned a session id that is already pinned to a live session; that session keeps its App, version and owner, and the new one gets no pin of its own (its requests are 404 session_not_found, unless they match the kept pin: same App, user and version line, then served at the kept version)',
      ),
      'session store',
    )
  }

  const perResponse = timersEndWithRequest()

  /**
   * Works on every open response of a kind (`items`) every `everyMs`. By one timer for all of
   * them, started by the first and stopped by the first tick that finds none, never what keeps a
   * process alive (the open responses' sockets are). Where a timer ends with the request that set
   * it (Workers), one for all would stop with the first response that ends (often a short POST's
   * event stream): each open response gets a timer of its own, from its own request, instead. A
   * failure is reported to `onError` under `context`: at most once a tick of the timer for all (a
   * store that is down fails every response's call of a tick at once), every time from a
   * response's own. Returns a function to call once an item is in `items`; it returns the
   * function that stops that response's own timer, or `undefined` where the timer for all
   * serves it.
   */
  function everyOpenResponse<T>(everyMs: number, context: string, items: ReadonlyMap<string, T>, work: (item: T, report: (error: unknown) => void) => void) {
    // The interval for all while it runs, with its handle. An interval stopped does nothing
    // more, even where `clearInterval` cannot stop it (a custom timer's handle may be anything).
    let shared: { handle: unknown } | undefined
    let failed = false
    // What failed, not the wrapper a store's failure travels in (`settle`'s), which no logger reads.
    const told = (error: unknown) => onError(isInstance(error, StoreFailure) ? error.error : error, context)
    const once = (error: unknown) => {
      if (failed) return
      failed = true
      told(error)
    }
    const each = told
    function tick(): void {
      if (items.size === 0) {
        const { handle } = shared!
        shared = undefined
        timers.clearInterval(handle)
        return
      }
      failed = false
      for (const item of items.values()) work(item, once)
    }
    return (item: T): (() => void) | undefined => {
      if (perResponse) {
        // Let go of once stopped: a timer that cannot be stopped keeps no response alive.
        let current: T | undefined = item
        const own = timers.setInterval(() => {
          if (current !== undefined) work(current, each)
        }, everyMs)
        return () => {
          current = undefined
          timers.clearInterval(own)
        }
      }
      if (shared === undefined) {
        const started: { handle: unknown } = { handle: undefined }
        started.handle = timers.setInterval(() => {
          if (shared === started) tick()
        }, everyMs)
        shared = started
        ;(started.handle as { unref?: () => void } | undefined)?.unref?.()
      }
      return undefined
    }
  }

  // Sessions with a response open on this instance, by id: how many, and when their pin's idle
  // TTL was last restarted, kept every third of the TTL (a restart that fails is retried at the
  // next tick, still in time).
  const open = new Map<string, KeptSession>()
  const keepEveryMs = Math.min(Math.max(Math.floor(sessionTtlMs / 3), 1), MAX_TIMER_MS)
  // A response that ends within this of the last restart (every short POST) costs no store call.
  const closeSlackMs = Math.min(sessionTtlMs / 10, 60_000)
  const keepSession = everyOpenResponse(keepEveryMs, 'session store (keeping the pins of open responses)', open, restartTtl)

  /**
   * Restarts the idle TTL of a pin (a `get` does); a pin already gone is not kept any more. A
   * restart still pending (a slow store) is not sent again within a keep-alive interval. `report` tells of a failure.
   */
  function restartTtl(kept: KeptSession, report: (error: unknown) => void): void {
    const at = now()
    if (waitsFor(kept, at, keepEveryMs)) return
    const done = (pin: SessionPin | undefined) => {
      if (pin === undefined) {
        if (open.get(kept.id) === kept) open.delete(kept.id)
      } else if (at > kept.restarted) kept.restarted = at
    }
    try {
      // A store's own promise or thenable (a lazy query) is adopted, as on the request path.
      const pin = adoptThenable(sessions.get(kept.id, sessionTtlMs) as MaybePromise<SessionPin | undefined>)
      if (!(pin instanceof Promise)) return done(pin)
      pendingUntil(kept, at, bounded(pin, 'sessions').then(done, report))
    } catch (error) {
      report(error)
    }
  }

  function failedAtEnd(error: unknown): void {
    onError(error, 'session store (keeping the pin of a response that ended)')
  }

  function keepOpenFailed(error: unknown): void {
    onError(error, 'session store (keeping the pins of open responses)')
  }

  /**
   * Keeps the pin of `sessionId` alive while the response is open. `restartedAt`: when its TTL
   * was last restarted for this response (the lookup of step 6; the pin's writing, for a new
   * session), not when its head came, which may be long after (a tool call answered as JSON).
   * Answers what ends it, as the response's end does (once, whichever comes first).
   */
  function keepWhileOpen(sessionId: string, whenClosed: (listener: () => void) => void, restartedAt?: number): () => void {
    const at = now()
    const since = restartedAt ?? at
    let kept = open.get(sessionId)
    if (kept === undefined) open.set(sessionId, (kept = { id: sessionId, count: 0, restarted: since, pending: false, pendingSince: 0 }))
    else if (since > kept.restarted) kept.restarted = since
    kept.count++
    const held = kept
    const stop = keepSession(held)
    // A head that came the slack or more after the lookup (a slow answer) is restarted now: the
    // first tick may come a third of the TTL on, and its retry another third, past the TTL.
    if (due(at, held)) restartTtl(held, keepOpenFailed)
    let ended = false
    const release = () => {
      if (ended) return
      ended = true
      stop?.()
      if (--held.count > 0) return
      if (open.get(sessionId) === held) open.delete(sessionId)
      if (due(now(), held)) restartTtl(held, failedAtEnd)
    }
    whenClosed(release)
    return release
  }

  /**
   * Whether `kept`'s pin was last restarted the slack or more before `at`: a clock that went
   * back, or answered no time, is taken as due (a store call too many, never a pin lost).
   */
  function due(at: number, kept: KeptSession): boolean {
    return !(at - kept.restarted < closeSlackMs)
  }

  // Open responses by credential (App, client address, `Authorization`), each group checked
  // once per `reauthorizeEveryMs`.
  const watched = new Map<string, Watched>()
  const watchGroup =
    reauthorizeEveryMs === false
      ? undefined
      : everyOpenResponse(reauthorizeEveryMs, 're-checking the credential of open responses', watched, (group, report) => recheck(group, report, reauthorizeEveryMs))

  /** Checks the credential of a response again while it is open; answers what stops that, as its end does. */
  function watchWhileOpen(context: DispatchContext, request: DispatchRequest, whenClosed: (listener: () => void) => void, close: () => void): (() => void) | undefined {
    if (watchGroup === undefined) return undefined
    const header = request.headers.get('authorization')
    if (!header) return undefined
    const clientAddress = request.clientAddress
    const app = context.app
    const key = `${app.id}\u0000${clientAddress ?? ''}\u0000${header}`
    let group = watched.get(key)
    if (group === undefined) {
      group = { key, header, clientAddress, app, subject: context.identity.subject, resource: context.baseUrl, closes: new Set(), pending: false, pendingSince: 0 }
      watched.set(key, group)
    }
    // One entry per response, even when an adapter hands the same function to two.
    const member = () => close()
    group.closes.add(member)
    const held = group
    const stop = watchGroup(held)
    let ended = false
    const release = () => {
      if (ended) return
      ended = true
      stop?.()
      if (!held.closes.delete(member) || held.closes.size > 0) return
      if (watched.get(held.key) === held) watched.delete(held.key)
    }
    whenClosed(release)
    return release
  }

  /**
   * Checks a group's credential again; one that no longer passes ends its responses. One that
   * cannot be checked (a store or the authorization server failing) leaves them open and is
   * reported: an outage must not end every stream at once. A check still pending after less
   * than `everyMs` (`reauthorizeEveryMs`) is not sent again.
   */
  function recheck(group: Watched, report: (error: unknown) => void, everyMs: number): void {
    if (group.closes.size === 0) return
    let at: number
    try {
      at = now()
    } catch (error) {
      report(error)
      return
    }
    if (waitsFor(group, at, everyMs)) return
    // Only the responses open when the check is sent are judged by it: one opened since was
    // authorized after this read, and is judged by the next check.
    const members = [...group.closes]
    const judged = (allowed: boolean) => {
      if (allowed) return
      const closes = members.filter((member) => group.closes.delete(member))
      if (group.closes.size === 0 && watched.get(group.key) === group) watched.delete(group.key)
      for (const close of closes) {
        try {
          close()
        } catch (error) {
          onError(error, 'closing an open response')
        }
      }
    }
    try {
      const verdict = stillAllowed(group)
      if (!(verdict instanceof Promise)) return judged(verdict)
      pendingUntil(group, at, verdict.then(judged, report))
    } catch (error) {
      report(error)
    }
  }

  /**
   * Whether a group's credential still passes steps 2 to 4 for its App and client address: an
   * API token live, allowed from the address and scoped to the App, or an OAuth token the
   * validator accepts for the App, of the same user, with an active subscription. Throws or
   * rejects when it cannot tell.
   */
  function stillAllowed(group: Watched): MaybePromise<boolean> {
    const parsed = parseBearerToken(group.header)
    if (parsed.kind !== 'bearer') return false
    const token = parsed.token
    const { app, clientAddress, subject } = group
    if (token.startsWith(tokens.prefix)) {
      return then(settle(tokens.authenticate(token, clientAddress), 'token'), (auth) => {
        if (!tokenAccepted(auth) || auth.record.userId !== subject || apiTokenRefusal(auth, clientAddress, app.id) !== undefined) return false
        return subscribed(subject, app.id)
      })
    }
    if (!validateOAuth) return false
    return then(validateOAuth(token, group.resource, app.id, clientAddress), (validated) => (acceptedSubject(validated) === subject ? subscribed(subject, app.id) : false))
  }

  /**
   * Whether a subscription store's answer is an active subscription: only `true` is. Any other
   * answer refuses (402); one that is no boolean is reported too (paying users refused, with
   * nothing in the logs otherwise).
   */
  function isSubscribed(active: unknown): boolean {
    if (active === true) return true
    if (active !== false) onError(new TypeError(`mcp-dispatch: the subscription store's isActive answered ${kindOf(active)}, not a boolean: refused (402)`), 'subscriptions answer')
    return false
  }

  function subscribed(subject: string, appId: string): MaybePromise<boolean> {
    return then(settle(subscriptions.isActive(subject, appId), 'subscriptions'), isSubscribed)
  }

  function decide(request: DispatchRequest): MaybePromise<Decision> {
    stage = 'callback'
    let origin: string | null | undefined
    // The request's flow, once made: a synchronous store that throws after the count answers
    // with the count's `RateLimit` fields, as one that rejects does (in `proceed`).
    let flow: Flow | undefined
    try {
      origin = request.headers.get('origin')
      // Step 1: mount, App, path, method, origin. Without `baseUrl` the App address is made
      // from the request's host: a request that names none (HTTP/1.0, an empty `Host`) names no
      // App, whatever a `resolveApp` of the platform's answers (its address would be `http://`).
      if (givenBaseUrl === undefined && !request.host) return notFound(request, origin)
      let path = request.path
      if (basePath !== '') {
        if (!path.startsWith(basePath) || (path.length > basePath.length && path[basePath.length] !== '/')) {
          // The document outside the mount: at RFC 9728's own address for the App's
          // (`/.well-known/oauth-protected-resource/mcp`), or where a `baseUrl` of the
          // platform's places `{base_url}/.well-known/oauth-protected-resource`.
          if (!path.startsWith(METADATA_PATH_INSERTED) && (givenBaseUrl === undefined || !path.endsWith(PROTECTED_RESOURCE_METADATA_PATH))) {
            return notFound(request, origin)
          }
          stage = 'apps'
          return proceed(new Flow(request, origin, path), settle(resolveApp(request), 'apps'), 'apps', metadataOutsideMount)
        }
        path = path.slice(basePath.length)
      }
      flow = new Flow(request, origin, path)
      stage = 'apps'
      return proceed(flow, settle(resolveApp(request), 'apps'), 'apps', withApp)
    } catch (error) {
      return failed(error, stage, flow, origin)
    }
  }

  /**
   * 404 `not_found`, or, for a CORS preflight, the preflight's answer: a browser sends the
   * request itself only after a preflight that succeeds, and then reads the 404 (with its CORS
   * headers) instead of an unreadable "failed to fetch". App slugs and paths are public.
   */
  function notFound(request: DispatchRequest, origin: string | null | undefined): Decision {
    if (cors && origin && request.method === 'OPTIONS' && request.headers.get('access-control-request-method')) {
      if (allowedOrigins && !allowedOrigins(origin)) return { type: 'reply', reply: originNotAllowedReply() }
      return { type: 'reply', reply: preflight(allowedOrigins ? origin : '*', request) }
    }
    return reply(notFoundReply(), origin)
  }

  /**
   * A metadata path outside `basePath`: the document where the 401 sends clients (spec 4.2:
   * `{base_url}/.well-known/oauth-protected-resource`, with a `baseUrl` whose path is not
   * `basePath`, such as `https://weather.example.com` for an endpoint at `/mcp`), and where RFC
   * 9728 section 3.1 puts it for an App address with a path (`{origin}/mcp`): the well-known
   * path inserted before the address's path, `/.well-known/oauth-protected-resource/mcp`, which
   * clients that discover the document from the URL they call try first (the MCP SDK's
   * `finishAuth` on a new transport, a web client's callback page). Else 404.
   *
   * There, a version path after the App's (`…/mcp/v1`, what a client of `{origin}/mcp/v1`
   * tries) gets the same document, naming the App's address: the fallback such a client tries
   * next, the origin's root, is no address of this App (at the origin's root, without a path,
   * `/.well-known/oauth-protected-resource/v1` stays 404 for that fallback: see `withApp`).
   */
  function metadataOutsideMount(flow: Flow, app: AppRecord | undefined): Decision {
    const { request, origin } = flow
    if (!app) return notFound(request, origin)
    const url = parseUrl(baseUrlOf(request, app))
    if (url === undefined) return notFound(request, origin)
    // `baseUrlOf` drops trailing slashes: a pathname of `/` is the origin's root.
    const base = url.pathname === '/' ? '' : url.pathname
    const path = request.path
    let served = path === base + PROTECTED_RESOURCE_METADATA_PATH
    if (!served && base !== '' && path.startsWith(PROTECTED_RESOURCE_METADATA_PATH) && path.startsWith(base, PROTECTED_RESOURCE_METADATA_PATH.length)) {
      // The App address itself, or a path the App serves after it (`/`, `/v1`).
      const rest = path.slice(PROTECTED_RESOURCE_METADATA_PATH.length + base.length)
      served = rest === '' || (rest.charCodeAt(0) === 47 /* / */ && parseVersionPath(rest) !== null)
    }
    return served ? { type: 'reply', reply: metadataReply(request, app) } : notFound(request, origin)
  }

  function withApp(flow: Flow, app: AppRecord | undefined): MaybePromise<Decision> {
    const { request, origin, path } = flow
    if (!app) return notFound(request, origin)
    // The id keys the scope, the subscription, the rate limit and the pins: a record without one
    // (a column left out, a number) is the store's failure, never an App every scope misses.
    if (typeof app.id !== 'string' || app.id === '') {
      throw new StoreFailure('apps', new TypeError(`mcp-dispatch: ${options.resolveApp == null ? 'the App store' : 'resolveApp'} answered an App record whose id is ${app.id === '' ? 'empty' : kindOf(app.id)}, not a non-empty string`))
    }
    if (path.startsWith(PROTECTED_RESOURCE_METADATA_PATH)) {
      // One protected resource per App, its address (spec 2.2), at every version path. No
      // path-suffixed document (RFC 9728 section 3.1) for `/v1`: one naming `{base_url}/v1`
      // would give a client that discovers it (rather than following the 401's
      // `resource_metadata`) another resource indicator for the same server, which the
      // authorization server did not grant with the code. The 404 sends it to the root document.
      if (path.length === PROTECTED_RESOURCE_METADATA_PATH.length) return { type: 'reply', reply: metadataReply(request, app) }
      return notFound(request, origin)
    }
    let selector = selectors.get(path)
    if (selector === undefined) {
      const key = keyOf(path)
      selector = parseVersionPath(key ?? path)
      if (key !== undefined) remember(selectors, key, selector)
    }
    if (!selector) return notFound(request, origin)
    // An `Origin` present and empty is refused too, without asking a predicate: it is no
    // origin (MCP transport: "If the Origin header is present and invalid, … 403").
    if (allowedOrigins && origin != null && (origin === '' || !allowedOrigins(origin))) return { type: 'reply', reply: originNotAllowedReply() }
    const method = request.method
    if (method === 'OPTIONS') return { type: 'reply', reply: preflight(allowedOrigins && origin ? origin : '*', request) }
    if (method !== 'POST' && method !== 'GET' && method !== 'DELETE' && method !== 'HEAD') {
      return reply(methodNotAllowedReply(ALLOWED_METHODS), origin)
    }
    flow.app = app
    flow.selector = selector
    // Steps 2 and 3: authenticate; API tokens: allowlist, then scope. HEAD is GET's head (RFC
    // 9110 section 9.3.2), and clients probe the MCP URL with it for `WWW-Authenticate` (Gemini
    // CLI after a 401): it gets GET's refusal, and past the credential 405, as the MCP SDK's
    // transport answers it; it never reaches the handler (one written for POST, GET and DELETE
    // alone may leave it unanswered).
    stage = 'token'
    return proceed(flow, authenticate(request, app), 'token', method === 'HEAD' ? headAfterIdentity : withIdentity)
  }

  /** Step 2 and 3 for HEAD: the refusal, or 405 (see `withApp`). */
  function headAfterIdentity(flow: Flow, auth: AuthOutcome): Decision {
    return reply(auth.identity === undefined ? auth.reply : methodNotAllowedReply(ALLOWED_METHODS), flow.origin)
  }

  function withIdentity(flow: Flow, auth: AuthOutcome): MaybePromise<Decision> {
    if (auth.identity === undefined) return reply(auth.reply, flow.origin)
    flow.auth = auth
    // Step 4: subscription.
    stage = 'subscriptions'
    return proceed(
      flow,
      settle(subscriptions.isActive(auth.identity.subject, flow.app.id), 'subscriptions'),
      'subscriptions',
      withSubscription,
    )
  }

  function withSubscription(flow: Flow, active: boolean): MaybePromise<Decision> {
    if (!isSubscribed(active)) return reply(paymentRequiredReply(), flow.origin)
    // Step 5: rate limit.
    stage = 'rate-limit policy'
    return proceed(flow, applyRateLimit(flow), 'rate-limit policy', withRateLimit)
  }

  function withRateLimit(flow: Flow, limited: RateLimitResult | Reply | undefined): MaybePromise<Decision> {
    if (limited !== undefined && 'status' in limited) return reply(limited, flow.origin)
    flow.limited = limited
    // Step 6: version, from the session pin or resolved anew.
    stage = 'apps'
    return proceed(flow, settle(apps.getLiveVersions(flow.app.id), 'apps'), 'apps', withLiveVersions)
  }

  function withLiveVersions(flow: Flow, live: readonly string[]): MaybePromise<Decision> {
    let index: VersionIndex
    try {
      index = indexOf(live, flow.app.id)
    } catch (error) {
      // The App store's answer, not a callback: reported as `apps failed`, with the store's other
      // failures, on an asynchronous store too (whose answer reaches here in a continuation that
      // took any throw for a callback's: `callback failed`, which points at `baseUrl`).
      throw new StoreFailure('apps', error)
    }
    const sessionId = flow.request.headers.get('mcp-session-id') ?? undefined
    if (sessionId === undefined) {
      const version = resolveVersion(index, flow.selector)
      if (version === null) return counted(flow, versionNotFoundReply(formatSelector(flow.selector), index.latest))
      return dispatch(flow, version, index)
    }
    if (!SESSION_ID.test(sessionId)) return counted(flow, sessionNotFoundReply())
    flow.index = index
    flow.sessionId = sessionId
    flow.lookedUpAt = now()
    stage = 'sessions'
    return proceed(flow, settle(sessions.get(sessionId, sessionTtlMs), 'sessions'), 'sessions', withPin)
  }

  function withPin(flow: Flow, pin: SessionPin | undefined): MaybePromise<Decision> {
    if (!pin) return counted(flow, sessionNotFoundReply())
    // The pinned version goes into `X-MCP-Version` and to the handler. A version no longer
    // live (replaced since the pin) is checked there; one that is not a version at all (a
    // platform's store answering what something else wrote) ends the session and is reported,
    // whatever the URL it was sent to.
    const version: unknown = pin.version
    if (typeof version !== 'string' || (!flow.index.exact.has(version) && !isExactVersion(version))) {
      onError(new Error(`mcp-dispatch: the session store answered a pin whose version is not a semantic version (${JSON.stringify(String(version).slice(0, 64))}); answered 404 session_not_found`), 'session store')
      return counted(flow, sessionNotFoundReply())
    }
    if (!pinMatches(pin, flow.app, flow.auth.identity, flow.selector)) return counted(flow, sessionNotFoundReply())
    return dispatch(flow, version, flow.index)
  }

  /**
   * A refusal after the rate limit counted the request (step 6: no such version or session):
   * it carries the `RateLimit` fields, so the client's last `r` stays true.
   */
  function counted(flow: Flow, refusal: Reply): Decision {
    const limited = flow.limited
    return reply(limited === undefined ? refusal : withRateLimitFields(refusal, flow.policyHeader, rateLimitValue(limited)), flow.origin)
  }

  /** `refusal` with the `RateLimit` fields of a counted request (as is, when it was not counted). */
  function withRateLimitFields(refusal: Reply, policy: string | undefined, value: string | undefined): Reply {
    if (value === undefined || policy === undefined) return refusal
    return { ...refusal, headers: { ...refusal.headers, 'ratelimit-policy': policy, ratelimit: value } }
  }

  function dispatch(flow: Flow, version: string, index: VersionIndex): Decision {
    const { request, app, limited, origin } = flow
    const latestVersion = index.latest ?? version
    let headers: Record<string, string>
    if (limited === undefined) {
      headers = { 'x-mcp-version': version, 'x-mcp-latest-version': latestVersion }
    } else {
      headers = {
        'x-mcp-version': version,
        'x-mcp-latest-version': latestVersion,
        'ratelimit-policy': flow.policyHeader,
        ratelimit: rateLimitValue(limited),
      }
    }
    if (cors && origin) Object.assign(headers, corsHeaders(origin))
    const context: DispatchContext = {
      app,
      identity: flow.auth.identity,
      version,
      latestVersion,
      sessionId: flow.sessionId,
      baseUrl: baseUrlOf(request, app),
      rateLimit: limited,
    }
    return new Dispatch(context, headers, request, origin, flow.lookedUpAt)
  }

  const dispatcher: Dispatcher = {
    basePath,
    metadata(app: AppRecord, baseUrl: string): ProtectedResourceMetadata {
      // The address as the dispatcher's own document would name it, checked as a `baseUrl`
      // answer is: never `weather.example.com` without its scheme, a query, or a trailing `/`
      // that makes `resource` another string than the one the 401's link leads to.
      if (typeof baseUrl !== 'string' || !APP_ADDRESS.test(baseUrl)) {
        throw new TypeError('mcp-dispatch: metadata(app, baseUrl) takes the App address as an http(s) URL without query, fragment, credentials or spaces, such as https://weather.example.com/mcp')
      }
      return metadata(app, withoutTrailingSlashes(baseUrl))
    },
    decide,
  }
  Object.defineProperty(dispatcher, kReporter, { value: onError })
  return dispatcher
}

/**
 * Where a dispatcher keeps its `onError`, for the adapters wrapped around it that have none of
 * their own: a registered symbol, so that a dispatcher made by the CommonJS build is read by an
 * adapter of the ES module build in the same process (a module-local key would not be).
 */
const kReporter = Symbol.for('mcp-dispatch.dispatcher.onError')

/**
 * @internal The `onError` of a dispatcher made by {@link createDispatcher} (its default
 * `logError` when none was given), or `undefined` for a `Dispatcher` made otherwise.
 */
export function dispatcherReporter(dispatcher: Dispatcher): ((error: unknown, context: string) => void) | undefined {
  const reporter: unknown = (dispatcher as { [kReporter]?: unknown })[kReporter]
  return typeof reporter === 'function' ? (reporter as (error: unknown, context: string) => void) : undefined
}

/**
 * An absolute http(s) URL with a host, and no query, fragment, white space or credentials
 * (`https://user:password@…`, which the 401's `resource_metadata` and the metadata's `resource`
 * would publish to every caller; RFC 9110 section 4.2.4 deprecates them): an App address.
 */
const APP_ADDRESS = /^https?:\/\/[^/?#\s@]+(?:\/[^?#\s]*)?$/i

/** `host` (a `Host` value, port included) names its host with a trailing dot (`a.example.`, `a.example.:8080`). */
function endsWithDot(host: string): boolean {
  const colon = host.lastIndexOf(':')
  const end = colon === -1 || host.endsWith(']') ? host.length : colon
  return host.charCodeAt(end - 1) === 46
}
