/**
 * Behaviour a coverage run found no test for, each as a platform meets it: a rate-limit policy
 * that answers with a promise (a plan read from a database), a rate-limit store's window that is
 * no time, a CORS preflight of a path nothing serves, a `basePath` written without its slash,
 * and a password reset whose listing of the tokens to invalidate fails.
 */
import {
  type DispatchRequest,
  type DispatcherOptions,
  type RateLimitPolicy,
  ConfigurationError,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  type TokenStore,
} from 'mcp-dispatch'
import { describe, expect, it } from 'vitest'
import { midMinute } from '../helpers/clock.js'
import { dispatchRequest } from '../helpers/dispatch-request.js'

const APP = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.2.3'] }

async function setup(extra: Partial<DispatcherOptions> = {}) {
  const errors: Array<{ error: unknown; context: string }> = []
  const apps = createMemoryAppStore([APP])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: APP.id, active: true }])
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
  const { token } = await tokens.create({ userId: 'user_1', name: 't', servers: [APP.id], expiresInDays: 30 })
  const dispatcher = createDispatcher({ apps, subscriptions, tokens, onError: (error, context) => void errors.push({ error, context }), ...extra })
  const decide = async (request: DispatchRequest = dispatchRequest('/v1', { authorization: `Bearer ${token}` })) => {
    const d = await dispatcher.decide(request)
    return d.type === 'dispatch'
      ? { status: 200, headers: d.headers as Record<string, string | undefined>, body: undefined as string | null | undefined }
      : { status: d.reply.status, headers: d.reply.headers as Record<string, string | undefined>, body: d.reply.body }
  }
  return { decide, errors, token }
}

describe('rateLimit.policy answering with a promise', () => {
  it('a resolved policy counts: RateLimit fields, then 429 past the limit', async () => {
    const policy: RateLimitPolicy = { limit: 2, windowType: 'minute' }
    // Three requests counted in one window: on the wall clock a minute could turn between two.
    const { decide, errors } = await setup({ rateLimit: { policy: async () => policy }, now: midMinute() })
    const first = await decide()
    expect(first.status).toBe(200)
    expect(first.headers['ratelimit-policy']).toBe('"minute";q=2;w=60')
    expect((await decide()).status).toBe(200)
    const third = await decide()
    expect(third.status).toBe(429)
    expect(third.headers['retry-after']).toMatch(/^\d+$/)
    expect(errors).toEqual([])
  })
  it('a resolved undefined is no limit', async () => {
    const { decide, errors } = await setup({ rateLimit: { policy: async () => undefined } })
    const served = await decide()
    expect(served.status).toBe(200)
    expect(served.headers.ratelimit).toBeUndefined()
    expect(errors).toEqual([])
  })
  it('a rejected policy is 503, reported as the policy', async () => {
    const { decide, errors } = await setup({ rateLimit: { policy: async () => { throw new Error('plans down') } } })
    expect((await decide()).status).toBe(503)
    expect(errors.map((e) => e.context)).toEqual(['rate-limit policy failed'])
  })
  it('a policy that never answers is 503 after storeTimeoutMs', async () => {
    const { decide, errors } = await setup({ storeTimeoutMs: 50, rateLimit: { policy: () => new Promise(() => {}) } })
    expect((await decide()).status).toBe(503)
    expect(errors.map((e) => e.context)).toEqual(['rate-limit policy failed'])
  })
  it('a resolved broken policy is 503 as a synchronous one is', async () => {
    const { decide, errors } = await setup({ rateLimit: { policy: async () => ({ limit: -1, windowType: 'minute' }) } })
    expect((await decide()).status).toBe(503)
    expect(errors.map((e) => e.context)).toEqual(['rate-limit policy failed'])
  })
})

describe('rate-limit store answers', () => {
  it('a windowStart that is no safe integer is a broken store: served under failOpen, reported', async () => {
    const { decide, errors } = await setup({
      rateLimit: { policy: () => ({ limit: 5, windowType: 'minute' }), store: { increment: () => ({ count: 1, windowStart: Number.NaN }) } },
    })
    const served = await decide()
    expect(served.status).toBe(200)
    expect(served.headers.ratelimit).toBeUndefined()
    expect(errors.map((e) => e.context)).toEqual(['rate-limit store failed; serving (failOpen)'])
  })
})

describe('CORS preflight of a path that is not found', () => {
  const preflightTo = (path: string): DispatchRequest => ({
    ...dispatchRequest(path, { origin: 'https://app.example', 'access-control-request-method': 'POST' }),
    method: 'OPTIONS',
  })
  it('without allowedOrigins: 204 with Access-Control-Allow-Origin *', async () => {
    const { decide } = await setup()
    const answer = await decide(preflightTo('/nope/deeper'))
    expect(answer.status).toBe(204)
    expect(answer.headers['access-control-allow-origin']).toBe('*')
  })
  it('with allowedOrigins that refuse the origin: 403', async () => {
    const { decide } = await setup({ allowedOrigins: ['https://other.example'] })
    const answer = await decide(preflightTo('/nope/deeper'))
    expect(answer.status).toBe(403)
  })
})

describe('options', () => {
  it('a basePath without a leading slash is a ConfigurationError', async () => {
    const refused = await setup({ basePath: 'mcp' }).catch((error: unknown) => error)
    expect(refused).toBeInstanceOf(ConfigurationError)
    expect((refused as Error).message).toMatch(/basePath/)
  })
})

describe('a password reset whose listing of the tokens to invalidate fails', () => {
  it('still revokes them and answers their count, and the failure is reported', async () => {
    const apps = createMemoryAppStore([APP])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'user_1', appId: APP.id, active: true }])
    const inner = createMemoryTokenStore()
    let failList = false
    const store: TokenStore = { ...inner, listByUser: (userId) => (failList ? Promise.reject(new Error('list down')) : inner.listByUser(userId)) }
    const errors: string[] = []
    const tokens = createTokenService({ store, apps, subscriptions, onError: (_error, context) => void errors.push(context) })
    const made = await Promise.all(['a', 'b'].map((name) => tokens.create({ userId: 'user_1', name, servers: [APP.id], expiresInDays: 30 })))
    failList = true
    expect(await tokens.revokeAllForUser('user_1')).toBe(2)
    expect(errors).toEqual(['password reset: listing the tokens to invalidate'])
    for (const { token } of made) expect(await tokens.authenticate(token, '203.0.113.7')).toEqual({ ok: false, reason: 'revoked' })
  })
})
