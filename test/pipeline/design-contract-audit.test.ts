/**
 * An audit of the dispatcher against DESIGN.md ("Request pipeline (order is part of the
 * contract)", the error table) and spec section 7, statement by statement.
 *
 * The order is checked as a whole: every combination of failures a request can carry at once
 * (unknown App, unknown path, refused `Origin`, a method the endpoint does not serve, a missing
 * or refused credential of each kind, an address outside the allowlist, a token out of scope,
 * no subscription, a spent rate limit, an unknown session, an exact version that is not live)
 * is sent, and the answer must be the one of the earliest step that fails, with that row's
 * exact status, body and headers, and never `X-MCP-Version`. A pair test alone would miss an
 * order that is right for two failures but wrong for three; here each pair is one of the
 * subsets.
 */
import {
  AuthorizationServerUnavailableError,
  type AccessTokenResult,
  type AccessTokenValidator,
  type Decision,
  type DispatchRequest,
  type Reply,
  createDispatcher,
  createMemoryAppStore,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  generateApiToken,
} from 'mcp-dispatch'
import { beforeAll, describe, expect, it } from 'vitest'
import { dispatchRequest } from '../helpers/dispatch-request.js'

const WEATHER = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0'] }
const NOTES = { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['2.0.0'] }
const DAY = 86_400_000
// 2030-01-01T00:00:20.000Z: 20 s into a minute.
const T0 = Date.UTC(2030, 0, 1, 0, 0, 20)
const ALLOWED_ORIGIN = 'https://app.example'
const METADATA_URL = 'https://weather.example.com/.well-known/oauth-protected-resource'

/** The failures, in the order DESIGN.md's pipeline meets them: the first one present wins. */
const FAILURES = [
  'unknownApp', // step 1: 404 not_found
  'badPath', // step 1: 404 not_found
  'badOrigin', // step 1: 403 origin_not_allowed (allowedOrigins)
  'badMethod', // step 1: 405
  'credential', // step 2: 401 (or 503 / the OAuth validator's)
  'ipNotAllowed', // step 3: 403 ip_not_allowed
  'outOfScope', // step 3: 403 -32003, no data
  'unsubscribed', // step 4: 402
  'rateLimited', // step 5: 429
  'unknownSession', // step 6: 404 session_not_found
  'versionNotLive', // step 6: 404 version_not_found
] as const
type Failure = (typeof FAILURES)[number]

/** How the credential is refused, when `credential` is among the failures. */
const REFUSED_CREDENTIALS = [
  'missing',
  'basic',
  'empty-bearer',
  'malformed-checksum',
  'malformed-length',
  'unknown',
  'expired',
  'revoked',
  'oauth-refused',
  'oauth-unavailable',
] as const
type RefusedCredential = (typeof REFUSED_CREDENTIALS)[number]

interface Answer {
  status: number
  headers: Record<string, string>
  body: unknown
}

const rpcError = (code: number, message: string, data?: Record<string, unknown>) => ({
  jsonrpc: '2.0',
  id: null,
  error: data === undefined ? { code, message } : { code, message, data },
})

/** `token` with its last checksum digit changed: malformed, the rest of it a live token's. */
const checksumChanged = (token: string) => `${token.slice(0, -1)}${token.endsWith('0') ? '1' : '0'}`

/** The names an answer's `Access-Control-Expose-Headers` exposes, lower-case. */
const exposedBy = (headers: Readonly<Record<string, string>>) => (headers['access-control-expose-headers'] ?? '').toLowerCase().split(/\s*,\s*/)

