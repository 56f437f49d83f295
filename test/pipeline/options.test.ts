/**
 * Options a platform can get wrong are refused when the object is created, with a
 * ConfigurationError naming the option, rather than accepted and misbehaving on every request
 * (an API that answers nothing, an unbounded store, every Origin refused).
 */
import {
  ConfigurationError,
  createDispatcher,
  createMemoryAppStore,
  createMemoryCacheStore,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createOAuthValidator,
  createTokenApi,
  createTokenService,
} from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { HOST, createFixture } from '../adapters/helpers.js'
import { createTestPlatform, mcpRequest } from '../helpers/platform.js'

/** The option a ConfigurationError names, or `undefined` when `create` succeeds. */
function refusedOption(create: () => unknown): string | undefined {
  try {
    create()
    return undefined
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigurationError)
    return (error as ConfigurationError).option
  }
}

const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
const subscriptions = createMemorySubscriptionStore([])
const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })

describe('options checked at creation', () => {
  it('the memory stores take a positive integer max (0 would be unbounded to lru-cache)', () => {
    for (const create of [createMemorySessionStore, createMemoryRateLimitStore, createMemoryCacheStore]) {
      // Past 2^24, lru-cache's index allocated up front threw its own RangeError (1e12) or took gigabytes.
      for (const max of [0, -1, Number.NaN, 1.5, Number.POSITIVE_INFINITY, 2 ** 24 + 1, 1e12]) expect(refusedOption(() => create({ max }))).toBe('max')
      expect(refusedOption(() => create({ max: 1 }))).toBeUndefined()
      expect(refusedOption(() => create({ max: 2 ** 24 }))).toBeUndefined()
      expect(refusedOption(() => create())).toBeUndefined()
    }
    // Three indexes of 2^24 entries allocated: seconds on a loaded host (once past 30 s in CI).
  }, 120_000)

  it('onError is a function wherever it is taken: anything else was accepted, and failed only when an error was to be reported (an unanswered request, an unhandled rejection)', () => {
    for (const onError of ['x', 5, null, {}]) {
      const label = JSON.stringify(onError)
      expect(refusedOption(() => createDispatcher({ apps, subscriptions, tokens, onError: onError as never })), label).toBe('onError')
      expect(refusedOption(() => createTokenService({ store: createMemoryTokenStore(), apps, subscriptions, onError: onError as never })), label).toBe('onError')
      expect(refusedOption(() => createTokenApi({ tokens, authenticateSession: () => null, verifyCsrf: false, onError: onError as never })), label).toBe('onError')
      expect(refusedOption(() => mcpDispatch({ dispatcher: createFixture().dispatcher, handler: () => new Response(), onError: onError as never })), label).toBe('onError')
      expect(refusedOption(() => mcpDispatch({ dispatcher: { apps, subscriptions, tokens }, handler: () => new Response(), onError: onError as never })), label).toBe('onError')
    }
    expect(refusedOption(() => createDispatcher({ apps, subscriptions, tokens, onError: () => {} }))).toBeUndefined()
  })

  it('an onError that throws (a logger that is down) fails no request: the 503 still answers, the rate limit still fails open, and the report goes to the default logger (regression: decide rejected)', async () => {
    const printed: string[] = []
    const original = console.error
    console.error = (...args: unknown[]) => void printed.push(args.map(String).join(' '))
    try {
      const loggerDown = () => {
        throw new Error('logger down')
      }
      const fixture = createFixture()
      const handle = mcpDispatch({
        dispatcher: {
          ...fixture.dispatcherOptions,
          subscriptions: { isActive: () => Promise.reject(new Error('subscriptions down')) },
          onError: loggerDown,
        },
        handler: () => new Response('{}'),
      })
      const request = (token: string) =>
        new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: '{}' })
      expect((await handle(request(fixture.tokens.alice), { clientAddress: '127.0.0.1' })).status).toBe(503)
      // The report, then the reporter's own failure.
      expect(printed).toEqual([expect.stringContaining('subscriptions down'), expect.stringContaining('onError failed: Error: logger down')])
      // Fail open on a rate-limit store that throws, reported to a reporter that throws.
      const open = mcpDispatch({
        dispatcher: {
          ...fixture.dispatcherOptions,
          rateLimit: { policy: () => ({ limit: 9, windowType: 'minute' }), store: { increment: () => Promise.reject(new Error('counters down')) } },
          onError: loggerDown,
        },
        handler: () => new Response('{}'),
      })
      expect((await open(request(fixture.tokens.alice), { clientAddress: '127.0.0.1' })).status).toBe(200)
      expect(printed.slice(2)).toEqual([expect.stringContaining('counters down'), expect.stringContaining('onError failed: Error: logger down')])
      // An async reporter that rejects: its report printed too, and its own failure, nothing
      // left unhandled; an error with no string form printed by its kind.
      printed.length = 0
      const rejecting = mcpDispatch({
        dispatcher: {
          ...fixture.dispatcherOptions,
          subscriptions: { isActive: () => Promise.reject(Object.create(null)) },
          onError: async () => {
            throw new Error('logger down')
          },
        },
        handler: () => new Response('{}'),
      })
      expect((await rejecting(request(fixture.tokens.alice), { clientAddress: '127.0.0.1' })).status).toBe(503)
      await new Promise((resolve) => setImmediate(resolve))
      expect(printed).toEqual([expect.stringContaining('[object Object]'), expect.stringContaining('onError failed: Error: logger down')])
    } finally {
      console.error = original
    }
  })

  it('resolveApp, baseUrl, sessions, cors, basePath and authorizationServers of the wrong kind are refused at creation, not answered 503 on every request (or every pin lost)', () => {
    const refused = (extra: Record<string, unknown>) => refusedOption(() => createDispatcher({ apps, subscriptions, tokens, ...extra } as never))
    expect(refused({ resolveApp: 'weather' })).toBe('resolveApp')
    expect(refused({ baseUrl: 'https://weather.example.com' })).toBe('baseUrl')
    expect(refused({ sessions: {} })).toBe('sessions')
    expect(refused({ cors: 'false' })).toBe('cors')
    expect(refused({ cors: 0 })).toBe('cors')
    expect(refused({ basePath: 5 })).toBe('basePath')
    expect(refused({ authorizationServers: 'https://auth.example.com' })).toBe('authorizationServers')
    expect(refused({ authorizationServers: 5 })).toBe('authorizationServers')
    expect(refused({ cors: false, sessions: createMemorySessionStore(), resolveApp: () => undefined, baseUrl: () => 'https://a.example' })).toBeUndefined()
    // `null` is the default, as for the other options.
    expect(refused({ cors: null, sessions: null, resolveApp: null, basePath: null })).toBeUndefined()
  })

  it('stores, services and validators without the methods they are called by are refused at creation, naming the option, not answered 503 on every request or thrown as a raw TypeError (regression)', () => {
    const dispatcher = (extra: Record<string, unknown>) => refusedOption(() => createDispatcher({ apps, subscriptions, tokens, ...extra } as never))
    for (const bad of [{}, 'x', 5]) {
      expect(dispatcher({ apps: bad })).toBe('apps')
      expect(dispatcher({ subscriptions: bad })).toBe('subscriptions')
      expect(dispatcher({ tokens: bad })).toBe('tokens')
      expect(dispatcher({ oauth: bad })).toBe('oauth')
    }
    expect(dispatcher({ apps: undefined })).toBe('apps')
    // With a resolveApp of its own, the dispatcher looks no App up by slug.
    expect(dispatcher({ apps: { getLiveVersions: () => [] }, resolveApp: () => undefined })).toBeUndefined()
    expect(dispatcher({ apps: { getLiveVersions: () => [] } })).toBe('apps')
    expect(dispatcher({ oauth: null })).toBeUndefined()
    expect(() => createDispatcher({ apps: { getAppBySlug: () => undefined } as never, subscriptions, tokens })).toThrow(
      'mcp-dispatch: option "apps" must be an AppStore (an object with getAppBySlug, getLiveVersions methods): it has no getLiveVersions',
    )

    const store = createMemoryTokenStore()
    const service = (extra: Record<string, unknown>) => refusedOption(() => createTokenService({ store, apps, subscriptions, ...extra } as never))
    expect(service({ store: {} })).toBe('store')
    expect(service({ apps: {} })).toBe('apps')
    expect(service({ subscriptions: {} })).toBe('subscriptions')
    expect(service({ subscriptions: undefined, canUseServer: true })).toBe('canUseServer')
    expect(service({ subscriptions: undefined, canUseServer: () => true })).toBeUndefined()
    expect(service({ random: 'x' })).toBe('random')
    expect(service({ invalidations: {} })).toBe('invalidations')
    // `null` (a config loader's unset value) is as absent: a cache still needs its bus named
    // (regression: null passed, and the in-process bus left other instances' revocations unheard).
    expect(service({ cacheTtlMs: 60_000, invalidations: null })).toBe('invalidations')
    expect(service({ invalidations: null })).toBeUndefined()
    for (const cacheTtlMs of ['60000', true, Number.NaN, -1, 600_001]) expect(service({ cacheTtlMs }), String(cacheTtlMs)).toBe('cacheTtlMs')
    expect(service({ unknownTokenBudget: { maxClients: 1e12 } })).toBe('unknownTokenBudget.maxClients')
    // `null` (a config loader's unset value) is the default, as it was.
    expect(service({ unknownTokenBudget: { maxClients: null }, random: null })).toBeUndefined()
    expect(refusedOption(() => createOAuthValidator({ issuer: 'https://auth.example.com', clientBudget: { maxClients: 1e12 } }))).toBe('clientBudget.maxClients')

    const api = (extra: Record<string, unknown>) => refusedOption(() => createTokenApi({ tokens, authenticateSession: () => null, verifyCsrf: false, ...extra } as never))
    expect(api({ tokens: {} })).toBe('tokens')
    expect(api({ tokens: 'x' })).toBe('tokens')
    expect(api({ clientAddress: 'x' })).toBe('clientAddress')
    expect(api({ clientAddress: () => '127.0.0.1' })).toBeUndefined()

    const adapter = (given: unknown) => refusedOption(() => mcpDispatch({ dispatcher: given as never, handler: () => new Response() }))
    expect(adapter('x')).toBe('dispatcher')
    expect(adapter({ decide: 'x' })).toBe('dispatcher')
    expect(adapter(undefined)).toBe('dispatcher')
  })

  it("authorizationServers are issuer identifiers, as the validator's issuer is: a space, a control character (a trailing newline from a secret file), a query, a fragment or a password is refused, not published as given (RFC 9728 section 2, RFC 8414 section 2)", () => {
    const refused = (authorizationServers: unknown) => refusedOption(() => createDispatcher({ apps, subscriptions, tokens, authorizationServers } as never))
    for (const url of ['https://auth.example.com ', 'https://auth.example.com\n', 'https://u:p@auth.example.com', 'https://auth.example.com/?tenant=1', 'https://auth.example.com/#x', 'https://auth.example.com/a b']) {
      expect(refused(['https://auth.example.com', url]), JSON.stringify(url)).toBe('authorizationServers.1')
    }
    // The entry is not quoted: what is wrong with it may be a secret (a password past the first
    // 100 characters, or holding an `@`; a query's client_secret).
    for (const url of [
      `https://user:${'S'.repeat(150)}@auth.example.com`,
      'https://u:p@ssw0rd@auth.example.com',
      'https://auth.example.com/?client_secret=ssw0rd',
      // No URL at all (a port past 65535, an open bracket), password and all.
      'https://admin:ssw0rd@auth.example.com:99999/',
      'https://admin:ssw0rd@[::1',
      'auth.example.com/?api_key=ssw0rd',
    ]) {
      expect(() => createDispatcher({ apps, subscriptions, tokens, authorizationServers: [url] })).toThrow(/^(?!.*(?:SSS|ssw0rd))/s)
    }
    expect(refused(['https://auth.example.com', 'http://127.0.0.1:8788/tenant'])).toBeUndefined()
    // Whatever an entry is, a ConfigurationError naming it (a BigInt threw from JSON.stringify).
    expect(refused(['https://auth.example.com', 10n])).toBe('authorizationServers.1')
    const circular: Record<string, unknown> = {}
    circular.self = circular
    expect(refused([circular])).toBe('authorizationServers.0')
  })

  it("the OAuth validator's algorithms are JWS algorithms jose verifies, its clock tolerance at most five minutes, its cache TTLs timers' delays, its introspection secret non-empty", () => {
    const issuer = 'https://auth.example.com'
    const validator = (extra: Record<string, unknown>) => refusedOption(() => createOAuthValidator({ issuer, ...extra } as never))
    for (const algorithms of [['RS265'], ['rs256'], ['none'], ['RS256', 'HS257']]) expect(validator({ mode: 'jwt', algorithms }), String(algorithms)).toBe('algorithms')
    expect(validator({ mode: 'jwt', algorithms: ['RS256', 'ES256', 'EdDSA', 'Ed25519', 'PS512', 'HS256', 'ML-DSA-65'] })).toBeUndefined()
    expect(validator({ clockToleranceMs: 300_001 })).toBe('clockToleranceMs')
    expect(validator({ clockToleranceMs: 1e12 })).toBe('clockToleranceMs')
    expect(validator({ clockToleranceMs: 300_000 })).toBeUndefined()
    expect(validator({ cacheTtlMs: 1e300 })).toBe('cacheTtlMs')
    expect(validator({ rejectionTtlMs: 2 ** 31 })).toBe('rejectionTtlMs')
    expect(validator({ mode: 'introspection', introspection: { clientId: 'rs', clientSecret: '' } })).toBe('introspection')
    expect(validator({ mode: 'introspection', introspection: { clientId: 'rs', clientSecret: 's' } })).toBeUndefined()
  })

  it("the token API's basePath is a path starting with /", () => {
    const api = (basePath: unknown) => () =>
      createTokenApi({ tokens, authenticateSession: () => null, verifyCsrf: false, basePath: basePath as string })
    expect(refusedOption(api('api/tokens'))).toBe('basePath')
    expect(refusedOption(api(''))).toBe('basePath')
    expect(refusedOption(api(42))).toBe('basePath')
    expect(refusedOption(api('/dashboard/api/tokens/'))).toBeUndefined()
    expect(refusedOption(api('/'))).toBeUndefined()
  })

  it("the dispatcher's scopesSupported is an array of scope names (a string was served as its characters)", () => {
    const dispatcher = (scopesSupported: unknown) => () => createDispatcher({ apps, subscriptions, tokens, scopesSupported: scopesSupported as string[] })
    for (const bad of ['openid mcp', [''], ['openid', 1], new Array(2), null, ['openid profile email'], [' '], ['a"b']]) {
      expect(refusedOption(dispatcher(bad)), JSON.stringify(bad)).toBe('scopesSupported')
    }
    expect(refusedOption(dispatcher(['openid', 'mcp:tools']))).toBeUndefined()
    expect(refusedOption(dispatcher([]))).toBeUndefined()
    // Copied at creation: what the caller's array becomes later is not served.
    const scopes = ['openid']
    const made = createDispatcher({ apps, subscriptions, tokens, scopesSupported: scopes })
    scopes.push('not checked')
    expect(made.metadata({ id: 'app_weather', slug: 'weather', name: 'Weather' }, 'https://weather.example.com').scopes_supported).toEqual(['openid'])
  })

  it("the dispatcher's sessionTtlMs is a whole number of milliseconds: Infinity would be sent to Redis as PX Infinity, and no pin written (regression)", () => {
    const dispatcher = (sessionTtlMs: unknown) => () => createDispatcher({ apps, subscriptions, tokens, sessionTtlMs: sessionTtlMs as number })
    for (const bad of [Number.POSITIVE_INFINITY, Number.NaN, 0, -1, 1.5, 2 ** 53, '3600000']) {
      expect(refusedOption(dispatcher(bad)), String(bad)).toBe('sessionTtlMs')
    }
    for (const good of [1, 3_600_000, 30 * 86_400_000, Number.MAX_SAFE_INTEGER, undefined]) {
      expect(refusedOption(dispatcher(good)), String(good)).toBeUndefined()
    }
  })

  it("the dispatcher's storeTimeoutMs is a timer's delay: at most 2^31 - 1 ms (past it, Infinity too, Node fires at once)", () => {
    const dispatcher = (storeTimeoutMs: unknown) => () => createDispatcher({ apps, subscriptions, tokens, storeTimeoutMs: storeTimeoutMs as number })
    for (const bad of [Number.POSITIVE_INFINITY, Number.NaN, 0, -1, 2 ** 31, '5000']) {
      expect(refusedOption(dispatcher(bad)), String(bad)).toBe('storeTimeoutMs')
    }
    for (const good of [1, 2.5, 5_000, 2 ** 31 - 1, undefined]) expect(refusedOption(dispatcher(good)), String(good)).toBeUndefined()
  })

  it("the dispatcher's allowedOrigins is an array of origins, never a string taken as a set of characters", () => {
    const dispatcher = (allowedOrigins: unknown) => () =>
      createDispatcher({ apps, subscriptions, tokens, allowedOrigins: allowedOrigins as string[] })
    expect(refusedOption(dispatcher('https://app.example'))).toBe('allowedOrigins')
    expect(refusedOption(dispatcher([42]))).toBe('allowedOrigins')
    expect(refusedOption(dispatcher(['https://app.example']))).toBeUndefined()
  })

  it("with oauth, the metadata names the validator's issuer by default, and a validator without one needs authorizationServers", async () => {
    const issuer = 'https://auth.example.com'
    const oauth = createOAuthValidator({ issuer })
    const metadata = async (dispatcher: ReturnType<typeof createDispatcher>) => {
      const answer = await mcpDispatch({ dispatcher, handler: () => new Response('{}') })(
        new Request(`http://${HOST}/.well-known/oauth-protected-resource`),
      )
      return (await answer.json()).authorization_servers
    }
    expect(await metadata(createDispatcher({ apps, subscriptions, tokens, oauth }))).toEqual([issuer])
    // Another server than the validator's: served as given, and told once (clients signing in
    // there get tokens the validator refuses).
    const told: Array<{ error: unknown; context: string }> = []
    const onError = (error: unknown, context: string) => void told.push({ error, context })
    expect(await metadata(createDispatcher({ apps, subscriptions, tokens, oauth, onError, authorizationServers: ['https://other.example.com'] }))).toEqual([
      'https://other.example.com',
    ])
    expect(told).toHaveLength(1)
    expect(told[0]!.context).toBe('configuration')
    expect(told[0]!.error).toBeInstanceOf(ConfigurationError)
    expect((told[0]!.error as ConfigurationError).option).toBe('authorizationServers')
    expect(String(told[0]!.error)).toContain('"https://auth.example.com"')
    // A trailing slash is another issuer; the issuer among others is as meant.
    createDispatcher({ apps, subscriptions, tokens, oauth, onError, authorizationServers: [`${issuer}/`] })
    expect(told).toHaveLength(2)
    createDispatcher({ apps, subscriptions, tokens, oauth, onError, authorizationServers: ['https://other.example.com', issuer] })
    expect(told).toHaveLength(2)
    // Without oauth, API tokens only: nothing to name, and the list is left out (RFC 9728 section 3.2).
    expect(await metadata(createDispatcher({ apps, subscriptions, tokens }))).toBeUndefined()
    const custom = { validate: async () => ({ active: false as const, reason: 'refused' }) }
    expect(refusedOption(() => createDispatcher({ apps, subscriptions, tokens, oauth: custom }))).toBe('authorizationServers')
    expect(refusedOption(() => createDispatcher({ apps, subscriptions, tokens, oauth, authorizationServers: [] }))).toBe('authorizationServers')
    expect(refusedOption(() => createDispatcher({ apps, subscriptions, tokens, oauth, authorizationServers: ['javascript:alert(1)'] }))).toBe('authorizationServers.0')
    expect(refusedOption(() => createDispatcher({ apps, subscriptions, tokens, oauth: custom, authorizationServers: [issuer] }))).toBeUndefined()
  })

  it('offline_access in scopesSupported or challengeScope is served as given, and told once at creation (SEP-2207)', async () => {
    const told: Array<[unknown, string]> = []
    const onError = (error: unknown, context: string) => void told.push([error, context])
    const dispatcher = createDispatcher({ apps, subscriptions, tokens, onError, scopesSupported: ['openid', 'offline_access'], challengeScope: ['openid', 'offline_access'] })
    expect(told.map(([error, context]) => [(error as ConfigurationError).option, context])).toEqual([
      ['scopesSupported', 'configuration'],
      ['challengeScope', 'configuration'],
    ])
    expect(told.every(([error]) => error instanceof ConfigurationError && /offline_access.*SEP-2207/.test(error.message))).toBe(true)
    const answer = await mcpDispatch({ dispatcher, handler: () => new Response('{}') })(new Request(`http://${HOST}/.well-known/oauth-protected-resource`))
    expect((await answer.json()).scopes_supported).toEqual(['openid', 'offline_access'])
    // Nothing said of lists without it, nor of the defaults.
    createDispatcher({ apps, subscriptions, tokens, onError, scopesSupported: ['openid', 'offline'], challengeScope: ['mcp:offline_access'] })
    createDispatcher({ apps, subscriptions, tokens, onError })
    expect(told).toHaveLength(2)
  })

  it("the dispatcher's allowedOrigins entries are origins: ones that could never match are refused, naming the entry", () => {
    const dispatcher = (allowedOrigins: string[]) => () => createDispatcher({ apps, subscriptions, tokens, allowedOrigins })
    // A wildcard host too: no browser sends one, so it matched nothing (regression: accepted).
    for (const bad of ['*', 'app.example', 'https://app.example/mcp', 'https://app.example?x=1', 'https://app.example#top', 'https://user@app.example', '', 'https://*.example.com', 'http://*:3000']) {
      expect(refusedOption(dispatcher(['https://ok.example', bad])), bad).toBe('allowedOrigins.1')
    }
    for (const good of ['https://app.example', 'http://localhost:5173', 'https://app.example/', 'null', 'chrome-extension://abcdefghijklmnop']) {
      expect(refusedOption(dispatcher([good])), good).toBeUndefined()
    }
    // An entry with credentials is refused without quoting them (regression: the message held the password).
    for (const secret of ['https://u:Sup3rSecretPw@app.example', 'https://u:Sup3rSecretPw@app.example/x', 'ht tp://u:Sup3rSecretPw@app.example']) {
      const message = (() => {
        try {
          dispatcher([secret])()
        } catch (error) {
          return String((error as Error).message)
        }
        return 'accepted'
      })()
      expect(message, secret).toContain('allowedOrigins')
      expect(message, secret).not.toContain('Sup3rSecretPw')
    }
  })
})

