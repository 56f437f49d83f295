/**
 * The Redis stores against a real Redis (test/helpers/redis.ts): the shared conformance
 * suites, then what only Redis does: key layout and TTLs (read back with PTTL, since expiry
 * follows the server's clock and no test sleeps), round trips per call, the script-cache
 * fallback, the local cache in front of the validation cache, pub/sub between buses, option
 * checks, and calls that give up on a Redis that does not answer.
 */
import { EventEmitter, once } from 'node:events'
import { inspect } from 'node:util'
import { type AddressInfo, type Socket, connect, createServer as createNetServer } from 'node:net'
import type { Cluster, Redis, RedisOptions } from 'ioredis'
import type { Cluster as Cluster5, Redis as Redis5 } from 'ioredis5'
import {
  ConfigurationError,
  type InvalidationMessage,
  type SessionPin,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import {
  type RedisArgument,
  type RedisClient,
  type RedisCommandClient,
  type RedisInvalidationBus,
  DEFAULT_REDIS_PREFIX,
  createRedisCacheStore,
  createRedisInvalidationBus,
  createRedisRateLimitStore,
  createRedisSessionStore,
} from 'mcp-dispatch/redis'
import { createClient } from 'redis'
import { describe, expect, expectTypeOf, it, vi } from 'vitest'
import { underProjectCI } from '../helpers/ci.js'
import { IOREDIS, REDIS_URL, describeRedis, holdConnection, nextInvalidation, redisAvailable, redisServerMissing, startPrivateRedis } from '../helpers/redis.js'
import { activeResources, leakedHandles, settles } from '../robustness/support.js'
import {
  countingTokenStore,
  createTestClock,
  describeCacheStoreConformance,
  describeInvalidationBusConformance,
  describeRateLimitStoreConformance,
  describeSessionStoreConformance,
} from './conformance.js'

const baseline = activeResources()
/** Why the test of a server that lost its scripts cannot start a Redis of its own, or `undefined`. */
const noRedisServer = redisServerMissing()

/**
 * For a test that starts a Redis of its own (startPrivateRedis): skipped, saying so, without
 * `redis-server`; failed instead under .ci/run, which provides it.
 */
function needsRedisServer(context: { skip(): void }, test: string): void {
  if (noRedisServer === undefined) return
  if (underProjectCI()) throw new Error(`redis-server is required under .ci/run (MCP_DISPATCH_CI): ${noRedisServer}`)
  console.warn(`[redis tests] the ${test} test is skipped: ${noRedisServer}; install Redis (apt-get install redis-server)`)
  context.skip()
}
const PIN: SessionPin = { appId: 'app_1', version: '1.2.3', subject: 'user_1' }
const W = 60_000
const START = 1_700_000_040_000 - (1_700_000_040_000 % W)

/** A client that records the commands it sends to the real one: round trips, counted. */
function recording(client: Redis): RedisCommandClient & { commands: string[] } {
  const commands: string[] = []
  return {
    commands,
    call: (command, ...args) => {
      commands.push(command)
      return client.call(command, ...args)
    },
  }
}

/** The next turn of the event loop, once this process has read what waits on its sockets. */
const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve))
/** Holds this process's event loop for `ms` (a long GC, a burst of work): nothing else runs meanwhile. */
function holdThisProcess(ms: number): void {
  const until = performance.now() + ms
  while (performance.now() < until) {
    // busy
  }
}

/** Every promise, settled: the message of each rejection, or `fulfilled`. */
async function outcomes(calls: readonly unknown[]): Promise<string[]> {
  const settled = await Promise.allSettled(calls)
  return settled.map((r) => (r.status === 'rejected' ? String((r.reason as Error).message) : 'fulfilled'))
}

/**
 * What two token services on one store need: Alice subscribed to `app_w`, and an `onError`
 * that keeps `<context>: <message>` lines in `errors`.
 */
function tokenWorld() {
  const errors: string[] = []
  return {
    apps: createMemoryAppStore([{ id: 'app_w', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }]),
    subscriptions: createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_w', active: true }]),
    store: createMemoryTokenStore(),
    errors,
    onError: (error: unknown, context: string) => void errors.push(`${context}: ${(error as Error).message}`),
  }
}

describeRedis('Redis stores: conformance', (redis) => {
  const closeBus = (bus: unknown) => (bus as RedisInvalidationBus).close()
  describeSessionStoreConformance('redis', () => createRedisSessionStore({ client: redis.client, prefix: redis.prefix() }), {
    injectableClock: false,
  })
  // Counters are judged by Redis's own clock (their PTTL): the case of a clock that steps back is a test of its own below.
  describeRateLimitStoreConformance('redis', () => createRedisRateLimitStore({ client: redis.client, prefix: redis.prefix() }), {
    injectableClock: false,
  })
  describeCacheStoreConformance(
    'redis (local cache in front)',
    ({ now }) => createRedisCacheStore({ client: redis.client, prefix: redis.prefix(), now }),
    { injectableClock: false },
  )
  describeCacheStoreConformance(
    'redis (no local cache)',
    () => createRedisCacheStore({ client: redis.client, prefix: redis.prefix(), localTtlMs: 0 }),
    { injectableClock: false },
  )
  describeInvalidationBusConformance(
    'redis',
    async () => {
      const bus = createRedisInvalidationBus({ client: redis.client, prefix: redis.prefix() })
      // A new connection subscribing: given more than the 1 s default deadline on a loaded machine.
      await bus.ready(5_000)
      return bus
    },
    { teardown: closeBus },
  )
})

describe('ioredis clients as the stores take them', () => {
  it('an ioredis 6 or ioredis 5 instance, or a Cluster of either, is a RedisClient as it is (checked by tsc)', () => {
    expectTypeOf<Redis>().toExtend<RedisClient>()
    expectTypeOf<Cluster>().toExtend<RedisClient>()
    expectTypeOf<Redis5>().toExtend<RedisClient>()
    expectTypeOf<Cluster5>().toExtend<RedisClient>()
  })
})

