/**
 * Invalidations (rotations, revocations) broadcast to every instance over Redis pub/sub, so a
 * token that stopped working is dropped from every instance's token cache at once (DESIGN.md
 * "API tokens").
 * @module
 */
import { randomUUID } from 'node:crypto'
import type { InvalidationBus, InvalidationMessage } from '../../core/stores.js'
import { ConfigurationError, optionNames, reporterOption } from '../../errors.js'
import { heldBack, lineGate } from '../../line-gate.js'
import { MAX_TIMER_MS, afterThisTurn, withTimeout } from '../../timeout.js'
import { type RedisCommandClient, type RedisStoreOptions, type RedisSubscriberClient, connectRedis, notReady, onReady, rereadSlots, withoutArguments } from './client.js'

/** Options of {@link createRedisInvalidationBus}. */
export interface RedisInvalidationBusOptions extends RedisStoreOptions {
  /**
   * Publishes invalidations. Unless `subscriber` is given, the bus also opens its subscriber
   * connection with `client.duplicate()` (a connection in subscriber mode cannot send other
   * commands), and closes it in {@link RedisInvalidationBus.close}. An ioredis `Redis` client is
   * duplicated with `{ autoResubscribe: false }`: the bus subscribes again itself whenever the
   * connection is ready, and ioredis 5's own resubscription, sent with no handler, ended the
   * process (an unhandled rejection) when the connection closed before its reply.
   */
  client: RedisCommandClient & { duplicate?(): RedisSubscriberClient }
  /**
   * A connection of your own to subscribe on, instead of a duplicate of `client`. The bus
   * listens on its channel, the heartbeat channel and its confirmation channel only (on a
   * Cluster: no confirmation channel, and no heartbeat channel with the heartbeat off) and, on
   * close, unsubscribes from them and leaves the connection open; one not yet connected
   * (`lazyConnect`) is connected by the bus. One bus per prefix on a
   * connection: one that already carries a bus of the same prefix is a `ConfigurationError`
   * (Redis would count the two as one receiver of each message). Not `client` itself (a
   * `ConfigurationError`): on RESP2, the only protocol of ioredis 5, a subscribed connection
   * refuses every other command.
   */
  subscriber?: RedisSubscriberClient | undefined
  /**
   * Errors that fail no call: the subscriber connection's errors, a failed subscription
   * (retried when the connection is ready again), or a silence past the heartbeat's bound
   * (context `invalidation subscriber`); a malformed message (`invalidation message`); a
   * listener that threw or rejected (`invalidation listener`); receivers that did not confirm an
   * invalidation (`invalidation publish`); a confirmation that could not be sent
   * (`invalidation confirm`); a failed `UNSUBSCRIBE` at `close()` (`invalidation unsubscribe`).
   * Default: `logError` (one line on stderr).
   */
  onError?: ((error: unknown, context: string) => void) | undefined
  /**
   * The bus's heartbeat, on a channel of its own (`<channel>:heartbeat`, on the same
   * subscriber connection), checked every this many milliseconds: a bus that heard nothing on
   * either channel for half of it publishes one, so a group of instances sends at least one per
   * interval, and up to one per bus when their timers tick together. When nothing at all has
   * arrived for this plus `timeoutMs` after its own heartbeat went out (a Redis that hangs
   * without closing the connection: no `close` event ever comes),
   * the bus stops `listening`, so the token service reads the store instead of trusting its
   * cache, until a message arrives again. A hang is so noticed between this plus `timeoutMs`
   * and 3.5 times this plus `timeoutMs` after it began (2 to 4.5 s by default); a cache may
   * still serve in that window. `false` turns it off (then only a lost connection is noticed;
   * `publish` still waits for the other buses' confirmations, and, but on a Cluster, the bus
   * still subscribes to the heartbeat channel, where buses of the version before confirm).
   * Default 1,000.
   */
  heartbeatMs?: number | false | undefined
}

/** Default interval of the bus's heartbeat, in milliseconds. */
export const DEFAULT_HEARTBEAT_MS = 1_000

/** The Redis invalidation bus: an {@link InvalidationBus} that can be awaited and closed. */
export interface RedisInvalidationBus extends InvalidationBus {
  /** The pub/sub channel: `<prefix>invalidations`. */
  readonly channel: string
  /**
   * Resolves once Redis confirmed the subscription (messages published before it are not
   * received); rejects after `timeoutMs` (the option) without it. Await it before serving.
   * Once the bus is closed (before the confirmation, or while a call waits for it), rejects at
   * once, naming the channel, rather than wait out its deadline: a closed bus never delivers.
   */
  ready(timeoutMs?: number): Promise<void>
  /** Stops delivering; disconnects the subscriber connection the bus opened, or unsubscribes a given one. Idempotent. */
  close(): Promise<void>
}

/** An emitter of events without arguments (a `Cluster`'s `+node`). */
interface EventSource {
  on(event: string, listener: () => void): unknown
  removeListener(event: string, listener: () => void): unknown
}

