/**
 * A black-box check of the reference platform over real HTTP on 127.0.0.1, written from
 * spec/service-spec.md (sections 2 to 9), DESIGN.md (error table, pipeline order) and
 * docs/platform.md alone, as an outside grader would: every answer read off the wire (status,
 * raw header fields, body), through the platform's own Node path (`outgoing`: the dispatch
 * headers go into Node's `writeHead`). One platform instance, an injected clock.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { AccessTokenValidator } from 'mcp-dispatch'
import type { Platform } from '../../examples/platform/index.js'
import {
  DAY,
  INITIALIZE,
  MINUTE,
  T0,
  type ServedPlatform,
  type TestClock,
  bodies,
  createTestPlatform,
  localhostFetch,
  servePlatform,
} from '../helpers/platform.js'

let platform: Platform
let clock: TestClock
let served: ServedPlatform
let token: (name: string) => string
let errors: Array<{ error: unknown; context: string }>
/** Carol's seeded token as her dashboard session rotated it (its new secret). */
let carolsRotated: string | undefined

/** OAuth access tokens this validator accepts: `oauth-<user>` is `user_<user>`. */
const oauth: AccessTokenValidator = {
  issuer: 'https://auth.example.com',
  validate: async (presented) =>
    /^oauth-[a-z]+$/.test(presented) ? { active: true, info: { subject: `user_${presented.slice(6)}` } } : { active: false, reason: 'unknown' },
}

beforeAll(async () => {
  ;({ platform, clock, token, errors } = createTestPlatform({ oauth }))
  served = await servePlatform(platform)
})
afterAll(async () => {
  await served?.close()
  await platform?.close()
  expect(errors).toEqual([])
})

const app = (slug: string, path = '/') => `${served.origin(slug)}${path}`
const metadataUrlOf = (slug: string) => `${served.origin(slug)}/.well-known/oauth-protected-resource`

/** A POST of a JSON-RPC message (default `tools/list`) to an App, over HTTP. */
function post(url: string, options: { bearer?: string; authorization?: string; body?: unknown; headers?: Record<string, string> } = {}) {
  const headers: Record<string, string> = { 'content-type': 'application/json', ...options.headers }
  if (options.bearer !== undefined) headers.authorization = `Bearer ${options.bearer}`
  if (options.authorization !== undefined) headers.authorization = options.authorization
  return localhostFetch(url, { method: 'POST', headers, body: JSON.stringify(options.body ?? { jsonrpc: '2.0', id: 1, method: 'tools/list' }) })
}

/** A refusal of the dispatch layer as read off the wire: JSON, the exact body, no version headers. */
async function expectRefusal(response: Response, status: number, body: unknown): Promise<void> {
  const text = await response.text()
  expect({ status: response.status, body: JSON.parse(text) }).toEqual({ status, body })
  expect(response.headers.get('content-type')).toBe('application/json')
  expect(response.headers.get('x-mcp-version')).toBeNull()
  expect(response.headers.get('x-mcp-latest-version')).toBeNull()
}

const challengeOf = (slug: string, invalidToken: boolean) =>
  `Bearer resource_metadata="${metadataUrlOf(slug)}"${invalidToken ? ', error="invalid_token"' : ''}`

/** A development dashboard session over HTTP (`POST /dev/session`). */
async function signIn(userId: string): Promise<{ cookie: string; csrfToken: string }> {
  const response = await localhostFetch(`http://api.localhost:${served.port}/dev/session`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ userId }),
  })
  expect(response.status).toBe(200)
  expect(response.headers.get('cache-control')).toBe('no-store')
  const setCookie = response.headers.get('set-cookie') ?? ''
  expect(setCookie).toMatch(/^mcp_dev_session=[A-Za-z0-9_-]+; HttpOnly; SameSite=Strict; Path=\/$/)
  const { csrfToken } = (await response.json()) as { csrfToken: string }
  return { cookie: setCookie.split(';')[0]!, csrfToken }
}

/** A call of the token API over HTTP. */
function api(method: string, path: string, options: { session?: { cookie: string; csrfToken: string }; csrf?: boolean; bearer?: string; body?: unknown } = {}) {
  const headers: Record<string, string> = {}
  if (options.session) {
    headers.cookie = options.session.cookie
    if (options.csrf !== false) headers['x-csrf-token'] = options.session.csrfToken
  }
  if (options.bearer !== undefined) headers.authorization = `Bearer ${options.bearer}`
  if (options.body !== undefined) headers['content-type'] = 'application/json'
  return localhostFetch(`http://api.localhost:${served.port}/api/tokens${path}`, {
    method,
    headers,
    ...(options.body !== undefined && { body: JSON.stringify(options.body) }),
  })
}

