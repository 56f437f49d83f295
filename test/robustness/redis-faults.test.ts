/**
 * A Redis that is down or hung never holds a request: the Redis stores give up after their
 * `timeoutMs`, and the dispatcher applies its failure policy through the real pipeline (web
 * adapter): the rate limit fails open (served, reported), the session store answers 503 with
 * `Retry-After`, a pin that cannot be written is reported and the answer that opened its session
 * is that 503 too.
 * Two ways down: a port where nothing listens (ioredis' defaults queue the commands and retry
 * forever), and a Redis that stops answering (a loopback proxy in front of the real Redis that
 * stops forwarding, or a connection held by a `BLPOP`: only this test's connection hangs,
 * never the other test files' clients of the same Redis, as `CLIENT PAUSE` would). Once one
 * call has passed its deadline, the stores' calls fail at once until Redis answers again (the
 * stall breaker). Afterwards no socket or timer of ours is left (the last test checks the
 * handles of this process).
 */
import * as net from 'node:net'
import {
  createMemoryAppStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { type RedisInvalidationBus, createRedisInvalidationBus, createRedisRateLimitStore } from 'mcp-dispatch/redis'
import { describe, expect, it, vi } from 'vitest'
import { REDIS_URL, type RedisTestContext, describeRedis, holdConnection } from '../helpers/redis.js'
import { type Fixture, activeResources, createRedisStorePipeline, createStorePipeline, jsonRpcError, leakedHandles } from './support.js'

const baseline = activeResources()
/**
 * The Redis stores' deadline in these tests; the dispatcher's own stays at its 5 s default. Long
 * enough that a loaded host's Redis answers the calls expected to succeed (at 150 ms a first
 * count or pin could miss it), short enough that each outage shows quickly.
 */
const TIMEOUT_MS = 500


function expectUnavailable({ response, body }: { response: Response; body: string }) {
  expect(response.status).toBe(503)
  expect(response.headers.get('retry-after')).toMatch(/^\d+$/)
  expect(response.headers.get('x-mcp-version')).toBeNull()
  expect(jsonRpcError(body)).toMatchObject({ code: -32005, data: { error: 'temporarily_unavailable' } })
}

/**
 * A connection to the real Redis for a proxy's `client` socket; both are kept in `sockets`
 * and end together.
 */
function toRedis(client: net.Socket, sockets: Set<net.Socket>): net.Socket {
  const target = new URL(REDIS_URL)
  const upstream = net.connect(Number(target.port || 6379), target.hostname)
  for (const socket of [client, upstream]) {
    sockets.add(socket)
    socket.on('error', () => {})
    socket.on('close', () => {
      sockets.delete(socket)
      client.destroy()
      upstream.destroy()
    })
  }
  return upstream
}

/**
 * A TCP proxy on 127.0.0.1 in front of the real Redis. `hang()` stops forwarding in both
 * directions (bytes are held, not lost); `answer()` delivers what was held and forwards again.
 */
async function hangingProxy(): Promise<{ port: number; hang(): void; answer(): void; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>()
  let hung = false
  const pipes: Array<{ flush(): void }> = []
  const pipe = (from: net.Socket, to: net.Socket) => {
    const held: Buffer[] = []
    from.on('data', (chunk: Buffer) => (hung ? held.push(chunk) : to.write(chunk)))
    pipes.push({ flush: () => held.splice(0).forEach((chunk) => to.write(chunk)) })
  }
  const server = net.createServer((client) => {
    const upstream = toRedis(client, sockets)
    pipe(client, upstream)
    pipe(upstream, client)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as net.AddressInfo).port,
    hang: () => void (hung = true),
    answer() {
      hung = false
      for (const p of pipes) p.flush()
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const socket of sockets) socket.destroy()
        server.close(() => resolve())
      }),
  }
}

/** How a counter call fails while nothing ever answered: its deadline. */
const NOT_COUNTED = `Redis script rate-limit increment did not answer within ${TIMEOUT_MS} ms`

