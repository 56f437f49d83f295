/**
 * OAuth validation with the validation cache shared by two dispatcher instances through real
 * Redis (a small local cache in front of it on each), in every mode (DESIGN.md "OAuth access
 * tokens", docs/oauth.md "Cache" and "Resilience"):
 *
 * - the cache lifetime (5 minutes by default, configurable) bounds the Redis entry's TTL, and a
 *   JWT's own `exp` bounds it too, in the Redis entry and in the other instance's local copy;
 * - refusals are never cached as acceptances; the refusals one instance keeps are the other's;
 * - while one instance's breaker is open, tokens the other cached in Redis keep working there,
 *   and uncached ones get the 503 of DESIGN.md with `Retry-After`;
 * - with Redis gone mid-run, tokens are validated upstream (or from the local copy), never
 *   taken unvalidated, and no request is answered 500;
 * - the token is never a Redis key, a Redis value, an event or an error body.
 *
 * A real oidc-provider (the development authorization server) issues the tokens of the
 * userinfo tests; the answers a provider should not give come from a programmable upstream.
 */
import { createHash } from 'node:crypto'
import { SignJWT, generateKeyPair } from 'jose'
import type { Redis } from 'ioredis'
import {
  type CachedValidation,
  type OAuthValidator,
  type OAuthValidatorEvent,
  type OAuthValidatorOptions,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createOAuthValidator,
  createTokenService,
} from 'mcp-dispatch'
import { type RedisCacheStoreOptions, createRedisCacheStore } from 'mcp-dispatch/redis'
import { mcpDispatch } from 'mcp-dispatch/web'
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { IOREDIS, type RedisTestContext, describeRedis, startPrivateRedis } from '../helpers/redis.js'
import { type ManualClock, createManualClock, createRecordingSleep } from './helpers/clock.js'
import { type FakeUpstream, proxyTo, startFakeUpstream } from './helpers/fake-upstream.js'
import { obtainAccessToken } from './helpers/oauth-client.js'

const WEATHER = { id: 'app_weather', slug: 'weather', name: 'Weather' } as const
const APP_URL = 'http://weather.localhost'

interface Instance {
  readonly name: string
  readonly validator: OAuthValidator
  readonly events: OAuthValidatorEvent[]
  readonly errors: unknown[]
  /** A `tools/list` through the whole pipeline (web adapter), in process. */
  post(bearer: string): Promise<Response>
}

function startInstance(
  name: string,
  validatorOptions: OAuthValidatorOptions,
  cacheOptions: RedisCacheStoreOptions | undefined,
  now: () => number,
): Instance {
  const events: OAuthValidatorEvent[] = []
  const errors: unknown[] = []
  const apps = createMemoryAppStore([{ ...WEATHER, versions: ['1.0.0'] }])
  const subscriptions = createMemorySubscriptionStore([
    { userId: 'user_alice', appId: WEATHER.id, active: true },
    { userId: 'user_bob', appId: WEATHER.id, active: true },
  ])
  const validator = createOAuthValidator({
    ...validatorOptions,
    ...(cacheOptions && { cache: createRedisCacheStore<CachedValidation>({ ...cacheOptions, now }) }),
    now,
    onEvent: (event) => events.push(event),
  })
  const dispatcher = createDispatcher({
    apps,
    subscriptions,
    tokens: createTokenService({ store: createMemoryTokenStore(), apps, subscriptions, now }),
    oauth: validator,
    baseUrl: (_request, app) => `http://${app.slug}.localhost`,
    now,
    onError: (error) => errors.push(error),
  })
  const handle = mcpDispatch({
    dispatcher,
    onError: (error) => errors.push(error),
    handler: () => Response.json({ jsonrpc: '2.0', id: 1, result: { tools: [] } }),
  })
  return {
    name,
    validator,
    events,
    errors,
    post: (bearer) =>
      handle(
        new Request(`${APP_URL}/v1`, {
          method: 'POST',
          headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
          body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
        }),
        { clientAddress: '127.0.0.1' },
      ),
  }
}