/** What each failure answers (status, exact body, the headers of its row). */
function expected(failure: Failure, credential: RefusedCredential | undefined): { status: number; body: unknown; headers: Record<string, string | null> } {
  switch (failure) {
    case 'unknownApp':
    case 'badPath':
      return { status: 404, body: rpcError(-32004, 'Not found', { error: 'not_found' }), headers: { 'www-authenticate': null } }
    case 'badOrigin':
      return { status: 403, body: rpcError(-32003, 'Forbidden', { error: 'origin_not_allowed' }), headers: { 'www-authenticate': null } }
    case 'badMethod':
      return {
        status: 405,
        body: rpcError(-32000, 'Method not allowed', { error: 'method_not_allowed' }),
        headers: { allow: 'GET, POST, DELETE, OPTIONS', 'www-authenticate': null },
      }
    case 'credential': {
      if (credential === 'oauth-unavailable') {
        return {
          status: 503,
          body: rpcError(-32005, 'Authorization server unavailable', { error: 'temporarily_unavailable', retryAfter: 7 }),
          headers: { 'retry-after': '7', 'www-authenticate': null },
        }
      }
      // DESIGN.md step 2: a token presented and refused carries error="invalid_token"; none,
      // or another scheme, the plain challenge (RFC 6750 section 3.1).
      const presented = credential !== 'missing' && credential !== 'basic'
      return {
        status: 401,
        body: rpcError(-32001, 'Unauthorized', {
          error: 'unauthorized',
          description: presented
            ? 'Authentication required: the bearer token is invalid, expired or revoked'
            : 'Authentication required: send Authorization: Bearer <token>',
        }),
        headers: {
          'www-authenticate': presented
            ? `Bearer resource_metadata="${METADATA_URL}", error="invalid_token"`
            : `Bearer resource_metadata="${METADATA_URL}"`,
        },
      }
    }
    case 'ipNotAllowed':
      return { status: 403, body: rpcError(-32003, 'Forbidden', { error: 'ip_not_allowed' }), headers: { 'www-authenticate': null } }
    case 'outOfScope':
      return { status: 403, body: rpcError(-32003, 'Forbidden'), headers: { 'www-authenticate': null } }
    case 'unsubscribed':
      return {
        status: 402,
        body: rpcError(-32002, 'Payment Required', { error: 'payment_required', description: 'An active subscription to this App is required' }),
        headers: { 'www-authenticate': null, ratelimit: null },
      }
    case 'rateLimited':
      // Limit 0: 20 s into the minute, the window ends in 40 s.
      return {
        status: 429,
        body: rpcError(-32000, 'Rate limit exceeded', { limit: 0, resetAt: (T0 + 40_000) / 1000, retryAfter: 40, windowType: 'minute' }),
        headers: { 'retry-after': '40', 'ratelimit-policy': '"minute";q=0;w=60', ratelimit: '"minute";r=0;t=40' },
      }
    case 'unknownSession':
      return {
        status: 404,
        body: rpcError(-32004, 'Session not found', { error: 'session_not_found' }),
        headers: { 'www-authenticate': null, 'ratelimit-policy': '"minute";q=1000000;w=60' },
      }
    case 'versionNotLive':
      return {
        status: 404,
        body: rpcError(-32004, 'Version not found', { error: 'version_not_found', requested: '9.9.9', latest: '1.1.0' }),
        headers: { 'www-authenticate': null, 'ratelimit-policy': '"minute";q=1000000;w=60' },
      }
  }
}

/** A user for each (subscribed, rate-limited) pair. */
const userOf = (unsubscribed: boolean, limited: boolean) => `user_${unsubscribed ? 'unsub' : 'sub'}_${limited ? 'limited' : 'free'}`
/** A token of each kind for each (user, allowlist, scope). */
type TokenKind = 'live' | 'expired' | 'revoked'
const tokenKey = (user: string, ip: boolean, scope: boolean, kind: TokenKind) => `${user}|${ip}|${scope}|${kind}`

let clock = T0 - 8 * DAY
const secrets = new Map<string, string>()
let dispatcher: ReturnType<typeof createDispatcher>
const UNKNOWN = generateApiToken()

