/**
 * Long runs on the Redis stores: thousands of requests through the dispatcher (in process, its
 * `decide`) on Redis session pins, rate-limit counters, the OAuth validation cache with its
 * local cache in front, and the invalidation bus, on both ioredis majors. Every key the stores
 * write has a TTL and is gone once it passes; the heap does not grow from N to 2N requests; the
 * clients' listeners stay as they were. Then a Redis of the test's own (`redis-server` on
 * a Unix socket of its own) killed mid-run and started again: the documented failure policy holds while
 * it is down (the rate limit fails open, sessions 503, the token cache off while the bus cannot
 * hear), nothing piles up in the client's offline queue however long the outage lasts, and all
 * is served again once it is back; the same on node-redis behind the documented adapter (with a
 * session store alone too), and for a client whose Redis is not there when it starts.
 */
import { type ChildProcess, spawn } from 'node:child_process'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import {
  type DispatchRequest,
  type Dispatcher,
  type MaybePromise,
  createDispatcher,
  createMemoryAppStore,
  createMemoryTokenStore,
  createOAuthValidator,
  createTokenService,
} from 'mcp-dispatch'
import {
  type RedisArgument,
  createRedisCacheStore,
  createRedisInvalidationBus,
  createRedisRateLimitStore,
  createRedisSessionStore,
} from 'mcp-dispatch/redis'
import { createClient } from 'redis'
import { afterAll, describe, expect, it, vi } from 'vitest'
import { IOREDIS, IOREDIS_KINDS, describeRedis, nextInvalidation, redisServerMissing, scanKeys } from '../helpers/redis.js'
import { activeResources, collectGarbage, leakedHandles } from '../robustness/support.js'

const baseline = activeResources()
const MB = 2 ** 20
const HOST = 'soak.example.com'
const ORIGIN = `https://${HOST}`
const ISSUER = 'https://auth.example.com'

// Any MaxListenersExceededWarning (or other process warning) during the file is a failure.
const warnings: string[] = []
const onWarning = (warning: Error) => void warnings.push(`${warning.name}: ${warning.message}`)
process.on('warning', onWarning)
afterAll(() => void process.off('warning', onWarning))

/** Heap in use after a full collection, in bytes. */
function heapUsed(): number {
  if (!collectGarbage()) throw new Error('no GC to call (--expose-gc refused): heap figures would be noise')
  collectGarbage()
  return process.memoryUsage().heapUsed
}

function request(method: string, headers: Readonly<Record<string, string>>): DispatchRequest {
  return { method, path: '/', host: HOST, origin: ORIGIN, clientAddress: '203.0.113.7', headers: { get: (name) => headers[name] } }
}

/** The status of a decision: a reply's, or the handler's 200 (assigning `sessionId`), or what completing it answered. */
async function statusOf(decided: MaybePromise<Awaited<ReturnType<Dispatcher['decide']>>>, sessionId?: string): Promise<number> {
  const decision = await decided
  if (decision.type === 'reply') return decision.reply.status
  const reply = await decision.complete({ status: 200, sessionId, contentType: 'application/json' })
  return reply ? reply.status : 200
}

/** Listener counts of an emitter, by event. */
function listeners(emitter: { eventNames(): (string | symbol)[]; listenerCount(event: string | symbol): number }) {
  return Object.fromEntries(emitter.eventNames().map((event) => [String(event), emitter.listenerCount(event)]))
}

/** Keys under `prefix`, counted by kind (`session`, `rl`, `cache`), with those that have no TTL. */
async function keysOf(client: InstanceType<(typeof IOREDIS)['ioredis']>, prefix: string) {
  const keys = await scanKeys(client, `${prefix}*`)
  const ttls = await Promise.all(keys.map((key) => client.pttl(key)))
  const byKind: Record<string, number> = {}
  for (const key of keys) {
    const kind = key.slice(prefix.length).split(':')[0]!
    byKind[kind] = (byKind[kind] ?? 0) + 1
  }
  // -2: expired between SCAN and PTTL.
  return { byKind, withoutTtl: keys.filter((_, i) => ttls[i] === -1), longest: Math.max(0, ...ttls) }
}

