/**
 * An option the library does not have is refused at creation, naming it and where it belongs,
 * never ignored: a misspelt `ratelimit` served every caller without a limit, `allowedOrigins`
 * beside an adapter's `dispatcher` (rather than in it) allowed every origin, a Redis `url`
 * instead of a client failed only at the first request. TypeScript catches such keys in an
 * object literal, not in an options object built elsewhere or in JavaScript.
 */
import express from 'express'
import Fastify from 'fastify'
import { Redis } from 'ioredis'
import {
  ConfigurationError,
  createCircuitBreaker,
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
import { mcpDispatch as expressDispatch, routeByVersion as expressRouteByVersion, serveTokenApi as expressServeTokenApi } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import { createPostgresTokenStore, postgresTokenStoreMigration } from 'mcp-dispatch/postgres'
import { createIdentitySigner, createIdentityVerifier, createProxyHandler } from 'mcp-dispatch/proxy'
import { createRedisCacheStore, createRedisInvalidationBus, createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'
import { mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { HOST, createFixture } from '../adapters/helpers.js'

/** The ConfigurationError `create` throws, as `{ option, message }`; `undefined` when it succeeds. */
function refusal(create: () => unknown): { option: string; message: string } | undefined {
  try {
    create()
    return undefined
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigurationError)
    return { option: (error as ConfigurationError).option, message: (error as Error).message }
  }
}

const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
const handler = () => new Response('{}')
const policy = () => ({ limit: 1, windowType: 'minute' as const })
/** A client that is never connected: the stores refuse their options before any command. */
const lazyRedis = () => new Redis({ lazyConnect: true, enableOfflineQueue: false })

describe('unknown options are refused at creation, naming where they belong', () => {
  it('the dispatcher: a misspelt option suggests the name it resembles; an adapter option says it is the adapter’s', () => {
    expect(refusal(() => createDispatcher({ apps, subscriptions, tokens, ratelimit: { policy } } as never))).toEqual({
      option: 'ratelimit',
      message: 'mcp-dispatch: option "ratelimit" is not an option of createDispatcher: did you mean "rateLimit"?',
    })
    expect(refusal(() => createDispatcher({ apps, subscriptions, tokens, allowedOrigin: ['https://a.example'] } as never))?.message).toContain(
      'did you mean "allowedOrigins"?',
    )
    expect(refusal(() => createDispatcher({ apps, subscriptions, tokens, trustProxy: 1 } as never))?.message).toContain(
      "it is one of the adapter's, given beside the dispatcher: mcpDispatch({ dispatcher, trustProxy })",
    )
    // Nothing like any: every name listed.
    const unlike = refusal(() => createDispatcher({ apps, subscriptions, tokens, shards: 4 } as never))
    expect(unlike?.option).toBe('shards')
    expect(unlike?.message).toContain('its options are apps, subscriptions, tokens, oauth,')
    // An option present as undefined is still the wrong name: its intended default is not what it meant.
    expect(refusal(() => createDispatcher({ apps, subscriptions, tokens, sessionTTLMs: undefined } as never))?.option).toBe('sessionTTLMs')
    expect(refusal(() => createDispatcher({ apps, subscriptions, tokens, rateLimit: { policy } }))).toBeUndefined()
  })

  it("rateLimit's own options: a policy's fields given to it say they come from the policy", () => {
    const limit = refusal(() => createDispatcher({ apps, subscriptions, tokens, rateLimit: { policy, limit: 10 } } as never))
    expect(limit?.option).toBe('rateLimit.limit')
    expect(limit?.message).toContain('the limits come from rateLimit.policy')
    expect(refusal(() => createDispatcher({ apps, subscriptions, tokens, rateLimit: { policy, failopen: false } } as never))?.message).toContain(
      'did you mean "rateLimit.failOpen"?',
    )
    expect(refusal(() => createDispatcher({ apps, subscriptions, tokens, rateLimit: 'minute' } as never))?.option).toBe('rateLimit')
    // Any falsy value is no rate limit, as before (`rateLimit: limited && { policy }` in JavaScript).
    for (const none of [false, null, undefined, '']) expect(refusal(() => createDispatcher({ apps, subscriptions, tokens, rateLimit: none } as never))).toBeUndefined()
  })

  it("the adapters: a dispatcher's option beside the dispatcher says to put it in it; Express and Fastify say they take no handler", () => {
    const dispatcher = { apps, subscriptions, tokens }
    for (const create of [
      () => webDispatch({ dispatcher, handler, allowedOrigins: ['https://a.example'] } as never),
      () => expressDispatch({ dispatcher, allowedOrigins: ['https://a.example'] } as never),
      () => fastifyDispatch({ dispatcher, allowedOrigins: ['https://a.example'] } as never),
    ]) {
      const refused = refusal(create)
      expect(refused?.option).toBe('allowedOrigins')
      expect(refused?.message).toContain("it is one of the dispatcher's, given in it: mcpDispatch({ dispatcher: { apps, subscriptions, tokens, allowedOrigins, … } })")
    }
    // The dispatcher's options given as the adapter's (no `dispatcher` key): told where they go,
    // not only that a dispatcher is missing.
    expect(refusal(() => webDispatch({ apps, subscriptions, tokens, handler } as never))?.option).toBe('apps')
    expect(refusal(() => expressDispatch({ dispatcher, handler } as never))?.message).toContain(
      "the Express adapter takes no handler: mount it before your MCP routes, app.use(mcpDispatch({ dispatcher })), then app.all('/{*path}', handler) (Express 4: '*')",
    )
    expect(refusal(() => fastifyDispatch({ dispatcher, handler } as never))?.message).toContain('the Fastify adapter takes no handler')
    // A handler in the dispatcher's options: only the Web adapter takes one, beside it.
    const inside = refusal(() => webDispatch({ dispatcher: { ...dispatcher, handler } } as never))
    expect(inside?.option).toBe('handler')
    expect(inside?.message).toContain("it is the Web adapter's, given beside the dispatcher: mcpDispatch({ dispatcher, handler }); Express and Fastify take none")
    // Fastify's register options given to the factory would never reach Fastify: refused there.
    expect(refusal(() => fastifyDispatch({ dispatcher, prefix: '/mcp' } as never))).toMatchObject({ option: 'prefix', message: expect.stringContaining('is not taken by the dispatch plugin') })
    expect(refusal(() => fastifyDispatch({ dispatcher, logLevel: 'warn' } as never))?.message).toContain(
      "it is one of Fastify's register options: app.register(mcpDispatch({ dispatcher }), { logLevel })",
    )
    expect(refusal(() => webDispatch({ dispatcher, handler, trustproxy: 1 } as never))?.message).toContain('did you mean "trustProxy"?')
    expect(refusal(() => webDispatch({ dispatcher, handlr: handler } as never))?.message).toContain('did you mean "handler"?')
    // A Dispatcher given whole is not looked into; its options were checked when it was made.
    expect(refusal(() => expressDispatch({ dispatcher: createDispatcher(dispatcher), trustProxy: 1, onError: () => {} }))).toBeUndefined()
  })

  it('an Express app given a misspelt rate limit fails at start, where before it served every caller with no limit', () => {
    const { rateLimit, ...rest } = createFixture().dispatcherOptions
    expect(rateLimit).toBeDefined()
    expect(() => express().use(expressDispatch({ dispatcher: { ...rest, ratelimit: rateLimit } } as never))).toThrow(
      'option "ratelimit" is not an option of createDispatcher: did you mean "rateLimit"?',
    )
  })

  it("Fastify's own register options pass beside the plugin's (logLevel), and the plugin registered so serves; a prefix keeps its own refusal", async () => {
    const fixture = createFixture()
    const app = Fastify()
    try {
      await app.register(fastifyDispatch, { dispatcher: fixture.dispatcher, logLevel: 'warn' } as never)
      app.all('/*', async () => ({ ok: true }))
      const response = await app.inject({ method: 'POST', url: '/v1', headers: { host: HOST, 'content-type': 'application/json' }, payload: '{}' })
      // No credentials: the dispatch layer answered, so the plugin is in place.
      expect(response.statusCode).toBe(401)
      expect(response.headers['www-authenticate']).toMatch(/^Bearer /)
    } finally {
      await app.close()
    }
    for (const [options, message] of [
      [{ dispatcher: fixture.dispatcher, prefx: '/mcp' }, 'option "prefx" is not an option of the Fastify adapter\'s mcpDispatch: did you mean "prefix"?'],
      [{ dispatcher: fixture.dispatcher, prefix: '/mcp' }, 'option "prefix" is not taken by the dispatch plugin'],
    ] as const) {
      const refused = Fastify()
      await expect(refused.register(fastifyDispatch, options as never).ready()).rejects.toThrow(message)
      await refused.close()
    }
  })

  it('the token service, the token API and the OAuth validator', () => {
    const store = createMemoryTokenStore()
    expect(refusal(() => createTokenService({ store, apps, subscriptions, previousPepper: [] } as never))?.message).toContain('did you mean "previousPeppers"?')
    expect(refusal(() => createTokenApi({ tokens, authenticateSession: () => null, verifyCsrf: false, basepath: '/api' } as never))?.message).toContain(
      'did you mean "basePath"?',
    )
    expect(refusal(() => createTokenApi({ tokens, authenticateSession: () => null, verifyCsrf: false, trustProxy: 1 } as never))?.message).toContain(
      'the token API takes the client address from clientAddress',
    )
    const issuer = 'https://auth.example.com'
    expect(refusal(() => createOAuthValidator({ issuer, mode: 'jwt', audiance: 'https://x.example' } as never))).toEqual({
      option: 'audiance',
      message: 'mcp-dispatch: option "audiance" is not an option of createOAuthValidator: did you mean "audience"?',
    })
    expect(
      refusal(() => createOAuthValidator({ issuer, mode: 'introspection', introspection: { clientId: 'a', clientSecret: 'b', introspectionEndpoint: 'https://x' } } as never))
        ?.option,
    ).toBe('introspection.introspectionEndpoint')
    expect(refusal(() => createOAuthValidator({ issuer, mode: 'introspection', introspection: { clientId: 'a', clientSecret: 'b', endpoint: `${issuer}/introspect` } }))).toBeUndefined()
    // The nested ones: retry, breaker, and the per-client budgets (the token service's too).
    expect(refusal(() => createOAuthValidator({ issuer, retry: { attempt: 2 } } as never))?.message).toBe(
      'mcp-dispatch: option "retry.attempt" is not an option of createOAuthValidator: did you mean "retry.attempts"?',
    )
    expect(refusal(() => createOAuthValidator({ issuer, breaker: { threshold: 2 } } as never))?.message).toContain('its options are failureThreshold, coolDownMs')
    expect(refusal(() => createOAuthValidator({ issuer, clientBudget: { limit: 10, window: 'minute' } } as never))?.option).toBe('clientBudget.window')
    expect(refusal(() => createTokenService({ store, apps, subscriptions, unknownTokenBudget: { limits: 10 } } as never))?.message).toContain(
      'did you mean "unknownTokenBudget.limit"?',
    )
    expect(refusal(() => createCircuitBreaker({ cooldownMs: 10 } as never))?.message).toContain('did you mean "breaker.coolDownMs"?')
    expect(
      refusal(() =>
        createOAuthValidator({ issuer, retry: { attempts: 2 }, breaker: { failureThreshold: 3 }, clientBudget: { limit: 5, windowType: 'second', maxClients: 10 } }),
      ),
    ).toBeUndefined()
  })

  it('the stores: a Redis or PostgreSQL connection setting says they take a client the platform connected', () => {
    for (const create of [createRedisSessionStore, createRedisRateLimitStore, createRedisCacheStore, createRedisInvalidationBus] as const) {
      const refused = refusal(() => create({ url: 'redis://127.0.0.1:6379' } as never))
      expect(refused?.option).toBe('url')
      expect(refused?.message).toContain('the Redis stores take a connected client, not its options: client: new Redis(url)')
    }
    const client = lazyRedis()
    try {
      expect(refusal(() => createRedisSessionStore({ client, timeout: 500 } as never))?.message).toContain('did you mean "timeoutMs"?')
      // Each store's own options beside the shared ones.
      expect(refusal(() => createRedisCacheStore({ client, localTtlMs: 0 }))).toBeUndefined()
      expect(refusal(() => createRedisRateLimitStore({ client, localTtlMs: 0 } as never))?.option).toBe('localTtlMs')
    } finally {
      client.disconnect()
    }
    expect(refusal(() => createPostgresTokenStore({ connectionString: 'postgres://127.0.0.1/test' } as never))?.message).toContain(
      'the store takes a pool the platform made, not its settings: pool: new pg.Pool({ connectionString })',
    )
    expect(refusal(() => postgresTokenStoreMigration({ shema: 'mcp' } as never))?.message).toContain('did you mean "schema"?')
    expect(postgresTokenStoreMigration({ schema: 'mcp' })).toContain('"mcp"')
    expect(refusal(() => createMemorySessionStore({ maxPersubject: 10 } as never))?.message).toContain('did you mean "maxPerSubject"?')
    expect(refusal(() => createMemoryRateLimitStore({ maxPerSubject: 10 } as never))?.option).toBe('maxPerSubject')
    expect(refusal(() => createMemoryCacheStore({ maxEntries: 10 } as never))?.message).toContain('its options are max, now')
    expect(refusal(() => createMemoryCacheStore(null as never))?.option).toBe('options')
  })

  it('the proxy, its identity signer and verifier, serveTokenApi and routeByVersion', () => {
    const upstream = 'http://127.0.0.1:1'
    expect(refusal(() => createProxyHandler({ upstream, identity: { issuer: 'https://p.example' }, timeout: 5 } as never))?.message).toContain('did you mean "timeoutMs"?')
    expect(refusal(() => createIdentitySigner({ issuer: 'https://p.example', ttl: 60 } as never))?.option).toBe('identity.ttl')
    expect(refusal(() => createIdentityVerifier({ issuer: 'https://p.example', jwks: 'https://p.example/jwks', audiences: ['x'] } as never))?.message).toContain(
      'did you mean "audience"?',
    )
    const api = createTokenApi({ tokens, authenticateSession: () => null, verifyCsrf: false })
    expect(refusal(() => expressServeTokenApi(api, { trustproxy: 1 } as never))?.message).toContain('did you mean "trustProxy"?')
    expect(refusal(() => expressRouteByVersion({ '1.0.0': (_req, res) => res.end() }, { appid: 'app_weather' } as never))?.message).toContain('did you mean "appId"?')
  })
})
