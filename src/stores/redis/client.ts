/**
 * What the Redis stores need of a client, typed structurally so this module loads without
 * any Redis package installed: an `ioredis` instance fits as it is, and any other client fits
 * behind a few lines of adapter. Also the options every Redis store shares, and the one place
 * commands are sent (each under a deadline, scripts by SHA with a fallback to the source,
 * none while the client's Redis is stalled but an invalidation's `PUBLISH`: see docs/stores.md,
 * the Redis section's failure behaviour).
 * @module
 */
import { createHash } from 'node:crypto'
import { ConfigurationError, optionNames, refuseUnknownOptions } from '../../errors.js'
import { timerOption, withTimeout } from '../../timeout.js'

/** An argument of a Redis command. */
export type RedisArgument = string | number

/**
 * Sends one Redis command and answers with its reply, as `ioredis`' `call` does: bulk
 * strings as strings, integers as numbers, nil as `null`, arrays as arrays, errors as a
 * rejection. For node-redis, one object for every store, telling the connection's state as
 * {@link status} (without it, counts sent in the first `timeoutMs` of an outage wait in
 * node-redis's offline queue and land once Redis is back, locking callers out for the rest of
 * their window):
 *
 * ```ts
 * const redis = {
 *   call: (...args: RedisArgument[]) => client.sendCommand(args.map(String)),
 *   get status() { return client.isReady ? 'ready' : 'reconnecting' },
 * }
 * ```
 *
 * The stores keep one stall breaker per client object (docs/stores.md, Redis): give every
 * store the same object (not a new adapter each) so that they share it. An error reply is
 * told from a client's own failure by its class name: `ReplyError` (ioredis), `ErrorReply`
 * and its subclasses (node-redis).
 */