beforeAll(async () => {
  const apps = createMemoryAppStore([WEATHER, NOTES])
  const subscriptions = createMemorySubscriptionStore()
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions, now: () => clock })
  const users = [false, true].flatMap((unsub) => [false, true].map((limited) => ({ unsub, limited, id: userOf(unsub, limited) })))
  for (const user of users) {
    subscriptions.setActive(user.id, WEATHER.id, true)
    subscriptions.setActive(user.id, NOTES.id, true)
  }
  const create = async (user: string, ip: boolean, scope: boolean, kind: TokenKind) => {
    const created = await tokens.create({
      userId: user,
      name: `${kind} ${ip} ${scope}`,
      servers: [scope ? NOTES.id : WEATHER.id],
      expiresInDays: 7,
      ...(ip && { allowedIps: ['198.51.100.0/24'] }),
    })
    if (kind === 'revoked') await tokens.revoke(user, created.id)
    secrets.set(tokenKey(user, ip, scope, kind), created.token)
  }
  // Expired ones first, 8 days ago with a lifetime of 7; then the clock is now.
  for (const user of users) for (const ip of [false, true]) for (const scope of [false, true]) await create(user.id, ip, scope, 'expired')
  clock = T0
  for (const user of users) {
    for (const ip of [false, true]) for (const scope of [false, true]) for (const kind of ['live', 'revoked'] as const) await create(user.id, ip, scope, kind)
  }
  for (const user of users) if (user.unsub) subscriptions.setActive(user.id, WEATHER.id, false)

  // A validator of the platform's own (the interface DESIGN.md makes pluggable): `oauth.<user>`
  // is that user's token, `oauth.refused` is refused, `oauth.down` finds the server unavailable.
  const oauth: AccessTokenValidator = {
    validate(token): Promise<AccessTokenResult> {
      if (token === 'oauth.down') return Promise.reject(new AuthorizationServerUnavailableError(7))
      if (token.startsWith('oauth.user_')) return Promise.resolve({ active: true, info: { subject: token.slice('oauth.'.length) } })
      return Promise.resolve({ active: false, reason: 'refused' })
    },
  }
  dispatcher = createDispatcher({
    apps,
    subscriptions,
    tokens,
    oauth,
    authorizationServers: ['https://auth.example.com'],
    allowedOrigins: [ALLOWED_ORIGIN],
    now: () => clock,
    rateLimit: {
      policy: (identity) =>
        identity.subject.endsWith('_limited') ? { limit: 0, windowType: 'minute' } : { limit: 1_000_000, windowType: 'minute' },
    },
    onError: (error) => {
      throw new Error(`unexpected onError: ${String(error)}`)
    },
  })
})

interface Scenario {
  failures: ReadonlySet<Failure>
  /** API token or OAuth access token, for a credential that is not refused. */
  via: 'api' | 'oauth'
  refused?: RefusedCredential
}

function authorization(s: Scenario): string | undefined {
  const f = s.failures
  const user = userOf(f.has('unsubscribed'), f.has('rateLimited'))
  const ip = f.has('ipNotAllowed')
  const scope = f.has('outOfScope')
  const live = secrets.get(tokenKey(user, ip, scope, 'live'))!
  switch (s.refused) {
    case undefined:
      return s.via === 'oauth' ? `Bearer oauth.${user}` : `Bearer ${live}`
    case 'missing':
      return undefined
    case 'basic':
      return 'Basic dXNlcjpwYXNz'
    case 'empty-bearer':
      return 'Bearer '
    case 'malformed-checksum':
      // The same user's live token, its last checksum digit changed.
      return `Bearer ${checksumChanged(live)}`
    case 'malformed-length':
      return `Bearer ${live}A`
    case 'unknown':
      return `Bearer ${UNKNOWN}`
    case 'expired':
      return `Bearer ${secrets.get(tokenKey(user, ip, scope, 'expired'))!}`
    case 'revoked':
      return `Bearer ${secrets.get(tokenKey(user, ip, scope, 'revoked'))!}`
    case 'oauth-refused':
      return 'Bearer oauth.refused'
    case 'oauth-unavailable':
      return 'Bearer oauth.down'
  }
}

function requestOf(s: Scenario): DispatchRequest {
  const f = s.failures
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    origin: f.has('badOrigin') ? 'https://evil.example' : ALLOWED_ORIGIN,
  }
  const auth = authorization(s)
  if (auth !== undefined) headers.authorization = auth
  if (f.has('unknownSession')) headers['mcp-session-id'] = 'no-such-session'
  const host = f.has('unknownApp') ? 'nope.example.com' : 'weather.example.com'
  const path = f.has('badPath') ? '/v1.x' : f.has('versionNotLive') ? '/v9.9.9' : '/v1'
  return { ...dispatchRequest(path, headers), method: f.has('badMethod') ? 'PUT' : 'POST', host, origin: `https://${host}` }
}

async function answer(s: Scenario): Promise<Answer | { dispatched: Decision & { type: 'dispatch' } }> {
  const decision = await dispatcher.decide(requestOf(s))
  if (decision.type === 'dispatch') return { dispatched: decision }
  const { reply } = decision
  return { status: reply.status, headers: { ...reply.headers }, body: reply.body === null ? null : JSON.parse(reply.body) }
}

