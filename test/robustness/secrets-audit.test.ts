/**
 * Secrets end to end, on the real stores: the pipeline, the token service and the token API
 * over PostgreSQL (token store, with a pepper) and Redis (OAuth validation cache, session pins,
 * rate-limit counters, invalidation pub/sub), an authorization server over HTTP, the MCP SDK's
 * server behind the Web adapter. What each store was sent and keeps is read back directly:
 *
 * - every command Redis ran (`MONITOR`: keys, values, published messages) and every key and
 *   value under the prefix afterwards, every query PostgreSQL was sent (text and parameters)
 *   and every row afterwards, hold no API-token secret, OAuth access token, pepper, dashboard
 *   cookie or CSRF token; API tokens are at rest as the HMAC of the pepper only;
 * - the reports (`onError`, the validator's `onEvent`, errors scanned whole with their causes)
 *   hold none of those, nor a token's hash, also while the stores fail (Redis `WRONGTYPE` with
 *   ioredis' command arguments, a PostgreSQL table gone);
 * - the token API's list, get, edit and revoke answers never carry a secret; create and rotate
 *   carry only their own.
 *
 * test/robustness/security.test.ts covers the same on the in-memory stores, every adapter and
 * the default logger.
 */
import { createHash, createHmac, randomBytes } from 'node:crypto'
import { inspect } from 'node:util'
import { Redis } from 'ioredis'
import {
  type CachedValidation,
  type OAuthValidatorEvent,
  type TokenService,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createOAuthValidator,
  createTokenApi,
  createTokenService,
  hashApiToken,
} from 'mcp-dispatch'
import { type PostgresQuery, type PostgresQueryable, type PostgresTokenStore, createPostgresTokenStore } from 'mcp-dispatch/postgres'
import {
  createRedisCacheStore,
  createRedisInvalidationBus,
  createRedisRateLimitStore,
  createRedisSessionStore,
} from 'mcp-dispatch/redis'
import { mcpDispatch, routeByVersion } from 'mcp-dispatch/web'
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest'
import { buildScenarioServer, createWebMcpHandler } from '../adapters/mcp.js'
import { INITIALIZE } from '../helpers/platform.js'
import { randomSchemaName, usePostgres } from '../helpers/postgres.js'
import { REDIS_URL, redisAvailable, scanKeys } from '../helpers/redis.js'
import { type FakeAnswer, type FakeUpstream, startFakeUpstream } from '../oauth/helpers/fake-upstream.js'
import { textsOf } from './support.js'

const HOST = 'weather.localhost'
const APP = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] } as const
const ACCEPT = 'application/json, text/event-stream'

