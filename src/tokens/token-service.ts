/**
 * The API-token lifecycle (spec 2.1, 3, 4.3, 5.2; DESIGN.md "API tokens"): create, list,
 * edit, rotate, revoke, revoke-all on password reset, and the per-request authentication.
 * @module
 */
import { randomBytes, randomUUID } from 'node:crypto'
import { LRUCache } from 'lru-cache'
import { z } from 'zod'
import {
  type RandomBytes,
  API_TOKEN_LENGTH,
  DEFAULT_TOKEN_PREFIX,
  tokenPrefixProblem,
  displayPrefix,
  generateApiToken,
  hashApiToken,
  hashesEqual,
  checkApiTokenFormat,
} from '../core/api-token.js'
import { type CompiledAllowlist, type IpRange, MAX_ALLOWLIST_ENTRIES, compileAllowlist, checkIpAllowlist, parseCidr, validateAllowlist } from '../core/ip.js'
import { hasLoneSurrogate, kindOf, named, quoted } from '../core/text.js'
import { adoptThenable } from '../core/thenable.js'
import type {
  ApiTokenPatch,
  ApiTokenRecord,
  AppRecord,
  AppStore,
  InvalidationBus,
  MaybePromise,
  SubscriptionStore,
  TokenStore,
} from '../core/stores.js'
import {
  ConfigurationError,
  ConflictError,
  DispatchError,
  ForbiddenError,
  InvalidInputError,
  NotFoundError,
  StoreUnavailableError,
  TokenInactiveError,
  UnauthorizedError,
  optionNames,
  refuseUnknownOptions,
  reporterOption,
  requireMethods,
} from '../errors.js'
import { type BudgetCharge, type ClientBudgetOptions, createClientBudget } from '../auth/client-budget.js'
import { clockOption, lruClock } from '../stores/lru-clock.js'
import { MAX_TIMER_MS, timerOption, timersEndWithRequest, withTimeout } from '../timeout.js'
import { createMemoryInvalidationBus } from '../stores/memory/index.js'
import { createInvalidationSender } from './invalidation-resend.js'
import { computeBackoff } from '../auth/backoff.js'

const DAY_MS = 86_400_000
/**
 * `2026-01-31T12:00:00Z`, with optional fractional seconds and a `Z` or `±hh:mm` offset; `T`
 * and `Z` in either case (RFC 3339 section 5.6), which `Date.parse` reads alike.
 */
const ISO_8601 = /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2})(?::(\d{2})(?:\.\d{1,9})?)?(?:[Zz]|[+-](\d{2}):(\d{2}))$/
/** Lifetimes a token may be created with, in days (spec 2.1, 8). */
export const TOKEN_LIFETIMES_DAYS = [7, 30, 90] as const
/** Longest lifetime of a token (spec 8). */
export const MAX_TOKEN_LIFETIME_MS = 90 * DAY_MS
/** Longest a cached token record may be trusted (spec 3: revocation within 10 minutes). */
const MAX_TOKEN_CACHE_TTL_MS = 600_000
/** How long a pass putting right a write whose caller was told 503 is tried again while it fails. */
const PUT_RIGHT_RETRY_MS = 600_000
/** The waits between those tries: 0.5–1 s first, then a ceiling doubling to 30 s (half jittered). */
const PUT_RIGHT_BACKOFF = { baseDelayMs: 1_000, maxDelayMs: 30_000 }
/** Most passes waiting to be tried again at once; past it, the oldest is given up (reported). */
const MAX_PUT_RIGHT_RETRIES = 10_000

/** State of a token (spec 3). */
export type ApiTokenStatus = 'active' | 'expired' | 'revoked'

/** One server a token may reach, as the API shows it (spec 2.1 `scopes[]`). */
export interface TokenScopeView {
  /** The App's id, as the token record holds it. */
  server_id: string
  /** The App's name; `null` when the App store no longer knows the App. */
  server_name: string | null
  /** The App's slug (its host label); `null` when the App store no longer knows the App. */
  server_slug: string | null
}

/** A token as the token API shows it, without its secret (spec 2.1 plus list fields). */
export interface ApiTokenView {
  /**
   * The token's id: stable across rotations, the `{id}` of the token API's routes. A UUID in
   * lower case for the tokens the service creates; a record the platform imported keeps its own
   * (the token API reaches ids of 1 to 64 unreserved URL characters, docs/api-tokens.md).
   */
  id: string
  /** Its label. */
  name: string
  /**
   * The first 12 characters of the secret (with the default prefix, `svc_` and 8 more; spec
   * 2.1), to tell tokens apart in a list; a rotation changes it. Not {@link TokenService.prefix}, the `svc_` all tokens
   * start with.
   */
  prefix: string
  /** When it stops working: ISO 8601 in UTC with milliseconds (`2026-12-07T09:30:00.000Z`). */
  expires_at: string
  /** The IP addresses and CIDR ranges it may be used from; `null`: from anywhere. */
  allowed_ips: string[] | null
  /** The Apps it may reach. */
  scopes: TokenScopeView[]
  /** When it was created: ISO 8601 in UTC with milliseconds. */
  created_at: string
  /** When it was last used (recorded coalesced, at most `lastUsedFlushMs` late); `null`: never. */
  last_used_at: string | null
  /** `active`, `expired` or `revoked`, as of the call (spec 3). */
  status: ApiTokenStatus
}

/** The create and rotate result: the fields of spec 2.1, with the full secret, shown once. */
export interface ApiTokenSecretView {
  /** The whole secret (`svc_…`, 48 characters with the default prefix): returned by `create` and `rotate` only, never stored or shown again. */
  token: string
  /** As {@link ApiTokenView.id}. */
  id: string
  /** As {@link ApiTokenView.name}. */
  name: string
  /** As {@link ApiTokenView.prefix}: the first 12 characters of `token`. */
  prefix: string
  /** As {@link ApiTokenView.expires_at}. */
  expires_at: string
  /** As {@link ApiTokenView.allowed_ips}. */
  allowed_ips: string[] | null
  /** As {@link ApiTokenView.scopes}. */
  scopes: TokenScopeView[]
  /** As {@link ApiTokenView.created_at}. */
  created_at: string
}

/** Input of {@link TokenService.create}. */
export interface CreateTokenInput {
  /** The owner (the dashboard session's user). */
  userId: string
  /** A label: 1 to 100 characters after trimming, a visible one among them (`validateTokenName`). */
  name: string
  /** App ids; one or more, each owned or subscribed by `userId`. */
  servers: readonly string[]
  /** Lifetime: 7, 30 or 90 days (spec 2.1); no token lives longer. */
  expiresInDays: 7 | 30 | 90
  /** IP addresses or CIDR ranges allowed to use the token (one or more), or `null` / absent for any. */
  allowedIps?: readonly string[] | null | undefined
}

/** Input of {@link TokenService.update} (spec 2.1: name, expiration, IP allowlist). */
export interface UpdateTokenInput {
  /** New name (as at creation); absent: unchanged. */
  name?: string | undefined
  /** New expiry (epoch ms or ISO 8601): in the future, at most 90 days after creation. */
  expiresAt?: number | string | undefined
  /** New allowlist (IPs and CIDR ranges, one or more); `null` removes it; absent: unchanged. */
  allowedIps?: readonly string[] | null | undefined
}

/**
 * Options of a call that hands out a secret ({@link TokenService.create},
 * {@link TokenService.rotate}).
 */
export interface SecretCallOptions {
  /**
   * The caller's request signal (the token API passes `request.signal`): a secret whose caller
   * has left by the time it is stored, or before the call answers (a client's own timeout, a
   * proxy's 504) reaches nobody, so a token created is revoked and a rotation undone, as when
   * the caller was answered 503, and the call rejects with the signal's reason. One that left
   * before the write was sent writes nothing. A headless client that retries a rotation with
   * the secret it holds is then not locked out of an active token whose new secret nobody got.
   */
  readonly signal?: AbortSignal | undefined
}

/** Who asks for a rotation (spec 4.3). */
export type RotateCaller =
  | { readonly kind: 'session'; readonly userId: string }
  | {
      readonly kind: 'token'
      readonly token: string
      /** The caller's address: a token with an allowlist is refused (403) without one. */
      readonly clientAddress?: string | undefined
    }

/** Result of {@link TokenService.authenticate}. A value, never an exception, for refusals. */
export type TokenAuthResult =
  | { readonly ok: true; readonly record: ApiTokenRecord; readonly allowlist: CompiledAllowlist }
  | { readonly ok: false; readonly reason: 'malformed' | 'unknown' | 'expired' | 'revoked' }

/** Options of {@link createTokenService}. */
export interface TokenServiceOptions {
  /** Where tokens are kept (hashes only). */
  store: TokenStore
  /** Apps, to validate servers at creation and to show `scopes`. */
  apps: AppStore
  /**
   * Whether `userId` may put `appId` in a new token ("Apps the creator owns or subscribes
   * to", spec 2.1). Default: an active subscription in `subscriptions`. Only `true` lets it; an
   * answer that is no boolean refuses, as `false` does, and is reported to `onError`.
   */
  canUseServer?: ((userId: string, appId: string) => MaybePromise<boolean>) | undefined
  /** Used by the default `canUseServer`. */
  subscriptions?: SubscriptionStore | undefined
  /**
   * Token prefix; default `svc_`. A lowercase letter, up to 14 lowercase letters or digits, then
   * `_` (at most 16 characters, no other `_`). Another throws `ConfigurationError` `prefix`.
   */
  prefix?: string | undefined
  /**
   * Server-side secret (a long random string; not empty): tokens are then stored as HMAC-SHA-256
   * instead of SHA-256. Set it from the start, the same on every instance: a token is found
   * only under the hash it was stored with, so tokens made without it (or with another) stop
   * authenticating (401) when it is turned on or changed, while the dashboard still lists them
   * as active; their owners rotate them (by session) to get working secrets.
   */
  pepper?: string | undefined
  /**
   * Peppers that tokens may still be stored under, tried in order after `pepper` when a token
   * is not found under it (`null`: plain SHA-256, the scheme without a pepper), so that turning
   * a pepper on or changing it locks no one out. New and rotated secrets are always stored under
   * `pepper`. Each entry costs every request with an unknown token one more hash and store
   * lookup (and a token stored under it one more of each, until its owner rotates it); tokens
   * live at most 90 days, so 90 days after the change no active token is stored under an old
   * pepper and it can be removed. At most 4 entries, none the scheme of `pepper` itself.
   * Default: none.
   */
  previousPeppers?: readonly (string | null)[] | undefined
  /**
   * Trust a looked-up token record for this long on this instance (0 = always ask the
   * store, the default, right for in-memory stores). At most 10 minutes (spec 3); rotations
   * and revocations drop it at once through `invalidations`, which must then be given: a bus
   * that reaches every instance sharing the store (`createRedisInvalidationBus` of
   * `mcp-dispatch/redis`), or `createMemoryInvalidationBus()` where this process is the only
   * one. Otherwise a secret rotated through another instance would still be accepted here
   * until its record left the cache, where spec section 3 has it invalid at once.
   */
  cacheTtlMs?: number | undefined
  /**
   * Store lookups of well-formed tokens that are not stored, per client address and window.
   * The checksum is public (anyone can make a token that passes it), so a made-up token costs
   * one store lookup (one per `previousPeppers` entry more); without a bound one client could
   * send the shared database as many as it can send requests, before any rate limit (which
   * counts authenticated callers). Counted like the OAuth validator's `clientBudget`: a lookup
   * in flight, or that found nothing or a revoked or expired token, takes a unit; one that
   * found a live token gives it back; requests with a token whose lookup is in flight share it
   * (and its unit); a hash already seen to belong to a live stored token is never counted, so
   * callers with real tokens are not held up. A refusal found is given again for 10 s without
   * a lookup. Past the limit, `authenticate` throws {@link TooManyValidationsError} (the
   * dispatcher answers 429 with `Retry-After`) without a lookup. A call without a client
   * address is not counted. IPv6 addresses count by their /64. Each instance counts on its own.
   * Default `{ limit: 600, windowType: 'minute', maxClients: 10_000 }`: ten lookups a second
   * on a unique index is no load for a database, and far more than a client with real tokens
   * makes up, while a client spraying made-up tokens is held to it; `false` turns it off.
   */
  unknownTokenBudget?: ClientBudgetOptions | false | undefined
  /**
   * At most this many store lookups of tokens not known to be stored (those `unknownTokenBudget`
   * counts) wait on the store at once, for the whole process: every client address, and calls
   * without one. Past it, such a token is refused at once with {@link StoreUnavailableError}
   * (503), without a store call, while tokens known to be stored, and requests that join a
   * lookup in flight, go on. The budget bounds one address; this bounds the process: with a
   * store that stops answering, made-up tokens from many addresses (or from a Web adapter given
   * no client address) would each hold a lookup, and about 1.3 kB of heap, until it answered
   * (measured: 100,000 such requests held 128 MB). A store that answers synchronously (in
   * memory) never has one waiting. A positive integer; default 1,000.
   */
  maxPendingLookups?: number | undefined
  /**
   * Most tokens one user may hold that are neither revoked nor expired: `create` past it fails
   * with {@link ConflictError} (the token API answers 409 `conflict`), until one is revoked or
   * expires. Without a bound, one signed-in user could make tokens until the store, and the
   * dashboard's list, gave out (2,000 in two seconds through the reference platform). Counted
   * from the store before the insert, and again after it: one user's creations on one instance
   * run that part one at a time, so they never pass it together; creations on instances sharing
   * a store at the same moment may pass the first count, but one whose second count finds more
   * than the bound revokes its token (listed as revoked; nobody was given its secret) and is
   * refused alike, so two racing at the bound may both be refused, never both kept (a revocation
   * that fails goes to `onError`, naming the token). Only, for a moment, may the next creation
   * after one whose insert outlived `storeTimeoutMs` pass it (that token is revoked as soon as
   * its insert lands: its caller got 503).
   * A positive integer; default 1,000.
   */
  maxActiveTokensPerUser?: number | undefined
  /**
   * Broadcast of rotations and revocations to other instances. Default in-process (this
   * service's own changes only). Required with `cacheTtlMs` (see there). A message whose
   * `publish` fails, throws or does not answer within `storeTimeoutMs` (or, when longer, the
   * bus's `publishTimeoutMs` and a second: a Redis bus's `timeoutMs`) is reported to `onError`
   * (`invalidation publish`) and sent again with backoff (the first round 0.5 to 1 s later, then
   * waits doubling up to 30 s) until it lands, for at most 10 minutes after the last change that
   * queued it (the longest any instance may cache the record it replaces); docs/stores.md.
   */
  invalidations?: InvalidationBus | undefined
  /** How often coalesced `last_used_at` times are written. Default 60 s. */
  lastUsedFlushMs?: number | undefined
  /**
   * Clock, epoch ms. Default `Date.now`. A reading that is `NaN`, negative, or later than
   * 8.64e15 ms (the last date JavaScript holds) less 90 days is a `ConfigurationError` naming
   * `now`, thrown at creation or by the call that reads it, before any store call.
   */
  now?: (() => number) | undefined
  /**
   * Random source for secrets: `(size) => bytes`, as `crypto.randomBytes` (the default). Not
   * `Math.random`, which answers a number: that is a `ConfigurationError` at creation.
   */
  random?: RandomBytes | undefined
  /**
   * Called with errors that must not fail a request: a failed `last_used_at` write (context
   * `last_used_at flush`), an invalidation not published (`invalidation publish`), a write whose
   * caller was told 503 that could not be put right (`token store write whose caller was told
   * 503`, `token store`), and the other contexts of docs/pipeline.md. Default `logError` (stderr).
   */
  onError?: ((error: unknown, context: string) => void) | undefined
  /**
   * Longest wait for each store call of a lifecycle call (create, list, get, update, rotate,
   * revoke, `revokeAllForUser`: one to three token-store calls each, a creation a fourth to revoke
   * its token when its second count finds too many or fails; a creation may first wait as
   * long for an earlier creation of the same user on this instance) and for a `last_used_at`
   * write, when the store answers with a promise; past it the call fails with
   * `StoreUnavailableError` (the token API answers 503), so a database that stopped answering
   * never holds a dashboard request or `close()`. The App store's `getApp` (asked for each
   * view's `scopes`, by a list once per App) and `canUseServer` (or the subscription store,
   * at creation) are bounded alike, their failures `StoreUnavailableError` naming the `app` or
   * `subscription` store;
   * except after a write that landed (an edit, a revocation, a rotation), whose answer then
   * names the Apps `null` (the failure goes to `onError`): the secret of a rotation is never
   * lost to the App store (a creation names them from its own lookups). The write may still land later: a write
   * whose caller was told 503 is put right at once, and again this long after
   * (docs/api-tokens.md). Also the longest wait for the `invalidations` bus's `publish`
   * (reported and sent again past it, the call answering as it would have), unless the bus
   * declares a longer one of its own (`publishTimeoutMs`: a Redis bus's `timeoutMs`, which its
   * `publish` may spend waiting for the other instances' confirmations), which is then waited
   * for and a second more.
   * `authenticate` is bounded by the dispatcher's `storeTimeoutMs`. Default 5 s.
   */
  storeTimeoutMs?: number | undefined
  /**
   * Keeps the request that starts store work alive until that work ends, on runtimes that end a
   * request's timers and I/O with it: on Cloudflare Workers, `waitUntil` of `cloudflare:workers`
   * (or a request's `ctx.waitUntil`). It is handed the `last_used_at` write and its
   * `lastUsedFlushMs` wait, and the store lookups requests share. Without it, on Workers, pending
   * uses are written by the first request that comes `lastUsedFlushMs` after the last write,
   * not before (none comes: not at all), and a lookup whose first request ended is done again.
   * Default: none (Node, Bun and Deno need none).
   */
  waitUntil?: ((promise: Promise<unknown>) => void) | undefined
}