/** Every subset of `items`. */
function subsets<T>(items: readonly T[]): T[][] {
  return items.reduce<T[][]>((all, item) => all.concat(all.map((s) => [...s, item])), [[]])
}

function describeScenario(s: Scenario): string {
  return `${s.via}${s.refused ? `(${s.refused})` : ''}: ${[...s.failures].join(' + ') || 'none'}`
}

/** Every scenario: each subset of failures, with each way of refusing the credential. */
function scenarios(): Scenario[] {
  const all: Scenario[] = []
  const others = FAILURES.filter((f) => f !== 'credential')
  for (const subset of subsets(others)) {
    const failures = new Set<Failure>(subset)
    all.push({ failures, via: 'api' })
    for (const refused of REFUSED_CREDENTIALS) all.push({ failures: new Set([...failures, 'credential']), via: 'api', refused })
    // OAuth identities have no allowlist or scope.
    if (!failures.has('ipNotAllowed') && !failures.has('outOfScope')) all.push({ failures, via: 'oauth' })
  }
  return all
}

describe('pipeline order: every combination of failures answers as the earliest step that fails (DESIGN.md "Request pipeline")', () => {
  it('each of the 2^10 subsets of failures, with an accepted credential (API token, OAuth) and each way of refusing one', async () => {
    const mismatches: string[] = []
    let checked = 0
    for (const scenario of scenarios()) {
      const got = await answer(scenario)
      const first = FAILURES.find((f) => scenario.failures.has(f))
      checked++
      if (first === undefined) {
        if (!('dispatched' in got)) mismatches.push(`${describeScenario(scenario)}: expected dispatch, got ${got.status} ${JSON.stringify(got.body)}`)
        else {
          expect(got.dispatched.context.version).toBe('1.1.0')
          expect(got.dispatched.headers['x-mcp-version']).toBe('1.1.0')
          expect(got.dispatched.headers['x-mcp-latest-version']).toBe('1.1.0')
        }
        continue
      }
      if ('dispatched' in got) {
        mismatches.push(`${describeScenario(scenario)}: expected ${first}, got a dispatch`)
        continue
      }
      const want = expected(first, scenario.refused)
      const problems: string[] = []
      if (got.status !== want.status) problems.push(`status ${got.status} (want ${want.status})`)
      if (JSON.stringify(got.body) !== JSON.stringify(want.body)) problems.push(`body ${JSON.stringify(got.body)} (want ${JSON.stringify(want.body)})`)
      // Every error body is JSON (DESIGN.md), and no answer of steps 1 to 6 carries the version headers.
      if (got.headers['content-type'] !== 'application/json') problems.push(`content-type ${got.headers['content-type']}`)
      if ('x-mcp-version' in got.headers || 'x-mcp-latest-version' in got.headers) problems.push('version headers on a refusal')
      for (const [name, value] of Object.entries(want.headers)) {
        if ((got.headers[name] ?? null) !== value) problems.push(`${name}: ${got.headers[name]} (want ${value})`)
      }
      // DESIGN.md "Adapters": error responses carry the CORS headers a browser-based client needs,
      // exposing WWW-Authenticate, Mcp-Session-Id and the version headers; an origin that is not
      // allowed reads none (docs/pipeline.md, CORS), and is told only that the answer varies by it.
      if (!scenario.failures.has('badOrigin')) {
        if (got.headers['access-control-allow-origin'] !== ALLOWED_ORIGIN) problems.push(`access-control-allow-origin: ${got.headers['access-control-allow-origin']}`)
        const exposed = exposedBy(got.headers)
        for (const name of ['www-authenticate', 'mcp-session-id', 'x-mcp-version', 'x-mcp-latest-version', 'retry-after']) {
          if (!exposed.includes(name)) problems.push(`${name} not exposed`)
        }
      } else if ('access-control-allow-origin' in got.headers || !/\bOrigin\b/.test(got.headers.vary ?? '')) {
        problems.push(`CORS to a refused origin: ${JSON.stringify(got.headers)}`)
      }
      if (problems.length > 0) mismatches.push(`${describeScenario(scenario)} → ${first}: ${problems.join('; ')}`)
    }
    expect(checked).toBeGreaterThan(10_000)
    expect(mismatches.slice(0, 20)).toEqual([])
  })
})

