/**
 * What the Redis stores need of a client, typed structurally so this module loads without
 * any Redis package installed: an `ioredis` instance fits as it is, and any other client fits
 * behind a few lines of adapter. Also the options every Redis store shares, and the one place
 * commands are sent (each under a deadline, scripts by SHA with a fallback to the source,
 * none while the client's Redis is stalled but an invalidation's `PUBLISH`: see
 * {@link connectRedis}).
 * @module
 */
import { createHash } from 'node:crypto'
import { ConfigurationError } from '../../errors.js'
import { timerOption, withTimeout } from '../../timeout.js'

/** An argument of a Redis command. */
export type RedisArgument = string | number

/**
 * Sends one Redis command and answers with its reply, as `ioredis`' `call` does: bulk
 * strings as strings, integers as numbers, nil as `null`, arrays as arrays, errors as a
 * rejection. For node-redis: `{ call: (...args) => client.sendCommand(args.map(String)) }`.
 *
 * The stores keep one stall breaker per client object (see {@link connectRedis}): give every
 * store the same object (not a new adapter each) so that they share it. An error reply is
 * told from a client's own failure by its class name: `ReplyError` (ioredis), `ErrorReply`
 * and its subclasses (node-redis).
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
  /**
   * The connection's state, where the client tells it (`ioredis`): one in its handshake
   * (`connect`) is subscribed once it is `ready`.
   */
  readonly status?: string
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
   * policy: the rate limit fails open, sessions answer 503, the OAuth cache misses). A call
   * that passes it unanswered, with nothing else answered on that client since it was sent,
   * also marks the client's Redis stalled: until Redis answers anything again, the calls of
   * every store on that client reject at once, unsent, but for one probe per `timeoutMs` (see
   * {@link connectRedis}). Default 1,000.
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
  /** One command, under the deadline; rejected unsent while the client's Redis is stalled. */
  send(command: string, ...args: RedisArgument[]): Promise<unknown>
  /**
   * One command, under the deadline, sent even while the client's Redis is stalled: for a
   * command that must reach Redis however late, because its landing late harms nothing and its
   * not landing does (an invalidation `PUBLISH`: refused, a revoked token would stay in the
   * other instances' caches for their whole TTL; late, it only ends them late). Its caller is
   * still told at the deadline. It counts for the breaker as any other call (its deadline
   * passing with nothing answered since it was sent opens it, an answer to it closes it), but
   * it is never the probe and leaves the probe's schedule alone.
   */
  sendAnyway(command: string, ...args: RedisArgument[]): Promise<unknown>
  /**
   * One script on one key (`EVALSHA`, then `EVAL` on `NOSCRIPT`), under one deadline;
   * rejected unsent while the client's Redis is stalled.
   */
  run(script: LuaScript, key: string, ...args: RedisArgument[]): Promise<unknown>
}

/**
 * What the commands sent through one client have shown of its Redis, shared by every store
 * on that client.
 */
interface StallBreaker {
  /** A command passed its deadline with nothing answered since it was sent, and nothing has answered since. */
  stalled: boolean
  /** While stalled: when (`performance.now()`) the next probe may go. */
  probeAt: number
  /** While stalled: the deadline the call that opened it passed, in ms (for messages). */
  missedMs: number
  /**
   * Answers seen, counted: a call notes it when its command is sent, and tells by it at its
   * deadline whether any answer arrived meanwhile (then Redis is slow, not hung).
   */
  answers: number
}

/**
 * How late past its deadline a call's timer may fire and still count as noticed on time (the
 * event loop was free): later, this process was busy, and an answer may be waiting unread.
 */
const NOTICED_LATE_MS = 20

/** The breaker of each client object (so several stores on one client share it). */
const breakers = new WeakMap<object, StallBreaker>()

function breakerOf(client: RedisCommandClient): StallBreaker {
  let breaker = breakers.get(client)
  if (!breaker) breakers.set(client, (breaker = { stalled: false, probeAt: 0, missedMs: 0, answers: 0 }))
  return breaker
}

/** Class names of Redis error replies: ioredis' `ReplyError`, node-redis' `ErrorReply` and its subclasses. */
const ERROR_REPLIES = new Set(['ReplyError', 'ErrorReply', 'SimpleError', 'BlobError', 'MultiErrorReply'])

/**
 * Whether a rejection is Redis's own answer (an error reply such as `NOSCRIPT` or `LOADING`),
 * not the client giving up on a connection (closed, retries exhausted, offline queue off).
 */
function isErrorReply(error: unknown): boolean {
  if (typeof error !== 'object' || error === null) return false
  return ERROR_REPLIES.has((error as Error).name) || ERROR_REPLIES.has((error as object).constructor?.name)
}

