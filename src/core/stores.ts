/**
 * Store interfaces. The core depends on these only; implementations live in
 * `src/stores/<name>/` and are loaded through their own subpath. Methods may answer
 * synchronously or with a promise, so an in-memory store costs no extra microtask.
 *
 * Every implementation must pass the shared conformance suite in `test/stores/`.
 * @module
 */

/** A value or a promise of it. */
export type MaybePromise<T> = T | Promise<T>

/**
 * An App's slug as the dispatcher's default `resolveApp` reads it from the `Host`: a DNS label
 * in lower case (1 to 63 letters, digits and inner hyphens). @internal
 */
export const APP_SLUG = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/

/** An App record: only what the spec shows (2.3). */
export interface AppRecord {
  /** Stable App identifier (`scopes[].server_id`). */
  readonly id: string
  /**
   * Slug used in the App address (`scopes[].server_slug`), the first label of its host name: a
   * DNS label in lower case (the memory store refuses another).
   */
  readonly slug: string
  /** Display name (`scopes[].server_name`). */
  readonly name: string
}

/**
 * Apps and their live versions. `getLiveVersions` should return the same array instance
 * while the live set is unchanged, so the compiled index is reused (it is cached by
 * identity); return a new array after every deploy.
 */
export interface AppStore {
  /** The App of this id, or `undefined` (the token service checks the servers of a new token with it). */
  getApp(appId: string): MaybePromise<AppRecord | undefined>
  /** The App of this slug (the first label of its address), or `undefined`: 404 `not_found`. */
  getAppBySlug(slug: string): MaybePromise<AppRecord | undefined>
  /**
   * The App's live versions (releases and pre-releases, as `applyDeploy` leaves them), on every
   * request: the same array instance until the next deploy. An unknown App: `[]`.
   */
  getLiveVersions(appId: string): MaybePromise<readonly string[]>
  /**
   * Makes `version` live by the versions rule (`applyDeploy`), atomically, and returns the
   * new live set. Throws `DeployRefusedError` when the rule refuses it, `NotFoundError` for
   * an unknown App, and `applyDeploy`'s `RangeError` when the stored set holds an entry that is
   * no version as written and the deploy would keep it.
   */
  deploy(appId: string, version: string): MaybePromise<readonly string[]>
}

/** Subscriptions: whether a user has an active subscription to an App (spec 2.3). */
export interface SubscriptionStore {
  /** `true` when the user has an active subscription to the App; anything else is 402. */
  isActive(userId: string, appId: string): MaybePromise<boolean>
}

/** An API token as stored. Holds the hash of the secret, never the secret. */
export interface ApiTokenRecord {
  /** The token's id, kept through rotations (not secret). */
  readonly id: string
  /** The user who owns the token. */
  readonly userId: string
  /** The owner's label for it (the token service takes 1 to 100 characters, trimmed: docs/api-tokens.md). */
  readonly name: string
  /** SHA-256 (or HMAC-SHA-256) hex of the secret. */
  readonly tokenHash: string
  /** First 12 characters of the secret. */
  readonly displayPrefix: string
  /** App ids the token may reach; fixed at creation. */
  readonly servers: readonly string[]
  /** `null` when there is no allowlist. */
  readonly allowedIps: readonly string[] | null
  /** Epoch milliseconds. */
  readonly expiresAt: number
  /** Epoch milliseconds. */
  readonly createdAt: number
  /** Epoch milliseconds of the last use written (uses are coalesced); `null`: never used. */
  readonly lastUsedAt: number | null
  /** Epoch milliseconds; `null`: not revoked. */
  readonly revokedAt: number | null
}

/** The fields an edit may change (spec 2.1: name, expiration, IP allowlist). */
export interface ApiTokenPatch {
  /** A new name. Absent: unchanged. */
  name?: string
  /**
   * A new expiry, epoch milliseconds. Absent: unchanged. The token service checks a user's edit
   * (in the future, at most 90 days after creation); the store writes the value as given: an
   * edit that landed after the old expiry is undone by writing that past expiry back.
   */
  expiresAt?: number
  /** A new IP allowlist (addresses and CIDR ranges), or `null` to remove it. Absent: unchanged. */
  allowedIps?: readonly string[] | null
}