// Long enough that a session's next request, on a loaded host, comes within it (at 400 ms one
// came later once, a 404); short enough for the test to see every session's key expire.
const SESSION_TTL_MS = 1_500
const CACHE_TTL_MS = 400

describeRedis('a long run on the Redis stores', (redis) => {
  it('thousands of requests (new sessions, reuse, DELETE, distinct OAuth callers, rotations): every key has a TTL (sessions and cache entries are gone after theirs), the heap stays flat from N to 2N, listeners stay as they were', { timeout: 60_000 }, async () => {
    const prefix = redis.prefix()
    const client = redis.connect({ maxRetriesPerRequest: 1 })
    const apps = createMemoryAppStore([{ id: 'app_s', slug: 'soak', name: 'Soak', versions: ['1.0.0', '2.0.0'] }])
    const subscriptions = { isActive: () => true }
    const errors: string[] = []
    const onError = (error: unknown, context: string) => void errors.push(`${context}: ${(error as Error).message}`)
    const bus = createRedisInvalidationBus({ client, prefix, heartbeatMs: 200, onError })
    await bus.ready(5_000)
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions, cacheTtlMs: 60_000, invalidations: bus, onError })
    const oauth = createOAuthValidator({
      issuer: ISSUER,
      userinfoEndpoint: `${ISSUER}/userinfo`,
      // A small local cache, full within the first requests: what is measured is what it keeps beyond.
      cache: createRedisCacheStore({ client, prefix, localTtlMs: 100, localMax: 500 }),
      cacheTtlMs: CACHE_TTL_MS,
      rejectionTtlMs: CACHE_TTL_MS,
      clientBudget: false,
      // The authorization server: `Bearer oauth-<sub>` is `<sub>`'s token.
      fetch: async (_url, init) => {
        const sub = (new Headers(init?.headers).get('authorization') ?? '').slice('Bearer oauth-'.length)
        return new Response(JSON.stringify({ sub }), { headers: { 'content-type': 'application/json' } })
      },
    })
    const dispatcher = createDispatcher({
      apps,
      subscriptions,
      tokens,
      oauth,
      authorizationServers: [ISSUER],
      sessions: createRedisSessionStore({ client, prefix }),
      sessionTtlMs: SESSION_TTL_MS,
      rateLimit: { store: createRedisRateLimitStore({ client, prefix }), policy: () => ({ limit: 1_000_000, windowType: 'minute' }) },
      onError,
    })
    const made = await Promise.all(
      Array.from({ length: 10 }, (_, i) => tokens.create({ userId: `api-${i}`, name: 'soak', servers: ['app_s'], expiresInDays: 7 })),
    )
    const secrets = made.map((m) => m.token)
    const statuses: Record<number, number> = {}
    const one = async (i: number): Promise<number> => {
      const oauthUser = { authorization: `Bearer oauth-user${i % 500}` }
      switch (i % 4) {
        case 0: {
          // initialize → pin, a request of the session, and every other one ended by DELETE.
          const session = `s-${i}`
          let status = await statusOf(dispatcher.decide(request('POST', oauthUser)), session)
          if (status === 200) status = await statusOf(dispatcher.decide(request('POST', { ...oauthUser, 'mcp-session-id': session })))
          if (status === 200 && i % 8 === 0) status = await statusOf(dispatcher.decide(request('DELETE', { ...oauthUser, 'mcp-session-id': session })))
          return status
        }
        case 1:
          // A caller never seen before: its own counter, its own cached validation.
          return statusOf(dispatcher.decide(request('POST', { authorization: `Bearer oauth-caller${i}` })))
        case 2: {
          const t = (i >> 2) % secrets.length
          const status = await statusOf(dispatcher.decide(request('POST', { authorization: `Bearer ${secrets[t]}` })))
          // A rotation now and then, publishing an invalidation (requests with the old secret
          // still on their way get 401).
          if (i % 200 === 2) secrets[t] = (await tokens.rotate(made[t]!.id, { kind: 'session', userId: `api-${t}` })).token
          return status
        }
        default:
          // A new session left to its idle TTL.
          return statusOf(dispatcher.decide(request('POST', oauthUser)), `idle-${i}`)
      }
    }
    const run = async (from: number, to: number) => {
      let next = from
      await Promise.all(
        Array.from({ length: 64 }, async () => {
          while (next < to) {
            const status = await one(next++)
            statuses[status] = (statuses[status] ?? 0) + 1
          }
        }),
      )
    }
    const N = 1_200
    await run(0, 300)
    const listenersBefore = listeners(client)
    const before = heapUsed()
    await run(300, 300 + N)
    const atN = heapUsed()
    await run(300 + N, 300 + 2 * N)
    const at2N = heapUsed()

    expect(errors).toEqual([])
    expect(statuses[200]).toBeGreaterThan(300 + 2 * N - 100)
    expect(Object.keys(statuses).sort()).toEqual(expect.arrayContaining(['200']))
    for (const status of Object.keys(statuses)) expect(['200', '401'], `status ${status}`).toContain(status)
    const more = (at2N - atN) / MB
    expect(more, `${more.toFixed(2)} MiB more after ${2 * N} than after ${N} (${((atN - before) / MB).toFixed(2)} after ${N})`).toBeLessThan(1)
    expect(listeners(client)).toEqual(listenersBefore)

    // Each kind is looked for right after one more caller writes it: on a loaded host the run's
    // last entries may have outlived their short TTLs by the scan (a coverage run found no cache
    // entry left), and so may this caller's, so it is tried again.
    let last = 0
    const during = await vi.waitFor(
      async () => {
        expect(await statusOf(dispatcher.decide(request('POST', { authorization: `Bearer oauth-last${last}` })), `last-${last++}`)).toBe(200)
        const keys = await keysOf(redis.client, prefix)
        expect(keys.byKind.session).toBeGreaterThan(0)
        expect(keys.byKind.cache).toBeGreaterThan(0)
        return keys
      },
      { timeout: 5_000, interval: 10 },
    )
    expect(during.withoutTtl).toEqual([])
    expect(during.longest).toBeLessThanOrEqual(120_000) // a counter's window and a minute
    // Once the session and cache TTLs have passed, only the counters of this minute are left.
    await vi.waitFor(async () => expect(Object.keys((await keysOf(redis.client, prefix)).byKind)).toEqual(['rl']), { timeout: 6_000, interval: 100 })
    // A session left idle past its TTL is over: 404, its client initializes again.
    expect(await statusOf(dispatcher.decide(request('POST', { authorization: 'Bearer oauth-user3', 'mcp-session-id': 'idle-3' })))).toBe(404)

    // Counters of a short window expire a minute after it (the grace for requests of the
    // window that reach Redis late), whatever the window: every key has its TTL.
    const counters = createRedisRateLimitStore({ client, prefix })
    await Promise.all(Array.from({ length: 500 }, (_, i) => counters.increment(`short-${i}`, 0, 300)))
    const short = (await keysOf(redis.client, `${prefix}rl:short-`))
    expect(short.withoutTtl).toEqual([])
    expect(short.longest).toBeLessThanOrEqual(60_300)
    expect(short.longest).toBeGreaterThan(59_000)

    await tokens.close()
    await bus.close()
    client.disconnect()
    expect(warnings).toEqual([])
  })
})

