/**
 * createOAuthValidator against a programmable authorization server on 127.0.0.1: discovery,
 * the three modes, JWT claim checks, cache bounds, single flight, retries, and secrecy of
 * the token. Time is a manual clock; nothing sleeps.
 */
import { inspect } from 'node:util'
import { createHash } from 'node:crypto'
import { type JWK, SignJWT, exportJWK, generateKeyPair } from 'jose'
import {
  AuthorizationServerUnavailableError,
  type CacheStore,
  type CachedValidation,
  ConfigurationError,
  type OAuthValidatorEvent,
  TooManyValidationsError,
  type OAuthValidatorOptions,
  createMemoryCacheStore,
  createOAuthValidator,
} from 'mcp-dispatch'
import { afterEach, beforeEach, describe, expect, it, onTestFinished, vi } from 'vitest'
import { type ManualClock, createManualClock, createManualTimers, createRecordingSleep } from './helpers/clock.js'
import { type FakeUpstream, startFakeUpstream } from './helpers/fake-upstream.js'
import { activeResources, leakedHandles } from '../robustness/support.js'

let fake: FakeUpstream
let clock: ManualClock
let events: OAuthValidatorEvent[]

beforeEach(async () => {
  fake = await startFakeUpstream()
  clock = createManualClock(Date.UTC(2030, 0, 1))
  events = []
  fake.route('/.well-known/openid-configuration', {
    status: 200,
    body: {
      issuer: fake.url,
      userinfo_endpoint: `${fake.url}/oidc/me`,
      jwks_uri: `${fake.url}/jwks`,
      introspection_endpoint: `${fake.url}/introspect`,
    },
  })
  fake.route('/oidc/me', (req) =>
    req.headers.authorization === 'Bearer good-token' || req.headers.authorization?.startsWith('Bearer ey')
      ? { status: 200, body: { sub: 'user_alice', name: 'Alice' } }
      : { status: 401, body: { error: 'invalid_token' } },
  )
})

afterEach(async () => {
  await fake.close()
})

function validator(options: Partial<OAuthValidatorOptions> = {}) {
  return createOAuthValidator({
    issuer: fake.url,
    now: clock,
    sleep: createRecordingSleep(),
    random: () => 0.5,
    onEvent: (e) => events.push(e),
    ...options,
  })
}

/** Awaits a promise that must reject with `type`, and returns the error. */
async function thrown<E>(promise: Promise<unknown>, type: new (...args: never[]) => E): Promise<E> {
  const error = await promise.then(
    () => undefined,
    (e: unknown) => e,
  )
  expect(error).toBeInstanceOf(type)
  return error as E
}

const unavailable = (promise: Promise<unknown>) => thrown(promise, AuthorizationServerUnavailableError)

describe('options', () => {
  it.each([
    [{ issuer: 'not a url' }, 'issuer'],
    [{ issuer: 'https://auth.example.com/?tenant=1' }, 'issuer'],
    // fetch refuses a URL with credentials, and Node's error quotes it, password and all.
    [{ issuer: 'https://rs:secret@auth.example.com' }, 'issuer'],
    [{ issuer: 'https://auth.example.com', userinfoEndpoint: 'https://rs:secret@auth.example.com/me' }, 'userinfoEndpoint'],
    [{ issuer: 'https://auth.example.com', mode: 'jwt' as const, jwks: 'https://rs@auth.example.com/jwks' }, 'jwks'],
    [{ issuer: 'https://auth.example.com', mode: 'magic' as never }, 'mode'],
    [{ issuer: 'https://auth.example.com', mode: 'introspection' as const }, 'introspection'],
    // Credentials with the default mode (userinfo), or jwt: ignored, tokens checked another way.
    [{ issuer: 'https://auth.example.com', introspection: { clientId: 'rs', clientSecret: 's' } }, 'introspection'],
    [{ issuer: 'https://auth.example.com', mode: 'jwt' as const, introspection: 'x' as never }, 'introspection'],
    [{ issuer: 'https://auth.example.com', audience: [] as string[] }, 'audience'],
    [{ issuer: 'https://auth.example.com', timeoutMs: -1 }, 'timeoutMs'],
    // Past 2^31 - 1 ms a timer fires at once: every validation would time out.
    [{ issuer: 'https://auth.example.com', timeoutMs: 2 ** 31 }, 'timeoutMs'],
    [{ issuer: 'https://auth.example.com', retry: { deadlineMs: 2 ** 31 } }, 'retry.deadlineMs'],
    [{ issuer: 'https://auth.example.com', retry: { maxDelayMs: 2 ** 40 } }, 'retry.maxDelayMs'],
    [{ issuer: 'https://auth.example.com', maxPendingValidations: 0 }, 'maxPendingValidations'],
    [{ issuer: 'https://auth.example.com', maxPendingValidations: 1.5 }, 'maxPendingValidations'],
    [{ issuer: 'https://auth.example.com', maxPendingValidations: Number.POSITIVE_INFINITY }, 'maxPendingValidations'],
    [{ issuer: 'https://auth.example.com', retry: { attempts: 0 } }, 'retry.attempts'],
    [{ issuer: 'https://auth.example.com', breaker: { failureThreshold: 0 } }, 'breaker.failureThreshold'],
    [{ issuer: 'https://auth.example.com', jwks: 'file:///keys.json' }, 'jwks'],
    // No key at all: every token would be refused, its client signing in again and again.
    [{ issuer: 'https://auth.example.com', mode: 'jwt', jwks: { keys: [] } }, 'jwks'],
    [{ issuer: 'https://auth.example.com', algorithms: 'RS256' as never }, 'algorithms'],
    [{ issuer: 'https://auth.example.com', algorithms: [] }, 'algorithms'],
    [{ issuer: 'https://auth.example.com', timers: {} as never }, 'timers'],
    [{ issuer: 'https://auth.example.com', cache: {} as never }, 'cache'],
    // A number would be written into every key, and validators given 1 and '1' share entries.
    [{ issuer: 'https://auth.example.com', cacheKeyPrefix: 1 as never }, 'cacheKeyPrefix'],
    [{ issuer: 'https://auth.example.com', clientBudget: { limit: 0 } }, 'clientBudget.limit'],
    [{ issuer: 'https://auth.example.com', clientBudget: { windowType: 'week' as never } }, 'clientBudget.windowType'],
    [{ issuer: 'https://auth.example.com', clientBudget: true as never }, 'clientBudget'],
  ])('refuses %j at construction (%s)', (options, option) => {
    let error: unknown
    try {
      createOAuthValidator(options as OAuthValidatorOptions)
    } catch (e) {
      error = e
    }
    expect(error).toBeInstanceOf(ConfigurationError)
    expect(error).toBeInstanceOf(TypeError)
    expect((error as ConfigurationError).option).toBe(option)
  })
})