/** The Redis entry of a token's validation (its key ends in the SHA-256 of the token). */
async function entryOf(redis: RedisTestContext, prefix: string, token: string) {
  const hash = createHash('sha256').update(token).digest('base64url')
  const keys = (await redis.keys()).filter((key) => key.startsWith(`${prefix}cache:`) && key.endsWith(`:${hash}`))
  expect(keys).toHaveLength(1)
  const [value, pttl] = await Promise.all([redis.client.get(keys[0]!), redis.client.pttl(keys[0]!)])
  return { key: keys[0]!, value: JSON.parse(value!) as CachedValidation, pttl }
}

async function expectNoTokenInRedis(redis: RedisTestContext, prefix: string, tokens: readonly string[]) {
  for (const key of (await redis.keys()).filter((k) => k.startsWith(prefix))) {
    const value = (await redis.client.get(key)) ?? ''
    for (const token of tokens) {
      expect(key).not.toContain(token)
      expect(value).not.toContain(token)
    }
  }
}

/** Events (errors with their messages and causes) hold none of `tokens`. */
function expectNoTokenIn(events: readonly OAuthValidatorEvent[], tokens: readonly string[]) {
  const text = JSON.stringify(events, (_key, value: unknown) =>
    value instanceof Error ? { name: value.name, message: value.message, cause: value.cause, stack: value.stack } : value,
  )
  for (const token of tokens) expect(text).not.toContain(token)
}

async function errorBody(response: Response) {
  return { status: response.status, body: (await response.json()) as { error: { code: number; message: string; data?: unknown } } }
}

let signingKey: CryptoKey
beforeAll(async () => {
  signingKey = (await generateKeyPair('ES256')).privateKey
})

function signJwt(issuer: string, claims: Record<string, unknown>, expiresAt: number): Promise<string> {
  return new SignJWT(claims)
    .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid: 'k1' })
    .setIssuer(issuer)
    .setIssuedAt(Math.floor(expiresAt / 1000) - 600)
    .setExpirationTime(Math.floor(expiresAt / 1000))
    .sign(signingKey)
}