let socketDir: string | undefined

/**
 * The Unix socket of the test's own Redis (no port to collide with): the same path every time
 * it starts again, in a temporary directory removed once the file's tests end.
 */
function socketPath(): string {
  socketDir ??= mkdtempSync(join(tmpdir(), 'mcp-dispatch-soak-'))
  return join(socketDir, 'redis.sock')
}
afterAll(() => {
  if (socketDir !== undefined) rmSync(socketDir, { recursive: true, force: true })
})

/** `redis-server` on {@link socketPath}, without persistence, answering once this resolves. */
async function startRedis(): Promise<ChildProcess> {
  const child = spawn('redis-server', ['--port', '0', '--unixsocket', socketPath(), '--save', '', '--appendonly', 'no', '--daemonize', 'no'], {
    stdio: 'ignore',
  })
  const probe = new IOREDIS.ioredis({ path: socketPath(), lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 })
  probe.on('error', () => {})
  try {
    for (const deadline = performance.now() + 5_000; ; ) {
      try {
        await probe.connect()
        await probe.ping()
        return child
      } catch (error) {
        if (performance.now() > deadline || child.exitCode !== null) {
          child.kill('SIGKILL')
          throw error
        }
        await new Promise((resolve) => setTimeout(resolve, 20))
      }
    }
  } finally {
    probe.disconnect()
  }
}

