/**
 * Counted, not timed: how often the reference platform calls the authorization server, and
 * what callers get while it is stopped, slow or failing (spec 5.1 steps 6 and 8). A real
 * oidc-provider issues the tokens; for the faults its userinfo endpoint is reached through a
 * programmable proxy on 127.0.0.1.
 */
import type { OAuthValidatorEvent } from 'mcp-dispatch'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { type Platform, type PlatformOptions, type PlatformSeed, createPlatform } from '../../examples/platform/index.js'
import { type ManualClock, createManualClock, createManualTimers, createRecordingSleep } from './helpers/clock.js'
import { type FakeUpstream, proxyTo, startFakeUpstream } from './helpers/fake-upstream.js'
import { inProcessFetch, obtainAccessToken } from './helpers/oauth-client.js'

const seed: PlatformSeed = {
  apps: [{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }],
  users: [{ id: 'user_alice' }, { id: 'user_bob' }],
  subscriptions: [
    { userId: 'user_alice', appId: 'app_weather', active: true },
    { userId: 'user_bob', appId: 'app_weather', active: true },
  ],
  tokens: [{ name: 'alice', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 30 }],
}

let clock: ManualClock
let auth: DevAuthServer
const asRequests: string[] = []
const platforms: Platform[] = []
const proxies: FakeUpstream[] = []

beforeAll(async () => {
  clock = createManualClock()
  auth = await startDevAuthServer({ accounts: ['user_alice', 'user_bob'], now: clock, onRequest: (r) => asRequests.push(r.path) })
})

afterEach(async () => {
  await Promise.all(platforms.splice(0).map((p) => p.close()))
  await Promise.all(proxies.splice(0).map((p) => p.close()))
})

afterAll(async () => {
  await auth?.close()
})

function platformWith(authorizationServer: Partial<NonNullable<PlatformOptions['authorizationServer']>> = {}): Platform {
  const platform = createPlatform({ seed, now: clock, authorizationServer: { issuer: auth.issuer, ...authorizationServer } })
  platforms.push(platform)
  return platform
}

function listTools(platform: Platform, bearer: string): Promise<Response> {
  return platform.fetch(
    new Request('http://weather.localhost/v1', {
      method: 'POST',
      headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    }),
  )
}

async function statuses(platform: Platform, bearer: string, n: number): Promise<number[]> {
  return Promise.all(Array.from({ length: n }, async () => (await listTools(platform, bearer)).status))
}

async function newToken(platform: Platform, loginHint = 'user_alice'): Promise<string> {
  return (await obtainAccessToken('http://weather.localhost/v1', inProcessFetch(platform.fetch), { loginHint })).accessToken
}

const userinfoAtAs = () => asRequests.filter((p) => p === '/me').length

describe('cache and single flight against a real authorization server', () => {
  it('100 concurrent requests with a new token make one userinfo call; none within 5 minutes; one after', async () => {
    const platform = platformWith()
    const token = await newToken(platform)
    const before = userinfoAtAs()

    expect(new Set(await statuses(platform, token, 100))).toEqual(new Set([200]))
    expect(userinfoAtAs() - before).toBe(1)

    clock.advance(299_999)
    expect(new Set(await statuses(platform, token, 100))).toEqual(new Set([200]))
    expect(userinfoAtAs() - before).toBe(1)

    clock.advance(1)
    expect(new Set(await statuses(platform, token, 100))).toEqual(new Set([200]))
    expect(userinfoAtAs() - before).toBe(2)
  })

  it('a refused token is asked about once per 30 s, however often it is sent', async () => {
    const platform = platformWith()
    const before = userinfoAtAs()
    const replies = await Promise.all(Array.from({ length: 100 }, () => listTools(platform, 'not-a-real-token')))
    expect(new Set(replies.map((r) => r.status))).toEqual(new Set([401]))
    expect(replies[0]!.headers.get('www-authenticate')).toContain('error="invalid_token"')
    expect(userinfoAtAs() - before).toBe(1)
    clock.advance(29_999)
    await statuses(platform, 'not-a-real-token', 10)
    expect(userinfoAtAs() - before).toBe(1)
    clock.advance(1)
    await statuses(platform, 'not-a-real-token', 10)
    expect(userinfoAtAs() - before).toBe(2)
  })
})

