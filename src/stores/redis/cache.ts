/**
 * The validation cache in Redis (OAuth results shared by every instance), with a small local
 * cache in front (DESIGN.md "Stores").
 * @module
 */
import { LRUCache } from 'lru-cache'
import type { CacheStore } from '../../core/stores.js'
import { ConfigurationError, optionNames } from '../../errors.js'
import { clockOption, entriesOption, lruClock } from '../lru-clock.js'
import { type RedisStoreOptions, connectRedis, luaScript, px } from './client.js'

/** The value and its remaining TTL in one round trip, so the local copy never outlives it. */
const READ = luaScript(
  'cache read',
  `local value = redis.call('GET', KEYS[1])
if not value then return false end
return { value, redis.call('PTTL', KEYS[1]) }`,
)

/** Options of {@link createRedisCacheStore}. */
export interface RedisCacheStoreOptions extends RedisStoreOptions {
  /**
   * How long this instance keeps a value it read or wrote, in whole milliseconds, never past
   * the value's own TTL: reads within it cost no round trip. A `delete` on another instance is
   * seen here only once it runs out. Default 5,000; `0` turns the local cache off.
   */
  localTtlMs?: number | undefined
  /** Most values kept locally; the least recently used go first. Default 10,000. */
  localMax?: number | undefined
  /** Clock of the local cache, epoch ms (tests). Default: lru-cache's monotonic clock. */
  now?: (() => number) | undefined
}

/** Default lifetime of a locally kept value of {@link createRedisCacheStore}. */
export const DEFAULT_LOCAL_CACHE_TTL_MS = 5_000
/** Default size of the local cache of {@link createRedisCacheStore}. */
export const DEFAULT_LOCAL_CACHE_MAX = 10_000

/** The options of its own, beside a Redis store's. */
const OWN_OPTIONS = optionNames<Omit<RedisCacheStoreOptions, keyof RedisStoreOptions>>({ localTtlMs: true, localMax: true, now: true })

/**
 * A TTL cache in Redis, for the OAuth validator's `cache` option (results keyed by hashes of
 * tokens, never tokens). Values are stored as JSON (`SET … PX`) under `<prefix>cache:<key>`,
 * so they must survive `JSON.stringify` (the validator's `CachedValidation` does); what is
 * read back is not checked against `T` (the validator checks it). A TTL of 0 or less stores
 * nothing; one that cannot be sent as `PX` (`Infinity`, above 2^53 - 1) rejects with a
 * `RangeError`.
 *
 * A small local cache (`lru-cache`, `localTtlMs`, `localMax`) sits in front: a value read or
 * written here is served from memory until the shorter of `localTtlMs` and its Redis TTL, so a
 * busy token costs one Redis read per `localTtlMs` per instance. The trade-off: `delete`
 * (the validator's `forget`) reaches the other instances' local copies only when those run out,
 * at most `localTtlMs` later. A miss costs one round trip (a script that reads the value and
 * its TTL), `set` and `delete` one each, every one under the `timeoutMs` deadline (and
 * rejected at once, unsent, while a hung Redis has the client's stall breaker open); the
 * validator treats a failing cache as a miss. A `set` that Redis fails still keeps its value
 * locally (and rejects): with Redis down, an instance asks the authorization server about a
 * busy token once per `localTtlMs`, not on every request.
 *
 * @example
 * ```ts
 * import { Redis } from 'ioredis'
 * import { createOAuthValidator, type CachedValidation } from 'mcp-dispatch'
 * import { createRedisCacheStore } from 'mcp-dispatch/redis'
 *
 * const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1, socketTimeout: 5_000 })
 * const oauth = createOAuthValidator({ issuer, cache: createRedisCacheStore<CachedValidation>({ client: redis }) })
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} without a Redis `client` (one with `call(command, ...args)`), or
 * with an empty `prefix` or a `timeoutMs` that is not a positive number of milliseconds; with a
 * `localTtlMs` below 0, a `localMax` that is not an integer from 1 to 2^24, or a `now` that is not a function.
 */