describe('userinfo mode (the default)', () => {
  it('finds userinfo through discovery and takes the identity from sub', async () => {
    const v = validator()
    expect(v.mode).toBe('userinfo')
    expect(await v.validate('good-token')).toEqual({ active: true, info: { subject: 'user_alice' } })
    expect(fake.count('/oidc/me')).toBe(1)
    expect(fake.requests.find((r) => r.path === '/oidc/me')?.headers.authorization).toBe('Bearer good-token')
  })

  it('uses the RFC 8414 document when there is no OpenID configuration', async () => {
    fake.route('/.well-known/openid-configuration', { status: 404 })
    fake.route('/.well-known/oauth-authorization-server', {
      status: 200,
      body: { issuer: fake.url, userinfo_endpoint: `${fake.url}/oidc/me` },
    })
    expect(await validator().validate('good-token')).toMatchObject({ active: true })
    expect(fake.count('/oidc/me')).toBe(1)
  })

  it('falls back to {issuer}/userinfo when the issuer publishes no discovery document', async () => {
    fake.route('/.well-known/openid-configuration', { status: 404 })
    fake.route('/userinfo', { status: 200, body: { sub: 'user_bob' } })
    expect(await validator().validate('good-token')).toEqual({ active: true, info: { subject: 'user_bob' } })
    expect(fake.count('/.well-known/oauth-authorization-server')).toBe(1)
  })

  it('"no discovery document" is believed for 5 minutes, then asked again (an issuer that came up late)', async () => {
    fake.route('/.well-known/openid-configuration', { status: 404 })
    fake.route('/.well-known/oauth-authorization-server', { status: 404 })
    fake.route('/userinfo', { status: 200, body: { sub: 'user_bob' } })
    const v = validator({ cacheTtlMs: 1 })
    expect(await v.validate('t1')).toMatchObject({ active: true, info: { subject: 'user_bob' } })
    fake.route('/.well-known/openid-configuration', { status: 200, body: { issuer: fake.url, userinfo_endpoint: `${fake.url}/oidc/me` } })
    fake.route('/oidc/me', { status: 200, body: { sub: 'user_alice' } })
    clock.advance(299_000)
    expect(await v.validate('t2')).toMatchObject({ info: { subject: 'user_bob' } })
    clock.advance(1_000)
    expect(await v.validate('t3')).toMatchObject({ active: true, info: { subject: 'user_alice' } })
    expect(fake.count('/.well-known/openid-configuration')).toBe(2)
  })

  it('a userinfo endpoint the server moved is followed without a restart: its 404 has the document fetched again (at most once per 5 minutes), and a day-old document is refreshed in the background (regression: 503 for good)', async () => {
    const v = validator({ cacheTtlMs: 1 })
    expect(await v.validate('good-token')).toMatchObject({ active: true, info: { subject: 'user_alice' } })
    // The server moves userinfo and says so in its document; the old address is gone.
    fake.route('/oidc/me', { status: 404 })
    fake.route('/.well-known/openid-configuration', { status: 200, body: { issuer: fake.url, userinfo_endpoint: `${fake.url}/userinfo` } })
    fake.route('/userinfo', { status: 200, body: { sub: 'user_bob' } })
    // Within 5 minutes of the last discovery the 404 is the setup's, as before.
    await unavailable(v.validate('t2'))
    expect(fake.count('/.well-known/openid-configuration')).toBe(1)
    clock.advance(300_000)
    await unavailable(v.validate('t3'))
    const oldAddressCalls = fake.count('/oidc/me')
    // The next tokens wait for the document (those that come while it is fetched too), and go
    // to the new address.
    let answerDiscovery!: () => void
    const held = new Promise<void>((resolve) => (answerDiscovery = resolve))
    fake.route('/.well-known/openid-configuration', () => held.then(() => ({ status: 200, body: { issuer: fake.url, userinfo_endpoint: `${fake.url}/userinfo` } })))
    const first = v.validate('t4')
    while (fake.count('/.well-known/openid-configuration') < 2) await new Promise((r) => setImmediate(r))
    const meanwhile = [v.validate('t4b'), v.validate('t4c')]
    answerDiscovery()
    for (const result of await Promise.all([first, ...meanwhile])) expect(result).toMatchObject({ active: true, info: { subject: 'user_bob' } })
    expect(fake.count('/oidc/me')).toBe(oldAddressCalls)
    expect(fake.count('/.well-known/openid-configuration')).toBe(2)
    expect(await v.validate('t5')).toMatchObject({ active: true })
    expect(fake.count('/.well-known/openid-configuration')).toBe(2)
    // A day later the document is fetched again while the one in hand serves; a failure keeps it.
    fake.route('/.well-known/openid-configuration', { status: 500 })
    clock.advance(24 * 3_600_000)
    expect(await v.validate('t6')).toMatchObject({ active: true, info: { subject: 'user_bob' } })
    while (fake.count('/.well-known/openid-configuration') < 3) await new Promise((r) => setImmediate(r))
    await new Promise((r) => setTimeout(r, 20))
    expect(await v.validate('t7')).toMatchObject({ active: true, info: { subject: 'user_bob' } })
  })

  it("a day-old document is not refreshed while the breaker is half-open: its one probe is the token's own call (regression: taken by the refresh, the token got 503)", async () => {
    const v = validator({ cacheTtlMs: 1, breaker: { failureThreshold: 1 }, retry: { attempts: 1 } })
    expect(await v.validate('good-token')).toMatchObject({ active: true })
    fake.route('/oidc/me', { status: 500 })
    await unavailable(v.validate('t1'))
    expect(v.breakerState).toBe('open')
    // The server is well again; the cool-down and the document's day are over.
    fake.route('/oidc/me', { status: 200, body: { sub: 'user_alice' } })
    clock.advance(24 * 3_600_000)
    expect(await v.validate('t2')).toMatchObject({ active: true, info: { subject: 'user_alice' } })
    expect(v.breakerState).toBe('closed')
    expect(fake.count('/.well-known/openid-configuration')).toBe(1)
  })

  it('refuses a discovery document that names another issuer, without calling userinfo', async () => {
    fake.route('/.well-known/openid-configuration', {
      status: 200,
      body: { issuer: 'https://evil.example', userinfo_endpoint: `${fake.url}/oidc/me` },
    })
    const error = await unavailable(validator().validate('good-token'))
    expect(error.status).toBe(503)
    expect(fake.count('/oidc/me')).toBe(0)
  })

  it('an https issuer: the endpoint a mode calls must be https in its discovery document; a plain http one it never calls is no matter', async () => {
    const issuer = 'https://as.example'
    const called: string[] = []
    const document = (fields: Record<string, string>) => ({ issuer, ...fields })
    const serving = (doc: Record<string, string>): typeof fetch =>
      (async (input: string | URL | Request) => {
        const url = String(input instanceof Request ? input.url : input)
        called.push(url)
        if (url === `${issuer}/.well-known/openid-configuration`) return Response.json(doc)
        if (url.endsWith('/userinfo')) return Response.json({ sub: 'user_alice' })
        if (url.endsWith('/introspect')) return Response.json({ active: true, sub: 'user_alice', iss: issuer })
        return new Response('not found', { status: 404 })
      }) as typeof fetch
    const plainUserinfo = document({ userinfo_endpoint: 'http://as.example/userinfo', introspection_endpoint: `${issuer}/introspect` })
    // userinfo mode would send the token in clear: refused, nothing sent there.
    const userinfo = createOAuthValidator({ issuer, fetch: serving(plainUserinfo), retry: { attempts: 1 } })
    expect((await unavailable(userinfo.validate('good-token'))).status).toBe(503)
    expect(called.filter((url) => url.startsWith('http:'))).toEqual([])
    const introspecting = (doc: Record<string, string>) =>
      createOAuthValidator({
        issuer,
        mode: 'introspection',
        introspection: { clientId: 'rs', clientSecret: 's3cret' },
        audience: false,
        fetch: serving(doc),
        retry: { attempts: 1 },
      })
    // introspection mode calls only the https introspection endpoint: served.
    expect(await introspecting(plainUserinfo).validate('good-token')).toMatchObject({ active: true, info: { subject: 'user_alice' } })
    // And the other way round: a plain http introspection endpoint with the client's secret.
    const plainIntrospection = document({ userinfo_endpoint: `${issuer}/userinfo`, introspection_endpoint: 'http://as.example/introspect' })
    called.length = 0
    expect((await unavailable(introspecting(plainIntrospection).validate('good-token'))).status).toBe(503)
    expect(called.filter((url) => url.startsWith('http:'))).toEqual([])
    expect(await createOAuthValidator({ issuer, fetch: serving(plainIntrospection) }).validate('good-token')).toMatchObject({ active: true })
  })

  it('caches an accepted token for 5 minutes, then asks again', async () => {
    const v = validator()
    await v.validate('good-token')
    clock.advance(299_999)
    await v.validate('good-token')
    expect(fake.count('/oidc/me')).toBe(1)
    clock.advance(1)
    await v.validate('good-token')
    expect(fake.count('/oidc/me')).toBe(2)
    expect(fake.count('/.well-known/openid-configuration')).toBe(1)
  })

  it('refuses on 401 and keeps the refusal for 30 s (configurable)', async () => {
    const v = validator()
    expect(await v.validate('bad-token')).toEqual({ active: false, reason: 'rejected by the authorization server' })
    clock.advance(29_999)
    expect(await v.validate('bad-token')).toMatchObject({ active: false })
    expect(fake.count('/oidc/me')).toBe(1)
    clock.advance(1)
    await v.validate('bad-token')
    expect(fake.count('/oidc/me')).toBe(2)

    const uncached = validator({ rejectionTtlMs: 0 })
    await uncached.validate('bad-token')
    await uncached.validate('bad-token')
    expect(fake.count('/oidc/me')).toBe(4)
  })

  it('answers 503 for any other status (an endpoint that is not there); a 4xx is neither retried nor counted against the server', async () => {
    fake.route('/oidc/me', { status: 404, body: { error: 'not_found' } })
    const v = validator({ breaker: { failureThreshold: 2 } })
    for (let i = 0; i < 5; i++) await unavailable(v.validate(`token-${i}`))
    expect(fake.count('/oidc/me')).toBe(5)
    expect(v.breakerState).toBe('closed')
  })

  it.each([
    [403, { 'www-authenticate': 'Bearer error="insufficient_scope", scope="openid"' }],
    [400, { 'www-authenticate': 'Bearer error="invalid_request"' }],
    // Another challenge first (two fields, as fetch joins them).
    [403, { 'www-authenticate': 'DPoP algs="ES256", Bearer realm="as", error="insufficient_scope"' }],
  ])('a %i about the token (RFC 6750 section 3.1: a token granted without openid) refuses it, remembered as a refusal, not a 503 for ever', async (status, headers) => {
    fake.route('/oidc/me', { status, headers, body: { error: 'insufficient_scope' } })
    const v = validator({ breaker: { failureThreshold: 2 } })
    for (let i = 0; i < 3; i++) expect(await v.validate('scopeless-token')).toEqual({ active: false, reason: `rejected by the authorization server (HTTP ${status})` })
    expect(fake.count('/oidc/me')).toBe(1)
    expect(v.breakerState).toBe('closed')
  })

  it.each([400, 403])('a %i without a Bearer error in its challenge (a gateway, a firewall) is not about the token: 503, not a refusal, not counted against the server', async (status) => {
    fake.route('/oidc/me', { status, headers: { 'content-type': 'text/html' }, body: '<h1>Forbidden</h1>' })
    const v = validator({ breaker: { failureThreshold: 2 } })
    for (let i = 0; i < 3; i++) await unavailable(v.validate('some-token'))
    // Asked every time: not remembered as a refusal.
    expect(fake.count('/oidc/me')).toBe(3)
    expect(v.breakerState).toBe('closed')
  })

  it.each([
    [403, 'Basic realm="corporate gateway"'],
    [400, 'Bearer realm="as"'],
    [403, 'Bearer error="server_error"'],
    [403, 'DPoP error="insufficient_scope"'],
  ])('a %i whose challenge (%s) holds no Bearer error about the token is not about the token either: 503, not remembered as a refusal', async (status, challenge) => {
    fake.route('/oidc/me', { status, headers: { 'www-authenticate': challenge }, body: { error: 'forbidden' } })
    const v = validator({ breaker: { failureThreshold: 2 } })
    for (let i = 0; i < 3; i++) await unavailable(v.validate('some-token'))
    expect(fake.count('/oidc/me')).toBe(3)
    expect(v.breakerState).toBe('closed')
  })

  it('answers 503 when a 2xx carries no sub, and does not count it: one user’s answer must not open the breaker for everyone', async () => {
    fake.route('/oidc/me', (req) =>
      req.headers.authorization === 'Bearer odd-token' ? { status: 200, body: { name: 'no subject' } } : { status: 200, body: { sub: 'user_alice' } },
    )
    const v = validator({ breaker: { failureThreshold: 2 } })
    for (let i = 0; i < 5; i++) await unavailable(v.validate('odd-token'))
    expect(v.breakerState).toBe('closed')
    expect(await v.validate('good-token')).toMatchObject({ active: true, info: { subject: 'user_alice' } })
  })

  it('reads a signed userinfo answer (application/jwt, OIDC Core section 5.3.2)', async () => {
    const { privateKey } = await generateKeyPair('RS256')
    const signed = await new SignJWT({ sub: 'user_bob', name: 'Bob' }).setProtectedHeader({ alg: 'RS256' }).setIssuer(fake.url).sign(privateKey)
    fake.route('/oidc/me', { status: 200, headers: { 'content-type': 'application/jwt' }, body: signed })
    expect(await validator().validate('good-token')).toEqual({ active: true, info: { subject: 'user_bob' } })
  })

  it('a 429 does not count against the server (limits are often per user), and its Retry-After is honoured: waited for within the deadline, else passed on', async () => {
    let calls = 0
    fake.route('/oidc/me', (req) =>
      req.headers.authorization === 'Bearer soon-token'
        ? ++calls === 1
          ? { status: 429, headers: { 'retry-after': '2' } }
          : { status: 200, body: { sub: 'user_alice' } }
        : { status: 429, headers: { 'retry-after': '120' } },
    )
    const sleep = createRecordingSleep()
    const v = validator({ sleep, breaker: { failureThreshold: 2 } })
    // Asked again once, two seconds later (not at the backoff's 75 ms).
    expect(await v.validate('soon-token')).toMatchObject({ active: true })
    expect(sleep.delays).toEqual([2000])
    // Two minutes is past the deadline: not retried; the client is told to wait that long.
    for (let i = 0; i < 3; i++) expect((await unavailable(v.validate(`later-token-${i}`))).retryAfter).toBe(120)
    expect(sleep.delays).toEqual([2000])
    expect(v.breakerState).toBe('closed')
  })

  it('429s neither count against the server nor for it: mixed with 5xx the breaker still opens; a probe that gets one opens it again', async () => {
    let n = 0
    fake.route('/oidc/me', () => (n++ % 2 === 0 ? { status: 500 } : { status: 429 }))
    const v = validator({ retry: { attempts: 1 }, breaker: { failureThreshold: 2, coolDownMs: 1_000 } })
    for (let i = 0; i < 4; i++) await unavailable(v.validate(`token-${i}`))
    expect(v.breakerState).toBe('open')
    clock.advance(1_000)
    fake.route('/oidc/me', { status: 429 })
    await unavailable(v.validate('probe-token'))
    expect(v.breakerState).toBe('open')
  })

  it('without an injected clock, a wall clock stepped back (NTP, a resumed VM) does not stretch the breaker’s cool-down, and breaker events still carry wall-clock times (regression: Retry-After 90 s after a 60 s step)', async () => {
    vi.useFakeTimers({ toFake: ['Date'], now: Date.UTC(2030, 0, 1) })
    try {
      fake.route('/oidc/me', { status: 500 })
      const v = validator({ now: undefined, retry: { attempts: 1 }, breaker: { failureThreshold: 1, coolDownMs: 30_000 } })
      const first = await unavailable(v.validate('token-0'))
      expect(first.retryAfter).toBe(30)
      expect(events).toContainEqual({ type: 'breaker', from: 'closed', to: 'open', at: Date.UTC(2030, 0, 1) })
      vi.setSystemTime(Date.UTC(2030, 0, 1) - 60_000)
      const second = await unavailable(v.validate('token-1'))
      expect(second.retryAfter).toBeLessThanOrEqual(30)
      expect(fake.count('/oidc/me')).toBe(1)
    } finally {
      vi.useRealTimers()
    }
  })

  it('a call under way when the breaker opens does not close it by its late 200: uncached tokens still fail fast until the cool-down and probe (regression)', async () => {
    let release!: () => void
    const held = new Promise<void>((resolve) => (release = resolve))
    fake.route('/oidc/me', async (req) => {
      if (req.headers.authorization !== 'Bearer slow-token') return { status: 500 }
      await held
      return { status: 200, body: { sub: 'user_alice' } }
    })
    const v = validator({ retry: { attempts: 1 }, breaker: { failureThreshold: 2, coolDownMs: 1_000 } })
    const slow = v.validate('slow-token')
    // The slow call's arrival upstream (a connection, a request): more than waitFor's default 1 s on a loaded machine.
    await vi.waitFor(() => expect(fake.count('/oidc/me')).toBe(1), { timeout: 5_000 })
    for (let i = 0; i < 2; i++) await unavailable(v.validate(`token-${i}`))
    expect(v.breakerState).toBe('open')
    release()
    expect(await slow).toMatchObject({ active: true, info: { subject: 'user_alice' } })
    expect(v.breakerState).toBe('open')
    await unavailable(v.validate('token-2'))
    expect(fake.count('/oidc/me')).toBe(3)
    // The cool-down over, a probe's answer closes it.
    clock.advance(1_000)
    fake.route('/oidc/me', { status: 200, body: { sub: 'user_bob' } })
    expect(await v.validate('token-3')).toMatchObject({ active: true })
    expect(v.breakerState).toBe('closed')
  })

  it('a half-open probe cut short with its request (Workers: its fetch and timers end, it never reports) does not keep the breaker refusing for good', async () => {
    // Timers that never fire: the probe's own timeout dies with its request, as on Workers.
    const v = validator({
      timers: createManualTimers(),
      timeoutMs: 1_000,
      retry: { attempts: 1, deadlineMs: 2_000 },
      breaker: { failureThreshold: 1, coolDownMs: 1_000 },
    })
    fake.route('/oidc/me', { status: 500 })
    await unavailable(v.validate('token-0'))
    expect(v.breakerState).toBe('open')
    clock.advance(1_000)
    const release = holdUserinfo({ status: 401, body: { error: 'invalid_token' } })
    const lost = v.validate('probe-token')
    while (fake.count('/oidc/me') < 2) await new Promise((r) => setImmediate(r))
    await unavailable(v.validate('token-1'))
    clock.advance(3_001)
    fake.route('/oidc/me', { status: 401, body: { error: 'invalid_token' } })
    expect(await v.validate('token-2')).toMatchObject({ active: false })
    expect(v.breakerState).toBe('closed')
    release()
    await lost
  })

  it('a Retry-After of 0 still waits the backoff; a 429 that names its wait gives the client’s budget unit back', async () => {
    fake.route('/oidc/me', { status: 429, headers: { 'retry-after': '0' } })
    const sleep = createRecordingSleep()
    await unavailable(validator({ sleep, retry: { attempts: 3, baseDelayMs: 100, maxDelayMs: 1_000 } }).validate('good-token'))
    expect(sleep.delays).toEqual([75, 150])
    fake.route('/oidc/me', { status: 429, headers: { 'retry-after': '120' } })
    const v = validator({ clientBudget: { limit: 2, windowType: 'minute' } })
    const context = { resource: 'https://weather.example.com', appId: 'app_1', clientAddress: '192.0.2.7' }
    for (let i = 0; i < 4; i++) expect((await unavailable(v.validate(`token-${i}`, context))).retryAfter).toBe(120)
  })

  it('a 5xx with a large error page counts against the server (its body is not read)', async () => {
    fake.route('/oidc/me', { status: 502, headers: { 'content-type': 'text/html' }, body: 'x'.repeat(300 * 1024) })
    const v = validator({ retry: { attempts: 1 }, breaker: { failureThreshold: 2 } })
    for (let i = 0; i < 2; i++) await unavailable(v.validate(`token-${i}`))
    expect(v.breakerState).toBe('open')
  })

  it('an answer past 256 KiB is not read whole: 503, not counted against the server', async () => {
    fake.route('/oidc/me', { status: 200, body: { sub: 'user_alice', picture: 'x'.repeat(300 * 1024) } })
    const v = validator({ breaker: { failureThreshold: 2 } })
    for (let i = 0; i < 3; i++) await unavailable(v.validate('good-token'))
    expect(v.breakerState).toBe('closed')
    const failure = events.find((e) => e.type === 'upstream' && e.outcome === 'failure')
    expect(failure).toMatchObject({ endpoint: 'userinfo', error: expect.stringContaining('over 262144') })
  })

  it('a string no Bearer header can carry (RFC 6750 b64token) is refused with no request, and nothing repeats it', async () => {
    const v = validator()
    for (const token of ['SECRET-VALUE\n-tail', 'SECRET VALUE', 'SECRET\u0100VALUE', 'SECRET"VALUE']) {
      expect(await v.validate(token)).toEqual({ active: false, reason: 'not an RFC 6750 bearer token' })
    }
    expect(fake.count('/oidc/me')).toBe(0)
    expect(JSON.stringify(events)).not.toContain('SECRET')
    expect(v.breakerState).toBe('closed')
  })

  it.each([500, 502, 503, 429])('retries HTTP %i with growing, jittered delays, then answers 503', async (status) => {
    fake.route('/oidc/me', { status })
    const sleep = createRecordingSleep()
    const v = validator({ sleep, retry: { attempts: 4, baseDelayMs: 100, maxDelayMs: 1_000 }, breaker: { failureThreshold: 10 } })
    const error = await unavailable(v.validate('good-token'))
    expect(fake.count('/oidc/me')).toBe(4)
    expect(sleep.delays).toEqual([75, 150, 300]) // equal jitter at random() = 0.5
    expect(error.retryAfter).toBe(1)
    expect(events.filter((e) => e.type === 'retry')).toHaveLength(3)
  })

  it('recovers within the retries when the server answers again', async () => {
    let calls = 0
    fake.route('/oidc/me', () => (++calls < 3 ? { status: 503 } : { status: 200, body: { sub: 'user_alice' } }))
    expect(await validator().validate('good-token')).toMatchObject({ active: true })
    expect(calls).toBe(3)
  })

  it('stops retrying when the deadline would pass', async () => {
    fake.route('/oidc/me', { status: 500 })
    const sleep = createRecordingSleep(clock) // sleeping moves the clock
    const v = validator({ sleep, retry: { attempts: 10, baseDelayMs: 100, deadlineMs: 150 } })
    await unavailable(v.validate('good-token'))
    expect(sleep.delays).toEqual([75])
    expect(fake.count('/oidc/me')).toBe(2)
  })

  it('a platform fetch that fails with the request in its message (the token, the client secret) is reported by its name and code only (regression: events and the 503 repeated them)', async () => {
    const secret = 'introspection-client-secret-1234'
    const token = 'oauth-access-token-abcdef-0123456789'
    const leaky: typeof fetch = async (url, init) => {
      throw new TypeError(`request to ${String(url)} failed: ${JSON.stringify(init)}`, { cause: Object.assign(new Error('refused'), { code: 'ECONNREFUSED' }) })
    }
    const modes: Partial<OAuthValidatorOptions>[] = [
      { mode: 'userinfo', userinfoEndpoint: `${fake.url}/oidc/me` },
      { mode: 'introspection', introspection: { clientId: 'rs', clientSecret: secret, endpoint: `${fake.url}/introspect` } },
    ]
    for (const mode of modes) {
      events = []
      const v = validator({ ...mode, fetch: leaky, retry: { attempts: 2, baseDelayMs: 1 } })
      const error = await unavailable(v.validate(token, { resource: 'https://weather.example.com', appId: 'app_w' }))
      const told = [JSON.stringify(events), String(error), String(error.cause), String((error.cause as Error | undefined)?.cause)].join('\n')
      const basic = Buffer.from(`rs:${secret}`).toString('base64')
      for (const hidden of [token, secret, basic]) expect(told, mode.mode).not.toContain(hidden)
      expect(events).toContainEqual(expect.objectContaining({ type: 'unavailable', error: `${mode.mode}: TypeError (ECONNREFUSED)` }))
    }
    // An error of another realm (a fetch made in a vm context) is named too; the runtime's own
    // fetch, which builds no message from the request, keeps its message.
    const { runInNewContext } = await import('node:vm')
    const foreign = runInNewContext('Object.assign(new TypeError("secret " + token), { code: "ECONNRESET" })', { token }) as unknown
    events = []
    const other = validator({ mode: 'userinfo', userinfoEndpoint: `${fake.url}/oidc/me`, fetch: async () => Promise.reject(foreign), retry: { attempts: 1 } })
    await unavailable(other.validate(token))
    expect(events).toContainEqual(expect.objectContaining({ type: 'unavailable', error: 'userinfo: TypeError (ECONNRESET)' }))
    // An error whose properties throw is still a failed call (503, counted), not a throw.
    const hostile = new Proxy({}, { get: () => { throw new Error('trap') } })
    const trapped = validator({ mode: 'userinfo', userinfoEndpoint: `${fake.url}/oidc/me`, fetch: async () => Promise.reject(hostile), retry: { attempts: 1 } })
    await unavailable(trapped.validate(token))
    // A message that quotes the request is left out whichever fetch made it (a replaced global one).
    const replaced = validator({ mode: 'userinfo', userinfoEndpoint: `${fake.url}/oidc/me`, fetch: async () => Promise.reject(new TypeError(`fetch failed for ${token}`)), retry: { attempts: 1 } })
    const quoted = await unavailable(replaced.validate(token))
    expect(`${String(quoted.cause)} ${JSON.stringify(events)}`).not.toContain(token)
    // The runtimes' own messages that quote nothing are kept, with their code.
    for (const said of ['terminated', 'This operation was aborted']) {
      events = []
      const kept = validator({ mode: 'userinfo', userinfoEndpoint: `${fake.url}/oidc/me`, fetch: async () => Promise.reject(Object.assign(new TypeError(said), { cause: { code: 'UND_ERR_SOCKET' } })), retry: { attempts: 1 } })
      await unavailable(kept.validate(token))
      expect(events).toContainEqual(expect.objectContaining({ type: 'unavailable', error: `userinfo: ${said} (UND_ERR_SOCKET)` }))
    }
    await fake.stop()
    events = []
    const own = validator({ mode: 'userinfo', userinfoEndpoint: `${fake.url}/oidc/me`, retry: { attempts: 1 } })
    await unavailable(own.validate(token))
    expect(events).toContainEqual(expect.objectContaining({ type: 'unavailable', error: 'userinfo: fetch failed (ECONNREFUSED)' }))
    // A runtime with no global fetch (Node 20 run with --no-experimental-fetch) is named as such,
    // not as a bare `TypeError`; one installed after creation is used.
    events = []
    const lacking = validator({ mode: 'userinfo', userinfoEndpoint: `${fake.url}/oidc/me`, retry: { attempts: 1 } })
    vi.stubGlobal('fetch', undefined)
    onTestFinished(() => void vi.unstubAllGlobals())
    await unavailable(lacking.validate(token))
    expect(events).toContainEqual(expect.objectContaining({ type: 'unavailable', error: 'userinfo: this runtime has no global fetch: give createOAuthValidator a fetch option' }))
  })

  it('treats a 407 (which Node\'s fetch fails on) as transient, and leaves no socket behind', async () => {
    const baseline = activeResources()
    fake.route('/oidc/me', { status: 407, headers: { 'proxy-authenticate': 'Basic realm="proxy"' }, body: 'x'.repeat(100_000) })
    const v = createOAuthValidator({ issuer: fake.url, userinfoEndpoint: `${fake.url}/oidc/me`, retry: { attempts: 2, baseDelayMs: 1 } })
    await unavailable(v.validate('good-token'))
    expect(fake.count('/oidc/me')).toBe(2)
    // The server hangs up: a socket the failed fetch kept paused would never read it, and stay.
    await fake.stop()
    expect(await leakedHandles(baseline)).toEqual({})
  })

  it('answers 503 to a 205 with a body (which Node\'s fetch gives no body) and leaves no socket behind', async () => {
    const baseline = activeResources()
    fake.route('/oidc/me', { status: 205, headers: { 'content-type': 'application/json' }, body: 'x'.repeat(100_000) })
    const v = createOAuthValidator({ issuer: fake.url, userinfoEndpoint: `${fake.url}/oidc/me`, retry: { attempts: 2, baseDelayMs: 1 } })
    await unavailable(v.validate('good-token'))
    await fake.stop()
    expect(await leakedHandles(baseline)).toEqual({})
  })

  it('takes a status past 599 for an unexpected answer, not a server error: not retried, and the breaker stays closed', async () => {
    fake.route('/oidc/me', { status: 600, body: { error: 'odd' } })
    const v = validator({ retry: { attempts: 3, baseDelayMs: 1 }, breaker: { failureThreshold: 2 } })
    for (let i = 0; i < 3; i++) {
      const error = await unavailable(v.validate('good-token'))
      expect((error.cause as Error).message).toBe('userinfo: HTTP 600')
    }
    expect(fake.count('/oidc/me')).toBe(3)
    expect(events.filter((e) => e.type === 'breaker')).toEqual([])
  })

  it('treats a timeout as transient (default timers) and leaves no timer behind', async () => {
    fake.route('/oidc/me', 'hang')
    const timers = () => process.getActiveResourcesInfo().filter((type) => type === 'Timeout').length
    const before = timers()
    // A deadline that outlasts the connection and the request's arrival (counted below) on a
    // loaded machine: 30 ms could pass before the request was even written.
    const v = createOAuthValidator({ issuer: fake.url, userinfoEndpoint: `${fake.url}/oidc/me`, timeoutMs: 250, retry: { attempts: 2, baseDelayMs: 1 } })
    const error = await unavailable(v.validate('good-token'))
    expect((error.cause as Error).message).toMatch(/timed out/)
    expect(fake.count('/oidc/me')).toBe(2)
    // Answered: its deadline and backoff timers are gone (a turn of the loop for clearTimeout
    // to land); a timer of an earlier test may have ended meanwhile, none may be added.
    await new Promise((resolve) => setImmediate(resolve))
    expect(timers()).toBeLessThanOrEqual(before)
  })
})