describe('allowedOrigins as a function', () => {
  it('allows what it answers true for; refuses (403) the rest, and what it throws on (reported)', async () => {
    const fixture = createFixture()
    const errors: Array<{ error: unknown; context: string }> = []
    const handle = mcpDispatch({
      dispatcher: createDispatcher({
        ...fixture.dispatcherOptions,
        onError: (error, context) => errors.push({ error, context }),
        allowedOrigins: (origin) => {
          if (origin === 'https://throws.example') throw new Error('bad predicate')
          return new URL(origin).hostname.endsWith('.app.example')
        },
      }),
      handler: () => new Response('{}', { headers: { 'content-type': 'application/json' } }),
    })
    const call = async (origin?: string) => {
      const response = await handle(
        new Request(`http://${HOST}/v1`, {
          method: 'POST',
          headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', ...(origin && { origin }) },
          body: '{}',
        }),
      )
      return { status: response.status, allowOrigin: response.headers.get('access-control-allow-origin'), body: await response.text() }
    }
    expect(await call('https://dash.app.example')).toMatchObject({ status: 200, allowOrigin: 'https://dash.app.example' })
    expect(await call()).toMatchObject({ status: 200 })
    const refused = await call('https://evil.example')
    expect(refused.status).toBe(403)
    expect(JSON.parse(refused.body)).toMatchObject({ error: { data: { error: 'origin_not_allowed' } } })
    expect((await call('https://throws.example')).status).toBe(403)
    expect(errors.map((e) => [(e.error as Error).message, e.context])).toEqual([['bad predicate', 'allowedOrigins']])
    // Present and empty: no origin, refused without asking the predicate (regression: taken for
    // no Origin at all, and served).
    const empty = await handle(
      new Request(`http://${HOST}/v1`, {
        method: 'POST',
        headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', origin: '' },
        body: '{}',
      }),
    )
    expect(empty.status).toBe(403)
    expect(errors).toHaveLength(1)
  })

  it('only an answer of true allows: an async predicate (a promise) or another truthy answer refuses (403)', async () => {
    const fixture = createFixture()
    for (const allowedOrigins of [async () => true, () => 'yes', () => 1]) {
      const handle = mcpDispatch({
        dispatcher: createDispatcher({ ...fixture.dispatcherOptions, allowedOrigins: allowedOrigins as unknown as (origin: string) => boolean }),
        handler: () => new Response('{}', { headers: { 'content-type': 'application/json' } }),
      })
      const response = await handle(
        new Request(`http://${HOST}/v1`, {
          method: 'POST',
          headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', origin: 'https://evil.example' },
          body: '{}',
        }),
      )
      expect(response.status, String(allowedOrigins)).toBe(403)
      expect(response.headers.get('access-control-allow-origin')).toBeNull()
    }
  })

  it('an array entry written with capitals, the default port or a trailing slash allows the origin as a browser sends it', async () => {
    const fixture = createFixture()
    const handle = mcpDispatch({
      dispatcher: createDispatcher({ ...fixture.dispatcherOptions, allowedOrigins: ['https://Dash.App.Example:443/', 'http://localhost:5173'] }),
      handler: () => new Response('{}', { headers: { 'content-type': 'application/json' } }),
    })
    const status = async (origin: string) =>
      (
        await handle(
          new Request(`http://${HOST}/v1`, {
            method: 'POST',
            headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', origin },
            body: '{}',
          }),
        )
      ).status
    expect(await status('https://dash.app.example')).toBe(200)
    expect(await status('http://localhost:5173')).toBe(200)
    expect(await status('https://dash.app.example:8443')).toBe(403)
    expect(await status('http://dash.app.example')).toBe(403)
  })

  it("the reference platform's default allows https pages, and http pages on loopback or its own domain; refuses other pages", async () => {
    const { platform, token } = createTestPlatform()
    try {
      const status = async (origin?: string) =>
        (await platform.fetch(mcpRequest('http://weather.localhost/v1', { token: token('alice'), ...(origin && { headers: { origin } }) }), { clientAddress: '127.0.0.1' })).status
      expect(await status()).toBe(200)
      for (const origin of ['http://localhost:6274', 'http://127.0.0.1:3000', 'http://[::1]:8080', 'http://dashboard.localhost:8787', 'https://inspector.example']) {
        expect(await status(origin), origin).toBe(200)
      }
      for (const origin of ['http://evil.example.com', 'http://localhost.evil.example', 'null', 'file://', 'chrome-extension://abc']) {
        expect(await status(origin), origin).toBe(403)
      }
    } finally {
      await platform.close()
    }
  })
})

describe("the token API's clientAddress", () => {
  it("info.clientAddress of null or '' names none, as undefined does: the clientAddress option is asked then too", async () => {
    const subscribed = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
    const service = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions: subscribed })
    const asked: unknown[] = []
    const api = createTokenApi({
      tokens: service,
      authenticateSession: () => null,
      verifyCsrf: false,
      clientAddress: (request) => (asked.push(request.url), '203.0.113.7'),
    })
    for (const none of [undefined, null, '']) {
      const created = await service.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 30, allowedIps: ['203.0.113.0/24'] })
      const request = new Request(`http://dashboard.localhost/api/tokens/${created.id}/rotate`, { method: 'POST', headers: { authorization: `Bearer ${created.token}` } })
      const response = await api(request, { clientAddress: none as never })
      // The option's address is in the allowlist: the rotation is let through.
      expect(response?.status, JSON.stringify(none)).toBe(200)
    }
    expect(asked).toHaveLength(3)
  })
})