describe('a flood of made-up bearer strings from one address (clientBudget)', () => {
  it('gets 429 with the section 7 body after 60 upstream refusals a minute; other addresses and known tokens are served', async () => {
    const platform = platformWith()
    const token = await newToken(platform)
    const post = (bearer: string, clientAddress: string) =>
      platform.fetch(
        new Request('http://weather.localhost/v1', {
          method: 'POST',
          headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
          body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
        }),
        { clientAddress },
      )
    expect((await post(token, '203.0.113.7')).status).toBe(200)
    const before = userinfoAtAs()
    const replies = await Promise.all(Array.from({ length: 100 }, (_, i) => post(`made-up-${i}`, '203.0.113.7')))
    const counts = replies.reduce<Record<number, number>>((c, r) => ({ ...c, [r.status]: (c[r.status] ?? 0) + 1 }), {})
    expect(counts).toEqual({ 401: 60, 429: 40 })
    expect(userinfoAtAs() - before).toBe(60)
    const limited = replies.find((r) => r.status === 429)!
    const body = await limited.json()
    expect(body).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Rate limit exceeded' } })
    expect(body.error.data).toEqual({ limit: 60, resetAt: expect.any(Number), retryAfter: expect.any(Number), windowType: 'minute' })
    expect(limited.headers.get('retry-after')).toBe(String(body.error.data.retryAfter))
    expect(limited.headers.get('ratelimit-policy')).toBe('"unverified";q=60;w=60')
    expect(limited.headers.get('ratelimit')).toBe(`"unverified";r=0;t=${body.error.data.retryAfter}`)
    expect(limited.headers.get('x-mcp-version')).toBeNull()
    // The breaker stayed closed; the known token and another address are served as before.
    expect((await post(token, '203.0.113.7')).status).toBe(200)
    expect((await post('made-up-x', '198.51.100.1')).status).toBe(401)
    clock.advance(body.error.data.retryAfter * 1000)
    expect((await post('made-up-y', '203.0.113.7')).status).toBe(401)
  })
})