describe('JWT access tokens in userinfo mode: claims checked before any upstream call', () => {
  let key: CryptoKey
  beforeEach(async () => {
    key = (await generateKeyPair('ES256')).privateKey
  })
  const sign = (claims: Record<string, unknown>, expiresInS = 600) =>
    new SignJWT({ sub: 'user_alice', ...claims })
      .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt' })
      .setIssuedAt(Math.floor(clock() / 1000))
      .setExpirationTime(Math.floor(clock() / 1000) + expiresInS)
      .sign(key)

  it('refuses another issuer, an expired token and a wrong audience locally', async () => {
    const v = validator({ audience: 'https://weather.example.com' })
    expect(await v.validate(await sign({ iss: 'https://evil.example', aud: 'https://weather.example.com' }))).toEqual({
      active: false,
      reason: 'issuer mismatch',
    })
    expect(await v.validate(await sign({ iss: fake.url, aud: 'https://weather.example.com' }, -1))).toEqual({
      active: false,
      reason: 'token expired',
    })
    expect(await v.validate(await sign({ iss: fake.url, aud: 'https://notes.example.com' }))).toEqual({
      active: false,
      reason: 'audience mismatch',
    })
    expect(fake.requests).toHaveLength(0)
    expect(events.filter((e) => e.type === 'rejected-locally')).toHaveLength(3)
  })

  it('a JWT for another audience made to look like none (padded, standard base64) is refused locally, not sent unchecked to a userinfo that may take it; an opaque token with dots is not (regression)', async () => {
    // A userinfo endpoint that takes whatever it is sent.
    fake.route('/oidc/me', { status: 200, body: { sub: 'user_alice' } })
    const v = validator({ audience: 'https://weather.example.com' })
    const foreign = await sign({ iss: fake.url, aud: 'https://notes.example.com' })
    const [header, payload, signature] = foreign.split('.') as [string, string, string]
    const standard = (segment: string) => segment.replace(/-/g, '+').replace(/_/g, '/')
    for (const disguised of [`${foreign}=`, `${header}==.${payload}.${signature}`, `${standard(header)}.${standard(payload)}.${standard(signature)}=`]) {
      expect(await v.validate(disguised), disguised).toEqual({ active: false, reason: 'malformed JWT' })
    }
    expect(fake.requests).toHaveLength(0)
    // Dots and base64 characters, but no JOSE header: the provider's to judge.
    expect(await v.validate('ya29.a0AfB_byC.Zx9')).toMatchObject({ active: true })
    expect(await v.validate('bm90LWpzb24.cGF5bG9hZA.c2ln')).toMatchObject({ active: true })
    expect(fake.count('/oidc/me')).toBe(2)
  })

  it('validates a good one at userinfo and never serves it past its exp', async () => {
    const v = validator({ audience: 'https://weather.example.com/' })
    const token = await sign({ iss: fake.url, aud: 'https://weather.example.com' }, 60)
    expect(await v.validate(token)).toMatchObject({ active: true, info: { subject: 'user_alice' } })
    clock.advance(59_999)
    expect(await v.validate(token)).toMatchObject({ active: true })
    clock.advance(1)
    expect(await v.validate(token)).toEqual({ active: false, reason: 'token expired' })
    expect(fake.count('/oidc/me')).toBe(1)
  })
})

