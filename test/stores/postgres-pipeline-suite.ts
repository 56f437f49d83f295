/**
 * The suite of test/stores/postgres-pipeline.test.ts (PostgreSQL) and
 * test/stores/pgbouncer.test.ts (PgBouncer in transaction mode in front of it), and the
 * platform instance it drives.
 *
 * The PostgreSQL token store under the real pipeline: the token API, the token service, the
 * dispatcher and the Web adapter in front of MCP SDK servers, served on 127.0.0.1, driven by
 * the official SDK client and plain HTTP. A token's whole life reaches the table; two
 * instances on one database agree within their cache TTL; an unreachable or silent
 * PostgreSQL gives 503, never a 200, and never a hung request.
 */
import {
  type DispatcherOptions,
  type TokenService,
  type TokenServiceOptions,
  type InvalidationBus,
  createDispatcher,
  createMemoryAppStore,
  createMemoryInvalidationBus,
  createMemorySubscriptionStore,
  createTokenApi,
  createTokenService,
  hashApiToken,
} from 'mcp-dispatch'
import { type PostgresQuery, type PostgresQueryable, createPostgresTokenStore } from 'mcp-dispatch/postgres'
import { mcpDispatch, routeByVersion } from 'mcp-dispatch/web'
import { expect, it } from 'vitest'
import { buildScenarioServer, createWebMcpHandler, readVersion } from '../adapters/mcp.js'
import { type TestClock, INITIALIZE, createClock, serveFetch } from '../helpers/platform.js'
import type { TestPostgres } from '../helpers/postgres.js'
import { tokenStatements, tokenTableNames } from '../../src/stores/postgres/schema.js'


/** One platform instance: token API under `/api/tokens`, the weather App's MCP everywhere else. */
export interface Instance {
  readonly origin: string
  readonly tokens: TokenService
  readonly clock: TestClock
  readonly errors: Array<{ error: unknown; context: string }>
  /** Every query the instance's token store sent to PostgreSQL. */
  readonly queries: PostgresQuery[]
  /** The operation of each of {@link queries}: `find_by_hash`, `touch`… (named or not). */
  operations(): string[]
  /** How many MCP requests (not token API calls) reached the instance. */
  readonly mcpRequests: () => number
  close(): Promise<void>
}

