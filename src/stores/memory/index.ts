/**
 * In-memory stores: the defaults, for one process. Bounded where growth is driven by
 * callers (`lru-cache`), and driven by an injectable clock so expiry is testable without
 * sleeping. State that must be shared between instances belongs in the Redis and
 * PostgreSQL stores.
 * @module
 */
import { LRUCache } from 'lru-cache'
import { ignoreRejection } from '../../core/thenable.js'
import { applyDeploy } from '../../core/versions.js'
import { windowStillCounts } from '../../core/rate-limit.js'
import { ConfigurationError, NotFoundError, optionNames, refuseUnknownOptions } from '../../errors.js'
import {
  APP_SLUG,
  type ApiTokenPatch,
  type ApiTokenRecord,
  type AppRecord,
  type AppStore,
  type CacheStore,
  type InvalidationBus,
  type InvalidationMessage,
  type RateLimitStore,
  type SessionPin,
  type SessionStore,
  type SubscriptionStore,
  type TokenStore,
} from '../../core/stores.js'
import { clockOption, entriesOption, lruClock } from '../lru-clock.js'

/** A clock in epoch milliseconds. */
export type Clock = () => number

/** An App with its initial live versions, for {@link createMemoryAppStore}. */
export interface MemoryAppSeed extends AppRecord {
  /** Versions deployed in this order through the versions rule. */
  readonly versions?: readonly string[] | undefined
}

/** The in-memory App store, with `addApp` for platforms that seed it. */
export interface MemoryAppStore extends AppStore {
  /**
   * Adds an App, deploying its `versions` in order by the versions rule (a refused one throws
   * `DeployRefusedError`, and the App is not added); a duplicate id or slug is a `TypeError`, as
   * is an empty id, a name that is no string, or a slug that is no DNS label in lower case (the
   * App's host name starts with it: the dispatcher's default `resolveApp` would never find it).
   */
  addApp(app: MemoryAppSeed): void
}

/**
 * In-memory apps and live versions. Seeded versions go through the same deploy rule as
 * later deploys, so a seed cannot hold a state that a deploy could not reach.
 *
 * @example
 * ```ts
 * const apps = createMemoryAppStore([{ id: 'app_1', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
 * apps.deploy('app_1', '1.0.1') // ['1.0.1']
 * ```
 *
 * @throws {TypeError} when `seed` is not iterable, or a seeded App is refused by `addApp` (two
 * sharing an id or a slug, a slug that is no DNS label in lower case…); {@link DeployRefusedError}
 * when a seeded App's versions break the versions rule.
 */
export function createMemoryAppStore(seed: Iterable<MemoryAppSeed> = []): MemoryAppStore {
  const byId = new Map<string, AppRecord>()
  const bySlug = new Map<string, AppRecord>()
  const live = new Map<string, readonly string[]>()
  const EMPTY: readonly string[] = Object.freeze([])
  const store: MemoryAppStore = {
    addApp(app) {
      checkApp(app)
      if (byId.has(app.id)) throw new TypeError(`mcp-dispatch: duplicate App id ${JSON.stringify(app.id)}`)
      if (bySlug.has(app.slug)) throw new TypeError(`mcp-dispatch: duplicate App slug ${JSON.stringify(app.slug)}`)
      // Every version deployed before the App is added: a refused one adds nothing.
      const versions = (app.versions ?? []).reduce<readonly string[]>((set, version) => applyDeploy(set, version), EMPTY)
      const record: AppRecord = Object.freeze({ id: app.id, slug: app.slug, name: app.name })
      byId.set(app.id, record)
      bySlug.set(app.slug, record)
      live.set(app.id, Object.freeze(versions))
    },
    getApp: (id) => byId.get(id),
    getAppBySlug: (slug) => bySlug.get(slug),
    getLiveVersions: (id) => live.get(id) ?? EMPTY,
    deploy(appId, version) {
      const current = live.get(appId)
      if (!current) throw new NotFoundError(`Unknown App ${JSON.stringify(appId)}`)
      const next = Object.freeze(applyDeploy(current, version))
      live.set(appId, next)
      return next
    },
  }
  for (const app of seedOf<MemoryAppSeed>(seed, 'createMemoryAppStore', 'Apps')) store.addApp(app)
  return store
}

