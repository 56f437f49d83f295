/**
 * `mcp-dispatch/redis`: the stores that several instances share through Redis (DESIGN.md
 * "Stores"): rate-limit counters, session pins, the OAuth validation cache and the
 * invalidation bus of the token caches. Each is a factory that takes your Redis client (an
 * `ioredis` instance, typed structurally, so this module imports no Redis package) and an
 * optional key prefix; each call is one round trip under a deadline (`timeoutMs`), so a Redis
 * that is down or hung never holds a request, and once one call passed it unanswered, the
 * calls of every store on that client fail at once until Redis answers again (a stall
 * breaker, with one probe at a time). See docs/stores.md, "Redis".
 *
 * @example
 * ```ts
 * import { Redis } from 'ioredis'
 * import { createRedisInvalidationBus, createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'
 *
 * const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1, socketTimeout: 5_000 })
 * const invalidations = createRedisInvalidationBus({ client: redis })
 * const tokens = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations })
 * const dispatcher = createDispatcher({
 *   apps, subscriptions, tokens, authorizationServers,
 *   sessions: createRedisSessionStore({ client: redis }),
 *   rateLimit: { store: createRedisRateLimitStore({ client: redis }), policy },
 * })
 * ```
 * @module
 */

export { DEFAULT_REDIS_PREFIX, DEFAULT_REDIS_TIMEOUT_MS } from './client.js'
export type {
  RedisArgument,
  RedisClient,
  RedisCommandClient,
  RedisStoreOptions,
  RedisSubscriberClient,
} from './client.js'
export { createRedisRateLimitStore } from './rate-limit.js'
export { createRedisSessionStore } from './sessions.js'
export { DEFAULT_LOCAL_CACHE_MAX, DEFAULT_LOCAL_CACHE_TTL_MS, createRedisCacheStore } from './cache.js'
export type { RedisCacheStoreOptions } from './cache.js'
export { DEFAULT_HEARTBEAT_MS, createRedisInvalidationBus } from './invalidation-bus.js'
export type { RedisInvalidationBus, RedisInvalidationBusOptions } from './invalidation-bus.js'