describe('jwt mode (local verification)', () => {
  // The App a token is presented to: its audience by default (a token must name it).
  const weather = { resource: 'http://weather.localhost', appId: 'app_weather' }
  let privateKey: CryptoKey
  let publicJwk: JWK
  beforeEach(async () => {
    const pair = await generateKeyPair('ES256')
    privateKey = pair.privateKey
    publicJwk = { ...(await exportJWK(pair.publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' }
  })
  const sign = (
    claims: Record<string, unknown>,
    options: { key?: CryptoKey; kid?: string; alg?: string; issuedAgoS?: number; expiresInS?: number } = {},
  ) =>
    new SignJWT({ sub: 'user_alice', iss: fake.url, aud: 'http://weather.localhost', client_id: 'client-1', scope: 'openid mcp', ...claims })
      .setProtectedHeader({ alg: options.alg ?? 'ES256', typ: 'at+jwt', kid: options.kid ?? 'k1' })
      .setIssuedAt(Math.floor(clock() / 1000) - (options.issuedAgoS ?? 0))
      .setExpirationTime(Math.floor(clock() / 1000) + (options.expiresInS ?? 600))
      .sign(options.key ?? privateKey)

  it('RFC 9068: a JWT typed as another kind, or without exp, is no access token; at+jwt, untyped and JWT are taken', async () => {
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    const context = { resource: 'http://weather.localhost', appId: 'app_weather' }
    const typed = (typ: unknown, exp = true) => {
      const jwt = new SignJWT({ sub: 'user_alice', iss: fake.url, aud: 'http://weather.localhost' })
        .setProtectedHeader({ alg: 'ES256', kid: 'k1', ...(typ !== undefined && { typ: typ as string }) })
        .setIssuedAt(Math.floor(clock() / 1000))
      return (exp ? jwt.setExpirationTime(Math.floor(clock() / 1000) + 600) : jwt).sign(privateKey)
    }
    for (const typ of ['at+jwt', 'application/at+jwt', 'AT+JWT', 'JWT', undefined]) {
      expect(await v.validate(await typed(typ), context), String(typ)).toMatchObject({ active: true })
    }
    for (const typ of ['id_token+jwt', 'logout+jwt', 'secevent+jwt', 'application/jwt-something']) {
      expect(await v.validate(await typed(typ), context), typ).toEqual({ active: false, reason: 'not an access token (typ)' })
    }
    // A typ that is no string types nothing the profile knows (regression: it skipped the check).
    for (const typ of [['id_token+jwt'], ['at+jwt'], 1, null, {}]) {
      expect(await v.validate(await typed(typ), context), JSON.stringify(typ)).toEqual({ active: false, reason: 'not an access token (typ)' })
    }
    expect(await v.validate(await typed('at+jwt', false), context)).toEqual({ active: false, reason: 'claim check failed: exp' })
  })

  it('takes a token for a path inside the App: a version path, or the endpoint under a basePath when the App is its origin; never a sibling path or another host', async () => {
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    for (const aud of ['http://weather.localhost/v1', 'http://weather.localhost/v1.2.3/', 'http://weather.localhost/mcp', 'http://weather.localhost/mcp/v1']) {
      expect(await v.validate(await sign({ aud }), weather), aud).toMatchObject({ active: true })
    }
    for (const aud of ['http://weather.localhost.evil', 'http://notes.localhost/v1', 'https://weather.localhost']) {
      expect(await v.validate(await sign({ aud }), weather), aud).toEqual({ active: false, reason: 'audience mismatch' })
    }
    const atPath = { resource: 'http://p.localhost/weather', appId: 'app_weather' }
    expect(await v.validate(await sign({ aud: 'http://p.localhost/weather-2' }), atPath)).toEqual({ active: false, reason: 'audience mismatch' })
  })

  it('reads the scopes from scope, else from scp as Okta (an array) and Entra ID (space-separated) name them (from the OAuth audit: scp was ignored)', async () => {
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    const scopes = async (claims: Record<string, unknown>) => {
      const result = await v.validate(await sign({ scope: undefined, ...claims }), weather)
      return result.active ? result.info.scopes : result
    }
    expect(await scopes({ scope: 'openid mcp:tools' })).toEqual(['openid', 'mcp:tools'])
    expect(await scopes({ scp: ['openid', 'mcp:tools'] })).toEqual(['openid', 'mcp:tools'])
    expect(await scopes({ scp: 'openid  mcp:tools' })).toEqual(['openid', 'mcp:tools'])
    expect(await scopes({ scope: 'openid', scp: ['mcp:tools'] })).toEqual(['openid'])
    // An entry holding a space is a list of its own, never one scope.
    expect(await scopes({ scp: ['openid mcp:tools', 'email'] })).toEqual(['openid', 'mcp:tools', 'email'])
    // Neither readable: none known, not an empty grant.
    expect(await scopes({ scp: ['openid', 1] })).toBeUndefined()
    expect(await scopes({})).toBeUndefined()
  })

  it('verifies with a local key set and makes no upstream call at all', async () => {
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] }, audience: ({ resource }) => resource })
    const token = await sign({})
    const context = { resource: 'http://weather.localhost', appId: 'app_weather' }
    expect(await v.validate(token, context)).toEqual({
      active: true,
      info: { subject: 'user_alice', clientId: 'client-1', scopes: ['openid', 'mcp'], expiresAt: (Math.floor(clock() / 1000) + 600) * 1000 },
    })
    // The same token presented to another App is refused: its audience is the first App.
    expect(await v.validate(token, { resource: 'http://notes.localhost', appId: 'app_notes' })).toEqual({
      active: false,
      reason: 'audience mismatch',
    })
    expect(fake.requests).toHaveLength(0)
  })

  it('keeps no refusal by default (made-up bearer strings cannot fill a shared cache: regression, one key each for 30 s); a rejectionTtlMs given is kept to', async () => {
    const context = { resource: 'http://weather.localhost', appId: 'app_weather' }
    const written: string[] = []
    const counted = () => {
      const inner = createMemoryCacheStore<CachedValidation>({ now: clock })
      return { ...inner, set: (key: string, value: CachedValidation, ttlMs: number) => (written.push(key), inner.set(key, value, ttlMs)) }
    }
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] }, cache: counted() })
    for (let i = 0; i < 50; i++) expect(await v.validate(`made-up-${i}`, context)).toEqual({ active: false, reason: 'not a JWT access token' })
    expect(await v.validate(await sign({}, { issuedAgoS: 7_200, expiresInS: -3_600 }), context)).toMatchObject({ active: false })
    expect(written).toEqual([])
    // A token the issuer signed is cached as before (its audience compared on every read).
    expect(await v.validate(await sign({}), context)).toMatchObject({ active: true })
    expect(await v.validate(await sign({ aud: 'http://notes.localhost' }), context)).toEqual({ active: false, reason: 'audience mismatch' })
    expect(written).toHaveLength(2)
    written.length = 0
    const keeping = validator({ mode: 'jwt', jwks: { keys: [publicJwk] }, cache: counted(), rejectionTtlMs: 30_000 })
    await keeping.validate('made-up', context)
    expect(written).toHaveLength(1)
  })

  it('binds tokens to the App they are presented to by default (MCP authorization, RFC 8707); audience false opts out', async () => {
    const weather = { resource: 'http://weather.localhost', appId: 'app_weather' }
    const notes = { resource: 'http://notes.localhost', appId: 'app_notes' }
    const token = await sign({})
    // An ID token's audience is the client that asked for it, not the App.
    const idToken = await sign({ aud: 'client-1' })
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    expect(await v.validate(token, weather)).toMatchObject({ active: true })
    expect(await v.validate(token, notes)).toEqual({ active: false, reason: 'audience mismatch' })
    expect(await v.validate(idToken, weather)).toEqual({ active: false, reason: 'audience mismatch' })
    const any = validator({ mode: 'jwt', jwks: { keys: [publicJwk] }, audience: false })
    expect(await any.validate(token, notes)).toMatchObject({ active: true })
    expect(await any.validate(idToken, weather)).toMatchObject({ active: true })
  })

  it('refuses a foreign signature, another issuer, an expired token and an opaque token', async () => {
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    const other = (await generateKeyPair('ES256')).privateKey
    expect(await v.validate(await sign({}, { key: other }), weather)).toMatchObject({ active: false, reason: 'invalid signature or token' })
    expect(await v.validate(await sign({ iss: 'https://evil.example' }), weather)).toMatchObject({ active: false, reason: 'claim check failed: iss' })
    expect(await v.validate(await sign({}, { expiresInS: -1 }), weather)).toMatchObject({ active: false, reason: 'token expired' })
    expect(await v.validate('opaque-token', weather)).toMatchObject({ active: false, reason: 'not a JWT access token' })
    // Each told as a local refusal with its reason, once (regression: only cache-miss).
    expect(events.filter((e) => e.type === 'rejected-locally').map((e) => (e as { reason: string }).reason)).toEqual([
      'invalid signature or token',
      'claim check failed: iss',
      'token expired',
      'not a JWT access token',
    ])
    // Another App's token: an audience mismatch.
    events = []
    const forNotes = await sign({ aud: 'https://notes.example.com' })
    expect(await v.validate(forNotes, weather)).toMatchObject({ active: false, reason: 'audience mismatch' })
    expect(events.filter((e) => e.type === 'rejected-locally')).toEqual([{ type: 'rejected-locally', reason: 'audience mismatch', expected: [weather.resource] }])
  })

  it('a refusal with no keys in hand (the JWKS endpoint failing) is told once; so is one validation that many requests share (joined)', async () => {
    fake.route('/jwks', { status: 500 })
    const v = validator({ mode: 'jwt' })
    events = []
    expect(await v.validate(await sign({ aud: 'https://notes.example.com' }), weather)).toMatchObject({ active: false, reason: 'audience mismatch' })
    expect(events.filter((e) => e.type === 'rejected-locally')).toEqual([{ type: 'rejected-locally', reason: 'audience mismatch', expected: [weather.resource] }])
    const local = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    events = []
    const forged = await sign({}, { key: (await generateKeyPair('ES256')).privateKey })
    const answers = await Promise.all(Array.from({ length: 5 }, () => local.validate(forged, weather)))
    for (const answer of answers) expect(answer).toEqual({ active: false, reason: 'invalid signature or token' })
    expect(events.filter((e) => e.type === 'rejected-locally')).toHaveLength(1)
    expect(events.filter((e) => e.type === 'joined')).toHaveLength(4)
  })

  it('refuses an expired token from its claims, before any signature check: a client resending it costs a decode (regression)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt', clockToleranceMs: 30_000 })
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    events = []
    const other = (await generateKeyPair('ES256')).privateKey
    // Signed by no key of the issuer's, naming its key: a signature check would say so; the
    // claims speak first.
    const forged = await sign({}, { key: other, expiresInS: -31 })
    const expired = await sign({}, { expiresInS: -30 })
    for (let i = 0; i < 3; i++) {
      expect(await v.validate(forged, weather)).toEqual({ active: false, reason: 'token expired' })
      expect(await v.validate(expired, weather)).toEqual({ active: false, reason: 'token expired' })
    }
    expect(events.filter((e) => e.type === 'rejected-locally')).toEqual(Array(6).fill({ type: 'rejected-locally', reason: 'token expired' }))
    // Within the clock tolerance a token is verified and taken, as jose takes it; a forged one is not.
    expect(await v.validate(await sign({}, { expiresInS: -29 }), weather)).toMatchObject({ active: true })
    expect(await v.validate(await sign({}, { key: other, expiresInS: -29 }), weather)).toMatchObject({ active: false, reason: 'invalid signature or token' })
    expect(fake.count('/jwks')).toBe(1)
  })

  it('never serves a cached token past its exp', async () => {
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    const token = await sign({}, { expiresInS: 60 })
    expect(await v.validate(token, weather)).toMatchObject({ active: true })
    clock.advance(60_000)
    expect(await v.validate(token, weather)).toMatchObject({ active: false, reason: 'token expired' })
  })

  it('fetches the JWKS named by discovery once, and again for a new kid at most once per interval', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt' })
    for (let i = 0; i < 10; i++) expect(await v.validate(await sign({ jti: `t${i}` }), weather)).toMatchObject({ active: true })
    expect(fake.count('/jwks')).toBe(1)
    expect(fake.count('/.well-known/openid-configuration')).toBe(1)

    // Rotation: a token signed with a key the cached set does not hold.
    const next = await generateKeyPair('ES256')
    const nextJwk = { ...(await exportJWK(next.publicKey)), kid: 'k2', alg: 'ES256', use: 'sig' }
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk, nextJwk] } })
    const rotated = await sign({}, { key: next.privateKey, kid: 'k2' })
    // Issued since the last fetch, within the refetch interval: not refused (a rotation the set
    // may not show yet) but 503, retry when a refetch is allowed; no call.
    expect((await unavailable(v.validate(rotated, weather))).retryAfter).toBe(30)
    expect(fake.count('/jwks')).toBe(1)
    // A token issued before that fetch, with a key the set did not hold then: refused, uncached.
    const older = await new SignJWT({ sub: 'user_alice', iss: fake.url, aud: 'http://weather.localhost' })
      .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid: 'k2' })
      .setIssuedAt(Math.floor(clock() / 1000) - 60)
      .setExpirationTime(Math.floor(clock() / 1000) + 600)
      .sign(next.privateKey)
    expect(await v.validate(older, weather)).toMatchObject({ active: false, reason: 'no matching key' })
    expect(fake.count('/jwks')).toBe(1)
    clock.advance(30_000)
    // The same token again: the refusal was not cached, and the refetched set holds its key.
    expect(await v.validate(rotated, weather)).toMatchObject({ active: true })
    expect(fake.count('/jwks')).toBe(2)
  })

  it('a token naming a key the set lacks waits for a refetch in flight, and is served when it brings the key (on Workers, the only refetch that can end)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt', jwksMaxAgeMs: 60_000 })
    expect(await v.validate(await sign({ jti: 'a' }), weather)).toMatchObject({ active: true })
    clock.advance(60_000)
    const next = await generateKeyPair('ES256')
    const nextJwk = { ...(await exportJWK(next.publicKey)), kid: 'k2', alg: 'ES256', use: 'sig' }
    let release!: () => void
    const gate = new Promise<void>((resolve) => (release = resolve))
    fake.route('/jwks', async () => {
      await gate
      return { status: 200, body: { keys: [publicJwk, nextJwk] } }
    })
    // Keys past their age: served at once, the refetch runs beside.
    expect(await v.validate(await sign({ jti: 'b' }), weather)).toMatchObject({ active: true })
    while (fake.count('/jwks') < 2) await new Promise((r) => setImmediate(r))
    const rotated = v.validate(await sign({}, { key: next.privateKey, kid: 'k2' }), weather)
    release()
    expect(await rotated).toMatchObject({ active: true })
    expect(fake.count('/jwks')).toBe(2)
  })

  it('while no key set could be fetched yet, a token its own claims refuse is 401 with no fetch; a good-looking one is 503 (regression: 503 for all, and each a fetch)', async () => {
    fake.route('/jwks', { status: 500 })
    const v = validator({ mode: 'jwt', retry: { attempts: 1 } })
    const refused = [
      await sign({}, { expiresInS: -3600 }),
      await sign({ iss: 'https://other.example' }),
      await sign({ aud: 'http://notes.localhost' }),
      await sign({ sub: '' }),
    ]
    for (const token of refused) expect(await v.validate(token, weather)).toMatchObject({ active: false })
    expect(fake.count('/jwks')).toBe(0)
    expect(v.breakerState).toBe('closed')
    await unavailable(v.validate(await sign({ jti: 'good' }), weather))
    expect(fake.count('/jwks')).toBe(1)
    // Once the keys are there, the same checks refuse as before.
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    clock.advance(60_000)
    expect(await v.validate(await sign({ jti: 'later' }), weather)).toMatchObject({ active: true })
    expect(await v.validate(await sign({}, { expiresInS: -3600 }), weather)).toMatchObject({ active: false })
  })

  it('on a fresh start, a token issued a little ahead of this clock is verified, not refused for its iat (nothing is known of the keys yet)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await sign({}, { issuedAgoS: -2 }), weather)).toMatchObject({ active: true })
    expect(fake.count('/jwks')).toBe(1)
  })

  it('a key rotated in by an issuer whose clock runs a few seconds ahead: its tokens wait for the refetch (503), then verify; not refused for their iat (regression: 401 until the keys aged out)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    const next = await generateKeyPair('ES256')
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk, { ...(await exportJWK(next.publicKey)), kid: 'k2', alg: 'ES256', use: 'sig' }] } })
    // The issuer's clock is 2 s ahead: every token of the new key has an `iat` to come.
    const ahead = (jti: string) => sign({ jti }, { key: next.privateKey, kid: 'k2', issuedAgoS: -2 })
    expect((await unavailable(v.validate(await ahead('a'), weather))).retryAfter).toBe(30)
    expect(fake.count('/jwks')).toBe(1)
    clock.advance(30_000)
    expect(await v.validate(await ahead('b'), weather)).toMatchObject({ active: true })
    expect(fake.count('/jwks')).toBe(2)
    // An `iat` further ahead than any clock runs is still refused at once, with no refetch.
    clock.advance(30_000)
    const unknownKey = (await generateKeyPair('ES256')).privateKey
    expect(await v.validate(await sign({}, { key: unknownKey, kid: 'k3', issuedAgoS: -3600 }), weather)).toEqual({ active: false, reason: 'no matching key' })
    expect(fake.count('/jwks')).toBe(2)
  })

  it('keeps verifying with the keys it has while the JWKS endpoint is down', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt', jwksMaxAgeMs: 60_000 })
    expect(await v.validate(await sign({ jti: 'a' }), weather)).toMatchObject({ active: true })
    fake.route('/jwks', { status: 503 })
    clock.advance(60_000)
    expect(await v.validate(await sign({ jti: 'b' }), weather)).toMatchObject({ active: true })
    // The refetch runs beside the validation (which did not wait for it): it is asked for.
    while (fake.count('/jwks') < 2) await new Promise((r) => setImmediate(r))
    expect(await v.validate(await sign({ jti: 'c' }), weather)).toMatchObject({ active: true })
  })

  it('what keys past their age accepted is not cached: once the refetch shows the key withdrawn, the token is refused', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt', jwksMaxAgeMs: 60_000 })
    expect(await v.validate(await sign({ jti: 'a' }), weather)).toMatchObject({ active: true })
    const token = await sign({ jti: 'b' }) // issued before the refetch below
    clock.advance(60_000)
    const rotated = { ...(await exportJWK((await generateKeyPair('ES256')).publicKey)), kid: 'k2', alg: 'ES256', use: 'sig' }
    fake.route('/jwks', { status: 200, body: { keys: [rotated] } }) // k1 withdrawn
    expect(await v.validate(token, weather)).toMatchObject({ active: true }) // stale k1 still verifies it, while the refetch runs
    while (fake.count('/jwks') < 2) await new Promise((r) => setImmediate(r))
    // Until the refetch's answer is in, the stale key answers again (uncached); then never.
    let result = await v.validate(token, weather)
    for (let i = 0; i < 200 && result.active; i++) {
      await new Promise((r) => setTimeout(r, 5))
      result = await v.validate(token, weather)
    }
    expect(result).toMatchObject({ active: false, reason: 'no matching key' })
  })

  it('keys past their age serve new tokens at once while the refetch hangs; the refetch is shared and its answer used', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const timers = createManualTimers()
    const v = validator({ mode: 'jwt', jwksMaxAgeMs: 60_000, timers })
    expect(await v.validate(await sign({ jti: 'a' }), weather)).toMatchObject({ active: true })
    fake.route('/jwks', 'hang')
    clock.advance(60_000)
    // No timer fires here: a validation that waited for the hung endpoint would never end.
    for (const jti of ['b', 'c', 'd']) expect(await v.validate(await sign({ jti }), weather)).toMatchObject({ active: true })
    while (fake.hanging === 0) await new Promise((r) => setImmediate(r))
    expect(fake.count('/jwks')).toBe(2)
    // The refetch times out; the stale keys stay, and the next token after the age starts one
    // more once the refetch interval since that attempt has passed (attempts are bounded, not
    // only successes).
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    expect(timers.fireAll()).toBe(1)
    clock.advance(30_000)
    expect(await v.validate(await sign({ jti: 'e' }), weather)).toMatchObject({ active: true })
    while (fake.count('/jwks') < 3) await new Promise((r) => setImmediate(r))
    expect(v.breakerState).toBe('closed')
  })

  it('a token naming a kid the set lacks is refused (401), with no refetch, when it would be refused anyway: claims, a junk signature, an iat further ahead than an issuer’s clock runs; a kid the set holds for another algorithm too (regression)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    const foreign = (await generateKeyPair('ES256')).privateKey
    const unknown = (claims: Record<string, unknown>, expiresInS?: number) =>
      sign(claims, { key: foreign, kid: 'kf', ...(expiresInS !== undefined && { expiresInS }) })
    const forged = (header: Record<string, unknown>, signature: string) =>
      `${Buffer.from(JSON.stringify({ typ: 'at+jwt', ...header })).toString('base64url')}.${Buffer.from(
        JSON.stringify({ sub: 'user_alice', iss: fake.url, aud: weather.resource, iat: Math.floor(clock() / 1000), exp: Math.floor(clock() / 1000) + 600 }),
      ).toString('base64url')}.${signature}`
    // Each was issued now, after the last fetch: before, every one got 503 (Retry-After 30).
    for (let round = 0; round < 2; round++) {
      expect(await v.validate(await unknown({ iss: 'https://evil.example' }), weather)).toEqual({ active: false, reason: 'issuer mismatch' })
      expect(await v.validate(await unknown({}, -120), weather)).toEqual({ active: false, reason: 'token expired' })
      expect(await v.validate(await unknown({ aud: 'https://other.example' }), weather)).toEqual({ active: false, reason: 'audience mismatch' })
      expect(await v.validate(await unknown({ sub: '' }), weather)).toEqual({ active: false, reason: 'token has no subject' })
      const fromTheFuture = await new SignJWT({ sub: 'user_alice', iss: fake.url, aud: weather.resource })
        .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid: 'kf' })
        .setIssuedAt(Math.floor(clock() / 1000) + 31_536_000)
        .setExpirationTime(Math.floor(clock() / 1000) + 600)
        .sign(foreign)
      expect(await v.validate(fromTheFuture, weather)).toEqual({ active: false, reason: 'no matching key' })
      const good = await unknown({})
      expect(await v.validate(`${good.slice(0, good.lastIndexOf('.'))}.AAAA`, weather)).toEqual({ active: false, reason: 'invalid signature or token' })
      expect(await v.validate(forged({ alg: 'ES256', kid: 'kz' }, 'A'.repeat(40)), weather)).toEqual({ active: false, reason: 'invalid signature or token' })
      // `k1` is an ES256 key: an RS256 token naming it is no rotation, whatever its iat.
      expect(await v.validate(forged({ alg: 'RS256', kid: 'k1' }, 'A'.repeat(342)), weather)).toEqual({ active: false, reason: 'no matching key' })
      expect(fake.count('/jwks')).toBe(1)
      // Past the refetch interval none of them makes the validator fetch the set either.
      clock.advance(30_000)
    }
    // A token that could be good still takes the rotation path: the refetch, then the wait.
    expect(await v.validate(await unknown({}), weather)).toEqual({ active: false, reason: 'no matching key' })
    expect(fake.count('/jwks')).toBe(2)
    expect((await unavailable(v.validate(await unknown({ jti: 'again' }), weather))).retryAfter).toBe(30)
  })

  it('a JWKS key that cannot be used is left out at load: the other keys verify, its tokens get 503 as the server’s failure (regression)', async () => {
    const rsa = await generateKeyPair('RS256')
    const broken = { kty: 'RSA', kid: 'rk', n: 'AA', e: 'AQAB' } // a modulus of one byte
    const rsaToken = await sign({}, { key: rsa.privateKey, kid: 'rk', alg: 'RS256', issuedAgoS: 60 })
    fake.route('/jwks', { status: 200, body: { keys: [broken, publicJwk] } })
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    // Before: a TypeError out of `jose` (a generic 503, counted by nothing).
    await unavailable(v.validate(rsaToken, weather))
    expect(fake.count('/jwks')).toBe(1)
    // Once the refetch interval allows, the set is asked again, and the repaired key verifies.
    fake.route('/jwks', { status: 200, body: { keys: [{ ...(await exportJWK(rsa.publicKey)), kid: 'rk', alg: 'RS256' }, publicJwk] } })
    clock.advance(30_000)
    expect(await v.validate(rsaToken, weather)).toMatchObject({ active: true })
    expect(fake.count('/jwks')).toBe(2)
  })

  it('an RSA key with a public exponent past 2^32 - 1 is left out at load, as unusable: each made-up token would cost milliseconds of CPU to refuse (regression)', async () => {
    const rsa = await generateKeyPair('RS256')
    const jwk = await exportJWK(rsa.publicKey)
    const rsaToken = await sign({}, { key: rsa.privateKey, kid: 'rk', alg: 'RS256', issuedAgoS: 60 })
    // 2^33 + 1: odd, imports under a 2048-bit modulus.
    const huge = { ...jwk, kid: 'rk', alg: 'RS256', e: Buffer.from([0x02, 0x00, 0x00, 0x00, 0x01]).toString('base64url') }
    fake.route('/jwks', { status: 200, body: { keys: [huge, publicJwk] } })
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    // Left out, as a key that does not import: the server's failure, not the token's.
    await unavailable(v.validate(rsaToken, weather))
    // The set republished with the key's own exponent (65537): it verifies.
    fake.route('/jwks', { status: 200, body: { keys: [{ ...jwk, kid: 'rk', alg: 'RS256' }, publicJwk] } })
    clock.advance(30_000)
    expect(await v.validate(rsaToken, weather)).toMatchObject({ active: true })
  })

  it('the server’s failures stay 503 past the refetch interval: a key still published unusable, a refetch that fails for a key rotated in; reported as unavailable (regression: 401 every other interval)', async () => {
    const rsa = await generateKeyPair('RS256')
    const broken = { kty: 'RSA', kid: 'rk', n: 'AA', e: 'AQAB' }
    const rsaToken = await sign({}, { key: rsa.privateKey, kid: 'rk', alg: 'RS256', issuedAgoS: 60, expiresInS: 3600 })
    fake.route('/jwks', { status: 200, body: { keys: [broken, publicJwk] } })
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    for (let interval = 0; interval < 3; interval++) {
      // Within the interval, and on the refetch that ends it (the set still publishes it unusable).
      expect((await unavailable(v.validate(rsaToken, weather))).retryAfter, `interval ${interval}`).toBeGreaterThan(0)
      clock.advance(30_000)
    }
    expect(fake.count('/jwks')).toBe(3)
    expect(events.filter((e) => e.type === 'unavailable').length).toBeGreaterThanOrEqual(3)

    // A key rotated in after the last fetch, whose refetch fails: 503, as within the interval,
    // not the 401 of "no matching key" (the client would refresh into a token signed the same way).
    const rotatedPair = await generateKeyPair('ES256')
    const rotated = rotatedPair.privateKey
    const fresh = await sign({ jti: 'rotated' }, { key: rotated, kid: 'k2' })
    fake.route('/jwks', { status: 500 })
    clock.advance(30_000)
    await unavailable(v.validate(fresh, weather))
    expect(await v.validate(fresh, weather).catch((e: unknown) => e)).toBeInstanceOf(AuthorizationServerUnavailableError)
    // One issued before the keys in hand were fetched names a key they would hold: refused.
    const stale = await sign({}, { key: rotated, kid: 'k3', issuedAgoS: 3 * 3600 })
    expect(await v.validate(stale, weather)).toEqual({ active: false, reason: 'no matching key' })
    // Once the set can be had with the key, the token verifies.
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk, { ...(await exportJWK(rotatedPair.publicKey)), kid: 'k2', alg: 'ES256' }] } })
    clock.advance(30_000)
    expect(await v.validate(fresh, weather)).toMatchObject({ active: true })
  })

  it('a validation is shared only by requests for the same App: a token of notes, naming a key rotated in, is taken at notes while a request at weather refuses it (regression: both refused)', async () => {
    const notes = { resource: 'http://notes.localhost', appId: 'app_notes' }
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    const rotated = await generateKeyPair('ES256')
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk, { ...(await exportJWK(rotated.publicKey)), kid: 'k2', alg: 'ES256' }] } })
    clock.advance(30_000)
    const token = await sign({ aud: notes.resource }, { key: rotated.privateKey, kid: 'k2' })
    // The request at weather leads; the one at notes comes while it runs.
    const [atWeather, atNotes] = await Promise.all([v.validate(token, weather), v.validate(token, notes)])
    expect(atWeather).toEqual({ active: false, reason: 'audience mismatch' })
    expect(atNotes).toMatchObject({ active: true, info: { subject: 'user_alice' } })
  })

  it('a JWKS with no usable key is a bad answer: 503, counted by the breaker, and not kept (the repaired set is used at once) (regression)', async () => {
    const rsa = await generateKeyPair('RS256')
    const rsaToken = await new SignJWT({ sub: 'user_alice', iss: fake.url, aud: weather.resource })
      .setProtectedHeader({ alg: 'RS256', typ: 'at+jwt', kid: 'rk' })
      .setIssuedAt(Math.floor(clock() / 1000))
      .setExpirationTime(Math.floor(clock() / 1000) + 600)
      .sign(rsa.privateKey)
    fake.route('/jwks', { status: 200, body: { keys: [{ kty: 'RSA', kid: 'rk', n: 'AA', e: 'AQAB' }] } })
    const v = validator({ mode: 'jwt', breaker: { failureThreshold: 2 } })
    await unavailable(v.validate(rsaToken, weather))
    await unavailable(v.validate(rsaToken, weather))
    expect(v.breakerState).toBe('open')
    expect(events).toContainEqual(expect.objectContaining({ type: 'upstream', endpoint: 'jwks', outcome: 'failure' }))
    fake.route('/jwks', { status: 200, body: { keys: [{ ...(await exportJWK(rsa.publicKey)), kid: 'rk', alg: 'RS256' }] } })
    clock.advance(30_000) // the breaker's cool-down; nothing of the bad set was kept
    expect(await v.validate(rsaToken, weather)).toMatchObject({ active: true })
  })

  it('JWKS refetches are bounded by attempts, not successes: a failing endpoint is asked at most once per interval (regression)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt', jwksMaxAgeMs: 120_000 })
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    fake.route('/jwks', { status: 500 })
    clock.advance(31_000)
    // Unknown kids, issued before the last fetch: each may ask for a refetch.
    const other = (await generateKeyPair('ES256')).privateKey
    const old = (i: number) =>
      new SignJWT({ sub: 'user_alice', iss: fake.url, aud: weather.resource, jti: `o${i}` })
        .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid: `kx${i}` })
        .setIssuedAt(Math.floor(clock() / 1000) - 3600)
        .setExpirationTime(Math.floor(clock() / 1000) + 600)
        .sign(other)
    for (let i = 0; i < 20; i++) expect(await v.validate(await old(i), weather)).toMatchObject({ active: false, reason: 'no matching key' })
    expect(fake.count('/jwks')).toBe(2)
    clock.advance(30_000)
    expect(await v.validate(await old(20), weather)).toMatchObject({ active: false })
    expect(fake.count('/jwks')).toBe(3)
    // Keys past their age: one background refetch, then none until the interval has passed.
    clock.advance(120_000)
    for (let i = 0; i < 5; i++) {
      expect(await v.validate(await sign({ jti: `s${i}` }), weather)).toMatchObject({ active: true })
      await new Promise((r) => setTimeout(r, 20))
    }
    // The background refetch reaches the server in its own time: waited for.
    await vi.waitFor(() => expect(fake.count('/jwks')).toBe(4), { timeout: 2_000, interval: 10 })
  })

  /** A token that names no key (`kid` is optional, RFC 7515), signed with `key`. */
  const signWithoutKid = (key: CryptoKey, options: { issuedAgoS?: number; jti?: string } = {}) =>
    new SignJWT({ sub: 'user_alice', iss: fake.url, aud: weather.resource, ...(options.jti && { jti: options.jti }) })
      .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt' })
      .setIssuedAt(Math.floor(clock() / 1000) - (options.issuedAgoS ?? 0))
      .setExpirationTime(Math.floor(clock() / 1000) + 600)
      .sign(key)

  it('a token naming no key is verified by whichever key of its algorithm signed it, the set holding two (a rotation under way); one no key signed is refused (regression: 401 for both)', async () => {
    const next = await generateKeyPair('ES256')
    const nextJwk = { ...(await exportJWK(next.publicKey)), kid: 'k2', alg: 'ES256', use: 'sig' }
    const stranger = (await generateKeyPair('ES256')).privateKey
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk, nextJwk] } })
    for (const v of [validator({ mode: 'jwt' }), validator({ mode: 'jwt', jwks: { keys: [publicJwk, nextJwk] } })]) {
      expect(await v.validate(await signWithoutKid(privateKey), weather)).toMatchObject({ active: true, info: { subject: 'user_alice' } })
      expect(await v.validate(await signWithoutKid(next.privateKey), weather)).toMatchObject({ active: true })
      // A signature that matched, then a claim that did not: that refusal, not a signature's.
      const expired = await new SignJWT({ sub: 'user_alice', iss: fake.url, aud: weather.resource })
        .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt' })
        .setIssuedAt(Math.floor(clock() / 1000) - 3600)
        .setExpirationTime(Math.floor(clock() / 1000) - 60)
        .sign(next.privateKey)
      expect(await v.validate(expired, weather)).toEqual({ active: false, reason: 'token expired' })
      expect(await v.validate(await signWithoutKid(stranger, { issuedAgoS: 3600 }), weather)).toEqual({
        active: false,
        reason: 'invalid signature or token',
      })
    }
    expect(fake.count('/jwks')).toBe(1)
  })

  it('a token naming no key is tried against at most 8 keys of its algorithm (each costs a signature check; a forgery names none)', async () => {
    const pairs = await Promise.all(Array.from({ length: 10 }, () => generateKeyPair('ES256')))
    const keys = await Promise.all(pairs.map(async (p, i) => ({ ...(await exportJWK(p.publicKey)), kid: `k${i}`, alg: 'ES256', use: 'sig' })))
    const v = validator({ mode: 'jwt', jwks: { keys } })
    expect(await v.validate(await signWithoutKid(pairs[7]!.privateKey), weather)).toMatchObject({ active: true })
    expect(await v.validate(await signWithoutKid(pairs[8]!.privateKey), weather)).toEqual({ active: false, reason: 'invalid signature or token' })
    // Named, any key verifies.
    expect(await v.validate(await sign({}, { key: pairs[9]!.privateKey, kid: 'k9' }), weather)).toMatchObject({ active: true })
  })

  it('a token naming no key, which the keys in hand do not verify, is treated as a key rotated in: 503 while no refetch could show it, verified once the refetch brings the key (regression: 401 until the set was past its age)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    // Refusals remembered for long: the one below must not be.
    const v = validator({ mode: 'jwt', rejectionTtlMs: 600_000 })
    expect(await v.validate(await signWithoutKid(privateKey), weather)).toMatchObject({ active: true })
    // The issuer swaps its key and signs with the new one, still naming none.
    const next = await generateKeyPair('ES256')
    fake.route('/jwks', { status: 200, body: { keys: [{ ...(await exportJWK(next.publicKey)), kid: 'k2', alg: 'ES256', use: 'sig' }] } })
    const rotated = await signWithoutKid(next.privateKey)
    expect((await unavailable(v.validate(rotated, weather))).retryAfter).toBe(30)
    // One issued before the keys in hand were fetched would have been verified by them:
    // refused, but not remembered (as for an unknown kid).
    const older = await signWithoutKid(next.privateKey, { issuedAgoS: 60 })
    expect(await v.validate(older, weather)).toEqual({ active: false, reason: 'invalid signature or token' })
    expect(fake.count('/jwks')).toBe(1)
    clock.advance(30_000)
    expect(await v.validate(rotated, weather)).toMatchObject({ active: true })
    expect(await v.validate(older, weather)).toMatchObject({ active: true })
    expect(fake.count('/jwks')).toBe(2)
    // A forgery is a key rotated in as far as anyone can tell until a refetch shows no key
    // verifies it (as for a made-up kid): 503 within the interval, with no call; then 401.
    const forged = await signWithoutKid((await generateKeyPair('ES256')).privateKey, { jti: 'forged' })
    await unavailable(v.validate(forged, weather))
    expect(fake.count('/jwks')).toBe(2)
    clock.advance(30_000)
    expect(await v.validate(forged, weather)).toMatchObject({ active: false, reason: 'invalid signature or token' })
    expect(await v.validate(forged, weather)).toMatchObject({ active: false, reason: 'invalid signature or token' })
    expect(fake.count('/jwks')).toBe(3)
  })

  it('a token naming a key the set lacks, issued in the very second the set was fetched, is taken for a rotation (503), not refused: iat has whole seconds (regression)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt' })
    clock.advance(500) // the fetch lands half way through a second
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    clock.advance(300) // the token is issued after the fetch, in the same second
    const next = await generateKeyPair('ES256')
    const token = await sign({ jti: 'same-second' }, { key: next.privateKey, kid: 'k2' })
    await unavailable(v.validate(token, weather))
    // One issued in the second before is refused, as before.
    const before = await sign({ jti: 'second-before' }, { key: next.privateKey, kid: 'k2', issuedAgoS: 1 })
    expect(await v.validate(before, weather)).toEqual({ active: false, reason: 'no matching key' })
  })

  it('a fetched JWKS with no keys is a bad answer: 503, and not kept, so the published set is used once it is there (regression: every token 401 until the set was past its age)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [] } })
    const v = validator({ mode: 'jwt' })
    await unavailable(v.validate(await sign({}), weather))
    expect(events).toContainEqual(expect.objectContaining({ type: 'upstream', endpoint: 'jwks', outcome: 'failure', error: expect.stringContaining('no keys') }))
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    expect(await v.validate(await sign({ jti: 'next' }), weather)).toMatchObject({ active: true })
    expect(fake.count('/jwks')).toBe(2)
  })

  it('an empty JWKS replacing keys in hand withdraws them: once the refetch lands, tokens of the withdrawn key are refused (a compromised key pulled before its successor is published)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt', jwksMaxAgeMs: 60_000 })
    expect(await v.validate(await sign({ jti: 'a' }), weather)).toMatchObject({ active: true })
    fake.route('/jwks', { status: 200, body: { keys: [] } })
    clock.advance(60_000)
    const token = await sign({ jti: 'b' }, { issuedAgoS: 30 })
    expect(await v.validate(token, weather)).toMatchObject({ active: true }) // the stale key, while the refetch runs
    await vi.waitFor(async () => expect(await v.validate(token, weather)).toMatchObject({ active: false }), { timeout: 2_000, interval: 10 })
    clock.advance(3_600_000)
    expect(await v.validate(await sign({ jti: 'c' }, { issuedAgoS: 30 }), weather)).toMatchObject({ active: false })
    expect(v.breakerState).toBe('closed')
  })

  it('a discovery document without the jwks_uri this mode needs is believed for 5 minutes, not for good: the endpoint published later is used (regression: 503 until a restart)', async () => {
    fake.route('/.well-known/openid-configuration', { status: 200, body: { issuer: fake.url, userinfo_endpoint: `${fake.url}/oidc/me` } })
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt' })
    await unavailable(v.validate(await sign({}), weather))
    await unavailable(v.validate(await sign({ jti: 'again' }), weather))
    expect(fake.count('/.well-known/openid-configuration')).toBe(1)
    fake.route('/.well-known/openid-configuration', { status: 200, body: { issuer: fake.url, jwks_uri: `${fake.url}/jwks` } })
    clock.advance(300_000)
    expect(await v.validate(await sign({ jti: 'later' }), weather)).toMatchObject({ active: true })
    expect(fake.count('/.well-known/openid-configuration')).toBe(2)
    // A complete document is kept.
    clock.advance(3_600_000)
    expect(await v.validate(await sign({ jti: 'much-later' }), weather)).toMatchObject({ active: true })
    expect(fake.count('/.well-known/openid-configuration')).toBe(2)
  })

  it('a jwks_uri the server moved is followed without a restart: the old address answering 404 has discovery asked again, and a key rotated in there verifies (regression: 503 for every new token until a restart)', async () => {
    fake.route('/jwks', { status: 200, body: { keys: [publicJwk] } })
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await sign({}), weather)).toMatchObject({ active: true })
    const next = await generateKeyPair('ES256')
    fake.route('/jwks', { status: 404 })
    fake.route('/keys', { status: 200, body: { keys: [publicJwk, { ...(await exportJWK(next.publicKey)), kid: 'k2', alg: 'ES256', use: 'sig' }] } })
    fake.route('/.well-known/openid-configuration', { status: 200, body: { issuer: fake.url, jwks_uri: `${fake.url}/keys` } })
    const rotated = (jti: string) => sign({ jti }, { key: next.privateKey, kid: 'k2' })
    clock.advance(300_000)
    // The refetch for the new key meets the old address gone: 503 for now.
    await unavailable(v.validate(await rotated('a'), weather))
    expect(fake.count('/jwks')).toBe(2)
    clock.advance(30_000)
    expect(await v.validate(await rotated('b'), weather)).toMatchObject({ active: true })
    expect(fake.count('/.well-known/openid-configuration')).toBe(2)
    expect(fake.count('/keys')).toBe(1)
  })

  it('a subject holding a lone surrogate or a NUL is refused: no store keeps the first as given (two users would share counters and subscriptions), PostgreSQL cannot store the second (regression: taken)', async () => {
    const refused = { active: false, reason: 'token subject is not well-formed Unicode, or holds a NUL' }
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    expect(await v.validate(await sign({ sub: 'user-\uD800' }), weather)).toEqual(refused)
    expect(await v.validate(await sign({ sub: 'user\u0000app' }), weather)).toEqual(refused)
    expect(await v.validate(await sign({ sub: 'user-\u{1F600}' }), weather)).toMatchObject({ active: true, info: { subject: 'user-\u{1F600}' } })
    // From introspection, and from userinfo (an answer it cannot use: 503, as one without sub).
    for (const sub of ['user-\uDC00', 'user\u0000']) {
      fake.route('/introspect', { status: 200, body: { active: true, sub } })
      const introspecting = validator({ mode: 'introspection', introspection: { clientId: 'rs', clientSecret: 's' }, audience: false })
      expect(await introspecting.validate(`opaque-${sub.length}`)).toEqual(refused)
      fake.route('/oidc/me', { status: 200, body: { sub } })
      await unavailable(validator().validate(`good-token-${sub.length}`))
    }
  })

  it('a token refused for its nbf is not remembered: taken once nbf has passed (regression)', async () => {
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    const token = await sign({ nbf: Math.floor(clock() / 1000) + 5 })
    expect(await v.validate(token, weather)).toEqual({ active: false, reason: 'claim check failed: nbf' })
    clock.advance(6_000)
    expect(await v.validate(token, weather)).toMatchObject({ active: true })
  })

  it('with no audience to compare (no context for the App function, or it gives nothing), a token is refused, never taken unchecked (regression)', async () => {
    const foreign = await sign({ aud: 'https://some-other-service.example' })
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    expect(await v.validate(foreign)).toEqual({ active: false, reason: 'no expected audience' })
    expect(await v.validate(await sign({}))).toEqual({ active: false, reason: 'no expected audience' })
    const fn = validator({ mode: 'jwt', jwks: { keys: [publicJwk] }, audience: () => undefined })
    expect(await fn.validate(foreign, weather)).toEqual({ active: false, reason: 'no expected audience' })
    // Nor anything else that is no audience, as untyped code's lookup that found nothing gives
    // (regression: null, false, 0 and '' took a token for another service).
    for (const nothing of [null, false, 0, '', [], [null], {}]) {
      const given = validator({ mode: 'jwt', jwks: { keys: [publicJwk] }, audience: (() => nothing) as never })
      expect(await given.validate(foreign, weather)).toEqual({ active: false, reason: 'no expected audience' })
    }
    fake.route('/introspect', { status: 200, body: { active: true, sub: 'u', aud: 'https://some-other-service.example' } })
    const introspecting = validator({ mode: 'introspection', introspection: { clientId: 'rs', clientSecret: 's' }, audience: (() => null) as never })
    expect(await introspecting.validate('opaque-foreign', weather)).toEqual({ active: false, reason: 'no expected audience' })
    // In userinfo mode too, once an audience is given (regression: [] and '' dropped the check,
    // where they had refused the token for another service).
    fake.route('/oidc/me', { status: 200, body: { sub: 'user_alice' } })
    const toOther = await sign({ iss: fake.url, aud: 'https://some-other-service.example' })
    for (const nothing of [undefined, null, false, [], '', ['']]) {
      const userinfo = validator({ audience: (() => nothing) as never })
      expect(await userinfo.validate(toOther, weather), JSON.stringify(nothing)).toEqual({ active: false, reason: 'no expected audience' })
    }
    // The App function called without the App (a platform's own `validate(token)`).
    expect(await validator({ audience: ({ resource }) => resource }).validate(toOther)).toEqual({ active: false, reason: 'no expected audience' })
    expect(fake.count('/oidc/me')).toBe(0)
    // A fixed audience needs no context; `false` checks none.
    expect(await validator({ mode: 'jwt', jwks: { keys: [publicJwk] }, audience: weather.resource }).validate(await sign({}))).toMatchObject({
      active: true,
    })
    expect(await validator({ mode: 'jwt', jwks: { keys: [publicJwk] }, audience: false }).validate(foreign)).toMatchObject({ active: true })
  })

  it('an audience with userinfo is not the App, though it has the App’s origin (regression)', async () => {
    const v = validator({ mode: 'jwt', jwks: { keys: [publicJwk] } })
    expect(await v.validate(await sign({ aud: 'http://u@weather.localhost' }), weather)).toEqual({ active: false, reason: 'audience mismatch' })
    expect(await v.validate(await sign({ aud: 'http://u:p@weather.localhost/v1' }), weather)).toEqual({ active: false, reason: 'audience mismatch' })
  })
})