/**
 * How a call of `what` fails once an earlier call passed its deadline: at once, unsent (the
 * stall breaker), or at its own deadline when it was sent as the breaker's probe, or before
 * the stall showed.
 */
const timedOutOrStalled = (what: string) =>
  expect.stringMatching(new RegExp(`^${what} (did not answer within ${TIMEOUT_MS} ms|not sent: Redis is stalled)`))
/**
 * The same for a client that says its connection is down: refused in its own words, never as a
 * stalled Redis (regression: "no answer" of a command that never left the offline queue).
 */
const timedOutOrNotReady = (what: string) =>
  expect.stringMatching(new RegExp(`^${what} (did not answer within ${TIMEOUT_MS} ms|not sent: the Redis connection is not ready \\((connecting|reconnecting)\\))$`))

/**
 * A TCP proxy on a fixed loopback port in front of the real Redis that can go away (`down()`:
 * its listener and connections closed, so the client reconnects) and come back (`up()`).
 */
async function droppingProxy(): Promise<{ port: number; down(): Promise<void>; up(): Promise<void>; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>()
  let server: net.Server | undefined
  let port = 0
  const up = async () => {
    server = net.createServer((client) => {
      const upstream = toRedis(client, sockets)
      client.pipe(upstream)
      upstream.pipe(client)
    })
    await new Promise<void>((resolve) => server!.listen(port, '127.0.0.1', resolve))
    port = (server.address() as net.AddressInfo).port
  }
  const down = () =>
    new Promise<void>((resolve) => {
      for (const socket of sockets) socket.destroy()
      if (!server) return resolve()
      server.close(() => resolve())
      server = undefined
    })
  await up()
  return { port, down, up, close: down }
}

/**
 * Two token services on one token store, both caching: A on a bus of its own, B on `busB`, the
 * bus under test (on `prefix`). A token is made on A and cached on B; `close` ends both
 * services and both buses (also when getting ready fails).
 */
async function twoInstances(redis: RedisTestContext, prefix: string, busB: RedisInvalidationBus) {
  const apps = createMemoryAppStore([{ id: 'app_1', slug: 'one', name: 'One', versions: ['1.0.0'] }])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_1', active: true }])
  const store = createMemoryTokenStore()
  const busA = createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: TIMEOUT_MS, heartbeatMs: 50 })
  const a = createTokenService({ store, apps, subscriptions, cacheTtlMs: 600_000, invalidations: busA })
  const b = createTokenService({ store, apps, subscriptions, cacheTtlMs: 600_000, invalidations: busB })
  const close = async () => {
    await Promise.all([a.close(), b.close()])
    await Promise.all([busA.close(), busB.close()])
  }
  try {
    // Subscribed on new connections: not within TIMEOUT_MS on a loaded machine.
    await Promise.all([busA.ready(5_000), busB.ready(5_000)])
    const made = await a.create({ userId: 'alice', name: 'ci', servers: ['app_1'], expiresInDays: 7 })
    expect((await b.authenticate(made.token)).ok).toBe(true) // cached on B
    return { a, b, made, close }
  } catch (error) {
    await close()
    throw error
  }
}

/** Waits (polling every 10 ms, at most 5 s) until `condition` holds. */
const until = (condition: () => boolean, what: string) =>
  vi.waitFor(() => expect(condition(), what).toBe(true), { timeout: 5_000, interval: 10 })

const reported = (fixture: Fixture) => fixture.errors.map((e) => [e.context, (e.error as Error).message])

