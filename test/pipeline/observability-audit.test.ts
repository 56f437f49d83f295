/**
 * From an audit of the observability surface, what the library reports (the `onError` contexts
 * of docs/pipeline.md, the OAuth validator's `onEvent` events of docs/oauth.md) against what it
 * emits. In-memory stores, a stub `fetch` for the authorization server: no socket, no sleep.
 *
 * - An observer that is an `async` function (`onEvent: async (e) => metrics.send(e)`) whose
 *   promise rejects (the metrics sink is down) must not end the process: "exceptions it throws
 *   are ignored" holds for its rejection too, as it does for an `onError` (regression: the
 *   validator's `onEvent` and the circuit breaker's `onStateChange` left it unhandled, which
 *   ends a Node process).
 * - The events carry the fields docs/oauth.md names; the dispatcher's contexts are the table's.
 */
import {
  AuthorizationServerUnavailableError,
  TooManyValidationsError,
  type DispatchRequest,
  type OAuthValidatorEvent,
  type OAuthValidatorOptions,
  createCircuitBreaker,
  createDispatcher,
  createMemoryAppStore,
  createMemoryInvalidationBus,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createOAuthValidator,
  createTokenService,
} from 'mcp-dispatch'
import { type IdentitySigner, createProxyHandler } from 'mcp-dispatch/proxy'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import { written } from '../helpers/stderr.js'

const ISSUER = 'https://auth.example.com'
const RESOURCE = 'https://weather.example.com'

/** Unhandled rejections seen while a test runs. */
let unhandled: unknown[]
const onUnhandled = (reason: unknown) => void unhandled.push(reason)
beforeEach(() => {
  unhandled = []
  process.on('unhandledRejection', onUnhandled)
})
afterEach(() => {
  process.off('unhandledRejection', onUnhandled)
})

/** Lets pending rejections be noticed (Node tells them after the microtask queue drains). */
const settled = () => new Promise((resolve) => setTimeout(resolve, 5))

/** A userinfo endpoint that accepts `good-token` and refuses anything else, or fails with 503. */
function userinfo(state: { down: boolean }): typeof fetch {
  return async (input, init) => {
    if (state.down) return new Response('down', { status: 503 })
    const authorization = new Headers(init?.headers).get('authorization')
    expect(String(input)).toBe(`${ISSUER}/userinfo`)
    return authorization === 'Bearer good-token'
      ? Response.json({ sub: 'user_alice' })
      : Response.json({ error: 'invalid_token' }, { status: 401 })
  }
}

/**
 * A validator of that endpoint, with one attempt per validation, on the clock `clock.at`
 * (epoch ms), and `options` beside.
 */
function stubValidator(state: { down: boolean }, clock: { at: number }, options: Partial<OAuthValidatorOptions> = {}) {
  return createOAuthValidator({ issuer: ISSUER, userinfoEndpoint: `${ISSUER}/userinfo`, fetch: userinfo(state), now: () => clock.at, retry: { attempts: 1 }, ...options })
}

describe('an async observer that rejects', () => {
  it('onEvent: its rejection is ignored, as a throw is, and validation goes on', async () => {
    const seen: string[] = []
    const validator = createOAuthValidator({
      issuer: ISSUER,
      userinfoEndpoint: `${ISSUER}/userinfo`,
      fetch: userinfo({ down: false }),
      onEvent: async (event) => {
        seen.push(event.type)
        throw new Error('metrics sink down')
      },
    })
    const result = await validator.validate('good-token', { resource: RESOURCE, appId: 'app_weather' })
    expect(result).toMatchObject({ active: true, info: { subject: 'user_alice' } })
    expect(await validator.validate('good-token', { resource: RESOURCE, appId: 'app_weather' })).toMatchObject({ active: true })
    await settled()
    expect(seen).toEqual(['cache-miss', 'upstream', 'cache-hit'])
    expect(unhandled).toEqual([])
  })

  it('createCircuitBreaker onStateChange: its rejection is ignored, as a throw is', async () => {
    const changes: string[] = []
    const breaker = createCircuitBreaker({
      failureThreshold: 1,
      coolDownMs: 1000,
      onStateChange: async (change) => {
        changes.push(`${change.from}->${change.to}`)
        throw new Error('metrics sink down')
      },
    })
    const permit = breaker.acquire()
    expect(permit.allowed).toBe(true)
    breaker.failure(permit.allowed ? permit : undefined)
    expect(breaker.state).toBe('open')
    await settled()
    expect(changes).toEqual(['closed->open'])
    expect(unhandled).toEqual([])
  })

  it('an invalidation listener of the in-process bus: its rejection is not left unhandled, and the others still hear the message', async () => {
    const bus = createMemoryInvalidationBus()
    const heard: string[] = []
    bus.subscribe(async (message) => {
      heard.push(`first ${message.kind}`)
      throw new Error('listener failed')
    })
    bus.subscribe((message) => void heard.push(`second ${message.kind}`))
    await bus.publish({ kind: 'token', tokenHash: 'h1' })
    await settled()
    expect(heard).toEqual(['first token', 'second token'])
    expect(unhandled).toEqual([])
  })
})