describe('introspection mode (RFC 7662)', () => {
  const introspection = { clientId: 'resource-server', clientSecret: 's3cret value' }

  it('introspects with client_secret_basic and caches no longer than the token lives', async () => {
    const exp = Math.floor(clock() / 1000) + 120
    fake.route('/introspect', (req) => {
      const params = new URLSearchParams(req.body)
      return params.get('token') === 'good-token'
        ? { status: 200, body: { active: true, sub: 'user_alice', client_id: 'c1', scope: 'openid', exp, iss: fake.url, token_type: 'Bearer' } }
        : { status: 200, body: { active: false } }
    })
    const v = validator({ mode: 'introspection', introspection, audience: false })
    expect(await v.validate('good-token')).toEqual({
      active: true,
      info: { subject: 'user_alice', clientId: 'c1', scopes: ['openid'], expiresAt: exp * 1000 },
    })
    const request = fake.requests.find((r) => r.path === '/introspect')!
    expect(request.headers.authorization).toBe(`Basic ${Buffer.from('resource-server:s3cret+value').toString('base64')}`)
    expect(new URLSearchParams(request.body).get('token_type_hint')).toBe('access_token')
    expect(await v.validate('other')).toEqual({ active: false, reason: 'inactive token' })
    clock.advance(119_999)
    await v.validate('good-token')
    expect(fake.count('/introspect')).toBe(2)
    clock.advance(1)
    expect(await v.validate('good-token')).toMatchObject({ active: false, reason: 'token expired' })
  })

  it('a discovery document without introspection_endpoint is believed for 5 minutes, not for good (regression: 503 until a restart)', async () => {
    fake.route('/.well-known/openid-configuration', { status: 200, body: { issuer: fake.url, userinfo_endpoint: `${fake.url}/oidc/me` } })
    fake.route('/introspect', { status: 200, body: { active: true, sub: 'user_alice' } })
    const v = validator({ mode: 'introspection', introspection, audience: false })
    await unavailable(v.validate('good-token'))
    clock.advance(299_000)
    await unavailable(v.validate('good-token'))
    expect(fake.count('/.well-known/openid-configuration')).toBe(1)
    fake.route('/.well-known/openid-configuration', { status: 200, body: { issuer: fake.url, introspection_endpoint: `${fake.url}/introspect` } })
    clock.advance(1_000)
    expect(await v.validate('good-token')).toMatchObject({ active: true, info: { subject: 'user_alice' } })
    expect(fake.count('/.well-known/openid-configuration')).toBe(2)
  })

  it('refuses refresh tokens, sender-constrained tokens and tokens for another audience', async () => {
    const answers: Record<string, unknown> = {
      refresh: { active: true, sub: 'u', token_type: 'refresh_token' },
      dpop: { active: true, sub: 'u', token_type: 'Bearer', cnf: { jkt: 'x' } },
      other: { active: true, sub: 'u', aud: 'https://notes.example.com' },
      none: { active: true, sub: 'u' },
      mine: { active: true, sub: 'u', aud: ['https://weather.example.com'] },
      early: { active: true, sub: 'u', aud: 'https://weather.example.com', nbf: Math.floor(clock() / 1000) + 3600 },
    }
    fake.route('/introspect', (req) => ({ status: 200, body: answers[new URLSearchParams(req.body).get('token')!] }))
    const v = validator({ mode: 'introspection', introspection, audience: 'https://weather.example.com' })
    expect(await v.validate('refresh')).toMatchObject({ active: false, reason: 'not a bearer access token' })
    expect(await v.validate('dpop')).toMatchObject({ active: false, reason: 'sender-constrained token' })
    expect(await v.validate('other')).toMatchObject({ active: false, reason: 'audience mismatch' })
    expect(await v.validate('none')).toMatchObject({ active: false, reason: 'audience mismatch' })
    expect(await v.validate('mine')).toMatchObject({ active: true })
    // Not before its `nbf` (RFC 7662 section 2.2), and not remembered as refused past it.
    expect(await v.validate('early')).toMatchObject({ active: false, reason: 'token not yet valid' })
    clock.advance(3_600_000)
    expect(await v.validate('early')).toMatchObject({ active: true })
  })

  it('a token the provider will not introspect (400 unsupported_token_type, e.g. an ID token) is refused, not a 503', async () => {
    fake.route('/introspect', { status: 400, body: { error: 'unsupported_token_type' } })
    const v = validator({ mode: 'introspection', introspection, audience: false })
    expect(await v.validate('an-id-token')).toEqual({ active: false, reason: 'unsupported token type' })
    expect(v.breakerState).toBe('closed')
    fake.route('/introspect', { status: 400, body: { error: 'invalid_request' } })
    await unavailable(v.validate('other-token'))
  })

  it('an answer that is not JSON (RFC 7662 section 2.2) is a bad answer, whatever it holds; JSON types with parameters are taken (regression)', async () => {
    const answer = { active: true, sub: 'u', exp: Math.floor(clock() / 1000) + 600 }
    const v = validator({ mode: 'introspection', introspection, audience: false, breaker: { failureThreshold: 1 } })
    fake.route('/introspect', { status: 200, body: answer, headers: { 'content-type': 'application/json; charset=utf-8' } })
    expect(await v.validate('json')).toMatchObject({ active: true })
    fake.route('/introspect', { status: 200, body: answer, headers: { 'content-type': 'application/token-introspection+json' } })
    expect(await v.validate('plus-json')).toMatchObject({ active: true })
    // A vendor type that looks like a secret to the messages' check is still JSON (review: refused).
    fake.route('/introspect', { status: 200, body: answer, headers: { 'content-type': 'application/vnd.MyCorpIntrospection-Response2+json' } })
    expect(await v.validate('vendor-json')).toMatchObject({ active: true })
    fake.route('/introspect', { status: 200, body: answer, headers: { 'content-type': 'text/html' } })
    await unavailable(v.validate('html'))
    expect(v.breakerState).toBe('open') // the server's failure, counted as other bad answers
  })

  it('an answer whose Content-Type echoes the token is refused without quoting it: no event or error holds the token (from the leak audit: the type went into the event whole)', async () => {
    // Pieces no longer than 8 (base64url): only the rule for such runs finds it.
    const token = 'aBcD3fGh-iJkL5mNo_pQrS7tUv'
    const v = validator({ mode: 'introspection', introspection, audience: false })
    fake.route('/introspect', (req) => ({ status: 200, body: { active: true, sub: 'u' }, headers: { 'content-type': `text/x-${new URLSearchParams(req.body).get('token')}` } }))
    const error = await thrown(v.validate(token), AuthorizationServerUnavailableError)
    expect(inspect([error, events], { depth: Infinity }).toLowerCase()).not.toContain('ijkl5mno')
    expect(JSON.stringify(events)).toContain('introspection: answer is of a type not shown, not JSON')
  })

  it('a Content-Type that echoes a token no check takes for a secret (a UUID, lower-case hex) is not quoted either; a media type is (from the OAuth audit: the UUID went into the default log)', async () => {
    const v = validator()
    for (const [token, echoed] of [
      ['91cc8741-e9aa-418e-ab9c-012723118277', (t: string) => t],
      ['0123456789abcdef0123456789abcdef', (t: string) => `text/x-${t}`],
      ['0123456789abcdef0123456789abcdee', (t: string) => `Bearer ${t}`],
      // Part of it: 20 of its 32 characters.
      ['fedcba9876543210fedcba9876543210', (t: string) => `text/x-${t.slice(2, 22)}`],
    ] as const) {
      fake.route('/oidc/me', () => ({ status: 200, body: 'not json', headers: { 'content-type': echoed(token) } }))
      const error = await thrown(v.validate(token), AuthorizationServerUnavailableError)
      expect(inspect([error, events], { depth: Infinity }).toLowerCase()).not.toContain(token.slice(4, 20))
      expect(JSON.stringify(events)).toContain('answer is not a JSON object (of a type not shown)')
    }
    events.length = 0
    fake.route('/oidc/me', { status: 200, body: 'sign in', headers: { 'content-type': 'Text/HTML; charset=utf-8' } })
    await thrown(v.validate('another-token'), AuthorizationServerUnavailableError)
    expect(JSON.stringify(events)).toContain('answer is not a JSON object (\\"Text/HTML\\")')
  })

  it('a present but malformed exp, nbf or iat refuses the token, rather than leaving it unchecked and cached (regression)', async () => {
    const later = String(Math.floor(clock() / 1000) + 600)
    const answers: Record<string, unknown> = {
      exp: { active: true, sub: 'u', exp: String(Math.floor(clock() / 1000) - 10) },
      nbf: { active: true, sub: 'u', exp: Math.floor(clock() / 1000) + 600, nbf: later },
      iat: { active: true, sub: 'u', exp: Math.floor(clock() / 1000) + 600, iat: later },
    }
    fake.route('/introspect', (req) => ({ status: 200, body: answers[new URLSearchParams(req.body).get('token')!] }))
    const v = validator({ mode: 'introspection', introspection, audience: false })
    for (const claim of ['exp', 'nbf', 'iat']) expect(await v.validate(claim)).toEqual({ active: false, reason: `malformed ${claim}` })
    expect(v.breakerState).toBe('closed')
  })

  it('answers 503 when the introspection endpoint refuses the resource server', async () => {
    fake.route('/introspect', { status: 401, body: { error: 'invalid_client' } })
    await unavailable(validator({ mode: 'introspection', introspection, audience: false }).validate('good-token'))
    expect(fake.count('/introspect')).toBe(1)
  })
})

