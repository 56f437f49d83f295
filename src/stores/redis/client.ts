/**
 * What the Redis stores need of a client, typed structurally so this module loads without
 * any Redis package installed: an `ioredis` instance fits as it is, and any other client fits
 * behind a few lines of adapter. Also the options every Redis store shares, and the one place
 * commands are sent (each under a deadline, scripts by SHA with a fallback to the source).
 * @module
 */
import { createHash } from 'node:crypto'
import { ConfigurationError } from '../../errors.js'
import { withTimeout } from '../../timeout.js'

/** An argument of a Redis command. */
export type RedisArgument = string | number

/**
 * Sends one Redis command and answers with its reply, as `ioredis`' `call` does: bulk
 * strings as strings, integers as numbers, nil as `null`, arrays as arrays, errors as a
 * rejection. For node-redis: `{ call: (...args) => client.sendCommand(args.map(String)) }`.
 */
export interface RedisCommandClient {
  call(command: string, ...args: RedisArgument[]): Promise<unknown>
  /**
   * The connection's state, where the client tells it (`ioredis`: `ready`, `reconnecting`,
   * …). A store whose calls must not wait in an offline queue (the rate-limit counters) fails
   * at once once the connection was ready and no longer is (see {@link lostSinceReady}).
   */
  readonly status?: string
}

/**
 * Whether `client` says commands sent now would wait in its offline queue (`ioredis`'
 * `status` other than `ready` or `wait`: connecting, reconnecting, loading after a restart,
 * closed), to run all at once when it is back. A client that tells no status is taken as ready.
 */
export function notReady(client: RedisCommandClient): boolean {
  const status = client.status
  return typeof status === 'string' && status !== 'ready' && status !== 'wait'
}

/**
 * A check for one store: `true` when `client` was seen `ready` and is not now (reconnecting,
 * connecting again, a restarted Redis loading, closed), when commands would wait in its
 * offline queue to run all at once later. Before the connection was first seen ready (the
 * start, `lazyConnect`'s `wait`) they wait, as they are sent within moments.
 */
export function lostSinceReady(client: RedisCommandClient): () => boolean {
  let seenReady = client.status === 'ready'
  // Told by the client itself where it can (ioredis emits `ready`), so an outage before the
  // store's first call is covered too.
  const events = client as { on?: (event: 'ready', listener: () => void) => unknown }
  if (!seenReady && typeof events.on === 'function') events.on('ready', () => void (seenReady = true))
  return () => {
    if (client.status === 'ready') {
      seenReady = true
      return false
    }
    return seenReady && notReady(client)
  }
}

/**
 * A connection in subscriber mode (RESP2 pub/sub), as `ioredis` gives it: `subscribe`,
 * `unsubscribe`, `message` events with `(channel, message)`, `ready` after every (re)connect,
 * `error` events, and `disconnect` to close it.
 */
export interface RedisSubscriberClient {
  subscribe(channel: string): Promise<unknown>
  unsubscribe(channel: string): Promise<unknown>
  on(event: 'message', listener: (channel: string, message: string) => void): unknown
  /** `ready`: connected (again); `close` / `end`: the connection is lost / given up. */
  on(event: 'ready' | 'close' | 'end', listener: () => void): unknown
  on(event: 'error', listener: (error: Error) => void): unknown
  removeListener(event: 'message' | 'ready' | 'close' | 'end' | 'error', listener: (...args: any[]) => void): unknown
  disconnect(): void
}

/** A command client that can open a second connection like itself (`ioredis`' `duplicate`). */
export interface RedisClient extends RedisCommandClient {
  duplicate(): RedisSubscriberClient
}

/** Options every Redis store takes. */
export interface RedisStoreOptions {
  /**
   * The client the store sends its commands through: an `ioredis` instance (`new Redis(url)`),
   * or anything with the same `call` (see {@link RedisCommandClient}). The store never closes
   * it: the application owns it.
   */
  client: RedisCommandClient
  /**
   * Prepended to every key and channel, so several deployments (or environments) can share
   * one Redis. Default `mcp-dispatch:`.
   */
  prefix?: string
  /**
   * Longest wait for one store call, in milliseconds; past it the call rejects, so a Redis
   * that is down or hung never holds a request (the dispatcher then applies its failure
   * policy: the rate limit fails open, sessions answer 503). Default 1,000.
   */
  timeoutMs?: number
}

