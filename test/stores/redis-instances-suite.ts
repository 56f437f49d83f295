/**
 * The suites of test/stores/redis-instances.test.ts (a single Redis) and
 * test/stores/redis-cluster.test.ts (a Redis Cluster), as functions of the Redis they run on.
 *
 * Two platform instances behind one load balancer, sharing Redis (DESIGN.md "Versions",
 * "API tokens", "Stores"), each served over real HTTP on 127.0.0.1 through the web adapter,
 * driven with the official MCP SDK client:
 *
 * - a session opened on instance A and continued on instance B keeps its pinned version after
 *   a deploy (session pins in Redis), and the instance holding its GET stream keeps the pin
 *   alive for the others past the idle TTL (on real time: Redis expires keys on its own clock);
 * - a token revoked or rotated through A's token service is refused by B as soon as the
 *   invalidation arrives, although B caches token records for a minute (Redis pub/sub);
 * - the rate-limit budget is one, whichever instance counts (counters in Redis);
 * - an OAuth token validated on one instance is a cache hit on the other (validation cache).
 *
 * What Redis does not hold is shared as the platform would share it: one App store (the
 * platform's database), one token store object (standing in for the shared PostgreSQL), and
 * one set of App servers per version (the Apps' own services). Each instance has its own
 * Redis connection, stores, token service (with its own cache) and invalidation bus.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { Redis } from 'ioredis'
import {
  type AppRecord,
  type CachedValidation,
  type TokenService,
  createDispatcher,
  createMemoryAppStore,
  createMemoryInvalidationBus,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createOAuthValidator,
  createTokenService,
} from 'mcp-dispatch'
import {
  type RedisInvalidationBus,
  createRedisCacheStore,
  createRedisInvalidationBus,
  createRedisRateLimitStore,
  createRedisSessionStore,
} from 'mcp-dispatch/redis'
import { mcpDispatch } from 'mcp-dispatch/web'
import { afterAll, beforeAll, expect, it, vi } from 'vitest'
import { type McpAppHandler, buildAppServer, createMcpAppHandler } from '../../examples/platform/mcp-app.js'
import { T0, localhostFetch, serveFetch } from '../helpers/platform.js'
import { type FakeUpstream, startFakeUpstream } from '../oauth/helpers/fake-upstream.js'
import { type RedisTestContext, nextInvalidation } from '../helpers/redis.js'
import type { RedisClusterTestContext } from '../helpers/redis-cluster.js'
import { countingTokenStore } from './conformance.js'

const WEATHER = { id: 'app_weather', slug: 'weather', name: 'Weather' } as const
const LIMITED = { id: 'app_limited', slug: 'limited', name: 'Limited' } as const
const now = () => T0

interface Instance {
  readonly name: string
  readonly port: number
  readonly tokens: TokenService
  readonly invalidations: RedisInvalidationBus
  /** Requests this instance dispatched to an App: method, session id, version served. */
  readonly served: Array<{ method: string; session: string | null; version: string }>
  close(): Promise<void>
}

/**
 * Two instances through the pipeline on `redis`. `keepAlive`: also the 6 s test of a session
 * kept alive by its GET stream (on ioredis 6 only).
 */