describe('OAuth validator events, as docs/oauth.md names them', () => {
  it('upstream carries endpoint, outcome, status, durationMs (and error on a failure); breaker from, to, at', async () => {
    const events: OAuthValidatorEvent[] = []
    const state = { down: false }
    const clock = { at: Date.UTC(2030, 0, 1) }
    const validator = stubValidator(state, clock, {
      sleep: async (ms) => void (clock.at += ms),
      breaker: { failureThreshold: 1 },
      onEvent: (event) => void events.push(event),
    })
    await validator.validate('good-token', { resource: RESOURCE, appId: 'app_weather' })
    expect(events.find((e) => e.type === 'upstream')).toEqual({ type: 'upstream', endpoint: 'userinfo', outcome: 'ok', status: 200, durationMs: 0 })
    state.down = true
    events.length = 0
    await expect(validator.validate('other-token', { resource: RESOURCE, appId: 'app_weather' })).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    // The breaker counts the failed call before it is reported.
    expect(events.map((e) => e.type)).toEqual(['cache-miss', 'breaker', 'upstream', 'unavailable'])
    expect(events[1]).toEqual({ type: 'breaker', from: 'closed', to: 'open', at: clock.at })
    expect(events[2]).toEqual({ type: 'upstream', endpoint: 'userinfo', outcome: 'failure', status: 503, durationMs: 0, error: 'userinfo: HTTP 503' })
    expect(events[3]).toMatchObject({ type: 'unavailable', retryAfter: expect.any(Number), error: 'userinfo: HTTP 503' })
    // The breaker open: refused at once.
    events.length = 0
    await expect(validator.validate('third-token', { resource: RESOURCE, appId: 'app_weather' })).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    expect(events.map((e) => e.type)).toEqual(['cache-miss', 'fail-fast'])
  })
})

