/**
 * Audit of the OAuth path with real MCP clients against the reference platform and a real
 * authorization server (oidc-provider), over real sockets on 127.0.0.1:
 *
 * - the SDK client's whole flow from a bare 401, and the RFC 8707 `resource` it ends up
 *   sending (authorization and token requests) against the metadata's `resource` and the
 *   audience the validator requires, at `/`, `/v1` and an exact version;
 * - an access token that expires in the middle of a session: refresh, retry, and the session's
 *   version pin surviving a deploy;
 * - tokens the validator must refuse (another resource, expired, not yet valid, another issuer,
 *   alg none, HS256 keyed with the public key): 401 with the challenge, never 500.
 */
import { execFile } from 'node:child_process'
import { type OAuthClientProvider, UnauthorizedError, auth, createMCPClient } from '@ai-sdk/mcp'
import {
  Client as ClientV2,
  type OAuthClientProvider as OAuthClientProviderV2,
  StreamableHTTPClientTransport as StreamableHTTPClientTransportV2,
  UnauthorizedError as UnauthorizedErrorV2,
} from '@modelcontextprotocol/client'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import {
  discoverAuthorizationServerMetadata,
  exchangeAuthorization,
  registerClient,
  startAuthorization,
} from '@modelcontextprotocol/sdk/client/auth.js'
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { type JWK, SignJWT, decodeJwt, exportJWK, exportSPKI, generateKeyPair } from 'jose'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { type Platform, type PlatformSeed, createPlatform } from '../../examples/platform/index.js'
import { INSPECTOR_CLI, RESOLVE_LOCALHOST, connectMcpRemoteOAuth } from '../helpers/audit-shared.js'
import { freePort } from '../helpers/free-port.js'
import { type ServedFetch, localhostFetch, mcpRequest, serveFetch } from '../helpers/platform.js'
import { type ManualClock, createManualClock } from './helpers/clock.js'
import {
  type FetchLike,
  type RecordedRequest,
  TestOAuthClient,
  connectWithOAuth,
  followSignIn,
  obtainAccessToken,
  recordingFetch,
} from './helpers/oauth-client.js'

