/**
 * Load: the reference platform (real MCP SDK server per version, Web adapter on
 * `@hono/node-server`) over loopback, 100 requests in flight, a mix of valid and invalid
 * credentials (API tokens, and OAuth access tokens validated by the platform's
 * `createOAuthValidator` against the development authorization server on loopback) and of
 * version paths. Zero 5xx, and every answer is the right one for its request: for a served
 * one, status, `X-MCP-Version`, `X-MCP-Latest-Version` and the version the App itself reports
 * (`get_version`); for a refusal, its whole JSON-RPC body and the headers it must carry
 * (`WWW-Authenticate`, `Retry-After`), and no version header.
 *
 * `LOAD_REQUESTS` sets the number of requests: 20,000 by default (issue 5), fewer on a
 * small machine (`LOAD_REQUESTS=5000 npm test`).
 */
import { randomBytes } from 'node:crypto'
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { isDeepStrictEqual } from 'node:util'
import { serve } from '@hono/node-server'
import { generateApiToken } from 'mcp-dispatch'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { type Platform, createPlatform } from '../../examples/platform/index.js'
import { createManualClock } from '../oauth/helpers/clock.js'
import { inProcessFetch, obtainAccessToken } from '../oauth/helpers/oauth-client.js'
import { API_TOKEN_PATTERN, T0, activeResources, leakedHandles, send } from './support.js'

const REQUESTS = Number(process.env.LOAD_REQUESTS ?? 20_000)
const CONCURRENCY = 100
/** Requests the limited App allows per minute; the clock stands still, so exactly this many pass. */
const LIMIT = 40
/** Lifetime of the authorization server's access tokens. */
const ACCESS_TOKEN_TTL_S = 3600

type ApiTokenKind = 'valid' | 'rotated' | 'otherApp' | 'unsubscribed' | 'malformed' | 'unknown' | 'revoked' | 'rotatedOld' | 'limited'
/** Access tokens of the authorization server: alice's, bob's (no subscription), one past its expiry, one it never issued. */
type OAuthKind = 'oauth' | 'oauthUnsubscribed' | 'oauthExpired' | 'oauthUnknown'
type TokenKind = ApiTokenKind | OAuthKind | 'none'

/** Latest live version of the weather App: `X-MCP-Latest-Version` of every answer it serves, `latest` of its 404s. */
const LATEST = '2.0.0'

/**
 * Paths on the weather App: the version each resolves to, or (`requested`) the selector a
 * 404 version_not_found names.
 */
const PATHS: Record<string, { version: string } | { requested: string }> = {
  '/': { version: '2.0.0' },
  '/v1': { version: '1.1.1' },
  '/v1.1': { version: '1.1.1' },
  '/v1.1.1': { version: '1.1.1' },
  '/v1.0': { version: '1.0.0' },
  '/v1.0.0': { version: '1.0.0' },
  '/v2': { version: '2.0.0' },
  '/v2.0.0': { version: '2.0.0' },
  '/v1.1.0': { requested: '1.1.0' }, // replaced by 1.1.1
  '/v3': { requested: '3' },
  // A live pre-release above the latest release: served at its exact URL only; no line holds it,
  // and the latest version every answer names stays the release.
  '/v2.1.0-rc.1': { version: '2.1.0-rc.1' },
  '/v2.1': { requested: '2.1' },
  '/v2.1.0': { requested: '2.1.0' },
  '/v2.1.0-rc.2': { requested: '2.1.0-rc.2' },
}

interface Case {
  kind: TokenKind
  path: string
}

/** A refusal as it must reach the client: status, whole body (parsed), headers it must carry. */
interface Refusal {
  status: number
  body: unknown
  headers: Record<string, string>
}

type Expected = { status: 200; version: string; latest: string } | Refusal

/**
 * The contract's error bodies written out (spec section 7, DESIGN.md's table), not taken from
 * the reply builders: a builder that answered the wrong code or `data` would otherwise be
 * compared with itself.
 */
function rpcError(status: number, code: number, message: string, data?: Record<string, unknown>, headers: Record<string, string> = {}): Refusal {
  return {
    status,
    body: { jsonrpc: '2.0', id: null, error: { code, message, ...(data && { data }) } },
    headers: { 'content-type': 'application/json', ...headers },
  }
}