/**
 * The API-token lifecycle. Create with {@link createTokenService}.
 *
 * A token's `id` is a UUID in lower case; `get`, `update`, `rotate` and `revoke` take it in
 * either case (RFC 9562: case-insensitive on input), as they take the id of a record imported
 * in upper case, and answer with the id as stored.
 */
export interface TokenService {
  /** The token prefix in use (`svc_` by default). */
  readonly prefix: string
  /**
   * Creates a token; the result is the only place the full secret appears (spec 3).
   *
   * @throws {InvalidInputError} (400) naming a bad field (`userId`, `name`, `servers`,
   * `expiresInDays`, `allowedIps.1`), or a server `userId` may not use.
   * @throws {ConflictError} (409) when the user holds `maxActiveTokensPerUser` active tokens already.
   * @throws {TokenInactiveError} (409) when a password reset of the user (`revokeAllForUser`)
   * ran while the token was being created: it was stored revoked.
   * @throws {StoreUnavailableError} (503) when a store fails or does not answer within `storeTimeoutMs`.
   */
  create(input: CreateTokenInput, options?: SecretCallOptions): Promise<ApiTokenSecretView>
  /**
   * Tokens of a user, newest first, without secrets (dashboard list, spec 2.1).
   *
   * @throws {InvalidInputError} (400) naming `userId` when it is no user id (not a string,
   * empty, or holding a NUL or a lone surrogate).
   * @throws {StoreUnavailableError} (503) when a store fails or does not answer within `storeTimeoutMs`.
   */
  list(userId: string): Promise<ApiTokenView[]>
  /**
   * One token of `userId`.
   *
   * @throws {InvalidInputError} (400) naming `userId` when it is no user id (not a string,
   * empty, or holding a NUL or a lone surrogate).
   * @throws {NotFoundError} (404) when there is no such token, or it is someone else's (answered alike).
   * @throws {StoreUnavailableError} (503) when a store fails or does not answer within `storeTimeoutMs`.
   */
  get(userId: string, id: string): Promise<ApiTokenView>
  /**
   * Edits name, expiration or allowlist; servers cannot change (spec 2.1, 3).
   *
   * @throws {InvalidInputError} (400) naming a bad field, `userId`, `servers` or `scopes` among them.
   * @throws {NotFoundError} (404) when there is no such token of `userId`.
   * @throws {TokenInactiveError} (409) when the token has expired or was revoked, or, for an
   *   edit of the expiry, expires within `storeTimeoutMs` (its write could land after it).
   * @throws {ConflictError} (409) when another edit of the expiry landed between this edit's read
   *   and its write (the write is a compare-and-swap on the expiry read): read it again.
   * @throws {StoreUnavailableError} (503) when a store fails or does not answer within `storeTimeoutMs`.
   */
  update(userId: string, id: string, input: UpdateTokenInput): Promise<ApiTokenView>
  /**
   * Rotates a secret (spec 3, 4.3): same id, name, scopes, expiry, allowlist; a new secret and
   * prefix, and the old secret refused at once.
   *
   * @throws {UnauthorizedError} (401) when the caller is a token that is not valid (unknown,
   * expired, revoked), or lost a race with a revocation or the expiry of itself.
   * @throws {ForbiddenError} (403) when a token rotates another token, or calls from an address
   * outside its allowlist (or from none, with an allowlist).
   * @throws {TooManyValidationsError} (429) when a token caller's `clientAddress` has spent its `unknownTokenBudget`.
   * @throws {InvalidInputError} (400) naming `userId` when a session caller's is no user id.
   * @throws {NotFoundError} (404) when the owner's session names no token of theirs.
   * @throws {TokenInactiveError} (409) when the owner rotates an expired or revoked token.
   * @throws {ConflictError} (409) when the rotation lost a race with another rotation of the
   * token (a second tab, the token rotating itself, or the caller's own earlier rotation, answered
   * 503 and being undone): no secret is handed out twice.
   * @throws {StoreUnavailableError} (503) when a store fails or does not answer within `storeTimeoutMs`.
   */
  rotate(id: string, caller: RotateCaller, options?: SecretCallOptions): Promise<ApiTokenSecretView>
  /**
   * Revokes a token of `userId`, permanently (spec 3). Idempotent. An expired token is left as
   * it is (spec 3: only an active token can be revoked) and answered with `status: 'expired'`.
   *
   * @throws {InvalidInputError} (400) naming `userId` when it is no user id (not a string,
   * empty, or holding a NUL or a lone surrogate).
   * @throws {NotFoundError} (404) when there is no such token of `userId`.
   * @throws {StoreUnavailableError} (503) when a store fails or does not answer within `storeTimeoutMs`.
   */
  revoke(userId: string, id: string): Promise<ApiTokenView>
  /**
   * Revokes every active token of a user: call it on password reset (spec 3). Expired tokens
   * are left as they are. Returns the count of tokens it revoked.
   *
   * @throws {InvalidInputError} (400) naming `userId` when it is no user id (not a string,
   * empty, or holding a NUL or a lone surrogate).
   * @throws {StoreUnavailableError} (503) when a store fails or does not answer within `storeTimeoutMs`.
   */
  revokeAllForUser(userId: string): Promise<number>
  /**
   * Authenticates a presented API token (format, hash lookup, state). Answers synchronously
   * when the store does (in memory), so the hot path costs no extra microtask; `await` it.
   * `clientAddress` (the caller's, as the dispatcher resolved it) is charged for the lookup of
   * a well-formed token not known to be stored (`unknownTokenBudget`).
   *
   * @throws {TooManyValidationsError} (429), synchronously, when `clientAddress` has spent its
   * `unknownTokenBudget` and the token would need a store lookup.
   * @throws {StoreUnavailableError} (503), synchronously, when the token would need a store lookup
   * and `maxPendingLookups` of them are already waiting on the store, or when the store's
   * `findByHash` throws; when it rejects, the returned promise rejects with it (the wait is
   * bounded by the dispatcher's `storeTimeoutMs`).
   */
  authenticate(token: string, clientAddress?: string): MaybePromise<TokenAuthResult>
  /** Writes pending `last_used_at` times now. */
  flush(): Promise<void>
  /**
   * Flushes, and once more, unless that write failed, for the uses recorded meanwhile (requests
   * still served while the platform drains; uses recorded during that second write, or after
   * `close`, keep their timer: written when it fires, or reported to `onError` if the store is
   * closed by then, provided the process still runs, which the timer does not keep); waits for
   * the second passes over writes whose caller was told 503 that are still to
   * come (each at most `storeTimeoutMs` away; see docs/api-tokens.md), gives those passes that
   * failed and wait to be tried again their last try (reporting to `onError` those it gives
   * up), stops listening for invalidations, and gives the invalidations whose publish failed
   * and that are still being sent again one last try (under `storeTimeoutMs`, or the bus's
   * `publishTimeoutMs` and a second when longer), reporting to `onError` how many it could not send. Safe to call again:
   * a second call writes the uses recorded since (reported to `onError` if the store is closed
   * by then) and resolves; the invalidations are not sent again.
   */
  close(): Promise<void>
}

// A label shown in dashboards and logs: no control characters or line separators (a newline,
// U+2028 or U+2029 could forge a log line or break a JavaScript consumer), no bidirectional
// embeddings, overrides or isolates (U+202A–U+202E, U+2066–U+2069: text that reads
// otherwise than it is), and something visible besides spaces, invisible format characters
// (U+200B, …), marks with no base (a lone U+0301), characters Unicode says to show as nothing
// (Default_Ignorable_Code_Point: Hangul fillers U+3164, U+FFA0, …) and the blank braille pattern.
const nameSchema = z
  .string()
  .trim()
  .min(1, 'must not be empty')
  .max(100, 'must be at most 100 characters')
  .refine((name) => !/\p{Cc}/u.test(name), 'must not contain control characters')
  .refine((name) => !/[\p{Zl}\p{Zp}]/u.test(name), 'must not contain line or paragraph separators')
  .refine((name) => !/[\u202A-\u202E\u2066-\u2069]/u.test(name), 'must not contain bidirectional overrides or isolates')
  // A lone surrogate is no character: a database stores U+FFFD in its place (PostgreSQL via pg).
  .refine((name) => !hasLoneSurrogate(name), 'must be well-formed Unicode (no lone surrogate)')
  .refine((name) => /[^\p{Z}\p{Cf}\p{M}\p{Default_Ignorable_Code_Point}\u2800]/u.test(name), 'must hold a visible character')
/**
 * Checks a token name against the rules `create` and `update` apply (after trimming: 1 to
 * 100 characters, no control characters, line or paragraph separators, bidirectional
 * overrides or isolates, and something visible). Returns what is wrong, or `null` when the
 * name is acceptable. For names that reach a store without the token service (seeds,
 * imports).
 */
export function validateTokenName(name: unknown): string | null {
  const result = nameSchema.safeParse(name)
  return result.success ? null : result.error.issues[0]!.message
}
/** A UUID in either case (the service's ids: `randomUUID()`, lower case). */
const ANY_CASE_UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i
/** How far the clocks of instances sharing a token store may disagree, for what a password reset sends. */
const CLOCK_SLACK_MS = 60_000
/** The longest user id a token is created for, in code points as zod counts them (an email address is at most 254). */
const MAX_USER_ID_LENGTH = 255
// A user id is the platform's and opaque, but it is stored and compared: one no store keeps as
// given would make two users one. PostgreSQL refuses NUL in text, and pg stores a lone
// surrogate as U+FFFD (`user-\uD800` and `user-\uDC00` would share their tokens). Refused as
// input (400), not as a store failure (503: to try again later would fail the same way).
const userIdSchema = z
  .string()
  .min(1, 'must not be empty')
  .refine((id) => !id.includes('\0'), 'must not contain NUL')
  .refine((id) => !hasLoneSurrogate(id), 'must be well-formed Unicode (no lone surrogate)')
// An id longer than an index entry holds fails every write: refused when a token is created
// only, so that users whose tokens were made before keep reaching them.
const newUserIdSchema = z
  .string()
  .max(MAX_USER_ID_LENGTH, `must be at most ${MAX_USER_ID_LENGTH} characters`)
  .pipe(userIdSchema)
// Its bounds and entries are validateAllowlist's, which seeds and imports use too (checkAllowlist).
// The length is checked here too, before each entry is: 8,000 entries of a 16 KiB body cost
// 20 ms of issues, one per entry, before validateAllowlist's bound (a denial-of-service audit).
const allowedIpsSchema = z
  .array(z.string('must be a string (an IP address or CIDR range)'), 'must be an array of IP addresses or CIDR ranges, or null')
  .max(MAX_ALLOWLIST_ENTRIES, `at most ${MAX_ALLOWLIST_ENTRIES} entries`)
  .nullable()