/** A connection whose end the bus can hear (`ioredis`' `Redis`). */
interface EndingConnection {
  readonly status?: unknown
  on(event: 'ready' | 'end', listener: () => void): unknown
  removeListener(event: 'ready' | 'end', listener: () => void): unknown
}

/**
 * What the bus reads of an ioredis `Cluster` subscriber: it subscribes through its
 * `ClusterSubscriber` (the field `subscriber`, private in ioredis' typings), on one connection
 * of its own to one node (`getInstance()`), which it replaces by one to another node when that
 * one ends, telling no one: the `Cluster` emits no `close`, and its `-node` comes only for a
 * node the `Cluster` itself had connected to, often not the subscriber's.
 */
interface ClusterSubscription {
  readonly isCluster?: unknown
  readonly subscriber?: { readonly getInstance?: unknown } | null
}

/** The connection a Cluster subscribes on now, or `undefined` (none, or not an ioredis Cluster). */
function subscribedConnection(cluster: ClusterSubscription): EndingConnection | undefined {
  const connection: unknown = (cluster.subscriber?.getInstance as (() => unknown) | undefined)?.call(cluster.subscriber)
  const events = connection as Partial<EndingConnection> | null | undefined
  return typeof events?.on === 'function' && typeof events.removeListener === 'function' ? (connection as EndingConnection) : undefined
}

/** Whether Redis refused a command for the user's rights (`NOPERM`), not for a lost connection. */
function refusedReason(error: unknown): boolean {
  return error instanceof Error && error.message.startsWith('NOPERM')
}

/**
 * The bus's own subscriber connection: a duplicate of `client`. An ioredis `Redis` (not a
 * `Cluster`, whose `duplicate` takes startup nodes first) is duplicated without its own
 * resubscription on reconnect: the bus subscribes again on `ready` itself, and ioredis 5 sends
 * that SUBSCRIBE with no handler, so a connection closed before its reply (the bus closed, the
 * connection lost again) rejected it unhandled, which ends a Node process.
 */
function ownSubscriber(client: RedisInvalidationBusOptions['client']): RedisSubscriberClient {
  const duplicate = client.duplicate as (this: unknown, override?: { autoResubscribe: boolean }) => RedisSubscriberClient
  return (client as ClusterSubscription).isCluster === true ? duplicate.call(client) : duplicate.call(client, { autoResubscribe: false })
}

/** A publish waiting for the other buses to confirm it. */
interface Awaiting {
  /** Confirmations counted, and how many Redis counted receivers (`Infinity` until it answered). */
  got: number
  needed: number
  /** The buses that confirmed (those of the version before, which do not say, are not in it). */
  readonly by: Set<string>
  readonly done: () => void
  /** Why it stopped waiting before every receiver confirmed, when no confirmation could reach this bus any more. */
  cut?: string
}

/**
 * A gate for a report that could come with every invalidation: open at most once a minute
 * (monotonic clock).
 */
function onceAMinute(): () => boolean {
  const gate = lineGate(60_000)
  return () => gate('report') !== undefined
}

/** How often the default logger writes the subscriber connection's errors at most (ms). */
const CONNECTION_ERROR_LOG_INTERVAL_MS = 10_000

/** Connection states (ioredis) a `ready` follows, where a command would be queued or refused. */
const UNREADY = new Set(['connecting', 'connect', 'reconnecting'])

/** The form of a bus's id (`randomUUID`). */
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

/** The channels buses listen on, by the connection given them as `subscriber`. */
const busChannels = new WeakMap<object, Set<string>>()
function channelsOf(connection: object): Set<string> {
  let channels = busChannels.get(connection)
  if (channels === undefined) busChannels.set(connection, (channels = new Set()))
  return channels
}

/**
 * What goes over the channel: the message, and which bus sent it. A message of another kind
 * (a later version's) is taken as a sign of life and otherwise ignored.
 */
type WireMessage =
  | {
      readonly origin: string
      readonly kind: 'token'
      readonly tokenHash: string
      /** Present when its sender waits for the other buses to confirm it (see `confirmed`). */
      readonly id?: string
      /**
       * `true`: confirm on the sender's own channel (`<channel>:ack:<origin>`, the body `<id>
       * <receiver's origin>`). Absent (a sender of the version before): on the heartbeat
       * channel, as JSON.
       */
      readonly direct?: boolean
    }
  | { readonly origin: string; readonly kind: 'other' }

function parseWire(text: string): WireMessage | undefined {
  try {
    const value = JSON.parse(text) as { origin?: unknown; kind?: unknown; tokenHash?: unknown; id?: unknown; direct?: unknown } | null
    if (typeof value?.origin !== 'string' || typeof value.kind !== 'string') return undefined
    if (value.kind !== 'token') return { origin: value.origin, kind: 'other' }
    if (typeof value.tokenHash === 'string') {
      const id = typeof value.id === 'string' ? value.id : undefined
      return { origin: value.origin, kind: 'token', tokenHash: value.tokenHash, ...(id !== undefined && { id, ...(value.direct === true && { direct: true }) }) }
    }
  } catch {
    // reported by the caller
  }
  return undefined
}