describe('the metadata document answers GET before every check but the App (DESIGN.md step 1, spec 4.2)', () => {
  it('whatever else the request carries: a refused Origin, any credential or none, no subscription, a spent limit, an unknown session', async () => {
    const document = {
      resource: 'https://weather.example.com',
      authorization_servers: ['https://auth.example.com'],
      bearer_methods_supported: ['header'],
      scopes_supported: ['openid', 'profile', 'email'],
      resource_name: 'Weather',
    }
    const mismatches: string[] = []
    for (const subset of subsets(['badOrigin', 'unsubscribed', 'rateLimited', 'unknownSession', 'ipNotAllowed', 'outOfScope'] as const)) {
      for (const refused of [undefined, ...REFUSED_CREDENTIALS]) {
        const failures = new Set<Failure>(refused === undefined ? subset : [...subset, 'credential'])
        const request = { ...requestOf({ failures, via: 'api', ...(refused && { refused }) }), method: 'GET', path: '/.well-known/oauth-protected-resource' }
        const decision = await dispatcher.decide(request)
        const label = describeScenario({ failures, via: 'api', ...(refused && { refused }) })
        if (decision.type !== 'reply') {
          mismatches.push(`${label}: dispatched`)
          continue
        }
        const { status, headers, body } = decision.reply
        if (status !== 200 || body === null || JSON.stringify(JSON.parse(body)) !== JSON.stringify(document)) mismatches.push(`${label}: ${status} ${body}`)
        // Cacheable and readable from any origin, so browser-based clients can read it (DESIGN.md step 1).
        if (headers['cache-control'] !== 'public, max-age=3600' || headers['access-control-allow-origin'] !== '*') {
          mismatches.push(`${label}: headers ${JSON.stringify(headers)}`)
        }
        const exposed = exposedBy(headers)
        if (!['www-authenticate', 'mcp-session-id', 'x-mcp-version', 'x-mcp-latest-version'].every((name) => exposed.includes(name))) {
          mismatches.push(`${label}: exposes ${headers['access-control-expose-headers']}`)
        }
        if ('x-mcp-version' in headers || 'www-authenticate' in headers || 'ratelimit' in headers) mismatches.push(`${label}: pipeline headers ${JSON.stringify(headers)}`)
      }
    }
    expect(mismatches.slice(0, 10)).toEqual([])
    // Of an App that does not exist: 404 not_found, as any path of it.
    const unknown = await dispatcher.decide({ ...requestOf({ failures: new Set(['unknownApp']), via: 'api' }), method: 'GET', path: '/.well-known/oauth-protected-resource' })
    expect(unknown.type === 'reply' && [unknown.reply.status, JSON.parse(unknown.reply.body!)]).toEqual([404, rpcError(-32004, 'Not found', { error: 'not_found' })])
  })
})