async function stopRedis(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return
  const exited = new Promise((resolve) => child.once('exit', resolve))
  child.kill('SIGKILL')
  await exited
}

/** Commands waiting in an ioredis client's offline queue, by name (its internals: `offlineQueue`, a Denque). */
function offlineQueue(client: object): Record<string, number> {
  const queue = (client as { offlineQueue: { length: number; peekAt(i: number): { command: { name: string } } } }).offlineQueue
  const counts: Record<string, number> = {}
  for (let i = 0; i < queue.length; i++) {
    const name = queue.peekAt(i).command.name
    counts[name] = (counts[name] ?? 0) + 1
  }
  return counts
}

const total = (counts: Record<string, number>) => Object.values(counts).reduce((a, b) => a + b, 0)

const missing = redisServerMissing()
for (const kind of IOREDIS_KINDS) {
  describe.runIf(missing === undefined)(`Redis killed mid-run and started again (ioredis ${kind === 'ioredis5' ? 5 : 6})`, () => {
    it('while down: counts fail open, sessions 503, the token cache off, and the offline queue stays put however long the outage (regression: a probe PING and each invalidation round added to it for as long as it lasted); once back, all is served and the revocation made meanwhile reaches the other instance', { timeout: 30_000 }, async () => {
      let server = await startRedis()
      const Redis = IOREDIS[kind]
      // Commands queued for ever while Redis is down (maxRetriesPerRequest: null), and a quick
      // reconnect, so the test waits on the stores, not on ioredis' backoff.
      const options = { path: socketPath(), maxRetriesPerRequest: null, retryStrategy: () => 50 }
      const client = new Redis(options)
      const other = new Redis(options)
      for (const c of [client, other]) c.on('error', () => {})
      const prefix = 'soak-restart:'
      const TIMEOUT_MS = 50
      try {
        const apps = createMemoryAppStore([{ id: 'app_s', slug: 'soak', name: 'Soak', versions: ['1.0.0'] }])
        const subscriptions = { isActive: () => true }
        const store = createMemoryTokenStore()
        const errors: string[] = []
        const onError = (error: unknown, context: string) => void errors.push(`${context}: ${(error as Error).message}`)
        const bus = createRedisInvalidationBus({ client, prefix, timeoutMs: TIMEOUT_MS, heartbeatMs: 100, onError })
        const otherBus = createRedisInvalidationBus({ client: other, prefix, timeoutMs: TIMEOUT_MS, heartbeatMs: 100, onError: () => {} })
        await Promise.all([bus.ready(5_000), otherBus.ready(5_000)])
        const tokens = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations: bus, onError })
        const otherTokens = createTokenService({ store, apps, subscriptions, cacheTtlMs: 60_000, invalidations: otherBus })
        const dispatcher = createDispatcher({
          apps,
          subscriptions,
          tokens,
          authorizationServers: [ISSUER],
          sessions: createRedisSessionStore({ client, prefix, timeoutMs: TIMEOUT_MS }),
          rateLimit: { store: createRedisRateLimitStore({ client, prefix, timeoutMs: TIMEOUT_MS }), policy: () => ({ limit: 1_000, windowType: 'minute' }) },
          onError,
        })
        const made = await Promise.all(Array.from({ length: 20 }, (_, i) => tokens.create({ userId: 'u', name: `t${i}`, servers: ['app_s'], expiresInDays: 7 })))
        const auth = { authorization: `Bearer ${made[0]!.token}` }
        // A loaded host may answer a command past the 50 ms deadline (a 503) now and then: each
        // answer checked while Redis is up comes within a few tries.
        const eventually = { timeout: 3_000, interval: 20 }
        await vi.waitFor(async () => expect(await statusOf(dispatcher.decide(request('POST', auth)), 'pinned')).toBe(200), eventually)
        for (const m of made) expect((await otherTokens.authenticate(m.token)).ok).toBe(true) // cached there
        const listenersBefore = listeners(client)

        await stopRedis(server)
        await vi.waitFor(() => expect([client.status, bus.listening]).toEqual([expect.not.stringMatching(/^ready$/), false]), { timeout: 5_000, interval: 5 })
        // Revoked while Redis is down: 19 invalidations the token service sends again in rounds.
        for (const m of made.slice(1)) await tokens.revoke('u', m.id)
        const queued: number[] = []
        const answers: Record<string, number[]> = { counted: [], session: [], opened: [] }
        const started = performance.now()
        while (performance.now() - started < 1_000) {
          answers.counted!.push(await statusOf(dispatcher.decide(request('POST', auth))))
          answers.session!.push(await statusOf(dispatcher.decide(request('POST', { ...auth, 'mcp-session-id': 'pinned' }))))
          answers.opened!.push(await statusOf(dispatcher.decide(request('POST', auth)), `down-${answers.opened!.length}`))
          queued.push(total(offlineQueue(client)))
          await new Promise((resolve) => setTimeout(resolve, 10))
        }
        // The documented policy: served without counting (fail open), 503 for a session's
        // lookup and for a new session's pin; the bus deaf, so the token cache is off.
        expect(new Set(answers.counted)).toEqual(new Set([200]))
        expect(new Set(answers.session)).toEqual(new Set([503]))
        expect(new Set(answers.opened)).toEqual(new Set([503]))
        expect(bus.listening).toBe(false)
        // What waits in the queue is what was sent before the breaker opened (the first
        // deadline), not one more command each probe or each invalidation round.
        const third = Math.floor(queued.length / 3)
        expect(queued.at(-1), `queued over the outage: ${queued.join(' ')} (${JSON.stringify(offlineQueue(client))})`).toBeLessThanOrEqual(queued[third]!)

        server = await startRedis()
        await vi.waitFor(() => expect([client.status, bus.listening, otherBus.listening]).toEqual(['ready', true, true]), { timeout: 5_000, interval: 10 })
        // Served and counted again: the counter starts afresh on the new Redis, none of the
        // outage's requests counted late; a pinned session is 404 (its pin went with Redis), a
        // new one is pinned.
        await vi.waitFor(
          async () => {
            const decided = await dispatcher.decide(request('POST', auth))
            expect(decided.type).toBe('dispatch')
            expect(decided.type === 'dispatch' && decided.headers.ratelimit).toMatch(/^"minute";r=99\d;t=\d+$/)
          },
          { timeout: 3_000, interval: 20 },
        )
        await vi.waitFor(async () => expect(await statusOf(dispatcher.decide(request('POST', { ...auth, 'mcp-session-id': 'pinned' })))).toBe(404), eventually)
        await vi.waitFor(async () => expect(await statusOf(dispatcher.decide(request('POST', auth)), 'after')).toBe(200), eventually)
        await vi.waitFor(async () => expect(await statusOf(dispatcher.decide(request('POST', { ...auth, 'mcp-session-id': 'after' })))).toBe(200), eventually)
        // The revocations made while Redis was down: the other instance dropped its cache when
        // its bus lost the connection, and refuses them.
        for (const m of made.slice(1)) expect(await otherTokens.authenticate(m.token)).toEqual({ ok: false, reason: 'revoked' })
        // And a revocation now reaches it at once.
        const heard = nextInvalidation(otherBus)
        await tokens.revoke('u', made[0]!.id)
        expect(await heard).toMatchObject({ kind: 'token' })
        expect(listeners(client)).toEqual(listenersBefore)

        await Promise.all([tokens.close(), otherTokens.close()])
        await Promise.all([bus.close(), otherBus.close()])
      } finally {
        client.disconnect()
        other.disconnect()
        await stopRedis(server)
      }
    })
  })
}