async function idOf(session: { cookie: string; csrfToken: string }, name: string): Promise<string> {
  const { tokens } = (await (await api('GET', '', { session })).json()) as { tokens: Array<{ id: string; name: string }> }
  const found = tokens.find((t) => t.name === name)
  if (!found) throw new Error(`no token ${name}`)
  return found.id
}

const ISO_MS = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/

describe('spec 7 and DESIGN.md error table, over HTTP', () => {
  it('401: no Authorization, another scheme, an unusable Bearer (OAuth or API token): the challenge of 5.1, error="invalid_token" when a token was refused, the exact body', async () => {
    const none = await post(app('weather', '/v1'))
    expect(none.headers.get('www-authenticate')).toBe(challengeOf('weather', false))
    await expectRefusal(none, 401, bodies.unauthorized(false))
    const basic = await post(app('weather', '/v1'), { authorization: 'Basic dXNlcjpwYXNz' })
    expect(basic.headers.get('www-authenticate')).toBe(challengeOf('weather', false))
    await expectRefusal(basic, 401, bodies.unauthorized(false))
    for (const bearer of ['not-an-oauth-token', 'svc_short', `svc_${'A'.repeat(44)}`]) {
      const refused = await post(app('weather', '/v1.1.1'), { bearer })
      expect(refused.headers.get('www-authenticate')).toBe(challengeOf('weather', true))
      await expectRefusal(refused, 401, bodies.unauthorized(true))
    }
  })

  it('402: identity verified (API token or OAuth), no active subscription; -32002 with data', async () => {
    await expectRefusal(await post(app('weather'), { bearer: token('bob') }), 402, bodies.paymentRequired)
    await expectRefusal(await post(app('weather'), { bearer: token('dave') }), 402, bodies.paymentRequired)
    await expectRefusal(await post(app('weather'), { bearer: 'oauth-dave' }), 402, bodies.paymentRequired)
    // The same user over OAuth at an App subscribed to is served.
    const subscribed = await post(app('notes'), { bearer: 'oauth-alice' })
    expect(subscribed.status).toBe(200)
    await subscribed.text()
  })

  it('403 scope: -32003 Forbidden, no data, even though the owner subscribes to the App', async () => {
    const response = await post(app('notes', '/v1'), { bearer: token('alice') })
    // toEqual: the error object has no data at all.
    await expectRefusal(response, 403, bodies.forbidden)
  })

  it('403 allowlist from an address outside it (this socket is 127.0.0.1): ip_not_allowed; order allowlist before scope', async () => {
    await expectRefusal(await post(app('weather'), { bearer: token('ipv4') }), 403, bodies.ipNotAllowed)
    await expectRefusal(await post(app('weather'), { bearer: token('ipv6') }), 403, bodies.ipNotAllowed)
    await expectRefusal(await post(app('notes'), { bearer: token('cidr4') }), 403, bodies.ipNotAllowed)
  })

  it('404: an exact version not live (never deployed, replaced); broader patterns still reach the latest of their line; an unknown App or path', async () => {
    const alice = token('alice')
    await expectRefusal(await post(app('weather', '/v1.1.0'), { bearer: alice }), 404, bodies.versionNotFound('1.1.0', '2.0.0'))
    await expectRefusal(await post(app('weather', '/v1.0.5'), { bearer: alice }), 404, bodies.versionNotFound('1.0.5', '2.0.0'))
    for (const [path, version] of [['/', '2.0.0'], ['/v1', '1.1.1'], ['/v1.1', '1.1.1'], ['/v1.0', '1.0.0'], ['/v2', '2.0.0']] as const) {
      const response = await post(app('weather', path), { bearer: alice })
      expect(response.status, path).toBe(200)
      expect(response.headers.get('x-mcp-version'), path).toBe(version)
      expect(response.headers.get('x-mcp-latest-version'), path).toBe('2.0.0')
      await response.text()
    }
    await expectRefusal(await post(app('nowhere', '/v1'), { bearer: alice }), 404, bodies.notFound)
    await expectRefusal(await post(app('weather', '/mcp')), 404, bodies.notFound)
  })

  it('429: the body of section 7 (limit, resetAt in Unix seconds, retryAfter, windowType minute), Retry-After and the RateLimit fields; no version headers', async () => {
    const secret = token('alice-limited')
    for (const remaining of [2, 1, 0]) {
      const ok = await post(app('limited', '/v1'), { bearer: secret })
      expect(ok.status).toBe(200)
      expect(ok.headers.get('x-mcp-version')).toBe('1.0.0')
      expect(ok.headers.get('ratelimit-policy')).toBe('"minute";q=3;w=60')
      expect(ok.headers.get('ratelimit')).toBe(`"minute";r=${remaining};t=30`)
      await ok.text()
    }
    const limited = await post(app('limited', '/v1'), { bearer: secret })
    const resetAt = (T0 - (T0 % MINUTE) + MINUTE) / 1000
    expect(limited.headers.get('retry-after')).toBe('30')
    expect(limited.headers.get('ratelimit')).toBe('"minute";r=0;t=30')
    await expectRefusal(limited, 429, bodies.rateLimited(3, resetAt, 30))
    // Rate limit before the version (pipeline step 5 before 6).
    await expectRefusal(await post(app('limited', '/v9.9.9'), { bearer: secret }), 429, bodies.rateLimited(3, resetAt, 30))
  })
})

