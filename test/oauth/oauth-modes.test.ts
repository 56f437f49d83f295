/**
 * The validation modes against a real authorization server that binds tokens to the App they
 * were requested for (RFC 8707, as the MCP authorization spec asks): local JWT/JWKS
 * verification with a per-App audience, RFC 7662 introspection, and the caveat that such
 * tokens are refused at userinfo.
 */
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { decodeJwt } from 'jose'
import { type OAuthValidatorEvent, createOAuthValidator } from 'mcp-dispatch'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { type Platform, type PlatformOptions, type PlatformSeed, createPlatform } from '../../examples/platform/index.js'
import { type ManualClock, createManualClock } from './helpers/clock.js'
import {
  TestOAuthClient,
  connectWithOAuth,
  inProcessFetch,
  loopbackFetch,
  obtainAccessToken,
  recordingFetch,
  servePlatform,
} from './helpers/oauth-client.js'

const seed: PlatformSeed = {
  apps: [
    { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] },
    { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['1.0.0'] },
  ],
  users: [{ id: 'user_alice' }],
  subscriptions: [
    { userId: 'user_alice', appId: 'app_weather', active: true },
    { userId: 'user_alice', appId: 'app_notes', active: true },
  ],
}
const TTL_S = 600
const introspectionClient = { clientId: 'mcp-dispatch', clientSecret: 'dev-introspection-secret' }

let clock: ManualClock
let jwtServer: DevAuthServer
let opaqueServer: DevAuthServer
const jwtRequests: string[] = []
const opaqueRequests: string[] = []
const platforms: Platform[] = []

beforeAll(async () => {
  clock = createManualClock()
  jwtServer = await startDevAuthServer({
    accounts: ['user_alice'],
    now: clock,
    accessTokenTtlSeconds: TTL_S,
    resourceIndicators: { accessTokenFormat: 'jwt' },
    onRequest: (r) => jwtRequests.push(r.path),
  })
  opaqueServer = await startDevAuthServer({
    accounts: ['user_alice'],
    now: clock,
    accessTokenTtlSeconds: TTL_S,
    resourceIndicators: { accessTokenFormat: 'opaque' },
    introspectionClient,
    onRequest: (r) => opaqueRequests.push(r.path),
  })
})

afterAll(async () => {
  await Promise.all(platforms.map((p) => p.close()))
  await jwtServer?.close()
  await opaqueServer?.close()
})

function platformWith(authorizationServer: NonNullable<PlatformOptions['authorizationServer']>): Platform {
  const platform = createPlatform({ seed, now: clock, authorizationServer })
  platforms.push(platform)
  return platform
}

function listTools(platform: Platform, app: string, bearer: string): Promise<Response> {
  return platform.fetch(
    new Request(`http://${app}.localhost/v1`, {
      method: 'POST',
      headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    }),
  )
}

describe('jwt mode: local JWKS verification with the App as audience', () => {
  /** A platform in jwt mode over loopback, the weather App's `/v1`, and a new client. */
  async function serveJwtPlatform() {
    const platform = platformWith({ issuer: jwtServer.issuer, mode: 'jwt', audience: ({ resource }) => resource })
    const server = await servePlatform(platform.fetch)
    const url = `http://weather.localhost:${server.port}/v1`
    return { server, url, provider: new TestOAuthClient(), fetchFn: recordingFetch(loopbackFetch) }
  }

  it('runs the SDK flow with audience-bound JWTs, calls no userinfo, and refreshes after expiry', async () => {
    const { server, url, provider, fetchFn } = await serveJwtPlatform()
    try {
      const { client } = await connectWithOAuth(url, provider, fetchFn)
      const token = provider.tokens()!.access_token
      const claims = decodeJwt(token)
      expect(claims).toMatchObject({ iss: jwtServer.issuer, sub: 'user_alice', aud: `http://weather.localhost:${server.port}` })

      expect((await client.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual({ app: 'weather', version: '1.0.0' })
      expect(jwtRequests.filter((p) => p === '/me')).toHaveLength(0)
      expect(jwtRequests.filter((p) => p === '/jwks')).toHaveLength(1)

      // Expiry by the token's own exp, then the client refreshes.
      clock.advance(TTL_S * 1000)
      await client.callTool({ name: 'echo', arguments: { text: 'again' } })
      expect(provider.savedTokens).toHaveLength(2)
      expect(fetchFn.log.some((r) => r.status === 401 && r.wwwAuthenticate?.includes('error="invalid_token"'))).toBe(true)
      // Keys older than jwksMaxAgeMs (10 minutes by default) are fetched again, once.
      expect(jwtRequests.filter((p) => p === '/jwks')).toHaveLength(2)
      await client.close()
    } finally {
      await server.close()
    }
  })

  it('a client that redeems the code on a fresh transport (no 401 seen) asks for the same resource: one App, one resource', async () => {
    // A web client signs in on one transport and redeems the code on another (its callback
    // page): that one discovers the metadata from /v1 itself. Both must name the same resource,
    // or the authorization server refuses the code (invalid_target).
    const { server, url, provider, fetchFn } = await serveJwtPlatform()
    try {
      const first = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: fetchFn })
      await expect(new Client({ name: 'web', version: '1.0.0' }).connect(first)).rejects.toBeInstanceOf(UnauthorizedError)
      await first.close()
      expect(provider.code).toBeDefined()

      // The callback keeps the client registration and the PKCE verifier, not the discovery.
      provider.discoveryStateValue = undefined
      const seen = fetchFn.log.length
      const callback = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: fetchFn })
      await callback.finishAuth(provider.code!)
      expect(decodeJwt(provider.tokens()!.access_token).aud).toBe(`http://weather.localhost:${server.port}`)
      // It found the App's one metadata document after the 404 of the path-suffixed one.
      const discovery = fetchFn.log.slice(seen).filter((r) => r.url.includes('/.well-known/oauth-protected-resource'))
      expect(discovery.map((r) => [new URL(r.url).pathname, r.status])).toContainEqual(['/.well-known/oauth-protected-resource/v1', 404])
      const client = new Client({ name: 'web', version: '1.0.0' })
      await client.connect(new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: fetchFn }))
      expect((await client.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual({ app: 'weather', version: '1.0.0' })
      await client.close()
    } finally {
      await server.close()
    }
  })

  it('refuses a token issued for one App at another App of the same platform', async () => {
    const platform = platformWith({ issuer: jwtServer.issuer, mode: 'jwt', audience: ({ resource }) => resource })
    const { accessToken } = await obtainAccessToken('http://weather.localhost/v1', inProcessFetch(platform.fetch))
    expect((await listTools(platform, 'weather', accessToken)).status).toBe(200)
    const elsewhere = await listTools(platform, 'notes', accessToken)
    expect(elsewhere.status).toBe(401)
    expect(elsewhere.headers.get('www-authenticate')).toContain('error="invalid_token"')
  })
})