/** A seed's entries, or a `TypeError` naming the function (not `seed is not iterable`). */
function seedOf<T>(seed: unknown, fn: string, what: string): Iterable<T> {
  if (seed === null || typeof seed !== 'object' || typeof (seed as Iterable<T>)[Symbol.iterator] !== 'function') {
    throw new TypeError(`mcp-dispatch: ${fn} takes an iterable of ${what} (an array), got ${seed === null ? 'null' : typeof seed}`)
  }
  return seed as Iterable<T>
}

/**
 * An App the dispatcher can serve, or a `TypeError` naming what is wrong: a slug the default
 * `resolveApp` never reads from a `Host` (`Notes_App`, upper case) would leave the App
 * answering 404 with nothing told.
 */
function checkApp(app: MemoryAppSeed): void {
  if (app === null || typeof app !== 'object') throw new TypeError('mcp-dispatch: an App must be an object { id, slug, name, versions? }')
  if (typeof app.id !== 'string' || app.id === '') throw new TypeError('mcp-dispatch: an App id must be a non-empty string')
  if (typeof app.slug !== 'string' || !APP_SLUG.test(app.slug)) {
    throw new TypeError(`mcp-dispatch: App ${JSON.stringify(app.id)}: slug must be a DNS label in lower case (1 to 63 letters, digits and inner hyphens), as the App's host name starts with it`)
  }
  if (typeof app.name !== 'string') throw new TypeError(`mcp-dispatch: App ${JSON.stringify(app.id)}: name must be a string`)
  if (app.versions !== undefined && !Array.isArray(app.versions)) throw new TypeError(`mcp-dispatch: App ${JSON.stringify(app.id)}: versions must be an array of versions`)
}

/** The in-memory subscription store, with `setActive` for platforms that seed it. */
export interface MemorySubscriptionStore extends SubscriptionStore {
  /**
   * Sets whether the user's subscription to the App is active (402 when not). A `TypeError` for
   * an `active` that is no boolean (a JavaScript `'false'` is not taken for `true`), or an empty
   * user or App id.
   */
  setActive(userId: string, appId: string, active: boolean): void
}

/**
 * In-memory subscriptions: which user may use which App (402 for the others), answered
 * synchronously. `seed` sets them once, in order (a later entry for the same pair wins);
 * `setActive` changes them later. One process only: share subscriptions between instances
 * through a store of your own over your billing data.
 *
 * @example
 * ```ts
 * const subscriptions = createMemorySubscriptionStore([{ userId: 'user_alice', appId: 'app_weather', active: true }])
 * subscriptions.setActive('user_alice', 'app_notes', true)
 * ```
 *
 * @throws {TypeError} when `seed` is not iterable, or an entry of it is refused by `setActive`.
 */
export function createMemorySubscriptionStore(
  seed: Iterable<{ userId: string; appId: string; active: boolean }> = [],
): MemorySubscriptionStore {
  const active = new Map<string, Set<string>>()
  const store: MemorySubscriptionStore = {
    setActive(userId, appId, isActive) {
      if (typeof userId !== 'string' || userId === '' || typeof appId !== 'string' || appId === '') {
        throw new TypeError('mcp-dispatch: a subscription takes a userId and an appId, each a non-empty string')
      }
      // A JavaScript caller's `'false'` would otherwise be taken for an active subscription.
      if (typeof isActive !== 'boolean') throw new TypeError(`mcp-dispatch: the subscription of ${JSON.stringify(userId)} to ${JSON.stringify(appId)}: active must be a boolean`)
      let apps = active.get(userId)
      if (isActive) {
        if (!apps) active.set(userId, (apps = new Set()))
        apps.add(appId)
      } else apps?.delete(appId)
    },
    isActive: (userId, appId) => active.get(userId)?.has(appId) === true,
  }
  for (const s of seedOf<{ userId: string; appId: string; active: boolean }>(seed, 'createMemorySubscriptionStore', 'subscriptions')) {
    if (s === null || typeof s !== 'object') throw new TypeError('mcp-dispatch: a subscription must be an object { userId, appId, active }')
    store.setActive(s.userId, s.appId, s.active)
  }
  return store
}