describeRedis('Redis down or hung, through the real pipeline', (redis) => {
  it('nothing listens on the port: the rate limit fails open, sessions give 503, each within the timeout', async () => {
    // ioredis' defaults: commands wait in the offline queue while it reconnects, without end
    // (never ready, so the counter's calls wait there too, until their deadline).
    const client = await redis.connectUnreachable()
    const options = { client, prefix: redis.prefix(), timeoutMs: TIMEOUT_MS }
    const { fixture, send } = await createRedisStorePipeline(options)

    const served = await send()
    expect(served.response.status).toBe(200)
    expect(served.response.headers.get('x-mcp-version')).toBe('1.2.3')
    expect(served.response.headers.get('ratelimit')).toBeNull()
    expect(served.ms).toBeLessThan(2_000)
    expect(reported(fixture)).toEqual([
      ['rate-limit store failed; serving (failOpen)', NOT_COUNTED],
    ])

    fixture.errors.length = 0
    const pinned = await send({ 'mcp-session-id': 'session-1' })
    expectUnavailable(pinned)
    expect(pinned.ms).toBeLessThan(2_000)
    expect(reported(fixture)).toEqual([
      ['rate-limit store failed; serving (failOpen)', timedOutOrNotReady('Redis script rate-limit increment')],
      ['sessions failed', timedOutOrNotReady('Redis GETEX')],
    ])

    // A session that opens while the pin cannot be written: the store's 503 goes instead (its
    // every request would be refused), the failure is reported.
    fixture.errors.length = 0
    const opened = await send({ 'x-open-session': 'session-2' })
    expectUnavailable(opened)
    expect(opened.response.headers.get('mcp-session-id')).toBeNull()
    expect(reported(fixture).map(([context]) => context)).toEqual(['rate-limit store failed; serving (failOpen)', 'session store'])
    await fixture.close()
    client.disconnect()
  })

  it('Redis stops answering: the same, and all is well again once it answers', async () => {
    const proxy = await hangingProxy()
    // `disconnectTimeout`: ioredis would otherwise keep a 2 s timer after disconnecting.
    const client = redis.connect({ disconnectTimeout: 10 }, `redis://127.0.0.1:${proxy.port}`)
    // Connected (through the proxy, with ioredis' ready check) before the first call's deadline runs.
    await client.ping()
    const options = { client, prefix: redis.prefix(), timeoutMs: TIMEOUT_MS }
    const { fixture, send } = await createRedisStorePipeline(options)
    try {
      const opened = await send({ 'x-open-session': 'session-hung' })
      expect(opened.response.status).toBe(200)
      expect(opened.response.headers.get('ratelimit')).toBe('"minute";r=999;t=30')
      expect((await send({ 'mcp-session-id': 'session-hung' })).response.status).toBe(200)
      expect(fixture.errors).toEqual([])

      proxy.hang()
      const [unlimited, pinned] = await Promise.all([send(), send({ 'mcp-session-id': 'session-hung' })])
      expect(unlimited.response.status).toBe(200)
      expect(unlimited.response.headers.get('ratelimit')).toBeNull()
      expectUnavailable(pinned)
      expect(pinned.ms).toBeLessThan(2_000)
      // The session lookup follows the counters' deadline: by then the stall showed.
      expect(reported(fixture)).toEqual([
        ['rate-limit store failed; serving (failOpen)', NOT_COUNTED],
        ['rate-limit store failed; serving (failOpen)', NOT_COUNTED],
        ['sessions failed', timedOutOrStalled('Redis GETEX')],
      ])

      // Answers again: the late answers of the hung calls close the breaker (and go nowhere
      // else); the pin is still there, the counter counts on.
      proxy.answer()
      const again = await vi.waitFor(
        async () => {
          const answered = await send({ 'mcp-session-id': 'session-hung' })
          expect(answered.response.headers.get('ratelimit')).not.toBeNull()
          return answered
        },
        { timeout: 5_000, interval: 10 },
      )
      expect(again.response.status).toBe(200)
      expect(again.response.headers.get('x-mcp-version')).toBe('1.2.3')
      expect(again.response.headers.get('ratelimit')).toMatch(/^"minute";r=99\d;t=30$/)
    } finally {
      await fixture.close()
      client.disconnect()
      await proxy.close()
    }
  })
})