describe('client budget: a flood of made-up tokens from one address', () => {
  const at = (clientAddress: string) => ({ resource: 'https://weather.example.com', appId: 'app_w', clientAddress })

  const spent = (promise: Promise<unknown>) => thrown(promise, TooManyValidationsError)

  it('stops calling upstream for one address after `limit` refusals in the window, while others and cached tokens go on', async () => {
    const v = validator({ clientBudget: { limit: 5 } })
    expect((await v.validate('good-token', at('203.0.113.7'))).active).toBe(true) // accepted: gives its unit back
    for (let i = 0; i < 5; i++) expect((await v.validate(`junk-${i}`, at('203.0.113.7'))).active).toBe(false)
    const error = await spent(v.validate('junk-5', at('203.0.113.7')))
    expect(error.status).toBe(429)
    expect(error).toMatchObject({ limit: 5, windowType: 'minute' })
    expect(fake.count('/oidc/me')).toBe(6)
    // A cached token of the same address, and another address, are not held up.
    expect((await v.validate('good-token', at('203.0.113.7'))).active).toBe(true)
    expect((await v.validate('junk-x', at('198.51.100.1'))).active).toBe(false)
    expect(fake.count('/oidc/me')).toBe(7)
    expect(events.filter((e) => e.type === 'client-budget-spent')).toHaveLength(1)
    // The next window starts afresh; retryAfter said when.
    clock.advance(error.retryAfter * 1000)
    expect((await v.validate('junk-6', at('203.0.113.7'))).active).toBe(false)
  })

  it('counts validations in flight, so a burst cannot pass before the first refusal is known', async () => {
    const release = holdUserinfo({ status: 401, body: { error: 'invalid_token' } })
    const v = validator({ clientBudget: { limit: 3 } })
    const burst = Array.from({ length: 10 }, (_, i) => v.validate(`junk-${i}`, at('203.0.113.7')).then(
      (r) => r.active,
      (e: unknown) => e,
    ))
    while (fake.count('/oidc/me') < 3) await new Promise((r) => setImmediate(r))
    release()
    const results = await Promise.all(burst)
    expect(results.filter((r) => r === false)).toHaveLength(3)
    expect(results.filter((r) => r instanceof TooManyValidationsError)).toHaveLength(7)
    expect(fake.count('/oidc/me')).toBe(3)
  })

  it('gives units back for accepted tokens and for the server\'s own failures', async () => {
    const v = validator({ clientBudget: { limit: 2 }, retry: { attempts: 1 } })
    for (let i = 0; i < 5; i++) expect((await v.validate(`ey.good-${i}`, at('203.0.113.7'))).active).toBe(true)
    fake.route('/oidc/me', { status: 500 })
    for (let i = 0; i < 3; i++) await unavailable(v.validate(`other-${i}`, at('203.0.113.7')))
    fake.route('/oidc/me', { status: 401, body: {} })
    expect((await v.validate('junk-1', at('203.0.113.7'))).active).toBe(false)
    expect((await v.validate('junk-2', at('203.0.113.7'))).active).toBe(false)
    await spent(v.validate('junk-3', at('203.0.113.7')))
  })

  it('keeps the unit when userinfo answers a success that is no JSON object, and does not count it against the server: a firewall may answer one client\'s token with a block page served with 200', async () => {
    for (const answer of [
      { status: 200, headers: { 'content-type': 'text/html' }, body: '<html>Request rejected</html>' },
      { status: 200, body: '[{"sub":"user_alice"}]' },
      { status: 200, body: '{"sub":' },
    ]) {
      fake.route('/oidc/me', (req) => (req.headers.authorization?.includes('../') ? answer : { status: 200, body: { sub: 'user_alice' } }))
      events = []
      const v = validator({ clientBudget: { limit: 3 }, retry: { attempts: 1 }, breaker: { failureThreshold: 2 } })
      for (let i = 0; i < 3; i++) await unavailable(v.validate(`../../etc/passwd-${i}`, at('203.0.113.7')))
      await spent(v.validate('../../etc/passwd-3', at('203.0.113.7')))
      expect(v.breakerState, answer.body).toBe('closed')
      expect(events).toContainEqual(expect.objectContaining({ type: 'unavailable', error: expect.stringContaining('not a JSON object') }))
      // Everyone else's tokens go on.
      expect((await v.validate('good-token', at('198.51.100.1'))).active).toBe(true)
    }
  })

  it('gives units back when introspection refuses the resource server\'s credentials or answers garbage: no answer about the token (regression)', async () => {
    for (const answer of [
      { status: 401, body: { error: 'invalid_client' } },
      { status: 403, body: {} },
      { status: 200, body: '{"active":tr' },
      { status: 200, body: [1] },
    ]) {
      fake.route('/introspect', answer)
      const v = validator({
        mode: 'introspection',
        introspection: { clientId: 'rs', clientSecret: 'wrong' },
        audience: false,
        clientBudget: { limit: 3 },
        retry: { attempts: 1 },
        breaker: { failureThreshold: 1000 },
      })
      for (let i = 0; i < 5; i++) await unavailable(v.validate(`t-${i}`, at('203.0.113.7')))
      fake.route('/introspect', { status: 200, body: { active: true, sub: 'u' } })
      expect(await v.validate('good', at('203.0.113.7')), JSON.stringify(answer)).toMatchObject({ active: true })
    }
  })

  it('gives units back when the endpoint is not where it is called (a redirect, 404, 405, 410): the setup is at fault, not the client (regression: 429 for everyone after the budget)', async () => {
    for (const [mode, path] of [['userinfo', '/oidc/me'], ['introspection', '/introspect']] as const) {
      for (const status of [302, 404, 405, 410]) {
        fake.route(path, { status, body: {} })
        const v = validator({
          mode,
          ...(mode === 'introspection' && { introspection: { clientId: 'rs', clientSecret: 's' }, audience: false }),
          clientBudget: { limit: 2 },
          retry: { attempts: 1 },
          breaker: { failureThreshold: 1000 },
        })
        for (let i = 0; i < 5; i++) await unavailable(v.validate(`ey.t-${i}`, at('203.0.113.7')))
      }
    }
  })

  it('keeps the unit when the server answers about the token itself (a 4xx other than 401: e.g. a header too large), though that is a 503', async () => {
    fake.route('/oidc/me', { status: 431 })
    const v = validator({ clientBudget: { limit: 2 } })
    await unavailable(v.validate('x'.repeat(8000), at('203.0.113.7')))
    await unavailable(v.validate('y'.repeat(8000), at('203.0.113.7')))
    await spent(v.validate('z'.repeat(8000), at('203.0.113.7')))
    expect(fake.count('/oidc/me')).toBe(2)
  })

  it('counts IPv6 clients by their /64, IPv4-mapped ones as IPv4; without an address, or with false, nothing is counted', async () => {
    const v = validator({ clientBudget: { limit: 1 } })
    expect((await v.validate('junk-1', at('2001:db8:1:2::1'))).active).toBe(false)
    await spent(v.validate('junk-2', at('2001:db8:1:2:ffff::9')))
    expect((await v.validate('junk-3', at('2001:db8:1:3::1'))).active).toBe(false)
    expect((await v.validate('junk-4', at('::ffff:192.0.2.1'))).active).toBe(false)
    await spent(v.validate('junk-5', at('192.0.2.1')))
    for (let i = 0; i < 5; i++) expect((await v.validate(`anon-${i}`)).active).toBe(false)
    const off = validator({ clientBudget: false })
    for (let i = 0; i < 5; i++) expect((await off.validate(`off-${i}`, at('192.0.2.9'))).active).toBe(false)
  })

  it('is on by default: 60 per minute', async () => {
    const v = validator({ rejectionTtlMs: 0 })
    for (let i = 0; i < 60; i++) await v.validate('junk', at('192.0.2.1'))
    expect((await spent(v.validate('junk', at('192.0.2.1')))).limit).toBe(60)
  })
})