/**
 * A confirmation from a bus of the version before, which sent them all on the heartbeat
 * channel, where every bus received every one: `{ "ack": <id>, "to": <origin> }`.
 */
function parseAck(text: string): { readonly ack: string; readonly to: string } | undefined {
  if (text.charCodeAt(0) !== 123 /* { */) return undefined
  try {
    const value = JSON.parse(text) as { ack?: unknown; to?: unknown } | null
    return typeof value?.ack === 'string' && typeof value.to === 'string' ? { ack: value.ack, to: value.to } : undefined
  } catch {
    return undefined
  }
}

/** The options of its own, beside a Redis store's. */
const OWN_OPTIONS = optionNames<Omit<RedisInvalidationBusOptions, keyof RedisStoreOptions>>({ subscriber: true, heartbeatMs: true, onError: true })

/**
 * An invalidation bus over Redis pub/sub, one per token service. `publish` delivers to this
 * bus's own listeners at once (as the in-process bus does) and sends one `PUBLISH` to
 * `<prefix>invalidations` (under the `timeoutMs` deadline, and even while the client's Redis is
 * stalled: docs/stores.md, "Failure behaviour"; but not while the client, seen ready before,
 * says its connection is down, nor while one never ready and stalled is connecting: it rejects at once then, rather than wait in the client's offline
 * queue, and the token service sends it again); every other bus on that channel
 * delivers it to its listeners when it arrives (its own messages coming back are skipped) and
 * confirms it on the sender's own channel, `<channel>:ack:<sender>`. On a single Redis,
 * `publish` resolves once every connection that received the message confirmed it, or
 * `timeoutMs` after it was sent, whichever comes first (a receiver that never confirms, such as
 * a bus of a version before confirmations or a `redis-cli SUBSCRIBE`, costs that wait and a
 * report to `onError` at most once a minute, never a failure; while this bus's own subscriber
 * connection is down, its channels silent or its confirmation channel refused, no
 * confirmation could reach it, and none is waited for).
 * Pass it as the token service's `invalidations`, with a `cacheTtlMs` above 0: a revoked or
 * rotated token is then refused by every listening instance by the time `revoke` or `rotate`
 * returns (DESIGN.md: at once, on every instance).
 *
 * Pub/sub delivers to whoever is subscribed at that moment: a bus whose subscriber
 * connection is down misses what was published meanwhile (it resubscribes when the
 * connection is ready again), and for those tokens the cache TTL bounds how long a stale
 * record may be trusted (DESIGN.md: within the cache TTL, at most 10 minutes). On an ioredis
 * `Cluster`, the connection the cluster subscribes on is followed too: a subscription ioredis
 * moves to another node is a reconnect (docs/stores.md, "Redis Cluster").
 *
 * @example
 * ```ts
 * import { Redis } from 'ioredis'
 * import { createRedisInvalidationBus } from 'mcp-dispatch/redis'
 *
 * const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1, socketTimeout: 5_000 })
 * const invalidations = createRedisInvalidationBus({ client: redis })
 * await invalidations.ready()
 * const tokens = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations })
 * // on shutdown: await tokens.close(); await invalidations.close(); await redis.quit()
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} without a Redis `client` (one with `call(command, ...args)`), or
 * with an empty `prefix` or a `timeoutMs` that is not a positive number of milliseconds; with an
 * `onError` or `heartbeatMs` it cannot use; with a `subscriber` that is not a connection of its
 * own (the client itself, or one already carrying a bus of this prefix), or none when the client
 * has no `duplicate()`.
 */