describe('success and metadata, over HTTP', () => {
  it('a valid MCP response carries X-MCP-Version and X-MCP-Latest-Version once each, and the JSON-RPC answer of the version', async () => {
    const response = await post(app('weather', '/v1.0.0'), { bearer: token('alice') })
    expect(response.status).toBe(200)
    expect(response.headers.get('x-mcp-version')).toBe('1.0.0')
    expect(response.headers.get('x-mcp-latest-version')).toBe('2.0.0')
    const message = JSON.parse(await response.text())
    expect(message).toMatchObject({ jsonrpc: '2.0', id: 1 })
    expect(message.result.tools.find((t: { name: string }) => t.name === 'get_version').description).toContain('1.0.0')
  })

  it('the metadata: no credential needed, the fields of 2.2 with this address, Cache-Control and CORS', async () => {
    for (const headers of [{}, { origin: 'https://client.example' }, { authorization: 'Bearer garbage' }] as Array<Record<string, string>>) {
      const response = await localhostFetch(metadataUrlOf('weather'), { headers })
      expect(response.status).toBe(200)
      expect(response.headers.get('content-type')).toBe('application/json')
      expect(response.headers.get('cache-control')).toBe('public, max-age=3600')
      expect(response.headers.get('access-control-allow-origin')).toBe('*')
      expect(response.headers.get('x-mcp-version')).toBeNull()
      const doc = await response.json()
      expect(doc).toMatchObject({
        resource: served.origin('weather'),
        authorization_servers: ['https://auth.example.com'],
        bearer_methods_supported: ['header'],
        scopes_supported: expect.arrayContaining(['openid', 'profile', 'email']),
      })
    }
  })
})