export function createRedisCacheStore<T extends object>(options: RedisCacheStoreOptions): CacheStore<T> {
  const redis = connectRedis(options, { name: 'createRedisCacheStore', options: OWN_OPTIONS })
  const localTtlMs = options.localTtlMs ?? DEFAULT_LOCAL_CACHE_TTL_MS
  // Whole milliseconds: lru-cache refuses a fractional TTL with an error of its own.
  if (!Number.isSafeInteger(localTtlMs) || localTtlMs < 0) {
    throw new ConfigurationError('localTtlMs', 'must be a whole number of milliseconds, 0 or more (0 turns the local cache off)')
  }
  const localMax = entriesOption(options.localMax, DEFAULT_LOCAL_CACHE_MAX, 'localMax')
  clockOption(options.now)

  const keyPrefix = `${redis.prefix}cache:`
  const local =
    localTtlMs > 0
      ? new LRUCache<string, T>({ max: localMax, ttl: localTtlMs, ttlAutopurge: false, ...lruClock(options.now) })
      : undefined
  // Per key, while calls on it are in flight: how many, and a count of its writes. A read or
  // write that started before another write of its key must not put its (older) value in the
  // local cache when it lands after it. Per key, so that writes of other keys (a refusal
  // stored for each made-up token) never keep a busy token's value out of it.
  const inFlight = new Map<string, { calls: number; writes: number }>()
  const begin = (key: string, write: boolean): number => {
    // No local cache, nothing to guard.
    if (local === undefined) return 0
    let entry = inFlight.get(key)
    if (entry === undefined) inFlight.set(key, (entry = { calls: 0, writes: 0 }))
    entry.calls++
    if (write) entry.writes++
    return entry.writes
  }
  const end = (key: string): void => {
    const entry = inFlight.get(key)!
    if (--entry.calls === 0) inFlight.delete(key)
  }
  const keepLocally = (key: string, value: T, redisTtlMs: number, startedAt: number) => {
    // PTTL -1: the key has no TTL (written by someone else); keep it for localTtlMs.
    const ttl = redisTtlMs === -1 ? localTtlMs : Math.min(localTtlMs, redisTtlMs)
    if (local && inFlight.get(key)?.writes === startedAt && ttl > 0) local.set(key, value, { ttl })
  }
  /** `pending`, with the key's call counted as in flight until it settles (with a local cache). */
  const tracked = <R>(key: string, pending: Promise<R>): Promise<R> => {
    if (local === undefined) return pending
    const done = () => end(key)
    pending.then(done, done)
    return pending
  }

  return {
    get(key) {
      const held = local?.get(key)
      if (held !== undefined) return held
      const startedAt = begin(key, false)
      return tracked(
        key,
        redis.run(READ, keyPrefix + key).then((reply) => {
          if (!Array.isArray(reply)) return undefined
          const value = JSON.parse(String(reply[0])) as T
          keepLocally(key, value, Number(reply[1]), startedAt)
          return value
        }),
      )
    },
    set(key, value, ttlMs) {
      if (!(ttlMs > 0)) return
      let ttl: number
      try {
        ttl = px(ttlMs)
      } catch (error) {
        // Infinity: refused as a rejection, as a failing Redis is (the validator reports it).
        return Promise.reject(error)
      }
      const json = JSON.stringify(value)
      const startedAt = begin(key, true)
      local?.delete(key)
      // The local copy is parsed from the JSON, as other instances see it, and is not the
      // caller's object (which the caller may still change).
      // Kept locally whether or not Redis took it: with Redis down (or stalled) an instance
      // still keeps what it just validated for `localTtlMs`, rather than asking the
      // authorization server again on every request; the failure still rejects (reported).
      const keep = () => {
        if (local) keepLocally(key, JSON.parse(json) as T, ttl, startedAt)
      }
      return tracked(
        key,
        redis.send('SET', keyPrefix + key, json, 'PX', ttl).then(keep, (error: unknown) => {
          keep()
          throw error
        }),
      )
    },
    delete(key) {
      begin(key, true)
      local?.delete(key)
      return tracked(key, redis.send('DEL', keyPrefix + key).then(() => {}))
    },
  }
}