/**
 * In-memory API-token store. Records are frozen copies; callers cannot mutate them. A
 * duplicate id or hash (`insert`, or `rotate` onto a hash another token holds, revoked or not)
 * throws `TypeError`, as the PostgreSQL store does, and changes nothing.
 */
export function createMemoryTokenStore(): TokenStore {
  const byId = new Map<string, ApiTokenRecord>()
  const idByHash = new Map<string, string>()
  const idsByUser = new Map<string, Set<string>>()
  // Each user's last password reset: a token created before it or in its millisecond, and not
  // yet expired at it, is inserted revoked.
  const resets = new Map<string, number>()
  // Created before the user's last password reset or in its millisecond (the reset ran while
  // it was being made), unless it had expired by then: expired is an end state (spec 3). Judged
  // on the expiry the record has: an edit of the expiry that lands after a reset that found the
  // token expired (late, after the old expiry) makes it a token of the old password expiring
  // after the reset, revoked as PostgreSQL reads it, not active.
  const revokedByReset = (record: ApiTokenRecord) => {
    const reset = resets.get(record.userId)
    return reset !== undefined && record.revokedAt === null && reset >= record.createdAt && reset < record.expiresAt ? reset : undefined
  }
  const put = (record: ApiTokenRecord) => {
    const frozen = Object.freeze({
      ...record,
      servers: Object.freeze([...record.servers]),
      allowedIps: record.allowedIps && Object.freeze([...record.allowedIps]),
    })
    byId.set(record.id, frozen)
    return frozen
  }
  return {
    insert(record) {
      if (byId.has(record.id)) throw new TypeError(`duplicate token id ${record.id}`)
      if (idByHash.has(record.tokenHash)) throw new TypeError('duplicate token hash')
      const reset = revokedByReset(record)
      const stored = put(reset !== undefined ? { ...record, revokedAt: reset } : record)
      idByHash.set(record.tokenHash, record.id)
      let ids = idsByUser.get(record.userId)
      if (!ids) idsByUser.set(record.userId, (ids = new Set()))
      ids.add(record.id)
      return stored
    },
    findByHash(hash) {
      const id = idByHash.get(hash)
      return id === undefined ? undefined : byId.get(id)
    },
    get: (id) => byId.get(id),
    listByUser(userId) {
      const ids = idsByUser.get(userId)
      return ids ? [...ids].map((id) => byId.get(id)!) : []
    },
    countActiveByUser(userId, at) {
      let active = 0
      for (const id of idsByUser.get(userId) ?? []) {
        const token = byId.get(id)!
        if (token.revokedAt === null && token.expiresAt > at) active++
      }
      return active
    },
    update(id, patch: ApiTokenPatch, expectedExpiresAt?: number) {
      const current = byId.get(id)
      if (!current || current.revokedAt !== null) return undefined
      if (expectedExpiresAt !== undefined && current.expiresAt !== expectedExpiresAt) return undefined
      const next: ApiTokenRecord = {
        ...current,
        ...(patch.name !== undefined && { name: patch.name }),
        ...(patch.expiresAt !== undefined && { expiresAt: patch.expiresAt }),
        ...(patch.allowedIps !== undefined && { allowedIps: patch.allowedIps && Object.freeze([...patch.allowedIps]) }),
      }
      const reset = revokedByReset(next)
      return put(reset !== undefined ? { ...next, revokedAt: reset } : next)
    },
    rotate(id, next, expectedHash) {
      const current = byId.get(id)
      if (!current || current.revokedAt !== null) return undefined
      if (expectedHash !== undefined && current.tokenHash !== expectedHash) return undefined
      // A hash another token holds (revoked ones too) is refused, as PostgreSQL's unique index
      // refuses it: re-pointing it would hand that token's secret this token's record.
      const holder = idByHash.get(next.tokenHash)
      if (holder !== undefined && holder !== id) throw new TypeError('duplicate token hash')
      idByHash.delete(current.tokenHash)
      idByHash.set(next.tokenHash, id)
      return put({ ...current, tokenHash: next.tokenHash, displayPrefix: next.displayPrefix })
    },
    revoke(id, at) {
      const current = byId.get(id)
      if (!current) return undefined
      // Revoked stays as first revoked; expired at `at` stays expired (spec 3: both are end
      // states). Either way the record is answered as it is.
      if (current.revokedAt !== null || at >= current.expiresAt) return current
      return put({ ...current, revokedAt: at })
    },
    revokeAllForUser(userId, at) {
      resets.set(userId, Math.max(resets.get(userId) ?? at, at))
      const out: ApiTokenRecord[] = []
      for (const id of idsByUser.get(userId) ?? []) {
        const current = byId.get(id)!
        // Only active tokens: one expired at `at` stays expired, and is not counted.
        if (current.revokedAt === null && at < current.expiresAt) out.push(put({ ...current, revokedAt: at }))
      }
      return out
    },
    touch(lastUsed) {
      for (const [id, at] of lastUsed) {
        const current = byId.get(id)
        if (current && (current.lastUsedAt === null || current.lastUsedAt < at)) put({ ...current, lastUsedAt: at })
      }
    },
  }
}