describe('API tokens over HTTP (spec 2.1, 3, 4.3, 4.4, 5.2)', () => {
  it('rotate by Bearer: only itself (another id: 403, nothing changes), the fields and formats of 2.1, the old secret 401 at once', async () => {
    const alice = await signIn('user_alice')
    const id = await idOf(alice, 'alice-week')
    const other = await idOf(alice, 'alice-notes')
    const before = (await (await api('GET', `/${id}`, { session: alice })).json()) as Record<string, unknown>

    const another = await api('POST', `/${other}/rotate`, { bearer: token('alice-week') })
    expect(another.status).toBe(403)
    expect(another.headers.get('cache-control')).toBe('no-store')
    expect(await another.json()).toMatchObject({ error: 'forbidden' })
    expect((await post(app('notes'), { bearer: token('alice-notes') })).status).toBe(200)

    clock.advance(DAY) // a rotation never extends the expiry
    try {
      await rotateADayLater(id, before)
    } finally {
      clock.advance(-DAY)
    }
  })

  async function rotateADayLater(id: string, before: Record<string, unknown>): Promise<void> {
    const response = await api('POST', `/${id}/rotate`, { bearer: token('alice-week') })
    expect(response.status).toBe(200)
    expect(response.headers.get('cache-control')).toBe('no-store')
    expect(response.headers.get('content-type')).toMatch(/^application\/json/)
    const rotated = (await response.json()) as Record<string, any>
    expect(Object.keys(rotated).sort()).toEqual(['allowed_ips', 'created_at', 'expires_at', 'id', 'name', 'prefix', 'scopes', 'token'])
    expect(rotated.token).toMatch(/^svc_[0-9A-Za-z]{44}$/)
    expect(rotated.token).toHaveLength(48)
    expect(rotated.token).not.toBe(token('alice-week'))
    expect(rotated.id).toBe(id)
    expect(rotated.id).toMatch(UUID)
    expect(rotated.name).toBe('alice-week')
    expect(rotated.prefix).toBe(rotated.token.slice(0, 12))
    expect(rotated.expires_at).toBe(before.expires_at)
    expect(rotated.expires_at).toMatch(ISO_MS)
    expect(rotated.expires_at).toBe(new Date(T0 + 7 * DAY).toISOString())
    expect(rotated.allowed_ips).toBeNull()
    expect(rotated.scopes).toEqual([{ server_id: 'app_weather', server_name: 'Weather', server_slug: 'weather' }])
    expect(rotated.created_at).toBe(new Date(T0).toISOString())

    const old = await post(app('weather'), { bearer: token('alice-week') })
    expect(old.headers.get('www-authenticate')).toBe(challengeOf('weather', true))
    await expectRefusal(old, 401, bodies.unauthorized(true))
    const again = await api('POST', `/${id}/rotate`, { bearer: token('alice-week') })
    expect(again.status).toBe(401)
    expect(again.headers.get('www-authenticate')).toBe('Bearer error="invalid_token"')
    const fresh = await post(app('weather'), { bearer: rotated.token })
    expect(fresh.status).toBe(200)
    await fresh.text()
  }

  it('rotate by Bearer needs no cookie or CSRF token even beside a cookie without one', async () => {
    const alice = await signIn('user_alice')
    const id = await idOf(alice, 'alice-all')
    const response = await api('POST', `/${id}/rotate`, { bearer: token('alice-all'), session: alice, csrf: false })
    expect(response.status).toBe(200)
    const rotated = (await response.json()) as { token: string; scopes: Array<{ server_id: string }> }
    expect(rotated.scopes.map((s) => s.server_id).sort()).toEqual(['app_limited', 'app_notes', 'app_weather'])
    expect((await post(app('notes'), { bearer: token('alice-all') })).status).toBe(401)
  })

  it('rotate by Bearer is held to the token allowlist (from 127.0.0.1: 403)', async () => {
    const alice = await signIn('user_alice')
    const response = await api('POST', `/${await idOf(alice, 'ipv4')}/rotate`, { bearer: token('ipv4') })
    expect(response.status).toBe(403)
  })

  it('rotate by session cookie (the dashboard): CSRF required; any token of the session user; not another user\'s (404)', async () => {
    const carol = await signIn('user_carol')
    const alice = await signIn('user_alice')
    const id = await idOf(carol, 'carol')
    expect((await api('POST', `/${id}/rotate`, { session: carol, csrf: false })).status).toBe(403)
    expect((await api('POST', `/${id}/rotate`, { session: alice })).status).toBe(404)
    const response = await api('POST', `/${id}/rotate`, { session: carol })
    expect(response.status).toBe(200)
    const rotated = (await response.json()) as { token: string; prefix: string; id: string }
    carolsRotated = rotated.token
    expect(rotated.id).toBe(id)
    expect(rotated.prefix).toBe(rotated.token.slice(0, 12))
    expect((await post(app('weather'), { bearer: token('carol') })).status).toBe(401)
    const ok = await post(app('weather'), { bearer: rotated.token })
    expect(ok.status).toBe(200)
    await ok.text()
  })

  it('PATCH: name, expires_at (never past created_at + 90 days nor into the past) and the allowlist change; servers are refused', async () => {
    const carol = await signIn('user_carol')
    const created = await api('POST', '', { session: carol, body: { name: 'ci', servers: ['app_weather'], expires_in_days: 7 } })
    expect(created.status).toBe(201)
    const token201 = (await created.json()) as Record<string, any>
    expect(token201).toMatchObject({ name: 'ci', allowed_ips: null, prefix: token201.token.slice(0, 12) })
    expect(token201.created_at).toMatch(ISO_MS)
    const path = `/${token201.id}`

    const renamed = await api('PATCH', path, { session: carol, body: { name: 'ci-renamed' } })
    expect(renamed.status).toBe(200)
    expect(await renamed.json()).toMatchObject({ name: 'ci-renamed' })

    const servers = await api('PATCH', path, { session: carol, body: { servers: ['app_notes'] } })
    expect(servers.status).toBe(400)
    expect(await servers.json()).toMatchObject({ error: 'invalid_request', field: 'servers' })

    const tooFar = await api('PATCH', path, { session: carol, body: { expires_at: new Date(T0 + 91 * DAY).toISOString() } })
    expect(tooFar.status).toBe(400)
    const past = await api('PATCH', path, { session: carol, body: { expires_at: new Date(clock.now() - 1000).toISOString() } })
    expect(past.status).toBe(400)
    const later = await api('PATCH', path, { session: carol, body: { expires_at: new Date(T0 + 90 * DAY).toISOString() } })
    expect(later.status).toBe(200)
    expect(((await later.json()) as { expires_at: string }).expires_at).toBe(new Date(T0 + 90 * DAY).toISOString())

    const listed = await api('PATCH', path, { session: carol, body: { allowed_ips: ['203.0.113.0/24'] } })
    expect(listed.status).toBe(200)
    expect(await listed.json()).toMatchObject({ allowed_ips: ['203.0.113.0/24'] })
    await expectRefusal(await post(app('weather'), { bearer: token201.token }), 403, bodies.ipNotAllowed)
    const opened = await api('PATCH', path, { session: carol, body: { allowed_ips: null } })
    expect(await opened.json()).toMatchObject({ allowed_ips: null })
    const ok = await post(app('weather'), { bearer: token201.token })
    expect(ok.status).toBe(200)
    await ok.text()

    // Revoke: 401 at once, permanent.
    const revoked = await api('DELETE', path, { session: carol })
    expect(revoked.status).toBe(200)
    expect(await revoked.json()).toMatchObject({ status: 'revoked' })
    const refused = await post(app('weather'), { bearer: token201.token })
    expect(refused.headers.get('www-authenticate')).toBe(challengeOf('weather', true))
    await expectRefusal(refused, 401, bodies.unauthorized(true))
    expect((await api('PATCH', path, { session: carol, body: { name: 'back' } })).status).toBe(409)
  })

  it('an expired token is 401 (spec 3), and stays so', async () => {
    const alice = await signIn('user_alice')
    const created = await api('POST', '', { session: alice, body: { name: 'short', servers: ['app_weather'], expires_in_days: 7 } })
    const { token: secret } = (await created.json()) as { token: string }
    const ok = await post(app('weather'), { bearer: secret })
    expect(ok.status).toBe(200)
    await ok.text()
    clock.advance(7 * DAY)
    try {
      const expired = await post(app('weather'), { bearer: secret })
      expect(expired.headers.get('www-authenticate')).toBe(challengeOf('weather', true))
      await expectRefusal(expired, 401, bodies.unauthorized(true))
    } finally {
      clock.advance(-7 * DAY)
    }
  })
})