/** Userinfo answers `answer` to every call, each held until the returned `release()`. */
function holdUserinfo(answer: { status: number; body: unknown }): () => void {
  let release!: () => void
  const gate = new Promise<void>((resolve) => (release = resolve))
  fake.route('/oidc/me', async () => {
    await gate
    return answer
  })
  return () => release()
}

/**
 * A userinfo endpoint that decides the first call on arrival (accepted) but answers it only on
 * `release()`, and refuses every later call: a token revoked while its first validation is in
 * flight.
 */
function revokedAfterFirstCall() {
  let release!: () => void
  const gate = new Promise<void>((resolve) => (release = resolve))
  let calls = 0
  fake.route('/oidc/me', async () => {
    calls++
    if (calls > 1) return { status: 401 } // revoked upstream meanwhile
    const answer = { status: 200, body: { sub: 'alice' } } // decided on arrival, answered late
    await gate
    return answer
  })
  return { release: () => release(), calls: () => calls }
}

describe('single flight, cache store and secrecy', () => {
  it('shares one upstream call among 50 concurrent first requests', async () => {
    const release = holdUserinfo({ status: 200, body: { sub: 'user_alice' } })
    const v = validator()
    const all = Promise.all(Array.from({ length: 50 }, () => v.validate('good-token')))
    while (fake.count('/oidc/me') === 0) await new Promise((r) => setImmediate(r))
    release()
    const results = await all
    expect(results.every((r) => r.active)).toBe(true)
    expect(fake.count('/oidc/me')).toBe(1)
    expect(events.filter((e) => e.type === 'joined')).toHaveLength(49)
  })

  it('hands waitUntil (Workers) each validation it leads, not the joined ones, so one outlives the request that started it', async () => {
    const release = holdUserinfo({ status: 200, body: { sub: 'user_alice' } })
    const handed: Promise<unknown>[] = []
    const v = validator({ waitUntil: (promise) => void handed.push(promise) })
    const all = Promise.all(Array.from({ length: 3 }, () => v.validate('good-token')))
    expect(handed).toHaveLength(1)
    while (fake.count('/oidc/me') === 0) await new Promise((r) => setImmediate(r))
    release()
    expect((await all).every((r) => r.active)).toBe(true)
    await handed[0]
    expect(() => validator({ waitUntil: 'ctx.waitUntil' as never })).toThrow(/waitUntil/)
  })

  it('takes a validation older than the deadline and a timeout for lost (cut short with its request, on Workers): not joined, and not counted against maxPendingValidations', async () => {
    const v = validator({ maxPendingValidations: 2, clientBudget: false, timeoutMs: 1_000, retry: { deadlineMs: 2_000 } })
    const release = holdUserinfo({ status: 401, body: { error: 'invalid_token' } })
    const lost = [v.validate('made-up-0'), v.validate('made-up-1')]
    while (fake.count('/oidc/me') < 2) await new Promise((r) => setImmediate(r))
    await unavailable(v.validate('made-up-2'))
    clock.advance(3_001)
    const again = [v.validate('made-up-0'), v.validate('made-up-2')]
    while (fake.count('/oidc/me') < 4) await new Promise((r) => setImmediate(r))
    expect(events.filter((e) => e.type === 'joined')).toEqual([])
    release()
    expect((await Promise.all([...lost, ...again])).map((r) => r.active)).toEqual([false, false, false, false])
  })

  it('maxPendingValidations bounds what a hung server can hold: one more is a 503 at once, with no upstream call; joiners and cached tokens go on', async () => {
    const v = validator({ maxPendingValidations: 5, clientBudget: false })
    expect((await v.validate('good-token')).active).toBe(true) // cached before the server hangs
    const release = holdUserinfo({ status: 401, body: { error: 'invalid_token' } })
    // Requests with no client address (a Web adapter given none) and from many addresses alike.
    const pending = Array.from({ length: 5 }, (_, i) => v.validate(`made-up-${i}`, i % 2 ? undefined : { resource: 'http://weather.localhost', appId: 'app_weather', clientAddress: `2001:db8:${i}::1` }))
    while (fake.count('/oidc/me') < 6) await new Promise((r) => setImmediate(r))
    const refused = await unavailable(v.validate('made-up-5'))
    expect(refused.retryAfter).toBe(1)
    expect(fake.count('/oidc/me')).toBe(6) // no call for the refused one
    expect(events.filter((e) => e.type === 'pending-limit')).toEqual([{ type: 'pending-limit', pending: 5 }])
    const joined = v.validate('made-up-0') // the same token as a flight in progress: joins it
    expect((await v.validate('good-token')).active).toBe(true)
    release()
    expect((await Promise.all([...pending, joined])).every((r) => !r.active)).toBe(true)
    // Drained: new validations go upstream again.
    expect((await v.validate('made-up-6')).active).toBe(false)
    expect(fake.count('/oidc/me')).toBe(7)
  })

  it('keys the cache by a hash, so validators sharing a store (Redis) share results', async () => {
    const inner = createMemoryCacheStore<CachedValidation>({ now: clock })
    const keys: string[] = []
    const values: unknown[] = []
    const shared: CacheStore<CachedValidation> = {
      get: (k) => inner.get(k),
      set(k, v, ttl) {
        keys.push(k)
        values.push(JSON.parse(JSON.stringify(v)))
        return inner.set(k, v, ttl)
      },
      delete: (k) => inner.delete(k),
    }
    await validator({ cache: shared }).validate('good-token')
    await validator({ cache: shared }).validate('good-token')
    expect(fake.count('/oidc/me')).toBe(1)
    expect(keys).toHaveLength(1)
    expect(keys[0]).toMatch(/^oauth:[A-Za-z0-9_-]{10}:[A-Za-z0-9_-]{43}$/)
    expect(keys[0]).not.toContain('good-token')
    expect(values[0]).toEqual({ active: true, info: { subject: 'user_alice' }, validUntil: clock() + 300_000 })
  })

  it('keeps validating when the cache store fails', async () => {
    const broken: CacheStore<CachedValidation> = {
      get: () => Promise.reject(new Error('redis down')),
      set: () => Promise.reject(new Error('redis down')),
      delete: () => undefined,
    }
    const v = validator({ cache: broken })
    expect(await v.validate('good-token')).toMatchObject({ active: true })
    expect(events.filter((e) => e.type === 'store-error').map((e) => (e as { operation: string }).operation)).toEqual(['get', 'set'])
  })

  it('a cache store of the platform’s own that hangs is given up on after timeoutMs: a read is a miss, a write a store error, forget rejects (regression: the request waited for ever)', async () => {
    const never = () => new Promise<never>(() => {})
    const hung: CacheStore<CachedValidation> = { get: never, set: never, delete: never }
    const v = validator({ cache: hung, timeoutMs: 100 })
    expect(await v.validate('good-token')).toMatchObject({ active: true, info: { subject: 'user_alice' } })
    expect(events.filter((e) => e.type === 'store-error').map((e) => (e as { operation: string }).operation)).toEqual(['get', 'set'])
    await expect(v.forget('good-token')).rejects.toThrow('the validation cache did not answer within 100 ms')
  })

  it('keys a token by the SHA-256 of its UTF-8 bytes, base64url: the key other instances and versions share', async () => {
    const keys: string[] = []
    const inner = createMemoryCacheStore<CachedValidation>({ now: clock })
    const cache: CacheStore<CachedValidation> = { ...inner, set: (k, v, ttl) => (keys.push(k), inner.set(k, v, ttl)) }
    await validator({ cache }).validate('good-token')
    expect(keys).toHaveLength(1)
    expect(keys[0]!.split(':')[2]).toBe(createHash('sha256').update('good-token').digest('base64url'))
  })

  it('reads a cache that answers synchronously, with a promise or with a thenable, and takes one that throws as a miss', async () => {
    const inner = createMemoryCacheStore<CachedValidation>({ now: clock })
    await validator({ cache: inner }).validate('good-token')
    expect(fake.count('/oidc/me')).toBe(1)
    const answers: Array<(k: string) => ReturnType<CacheStore<CachedValidation>['get']>> = [
      (k) => inner.get(k),
      (k) => Promise.resolve(inner.get(k)),
      (k) => ({ then: (resolve: (v: unknown) => void) => resolve(inner.get(k)) }) as never,
    ]
    for (const get of answers) {
      events = []
      expect(await validator({ cache: { ...inner, get } }).validate('good-token')).toEqual({ active: true, info: { subject: 'user_alice' } })
      expect(events).toEqual([{ type: 'cache-hit', active: true }])
    }
    expect(fake.count('/oidc/me')).toBe(1)
    events = []
    const throwing: CacheStore<CachedValidation> = {
      ...inner,
      get: () => {
        throw new Error('cache down')
      },
    }
    expect(await validator({ cache: throwing }).validate('good-token')).toMatchObject({ active: true })
    expect(fake.count('/oidc/me')).toBe(2)
    expect(events.filter((e) => e.type === 'store-error').map((e) => (e as { operation: string }).operation)).toEqual(['get'])
  })

  it('forgets a token on demand', async () => {
    const v = validator()
    await v.validate('good-token')
    await v.forget('good-token')
    await v.validate('good-token')
    expect(fake.count('/oidc/me')).toBe(2)
  })

  it('forgetting one token leaves the others alone: their validations in flight still cache their answers and are still joined', async () => {
    let release!: () => void
    const held = new Promise<void>((resolve) => (release = resolve))
    let calls = 0
    fake.route('/oidc/me', async () => {
      calls++
      await held
      return { status: 200, body: { sub: 'user_alice' } }
    })
    const v = validator()
    const first = v.validate('good-token')
    while (calls === 0) await new Promise((resolve) => setTimeout(resolve, 5))
    await v.forget('another-token')
    const joined = v.validate('good-token') // joins the flight in progress
    release()
    expect(await first).toMatchObject({ active: true })
    expect(await joined).toMatchObject({ active: true })
    expect(await v.validate('good-token')).toMatchObject({ active: true }) // from the cache
    expect(calls).toBe(1)
  })

  it('a token forgotten again after its first forget was pruned still gets a new flight, never the one from before (regression)', async () => {
    const v = validator()
    await v.forget('good-token')
    clock.advance(20_000) // past the first forget's life: pruned at the next forget
    const upstream = revokedAfterFirstCall()
    const before = v.validate('good-token')
    while (upstream.calls() === 0) await new Promise((resolve) => setTimeout(resolve, 5))
    await v.forget('another-token')
    await v.forget('good-token') // the revocation
    const after = v.validate('good-token')
    while (upstream.calls() < 2) await new Promise((resolve) => setTimeout(resolve, 5))
    upstream.release()
    expect(await before).toMatchObject({ active: true })
    expect(await after).toMatchObject({ active: false })
  })

  it('forget during a validation in flight: its answer, read before the revocation, is not cached (regression)', async () => {
    const upstream = revokedAfterFirstCall()
    const v = validator()
    const inFlight = v.validate('good-token')
    while (upstream.calls() === 0) await new Promise((resolve) => setTimeout(resolve, 5))
    await v.forget('good-token')
    upstream.release()
    expect(await inFlight).toMatchObject({ active: true })
    expect(await v.validate('good-token')).toMatchObject({ active: false })
    expect(upstream.calls()).toBe(2)
  })

  it('forget during a validation in flight, then the wall clock stepped forward (NTP) and another forget: its answer is still not cached (regression: the record of the forget was pruned by the wall clock, and the cache\'s mark had passed on it)', async () => {
    // The wall clock (Date) is the test's, the monotonic one real; the validator has no clock injected.
    vi.useFakeTimers({ toFake: ['Date'], now: Date.UTC(2030, 0, 1) })
    onTestFinished(() => void vi.useRealTimers())
    const upstream = revokedAfterFirstCall()
    const v = validator({ now: undefined })
    const inFlight = v.validate('good-token')
    while (upstream.calls() === 0) await new Promise((resolve) => setTimeout(resolve, 5))
    await v.forget('good-token')
    vi.setSystemTime(Date.now() + 3_600_000)
    await v.forget('another-token') // prunes the records of forgets past their life
    upstream.release()
    expect(await inFlight).toMatchObject({ active: true })
    expect(await v.validate('good-token')).toMatchObject({ active: false })
    expect(upstream.calls()).toBe(2)
  })

  it('a request after forget does not join the validation in flight from before it (regression)', async () => {
    const upstream = revokedAfterFirstCall()
    const v = validator()
    const before = v.validate('good-token')
    while (upstream.calls() === 0) await new Promise((resolve) => setTimeout(resolve, 5))
    await v.forget('good-token')
    const after = v.validate('good-token')
    while (upstream.calls() < 2) await new Promise((resolve) => setTimeout(resolve, 5))
    upstream.release()
    expect(await before).toMatchObject({ active: true }) // its own answer, from before
    expect(await after).toMatchObject({ active: false })
  })

  it('forget on one instance, while another sharing the cache (Redis) validates the token: nothing is cached (regression)', async () => {
    const upstream = revokedAfterFirstCall()
    const shared = createMemoryCacheStore<CachedValidation>({ now: clock })
    const a = validator({ cache: shared })
    const b = validator({ cache: shared })
    const inFlight = b.validate('good-token')
    while (upstream.calls() === 0) await new Promise((resolve) => setTimeout(resolve, 5))
    await a.forget('good-token')
    upstream.release()
    expect(await inFlight).toMatchObject({ active: true })
    expect(await a.validate('good-token')).toMatchObject({ active: false })
    expect(await b.validate('good-token')).toMatchObject({ active: false })
    expect(upstream.calls()).toBeGreaterThanOrEqual(2)
    // The mark is no answer: past it, a token is validated and cached as usual.
    clock.advance(20_000)
    fake.route('/oidc/me', { status: 200, body: { sub: 'alice' } })
    const before = fake.count('/oidc/me')
    expect(await a.validate('good-token')).toMatchObject({ active: true })
    expect(await b.validate('good-token')).toMatchObject({ active: true })
    expect(fake.count('/oidc/me')).toBe(before + 1)
  })

  it('forget landing between another instance\'s decision and its cache write still leaves nothing cached (regression)', async () => {
    const shared = createMemoryCacheStore<CachedValidation>({ now: clock })
    const a = validator({ cache: shared })
    let forgetNow = false
    const racing: CacheStore<CachedValidation> = {
      get: (k) => shared.get(k),
      async set(k, v, ttl) {
        if (forgetNow && v.active) {
          forgetNow = false
          await a.forget('good-token') // revoked upstream, learnt of on A, just before B writes
          fake.route('/oidc/me', { status: 401 })
        }
        return shared.set(k, v, ttl)
      },
      delete: (k) => shared.delete(k),
    }
    const b = validator({ cache: racing })
    forgetNow = true
    expect(await b.validate('good-token')).toMatchObject({ active: true }) // its own answer, from before
    const c = validator({ cache: shared })
    expect(await c.validate('good-token')).toMatchObject({ active: false })
    expect(await a.validate('good-token')).toMatchObject({ active: false })
  })

  it('never puts the token in an event, an error or its cause', async () => {
    const secret = 'very-secret-token-value-1234567890'
    fake.route('/oidc/me', { status: 500 })
    const v = validator({ breaker: { failureThreshold: 3 } })
    const first = await unavailable(v.validate(secret))
    const second = await unavailable(v.validate(secret))
    for (const error of [first, second]) {
      expect(error.message).not.toContain(secret)
      expect(String((error.cause as Error | undefined)?.message)).not.toContain(secret)
    }
    expect(JSON.stringify(events)).not.toContain(secret)
    expect(events.map((e) => e.type)).toContain('fail-fast')
  })
})
