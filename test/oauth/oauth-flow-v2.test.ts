/**
 * Spec 5.1 with the official SDK v2 client (`@modelcontextprotocol/client`, the SDK's stable
 * line since MCP 2026-07-28): it meets the App's 401, reads `resource_metadata`, signs in at
 * a real authorization server (oidc-provider on 127.0.0.1, dynamic registration, PKCE), and
 * reaches the App of the reference platform with its access token; the token expires and is
 * refreshed. The v2 client checks more than v1 (the issuer of the authorization server
 * metadata, the `resource` the metadata names), so this is the flow of today's clients.
 */
import {
  Client,
  type OAuthClientProvider,
  StreamableHTTPClientTransport,
  UnauthorizedError,
} from '@modelcontextprotocol/client'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { type Platform, type PlatformSeed, createPlatform } from '../../examples/platform/index.js'
import { type ManualClock, createManualClock } from './helpers/clock.js'
import { TestOAuthClient, loopbackFetch, recordingFetch, servePlatform } from './helpers/oauth-client.js'

const seed: PlatformSeed = {
  apps: [{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0', '2.0.0'] }],
  users: [{ id: 'user_alice' }],
  subscriptions: [{ userId: 'user_alice', appId: 'app_weather', active: true }],
}
const ACCESS_TOKEN_TTL_S = 600
const CACHE_TTL_MS = 300_000

let clock: ManualClock
let auth: DevAuthServer
let platform: Platform
let server: { port: number; close(): Promise<void> }
let appUrl: string

beforeAll(async () => {
  clock = createManualClock()
  auth = await startDevAuthServer({ accounts: ['user_alice'], now: clock, accessTokenTtlSeconds: ACCESS_TOKEN_TTL_S })
  platform = createPlatform({ seed, now: clock, authorizationServer: { issuer: auth.issuer } })
  server = await servePlatform(platform.fetch)
  appUrl = `http://weather.localhost:${server.port}`
})

afterAll(async () => {
  await server?.close()
  await platform?.close()
  await auth?.close()
})

describe('spec 5.1 with the SDK v2 client', () => {
  it.each([
    ['/v1', '1.1.0', undefined],
    ['/', '2.0.0', 'auto' as const],
  ])('signs in at %s (%s, negotiation %s), calls a tool, then refreshes an expired token', async (path, version, mode) => {
    const provider = new TestOAuthClient({ loginHint: 'user_alice' })
    const fetchFn = recordingFetch(loopbackFetch)
    const options = mode ? { versionNegotiation: { mode } } : undefined
    const open = () =>
      new StreamableHTTPClientTransport(new URL(appUrl + path), { authProvider: provider as unknown as OAuthClientProvider, fetch: fetchFn })

    const first = open()
    await expect(new Client({ name: 'oauth-v2', version: '1.0.0' }, options).connect(first)).rejects.toBeInstanceOf(UnauthorizedError)
    const log = fetchFn.log
    expect(log[0]).toMatchObject({ status: 401, authorization: null })
    expect(log[0]!.wwwAuthenticate).toBe(`Bearer resource_metadata="${appUrl}/.well-known/oauth-protected-resource"`)
    expect(log.some((r) => r.url === `${appUrl}/.well-known/oauth-protected-resource` && r.status === 200)).toBe(true)
    // RFC 9207: the redirect names the issuer, which the v2 client checks against the metadata.
    expect(provider.callbackParams?.get('iss')).toBe(auth.issuer)
    await first.finishAuth(provider.callbackParams!)
    await first.close()

    const transport = open()
    const client = new Client({ name: 'oauth-v2', version: '1.0.0' }, options)
    await client.connect(transport)
    try {
      const result = await client.callTool({ name: 'get_version', arguments: {} })
      expect(result.structuredContent).toEqual({ app: 'weather', version })
      const token = provider.savedTokens[0]!.access_token
      const toApp = log.slice(log.findIndex((r) => r.url.endsWith('/token')) + 1).filter((r) => r.url.startsWith(appUrl))
      expect(toApp.length).toBeGreaterThan(0)
      expect(toApp.every((r) => r.authorization === `Bearer ${token}`)).toBe(true)

      // Past the token's lifetime and the validation cache: 401 invalid_token, refresh, retry.
      clock.advance(ACCESS_TOKEN_TTL_S * 1000 + CACHE_TTL_MS)
      const before = log.length
      const echoed = await client.callTool({ name: 'echo', arguments: { text: 'after refresh' } })
      expect(echoed.content).toEqual([{ type: 'text', text: `after refresh (from weather ${version})` }])
      const retried = log.slice(before)
      expect(retried[0]).toMatchObject({ status: 401 })
      expect(retried[0]!.wwwAuthenticate).toContain('error="invalid_token"')
      expect(retried.some((r) => r.url.endsWith('/token') && /grant_type=refresh_token/.test(r.body ?? ''))).toBe(true)
      expect(provider.savedTokens).toHaveLength(2)
      expect(retried.at(-1)).toMatchObject({ status: 200, authorization: `Bearer ${provider.savedTokens[1]!.access_token}` })
    } finally {
      await client.close()
    }
  })
})