describe('version pinning across a deploy through POST /dev/deploy (spec 9.2)', () => {
  it('an open session keeps its version; a new connection resolves anew; the replaced exact version is 404, a broader pattern reaches the new patch', async () => {
    const alice = token('alice')
    const opened = await post(app('weather', '/v1'), { bearer: alice, body: INITIALIZE, headers: { accept: 'application/json, text/event-stream' } })
    expect(opened.status).toBe(200)
    expect(opened.headers.get('x-mcp-version')).toBe('1.1.1')
    await opened.text()
    const session = opened.headers.get('mcp-session-id')!
    const inSession = { accept: 'application/json, text/event-stream', 'mcp-session-id': session, 'mcp-protocol-version': '2025-06-18' }
    await (await post(app('weather', '/v1'), { bearer: alice, body: { jsonrpc: '2.0', method: 'notifications/initialized' }, headers: inSession })).text()

    const deploy = await localhostFetch(`http://api.localhost:${served.port}/dev/deploy`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ app: 'weather', version: '1.1.2' }),
    })
    expect(deploy.status).toBe(200)
    expect(await deploy.json()).toMatchObject({ app: 'weather', version: '1.1.2' })

    const call = { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'get_version', arguments: {} } }
    const pinned = await post(app('weather', '/v1'), { bearer: alice, body: call, headers: inSession })
    expect(pinned.status).toBe(200)
    expect(pinned.headers.get('x-mcp-version')).toBe('1.1.1')
    expect(pinned.headers.get('x-mcp-latest-version')).toBe('2.0.0')
    expect(await pinned.text()).toContain('1.1.1')

    const fresh = await post(app('weather', '/v1'), { bearer: alice, body: call })
    expect(fresh.headers.get('x-mcp-version')).toBe('1.1.2')
    expect(await fresh.text()).toContain('1.1.2')
    await expectRefusal(await post(app('weather', '/v1.1.1'), { bearer: alice }), 404, bodies.versionNotFound('1.1.1', '2.0.0'))
  })
})