describe('a token that starts with the API-token prefix is an API token; anything else an OAuth access token (DESIGN.md step 2)', () => {
  // A validator that accepts every token it is asked about (or answers as `validate` does):
  // whatever reaches it is served.
  async function setup(validate: AccessTokenValidator['validate'] = () => Promise.resolve({ active: true, info: { subject: 'u1' } })) {
    const apps = createMemoryAppStore([WEATHER])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'u1', appId: WEATHER.id, active: true }])
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions, now: () => T0 })
    const live = await tokens.create({ userId: 'u1', name: 'live', servers: [WEATHER.id], expiresInDays: 7 })
    const revoked = await tokens.create({ userId: 'u1', name: 'revoked', servers: [WEATHER.id], expiresInDays: 7 })
    await tokens.revoke('u1', revoked.id)
    const asked: string[] = []
    const oauth: AccessTokenValidator = {
      validate(token, context) {
        asked.push(token)
        return validate(token, context)
      },
    }
    const dispatcher = createDispatcher({ apps, subscriptions, tokens, oauth, authorizationServers: ['https://auth.example.com'], now: () => T0 })
    const send = async (credential: string) => {
      const decision = await dispatcher.decide(dispatchRequest('/', { authorization: `Bearer ${credential}` }))
      return decision.type === 'dispatch' ? 200 : decision.reply.status
    }
    return { live: live.token, liveId: live.id, revoked: revoked.token, asked, send, dispatcher }
  }

  it('an svc_ token that is malformed (checksum, length, alphabet), unknown or revoked is 401, and never asked of the authorization server', async () => {
    const { live, revoked, asked, send } = await setup()
    for (const token of [checksumChanged(live), live.slice(0, -1), `${live}0`, `${live.slice(0, 20)}~${live.slice(21)}`, 'svc_', generateApiToken(), revoked]) {
      expect([token, await send(token)]).toEqual([token, 401])
    }
    expect(asked).toEqual([])
    expect(await send(live)).toBe(200)
    expect(asked).toEqual([])
  })

  it('a token with the prefix in another case or with another separator is an OAuth access token', async () => {
    const { live, asked, send } = await setup()
    for (const token of [`SVC_${live.slice(4)}`, `svc-${live.slice(4)}`, `Svc_${live.slice(4)}`, `xsvc_${live.slice(4)}`]) {
      expect(await send(token)).toBe(200)
    }
    expect(asked).toEqual([`SVC_${live.slice(4)}`, `svc-${live.slice(4)}`, `Svc_${live.slice(4)}`, `xsvc_${live.slice(4)}`])
  })

  it('the handler is told who called: an OAuth token\'s subject, client and scopes; an API token\'s owner and token id', async () => {
    const { dispatcher, live, liveId } = await setup((token) =>
      Promise.resolve(token === 'with-client' ? { active: true, info: { subject: 'u1', clientId: 'agent-1', scopes: ['openid', 'mcp:tools'] } } : { active: true, info: { subject: 'u1' } }),
    )
    const identity = async (credential: string) => {
      const decision = await dispatcher.decide(dispatchRequest('/', { authorization: `Bearer ${credential}` }))
      if (decision.type !== 'dispatch') throw new Error(`refused: ${decision.reply.status}`)
      return decision.context.identity
    }
    expect(await identity('with-client')).toEqual({ subject: 'u1', method: 'oauth', clientId: 'agent-1', scopes: ['openid', 'mcp:tools'] })
    expect(await identity('without-client')).toEqual({ subject: 'u1', method: 'oauth' })
    expect(await identity(live)).toEqual({ subject: 'u1', method: 'api_token', tokenId: liveId })
  })
})