describe('introspection mode (RFC 7662)', () => {
  it('validates opaque audience-bound tokens by introspection, once per cache window, bounded by exp', async () => {
    const platform = platformWith({
      issuer: opaqueServer.issuer,
      mode: 'introspection',
      introspection: introspectionClient,
      audience: ({ resource }) => resource,
    })
    const introspections = () => opaqueRequests.filter((p) => p === '/token/introspection').length
    const { accessToken } = await obtainAccessToken('http://weather.localhost/v1', inProcessFetch(platform.fetch))
    const before = introspections()
    const replies = await Promise.all(Array.from({ length: 50 }, () => listTools(platform, 'weather', accessToken)))
    expect(new Set(replies.map((r) => r.status))).toEqual(new Set([200]))
    expect(introspections() - before).toBe(1)
    // Bound to weather: notes refuses it (the audience came from the introspection answer).
    expect((await listTools(platform, 'notes', accessToken)).status).toBe(401)
    // The cache never outlives the token: at its exp the platform asks again and is told no.
    // (exp has whole seconds: a second before the TTL ends is before it, the TTL's end after.)
    clock.advance(TTL_S * 1000 - 1000)
    expect((await listTools(platform, 'weather', accessToken)).status).toBe(200)
    expect(introspections() - before).toBe(2)
    clock.advance(1000)
    expect((await listTools(platform, 'weather', accessToken)).status).toBe(401)
  })
})

describe('userinfo mode and resource indicators (the caveat in docs/oauth.md)', () => {
  it('gets 401 for audience-bound tokens (the provider refuses them at userinfo), 200 without a resource; onEvent shows it as the page says', async () => {
    const events: OAuthValidatorEvent[] = []
    const platform = platformWith({ issuer: opaqueServer.issuer, onEvent: (event) => void events.push(event) })
    const fetchFn = inProcessFetch(platform.fetch)
    const bound = await obtainAccessToken('http://weather.localhost/v1', fetchFn)
    const reply = await listTools(platform, 'weather', bound.accessToken)
    expect(reply.status).toBe(401)
    // "How it shows" in docs/oauth.md: the fresh token's userinfo call answered, with 401.
    expect(events.filter((e) => e.type === 'upstream' && e.endpoint === 'userinfo')).toEqual([
      { type: 'upstream', endpoint: 'userinfo', outcome: 'ok', status: 401, durationMs: expect.any(Number) },
    ])
    const unbound = await obtainAccessToken('http://weather.localhost/v1', fetchFn, { omitResource: true })
    expect((await listTools(platform, 'weather', unbound.accessToken)).status).toBe(200)
  })

  it('turns the SDK client\'s sign-in into the 401 loop the page describes: refused after it signed in and refreshed', async () => {
    const platform = platformWith({ issuer: opaqueServer.issuer })
    const server = await servePlatform(platform.fetch)
    try {
      const provider = new TestOAuthClient()
      const signIn = connectWithOAuth(`http://weather.localhost:${server.port}/v1`, provider, recordingFetch(loopbackFetch))
      await expect(signIn).rejects.toThrow('Server returned 401 after successful authentication')
      // It signed in (a code redeemed), then got a fresh token by refreshing, and both were refused.
      expect(provider.savedTokens).toHaveLength(2)
    } finally {
      await server.close()
    }
  })
})

describe('the reference platform given a validator of its own (`oauth`)', () => {
  it("names the validator's issuer in the metadata; a validator that names none needs authorizationServer beside it", async () => {
    const issuer = 'https://auth.example.com'
    const platform = createPlatform({ seed, now: clock, oauth: createOAuthValidator({ issuer }) })
    platforms.push(platform)
    const metadata = await platform.fetch(new Request('http://weather.localhost/.well-known/oauth-protected-resource'), { clientAddress: '127.0.0.1' })
    expect(metadata.status).toBe(200)
    expect((await metadata.json()).authorization_servers).toEqual([issuer])
    const nameless = { validate: async () => ({ active: false as const, reason: 'refused' }) }
    expect(() => createPlatform({ seed, now: clock, oauth: nameless })).toThrow(/authorizationServers/)
  })
})