/** Persistence of API tokens. Every method that changes a record is atomic. */
export interface TokenStore {
  /**
   * Stores a new token. May answer the record as stored: revoked when a password reset of its
   * user (`revokeAllForUser`) after its `createdAt` and before its `expiresAt` is already
   * recorded.
   */
  insert(record: ApiTokenRecord): MaybePromise<ApiTokenRecord | void>
  /**
   * The token stored under this hash of its secret, revoked and expired ones included (their
   * refusal says why), or `undefined`. On the request path: one indexed read.
   */
  findByHash(tokenHash: string): MaybePromise<ApiTokenRecord | undefined>
  /** The token of this id, in any state, or `undefined`. */
  get(id: string): MaybePromise<ApiTokenRecord | undefined>
  /** Every token of the user, in any state (the dashboard lists revoked and expired ones too). */
  listByUser(userId: string): MaybePromise<readonly ApiTokenRecord[]>
  /**
   * How many of the user's tokens are active at `now` (epoch ms): not revoked, by the token's
   * own revocation or a password reset, and `expiresAt` after `now`. Optional: the token
   * service counts a user's active tokens at each creation (`maxActiveTokensPerUser`) with it
   * when it is there, else from `listByUser`, which reads every token the user ever had (a
   * user who creates and revokes in a loop makes that read grow by a row each time). A count as
   * a driver gives it is taken (a string of digits, as node-postgres gives `count(*)`, or a
   * `bigint`); any other answer that is not a whole number from 0 (a row, `undefined`) fails the
   * creation as the store's failure (503), never a cap turned off.
   */
  countActiveByUser?: ((userId: string, now: number) => MaybePromise<number>) | undefined
  /**
   * Applies `patch` unless the token is revoked; `undefined` when absent or revoked. When
   * `expectedExpiresAt` is given, applies it only if the token's current `expiresAt` equals it
   * (compare-and-swap, as `rotate` with `expectedHash`), and answers `undefined` otherwise.
   * The token service passes it with every edit of the expiry (the expiry it read: two edits at
   * once cannot both land, nor one that lands late on the other's) and when it undoes an edit
   * that landed late; a store that ignores it works, with those races open (the later write
   * wins, and an undo can overwrite an edit landing meanwhile).
   */
  update(id: string, patch: ApiTokenPatch, expectedExpiresAt?: number): MaybePromise<ApiTokenRecord | undefined>
  /**
   * Replaces the secret's hash and display prefix, only if the token is not revoked and,
   * when `expectedHash` is given, its current hash equals it (compare-and-swap, so two
   * concurrent rotations by the same secret cannot both succeed). A `next.tokenHash` that
   * another token holds (revoked or not) is refused with a `TypeError` and changes nothing, as
   * a duplicate hash on `insert` is: the hash must keep finding the token it belongs to.
   */
  rotate(
    id: string,
    next: { tokenHash: string; displayPrefix: string },
    expectedHash?: string,
  ): MaybePromise<ApiTokenRecord | undefined>
  /**
   * Marks one token revoked at `at` and answers it; `undefined` when absent. Revoked and expired
   * are end states (spec 3), so a token already revoked keeps its first revocation, and one
   * expired at `at` (`at >= expiresAt`, the token service's boundary) is left as it is: both
   * are answered unchanged.
   */
  revoke(id: string, at: number): MaybePromise<ApiTokenRecord | undefined>
  /**
   * Revokes every active token of `userId` (a password reset): not revoked, and not expired at
   * `at` (`expiresAt > at`); returns those it revoked, and only those. Expired tokens are left as
   * they are. It also records `at` as the user's reset, and from then on a token of `userId`
   * created at or before `at` (`createdAt <= at`) and expiring after it is revoked (at `at`)
   * whenever it is inserted, read, updated or rotated, even one inserted after this call: a
   * creation racing the reset cannot outlive it, even in the reset's millisecond, where which
   * came first cannot be told. A token created after that millisecond is a token of the new
   * password, and stays active; one that expired by the reset stays expired.
   */
  revokeAllForUser(userId: string, at: number): MaybePromise<readonly ApiTokenRecord[]>
  /** Records last-used times in one batch (coalesced by the token service). */
  touch(lastUsed: ReadonlyMap<string, number>): MaybePromise<void>
}

/** What an MCP session is pinned to (DESIGN.md "Versions"). */
export interface SessionPin {
  /** The App the session was opened at. */
  readonly appId: string
  /** The version it was resolved to, exact (`1.2.3`): every request of the session gets it. */
  readonly version: string
  /** The identity (user id) that opened the session. */
  readonly subject: string
}