/**
 * A node-redis client of the test's Redis (not connected yet) with a quick reconnect, behind the
 * adapter of docs/stores.md, and the count of its queue, by its internals (commands not yet
 * written, and those awaiting replies).
 */
function nodeRedisAdapter() {
  const nodeRedis = createClient({ socket: { path: socketPath(), reconnectStrategy: () => 50 } })
  nodeRedis.on('error', () => {})
  const client = {
    call: (...args: RedisArgument[]) => nodeRedis.sendCommand(args.map(String)),
    get status() {
      return nodeRedis.isReady ? 'ready' : 'reconnecting'
    },
  }
  const pending = () => (nodeRedis as unknown as { _getQueue(): { pendingCount: number } })._getQueue().pendingCount
  return { nodeRedis, client, pending }
}

describe.runIf(missing === undefined)('Redis killed mid-run and started again (node-redis behind the adapter of docs/stores.md)', () => {
  it('while down: counts fail open, sessions 503, and its queue stays put (regression: a probe PING each deadline); once back, served', { timeout: 30_000 }, async () => {
    let server = await startRedis()
    const { nodeRedis, client, pending } = nodeRedisAdapter()
    await nodeRedis.connect()
    try {
      const apps = createMemoryAppStore([{ id: 'app_s', slug: 'soak', name: 'Soak', versions: ['1.0.0'] }])
      const subscriptions = { isActive: () => true }
      const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
      const dispatcher = createDispatcher({
        apps,
        subscriptions,
        tokens,
        authorizationServers: [ISSUER],
        sessions: createRedisSessionStore({ client, prefix: 'soak-restart:', timeoutMs: 50 }),
        rateLimit: { store: createRedisRateLimitStore({ client, prefix: 'soak-restart:', timeoutMs: 50 }), policy: () => ({ limit: 1_000, windowType: 'minute' }) },
        onError: () => {},
      })
      const { token } = await tokens.create({ userId: 'u', name: 'n', servers: ['app_s'], expiresInDays: 7 })
      const auth = { authorization: `Bearer ${token}` }
      // A loaded host may answer a command past the 50 ms deadline (a 503) now and then: each
      // answer checked while Redis is up comes within a few tries.
      const eventually = { timeout: 3_000, interval: 20 }
      await vi.waitFor(async () => expect(await statusOf(dispatcher.decide(request('POST', auth)), 'pinned')).toBe(200), eventually)

      await stopRedis(server)
      await vi.waitFor(() => expect(nodeRedis.isReady).toBe(false), { timeout: 5_000, interval: 5 })
      const queued: number[] = []
      const answers = { counted: new Set<number>(), session: new Set<number>() }
      for (const started = performance.now(); performance.now() - started < 1_000; ) {
        answers.counted.add(await statusOf(dispatcher.decide(request('POST', auth))))
        answers.session.add(await statusOf(dispatcher.decide(request('POST', { ...auth, 'mcp-session-id': 'pinned' }))))
        queued.push(pending())
        await new Promise((resolve) => setTimeout(resolve, 10))
      }
      expect(answers).toEqual({ counted: new Set([200]), session: new Set([503]) })
      expect(queued.at(-1), `queued over the outage: ${queued.join(' ')}`).toBeLessThanOrEqual(queued[Math.floor(queued.length / 3)]!)

      server = await startRedis()
      await vi.waitFor(() => expect(nodeRedis.isReady).toBe(true), { timeout: 5_000, interval: 10 })
      await vi.waitFor(async () => expect(await statusOf(dispatcher.decide(request('POST', auth)), 'after')).toBe(200), eventually)
      await vi.waitFor(async () => expect(await statusOf(dispatcher.decide(request('POST', { ...auth, 'mcp-session-id': 'after' })))).toBe(200), eventually)
      await tokens.close()
    } finally {
      nodeRedis.destroy()
      await stopRedis(server)
    }
  })
})