describeRedis('a Redis that hangs costs one deadline, not one per request (regression: counts of a hang landing at once)', (redis) => {
  it('after the first call passes its deadline, requests are answered at once (served, or 503 for a session) and counted nowhere; once Redis answers, the counter goes on from where it was', async () => {
    // The 20 requests below must all come before the probe is due, timeoutMs after the stall
    // showed: a second leaves room for a loaded machine (400 ms could be used up).
    const timeoutMs = 1_000
    const client = redis.connect()
    const prefix = redis.prefix()
    const options = { client, prefix, timeoutMs }
    const { fixture, send } = await createRedisStorePipeline(options)
    try {
      const opened = await send({ 'x-open-session': 'session-held' })
      expect(opened.response.headers.get('ratelimit')).toBe('"minute";r=999;t=30')

      const stall = holdConnection(client, redis.client, `${prefix}hold`)
      const first = await send()
      expect(first.response.status).toBe(200)
      expect(first.response.headers.get('ratelimit')).toBeNull()
      expect(first.ms).toBeGreaterThanOrEqual(timeoutMs - 1)
      fixture.errors.length = 0

      await new Promise((resolve) => setImmediate(resolve))
      // Not waited out: every call is refused unsent (the reports below say so), none times out.
      const during: Array<Awaited<ReturnType<typeof send>>> = []
      for (let i = 0; i < 20; i++) during.push(await send(i % 2 === 0 ? {} : { 'mcp-session-id': 'session-held' }))
      expect(during.map((d) => d.response.status)).toEqual(Array.from({ length: 20 }, (_, i) => (i % 2 === 0 ? 200 : 503)))
      for (const d of during.filter((_, i) => i % 2 === 1)) expectUnavailable(d)
      expect(new Set(reported(fixture).map(([, message]) => String(message).replace(/^Redis (script rate-limit increment|GETEX) /, '')))).toEqual(
        new Set([`not sent: Redis is stalled (a command got no answer within ${timeoutMs} ms, and nothing has answered since)`]),
      )

      await stall.release()
      const after = await vi.waitFor(
        async () => {
          const answered = await send({ 'mcp-session-id': 'session-held' })
          expect(answered.response.headers.get('ratelimit')).not.toBeNull()
          return answered
        },
        { timeout: 5_000, interval: 10 },
      )
      // 1 (the session opened), 2 (the first request of the hang, sent before it showed,
      // counted when Redis answered), 3: this one. None of the 20.
      expect(after.response.status).toBe(200)
      expect(after.response.headers.get('ratelimit')).toBe('"minute";r=997;t=30')
    } finally {
      await fixture.close()
    }
  })
})

