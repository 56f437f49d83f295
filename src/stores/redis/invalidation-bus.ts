/**
 * Invalidations (rotations, revocations) broadcast to every instance over Redis pub/sub, so a
 * token that stopped working is dropped from every instance's token cache at once (DESIGN.md
 * "API tokens").
 * @module
 */
import { randomUUID } from 'node:crypto'
import type { InvalidationBus, InvalidationMessage } from '../../core/stores.js'
import { ConfigurationError, logError } from '../../errors.js'
import { withTimeout } from '../../timeout.js'
import { type RedisCommandClient, type RedisStoreOptions, type RedisSubscriberClient, connectRedis } from './client.js'

/** Options of {@link createRedisInvalidationBus}. */
export interface RedisInvalidationBusOptions extends RedisStoreOptions {
  /**
   * Publishes invalidations. Unless `subscriber` is given, the bus also opens its subscriber
   * connection with `client.duplicate()` (a connection in subscriber mode cannot send other
   * commands), and closes it in {@link RedisInvalidationBus.close}.
   */
  client: RedisCommandClient & { duplicate?(): RedisSubscriberClient }
  /**
   * A connection of your own to subscribe on, instead of a duplicate of `client`. The bus
   * listens on its channel only and, on close, unsubscribes from it and leaves the connection
   * open.
   */
  subscriber?: RedisSubscriberClient
  /**
   * Errors that fail no call: the subscriber connection's errors, a failed subscription
   * (retried when the connection is ready again), a malformed message, a listener that threw.
   * Default: `logError` (one line on stderr).
   */
  onError?: (error: unknown, context: string) => void
}

/** The Redis invalidation bus: an {@link InvalidationBus} that can be awaited and closed. */
export interface RedisInvalidationBus extends InvalidationBus {
  /** The pub/sub channel: `<prefix>invalidations`. */
  readonly channel: string
  /**
   * Resolves once Redis confirmed the subscription (messages published before it are not
   * received); rejects after `timeoutMs` (the option) without it. Await it before serving.
   */
  ready(timeoutMs?: number): Promise<void>
  /** Stops delivering; disconnects the subscriber connection the bus opened, or unsubscribes a given one. Idempotent. */
  close(): Promise<void>
}

/** What goes over the channel: the message, and which bus sent it. */
interface WireMessage {
  readonly origin: string
  readonly kind: 'token'
  readonly tokenHash: string
}

function parseWire(text: string): WireMessage | undefined {
  try {
    const value = JSON.parse(text) as Partial<WireMessage> | null
    if (typeof value?.origin === 'string' && value.kind === 'token' && typeof value.tokenHash === 'string') {
      return value as WireMessage
    }
  } catch {
    // reported by the caller
  }
  return undefined
}

/**
 * An invalidation bus over Redis pub/sub, one per token service. `publish` delivers to this
 * bus's own listeners at once (as the in-process bus does) and sends one `PUBLISH` to
 * `<prefix>invalidations` (under the `timeoutMs` deadline); every other bus on that channel
 * delivers it to its listeners when it arrives (its own messages coming back are skipped).
 * Pass it as the token service's `invalidations`, with a `cacheTtlMs` above 0: a revoked or
 * rotated token is then refused by every instance as soon as the message lands, well inside
 * the cache TTL.
 *
 * Pub/sub delivers to whoever is subscribed at that moment: a bus whose subscriber
 * connection is down misses what was published meanwhile (it resubscribes when the
 * connection is ready again), and for those tokens the cache TTL bounds how long a stale
 * record may be trusted (DESIGN.md: within the cache TTL, at most 10 minutes).
 *
 * @example
 * ```ts
 * import { Redis } from 'ioredis'
 * import { createRedisInvalidationBus } from 'mcp-dispatch/redis'
 *
 * const redis = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: 1 })
 * const invalidations = createRedisInvalidationBus({ client: redis })
 * await invalidations.ready()
 * const tokens = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations })
 * // on shutdown: await tokens.close(); await invalidations.close(); await redis.quit()
 * ```
 */