export interface RedisCommandClient {
  /** Sends `command` with `args`, answering its reply (see above); an error reply rejects. */
  call(command: string, ...args: RedisArgument[]): Promise<unknown>
  /**
   * The connection's state, where the client tells it (`ioredis`: `ready`, `reconnecting`,
   * …). A store whose calls must not wait in an offline queue (the rate-limit counters) fails
   * at once once the connection was ready and no longer is (docs/stores.md, Redis).
   */
  readonly status?: string | undefined
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
 * start, `lazyConnect`'s `wait`) they wait, as they are sent within moments. Seen ready: told
 * by the client's `ready` event where it has one (ioredis), else by a check made while its
 * `status` says so (the node-redis adapter, which emits none): a store that takes one
 * calls it on each of its calls, not only when it would refuse one.
 */
export function lostSinceReady(client: RedisCommandClient): () => boolean {
  const readiness = readinessOf(client)
  return () => {
    if (client.status === 'ready') {
      readiness.seen = true
      return false
    }
    return readiness.seen && notReady(client)
  }
}

/**
 * Calls `listener` each time `client` says it is `ready` (ioredis, after every reconnect), through
 * the client's one listener of the stores; never for a client that emits no `ready` (the
 * node-redis adapter). Answers the function that stops it.
 */
export function onReady(client: RedisCommandClient, listener: () => void): () => void {
  const { whenReady } = readinessOf(client)
  whenReady.add(listener)
  return () => void whenReady.delete(listener)
}

/** Whether each client object was seen `ready`: one entry, and one listener, per client. */
const readinessByClient = new WeakMap<object, { seen: boolean; readonly whenReady: Set<() => void> }>()

function readinessOf(client: RedisCommandClient): { seen: boolean; readonly whenReady: Set<() => void> } {
  let readiness = readinessByClient.get(client)
  if (readiness !== undefined) return readiness
  const created = { seen: client.status === 'ready', whenReady: new Set<() => void>() }
  readinessByClient.set(client, (readiness = created))
  // Told by the client itself where it can (ioredis emits `ready`), so an outage before the
  // store's first call is covered too: one listener for every store on the client (one each
  // piled up past Node's warning of eleven), kept for as long as the client lives. A single
  // Redis client ready again (after a reconnect, its handshake answered) has been answered:
  // its stall breaker closes then, not only at its next probe, up to two deadlines later (a
  // Sentinel client moved off a hung primary was refused for a second more). Not a
  // cluster's `ready`, which is the whole client's, not a master's, nor that of a client
  // made with ioredis' `enableReadyCheck: false`, whose `ready` waits only on its setup
  // commands, ignoring their failures (a `commandTimeout`), and with `disableClientInfo` on
  // RESP2 on nothing: it can come with nothing answered (a hung Redis that accepts
  // connections would then have each reconnect let one more deadline's worth of calls wait on it).
  const events = client as {
    on?: (event: 'ready', listener: () => void) => unknown
    isCluster?: unknown
    options?: { enableReadyCheck?: unknown }
  }
  if (typeof events.on === 'function') {
    const answeredWhenReady = events.isCluster !== true && events.options?.enableReadyCheck !== false
    events.on('ready', () => {
      created.seen = true
      if (answeredWhenReady) breakers.get(client)?.get('')?.answered()
      for (const listener of created.whenReady) listener()
    })
  }
  return readiness
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
  readonly status?: string | undefined
  /** Subscribes to `channel`; settles once Redis confirmed it. */
  subscribe(channel: string): Promise<unknown>
  /** Unsubscribes from `channel`. */
  unsubscribe(channel: string): Promise<unknown>
  /** `message`: a message published on a subscribed channel. */
  on(event: 'message', listener: (channel: string, message: string) => void): unknown
  /** `ready`: connected (again); `close` / `end`: the connection is lost / given up. */
  on(event: 'ready' | 'close' | 'end', listener: () => void): unknown
  /** `error`: a connection error (ioredis then reconnects by itself). */
  on(event: 'error', listener: (error: Error) => void): unknown
  /** Removes a listener added with `on`. */
  removeListener(event: 'message' | 'ready' | 'close' | 'end' | 'error', listener: (...args: any[]) => void): unknown
  /** Closes the connection (ioredis' `disconnect`). */
  disconnect(): void
}

/** A command client that can open a second connection like itself (`ioredis`' `duplicate`). */
export interface RedisClient extends RedisCommandClient {
  /** A new connection to the same Redis with the same options, for the invalidation bus to subscribe on. */
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
  prefix?: string | undefined
  /**
   * Longest wait for one store call, in milliseconds; past it the call rejects, so a Redis
   * that is down or hung never holds a request (the dispatcher then applies its failure
   * policy: the rate limit fails open, sessions answer 503, the OAuth cache misses). A call
   * that passes it unanswered, with nothing else answered on that client since it was sent,
   * also marks the client's Redis stalled: until Redis answers anything again, the calls of
   * every store on that client reject at once, unsent, but for one probe per `timeoutMs`
   * (docs/stores.md, Redis). Default 1,000.
   */
  timeoutMs?: number | undefined
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
   * One command, under the deadline, sent even while the client's Redis is stalled (but not
   * while the client, seen ready before, says its connection is down, nor, stalled before it
   * was ever ready, while it says it is connecting: refused then, unsent, rather than left in
   * its offline queue; its caller sends it again): for a
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
   * While stalled: when (`performance.now()`) the call that opened it was sent, with nothing
   * answered since. A store whose deadline is longer than that silence still sends its calls.
   */
  silentSince: number
  /**
   * Answers seen, counted: a call notes it when its command is sent, and tells by it at its
   * deadline whether any answer arrived meanwhile (then Redis is slow, not hung).
   */
  answers: number
  /** Notes an answer: counts it and closes the breaker (one function per breaker, not per call). */
  readonly answered: () => void
}


/**
 * How much longer than Redis's silence a store's deadline must be for its calls to be sent
 * while the breaker is open: a timer may fire a little before its delay by `performance.now()`,
 * and deadlines this close are one.
 */
const DEADLINE_SLACK_MS = 20

/**
 * The breakers of each client object (so several stores on one client share them): one for a
 * single Redis, one per master for a Redis Cluster client (keyed `host:port`; `''` for the
 * whole client: a single Redis, a command on no key, a cluster whose slots are not known yet).
 */
const breakers = new WeakMap<object, Map<string, StallBreaker>>()

function breakerOf(client: RedisCommandClient, node: string): StallBreaker {
  let byNode = breakers.get(client)
  if (!byNode) breakers.set(client, (byNode = new Map()))
  let breaker = byNode.get(node)
  if (!breaker) {
    const created: StallBreaker = {
      stalled: false,
      probeAt: 0,
      missedMs: 0,
      silentSince: 0,
      answers: 0,
      answered: () => {
        created.answers++
        created.stalled = false
      },
    }
    byNode.set(node, (breaker = created))
  }
  return breaker
}

