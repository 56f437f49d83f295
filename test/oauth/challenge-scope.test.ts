/**
 * `challengeScope`: the 401's challenge names the scopes the App needs (MCP authorization
 * 2025-11-25, "Protected Resource Metadata Discovery Requirements": servers SHOULD; clients
 * ask for the challenge's `scope` before the metadata's `scopes_supported`). End to end with
 * the official MCP SDK client signing in at a real authorization server (oidc-provider on
 * 127.0.0.1): it asks for, and is granted, the challenge's scopes, not every supported one.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import {
  ConfigurationError,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createOAuthValidator,
  createTokenService,
} from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { type WebMcpSessions, createWebMcpHandler } from '../adapters/mcp.js'
import { TestOAuthClient, connectWithOAuth, loopbackFetch, recordingFetch, servePlatform } from './helpers/oauth-client.js'

function stores() {
  const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'user_alice', appId: 'app_weather', active: true }])
  return { apps, subscriptions, tokens: createTokenService({ store: createMemoryTokenStore(), apps, subscriptions }) }
}

const METADATA = 'http://weather.localhost/.well-known/oauth-protected-resource'

describe('challengeScope', () => {
  it('names the scopes in the 401 challenge, beside resource_metadata and before error', async () => {
    const handle = mcpDispatch({
      dispatcher: { ...stores(), authorizationServers: ['https://auth.example.com'], challengeScope: ['openid', 'mcp:tools'] },
      handler: () => new Response('{}'),
    })
    const missing = await handle(new Request('http://weather.localhost/', { method: 'POST' }))
    expect(missing.status).toBe(401)
    expect(missing.headers.get('www-authenticate')).toBe(`Bearer resource_metadata="${METADATA}", scope="openid mcp:tools"`)
    const refused = await handle(new Request('http://weather.localhost/', { method: 'POST', headers: { authorization: 'Bearer svc_nope' } }))
    expect(refused.status).toBe(401)
    expect(refused.headers.get('www-authenticate')).toBe(`Bearer resource_metadata="${METADATA}", scope="openid mcp:tools", error="invalid_token"`)
    // The metadata document is unchanged: scopes_supported stays the list of every scope.
    const metadata = await handle(new Request(METADATA))
    expect(((await metadata.json()) as { scopes_supported: string[] }).scopes_supported).toEqual(['openid', 'profile', 'email'])
  })

  it('is left out by default, and for null (a config loader\'s unset value): the challenge of spec 5.1', async () => {
    for (const challengeScope of [undefined, null]) {
      const handle = mcpDispatch({ dispatcher: { ...stores(), authorizationServers: ['https://auth.example.com'], challengeScope }, handler: () => new Response('{}') })
      const missing = await handle(new Request('http://weather.localhost/', { method: 'POST' }))
      expect(missing.headers.get('www-authenticate')).toBe(`Bearer resource_metadata="${METADATA}"`)
    }
  })

  it('refuses what is no list of scope names, naming the option', () => {
    for (const challengeScope of [[], ['openid profile'], ['a"b'], ['a\\b'], [''], [42], 'openid', ['ok', 'é']]) {
      expect(() => createDispatcher({ ...stores(), challengeScope: challengeScope as never }), JSON.stringify(challengeScope)).toThrow(ConfigurationError)
      expect(() => createDispatcher({ ...stores(), challengeScope: challengeScope as never })).toThrow(/challengeScope/)
    }
    // With a validator in userinfo mode (the spec's), `openid` must be among them: clients ask for
    // these alone, and the userinfo endpoint refuses a token granted without it.
    const userinfo = createOAuthValidator({ issuer: 'https://auth.example.com' })
    expect(() => createDispatcher({ ...stores(), oauth: userinfo, challengeScope: ['mcp:tools'] })).toThrow(/challengeScope.*openid/)
    expect(() => createDispatcher({ ...stores(), oauth: userinfo, challengeScope: ['openid', 'mcp:tools'] })).not.toThrow()
    const jwt = createOAuthValidator({ issuer: 'https://auth.example.com', mode: 'jwt', jwks: 'https://auth.example.com/jwks', audience: false })
    expect(() => createDispatcher({ ...stores(), oauth: jwt, challengeScope: ['mcp:tools'] })).not.toThrow()
    // A copy is taken: changing the array later changes nothing.
    const scopes = ['openid', 'openid'] // a name twice is named once
    const handle = mcpDispatch({ dispatcher: { ...stores(), challengeScope: scopes }, handler: () => new Response('{}') })
    scopes.push('a"b')
    return handle(new Request('http://weather.localhost/', { method: 'POST' })).then((res) => {
      expect(res.headers.get('www-authenticate')).toBe(`Bearer resource_metadata="${METADATA}", scope="openid"`)
    })
  })
})

describe('challengeScope with the MCP SDK client and a real authorization server', () => {
  let auth: DevAuthServer
  let server: { port: number; close(): Promise<void> }
  let app: WebMcpSessions

  beforeAll(async () => {
    auth = await startDevAuthServer({ accounts: ['user_alice'] })
    app = createWebMcpHandler(() => {
      const mcp = new McpServer({ name: 'weather', version: '1.0.0' })
      mcp.registerTool('whoami', { description: 'The caller', inputSchema: {} }, async () => ({ content: [{ type: 'text', text: 'weather' }] }))
      return mcp
    })
    const handle = mcpDispatch({
      dispatcher: {
        ...stores(),
        oauth: createOAuthValidator({ issuer: auth.issuer }),
        // Everything the authorization server offers is supported; the App needs less.
        scopesSupported: ['openid', 'profile', 'email'],
        challengeScope: ['openid', 'profile'],
      },
      handler: (request) => app.handle(request),
    })
    server = await servePlatform((request, info) => handle(request, info))
  })

  afterAll(async () => {
    await server?.close()
    await app?.close()
    await auth?.close()
  })

  it('asks for the challenge scopes, is granted those, and reaches the App', async () => {
    const authorizationUrls: URL[] = []
    const provider = new (class extends TestOAuthClient {
      override async redirectToAuthorization(url: URL): Promise<void> {
        authorizationUrls.push(new URL(url))
        await super.redirectToAuthorization(url)
      }
    })({ loginHint: 'user_alice' })
    const fetchFn = recordingFetch(loopbackFetch)
    const url = `http://weather.localhost:${server.port}/`
    const { client, transport } = await connectWithOAuth(url, provider, fetchFn)

    expect(fetchFn.log[0]).toMatchObject({ status: 401 })
    expect(fetchFn.log[0]!.wwwAuthenticate).toContain('scope="openid profile"')
    expect(authorizationUrls).toHaveLength(1)
    expect(authorizationUrls[0]!.searchParams.get('scope')).toBe('openid profile')
    expect(provider.savedTokens[0]!.scope?.split(' ').sort()).toEqual(['openid', 'profile'])

    const result = await client.callTool({ name: 'whoami', arguments: {} })
    expect(result.content).toEqual([{ type: 'text', text: 'weather' }])
    await transport.terminateSession().catch(() => {})
    await client.close()
  })
})
