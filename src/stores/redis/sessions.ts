/**
 * Session pins in Redis, so every instance behind a load balancer serves a session the
 * version it was opened with (DESIGN.md "Versions").
 * @module
 */
import { randomBytes } from 'node:crypto'
import type { SessionPin, SessionStore } from '../../core/stores.js'
import { type RedisStoreOptions, connectRedis, luaScript, px } from './client.js'

function toPin(reply: unknown): SessionPin | undefined {
  if (reply === null || reply === undefined) return undefined
  const pin = JSON.parse(String(reply)) as Partial<SessionPin> | null
  if (typeof pin?.appId !== 'string' || typeof pin.version !== 'string' || typeof pin.subject !== 'string') {
    // Something else writes under this prefix: say so rather than serve a guess.
    throw new Error('Redis session store: the value stored for this session is not a session pin')
  }
  return { appId: pin.appId, version: pin.version, subject: pin.subject }
}

function done(): void {}

/**
 * A new pin (`SET … PX … NX`), and 1 too when the key already holds this very write (the same
 * value, write id included): the script of a call that reached Redis and whose answer was lost
 * with its connection is sent again by ioredis (`autoResendUnfulfilledCommands`), and must not
 * find its own pin "taken". Any other write under the id, the same pin included, is 0.
 */
const PIN = luaScript(
  'session pin',
  `if redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2], 'NX') then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0`,
)

/**
 * `Mcp-Session-Id` → pin in Redis, with an idle TTL kept by Redis: `get` is one `GETEX … PX`
 * round trip that reads the pin and restarts its TTL atomically (Redis 6.2 or later), `set`
 * one script that runs `SET … PX … NX` (a new session only: a live pin under the same id is
 * kept; the script's own write, as ioredis finds it when it sends the script again after a lost
 * connection, is `true`), `delete` one `DEL`. Key: `<prefix>session:<id>`, the pin as JSON
 * (`{ appId, version, subject, w }`, `w` the id of the write). Every call rejects after
 * `timeoutMs`, so a Redis that is down gives 503 (the dispatcher's policy for sessions), never a hung request; once one call
 * of any store on the client passed its deadline unanswered (a hung Redis), calls reject at
 * once, unsent, until Redis answers again (the stall breaker of `timeoutMs`). A TTL that
 * cannot be sent as `PX` (`Infinity`, `NaN`, above 2^53 - 1) rejects the call with a
 * `RangeError` (the dispatcher's `sessionTtlMs` is checked when it is created).
 *
 * Expiry follows the Redis server's clock, not the dispatcher's `now`.
 *
 * @example
 * ```ts
 * import { Redis } from 'ioredis'
 * import { createRedisSessionStore } from 'mcp-dispatch/redis'
 *
 * const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1, socketTimeout: 5_000 })
 * const dispatcher = createDispatcher({ apps, subscriptions, tokens, authorizationServers, sessions: createRedisSessionStore({ client: redis }) })
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} without a Redis `client` (one with `call(command, ...args)`), or
 * with an empty `prefix` or a `timeoutMs` that is not a positive number of milliseconds.
 */
export function createRedisSessionStore(options: RedisStoreOptions): SessionStore {
  const redis = connectRedis(options, { name: 'createRedisSessionStore' })
  const keyPrefix = `${redis.prefix}session:`
  return {
    // Async, so a TTL `px` refuses (Infinity) rejects the call like any other failure.
    async get(sessionId, ttlMs) {
      return redis.send('GETEX', keyPrefix + sessionId, 'PX', px(ttlMs)).then(toPin)
    },
    async set(sessionId, pin, ttlMs) {
      // `w`, this write's own id: a resent write finds itself, and nothing else does.
      const value = JSON.stringify({ appId: pin.appId, version: pin.version, subject: pin.subject, w: randomBytes(9).toString('base64url') })
      // NX: only a new session; a live pin under the same id is kept (answer 0: false). Read as
      // a number: a client may give integers as strings (ioredis' `stringNumbers`).
      return redis.run(PIN, keyPrefix + sessionId, value, px(ttlMs)).then((reply) => {
        const stored = Number(reply)
        if (stored !== 0 && stored !== 1) throw new Error(`Redis session store: the pin script answered ${String(reply)}, not 0 or 1`)
        return stored === 1
      })
    },
    delete(sessionId) {
      return redis.send('DEL', keyPrefix + sessionId).then(done)
    },
  }
}