export async function startInstance(options: {
  pool: PostgresQueryable
  schema?: string
  /** The store's `preparedStatements` (default `true`). */
  preparedStatements?: boolean
  cacheTtlMs?: number
  /** The token service's bus; default one of its own (it hears only itself). */
  invalidations?: InvalidationBus
  storeTimeoutMs?: number
  pepper?: string
  previousPeppers?: readonly (string | null)[]
  /** The clock of the service and the dispatcher; default the instance's `clock`, which stands still until advanced. */
  now?: () => number
  /** More options of the token service (`storeTimeoutMs`, `lastUsedFlushMs`…). */
  service?: Partial<TokenServiceOptions>
  /** More options of the dispatcher (`sessions`, `rateLimit`…). */
  dispatcher?: Partial<DispatcherOptions>
}): Promise<Instance> {
  const queries: PostgresQuery[] = []
  const pool: PostgresQueryable = {
    query(query) {
      queries.push(query)
      return options.pool.query(query)
    },
  }
  const store = createPostgresTokenStore({
    pool,
    ...(options.schema !== undefined && { schema: options.schema }),
    ...(options.preparedStatements !== undefined && { preparedStatements: options.preparedStatements }),
  })
  // Unnamed statements are told by their text.
  const named = new Map(Object.values(tokenStatements(tokenTableNames({ schema: options.schema }))).map((s) => [s.text, s.name]))
  const clock = createClock()
  const now = options.now ?? clock.now
  const errors: Instance['errors'] = []
  const onError = (error: unknown, context: string) => errors.push({ error, context })
  const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0'] }])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
  const tokens = createTokenService({
    store,
    apps,
    subscriptions,
    cacheTtlMs: options.cacheTtlMs ?? 0,
    invalidations: options.invalidations ?? createMemoryInvalidationBus(),
    now,
    onError,
    ...(options.pepper !== undefined && { pepper: options.pepper }),
    ...(options.previousPeppers !== undefined && { previousPeppers: options.previousPeppers }),
    ...options.service,
  })
  const dispatcher = createDispatcher({
    apps,
    subscriptions,
    tokens,
    resolveApp: () => apps.getApp('app_weather'),
    ...(options.storeTimeoutMs !== undefined && { storeTimeoutMs: options.storeTimeoutMs }),
    now,
    onError,
    ...options.dispatcher,
  })
  const sessions: Array<{ close(): Promise<void> }> = []
  const mcp = mcpDispatch({
    dispatcher,
    onError,
    handler: routeByVersion((app, version) => {
      const handler = createWebMcpHandler(() => buildScenarioServer(app.slug, version))
      sessions.push(handler)
      return (request) => handler.handle(request)
    }),
  })
  // The dashboard session: a cookie naming the user, and a CSRF header derived from it.
  const user = (request: Request) => /(?:^|;\s*)session=(\w+)/.exec(request.headers.get('cookie') ?? '')?.[1]
  const api = createTokenApi({
    tokens,
    authenticateSession: (request) => {
      const userId = user(request)
      return userId ? { userId } : null
    },
    verifyCsrf: (request, session) => request.headers.get('x-csrf-token') === `csrf-${session.userId}`,
    onError,
  })
  let mcpRequests = 0
  const served = await serveFetch(async (request, info) => {
    if (new URL(request.url).pathname.startsWith('/api/tokens')) return (await api(request)) ?? new Response('not found', { status: 404 })
    mcpRequests++
    return mcp(request, info)
  })
  return {
    origin: `http://127.0.0.1:${served.port}`,
    tokens,
    clock,
    errors,
    queries,
    operations: () => queries.map((query) => (query.name ?? named.get(query.text) ?? query.text).replace(/^mcp_dispatch_[0-9a-f]+_/, '')),
    mcpRequests: () => mcpRequests,
    async close() {
      await Promise.all(sessions.map((s) => s.close()))
      await tokens.close()
      await served.close()
    },
  }
}

/** A dashboard call of alice's. */
export function asAlice(instance: Instance, method: string, path: string, body?: unknown): Promise<Response> {
  return fetch(`${instance.origin}/api/tokens${path}`, {
    method,
    headers: { cookie: 'session=alice', 'x-csrf-token': 'csrf-alice', 'content-type': 'application/json' },
    ...(body !== undefined && { body: JSON.stringify(body) }),
  })
}

/** A plain MCP `initialize` with a bearer token; resolves to the response. */
export function initialize(instance: Instance, token: string): Promise<Response> {
  return fetch(`${instance.origin}/v1`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, accept: 'application/json, text/event-stream', 'content-type': 'application/json' },
    body: JSON.stringify(INITIALIZE),
  })
}

export async function status(instance: Instance, token: string): Promise<number> {
  const response = await initialize(instance, token)
  await response.body?.cancel()
  return response.status
}

/** The version the SDK client is served with `token` (a whole session: initialize, tools/call, DELETE). */
function sdkVersion(instance: Instance, token: string): Promise<unknown> {
  return readVersion(`${instance.origin}/v1`, { fetch, headers: { authorization: `Bearer ${token}` } })
}

/**
 * A token's whole life through the pipeline on `postgres`, two instances on one database, and
 * a pepper turned on, with the store's `preparedStatements`.
 */
