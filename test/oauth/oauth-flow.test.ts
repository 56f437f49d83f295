/**
 * Spec 5.1 steps 1 to 7 end to end: the official MCP SDK client signs in against a real
 * authorization server (oidc-provider on 127.0.0.1, dynamic registration, PKCE) and reaches an
 * App of the reference platform over real HTTP, at `/`, `/v1` and the exact path; its token
 * expires (injected clock) and is refreshed. The same with the SDK v2 client
 * (`@modelcontextprotocol/client`, the SDK's line since MCP 2026-07-28), which checks more: the
 * issuer in the authorization response (RFC 9207), and that the code is redeemed at the
 * authorization server that minted it (SEP-2352).
 */
import {
  Client as ClientV2,
  type OAuthClientProvider as OAuthClientProviderV2,
  StreamableHTTPClientTransport as StreamableHTTPClientTransportV2,
  UnauthorizedError as UnauthorizedErrorV2,
} from '@modelcontextprotocol/client'
import { StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { type Platform, type PlatformSeed, createPlatform } from '../../examples/platform/index.js'
import { type ManualClock, createManualClock } from './helpers/clock.js'
import {
  type RecordedRequest,
  TestOAuthClient,
  connectWithOAuth,
  inProcessFetch,
  loopbackFetch,
  obtainAccessToken,
  recordingFetch,
  servePlatform,
} from './helpers/oauth-client.js'

const seed: PlatformSeed = {
  apps: [{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0', '1.1.1', '2.0.0'] }],
  users: [{ id: 'user_alice' }, { id: 'user_bob' }],
  subscriptions: [
    { userId: 'user_alice', appId: 'app_weather', active: true },
    { userId: 'user_bob', appId: 'app_weather', active: false },
  ],
}

const ACCESS_TOKEN_TTL_S = 600
const CACHE_TTL_MS = 300_000

let clock: ManualClock
let auth: DevAuthServer
let platform: Platform
let server: { port: number; close(): Promise<void> }
const asRequests: { method: string; path: string }[] = []
const userinfoCalls = () => asRequests.filter((r) => r.path === '/me').length
let appUrl: string

beforeAll(async () => {
  clock = createManualClock()
  auth = await startDevAuthServer({
    accounts: ['user_alice', 'user_bob'],
    now: clock,
    accessTokenTtlSeconds: ACCESS_TOKEN_TTL_S,
    onRequest: (r) => asRequests.push(r),
  })
  platform = createPlatform({ seed, now: clock, authorizationServer: { issuer: auth.issuer } })
  server = await servePlatform(platform.fetch)
  appUrl = `http://weather.localhost:${server.port}`
})

afterAll(async () => {
  await server?.close()
  await platform?.close()
  await auth?.close()
})

/**
 * Spec 5.1 step 7: `ms` later the token has expired at the authorization server and left the
 * validation cache, so the App answers 401 invalid_token; the client refreshes it and retries
 * on its own, with the new token.
 */
async function expectRefreshAfter(
  ms: number,
  callTool: (request: { name: string; arguments: Record<string, unknown> }) => Promise<unknown>,
  log: RecordedRequest[],
  provider: TestOAuthClient,
  version: string,
): Promise<void> {
  clock.advance(ms)
  const before = log.length
  const echoed = (await callTool({ name: 'echo', arguments: { text: 'after refresh' } })) as { content?: unknown }
  expect(echoed.content).toEqual([{ type: 'text', text: `after refresh (from weather ${version})` }])
  const retried = log.slice(before)
  expect(retried[0]).toMatchObject({ status: 401 })
  expect(retried[0]!.wwwAuthenticate).toContain('error="invalid_token"')
  expect(retried.some((r) => r.url.endsWith('/token') && /grant_type=refresh_token/.test(r.body ?? '') && r.status === 200)).toBe(true)
  expect(provider.savedTokens).toHaveLength(2)
  expect(provider.savedTokens[1]!.access_token).not.toBe(provider.savedTokens[0]!.access_token)
  expect(retried.at(-1)).toMatchObject({ status: 200, authorization: `Bearer ${provider.savedTokens[1]!.access_token}` })
}

describe('spec 5.1 with the MCP SDK client', () => {
  it.each([
    ['/', '2.0.0'],
    ['/v1', '1.1.1'],
    ['/v1.1.1', '1.1.1'],
  ])('signs in and calls a tool at %s, then refreshes an expired token', async (path, version) => {
    const url = appUrl + (path === '/' ? '/' : path)
    const provider = new TestOAuthClient({ loginHint: 'user_alice' })
    const fetchFn = recordingFetch(loopbackFetch)
    const userinfoBefore = userinfoCalls()

    const { client, transport } = await connectWithOAuth(url, provider, fetchFn)
    const log = fetchFn.log

    // Step 1: no token, 401 with the resource_metadata challenge.
    const first = log[0]!
    expect(first).toMatchObject({ method: 'POST', status: 401, authorization: null })
    expect(first.wwwAuthenticate).toBe(`Bearer resource_metadata="${appUrl}/.well-known/oauth-protected-resource"`)
    // Step 2: the metadata names the authorization server.
    const metadataIndex = log.findIndex((r) => r.url === `${appUrl}/.well-known/oauth-protected-resource`)
    expect(log[metadataIndex]?.status).toBe(200)
    // Step 3: discovery of the authorization server, registration, code exchange, all at the issuer.
    const atIssuer = log.filter((r) => r.url.startsWith(auth.issuer))
    expect(atIssuer.some((r) => r.url.includes('/.well-known/') && r.status === 200)).toBe(true)
    expect(atIssuer.some((r) => r.method === 'POST' && r.url.endsWith('/reg') && r.status === 201)).toBe(true)
    expect(atIssuer.some((r) => r.method === 'POST' && r.url.endsWith('/token') && /grant_type=authorization_code/.test(r.body ?? ''))).toBe(true)
    expect(provider.savedTokens).toHaveLength(1)
    // Step 4: after sign-in every request to the App carries the bearer.
    const afterSignIn = log.slice(log.findIndex((r) => r.url.endsWith('/token')) + 1).filter((r) => r.url.startsWith(appUrl))
    expect(afterSignIn.length).toBeGreaterThan(0)
    expect(afterSignIn.every((r) => r.authorization === `Bearer ${provider.savedTokens[0]!.access_token}`)).toBe(true)

    const result = await client.callTool({ name: 'get_version', arguments: {} })
    expect(result.structuredContent).toEqual({ app: 'weather', version })

    // Step 5: validated once at the authorization server's userinfo endpoint…
    expect(userinfoCalls() - userinfoBefore).toBe(1)
    // Step 6: …and from the cache for the next five minutes.
    clock.advance(CACHE_TTL_MS - 1)
    await client.callTool({ name: 'echo', arguments: { text: 'cached' } })
    await client.listTools()
    expect(userinfoCalls() - userinfoBefore).toBe(1)

    // Step 7: the token expires at the authorization server; once the cache entry is gone the
    // App answers 401 invalid_token and the client refreshes and retries on its own.
    await expectRefreshAfter(ACCESS_TOKEN_TTL_S * 1000, (arg) => client.callTool(arg), log, provider, version)
    // One userinfo call refused the old token, one accepted the new one.
    expect(userinfoCalls() - userinfoBefore).toBe(3)

    await transport.terminateSession().catch(() => {})
    await client.close()
  })

  it('answers 402 to an OAuth user without an active subscription, like an API token owner', async () => {
    const provider = new TestOAuthClient({ loginHint: 'user_bob' })
    const error = await connectWithOAuth(`${appUrl}/v1`, provider, loopbackFetch).then(
      () => undefined,
      (e: unknown) => e,
    )
    expect(error).toBeInstanceOf(StreamableHTTPError)
    expect((error as StreamableHTTPError).code).toBe(402)
    expect((error as Error).message).toContain('-32002')
  })

  it('lists the issuer in the protected-resource metadata', async () => {
    const res = await loopbackFetch(`${appUrl}/.well-known/oauth-protected-resource`)
    expect(res.status).toBe(200)
    expect(await res.json()).toMatchObject({ resource: appUrl, authorization_servers: [auth.issuer] })
  })
})

describe('the OAuth identity in subscription and rate limits', () => {
  it('shares the rate-limit counter of the user with their API tokens', async () => {
    const limited = createPlatform({
      seed: {
        ...seed,
        apps: [{ ...seed.apps[0]!, rateLimitPerMinute: 3 }],
        tokens: [{ name: 'alice', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 30 }],
      },
      now: clock,
      authorizationServer: { issuer: auth.issuer },
    })
    try {
      const fetchFn = inProcessFetch(limited.fetch)
      const { accessToken } = await obtainAccessToken('http://weather.localhost/v1', fetchFn, { loginHint: 'user_alice' })
      const call = (bearer: string) =>
        limited.fetch(
          new Request('http://weather.localhost/v1', {
            method: 'POST',
            headers: {
              authorization: `Bearer ${bearer}`,
              'content-type': 'application/json',
              accept: 'application/json, text/event-stream',
            },
            body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
          }),
        )
      const apiToken = limited.tokens.alice!
      const statuses = [
        (await call(apiToken)).status,
        (await call(accessToken)).status,
        (await call(apiToken)).status,
      ]
      expect(statuses).toEqual([200, 200, 200])
      const overOAuth = await call(accessToken)
      expect(overOAuth.status).toBe(429)
      expect(((await overOAuth.json()) as { error: { data: { limit: number } } }).error.data.limit).toBe(3)
      expect((await call(apiToken)).status).toBe(429)
    } finally {
      await limited.close()
    }
  })

  it('answers 402 to an OAuth token of an unsubscribed user on a direct request', async () => {
    const fetchFn = inProcessFetch(platform.fetch)
    const { accessToken } = await obtainAccessToken('http://weather.localhost/v1', fetchFn, { loginHint: 'user_bob' })
    const res = await platform.fetch(
      new Request('http://weather.localhost/v1', {
        method: 'POST',
        headers: { authorization: `Bearer ${accessToken}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
      }),
    )
    expect(res.status).toBe(402)
    expect(await res.json()).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32002, data: { error: 'payment_required' } } })
  })
})

describe('spec 5.1 with the SDK v2 client', () => {
  it.each([
    ['/v1', '1.1.1', undefined],
    ['/', '2.0.0', 'auto' as const],
  ])('signs in at %s (%s, negotiation %s), calls a tool, then refreshes an expired token', async (path, version, mode) => {
    const provider = new TestOAuthClient({ loginHint: 'user_alice' })
    const fetchFn = recordingFetch(loopbackFetch)
    const options = mode ? { versionNegotiation: { mode } } : undefined
    const open = () =>
      new StreamableHTTPClientTransportV2(new URL(appUrl + path), { authProvider: provider as unknown as OAuthClientProviderV2, fetch: fetchFn })

    const first = open()
    await expect(new ClientV2({ name: 'oauth-v2', version: '1.0.0' }, options).connect(first)).rejects.toBeInstanceOf(UnauthorizedErrorV2)
    const log = fetchFn.log
    expect(log[0]).toMatchObject({ status: 401, authorization: null })
    expect(log[0]!.wwwAuthenticate).toBe(`Bearer resource_metadata="${appUrl}/.well-known/oauth-protected-resource"`)
    expect(log.some((r) => r.url === `${appUrl}/.well-known/oauth-protected-resource` && r.status === 200)).toBe(true)
    // RFC 9207: the redirect names the issuer, which the v2 client checks against the metadata.
    expect(provider.callbackParams?.get('iss')).toBe(auth.issuer)
    await first.finishAuth(provider.callbackParams!)
    await first.close()

    const transport = open()
    const client = new ClientV2({ name: 'oauth-v2', version: '1.0.0' }, options)
    await client.connect(transport)
    try {
      const result = await client.callTool({ name: 'get_version', arguments: {} })
      expect(result.structuredContent).toEqual({ app: 'weather', version })
      const token = provider.savedTokens[0]!.access_token
      const toApp = log.slice(log.findIndex((r) => r.url.endsWith('/token')) + 1).filter((r) => r.url.startsWith(appUrl))
      expect(toApp.length).toBeGreaterThan(0)
      expect(toApp.every((r) => r.authorization === `Bearer ${token}`)).toBe(true)

      // Past the token's lifetime and the validation cache.
      await expectRefreshAfter(ACCESS_TOKEN_TTL_S * 1000 + CACHE_TTL_MS, (arg) => client.callTool(arg), log, provider, version)
    } finally {
      await client.close()
    }
  })
})