describeRedis('OAuth validation shared by two instances through Redis', (redis) => {
  let clock: ManualClock
  let auth: DevAuthServer
  let upstream: FakeUpstream
  beforeAll(async () => {
    clock = createManualClock()
    auth = await startDevAuthServer({ accounts: ['user_alice', 'user_bob'], now: clock })
    upstream = await startFakeUpstream()
  })
  afterAll(async () => {
    await auth?.close()
    await upstream?.close()
  })
  beforeEach(() => {
    upstream.requests.length = 0
  })

  /** A token of the real provider for `user`, asked for as an MCP client would (no resource). */
  async function providerToken(user = 'user_alice'): Promise<string> {
    const issuer = auth.issuer
    const fetchFn = async (input: string | URL, init?: RequestInit) => {
      const url = new URL(input)
      if (url.host === 'weather.localhost' && url.pathname === '/.well-known/oauth-protected-resource') {
        return Response.json({ resource: APP_URL, authorization_servers: [issuer], bearer_methods_supported: ['header'] })
      }
      if (url.host === 'weather.localhost') return new Response(null, { status: 401 })
      return fetch(input, init)
    }
    return (await obtainAccessToken(`${APP_URL}/v1`, fetchFn, { loginHint: user })).accessToken
  }

  /** Two instances of `options` sharing the cache under a fresh prefix, each on its own client. */
  function twoInstances(options: OAuthValidatorOptions, cache: Partial<RedisCacheStoreOptions> = {}) {
    const prefix = redis.prefix()
    const a = startInstance('A', options, { client: redis.client, prefix, ...cache }, clock)
    const b = startInstance('B', options, { client: redis.connect(), prefix, ...cache }, clock)
    return { prefix, a, b }
  }

  it('userinfo (real provider): validated on A, a Redis hit on B; the entry lives 5 minutes by default, cacheTtlMs when given', async () => {
    const userinfoCalls = () => upstream.requests.filter((r) => r.path === '/me').length
    upstream.route('/me', proxyTo(auth.userinfoEndpoint))
    for (const [cacheTtlMs, ttl] of [[undefined, 300_000], [60_000, 60_000]] as const) {
      const before = userinfoCalls()
      const { prefix, a, b } = twoInstances({ issuer: auth.issuer, userinfoEndpoint: `${upstream.url}/me`, ...(cacheTtlMs && { cacheTtlMs }) })
      const token = await providerToken()
      expect((await a.post(token)).status).toBe(200)
      expect((await b.post(token)).status).toBe(200)
      expect(userinfoCalls() - before).toBe(1)
      expect(b.events.map((e) => e.type)).toEqual(['cache-hit'])
      const entry = await entryOf(redis, prefix, token)
      expect(entry.value).toMatchObject({ active: true, info: { subject: 'user_alice' } })
      expect(entry.pttl).toBeGreaterThan(ttl - 5_000)
      expect(entry.pttl).toBeLessThanOrEqual(ttl)
      // Past the lifetime, on B (whose local copy is long gone too), the token is asked about again.
      clock.advance(ttl)
      expect((await b.post(token)).status).toBe(200)
      expect(userinfoCalls() - before).toBe(2)
      await expectNoTokenInRedis(redis, prefix, [token])
      expect([...a.errors, ...b.errors]).toEqual([])
    }
  })

  it('a token the provider refuses is cached as a refusal (30 s), never as valid: B answers it 401 invalid_token from Redis', async () => {
    const { prefix, a, b } = twoInstances({ issuer: auth.issuer })
    const made = 'made-up-token-0123456789'
    for (const instance of [a, b]) {
      const response = await instance.post(made)
      expect(response.status).toBe(401)
      expect(response.headers.get('www-authenticate')).toContain('error="invalid_token"')
      expect(JSON.stringify(await response.json())).not.toContain(made)
    }
    expect(b.events.map((e) => e.type)).toEqual(['cache-hit'])
    expect(b.events[0]).toEqual({ type: 'cache-hit', active: false })
    const entry = await entryOf(redis, prefix, made)
    expect(entry.value).toMatchObject({ active: false })
    expect(entry.pttl).toBeLessThanOrEqual(30_000)
    await expectNoTokenInRedis(redis, prefix, [made])
  })

  it('userinfo with a JWT: the Redis entry, and the local copy on B, end at its exp, within the 5 minutes', async () => {
    upstream.route('/.well-known/openid-configuration', { status: 404 })
    upstream.route('/.well-known/oauth-authorization-server', { status: 404 })
    upstream.route('/userinfo', { status: 200, body: { sub: 'user_alice' } })
    const { prefix, a, b } = twoInstances({ issuer: upstream.url })
    const token = await signJwt(upstream.url, { sub: 'user_alice' }, clock() + 90_000)
    expect((await a.post(token)).status).toBe(200)
    expect((await b.post(token)).status).toBe(200)
    const entry = await entryOf(redis, prefix, token)
    expect(entry.pttl).toBeLessThanOrEqual(90_000)
    expect(entry.value.validUntil).toBeLessThanOrEqual(clock() + 90_000)
    clock.advance(90_000)
    expect((await b.post(token)).status).toBe(401)
    expect(upstream.count('/userinfo')).toBe(1)
  })

  it('introspection of a JWT whose answer names no exp: the cache still ends at the JWT’s exp (Redis entry and info), not 5 minutes on (regression)', async () => {
    upstream.route('/introspect', { status: 200, body: { active: true, sub: 'user_alice', aud: APP_URL } })
    const { prefix, a, b } = twoInstances({
      issuer: upstream.url,
      mode: 'introspection',
      introspection: { clientId: 'rs', clientSecret: 'secret', endpoint: `${upstream.url}/introspect` },
    })
    const expiresAt = Math.floor((clock() + 60_000) / 1000) * 1000
    const token = await signJwt(upstream.url, { sub: 'user_alice', aud: APP_URL }, expiresAt)
    expect((await a.post(token)).status).toBe(200)
    expect((await b.post(token)).status).toBe(200)
    expect(upstream.count('/introspect')).toBe(1)
    const entry = await entryOf(redis, prefix, token)
    expect(entry.pttl).toBeLessThanOrEqual(60_000)
    expect(entry.value).toMatchObject({ active: true, validUntil: expiresAt, info: { subject: 'user_alice', expiresAt } })
    clock.advance(60_000)
    expect((await b.post(token)).status).toBe(401)
  })

  it('breaker open on B: a token A cached in Redis keeps working on B; uncached ones get the 503 of DESIGN.md with Retry-After, with no upstream call', async () => {
    const proxy = await startFakeUpstream()
    try {
      proxy.route('/me', proxyTo(auth.userinfoEndpoint))
      const prefix = redis.prefix()
      const a = startInstance('A', { issuer: auth.issuer }, { client: redis.client, prefix }, clock)
      let calls = 0
      const b = startInstance(
        'B',
        {
          issuer: auth.issuer,
          userinfoEndpoint: `${proxy.url}/me`,
          fetch: (input, init) => (calls++, fetch(input, init)),
          sleep: createRecordingSleep(clock),
          breaker: { failureThreshold: 2, coolDownMs: 30_000 },
        },
        { client: redis.connect(), prefix },
        clock,
      )
      const [cachedByA, cachedByB, fresh, fresher] = [await providerToken(), await providerToken('user_bob'), await providerToken(), await providerToken()]
      expect((await a.post(cachedByA)).status).toBe(200)
      expect((await b.post(cachedByB)).status).toBe(200)
      await proxy.stop()
      // Retries spent (the breaker opens on the way): 503, the DESIGN.md body, Retry-After.
      const first = await b.post(fresh)
      expect(b.validator.breakerState).toBe('open')
      const retryAfter = Number(first.headers.get('retry-after'))
      expect(retryAfter).toBeGreaterThanOrEqual(1)
      expect(await errorBody(first)).toEqual({
        status: 503,
        body: { jsonrpc: '2.0', id: null, error: { code: -32005, message: 'Authorization server unavailable', data: { error: 'temporarily_unavailable', retryAfter } } },
      })
      // While open: fail fast, no call at all.
      const before = calls
      const second = await b.post(fresher)
      expect(second.status).toBe(503)
      expect(Number(second.headers.get('retry-after'))).toBe(30)
      expect(JSON.stringify(await second.json())).not.toContain(fresher)
      expect(calls).toBe(before)
      expect(b.events.at(-1)).toEqual({ type: 'fail-fast', retryAfter: 30 })
      // Cached tokens keep working: its own, and the one A cached in Redis (never seen by B).
      expect((await b.post(cachedByB)).status).toBe(200)
      expect((await b.post(cachedByA)).status).toBe(200)
      expect(b.events.at(-1)).toEqual({ type: 'cache-hit', active: true })
      expect(calls).toBe(before)
      // A refusal A cached is still a refusal on B, breaker or not.
      expect((await a.post('made-up-while-open')).status).toBe(401)
      expect((await b.post('made-up-while-open')).status).toBe(401)
      expect(calls).toBe(before)
      await expectNoTokenInRedis(redis, prefix, [cachedByA, cachedByB, fresh, fresher])
      expectNoTokenIn([...a.events, ...b.events], [cachedByA, cachedByB, fresh, fresher])
    } finally {
      await proxy.close()
    }
  })

  it('Redis gone mid-run: tokens are validated upstream and then kept locally (not one userinfo call per request), a made-up one is refused, the server down too is 503; never unvalidated, never 500', async () => {
    const server = await startPrivateRedis()
    const proxy = await startFakeUpstream()
    const clients: Redis[] = []
    try {
      proxy.route('/me', proxyTo(auth.userinfoEndpoint))
      const userinfoCalls = () => proxy.count('/me')
      const connect = () => {
        const client = new IOREDIS[redis.kind]({ path: server.path, maxRetriesPerRequest: 1, disconnectTimeout: 10 })
        client.on('error', () => {})
        clients.push(client)
        return client
      }
      const options = { issuer: auth.issuer, userinfoEndpoint: `${proxy.url}/me`, sleep: createRecordingSleep(clock) }
      const [ca, cb] = [connect(), connect()]
      await Promise.all([ca.ping(), cb.ping()])
      const a = startInstance('A', options, { client: ca }, clock)
      const b = startInstance('B', options, { client: cb }, clock)
      const [seen, later] = [await providerToken(), await providerToken('user_bob')]
      expect((await a.post(seen)).status).toBe(200)
      expect((await b.post(seen)).status).toBe(200)
      expect(userinfoCalls()).toBe(1)
      await server.stop()
      // B's local copy serves within localTtlMs, with no call.
      expect((await b.post(seen)).status).toBe(200)
      expect(userinfoCalls()).toBe(1)
      clock.advance(6_000)
      // Past it: validated upstream, and kept locally, so the next requests cost no call.
      for (let i = 0; i < 5; i++) expect((await b.post(seen)).status).toBe(200)
      for (let i = 0; i < 5; i++) expect((await b.post(later)).status).toBe(200)
      expect(userinfoCalls()).toBe(3)
      expect(b.events.filter((e) => e.type === 'store-error').length).toBeGreaterThan(0)
      // A made-up token is asked about, and refused.
      expect((await b.post('made-up-redis-down')).status).toBe(401)
      // The authorization server gone too: an uncached token is 503, never taken.
      await proxy.stop()
      clock.advance(6_000)
      const response = await b.post(seen)
      expect(response.status).toBe(503)
      expect(response.headers.get('retry-after')).not.toBeNull()
      expect([...a.errors, ...b.errors]).toEqual([])
      expectNoTokenIn([...a.events, ...b.events], [seen, later, 'made-up-redis-down'])
    } finally {
      for (const client of clients) client.disconnect()
      await proxy.close()
      await server.stop()
    }
  })

  it('forget while Redis is down still drops this instance’s local copy: the revoked token is asked about again, not served for localTtlMs (regression)', async () => {
    const server = await startPrivateRedis()
    const proxy = await startFakeUpstream()
    const client = new IOREDIS[redis.kind]({ path: server.path, maxRetriesPerRequest: 1, disconnectTimeout: 10 })
    client.on('error', () => {})
    try {
      let revoked = false
      const real = proxyTo(auth.userinfoEndpoint)
      proxy.route('/me', (request) => (revoked ? { status: 401, body: { error: 'invalid_token' } } : real(request)))
      await client.ping()
      const b = startInstance('B', { issuer: auth.issuer, userinfoEndpoint: `${proxy.url}/me` }, { client }, clock)
      const token = await providerToken()
      expect((await b.post(token)).status).toBe(200)
      await server.stop()
      // The platform learns of the revocation; Redis cannot take the mark (forget rejects, so
      // the platform knows), but this instance must not go on serving its own copy.
      revoked = true
      await expect(b.validator.forget(token)).rejects.toThrow()
      expect((await b.post(token)).status).toBe(401)
      expect(proxy.count('/me')).toBe(2)
    } finally {
      client.disconnect()
      await proxy.close()
      await server.stop()
    }
  })

  for (const [title, skewMs] of [
    ['on one clock', 0],
    ['on an instance whose clock is 30 s ahead of the forgetting one', 30_000],
  ] as const) {
    it(`forget on one instance, a validation in flight on the other ${title}: its answer from before the revocation is not left in the shared cache (regression: served for 5 minutes past 15 s of skew)`, async () => {
      let revoked = false
      let releaseFirst!: () => void
      const firstHeld = new Promise<void>((resolve) => (releaseFirst = resolve))
      let calls = 0
      // The provider's userinfo: the call made before the revocation is answered late, with the
      // user; every call after it is refused.
      const fetch = async (): Promise<Response> => {
        calls++
        if (calls === 1) await firstHeld
        else if (revoked) return new Response('', { status: 401 })
        return Response.json({ sub: 'user_alice' })
      }
      const prefix = redis.prefix()
      const validator = (now: () => number) =>
        createOAuthValidator({
          issuer: 'https://auth.example.com',
          userinfoEndpoint: 'https://auth.example.com/userinfo',
          fetch,
          now,
          cache: createRedisCacheStore<CachedValidation>({ client: redis.client, prefix, localTtlMs: 0 }),
        })
      const forgetting = validator(() => clock())
      const validating = validator(() => clock() + skewMs)
      const token = `opaque-${createHash('sha256').update(String(skewMs)).digest('hex').slice(0, 16)}`
      const inFlight = validating.validate(token)
      await expect.poll(() => calls).toBe(1)
      revoked = true
      await forgetting.forget(token)
      releaseFirst()
      // The validation in flight answers its caller with what it got (docs/oauth.md)...
      expect(await inFlight).toMatchObject({ active: true })
      // ...and caches nothing: the next one is asked upstream, and refused.
      expect(await forgetting.validate(token)).toMatchObject({ active: false })
      expect(calls).toBe(2)
    })
  }

  it('introspection answers: active false is 401 invalid_token (and shared as a refusal); wrong types are refused or 503, never taken', async () => {
    const cases: Array<[string, Record<string, unknown>, number]> = [
      ['inactive', { active: false }, 401],
      ['active as a string', { active: 'true', sub: 'user_alice', aud: APP_URL }, 503],
      ['sub a number', { active: true, sub: 42, aud: APP_URL }, 401],
      ['exp a string', { active: true, sub: 'user_alice', aud: APP_URL, exp: '9999999999' }, 401],
      ['aud a number', { active: true, sub: 'user_alice', aud: 7 }, 401],
      ['iss another', { active: true, sub: 'user_alice', aud: APP_URL, iss: 'https://other.example' }, 401],
      ['token_type refresh', { active: true, sub: 'user_alice', aud: APP_URL, token_type: 'refresh_token' }, 401],
    ]
    for (const [name, body, status] of cases) {
      const path = `/introspect-${cases.findIndex((c) => c[0] === name)}`
      upstream.route(path, { status: 200, body })
      const { prefix, a, b } = twoInstances({
        issuer: upstream.url,
        mode: 'introspection',
        introspection: { clientId: 'rs', clientSecret: 'secret', endpoint: `${upstream.url}${path}` },
        retry: { attempts: 1 },
      })
      const token = `opaque-${name.replace(/ /g, '-')}`
      for (const instance of [a, b]) {
        const response = await instance.post(token)
        expect({ name, status: response.status }).toEqual({ name, status })
        if (status === 401) expect(response.headers.get('www-authenticate')).toContain('error="invalid_token"')
        expect(JSON.stringify(await response.json())).not.toContain(token)
      }
      // A refusal is shared (B asks nothing); a 503 is never cached, so B asks again.
      expect({ name, calls: upstream.count(path) }).toEqual({ name, calls: status === 401 ? 1 : 2 })
      const keys = (await redis.keys()).filter((key) => key.startsWith(prefix))
      if (status === 503) expect(keys).toEqual([])
      for (const key of keys) {
        const entry = JSON.parse((await redis.client.get(key))!) as CachedValidation
        // An audience that is no string is none: the answer is kept, with no audience that any
        // App's check could match (the audience is compared per request, for each App).
        if (name === 'aud a number') {
          expect(entry).toMatchObject({ active: true })
          expect(entry).not.toHaveProperty('audience')
        } else expect(entry).toMatchObject({ active: false })
      }
      await expectNoTokenInRedis(redis, prefix, [token])
    }
  })

  it('userinfo answers the validator cannot use (no sub, not JSON, too large, a redirect) are 503 on both instances and never cached; a sub other than the JWT’s is the identity userinfo names', async () => {
    upstream.route('/elsewhere', { status: 200, body: { sub: 'user_alice' } })
    const cases: Array<[string, Parameters<FakeUpstream['route']>[1]]> = [
      ['no sub', { status: 200, body: { name: 'Alice' } }],
      ['not JSON', { status: 200, body: '<html>sign in</html>', headers: { 'content-type': 'text/html' } }],
      ['too large', { status: 200, body: { sub: 'user_alice', pad: 'x'.repeat(300 * 1024) } }],
      ['a redirect', { status: 302, headers: { location: `${upstream.url}/elsewhere` } }],
    ]
    for (const [name, answer] of cases) {
      const path = `/userinfo-${cases.findIndex((c) => c[0] === name)}`
      upstream.route(path, answer)
      const { prefix, a, b } = twoInstances({ issuer: upstream.url, userinfoEndpoint: `${upstream.url}${path}` })
      const token = `opaque-${name.replace(/ /g, '-')}`
      for (const instance of [a, b]) {
        const response = await instance.post(token)
        expect({ name, status: response.status }).toEqual({ name, status: 503 })
        expect((await response.json()) as unknown).toMatchObject({ error: { code: -32005, data: { error: 'temporarily_unavailable' } } })
        expect(instance.validator.breakerState).toBe('closed')
      }
      expect({ name, calls: upstream.count(path) }).toEqual({ name, calls: 2 })
      expect((await redis.keys()).filter((key) => key.startsWith(prefix))).toEqual([])
    }
    expect(upstream.count('/elsewhere')).toBe(0)
    // The JWT's own sub is unverified in this mode; userinfo, which checked the token, names the user.
    upstream.route('/userinfo-bob', { status: 200, body: { sub: 'user_bob' } })
    const { prefix, b } = twoInstances({ issuer: upstream.url, userinfoEndpoint: `${upstream.url}/userinfo-bob` })
    const token = await signJwt(upstream.url, { sub: 'user_alice' }, clock() + 120_000)
    expect((await b.post(token)).status).toBe(200)
    expect((await entryOf(redis, prefix, token)).value).toMatchObject({ active: true, info: { subject: 'user_bob' } })
  })
})