describe('OAuth validator without onEvent: what an operator must act on goes to stderr', () => {
  const context = { resource: RESOURCE, appId: 'app_weather' }

  it('a server down: the 503 and the breaker opening, once each; fail-fast writes nothing; the breaker closing when it answers again', async () => {
    const state = { down: true }
    const clock = { at: Date.UTC(2030, 0, 1) }
    const validator = stubValidator(state, clock, { breaker: { failureThreshold: 1, coolDownMs: 30_000 } })
    expect(
      await written(async () => {
        await expect(validator.validate('other-token', context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
        await expect(validator.validate('third-token', context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
      }),
    ).toEqual([
      '[mcp-dispatch] oauth breaker: Error: the circuit breaker opened: uncached tokens get 503 until a probe of the authorization server succeeds',
      expect.stringMatching(/^\[mcp-dispatch\] oauth unavailable: Error: a token was answered 503 \(retry after \d+ s\): userinfo: HTTP 503$/),
    ])
    state.down = false
    clock.at += 31_000
    expect(
      await written(async () => {
        expect(await validator.validate('good-token', context)).toMatchObject({ active: true })
      }),
    ).toEqual(['[mcp-dispatch] oauth breaker: Error: the circuit breaker closed: the authorization server answers again'])
  })

  it('a discovery document naming another issuer (an issuer configured with a trailing slash) is named, not a silent 503', async () => {
    const validator = createOAuthValidator({
      issuer: `${ISSUER}/`,
      fetch: async (input) =>
        String(input).includes('/.well-known/') ? Response.json({ issuer: ISSUER, userinfo_endpoint: `${ISSUER}/userinfo` }) : new Response('unexpected', { status: 500 }),
      retry: { attempts: 1 },
    })
    const lines = await written(async () => {
      await expect(validator.validate('some-token', context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    })
    expect(lines).toHaveLength(1)
    expect(lines[0]).toMatch(/^\[mcp-dispatch\] oauth unavailable: Error: a token was answered 503 .*issuer mismatch/)
  })

  it('the breaker turning back within 10 s is written each time (only repeats wait)', async () => {
    const state = { down: true }
    const clock = { at: 1_000_000 }
    const validator = stubValidator(state, clock, { breaker: { failureThreshold: 1, coolDownMs: 1_000 } })
    const lines = await written(async () => {
      await expect(validator.validate('t1', context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
      clock.at += 1_001
      state.down = false
      await validator.validate('good-token', context)
      state.down = true
      await expect(validator.validate('t2', context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    })
    expect(lines.map((line) => line.replace(/ \(retry after \d+ s\)/, '').replace(/^\[mcp-dispatch\] /, ''))).toEqual([
      'oauth breaker: Error: the circuit breaker opened: uncached tokens get 503 until a probe of the authorization server succeeds',
      'oauth unavailable: Error: a token was answered 503: userinfo: HTTP 503',
      'oauth breaker: Error: the circuit breaker closed: the authorization server answers again',
      'oauth breaker: Error: the circuit breaker opened: uncached tokens get 503 until a probe of the authorization server succeeds',
    ])
  })

  it('validations past maxPendingValidations: their 503 is written too', async () => {
    let release = () => {}
    const held = new Promise<void>((resolve) => (release = resolve))
    const validator = createOAuthValidator({
      issuer: ISSUER,
      userinfoEndpoint: `${ISSUER}/userinfo`,
      fetch: async () => (await held, Response.json({ sub: 'user_alice' })),
      maxPendingValidations: 1,
    })
    const first = validator.validate('waiting-token', context)
    const lines = await written(async () => {
      await expect(validator.validate('second-token', context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    })
    release()
    expect(await first).toMatchObject({ active: true })
    expect(lines).toEqual([
      '[mcp-dispatch] oauth pending limit: Error: 1 validations were already waiting for the authorization server (maxPendingValidations): an uncached token was answered 503',
    ])
  })

  it('at most one line of a kind per 10 s: the next names how many came meanwhile; a clock stepped back is a quiet interval; an onEvent given hears every event and nothing is written', async () => {
    const clock = { at: 0 }
    const validator = stubValidator({ down: true }, clock, { breaker: { failureThreshold: 1_000 } })
    const fail = (token: string) => expect(validator.validate(token, context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    const lines = await written(async () => {
      await fail('t1')
      clock.at += 5_000
      await fail('t2')
      await fail('t3')
      clock.at += 5_000
      await fail('t4')
      // A clock stepped back a minute (a wall clock given as now): a quiet interval, not a minute
      // of silence.
      clock.at -= 60_000
      await fail('t5')
    })
    expect(lines.map((line) => line.slice(0, line.indexOf(': Error')))).toEqual([
      '[mcp-dispatch] oauth unavailable',
      '[mcp-dispatch] oauth unavailable; 2 more since the last line',
      '[mcp-dispatch] oauth unavailable',
    ])
    const events: string[] = []
    const observed = stubValidator({ down: true }, clock, { breaker: { failureThreshold: 1_000 }, onEvent: (event) => void events.push(event.type) })
    expect(
      await written(async () => {
        await expect(observed.validate('t6', context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
      }),
    ).toEqual([])
    expect(events).toContain('unavailable')
  })
})

describe('dispatcher onError contexts, as the table of docs/pipeline.md names them', () => {
  const WEATHER = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.2.3'] }
  const request = (token: string): DispatchRequest => ({
    method: 'POST',
    path: '/v1',
    host: 'weather.example.com',
    origin: 'https://weather.example.com',
    headers: new Headers({ authorization: `Bearer ${token}`, accept: 'application/json, text/event-stream' }),
    clientAddress: '192.0.2.1',
  })

  it('a failing token store is `token failed` on the dispatcher, once; a failing validator of your own `oauth failed`', async () => {
    const reports: Array<{ context: string; by: string }> = []
    const store = createMemoryTokenStore()
    const apps = createMemoryAppStore([WEATHER])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: WEATHER.id, active: true }])
    const { token } = await createTokenService({ store, apps, subscriptions }).create({ userId: 'user_1', name: 'ci', servers: [WEATHER.id], expiresInDays: 30 })
    // Another instance's service: the token is in no cache of its own.
    const tokens = createTokenService({ store, apps, subscriptions, onError: (_e, context) => void reports.push({ context, by: 'tokens' }) })
    store.findByHash = () => Promise.reject(new Error('connection refused'))
    const dispatcher = createDispatcher({
      apps,
      subscriptions,
      tokens,
      oauth: {
        validate: () => Promise.reject(new Error('my validator broke')),
        issuer: ISSUER,
      },
      onError: (_e, context) => void reports.push({ context, by: 'dispatcher' }),
    })
    const apiToken = await dispatcher.decide(request(token))
    expect(apiToken).toMatchObject({ type: 'reply', reply: { status: 503 } })
    const oauth = await dispatcher.decide(request('an-oauth-access-token'))
    expect(oauth).toMatchObject({ type: 'reply', reply: { status: 503 } })
    await settled()
    expect(reports).toEqual([
      { context: 'token failed', by: 'dispatcher' },
      { context: 'oauth failed', by: 'dispatcher' },
    ])
  })

  it('a token service that throws or rejects with TooManyValidationsError gets 429, not reported (regression: rejected, it was 503 `token failed`)', async () => {
    const reports: string[] = []
    const apps = createMemoryAppStore([WEATHER])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: WEATHER.id, active: true }])
    const service = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
    const spent = () => new TooManyValidationsError({ limit: 20, resetAt: 1_900_000_060, retryAfter: 42, windowType: 'minute' })
    const answers = { throws: false }
    // A token service of the platform's own, wrapping the library's: its lookups budget spent.
    const tokens = Object.assign(Object.create(service) as typeof service, {
      authenticate: () => {
        if (answers.throws) throw spent()
        return Promise.reject(spent())
      },
    })
    const dispatcher = createDispatcher({ apps, subscriptions, tokens, onError: (_e, context) => void reports.push(context) })
    const { token } = await service.create({ userId: 'user_1', name: 'ci', servers: [WEATHER.id], expiresInDays: 30 })
    for (const throws of [true, false]) {
      answers.throws = throws
      const decision = await dispatcher.decide(request(token))
      expect(decision, throws ? 'thrown' : 'rejected').toMatchObject({ type: 'reply', reply: { status: 429, headers: { 'retry-after': '42' } } })
      const body = decision.type === 'reply' ? JSON.parse(String(decision.reply.body)) : undefined
      expect(body).toEqual({
        jsonrpc: '2.0',
        id: null,
        error: { code: -32000, message: 'Rate limit exceeded', data: { limit: 20, resetAt: 1_900_000_060, retryAfter: 42, windowType: 'minute' } },
      })
    }
    expect(reports).toEqual([])
  })

  it('a validator that answers 503 with AuthorizationServerUnavailableError is not reported (its onEvent tells it)', async () => {
    const reports: string[] = []
    const apps = createMemoryAppStore([WEATHER])
    const subscriptions = createMemorySubscriptionStore([])
    const dispatcher = createDispatcher({
      apps,
      subscriptions,
      tokens: createTokenService({ store: createMemoryTokenStore(), apps, subscriptions }),
      oauth: { validate: () => Promise.reject(new AuthorizationServerUnavailableError(7)), issuer: ISSUER },
      onError: (_e, context) => void reports.push(context),
    })
    const decision = await dispatcher.decide(request('an-oauth-access-token'))
    expect(decision).toMatchObject({ type: 'reply', reply: { status: 503, headers: { 'retry-after': '7' } } })
    expect(reports).toEqual([])
  })
})

describe('proxy handler onError contexts, as docs/adapters.md names them', () => {
  it('an upstream function that throws is 502, reported under `proxy upstream`', async () => {
    const reports: Array<{ error: unknown; context: string }> = []
    const identity: IdentitySigner = { sign: async () => 'identity', jwks: async () => ({ keys: [] }) } as unknown as IdentitySigner
    const proxy = createProxyHandler({
      upstream: () => {
        throw new Error('upstream table broke')
      },
      identity,
      onError: (error, context) => void reports.push({ error, context }),
    })
    const context = { app: { id: 'app_weather' }, version: '1.2.3' } as unknown as Parameters<typeof proxy>[1]
    const response = await proxy(new Request('https://weather.example.com/v1', { method: 'POST', body: '{}' }), context)
    expect(response.status).toBe(502)
    expect(await response.json()).toMatchObject({ error: { data: { error: 'upstream_unavailable' } } })
    expect(reports).toEqual([{ error: expect.objectContaining({ message: 'upstream table broke' }), context: 'proxy upstream' }])
  })
})