describe('a store that fails answers 503 at its own step, never before an earlier step has refused (DESIGN.md "Stores", failure policy)', () => {
  it('token, subscription, rate-limit (failOpen: false), live-version and session stores each down in turn', async () => {
    const down = { tokens: false, subscriptions: false, rateLimit: false, versions: false, sessions: false }
    const fail = (which: keyof typeof down) => {
      if (down[which]) throw new Error(`${which} store down`)
    }
    const memoryApps = createMemoryAppStore([WEATHER, NOTES])
    const apps = { ...memoryApps, getLiveVersions: (id: string) => (fail('versions'), memoryApps.getLiveVersions(id)) }
    const memorySubscriptions = createMemorySubscriptionStore([
      { userId: 'u1', appId: WEATHER.id, active: true },
      { userId: 'u1', appId: NOTES.id, active: true },
      { userId: 'u2', appId: WEATHER.id, active: true },
      { userId: 'limited', appId: WEATHER.id, active: true },
    ])
    const subscriptions = { ...memorySubscriptions, isActive: (u: string, a: string) => (fail('subscriptions'), memorySubscriptions.isActive(u, a)) }
    const memoryTokens = createMemoryTokenStore()
    const store = { ...memoryTokens, findByHash: (hash: string) => (fail('tokens'), memoryTokens.findByHash(hash)) }
    const tokens = createTokenService({ store, apps, subscriptions, now: () => T0 })
    const make = async (userId: string, servers: string[], allowedIps?: string[]) =>
      (await tokens.create({ userId, name: 't', servers, expiresInDays: 7, ...(allowedIps && { allowedIps }) })).token
    const live = await make('u1', [WEATHER.id])
    const outOfScope = await make('u1', [NOTES.id])
    const outsideAllowlist = await make('u1', [WEATHER.id], ['198.51.100.1'])
    const limited = await make('limited', [WEATHER.id])
    const unsubscribed = await make('u2', [WEATHER.id])
    memorySubscriptions.setActive('u2', WEATHER.id, false)
    const memoryRate = createMemoryRateLimitStore()
    const memorySessions = createMemorySessionStore()
    const dispatcher = createDispatcher({
      apps,
      subscriptions,
      tokens,
      now: () => T0,
      sessions: { ...memorySessions, get: (id: string, ttl: number) => (fail('sessions'), memorySessions.get(id, ttl)) },
      rateLimit: {
        failOpen: false,
        store: { increment: (key: string, start: number, ms: number) => (fail('rateLimit'), memoryRate.increment(key, start, ms)) },
        policy: (identity) => ({ limit: identity.subject === 'limited' ? 0 : 100, windowType: 'minute' as const }),
      },
      onError: () => {},
    })
    const send = async (options: { token?: string; host?: string; path?: string; session?: string }) => {
      const headers = {
        ...(options.token !== undefined && { authorization: `Bearer ${options.token}` }),
        ...(options.session !== undefined && { 'mcp-session-id': options.session }),
      }
      const host = options.host ?? 'weather.example.com'
      const decision = await dispatcher.decide({ ...dispatchRequest(options.path ?? '/v1', headers), host, origin: `https://${host}` })
      if (decision.type === 'dispatch') return 'dispatch'
      const body = JSON.parse(decision.reply.body!) as { error: { data?: { error?: string } } }
      return `${decision.reply.status} ${body.error.data?.error ?? ''}`.trim()
    }
    const checksum = checksumChanged(live)
    const cases: Array<[keyof typeof down, Parameters<typeof send>[0], string]> = [
      ['tokens', { token: generateApiToken(), host: 'nope.example.com' }, '404 not_found'],
      ['tokens', { token: generateApiToken(), path: '/v1.x' }, '404 not_found'],
      ['tokens', {}, '401 unauthorized'],
      ['tokens', { token: checksum }, '401 unauthorized'],
      ['tokens', { token: generateApiToken() }, '503 temporarily_unavailable'],
      ['subscriptions', { token: checksum }, '401 unauthorized'],
      ['subscriptions', { token: outsideAllowlist }, '403 ip_not_allowed'],
      ['subscriptions', { token: outOfScope }, '403'],
      ['subscriptions', { token: live }, '503 temporarily_unavailable'],
      ['rateLimit', { token: unsubscribed }, '402 payment_required'],
      ['rateLimit', { token: live }, '503 temporarily_unavailable'],
      ['versions', { token: unsubscribed }, '402 payment_required'],
      ['versions', { token: limited }, '429'],
      ['versions', { token: live }, '503 temporarily_unavailable'],
      ['sessions', { token: limited, session: 'some-session' }, '429'],
      ['sessions', { token: live, session: 'some-session' }, '503 temporarily_unavailable'],
      ['sessions', { token: live }, 'dispatch'],
    ]
    const got: string[] = []
    for (const [which, request, want] of cases) {
      down[which] = true
      got.push(`${which} down, ${JSON.stringify(request)}: ${await send(request)} (want ${want})`)
      down[which] = false
    }
    expect(got).toEqual(cases.map(([which, request, want]) => `${which} down, ${JSON.stringify(request)}: ${want} (want ${want})`))
  })

  it('the 503 that replaces the answer of a session whose pin could not be stored is readable by the browser page that opened it (CORS)', async () => {
    const apps = createMemoryAppStore([WEATHER])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'u1', appId: WEATHER.id, active: true }])
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions, now: () => T0 })
    const { token } = await tokens.create({ userId: 'u1', name: 't', servers: [WEATHER.id], expiresInDays: 7 })
    const origin = 'https://inspector.example'
    for (const allowedOrigins of [undefined, [origin]]) {
      const dispatcher = createDispatcher({
        apps,
        subscriptions,
        tokens,
        now: () => T0,
        sessions: { get: () => Promise.resolve(undefined), set: () => Promise.reject(new Error('pins down')), delete: () => Promise.resolve() },
        ...(allowedOrigins && { allowedOrigins }),
        onError: () => {},
      })
      const opened = await dispatcher.decide(dispatchRequest('/v1', { authorization: `Bearer ${token}`, origin }))
      if (opened.type !== 'dispatch') throw new Error('not dispatched')
      const replaced = (await opened.complete({ status: 200, sessionId: 's1' })) as Reply
      expect(replaced.status).toBe(503)
      expect(replaced.headers['access-control-allow-origin']).toBe(opened.headers['access-control-allow-origin'])
      expect(replaced.headers['access-control-allow-origin']).toBe(allowedOrigins ? origin : '*')
      expect(exposedBy(replaced.headers)).toContain('retry-after')
    }
  })
})