/** Options of the in-memory TTL stores. */
export interface MemoryTtlStoreOptions {
  /** Most entries kept (an integer from 1 to 2^24); the least recently used go first. Default 100,000. */
  max?: number | undefined
  /**
   * Clock in epoch milliseconds. Default: lru-cache's monotonic clock for the session and cache
   * stores' entries; `Date.now` for the rate-limit store's windows. Given to the rate-limit
   * store, it also times its counters' life, which the monotonic clock times by default.
   */
  now?: Clock | undefined
}

/** Options of {@link createMemorySessionStore}. */
export interface MemorySessionStoreOptions extends MemoryTtlStoreOptions {
  /**
   * Most pins one user (`subject`) holds; a new session past it ends that user's expired pins,
   * then its least recently used one, never another user's. Without it, one caller opening `max` sessions would push every
   * other user's pin out of the store (their next request: 404 `session_not_found`, and a
   * new session at the newest version). Default 1,000.
   */
  maxPerSubject?: number | undefined
}

/**
 * One user's pin ids, least recently used first, knowing which id is last, so that a request
 * of the session its user used last (a client's every request but the first) reorders nothing:
 * a delete and an add per request cost more than the rest of the lookup (the set's table is
 * rebuilt every few deletes). The order is the same as with a delete and an add every time.
 */
class PinIds extends Set<string> {
  /** The last id of the order, or `undefined` when not known. */
  last: string | undefined = undefined
  override add(id: string): this {
    // An id already held keeps its place.
    if (!this.has(id)) this.last = id
    return super.add(id)
  }
  override delete(id: string): boolean {
    if (id === this.last) this.last = undefined
    return super.delete(id)
  }
  /** Makes `id` the most recently used. */
  touch(id: string): void {
    if (id === this.last) return
    super.delete(id)
    super.add(id)
    this.last = id
  }
}

const TTL_STORE_OPTIONS = optionNames<MemoryTtlStoreOptions>({ max: true, now: true })
const SESSION_STORE_OPTIONS = optionNames<MemorySessionStoreOptions>({ max: true, now: true, maxPerSubject: true })