const seed: PlatformSeed = {
  apps: [
    { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0', '1.1.1', '2.0.0'] },
    { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['1.0.0'] },
  ],
  users: [{ id: 'user_alice' }],
  subscriptions: [
    { userId: 'user_alice', appId: 'app_weather', active: true },
    { userId: 'user_alice', appId: 'app_notes', active: true },
  ],
  tokens: [{ name: 'alice', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 30 }],
}
const TTL_S = 60

/** A TestOAuthClient that keeps every authorization URL it was sent to. */
class RecordingOAuthClient extends TestOAuthClient {
  readonly authorizationUrls: URL[] = []
  override async redirectToAuthorization(authorizationUrl: URL): Promise<void> {
    this.authorizationUrls.push(new URL(authorizationUrl))
    return super.redirectToAuthorization(authorizationUrl)
  }
}

let clock: ManualClock
let jwtAuth: DevAuthServer
let userinfoAuth: DevAuthServer
let jwtPlatform: Platform
let userinfoPlatform: Platform
let jwtServed: ServedFetch
let userinfoServed: ServedFetch
let opaqueAuth: DevAuthServer
let introspectionPlatform: Platform
let introspectionServed: ServedFetch

/** A development authorization server for user_alice, on the shared clock, its access tokens living TTL_S. */
const startAuthServer = (options: Partial<Parameters<typeof startDevAuthServer>[0]> = {}) =>
  startDevAuthServer({ accounts: ['user_alice'], now: clock, accessTokenTtlSeconds: TTL_S, ...options })

/** Serves `platform` on 127.0.0.1, on a port of the system's choosing. */
const serve = (platform: Platform) => serveFetch((request, info) => platform.fetch(request, info))

beforeAll(async () => {
  clock = createManualClock()
  jwtAuth = await startAuthServer({ resourceIndicators: { accessTokenFormat: 'jwt' } })
  userinfoAuth = await startAuthServer()
  // jwt mode as `npm start` runs it with AUTH_MODE=jwt: each App's own address is the audience.
  jwtPlatform = createPlatform({ seed, now: clock, authorizationServer: { issuer: jwtAuth.issuer, mode: 'jwt' } })
  userinfoPlatform = createPlatform({ seed, now: clock, authorizationServer: { issuer: userinfoAuth.issuer } })
  jwtServed = await serve(jwtPlatform)
  userinfoServed = await serve(userinfoPlatform)
  const introspection = { clientId: 'mcp-dispatch', clientSecret: 'audit-introspection-secret' }
  opaqueAuth = await startAuthServer({ resourceIndicators: { accessTokenFormat: 'opaque' }, introspectionClient: introspection })
  introspectionPlatform = createPlatform({
    seed,
    now: clock,
    authorizationServer: { issuer: opaqueAuth.issuer, mode: 'introspection', introspection },
  })
  introspectionServed = await serve(introspectionPlatform)
})

afterAll(async () => {
  // Each server before the platform it serves, each platform before its authorization server.
  const started = [jwtServed, userinfoServed, introspectionServed, introspectionPlatform, opaqueAuth, jwtPlatform, userinfoPlatform, jwtAuth, userinfoAuth]
  for (const open of started) await open?.close()
})

/** The Apps through `localhostFetch` (real sockets, `*.localhost` looked up as loopback), the rest through Node's. */
const appFetch: FetchLike = (input, init) =>
  new URL(String(input)).hostname.endsWith('.localhost') ? localhostFetch(input, init) : fetch(input, init)

const jwtApp = () => `http://weather.localhost:${jwtServed.port}`
const userinfoApp = () => `http://weather.localhost:${userinfoServed.port}`

/** The challenge of a 401 to a token presented and refused, at the App `app` (its origin). */
const invalidTokenChallenge = (app: string) => `Bearer resource_metadata="${app}/.well-known/oauth-protected-resource", error="invalid_token"`

/** `tools/list` posted to the App `app` (its origin) at `/v1` with `token` as bearer. */
const postToolsList = (app: string, token: string) => localhostFetch(mcpRequest(`${app}/v1`, { token }))

/** The first request in `log` to a token endpoint with `grant_type=<grant>`. */
const tokenRequest = (log: readonly RecordedRequest[], grant: 'authorization_code' | 'refresh_token') =>
  log.find((r) => r.url.endsWith('/token') && (r.body ?? '').includes(`grant_type=${grant}`))

/** Ends the client's session (`DELETE`, whatever it answers) and closes it. */
async function endSession(client: Client, transport: StreamableHTTPClientTransport): Promise<void> {
  await transport.terminateSession().catch(() => {})
  await client.close()
}

describe('the SDK client from a bare 401 (jwt mode, audience-bound tokens): the resource it sends', () => {
  it.each([
    ['/', '2.0.0'],
    ['/v1', '1.1.1'],
    ['/v1.1.1', '1.1.1'],
    ['/v1/', '1.1.1'],
  ])('at %s: resource in the authorization and token requests = the metadata resource = the token audience', async (path, version) => {
    const url = jwtApp() + path
    const provider = new RecordingOAuthClient({ loginHint: 'user_alice' })
    const fetchFn = recordingFetch(appFetch)
    const { client, transport } = await connectWithOAuth(url, provider, fetchFn)
    try {
      const log = fetchFn.log
      expect(log[0]).toMatchObject({ method: 'POST', status: 401, authorization: null })
      expect(log[0]!.wwwAuthenticate).toBe(`Bearer resource_metadata="${jwtApp()}/.well-known/oauth-protected-resource"`)
      const metadata = (await (await appFetch(`${jwtApp()}/.well-known/oauth-protected-resource`)).json()) as { resource: string }
      expect(metadata.resource).toBe(jwtApp())

      expect(provider.authorizationUrls).toHaveLength(1)
      const authorization = provider.authorizationUrls[0]!
      expect(authorization.searchParams.get('code_challenge_method')).toBe('S256')
      const sentResource = authorization.searchParams.get('resource')
      const tokenRequest = log.find((r) => r.url.startsWith(jwtAuth.issuer) && r.url.endsWith('/token'))!
      const tokenResource = new URLSearchParams(tokenRequest.body ?? '').get('resource')
      expect(tokenResource).toBe(sentResource)
      // The same resource as the metadata's, whichever version path was called (one App, one
      // protected resource): compared as URLs, since the SDK sends `new URL(resource).href`.
      expect(new URL(sentResource!).href).toBe(new URL(metadata.resource).href)
      const { aud } = decodeJwt(provider.tokens()!.access_token)
      expect(aud).toBe(sentResource)

      expect((await client.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual({ app: 'weather', version })
    } finally {
      await endSession(client, transport)
    }
  })
})

describe('the SDK v2 client (@modelcontextprotocol/client) in jwt mode: the resource it sends', () => {
  it.each([
    ['/', undefined],
    ['/v1.1.1', undefined],
    ['/v1', 'auto' as const],
  ])('at %s (negotiation %s): resource = the metadata resource = the audience, through a refresh', async (path, mode) => {
    const provider = new RecordingOAuthClient({ loginHint: 'user_alice' })
    const fetchFn = recordingFetch(appFetch)
    const options = mode ? { versionNegotiation: { mode } } : undefined
    const open = () =>
      new StreamableHTTPClientTransportV2(new URL(jwtApp() + path), { authProvider: provider as unknown as OAuthClientProviderV2, fetch: fetchFn })
    const first = open()
    await expect(new ClientV2({ name: 'v2', version: '1.0.0' }, options).connect(first)).rejects.toBeInstanceOf(UnauthorizedErrorV2)
    await first.finishAuth(provider.callbackParams!)
    await first.close()
    const sent = provider.authorizationUrls[0]!.searchParams.get('resource')
    expect(new URL(sent!).href).toBe(new URL(jwtApp()).href)
    const redeemed = tokenRequest(fetchFn.log, 'authorization_code')!
    expect(new URLSearchParams(redeemed.body!).get('resource')).toBe(sent)
    expect(decodeJwt(provider.tokens()!.access_token).aud).toBe(sent)

    const client = new ClientV2({ name: 'v2', version: '1.0.0' }, options)
    await client.connect(open())
    try {
      const version = (await client.callTool({ name: 'get_version', arguments: {} })).structuredContent as { version: string }
      clock.advance(TTL_S * 1000)
      expect((await client.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual(version)
      expect(tokenRequest(fetchFn.log, 'refresh_token')?.status).toBe(200)
      expect(decodeJwt(provider.tokens()!.access_token).aud).toBe(sent)
    } finally {
      await client.close()
    }
  })
})

describe('an access token that expires in the middle of a session', () => {
  it.each([
    ['userinfo', (): string => userinfoApp(), (): Platform => userinfoPlatform, '1.2.0'],
    ['jwt', (): string => jwtApp(), (): Platform => jwtPlatform, '1.3.0'],
    ['introspection', (): string => `http://weather.localhost:${introspectionServed.port}`, (): Platform => introspectionPlatform, '1.4.0'],
  ] as const)('%s mode: the client refreshes and retries in the same session, whose pin holds across a deploy', async (_mode, app, platform, deployed) => {
    const provider = new RecordingOAuthClient({ loginHint: 'user_alice' })
    const fetchFn = recordingFetch(appFetch)
    const { client, transport } = await connectWithOAuth(`${app()}/v1`, provider, fetchFn)
    try {
      const sessionId = transport.sessionId
      expect(sessionId).toEqual(expect.any(String))
      expect((await client.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual({ app: 'weather', version: '1.1.1' })
      platform().deploy('app_weather', deployed)

      // Past the token's lifetime: in jwt and introspection modes the validation cache keeps no
      // answer past the token's exp; in userinfo mode an opaque token's answer is kept for the
      // spec's 5 minutes (section 5.1 step 6), so past those too.
      clock.advance(TTL_S * 1000 + (_mode === 'userinfo' ? 300_000 : 0))
      const before = fetchFn.log.length
      expect((await client.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual({ app: 'weather', version: '1.1.1' })
      const after = fetchFn.log.slice(before)
      expect(after[0]).toMatchObject({ status: 401 })
      expect(after[0]!.wwwAuthenticate).toContain('error="invalid_token"')
      expect(tokenRequest(after, 'refresh_token')?.status).toBe(200)
      expect(provider.savedTokens).toHaveLength(2)
      expect(transport.sessionId).toBe(sessionId)
      if (_mode === 'jwt') {
        // The refreshed token is for the same resource (RFC 8707 section 2.2).
        expect(decodeJwt(provider.savedTokens[1]!.access_token).aud).toBe(decodeJwt(provider.savedTokens[0]!.access_token).aud)
      }
      // A new session of the same client sees the deploy.
      const fresh = new Client({ name: 'fresh', version: '1.0.0' })
      await fresh.connect(new StreamableHTTPClientTransport(new URL(`${app()}/v1`), { authProvider: provider, fetch: fetchFn }))
      expect((await fresh.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual({ app: 'weather', version: deployed })
      await fresh.close()
    } finally {
      await endSession(client, transport)
    }
  })
})

describe('tokens the jwt-mode validator must refuse: 401 with the challenge, never 500', () => {
  const ISSUER = 'https://auth.example.test'
  let platform: Platform
  let served: ServedFetch
  let privateKey: CryptoKey
  let publicJwk: JWK
  let publicPem: string
  const origin = () => `http://weather.localhost:${served.port}`

  beforeAll(async () => {
    const pair = await generateKeyPair('RS256', { extractable: true })
    privateKey = pair.privateKey
    publicJwk = { ...(await exportJWK(pair.publicKey)), kid: 'k1', alg: 'RS256', use: 'sig' }
    publicPem = await exportSPKI(pair.publicKey)
    platform = createPlatform({ seed, now: clock, authorizationServer: { issuer: ISSUER, mode: 'jwt', jwks: { keys: [publicJwk] } } })
    served = await serve(platform)
  })
  afterAll(async () => {
    await served?.close()
    await platform?.close()
  })

  const nowS = () => Math.floor(clock() / 1000)
  const sign = (claims: Record<string, unknown>, header: Record<string, unknown> = {}) =>
    new SignJWT({ sub: 'user_alice', ...claims })
      .setProtectedHeader({ alg: 'RS256', typ: 'at+jwt', kid: 'k1', ...header })
      .sign(privateKey)
  const base = () => ({ iss: ISSUER, aud: origin(), iat: nowS(), exp: nowS() + 600 })
  const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')

  /** Connects the SDK client with `token` in its headers; answers the HTTP status it failed with, or 200. */
  async function connectWith(token: string): Promise<number> {
    const client = new Client({ name: 'bearer', version: '1.0.0' })
    const transport = new StreamableHTTPClientTransport(new URL(`${origin()}/v1`), {
      fetch: appFetch,
      requestInit: { headers: { authorization: `Bearer ${token}` } },
    })
    try {
      await client.connect(transport)
      await client.listTools()
      return 200
    } catch (error) {
      if (error instanceof StreamableHTTPError && typeof error.code === 'number') return error.code
      throw error
    } finally {
      await endSession(client, transport)
    }
  }

  it('a good token passes (the baseline)', async () => {
    expect(await connectWith(await sign(base()))).toBe(200)
  })

  it.each([
    ['another App of the platform', () => sign({ ...base(), aud: `http://notes.localhost:${served.port}` })],
    ['another service', () => sign({ ...base(), aud: 'https://api.example.test' })],
    ['no audience', () => sign({ ...base(), aud: undefined })],
    ['the App at another port', () => sign({ ...base(), aud: `http://weather.localhost:1` })],
    ['expired', () => sign({ ...base(), iat: nowS() - 700, exp: nowS() - 100 })],
    ['expiring this very second', () => sign({ ...base(), exp: nowS() })],
    ['not yet valid', () => sign({ ...base(), nbf: nowS() + 100 })],
    ['another issuer', () => sign({ ...base(), iss: 'https://evil.example.test' })],
    ['no issuer', () => sign({ ...base(), iss: undefined })],
    ['no exp', () => sign({ ...base(), exp: undefined })],
    ['an ID token type', () => sign(base(), { typ: 'id_token+jwt' })],
    ['alg none', async () => `${b64({ alg: 'none', typ: 'at+jwt' })}.${b64({ sub: 'user_alice', ...base() })}.`],
    ['HS256 keyed with the PEM public key', () =>
      new SignJWT({ sub: 'user_alice', ...base() }).setProtectedHeader({ alg: 'HS256', typ: 'at+jwt', kid: 'k1' }).sign(new TextEncoder().encode(publicPem))],
    ['HS256 keyed with the JWK public key', () =>
      new SignJWT({ sub: 'user_alice', ...base() }).setProtectedHeader({ alg: 'HS256', typ: 'at+jwt', kid: 'k1' }).sign(new TextEncoder().encode(JSON.stringify(publicJwk)))],
    ['a foreign key', async () => {
      const other = await generateKeyPair('RS256')
      return new SignJWT({ sub: 'user_alice', ...base() }).setProtectedHeader({ alg: 'RS256', typ: 'at+jwt', kid: 'k1' }).sign(other.privateKey)
    }],
    ['a payload changed after signing', async () => {
      const [header, , signature] = (await sign(base())).split('.')
      return `${header}.${b64({ sub: 'user_bob', ...base() })}.${signature}`
    }],
    ['not a JWT', async () => 'opaque-string-not-a-jwt'],
    // RFC 9449 section 6.1 / RFC 8705 section 3.1: bound to a key this layer checks no proof of
    // (regression: taken as a bearer token in jwt mode, while introspection mode refused it).
    ['DPoP-bound (cnf.jkt)', () => sign({ ...base(), cnf: { jkt: '0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I' } })],
    ['mTLS-bound (cnf x5t#S256)', () => sign({ ...base(), cnf: { 'x5t#S256': 'bwcK0esc3ACC3DB2Y5_lESsXE8o9ltc05O89jdN-dg2' } })],
    // A `cnf` this layer cannot read is no bearer token either: refused, never taken as one.
    ['cnf null', () => sign({ ...base(), cnf: null })],
    ['cnf empty', () => sign({ ...base(), cnf: {} })],
  ])('%s: 401 invalid_token with resource_metadata, through the SDK client and on the wire', async (_name, make) => {
    const token = await make()
    expect(await connectWith(token)).toBe(401)
    const res = await postToolsList(origin(), token)
    expect(res.status).toBe(401)
    expect(res.headers.get('www-authenticate')).toBe(invalidTokenChallenge(origin()))
    expect(await res.json()).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32001, data: { error: 'unauthorized' } } })
  })
})

describe('a sender-constrained token naming a key the JWKS in hand lacks (jwt mode, keys from the authorization server)', () => {
  it('is refused 401 from its own claims, as an expired or foreign one is, not answered 503 as a key rotated in (regression)', async () => {
    // Signed by a key the issuer does not publish, naming a kid its JWKS lacks, issued now: a
    // token a rotation could explain, but one its `cnf` refuses whatever key signed it.
    const { privateKey } = await generateKeyPair('ES256')
    const nowS = Math.floor(clock() / 1000)
    const token = await new SignJWT({ sub: 'user_alice', cnf: { jkt: '0ZcOCORZNYy-DWpqq30jZyJGHTN0d2HglBV3uiguA4I' } })
      .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid: 'rotated-in' })
      .setIssuer(jwtAuth.issuer)
      .setAudience(jwtApp())
      .setIssuedAt(nowS)
      .setExpirationTime(nowS + 600)
      .sign(privateKey)
    const seen: Array<[number, string | null]> = []
    // Twice: the first may be the one that fetches the keys; the second comes within the
    // refetch interval, where a token issued since the fetch waits for a rotation (503).
    for (let i = 0; i < 2; i++) {
      const res = await appFetch(`${jwtApp()}/v1`, {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
      })
      await res.arrayBuffer()
      seen.push([res.status, res.headers.get('www-authenticate')])
    }
    const challenge = `Bearer resource_metadata="${jwtApp()}/.well-known/oauth-protected-resource", error="invalid_token"`
    expect(seen).toEqual([
      [401, challenge],
      [401, challenge],
    ])
  })
})

describe('other installed clients against the jwt-mode platform', () => {
  const TOOL_NAMES = ['count', 'echo', 'get_version']
  /** Checks that `tools` (as listed) include the App's own. */
  const expectAppTools = (tools: ReadonlyArray<{ name: string }>) => expect(tools.map((t) => t.name)).toEqual(expect.arrayContaining(TOOL_NAMES))

  it('@ai-sdk/mcp lists tools with an svc_ token', async () => {
    const client = await createMCPClient({
      transport: { type: 'http', url: `${jwtApp()}/v1`, headers: { authorization: `Bearer ${jwtPlatform.tokens.alice!}` }, fetch: appFetch as typeof fetch },
    })
    try {
      expectAppTools((await client.listTools()).tools)
    } finally {
      await client.close()
    }
  })

  it('@ai-sdk/mcp signs in from the 401 with the App address as resource, and lists tools with the audience-bound token', async () => {
    const provider = new RecordingOAuthClient({ loginHint: 'user_alice' })
    const url = `${jwtApp()}/v1`
    const transport = { type: 'http' as const, url, authProvider: provider as unknown as OAuthClientProvider, fetch: appFetch as typeof fetch }
    await expect(createMCPClient({ transport })).rejects.toBeInstanceOf(UnauthorizedError)
    const sent = provider.authorizationUrls[0]!.searchParams.get('resource')
    expect(new URL(sent!).href).toBe(new URL(jwtApp()).href)
    const params = provider.callbackParams!
    expect(
      await auth(provider as unknown as OAuthClientProvider, {
        serverUrl: url,
        authorizationCode: provider.code,
        callbackState: params.get('state') ?? undefined,
        callbackIssuer: params.get('iss') ?? undefined,
        fetchFn: appFetch as typeof fetch,
      }),
    ).toBe('AUTHORIZED')
    expect(new URL(String(decodeJwt(provider.tokens()!.access_token).aud)).href).toBe(new URL(jwtApp()).href)
    const client = await createMCPClient({ transport })
    try {
      expectAppTools((await client.listTools()).tools)
    } finally {
      await client.close()
    }
  })

  /** `mcp-inspector --cli <url> --transport http --header 'Authorization: Bearer …' --method tools/list`, killed past 25 s. */
  function inspectorToolsList(url: string, bearer: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
    return new Promise((resolve, reject) => {
      const child = execFile(
        process.execPath,
        [INSPECTOR_CLI, '--cli', url, '--transport', 'http', '--header', `Authorization: Bearer ${bearer}`, '--method', 'tools/list'],
        { env: { ...process.env, NODE_OPTIONS: `--import ${RESOLVE_LOCALHOST}` }, timeout: 25_000, killSignal: 'SIGKILL' },
        (error, stdout, stderr) => {
          if (error?.killed) reject(new Error(`inspector overran: ${stdout} ${stderr}`))
          else if (error && typeof error.code !== 'number') reject(error)
          else resolve({ code: error ? (error.code as number) : 0, stdout, stderr })
        },
      )
      child.stdin?.end()
    })
  }

  it('the Inspector CLI lists tools with an svc_ token, and with an OAuth access token for the App; one for another App exits 1 with -32001', async () => {
    const withApiToken = await inspectorToolsList(`${jwtApp()}/v1`, jwtPlatform.tokens.alice!)
    expect(withApiToken.code).toBe(0)
    expectAppTools((JSON.parse(withApiToken.stdout) as { tools: Array<{ name: string }> }).tools)

    const { accessToken } = await obtainAccessToken(`${jwtApp()}/v1`, appFetch, { loginHint: 'user_alice' })
    const withAccessToken = await inspectorToolsList(`${jwtApp()}/v1`, accessToken)
    expect(withAccessToken.code).toBe(0)
    expectAppTools((JSON.parse(withAccessToken.stdout) as { tools: Array<{ name: string }> }).tools)

    const elsewhere = await inspectorToolsList(`http://notes.localhost:${jwtServed.port}/v1`, accessToken)
    expect(elsewhere.code).toBe(1)
    const body = /\{"jsonrpc".*\}/.exec(elsewhere.stderr + elsewhere.stdout)?.[0]
    expect(JSON.parse(body ?? 'null')).toMatchObject({ id: null, error: { code: -32001 } })
  }, 60_000)
})

describe('userinfo mode: a token granted without `openid` (no scope challenge in the spec; docs/oauth.md "Decisions")', () => {
  it('is refused 401 invalid_token, not 403; the SDK client holding a refresh token refreshes into the same scope and gives up, and signs in with scopes_supported once its tokens are cleared', async () => {
    // A client that asked for `profile` alone (not the SDK's default: it asks for the
    // metadata's scopes_supported, `openid` among them).
    const provider = new TestOAuthClient({ loginHint: 'user_alice' })
    const metadata = await discoverAuthorizationServerMetadata(userinfoAuth.issuer)
    const info = await registerClient(userinfoAuth.issuer, {
      metadata,
      clientMetadata: { ...provider.clientMetadata, scope: 'profile offline_access' },
    })
    provider.saveClientInformation(info)
    const { authorizationUrl, codeVerifier } = await startAuthorization(userinfoAuth.issuer, {
      metadata,
      clientInformation: info,
      redirectUrl: provider.redirectUrl,
      scope: 'profile',
    })
    const code = (await followSignIn(authorizationUrl.href, provider.redirectUrl)).searchParams.get('code')!
    const tokens = await exchangeAuthorization(userinfoAuth.issuer, {
      metadata,
      clientInformation: info,
      authorizationCode: code,
      codeVerifier,
      redirectUri: provider.redirectUrl,
    })
    expect(tokens.scope).toBe('profile')
    expect(tokens.refresh_token).toEqual(expect.any(String))
    provider.saveTokens({ ...tokens, issuer: userinfoAuth.issuer } as typeof tokens)

    // The provider's userinfo answers 403 insufficient_scope scope="openid"; the App 401.
    const fetchFn = recordingFetch(appFetch)
    const url = `${userinfoApp()}/v1`
    const client = new Client({ name: 'profile-only', version: '1.0.0' })
    const error = await client.connect(new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: fetchFn })).then(
      () => undefined,
      (e: unknown) => e,
    )
    expect(error).toBeInstanceOf(StreamableHTTPError)
    expect((error as Error).message).toContain('Server returned 401 after successful authentication')
    const toApp = fetchFn.log.filter((r) => r.url === url)
    expect(toApp.map((r) => r.status)).toEqual([401, 401])
    expect(toApp.every((r) => r.wwwAuthenticate === invalidTokenChallenge(userinfoApp()))).toBe(true)
    // It refreshed (keeping the grant's scope) rather than signing in again.
    expect(tokenRequest(fetchFn.log, 'refresh_token') !== undefined).toBe(true)
    expect(provider.savedTokens.at(-1)!.scope).toBe('profile')
    await client.close()

    // Its tokens cleared, it signs in asking for the metadata's scopes_supported, and gets in.
    const fresh = new RecordingOAuthClient({ loginHint: 'user_alice' })
    const { client: signedIn } = await connectWithOAuth(url, fresh, appFetch)
    expect(fresh.authorizationUrls[0]!.searchParams.get('scope')).toBe('openid profile email')
    expect((await signedIn.callTool({ name: 'echo', arguments: { text: 'ok' } })).isError).toBeFalsy()
    await signedIn.close()
  })
})

describe("another authorization server's tokens, and tokens that are no access tokens", () => {
  it('are refused 401 invalid_token in every mode, never 500', async () => {
    const jwtIssued = await obtainAccessToken(`${jwtApp()}/v1`, appFetch, { loginHint: 'user_alice' })
    const userinfoIssued = await obtainAccessToken(`${userinfoApp()}/v1`, appFetch, { loginHint: 'user_alice' })
    const introspectionApp = `http://weather.localhost:${introspectionServed.port}`
    const opaqueIssued = await obtainAccessToken(`${introspectionApp}/v1`, appFetch, { loginHint: 'user_alice' })
    const refreshOf = (issued: { provider: TestOAuthClient }) => issued.provider.tokens()!.refresh_token!
    const cases: Array<[string, string, string]> = [
      ['jwt AS token at the userinfo App', userinfoApp(), jwtIssued.accessToken],
      ['jwt AS token at the introspection App', introspectionApp, jwtIssued.accessToken],
      ['userinfo AS token at the jwt App', jwtApp(), userinfoIssued.accessToken],
      ['introspection AS token at the jwt App', jwtApp(), opaqueIssued.accessToken],
      ['introspection AS token at the userinfo App', userinfoApp(), opaqueIssued.accessToken],
      ['a refresh token at the jwt App', jwtApp(), refreshOf(jwtIssued)],
      ['a refresh token at the introspection App', introspectionApp, refreshOf(opaqueIssued)],
      ['a refresh token at the userinfo App', userinfoApp(), refreshOf(userinfoIssued)],
    ]
    const seen: Array<[string, number, string | null]> = []
    for (const [name, app, token] of cases) {
      const res = await postToolsList(app, token)
      await res.arrayBuffer()
      seen.push([name, res.status, res.headers.get('www-authenticate')])
    }
    expect(seen).toEqual(
      cases.map(([name, app]) => [name, 401, invalidTokenChallenge(app)]),
    )
  })
})

describe('mcp-remote in OAuth mode against audience-bound tokens (jwt mode)', () => {
  it('signs in through the headless browser at /v1 and calls a tool with a token the App accepts', async () => {
    const remote = await connectMcpRemoteOAuth(`${jwtApp()}/v1`, await freePort())
    try {
      expect(remote.stderr()).toContain('Browser opened automatically')
      const echoed = await remote.client.callTool({ name: 'echo', arguments: { text: 'bound' } })
      expect(echoed.content).toEqual([{ type: 'text', text: expect.stringMatching(/^bound \(from weather /) }])
    } finally {
      await remote.close()
    }
  }, 60_000)
})