const createSchema = z.object({
  userId: newUserIdSchema,
  name: nameSchema,
  // An App id is stored in the token's scope and compared with the App's own id on every
  // request: refused as a user id is where no store would keep it as given (NUL, a lone surrogate).
  servers: z
    .array(
      z
        .string()
        .min(1, 'must not be empty')
        .max(200, 'must be at most 200 characters')
        .refine((id) => !id.includes('\0'), 'must not contain NUL')
        .refine((id) => !hasLoneSurrogate(id), 'must be well-formed Unicode (no lone surrogate)'),
    )
    .min(1, 'must name at least one server')
    .max(100, 'at most 100 servers'),
  expiresInDays: z.union(TOKEN_LIFETIMES_DAYS.map((d) => z.literal(d)) as [z.ZodLiteral<7>, z.ZodLiteral<30>, z.ZodLiteral<90>], {
    error: 'must be 7, 30 or 90',
  }),
  allowedIps: allowedIpsSchema.optional(),
})
const updateSchema = z
  .object({
    name: nameSchema.optional(),
    expiresAt: z.union([z.number().int(), z.string().max(40, 'must be at most 40 characters')]).optional(),
    allowedIps: allowedIpsSchema.optional(),
  })
  .strict()

/** Runs a zod schema and turns its first issue into an {@link InvalidInputError} naming the field. */
export function parseInput<T>(schema: z.ZodType<T>, input: unknown, fieldNames: Record<string, string> = {}): T {
  const result = schema.safeParse(input, { error: typeSentences })
  if (result.success) return result.data
  const issue = result.error.issues[0]!
  if (issue.code === 'unrecognized_keys') {
    const key = issue.keys[0]!
    // Named as sent, up to 64 characters (a caller's key can be as long as the body), unless it
    // looks like a secret; in JSON quotes, with escapes, unless it is all visible ASCII (`named`):
    // a key holding a line break must not forge a line in the log an error body ends up in.
    throw new InvalidInputError(named(renamed(fieldNames, key)), 'is not a known field')
  }
  const path = issue.path.map((p) => (typeof p === 'string' ? renamed(fieldNames, p) : String(p))).join('.')
  // A field that is not there at all: say so, not what type it should have had.
  const missing = issue.code === 'invalid_type' && issue.path.length > 0 && valueAt(input, issue.path) === undefined
  if (!missing) throw new InvalidInputError(path || 'body', issue.message)
  // A key it does not know, spelled as the field in another case (`expiresInDays` sent to the
  // HTTP API, whose field is `expires_in_days`), with other separators, in fullwidth letters or
  // with an invisible character in it (a zero-width space), is the field meant: named too.
  const spelling = (key: string) => key.normalize('NFKC').replace(/[^\p{L}\p{N}]/gu, '').toLowerCase()
  const field = spelling(String(issue.path.at(-1)))
  const meant = result.error.issues.flatMap((i) => (i.code === 'unrecognized_keys' ? i.keys : [])).find((key) => spelling(key) === field)
  throw new InvalidInputError(path, meant === undefined ? 'is required' : `is required (${quoted(renamed(fieldNames, meant))} is not a known field)`)
}

/** What zod calls a type, as a caller reads it. */
const TYPE_NAMES: Readonly<Record<string, string>> = {
  string: 'a string',
  number: 'a number',
  int: 'an integer',
  boolean: 'true or false',
  array: 'an array',
  object: 'a JSON object',
}

/**
 * zod's error map for a wrong type: a sentence about the field ("must be a string"), not zod's
 * own text ("Invalid input: expected string, received number"). zod asks it only about issues
 * whose schema set no message of its own; `undefined` leaves zod's.
 */
const typeSentences: z.core.$ZodErrorMap = (issue) => {
  if (issue.code === 'invalid_type' && Object.hasOwn(TYPE_NAMES, issue.expected)) return `must be ${TYPE_NAMES[issue.expected]}`
  if (issue.code === 'invalid_union') {
    const expected = issue.errors.flatMap((branch) =>
      branch.length === 1 && branch[0]!.code === 'invalid_type' && branch[0]!.path.length === 0 && Object.hasOwn(TYPE_NAMES, branch[0]!.expected)
        ? [TYPE_NAMES[branch[0]!.expected]!]
        : [],
    )
    if (expected.length === issue.errors.length && expected.length > 0) return `must be ${expected.join(' or ')}`
  }
  return undefined
}

/**
 * `key` as `names` renames it: an own entry only, so a key of the input such as `constructor`
 * or `__proto__` stays itself rather than becoming what `Object.prototype` holds under it.
 * @internal
 */
export function renamed(names: Readonly<Record<string, string>>, key: string): string {
  return Object.hasOwn(names, key) ? names[key]! : key
}

function valueAt(input: unknown, path: readonly PropertyKey[]): unknown {
  let value = input
  for (const key of path) {
    if (value === null || typeof value !== 'object' || !Object.hasOwn(value, key)) return undefined
    value = (value as Record<PropertyKey, unknown>)[key]
  }
  return value
}

/**
 * Epoch ms of an ISO 8601 timestamp (RFC 3339 profile), or `NaN`. Every field is checked
 * against the calendar: `Date.parse` would roll `2026-11-31` over into December and take
 * `24:00`, so an impossible date would become another one without a word.
 */
function parseTimestamp(text: string): number {
  const m = ISO_8601.exec(text)
  if (!m) return Number.NaN
  const [year, month, day, hour, minute, second = 0, offsetHours = 0, offsetMinutes = 0] = m.slice(1).map((f) => Number(f ?? 0))
  const daysInMonth = new Date(Date.UTC(year!, month!, 0)).getUTCDate()
  if (month! < 1 || month! > 12 || day! < 1 || day! > daysInMonth) return Number.NaN
  if (hour! > 23 || minute! > 59 || second > 59 || offsetHours > 23 || offsetMinutes > 59) return Number.NaN
  return Date.parse(text)
}

/** The allowlist to store: each entry once, in the order given; `null` for none. */
function allowlistOf(entries: readonly string[] | null | undefined): string[] | null {
  return entries ? [...new Set(entries)] : null
}

function iso(ms: number): string {
  return new Date(ms).toISOString()
}

/**
 * Latest reading of an injected clock the service takes: a token it creates then still expires
 * at a date (`Date` ends at 8.64e15 ms, in the year 275760), which every view writes as ISO 8601.
 */
const LATEST_CLOCK_MS = 8.64e15 - MAX_TOKEN_LIFETIME_MS

/**
 * An injected clock's reading in whole milliseconds, or a `ConfigurationError` naming `now` for
 * one that is no time a token can carry (`NaN`, negative, past {@link LATEST_CLOCK_MS}): thrown
 * before any store call, rather than a token stored with a `NaN` date, or stored and then its
 * `RangeError`.
 */
function clockReading(value: number): number {
  const ms = Math.floor(value)
  if (ms >= 0 && ms <= LATEST_CLOCK_MS) return ms
  throw new ConfigurationError('now', `answered ${String(value)}: must answer epoch ms from 0 to ${LATEST_CLOCK_MS}`)
}

const TOKEN_SERVICE_OPTIONS = optionNames<TokenServiceOptions>({ store: true, apps: true, subscriptions: true, prefix: true, pepper: true, previousPeppers: true, cacheTtlMs: true, canUseServer: true, maxPendingLookups: true, maxActiveTokensPerUser: true, unknownTokenBudget: true, lastUsedFlushMs: true, storeTimeoutMs: true, invalidations: true, random: true, now: true, waitUntil: true, onError: true })

/**
 * Creates the token service.
 *
 * @example
 * ```ts
 * const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
 * const { token } = await tokens.create({ userId: 'u1', name: 'CI', servers: ['app_1'], expiresInDays: 30 })
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} without `store`, `apps`, and `canUseServer` or `subscriptions`, or with one of them (or `invalidations`) without the methods the service calls; with a bad `prefix`, an empty `pepper`, bad `previousPeppers`, or a `cacheTtlMs`, `storeTimeoutMs`, `lastUsedFlushMs`, `maxPendingLookups` or `maxActiveTokensPerUser` out of range; with `cacheTtlMs` and no `invalidations`, an `invalidations` bus whose `publishTimeoutMs` is not a number of milliseconds, or an `onError` that is not a function. The service's methods throw {@link DispatchError}s: see {@link TokenService}.
 */