describe.runIf(redisAvailable)('secrets on the real stores', () => {
  const postgres = usePostgres()
  const pepper = `pepper-${randomBytes(24).toString('base64url')}`
  const cookie = randomBytes(24).toString('base64url')
  const csrf = randomBytes(24).toString('base64url')
  const prefix = `mcp-dispatch-test:${randomBytes(6).toString('hex')}:`
  /** OAuth access tokens: accepted, refused, and one the server echoes back in its answer. */
  const oauth = {
    good: `at.${randomBytes(24).toString('base64url')}`,
    refused: `at.${randomBytes(24).toString('base64url')}`,
    echoed: `at.${randomBytes(24).toString('base64url')}`,
    failing: `at.${randomBytes(24).toString('base64url')}`,
  }
  const issued: string[] = [] // every API-token secret the API handed out
  const reports: string[] = [] // onError and onEvent, whole
  const answers: string[] = [] // every answer's body and headers but those of create and rotate
  const monitored: string[] = [] // every command Redis ran, as MONITOR shows it
  const queries: PostgresQuery[] = []
  let schema: string
  let client: Redis
  let monitoring: Redis
  let monitor: Awaited<ReturnType<Redis['monitor']>>
  let upstream: FakeUpstream
  let mcp: (request: Request) => Promise<Response>
  let api: (request: Request) => Promise<Response | null>
  let tokenTable: string
  let store: PostgresTokenStore
  let service: TokenService
  const closing: Array<() => Promise<void>> = []

  const report = (error: unknown, context: string) => reports.push(context, ...textsOf(error), inspect(error, { depth: 8 }))

  beforeAll(async () => {
    client = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 })
    // `monitor()` opens a connection of its own: both are closed after.
    monitoring = new Redis(REDIS_URL)
    monitor = await monitoring.monitor()
    monitor.on('monitor', (_time: string, args: string[]) => monitored.push(args.join(' ')))
    upstream = await startFakeUpstream()
    upstream.route('/userinfo', (request): FakeAnswer => {
      const token = (request.headers.authorization ?? '').replace(/^Bearer /, '')
      if (token === oauth.good) return { status: 200, body: { sub: 'alice' } }
      // A server that names the token it refuses, in its body and its challenge.
      if (token === oauth.echoed) {
        return { status: 400, body: `invalid token ${token}`, headers: { 'content-type': 'text/plain', 'www-authenticate': `Bearer error="invalid_request", error_description="bad token ${token}"` } }
      }
      if (token === oauth.failing) return { status: 500, body: { error: `server_error for ${token}` } }
      return { status: 401, body: { error: 'invalid_token', token }, headers: { 'www-authenticate': 'Bearer error="invalid_token"' } }
    })

    schema = randomSchemaName()
    const pool: PostgresQueryable = {
      query(query) {
        queries.push(query)
        return postgres.pool.query(query)
      },
    }
    store = createPostgresTokenStore({ pool, schema })
    await store.migrate()
    tokenTable = store.table
    const built = await pipeline(report)
    ;({ mcp, api, tokens: service } = built)
    closing.push(built.close)
  })

  /**
   * The pipeline on the real stores, reporting to `onError` (the validator's events too), or,
   * without it, to the default logger.
   */
  async function pipeline(onError: ((error: unknown, context: string) => void) | undefined) {
    const reporting = onError === undefined ? {} : { onError }
    const apps = createMemoryAppStore([APP])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: APP.id, active: true }])
    const invalidations = createRedisInvalidationBus({ client, prefix, ...reporting })
    await invalidations.ready(5_000)
    const tokens = createTokenService({ store, apps, subscriptions, pepper, cacheTtlMs: 60_000, invalidations, ...reporting })
    const validator = createOAuthValidator({
      issuer: upstream.url,
      userinfoEndpoint: `${upstream.url}/userinfo`,
      cache: createRedisCacheStore<CachedValidation>({ client, prefix, localTtlMs: 0 }),
      retry: { attempts: 1 },
      ...(onError && { onEvent: (event: OAuthValidatorEvent) => reports.push(event.type, inspect(event, { depth: 8 })) }),
    })
    const dispatcher = createDispatcher({
      apps,
      subscriptions,
      tokens,
      oauth: validator,
      sessions: createRedisSessionStore({ client, prefix }),
      rateLimit: { store: createRedisRateLimitStore({ client, prefix }), policy: () => ({ limit: 1_000, windowType: 'minute' }) },
      ...reporting,
    })
    const sessions = createWebMcpHandler(() => buildScenarioServer(APP.slug, '1.0.0'))
    const handle = mcpDispatch({ dispatcher, ...reporting, handler: routeByVersion(() => (request) => sessions.handle(request)) })
    const tokenApi = createTokenApi({
      tokens,
      authenticateSession: (request) => ((request.headers.get('cookie') ?? '').includes(`sid=${cookie}`) ? { userId: 'alice' } : null),
      verifyCsrf: (request) => request.headers.get('x-csrf-token') === csrf,
      ...reporting,
    })
    return {
      tokens,
      mcp: (request: Request) => handle(request, { clientAddress: '127.0.0.1' }),
      api: (request: Request) => tokenApi(request, { clientAddress: '127.0.0.1' }),
      async close() {
        await sessions.close()
        await tokens.close()
        await invalidations.close()
      },
    }
  }

  afterAll(async () => {
    for (const close of closing) await close()
    await upstream?.close()
    monitor?.disconnect()
    monitoring?.disconnect()
    if (client) {
      const keys = await scanKeys(client, `${prefix}*`)
      if (keys.length > 0) await client.del(...keys)
      client.disconnect()
    }
  })

  /** A dashboard call; its answer is kept for the scan unless `secret` (create, rotate). */
  async function dashboard(method: string, path: string, body?: unknown, secret = false): Promise<Response> {
    const response = (await api(
      new Request(`http://dashboard.localhost/api/tokens${path}`, {
        method,
        headers: { cookie: `theme=dark; sid=${cookie}`, 'x-csrf-token': csrf, 'content-type': 'application/json' },
        ...(body !== undefined && { body: JSON.stringify(body) }),
      }),
    ))!
    if (!secret) await keep(response)
    return response
  }

  async function keep(response: Response): Promise<string> {
    const text = await response.clone().text()
    answers.push(text, ...[...response.headers].map(([name, value]) => `${name}: ${value}`))
    return text
  }

  /** An MCP exchange with `token`: initialize, then tools/list on the session, then DELETE. */
  async function useMcp(token: string): Promise<number> {
    const headers = { authorization: `Bearer ${token}`, accept: ACCEPT, 'content-type': 'application/json' }
    const init = await mcp(new Request(`http://${HOST}/v1`, { method: 'POST', headers, body: JSON.stringify(INITIALIZE) }))
    await keep(init)
    const session = init.headers.get('mcp-session-id')
    if (init.status !== 200 || session === null) return init.status
    const sessionHeaders = { ...headers, 'mcp-session-id': session, 'mcp-protocol-version': '2025-06-18' }
    for (const body of [{ jsonrpc: '2.0', method: 'notifications/initialized' }, { jsonrpc: '2.0', id: 2, method: 'tools/list' }]) {
      await keep(await mcp(new Request(`http://${HOST}/v1`, { method: 'POST', headers: sessionHeaders, body: JSON.stringify(body) })))
    }
    await keep(await mcp(new Request(`http://${HOST}/v1`, { method: 'DELETE', headers: sessionHeaders })))
    return 200
  }

  it("a token's whole life, OAuth tokens accepted and refused: nothing secret in Redis, PostgreSQL, the reports or the answers", async () => {
    // Create two tokens, list, read, edit, rotate one by the session and one by itself.
    const created = await Promise.all(
      ['laptop', 'ci'].map(async (name) => {
        const response = await dashboard('POST', '', { name, servers: [APP.id], expires_in_days: 30 }, true)
        expect(response.status).toBe(201)
        return (await response.json()) as { id: string; token: string }
      }),
    )
    issued.push(...created.map((c) => c.token))
    const [laptop, ci] = created as [{ id: string; token: string }, { id: string; token: string }]
    expect(await useMcp(laptop.token)).toBe(200)
    expect(await useMcp(ci.token)).toBe(200)

    const listed = await dashboard('GET', '')
    expect(listed.status).toBe(200)
    expect(await dashboard('GET', `/${laptop.id}`)).toHaveProperty('status', 200)
    expect(await dashboard('PATCH', `/${laptop.id}`, { name: 'laptop 2', allowed_ips: ['127.0.0.1', '::1'] })).toHaveProperty('status', 200)

    const bySession = await dashboard('POST', `/${laptop.id}/rotate`, undefined, true)
    expect(bySession.status).toBe(200)
    const laptopNext = ((await bySession.json()) as { token: string }).token
    issued.push(laptopNext)
    const byItself = (await api(
      new Request(`http://dashboard.localhost/api/tokens/${ci.id}/rotate`, { method: 'POST', headers: { authorization: `Bearer ${ci.token}` } }),
    ))!
    expect(byItself.status).toBe(200)
    const ciNext = ((await byItself.json()) as { token: string }).token
    issued.push(ciNext)
    // The old secrets are refused (401), the new ones work; a rotation by a stale secret is refused.
    expect(await useMcp(laptop.token)).toBe(401)
    expect(await useMcp(laptopNext)).toBe(200)
    expect(await useMcp(ciNext)).toBe(200)
    const stale = (await api(
      new Request(`http://dashboard.localhost/api/tokens/${ci.id}/rotate`, { method: 'POST', headers: { authorization: `Bearer ${ci.token}` } }),
    ))!
    expect(stale.status).toBe(401)
    await keep(stale)

    // OAuth: accepted twice (the second from the Redis cache), refused, echoed, failing.
    expect(await useMcp(oauth.good)).toBe(200)
    expect(await useMcp(oauth.good)).toBe(200)
    expect(upstream.count('/userinfo')).toBe(1)
    expect(await useMcp(oauth.refused)).toBe(401)
    expect(await useMcp(oauth.echoed)).toBe(401)
    expect(await useMcp(oauth.failing)).toBe(503)

    // Revoke one, reset the password (revokes the other); both refused from then on.
    expect(await dashboard('DELETE', `/${laptop.id}`)).toHaveProperty('status', 200)
    expect(await useMcp(laptopNext)).toBe(401)
    expect(await service.revokeAllForUser('alice')).toBe(1)
    expect(await useMcp(ciNext)).toBe(401)

    // The views: no secret, no hash, in any answer but the create's and the rotate's.
    const views = [...(((await (await dashboard('GET', '')).json()) as { tokens: Array<Record<string, unknown>> }).tokens)]
    expect(views.map((v) => v.id).sort()).toEqual([laptop.id, ci.id].sort())
    for (const view of views) {
      expect(Object.keys(view).sort()).toEqual(['allowed_ips', 'created_at', 'expires_at', 'id', 'last_used_at', 'name', 'prefix', 'scopes', 'status'])
      expect(view.prefix).toHaveLength(12)
    }

    await settle()
    const oauthTokens = Object.values(oauth)
    const secrets = [...issued, ...oauthTokens, pepper, cookie, csrf]
    const hashes = [
      ...issued.map((token) => hashApiToken(token, pepper)),
      ...issued.map((token) => hashApiToken(token)),
      ...oauthTokens.map((token) => createHash('sha256').update(token).digest('base64url')),
    ]

    // Redis: what it was sent, and what it keeps.
    // Every store's commands were seen: pins, counters, the OAuth cache, invalidations.
    for (const what of [`${prefix}session:`, `${prefix}rl:`, `${prefix}cache:`, `PUBLISH ${prefix}invalidations`]) {
      expect([what, monitored.some((line) => line.includes(what))]).toEqual([what, true])
    }
    expect(leaks(monitored.filter((line) => line.includes(prefix)), secrets)).toEqual([])
    const kept: string[] = []
    for (const key of await scanKeys(client, `${prefix}*`)) {
      const type = await client.type(key)
      const value =
        type === 'string' ? await client.get(key) : type === 'hash' ? JSON.stringify(await client.hgetall(key)) : `(${type})`
      kept.push(`${key} = ${value}`)
    }
    expect(kept.some((line) => line.includes(`${prefix}cache:`))).toBe(true) // the OAuth cache
    expect(kept.some((line) => line.includes(`${prefix}rl:`))).toBe(true) // the counters
    expect(leaks(kept, secrets)).toEqual([])
    // The OAuth cache is keyed by the token's hash.
    const goodHash = createHash('sha256').update(oauth.good).digest('base64url')
    expect(kept.some((line) => line.startsWith(`${prefix}cache:`) && line.includes(goodHash))).toBe(true)

    // PostgreSQL: every query sent, and every row.
    expect(queries.length).toBeGreaterThan(10)
    expect(leaks(queries.map((q) => `${q.text} ${JSON.stringify(q.values ?? [])}`), secrets)).toEqual([])
    const rows = (await postgres.pool.query(`SELECT * FROM ${tokenTable} ORDER BY created_at`)).rows as Array<Record<string, unknown>>
    expect(rows).toHaveLength(2)
    expect(leaks(rows.map((row) => JSON.stringify(row)), secrets)).toEqual([])
    // At rest under the pepper's HMAC, never plain SHA-256: the live secrets' rows.
    const byId = new Map(rows.map((row) => [row.id, row]))
    expect(byId.get(laptop.id)!.token_hash).toBe(createHmac('sha256', pepper).update(laptopNext).digest('hex'))
    expect(byId.get(ci.id)!.token_hash).toBe(createHmac('sha256', pepper).update(ciNext).digest('hex'))
    expect(byId.get(ci.id)!.display_prefix).toBe(ciNext.slice(0, 12))

    // Reports and answers: no secret, no hash (answers: no hash-like value at all).
    expect(reports.length).toBeGreaterThan(0)
    expect(leaks([...reports, ...answers], [...secrets, ...hashes])).toEqual([])
    expect(answers.filter((text) => /[0-9a-f]{64}/.test(text)).slice(0, 3)).toEqual([])
  })

  it("stores that fail mid-request: Redis WRONGTYPE (ioredis' command arguments) and a PostgreSQL table gone report no secret nor hash", async () => {
    const created = await dashboard('POST', '', { name: 'doomed', servers: [APP.id], expires_in_days: 7 }, true)
    expect(created.status).toBe(201)
    const { id, token } = (await created.json()) as { id: string; token: string }
    issued.push(token)
    const good = `at.${randomBytes(24).toString('base64url')}`
    upstream.route('/userinfo', (request) =>
      request.headers.authorization === `Bearer ${good}` ? { status: 200, body: { sub: 'alice' } } : { status: 401 },
    )
    const hashOfGood = createHash('sha256').update(good).digest('base64url')
    expect(await useMcp(good)).toBe(200)
    // Every key of ours becomes a list: every read and write of it fails with WRONGTYPE.
    const keys = await scanKeys(client, `${prefix}*`)
    for (const key of keys) {
      await client.del(key)
      await client.rpush(key, 'not what the store wrote')
    }
    // The OAuth cache misses (the validator asks again), the counters fail open.
    reports.length = 0
    expect(await useMcp(good)).toBe(200)
    expect(reports.join('\n')).toContain('WRONGTYPE')
    // PostgreSQL: the table renamed away mid-run, every lookup fails (503), then back.
    await postgres.pool.query(`ALTER TABLE ${tokenTable} RENAME TO gone`)
    try {
      expect(await useMcp(token)).toBe(503)
      expect((await dashboard('GET', `/${id}`)).status).toBe(503)
    } finally {
      await postgres.pool.query(`ALTER TABLE "${schema}".gone RENAME TO ${tokenTable.split('.')[1]}`)
    }
    expect(reports.join('\n')).toContain('42P01')
    await settle()
    const secrets = [...issued, good, pepper, cookie, csrf]
    const hashes = [...issued.map((t) => hashApiToken(t, pepper)), ...issued.map((t) => hashApiToken(t)), hashOfGood]
    expect(leaks([...reports, ...answers], [...secrets, ...hashes])).toEqual([])
  })

  it('with no onError anywhere, the default logger prints none of them while Redis and PostgreSQL fail', async () => {
    const built = await pipeline(undefined)
    closing.push(built.close)
    const reporting = { mcp, api }
    ;({ mcp, api } = built)
    const printed: string[] = []
    const spy = vi.spyOn(console, 'error').mockImplementation((...args: unknown[]) => {
      printed.push(args.map((a) => (typeof a === 'string' ? a : inspect(a, { depth: 8 }))).join(' '))
    })
    try {
      const created = await dashboard('POST', '', { name: 'quiet', servers: [APP.id], expires_in_days: 7 }, true)
      expect(created.status).toBe(201)
      const { id, token } = (await created.json()) as { id: string; token: string }
      issued.push(token)
      const good = `at.${randomBytes(24).toString('base64url')}`
      upstream.route('/userinfo', (request) =>
        request.headers.authorization === `Bearer ${good}` ? { status: 200, body: { sub: 'alice' } } : { status: 401 },
      )
      expect(await useMcp(good)).toBe(200)
      for (const key of await scanKeys(client, `${prefix}*`)) {
        await client.del(key)
        await client.rpush(key, 'not what the store wrote')
      }
      expect(await useMcp(good)).toBe(200) // the counters fail open, logged
      await postgres.pool.query(`ALTER TABLE ${tokenTable} RENAME TO gone`)
      try {
        expect(await useMcp(token)).toBe(503)
        expect((await dashboard('GET', `/${id}`)).status).toBe(503)
        expect((await dashboard('DELETE', `/${id}`)).status).toBe(503)
      } finally {
        await postgres.pool.query(`ALTER TABLE "${schema}".gone RENAME TO ${tokenTable.split('.')[1]}`)
      }
      await settle()
      const logged = printed.filter((line) => line.startsWith('[mcp-dispatch] '))
      expect(logged.join('\n')).toContain('42P01')
      expect(logged.join('\n')).toContain('WRONGTYPE')
      const secrets = [...issued, good, pepper, cookie, csrf]
      const hashes = [...issued.map((t) => hashApiToken(t, pepper)), ...issued.map((t) => hashApiToken(t)), createHash('sha256').update(good).digest('base64url')]
      expect(leaks([...printed, ...answers], [...secrets, ...hashes])).toEqual([])
    } finally {
      spy.mockRestore()
      ;({ mcp, api } = reporting)
    }
  })

  /** Lets reports of work after an answer (last-used writes, invalidations) arrive. */
  async function settle(): Promise<void> {
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
})

/**
 * Texts naming any of `secrets`: the first five. (Not any `svc_…` string, as
 * security.test.ts checks: a token's 12-character display prefix is stored and listed.)
 */
function leaks(texts: string[], secrets: string[]): string[] {
  return texts.filter((text) => secrets.some((secret) => text.includes(secret))).slice(0, 5)
}