describe.runIf(missing === undefined)('Redis killed mid-run and started again (node-redis behind the adapter, sessions only)', () => {
  it('while down, its queue stays put with no store that reads the status on each call (regression: the adapter, which emits no `ready`, was never seen ready, so a probe PING was queued each deadline)', { timeout: 30_000 }, async () => {
    let server = await startRedis()
    const { nodeRedis, client, pending } = nodeRedisAdapter()
    try {
      // Created before the client connects, as an application's module setup does.
      const sessions = createRedisSessionStore({ client, prefix: 'soak-restart:', timeoutMs: 50 })
      await nodeRedis.connect()
      // Within a few tries: a loaded host may answer past the 50 ms deadline now and then.
      await vi.waitFor(
        async () => {
          await sessions.set('pinned', { appId: 'app_s', version: '1.0.0', subject: 'u' }, 60_000)
          expect(await sessions.get('pinned', 60_000)).toEqual({ appId: 'app_s', version: '1.0.0', subject: 'u' })
        },
        { timeout: 3_000, interval: 20 },
      )

      await stopRedis(server)
      await vi.waitFor(() => expect(nodeRedis.isReady).toBe(false), { timeout: 5_000, interval: 5 })
      const queued: number[] = []
      for (const started = performance.now(); performance.now() - started < 400; ) {
        await Promise.resolve(sessions.get('pinned', 60_000)).catch(() => {})
        queued.push(pending())
        await new Promise((resolve) => setTimeout(resolve, 10))
      }
      expect(queued.at(-1), `queued over the outage: ${queued.join(' ')}`).toBeLessThanOrEqual(queued[Math.floor(queued.length / 3)]!)

      server = await startRedis()
      await vi.waitFor(() => expect(nodeRedis.isReady).toBe(true), { timeout: 5_000, interval: 10 })
      // The first call once it is ready is the probe: answered at once (the pin went with Redis).
      await vi.waitFor(async () => expect(await sessions.get('pinned', 60_000)).toBeUndefined(), { timeout: 1_000, interval: 20 })
    } finally {
      nodeRedis.destroy()
      await stopRedis(server)
    }
  })
})

