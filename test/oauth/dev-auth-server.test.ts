/**
 * The reference platform's development authorization server, as an OAuth client that does not
 * use the MCP SDK meets it: the official MCP conformance runner's authorization-server
 * scenarios (metadata, and an authorization code grant with PKCE whose request carries no
 * `scope`), and a client that omits `scope` (RFC 6749 section 3.3), which must get the default
 * scopes and a token the platform accepts, not `access_denied`.
 */
import { createHash, randomBytes } from 'node:crypto'
import { mkdtemp, rm } from 'node:fs/promises'
import { createServer } from 'node:net'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { type Platform, createPlatform } from '../../examples/platform/index.js'
import { conformanceAvailable, failures, runAuthorizationConformance } from '../helpers/conformance.js'
import { followSignIn, loopbackFetch, servePlatform } from './helpers/oauth-client.js'

const installed = conformanceAvailable('dev-auth-server')

let auth: DevAuthServer
let platform: Platform
let server: { port: number; close(): Promise<void> }

beforeAll(async () => {
  auth = await startDevAuthServer({ accounts: ['user_alice', 'user_bob'] })
  platform = createPlatform({
    seed: {
      apps: [{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }],
      users: [{ id: 'user_alice' }, { id: 'user_bob' }],
      subscriptions: [{ userId: 'user_alice', appId: 'app_weather', active: true }],
    },
    authorizationServer: { issuer: auth.issuer },
  })
  server = await servePlatform(platform.fetch)
})

afterAll(async () => {
  await server?.close()
  await platform?.close()
  await auth?.close()
})

/** A loopback port nothing listens on now (the runner's callback server takes it). */
async function freePort(): Promise<number> {
  const probe = createServer()
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve))
  const port = (probe.address() as { port: number }).port
  await new Promise<void>((resolve) => probe.close(() => resolve()))
  return port
}

/** Registers a public client (RFC 7591) with one redirect URI. */
async function register(redirectUri: string): Promise<string> {
  const response = await fetch(`${auth.issuer}/reg`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      redirect_uris: [redirectUri],
      token_endpoint_auth_method: 'none',
      grant_types: ['authorization_code'],
      response_types: ['code'],
    }),
  })
  expect(response.status).toBe(201)
  return ((await response.json()) as { client_id: string }).client_id
}

describe.skipIf(!installed)('the official conformance runner against the development authorization server', () => {
  let outputDir: string
  beforeAll(async () => {
    outputDir = await mkdtemp(join(tmpdir(), 'mcp-dispatch-as-conformance-'))
  })
  afterAll(async () => {
    if (outputDir) await rm(outputDir, { recursive: true, force: true })
  })

  it('passes the metadata and authorization code grant scenarios', async () => {
    const callbackPort = await freePort()
    const redirectUri = `http://127.0.0.1:${callbackPort}/callback`
    const clientId = await register(redirectUri)
    const asked: string[] = []
    const run = await runAuthorizationConformance({
      issuer: auth.issuer,
      clientId,
      callbackPort,
      resource: `http://weather.localhost:${server.port}/`,
      signIn: (url) => {
        asked.push(url)
        return followSignIn(url, redirectUri)
      },
      outputDir,
      timeoutMs: 60_000,
    })
    // The runner asked once, and for no scope: the server's default applied.
    expect(asked).toHaveLength(1)
    expect(new URL(asked[0]!).searchParams.has('scope')).toBe(false)
    expect([...run.scenarios.keys()].sort(), run.output.slice(-4_000)).toEqual([
      'authorization-code-grant',
      'authorization-server-metadata-endpoint',
    ])
    for (const [scenario, checks] of run.scenarios) {
      expect(failures(checks), `${scenario}: ${run.output.slice(-2_000)}`).toEqual([])
      expect(checks.some((c) => c.status === 'SUCCESS'), scenario).toBe(true)
    }
  }, 90_000)
})

/**
 * Runs an authorization code grant with PKCE as a public client, the authorization request
 * carrying `params` besides the required ones; the callback's parameters and the token answer.
 */