/** `Mcp-Session-Id` → pin, with an idle TTL. */
export interface SessionStore {
  /**
   * `true` when every method answers synchronously (in-memory stores). Adapters that cannot
   * await before writing (Express, Fastify) then store the pin on the spot instead of holding
   * the response until a promise settles. A `set` of such a store that throws is reported, and
   * the answer that opened the session still goes out (an asynchronous store's failure replaces
   * it with a 503).
   */
  readonly synchronous?: boolean | undefined
  /** Returns the pin and restarts its idle TTL. */
  get(sessionId: string, ttlMs: number): MaybePromise<SessionPin | undefined>
  /**
   * Stores the pin of a new session, only if no pin is stored under `sessionId`: answers
   * `false`, changing nothing, when one is (a handler that assigned an id already in use, by
   * a bug or by an App behind the proxy choosing its own ids): the session already pinned
   * keeps its version and its owner (spec 9.2.1). `true` or nothing: stored. (`null` and `0`,
   * what Redis's `SET … NX` and `SETNX` answer for a key already there, are read as `false`.) A
   * store that cannot tell (an older implementation) may answer nothing, and overwrites.
   */
  set(sessionId: string, pin: SessionPin, ttlMs: number): MaybePromise<void | boolean>
  /** Ends the pin (the session's `DELETE`, or the App no longer knows it); none there: nothing. */
  delete(sessionId: string): MaybePromise<void>
}

/** Fixed-window counters. One atomic round trip per request. */
export interface RateLimitStore {
  /**
   * Adds one to the counter of `key` for the window that starts at `windowStart` and returns
   * the new count (a `bigint` or a decimal string, as a database's driver hands one back, is
   * read as its number; any other answer that is no whole number from 1 is a failure of the
   * store). The counter must last until its window ends, and a networked store should
   * keep it a while longer for the requests stamped in the window that reach it late (the
   * Redis store: a TTL of one window and a minute from the window's first request).
   *
   * Shared by instances whose clocks disagree, a store never moves a counter back to an older
   * window: a request stamped with an older window than the counter's (its instance's clock
   * is behind) counts against the counter's window, and the store then answers
   * `{ count, windowStart }` with the window it counted, so the caller's reset time is that
   * window's end. (Moving back would let two skewed instances reset each other's counter, and
   * the limit would hold for neither.) Requests of older windows count against a counter for
   * one window of the store's own time from its first request, so one started by a clock that
   * ran fast refuses the others for one window. A store that kept the count of the window a
   * counter replaced may count a request of that window there instead, and answer it as a
   * plain count (the Redis store does, for requests that reach it late).
   */
  increment(key: string, windowStart: number, windowMs: number): MaybePromise<number | RateLimitCount>
}

/** A count in another window than the one asked for: see {@link RateLimitStore.increment}. */
export interface RateLimitCount {
  /** Requests counted in the window, this one included. */
  readonly count: number
  /** Start of the window counted, epoch ms. */
  readonly windowStart: number
}

/** A TTL cache for validation results (OAuth) and the like. Keys are hashes, never secrets. */
export interface CacheStore<T> {
  /** The value under `key` while its TTL runs, else `undefined`. */
  get(key: string): MaybePromise<T | undefined>
  /** Stores `value` for `ttlMs`; a TTL of 0 or less stores nothing. */
  set(key: string, value: T, ttlMs: number): MaybePromise<void>
  /** Drops the value under `key`, if any. */
  delete(key: string): MaybePromise<void>
}

/**
 * An invalidation: a token's cached record must be dropped on every instance (`token`), or,
 * delivered by a bus to its own listeners only, every cached record (`all`: the bus lost its
 * connection and may have missed messages).
 */
export type InvalidationMessage =
  | {
      readonly kind: 'token'
      /** Hash of the secret that stopped working. */
      readonly tokenHash: string
    }
  | { readonly kind: 'all' }

/**
 * Broadcast of invalidations between instances: in-process by default
 * (`createMemoryInvalidationBus`), Redis pub/sub across instances (`createRedisInvalidationBus`
 * from `mcp-dispatch/redis`).
 */
export interface InvalidationBus {
  /** Delivers `message` to this bus's listeners at once, and to every other bus on the channel. */
  publish(message: InvalidationMessage): MaybePromise<void>
  /** Returns a function that unsubscribes. */
  subscribe(listener: (message: InvalidationMessage) => void): () => void
  /**
   * The longest a `publish` of this bus takes by its own deadline, in milliseconds (the Redis
   * bus: its `timeoutMs`, over the `PUBLISH` and the other buses' confirmations). The token
   * service then waits for a publish at least this plus a second before it takes it for failed
   * (reported, sent again), whatever its `storeTimeoutMs`. Absent: `storeTimeoutMs` bounds it.
   */
  readonly publishTimeoutMs?: number | undefined
  /**
   * `false` while messages published elsewhere cannot reach this bus (its connection is down
   * or not yet subscribed): the token service then neither reads nor fills its cache, so a
   * rotation or revocation it cannot hear of is seen in the store at once. Absent: always
   * listening (an in-process bus). A bus that has it delivers `{ kind: 'all' }` to its own
   * listeners on each change of it; on one to `true` the token service also sends at once the
   * invalidations it could not publish meanwhile.
   */
  readonly listening?: boolean | undefined
}