describe.runIf(missing === undefined)('Redis down when the client starts (ioredis 6)', () => {
  it('its offline queue stays put however long Redis is not there, and all is served once it is (regression: the probe PING was queued each deadline while the client had never been ready)', { timeout: 30_000 }, async () => {
    const client = new IOREDIS.ioredis({ path: socketPath(), maxRetriesPerRequest: null, retryStrategy: () => 50 })
    client.on('error', () => {})
    let server: ChildProcess | undefined
    try {
      const sessions = createRedisSessionStore({ client, prefix: 'soak-start:', timeoutMs: 50 })
      // Its PUBLISH goes through `sendAnyway`, as the token service's rounds send a revocation.
      const bus = createRedisInvalidationBus({ client, prefix: 'soak-start:', timeoutMs: 50, heartbeatMs: false, onError: () => {} })
      const queued: number[] = []
      for (const started = performance.now(); performance.now() - started < 400; ) {
        await Promise.resolve(sessions.get('s', 60_000)).catch(() => {})
        await Promise.resolve(bus.publish({ kind: 'token', tokenHash: 'a'.repeat(64) })).catch(() => {})
        queued.push(total(offlineQueue(client)))
        await new Promise((resolve) => setTimeout(resolve, 10))
      }
      expect(client.status).not.toBe('ready')
      expect(queued.at(-1), `queued while Redis was not there: ${queued.join(' ')} (${JSON.stringify(offlineQueue(client))})`).toBeLessThanOrEqual(queued[Math.floor(queued.length / 3)]!)

      server = await startRedis()
      await vi.waitFor(() => expect(client.status).toBe('ready'), { timeout: 5_000, interval: 10 })
      await vi.waitFor(async () => expect(await sessions.get('s', 60_000)).toBeUndefined(), { timeout: 1_000, interval: 20 })
      await vi.waitFor(async () => expect(await sessions.set('s', { appId: 'app_s', version: '1.0.0', subject: 'u' }, 60_000)).toBe(true), { timeout: 3_000, interval: 20 })
      await bus.ready(5_000)
      await bus.publish({ kind: 'token', tokenHash: 'a'.repeat(64) })
      await bus.close()
    } finally {
      client.disconnect()
      if (server) await stopRedis(server)
    }
  })
})

describe('nothing left behind', () => {
  it('no socket, server or timer of the stores or buses outlives them (the process exits on its own), and no process warning came', async () => {
    expect(await leakedHandles(baseline)).toEqual({})
    expect(warnings).toEqual([])
  })
})