/** Refuses options that are no object, or name an option the store does not have. */
function memoryOptions(options: object, known: readonly string[], where: string): void {
  if (options === null || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  refuseUnknownOptions(options, known, where)
}

/**
 * In-memory session pins with an idle TTL (`lru-cache`), at most `max` in all (the least
 * recently used go first) and `maxPerSubject` per user (that user's expired, then least
 * recently used, go first).
 *
 * @throws {ConfigurationError} when `max` or `maxPerSubject` is not an integer from 1 to 2^24, or `now`
 * is not a function.
 */
export function createMemorySessionStore(options: MemorySessionStoreOptions = {}): SessionStore {
  memoryOptions(options, SESSION_STORE_OPTIONS, 'createMemorySessionStore')
  const maxPerSubject = entriesOption(options.maxPerSubject, 1_000, 'maxPerSubject')
  const max = entriesOption(options.max, 100_000, 'max')
  // Each user's pins, least recently used first; kept in step with the cache by its dispose
  // hook (a pin deleted, evicted, or found expired).
  const bySubject = new Map<string, PinIds>()
  const cache = new LRUCache<string, SessionPin>({
    max,
    ttl: 1,
    ttlAutopurge: false,
    ...lruClock(clockOption(options.now)),
    dispose: (pin, id) => {
      const own = bySubject.get(pin.subject)
      own?.delete(id)
      if (own?.size === 0) bySubject.delete(pin.subject)
    },
  })
  return {
    synchronous: true,
    get(id, ttlMs) {
      const pin = cache.get(id)
      if (pin !== undefined) {
        cache.set(id, pin, { ttl: ttlMs })
        // Most recently used last, among its user's pins.
        bySubject.get(pin.subject)?.touch(id)
      }
      return pin
    },
    set(id, pin, ttlMs) {
      // Only a new session: a live pin under the same id keeps its version and owner.
      if (cache.has(id)) return false
      let own = bySubject.get(pin.subject)
      if (own !== undefined && own.size >= maxPerSubject) {
        // Its expired pins go first (they stay in the cache until something touches them)…
        for (const old of [...own]) {
          if (cache.has(old)) continue
          own.delete(old)
          cache.delete(old)
        }
        if (own.size === 0) bySubject.delete(pin.subject)
        own = bySubject.get(pin.subject)
      }
      // …then its least recently used.
      while (own !== undefined && own.size >= maxPerSubject) {
        const oldest = own.values().next().value!
        own.delete(oldest)
        cache.delete(oldest)
        own = bySubject.get(pin.subject)
      }
      // Read again after the write: it may replace an expired pin under this id, whose
      // dispose hook then runs.
      cache.set(id, pin, { ttl: ttlMs })
      own = bySubject.get(pin.subject)
      if (!own) bySubject.set(pin.subject, (own = new PinIds()))
      own.add(id)
      return true
    },
    delete(id) {
      cache.delete(id)
    },
  }
}

/**
 * In-memory fixed-window counters, bounded by `max` keys. A plain `Map` (one lookup per
 * request): once it holds `max` keys, counters of windows that have ended are swept, then
 * the least recently used keys go first. From half of `max` on, a counter that is used moves to
 * the end of the map's order, so a busy caller's counter is the last to go (dropping it would
 * reset its count); below that, nothing is reordered and a request costs one lookup.
 *
 * A counter lives one window from its first request, as the Redis store judges it for requests
 * of older windows (its TTL adds a minute for requests of the counter's own window that reach
 * it late over the network; here they count however late they come), timed on
 * the monotonic clock (`performance.now()`), so a wall clock stepped back or forward does not
 * change how long it lives; with `now` given, on that clock instead (a test's), where a step
 * back by less than a window keeps counting against it and a longer one starts it again.
 *
 * @throws {ConfigurationError} with a `max` that is not an integer from 1 to 2^24, or a `now` that is
 * not a function.
 */
export function createMemoryRateLimitStore(options: MemoryTtlStoreOptions = {}): RateLimitStore {
  memoryOptions(options, TTL_STORE_OPTIONS, 'createMemoryRateLimitStore')
  const max = entriesOption(options.max, 100_000, 'max')
  const given = clockOption(options.now)
  const now = given ?? Date.now
  // How long a counter has lived: never moved by a wall clock's steps, unless a clock is given.
  const lifeClock = given ?? (() => performance.now())
  const reorderFrom = Math.floor(max / 2)
  // Room is made for a batch of new counters at once, so the sweep over every counter is paid
  // once per `batch` new callers, not by each of them (at 100,000 counters a sweep takes
  // milliseconds of event loop).
  const batch = Math.max(1, Math.ceil(max / 100))
  const counters = new Map<string, { windowStart: number; end: number; count: number; started: number }>()
  function makeRoom(): void {
    // Ended windows by the store's clock: a request's own window start says nothing about
    // the counters of other window types (a day window starts at midnight).
    const at = now()
    for (const [key, entry] of counters) if (entry.end <= at) counters.delete(key)
    for (const key of counters.keys()) {
      if (counters.size <= max - batch) break
      counters.delete(key)
    }
  }
  return {
    increment(key, windowStart, windowMs) {
      const entry = counters.get(key)
      if (entry && counters.size >= reorderFrom) {
        counters.delete(key)
        counters.set(key, entry)
      }
      if (entry && entry.windowStart >= windowStart) {
        if (entry.windowStart === windowStart) return ++entry.count
        // A request stamped with an older window (an instance whose clock is behind, sharing
        // this store, or this clock stepped back across a window's start) counts against the
        // counter's window, which is named in the answer, for one window of this store's time
        // since the counter started (as the Redis store, by its PTTL). A clock that has since
        // stepped back by less than a window still counts against it (a step of a second across
        // a window's start once gave a fresh limit, and another when the clock caught up); by
        // more, the counter starts again rather than refusing for the size of the step.
        if (windowStillCounts(lifeClock() - entry.started, windowMs)) return { count: ++entry.count, windowStart: entry.windowStart }
      }
      if (entry) entry.windowStart = windowStart
      else if (counters.size >= max) makeRoom()
      if (entry) {
        entry.end = windowStart + windowMs
        entry.count = 1
        entry.started = lifeClock()
      } else counters.set(key, { windowStart, end: windowStart + windowMs, count: 1, started: lifeClock() })
      return 1
    },
  }
}

/**
 * In-memory TTL cache (`lru-cache`), for the OAuth validator's results: at most `max` entries
 * (default 100,000), the least recently used dropped first; an entry lives the `ttlMs` its `set`
 * gives (0 or less: not stored), read against `now` when given (else lru-cache's monotonic
 * clock). One process only: the Redis cache store shares its entries between instances.
 *
 * @throws {ConfigurationError} with a `max` that is not an integer from 1 to 2^24, or a `now` that is
 * not a function.
 */
export function createMemoryCacheStore<T extends object>(options: MemoryTtlStoreOptions = {}): CacheStore<T> {
  memoryOptions(options, TTL_STORE_OPTIONS, 'createMemoryCacheStore')
  const cache = new LRUCache<string, T>({
    max: entriesOption(options.max, 100_000, 'max'),
    ttl: 1,
    ttlAutopurge: false,
    ...lruClock(clockOption(options.now)),
  })
  return {
    get: (key) => cache.get(key),
    set(key, value, ttlMs) {
      if (ttlMs > 0) cache.set(key, value, { ttl: ttlMs })
    },
    delete(key) {
      cache.delete(key)
    },
  }
}

/** In-process invalidation bus: delivers synchronously to the listeners of this process. */
export function createMemoryInvalidationBus(): InvalidationBus {
  const listeners = new Set<(message: InvalidationMessage) => void>()
  return {
    publish(message) {
      // An `async` listener's rejection is not left unhandled (which ends a Node process); a
      // throw reaches the publisher, as before.
      for (const listener of listeners) ignoreRejection(listener(message))
    },
    subscribe(listener) {
      listeners.add(listener)
      return () => listeners.delete(listener)
    },
  }
}