/**
 * Checks the shared options (throwing `ConfigurationError`) and returns the command paths.
 *
 * Every call runs under `timeoutMs`. A Redis that hangs (the connection stays up, nothing is
 * answered: a stopped or overloaded server, a network that holds packets) would otherwise make
 * every call wait the whole deadline and stay queued on the socket, to run all at once when
 * Redis answers again (or when ioredis re-sends them on a new connection): counters of a whole
 * hang landing together would lock callers out for the rest of their window. So the client
 * gets a stall breaker, shared by every store on that client object (a `WeakMap` entry):
 *
 * - A call that passes its deadline unanswered opens it, if no answer to any command of that
 *   client (a reply or an error reply) has arrived since the call's command was sent. An
 *   answer meanwhile shows a Redis that is slow, not hung: a store's tight deadline then fails
 *   only its own call, and never refuses the calls of stores with longer deadlines on the same
 *   client. (When nothing at all answered within a whole deadline, a slow Redis looks hung:
 *   the breaker opens until the first late answer closes it.) When this process noticed the
 *   deadline late (its event loop was held, more than 20 ms past it), answers may be waiting
 *   unread: it is judged once what was waiting has been read (a stall of this process is no
 *   stall of Redis).
 * - While open, calls reject at once and are not sent: the dispatcher applies its failure
 *   policy at once (the rate limit fails open, sessions 503, the OAuth cache misses), and no
 *   count waits on the socket to land later.
 * - One call at a time is the probe, the first `timeoutMs` after the breaker opened or the
 *   last probe gave up: it sends `PING` and, once that is answered, its own command, both
 *   under its deadline. A probe of a Redis still hung costs one queued `PING` and that call's
 *   wait, never a store command (a `PING` answered after the deadline sends nothing more).
 * - Any answer from Redis closes it: a reply or an error reply to any command of that client
 *   (a late answer to a call that timed out too, or the probe's `PING`). A client's own
 *   failure (a connection closed, retries exhausted) is no answer.
 * - A command sent by {@link RedisConnection.sendAnyway} (the invalidation bus's `PUBLISH`)
 *   is never refused: it is sent while open too, to land when Redis answers, and its caller
 *   is told at its deadline. It is no probe; its answer closes the breaker as any answer does.
 *
 * A client whose Redis answers within `timeoutMs`, or keeps answering something within it,
 * never sees it. On a Redis Cluster client the breaker is the cluster's, as the client object
 * is: it cannot tell a hung shard from the others. While the healthy shards answer, a call to
 * the hung one that passes its deadline opens nothing, so calls to that shard keep being sent,
 * each waiting its whole deadline and left queued to run when the shard answers; when the
 * breaker does open (nothing else answered within that deadline), the calls to the healthy
 * shards are refused too, until an answer from any shard closes it, which leaves the hung
 * shard unprotected again. Give such a deployment a deadline it can afford per call.
 *
 * @example
 * ```ts
 * const redis = connectRedis({ client, prefix: 'app:', timeoutMs: 500 })
 * const pin = await redis.send('GET', `${redis.prefix}session:abc`)
 * ```
 */
export function connectRedis(options: RedisStoreOptions): RedisConnection {
  if (!options || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  const { client } = options
  if (!client || typeof client.call !== 'function') {
    throw new ConfigurationError('client', 'must be a Redis client with a call(command, ...args) method, such as an ioredis instance')
  }
  const prefix = options.prefix ?? DEFAULT_REDIS_PREFIX
  if (typeof prefix !== 'string' || prefix === '') throw new ConfigurationError('prefix', 'must be a non-empty string')
  const timeoutMs = timerOption('timeoutMs', options.timeoutMs ?? DEFAULT_REDIS_TIMEOUT_MS)

  const breaker = breakerOf(client)
  const answered = () => {
    breaker.answers++
    breaker.stalled = false
  }
  const call = (command: string, args: RedisArgument[]): Promise<unknown> => {
    let reply: Promise<unknown>
    try {
      reply = Promise.resolve(client.call(command, ...args))
    } catch (error) {
      return Promise.reject(error)
    }
    reply.then(answered, (error: unknown) => isErrorReply(error) && answered())
    return reply
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
  const open = () => {
    breaker.stalled = true
    breaker.probeAt = performance.now() + timeoutMs
    breaker.missedMs = timeoutMs
  }
  /**
   * `attempt` under the deadline, through the breaker (see above); `anyway`: sent even while
   * it is open, and never as the probe.
   */
  const guarded = (what: string, attempt: () => Promise<unknown>, anyway = false): Promise<unknown> => {
    let settled = false
    let expired = false
    let probe = false
    // The answers counted when the command was sent: any more by the deadline, and Redis is
    // answering, if slowly (or another store's deadline is the tighter one): no stall.
    let seen = breaker.answers
    let pending: Promise<unknown>
    if (!breaker.stalled || anyway) pending = attempt()
    else if (performance.now() < breaker.probeAt) {
      return Promise.reject(
        new Error(`${what} not sent: Redis is stalled (a command got no answer within ${breaker.missedMs} ms, and nothing has answered since)`),
      )
    } else {
      // One probe at a time; the next no sooner than timeoutMs after this one gave up.
      probe = true
      breaker.probeAt = Number.POSITIVE_INFINITY
      pending = call('PING', []).then(() => {
        // Answered after this call gave up: its command would only run late, for no one.
        if (expired) throw new Error(`${what} not sent: Redis answered the probe after the deadline`)
        // Counted from the command, not the PING: the PING's answer says nothing of it.
        seen = breaker.answers
        return attempt()
      })
    }
    const sentAt = performance.now()
    const settle = () => void (settled = true)
    pending.then(settle, settle)
    return withTimeout(pending, timeoutMs, what).catch((error: unknown) => {
      if (!settled) {
        expired = true
        // A deadline noticed late means this process was busy (its event loop held): the
        // answer may be waiting, unread, on the socket. Judged once what was waiting has been
        // read then (setImmediate runs after that), so a stall of this process is no stall of
        // Redis; on time, at once.
        if (performance.now() - sentAt - timeoutMs < NOTICED_LATE_MS) {
          if (!breaker.stalled && breaker.answers === seen) open()
        } else {
          setImmediate(() => {
            if (!settled && !breaker.stalled && breaker.answers === seen) open()
          })
        }
      }
      if (probe && breaker.stalled) breaker.probeAt = performance.now() + timeoutMs
      throw error
    })
  }
  return {
    prefix,
    timeoutMs,
    send: (command, ...args) => guarded(`Redis ${command}`, () => call(command, args)),
    sendAnyway: (command, ...args) => guarded(`Redis ${command}`, () => call(command, args), true),
    run: (script, key, ...args) => guarded(`Redis script ${script.name}`, () => evaluate(script, [1, key, ...args])),
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