export function twoInstancesSuite(redis: RedisTestContext, options: { keepAlive: boolean }): void {
  const prefix = redis.prefix()
  const errors: Array<{ instance: string; context: string; error: unknown }> = []
  const apps = createMemoryAppStore([
    { ...WEATHER, versions: ['1.0.0', '1.1.0'] },
    { ...LIMITED, versions: ['1.0.0'] },
  ])
  const subscriptions = createMemorySubscriptionStore([
    { userId: 'alice', appId: WEATHER.id, active: true },
    { userId: 'alice', appId: LIMITED.id, active: true },
  ])
  // The shared token database, counting lookups: a lookup that does not happen was served from
  // an instance's token cache.
  const { store: tokenStore, lookups } = countingTokenStore(createMemoryTokenStore())
  const appServers = new Map<string, McpAppHandler>()
  const appServer = (app: AppRecord, version: string) => {
    const key = `${app.id}@${version}`
    let handler = appServers.get(key)
    if (!handler) appServers.set(key, (handler = createMcpAppHandler(() => buildAppServer(app, version))))
    return handler
  }

  async function startInstance(name: string, sessionTtlMs?: number): Promise<Instance> {
    const client = redis.connect({ maxRetriesPerRequest: 1 })
    const onError = (error: unknown, context: string) => errors.push({ instance: name, context, error })
    const invalidations = createRedisInvalidationBus({ client, prefix, onError })
    // A new connection subscribing: given more than the store's deadline on a loaded machine.
    await invalidations.ready(5_000)
    const tokens = createTokenService({ store: tokenStore, apps, subscriptions, cacheTtlMs: 60_000, invalidations, now, onError })
    const dispatcher = createDispatcher({
      apps,
      subscriptions,
      tokens,
      authorizationServers: ['https://auth.example.com'],
      sessions: createRedisSessionStore({ client, prefix }),
      ...(sessionTtlMs !== undefined && { sessionTtlMs }),
      rateLimit: {
        store: createRedisRateLimitStore({ client, prefix }),
        policy: (_identity, app) => (app.id === LIMITED.id ? { limit: 3, windowType: 'minute' } : undefined),
      },
      now,
      onError,
    })
    const served: Instance['served'] = []
    const handle = mcpDispatch({
      dispatcher,
      onError,
      handler: (request, context) => {
        served.push({ method: request.method, session: request.headers.get('mcp-session-id'), version: context.version })
        return appServer(context.app, context.version)(request)
      },
    })
    const server = await serveFetch(handle)
    return {
      name,
      port: server.port,
      tokens,
      invalidations,
      served,
      async close() {
        await server.close()
        await tokens.close()
        await invalidations.close()
      },
    }
  }

  let a: Instance
  let b: Instance
  let alice: { token: string; id: string }
  /** The instance the load balancer sends the next requests to. */
  let target: Instance
  /** `fetch` through the load balancer: every request goes to `target`, whatever its URL's port. */
  const balanced = (input: string | URL | Request, init?: RequestInit) => {
    const url = new URL(input instanceof Request ? input.url : input)
    url.port = String(target.port)
    return localhostFetch(input instanceof Request ? new Request(url, input) : url, init)
  }
  const post = (slug: string, token: string, body: unknown = { jsonrpc: '2.0', id: 1, method: 'tools/list' }) =>
    balanced(`http://${slug}.localhost/v1`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify(body),
    })

  /** An MCP SDK client of alice's on the weather App's `/v1`, through `fetch` (default: the balancer). */
  async function connectAlice(name: string, fetch: typeof balanced = balanced) {
    const transport = new StreamableHTTPClientTransport(new URL('http://weather.localhost/v1'), {
      fetch,
      requestInit: { headers: { authorization: `Bearer ${alice.token}` } },
    })
    const client = new Client({ name, version: '1.0.0' })
    await client.connect(transport)
    return { client, transport }
  }

  beforeAll(async () => {
    a = await startInstance('A')
    b = await startInstance('B')
    target = a
    const created = await a.tokens.create({ userId: 'alice', name: 'laptop', servers: [WEATHER.id, LIMITED.id], expiresInDays: 30 })
    alice = { token: created.token, id: created.id }
  })
  afterAll(async () => {
    await a?.close()
    await b?.close()
    await Promise.all([...appServers.values()].map((handler) => handler.close()))
    expect(errors).toEqual([])
  })

  it('a session opened on A and continued on B keeps its pinned version after a deploy', async () => {
    const seen: Array<{ instance: string; method: string; status: number; version: string | null; latest: string | null }> = []
    const recording = async (input: string | URL | Request, init?: RequestInit) => {
      const instance = target.name
      const response = await balanced(input, init)
      seen.push({
        instance,
        method: init?.method ?? 'GET',
        status: response.status,
        version: response.headers.get('x-mcp-version'),
        latest: response.headers.get('x-mcp-latest-version'),
      })
      return response
    }
    const { client, transport } = await connectAlice('redis-instances', recording)
    const sessionId = transport.sessionId!
    expect(sessionId).toBeTruthy()
    expect(await redis.client.exists(`${prefix}session:${sessionId}`)).toBe(1)

    apps.deploy(WEATHER.id, '1.2.0')
    target = b
    const result = await client.callTool({ name: 'get_version', arguments: {} })
    expect(result.structuredContent).toEqual({ app: 'weather', version: '1.1.0' })
    // B served the session's request from the pin it read in Redis.
    expect(b.served.filter((s) => s.session === sessionId && s.method === 'POST').map((s) => s.version)).toEqual(['1.1.0'])

    // A new connection on B gets the new deploy; the old session still does not move.
    const { client: other, transport: fresh } = await connectAlice('redis-instances-fresh')
    expect((await other.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual({ app: 'weather', version: '1.2.0' })
    await fresh.terminateSession()
    await other.close()
    target = a
    expect((await client.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual({ app: 'weather', version: '1.1.0' })

    // DELETE through B ends the pin for every instance: A no longer knows the session.
    target = b
    await transport.terminateSession()
    await client.close()
    expect(await redis.client.exists(`${prefix}session:${sessionId}`)).toBe(0)
    target = a
    const after = await balanced('http://weather.localhost/v1', {
      method: 'POST',
      headers: {
        authorization: `Bearer ${alice.token}`,
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
        'mcp-session-id': sessionId,
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'tools/list' }),
    })
    expect(after.status).toBe(404)
    expect(await after.json()).toMatchObject({ error: { data: { error: 'session_not_found' } } })

    const posts = seen.filter((s) => s.method === 'POST')
    expect(posts[0]).toEqual({ instance: 'A', method: 'POST', status: 200, version: '1.1.0', latest: '1.1.0' })
    expect(posts.filter((s) => s.instance === 'B')).toContainEqual({ instance: 'B', method: 'POST', status: 200, version: '1.1.0', latest: '1.2.0' })
    expect(posts.every((s) => s.version === '1.1.0')).toBe(true)
  })

  // 9 s of real time, on one ioredis major: what it adds to the rest (a GETEX every third of the
  // TTL, from the dispatcher's timer) goes through the client as every other GETEX here does.
  it.runIf(options.keepAlive && redis.kind === 'ioredis')('the instance holding a session\'s GET stream keeps its pin in Redis for the others, past the idle TTL', async () => {
    // Two more instances with a pin TTL of 3 s, on real time (Redis expires keys on its own
    // clock): the SDK client's GET stream stays open on C while nothing else is sent. C renews
    // the pin every third of the TTL: a loaded host's stall of a second or more is within it.
    const ttl = 3_000
    const c = await startInstance('C', ttl)
    const d = await startInstance('D', ttl)
    try {
      target = c
      const { client, transport } = await connectAlice('redis-keepalive')
      const sessionId = transport.sessionId!
      const pinned = (await client.callTool({ name: 'get_version', arguments: {} })).structuredContent as { version: string }
      // The SDK client opens its GET stream on its own after initialize: more than waitFor's default 1 s on a loaded machine.
      await vi.waitFor(() => expect(c.served.some((s) => s.method === 'GET' && s.session === sessionId)).toBe(true), { timeout: 5_000 })

      apps.deploy(WEATHER.id, '1.3.0')
      target = d
      await new Promise((resolve) => setTimeout(resolve, 2 * ttl))
      expect(await redis.client.pttl(`${prefix}session:${sessionId}`)).toBeGreaterThan(0)
      expect((await client.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual(pinned)
      expect(d.served.filter((s) => s.session === sessionId).map((s) => s.version)).toEqual([pinned.version])

      // The stream goes (the client closes, sending no DELETE): the pin expires after its TTL.
      await client.close()
      await vi.waitFor(() => expect(redis.client.exists(`${prefix}session:${sessionId}`)).resolves.toBe(0), { timeout: 3 * ttl, interval: 100 })
    } finally {
      await c.close()
      await d.close()
    }
  })

  it('a token revoked through A is refused by B as soon as the invalidation arrives, though B caches tokens for a minute', async () => {
    const created = await a.tokens.create({ userId: 'alice', name: 'to revoke', servers: [WEATHER.id], expiresInDays: 7 })
    // An instance with the same cache but no Redis bus: what B would do without the broadcast.
    const isolated = createTokenService({
      store: tokenStore,
      apps,
      subscriptions,
      cacheTtlMs: 60_000,
      invalidations: createMemoryInvalidationBus(),
      now,
    })
    expect((await isolated.authenticate(created.token)).ok).toBe(true)

    target = b
    expect((await post('weather', created.token)).status).toBe(200)
    const lookupsBefore = lookups()
    expect((await post('weather', created.token)).status).toBe(200)
    expect(lookups()).toBe(lookupsBefore) // served from B's token cache

    const arrived = nextInvalidation(b.invalidations)
    await a.tokens.revoke('alice', created.id)
    expect(await arrived).toMatchObject({ kind: 'token' })
    const refused = await post('weather', created.token)
    expect(refused.status).toBe(401)
    expect(refused.headers.get('www-authenticate')).toContain('error="invalid_token"')
    expect(lookups()).toBe(lookupsBefore + 1)
    // Without the bus, the revoked token would still be accepted from the cache.
    expect((await isolated.authenticate(created.token)).ok).toBe(true)
    await isolated.close()
  })

  it('a token rotated through A: B refuses the old secret at once and accepts the new one', async () => {
    const created = await a.tokens.create({ userId: 'alice', name: 'to rotate', servers: [WEATHER.id], expiresInDays: 7 })
    target = b
    expect((await post('weather', created.token)).status).toBe(200)
    const arrived = nextInvalidation(b.invalidations)
    const rotated = await a.tokens.rotate(created.id, { kind: 'session', userId: 'alice' })
    await arrived
    expect((await post('weather', created.token)).status).toBe(401)
    expect((await post('weather', rotated.token)).status).toBe(200)
  })

  it('the rate-limit budget is shared: three requests per minute in all, across A and B', async () => {
    const statuses: Array<[string, number, string | null]> = []
    for (const instance of [a, b, a, b]) {
      target = instance
      const response = await post('limited', alice.token)
      statuses.push([instance.name, response.status, response.headers.get('ratelimit')])
      if (response.status === 429) {
        expect(response.headers.get('retry-after')).toBe('30')
        expect(await response.json()).toMatchObject({ error: { code: -32000, data: { limit: 3, retryAfter: 30 } } })
      } else await response.body?.cancel()
    }
    expect(statuses).toEqual([
      ['A', 200, '"minute";r=2;t=30'],
      ['B', 200, '"minute";r=1;t=30'],
      ['A', 200, '"minute";r=0;t=30'],
      ['B', 429, '"minute";r=0;t=30'],
    ])
  })
}

/** An OAuth token validated on one instance is a cache hit on the other, through `redis`. */
export function sharedValidationCacheSuite(redis: RedisTestContext): void {
  let upstream: FakeUpstream
  beforeAll(async () => {
    upstream = await startFakeUpstream()
    upstream.route('/.well-known/openid-configuration', {
      status: 200,
      body: { issuer: upstream.url, userinfo_endpoint: `${upstream.url}/oidc/me` },
    })
    upstream.route('/oidc/me', (request) =>
      request.headers.authorization === 'Bearer good-token'
        ? { status: 200, body: { sub: 'user_alice' } }
        : { status: 401, body: { error: 'invalid_token' } },
    )
  })
  afterAll(() => upstream?.close())

  it('a token validated on A is a cache hit on B: one userinfo call for both, for accepted and refused tokens', async () => {
    const prefix = redis.prefix()
    const events: Record<'A' | 'B', string[]> = { A: [], B: [] }
    const validator = (name: 'A' | 'B', client: Redis) =>
      createOAuthValidator({
        issuer: upstream.url,
        cache: createRedisCacheStore<CachedValidation>({ client, prefix }),
        onEvent: (event) => events[name].push(event.type),
      })
    // A first call on a new client (its socket, on a cluster the slot map and each master's
    // socket) may exceed the cache store's 1 s deadline on a loaded machine, a miss the counts
    // below would fail on: each client reads every master first, with no deadline.
    const cluster = 'cluster' in redis ? (redis as RedisClusterTestContext).cluster : undefined
    const tags = cluster ? await Promise.all(cluster.ports.map((port) => cluster.hashTagOn(port))) : ['']
    const warm = async (client: Redis) => {
      await Promise.all(tags.map((tag) => client.get(`${prefix}${tag}warm`)))
      return client
    }
    const a = validator('A', await warm(redis.client))
    const b = validator('B', await warm(redis.connect()))
    expect(await a.validate('good-token')).toEqual({ active: true, info: { subject: 'user_alice' } })
    expect(await b.validate('good-token')).toEqual({ active: true, info: { subject: 'user_alice' } })
    expect(await a.validate('bad-token')).toMatchObject({ active: false })
    expect(await b.validate('bad-token')).toMatchObject({ active: false })
    expect(upstream.count('/oidc/me')).toBe(2)
    expect(events.B.filter((type) => type === 'cache-hit')).toHaveLength(2)
    expect(events.B).not.toContain('cache-miss')
    // Two entries, keyed by hashes: no token in a key or a value.
    const keys = await redis.keys()
    const entries = keys.filter((key) => key.startsWith(`${prefix}cache:oauth:`))
    expect(entries).toHaveLength(2)
    for (const key of entries) {
      expect(key).not.toMatch(/good-token|bad-token/)
      expect(await redis.client.get(key)).not.toMatch(/good-token|bad-token/)
    }
  })
}
