/**
 * Fixed-window rate-limit counters in Redis: one key per counter, one script per request.
 * @module
 */
import type { RateLimitCount, RateLimitStore } from '../../core/stores.js'
import { hasLoneSurrogate } from '../../core/text.js'
import { type RedisStoreOptions, connectRedis, lostSinceReady, luaScript, px } from './client.js'

/**
 * How long a counter outlives its window (its TTL is the window and this, from the window's
 * first request), for the requests stamped in the window that reach Redis late. A request is
 * stamped with its window before its increment reaches Redis: a busy event loop (a command
 * that node-redis, or ioredis with auto-pipelining, writes on the next turn goes out only once
 * the process is free again, and its answer still counts), a slow network. With a TTL of one
 * window, one stamped at the window's tail that arrived after that found the counter gone,
 * started it again at 1 and was served past the limit, with the rest of the window.
 */
const GRACE_MS = 60_000

/**
 * One atomic step: the counter is a hash of the window it counts (`w`, epoch ms) and the
 * count (`c`), and the window it last replaced with that window's count (`nw`, `nc`), with a
 * TTL (ARGV[2]) of one window and {@link GRACE_MS} (ARGV[3]) of Redis's time from its last
 * change of window. A request stamped with either window adds to that window's count and
 * gets it, however late it comes: a late request of the window just replaced counts on there,
 * never from 1 again. One stamped with another, older window (its instance's clock is behind)
 * adds to the counter's count while the counter is younger than one window of Redis's time
 * (its `PTTL` is above the grace), never moving it back, and gets `{count, w}`, the window it
 * counted in; so a counter started by a clock that ran fast refuses the others for one window,
 * not for its grace. Any other request starts the counter again at 1 in its own window, and
 * sets the window it replaces aside.
 */
const INCREMENT = luaScript(
  'rate-limit increment',
  `local held = redis.call('HMGET', KEYS[1], 'w', 'nw')
local current = tonumber(held[1])
local aside = tonumber(held[2])
local requested = tonumber(ARGV[1])
if current and current == requested then return redis.call('HINCRBY', KEYS[1], 'c', 1) end
if aside and aside == requested then return redis.call('HINCRBY', KEYS[1], 'nc', 1) end
if current and current > requested and redis.call('PTTL', KEYS[1]) > tonumber(ARGV[3]) then
  return {redis.call('HINCRBY', KEYS[1], 'c', 1), held[1]}
end
if current then
  redis.call('HSET', KEYS[1], 'w', ARGV[1], 'c', 1, 'nw', held[1], 'nc', redis.call('HGET', KEYS[1], 'c'))
else
  redis.call('HSET', KEYS[1], 'w', ARGV[1], 'c', 1)
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1`,
)

function toCount(reply: unknown): number | RateLimitCount {
  if (Array.isArray(reply)) {
    const windowStart = Number(reply[1])
    const count = toCount(reply[0]) as number
    if (!Number.isSafeInteger(windowStart)) throw new Error(`Redis rate-limit script answered window ${String(reply[1])}`)
    return { count, windowStart }
  }
  const count = Number(reply)
  if (!Number.isSafeInteger(count) || count < 1) throw new Error(`Redis rate-limit script answered ${String(reply)}`)
  return count
}

/**
 * The key as written: Redis keys are bytes, and a key holding a lone surrogate (a subject a
 * custom access-token validator let through) has no UTF-8 (ioredis writes U+FFFD in its place,
 * so two such keys would be one counter). Such a key is written as its JSON after a NUL; so is
 * a key that begins with a NUL, so that no key is written as another's.
 */
function wireKey(key: string): string {
  return key.charCodeAt(0) === 0 || hasLoneSurrogate(key) ? `\0${JSON.stringify(key)}` : key
}

/**
 * Rate-limit counters in Redis, shared by every instance: `increment` is one `EVALSHA`
 * round trip (an `EVAL` once more after the server lost its script cache), atomic, under the
 * `timeoutMs` deadline. Key: `<prefix>rl:<key>`, a hash `{ w: windowStart, c: count }` (and
 * `nw`, `nc`: the window it replaced last, and its count) that expires one window and a
 * minute after the window's first request, so that a request stamped at a window's tail that
 * reaches Redis late still counts against its window. When Redis fails or times out the call
 * rejects, and the dispatcher serves (fail open, `rateLimit.failOpen`) and reports it. Once
 * the client was ready and is not (`ioredis`: `status` other than `ready`: reconnecting,
 * connecting again, a restarted Redis loading), the call rejects at once instead of joining
 * the client's offline queue: replayed when Redis is back, the counts of a whole outage would land
 * at once and lock callers out for the rest of the window. (On a Redis Cluster the status is
 * the cluster's: the queue of one shard that fails is not covered.) A Redis that hangs with the
 * connection up is met by the stall breaker every store on the client shares: after one call
 * passes `timeoutMs` unanswered, the calls fail at once and are not sent (but for one `PING`
 * probe at a time) until Redis answers again, so a hang costs one deadline and its counts do
 * not pile up on the socket. The increments sent before the stall showed can still land late,
 * and ioredis re-sends them after a connection reset unless the client is made with
 * `autoResendUnfulfilledCommands: false`, advisable for the client the counters use
 * (docs/stores.md, "Client setup").
 *
 * @example
 * ```ts
 * import { Redis } from 'ioredis'
 * import { createRedisRateLimitStore } from 'mcp-dispatch/redis'
 *
 * // Commands a reset connection leaves unanswered are dropped, not counted late.
 * const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1, socketTimeout: 5_000, autoResendUnfulfilledCommands: false })
 * const dispatcher = createDispatcher({
 *   apps, subscriptions, tokens, authorizationServers,
 *   rateLimit: { store: createRedisRateLimitStore({ client: redis }), policy: () => ({ limit: 60, windowType: 'minute' }) },
 * })
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} without a Redis `client` (one with `call(command, ...args)`), or
 * with an empty `prefix` or a `timeoutMs` that is not a positive number of milliseconds.
 */
export function createRedisRateLimitStore(options: RedisStoreOptions): RateLimitStore {
  const redis = connectRedis(options, { name: 'createRedisRateLimitStore' })
  const keyPrefix = `${redis.prefix}rl:`
  const client = options.client
  const lost = lostSinceReady(client)
  return {
    // Async: a window `px` refuses rejects the call, as a failing Redis does.
    async increment(key, windowStart, windowMs) {
      if (lost()) throw new Error(`Redis connection not ready (${client.status}): not counted`)
      if (typeof windowStart !== 'number' || !Number.isSafeInteger(windowStart)) {
        throw new RangeError(`Redis rate-limit counters take a window's start as whole epoch milliseconds, not ${String(windowStart)}`)
      }
      const ttl = Math.min(px(windowMs) + GRACE_MS, Number.MAX_SAFE_INTEGER)
      return redis.run(INCREMENT, keyPrefix + wireKey(key), windowStart, ttl, GRACE_MS).then(toCount)
    },
  }
}