describe('a sick authorization server', () => {
  type Fault = 'stopped' | 'slow (past the timeout)' | 'answering 500'

  it.each<Fault>(['stopped', 'slow (past the timeout)', 'answering 500'])(
    'while it is %s: cached tokens 200, uncached 503 failing fast once the breaker is open, and recovery by itself',
    async (fault) => {
      const proxy = await startFakeUpstream()
      proxies.push(proxy)
      proxy.route('/me', proxyTo(auth.userinfoEndpoint))
      const timers = createManualTimers()
      const sleep = createRecordingSleep()
      const events: OAuthValidatorEvent[] = []
      const platform = platformWith({
        userinfoEndpoint: `${proxy.url}/me`,
        timeoutMs: 2_000,
        retry: { attempts: 3, baseDelayMs: 100 },
        breaker: { failureThreshold: 3, coolDownMs: 30_000 },
        timers,
        sleep,
        random: () => 0.5,
        onEvent: (e) => events.push(e),
      })
      const userinfoCalls = () => events.filter((e) => e.type === 'upstream' && e.endpoint === 'userinfo').length
      const cached = await newToken(platform)
      const uncached = [await newToken(platform), await newToken(platform, 'user_bob')]
      expect((await listTools(platform, cached)).status).toBe(200)
      expect(userinfoCalls()).toBe(1)

      // The fault.
      if (fault === 'stopped') await proxy.stop()
      else if (fault === 'answering 500') proxy.route('/me', { status: 500 })
      else {
        proxy.route('/me', 'hang')
        // The per-call timeout fires while the server holds the request.
        proxy.onRequest = () => timers.fireAll()
      }

      expect(await statuses(platform, cached, 20)).toEqual(Array(20).fill(200))
      expect(userinfoCalls()).toBe(1)

      // The first uncached token: three attempts with backoff, then 503; the breaker opens.
      const first = await listTools(platform, uncached[0]!)
      expect(first.status).toBe(503)
      expect(first.headers.get('retry-after')).toBe('30')
      expect(await first.json()).toEqual({
        jsonrpc: '2.0',
        id: null,
        error: { code: -32005, message: 'Authorization server unavailable', data: { error: 'temporarily_unavailable', retryAfter: 30 } },
      })
      expect(userinfoCalls()).toBe(1 + 3)
      expect(sleep.delays).toEqual([75, 150])
      const failures = events.flatMap((e) => (e.type === 'upstream' && e.outcome === 'failure' ? [e.error] : []))
      expect(failures).toHaveLength(3)
      if (fault === 'slow (past the timeout)') for (const f of failures) expect(f).toMatch(/timed out after 2000 ms/)
      if (fault === 'answering 500') for (const f of failures) expect(f).toBe('userinfo: HTTP 500')
      if (fault === 'stopped') for (const f of failures) expect(f).toMatch(/ECONNREFUSED/)
      if (fault !== 'stopped') expect(proxy.count('/me')).toBe(1 + 3)

      // Open: every uncached token fails fast, without a single upstream call.
      const fast = await Promise.all(uncached.flatMap((t) => Array.from({ length: 25 }, () => listTools(platform, t))))
      expect(new Set(fast.map((r) => r.status))).toEqual(new Set([503]))
      expect(userinfoCalls()).toBe(1 + 3)
      if (fault !== 'stopped') expect(proxy.count('/me')).toBe(1 + 3)
      // Cached OAuth tokens and API tokens are untouched.
      expect(await statuses(platform, cached, 10)).toEqual(Array(10).fill(200))
      expect((await listTools(platform, platform.tokens.alice!)).status).toBe(200)

      // The server comes back; within the cool-down the breaker still fails fast.
      if (fault === 'stopped') await proxy.start()
      proxy.onRequest = undefined
      proxy.route('/me', proxyTo(auth.userinfoEndpoint))
      clock.advance(29_999)
      expect((await listTools(platform, uncached[1]!)).status).toBe(503)
      expect(userinfoCalls()).toBe(1 + 3)

      // After it, one probe closes the breaker and service resumes by itself.
      clock.advance(1)
      expect((await listTools(platform, uncached[0]!)).status).toBe(200)
      expect(userinfoCalls()).toBe(1 + 3 + 1)
      expect(await statuses(platform, uncached[1]!, 10)).toEqual(Array(10).fill(200))
      expect(userinfoCalls()).toBe(1 + 3 + 2)
      const transitions = events.flatMap((e) => (e.type === 'breaker' ? [`${e.from}->${e.to}`] : []))
      expect(transitions).toEqual(['closed->open', 'open->half-open', 'half-open->closed'])
    },
  )

  it('a failed probe opens the breaker again for another cool-down', async () => {
    const proxy = await startFakeUpstream()
    proxies.push(proxy)
    proxy.route('/me', { status: 500 })
    const events: OAuthValidatorEvent[] = []
    const platform = platformWith({
      userinfoEndpoint: `${proxy.url}/me`,
      retry: { attempts: 1 },
      breaker: { failureThreshold: 2, coolDownMs: 10_000 },
      onEvent: (e) => events.push(e),
    })
    const tokens = [await newToken(platform), await newToken(platform), await newToken(platform, 'user_bob')]
    const burst = async () =>
      new Set((await Promise.all(Array.from({ length: 30 }, (_, i) => listTools(platform, tokens[i % 3]!)))).map((r) => r.status))
    expect(await statuses(platform, tokens[0]!, 1)).toEqual([503])
    expect(await statuses(platform, tokens[1]!, 1)).toEqual([503])
    expect(proxy.count('/me')).toBe(2)
    expect(await burst()).toEqual(new Set([503]))
    expect(proxy.count('/me')).toBe(2)

    clock.advance(10_000)
    // Concurrent callers with different tokens during the probe: exactly one reaches the server.
    expect(await burst()).toEqual(new Set([503]))
    expect(proxy.count('/me')).toBe(3)
    expect(await burst()).toEqual(new Set([503]))
    expect(proxy.count('/me')).toBe(3)
    const transitions = events.flatMap((e) => (e.type === 'breaker' ? [`${e.from}->${e.to}`] : []))
    expect(transitions).toEqual(['closed->open', 'open->half-open', 'half-open->open'])
  })
})