describe('forget on an instance whose own write of the token is held up by Redis', () => {
  for (const entryWrite of ['fails', 'is taken'] as const) {
    it(`the entry's write ${entryWrite}: the answer of a validation in flight is not served from the local copy once forget is called, while forget waits on its mark (regression: served active until the mark write settled)`, async () => {
      // A Redis whose first two writes (the validation's entry, then forget's mark) are answered
      // only when the test says; reads find nothing, deletes are taken.
      const writes: Array<{ resolve: (value: unknown) => void; reject: (error: Error) => void }> = []
      let written = () => {}
      const client = {
        status: 'ready',
        call: (command: string) => {
          if (command === 'SET' && writes.length < 2) {
            return new Promise((resolve, reject) => {
              writes.push({ resolve, reject })
              written()
            })
          }
          return Promise.resolve(command === 'SET' || command === 'DEL' ? 'OK' : null)
        },
      }
      const wrote = (count: number) =>
        new Promise<void>((resolve) => {
          written = () => writes.length >= count && resolve()
          written()
        })
      let revoked = false
      let calls = 0
      const validator = createOAuthValidator({
        issuer: 'https://as.example.com',
        userinfoEndpoint: 'https://as.example.com/userinfo',
        cache: createRedisCacheStore<CachedValidation>({ client, timeoutMs: 10_000 }),
        fetch: async () => {
          calls++
          return revoked ? Response.json({ error: 'invalid_token' }, { status: 401 }) : Response.json({ sub: 'user_alice' })
        },
      })
      const token = 'opaque-token-revoked-0123456789'
      const first = validator.validate(token)
      await wrote(1)
      // The platform learns of the revocation while the validation's write is in flight.
      revoked = true
      const forgetting = validator.forget(token)
      await wrote(2)
      // The entry's write settles; the mark's is still pending.
      if (entryWrite === 'fails') writes[0]!.reject(new Error('Connection is closed.'))
      else writes[0]!.resolve('OK')
      // The validation in flight answers its caller, as it would have without the forget.
      expect(await first).toMatchObject({ active: true })
      // The next request asks the authorization server, which refuses the token.
      expect(await validator.validate(token)).toEqual({ active: false, reason: 'rejected by the authorization server' })
      expect(calls).toBe(2)
      writes[1]!.reject(new Error('Connection is closed.'))
      await expect(forgetting).rejects.toThrow('Connection is closed.')
    })
  }
})