describe('password reset revokes all of the owner\'s tokens (spec 3)', () => {
  it('POST /dev/password-reset over HTTP: every token of the user 401 at once, another user\'s unaffected', async () => {
    const carol = await signIn('user_carol')
    const created = (await (await api('POST', '', { session: carol, body: { name: 'x', servers: ['app_weather'], expires_in_days: 30 } })).json()) as { token: string }
    const before = await post(app('weather'), { bearer: created.token })
    expect(before.status).toBe(200)
    await before.text()
    const { tokens } = (await (await api('GET', '', { session: carol })).json()) as { tokens: Array<{ status: string }> }
    const active = tokens.filter((t) => t.status === 'active').length
    expect(active).toBeGreaterThanOrEqual(2)
    const reset = await localhostFetch(`http://api.localhost:${served.port}/dev/password-reset`, {
      method: 'POST',
      headers: { cookie: carol.cookie, 'x-csrf-token': carol.csrfToken },
    })
    expect(reset.status).toBe(200)
    expect(await reset.json()).toEqual({ revoked: active })
    const after = (await (await api('GET', '', { session: carol })).json()) as { tokens: Array<{ status: string }> }
    expect(after.tokens.map((t) => t.status).filter((status) => status === 'active')).toEqual([])
    for (const secret of [created.token, carolsRotated!]) {
      const refused = await post(app('weather'), { bearer: secret })
      await expectRefusal(refused, 401, bodies.unauthorized(true))
    }
    expect((await post(app('weather'), { bearer: token('alice') })).status).toBe(200)
  })
})

describe('the api host\'s identity JWKS (docs/platform.md "Hosts")', () => {
  it('answers GET and HEAD alike (HEAD without the body), and another method 405 with Allow (regression: HEAD and POST were 404, as if no JWKS were there)', async () => {
    const url = `http://api.localhost:${served.port}/.well-known/jwks.json`
    const got = await localhostFetch(url)
    expect(got.status).toBe(200)
    expect(got.headers.get('cache-control')).toBe('no-cache')
    const body = await got.text()
    expect((JSON.parse(body) as { keys: unknown[] }).keys).toHaveLength(1)
    const head = await localhostFetch(url, { method: 'HEAD' })
    expect(head.status).toBe(200)
    expect(head.headers.get('content-type')).toBe(got.headers.get('content-type'))
    expect(head.headers.get('cache-control')).toBe('no-cache')
    expect(await head.text()).toBe('')
    // In process too: no body handed to a caller that asked for none.
    const inProcess = await platform.fetch(new Request(url, { method: 'HEAD' }))
    expect(inProcess.status).toBe(200)
    expect(inProcess.body).toBeNull()
    for (const method of ['POST', 'PUT', 'DELETE', 'PATCH']) {
      const refused = await localhostFetch(url, { method })
      expect(refused.status, method).toBe(405)
      expect(refused.headers.get('allow')).toBe('GET, HEAD')
      expect(await refused.json()).toEqual({ error: 'method_not_allowed', message: '/.well-known/jwks.json takes GET or HEAD' })
    }
  })
  it('answers any other path on the api host 404 in the token API\'s error shape, not JSON-RPC (no MCP there), and an unknown host 404 JSON-RPC not_found', async () => {
    for (const [method, path] of [['POST', '/'], ['GET', '/api'], ['GET', '/api/tokenz'], ['POST', '/v1'], ['GET', '/.well-known/oauth-protected-resource']]) {
      const got = await localhostFetch(`http://api.localhost:${served.port}${path}`, { method, headers: { 'content-type': 'application/json' }, ...(method === 'POST' ? { body: '{}' } : {}) })
      expect(got.status, `${method} ${path}`).toBe(404)
      expect(got.headers.get('content-type')).toMatch(/^application\/json/)
      expect(got.headers.get('x-mcp-version')).toBeNull()
      expect(await got.json()).toEqual({ error: 'not_found', message: 'Not found' })
    }
    for (const host of ['localhost', 'a.weather.localhost', 'nowhere.localhost']) {
      const elsewhere = await post(`http://${host}:${served.port}/`, { bearer: token('alice') })
      expect(elsewhere.status, host).toBe(404)
      expect(await elsewhere.json()).toEqual(bodies.notFound)
    }
  })
})