describeRedis('Redis gone and back', (redis) => {
  it('requests served while the connection was lost are not counted when it is back (no lockout by a replayed queue)', async () => {
    const proxy = await droppingProxy()
    // ioredis' defaults, but a quick reconnect; its offline queue would hold every command.
    const client = redis.connect({ disconnectTimeout: 10, retryStrategy: () => 20 }, `redis://127.0.0.1:${proxy.port}`)
    // Its reconnections while the proxy is down are refused; a client without a listener would
    // print each as "[ioredis] Unhandled error event".
    const clientErrors = new Set<string>()
    client.on('error', (error: NodeJS.ErrnoException) => void clientErrors.add(error.code ?? error.message))
    await until(() => client.status === 'ready', 'the first connection')
    // Made on a client that is already ready, and never called before the outage.
    const counters = createRedisRateLimitStore({ client, prefix: redis.prefix(), timeoutMs: TIMEOUT_MS })
    const { fixture, send } = await createStorePipeline(createMemorySessionStore(), counters)
    try {
      await proxy.down()
      await until(() => client.status === 'reconnecting', 'the client to notice')
      // Spread over the reconnect attempts (every 20 ms), so the client is seen reconnecting and
      // connecting again: neither may queue a count.
      const during: Response[] = []
      const statuses = new Set<string>()
      for (let i = 0; i < 20; i++) {
        statuses.add(client.status)
        during.push((await send()).response)
        await new Promise((resolve) => setTimeout(resolve, 7))
      }
      expect(during.map((r) => r.status)).toEqual(Array(20).fill(200))
      expect(statuses.has('reconnecting'), [...statuses].join()).toBe(true)
      expect(during.every((r) => r.headers.get('ratelimit') === null)).toBe(true)

      await proxy.up()
      await until(() => client.status === 'ready', 'the reconnect')
      // The first counted request of the window: the 20 served meanwhile were never queued.
      const after = (await send()).response
      expect(after.status).toBe(200)
      expect(after.headers.get('ratelimit')).toBe('"minute";r=999;t=30')
      expect(clientErrors.has('ECONNREFUSED')).toBe(true)
      expect([...clientErrors].filter((code) => code !== 'ECONNREFUSED' && code !== 'ECONNRESET')).toEqual([])
    } finally {
      await fixture.close()
      client.disconnect()
      await proxy.close()
    }
  })
})

describeRedis('a Redis that hangs under the invalidation bus', (redis) => {
  it('the silent channel turns the cache off (a token revoked elsewhere is refused), and on again once messages arrive', async () => {
    for (const heartbeatMs of [0, -1, Number.NaN, 3_000_000_000, '1000']) {
      expect(() => createRedisInvalidationBus({ client: redis.connect(), heartbeatMs: heartbeatMs as number }), String(heartbeatMs)).toThrow(
        /heartbeatMs/,
      )
    }
    const proxy = await hangingProxy()
    const prefix = redis.prefix()
    const errors: Array<[string, string]> = []
    const onError = (error: unknown, context: string) => void errors.push([context, (error as Error).message])
    // B hears the channel through the proxy.
    const subscriberB = redis.connect({ disconnectTimeout: 10 }, `redis://127.0.0.1:${proxy.port}`)
    const busB = createRedisInvalidationBus({ client: redis.connect(), subscriber: subscriberB, prefix, timeoutMs: TIMEOUT_MS, heartbeatMs: 50, onError })
    const { a, b, made, close } = await twoInstances(redis, prefix, busB)
    try {
      proxy.hang()
      await until(() => busB.listening === false, 'B to notice the silence')
      expect(errors).toEqual([['invalidation subscriber', `Nothing arrived on ${busB.channel} for ${50 + TIMEOUT_MS} ms: the cache is off until something does`]])
      // Revoked on A: the message does not reach B, but B no longer trusts its cache.
      await a.revoke('alice', made.id)
      expect(await b.authenticate(made.token)).toEqual({ ok: false, reason: 'revoked' })
      // B's own publish waits for no confirmation while B hears nothing (none could reach it),
      // so no receiver is blamed for it.
      await busB.publish({ kind: 'token', tokenHash: 'while-deaf' })
      expect(errors).toHaveLength(1)

      proxy.answer()
      await until(() => busB.listening === true, 'B to hear the channel again')
      expect(errors).toHaveLength(1)
    } finally {
      await close()
      subscriberB.disconnect()
      await proxy.close()
    }
  })
})