describeRedis('Redis stores: what only Redis does', (redis) => {
  it('an ioredis instance is a RedisClient as it is', () => {
    const client: RedisClient = redis.client
    expect(typeof client.duplicate).toBe('function')
  })

  it('a command Redis refuses: the error reaches the caller without its arguments (keys and values hold token hashes that a logger of whole errors would write)', async () => {
    const { inspect } = await import('node:util')
    const prefix = redis.prefix()
    const key = 'c'.repeat(43) // as a token's SHA-256 in base64url: the OAuth cache's key
    const cache = createRedisCacheStore({ client: redis.client, prefix, localTtlMs: 0 })
    await redis.client.rpush(`${prefix}cache:${key}`, 'a list, not a cached value') // WRONGTYPE for GET
    let refused: unknown
    await (cache.get(key) as Promise<unknown>).catch((error: unknown) => (refused = error))
    expect(String((refused as Error).message)).toContain('WRONGTYPE')
    expect((refused as { command?: unknown }).command).toEqual({ name: 'EVALSHA' })
    expect(inspect(refused, { depth: 5 })).not.toContain(key)
    await redis.client.del(`${prefix}cache:${key}`)
  })

  describe('session pins', () => {
    it('live under <prefix>session:<id> as JSON, with the idle TTL in Redis', async () => {
      const prefix = redis.prefix()
      const sessions = createRedisSessionStore({ client: redis.client, prefix })
      // Ten seconds: read back before it runs out, even after a stall of this process.
      await sessions.set('s1', PIN, 10_000)
      expect(JSON.parse((await redis.client.get(`${prefix}session:s1`))!)).toEqual({ ...PIN, w: expect.stringMatching(/^[\w-]{12}$/) })
      const ttl = await redis.client.pttl(`${prefix}session:s1`)
      expect(ttl).toBeGreaterThan(0)
      expect(ttl).toBeLessThanOrEqual(10_000)
      expect(await redis.keys()).toContain(`${prefix}session:s1`)
    })

    it('get restarts the idle TTL in the same round trip (GETEX)', async () => {
      const prefix = redis.prefix()
      const client = recording(redis.client)
      const sessions = createRedisSessionStore({ client, prefix })
      await sessions.set('s1', PIN, 10_000)
      client.commands.length = 0
      expect(await sessions.get('s1', 600_000)).toEqual(PIN)
      expect(client.commands).toEqual(['GETEX'])
      expect(await redis.client.pttl(`${prefix}session:s1`)).toBeGreaterThan(590_000)
    })

    it('get of an unknown session writes nothing; delete removes the key', async () => {
      const prefix = redis.prefix()
      const sessions = createRedisSessionStore({ client: redis.client, prefix })
      expect(await sessions.get('nobody', 60_000)).toBeUndefined()
      await sessions.set('s1', PIN, 60_000)
      await sessions.delete('s1')
      expect(await redis.client.exists(`${prefix}session:nobody`, `${prefix}session:s1`)).toBe(0)
    })

    it('a value that is not a pin is refused loudly (another writer under the prefix), not served', async () => {
      const prefix = redis.prefix()
      await redis.client.set(`${prefix}session:s1`, '{"appId":"app_1"}')
      await redis.client.set(`${prefix}session:s2`, 'not json')
      await redis.client.set(`${prefix}session:s3`, '{"appId":"app_1","version":"1.0.0"}')
      await redis.client.set(`${prefix}session:s4`, '{"appId":"app_1","subject":"user_1"}')
      const sessions = createRedisSessionStore({ client: redis.client, prefix })
      await expect(sessions.get('s1', 60_000)).rejects.toThrow(/not a session pin/)
      await expect(sessions.get('s3', 60_000), 'no subject').rejects.toThrow(/not a session pin/)
      await expect(sessions.get('s4', 60_000), 'no version').rejects.toThrow(/not a session pin/)
      await expect(sessions.get('s2', 60_000)).rejects.toThrow(SyntaxError)
    })

    it('keeps only the pin fields', async () => {
      const prefix = redis.prefix()
      const sessions = createRedisSessionStore({ client: redis.client, prefix })
      await sessions.set('s1', { ...PIN, extra: 'dropped' } as SessionPin, 60_000)
      expect(await sessions.get('s1', 60_000)).toEqual(PIN)
    })

    it('a pin write that reached Redis but whose answer was lost with the connection is resent by ioredis and answers true, its own pin (regression: false, reported as a session id taken)', async () => {
      const upstream = new URL(REDIS_URL)
      let dropAfter: string | undefined
      const sockets = new Set<Socket>()
      // A proxy that, once armed, passes a command naming `dropAfter` on to Redis and then cuts
      // the client's connection before Redis's answer reaches it.
      const proxy = createNetServer((downstream) => {
        const toRedis = connect(Number(upstream.port || 6379), upstream.hostname)
        let answering = true
        for (const socket of [downstream, toRedis]) {
          sockets.add(socket)
          socket.on('error', () => {})
          socket.on('close', () => (sockets.delete(socket), downstream.destroy(), toRedis.destroy()))
        }
        downstream.on('data', (chunk: Buffer) => {
          toRedis.write(chunk)
          if (dropAfter !== undefined && chunk.toString('latin1').includes(dropAfter)) {
            dropAfter = undefined
            answering = false
            setTimeout(() => downstream.destroy(), 100)
          }
        })
        toRedis.on('data', (chunk: Buffer) => void (answering && downstream.write(chunk)))
      })
      await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve))
      try {
        // disconnectTimeout: disconnected twice (here, and after the suite), ioredis would wait 2 s on a timer.
        const client = redis.connect({ retryStrategy: () => 10, disconnectTimeout: 10 }, `redis://127.0.0.1:${(proxy.address() as AddressInfo).port}`)
        client.on('error', () => {})
        const prefix = redis.prefix()
        const sessions = createRedisSessionStore({ client, prefix, timeoutMs: 5_000 })
        expect(await sessions.set('warm', PIN, 60_000)).toBe(true) // the script is known to Redis
        dropAfter = `${prefix}session:resent`
        expect(await sessions.set('resent', PIN, 60_000)).toBe(true)
        expect(await sessions.get('resent', 60_000)).toEqual(PIN)
        // Another pin under the id is still refused, the stored one kept; the same pin written
        // again (a handler that gave one id twice) too, as every store refuses it.
        expect(await sessions.set('resent', { ...PIN, version: '9.9.9' }, 60_000)).toBe(false)
        expect(await sessions.set('resent', PIN, 60_000)).toBe(false)
        expect(await sessions.get('resent', 60_000)).toEqual(PIN)
        client.disconnect()
      } finally {
        for (const socket of sockets) socket.destroy()
        await new Promise<void>((resolve) => proxy.close(() => resolve()))
      }
    })

    it('a client that gives integers as strings (ioredis stringNumbers) stores new pins as new (regression of the script: every new session taken for an id in use)', async () => {
      const client = redis.connect({ stringNumbers: true })
      const sessions = createRedisSessionStore({ client, prefix: redis.prefix() })
      expect(await sessions.set('s1', PIN, 60_000)).toBe(true)
      expect(await sessions.set('s1', PIN, 60_000)).toBe(false)
    })

    it('are not synchronous (adapters hold the response until the pin is written)', () => {
      expect(createRedisSessionStore({ client: redis.client }).synchronous).toBeFalsy()
    })
  })

  it('a single Redis that is a replica refuses each write READONLY: the call fails with it, sent once (a cluster sends it again: test/stores/redis-cluster.test.ts)', async (context) => {
    needsRedisServer(context, 'READONLY')
    // A replica of a master that is not there: it answers reads, and refuses writes READONLY.
    const closed = createNetServer()
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve))
    const { port } = closed.address() as AddressInfo
    await new Promise<void>((resolve) => closed.close(() => resolve()))
    const server = await startPrivateRedis(['--replicaof', '127.0.0.1', String(port)])
    const connection = new IOREDIS[redis.kind]({ path: server.path })
    try {
      await connection.ping()
      const client = recording(connection)
      const counters = createRedisRateLimitStore({ client, prefix: redis.prefix() })
      const sessions = createRedisSessionStore({ client, prefix: redis.prefix() })
      // (A script's refusal starts with READONLY on Redis 7; Redis 6.2 puts it inside its ERR.)
      await expect(counters.increment('k', START, W)).rejects.toThrow(/READONLY You can't write against a read only replica/)
      await expect(sessions.get('s', 60_000)).rejects.toThrow(/^READONLY /)
      // Each sent once: EVALSHA (refused NOSCRIPT: the script was never loaded there), EVAL
      // (run until its first write, refused there), and the GETEX.
      expect(client.commands).toEqual(['EVALSHA', 'EVAL', 'GETEX'])
    } finally {
      connection.disconnect()
      await server.stop()
    }
  })

  describe('rate-limit counters', () => {
    it('stores add one ready listener between them, kept for the reconnects (regression: one each, MaxListenersExceededWarning at twelve)', async () => {
      const client = redis.connect({ lazyConnect: true })
      const before = client.listenerCount('ready')
      const warnings: string[] = []
      const warned = (warning: Error) => void warnings.push(warning.name)
      process.on('warning', warned)
      try {
        const prefix = redis.prefix()
        const stores = Array.from({ length: 12 }, () => createRedisRateLimitStore({ client, prefix }))
        expect(client.listenerCount('ready') - before).toBe(1)
        await client.connect()
        expect(client.listenerCount('ready') - before).toBe(1)
        // Each store still counts, and still knows the client was ready.
        for (const [i, store] of stores.entries()) expect(await store.increment('k', START, W)).toBe(i + 1)
        await new Promise((resolve) => setImmediate(resolve))
        expect(warnings).not.toContain('MaxListenersExceededWarning')
      } finally {
        process.removeListener('warning', warned)
      }
    })

    it('one round trip per increment: EVALSHA, and EVAL once more when the server lost its scripts', async (context) => {
      // The scripts are flushed on a Redis of this test's own: a SCRIPT FLUSH on the shared one
      // would cost the test files running alongside a NOSCRIPT and an EVAL within their deadlines.
      needsRedisServer(context, 'script-cache')
      const server = await startPrivateRedis()
      // Not one of the suite's clients: disconnected here, before its server ends.
      const connection = new IOREDIS[redis.kind]({ path: server.path })
      try {
        // Connected first: the first call is no connection and ready check within the deadline.
        await connection.ping()
        const client = recording(connection)
        const counters = createRedisRateLimitStore({ client, prefix: redis.prefix() })
        await counters.increment('warm', START, W)
        client.commands.length = 0
        for (let i = 0; i < 5; i++) await counters.increment('k', START, W)
        expect(client.commands).toEqual(['EVALSHA', 'EVALSHA', 'EVALSHA', 'EVALSHA', 'EVALSHA'])

        await connection.script('FLUSH')
        client.commands.length = 0
        expect(await counters.increment('k', START, W)).toBe(6)
        expect(await counters.increment('k', START, W)).toBe(7)
        expect(client.commands).toEqual(['EVALSHA', 'EVAL', 'EVALSHA'])
      } finally {
        connection.disconnect()
        await server.stop()
      }
    })

    it('a counter is one hash under <prefix>rl:<key>, expiring one window and a minute after its window\'s first request', async () => {
      const prefix = redis.prefix()
      const counters = createRedisRateLimitStore({ client: redis.client, prefix })
      await counters.increment('user:app', START, W)
      await counters.increment('user:app', START, W)
      expect(await redis.client.hgetall(`${prefix}rl:user:app`)).toEqual({ w: String(START), c: '2' })
      const ttl = await redis.client.pttl(`${prefix}rl:user:app`)
      expect(ttl).toBeGreaterThan(W + 60_000 - 5_000)
      expect(ttl).toBeLessThanOrEqual(W + 60_000)
      // The next window, beside the one it replaced (for that one's late requests).
      await counters.increment('user:app', START + W, W)
      expect(await redis.client.hgetall(`${prefix}rl:user:app`)).toEqual({ w: String(START + W), c: '1', nw: String(START), nc: '2' })
      // An hour's counter lives an hour and a minute.
      await counters.increment('hourly', START, 3_600_000)
      const hourly = await redis.client.pttl(`${prefix}rl:hourly`)
      expect(hourly).toBeGreaterThan(3_660_000 - 5_000)
      expect(hourly).toBeLessThanOrEqual(3_660_000)
    })

    it('a request stamped in a window that reaches Redis more than one window after the window\'s first request still counts against it', async () => {
      const counters = createRedisRateLimitStore({ client: redis.client, prefix: redis.prefix() })
      const window = 1_000
      expect(await counters.increment('k', START, window)).toBe(1)
      expect(await counters.increment('k', START, window)).toBe(2)
      // A request stamped at the window's tail, held past one window (a busy event loop): it
      // counts on, where a counter gone after one window started again at 1 and was served.
      await new Promise((resolve) => setTimeout(resolve, window + 150))
      expect(await counters.increment('k', START, window)).toBe(3)
      // The next window starts again at 1.
      expect(await counters.increment('k', START + window, window)).toBe(1)
    })

    it('a counter started by a clock that ran fast refuses the others for one window of Redis time, not for its grace, then starts again', async () => {
      const counters = createRedisRateLimitStore({ client: redis.client, prefix: redis.prefix() })
      // The four counts below must land within one window of the first (judged by its PTTL): a
      // second leaves room for a loaded machine.
      const window = 1_000
      // An instance an hour fast counts; the others, behind it, count against its window…
      for (let i = 0; i < 3; i++) await counters.increment('k', START + 9_000 * window, window)
      expect(await counters.increment('k', START, window)).toEqual({ count: 4, windowStart: START + 9_000 * window })
      // …for no longer than one window of real time (its TTL, a minute more, is for requests of
      // its own window that reach Redis late).
      await new Promise((resolve) => setTimeout(resolve, window + 100))
      expect(await counters.increment('k', START, window)).toBe(1)
    })

    it('past its first window, a counter an older window replaced keeps its count aside: a late request of its window counts on there, as does its instance back within it; a newer window sets aside the one it replaces instead', async () => {
      const counters = createRedisRateLimitStore({ client: redis.client, prefix: redis.prefix() })
      const window = 1_000
      expect(await counters.increment('k', START + window, window)).toBe(1)
      expect(await counters.increment('k', START + window, window)).toBe(2)
      await new Promise((resolve) => setTimeout(resolve, window + 100))
      // An instance a window behind, once the counter is a window old: its own window, from 1.
      expect(await counters.increment('k', START, window)).toBe(1)
      // A late request of the window it replaced counts on in that window (regression: it
      // started it again at 1, and was served past the limit).
      expect(await counters.increment('k', START + window, window)).toBe(3)
      expect(await counters.increment('k', START, window)).toBe(2)
      // A newer window starts again, and sets aside the window it replaced (START), not the other.
      expect(await counters.increment('k', START + 2 * window, window)).toBe(1)
      expect(await counters.increment('k', START, window)).toBe(3)
      expect(await counters.increment('k', START + window, window)).toEqual({ count: 2, windowStart: START + 2 * window })
    })

    it('a late request of the window a newer one replaced counts on in its own window, while the newer counter is young and once it is a window old (regression: counted against the newer window, then its own started again at 1 and was served past the limit)', async () => {
      const counters = createRedisRateLimitStore({ client: redis.client, prefix: redis.prefix() })
      const window = 1_000
      for (let count = 1; count <= 3; count++) expect(await counters.increment('k', START, window)).toBe(count)
      expect(await counters.increment('k', START + window, window)).toBe(1)
      // Requests of the first window that reach Redis late, held in a busy process.
      expect(await counters.increment('k', START, window)).toBe(4)
      await new Promise((resolve) => setTimeout(resolve, window + 100))
      expect(await counters.increment('k', START, window)).toBe(5)
      expect(await counters.increment('k', START + window, window)).toBe(2)
    })

    it('a window start that is no whole epoch milliseconds is refused before anything is sent (a script given none would count on a key without a TTL)', async () => {
      const client = recording(redis.client)
      const counters = createRedisRateLimitStore({ client, prefix: redis.prefix() })
      for (const start of [Number.NaN, 1.5, Number.POSITIVE_INFINITY, '1' as unknown as number, undefined as unknown as number]) {
        await expect(counters.increment('k', start, W)).rejects.toThrow(RangeError)
      }
      expect(client.commands).toEqual([])
    })

    it('a counter something else wrote under its key (a count below 1 or past 2^53, a window that is no whole ms) rejects the call: never taken as a count', async () => {
      const prefix = redis.prefix()
      const counters = createRedisRateLimitStore({ client: redis.client, prefix })
      await redis.client.hset(`${prefix}rl:low`, { w: String(START), c: '-5' })
      await redis.client.hset(`${prefix}rl:high`, { w: String(START), c: '9007199254740993' })
      await redis.client.hset(`${prefix}rl:window`, { w: '1e300', c: '1' })
      await redis.client.pexpire(`${prefix}rl:window`, 3_600_000)
      await expect(counters.increment('low', START, W)).rejects.toThrow('Redis rate-limit script answered -4')
      await expect(counters.increment('high', START, W)).rejects.toThrow(/^Redis rate-limit script answered 900719925474099\d$/)
      await expect(counters.increment('window', START, W)).rejects.toThrow('Redis rate-limit script answered window 1e300')
    })

    it('instances sharing a prefix share the budget; another prefix has its own', async () => {
      const prefix = redis.prefix()
      const a = createRedisRateLimitStore({ client: redis.client, prefix })
      // A fresh client connected first, with no deadline (a loaded machine's first connection
      // can take longer than the store's).
      const other = redis.connect()
      await other.ping()
      const b = createRedisRateLimitStore({ client: other, prefix })
      const elsewhere = createRedisRateLimitStore({ client: redis.client, prefix: redis.prefix() })
      expect(await a.increment('k', START, W)).toBe(1)
      expect(await b.increment('k', START, W)).toBe(2)
      expect(await a.increment('k', START, W)).toBe(3)
      expect(await elsewhere.increment('k', START, W)).toBe(1)
    })
  })

  describe('validation cache', () => {
    it('serves a value from the local cache without a round trip, until the local TTL runs out', async () => {
      const clock = createTestClock()
      const client = recording(redis.client)
      const cache = createRedisCacheStore<{ n: number }>({ client, prefix: redis.prefix(), now: clock.now, localTtlMs: 5_000 })
      await cache.get('warm') // the read script is known to the server from here on
      await cache.set('k', { n: 1 }, 300_000)
      client.commands.length = 0
      for (let i = 0; i < 3; i++) expect(await cache.get('k')).toEqual({ n: 1 })
      expect(client.commands).toEqual([])
      clock.advance(5_001)
      expect(await cache.get('k')).toEqual({ n: 1 })
      expect(await cache.get('k')).toEqual({ n: 1 })
      expect(client.commands).toEqual(['EVALSHA'])
    })

    it('the trade-off: a delete on one instance reaches the local copy of another when it runs out', async () => {
      const prefix = redis.prefix()
      const clock = createTestClock()
      const a = createRedisCacheStore<{ n: number }>({ client: redis.client, prefix, now: clock.now })
      const other = redis.connect()
      await other.ping() // connected first, with no deadline
      const b = createRedisCacheStore<{ n: number }>({ client: other, prefix, now: clock.now, localTtlMs: 2_000 })
      await a.set('k', { n: 1 }, 300_000)
      expect(await b.get('k')).toEqual({ n: 1 })
      await a.delete('k')
      expect(await a.get('k')).toBeUndefined()
      expect(await b.get('k')).toEqual({ n: 1 })
      clock.advance(2_001)
      expect(await b.get('k')).toBeUndefined()
    })

    it('a local copy never outlives the value in Redis (its remaining TTL is read with it)', async () => {
      const prefix = redis.prefix()
      const clock = createTestClock()
      const a = createRedisCacheStore<{ n: number }>({ client: redis.client, prefix })
      const client = recording(redis.client)
      const b = createRedisCacheStore<{ n: number }>({ client, prefix, now: clock.now, localTtlMs: 60_000 })
      await b.get('warm')
      client.commands.length = 0
      // The local copy lives the TTL Redis reads back, less the real time since the set: 30 s
      // leaves 10 s of it for the second read below to come from the local copy.
      await a.set('k', { n: 1 }, 30_000)
      expect(await b.get('k')).toEqual({ n: 1 })
      clock.advance(20_000)
      expect(await b.get('k')).toEqual({ n: 1 })
      expect(client.commands).toHaveLength(1)
      clock.advance(10_001)
      await b.get('k')
      expect(client.commands).toHaveLength(2)
    })

    it('stores JSON under <prefix>cache:<key> with the TTL; later changes to the caller’s object change nothing', async () => {
      const prefix = redis.prefix()
      const cache = createRedisCacheStore<{ list: number[] }>({ client: redis.client, prefix })
      const value = { list: [1] }
      await cache.set('oauth:abc', value, 60_000)
      value.list.push(2)
      expect(await cache.get('oauth:abc')).toEqual({ list: [1] })
      expect(await redis.client.get(`${prefix}cache:oauth:abc`)).toBe('{"list":[1]}')
      const ttl = await redis.client.pttl(`${prefix}cache:oauth:abc`)
      expect(ttl).toBeGreaterThan(50_000)
      expect(ttl).toBeLessThanOrEqual(60_000)
    })

    it('writes of other keys never keep a key out of the local cache: made-up tokens each storing a refusal cost a busy token nothing (regression: one Redis read per request)', async () => {
      const prefix = redis.prefix()
      const client = recording(redis.client)
      const cache = createRedisCacheStore<{ n: number }>({ client, prefix })
      await cache.get('warm')
      await cache.set('hot', { n: 1 }, 60_000)
      // The read of `hot` goes out while writes of other keys are in flight and land first.
      const fresh = createRedisCacheStore<{ n: number }>({ client, prefix })
      client.commands.length = 0
      for (let round = 0; round < 5; round++) {
        const reading = fresh.get('hot')
        const writes = Array.from({ length: 3 }, (_, i) => fresh.set(`refused-${round}-${i}`, { n: 0 }, 60_000))
        expect(await reading).toEqual({ n: 1 })
        await Promise.all(writes)
      }
      // One read of `hot` from Redis, then the local copy; the writes, one SET each.
      expect(client.commands.filter((command) => command !== 'SET')).toEqual(['EVALSHA'])
    })

    it('a read that lands after a delete does not put the old value back in the local cache', async () => {
      const prefix = redis.prefix()
      const cache = createRedisCacheStore<{ n: number }>({ client: redis.client, prefix })
      await cache.get('warm') // the script is known to the server: the read is one command, sent before the delete
      await createRedisCacheStore<{ n: number }>({ client: redis.client, prefix, localTtlMs: 0 }).set('k', { n: 1 }, 60_000)
      const reading = cache.get('k')
      await cache.delete('k')
      expect(await reading).toEqual({ n: 1 })
      expect(await cache.get('k')).toBeUndefined()
    })

    it('a read made while a set of its key is in flight does not answer the value that set replaces', async () => {
      const cache = createRedisCacheStore<{ n: number }>({ client: redis.client, prefix: redis.prefix() })
      await cache.set('k', { n: 1 }, 60_000)
      expect(await cache.get('k')).toEqual({ n: 1 })
      const writing = cache.set('k', { n: 2 }, 60_000)
      // Sent after the SET, on the same connection.
      expect(await cache.get('k')).toEqual({ n: 2 })
      await writing
    })

    it('a value Redis holds without a TTL (written by something else) is kept locally for localTtlMs', async () => {
      const prefix = redis.prefix()
      const clock = createTestClock()
      const client = recording(redis.client)
      const cache = createRedisCacheStore<{ n: number }>({ client, prefix, now: clock.now, localTtlMs: 5_000 })
      await cache.get('warm')
      await redis.client.set(`${prefix}cache:k`, '{"n":1}')
      client.commands.length = 0
      expect(await cache.get('k')).toEqual({ n: 1 })
      expect(await cache.get('k')).toEqual({ n: 1 })
      expect(client.commands).toEqual(['EVALSHA'])
      clock.advance(5_001)
      expect(await cache.get('k')).toEqual({ n: 1 })
      expect(client.commands).toEqual(['EVALSHA', 'EVALSHA'])
    })

    it('a value Redis answers with no time left (PTTL 0) is not kept locally: lru-cache would keep a TTL of 0 for ever', async () => {
      const commands: string[] = []
      const client: RedisCommandClient = {
        call: async (command) => {
          commands.push(command)
          return ['{"n":1}', 0]
        },
      }
      const cache = createRedisCacheStore<{ n: number }>({ client, prefix: redis.prefix() })
      expect(await cache.get('k')).toEqual({ n: 1 })
      expect(await cache.get('k')).toEqual({ n: 1 })
      expect(commands).toEqual(['EVALSHA', 'EVALSHA'])
    })

    it('keeps at most localMax values locally, the least recently used going first', async () => {
      const client = recording(redis.client)
      const cache = createRedisCacheStore<{ n: number }>({ client, prefix: redis.prefix(), localMax: 2 })
      await cache.get('warm')
      await cache.set('a', { n: 1 }, 60_000)
      await cache.set('b', { n: 2 }, 60_000)
      client.commands.length = 0
      expect(await cache.get('a')).toEqual({ n: 1 }) // from the local copy: 'b' is now the least recently used
      expect(client.commands).toEqual([])
      await cache.set('c', { n: 3 }, 60_000)
      client.commands.length = 0
      expect(await cache.get('a')).toEqual({ n: 1 })
      expect(await cache.get('c')).toEqual({ n: 3 })
      expect(client.commands).toEqual([])
      expect(await cache.get('b')).toEqual({ n: 2 })
      expect(client.commands).toEqual(['EVALSHA'])
    })
  })

  describe('invalidation bus', () => {
    it('ready() resolves while the bus is open, and rejects naming it once closed: a closed bus delivers nothing', async () => {
      const bus = createRedisInvalidationBus({ client: redis.client, prefix: redis.prefix() })
      await bus.ready(5_000)
      await bus.ready(5_000)
      await bus.close()
      await expect(bus.ready(5_000)).rejects.toThrow(`Redis invalidation bus on ${bus.channel} is closed`)
      expect(bus.listening).toBe(false)
    })

    it('carries a message from one instance to the others, and to the sender once', async () => {
      const prefix = redis.prefix()
      const a = createRedisInvalidationBus({ client: redis.client, prefix })
      const b = createRedisInvalidationBus({ client: redis.connect(), prefix })
      const other = createRedisInvalidationBus({ client: redis.client, prefix: redis.prefix() })
      // New connections subscribing: given more than the 1 s default deadline on a loaded machine.
      await Promise.all([a.ready(5_000), b.ready(5_000), other.ready(5_000)])
      const seenByA: InvalidationMessage[] = []
      const seenByOther: InvalidationMessage[] = []
      a.subscribe((m) => seenByA.push(m))
      other.subscribe((m) => seenByOther.push(m))
      const atB = nextInvalidation(b)
      await a.publish({ kind: 'token', tokenHash: 'h1' })
      expect(await atB).toEqual({ kind: 'token', tokenHash: 'h1' })
      // A message from b, seen by a, shows that a's own message did not come back to it meanwhile.
      const atA = nextInvalidation(a)
      await b.publish({ kind: 'token', tokenHash: 'h2' })
      await atA
      expect(seenByA).toEqual([
        { kind: 'token', tokenHash: 'h1' },
        { kind: 'token', tokenHash: 'h2' },
      ])
      expect(seenByOther).toEqual([])
      await Promise.all([a.close(), b.close(), other.close()])
    })

    it('a publish refused while its command connection was down: once that client is ready again, the bus tells its listeners at once ({ kind: "all" }, which starts the token service\'s round of resends), once; nothing when it refused nothing; each bus on a shared client keeps its own watch when another closes', async () => {
      const prefix = redis.prefix()
      // The stores' client as ioredis is one: a `status`, and a `ready` event after each reconnect.
      const client = Object.assign(new EventEmitter(), { status: 'ready', call: (command: string, ...args: string[]) => redis.client.call(command, ...args) })
      const a = createRedisInvalidationBus({ client, subscriber: redis.connect(), prefix, heartbeatMs: false })
      const b = createRedisInvalidationBus({ client, subscriber: redis.connect(), prefix, heartbeatMs: false })
      await Promise.all([a.ready(5_000), b.ready(5_000)])
      const heard: Record<'a' | 'b', InvalidationMessage[]> = { a: [], b: [] }
      a.subscribe((message) => void heard.a.push(message))
      b.subscribe((message) => void heard.b.push(message))
      const refused = async (bus: typeof a) => {
        client.status = 'reconnecting'
        await expect(bus.publish({ kind: 'token', tokenHash: 'h1' })).rejects.toThrow('the Redis connection is not ready (reconnecting)')
      }
      const readyAgain = () => {
        client.status = 'ready'
        client.emit('ready')
      }
      readyAgain()
      expect(heard).toEqual({ a: [], b: [] })
      // A bus delivers its own message to its instance's listeners at once, sent or not.
      const own = { kind: 'token', tokenHash: 'h1' }
      await refused(a)
      expect(heard).toEqual({ a: [own], b: [] })
      readyAgain()
      expect(heard).toEqual({ a: [own, { kind: 'all' }], b: [] })
      readyAgain()
      expect(heard).toEqual({ a: [own, { kind: 'all' }], b: [] })
      await refused(b)
      await a.close()
      readyAgain()
      expect(heard).toEqual({ a: [own, { kind: 'all' }], b: [own, { kind: 'all' }] })
      await b.close()
    })

    it('an invalidation its instance could not publish (its own connection lost, the others listening) is sent again once it can be: the others refuse the token well inside their cache TTL', async () => {
      const prefix = redis.prefix()
      const { apps, subscriptions, store, errors, onError } = tokenWorld()
      // A publishes on a connection that refuses commands while it reconnects (no offline queue).
      const clientA = redis.connect({ enableOfflineQueue: false })
      clientA.on('error', () => {})
      const busA = createRedisInvalidationBus({ client: clientA, subscriber: redis.connect(), prefix, heartbeatMs: false, onError })
      const busB = createRedisInvalidationBus({ client: redis.connect(), prefix, heartbeatMs: false })
      await Promise.all([busA.ready(5_000), busB.ready(5_000)])
      const a = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations: busA, onError })
      const b = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations: busB })
      const created = await a.create({ userId: 'alice', name: 'ci', servers: ['app_w'], expiresInDays: 7 })
      expect(await b.authenticate(created.token)).toMatchObject({ ok: true }) // now in B's cache

      // A's command connection is cut (a network blip, a proxy restart); ioredis reconnects it.
      const id = await clientA.client('ID')
      await redis.client.client('KILL', 'ID', String(id))
      await vi.waitFor(() => expect(clientA.status).not.toBe('ready'), { timeout: 2_000, interval: 1 })
      const heard = nextInvalidation(busB)
      await a.revoke('alice', created.id)
      expect(errors).toEqual([expect.stringMatching(/^invalidation publish: /)])
      expect(await b.authenticate(created.token)).toMatchObject({ ok: true }) // not heard: still cached

      // Sent again once the connection is back: B hears it and refuses the token.
      expect(await Promise.race([heard, new Promise((resolve) => setTimeout(resolve, 10_000, 'never heard'))])).toEqual({
        kind: 'token',
        tokenHash: expect.any(String),
      })
      expect(await b.authenticate(created.token)).toEqual({ ok: false, reason: 'revoked' })
      expect(errors).toHaveLength(1)
      await Promise.all([a.close(), b.close()])
      await Promise.all([busA.close(), busB.close()])
    })

    /**
     * A filter of what Redis sends one connection that drops each message published on a channel
     * (`message`, as Redis pushes it to a subscriber: RESP2 or RESP3) and passes the rest. It
     * passes whole frames only: a frame split across TCP chunks waits for its end, so that no
     * message gets through in two halves.
     */
    function withoutPublished(): (chunk: Buffer) => Buffer {
      let pending = Buffer.alloc(0)
      /** Where the frame at `at` ends, or -1 while it has not all arrived. */
      function frameEnd(at: number): number {
        const line = pending.indexOf('\r\n', at)
        if (line === -1) return -1
        const type = String.fromCharCode(pending[at]!)
        const size = Number(pending.toString('latin1', at + 1, line))
        // Blob types: a length, then that many bytes (-1: null).
        if ('$!='.includes(type)) return size < 0 ? line + 2 : line + 2 + size + 2 <= pending.length ? line + 2 + size + 2 : -1
        // Aggregates: that many frames (maps and attributes: pairs; -1: null); an attribute precedes a frame.
        if ('*>~%|'.includes(type)) {
          let end = line + 2
          for (let i = 0; i < ('%|'.includes(type) ? 2 * size : size) && end !== -1; i++) end = frameEnd(end)
          return type === '|' && end !== -1 ? frameEnd(end) : end
        }
        return line + 2
      }
      return (chunk) => {
        pending = Buffer.concat([pending, chunk])
        const passed: Buffer[] = []
        let at = 0
        for (let end = frameEnd(at); end !== -1; at = end, end = frameEnd(at)) {
          if (!/^[*>]3\r\n\$7\r\nmessage\r\n$/.test(pending.toString('latin1', at, at + 17))) passed.push(pending.subarray(at, end))
        }
        pending = pending.subarray(at)
        return Buffer.concat(passed)
      }
    }

    /**
     * A proxy to Redis whose connections, once dropped, stay open and pass nothing either way
     * (a NAT or load balancer that forgot them); new connections pass as before. `subscriber`: a
     * connection through it. `client`: a client whose duplicate (a bus's own subscriber) goes
     * through it, while its own commands, the heartbeats among them, reach Redis directly.
     */
    async function forgettingProxy() {
      const upstream = new URL(REDIS_URL)
      const sockets = new Set<Socket>()
      const connections: Array<{ dropped: boolean }> = []
      let deafNew = false
      const proxy = createNetServer((downstream) => {
        const toRedis = connect(Number(upstream.port || 6379), upstream.hostname)
        const connection = { dropped: false }
        const heard = deafNew ? withoutPublished() : undefined
        connections.push(connection)
        for (const socket of [downstream, toRedis]) {
          sockets.add(socket)
          socket.on('error', () => {})
          socket.on('close', () => (sockets.delete(socket), downstream.destroy(), toRedis.destroy()))
        }
        downstream.on('data', (chunk: Buffer) => void (connection.dropped || toRedis.write(chunk)))
        toRedis.on('data', (chunk: Buffer) => {
          if (connection.dropped) return
          // A deaf connection passes Redis's replies, and no published message.
          downstream.write(heard === undefined ? chunk : heard(chunk))
        })
      })
      await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve))
      const proxied = `redis://127.0.0.1:${(proxy.address() as AddressInfo).port}`
      /** A connection through the proxy; as a bus's duplicate, with the options the bus gives it. */
      const subscriber = (override?: RedisOptions) => redis.connect({ retryStrategy: () => 10, disconnectTimeout: 10, ...override }, proxied)
      return {
        connections,
        subscriber,
        client: () => Object.assign(redis.connect(), { duplicate: subscriber }),
        /** Forgets every connection made so far. */
        drop: () => void connections.forEach((connection) => (connection.dropped = true)),
        /** From now on, each new connection passes no published message: a bus's replacements of a forgotten one hear nothing either. */
        deafenNew: () => void (deafNew = true),
        close: async () => {
          for (const socket of sockets) socket.destroy()
          await new Promise<void>((resolve) => proxy.close(() => resolve()))
        },
      }
    }

    it('a subscriber connection dropped without a reset (a NAT or load balancer that forgot it) while Redis answers the heartbeats is replaced: the bus hears again within seconds, not at TCP keepalive (regression: deaf, the token cache off, for minutes to hours)', async () => {
      const { connections, client: proxiedClient, drop, close } = await forgettingProxy()
      const buses: RedisInvalidationBus[] = []
      try {
        const prefix = redis.prefix()
        const client = proxiedClient()
        const errors: string[] = []
        const bus = createRedisInvalidationBus({ client, prefix, heartbeatMs: 100, timeoutMs: 200, onError: (error, context) => void errors.push(`${context}: ${(error as Error).message}`) })
        const other = createRedisInvalidationBus({ client: redis.connect(), prefix })
        buses.push(bus, other)
        await Promise.all([bus.ready(5_000), other.ready(5_000)])
        expect(bus.listening).toBe(true)
        drop()
        await vi.waitFor(() => expect(bus.listening).toBe(false), { timeout: 5_000 })
        await vi.waitFor(() => expect(bus.listening).toBe(true), { timeout: 10_000 })
        expect(errors).toContainEqual(expect.stringMatching(/^invalidation subscriber: Nothing arrived on .* the subscriber connection is replaced$/))
        expect(connections.length).toBeGreaterThanOrEqual(2)
        const heard = nextInvalidation(bus)
        await other.publish({ kind: 'token', tokenHash: 'h-after' })
        expect(await heard).toEqual({ kind: 'token', tokenHash: 'h-after' })
      } finally {
        await Promise.all(buses.map((bus) => bus.close()))
        await close()
      }
    })

    it('a publish waiting for confirmations when its channels go silent stops waiting once the silence is judged (none could reach it), reported as such', async () => {
      const { client, drop, close } = await forgettingProxy()
      const T = 4_000
      const reports: string[] = []
      // When the silence was judged (its report), by the monotonic clock.
      let judgedAt: number | undefined
      const onError = (error: unknown, context: string) => {
        const message = (error as Error).message
        if (/^Nothing arrived on .*: the cache is off until something does$/.test(message)) judgedAt ??= performance.now()
        reports.push(`${context}: ${message}`)
      }
      const bus = createRedisInvalidationBus({ client: client(), prefix: redis.prefix(), heartbeatMs: 100, timeoutMs: T, onError })
      try {
        await bus.ready(5_000)
        drop()
        // Silent for 2 s of the 4.1 s (heartbeatMs + timeoutMs) past which it is judged so: the
        // publish below waits while the bus still listens, its own deadline about 2 s past the
        // judgement.
        await new Promise((resolve) => setTimeout(resolve, 2_000))
        expect(bus.listening).toBe(true)
        // Redis counts its subscriber connection, whose copy never comes back.
        const began = performance.now()
        await bus.publish({ kind: 'token', tokenHash: 'h1' })
        const finished = performance.now()
        // Ended by the judgement (in the same turn), not by its deadline, T after it began.
        expect(judgedAt).toBeGreaterThan(began)
        expect(finished - judgedAt!).toBeLessThan(500)
        expect(bus.listening).toBe(false)
        expect(reports).toContainEqual(expect.stringMatching(/^invalidation publish: Stopped waiting for 1 of 1 receivers of .* to confirm an invalidation: nothing arrived on its channels/))
      } finally {
        await bus.close()
        await close()
      }
    })

    it('a subscriber connection that stays deaf however often it is replaced is replaced again and again, each gap past a wait that doubles: more than 600 ms, 1.2 s, then 2.4 s', async () => {
      const { client, drop, deafenNew, close } = await forgettingProxy()
      const replaced: number[] = []
      const bus = createRedisInvalidationBus({
        client: client(),
        prefix: redis.prefix(),
        heartbeatMs: 100,
        timeoutMs: 200,
        onError: (error) => void ((error as Error).message.endsWith('the subscriber connection is replaced') && replaced.push(performance.now())),
      })
      try {
        await bus.ready(5_000)
        deafenNew()
        drop()
        // Each gap is longer than the bus's wait between replacements: 2 × (heartbeatMs +
        // timeoutMs) = 600 ms at first, doubled at each replacement (up to a minute). Times read
        // here a few microseconds after the bus's own: 10 ms of slack.
        await vi.waitFor(() => expect(replaced.length).toBeGreaterThanOrEqual(4), { timeout: 15_000 })
        const gaps = replaced.slice(1, 4).map((at, i) => at - replaced[i]!)
        expect(gaps[0]).toBeGreaterThan(600 - 10)
        expect(gaps[1]).toBeGreaterThan(1_200 - 10)
        expect(gaps[2]).toBeGreaterThan(2_400 - 10)
        // And the wait grew: the first gap (600 ms and a beat) is shorter than the third.
        expect(gaps[0]).toBeLessThan(gaps[2]!)
      } finally {
        await bus.close()
        await close()
      }
    })

    it('a subscriber connection of your own that goes deaf is never replaced (it is the application\'s): the bus only stops listening', async () => {
      const { connections, subscriber: through, drop, close } = await forgettingProxy()
      const errors: string[] = []
      const subscriber = through({ autoResubscribe: false })
      const bus = createRedisInvalidationBus({ client: redis.connect(), subscriber, prefix: redis.prefix(), heartbeatMs: 100, timeoutMs: 200, onError: (error) => void errors.push((error as Error).message) })
      try {
        await bus.ready(5_000)
        drop()
        await vi.waitFor(() => expect(bus.listening).toBe(false), { timeout: 5_000 })
        // A connection of its own would have been replaced at least twice by now (600 ms, then 1.2 s apart).
        await new Promise((resolve) => setTimeout(resolve, 2_500))
        expect(connections).toHaveLength(1)
        expect(errors.filter((message) => message.endsWith('the subscriber connection is replaced'))).toEqual([])
        expect(bus.listening).toBe(false)
      } finally {
        await bus.close()
        subscriber.disconnect()
        await close()
      }
    })

    it('each of six deaf spells in a row ends within 7 s (carried over, the sixth would wait 9.6 s): once its replaced subscriber hears again, the backoff between replacements starts afresh', { timeout: 90_000 }, async () => {
      const { client, drop, close } = await forgettingProxy()
      // With heartbeatMs 100 and timeoutMs 200, a replacement comes 600 ms after the last at the
      // earliest, and each one more doubles that wait until something arrives: carried over
      // from spell to spell, the fifth spell's would wait 4.8 s, the sixth's 9.6 s.
      const commands = client()
      let subscriber: Redis | undefined
      const duplicate = commands.duplicate
      const bus = createRedisInvalidationBus({
        client: Object.assign(commands, { duplicate: (...args: Parameters<Redis['duplicate']>) => (subscriber = duplicate.apply(commands, args)) }),
        prefix: redis.prefix(),
        heartbeatMs: 100,
        timeoutMs: 200,
        onError: () => {},
      })
      // Messages the bus's subscriber connection delivered (its own heartbeats coming back).
      let messages = 0
      subscriber!.on('message', () => void messages++)
      try {
        await bus.ready(5_000)
        for (let spell = 1; spell <= 6; spell++) {
          drop()
          const began = performance.now()
          await vi.waitFor(() => expect(bus.listening).toBe(false), { timeout: 5_000 })
          const before = messages
          await vi.waitFor(() => expect(bus.listening).toBe(true), { timeout: 10_000 })
          expect(performance.now() - began, `spell ${spell}`).toBeLessThan(7_000)
          // Listening again once the replacement is subscribed; the backoff starts afresh only
          // once something arrives on it: the next spell begins after that.
          await vi.waitFor(() => expect(messages).toBeGreaterThan(before), { timeout: 5_000 })
        }
      } finally {
        await bus.close()
        await close()
      }
    })

    it('the bus closed while its own subscriber connection subscribes again after a reconnect leaves nothing unhandled (regression, ioredis 5: its own resubscription, sent with no handler, was rejected unhandled when the connection closed before the reply, which ends a Node process)', async () => {
      const commands = redis.connect()
      let subscriber: Redis | undefined
      const duplicate = commands.duplicate
      const bus = createRedisInvalidationBus({
        client: Object.assign(commands, { duplicate: (...args: Parameters<Redis['duplicate']>) => (subscriber = duplicate.apply(commands, args)) }),
        prefix: redis.prefix(),
        onError: () => {},
      })
      const unhandled: unknown[] = []
      const onUnhandled = (reason: unknown) => void unhandled.push(reason)
      process.on('unhandledRejection', onUnhandled)
      try {
        await bus.ready(5_000)
        const stream = () => (subscriber as unknown as { stream: Socket }).stream
        // Ready again after the connection dropped: ioredis emits it a tick after it sent its
        // own resubscription, if it sends one; the bus closes, and the connection is gone before
        // any reply.
        const reconnected = new Promise<void>((resolve) =>
          subscriber!.once('ready', () => {
            void bus.close()
            stream().destroy()
            resolve()
          }),
        )
        stream().destroy()
        await reconnected
        await new Promise((resolve) => setTimeout(resolve, 200))
        expect(unhandled).toEqual([])
      } finally {
        process.off('unhandledRejection', onUnhandled)
        await bus.close()
      }
    })

    it('an error reply that quotes the command\'s arguments (a command the server lacks: below 6.2, renamed away) reaches the caller and onError without them: no session id, no token hash in its message, stack or anything logged (regression: Redis\'s "with args beginning with:" was printed whole)', async (context) => {
      needsRedisServer(context, 'renamed-commands')
      const server = await startPrivateRedis(['--rename-command', 'GETEX', '', '--rename-command', 'PUBLISH', ''])
      const connection = new IOREDIS[redis.kind]({ path: server.path })
      const sessionId = 'session-canary-5c1e4b7d9a2f'
      const tokenHash = 'feedc0ffee1234567890abcdef0123456789abcdef0123456789abcdef012345'
      const reports: unknown[] = []
      const bus = createRedisInvalidationBus({ client: connection, prefix: redis.prefix(), heartbeatMs: false, onError: (error) => void reports.push(error) })
      try {
        await connection.ping()
        const sessions = createRedisSessionStore({ client: connection, prefix: redis.prefix() })
        const failures = await Promise.all(
          [(): unknown => sessions.get(sessionId, 60_000), (): unknown => bus.publish({ kind: 'token', tokenHash })].map((call) =>
            Promise.resolve()
              .then(call)
              .then(
                () => undefined,
                (error: unknown) => error,
              ),
          ),
        )
        for (const error of failures) {
          expect((error as Error).message).toMatch(/^ERR unknown command '(GETEX|PUBLISH)', with args beginning with: \(dropped by mcp-dispatch\)$/)
          expect((error as Error).stack).toContain('(dropped by mcp-dispatch)')
        }
        const logged = inspect([failures, reports], { depth: Infinity, showHidden: true })
        expect(logged).not.toContain('canary')
        expect(logged).not.toContain(tokenHash.slice(0, 12))
      } finally {
        await bus.close()
        connection.disconnect()
        await server.stop()
      }
    })

    it('a subscriber connection refused at its handshake (a wrong or rotated password) is reported without the handshake’s arguments: the password never reaches onError (regression: error.command.args held it)', async () => {
      const upstream = new URL(REDIS_URL)
      const refused = `redis://nobody:canary-password-7Qx@${upstream.hostname}:${upstream.port || 6379}`
      const reports: unknown[] = []
      const client = Object.assign(redis.connect(), { duplicate: () => redis.connect({ retryStrategy: () => null, disconnectTimeout: 10 }, refused) })
      const bus = createRedisInvalidationBus({ client, prefix: redis.prefix(), heartbeatMs: false, onError: (error, context) => void reports.push({ context, error }) })
      await vi.waitFor(() => expect(reports.length).toBeGreaterThan(0), { timeout: 5_000 })
      const logged = inspect(reports, { depth: Infinity, showHidden: true })
      expect(logged).toMatch(/WRONGPASS|NOAUTH|invalid username-password/)
      expect(logged).not.toContain('canary-password-7Qx')
      await bus.close()
    })

    it('a rotation or revocation through one instance is refused by every other instance as soon as the call returns: publish waits until the other buses confirm delivery', async () => {
      const prefix = redis.prefix()
      const { apps, subscriptions, store } = tokenWorld()
      const buses = [0, 1, 2].map(() => createRedisInvalidationBus({ client: redis.connect(), prefix }))
      await Promise.all(buses.map((bus) => bus.ready(5_000)))
      const [a, b, c] = buses.map((invalidations) => createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations }))
      for (let i = 0; i < 10; i++) {
        const created = await a!.create({ userId: 'alice', name: `t${i}`, servers: ['app_w'], expiresInDays: 7 })
        expect((await b!.authenticate(created.token)).ok).toBe(true) // cached on B and C
        expect((await c!.authenticate(created.token)).ok).toBe(true)
        const rotated = await a!.rotate(created.id, { kind: 'session', userId: 'alice' })
        expect(await b!.authenticate(created.token)).toEqual({ ok: false, reason: 'unknown' })
        expect(await c!.authenticate(created.token)).toEqual({ ok: false, reason: 'unknown' })
        expect((await b!.authenticate(rotated.token)).ok).toBe(true)
        await a!.revoke('alice', created.id)
        expect(await b!.authenticate(rotated.token)).toEqual({ ok: false, reason: 'revoked' })
        expect(await c!.authenticate(rotated.token)).toEqual({ ok: false, reason: 'revoked' })
      }
      await Promise.all([a!.close(), b!.close(), c!.close()])
      await Promise.all(buses.map((bus) => bus.close()))
    })

    it('a receiver that never confirms (no bus) holds a publish for timeoutMs at most, without failing it, heartbeat or not', async () => {
      const prefix = redis.prefix()
      // Long enough that a loaded machine answers the publishes that wait for nobody well within it.
      const T = 2_000
      const errors: string[] = []
      const onError = (error: unknown, context: string) => void errors.push(`${context}: ${(error as Error).message}`)
      const waiting = createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: T, onError })
      const quiet = createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: T, heartbeatMs: false, onError })
      await Promise.all([waiting.ready(5_000), quiet.ready(5_000)])
      // Each confirmed by the other, with the heartbeat on or off: answered at once.
      for (const bus of [waiting, quiet]) {
        const began = performance.now()
        await bus.publish({ kind: 'token', tokenHash: 'h1' })
        expect(performance.now() - began).toBeLessThan(T / 2)
      }
      // A subscriber that is no bus, a `redis-cli SUBSCRIBE` say.
      const listener = redis.connect()
      await listener.subscribe(waiting.channel)
      for (const bus of [waiting, quiet]) {
        const began = performance.now()
        await expect(bus.publish({ kind: 'token', tokenHash: 'h2' })).resolves.toBeUndefined()
        expect(performance.now() - began).toBeGreaterThanOrEqual(T - 5)
      }
      // Reported (at most once a minute per bus), so an operator learns "at once" did not hold.
      const report = new RegExp(`^invalidation publish: 1 receiver of ${waiting.channel} did not confirm an invalidation within ${T} ms \\(the last: 1 of 3;`)
      expect(errors).toEqual([expect.stringMatching(report), expect.stringMatching(report)])
      await Promise.all([waiting.close(), quiet.close()])
    })

    it('a token service whose storeTimeoutMs is below the bus timeoutMs waits for the confirmations all the same: nothing is taken for failed, reported as such or sent again', async () => {
      const prefix = redis.prefix()
      const T = 1_500
      const { apps, subscriptions, store, errors, onError } = tokenWorld()
      const bus = createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: T, onError })
      await bus.ready(5_000)
      expect(bus.publishTimeoutMs).toBe(T)
      const service = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations: bus, storeTimeoutMs: 200, onError })
      // A receiver that never confirms holds each publish for T.
      const listener = redis.connect()
      const heard: string[] = []
      listener.on('message', (_from: string, text: string) => heard.push(text))
      await listener.subscribe(bus.channel)
      const created = await service.create({ userId: 'alice', name: 'ci', servers: ['app_w'], expiresInDays: 7 })
      const began = performance.now()
      await service.revoke('alice', created.id)
      expect(performance.now() - began).toBeGreaterThanOrEqual(T - 5)
      // Past the rounds' first wait (0.5 to 1 s): the revocation went out once.
      await new Promise((resolve) => setTimeout(resolve, 1_200))
      expect(heard).toHaveLength(1)
      expect(errors).toEqual([expect.stringMatching(/^invalidation publish: 1 receiver of .* did not confirm/)])
      await service.close()
      await bus.close()
    })

    /**
     * A receiver on `channel` as a bus of the version before confirmations went to their
     * senders' channels: it confirms every message on the heartbeat channel, as JSON, whatever
     * the message asks. Its connection, subscribed.
     */
    async function receiverOfTheVersionBefore(channel: string) {
      const before = redis.connect()
      before.on('message', (_from: string, text: string) => {
        const { id, origin } = JSON.parse(text) as { id: string; origin: string }
        void redis.client.publish(`${channel}:heartbeat`, JSON.stringify({ ack: id, to: origin }))
      })
      await before.subscribe(channel)
      return before
    }

    it('each confirmation goes to its sender only (one per receiver, none on the channel every bus hears), and buses of the version before are understood both ways', async () => {
      const prefix = redis.prefix()
      const T = 5_000
      const errors: unknown[] = []
      const buses = [0, 1, 2, 3].map(() => createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: T, onError: (error) => errors.push(error) }))
      await Promise.all(buses.map((bus) => bus.ready(5_000)))
      const channel = buses[0]!.channel
      // What goes over the confirmation channels, and over the heartbeat channel (heartbeats
      // are the sender's id alone; confirmations of the version before were JSON there).
      const watcher = redis.connect()
      const acks: string[] = []
      const onHeartbeatChannel: string[] = []
      watcher.on('pmessage', (_pattern: string, from: string) => acks.push(from))
      watcher.on('message', (_from: string, text: string) => void (text.startsWith('{') && onHeartbeatChannel.push(text)))
      await watcher.psubscribe(`${channel}:ack:*`)
      await watcher.subscribe(`${channel}:heartbeat`)
      await buses[0]!.publish({ kind: 'token', tokenHash: 'h1' })
      await buses[3]!.publish({ kind: 'token', tokenHash: 'h2' })
      // Three to each sender, on its own channel (the watcher hears them a moment after it).
      await vi.waitFor(() => expect(acks).toHaveLength(6), { timeout: 2_000, interval: 5 })
      expect(new Set(acks.slice(0, 3)).size).toBe(1)
      expect(new Set(acks.slice(3)).size).toBe(1)
      expect(acks[0]).not.toBe(acks[3])
      expect(onHeartbeatChannel).toEqual([])

      // A sender of the version before (no `direct`): confirmed on the heartbeat channel, as it
      // listens there.
      const heartbeats = redis.connect()
      const old: unknown[] = []
      heartbeats.on('message', (_from: string, text: string) => void (text.startsWith('{') && old.push(JSON.parse(text))))
      await heartbeats.subscribe(`${channel}:heartbeat`)
      const sender = '00000000-0000-4000-8000-00000000000b'
      await redis.client.publish(channel, JSON.stringify({ origin: sender, kind: 'token', tokenHash: 'h3', id: 'm1' }))
      await vi.waitFor(() => expect(old).toEqual(Array(4).fill({ ack: 'm1', to: sender })), { timeout: 2_000, interval: 5 })

      // A receiver of the version before (it confirms on the heartbeat channel, whatever the
      // message asks): its confirmation counts, so the sender does not wait T for it.
      await receiverOfTheVersionBefore(channel)
      const began = performance.now()
      await buses[1]!.publish({ kind: 'token', tokenHash: 'h4' })
      expect(performance.now() - began).toBeLessThan(T / 2)
      expect(errors).toEqual([])
      await Promise.all(buses.map((bus) => bus.close()))
    })

    it('a receiver of the version before is heard by a bus with the heartbeat off too; a receiver confirming twice counts once; a forged sender gets no confirmation', async () => {
      const prefix = redis.prefix()
      const T = 3_000
      const errors: unknown[] = []
      const quietClient = redis.connect()
      const quiet = createRedisInvalidationBus({ client: quietClient, prefix, timeoutMs: T, heartbeatMs: false, onError: (error) => errors.push(error) })
      await quiet.ready(5_000)
      const channel = quiet.channel
      const before = await receiverOfTheVersionBefore(channel)
      let began = performance.now()
      await quiet.publish({ kind: 'token', tokenHash: 'h1' })
      expect(performance.now() - began).toBeLessThan(T / 2)
      await before.unsubscribe(channel)

      // Two receivers, one of which confirms twice, under its own name: the second is not taken
      // for the other receiver's.
      const [ackChannel] = (await redis.client.pubsub('CHANNELS', `${channel}:ack:*`)) as string[]
      const twice = redis.connect()
      twice.on('message', (_from: string, text: string) => {
        const { id } = JSON.parse(text) as { id: string }
        for (let i = 0; i < 2; i++) void redis.client.publish(ackChannel!, `${id} 00000000-0000-4000-8000-000000000001`)
      })
      await twice.subscribe(channel)
      const silent = redis.connect()
      await silent.subscribe(channel)
      began = performance.now()
      await quiet.publish({ kind: 'token', tokenHash: 'h2' })
      expect(performance.now() - began).toBeGreaterThanOrEqual(T - 5)
      expect(errors).toEqual([expect.objectContaining({ message: expect.stringMatching(/^1 receiver of .* \(the last: 1 of 3;/) })])
      await Promise.all([twice.unsubscribe(channel), silent.unsubscribe(channel)])

      // A message whose sender is no bus's id: delivered, and confirmed nowhere.
      const watcher = redis.connect()
      const published: string[] = []
      watcher.on('pmessage', (_pattern: string, from: string) => published.push(from))
      await watcher.psubscribe(`${channel}:*`)
      const heard = nextInvalidation(quiet)
      await redis.client.publish(channel, JSON.stringify({ origin: 'x'.repeat(10_000), kind: 'token', tokenHash: 'h3', id: 'm1', direct: true }))
      expect(await heard).toEqual({ kind: 'token', tokenHash: 'h3' })
      // A confirmation would have been sent on the bus's client before this marker (one
      // connection keeps its commands in order), so it would have arrived before it.
      await quietClient.publish(`${channel}:marker`, 'm')
      await vi.waitFor(() => expect(published).toContain(`${channel}:marker`), { timeout: 2_000, interval: 5 })
      expect(published).toEqual([`${channel}:marker`])
      await quiet.close()
    })

    it('while its own subscriber connection is down, a publish waits for no confirmation (none could reach it) and reports none', async () => {
      const prefix = redis.prefix()
      const T = 3_000
      const reports: string[] = []
      // Not reconnected; and disconnected again after the suite, which sets ioredis a timer of
      // `disconnectTimeout` on a connection already closed.
      const subscriber = redis.connect({ retryStrategy: () => null, disconnectTimeout: 10 })
      const a = createRedisInvalidationBus({ client: redis.connect(), subscriber, prefix, timeoutMs: T, onError: (_error, context) => reports.push(context) })
      const b = createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: T })
      await Promise.all([a.ready(5_000), b.ready(5_000)])
      subscriber.disconnect()
      await vi.waitFor(() => expect(a.listening).toBe(false), { timeout: 2_000, interval: 5 })
      const heard = nextInvalidation(b)
      const began = performance.now()
      await a.publish({ kind: 'token', tokenHash: 'h1' })
      expect(performance.now() - began).toBeLessThan(T / 2)
      expect(await heard).toEqual({ kind: 'token', tokenHash: 'h1' })
      expect(reports.filter((context) => context === 'invalidation publish')).toEqual([])
      await Promise.all([a.close(), b.close()])
    })

    it('a publish waiting for confirmations when its subscriber connection is lost stops waiting (none sent meanwhile could reach it), reported as such', async () => {
      const prefix = redis.prefix()
      const T = 5_000
      const reports: string[] = []
      const name = `bus-lost-${prefix.replace(/\W/g, '')}`
      const a = createRedisInvalidationBus({
        client: redis.connect(),
        subscriber: redis.connect({ connectionName: name }),
        prefix,
        timeoutMs: T,
        onError: (error, context) => reports.push(`${context}: ${(error as Error).message}`),
      })
      await a.ready(5_000)
      // A receiver that never confirms holds the publish.
      const listener = redis.connect()
      await listener.subscribe(a.channel)
      const began = performance.now()
      const publishing = a.publish({ kind: 'token', tokenHash: 'h1' })
      await new Promise((resolve) => setTimeout(resolve, 100))
      const list = (await redis.client.client('LIST')) as string
      const found = [...list.matchAll(/(?:^|\n)id=(\d+) .*? name=(\S+)/g)].find((match) => match[2] === name)?.[1]
      await redis.client.client('KILL', 'ID', found!)
      await publishing
      expect(performance.now() - began).toBeLessThan(T / 2)
      // Reported apart from receivers that did not confirm: the listener is not to blame.
      expect(reports.filter((report) => report.startsWith('invalidation publish'))).toEqual([
        `invalidation publish: Stopped waiting for 1 of 2 receivers of ${a.channel} to confirm an invalidation: its subscriber connection was lost, so no confirmation could reach this bus; their instances may serve the token from their cache until the message reaches them`,
      ])
      await a.close()
    })

    it('under Redis ACLs: without the confirmation channels a bus still listens and waits for no confirmation; without the channel, ready() fails and nothing waits; a receiver that may not confirm is reported, once for two confirmations', async () => {
      const prefix = redis.prefix()
      const T = 3_000
      const channel = `${prefix}invalidations`
      const tag = prefix.replace(/\W/g, '')
      // `old`: the channels of a version before confirmations; `none`: no channel at all.
      const users = { old: `mcp-dispatch-test-old-${tag}`, none: `mcp-dispatch-test-none-${tag}` }
      await redis.client.call('ACL', 'SETUSER', users.old, 'on', 'nopass', '+@all', '~*', 'resetchannels', `&${channel}`, `&${channel}:heartbeat`)
      await redis.client.call('ACL', 'SETUSER', users.none, 'on', 'nopass', '+@all', '~*', 'resetchannels')
      try {
        const reports: { a: string[]; b: string[]; c: string[]; d: string[] } = { a: [], b: [], c: [], d: [] }
        const onError = (name: keyof typeof reports) => (error: unknown, context: string) => void reports[name].push(`${context}: ${(error as Error).message}`)
        // Not reconnected once DELUSER below closes them; disconnected again after the suite,
        // with a short timer of ioredis's own.
        const as = (user: string) => redis.connect({ username: user, password: 'any', retryStrategy: () => null, disconnectTimeout: 10 })
        const a = createRedisInvalidationBus({ client: redis.connect(), subscriber: as(users.old), prefix, timeoutMs: T, onError: onError('a') })
        const b = createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: T, onError: onError('b') })
        await Promise.all([a.ready(5_000), b.ready(5_000)])
        // A: listening (its cache stays on), its refused confirmation channel reported.
        expect(a.listening).toBe(true)
        expect(reports.a.length).toBeGreaterThan(0)
        expect(reports.a).toEqual(Array(reports.a.length).fill(expect.stringMatching(/^invalidation subscriber: Redis refused SUBSCRIBE .*:ack:.* \(NOPERM/)))
        const reported = reports.a.length
        // A hears B and confirms to it (A's client may publish there): B does not wait T.
        let heard = nextInvalidation(a)
        let began = performance.now()
        await b.publish({ kind: 'token', tokenHash: 'h1' })
        expect(performance.now() - began).toBeLessThan(T / 2)
        expect(await heard).toEqual({ kind: 'token', tokenHash: 'h1' })
        // A's own publishes wait for no confirmation (none could reach it) and blame no receiver.
        heard = nextInvalidation(b)
        began = performance.now()
        await a.publish({ kind: 'token', tokenHash: 'h2' })
        expect(performance.now() - began).toBeLessThan(T / 2)
        expect(await heard).toEqual({ kind: 'token', tokenHash: 'h2' })
        expect(reports.a).toHaveLength(reported)

        // C may subscribe to nothing: ready() fails, and its publishes wait for nothing.
        const c = createRedisInvalidationBus({ client: redis.connect(), subscriber: as(users.none), prefix, timeoutMs: T, onError: onError('c') })
        await expect(c.ready(1_000)).rejects.toThrow(/did not answer within/)
        expect(c.listening).toBe(false)
        expect(reports.c.length).toBeGreaterThan(0)
        expect(reports.c.every((report) => report.startsWith('invalidation subscriber: '))).toBe(true)
        heard = nextInvalidation(b)
        began = performance.now()
        await c.publish({ kind: 'token', tokenHash: 'h3' })
        expect(performance.now() - began).toBeLessThan(T / 2)
        expect(await heard).toEqual({ kind: 'token', tokenHash: 'h3' })
        expect(reports.c.some((report) => report.startsWith('invalidation publish'))).toBe(false)

        // D hears but may not publish its confirmations: reported by D, and B waits T for it.
        const d = createRedisInvalidationBus({ client: as(users.old), prefix, timeoutMs: T, onError: onError('d') })
        await d.ready(5_000)
        // Two invalidations: D reports the first confirmation it could not send, not the second
        // (at most once a minute); B reports the receiver that did not confirm (D) once too.
        await Promise.all([b.publish({ kind: 'token', tokenHash: 'h4' }), b.publish({ kind: 'token', tokenHash: 'h5' })])
        expect(reports.d.filter((report) => report.startsWith('invalidation confirm'))).toEqual([
          expect.stringMatching(/^invalidation confirm: A confirmation on .*:ack:\* could not be sent \(NOPERM/),
        ])
        expect(reports.b).toEqual([expect.stringMatching(/^invalidation publish: 1 receiver of .* did not confirm/)])
        await Promise.all([a.close(), b.close(), c.close(), d.close()])
      } finally {
        for (const user of Object.values(users)) await redis.client.call('ACL', 'DELUSER', user)
      }
    })

    it('subscribes one channel at a time, its confirmation channel first; closed at once, it leaves a connection of your own subscribed to nothing (regression)', async () => {
      const prefix = redis.prefix()
      const subscriber = redis.connect()
      await subscriber.ping()
      const calls: string[][] = []
      const subscribe = subscriber.subscribe.bind(subscriber) as (...channels: string[]) => Promise<unknown>
      // A client that takes one channel per call, as RedisSubscriberClient says.
      ;(subscriber as unknown as { subscribe: (channel: string) => Promise<unknown> }).subscribe = (channel) => {
        calls.push([channel])
        return subscribe(channel)
      }
      const bus = createRedisInvalidationBus({ client: redis.connect(), subscriber, prefix })
      await bus.ready(5_000)
      expect(calls).toEqual([[expect.stringMatching(new RegExp(`^${bus.channel}:ack:[0-9a-f-]{36}$`))], [`${bus.channel}:heartbeat`], [bus.channel]])
      // It hears another bus (every channel subscribed, not only the first).
      const other = createRedisInvalidationBus({ client: redis.connect(), prefix })
      await other.ready(5_000)
      const heard = nextInvalidation(bus)
      await other.publish({ kind: 'token', tokenHash: 'h1' })
      expect(await heard).toEqual({ kind: 'token', tokenHash: 'h1' })
      await other.close()
      await bus.close()
      // Closed in the same turn as it was made: its SUBSCRIBE is never sent after the UNSUBSCRIBE.
      for (const heartbeatMs of [1_000, false] as const) {
        await createRedisInvalidationBus({ client: redis.connect(), subscriber, prefix, heartbeatMs }).close()
        await new Promise((resolve) => setTimeout(resolve, 50))
        expect(await redis.client.pubsub('NUMSUB', bus.channel, `${bus.channel}:heartbeat`)).toEqual([bus.channel, 0, `${bus.channel}:heartbeat`, 0])
        expect(await redis.client.pubsub('CHANNELS', `${bus.channel}:ack:*`)).toEqual([])
      }
    })

    it('counts its own connection as Redis did: a publish right after its subscriber reconnected waits for no one who is not there (regression)', async () => {
      const prefix = redis.prefix()
      const T = 5_000
      const name = `bus-a-${prefix.replace(/\W/g, '')}`
      const subscriberA = redis.connect({ connectionName: name })
      const a = createRedisInvalidationBus({ client: redis.connect(), subscriber: subscriberA, prefix, timeoutMs: T })
      const b = createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: T })
      await Promise.all([a.ready(5_000), b.ready(5_000)])
      // Two buses of one prefix on one connection: Redis would count them as one receiver.
      expect(() => createRedisInvalidationBus({ client: redis.connect(), subscriber: subscriberA, prefix })).toThrow(ConfigurationError)
      for (let i = 0; i < 3; i++) {
        // A subscribed connection takes no CLIENT ID (ioredis 5): found by its name.
        const list = (await redis.client.client('LIST')) as string
        const id = /(?:^|\n)id=(\d+) .*? name=(\S+)/g
        const found = [...list.matchAll(id)].find((match) => match[2] === name)?.[1]
        const published = new Promise<number>((resolve) =>
          subscriberA.once('ready', () => {
            const began = performance.now()
            void Promise.resolve(a.publish({ kind: 'token', tokenHash: `h${i}` })).then(() => resolve(performance.now() - began))
          }),
        )
        await redis.client.client('KILL', 'ID', found!)
        // Confirmed by B (and by A's own connection when Redis counted it), not held to T.
        expect(await published).toBeLessThan(T / 2)
        await a.ready(5_000)
      }
      await Promise.all([a.close(), b.close()])
      // Once closed, the connection takes another bus.
      const again = createRedisInvalidationBus({ client: redis.connect(), subscriber: subscriberA, prefix })
      await again.close()
    })

    it('reports a malformed message and a listener that throws; delivery goes on', async () => {
      const prefix = redis.prefix()
      const errors: string[] = []
      const bus = createRedisInvalidationBus({ client: redis.client, prefix, onError: (_e, context) => errors.push(context) })
      // A new connection subscribing: given more than the 1 s default deadline on a loaded machine.
      await bus.ready(5_000)
      bus.subscribe(() => {
        throw new Error('listener bug')
      })
      // An `async` listener's rejection is reported too, not left unhandled (regression: it
      // ended the process).
      bus.subscribe(async () => {
        throw new Error('async listener bug')
      })
      const delivered = nextInvalidation(bus)
      await redis.client.publish(bus.channel, 'not json')
      await redis.client.publish(bus.channel, JSON.stringify({ origin: 'elsewhere', kind: 'token', tokenHash: 'h1' }))
      expect(await delivered).toEqual({ kind: 'token', tokenHash: 'h1' })
      await vi.waitFor(() => expect(errors).toEqual(['invalidation message', 'invalidation listener', 'invalidation listener']))
      await bus.close()
    })

    it('close disconnects the connection it opened and stops delivery', async () => {
      const prefix = redis.prefix()
      const bus = createRedisInvalidationBus({ client: redis.client, prefix })
      // A new connection subscribing: given more than the 1 s default deadline on a loaded machine.
      await bus.ready(5_000)
      expect(await redis.client.pubsub('NUMSUB', bus.channel)).toEqual([bus.channel, 1])
      const seen: InvalidationMessage[] = []
      bus.subscribe((m) => seen.push(m))
      await bus.close()
      await bus.close()
      expect(await settles(async () => (await redis.client.pubsub('NUMSUB', bus.channel))[1] === 0)).toBe(true)
      await redis.client.publish(bus.channel, JSON.stringify({ origin: 'elsewhere', kind: 'token', tokenHash: 'h1' }))
      await bus.publish({ kind: 'token', tokenHash: 'h2' })
      expect(seen).toEqual([])
    })

    it('a subscriber connection of your own is unsubscribed on close, not closed', async () => {
      const prefix = redis.prefix()
      const subscriber = redis.connect()
      const bus = createRedisInvalidationBus({ client: redis.client, subscriber, prefix })
      // A new connection subscribing: given more than the 1 s default deadline on a loaded machine.
      await bus.ready(5_000)
      expect(await redis.client.pubsub('NUMSUB', `${bus.channel}:heartbeat`)).toEqual([`${bus.channel}:heartbeat`, 1])
      // Its confirmation channel (`<channel>:ack:<its id>`).
      const ack = ((await redis.client.pubsub('CHANNELS', `${bus.channel}:ack:*`)) as string[])
      expect(ack).toHaveLength(1)
      await bus.close()
      expect(await redis.client.pubsub('NUMSUB', bus.channel)).toEqual([bus.channel, 0])
      expect(await redis.client.pubsub('NUMSUB', `${bus.channel}:heartbeat`)).toEqual([`${bus.channel}:heartbeat`, 0])
      expect(await redis.client.pubsub('NUMSUB', ack[0]!)).toEqual([ack[0], 0])
      expect(subscriber.status).toBe('ready')
    })

    it('a subscriber connection of your own that is closed when the bus closes: its failed UNSUBSCRIBE is reported (invalidation unsubscribe), close() resolves', async () => {
      const reports: string[] = []
      const subscriber = redis.connect({ retryStrategy: () => null, disconnectTimeout: 10 })
      const bus = createRedisInvalidationBus({ client: redis.client, subscriber, prefix: redis.prefix(), onError: (error, context) => void reports.push(`${context}: ${(error as Error).message}`) })
      await bus.ready(5_000)
      subscriber.disconnect()
      await vi.waitFor(() => expect(subscriber.status).toBe('end'), { timeout: 2_000, interval: 5 })
      await expect(bus.close()).resolves.toBeUndefined()
      expect(reports.filter((report) => report.startsWith('invalidation unsubscribe'))).toEqual([expect.stringMatching(/^invalidation unsubscribe: Connection is closed/)])
    })

    it('without timeoutMs, its publishTimeoutMs, which the token service reads, is 1,000', async () => {
      const bus = createRedisInvalidationBus({ client: redis.client, prefix: redis.prefix() })
      try {
        expect(bus.publishTimeoutMs).toBe(1_000)
      } finally {
        await bus.close()
      }
    })

    it('once closed: a listener subscribed then hears nothing, and a publish waits for no confirmation', async () => {
      const T = 3_000
      const bus = createRedisInvalidationBus({ client: redis.connect(), prefix: redis.prefix(), timeoutMs: T })
      await bus.ready(5_000)
      await bus.close()
      const heard: InvalidationMessage[] = []
      bus.subscribe((message) => void heard.push(message))
      const began = performance.now()
      await bus.publish({ kind: 'token', tokenHash: 'h1' })
      expect(performance.now() - began).toBeLessThan(T / 2)
      expect(heard).toEqual([])
    })

    it('publishes a message of kind all to its own listeners only: nothing goes over the channel', async () => {
      const client = redis.connect()
      const watcher = redis.connect()
      const bus = createRedisInvalidationBus({ client, prefix: redis.prefix(), heartbeatMs: false })
      try {
        await bus.ready(5_000)
        const published: string[] = []
        watcher.on('message', (from: string) => published.push(from))
        await watcher.subscribe(bus.channel, `${bus.channel}:marker`)
        const heard = nextInvalidation(bus, 'all')
        await bus.publish({ kind: 'all' })
        expect(await heard).toEqual({ kind: 'all' })
        // A PUBLISH would have gone out on the bus's client before this marker (one connection
        // keeps its commands in order), so it would have arrived before it.
        await client.publish(`${bus.channel}:marker`, 'm')
        await vi.waitFor(() => expect(published).toContain(`${bus.channel}:marker`), { timeout: 2_000, interval: 5 })
        expect(published).toEqual([`${bus.channel}:marker`])
      } finally {
        await bus.close()
        client.disconnect()
        watcher.disconnect()
      }
    })

    it('a subscriber connection of your own, handed over during its handshake, is subscribed once ready, not thrown out of it (regression: ioredis 5)', async () => {
      // ioredis 5 writes a SUBSCRIBE at once while the connection is in its handshake
      // (`connect`); the connection, then in subscriber mode, has its ready check (INFO)
      // refused and is dropped: here, with no retry, for good.
      const subscriber = redis.connect({ retryStrategy: () => null })
      const events: string[] = []
      subscriber.on('error', (error: Error) => events.push(`error: ${error.message}`))
      subscriber.on('close', () => events.push('close'))
      await once(subscriber, 'connect')
      expect(subscriber.status).toBe('connect')
      const bus = createRedisInvalidationBus({ client: redis.client, subscriber, prefix: redis.prefix() })
      // A new connection subscribing: given more than the 1 s default deadline on a loaded machine.
      await bus.ready(5_000)
      expect(bus.listening).toBe(true)
      expect(subscriber.status).toBe('ready')
      expect(events).toEqual([])
      await bus.close()
    })

    it('on a client without an offline queue (enableOfflineQueue: false), reports nothing at its start: its connection, still connecting or not yet (lazyConnect), is subscribed once ready (regression)', async () => {
      for (const options of [{ enableOfflineQueue: false }, { enableOfflineQueue: false, lazyConnect: true }]) {
        const client = redis.connect(options)
        client.on('error', () => {})
        const errors: string[] = []
        // Its own connection, `client.duplicate()`, is still connecting (or waiting) when the bus is created.
        const bus = createRedisInvalidationBus({ client, prefix: redis.prefix(), onError: (error, context) => errors.push(`${context}: ${(error as Error).message}`) })
        await bus.ready(5_000)
        expect(bus.listening, JSON.stringify(options)).toBe(true)
        expect(errors, JSON.stringify(options)).toEqual([])
        await bus.close()
        // And a subscriber connection of your own, not yet connected.
        const subscriber = redis.connect(options)
        subscriber.on('error', () => {})
        const given = createRedisInvalidationBus({ client: redis.client, subscriber, prefix: redis.prefix(), onError: (error, context) => errors.push(`${context}: ${(error as Error).message}`) })
        await given.ready(5_000)
        expect(given.listening, JSON.stringify(options)).toBe(true)
        expect(errors, JSON.stringify(options)).toEqual([])
        await given.close()
      }
    })

    it('on a lazyConnect client nothing has used yet, its heartbeats go out all the same (connecting it): a bus alone on its channel keeps hearing itself and listening, nothing reported', async () => {
      const client = redis.connect({ lazyConnect: true })
      const watcher = redis.connect()
      const errors: string[] = []
      // A timeoutMs a lazy connection makes on a loaded machine: the heartbeats themselves are watched.
      const bus = createRedisInvalidationBus({ client, prefix: redis.prefix(), heartbeatMs: 100, timeoutMs: 1_000, onError: (error, context) => errors.push(`${context}: ${(error as Error).message}`) })
      try {
        let heartbeats = 0
        watcher.on('message', () => void heartbeats++)
        await watcher.subscribe(`${bus.channel}:heartbeat`)
        await bus.ready(5_000)
        await vi.waitFor(() => expect(heartbeats).toBeGreaterThanOrEqual(3), { timeout: 5_000 })
        expect(client.status).toBe('ready')
        expect(bus.listening).toBe(true)
        expect(errors).toEqual([])
      } finally {
        await bus.close()
        client.disconnect()
        watcher.disconnect()
      }
    })

    it('a closed bus sends no more heartbeats and stops its heartbeat timer, though its client stays connected', async () => {
      const watcher = redis.connect()
      // The intervals the bus sets when created (its heartbeat's).
      const setInterval = vi.spyOn(globalThis, 'setInterval')
      const clearInterval = vi.spyOn(globalThis, 'clearInterval')
      let bus: RedisInvalidationBus | undefined
      try {
        bus = createRedisInvalidationBus({ client: redis.client, prefix: redis.prefix(), heartbeatMs: 50, onError: () => {} })
        const intervals = setInterval.mock.results.map((result) => result.value as unknown)
        setInterval.mockRestore()
        expect(intervals).toHaveLength(1)
        const heartbeatChannel = `${bus.channel}:heartbeat`
        let heartbeats = 0
        const markers: string[] = []
        watcher.on('message', (_channel: string, text: string) => void (text.startsWith('marker-') ? markers.push(text) : heartbeats++))
        await watcher.subscribe(heartbeatChannel)
        // Heartbeats go out on the bus's client, in order: once a marker sent on it has come
        // back, every heartbeat sent before has too.
        const marker = async (text: string) => {
          await redis.client.publish(heartbeatChannel, text)
          await vi.waitFor(() => expect(markers).toContain(text), { timeout: 5_000 })
        }
        await vi.waitFor(() => expect(heartbeats).toBeGreaterThanOrEqual(2), { timeout: 5_000 })
        await bus.close()
        expect(clearInterval).toHaveBeenCalledWith(intervals[0])
        await marker('marker-closed')
        const atClose = heartbeats
        // Six heartbeat intervals later.
        await new Promise((resolve) => setTimeout(resolve, 300))
        await marker('marker-later')
        expect(heartbeats).toBe(atClose)
        expect(redis.client.status).toBe('ready')
      } finally {
        setInterval.mockRestore()
        clearInterval.mockRestore()
        await bus?.close()
        watcher.disconnect()
      }
    })

    it('an invalidation published while its client is still connecting at the start is sent once connected, not refused: another bus hears it', async () => {
      const prefix = redis.prefix()
      const other = createRedisInvalidationBus({ client: redis.client, prefix })
      let client: Redis | undefined
      let bus: RedisInvalidationBus | undefined
      try {
        await other.ready(5_000)
        client = redis.connect()
        bus = createRedisInvalidationBus({ client, prefix, heartbeatMs: false })
        expect(client.status).toBe('connecting')
        const heard = nextInvalidation(other)
        await expect(bus.publish({ kind: 'token', tokenHash: 'h-early' })).resolves.toBeUndefined()
        expect(await heard).toEqual({ kind: 'token', tokenHash: 'h-early' })
      } finally {
        await Promise.all([bus?.close(), other.close()])
        client?.disconnect()
      }
    })

    it('refuses its own client as its subscriber: a subscribed connection cannot send the stores\' commands (ioredis 5; RESP2), so every store on it would fail (regression)', () => {
      const client = redis.connect({ lazyConnect: true })
      let thrown: unknown
      try {
        createRedisInvalidationBus({ client, subscriber: client, prefix: redis.prefix() })
      } catch (error) {
        thrown = error
      }
      expect(thrown).toBeInstanceOf(ConfigurationError)
      expect((thrown as ConfigurationError).option).toBe('subscriber')
    })

    it('subscribes again after its connection was dropped, even without ioredis resubscribing', async () => {
      const prefix = redis.prefix()
      const subscriber = redis.connect({ autoResubscribe: false })
      const id = await subscriber.client('ID')
      const bus = createRedisInvalidationBus({ client: redis.client, subscriber, prefix })
      // A new connection subscribing: given more than the 1 s default deadline on a loaded machine.
      await bus.ready(5_000)
      await redis.client.client('KILL', 'ID', String(id))
      expect(await settles(async () => (await redis.client.pubsub('NUMSUB', bus.channel))[1] === 1)).toBe(true)
      const received = nextInvalidation(bus)
      await redis.client.publish(bus.channel, JSON.stringify({ origin: 'elsewhere', kind: 'token', tokenHash: 'after' }))
      expect(await received).toEqual({ kind: 'token', tokenHash: 'after' })
      await bus.close()
    })
  })

  describe('a bus that cannot hear the others', () => {
    /** Two token services sharing one token database, each with its own bus and a minute of cache. */
    async function twoInstances(prefix: string) {
      const apps = createMemoryAppStore([{ id: 'app_w', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
      const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_w', active: true }])
      const { store, lookups } = countingTokenStore(createMemoryTokenStore())
      const busA = createRedisInvalidationBus({ client: redis.client, prefix })
      // B's subscriber is a connection of its own, so the test can drop it alone.
      const subscriberB = redis.connect()
      const subscriberId = await subscriberB.client('ID')
      const busB = createRedisInvalidationBus({ client: redis.client, subscriber: subscriberB, prefix })
      // New connections subscribing: given more than the 1 s default deadline on a loaded machine.
      await Promise.all([busA.ready(5_000), busB.ready(5_000)])
      const service = (invalidations: RedisInvalidationBus) =>
        createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations })
      return {
        a: service(busA),
        b: service(busB),
        busB,
        lookups,
        drop: () => redis.client.client('KILL', 'ID', String(subscriberId)),
        close: () => Promise.all([busA.close(), busB.close()]),
      }
    }

    it('while its connection is down, the token service reads the store: a rotation there is seen at once (regression)', async () => {
      const { a, b, busB, lookups, drop, close } = await twoInstances(redis.prefix())
      const created = await a.create({ userId: 'alice', name: 'ci', servers: ['app_w'], expiresInDays: 7 })
      expect(await b.authenticate(created.token)).toMatchObject({ ok: true })
      const before = lookups()
      expect(await b.authenticate(created.token)).toMatchObject({ ok: true })
      expect(lookups()).toBe(before) // from B's cache
      expect(busB.listening).toBe(true)

      // B's subscription is lost; A rotates and its PUBLISH reaches nobody.
      await drop()
      expect(await settles(async () => busB.listening === false)).toBe(true)
      const rotated = await a.rotate(created.id, { kind: 'session', userId: 'alice' })
      expect(await b.authenticate(created.token)).toMatchObject({ ok: false })
      expect(await b.authenticate(rotated.token)).toMatchObject({ ok: true })

      // Subscribed again (ioredis reconnects): B caches again, and hears A again.
      expect(await settles(async () => busB.listening === true)).toBe(true)
      await b.authenticate(rotated.token)
      const cached = lookups()
      expect(await b.authenticate(rotated.token)).toMatchObject({ ok: true })
      expect(lookups()).toBe(cached)
      const heard = nextInvalidation(busB)
      await a.revoke('alice', created.id)
      await heard
      expect(await b.authenticate(rotated.token)).toMatchObject({ ok: false })
      await close()
    })

    it('records cached before the connection was lost are dropped, not served again after it comes back', async () => {
      const { a, b, busB, lookups, drop, close } = await twoInstances(redis.prefix())
      const created = await a.create({ userId: 'alice', name: 'ci', servers: ['app_w'], expiresInDays: 7 })
      await b.authenticate(created.token)
      const dropped = nextInvalidation(busB, 'all')
      await drop()
      await dropped
      expect(await settles(async () => busB.listening === true)).toBe(true)
      const before = lookups()
      await b.authenticate(created.token)
      expect(lookups()).toBe(before + 1)
      await close()
    })
  })

  it('keys land under the default prefix when none is given', async () => {
    const id = `default-prefix-${Date.now()}-${Math.random()}`
    const sessions = createRedisSessionStore({ client: redis.client })
    await sessions.set(id, PIN, 60_000)
    try {
      expect(await redis.client.exists(`${DEFAULT_REDIS_PREFIX}session:${id}`)).toBe(1)
    } finally {
      await sessions.delete(id)
    }
  })

  describe('TTLs that cannot be sent as PX', () => {
    it('Infinity, NaN or past 2^53 - 1: the call rejects with a RangeError and sends nothing (Redis would refuse PX Infinity on every call)', async () => {
      const client = recording(redis.client)
      const options = { client, prefix: redis.prefix() }
      const sessions = createRedisSessionStore(options)
      const counters = createRedisRateLimitStore(options)
      const cache = createRedisCacheStore<{ n: number }>(options)
      for (const ttl of [Number.POSITIVE_INFINITY, Number.NaN, 2 ** 53]) {
        const calls = [sessions.get('s', ttl), sessions.set('s', PIN, ttl), counters.increment('k', START, ttl)]
        if (!Number.isNaN(ttl)) calls.push(cache.set('k', { n: 1 }, ttl) as Promise<void>)
        for (const call of calls) await expect(call, String(ttl)).rejects.toThrow(RangeError)
        await expect(sessions.set('s', PIN, ttl)).rejects.toThrow(/finite number of milliseconds/)
      }
      expect(client.commands).toEqual([])
      // The largest whole number Redis is given is taken as it is.
      expect(await sessions.set('s', PIN, Number.MAX_SAFE_INTEGER)).toBe(true)
      expect(await redis.client.pttl(`${options.prefix}session:s`)).toBeGreaterThan(2 ** 52)
    })
  })

  describe('a Redis that stalls: the stall breaker shared by the stores of a client (regression: counts of a hang landing at once)', () => {
    // Long enough that a loaded host answers the calls expected to succeed within it.
    const T = 500
    const STALLED = new RegExp(`not sent: Redis is stalled \\(a command got no answer within ${T} ms`)

    it('once a call passes its deadline unanswered, the calls of every store on the client fail at once, unsent; the counter is not inflated, and all works once Redis answers', async () => {
      const client = redis.connect()
      await client.ping() // connected: the first call below is no connection within T
      const sent = recording(client)
      const prefix = redis.prefix()
      const options = { client: sent, prefix, timeoutMs: T }
      const counters = createRedisRateLimitStore(options)
      const sessions = createRedisSessionStore(options)
      const cache = createRedisCacheStore<{ n: number }>({ ...options, localTtlMs: 0 })
      expect(await counters.increment('k', START, W)).toBe(1)
      expect(await sessions.set('s', PIN, 60_000)).toBe(true)

      const stall = holdConnection(client, redis.client, `${prefix}hold`)
      const started = performance.now()
      await expect(counters.increment('k', START, W)).rejects.toThrow(`Redis script rate-limit increment did not answer within ${T} ms`)
      expect(performance.now() - started).toBeGreaterThanOrEqual(T - 1)

      await nextTurn()
      sent.commands.length = 0
      const failures: string[] = []
      for (let i = 0; i < 20; i++) {
        const call = [() => counters.increment('k', START, W), () => sessions.get('s', 60_000), () => cache.get('c')][i % 3]!
        failures.push(...(await outcomes([call()])))
      }
      // Refused at once, unsent (nothing reached the connection), rather than each waited out.
      expect(failures).toEqual(Array(20).fill(expect.stringMatching(STALLED)))
      expect(sent.commands).toEqual([])

      await stall.release()
      await client.ping() // answered after every answer before it on this connection
      // 1, the call that timed out (sent before the stall showed; its answer closed the
      // breaker), then this one: none of the 20.
      expect(await counters.increment('k', START, W)).toBe(3)
      expect(await sessions.get('s', 60_000)).toEqual(PIN)
    })

    it('one probe at a time, timeoutMs after the stall showed: a PING, never the store command, and nothing more once it gave up', async () => {
      const client = redis.connect()
      await client.ping() // connected: the first call below is no connection within T
      const sent = recording(client)
      const prefix = redis.prefix()
      const counters = createRedisRateLimitStore({ client: sent, prefix, timeoutMs: T })
      expect(await counters.increment('k', START, W)).toBe(1)
      const stall = holdConnection(client, redis.client, `${prefix}hold`)
      await expect(counters.increment('k', START, W)).rejects.toThrow(/did not answer within/)
      await nextTurn()
      await expect(counters.increment('k', START, W)).rejects.toThrow(STALLED)

      // A probe is due timeoutMs after the deadline passed. A timer of T can fire a millisecond
      // or two before that by performance.now() (libuv counts from the loop's cached time, taken
      // before the deadline's callback ran): the call meant as the probe was then refused and the
      // first of the ten below became the probe (seen once in CI). Wait a margin past it.
      await new Promise((resolve) => setTimeout(resolve, T + 25))
      sent.commands.length = 0
      const started = performance.now()
      const probe = counters.increment('k', START, W)
      // While the probe waits, the others still fail at once.
      expect(await outcomes(Array.from({ length: 10 }, () => counters.increment('k', START, W)))).toEqual(Array(10).fill(expect.stringMatching(STALLED)))
      await expect(probe).rejects.toThrow(`Redis script rate-limit increment did not answer within ${T} ms`)
      expect(performance.now() - started).toBeGreaterThanOrEqual(T - 1)
      expect(sent.commands).toEqual(['PING'])
      // The next probe is not due before another timeoutMs.
      await expect(counters.increment('k', START, W)).rejects.toThrow(STALLED)

      await stall.release()
      await client.ping()
      // The PING answered late sent no increment: 1, the call that timed out, this one.
      expect(await counters.increment('k', START, W)).toBe(3)
      expect(sent.commands).toEqual(['PING', 'EVALSHA'])
    })

    it.each([true, false])(
      'a stall that ends with the connection reset (autoResendUnfulfilledCommands: %s): only a call sent before the stall showed can be replayed, and the breaker closes',
      async (resend) => {
        const client = redis.connect({ autoResendUnfulfilledCommands: resend, retryStrategy: () => 10 })
        const prefix = redis.prefix()
        const counters = createRedisRateLimitStore({ client, prefix, timeoutMs: T })
        const id = (await client.client('ID')) as number
        expect(await counters.increment('k', START, W)).toBe(1)
        holdConnection(client, redis.client, `${prefix}hold`)
        await expect(counters.increment('k', START, W)).rejects.toThrow(/did not answer within/)
        await nextTurn()
        const failed = await outcomes(Array.from({ length: 20 }, () => counters.increment('k', START, W)))
        expect(failed).toEqual(Array(20).fill(expect.stringMatching(STALLED)))

        const back = once(client, 'ready')
        await redis.client.client('KILL', 'ID', id)
        await back
        // Re-sent first, the BLPOP holds the new connection too, until something is pushed.
        if (resend) await redis.client.lpush(`${prefix}hold`, 'go')
        // Closed by the replayed call's answer, or else by the next probe (a PING, then this call).
        const count = await vi.waitFor(() => counters.increment('k', START, W), { timeout: 5_000, interval: 10 })
        expect(count).toBe(resend ? 3 : 2)
      },
    )

    it('a Redis error reply closes it as a reply does (no probe needed)', async () => {
      const client = redis.connect()
      const sent = recording(client)
      const prefix = redis.prefix()
      const sessions = createRedisSessionStore({ client: sent, prefix, timeoutMs: T })
      await redis.client.rpush(`${prefix}session:list`, 'x') // GETEX on a list: WRONGTYPE
      const stall = holdConnection(client, redis.client, `${prefix}hold`)
      await expect(sessions.get('list', 60_000)).rejects.toThrow(/did not answer within/)
      await nextTurn()
      await expect(sessions.get('s', 60_000)).rejects.toThrow(STALLED)
      await stall.release()
      await client.ping() // the late answer, WRONGTYPE, is in
      sent.commands.length = 0
      expect(await sessions.get('s', 60_000)).toBeUndefined()
      expect(sent.commands).toEqual(['GETEX'])
    })

    it('a stall of this process is no stall of Redis: an answer left unread while the event loop was held past the deadline opens nothing, and is the call\'s', async () => {
      const client = redis.connect()
      // Connected first: the first call is no connection and ready check within the deadline.
      await client.ping()
      // A deadline a loaded machine answers within, and a hold well past it (by more than the
      // 20 ms that count as noticed on time), long enough for Redis to have answered meanwhile.
      const counters = createRedisRateLimitStore({ client, prefix: redis.prefix(), timeoutMs: 300 })
      expect(await counters.increment('k', START, W)).toBe(1)
      // Out of the socket's read callback, so the answer cannot be read before the timers run.
      await nextTurn()
      const late = counters.increment('k', START, W)
      // Held: Redis answers meanwhile, and the answer waits on the socket
      holdThisProcess(1_000)
      // The answer that waited on the socket is the call's (before, it failed: a count Redis
      // made was served fail open, past the limit; test/stores/rate-limit-load-audit.test.ts).
      expect(await late).toBe(2)
      // Sent and answered at once, with no probe: Redis never stalled.
      expect(await counters.increment('k', START, W)).toBe(3)
    })

    /**
     * A counter counted once, then a second increment begun (`late`) on an ioredis client with
     * enableAutoPipelining: it sends in a setImmediate (as node-redis always does), so a process
     * held right after the call sends its command only once the hold is over.
     */
    async function pipelinedIncrement() {
      const client = redis.connect({ enableAutoPipelining: true })
      await client.ping()
      const counters = createRedisRateLimitStore({ client, prefix: redis.prefix(), timeoutMs: 300 })
      expect(await counters.increment('k', START, W)).toBe(1)
      await nextTurn()
      return { counters, late: counters.increment('k', START, W) }
    }

    // Redis must answer within the 20 ms the call waits (judged once this process has read its
    // sockets, however busy it is again): a Redis itself starved longer fails the call, rightly,
    // so on a loaded host a run may fail that way; each try has a prefix of its own.
    it('so too when the client writes its commands only on the next turn (ioredis\' enableAutoPipelining): the command went out after the hold, and its answer, a moment later, is the call\'s (regression: judged at once then, it failed and opened the breaker)', { retry: 2 }, async () => {
      const { counters, late } = await pipelinedIncrement()
      // Held: the command waits in the client, unsent, while its deadline passes
      holdThisProcess(1_000)
      expect(await late).toBe(2)
      // Redis never stalled: no probe, the next call sent and answered at once.
      expect(await counters.increment('k', START, W)).toBe(3)
    })

    it('and when this process is held again right after that command went out, past the moment the call waits for its answer: the answer that waited on the socket is still the call\'s (regression: the wait\'s timer ran before the socket was read, the call failed and opened the breaker)', { retry: 2 }, async () => {
      const { counters, late } = await pipelinedIncrement()
      // Queued after the client's own setImmediate, so it runs once the command is written:
      // the process is busy again (the work that piled up during the first hold), for longer
      // than the 20 ms the call waits, while Redis answers and the answer waits unread.
      setImmediate(() => holdThisProcess(200))
      holdThisProcess(1_000)
      expect(await late).toBe(2)
      expect(await counters.increment('k', START, W)).toBe(3)
    })

    it('an error reply left unread while the event loop was held is the call\'s error, not a deadline, and opens nothing', async () => {
      const client = redis.connect()
      await client.ping()
      const prefix = redis.prefix()
      const sessions = createRedisSessionStore({ client, prefix, timeoutMs: 300 })
      await redis.client.rpush(`${prefix}session:list`, 'x') // GETEX on a list: WRONGTYPE
      await nextTurn()
      const late = sessions.get('list', 60_000)
      // Held: Redis answers WRONGTYPE meanwhile, unread
      holdThisProcess(1_000)
      await expect(late).rejects.toThrow(/WRONGTYPE/)
      expect(await sessions.get('s', 60_000)).toBeUndefined()
    })

    it('a Redis hung while this process was held too still opens it: the call fails once no answer came in the moment it waits for one', async () => {
      const client = redis.connect()
      await client.ping()
      const prefix = redis.prefix()
      const counters = createRedisRateLimitStore({ client, prefix, timeoutMs: T })
      const stall = holdConnection(client, redis.client, `${prefix}hold`)
      await nextTurn()
      const late = counters.increment('k', START, W)
      // busy, and Redis answers nothing meanwhile
      holdThisProcess(T + 300)
      await expect(late).rejects.toThrow(`did not answer within ${T} ms`)
      await expect(counters.increment('k', START, W)).rejects.toThrow(STALLED)
      await stall.release()
    })

    it('an invalidation PUBLISH is sent even while it is open, and lands once Redis answers: a token revoked during a stall is refused by the other instances (regression)', async () => {
      const prefix = redis.prefix()
      const { apps, subscriptions, store, errors, onError } = tokenWorld()
      // A's commands go through a connection the test holds; B's through another, never held.
      const client = redis.connect()
      const sent = recording(client)
      const busA = createRedisInvalidationBus({ client: sent, subscriber: redis.connect(), prefix, timeoutMs: T, heartbeatMs: false, onError })
      const busB = createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: T, heartbeatMs: false, onError })
      // New connections subscribing: given more than T on a loaded machine.
      await Promise.all([busA.ready(5_000), busB.ready(5_000)])
      const a = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations: busA, onError })
      const b = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations: busB, onError })
      const created = await a.create({ userId: 'alice', name: 'ci', servers: ['app_w'], expiresInDays: 7 })
      expect(await b.authenticate(created.token)).toMatchObject({ ok: true }) // now in B's cache

      // A's Redis stalls, and a session lookup on A's client opens the breaker.
      const sessions = createRedisSessionStore({ client: sent, prefix, timeoutMs: T })
      const stall = holdConnection(client, redis.client, `${prefix}hold`)
      await expect(sessions.get('s', 60_000)).rejects.toThrow(/did not answer within/)
      await nextTurn()
      await expect(sessions.get('s', 60_000)).rejects.toThrow(STALLED)

      // Revoked on A meanwhile: the PUBLISH is sent anyway, waits on the held connection, and
      // its deadline goes to onError. It is no probe, and closes nothing: the store calls
      // made while it waits still fail at once, unsent.
      sent.commands.length = 0
      const heard = nextInvalidation(busB)
      const revoking = a.revoke('alice', created.id) // waits for its PUBLISH
      await vi.waitFor(() => expect(sent.commands).toEqual(['PUBLISH']), { timeout: 1_000, interval: 1 })
      expect(await outcomes(Array.from({ length: 5 }, () => sessions.get('s', 60_000)))).toEqual(Array(5).fill(expect.stringMatching(STALLED)))
      expect(sent.commands).toEqual(['PUBLISH'])
      await revoking
      expect(errors).toEqual([`invalidation publish: Redis PUBLISH did not answer within ${T} ms`])

      // Redis answers: the invalidation lands late, as a late one should, and B refuses the token.
      await stall.release()
      expect(await Promise.race([heard, new Promise((resolve) => setTimeout(resolve, 2_000, 'never heard'))])).toEqual({
        kind: 'token',
        tokenHash: expect.any(String),
      })
      expect(await b.authenticate(created.token)).toMatchObject({ ok: false })
      // The late answers (the lookup's, then the PUBLISH's) closed the breaker: sent at once, no
      // probe (the token service may send its PUBLISH again meanwhile: a duplicate is harmless).
      sent.commands.length = 0
      expect(await sessions.get('s', 60_000)).toBeUndefined()
      expect(sent.commands.filter((command) => command !== 'PUBLISH')).toEqual(['GETEX'])
      await Promise.all([a.close(), b.close()])
      await Promise.all([busA.close(), busB.close()])
    })

    /** A client of the test's Redis whose every command is answered `ms` after it is called. */
    const slowClient = (ms: number): RedisCommandClient => ({
      status: 'ready',
      call: (command, ...args) => new Promise((resolve) => setTimeout(resolve, ms)).then(() => redis.client.call(command, ...args)),
    })
    /**
     * As {@link slowClient}, but a script (the increments) is sent on to Redis only once
     * `release()` is called: its answer comes after its caller gave up however late this
     * process noticed the deadline (one noticed 80 ms late would take an answer due 100 ms
     * after it, rightly: docs/stores.md).
     */
    const slowClientHoldingScripts = (ms: number) => {
      const held: Array<() => void> = []
      const scripts: Array<Promise<unknown>> = []
      const client: RedisCommandClient = {
        status: 'ready',
        call: (command, ...args) => {
          if (!command.startsWith('EVAL')) return new Promise((resolve) => setTimeout(resolve, ms)).then(() => redis.client.call(command, ...args))
          const answer = new Promise<void>((resolve) => held.push(resolve)).then(() => redis.client.call(command, ...args))
          scripts.push(answer.catch(() => {}))
          return answer
        },
      }
      /** Sends the scripts held so far on to Redis; resolves once each is answered. */
      const release = () => {
        for (const resolve of held.splice(0)) resolve()
        return Promise.all(scripts.splice(0))
      }
      return { client, release }
    }

    it('a slow Redis is no hung one: a call that passes its deadline while other calls are answered opens nothing, so a store with a longer deadline on the same client is served (regression)', async () => {
      // Every lookup is answered 300 ms after it is called; every increment only once released,
      // after it timed out.
      const { client: slow, release } = slowClientHoldingScripts(300)
      const prefix = redis.prefix()
      const counters = createRedisRateLimitStore({ client: slow, prefix, timeoutMs: 200 })
      const sessions = createRedisSessionStore({ client: slow, prefix, timeoutMs: 2_000 })
      // A lookup answered at about 300 ms, inside the window of the increment sent at 150 ms
      // (the 150 ms timer runs before the lookup's 300 ms one however late both are), whose own
      // deadline passes at 350 ms and whose answer is released once it gave up.
      const first = sessions.get('s1', 60_000)
      await new Promise((resolve) => setTimeout(resolve, 150))
      await expect(counters.increment('k', START, W)).rejects.toThrow('Redis script rate-limit increment did not answer within 200 ms')
      // Before that late answer: sent, not refused as stalled.
      expect(await outcomes([first, sessions.get('s2', 60_000)])).toEqual(['fulfilled', 'fulfilled'])
      await release()

      // And a steady stream, where every increment times out: once the lookups are answered
      // (the first after 300 ms, before the first increment's deadline), none is refused.
      const message = (call: unknown) => Promise.resolve(call).then(() => 'fulfilled', (error: Error) => error.message)
      const lookups: Array<Promise<string>> = []
      const increments: Array<Promise<string>> = []
      for (let i = 0; i < 30; i++) {
        lookups.push(message(sessions.get(`s${i}`, 60_000)))
        if (i >= 8) increments.push(message(counters.increment('k', START, W)))
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
      expect(await Promise.all(lookups)).toEqual(Array(30).fill('fulfilled'))
      expect(await Promise.all(increments)).toEqual(Array(22).fill('Redis script rate-limit increment did not answer within 200 ms'))
      // Their counts were made, only late: the 23rd increment is answered 23.
      expect((await release()).at(-1)).toBe(23)
    })

    it('one request after another, as the dispatcher makes them: the lookup that follows an increment past its deadline is sent and served (regression: refused as stalled, 503)', async () => {
      // Every command is answered 400 ms after it is called; the increment gives up at 100 ms
      // (far enough: on a loaded host, a deadline noticed late waits a moment for its answer, and
      // one of 150 ms came within it).
      const slow = slowClient(400)
      const prefix = redis.prefix()
      const counters = createRedisRateLimitStore({ client: slow, prefix, timeoutMs: 100 })
      const sessions = createRedisSessionStore({ client: slow, prefix, timeoutMs: 1_000 })
      for (let i = 0; i < 4; i++) {
        await expect(counters.increment('k', START, W)).rejects.toThrow('did not answer within 100 ms')
        expect(await sessions.get(`s${i}`, 60_000), `request ${i}`).toBeUndefined()
        // Nothing else in flight between two requests.
        await new Promise((resolve) => setTimeout(resolve, 450))
      }
    })

    it.each([
      // A real one (never connected, its command path replaced): its options as ioredis keeps them.
      ['an ioredis client with its default options', () => new IOREDIS[redis.kind]({ lazyConnect: true })],
      ['a client with a ready event and no options', () => new EventEmitter()],
    ])('%s, ready again (reconnected, its handshake answered), closes the breaker at once, not at the next probe (regression: a Sentinel client moved off a hung primary was refused a second more)', async (_kind, made) => {
      let answer = false
      const client = Object.assign(made(), {
        status: 'ready',
        call: () => (answer ? Promise.resolve(null) : new Promise(() => {})),
      })
      const sessions = createRedisSessionStore({ client, prefix: redis.prefix(), timeoutMs: 1_000 })
      await expect(sessions.get('s1', 60_000)).rejects.toThrow('Redis GETEX did not answer within 1000 ms')
      await nextTurn()
      await expect(sessions.get('s2', 60_000)).rejects.toThrow('Redis GETEX not sent: Redis is stalled')
      // Connected again, to a Redis that answers: the next call is sent, well before the probe.
      answer = true
      client.emit('ready')
      expect(await sessions.get('s3', 60_000)).toBeUndefined()
    })

    it("the ready of a client made with ioredis' enableReadyCheck: false (which can come with nothing answered: its setup commands' failures are ignored) leaves the breaker open until its probe", async () => {
      // A real ioredis client (never connected) with its command path replaced by one Redis
      // never answers: the option is read where ioredis keeps it.
      const client = new IOREDIS[redis.kind]({ lazyConnect: true, enableReadyCheck: false })
      Object.assign(client, { status: 'ready', call: () => new Promise(() => {}) })
      const sessions = createRedisSessionStore({ client, prefix: redis.prefix(), timeoutMs: 1_000 })
      await expect(sessions.get('s1', 60_000)).rejects.toThrow('Redis GETEX did not answer within 1000 ms')
      await nextTurn()
      // Reconnected to the same hung Redis: the next call is still refused, not left to wait.
      client.emit('ready')
      await expect(sessions.get('s2', 60_000)).rejects.toThrow('Redis GETEX not sent: Redis is stalled')
    })

    it('a breaker opened while the client says its connection is down refuses in those words, not as a stalled Redis (regression: a command that never left the offline queue was reported as one Redis had not answered)', async () => {
      const client: RedisCommandClient & { status: string } = { status: 'ready', call: () => new Promise(() => {}) }
      const sessions = createRedisSessionStore({ client, prefix: redis.prefix(), timeoutMs: 1_000 })
      await expect(sessions.get('s1', 60_000)).rejects.toThrow('Redis GETEX did not answer within 1000 ms')
      await nextTurn()
      client.status = 'reconnecting'
      await expect(sessions.get('s2', 60_000)).rejects.toThrow(/^Redis GETEX not sent: the Redis connection is not ready \(reconnecting\)$/)
      // Up again, before the next probe is due: the breaker's own words.
      client.status = 'ready'
      await expect(sessions.get('s3', 60_000)).rejects.toThrow('Redis GETEX not sent: Redis is stalled (a command got no answer within 1000 ms')
    })

    it('a client that never answers (as a hung Redis; a real one is held in test/robustness/redis-faults.test.ts) is still noticed: each store refuses without sending once it has been silent for its own deadline, a store with a longer one still sends', async () => {
      const hung: RedisCommandClient = { status: 'ready', call: () => new Promise(() => {}) }
      const prefix = redis.prefix()
      const counters = createRedisRateLimitStore({ client: hung, prefix, timeoutMs: 300 })
      const sessions = createRedisSessionStore({ client: hung, prefix, timeoutMs: 1_000 })
      await expect(counters.increment('k', START, W)).rejects.toThrow('did not answer within 300 ms')
      // In a later turn, as the next request: a deadline noticed late opens the breaker after this one.
      await nextTurn()
      // Silent for 300 ms: the session store (1,000 ms) still sends, and waits its own deadline;
      // the rate-limit store (300 ms) is refused at once.
      const lookup = expect(sessions.get('s1', 60_000)).rejects.toThrow('did not answer within 1000 ms')
      // "not sent": refused without a command, so without waiting for one.
      await expect(counters.increment('k', START, W)).rejects.toThrow('not sent: Redis is stalled (a command got no answer within 300 ms')
      await lookup
      // Silent for longer than its deadline now: the session store is refused at once too,
      // until the next probe.
      await expect(sessions.get('s2', 60_000)).rejects.toThrow(/not sent: Redis is stalled|did not answer within 1000 ms/)
    })
  })

  describe('a Redis that does not answer', () => {
    it('every call rejects after timeoutMs (nothing listens on the port)', async () => {
      const client = await redis.connectUnreachable()
      const options = { client, prefix: redis.prefix(), timeoutMs: 50 }
      const started = Date.now()
      const calls: Array<Promise<unknown>> = [
        Promise.resolve(createRedisRateLimitStore(options).increment('k', START, W)),
        Promise.resolve(createRedisSessionStore(options).get('s', 60_000)),
        Promise.resolve(createRedisSessionStore(options).set('s', PIN, 60_000)),
        Promise.resolve(createRedisCacheStore<{ n: number }>(options).get('k')),
      ]
      for (const call of calls) await expect(call).rejects.toThrow(/did not answer within 50 ms/)
      expect(Date.now() - started).toBeLessThan(2_000)

      const seen: InvalidationMessage[] = []
      const bus = createRedisInvalidationBus(options)
      bus.subscribe((m) => seen.push(m))
      await expect(bus.ready()).rejects.toThrow(/SUBSCRIBE .* did not answer within 50 ms/)
      // Local listeners still hear it; the other instances cannot, and the caller is told.
      // The calls above showed the stall, and the client has never been ready: the invalidation
      // is refused at once, unsent, rather than left in its offline queue, one more each time
      // the token service sends it again (test/stores/redis-soak-audit.test.ts).
      await expect(bus.publish({ kind: 'token', tokenHash: 'h' })).rejects.toThrow(/PUBLISH not sent: the Redis connection is not ready/)
      expect(seen).toEqual([{ kind: 'token', tokenHash: 'h' }])
      await bus.close()
      client.disconnect()
    })

    it('a client never ready, on its way to a Redis that is not there, gets no probe once its stall showed: a call timeoutMs later is refused at once, unsent, naming the connection\'s state', async () => {
      const client = await redis.connectUnreachable()
      try {
        // The commands the store hands the client.
        const sent: string[] = []
        const call = client.call.bind(client) as (...args: RedisArgument[]) => Promise<unknown>
        Object.assign(client, { call: (...args: RedisArgument[]) => (sent.push(String(args[0])), call(...args)) })
        const sessions = createRedisSessionStore({ client, prefix: redis.prefix(), timeoutMs: 50 })
        await expect(sessions.get('s', 60_000)).rejects.toThrow(/did not answer within 50 ms/)
        expect(sent).toEqual(['GETEX'])
        // Past the time of the next probe: its PING would only wait in the offline queue.
        await new Promise((resolve) => setTimeout(resolve, 100))
        await expect(sessions.get('s', 60_000)).rejects.toThrow(/^Redis GETEX not sent: the Redis connection is not ready \((connecting|reconnecting)\)$/)
        expect(sent).toEqual(['GETEX'])
      } finally {
        client.disconnect()
      }
    })

    it('ready() on a bus closed while it waits, or after, rejects at once naming the channel (regression: it waited out its deadline, the process held by nothing that could come)', async () => {
      const client = await redis.connectUnreachable()
      const bus = createRedisInvalidationBus({ client, prefix: redis.prefix(), timeoutMs: 50 })
      // A deadline far past the test's own: only the close can end the wait in time.
      const waiting = bus.ready(600_000)
      await bus.close()
      await expect(waiting).rejects.toThrow(`Redis invalidation bus on ${bus.channel} is closed`)
      await expect(bus.ready(600_000)).rejects.toThrow(/is closed/)
      client.disconnect()
    })
  })
})