export function createTokenService(options: TokenServiceOptions): TokenService {
  if (options === null || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  refuseUnknownOptions(options, TOKEN_SERVICE_OPTIONS, 'createTokenService')
  const { store, apps } = options
  requireMethods('store', store, 'a TokenStore', ['insert', 'findByHash', 'get', 'listByUser', 'update', 'rotate', 'revoke', 'revokeAllForUser', 'touch'])
  requireMethods('apps', apps, 'an AppStore', ['getApp'])
  const prefix = options.prefix ?? DEFAULT_TOKEN_PREFIX
  const prefixProblem = tokenPrefixProblem(prefix)
  if (prefixProblem !== null) throw new ConfigurationError('prefix', prefixProblem)
  const cacheTtlMs = options.cacheTtlMs ?? 0
  if (typeof cacheTtlMs !== 'number' || !(cacheTtlMs >= 0 && cacheTtlMs <= MAX_TOKEN_CACHE_TTL_MS)) {
    throw new ConfigurationError('cacheTtlMs', `must be between 0 and ${MAX_TOKEN_CACHE_TTL_MS} (10 minutes)`)
  }
  if (!options.canUseServer && !options.subscriptions) {
    throw new ConfigurationError('canUseServer', 'or "subscriptions" is required to check the servers of a new token')
  }
  if (options.canUseServer) {
    if (typeof options.canUseServer !== 'function') throw new ConfigurationError('canUseServer', 'must be a function')
  } else requireMethods('subscriptions', options.subscriptions, 'a SubscriptionStore', ['isActive'])
  if (options.random != null && typeof options.random !== 'function') throw new ConfigurationError('random', 'must be a function')
  // Whole milliseconds, as stores keep them (PostgreSQL: bigint), whatever clock is injected.
  const injectedNow = clockOption(options.now)
  const now = injectedNow ? () => clockReading(injectedNow()) : Date.now
  // Spans (deadlines, a budget window's life) on a monotonic clock unless one is injected.
  const monotonic = injectedNow ?? (() => performance.now())
  const random = options.random ?? randomBytes
  // Drawn once now, so a source of another kind (`Math.random`) fails here, not at every create.
  if (options.random != null) {
    let drawn: unknown
    try {
      drawn = random(1)
    } catch (error) {
      throw new ConfigurationError('random', 'threw when asked for one byte', { cause: error })
    }
    if (!(drawn instanceof Uint8Array) || drawn.length !== 1) {
      throw new ConfigurationError('random', `must answer a Uint8Array of the size asked for, as crypto.randomBytes does; random(1) answered ${kindOf(drawn)}`)
    }
  }
  const pepper = options.pepper
  // An empty variable of the environment (`PEPPER=`) must not quietly switch the hash scheme
  // (an unset one gives none): a pepper is a non-empty string, or absent.
  if (pepper !== undefined && (typeof pepper !== 'string' || pepper === '')) {
    throw new ConfigurationError('pepper', 'must be a non-empty secret string (a long random one), or absent')
  }
  const previousPeppers = checkPreviousPeppers(options.previousPeppers, pepper)
  const onError = reporterOption(options.onError)
  const waitUntil = options.waitUntil
  if (waitUntil !== undefined && typeof waitUntil !== 'function') throw new ConfigurationError('waitUntil', 'must be a function')
  const maxPendingLookups = options.maxPendingLookups ?? 1_000
  if (!Number.isSafeInteger(maxPendingLookups) || maxPendingLookups < 1) {
    throw new ConfigurationError('maxPendingLookups', 'must be a positive integer')
  }
  const maxActiveTokens = options.maxActiveTokensPerUser ?? 1_000
  if (!Number.isSafeInteger(maxActiveTokens) || maxActiveTokens < 1) {
    throw new ConfigurationError('maxActiveTokensPerUser', 'must be a positive integer')
  }
  const unknownTokenBudget = createClientBudget(
    options.unknownTokenBudget,
    { now: injectedNow ?? Date.now, elapsed: monotonic },
    'unknownTokenBudget',
    DEFAULT_UNKNOWN_TOKEN_LOOKUPS,
  )
  // Both become timers' delays (past 2^31 - 1 ms one fires at once: every use would write).
  const flushEvery = timerOption('lastUsedFlushMs', options.lastUsedFlushMs ?? 60_000)
  const storeTimeoutMs = timerOption('storeTimeoutMs', options.storeTimeoutMs ?? 5_000)
  const canUseServer =
    options.canUseServer ?? ((userId: string, appId: string) => options.subscriptions!.isActive(userId, appId))
  // A cache without a bus shared by the instances would keep a secret rotated elsewhere alive
  // for the cache's TTL: the platform says which bus, even when it is the in-process one.
  // (`null`, a config loader's unset value, is as absent: required all the same.)
  if (cacheTtlMs > 0 && options.invalidations == null) {
    throw new ConfigurationError(
      'invalidations',
      'is required with cacheTtlMs: give the bus every instance sharing the token store hears (createRedisInvalidationBus), or createMemoryInvalidationBus() when this process is the only one',
    )
  }
  if (options.invalidations != null) requireMethods('invalidations', options.invalidations, 'an InvalidationBus', ['publish', 'subscribe'])
  const invalidations = options.invalidations ?? createMemoryInvalidationBus()
  // A publish still within the bus's own deadline (a Redis bus waiting for the other instances'
  // confirmations) is not taken for a failed one, reported and sent again.
  const busTimeoutMs: unknown = invalidations.publishTimeoutMs
  if (busTimeoutMs !== undefined && !(typeof busTimeoutMs === 'number' && busTimeoutMs >= 0 && busTimeoutMs <= MAX_TIMER_MS)) {
    throw new ConfigurationError('invalidations', 'has a publishTimeoutMs that is not a number of milliseconds from 0 to 2^31 - 1')
  }
  const publishDeadlineMs = Math.min(MAX_TIMER_MS, Math.max(storeTimeoutMs, busTimeoutMs === undefined ? 0 : busTimeoutMs + WRITE_SLACK_MS))
  // An injected clock drives the cache TTL; by default lru-cache's own monotonic clock does, so
  // a wall clock stepped back (NTP, a resumed VM) cannot stretch it past `cacheTtlMs`.
  // lru-cache keeps an entry for `ttl` inclusive: one millisecond less, so a revocation takes
  // effect within `cacheTtlMs`, never at `cacheTtlMs` and a millisecond.
  const cache =
    cacheTtlMs > 0
      ? new LRUCache<string, ApiTokenRecord>({ max: 50_000, ttl: Math.max(1, cacheTtlMs - 1), ...lruClock(options.now) })
      : undefined
  /** `false` once closed: the service no longer hears invalidations, so it no longer caches. */
  let hearing = true
  // Counts invalidations: a lookup that was in flight while one arrived does not cache what it
  // read, since it may have read the record before the change (a revoked token would then be
  // trusted for the rest of the cache TTL).
  let invalidationCount = 0
  const sender = createInvalidationSender({
    send: (tokenHash) => invalidations.publish({ kind: 'token', tokenHash }),
    report: onError,
    deadlineMs: publishDeadlineMs,
    now: monotonic,
    waitUntil,
  })
  const unsubscribe = invalidations.subscribe((message) => {
    if (message.kind === 'token') {
      invalidationCount++
      cache?.delete(message.tokenHash)
      dropRefusal(message.tokenHash)
      charged.delete(message.tokenHash)
    } else if (message.kind === 'all') {
      invalidationCount++
      cache?.clear()
      refusedHashes.clear()
      refusalAliases?.clear()
      charged.clear()
      // The bus hears the others again (a Redis bus says so when its connection is back):
      // invalidations that failed while it was cut go now, not when their backoff ends.
      if (invalidations.listening !== false) sender.resend()
    }
  })
  // Found now, not at `close`, where it would stop the shutdown before its last write. (The
  // listener stays on that bus: there is nothing to remove it with.)
  if (typeof unsubscribe !== 'function') {
    throw new ConfigurationError('invalidations', `subscribe answered ${kindOf(unsubscribe)}: it must return the function that unsubscribes`)
  }
  // Hashes that matched a live stored token: their tokens are well formed, so the checksum
  // need not be computed again, and their lookups are not charged to `unknownTokenBudget`
  // (hashes only, never a secret). Bounded in two generations: when `wellFormed` holds half
  // of `MAX_KNOWN_HASHES` it becomes `knownBefore` and a new one starts; a hash used from
  // `knownBefore` moves back to `wellFormed`. So a token in use stays known however many others
  // come and go, and the hot path costs one `Set` lookup.
  let wellFormed = new Set<string>()
  let knownBefore = new Set<string>()
  // Hashes of well-formed tokens the store did not hold, or holds revoked or expired, answered
  // with the same refusal again for a while without a lookup or a charge to the client's budget
  // (a client retrying a secret rotated away, or a token it no longer has the right to use).
  // An unknown hash becomes known only when that very secret is issued, and new secrets are
  // random; revoked and expired are end states. So holding the answer is safe; it is held
  // briefly anyway, for a store whose reads lag its writes (a replica), and dropped by any
  // invalidation of its hash in any scheme (`refusalAliases`).
  const refusedHashes = new LRUCache<string, TokenAuthResult>({ max: 10_000, ttl: REFUSED_HASH_TTL_MS, ...lruClock(options.now) })
  // With `previousPeppers`: the hash of a refused token in each previous scheme, to its hash in
  // the current one, which its refusal is held under. An invalidation names the hash a token is
  // stored with, which may be a previous scheme's (a rotation undone after its write timed out
  // puts back a token stored under the old pepper: its secret must work again at once).
  const refusalAliases =
    previousPeppers.length === 0 ? undefined : new LRUCache<string, string>({ max: 10_000 * previousPeppers.length, ttl: REFUSED_HASH_TTL_MS, ...lruClock(options.now) })
  /** Drops the refusal held for an invalidated hash, under whichever scheme it is held. */
  function dropRefusal(tokenHash: string): void {
    refusedHashes.delete(tokenHash)
    const current = refusalAliases?.get(tokenHash)
    if (current !== undefined) {
      refusedHashes.delete(current)
      refusalAliases!.delete(tokenHash)
    }
  }
  // The charged lookups in flight, by hash: more requests with the same token meanwhile (a
  // client opening many requests at once on an instance that has not seen its token yet)
  // share the lookup and its one unit instead of spending the budget. Dropped by any
  // invalidation of the hash, so no request after it gets what was read before it.
  const charged = new Map<string, { readonly auth: Promise<TokenAuthResult>; readonly since: number }>()
  // Those lookups still waiting on the store, hung ones included (`maxPendingLookups`): a lookup
  // `charged` no longer shares is still counted until the store answers it.
  let pendingLookups = 0
  // Where a request's I/O ends with it (Workers), a lookup whose request ended first (its client
  // left, or the dispatcher answered 503 past `storeTimeoutMs`) never settles: its count would
  // stay for good, and `maxPendingLookups` such lookups would refuse every unknown token of the
  // isolate. There, lookups are counted by when they began, and one older than `storeTimeoutMs`
  // (and some slack) is forgotten when the bound is reached. On Node, Bun and Deno a lookup on a
  // hung store is still pending, and counts until the store answers it.
  const lookupsEndWithRequest = timersEndWithRequest()
  const lookupsSince = new Set<{ readonly since: number }>()
  // The accepted result per record (records are immutable): one object, not one per request.
  const accepted = new WeakMap<ApiTokenRecord, TokenAuthResult>()
  const pendingLastUsed = new Map<string, number>()
  let lastFlush = now()
  let flushing: Promise<void> | undefined
  // When `flushing` began (`monotonic`). A write lasts `storeTimeoutMs` at most (its timeout); one
  // unsettled well past that was cut short with the request that began it (Workers, without
  // `waitUntil`: its promise never settles there, or rejects only in a request that awaits it).
  let flushingSince = 0
  // Writes pending uses within `flushEvery` of the first one even when no request follows
  // (unref'd: it never keeps a process alive). With `waitUntil`, the request that set it is kept
  // until it fires or is cleared (`releaseFlushTimer`).
  let flushTimer: ReturnType<typeof setTimeout> | undefined
  let releaseFlushTimer: (() => void) | undefined
  let writing: ReadonlyMap<string, number> | undefined
  let closed = false
  // Whether the last `last_used_at` write that ended failed: `close` then writes no more (its
  // batch is reported and kept, and a store that failed it would fail the next too).
  let lastWriteFailed = false

  const hash = (token: string) => hashApiToken(token, pepper)
  /** What a call whose caller left rejects with: its signal's reason. */
  const callerLeft = (signal: AbortSignal): unknown => signal.reason ?? new Error('The caller left')
  const statusOf = (r: ApiTokenRecord, at = now()): ApiTokenStatus =>
    r.revokedAt !== null ? 'revoked' : at >= r.expiresAt ? 'expired' : 'active'

  /**
   * A rotation's compare-and-swap from the secret of `read`, the record as its caller found it:
   * the new secret, or no secret at all. Lost to a revocation or an expiry, which a read shows:
   * `inactive`. Lost to another rotation: 409 `lost`, and no swap again: that rotation's caller
   * (a second tab, the token rotating itself) was handed the new secret, which another swap would
   * kill at once. The secret read back in place (no rotation won: one whose store failed was
   * undone, and its caller, answered 503, holds that secret): it swaps again, from that read, up
   * to MAX_ROTATE_ATTEMPTS times.
   */
  async function swapSecret(
    id: string,
    read: ApiTokenRecord,
    on: { reread: () => Promise<ApiTokenRecord>; inactive: (state: 'expired' | 'revoked') => Error; lost: string },
    signal: AbortSignal | undefined,
  ): Promise<ApiTokenSecretView> {
    for (let attempt = 1; ; attempt++) {
      const state = statusOf(read)
      if (state !== 'active') throw on.inactive(state)
      const secret = await newSecret()
      const current = read
      // No closure here names `secret`, so none holds the clear secret: the undo may wait to be
      // tried again for minutes (`putRight`).
      const stored = secret.stored
      const undo = (why = 'whose caller was told 503 (it may have landed)') =>
        undoRotation(id, { tokenHash: current.tokenHash, displayPrefix: current.displayPrefix }, stored.tokenHash, current.tokenHash, why)
      // Its caller left before the write: nothing is written (written, then undone, the new
      // secret stood meanwhile, and the old one, which the caller still holds, was refused).
      if (signal?.aborted) throw callerLeft(signal)
      const rotated = await storeCall(() => store.rotate(id, stored, current.tokenHash), {
        landed: (late) => late && undo(),
        unknown: () => undo(),
      })
      if (rotated) {
        await invalidate(current.tokenHash, true)
        // Its caller left meanwhile: nobody holds the new secret (see `SecretCallOptions`).
        const left = async (): Promise<never> => {
          await putRight(() => undo('that landed though its caller had left'), 'token store')
          throw callerLeft(signal!)
        }
        if (signal?.aborted) return left()
        // Its write landed once the token had expired (spec 3: only an active token is rotated):
        // no dead secret is handed out.
        if (statusOf(rotated) === 'expired') throw on.inactive('expired')
        const view = await secretView(rotated, secret.token)
        // Or while the App store named the token's Apps (up to `storeTimeoutMs`): the secret
        // would reach nobody all the same (regression: the rotation stood, and the client that
        // retried with the secret it held was told 401 invalid_token).
        if (signal?.aborted) return left()
        return view
      }
      read = await on.reread()
      const after = statusOf(read)
      if (after !== 'active') throw on.inactive(after)
      if (read.tokenHash !== current.tokenHash) throw new ConflictError(on.lost)
      if (attempt === MAX_ROTATE_ATTEMPTS) throw new ConflictError('Token is being rotated concurrently; try again')
    }
  }

  /**
   * A rotation whose caller was told 503 may have landed (it answered after the deadline, or
   * the store failed once the statement may have been sent): nobody holds its secret, so the
   * old one is put back (compare-and-swap on the new hash: nothing happens if it never landed,
   * and a rotation or revocation since keeps its own), as the caller believes; a headless
   * client would otherwise be locked out with an active token. So is one whose caller left
   * (`SecretCallOptions`). Either way, both secrets' cached records are dropped. `why`: what the
   * report of an undo that fails says of the rotation and its caller.
   */
  async function undoRotation(
    id: string,
    previous: { tokenHash: string; displayPrefix: string },
    landedHash: string,
    replacedHash: string,
    why: string,
  ): Promise<void> {
    try {
      await storeCall(() => store.rotate(id, previous, landedHash))
    } catch (error) {
      throw new Error(`token ${id}: a rotation ${why} could not be undone`, { cause: error })
    } finally {
      await Promise.all([invalidate(landedHash, true), invalidate(replacedHash)])
    }
  }

  /**
   * After a write whose outcome is unknown: the secret the record held when read (`readHash`)
   * and, if a rotation since replaced it, the token's secret now (the write's own answer would
   * have named it) are invalidated.
   */
  async function invalidateReadAndCurrent(id: string, readHash: string): Promise<void> {
    // Side by side: a bus waiting for the other instances' confirmations holds each for a while.
    const read = invalidate(readHash)
    const current = await storeCall(() => store.get(id)).finally(() => read)
    if (current !== undefined && current.tokenHash !== readHash) await invalidate(current.tokenHash)
  }

  // The edits of an expiry that succeeded here, counted, and the last one of each token (the
  // latest 10,000 tokens): an edit whose caller was told 503 does not put its expiry back when
  // an edit that succeeded since set the same expiry (its caller, told 200, sent it again).
  let expiryEdits = 0
  const lastExpiryEdit = new LRUCache<string, { readonly seq: number; readonly expiresAt: number }>({ max: 10_000 })

  // Second runs of `unknown` reconcilers still to come (`runAgainLater`), each settling once it
  // has run, with its timer: `close` waits for them.
  const lateRuns = new Map<Promise<void>, ReturnType<typeof setTimeout>>()
  let closing = false

  /**
   * Runs a reconciler (which never rejects) once more `storeTimeoutMs` after its first run put
   * things right. A write whose store failed may not have ended on the server: a connection
   * lost with the statement sent (a pooler restart, a middlebox), or a client-side timeout
   * (pg's `query_timeout`), leaves a statement waiting on a lock to commit later, after the
   * first run found nothing to put right (a rotation not yet there to undo, a token not yet
   * there to revoke). By then a `statement_timeout` under `storeTimeoutMs` (docs/stores.md) has
   * ended any such statement, so the second run sees how the write ended. Unref'd until
   * `close` waits for it; handed to `waitUntil` where given. After `close` it still runs: one
   * that fails (the store closed) is reported naming its token.
   */
  function runAgainLater(run: () => Promise<void>): void {
    let timer!: ReturnType<typeof setTimeout>
    const done: Promise<void> = new Promise<void>((resolve) => {
      timer = setTimeout(() => void run().finally(resolve), storeTimeoutMs)
    }).finally(() => lateRuns.delete(done))
    if (!closing) timer.unref?.()
    lateRuns.set(done, timer)
    waitUntil?.(done)
  }

  // Passes putting right a write that failed and wait to be tried again, oldest first: each
  // one's timer, what tries it now (the timer cleared) and what gives it up; and those being
  // tried again. `close` tries the first at once and waits for both.
  const retriesDue = new Map<ReturnType<typeof setTimeout>, { readonly now: () => Promise<void>; readonly giveUp: () => void }>()
  const retriesRunning = new Set<Promise<void>>()

  /**
   * Runs `run`, a pass putting right a write (harmless when nothing is to be put right, and
   * when repeated), and answers whether it succeeded; never rejects. When it fails (the store
   * still down), the failure is reported under `context`, naming the token, and the pass is
   * tried again, silently, 0.5–1 s later and then with waits doubling to 30 s, for
   * {@link PUT_RIGHT_RETRY_MS} while the service is open, and once more at `close`; when none
   * of those succeeds, its last failure is reported as given up (so is the oldest waiting when
   * {@link MAX_PUT_RIGHT_RETRIES} wait). `succeeded` runs after a try that succeeds. After
   * `close`, a failure is reported and not tried again. `failed`: the pass has just been made
   * and failed so; it is not made again at once.
   */
  function putRight(run: () => unknown, context: string, succeeded?: () => void, failed?: { readonly error: unknown }): Promise<boolean> {
    const since = monotonic()
    let tries = 0
    let failure: unknown
    const giveUp = () => onError(givenUp(failure, tries), context)
    const failedWith = (error: unknown): false => {
      failure = error
      const last = closed || monotonic() - since >= PUT_RIGHT_RETRY_MS
      if (tries === 1) onError(error, context)
      else if (last) giveUp()
      if (!last) retryLater()
      return false
    }
    const attempt = async (): Promise<boolean> => {
      tries++
      try {
        await run()
      } catch (error) {
        return failedWith(error)
      }
      succeeded?.()
      return true
    }
    const retryLater = () => {
      if (retriesDue.size >= MAX_PUT_RIGHT_RETRIES) {
        const [oldest, retry] = retriesDue.entries().next().value!
        clearTimeout(oldest)
        retriesDue.delete(oldest)
        retry.giveUp()
      }
      let release: (() => void) | undefined
      const now = (): Promise<void> => {
        clearTimeout(timer)
        retriesDue.delete(timer)
        const running = attempt().then(() => release?.())
        retriesRunning.add(running)
        void running.finally(() => retriesRunning.delete(running))
        return running
      }
      const timer = setTimeout(now, computeBackoff(tries, PUT_RIGHT_BACKOFF))
      timer.unref?.()
      retriesDue.set(timer, { now, giveUp: () => (giveUp(), release?.()) })
      waitUntil?.(new Promise<void>((resolve) => (release = resolve)))
    }
    if (failed === undefined) return attempt()
    tries = 1
    return Promise.resolve(failedWith(failed.error))
  }

  /**
   * A store call under `storeTimeoutMs`. A write whose caller is told 503 may still have
   * landed, and `reconcile` puts that right (invalidates, or undoes, what it changed, as it
   * would have been in time):
   * - `landed`, with the store's answer, when the write answers after the deadline;
   * - `unknown` when the store failed (a connection lost after the statement was sent may
   *   have committed it: spec 3's "old secret is invalid immediately" holds only if the
   *   change is treated as possible), or answered a failure after the deadline. It must do no
   *   harm when nothing landed, nor when run twice: it runs again `storeTimeoutMs` later, for
   *   a statement the failure left running on the server (`runAgainLater`). The caller's 503
   *   waits for its first run (under the deadline), so a client that retries at once finds
   *   the store as it believes it to be.
   * A refusal of the input (`InvalidInputError`, `NotFoundError`) changed nothing.
   */
  async function storeCall<T>(fn: () => MaybePromise<T>, reconcile?: Reconcile<T>): Promise<T> {
    let answer: MaybePromise<T> | undefined
    let settled = false
    const started = monotonic()
    try {
      // A thenable of another library is awaited under the deadline too, as a promise is.
      answer = adoptThenable(fn())
      if (!(answer instanceof Promise)) return answer
      return await withTimeout(
        answer.finally(() => (settled = true)),
        storeTimeoutMs,
        'token store',
      )
    } catch (error) {
      if (error instanceof InvalidInputError || error instanceof NotFoundError) throw error
      if (reconcile && answer instanceof Promise) {
        const unknown = reconcile.unknown ?? (() => undefined)
        const context = 'token store write whose caller was told 503'
        // Once more `storeTimeoutMs` after it succeeded (at its first try or a later one).
        const reconcileUnknown = () => putRight(unknown, context, () => runAgainLater(() => putRight(unknown, context).then(() => {})))
        if (!settled) {
          answer.then(
            (value) => void putRight(() => reconcile.landed(value), context),
            () => void reconcileUnknown(),
          )
        } else {
          // Waited for within what is left of the call's own deadline (it goes on, and reports,
          // past it), so the 503 never comes later than `storeTimeoutMs` after the call began.
          const running = reconcileUnknown()
          const left = storeTimeoutMs - (monotonic() - started)
          if (left > 0) await withTimeout(running, left, 'token store').catch(() => {})
        }
      }
      if (error instanceof StoreUnavailableError) throw error
      throw new StoreUnavailableError('token', { cause: error })
    }
  }

  /**
   * A call of the App store or of `canUseServer` (the subscription store), bounded as the token
   * store's are: a failure, or no answer within `storeTimeoutMs`, is `StoreUnavailableError`
   * naming it (503). A `DispatchError` of the platform's own `canUseServer` goes on as it is.
   */
  async function askStore<T>(store: 'app' | 'subscription', fn: () => MaybePromise<T>): Promise<T> {
    try {
      const answer = adoptThenable(fn())
      return answer instanceof Promise ? await withTimeout(answer, storeTimeoutMs, `${store} store`) : answer
    } catch (error) {
      if (error instanceof DispatchError) throw error
      throw new StoreUnavailableError(store, { cause: error })
    }
  }

  /**
   * Whether `userId` may put `appId` in a token's scope: only `canUseServer` (the subscription
   * store's `isActive`) answering `true` lets it, as the dispatcher lets a request through. Any
   * other answer refuses, and one that is no boolean (`'false'`, `'f'` as a text column reads,
   * `1`) is reported to `onError` too: never a scope the user may not have.
   */
  async function mayUse(userId: string, appId: string): Promise<boolean> {
    const answer: unknown = await askStore('subscription', () => canUseServer(userId, appId))
    if (answer === true) return true
    if (answer !== false) {
      const asked = options.canUseServer ? 'canUseServer' : "the subscription store's isActive"
      onError(new TypeError(`mcp-dispatch: ${asked} answered ${kindOf(answer)}, not a boolean: the App refused for the new token`), 'subscriptions answer')
    }
    return false
  }

  /** The App of this id, as the App store answers it (bounded as every call of it). */
  const askApp = (id: string): Promise<AppRecord | undefined> => askStore('app', () => apps.getApp(id))

  /**
   * An App lookup that asks the App store once per App, for the views of one list: a user's
   * thousand tokens name a few Apps, and one question per token and App (100,000 for 1,000
   * tokens of 100 Apps each, all at once) took a pooled App store past `storeTimeoutMs`, and
   * the list was a 503 (a listing audit).
   */
  function onceEachApp(): (id: string) => Promise<AppRecord | undefined> {
    const asked = new Map<string, Promise<AppRecord | undefined>>()
    return (id) => {
      let app = asked.get(id)
      if (app === undefined) asked.set(id, (app = askApp(id)))
      return app
    }
  }

  /**
   * The `scopes` of a view: each App's name and slug, from `known` (what a creation looked up)
   * or the App store (through `lookUp`). After a write (`written`), the answer is owed whatever
   * the App store does, since the write has landed (a rotated secret refused, a token created):
   * an App the store fails to name is named `null`, as one it no longer knows, and the failure
   * reported.
   */
  async function scopesOf(
    record: ApiTokenRecord,
    written: boolean,
    known?: ReadonlyMap<string, AppRecord>,
    lookUp: (id: string) => Promise<AppRecord | undefined> = askApp,
  ): Promise<TokenScopeView[]> {
    return Promise.all(
      record.servers.map(async (id) => {
        let app = known?.get(id)
        if (app === undefined) {
          try {
            app = await lookUp(id)
          } catch (error) {
            if (!written) throw error
            onError(error, 'app store (the names of a token\'s Apps, after its write: answered without them)')
          }
        }
        return { server_id: id, server_name: app?.name ?? null, server_slug: app?.slug ?? null }
      }),
    )
  }

  /**
   * A token's view; `written`: after a write that has landed (see {@link scopesOf}); `lookUp`:
   * how its Apps are looked up (a list's asks once per App).
   */
  async function view(record: ApiTokenRecord, written = false, lookUp?: (id: string) => Promise<AppRecord | undefined>): Promise<ApiTokenView> {
    return {
      id: record.id,
      name: record.name,
      prefix: record.displayPrefix,
      expires_at: iso(record.expiresAt),
      allowed_ips: record.allowedIps ? [...record.allowedIps] : null,
      scopes: await scopesOf(record, written, undefined, lookUp),
      created_at: iso(record.createdAt),
      last_used_at: lastUsedAt(record),
      status: statusOf(record),
    }
  }

  /** `last_used_at` with the uses not yet written (or being written): never an older date. */
  function lastUsedAt(record: ApiTokenRecord): string | null {
    const at = Math.max(record.lastUsedAt ?? -1, pendingLastUsed.get(record.id) ?? -1, writing?.get(record.id) ?? -1)
    return at === -1 ? null : iso(at)
  }

  /** The view of a token just created or rotated, with its secret: always after a write. */
  async function secretView(record: ApiTokenRecord, token: string, known?: ReadonlyMap<string, AppRecord>): Promise<ApiTokenSecretView> {
    return {
      token,
      id: record.id,
      name: record.name,
      prefix: record.displayPrefix,
      expires_at: iso(record.expiresAt),
      allowed_ips: record.allowedIps ? [...record.allowedIps] : null,
      scopes: await scopesOf(record, true, known),
      created_at: iso(record.createdAt),
    }
  }

  function checkUserId(userId: unknown): void {
    const result = userIdSchema.safeParse(userId, { error: typeSentences })
    if (!result.success) throw new InvalidInputError('userId', result.error.issues[0]!.message)
  }

  function checkAllowlist(entries: readonly string[] | null | undefined, field: string): void {
    if (!entries) return
    const bad = validateAllowlist(entries)
    if (bad) throw new InvalidInputError(bad.index === null ? field : `${field}.${bad.index}`, bad.message)
  }

  /**
   * The record of `userId`'s token `id`. A UUID is case-insensitive on input (RFC 9562 section
   * 4): one not stored as given is looked up in lower case (as the service writes its ids), then
   * in upper case (an import's), so the id a user pastes in either case names its token. Later
   * writes use the id as stored (`record.id`).
   */
  async function ownedRecord(userId: string, id: string): Promise<ApiTokenRecord> {
    checkUserId(userId)
    const spellings = typeof id === 'string' && ANY_CASE_UUID.test(id) ? new Set([id, id.toLowerCase(), id.toUpperCase()]) : [id]
    let record: ApiTokenRecord | undefined
    for (const spelling of spellings) {
      const found = await storeCall(() => store.get(spelling))
      // Someone else's token is read past like a missing one, so that it costs the same reads
      // and gets the same 404: no existence oracle, by the answer or by its time.
      if (found !== undefined && found.userId === userId) {
        record = found
        break
      }
    }
    if (!record) throw new NotFoundError('Token not found')
    return record
  }

  /** Whether `given` names the token stored as `id`: exactly, or a UUID in another case. */
  function namesToken(given: string, id: string): boolean {
    return given === id || (typeof given === 'string' && ANY_CASE_UUID.test(given) && given.toLowerCase() === id.toLowerCase())
  }

  function invalidate(tokenHash: string, gone = false): Promise<void> {
    invalidationCount++
    cache?.delete(tokenHash)
    dropRefusal(tokenHash)
    charged.delete(tokenHash)
    // A secret gone for good (rotated away, revoked) is no longer known either (see
    // `wellFormed`): kept until presented again, one user rotating or revoking in a loop pushed
    // every other token out of the known hashes (each then charged to its client's
    // `unknownTokenBudget`, and held by `maxPendingLookups`). One still live (an edit) stays.
    if (gone) forget(tokenHash)
    // Never rejects: a bus that fails, throws or does not answer within `publishDeadlineMs` is
    // reported, and the invalidation sent again (invalidation-resend.ts), never thrown to a
    // caller whose write is done, nor left unhandled behind a 503.
    return sender.publish(tokenHash)
  }

  /**
   * A new secret: `token`, the clear text for its caller alone, and `stored`, what a store is
   * given (its hash and display prefix; never the token, which a store might log or keep).
   */
  async function newSecret(): Promise<{ token: string; stored: { tokenHash: string; displayPrefix: string } }> {
    const token = generateApiToken(prefix, random)
    const tokenHash = hash(token)
    // Issued here, so known here: its first use on this instance needs no checksum and is not
    // charged to its client's `unknownTokenBudget`.
    knowWellFormed(tokenHash)
    return { token, stored: { tokenHash, displayPrefix: displayPrefix(token) } }
  }

  function knowWellFormed(tokenHash: string): void {
    if (wellFormed.size >= MAX_KNOWN_HASHES / 2) {
      knownBefore = wellFormed
      wellFormed = new Set()
    }
    wellFormed.add(tokenHash)
  }

  /** Whether `tokenHash` is known; one known from the previous generation moves to the current one. */
  function isKnown(tokenHash: string): boolean {
    if (wellFormed.has(tokenHash)) return true
    if (!knownBefore.has(tokenHash)) return false
    knownBefore.delete(tokenHash)
    knowWellFormed(tokenHash)
    return true
  }

  /** Forgets `tokenHash`; whether it was known. */
  function forget(tokenHash: string): boolean {
    const current = wellFormed.delete(tokenHash)
    return knownBefore.delete(tokenHash) || current
  }

  function recordUse(id: string, at: number): void {
    pendingLastUsed.set(id, at)
    if (at - lastFlush >= flushEvery && (!flushing || writeLost())) void service.flush()
    else if (flushTimer === undefined) armFlush()
  }

  /** How long after its start a write is still waited for: its timeout, and some slack. */
  function writeLeftMs(): number {
    return flushingSince + storeTimeoutMs + WRITE_SLACK_MS - monotonic()
  }

  /** Whether the write in flight was cut short by the runtime (see `flushingSince`). */
  function writeLost(): boolean {
    return writeLeftMs() < 0
  }

  function armFlush(): void {
    flushTimer = setTimeout(() => void service.flush(), flushEvery)
    flushTimer.unref?.()
    if (waitUntil) waitUntil(new Promise<void>((resolve) => (releaseFlushTimer = resolve)))
  }

  /** `batch` pending again, where no later use of its tokens is: none is lost. */
  function keepPending(batch: ReadonlyMap<string, number>): void {
    for (const [id, at] of batch) {
      const pending = pendingLastUsed.get(id)
      if (pending === undefined || pending < at) pendingLastUsed.set(id, at)
    }
  }

  /** Writes the pending uses: one `touch` of the store; on failure they stay pending. */
  function writePending(): Promise<void> {
    if (pendingLastUsed.size === 0) return Promise.resolve()
    const batch = new Map(pendingLastUsed)
    pendingLastUsed.clear()
    writing = batch
    lastFlush = now()
    const write = async () => {
      try {
        const touched = adoptThenable(store.touch(batch))
        if (touched instanceof Promise) await withTimeout(touched, storeTimeoutMs, 'token store touch')
        lastWriteFailed = false
      } catch (error) {
        lastWriteFailed = true
        onError(error, 'last_used_at flush')
        // Kept for the next flush, so the dashboard never goes back to an older date while the
        // store is away.
        keepPending(batch)
        if (flushTimer === undefined && !closed) armFlush()
      }
    }
    // Cleared in a reaction, so always after the assignment, even when `touch` throws at once;
    // and only if still the write in flight (one taken for lost may end late).
    const current: Promise<void> = write().finally(() => {
      if (flushing !== current) return
      flushing = undefined
      writing = undefined
    })
    flushing = current
    flushingSince = monotonic()
    waitUntil?.(current)
    return current
  }

  /**
   * The store's record for `tokenHash`, judged (`undefined`: not stored under that hash), and
   * remembered: in the cache when live, as refused when revoked or expired (see `remember`).
   * `known`: the hash is already in `wellFormed` (the caller looked).
   */
  function lookup(tokenHash: string, known: boolean): MaybePromise<TokenAuthResult | undefined> {
    let found: MaybePromise<ApiTokenRecord | undefined>
    // When the store was asked: a record is trusted for `cacheTtlMs` from its read, not from
    // its answer, so a slow answer is cached for what is left of the TTL.
    const askedAt = cache === undefined ? 0 : monotonic()
    try {
      // Another library's promise is awaited as one, never taken for the record.
      found = adoptThenable(store.findByHash(tokenHash))
    } catch (error) {
      throw new StoreUnavailableError('token', { cause: error })
    }
    if (!(found instanceof Promise)) return remember(found, tokenHash, known, invalidationCount, askedAt)
    const before = invalidationCount
    return found.then(
      (record) => remember(record, tokenHash, known, before, askedAt),
      (error: unknown) => {
        throw new StoreUnavailableError('token', { cause: error })
      },
    )
  }

  /**
   * The record the store found for `tokenHash`, judged if it matches. Nothing is remembered from
   * a read an invalidation may have overtaken (one came in since `asked`, the count when the
   * lookup started): a rotation undone or an edit would otherwise be missed. A live record is
   * cached until `cacheTtlMs` after `askedAt` (when the store was asked, on `monotonic`): a
   * revocation another instance could not tell this one of takes effect within `cacheTtlMs` of
   * the read, however late its answer came.
   */
  function remember(record: ApiTokenRecord | undefined, tokenHash: string, known: boolean, asked: number, askedAt: number): TokenAuthResult | undefined {
    // A bytea column read as a Buffer would match no hash: every token refused (401, telling
    // clients to drop it), with nothing reported.
    if (record && typeof record.tokenHash !== 'string') throw wrongShape(record, `tokenHash (${kindOf(record.tokenHash)}) is no string (read a bytea column as hex text)`)
    // A store is trusted with the lookup, not with the match: compared in constant time.
    const auth = record && hashesEqual(record.tokenHash, tokenHash) ? judge(record) : undefined
    if (auth === undefined || !auth.ok) {
      // A hash seen live that no longer is (its secret rotated away, or the token revoked or
      // expired, for good): no longer known, so its next lookup is charged to its client, and
      // its refusal held like any other rather than looked up on every presentation. (A hash
      // under a previous pepper in `wellFormed` is held under that hash, which `authenticate`
      // does not read: its next presentation is looked up, charged, and held under `pepper`'s.)
      if (known && forget(tokenHash) && asked === invalidationCount) refusedHashes.set(tokenHash, auth ?? UNKNOWN)
      return auth
    }
    if (!known) knowWellFormed(tokenHash)
    if (cache && hearing && asked === invalidationCount && invalidations.listening !== false) {
      const ttl = Math.floor(cacheTtlMs - 1 - (monotonic() - askedAt))
      if (ttl >= 1) cache.set(tokenHash, record, { ttl })
    }
    return auth
  }

  /** A cached record; none while the bus cannot hear other instances (a rotation there would go unnoticed). */
  function fromCache(tokenHash: string): ApiTokenRecord | undefined {
    return cache !== undefined && hearing && invalidations.listening !== false ? cache.get(tokenHash) : undefined
  }

  /**
   * The record cached for `token` under one of `previousPeppers` (where `lookup` left it: under
   * the hash it is stored with, which its rotation or revocation invalidates), so a token not
   * yet rotated since a pepper change is served from the cache without a store lookup.
   */
  function cachedUnderPreviousPepper(token: string, older: readonly string[] | undefined): ApiTokenRecord | undefined {
    if (cache === undefined) return undefined
    for (let i = 0; i < previousPeppers.length; i++) {
      const cached = fromCache(older?.[i] ?? hashApiToken(token, previousPeppers[i] ?? undefined))
      if (cached !== undefined) return cached
    }
    return undefined
  }

  /**
   * A well-formed token not found under `pepper`, looked up under `previousPeppers[i]` and the
   * ones after it. Found, it is judged as stored; nothing is written.
   */
  function underPreviousPepper(token: string, i: number, known: boolean, older: readonly string[] | undefined): MaybePromise<TokenAuthResult> {
    if (i === previousPeppers.length) return UNKNOWN
    const judged = lookup(older?.[i] ?? hashApiToken(token, previousPeppers[i] ?? undefined), known)
    const next = (found: TokenAuthResult | undefined) => found ?? underPreviousPepper(token, i + 1, known, older)
    return judged instanceof Promise ? judged.then(next) : next(judged)
  }

  /**
   * The record stored for `token` under `pepper`, else under each of `previousPeppers`, judged.
   * `older`: the token's hashes under `previousPeppers`, where already made (else made as needed).
   */
  function lookUnderEveryPepper(token: string, tokenHash: string, known: boolean, older?: readonly string[]): MaybePromise<TokenAuthResult> {
    if (previousPeppers.length === 0) {
      const judged = lookup(tokenHash, known)
      return judged instanceof Promise ? judged.then(orUnknown) : (judged ?? UNKNOWN)
    }
    const cached = cachedUnderPreviousPepper(token, older)
    if (cached !== undefined) return judge(cached)
    const judged = lookup(tokenHash, known)
    const next = (found: TokenAuthResult | undefined) => found ?? underPreviousPepper(token, 0, known, older)
    return judged instanceof Promise ? judged.then(next) : next(judged)
  }

  /**
   * The charged lookup of a hash not known here, settled: a token found live gives its unit
   * back; one unknown, revoked or expired keeps it (refusals are what the budget bounds: a
   * revoked token would otherwise be a free lookup on every presentation), and the refusal is
   * held (`refusedHashes`) unless an invalidation may have overtaken the read.
   */
  function settleCharge(auth: TokenAuthResult, charge: BudgetCharge, tokenHash: string, older: readonly string[] | undefined, asked: number): TokenAuthResult {
    if (auth.ok) charge.refund()
    else if (asked === invalidationCount) {
      refusedHashes.set(tokenHash, auth)
      if (older !== undefined) for (const hash of older) refusalAliases!.set(hash, tokenHash)
    }
    return auth
  }

  function judge(record: ApiTokenRecord | undefined): TokenAuthResult {
    if (!record) return UNKNOWN
    if (record.revokedAt !== null) {
      // Left out (a column mapped under another name): every token would read as revoked, 401.
      if (record.revokedAt === undefined) throw wrongShape(record, 'revokedAt (undefined) is neither null (live) nor the time of the revocation')
      return REVOKED
    }
    const at = now()
    if (at >= record.expiresAt) return EXPIRED
    let result = accepted.get(record)
    if (result === undefined) {
      checkStoredShape(record)
      result = Object.freeze({ ok: true, record, allowlist: storedAllowlist(record) })
      accepted.set(record, result)
    }
    recordUse(record.id, at)
    return result
  }

  /**
   * Throws `StoreUnavailableError` (503, reported) for a live record whose expiry, scope or
   * allowlist is not of the type `ApiTokenRecord` says: a store of the platform's own that maps
   * a column as text (`"2027-01-01T00:00:00Z"`, `'["app_1"]'`, node-postgres's string for a
   * `bigint`) or leaves one out (`undefined`). Taken as it came, such a record never expires
   * (`at >= NaN` is false), is scoped to every App whose id is part of the text (a string's
   * `includes`), has no allowlist (`undefined` read as none), or has an owner no user has
   * (`userId` mapped under another name): never an access the stored token does not grant.
   * (An entry of `servers` that is no string, a SQL array's NULL, grants nothing, and is let
   * be.)
   */
  function checkStoredShape(record: ApiTokenRecord): void {
    const { expiresAt, servers, allowedIps, userId } = record as { expiresAt: unknown; servers: unknown; allowedIps: unknown; userId: unknown }
    const wrong =
      typeof expiresAt !== 'number' || !Number.isFinite(expiresAt)
        ? `expiresAt (${kindOf(expiresAt)}) is no finite number of epoch milliseconds (read a bigint column with Number())`
        : typeof userId !== 'string' || userId === ''
          ? `userId (${userId === '' ? 'empty' : kindOf(userId)}) is no non-empty string (the owner: every token without one would be one user's, sharing sessions and counters)`
          : !Array.isArray(servers)
          ? `servers (${kindOf(servers)}) is no array of App ids`
          : allowedIps !== null && !Array.isArray(allowedIps)
            ? `allowedIps (${kindOf(allowedIps)}) is neither null (no allowlist) nor an array (give null for a missing one)`
            : undefined
    if (wrong !== undefined) throw wrongShape(record, wrong)
  }

  /**
   * Every token of `userId`, as the store lists them (one store call). An answer that is no
   * array (a driver's result, `{ rows }`, handed on whole; `undefined` for a user with none) is
   * the store's failure, told as one (503 naming `listByUser`), not a `TypeError` of the code
   * reading it (`records is not iterable`).
   */
  async function listed(userId: string): Promise<readonly ApiTokenRecord[]> {
    const records: unknown = await storeCall(() => store.listByUser(userId))
    if (!Array.isArray(records)) throw wrongAnswer('listByUser', records, 'an array of records')
    return records as readonly ApiTokenRecord[]
  }

  /** The `StoreUnavailableError` (503, reported) for a store method's answer that is not `expected`. */
  function wrongAnswer(method: string, answer: unknown, expected: string): StoreUnavailableError {
    return new StoreUnavailableError('token', { cause: new TypeError(`mcp-dispatch: the token store's ${method} answered ${kindOf(answer)}, not ${expected}`) })
  }

  /** The `StoreUnavailableError` (503, reported) for a record whose field is `wrong`. */
  function wrongShape(record: ApiTokenRecord, wrong: string): StoreUnavailableError {
    // The id as stored: quoted where it holds anything that could forge a log line.
    return new StoreUnavailableError('token', { cause: new TypeError(`mcp-dispatch: the token store answered a record for token ${named(String(record.id))} whose ${wrong}`) })
  }

  // Tokens whose stored allowlist holds an entry that cannot be read, already reported.
  const unreadableAllowlists = new LRUCache<string, true>({ max: 1_000 })

  /**
   * The allowlist a record stores, compiled. An entry no address can be read from (a row written
   * past `validateAllowlist`: by hand, an import, a seed of the platform's) matches no address,
   * and is reported once per token (`token allowlist`, naming the token): the token's requests
   * from elsewhere get 403 `ip_not_allowed`, as they would with the entry mistyped, and neither a
   * 503 that says to come back in a second, for ever, nor an allowlist wider than the one stored.
   */
  function storedAllowlist(record: ApiTokenRecord): CompiledAllowlist {
    try {
      return compileAllowlist(record.allowedIps)
    } catch (error) {
      if (!Array.isArray(record.allowedIps)) throw error
      if (!unreadableAllowlists.has(record.id)) {
        unreadableAllowlists.set(record.id, true)
        onError(
          new Error(`mcp-dispatch: the allowlist stored for token ${record.id} holds an entry that is no address or CIDR range (${error instanceof Error ? error.message : String(error)}); that entry matches no address: correct it with an edit of the token`),
          'token allowlist',
        )
      }
      const ranges: IpRange[] = []
      for (const entry of record.allowedIps) {
        const range = typeof entry === 'string' ? parseCidr(entry) : 'address'
        if (typeof range !== 'string') ranges.push(range)
      }
      return ranges
    }
  }

  // The count-and-insert of each user's creation that runs or waits last on this instance.
  const creations = new Map<string, Promise<unknown>>()

  /**
   * `run` once the count-and-insert of the creations of `userId` started before it on this
   * instance have settled. Each of those is bounded (three store calls, each under
   * `storeTimeoutMs`, and a fourth to revoke its token when the second count fails or finds too
   * many), and the wait is too: past `storeTimeoutMs` the creation fails as its own store call
   * would (`StoreUnavailableError`), so creations queued behind a store that stopped answering
   * each fail within about twice the bound (a wait, then its own calls), not one bound after
   * another.
   */
  function oneCreationAtATime<T>(userId: string, run: () => Promise<T>): Promise<T> {
    const before = creations.get(userId)
    const result = before
      ? withTimeout(before, storeTimeoutMs, 'token store (an earlier creation of the same user)').then(run, (error: unknown) => {
          throw new StoreUnavailableError('token', { cause: error })
        })
      : run()
    // Settled once both have: one that gave up waiting (past the bound) must not let the next
    // count while the one it waited for still counts and inserts. It holds nothing of theirs
    // (their results hold the clear secrets), however long the chain runs.
    const last = Promise.allSettled(before ? [before, result] : [result]).then(() => {})
    creations.set(userId, last)
    void last.then(() => {
      if (creations.get(userId) === last) creations.delete(userId)
    })
    return result
  }

  /**
   * The part of `create` that counts the user's active tokens, inserts the new one and counts
   * again (three store calls, each bounded, and a revocation of the new token when the second
   * count fails or finds too many): run by {@link oneCreationAtATime}, so two creations of one
   * user on this instance cannot both pass `maxActiveTokensPerUser` on the same count. Answers
   * the record stored and its secret; the view (which asks the App store) is built after.
   */
  async function insertCounted(
    data: z.infer<typeof createSchema>,
    servers: string[],
    createdAt: number,
    signal: AbortSignal | undefined,
  ): Promise<{ record: ApiTokenRecord; token: string }> {
    const tooMany = () => new ConflictError(`At most ${maxActiveTokens} active tokens per user: revoke one before creating another`)
    if ((await countActive(data.userId)) >= maxActiveTokens) throw tooMany()
    const secret = await newSecret()
    const record: ApiTokenRecord = {
      id: randomUUID(),
      userId: data.userId,
      name: data.name,
      ...secret.stored,
      servers,
      allowedIps: allowlistOf(data.allowedIps),
      expiresAt: createdAt + data.expiresInDays * DAY_MS,
      createdAt,
      lastUsedAt: null,
      revokedAt: null,
    }
    // Stored (or may have been) though its caller is refused: nobody holds its secret, so it is
    // revoked (by id: nothing happens if it was never stored). `what`: what the report of a
    // revocation that fails says of the token and its caller.
    const revokeRefused = (what: string) =>
      storeCall(() => store.revoke(record.id, now())).catch((error: unknown) => {
        throw new Error(`token ${record.id} ${what}, and could not be revoked: revoke it`, { cause: error })
      })
    const revokeUnheld = () => revokeRefused('may have been created though its caller got 503')
    // Its caller left before the insert: nothing is written (see `SecretCallOptions`).
    if (signal?.aborted) throw callerLeft(signal)
    const stored = await storeCall(() => store.insert(record), { landed: revokeUnheld, unknown: revokeUnheld })
    // A password reset of the owner that ran while this token was being made revokes it
    // (the store keeps the reset): the caller is told, rather than handed a dead secret.
    if (stored && stored.revokedAt !== null) throw new TokenInactiveError('revoked')
    // Counted again once stored: creations on other instances sharing the store may have passed
    // the first count at the same moment. Each counts after its own insert has committed, so of
    // any two the later to count sees the other's token, and at most `maxActiveTokens` stay
    // active: one past them is revoked (nobody holds its secret) and refused as the first count
    // would have refused it. Two that race at the bound may both be.
    let after: number
    try {
      after = await countActive(data.userId)
    } catch (error) {
      // Its caller gets 503 with the token stored: put right (and reported, if it cannot be) as
      // every other write whose caller got 503 is (docs/pipeline.md).
      await putRight(revokeUnheld, 'token store write whose caller was told 503')
      throw error
    }
    if (after > maxActiveTokens) {
      await putRight(() => revokeRefused('was created past maxActiveTokensPerUser (its caller was refused 409)'), 'token store')
      throw tooMany()
    }
    // Its caller left meanwhile: nobody holds its secret (see `SecretCallOptions`).
    if (signal?.aborted) {
      await putRight(() => revokeRefused('was created though its caller had left'), 'token store')
      throw callerLeft(signal)
    }
    return { record, token: secret.token }
  }

  /** How many tokens of `userId` are active now, as the store counts them (one store call). */
  async function countActive(userId: string): Promise<number> {
    const at = now()
    if (typeof store.countActiveByUser !== 'function') {
      let active = 0
      const owned = await listed(userId)
      for (const token of owned) if (token.revokedAt === null && token.expiresAt > at) active++
      return active
    }
    let counted: unknown = await storeCall(() => store.countActiveByUser!(userId, at))
    // A driver's count as it comes (node-postgres' `count(*)` is a string, a `bigint` elsewhere).
    if (typeof counted === 'bigint' || (typeof counted === 'string' && /^\d{1,15}$/.test(counted))) counted = Number(counted)
    // Anything else (a row, `undefined`) would turn the cap off.
    if (!Number.isSafeInteger(counted) || (counted as number) < 0) {
      const said = typeof counted === 'object' ? (counted === null ? 'null' : 'an object') : typeof counted === 'string' ? 'a string' : String(counted)
      throw new StoreUnavailableError('token', { cause: new TypeError(`mcp-dispatch: the token store's countActiveByUser answered ${said}, not a count`) })
    }
    return counted as number
  }

  const service: TokenService = {
    prefix,

    async create(input, call) {
      // When the creation began: a password reset from then on (its millisecond included, as
      // the stores count it) revokes the token, however its awaits interleave with the reset's.
      const createdAt = now()
      const data = parseInput(createSchema, input)
      checkAllowlist(data.allowedIps, 'allowedIps')
      const known = new Map<string, AppRecord>()
      for (const appId of new Set(data.servers)) {
        const app = await askApp(appId)
        if (!app || !(await mayUse(data.userId, app.id))) {
          // Name the position in the input, which is what the caller sees (duplicates included).
          throw new InvalidInputError(`servers.${data.servers.indexOf(appId)}`, 'is not an App you own or subscribe to')
        }
        // The scope holds the App's own id, which requests are checked against: an App store that
        // finds `APP_1` for `app_1` (a column compared without case) must not make a scope of
        // an id no App has.
        known.set(app.id, app)
      }
      const servers = [...known.keys()]
      // One user's creations, from the count to the insert, one at a time on this instance: the
      // count each checks holds the tokens the ones before it made.
      const { record, token } = await oneCreationAtATime(data.userId, () => insertCounted(data, servers, createdAt, call?.signal))
      return secretView(record, token, known)
    },

    async list(userId) {
      checkUserId(userId)
      const records = await listed(userId)
      const sorted = [...records].sort((a, b) => b.createdAt - a.createdAt || (a.id < b.id ? -1 : 1))
      const lookUp = onceEachApp()
      return Promise.all(sorted.map((record) => view(record, false, lookUp)))
    },

    async get(userId, id) {
      return view(await ownedRecord(userId, id))
    },

    async update(userId, tokenId, input) {
      if (input && typeof input === 'object' && ('servers' in input || 'scopes' in input)) {
        throw new InvalidInputError('servers' in input ? 'servers' : 'scopes', 'cannot be changed after creation')
      }
      const data = parseInput(updateSchema, input)
      const record = await ownedRecord(userId, tokenId)
      const id = record.id
      const state = statusOf(record)
      if (state !== 'active') throw new TokenInactiveError(state)
      const patch: ApiTokenPatch = {}
      if (data.name !== undefined) patch.name = data.name
      if (data.allowedIps !== undefined) {
        checkAllowlist(data.allowedIps, 'allowedIps')
        patch.allowedIps = allowlistOf(data.allowedIps)
      }
      if (data.expiresAt !== undefined) {
        const at = typeof data.expiresAt === 'number' ? data.expiresAt : parseTimestamp(data.expiresAt)
        if (!Number.isFinite(at)) {
          throw new InvalidInputError('expiresAt', 'is not a valid ISO 8601 timestamp (e.g. 2026-01-31T12:00:00Z)')
        }
        if (at <= now()) throw new InvalidInputError('expiresAt', 'must be in the future')
        if (at > record.createdAt + MAX_TOKEN_LIFETIME_MS) {
          throw new InvalidInputError('expiresAt', 'must be at most 90 days after the token was created')
        }
        // A write of the expiry may land up to `storeTimeoutMs` after it is sent (a row held by
        // another write, a busy pool): within that of the old expiry, it could land once the
        // token has expired and bring it back (spec 3: it never returns to active) until it is
        // undone. Refused as an edit after the expiry would be (409), before anything is written.
        if (record.expiresAt <= now() + storeTimeoutMs) throw new TokenInactiveError('expiring')
        patch.expiresAt = at
      }
      /**
       * A new expiry must not land once the old one has passed: it would bring an expired
       * token back (spec 3: it never returns to active). What `fields` names is put back as it
       * was, if the expiry is still this edit's; another edit since keeps its own (the read
       * skips the write when one landed before it, and the write is a compare-and-swap on this
       * edit's expiry for one that lands between the two). Answers whether it was put back.
       */
      const undoIfExpired = async (fields: ApiTokenPatch): Promise<boolean> => {
        try {
          const current = await storeCall(() => store.get(id))
          if (current?.expiresAt !== patch.expiresAt) return false
          return (await storeCall(() => store.update(id, fields, patch.expiresAt))) !== undefined
        } catch (error) {
          throw new Error(`token ${id}: an edit of its expiry landed after the old expiry and could not be undone`, { cause: error })
        }
      }
      const expiryPassed = () => patch.expiresAt !== undefined && now() >= record.expiresAt
      const expiryEditsBefore = expiryEdits
      const sentAgain = () => {
        const since = lastExpiryEdit.get(id)
        return since !== undefined && since.seq > expiryEditsBefore && since.expiresAt === patch.expiresAt
      }
      const succeeded = () => {
        if (patch.expiresAt !== undefined) lastExpiryEdit.set(id, { seq: ++expiryEdits, expiresAt: patch.expiresAt })
      }
      // Its caller was told 503, so nobody expects this edit any more: only what would break
      // spec 3, the expiry, is put back (compare-and-swap: nothing happens if it never landed),
      // unless an edit that succeeded here since set the same expiry. `fields`: what is put
      // back (an edit answered in time whose undo failed puts back all of it).
      const reconcileEdit = async (tokenHash: string, fields: ApiTokenPatch = { expiresAt: record.expiresAt }) => {
        try {
          if (expiryPassed() && !sentAgain()) await undoIfExpired(fields)
        } finally {
          await invalidate(tokenHash)
        }
      }
      // An edit of the expiry is a compare-and-swap on the expiry it read: one answered 503 here
      // and sent again through another instance (200 there) then cannot land on that edit's
      // result later, and be put back as one that landed after the old expiry.
      const write = (expected: number | undefined) =>
        storeCall(() => store.update(id, patch, expected), {
          landed: (late) => late && reconcileEdit(late.tokenHash),
          unknown: () => Promise.all([reconcileEdit(record.tokenHash), invalidateReadAndCurrent(id, record.tokenHash)]),
        })
      let updated = await write(patch.expiresAt !== undefined ? record.expiresAt : undefined)
      if (!updated && patch.expiresAt !== undefined) {
        const current = await storeCall(() => store.get(id))
        if (current !== undefined && current.revokedAt === null) {
          // The expiry this edit sets is in place already (its own earlier try, answered 503,
          // landed since it was read): the rest of it is applied on that.
          if (current.expiresAt === patch.expiresAt) updated = await write(current.expiresAt)
          if (!updated) throw new ConflictError('The token was edited at the same time (its expiry changed): read it again, then edit it')
        }
      }
      if (!updated) throw new TokenInactiveError('revoked')
      if (updated.revokedAt !== null) {
        // Landed revoked: a password reset that found the token expired ran while this edit of
        // its expiry was on its way, and the new expiry, past the reset, makes it a token of the
        // old password (docs/stores.md). Revoked is an end state; nothing is left to undo.
        await invalidate(updated.tokenHash)
        throw new TokenInactiveError('revoked')
      }
      if (expiryPassed()) {
        // Answered in time, but the old expiry passed while the write was on its way: requests
        // in between may have been refused as expired, so the token stays so, and the caller
        // is told (409), as for an edit made after the expiry. The whole edit is put back, so
        // a 409 means nothing changed.
        const before: ApiTokenPatch = { expiresAt: record.expiresAt }
        if (patch.name !== undefined) before.name = record.name
        if (patch.allowedIps !== undefined) before.allowedIps = record.allowedIps
        let undone: boolean
        try {
          undone = await undoIfExpired(before)
        } catch (error) {
          // Nothing is known for sure: the caller is told the store failed, the platform hears
          // which token may have come back, and the undo is tried again while it fails, as
          // what puts right a write whose caller got 503 is (not over the same edit answered
          // 200 since, and the caches invalidated once it has run).
          void putRight(() => reconcileEdit(updated.tokenHash, before), 'token store', undefined, { error })
          await invalidate(updated.tokenHash)
          throw new StoreUnavailableError('token', { cause: error })
        }
        await invalidate(updated.tokenHash)
        if (undone) throw new TokenInactiveError('expired')
        // Another edit's expiry landed since: the token is as that edit left it.
        succeeded()
        return view((await storeCall(() => store.get(id))) ?? updated, true)
      }
      succeeded()
      await invalidate(updated.tokenHash)
      return view(updated, true)
    },

    async rotate(tokenId, caller, call) {
      // Each swaps at the id as stored, once the token is found (`namesToken`, `ownedRecord`).
      if (caller.kind === 'token') {
        const checking = service.authenticate(caller.token, caller.clientAddress)
        // Its lookup is bounded here: on this path no dispatcher deadline applies.
        const auth = checking instanceof Promise ? await storeCall(() => checking) : checking
        if (!auth.ok) throw new UnauthorizedError()
        // An unknown address fails a token's allowlist, as on the MCP path (spec 5.2).
        if (!checkIpAllowlist(caller.clientAddress, auth.allowlist)) {
          throw new ForbiddenError('Request from an address outside the token allowlist')
        }
        if (!namesToken(tokenId, auth.record.id)) throw new ForbiddenError('An API token can rotate only itself')
        const id = auth.record.id
        // Lost to another rotation: 409, and not 401 `invalid_token`, which tells a client to drop
        // a token. The winner may be this client's own earlier rotation, answered 503 when its
        // store call timed out and landed since, about to be undone (regression: its retry on
        // another instance was told `invalid_token`, and the secret worked again a moment later).
        return swapSecret(id, auth.record, {
          reread: async () => {
            const current = await storeCall(() => store.get(id))
            if (current === undefined) throw new UnauthorizedError()
            return current
          },
          // The presented secret is refused as any inactive token's.
          inactive: () => new UnauthorizedError(),
          lost: 'Token was rotated by another request meanwhile; try again in a few seconds (a 401 then means this secret was rotated away)',
        }, call?.signal)
      }
      // The owner's rotation replaces the secret it read, compare-and-swap, so the secret it
      // invalidates is the one it replaced: one the token rotated to meanwhile (by Bearer, on
      // another instance) is not left cached anywhere.
      const record = await ownedRecord(caller.userId, tokenId)
      return swapSecret(record.id, record, {
        reread: () => ownedRecord(caller.userId, record.id),
        inactive: (state) => new TokenInactiveError(state),
        lost: 'Token was rotated by another request meanwhile; rotate again to replace that secret',
      }, call?.signal)
    },

    async revoke(userId, tokenId) {
      const record = await ownedRecord(userId, tokenId)
      const id = record.id
      const at = now()
      // Expired is an end state (spec 3): answered as it is, and nothing is written. The store
      // leaves it too (`TokenStore.revoke`); checked here as well so that a custom store written
      // before that rule cannot move it to revoked.
      if (statusOf(record, at) === 'expired') return view(record)
      const revoked = await storeCall(() => store.revoke(id, at), {
        // A late answer that is no record (`true`, a row count) names no hash: the read one and the current one.
        landed: (late) => late && (typeof late === 'object' ? Promise.all([invalidate(late.tokenHash), invalidate(record.tokenHash)]) : invalidateReadAndCurrent(id, record.tokenHash)),
        unknown: () => invalidateReadAndCurrent(id, record.tokenHash),
      })
      if (!revoked) throw new NotFoundError('Token not found')
      if (typeof revoked !== 'object') {
        // `true`, a count: the row may be revoked, its record unknown. Invalidated as when the
        // store's answer is lost, and the platform hears the store is wrong.
        await invalidateReadAndCurrent(id, record.tokenHash)
        throw wrongAnswer('revoke', revoked, 'the revoked record, or undefined')
      }
      // The revoked record's hash, not the one read before: a rotation may have landed between.
      await Promise.all([invalidate(revoked.tokenHash, true), revoked.tokenHash !== record.tokenHash && invalidate(record.tokenHash, true)])
      return view(revoked, true)
    },

    async revokeAllForUser(userId) {
      // Checked as everywhere but for the length of a new token's user: a reset that named no
      // user (a wrong field read) must not answer as if it revoked theirs.
      checkUserId(userId)
      const at = now()
      // Only the tokens some instance may still hold as active are sent (a user's history may
      // hold many thousands, each a message on the bus): not one expired or revoked longer ago
      // than any instance caches a token (`cacheTtlMs`, at most 10 minutes), with a minute for
      // their clocks. One revoked within that time is sent again, whatever it was revoked by
      // (a reset before this one whose listing failed, a revocation whose message is still being
      // sent again).
      // (A lookup that read the row before the revocation caches it when it answers, up to
      // `storeTimeoutMs` later: that is allowed for too.)
      const since = at - MAX_TOKEN_CACHE_TTL_MS - Math.max(CLOCK_SLACK_MS, storeTimeoutMs)
      const mayBeCachedActive = (r: ApiTokenRecord) => r.expiresAt > since && (r.revokedAt === null || r.revokedAt >= since)
      // Which tokens it revoked is not known: every token of the user it may have ended is invalidated.
      const invalidateListed = async () => invalidateAll((await listed(userId)).filter(mayBeCachedActive))
      // An answer that is no array (a count, `true`: what an UPDATE's driver answers) names none.
      const invalidateAll = (records: readonly ApiTokenRecord[]): Promise<unknown> =>
        Array.isArray(records) ? Promise.all(records.map((r) => invalidate(r.tokenHash))) : invalidateListed()
      const answered: unknown = await storeCall(() => store.revokeAllForUser(userId, at), { landed: invalidateAll, unknown: invalidateListed })
      const revoked = Array.isArray(answered) ? (answered as readonly ApiTokenRecord[]) : []
      const first = Promise.all(revoked.map((r) => invalidate(r.tokenHash, true)))
      // Every token of the user, not only those the reset's own statement revoked: one whose
      // creation committed while that statement ran (READ COMMITTED: not in its snapshot) is
      // revoked by the recorded reset when read, but may already sit in another instance's
      // cache, where only an invalidation reaches it.
      const done = new Set(revoked.map((r) => r.tokenHash))
      // A listing that is no array names none, and is reported: the reset itself has landed.
      const invalidateOthers = async (records: readonly ApiTokenRecord[]) => {
        if (!Array.isArray(records)) throw wrongAnswer('listByUser', records, 'an array of records')
        await Promise.all(records.filter((r) => !done.has(r.tokenHash) && mayBeCachedActive(r)).map((r) => invalidate(r.tokenHash)))
      }
      // A listing that answers late still invalidates what it lists.
      const others = storeCall(() => store.listByUser(userId), { landed: invalidateOthers })
        .then(invalidateOthers)
        .catch((error: unknown) => onError(error, 'password reset: listing the tokens to invalidate'))
      await Promise.all([first, others])
      if (!Array.isArray(answered)) {
        // Every token the listing names was invalidated above; the platform hears the store is wrong.
        throw wrongAnswer('revokeAllForUser', answered, 'the array of the records it revoked')
      }
      return revoked.length
    },

    authenticate(token, clientAddress) {
      // Cheap checks first; the checksum only for tokens whose hash is not known to belong to
      // a stored token (such a token passed it when it was made), so a valid token costs one
      // hash and one lookup, and garbage never reaches the store.
      if (token.length !== API_TOKEN_LENGTH || !token.startsWith(prefix)) return MALFORMED
      const tokenHash = hash(token)
      const cached = fromCache(tokenHash)
      if (cached !== undefined) return judge(cached)
      if (isKnown(tokenHash)) return lookUnderEveryPepper(token, tokenHash, true)
      if (checkApiTokenFormat(token, prefix) !== null) return MALFORMED
      const refused = refusedHashes.get(tokenHash)
      if (refused !== undefined) return refused
      // A lookup older than `storeTimeoutMs` is not joined: its requests have been answered 503
      // by now, and a store that hangs on one query must not hold the token back once it answers.
      const sharing = charged.get(tokenHash)
      if (sharing !== undefined && monotonic() - sharing.since < storeTimeoutMs) return sharing.auth
      // Its hashes under the previous peppers, made once: the lookups and a refusal's aliases use them.
      const older = previousPeppers.length === 0 ? undefined : previousPeppers.map((previous) => hashApiToken(token, previous ?? undefined))
      if (older !== undefined) {
        // A token still stored under a previous pepper, cached or seen live here under the hash it
        // is stored with, is known as a token stored under `pepper` is: served from the cache, or
        // looked up without a charge to its client's budget, so made-up tokens from its address
        // do not hold it up.
        const cached = cachedUnderPreviousPepper(token, older)
        if (cached !== undefined) return judge(cached)
        if (older.some(isKnown)) return lookUnderEveryPepper(token, tokenHash, true, older)
      }
      if (pendingLookups >= maxPendingLookups && lookupsEndWithRequest) {
        const at = monotonic()
        for (const lookup of lookupsSince) {
          if (at - lookup.since <= storeTimeoutMs + WRITE_SLACK_MS) break
          lookupsSince.delete(lookup)
          pendingLookups--
        }
      }
      if (pendingLookups >= maxPendingLookups) {
        throw new StoreUnavailableError('token', {
          cause: new Error(`${pendingLookups} lookups of tokens not known to be stored are waiting on the store (maxPendingLookups)`),
        })
      }
      // A well-formed token not known to be stored: its lookups are charged to the client.
      const charge = unknownTokenBudget.charge(clientAddress)
      const asked = invalidationCount
      let result: MaybePromise<TokenAuthResult>
      try {
        result = lookUnderEveryPepper(token, tokenHash, false, older)
      } catch (error) {
        charge.refund()
        throw error
      }
      if (!(result instanceof Promise)) return settleCharge(result, charge, tokenHash, older, asked)
      pendingLookups++
      const done = () => {
        // One forgotten as lost (above) is counted down already.
        if (!lookupsEndWithRequest || lookupsSince.delete(shared)) pendingLookups--
        if (charged.get(tokenHash) === shared) charged.delete(tokenHash)
      }
      const auth: Promise<TokenAuthResult> = result.then(
        (auth) => {
          done()
          return settleCharge(auth, charge, tokenHash, older, asked)
        },
        (error: unknown) => {
          done()
          charge.refund()
          throw error
        },
      )
      const shared = { auth, since: monotonic() }
      charged.set(tokenHash, shared)
      if (lookupsEndWithRequest) lookupsSince.add(shared)
      // Shared by the requests with this token meanwhile: it must not end with the first one.
      if (waitUntil) waitUntil(auth.then(undefined, () => {}))
      return auth
    },

    async flush() {
      // Released once the write is handed to `waitUntil` (below), so the request the timer
      // belongs to lives on until the write ends.
      const release = releaseFlushTimer
      releaseFlushTimer = undefined
      try {
        if (flushTimer !== undefined) {
          clearTimeout(flushTimer)
          flushTimer = undefined
        }
        // A write in flight holds an older batch; wait for it, then write what came in meanwhile.
        while (flushing) {
          const current = flushing
          // `write` never rejects, and settles within `storeTimeoutMs`: a rejection (the runtime
          // ended the request that began it, and its write with it: Workers, without
          // `waitUntil`) or no answer well past that (a runtime that leaves it pending for
          // ever) is a write cut short. Its batch is written again.
          const left = writeLeftMs()
          const lost =
            left < 0 ||
            !(await withTimeout(current, Math.min(left + 1, MAX_TIMER_MS), 'last_used_at write').then(
              () => true,
              () => false,
            ))
          if (lost && flushing === current) {
            if (writing) keepPending(writing)
            flushing = undefined
            writing = undefined
          }
        }
        await writePending()
      } finally {
        release?.()
      }
    },

    async close() {
      unsubscribe()
      // Deaf to other instances from here on: requests still served while the platform drains
      // read the store, rather than a cache no revocation reaches any more.
      hearing = false
      cache?.clear()
      // The write deadlines do not keep a process alive; this one does, so a process that
      // closes and ends still gets its last write done or reported (bounded: an in-flight
      // flush, this one, then one for the uses recorded meanwhile; the second passes keep the
      // process on their own timers).
      const keepAlive = setTimeout(() => {}, Math.min(3 * storeTimeoutMs + 1_000, MAX_TIMER_MS))
      // Writes cut off that are to be put right once more are, when due (at most
      // `storeTimeoutMs` away: sooner, a statement may still be waiting on the server), while
      // the store is open; the process waits for them. Those pending now, then those that came
      // while they ran; any later (writes still failing as it closes) run on their own timers,
      // which keep the process until they have.
      closing = true
      const secondPasses = async () => {
        for (let round = 0; round < 2 && lateRuns.size > 0; round++) {
          for (const timer of lateRuns.values()) timer.ref?.()
          await Promise.all(lateRuns.keys())
        }
      }
      try {
        await Promise.all([service.flush(), secondPasses()])
        // Uses recorded meanwhile (while that last batch was written, or the second passes were
        // waited for: requests still served while the platform drains) are written too, rather
        // than dropped with their timer; so is a write their timer began meanwhile waited for
        // (regression: on a loaded host the timer fired as the last write ended, took them, and
        // close() resolved with their write in flight).
        if ((pendingLastUsed.size > 0 || flushing !== undefined) && !lastWriteFailed) await service.flush()
      } finally {
        clearTimeout(keepAlive)
      }
      // From here a write that fails is reported, not retried for ever.
      closed = true
      // Uses recorded while that one was writing keep their timer, as uses after `close` do: they
      // are written when it fires (or reported, if the store is closed by then), unless the
      // process has ended before (the timer keeps none alive). After a failed write none is kept
      // (above: reported, not retried).
      if (pendingLastUsed.size === 0 || lastWriteFailed) {
        if (flushTimer !== undefined) clearTimeout(flushTimer)
        flushTimer = undefined
        releaseFlushTimer?.()
        releaseFlushTimer = undefined
      }
      // Passes putting right a write that wait to be tried again get their last try now (what
      // fails it is reported as given up), beside those being tried.
      await Promise.all([...[...retriesDue.values()].map((retry) => retry.now()), ...retriesRunning])
      // Nor sent again: invalidations still waiting get one last try, and what fails it is reported.
      await sender.close()
    },
  }
  return service
}

/**
 * The report of a pass putting right a write that was tried again for a while and given up:
 * its last failure (which names the token), saying so.
 */
function givenUp(error: unknown, tries: number): Error {
  const message = error instanceof Error ? error.message : String(error)
  return new Error(`${message} (tried ${tries === 1 ? 'once' : `${tries} times`}, given up)`, { cause: error })
}

/** `previousPeppers`, checked: non-empty strings or `null`, each once, none `pepper`'s own scheme. */
function checkPreviousPeppers(value: unknown, pepper: string | undefined): readonly (string | null)[] {
  if (value === undefined) return []
  if (!Array.isArray(value)) {
    throw new ConfigurationError('previousPeppers', 'must be an array of peppers (non-empty strings, or null for none)')
  }
  if (value.length > MAX_PREVIOUS_PEPPERS) {
    throw new ConfigurationError('previousPeppers', `holds at most ${MAX_PREVIOUS_PEPPERS} entries (each costs a lookup per unknown token)`)
  }
  const seen = new Set<string | null>([pepper ?? null])
  value.forEach((entry: unknown, i) => {
    if (entry !== null && (typeof entry !== 'string' || entry === '')) {
      throw new ConfigurationError(`previousPeppers.${i}`, 'must be a non-empty string, or null for the scheme without a pepper')
    }
    if (seen.has(entry)) {
      throw new ConfigurationError(`previousPeppers.${i}`, entry === (pepper ?? null) ? 'is the scheme of "pepper" itself' : 'is listed twice')
    }
    seen.add(entry)
  })
  return Object.freeze([...(value as (string | null)[])])
}

/**
 * What a store call whose caller was told 503 does to put right what it may have changed
 * (`storeCall`): `landed` with the late answer, `unknown` when whether a write landed is not
 * known (none for a read). `unknown` must do no harm when nothing landed.
 */
interface Reconcile<T> {
  landed(value: T): unknown
  unknown?(): unknown
}

const MAX_PREVIOUS_PEPPERS = 4

/**
 * How long a hash the store did not hold, or holds revoked or expired, is answered 401 without
 * asking the store again.
 */
const REFUSED_HASH_TTL_MS = 10_000
/** Store lookups of tokens not known to be stored, per client address and minute, by default. */
const DEFAULT_UNKNOWN_TOKEN_LOOKUPS = 600

/**
 * How long past its `storeTimeoutMs` a `last_used_at` write is still waited for before it is
 * taken for cut short by the runtime (its timeout's timer fires late on a loaded event loop). One
 * taken for lost that still lands is harmless: `touch` never moves a date back.
 */
const WRITE_SLACK_MS = 1_000

/**
 * How many hashes of live stored tokens an instance remembers as known, at most (about 100 bytes
 * each; at least half of it, the most recently used).
 */
const MAX_KNOWN_HASHES = 50_000

const orUnknown = (found: TokenAuthResult | undefined): TokenAuthResult => found ?? UNKNOWN

/** Swaps a rotation tries while a read finds the secret it read back in place. */
const MAX_ROTATE_ATTEMPTS = 4

const MALFORMED: TokenAuthResult = Object.freeze({ ok: false, reason: 'malformed' })
const UNKNOWN: TokenAuthResult = Object.freeze({ ok: false, reason: 'unknown' })
const REVOKED: TokenAuthResult = Object.freeze({ ok: false, reason: 'revoked' })
const EXPIRED: TokenAuthResult = Object.freeze({ ok: false, reason: 'expired' })