async function grant(
  params: Record<string, string>,
  path = '/auth',
  jar?: Map<string, string>,
): Promise<{ callback: URLSearchParams; tokens: { access_token: string; scope: string } }> {
  const redirectUri = 'http://127.0.0.1:9/callback'
  const clientId = await register(redirectUri)
  const verifier = randomBytes(32).toString('base64url')
  const authorize = new URL(`${auth.issuer}${path}`)
  authorize.search = new URLSearchParams({
    response_type: 'code',
    client_id: clientId,
    redirect_uri: redirectUri,
    code_challenge: createHash('sha256').update(verifier).digest('base64url'),
    code_challenge_method: 'S256',
    ...params,
  }).toString()
  const callback = (await followSignIn(authorize.href, redirectUri, jar)).searchParams
  if (callback.get('error') !== null) return { callback, tokens: { access_token: '', scope: '' } }
  const response = await fetch(`${auth.issuer}/token`, {
    method: 'POST',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
    body: new URLSearchParams({ grant_type: 'authorization_code', code: callback.get('code')!, redirect_uri: redirectUri, code_verifier: verifier, client_id: clientId }),
  })
  expect(response.status).toBe(200)
  return { callback, tokens: (await response.json()) as { access_token: string; scope: string } }
}

describe('automatic sign-in', () => {
  /** The user a token of the development server is for, by its userinfo. */
  async function userOf(accessToken: string): Promise<string> {
    const response = await fetch(`${auth.issuer}/me`, { headers: { authorization: `Bearer ${accessToken}` } })
    expect(response.status).toBe(200)
    return ((await response.json()) as { sub: string }).sub
  }

  it('signs in as the user login_hint names, or the first seed user, even in a browser signed in before as another (regression: its session cookie won, and an unknown hint got that user’s token)', async () => {
    const jar = new Map<string, string>()
    expect(await userOf((await grant({ login_hint: 'user_alice' }, '/auth', jar)).tokens.access_token)).toBe('user_alice')
    expect(jar.size).toBeGreaterThan(0) // the browser keeps a session
    expect(await userOf((await grant({ login_hint: 'user_bob' }, '/auth', jar)).tokens.access_token)).toBe('user_bob')
    expect(await userOf((await grant({ login_hint: 'user_bob' }, '/auth', jar)).tokens.access_token)).toBe('user_bob')
    const unknown = (await grant({ login_hint: 'user_nobody' }, '/auth', jar)).callback
    expect([unknown.get('error'), unknown.get('error_description')]).toEqual(['access_denied', 'login_hint names no known user'])
    expect(await userOf((await grant({}, '/auth', jar)).tokens.access_token)).toBe('user_alice')
  })
})

describe('an authorization request without scope (RFC 6749 section 3.3)', () => {
  it('gets the default scopes, and a token the platform accepts at userinfo', async () => {
    const { callback, tokens } = await grant({ state: 'state-1', login_hint: 'user_alice' })
    expect(callback.get('state')).toBe('state-1')
    expect(tokens.scope.split(' ').sort()).toEqual(['email', 'openid', 'profile'])

    const answer = await loopbackFetch(`http://weather.localhost:${server.port}/v1`, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${tokens.access_token}`,
        'content-type': 'application/json',
        accept: 'application/json, text/event-stream',
      },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    })
    expect(answer.status).toBe(200)
    expect(answer.headers.get('x-mcp-version')).toBe('1.0.0')
    const body = (await answer.json()) as { result: { tools: { name: string }[] } }
    expect(body.result.tools.map((t) => t.name)).toContain('get_version')
  })

  it('gets them at every spelling of the path oidc-provider routes as /auth (regression: access_denied at /AUTH and /auth/)', async () => {
    for (const path of ['/AUTH', '/auth/']) {
      expect((await grant({ login_hint: 'user_alice' }, path)).tokens.scope.split(' ').sort(), path).toEqual(['email', 'openid', 'profile'])
    }
  })

  it('keeps a scope the client asked for', async () => {
    expect((await grant({ scope: 'openid' })).tokens.scope).toBe('openid')
  })
})

describe('open registration is bounded', () => {
  it('a registration past 16 kB, or one that does not say its length, is refused before it is stored (a 50 kB client_name each held 50 kB for good)', async () => {
    const register = (body: string | ReadableStream<Uint8Array>) =>
      fetch(`${auth.issuer}/reg`, { method: 'POST', headers: { 'content-type': 'application/json' }, body, duplex: 'half' } as RequestInit)
    const metadata = (name: string) => JSON.stringify({ redirect_uris: ['http://127.0.0.1:1/callback'], token_endpoint_auth_method: 'none', client_name: name })
    const big = await register(metadata('x'.repeat(50_000)))
    expect(big.status).toBe(413)
    expect(((await big.json()) as { error: string }).error).toBe('invalid_client_metadata')
    // The path as oidc-provider routes it: any case, a trailing slash.
    for (const path of ['/REG', '/Reg', '/reg/']) {
      const other = await fetch(`${auth.issuer}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: metadata('x'.repeat(50_000)) })
      expect(other.status, path).toBe(413)
    }
    const chunked = await register(new Blob([metadata('chunked')]).stream())
    expect(chunked.status).toBe(411)
    await chunked.body?.cancel()
    expect((await register(metadata('small'))).status).toBe(201)
  })
})