describe('Redis stores: options', () => {
  const client = { call: async () => null, duplicate: () => ({}) as never }
  const cases: Array<[string, () => unknown]> = [
    ['client', () => createRedisSessionStore({} as never)],
    ['client', () => createRedisRateLimitStore({ client: {} as never })],
    ['prefix', () => createRedisSessionStore({ client, prefix: '' })],
    ['timeoutMs', () => createRedisRateLimitStore({ client, timeoutMs: 0 })],
    ['timeoutMs', () => createRedisRateLimitStore({ client, timeoutMs: Number.POSITIVE_INFINITY })],
    ['localTtlMs', () => createRedisCacheStore({ client, localTtlMs: -1 })],
    ['localTtlMs', () => createRedisCacheStore({ client, localTtlMs: Number.POSITIVE_INFINITY })],
    // lru-cache would refuse it with a TypeError of its own, naming no option.
    ['localTtlMs', () => createRedisCacheStore({ client, localTtlMs: 2.5 })],
    ['localMax', () => createRedisCacheStore({ client, localMax: 0.5 })],
    ['now', () => createRedisCacheStore({ client, now: 5 as never })],
    ['subscriber', () => createRedisInvalidationBus({ client: { call: client.call } })],
    ['subscriber', () => createRedisInvalidationBus({ client, subscriber: {} as never })],
    ['onError', () => createRedisInvalidationBus({ client, onError: 'log' as never })],
  ]
  it.each(cases)('refuses a bad "%s" with a ConfigurationError naming it', (option, create) => {
    let thrown: unknown
    try {
      create()
    } catch (error) {
      thrown = error
    }
    expect(thrown).toBeInstanceOf(ConfigurationError)
    expect((thrown as ConfigurationError).option).toBe(option)
  })
})