/** Default key prefix of the Redis stores. */
export const DEFAULT_REDIS_PREFIX = 'mcp-dispatch:'
/** Default per-call deadline of the Redis stores, in milliseconds. */
export const DEFAULT_REDIS_TIMEOUT_MS = 1_000

/** A Lua script, sent by SHA1 (`EVALSHA`) and by source when the server does not know it yet. */
export interface LuaScript {
  readonly name: string
  readonly source: string
  readonly sha: string
}

/** A script for {@link RedisConnection.run}; its SHA1 is computed once here. */
export function luaScript(name: string, source: string): LuaScript {
  return { name, source, sha: createHash('sha1').update(source).digest('hex') }
}

/** Validated options and the command paths of one store. */
export interface RedisConnection {
  readonly prefix: string
  readonly timeoutMs: number
  /** One command, under the deadline. */
  send(command: string, ...args: RedisArgument[]): Promise<unknown>
  /** One script on one key (`EVALSHA`, then `EVAL` on `NOSCRIPT`), under one deadline. */
  run(script: LuaScript, key: string, ...args: RedisArgument[]): Promise<unknown>
}

/** Largest delay `setTimeout` takes. */
const MAX_TIMEOUT_MS = 2_147_483_647

/** Checks the shared options (throwing `ConfigurationError`) and returns the command paths. */
export function connectRedis(options: RedisStoreOptions): RedisConnection {
  if (!options || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  const { client } = options
  if (!client || typeof client.call !== 'function') {
    throw new ConfigurationError('client', 'must be a Redis client with a call(command, ...args) method, such as an ioredis instance')
  }
  const prefix = options.prefix ?? DEFAULT_REDIS_PREFIX
  if (typeof prefix !== 'string' || prefix === '') throw new ConfigurationError('prefix', 'must be a non-empty string')
  const timeoutMs = options.timeoutMs ?? DEFAULT_REDIS_TIMEOUT_MS
  if (typeof timeoutMs !== 'number' || !(timeoutMs > 0 && timeoutMs <= MAX_TIMEOUT_MS)) {
    throw new ConfigurationError('timeoutMs', `must be a positive number of milliseconds, at most ${MAX_TIMEOUT_MS}`)
  }

  const call = (command: string, args: RedisArgument[]): Promise<unknown> => {
    try {
      return Promise.resolve(client.call(command, ...args))
    } catch (error) {
      return Promise.reject(error)
    }
  }
  const evaluate = async (script: LuaScript, args: RedisArgument[]): Promise<unknown> => {
    try {
      return await call('EVALSHA', [script.sha, ...args])
    } catch (error) {
      // A server that restarted, or a replica promoted since, has an empty script cache.
      if (!String((error as Error | undefined)?.message).startsWith('NOSCRIPT')) throw error
      return call('EVAL', [script.source, ...args])
    }
  }
  return {
    prefix,
    timeoutMs,
    send: (command, ...args) => withTimeout(call(command, args), timeoutMs, `Redis ${command}`),
    run: (script, key, ...args) => withTimeout(evaluate(script, [1, key, ...args]), timeoutMs, `Redis script ${script.name}`),
  }
}

/**
 * A TTL for `PX`: whole milliseconds, at least 1 (Redis refuses 0 and fractions, so a fraction
 * is rounded up and 0 or less becomes 1).
 *
 * @throws {RangeError} when `ttlMs` is not a finite number, or is above 2^53 - 1: Redis refuses
 * `PX Infinity` (and `1e+21`), so the command would fail on every call (a session store handed
 * `Infinity` would never write a pin). The stores turn it into a rejection of the call.
 */
export function px(ttlMs: number): number {
  if (typeof ttlMs !== 'number' || !Number.isFinite(ttlMs) || ttlMs > Number.MAX_SAFE_INTEGER) {
    throw new RangeError(
      `Redis stores take a TTL as a finite number of milliseconds, at most ${Number.MAX_SAFE_INTEGER} (PX), not ${String(ttlMs)}`,
    )
  }
  return Math.max(1, Math.ceil(ttlMs))
}