/**
 * What the stores read of a Redis Cluster client to tell its masters apart: ioredis' `Cluster`
 * says `isCluster: true` and keeps `slots`, for each hash slot the `host:port` of the nodes
 * serving it, master first; `refreshSlotsCache()` reads them again from a node.
 */
interface ClusterSlotMap {
  readonly isCluster?: unknown
  readonly slots?: unknown
  readonly refreshSlotsCache?: unknown
  /** ioredis' options: `keyPrefix`, which the client puts before every key it sends. */
  readonly options?: { readonly keyPrefix?: unknown }
}

/**
 * The prefix a cluster client puts before every key it sends (ioredis' `keyPrefix`), which
 * decides the slot, and so the master, a command goes to; `''` without one.
 */
function clientKeyPrefix(cluster: ClusterSlotMap): string {
  const prefix = cluster.options?.keyPrefix
  if (typeof prefix === 'string') return prefix
  return prefix instanceof Uint8Array ? Buffer.from(prefix).toString('utf8') : ''
}

/** Redis Cluster's hash slots. */
const HASH_SLOTS = 16_384
const utf8 = new TextEncoder()

/**
 * The hash slot of `key` (Redis Cluster specification, "Key distribution model"): CRC16
 * (XMODEM) of the key's bytes, or of its hash tag (what lies between its first `{` and the
 * first `}` after it, when not empty), modulo 16,384.
 * @internal
 */
export function hashSlot(key: string): number {
  const bytes = utf8.encode(key)
  let start = 0
  let end = bytes.length
  const open = bytes.indexOf(0x7b)
  if (open !== -1) {
    const close = bytes.indexOf(0x7d, open + 1)
    if (close > open + 1) [start, end] = [open + 1, close]
  }
  let crc = 0
  for (let i = start; i < end; i++) {
    crc ^= bytes[i]! << 8
    for (let bit = 0; bit < 8; bit++) crc = crc & 0x8000 ? ((crc << 1) ^ 0x1021) & 0xffff : (crc << 1) & 0xffff
  }
  return crc % HASH_SLOTS
}

/**
 * The master that serves `key` on a Redis Cluster client, as the client's slot map has it
 * (`host:port`); `''` for a command on no key, or a slot not mapped yet.
 */
function masterOf(cluster: ClusterSlotMap, clientPrefix: string, key: string | undefined): string {
  if (key === undefined || !Array.isArray(cluster.slots)) return ''
  const nodes: unknown = cluster.slots[hashSlot(clientPrefix + key)]
  return Array.isArray(nodes) && typeof nodes[0] === 'string' ? nodes[0] : ''
}

/**
 * Has a Redis Cluster client read its slot map again (ioredis' `refreshSlotsCache()`; one read
 * at a time, since ioredis skips a request while one runs, and its failures are the client's
 * events); nothing for any other client. For a master that may have been replaced while it
 * answers nothing: ioredis otherwise learns of a new master only from a node's `MOVED`.
 */
export function rereadSlots(client: unknown): void {
  const refresh = (client as ClusterSlotMap | null | undefined)?.refreshSlotsCache
  if (typeof refresh === 'function') refresh.call(client)
}

/**
 * Connection states (ioredis') a `ready` follows, in which a command waits in the client's
 * offline queue: no probe is sent then (see {@link connectRedis}).
 */
const CONNECTING = new Set(['connecting', 'connect', 'reconnecting'])

/** Commands the stores send on no key (a channel instead), which a cluster client sends to any node. */
const KEYLESS = new Set(['PUBLISH', 'PING'])

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
 * Whether a rejection is Redis's `READONLY` reply (a write sent to a replica, not applied): as
 * a command's reply, or a script's on Redis 7 (`READONLY …`), or on Redis 6.2 (`ERR Error
 * running script … -READONLY …`).
 */
function isReadonly(error: unknown): boolean {
  return isErrorReply(error) && /(?:^|-)READONLY /.test(String((error as Error).message))
}

/** Whether `client` says it is on its way to a connection (connecting, its handshake, reconnecting). */
function connecting(client: RedisCommandClient): boolean {
  return CONNECTING.has(client.status as string)
}