describe('Redis invalidation bus: its subscriber connection failing again and again (a Redis that is down)', () => {
  /** A port nothing listens on: every connection is refused at once. */
  async function closedPort(): Promise<number> {
    const server = createNetServer()
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    const { port } = server.address() as AddressInfo
    await new Promise((resolve) => server.close(resolve))
    return port
  }

  it('the default logger writes one line per 10 s, the next naming how many came meanwhile; an onError of yours hears every refusal', async () => {
    const port = await closedPort()
    const lines: string[] = []
    const spy = vi.spyOn(console, 'error').mockImplementation((line: unknown) => void lines.push(String(line)))
    const heard: string[] = []
    // Reconnecting every 20 ms: dozens of refusals in the second below.
    const clients = [0, 1].map(() => new IOREDIS.ioredis({ host: '127.0.0.1', port, retryStrategy: () => 20, maxRetriesPerRequest: 0, lazyConnect: true }))
    const silent = createRedisInvalidationBus({ client: clients[0]!, prefix: 'bus-log-default' })
    const told = createRedisInvalidationBus({ client: clients[1]!, prefix: 'bus-log-own', onError: (_error, context) => void heard.push(context) })
    try {
      await new Promise((resolve) => setTimeout(resolve, 1_000))
      const subscriberLines = lines.filter((line) => line.startsWith('[mcp-dispatch] invalidation subscriber'))
      expect(subscriberLines).toHaveLength(1)
      expect(subscriberLines[0]).toMatch(/^\[mcp-dispatch\] invalidation subscriber: Error: connect ECONNREFUSED/)
      expect(heard.filter((context) => context === 'invalidation subscriber').length).toBeGreaterThan(5)
    } finally {
      spy.mockRestore()
      await silent.close().catch(() => {})
      await told.close().catch(() => {})
      for (const client of clients) client.disconnect()
    }
  })
})