/**
 * The 401 of spec 5.1 at the weather App: `error="invalid_token"` (RFC 6750) in the challenge
 * when a token was presented and refused, so the client knows to get a fresh one.
 */
function unauthorized(port: number, presented: boolean): Refusal {
  const challenge = `Bearer resource_metadata="http://weather.localhost:${port}/.well-known/oauth-protected-resource"`
  return rpcError(
    401,
    -32001,
    'Unauthorized',
    {
      error: 'unauthorized',
      description: presented
        ? 'Authentication required: the bearer token is invalid, expired or revoked'
        : 'Authentication required: send Authorization: Bearer <token>',
    },
    { 'www-authenticate': presented ? `${challenge}, error="invalid_token"` : challenge },
  )
}

const PAYMENT_REQUIRED = rpcError(402, -32002, 'Payment Required', {
  error: 'payment_required',
  description: 'An active subscription to this App is required',
})
/** Scope: no data (spec section 7). */
const FORBIDDEN = rpcError(403, -32003, 'Forbidden')

/**
 * The 429 of the limited App: the clock stands at T0, 30 s into a minute, so every refusal
 * names that minute's end and the 30 s left of it.
 */
const WINDOW_END_S = Math.floor(T0 / 60_000) * 60 + 60
const RETRY_AFTER_S = WINDOW_END_S - T0 / 1000
const RATE_LIMITED = rpcError(
  429,
  -32000,
  'Rate limit exceeded',
  { limit: LIMIT, resetAt: WINDOW_END_S, retryAfter: RETRY_AFTER_S, windowType: 'minute' },
  { 'retry-after': String(RETRY_AFTER_S) },
)

/** What the platform must answer to a case (the limited App: 200, or 429 once the limit is spent, counted apart). */
function expected(c: Case, port: number): Expected {
  switch (c.kind) {
    case 'none':
      return unauthorized(port, false)
    case 'malformed':
    case 'unknown':
    case 'revoked':
    case 'rotatedOld':
    case 'oauthExpired':
    case 'oauthUnknown':
      return unauthorized(port, true)
    case 'otherApp':
      return FORBIDDEN
    case 'unsubscribed':
    case 'oauthUnsubscribed':
      return PAYMENT_REQUIRED
    case 'limited':
      return { status: 200, version: '1.0.0', latest: '1.0.0' }
    default: {
      const target = PATHS[c.path]!
      return 'version' in target
        ? { status: 200, version: target.version, latest: LATEST }
        : rpcError(404, -32004, 'Version not found', { error: 'version_not_found', requested: target.requested, latest: LATEST })
    }
  }
}

/** What is wrong with a refusal, or `undefined`: its status, whole body, headers, and no version header. */
function refusalMismatch(response: { status: number; headers: http.IncomingHttpHeaders; body: Buffer }, want: Refusal): string | undefined {
  const text = response.body.toString()
  let body: unknown
  try {
    body = JSON.parse(text)
  } catch {
    body = undefined
  }
  if (response.status !== want.status || !isDeepStrictEqual(body, want.body)) {
    return `${response.status} ${text.slice(0, 300)}, expected ${want.status} ${JSON.stringify(want.body)}`
  }
  for (const [name, value] of Object.entries(want.headers)) {
    if (response.headers[name] !== value) return `${name}: ${String(response.headers[name])}, expected ${value}`
  }
  // Produced before the MCP layer: no version header (spec section 7, DESIGN.md step 7).
  for (const name of ['x-mcp-version', 'x-mcp-latest-version']) {
    if (response.headers[name] !== undefined) return `${name}: ${String(response.headers[name])} on a refusal`
  }
  return undefined
}

// Before anything of the run is started: what is still open after it is its leak.
const baseline = activeResources()