/** The refusal of a call unsent because `client` says its connection is not ready. */
function notReadyError(what: string, client: RedisCommandClient): Error {
  return new Error(`${what} not sent: the Redis connection is not ready (${client.status})`)
}

/** How long a cluster call refused `READONLY` waits before it is sent once more (see {@link connectRedis}). */
const READONLY_RETRY_MS = 25

/**
 * Drops the arguments ioredis attaches to a failed command's error (`error.command.args`):
 * keys and values that hold token hashes (the cache's keys, an invalidation's message), which
 * an `onError` or `onEvent` that logs errors whole would write out, and the password of a
 * connection's handshake (`HELLO 3 AUTH user password`, `AUTH password`). The command's name
 * stays. Redis quotes the arguments itself in the reply to a command it does not know (`ERR
 * unknown command 'GETEX', with args beginning with: 'mcp-dispatch:session:…'`: a server below
 * 6.2, one with the command renamed away, a Redis-compatible one that lacks it), on either
 * client: that part of the message, and of the stack that repeats it, is dropped too.
 *
 * @internal
 */
export function withoutArguments(error: unknown): void {
  if (error === null || typeof error !== 'object') return
  try {
    const { message, stack } = error as { message?: unknown; stack?: unknown }
    if (typeof message === 'string' && QUOTED_ARGUMENTS.test(message)) {
      ;(error as { message: string }).message = message.replace(QUOTED_ARGUMENTS, ARGUMENTS_DROPPED)
      if (typeof stack === 'string') (error as { stack: string }).stack = stack.replace(QUOTED_ARGUMENTS_IN_STACK, ARGUMENTS_DROPPED)
    }
  } catch {
    // A frozen error keeps what it has: nothing of ours can change it.
  }
  const command = (error as { command?: unknown }).command
  if (command === null || typeof command !== 'object' || !('args' in command)) return
  try {
    ;(error as { command: unknown }).command = { name: (command as { name?: unknown }).name }
  } catch {
    // A frozen error keeps what it has: nothing of ours can change it.
  }
}

/** Redis's quotation of a command's arguments in an error reply, to the end of the message. */
const QUOTED_ARGUMENTS = /with args beginning with:[^]*$/
/** The same in a stack, to the end of its first line (the message's lines, up to `    at …`). */
const QUOTED_ARGUMENTS_IN_STACK = /with args beginning with:[^]*?(?=\n {4}at |$)/
const ARGUMENTS_DROPPED = 'with args beginning with: (dropped by mcp-dispatch)'

const REDIS_STORE_OPTIONS = optionNames<RedisStoreOptions>({ client: true, prefix: true, timeoutMs: true })