export function createRedisInvalidationBus(options: RedisInvalidationBusOptions): RedisInvalidationBus {
  const redis = connectRedis(options)
  const onError = options.onError ?? logError
  if (typeof onError !== 'function') throw new ConfigurationError('onError', 'must be a function')
  const given = options.subscriber
  const methods = ['subscribe', 'unsubscribe', 'on', 'removeListener'] as const
  if (given !== undefined && !methods.every((name) => typeof given?.[name] === 'function')) {
    throw new ConfigurationError('subscriber', `must be a Redis connection with ${methods.join('(), ')}() (ioredis)`)
  }
  if (given === undefined && typeof options.client.duplicate !== 'function') {
    throw new ConfigurationError('subscriber', 'is required when the client has no duplicate() method')
  }
  const subscriber = given ?? options.client.duplicate!()
  const channel = `${redis.prefix}invalidations`
  const origin = randomUUID()
  const listeners = new Set<(message: InvalidationMessage) => void>()
  let closed = false
  let confirm!: () => void
  const subscribed = new Promise<void>((resolve) => (confirm = resolve))

  function deliver(message: InvalidationMessage): void {
    for (const listener of [...listeners]) {
      try {
        listener(message)
      } catch (error) {
        onError(error, 'invalidation listener')
      }
    }
  }
  function onMessage(from: string, text: string): void {
    if (closed || from !== channel) return
    const wire = parseWire(text)
    if (!wire) return onError(new Error('Malformed invalidation message'), 'invalidation message')
    if (wire.origin !== origin) deliver({ kind: wire.kind, tokenHash: wire.tokenHash })
  }
  function onConnectionError(error: Error): void {
    if (!closed) onError(error, 'invalidation subscriber')
  }
  // Whether messages from other instances can arrive now: false from creation until Redis
  // confirms the subscription, and from a lost connection until it confirms it again. While
  // false the token service serves nothing from its cache; each change of state also drops
  // every cached record, since messages published meanwhile were lost.
  let listening = false
  function setListening(now: boolean): void {
    if (listening === now || closed) return
    listening = now
    deliver({ kind: 'all' })
  }
  // On creation, and again whenever the connection is ready (after a failed first attempt,
  // or a reconnect when the client does not resubscribe by itself); a repeat is harmless.
  function subscribe(): void {
    if (closed) return
    Promise.resolve()
      .then(() => subscriber.subscribe(channel))
      .then(
        () => {
          setListening(true)
          confirm()
        },
        (error: unknown) => onConnectionError(error as Error),
      )
  }
  function lost(): void {
    setListening(false)
  }
  subscriber.on('message', onMessage)
  subscriber.on('ready', subscribe)
  subscriber.on('close', lost)
  subscriber.on('end', lost)
  // Stays attached after close: a connection without an error listener logs every error.
  if (!given) subscriber.on('error', onConnectionError)
  subscribe()

  return {
    channel,
    publish(message) {
      deliver(message)
      // `all` concerns this bus's own listeners; other instances judge their own connection.
      if (message.kind !== 'token') return Promise.resolve()
      const wire: WireMessage = { origin, kind: message.kind, tokenHash: message.tokenHash }
      return redis.send('PUBLISH', channel, JSON.stringify(wire)).then(() => {})
    },
    subscribe(listener) {
      if (!closed) listeners.add(listener)
      return () => listeners.delete(listener)
    },
    get listening() {
      return listening && !closed
    },
    ready(timeoutMs = redis.timeoutMs) {
      return withTimeout(subscribed, timeoutMs, `Redis SUBSCRIBE ${channel}`)
    },
    async close() {
      if (closed) return
      closed = true
      listeners.clear()
      subscriber.removeListener('message', onMessage)
      subscriber.removeListener('ready', subscribe)
      subscriber.removeListener('close', lost)
      subscriber.removeListener('end', lost)
      // The connection the bus opened is closed at once: it holds nothing worth waiting for.
      if (!given) return subscriber.disconnect()
      try {
        await withTimeout(Promise.resolve(given.unsubscribe(channel)), redis.timeoutMs, 'Redis UNSUBSCRIBE')
      } catch (error) {
        onError(error, 'invalidation unsubscribe')
      }
    },
  }
}