describe(`load: ${REQUESTS} requests, ${CONCURRENCY} in flight, through the reference platform`, () => {
  let platform: Platform
  let authServer: DevAuthServer
  let server: http.Server
  let port: number
  const errors: Array<{ error: unknown; context: string }> = []
  const logged: string[] = []
  const tokens = {} as Record<Exclude<TokenKind, 'none'>, string>

  beforeAll(async () => {
    // The authorization server's own clock, moved to make one token expire; the platform's
    // stands at T0 (its validation cache then never expires: each token goes upstream once).
    const authClock = createManualClock()
    authServer = await startDevAuthServer({ accounts: ['alice', 'bob'], now: authClock, accessTokenTtlSeconds: ACCESS_TOKEN_TTL_S })
    platform = createPlatform({
      seed: {
        apps: [
          { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0', '1.1.1', '2.0.0', '2.1.0-rc.1'] },
          { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['1.0.0'] },
          { id: 'app_limited', slug: 'limited', name: 'Limited', versions: ['1.0.0'], rateLimitPerMinute: LIMIT },
        ],
        users: [{ id: 'alice' }, { id: 'bob' }],
        subscriptions: [
          { userId: 'alice', appId: 'app_weather', active: true },
          { userId: 'alice', appId: 'app_notes', active: true },
          { userId: 'alice', appId: 'app_limited', active: true },
          { userId: 'bob', appId: 'app_weather', active: false },
        ],
        tokens: [
          { name: 'valid', userId: 'alice', servers: ['app_weather'], expiresInDays: 30 },
          { name: 'otherApp', userId: 'alice', servers: ['app_notes'], expiresInDays: 30 },
          { name: 'unsubscribed', userId: 'bob', servers: ['app_weather'], expiresInDays: 30 },
          { name: 'limited', userId: 'alice', servers: ['app_limited'], expiresInDays: 30 },
        ],
      },
      now: () => T0,
      // The spec's validation (userinfo), the platform's default.
      authorizationServer: { issuer: authServer.issuer },
      onError: (error, context) => errors.push({ error, context }),
    })
    Object.assign(tokens, platform.tokens)
    const service = platform.tokenService
    const revoked = await service.create({ userId: 'alice', name: 'revoked', servers: ['app_weather'], expiresInDays: 7 })
    await service.revoke('alice', revoked.id)
    const old = await service.create({ userId: 'alice', name: 'rotated', servers: ['app_weather'], expiresInDays: 7 })
    const rotated = await service.rotate(old.id, { kind: 'session', userId: 'alice' })
    // Access tokens as an MCP client gets them: discovery from the App, registration, sign-in,
    // code exchange. The expired one first, then the clock past its lifetime.
    const signIn = async (user: string) =>
      (await obtainAccessToken('http://weather.localhost/v1', inProcessFetch(platform.fetch), { loginHint: user })).accessToken
    const expiredAccessToken = await signIn('alice')
    authClock.advance(ACCESS_TOKEN_TTL_S * 1000 + 1000)
    Object.assign(tokens, {
      revoked: revoked.token,
      rotatedOld: old.token,
      rotated: rotated.token,
      malformed: 'svc_not-a-real-token',
      // Well-formed (checksum and all) but never issued.
      unknown: generateApiToken(),
      oauth: await signIn('alice'),
      oauthUnsubscribed: await signIn('bob'),
      oauthExpired: expiredAccessToken,
      // Shaped like the server's opaque tokens, never issued by it.
      oauthUnknown: randomBytes(32).toString('base64url'),
    })
    server = await new Promise<http.Server>((resolve) => {
      const s: http.Server = serve(
        {
          port: 0,
          hostname: '127.0.0.1',
          fetch: (request: Request, env: { incoming?: { socket?: { remoteAddress?: string } } }) =>
            platform.fetch(request, { clientAddress: env.incoming?.socket?.remoteAddress }),
        },
        () => resolve(s),
      ) as http.Server
    })
    port = (server.address() as AddressInfo).port
  })

  afterAll(async () => {
    server?.closeAllConnections()
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()))
    await platform?.close()
    await authServer?.close()
  })

  it('answers every request correctly for what it asked, with zero 5xx', { timeout: 180_000 }, async () => {
    // A fixed, shuffled mix: over half valid credentials (API and OAuth) over every path, the
    // rest refused for a reason each.
    const kinds: TokenKind[] = [
      'valid', 'valid', 'valid', 'valid', 'oauth', 'valid', 'oauth', 'rotated', 'otherApp', 'unsubscribed', 'malformed', 'unknown',
      'revoked', 'rotatedOld', 'none', 'limited', 'oauthUnsubscribed', 'oauthExpired', 'oauthUnknown',
    ]
    const paths = Object.keys(PATHS)
    // Every kind in turn, and each kind over every path in turn (regression: a stride sharing a
    // factor with the number of kinds sent 2 of them only).
    const cases: Case[] = Array.from({ length: REQUESTS }, (_, i) => ({
      kind: kinds[i % kinds.length]!,
      path: paths[Math.floor(i / kinds.length) % paths.length]!,
    }))
    const combos = new Set(cases.map((c) => `${c.kind} ${c.path}`))
    expect(combos.size, 'every kind over every path').toBe(new Set(kinds).size * paths.length)

    const agent = new http.Agent({ keepAlive: true, maxSockets: CONCURRENCY })
    const wrong: string[] = []
    const byStatus = new Map<number, number>()
    let limitedServed = 0
    let limitedRefused = 0
    let next = 0
    const worker = async () => {
      while (next < cases.length) {
        // Each request's own JSON-RPC id, echoed by the App: answers crossed between
        // concurrent requests of one version would carry another's.
        const id = next
        const c = cases[next++]!
        const host = c.kind === 'limited' ? 'limited' : 'weather'
        const sentAt = performance.now()
        const response = await send(
          port,
          {
            method: 'POST',
            path: c.kind === 'limited' ? '/v1' : c.path,
            headers: {
              host: `${host}.localhost:${port}`,
              'content-type': 'application/json',
              accept: 'application/json, text/event-stream',
              ...(c.kind !== 'none' && { authorization: `Bearer ${tokens[c.kind]}` }),
            },
            body: JSON.stringify({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'get_version', arguments: {} } }),
          },
          agent,
          30_000,
        ).catch((error: Error) => {
          // Which request, and what the run had done meanwhile, for a hang or a connection error.
          const ms = Math.round(performance.now() - sentAt)
          throw new Error(`request ${id} (${c.kind} ${c.path}), sent ${ms} ms before, with ${next} of ${cases.length} sent: ${error.message}`, { cause: error })
        })
        byStatus.set(response.status, (byStatus.get(response.status) ?? 0) + 1)
        const want = expected(c, port)
        if (c.kind === 'limited' && response.status === 429) {
          limitedRefused++
          const mismatch = refusalMismatch(response, RATE_LIMITED)
          if (mismatch) wrong.push(`limited 429: ${mismatch}`)
          continue
        }
        if (!('version' in want)) {
          // Refused by the dispatch layer.
          const mismatch = refusalMismatch(response, want)
          if (mismatch) wrong.push(`${c.kind} ${c.path}: ${mismatch}`)
          continue
        }
        if (response.status !== want.status) {
          wrong.push(`${c.kind} ${c.path}: ${response.status}, expected ${want.status}: ${response.body.toString().slice(0, 200)}`)
          continue
        }
        if (c.kind === 'limited') limitedServed++
        const answer = JSON.parse(response.body.toString()) as { id?: unknown; result?: { structuredContent?: { version?: string } } }
        const reported = answer.result?.structuredContent?.version
        const version = response.headers['x-mcp-version']
        const latest = response.headers['x-mcp-latest-version']
        if (version !== want.version || latest !== want.latest || reported !== want.version || answer.id !== id) {
          wrong.push(
            `${c.kind} ${c.path} #${id}: X-MCP-Version ${String(version)}, X-MCP-Latest-Version ${String(latest)}, App says ${reported} for #${String(answer.id)}, expected ${want.version} (latest ${want.latest})`,
          )
        }
      }
    }
    const originalError = console.error
    console.error = (...args: unknown[]) => logged.push(args.map(String).join(' '))
    try {
      await Promise.all(Array.from({ length: CONCURRENCY }, worker))
    } finally {
      console.error = originalError
      agent.destroy()
    }

    expect(wrong.slice(0, 10), `${wrong.length} wrong answers`).toEqual([])
    expect([...byStatus.keys()].filter((s) => s >= 500)).toEqual([])
    expect(limitedServed).toBe(Math.min(LIMIT, cases.filter((c) => c.kind === 'limited').length))
    expect(limitedServed + limitedRefused).toBe(cases.filter((c) => c.kind === 'limited').length)
    expect(errors).toEqual([])
    // Whatever was logged under load, no credential in it: no API token, no access token.
    const accessTokens = [tokens.oauth, tokens.oauthUnsubscribed, tokens.oauthExpired, tokens.oauthUnknown]
    expect(logged.filter((line) => API_TOKEN_PATTERN.test(line) || accessTokens.some((t) => line.includes(t)))).toEqual([])
  })
})

describe('nothing leaks', () => {
  it('leaves no socket, server or timer of the run behind: the platform, its authorization server and their clients closed', async () => {
    expect(await leakedHandles(baseline)).toEqual({})
  })
})