/**
 * Regression: a browser-based MCP client (a page, such as the MCP Inspector's) registers and
 * redeems its code cross-origin. oidc-provider answers the registration endpoint without CORS
 * headers, so the page's registration failed ("Failed to fetch"); test/platform/browser-client.test.ts
 * runs the whole sign-in in Chromium.
 */
describe('a page registering and redeeming its code (CORS)', () => {
  const page = 'http://localhost:6274'

  it('registration answers the preflight and the POST of a page served from this machine', async () => {
    const preflight = await fetch(`${auth.issuer}/reg`, {
      method: 'OPTIONS',
      headers: { origin: page, 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type' },
    })
    expect(preflight.status).toBe(204)
    expect(preflight.headers.get('access-control-allow-origin')).toBe(page)
    expect(preflight.headers.get('access-control-allow-methods')).toBe('POST')
    expect(preflight.headers.get('access-control-allow-headers')?.toLowerCase()).toContain('content-type')

    const registered = await fetch(`${auth.issuer}/reg`, {
      method: 'POST',
      headers: { origin: page, 'content-type': 'application/json' },
      body: JSON.stringify({ redirect_uris: [`${page}/oauth/callback`], token_endpoint_auth_method: 'none' }),
    })
    expect(registered.status).toBe(201)
    expect(registered.headers.get('access-control-allow-origin')).toBe(page)
    // A refusal is readable too: the page sees why.
    const refused = await fetch(`${auth.issuer}/reg`, {
      method: 'POST',
      headers: { origin: page, 'content-type': 'application/json' },
      body: JSON.stringify({ redirect_uris: 'not a list' }),
    })
    expect(refused.status).toBe(400)
    expect(refused.headers.get('access-control-allow-origin')).toBe(page)
  })

  it('a page of a website cannot register: sign-in is automatic, its code would be a token of the seed user (regression)', async () => {
    for (const origin of ['https://evil.example', 'http://evil.localhost.example', 'null']) {
      const preflight = await fetch(`${auth.issuer}/reg`, {
        method: 'OPTIONS',
        headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type' },
      })
      // No CORS headers: the browser never sends the POST.
      expect(preflight.status, origin).not.toBe(204)
      expect(preflight.headers.get('access-control-allow-origin'), origin).toBeNull()
      const registered = await fetch(`${auth.issuer}/reg`, {
        method: 'POST',
        headers: { origin, 'content-type': 'application/json' },
        body: JSON.stringify({ redirect_uris: [`${origin === 'null' ? 'https://evil.example' : origin}/cb`], token_endpoint_auth_method: 'none' }),
      })
      expect(registered.headers.get('access-control-allow-origin'), origin).toBeNull()
    }
    for (const origin of ['http://127.0.0.1:6274', 'http://[::1]:6274', 'https://inspector.localhost']) {
      const preflight = await fetch(`${auth.issuer}/reg`, {
        method: 'OPTIONS',
        headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'content-type' },
      })
      expect(preflight.headers.get('access-control-allow-origin'), origin).toBe(origin)
    }
  })

  it("the token endpoint answers the page of a public client's redirect URI, and no other", async () => {
    const clientId = await register(`${page}/oauth/callback`)
    const ask = (origin: string) =>
      fetch(`${auth.issuer}/token`, {
        method: 'POST',
        headers: { origin, 'content-type': 'application/x-www-form-urlencoded' },
        body: new URLSearchParams({ grant_type: 'authorization_code', code: 'unknown', redirect_uri: `${page}/oauth/callback`, code_verifier: 'x'.repeat(43), client_id: clientId }),
      })
    const own = await ask(page)
    expect(own.status).toBe(400)
    expect(own.headers.get('access-control-allow-origin')).toBe(page)
    const other = await ask('http://localhost:9999')
    expect(other.headers.get('access-control-allow-origin')).toBeNull()
  })
})