export function createRedisInvalidationBus(options: RedisInvalidationBusOptions): RedisInvalidationBus {
  const redis = connectRedis(options, { name: 'createRedisInvalidationBus', options: OWN_OPTIONS })
  const onError = reporterOption(options.onError)
  const given = options.subscriber
  const methods = ['subscribe', 'unsubscribe', 'on', 'removeListener'] as const
  if (given !== undefined && !methods.every((name) => typeof given?.[name] === 'function')) {
    throw new ConfigurationError('subscriber', `must be a Redis connection with ${methods.join('(), ')}() (ioredis)`)
  }
  // A subscribed connection (RESP2, ioredis 5's only protocol) refuses every other command:
  // every store on the client would fail. One connection of its own, whatever the protocol.
  if (given !== undefined && given === (options.client as unknown)) {
    throw new ConfigurationError('subscriber', 'must be a connection of its own, not the client: a subscribed connection cannot send the other commands')
  }
  if (given === undefined && typeof options.client.duplicate !== 'function') {
    throw new ConfigurationError('subscriber', 'is required when the client has no duplicate() method')
  }
  const heartbeatMs = options.heartbeatMs ?? DEFAULT_HEARTBEAT_MS
  if (heartbeatMs !== false && !(typeof heartbeatMs === 'number' && heartbeatMs > 0 && heartbeatMs <= MAX_TIMER_MS)) {
    throw new ConfigurationError('heartbeatMs', 'must be a positive number of milliseconds, or false')
  }
  const channel = `${redis.prefix}invalidations`
  // Redis counts a connection once however many buses listen on it: a second bus on the same
  // channel of one connection would confirm for a receiver it is not (and receive each message
  // once for both).
  if (given !== undefined && channelsOf(given).has(channel)) {
    throw new ConfigurationError('subscriber', `already carries a bus on ${channel}: give each bus of one prefix a connection of its own`)
  }
  const subscriber = given ?? ownSubscriber(options.client)
  if (given !== undefined) channelsOf(given).add(channel)
  // Heartbeats go apart, so buses of a version before the heartbeat never see them.
  const heartbeatChannel = `${channel}:heartbeat`
  const origin = randomUUID()
  // Confirmations of this bus's invalidations come on a channel of its own, so each reaches
  // its sender only (on a channel every bus heard, each invalidation of N buses cost (N − 1) × N
  // deliveries), naming the bus that confirms: a receiver confirming twice (a PUBLISH ioredis
  // sent again after a reconnect reaches it twice) counts once.
  const ackPrefix = `${channel}:ack:`
  const ackChannel = ackPrefix + origin
  const listeners = new Set<(message: InvalidationMessage) => void>()
  let closed = false
  let confirm!: () => void
  const subscribed = new Promise<void>((resolve) => (confirm = resolve))
  // Rejects on close(): a `ready()` waiting then stops waiting. Handled here, so that a bus
  // closed with no one waiting leaves no unhandled rejection.
  const closedError = () => new Error(`Redis invalidation bus on ${channel} is closed`)
  let shut!: (error: Error) => void
  const shutdown = new Promise<never>((_, reject) => (shut = reject))
  shutdown.catch(() => {})

  function deliver(message: InvalidationMessage): void {
    for (const listener of [...listeners]) {
      try {
        const answer: unknown = listener(message)
        // An `async` listener's rejection is reported as its throw is, never left unhandled
        // (which ends a Node process).
        if (typeof (answer as PromiseLike<unknown> | undefined)?.then === 'function') {
          Promise.resolve(answer).catch((error: unknown) => onError(error, 'invalidation listener'))
        }
      } catch (error) {
        onError(error, 'invalidation listener')
      }
    }
  }
  function onMessage(from: string, text: string): void {
    if (closed) return
    // Something arrived: a replaced subscriber hears again (a subscription confirmed is not yet
    // that), so the next deaf spell starts the replacements afresh.
    lastReplaced = -Infinity
    replaceEveryMs = 2 * silentLimitMs
    if (from === ackChannel) {
      heard()
      const space = text.indexOf(' ')
      return space === -1 ? undefined : confirmed(text.slice(0, space), text.slice(space + 1))
    }
    if (from === heartbeatChannel) {
      heard()
      const ack = parseAck(text)
      if (ack?.to === origin) confirmed(ack.ack, undefined)
      return
    }
    if (from !== channel) return
    if (!subscribedNow) resubscribe()
    const wire = parseWire(text)
    if (!wire) return onError(new Error('Malformed invalidation message'), 'invalidation message')
    heard()
    if (wire.kind !== 'token') return
    // Its own message back: this connection was among the receivers Redis counted.
    if (wire.origin === origin) return wire.id === undefined ? undefined : confirmed(wire.id, origin)
    deliver({ kind: wire.kind, tokenHash: wire.tokenHash })
    // Delivered (the token service dropped the record): its sender may stop waiting for us.
    // Sent even while this client's Redis is stalled, as an invalidation is: late, it is harmless.
    // Only to a sender that looks like a bus (its id a UUID): a message forged or garbled on the
    // channel does not make every bus publish where it says.
    if (wire.id === undefined || !UUID.test(wire.origin)) return
    const [to, body] = wire.direct ? [ackPrefix + wire.origin, `${wire.id} ${origin}`] : [heartbeatChannel, JSON.stringify({ ack: wire.id, to: wire.origin })]
    redis.sendAnyway('PUBLISH', to, body).catch(unsentConfirmation)
  }
  // A confirmation that could not be sent (an ACL without publish rights on the confirmation
  // channels, a lost connection) leaves its sender waiting `timeoutMs`: reported at most once a
  // minute.
  const unsentReport = onceAMinute()
  function unsentConfirmation(error: unknown): void {
    if (closed || !unsentReport()) return
    const reason = error instanceof Error ? error.message : String(error)
    // The ACL advice only for a refusal of Redis's (NOPERM): a connection that is down says so itself.
    const acl = /NOPERM/.test(reason) ? ` (with Redis ACLs, this client's user needs that channel: docs/stores.md, "Redis")` : ''
    onError(
      new Error(`A confirmation on ${ackPrefix}* could not be sent (${reason}): its sender waits its timeoutMs for it${acl}`, { cause: error }),
      'invalidation confirm',
    )
  }
  // Publishes waiting for the other buses on the channel to confirm delivery, by message id:
  // `needed` is known once Redis answered the PUBLISH with how many connections received it.
  // Confirmations are counted once per bus that sent them; those of buses of the version before,
  // which do not say who they are, each count.
  const awaiting = new Map<string, Awaiting>()
  function confirmed(id: string, by: string | undefined): void {
    const entry = awaiting.get(id)
    if (entry === undefined) return
    if (by !== undefined) {
      if (entry.by.has(by)) return
      entry.by.add(by)
    }
    entry.got++
    if (entry.got >= entry.needed) entry.done()
  }
  // On a Cluster, a PUBLISH counts only the receivers on the node that ran it: not waited for.
  const confirms = (options.client as ClusterSubscription).isCluster !== true
  // The confirmation channel, and the heartbeat channel (where buses of the version before
  // confirm), then the channel.
  const channels = [...(confirms ? [ackChannel] : []), ...(confirms || heartbeatMs !== false ? [heartbeatChannel] : []), channel]
  // Receivers that did not confirm in time, reported at most once a minute with their count.
  let missing = 0
  const missingReport = onceAMinute()
  function unconfirmed(count: number, of: number): void {
    if (closed) return
    missing += count
    if (!missingReport()) return
    onError(
      new Error(
        `${missing} receiver${missing === 1 ? '' : 's'} of ${channel} did not confirm an invalidation within ${redis.timeoutMs} ms (the last: ${count} of ${of}; a bus of a version before confirmations, a process that hangs, or a subscriber that is no bus): their instances may serve the token from their cache until the message reaches them`,
      ),
      'invalidation publish',
    )
    missing = 0
  }
  // Publishes waiting for confirmations that can no longer reach this bus stop waiting, and are
  // reported (at most once a minute) apart from receivers that did not confirm.
  const cutReport = onceAMinute()
  function stopWaiting(cause: string): void {
    for (const entry of awaiting.values()) {
      entry.cut ??= cause
      entry.done()
    }
  }
  function cutShort(count: number, of: number, cause: string): void {
    if (closed || count <= 0 || !cutReport()) return
    onError(
      new Error(`Stopped waiting for ${count} of ${of} receivers of ${channel} to confirm an invalidation: ${cause}, so no confirmation could reach this bus; their instances may serve the token from their cache until the message reaches them`),
      'invalidation publish',
    )
  }
  // The default logger's account of the subscriber connection's errors: a Redis that is down
  // fails every reconnection (ioredis tries again every 2 s at most), so at most one line per
  // 10 s, the next naming how many came meanwhile. An `onError` of yours hears every one.
  const connectionErrorGate = options.onError === undefined ? lineGate(CONNECTION_ERROR_LOG_INTERVAL_MS) : undefined
  function onConnectionError(error: Error): void {
    // A failed handshake of the connection the bus opened carries its arguments, the password
    // among them (`HELLO 3 AUTH default <password>`): dropped, as from every store's command.
    withoutArguments(error)
    if (closed) return
    const held = connectionErrorGate ? connectionErrorGate('subscriber') : 0
    if (held !== undefined) onError(error, heldBack('invalidation subscriber', held))
  }
  // Whether messages from other instances can arrive now: false from creation until Redis
  // confirms the subscription, from a lost connection until it confirms it again, and while
  // the channel is silent past the heartbeat's bound (deaf). While false the token service
  // serves nothing from its cache; each change of state also drops every cached record, since
  // messages published meanwhile were lost.
  let listening = false
  let subscribedNow = false
  let deaf = false
  function setListening(): void {
    const now = subscribedNow && !deaf
    if (listening === now || closed) return
    listening = now
    deliver({ kind: 'all' })
  }
  // How long the channels may stay silent after a heartbeat was sent (see `judgeSilence`).
  const silentLimitMs = heartbeatMs === false ? 0 : heartbeatMs + redis.timeoutMs
  // The heartbeat: the last time anything arrived on the channel (monotonic clock).
  let lastHeard = performance.now()
  function heard(): void {
    lastHeard = performance.now()
    pendingSince = undefined
    answeredWhileDeaf = undefined
    if (deaf) {
      deaf = false
      setListening()
    }
  }
  // A subscriber the bus opened that stays deaf while the client's heartbeats are answered
  // (Redis is reached, its PUBLISH counted, and nothing comes back) is on a connection dropped
  // without a reset: a NAT, firewall or load balancer that forgot it, Redis moved behind the
  // same address. Only TCP keepalive would notice, minutes to hours later, and the token cache
  // stays off meanwhile. Such a connection is replaced (ioredis' `disconnect(true)` reconnects,
  // and its `ready` subscribes again): first after twice the silent limit, then at doubling
  // intervals up to a minute while replacing does not help. Not one given to the bus, which is
  // the application's, nor a Cluster's, which the slot map rereads move.
  let answeredWhileDeaf: number | undefined
  let lastReplaced = -Infinity
  let replaceEveryMs = 2 * silentLimitMs
  function replaceDeafSubscriber(): void {
    if (given !== undefined || cluster !== undefined || answeredWhileDeaf === undefined) return
    const at = performance.now()
    if (at - answeredWhileDeaf <= silentLimitMs || at - lastReplaced <= replaceEveryMs) return
    const connection = subscriber as { status?: unknown; disconnect?: (reconnect?: boolean) => void }
    if (connection.status !== 'ready' || typeof connection.disconnect !== 'function') return
    if (lastReplaced !== -Infinity) replaceEveryMs = Math.min(replaceEveryMs * 2, Math.max(60_000, 2 * silentLimitMs))
    lastReplaced = at
    answeredWhileDeaf = undefined
    onError(
      new Error(`Nothing arrived on ${channel} while Redis answered the heartbeats sent to it: the subscriber connection is replaced`),
      'invalidation subscriber',
    )
    connection.disconnect(true)
  }
  // Silence is judged against the bus's own heartbeat: sent, and nothing at all heard since,
  // for `heartbeatMs` + `timeoutMs`. Judged after this process has read its sockets
  // (setImmediate runs after that), so a stall of the process, whatever its length, is no
  // silence: what Redis sent meanwhile is read first.
  let pendingSince: number | undefined
  let lastSent = -Infinity
  function beat(): void {
    if (closed || heartbeatMs === false) return
    if (!subscribedNow) return resubscribe()
    // A Cluster's subscription stays on a node that hangs (its connection up, nothing
    // arriving): read again, the slot map leaves out a node the cluster has marked failed, and
    // ioredis then drops its connections to it, moving the subscription (followed below).
    // Asked when the channel goes silent, and each interval while it stays so.
    if (deaf) {
      rereadSlots(subscriber)
      replaceDeafSubscriber()
    }
    const at = performance.now()
    if (pendingSince !== undefined) afterThisTurn(judgeSilence)
    // At least one heartbeat per interval for the group: a bus sends one when it heard nothing
    // for half an interval, and again each interval while it waits for an answer. One that
    // fails is what the silence check notices; it is not reported each time.
    const silent = pendingSince === undefined ? at - lastHeard >= heartbeatMs / 2 : at - lastSent >= heartbeatMs
    if (!silent) return
    // The silence is judged whether or not a heartbeat can be sent: a command connection that
    // is down while the subscriber hears nothing (both cut off from Redis) must not leave the
    // cache trusted; other instances' heartbeats, heard, end it.
    pendingSince ??= at
    if (!notReady(options.client)) {
      lastSent = at
      // Through the breaker, unlike an invalidation: one refused while Redis is stalled only
      // lets the silence show sooner, which turns the cache off (the safe side).
      redis.send('PUBLISH', heartbeatChannel, origin).then(
        () => void (deaf && (answeredWhileDeaf ??= performance.now())),
        () => {},
      )
    }
  }
  function judgeSilence(): void {
    if (closed || deaf || !subscribedNow || pendingSince === undefined || performance.now() - pendingSince <= silentLimitMs) return
    deaf = true
    answeredWhileDeaf = undefined
    setListening()
    stopWaiting('nothing arrived on its channels')
    rereadSlots(subscriber)
    // Named when no heartbeat went out: the subscriber may be fine, with nobody else publishing.
    const unsent = lastSent < pendingSince ? ', and no heartbeat could be sent (the command connection is not ready)' : ''
    onError(new Error(`Nothing arrived on ${channel} for ${silentLimitMs} ms${unsent}: the cache is off until something does`), 'invalidation subscriber')
  }
  const timer = heartbeatMs === false ? undefined : setInterval(beat, heartbeatMs)
  ;(timer as { unref?: () => void } | undefined)?.unref?.()
  // On creation, and again whenever the connection is ready (after a failed first attempt,
  // or a reconnect when the client does not resubscribe by itself); a repeat is harmless.
  function subscribe(): Promise<void> {
    // A connection on its way up is subscribed on its `ready`: in its handshake (ioredis
    // `connect`) ioredis 5 would write the SUBSCRIBE at once, and the connection, then
    // subscribed, would have its ready check refused and be dropped; before it (`connecting`,
    // `reconnecting`) a client with `enableOfflineQueue: false` refuses the command, which
    // would be reported as a failure although the `ready` that follows subscribes.
    if (closed || UNREADY.has(subscriber.status as string)) return Promise.resolve()
    // Not connected yet (`lazyConnect`): connected, and subscribed on its `ready`, since a
    // SUBSCRIBE would be refused while it connects where there is no offline queue.
    if (subscriber.status === 'wait' && typeof (subscriber as { connect?: unknown }).connect === 'function') {
      ;(subscriber as unknown as { connect(): Promise<unknown> }).connect().catch(() => {})
      return Promise.resolve()
    }
    const movesBefore = moves
    // One channel per SUBSCRIBE (a client of your own may take one only), each confirmed before
    // the next, the channel last: Redis never counts this connection as a receiver of an
    // invalidation before it can hear the confirmations. None sent once closed (close() has
    // unsubscribed, or is about to: a SUBSCRIBE after it would keep the channel).
    let subscribing: Promise<unknown> = Promise.resolve()
    for (const name of channels) {
      subscribing = subscribing.then(() => {
        if (closed) return
        const subscribed = Promise.resolve(subscriber.subscribe(name))
        if (name !== ackChannel) return subscribed
        // Refused (an ACL that lists the channels of a version before confirmations): this bus
        // goes on without them, waiting for none, rather than without its cache.
        return subscribed.then(
          () => void (acksHeard = true),
          (error: unknown) => {
            acksHeard = false
            if (!refusedReason(error)) throw error
            stopWaiting('Redis refused its confirmation channel')
            onConnectionError(
              new Error(`Redis refused SUBSCRIBE ${name} (${(error as Error).message}): this bus's publishes wait for no confirmation until it is allowed and the connection subscribes again (a reconnect; docs/stores.md, "Redis")`),
            )
          },
        )
      })
    }
    return subscribing.then(
      () => {
        subscribeFailed = false
        // Confirmed on a Cluster connection that has ended since: the next one's `ready`
        // subscribes again.
        if (moves !== movesBefore) return
        subscribedNow = true
        heard()
        setListening()
        follow()
        confirm()
      },
      (error: unknown) => {
        // Refused (an ACL without one of the channels, say) on a connection that stays up: no
        // confirmation reaches this bus until a later attempt succeeds.
        subscribeFailed = true
        stopWaiting('Redis refused its subscription')
        onConnectionError(error as Error)
      },
    )
  }
  // Whether the last attempt to subscribe failed (until a later one succeeds, or the connection
  // is lost and subscribed again on its `ready`), and whether the confirmation channel is
  // subscribed (not when Redis refused it).
  let subscribeFailed = false
  let acksHeard = false
  /**
   * Whether a confirmation can reach this bus now: subscribed to its confirmation channel (or
   * about to be: a connection that is ready, its subscription on its way) and not deaf. Not
   * while its subscriber connection is down, its subscription or its confirmation channel was
   * refused, or its channels are silent: a wait would only end in a report blaming receivers.
   */
  function confirmationsReach(): boolean {
    if (deaf) return false
    return subscribedNow ? acksHeard : !subscribeFailed && subscriber.status === 'ready'
  }
  function lost(): void {
    subscribedNow = false
    subscribeFailed = false
    setListening()
    // Confirmations sent while the connection is down are lost: publishes waiting for them stop.
    stopWaiting('its subscriber connection was lost')
  }
  // An ioredis Cluster moves its subscription to another node, unsaid, when the connection it
  // subscribed on ends (its node died or left): what was published in between is lost. So the
  // bus follows that connection itself, as it follows a single Redis's: its end is a lost
  // connection (listening off, the caches dropped), and the next one's `ready` a reconnect
  // (subscribed again, confirmed, listening). It is found through ioredis' internals (see
  // ClusterSubscription); a Cluster without them is reported, and then only the heartbeat
  // notices a subscription that moved, when the move takes long enough.
  const cluster = (subscriber as ClusterSubscription).isCluster === true ? (subscriber as ClusterSubscription) : undefined
  // Only a Cluster is followable.
  const followable = typeof cluster?.subscriber?.getInstance === 'function'
  let followed: EndingConnection | undefined
  let moves = 0
  function follow(): void {
    if (!cluster || closed) return
    const connection = subscribedConnection(cluster)
    if (connection === followed) return
    followed?.removeListener('end', moved)
    followed?.removeListener('ready', subscribe)
    followed = connection
    followed?.on('end', moved)
    followed?.on('ready', subscribe)
  }
  function moved(): void {
    moves++
    lost()
    // ioredis has picked the next connection by now (its own listener ran first); when it found
    // no node to pick, it picks one with the next node it finds (`+node`).
    follow()
  }
  // Should its `ready` go unseen all the same, a Cluster connection that is ready while the bus
  // is not subscribed is subscribed on at the next heartbeat, or at the first message it brings
  // (ioredis subscribes it on the bus's channels by itself): one attempt at a time.
  let retrying = false
  function resubscribe(): void {
    if (!cluster || closed || subscribedNow || retrying) return
    follow()
    if (followed?.status !== 'ready') return
    retrying = true
    void subscribe().finally(() => (retrying = false))
  }
  // `+node` is emitted before ioredis picks a connection with it: looked at just after.
  const nodeAdded = () => void queueMicrotask(follow)
  subscriber.on('message', onMessage)
  subscriber.on('ready', subscribe)
  subscriber.on('close', lost)
  subscriber.on('end', lost)
  if (followable) (subscriber as unknown as EventSource).on('+node', nodeAdded)
  if (cluster && !followable) {
    onError(
      new Error('This Redis Cluster client does not show which connection it subscribes on: a subscription it moves to another node goes unnoticed, and messages published meanwhile are lost with the cache kept'),
      'invalidation subscriber',
    )
  }
  // Stays attached after close: a connection without an error listener logs every error.
  if (!given) subscriber.on('error', onConnectionError)
  subscribe()

  // A publish refused unsent while the client said its connection was down is sent again by the
  // token service's rounds, whose backoff can put the next one seconds after the connection is
  // back: meanwhile the other instances, listening all along, serve the token from their caches.
  // So once the client is ready again the token service is told at once, as when this bus hears
  // again (`{ kind: 'all' }`, which starts a round). Each of an instance's connections reconnects
  // on its own backoff: this one may come back seconds after the subscriber (measured: a token
  // revoked meanwhile was accepted elsewhere 1.9 to 2.7 s after the connection was back).
  let refusedWhileDown = false
  const stopReadyWatch = onReady(options.client, () => {
    const refused = refusedWhileDown
    refusedWhileDown = false
    // Not listening: its `{ kind: 'all' }` comes once it hears again.
    if (refused && listening && !closed) deliver({ kind: 'all' })
  })
  const noteRefusal = (publishing: Promise<void>): Promise<void> =>
    publishing.catch((error: unknown) => {
      if (notReady(options.client)) refusedWhileDown = true
      throw error
    })

  return {
    channel,
    publishTimeoutMs: redis.timeoutMs,
    publish(message) {
      deliver(message)
      // `all` concerns this bus's own listeners; other instances judge their own connection.
      if (message.kind !== 'token') return Promise.resolve()
      // Sent even while the client's Redis is stalled (the breaker would refuse it unsent): a
      // revocation landing late is harmless, one never sent leaves the token in the other
      // instances' caches for their whole TTL. Its deadline still fails this call. Refused at
      // once, unsent, while the client says its connection is down, or is still connecting
      // after a command went unanswered (the
      // token service sends it again in rounds; in the offline queue each round would add one
      // more). Sent without an id (nobody confirms it) where no confirmation could reach this bus.
      if (!confirms || closed || !confirmationsReach()) {
        const wire: WireMessage = { origin, kind: message.kind, tokenHash: message.tokenHash }
        return noteRefusal(redis.sendAnyway('PUBLISH', channel, JSON.stringify(wire)).then(() => {}))
      }
      // Resolved once every connection that received it has confirmed (another bus once it
      // delivered it, on this bus's confirmation channel; this bus's own by receiving it back),
      // so a token revoked here is refused by every instance when this resolves, not a pub/sub
      // hop later; or `timeoutMs` after it was sent, whatever has confirmed (a receiver that
      // never confirms: a bus of a version before confirmations, a process that hangs, a
      // subscriber that is no bus), without failing the call.
      const began = performance.now()
      const id = randomUUID()
      const wire: WireMessage = { origin, kind: message.kind, tokenHash: message.tokenHash, id, direct: true }
      let done!: () => void
      const delivered = new Promise<void>((resolve) => (done = resolve))
      const entry: Awaiting = { got: 0, needed: Infinity, by: new Set<string>(), done }
      awaiting.set(id, entry)
      return noteRefusal(redis
        .sendAnyway('PUBLISH', channel, JSON.stringify(wire))
        .then((receivers) => {
          // Every connection subscribed to the channel, this bus's own among them when Redis
          // counted it (its message then comes back to it, which counts as its confirmation).
          entry.needed = typeof receivers === 'number' ? receivers : 0
          if (entry.got >= entry.needed) done()
          // The PUBLISH and the confirmations share one `timeoutMs`.
          return withTimeout(delivered, Math.max(0, redis.timeoutMs - (performance.now() - began)), 'confirmations').then(
            () => (entry.cut === undefined ? undefined : cutShort(entry.needed - entry.got, entry.needed, entry.cut)),
            () => unconfirmed(entry.needed - entry.got, entry.needed),
          )
        })
        .finally(() => awaiting.delete(id)))
    },
    subscribe(listener) {
      if (!closed) listeners.add(listener)
      return () => listeners.delete(listener)
    },
    get listening() {
      return listening && !closed
    },
    ready(timeoutMs = redis.timeoutMs) {
      if (closed) return Promise.reject(closedError())
      return withTimeout(Promise.race([subscribed, shutdown]), timeoutMs, `Redis SUBSCRIBE ${channel}`)
    },
    async close() {
      if (closed) return
      closed = true
      stopReadyWatch()
      shut(closedError())
      if (timer !== undefined) clearInterval(timer)
      listeners.clear()
      // Publishes waiting for confirmations stop waiting: none can arrive any more.
      stopWaiting('closed')
      subscriber.removeListener('message', onMessage)
      subscriber.removeListener('ready', subscribe)
      subscriber.removeListener('close', lost)
      subscriber.removeListener('end', lost)
      if (followable) (subscriber as unknown as EventSource).removeListener('+node', nodeAdded)
      followed?.removeListener('end', moved)
      followed?.removeListener('ready', subscribe)
      followed = undefined
      // The connection the bus opened is closed at once: it holds nothing worth waiting for.
      if (!given) return subscriber.disconnect()
      channelsOf(given).delete(channel)
      try {
        const results = await Promise.allSettled(
          channels.map((name) => withTimeout(Promise.resolve(given.unsubscribe(name)), redis.timeoutMs, 'Redis UNSUBSCRIBE')),
        )
        for (const result of results) if (result.status === 'rejected') throw result.reason
      } catch (error) {
        onError(error, 'invalidation unsubscribe')
      }
    },
  }
}