describeRedis('a bus cut off from Redis on both connections', (redis) => {
  it('its command connection down, so no heartbeat can be sent, and its subscriber hearing nothing: the cache is off all the same (regression: trusted for cacheTtlMs, a token revoked elsewhere accepted)', async () => {
    const commands = await droppingProxy()
    const channel = await hangingProxy()
    const prefix = redis.prefix()
    const errors: string[] = []
    const clientB = redis.connect({ disconnectTimeout: 10, retryStrategy: () => 20 }, `redis://127.0.0.1:${commands.port}`)
    clientB.on('error', () => {}) // its reconnections, refused
    const subscriberB = redis.connect({ disconnectTimeout: 10 }, `redis://127.0.0.1:${channel.port}`)
    const busB = createRedisInvalidationBus({
      client: clientB,
      subscriber: subscriberB,
      prefix,
      timeoutMs: TIMEOUT_MS,
      heartbeatMs: 50,
      onError: (error) => void errors.push((error as Error).message),
    })
    const { a, b, made, close } = await twoInstances(redis, prefix, busB)
    try {
      // B's command connection goes (reconnecting, refused), then its subscriber hears nothing.
      await commands.down()
      await until(() => clientB.status !== 'ready', 'B’s command connection to go')
      channel.hang()
      await until(() => busB.listening === false, 'B to notice the silence')
      expect(errors).toContainEqual(
        expect.stringMatching(/^Nothing arrived on .*, and no heartbeat could be sent \(the command connection is not ready\): the cache is off until something does$/),
      )
      await a.revoke('alice', made.id)
      expect(await b.authenticate(made.token)).toEqual({ ok: false, reason: 'revoked' })
    } finally {
      await close()
      clientB.disconnect()
      subscriberB.disconnect()
      await Promise.all([commands.close(), channel.close()])
    }
  })
})

describeRedis('the invalidation bus heartbeat, when nothing is wrong', (redis) => {
  it('a stall of this process is no silence, a message of an unknown kind is no error, and heartbeats stay off the invalidation channel', async () => {
    const prefix = redis.prefix()
    const errors: unknown[] = []
    const bus = createRedisInvalidationBus({ client: redis.connect(), prefix, timeoutMs: TIMEOUT_MS, heartbeatMs: 50, onError: (e) => void errors.push(e) })
    const onChannel: string[] = []
    const watcher = redis.connect()
    try {
      await bus.ready(5_000)
      await watcher.subscribe(bus.channel)
      watcher.on('message', (_channel: string, text: string) => void onChannel.push(text))
      const changes: string[] = []
      bus.subscribe((m) => void changes.push(m.kind))
      // The event loop held for longer than the silence bound (50 ms + TIMEOUT_MS).
      const stallEnd = Date.now() + 50 + TIMEOUT_MS + 300
      while (Date.now() < stallEnd) {
        // busy
      }
      await redis.client.publish(bus.channel, JSON.stringify({ origin: 'a later version', kind: 'something-new' }))
      await new Promise((resolve) => setTimeout(resolve, 300))
      expect(errors).toEqual([])
      expect(changes).toEqual([]) // never went deaf, so the cache was never dropped
      expect(bus.listening).toBe(true)
      expect(onChannel).toEqual([JSON.stringify({ origin: 'a later version', kind: 'something-new' })])
    } finally {
      watcher.disconnect()
      await bus.close()
    }
  })
})

describeRedis('a lone bus under event-loop lag', (redis) => {
  it('a process that keeps blocking its loop (40 ms at a time) is not taken for a silent Redis, even with timeoutMs below heartbeatMs', async () => {
    const errors: unknown[] = []
    const bus = createRedisInvalidationBus({ client: redis.connect(), prefix: redis.prefix(), timeoutMs: 20, heartbeatMs: 100, onError: (e) => void errors.push(e) })
    try {
      // ready() waits timeoutMs by default: 20 ms for a new connection and two SUBSCRIBEs.
      await bus.ready(5_000)
      const end = Date.now() + 1_500
      while (Date.now() < end) {
        const block = Date.now() + 40
        while (Date.now() < block) {
          // busy
        }
        await new Promise((resolve) => setTimeout(resolve, 10))
      }
      expect(errors).toEqual([])
      expect(bus.listening).toBe(true)
    } finally {
      await bus.close()
    }
  })
})

describe('nothing leaks', () => {
  it('leaves no socket, server or timer of its own behind', async () => {
    expect(await leakedHandles(baseline)).toEqual({})
  })
})