export function postgresPipelineSuite(postgres: TestPostgres, { preparedStatements }: { preparedStatements: boolean }): void {

  it('create, call with the SDK client, coalesced last-used, rotate, revoke: every step reaches the table', async () => {
    const store = await postgres.tokenStore({ preparedStatements })
    const instance = await startInstance({ pool: postgres.pool, schema: store.schema, preparedStatements })
    const row = async (id: string) =>
      (await postgres.pool.query(`SELECT token_hash, last_used_at, revoked_at FROM ${store.table} WHERE id = $1`, [id])).rows[0]
    try {
      const created = await asAlice(instance, 'POST', '', { name: 'CI', servers: ['app_weather'], expires_in_days: 30 })
      expect(created.status).toBe(201)
      const { id, token } = await created.json()
      expect(await row(id)).toEqual({ token_hash: hashApiToken(token), last_used_at: null, revoked_at: null })

      instance.queries.length = 0
      const before = instance.mcpRequests()
      expect(await sdkVersion(instance, token)).toEqual([{ type: 'text', text: '1.1.0' }])
      // One indexed lookup per request, and no write: last-used times wait for the flush.
      expect(instance.mcpRequests() - before).toBeGreaterThanOrEqual(3)
      expect(instance.operations()).toEqual(Array(instance.mcpRequests() - before).fill('find_by_hash'))
      expect((await row(id)).last_used_at).toBeNull()

      instance.clock.advance(1_000)
      expect(await status(instance, token)).toBe(200)
      instance.queries.length = 0
      await instance.tokens.flush()
      expect(instance.operations()).toEqual(['touch'])
      expect(Number((await row(id)).last_used_at)).toBe(instance.clock.now())

      // The token rotates itself (Bearer): the old secret stops at once, the new one works.
      const rotated = await fetch(`${instance.origin}/api/tokens/${id}/rotate`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}` },
      })
      expect(rotated.status).toBe(200)
      const next = (await rotated.json()).token as string
      expect(next).not.toBe(token)
      expect((await row(id)).token_hash).toBe(hashApiToken(next))
      const refused = await initialize(instance, token)
      expect(refused.status).toBe(401)
      expect(refused.headers.get('www-authenticate')).toContain('error="invalid_token"')
      await refused.body?.cancel()
      expect(await sdkVersion(instance, next)).toEqual([{ type: 'text', text: '1.1.0' }])

      instance.clock.advance(1_000)
      const revoked = await asAlice(instance, 'DELETE', `/${id}`)
      expect(revoked.status).toBe(200)
      expect(await revoked.json()).toMatchObject({ id, status: 'revoked' })
      expect(Number((await row(id)).revoked_at)).toBe(instance.clock.now())
      expect(await status(instance, next)).toBe(401)

      const listed = await (await asAlice(instance, 'GET', '')).json()
      expect(listed.tokens).toEqual([expect.objectContaining({ id, status: 'revoked', last_used_at: expect.any(String) })])
      expect(instance.errors).toEqual([])
    } finally {
      await instance.close()
    }
  })

  it('two instances on one database hearing one bus: a rotation or revocation through one is refused by the other at once, though it caches', async () => {
    const store = await postgres.tokenStore({ preparedStatements })
    // What a Redis bus gives instances in several processes (test/stores/redis-instances-suite.ts).
    const invalidations = createMemoryInvalidationBus()
    const a = await startInstance({ pool: postgres.openPool({ max: 2 }), schema: store.schema, preparedStatements, invalidations })
    const b = await startInstance({ pool: postgres.openPool({ max: 2 }), schema: store.schema, cacheTtlMs: 600_000, preparedStatements, invalidations })
    try {
      const created = await asAlice(a, 'POST', '', { name: 'shared', servers: ['app_weather'], expires_in_days: 7 })
      const { id, token } = await created.json()
      expect(await status(b, token)).toBe(200)
      const lookups = b.queries.length
      expect(await status(b, token)).toBe(200)
      expect(b.queries.length).toBe(lookups) // served from b's cache

      const rotated = await asAlice(a, 'POST', `/${id}/rotate`)
      expect(rotated.status).toBe(200)
      const next = (await rotated.json()).token as string
      expect(await status(b, token)).toBe(401)
      expect(await status(b, next)).toBe(200)
      expect((await asAlice(a, 'DELETE', `/${id}`)).status).toBe(200)
      expect(await status(b, next)).toBe(401)
      expect([...a.errors, ...b.errors]).toEqual([])
    } finally {
      await a.close()
      await b.close()
    }
  })

  it('two instances on one database, each told it is alone (a bus of its own): a rotation or revocation through one is refused by the other within its cache TTL', async () => {
    const store = await postgres.tokenStore({ preparedStatements })
    const a = await startInstance({ pool: postgres.openPool({ max: 2 }), schema: store.schema, preparedStatements })
    const b = await startInstance({ pool: postgres.openPool({ max: 2 }), schema: store.schema, cacheTtlMs: 1_000, preparedStatements })
    try {
      const created = await asAlice(a, 'POST', '', { name: 'shared', servers: ['app_weather'], expires_in_days: 7 })
      const { id, token } = await created.json()
      expect(await status(b, token)).toBe(200)

      const rotated = await asAlice(a, 'POST', `/${id}/rotate`)
      expect(rotated.status).toBe(200)
      const next = (await rotated.json()).token as string
      expect(await status(a, token)).toBe(401)
      // No broadcast between these instances: b trusts its cached record, without asking
      // PostgreSQL, for at most cacheTtlMs.
      const lookups = b.queries.length
      expect(await status(b, token)).toBe(200)
      expect(b.queries.length).toBe(lookups)
      b.clock.advance(1_001)
      expect(await status(b, token)).toBe(401)
      expect(await status(b, next)).toBe(200)

      expect((await asAlice(a, 'DELETE', `/${id}`)).status).toBe(200)
      expect(await status(a, next)).toBe(401)
      b.clock.advance(1_001)
      expect(await status(b, next)).toBe(401)
      expect([...a.errors, ...b.errors]).toEqual([])
    } finally {
      await a.close()
      await b.close()
    }
  })

  it('a pepper turned on with the old scheme in previousPeppers: existing tokens keep working until rotated onto it', async () => {
    const store = await postgres.tokenStore({ preparedStatements })
    const hashOf = async (id: string) =>
      (await postgres.pool.query(`SELECT token_hash FROM ${store.table} WHERE id = $1`, [id])).rows[0].token_hash as string
    const before = await startInstance({ pool: postgres.pool, schema: store.schema, preparedStatements })
    const { id, token } = await (await asAlice(before, 'POST', '', { name: 'CI', servers: ['app_weather'], expires_in_days: 30 })).json()
    await before.close()

    const locked = await startInstance({ pool: postgres.pool, schema: store.schema, pepper: 'a-long-random-pepper', preparedStatements })
    const after = await startInstance({
      pool: postgres.pool,
      schema: store.schema,
      preparedStatements,
      pepper: 'a-long-random-pepper',
      previousPeppers: [null],
      cacheTtlMs: 60_000,
    })
    try {
      expect(await status(locked, token)).toBe(401)
      expect(await sdkVersion(after, token)).toEqual([{ type: 'text', text: '1.1.0' }])
      expect(await hashOf(id)).toBe(hashApiToken(token))
      // Cached under the hash it is stored with: no more queries while it is served.
      after.queries.length = 0
      expect(await status(after, token)).toBe(200)
      expect(after.queries).toEqual([])

      // Its owner's rotation stores the new secret under the pepper; the old secret is refused at once.
      const rotated = await asAlice(after, 'POST', `/${id}/rotate`)
      expect(rotated.status).toBe(200)
      const next = (await rotated.json()).token as string
      expect(await hashOf(id)).toBe(hashApiToken(next, 'a-long-random-pepper'))
      expect(await status(after, token)).toBe(401)
      expect(await status(after, next)).toBe(200)
      expect(await status(locked, next)).toBe(200)
      expect([...locked.errors, ...after.errors]).toEqual([])
    } finally {
      await locked.close()
      await after.close()
    }
  })
}