describe.runIf(redisAvailable)('node-redis (the adapter of docs/stores.md): a process held past a deadline', () => {
  // As the ioredis case above: Redis must answer within the 20 ms the call waits (a starved
  // Redis may not: tried again, under a prefix of its own).
  it('takes the answer to a command node-redis sent once the hold was over (it writes on the next turn), and opens nothing (regression: judged at once then, it failed and opened the breaker)', { retry: 2 }, async () => {
    const client = createClient({ url: REDIS_URL })
    client.on('error', () => {})
    await client.connect()
    const adapter = {
      call: (...args: RedisArgument[]) => client.sendCommand(args.map(String)),
      get status() {
        return client.isReady ? 'ready' : 'reconnecting'
      },
    }
    const prefix = `mcp-dispatch-test:node-redis-held:${process.pid}:${Date.now()}:`
    const counters = createRedisRateLimitStore({ client: adapter, prefix, timeoutMs: 300 })
    try {
      expect(await counters.increment('k', START, W)).toBe(1)
      await nextTurn()
      const late = counters.increment('k', START, W)
      // Held: the command waits in node-redis, unsent, while its deadline passes
      holdThisProcess(1_000)
      expect(await late).toBe(2)
      expect(await counters.increment('k', START, W)).toBe(3)
    } finally {
      await client.sendCommand(['DEL', `${prefix}rl:k`])
      client.destroy()
    }
  })
})

describe('nothing leaks', () => {
  it('leaves no socket or timer behind: every connection a store or bus opened is closed', async () => {
    expect(await leakedHandles(baseline)).toEqual({})
  })
})