/** Where an option of a Redis connection goes: the stores take a client connected by the platform. */
function redisConnectionOption(key: string): string | undefined {
  return ['url', 'host', 'port', 'password', 'username', 'db', 'tls', 'redis', 'connection'].includes(key)
    ? 'the Redis stores take a connected client, not its options: client: new Redis(url) (ioredis), or the node-redis adapter (docs/stores.md)'
    : undefined
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
 *   only its own call. (When nothing at all answered within a whole deadline, a slow Redis
 *   looks hung: the breaker opens until the first late answer closes it.) A deadline is judged
 *   once this process has read its sockets (`withTimeout`, `expireOnceRead`): on time, a turn of
 *   the event loop after its timer, since Node runs due timers before it reads what came meanwhile.
 *   When this process noticed the
 *   deadline late (its event loop was held, more than 20 ms past it), answers may be waiting
 *   unread, or its command may have gone out only after the hold (a client that writes on the
 *   next turn: node-redis, ioredis' `enableAutoPipelining`): the call waits up to 20 ms more for
 *   its answer (no longer than the answer takes), takes it if it came, and is judged then (a
 *   stall of this process is no stall of Redis, nor a failed call).
 * - While open, calls reject at once and are not sent, once Redis has been silent (since the
 *   call that opened it was sent) for as long as their store's `timeoutMs`: the dispatcher
 *   applies its failure policy at once (the rate limit fails open, sessions 503, the OAuth
 *   cache misses), and no count waits on the socket to land later. A store with a longer
 *   deadline than that silence still sends its calls, so a tight deadline never refuses the
 *   calls of stores with longer ones on the same client, overlapping or following its own.
 * - One call at a time is the probe, the first `timeoutMs` after the breaker opened or the
 *   last probe gave up: it sends `PING` and, once that is answered, its own command, both
 *   under its deadline. A probe of a Redis still hung costs one queued `PING` and that call's
 *   wait, never a store command (a `PING` answered after the deadline sends nothing more).
 *   None is sent while the client, seen ready before, says its connection is down
 *   (`status`: reconnecting…), nor, before it was ever ready, while it says it is on its way
 *   there (`connecting`, `connect`, `reconnecting`): its `PING` would only wait in the offline
 *   queue, one more per probe for as long as the outage lasts; the first call once it is ready
 *   is the probe.
 * - Any answer from Redis closes it: a reply or an error reply to any command of that client
 *   (a late answer to a call that timed out too, or the probe's `PING`). A client's own
 *   failure (a connection closed, retries exhausted) is no answer.
 * - A command sent by {@link RedisConnection.sendAnyway} (the invalidation bus's `PUBLISH`)
 *   is never refused by it: it is sent while open too, to land when Redis answers, and its
 *   caller is told at its deadline. It is no probe; its answer closes the breaker as any
 *   answer does. It is refused at once, unsent, only while the client, seen ready before, says
 *   its connection is down, or, before it was ever ready, while it says it is on its way there
 *   and a command went unanswered: it would wait in the offline queue, and each call of its caller
 *   (the token service sends an invalidation again in rounds until it lands) would add one more.
 *
 * A client whose Redis answers within `timeoutMs`, or keeps answering something within it,
 * never sees it. On a Redis Cluster client (ioredis' `Cluster`: `isCluster`, with its slot map
 * `slots`) there is one breaker per master, found from the key of each command by its hash
 * slot (with the client's own `keyPrefix` before it, as the client sends it): a master that
 * hangs or went down opens its own, so its calls fail at once after the first deadline while
 * the calls to the other masters are sent and answered as before; only
 * that master's answers close it, and its probe is an `EXISTS` of the call's key (which reaches
 * that master, where a `PING` would go to any node). Commands on no key (`PUBLISH`) and a
 * cluster whose slots are not known yet share one breaker for the whole client. When a
 * master's breaker opens, and again each time its probe gets no answer, the client is asked to
 * read the slot map again (`refreshSlotsCache()`): ioredis learns that a replica took a
 * master's slots only from a node's answer (`MOVED`) or such a read, and a master that hangs
 * (or is cut off with its connections up) answers nothing, so without it the calls of its slots
 * would stay on its breaker, refused, for as long as it hangs, while its promoted replica
 * serves them.
 *
 * On a cluster, a call refused `READONLY` (a master demoted by a failover in the instant the
 * call reached it: the write was not applied) is sent once more 25 ms later, the slot map read
 * again meanwhile, by then answered `MOVED`, which the client follows: only when the wait ends
 * 25 ms or more before its deadline, and with the connection still up; a second refusal is the
 * call's error. A single Redis that refuses `READONLY` is a replica the client is connected to,
 * which no wait changes: its call fails at once.
 *
 * @example
 * ```ts
 * const redis = connectRedis({ client, prefix: 'app:', timeoutMs: 500 })
 * const pin = await redis.send('GET', `${redis.prefix}session:abc`)
 * ```
 */
export function connectRedis(options: RedisStoreOptions, store: { name: string; options?: readonly string[] }): RedisConnection {
  if (!options || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  refuseUnknownOptions(options, [...REDIS_STORE_OPTIONS, ...(store.options ?? [])], store.name, redisConnectionOption)
  const { client } = options
  if (!client || typeof client.call !== 'function') {
    throw new ConfigurationError('client', 'must be a Redis client with a call(command, ...args) method, such as an ioredis instance')
  }
  const prefix = options.prefix ?? DEFAULT_REDIS_PREFIX
  if (typeof prefix !== 'string' || prefix === '') throw new ConfigurationError('prefix', 'must be a non-empty string')
  const timeoutMs = timerOption('timeoutMs', options.timeoutMs ?? DEFAULT_REDIS_TIMEOUT_MS)
  // The client's own breaker, found once: a single Redis has no other, so only a cluster
  // client looks up the master of each call.
  const whole = breakerOf(client, '')
  const clustered = (client as ClusterSlotMap).isCluster === true
  // The client's own key prefix, read once: the key a command's slot is computed from.
  const clientPrefix = clustered ? clientKeyPrefix(client as ClusterSlotMap) : ''
  // Whether the client, seen ready, says its connection is down: no probe, nor a command sent
  // anyway, is sent then.
  const lost = lostSinceReady(client)

  const call = (breaker: StallBreaker, command: string, args: RedisArgument[]): Promise<unknown> => {
    let reply: Promise<unknown>
    try {
      reply = Promise.resolve(client.call(command, ...args))
    } catch (error) {
      return Promise.reject(error)
    }
    reply.then(breaker.answered, (error: unknown) => {
      // First of the rejection's handlers, so before any caller or `onError` sees the error.
      withoutArguments(error)
      if (isErrorReply(error)) breaker.answered()
    })
    return reply
  }
  const evaluate = async (breaker: StallBreaker, script: LuaScript, args: RedisArgument[]): Promise<unknown> => {
    try {
      return await call(breaker, 'EVALSHA', [script.sha, ...args])
    } catch (error) {
      // A server that restarted, or a replica promoted since, has an empty script cache (on a
      // cluster: a master that never ran it, or the target of a slot being migrated).
      if (!String((error as Error | undefined)?.message).startsWith('NOSCRIPT')) throw error
      return call(breaker, 'EVAL', [script.source, ...args])
    }
  }
  /**
   * `attempt` on `key` under the deadline, through the breaker of the master serving `key`
   * (see above); `anyway`: sent even while it is open, and never as the probe.
   */
  const guarded = (
    what: string,
    key: string | undefined,
    attempt: (breaker: StallBreaker) => Promise<unknown>,
    anyway = false,
  ): Promise<unknown> => {
    const master = clustered ? masterOf(client as ClusterSlotMap, clientPrefix, key) : ''
    const breaker = master === '' ? whole : breakerOf(client, master)
    let settled = false
    let expired = false
    let probe = false
    // The answers counted when the command was sent: any more by the deadline, and Redis is
    // answering, if slowly (or another store's deadline is the tighter one): no stall.
    let seen = breaker.answers
    let pending: Promise<unknown>
    // Not even a command that must land however late is put in an offline queue: each call of
    // its caller (the token service's rounds of an invalidation) would add one more there for
    // as long as the connection is down, all sent at once when it is back. Refused, it is sent
    // again by its caller: the bus tells the token service once the client is ready again
    // (`onReady`), which starts a round at once. Read on every call, not only when it
    // matters: a client that emits no `ready` (the node-redis adapter) is seen ready only by a
    // call made while it is.
    const down = lost()
    // Before the client was ever ready, only once a command went unanswered (Redis not there
    // when the process started): a `PUBLISH` made while it connects as usual is sent on connect.
    if (anyway && (down || (breaker.stalled && connecting(client)))) return Promise.reject(notReadyError(what, client))
    // A cluster call refused READONLY is sent once more (see connectRedis), the slot map read
    // again meanwhile: only when the wait ends well within its deadline (a retry sent at the
    // deadline would be applied, its call failed) and the connection is still up (else the
    // retry would wait in the offline queue, to count late).
    const send = !clustered
      ? attempt
      : (breaker: StallBreaker) =>
          attempt(breaker).catch((error: unknown) => {
            // The deadline runs from `sentAt` (below), a probe's PING included.
            if (!isReadonly(error) || performance.now() - sentAt + 2 * READONLY_RETRY_MS > timeoutMs) throw error
            rereadSlots(client)
            return new Promise<void>((resolve) => {
              const timer = setTimeout(resolve, READONLY_RETRY_MS)
              ;(timer as { unref?: () => void }).unref?.()
            }).then(() => {
              if (expired || lost()) throw error
              // Counted from the command sent again, as for a probe's.
              seen = breaker.answers
              return attempt(breaker)
            })
          })
    // When the deadline starts.
    const sentAt = performance.now()
    // Refused only once Redis has been silent for as long as this store waits: a store whose
    // deadline is tighter than Redis's pace (a rate-limit store at 100 ms on a Redis answering
    // in 150 ms) leaves the calls of stores with longer ones sent (a session store at 1,000 ms
    // on the same client), those that follow its own timed-out call included.
    if (!breaker.stalled || anyway || sentAt - breaker.silentSince + DEADLINE_SLACK_MS < timeoutMs) pending = send(breaker)
    else if (sentAt < breaker.probeAt || down || connecting(client)) {
      // A client that says its connection is down (reconnecting) would only queue the probe's
      // PING in its offline queue, one more each `timeoutMs` for as long as the outage lasts
      // (for ever with ioredis' `maxRetriesPerRequest: null): none is sent, and the first call
      // once it is ready again is the probe. So too before it was ever ready, while it says it
      // is on its way there (a Redis not there when the process started): only states a `ready`
      // follows, so that a client whose `status` never says `ready` still has its probes.
      // Named for what the client says of its connection when it says it is down: the command
      // that opened the breaker may never have left its offline queue (a Redis restarted, a
      // Sentinel failover), so "no answer" would send an operator looking for a hung server.
      return Promise.reject(
        down || connecting(client)
          ? notReadyError(what, client)
          : new Error(`${what} not sent: Redis${master && ` ${master}`} is stalled (a command got no answer within ${breaker.missedMs} ms, and nothing has answered since)`),
      )
    } else {
      // One probe at a time; the next no sooner than timeoutMs after this one gave up. On a
      // cluster, a read of the key, so that it reaches the master in question (a PING goes to
      // any node).
      probe = true
      breaker.probeAt = Number.POSITIVE_INFINITY
      const ping = master === '' ? call(breaker, 'PING', []) : call(breaker, 'EXISTS', [key!])
      pending = ping.then(() => {
        // Answered after this call gave up: its command would only run late, for no one.
        if (expired) throw new Error(`${what} not sent: Redis answered the probe after the deadline`)
        // Counted from the command, not the PING: the PING's answer says nothing of it.
        seen = breaker.answers
        return send(breaker)
      })
    }
    const settle = () => void (settled = true)
    pending.then(settle, settle)
    return withTimeout(pending, timeoutMs, what).catch((error: unknown) => {
      // Made only here, so an answer in time costs nothing more.
      const failed = (reason: unknown): never => {
        if (probe && breaker.stalled) {
          breaker.probeAt = performance.now() + timeoutMs
          // A master that stalls may have been replaced (see above).
          if (breaker !== whole) rereadSlots(client)
        }
        throw reason
      }
      const gaveUp = (reason: unknown): never => {
        if (!breaker.stalled && breaker.answers === seen) open(breaker, sentAt)
        return failed(reason)
      }
      if (settled) return failed(error)
      // Past the deadline, as `withTimeout` judged it once this process had read its sockets,
      // and NOTICED_LATE_MS more when its timer fired late: a process whose event loop was held
      // may have had the answer waiting unread, or have sent the command itself only once the
      // hold was over (node-redis, and ioredis with `enableAutoPipelining`, write in a
      // `setImmediate`: a process held right after the call held its command back, and its
      // answer comes a round trip later). An answer by then was the call's, so a stall of this
      // process is neither a stall of Redis nor a failed call (a rate-limit count that Redis
      // made, failed here, served its request past the limit, fail open). None came: a probe's
      // PING answered from now on sends nothing more.
      expired = true
      return gaveUp(error)
    })
  }
  const open = (breaker: StallBreaker, silentSince: number) => {
    breaker.stalled = true
    breaker.probeAt = performance.now() + timeoutMs
    breaker.missedMs = timeoutMs
    breaker.silentSince = silentSince
    if (breaker !== whole) rereadSlots(client)
  }
  const keyOf = (command: string, args: RedisArgument[]) => (KEYLESS.has(command) ? undefined : String(args[0]))
  return {
    prefix,
    timeoutMs,
    send: (command, ...args) => guarded(`Redis ${command}`, keyOf(command, args), (breaker) => call(breaker, command, args)),
    sendAnyway: (command, ...args) =>
      guarded(`Redis ${command}`, keyOf(command, args), (breaker) => call(breaker, command, args), true),
    run: (script, key, ...args) => guarded(`Redis script ${script.name}`, key, (breaker) => evaluate(breaker, script, [1, key, ...args])),
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
