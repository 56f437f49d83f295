/**
 * The token-management API (spec 2.1, 3, 4.3, 4.4, 5.2; DESIGN.md "API tokens") through the
 * reference platform's `api.localhost` host, with a development dashboard session, and the
 * effect of every lifecycle step on the Apps (real MCP SDK servers behind the Web adapter).
 */
import { gzipSync } from 'node:zlib'
import { generateApiToken } from 'mcp-dispatch'
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest'
import type { Platform } from '../examples/platform/index.js'
import {
  CLIENT,
  DAY,
  type DevSession,
  T0,
  type TestClock,
  type TokenApiCallOptions,
  bodies,
  createTestPlatform,
  devSignIn,
  json,
  mcpRequest,
  tokenApiCall,
} from './helpers/platform.js'

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/
/** The fields of spec 2.1, and only those, in a create or rotate result. */
const SECRET_FIELDS = ['allowed_ips', 'created_at', 'expires_at', 'id', 'name', 'prefix', 'scopes', 'token']
const WEATHER_SCOPE = { server_id: 'app_weather', server_name: 'Weather', server_slug: 'weather' }

let platform: Platform
let clock: TestClock
let token: (name: string) => string
let errors: Array<{ error: unknown; context: string }>

beforeEach(() => {
  ;({ platform, clock, token, errors } = createTestPlatform())
})
afterEach(async () => {
  await platform.close()
  expect(errors).toEqual([])
})

type Session = DevSession

async function signIn(userId: string): Promise<Session> {
  const session = await devSignIn(platform, userId)
  expect(session.cookie).toMatch(/^mcp_dev_session=/)
  return session
}

function call(method: string, path: string, options: TokenApiCallOptions = {}): Promise<Response> {
  return tokenApiCall(platform, method, path, options)
}

/** The status of a tools/list on the weather App with a secret. */
async function appStatus(secret: string, clientAddress = CLIENT, slug = 'weather'): Promise<number> {
  const response = await platform.fetch(mcpRequest(`http://${slug}.localhost/v1`, { token: secret }), { clientAddress })
  return response.status
}

/** Checks a 400 naming `field`; returns the error body. */
async function expectFieldError(response: Response, field: string, status = 400): Promise<{ message: string }> {
  expect(response.status).toBe(status)
  expect(response.headers.get('content-type')).toBe('application/json')
  const body = await json(response)
  expect(body).toMatchObject({ error: 'invalid_request', field })
  expect(body.message.startsWith(`${field}: `)).toBe(true)
  return body
}

async function seededId(userId: string, name: string): Promise<string> {
  const found = (await platform.tokenService.list(userId)).find((t) => t.name === name)
  if (!found) throw new Error(`no token ${name}`)
  return found.id
}

async function createToken(session: Session, body: Record<string, unknown> = {}): Promise<any> {
  const response = await call('POST', '', { session, body: { name: 'CI', servers: ['app_weather'], expires_in_days: 30, ...body } })
  expect(response.status).toBe(201)
  return json(response)
}

describe('dev session (reference platform)', () => {
  it('sets an HttpOnly, SameSite=Strict session cookie and answers the CSRF token', async () => {
    const response = await platform.fetch(
      new Request('http://api.localhost/dev/session', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ userId: 'user_alice' }),
      }),
    )
    expect(response.status).toBe(200)
    const setCookie = response.headers.get('set-cookie') ?? ''
    expect(setCookie).toMatch(/^mcp_dev_session=[^;]+;/)
    expect(setCookie).toMatch(/HttpOnly/)
    expect(setCookie).toMatch(/SameSite=Strict/)
    expect(await json(response)).toEqual({ userId: 'user_alice', csrfToken: expect.any(String) })
  })

  it('an unknown user gets 400 naming userId', async () => {
    const response = await platform.fetch(
      new Request('http://api.localhost/dev/session', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: '{"userId":"user_mallory"}',
      }),
    )
    expect(response.status).toBe(400)
    expect(await json(response)).toMatchObject({ field: 'userId' })
  })

  it('answers loopback clients only, and JSON only (no cross-site simple request can sign anyone in)', async () => {
    const signIn = (clientAddress: string | undefined, contentType = 'application/json') =>
      platform.fetch(
        new Request('http://api.localhost/dev/session', {
          method: 'POST',
          headers: { 'content-type': contentType },
          body: JSON.stringify({ userId: 'user_alice' }),
        }),
        clientAddress === undefined ? undefined : { clientAddress },
      )
    for (const address of ['127.0.0.1', '::1', '::ffff:127.0.0.1']) expect((await signIn(address)).status).toBe(200)
    for (const address of [CLIENT, '10.0.0.1', '::ffff:192.0.2.1']) {
      const refused = await signIn(address)
      expect(refused.status).toBe(403)
      expect(refused.headers.get('set-cookie')).toBeNull()
    }
    const plain = await signIn('127.0.0.1', 'text/plain')
    expect(plain.status).toBe(400)
    expect(await json(plain)).toMatchObject({ field: 'content-type' })
  })

  it('without a session the API answers 401', async () => {
    const response = await call('GET', '')
    expect(response.status).toBe(401)
    expect(await json(response)).toMatchObject({ error: 'unauthorized' })
  })
})

describe('dev deploy (reference platform)', () => {
  const deploy = (body: unknown, clientAddress?: string, contentType = 'application/json') =>
    platform.fetch(
      new Request('http://api.localhost/dev/deploy', {
        method: 'POST',
        headers: { 'content-type': contentType },
        body: typeof body === 'string' ? body : JSON.stringify(body),
      }),
      clientAddress === undefined ? undefined : { clientAddress },
    )
  const servedVersion = async (path: string) => {
    const response = await platform.fetch(mcpRequest(`http://weather.localhost${path}`, { token: token('alice') }), { clientAddress: CLIENT })
    expect(response.status).toBe(200)
    return [response.headers.get('x-mcp-version'), response.headers.get('x-mcp-latest-version')]
  }

  it('makes a version live by the versions rule, by slug or id, and new connections resolve to it', async () => {
    expect(await servedVersion('/v1')).toEqual(['1.1.1', '2.0.0'])
    const minor = await deploy({ app: 'weather', version: '1.2.0' }, '127.0.0.1')
    expect(minor.status).toBe(200)
    expect(await json(minor)).toEqual({ app: 'weather', version: '1.2.0', live: expect.arrayContaining(['1.0.0', '1.1.1', '1.2.0', '2.0.0']) })
    expect(await servedVersion('/v1')).toEqual(['1.2.0', '2.0.0'])
    // A patch replaces the live patch of its minor: the replaced one's exact URL is gone.
    const patch = await deploy({ app: 'app_weather', version: '2.0.1' })
    expect(patch.status).toBe(200)
    expect((await json(patch)).live).not.toContain('2.0.0')
    expect(await servedVersion('/')).toEqual(['2.0.1', '2.0.1'])
    const gone = await platform.fetch(mcpRequest('http://weather.localhost/v2.0.0', { token: token('alice') }), { clientAddress: CLIENT })
    expect(gone.status).toBe(404)
    expect((await json(gone)).error.data).toEqual({ error: 'version_not_found', requested: '2.0.0', latest: '2.0.1' })
  })

  it('a body in a content coding is 400 naming content-encoding, as the token API answers it (not "body: is not JSON"); identity is no coding', async () => {
    const send = (body: BodyInit, coding: string) =>
      platform.fetch(new Request('http://api.localhost/dev/deploy', { method: 'POST', headers: { 'content-type': 'application/json', 'content-encoding': coding }, body }))
    for (const coding of ['gzip', 'GZIP', 'identity, gzip', 'br']) {
      const refused = await send(new Uint8Array(gzipSync(JSON.stringify({ app: 'weather', version: '1.2.0' }))), coding)
      expect(refused.status, coding).toBe(400)
      expect(await json(refused)).toEqual({ error: 'invalid_request', field: 'content-encoding', message: 'content-encoding: is not supported: send the body uncompressed (no Content-Encoding, or identity)' })
    }
    expect(await servedVersion('/v1')).toEqual(['1.1.1', '2.0.0'])
    const identity = await send(JSON.stringify({ app: 'weather', version: '1.2.0' }), 'identity')
    expect(identity.status).toBe(200)
    expect(await servedVersion('/v1')).toEqual(['1.2.0', '2.0.0'])
  })

  it('reads its body as the token API does: a UTF-8 byte order mark is dropped, bytes that are not UTF-8 are 400 naming body (not U+FFFD)', async () => {
    const send = (body: Uint8Array<ArrayBuffer>) => platform.fetch(new Request('http://api.localhost/dev/deploy', { method: 'POST', headers: { 'content-type': 'application/json' }, body }))
    const utf8 = (text: string) => new Uint8Array(Buffer.from(text))
    // A byte that is no UTF-8 inside the version's string: refused, not read as \ufffd.
    const bad = new Uint8Array([...utf8('{"app":"weather","version":"1.2.0-'), 0xff, ...utf8('"}')])
    const refused = await send(bad)
    expect(refused.status).toBe(400)
    expect(await json(refused)).toEqual({ error: 'invalid_request', field: 'body', message: 'body: is not valid UTF-8' })
    expect(await servedVersion('/v1')).toEqual(['1.1.1', '2.0.0'])
    const withMark = await send(new Uint8Array([0xef, 0xbb, 0xbf, ...utf8(JSON.stringify({ app: 'weather', version: '1.2.0' }))]))
    expect(withMark.status).toBe(200)
    expect(await servedVersion('/v1')).toEqual(['1.2.0', '2.0.0'])
  })

  it('refuses what the versions rule refuses with 409, and names the wrong field with 400', async () => {
    for (const version of ['1.1.0', '1.1.1', 'one']) {
      const refused = await deploy({ app: 'weather', version })
      expect(refused.status, version).toBe(409)
      expect(await json(refused)).toMatchObject({ error: 'deploy_refused', field: 'version' })
    }
    await expectFieldError(await deploy({ app: 'nope', version: '9.0.0' }), 'app')
    await expectFieldError(await deploy({ app: 'weather', version: 9 }), 'version')
    await expectFieldError(await deploy({ app: 'weather', version: '9.0.0', upstream: 'ftp://x.example' }), 'upstream')
    await expectFieldError(await deploy('{"app":'), 'body')
    await expectFieldError(await deploy('["weather"]'), 'body')
    await expectFieldError(await deploy({ app: 'weather', version: '9.0.0' }, '127.0.0.1', 'text/plain'), 'content-type')
    // Nothing of those went live.
    expect(await servedVersion('/')).toEqual(['2.0.0', '2.0.0'])
  })

  it('every development endpoint takes POST only: 405 with Allow for another method', async () => {
    for (const path of ['/dev/session', '/dev/deploy', '/dev/password-reset']) {
      for (const method of ['GET', 'PUT', 'DELETE']) {
        const response = await platform.fetch(new Request(`http://api.localhost${path}`, { method }))
        expect(response.status, `${method} ${path}`).toBe(405)
        expect(response.headers.get('allow')).toBe('POST')
        expect(await json(response)).toMatchObject({ error: 'method_not_allowed' })
      }
    }
  })

  it('answers loopback clients only', async () => {
    for (const address of [CLIENT, '10.0.0.1', '::ffff:192.0.2.1']) {
      const refused = await deploy({ app: 'weather', version: '3.0.0' }, address)
      expect(refused.status).toBe(403)
      expect(await json(refused)).toMatchObject({ error: 'forbidden' })
    }
    expect(await servedVersion('/')).toEqual(['2.0.0', '2.0.0'])
  })
})

describe('create (spec 2.1, 3)', () => {
  it('201 with the fields of spec 2.1 and the full secret, shown once; the token works at once', async () => {
    const alice = await signIn('user_alice')
    const response = await call('POST', '', {
      session: alice,
      body: { name: 'CI deploys', servers: ['app_weather'], expires_in_days: 30, allowed_ips: null },
    })
    expect(response.status).toBe(201)
    expect(response.headers.get('cache-control')).toBe('no-store')
    const created = await json(response)
    expect(response.headers.get('location')).toBe(`/api/tokens/${created.id}`)
    expect(Object.keys(created).sort()).toEqual(SECRET_FIELDS)
    expect(created).toEqual({
      token: expect.stringMatching(/^svc_[0-9A-Za-z]{44}$/),
      id: expect.stringMatching(UUID),
      name: 'CI deploys',
      prefix: created.token.slice(0, 12),
      expires_at: new Date(T0 + 30 * DAY).toISOString(),
      allowed_ips: null,
      scopes: [WEATHER_SCOPE],
      created_at: new Date(T0).toISOString(),
    })
    expect(created.token).toHaveLength(48)
    expect(created.expires_at).toMatch(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/)
    expect(await appStatus(created.token)).toBe(200)
    // Scope is fixed to the servers named: notes is out of reach although alice subscribes.
    expect(await appStatus(created.token, CLIENT, 'notes')).toBe(403)
  })

  it('409 conflict past 1,000 active tokens of one user, until one is revoked', async () => {
    const carol = await signIn('user_carol')
    // carol holds her seeded token; 999 more through the service, then the API refuses.
    for (let i = 0; i < 999; i++) await platform.tokenService.create({ userId: 'user_carol', name: `t${i}`, servers: ['app_weather'], expiresInDays: 7 })
    const refused = await call('POST', '', { session: carol, body: { name: 'one more', servers: ['app_weather'], expires_in_days: 7 } })
    expect(refused.status).toBe(409)
    expect(await json(refused)).toEqual({ error: 'conflict', message: 'At most 1000 active tokens per user: revoke one before creating another' })
    expect((await platform.tokenService.list('user_carol')).length).toBe(1_000)
    await platform.tokenService.revoke('user_carol', await seededId('user_carol', 'carol'))
    expect((await call('POST', '', { session: carol, body: { name: 'one more', servers: ['app_weather'], expires_in_days: 7 } })).status).toBe(201)
  })

  it('7, 30 and 90 days; several servers; an allowlist', async () => {
    const alice = await signIn('user_alice')
    for (const days of [7, 90]) {
      expect((await createToken(alice, { expires_in_days: days })).expires_at).toBe(new Date(T0 + days * DAY).toISOString())
    }
    const multi = await createToken(alice, { servers: ['app_weather', 'app_notes'], allowed_ips: ['203.0.113.0/24', '2001:db8::1'] })
    expect(multi.scopes).toEqual([WEATHER_SCOPE, { server_id: 'app_notes', server_name: 'Notes', server_slug: 'notes' }])
    expect(multi.allowed_ips).toEqual(['203.0.113.0/24', '2001:db8::1'])
    expect(await appStatus(multi.token, '203.0.113.50', 'notes')).toBe(200)
    expect(await appStatus(multi.token, '2001:db8::1')).toBe(200)
    expect(await appStatus(multi.token, CLIENT)).toBe(403)
  })

  it.each([
    ['name', { name: '' }],
    ['name', { name: '   ' }],
    ['name', { name: 'x'.repeat(101) }],
    ['name', { name: 42 }],
    ['name', { name: undefined }],
    ['servers', { servers: [] }],
    ['servers', { servers: 'app_weather' }],
    ['servers', { servers: undefined }],
    ['servers.0', { servers: ['app_unknown'] }],
    ['servers.1', { servers: ['app_weather', 'app_nope'] }],
    ['expires_in_days', { expires_in_days: 1 }],
    ['expires_in_days', { expires_in_days: 365 }],
    ['expires_in_days', { expires_in_days: '30' }],
    ['expires_in_days', { expires_in_days: null }],
    ['expires_in_days', { expires_in_days: undefined }],
    ['allowed_ips.0', { allowed_ips: ['not-an-ip'] }],
    ['allowed_ips.0', { allowed_ips: ['10.0.0.0/33'] }],
    ['allowed_ips.1', { allowed_ips: ['10.0.0.1', '999.1.1.1'] }],
    ['allowed_ips', { allowed_ips: '10.0.0.1' }],
    ['scopes', { scopes: ['app_weather'] }],
  ])('bad input: 400 naming %s, and nothing is created', async (field, patch) => {
    const alice = await signIn('user_alice')
    const before = (await json(await call('GET', '', { session: alice }))).tokens.length
    const body = { name: 'CI', servers: ['app_weather'], expires_in_days: 30, ...patch }
    await expectFieldError(await call('POST', '', { session: alice, body }), field)
    expect((await json(await call('GET', '', { session: alice }))).tokens).toHaveLength(before)
  })

  it.each(['__proto__', 'constructor', 'toString', 'hasOwnProperty', 'valueOf'])(
    'an unknown field named like a property of every object (%s): 400 naming it, on create and edit, nothing changed',
    async (key) => {
      const alice = await signIn('user_alice')
      const before = await json(await call('GET', '', { session: alice }))
      // As raw JSON: in an object literal `__proto__` would set the prototype, not a key.
      const create = `{"name":"CI","servers":["app_weather"],"expires_in_days":30,${JSON.stringify(key)}:{}}`
      expect((await expectFieldError(await call('POST', '', { session: alice, rawBody: create }), key)).message).toBe(
        `${key}: is not a known field`,
      )
      const id = await seededId('user_alice', 'alice')
      await expectFieldError(await call('PATCH', `/${id}`, { session: alice, rawBody: `{${JSON.stringify(key)}:1}` }), key)
      expect(await json(await call('GET', '', { session: alice }))).toEqual(before)
    },
  )

  it('an unknown field with a long name: 400 naming its first 64 characters, not the whole name sent back (a surrogate pair kept whole)', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const long = 'x'.repeat(10_000)
    const edited = await expectFieldError(await call('PATCH', `/${id}`, { session: alice, body: { [long]: 1 } }), `${'x'.repeat(64)}…`)
    expect(edited.message).toBe(`${'x'.repeat(64)}…: is not a known field`)
    // Characters are code points: a surrogate pair is one, never halved into a lone surrogate.
    const astral = `${'y'.repeat(63)}😀${'y'.repeat(100)}`
    const created = await expectFieldError(
      await call('POST', '', { session: alice, body: { name: 'CI', servers: ['app_weather'], expires_in_days: 30, [astral]: 1 } }),
      `"${'y'.repeat(63)}😀…"`,
    )
    expect(created.message).toBe(`"${'y'.repeat(63)}😀…": is not a known field`)
    const emoji = '😀'.repeat(40)
    const shown = await expectFieldError(await call('PATCH', `/${id}`, { session: alice, body: { [emoji]: 1 } }), `"${emoji}"`)
    expect(shown.message).toBe(`"${emoji}": is not a known field`)
    // Exactly 64 characters: named whole.
    await expectFieldError(await call('PATCH', `/${id}`, { session: alice, body: { ['z'.repeat(64)]: 1 } }), 'z'.repeat(64))
  })

  it('a secret pasted into the wrong place (a key, an allowlist entry) is refused without being sent back: error bodies end up in logs', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const secret = generateApiToken()
    const asKey = await expectFieldError(
      await call('POST', '', { session: alice, body: { name: 'CI', servers: ['app_weather'], expires_in_days: 30, [secret]: true } }),
      '[not shown: it looks like a secret]',
    )
    expect(asKey.message).toBe('[not shown: it looks like a secret]: is not a known field')
    const asEntry = await expectFieldError(await call('PATCH', `/${id}`, { session: alice, body: { allowed_ips: ['10.0.0.1', secret] } }), 'allowed_ips.1')
    expect(asEntry.message).toBe('allowed_ips.1: entry 1 ([not shown: it looks like a secret]) is not an IPv4/IPv6 address or CIDR range')
    // An OAuth access token's part, too; what is no secret is still quoted.
    const jwtPart = 'eyJhbGciOiJSUzI1NiIsInR5cCI6ImF0K2p3dCJ9'
    const asJwt = await expectFieldError(await call('PATCH', `/${id}`, { session: alice, body: { allowed_ips: [jwtPart] } }), 'allowed_ips.0')
    expect(asJwt.message).not.toContain(jwtPart)
    const plain = await expectFieldError(await call('PATCH', `/${id}`, { session: alice, body: { allowed_ips: ['localhost'] } }), 'allowed_ips.0')
    expect(plain.message).toContain('("localhost")')
  })

  it('an unknown key holding a line break, a space or an invisible character is named in JSON quotes with escapes: an error body cannot forge a log line', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    for (const [key, shown] of [
      ['a\r\nSet-Cookie: x=1', '"a\\r\\nSet-Cookie: x=1"'],
      ['my field', '"my field"'],
      ['', '""'],
      ['name\u200b', '"name\\u200b"'],
      ['x\u202ey\u2028z\u0085', '"x\\u202ey\\u2028z\\u0085"'],
      ['caf\u00e9', '"caf\u00e9"'],
    ]) {
      const edited = await expectFieldError(await call('PATCH', `/${id}`, { session: alice, rawBody: `{${JSON.stringify(key)}:1}` }), shown!)
      expect(edited.message).toBe(`${shown}: is not a known field`)
      expect(edited.message).not.toMatch(/[\r\n\u0085\u2028\u200b\u202e]/)
    }
    // A lone surrogate is escaped too, so the body is well-formed Unicode a strict decoder takes.
    const lone = await call('PATCH', `/${id}`, { session: alice, rawBody: '{"x\\ud800":1}' })
    expect(lone.status).toBe(400)
    const text = await lone.text()
    expect(text).toContain('"x\\\\ud800\\"')
    expect(JSON.parse(text).field).toBe('"x\\ud800"')
  })

  it('a missing field is named with the key sent in its place, spelt with other separators, in fullwidth letters or with an invisible character', async () => {
    const alice = await signIn('user_alice')
    for (const [key, shown] of [
      ['expires_in_days\u200b', '"expires_in_days\\u200b"'],
      ['expires-in-days', '"expires-in-days"'],
      ['\uff45xpires_in_days', '"\uff45xpires_in_days"'],
    ]) {
      const created = await expectFieldError(
        await call('POST', '', { session: alice, rawBody: JSON.stringify({ name: 'CI', servers: ['app_weather'], [key!]: 30 }) }),
        'expires_in_days',
      )
      expect(created.message).toBe(`expires_in_days: is required (${shown} is not a known field)`)
    }
  })

  it('a camelCase key (as the TypeScript service spells it) is refused under the name it was sent with, not blamed on the API\'s own name', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    for (const [key, value] of [['expiresAt', '2030-01-01T00:00:00Z'], ['allowedIps', ['10.0.0.1']]] as const) {
      const edited = await expectFieldError(await call('PATCH', `/${id}`, { session: alice, body: { [key]: value } }), key)
      expect(edited.message).toBe(`${key}: is not a known field`)
    }
    // On create, the field it takes the place of is missing: that is said first, by its name,
    // with the key sent in its place.
    const created = await expectFieldError(
      await call('POST', '', { session: alice, body: { name: 'CI', servers: ['app_weather'], expiresInDays: 30 } }),
      'expires_in_days',
    )
    expect(created.message).toBe('expires_in_days: is required ("expiresInDays" is not a known field)')
    // Only a key that spells the missing field another way is named: another is no hint.
    const unrelated = await expectFieldError(await call('POST', '', { session: alice, body: { servers: ['app_weather'], expiresInDays: 30 } }), 'name')
    expect(unrelated.message).toBe('name: is required')
    const extra = { name: 'CI', servers: ['app_weather'], expires_in_days: 30, allowedIps: ['10.0.0.1'] }
    expect((await expectFieldError(await call('POST', '', { session: alice, body: extra }), 'allowedIps')).message).toBe(
      'allowedIps: is not a known field',
    )
    // A field the service refuses is still named as the API spells it.
    await expectFieldError(await call('POST', '', { session: alice, body: { name: 'CI', servers: ['app_weather'], expires_in_days: 8 } }), 'expires_in_days')
  })

  it.each([
    ['name', { name: 5 }, 'name: must be a string'],
    ['servers', { servers: 'app_weather' }, 'servers: must be an array'],
    ['allowed_ips', { allowed_ips: 5 }, 'allowed_ips: must be an array of IP addresses or CIDR ranges, or null'],
    ['allowed_ips.0', { allowed_ips: [5] }, 'allowed_ips.0: must be a string (an IP address or CIDR range)'],
  ])('a value of the wrong type (%s) is told in words, not in the validator\'s', async (field, patch, message) => {
    const alice = await signIn('user_alice')
    const body = { name: 'CI', servers: ['app_weather'], expires_in_days: 30, ...patch }
    expect((await expectFieldError(await call('POST', '', { session: alice, body }), field)).message).toBe(message)
  })

  it('a server the creator neither owns nor subscribes to is refused (spec 2.1)', async () => {
    const bob = await signIn('user_bob') // bob's subscription to weather is inactive
    await expectFieldError(await call('POST', '', { session: bob, body: { name: 'x', servers: ['app_weather'], expires_in_days: 7 } }), 'servers.0')
  })

  it('a body that is not JSON, or not declared as JSON', async () => {
    const alice = await signIn('user_alice')
    await expectFieldError(await call('POST', '', { session: alice, rawBody: '{"name":' }), 'body')
    await expectFieldError(await call('POST', '', { session: alice, rawBody: '[]' }), 'body')
    await expectFieldError(await call('POST', '', { session: alice, rawBody: '{}', contentType: 'text/plain' }), 'content-type')
    for (const contentType of ['application/json-seq', 'application/json-patch+json', 'application/jsonx']) {
      await expectFieldError(await call('POST', '', { session: alice, rawBody: '{}', contentType }), 'content-type')
    }
    // Parameters are fine.
    await expectFieldError(await call('POST', '', { session: alice, rawBody: '{}', contentType: 'application/json ; charset=utf-8' }), 'name')
    await expectFieldError(await call('POST', '', { session: alice, rawBody: JSON.stringify({ name: 'x'.repeat(20_000) }) }), 'body')
  })

  it('a body that is not UTF-8 is refused, not stored with U+FFFD in place of what was sent', async () => {
    const alice = await signIn('user_alice')
    const before = (await json(await call('GET', '', { session: alice }))).tokens.length
    const encode = (text: string) => new TextEncoder().encode(text)
    const bytes = (...parts: (string | number[])[]) => new Uint8Array(parts.flatMap((p) => [...(typeof p === 'string' ? encode(p) : p)]))
    const rest = '","servers":["app_weather"],"expires_in_days":7}'
    // Bytes no UTF-8 text holds, an overlong encoding, and a sequence cut short at the end.
    for (const rawBody of [bytes('{"name":"', [0xff, 0xfe], rest), bytes('{"name":"', [0xc0, 0xaf], rest), bytes('{"name":"x', rest, [0xe2, 0x82])]) {
      const refused = await expectFieldError(await call('POST', '', { session: alice, rawBody }), 'body')
      expect(refused.message).toBe('body: is not valid UTF-8')
    }
    expect((await json(await call('GET', '', { session: alice }))).tokens.length).toBe(before)
    // UTF-8 beyond ASCII is taken as it is.
    const made = await call('POST', '', { session: alice, rawBody: bytes('{"name":"Caf\u00e9 \u{1F680}', rest) })
    expect(made.status).toBe(201)
    expect((await json(made)).name).toBe('Caf\u00e9 \u{1F680}')
  })

  it('a body in a content coding (gzip, br) is refused naming Content-Encoding, not read as JSON nor called invalid UTF-8', async () => {
    const alice = await signIn('user_alice')
    const before = (await json(await call('GET', '', { session: alice }))).tokens.length
    const body = { name: 'coded', servers: ['app_weather'], expires_in_days: 7 }
    const gzipped = new Uint8Array(gzipSync(JSON.stringify(body)))
    for (const coding of ['gzip', 'GZIP', 'br', 'deflate', 'gzip, identity']) {
      const refused = await expectFieldError(await call('POST', '', { session: alice, rawBody: gzipped, headers: { 'content-encoding': coding } }), 'content-encoding')
      expect(refused.message).toBe('content-encoding: is not supported: send the body uncompressed (no Content-Encoding, or identity)')
    }
    // A rotation takes no body, coded or not: nothing is rotated.
    const made = await json(await call('POST', '', { session: alice, body }))
    const rotation = await call('POST', `/${made.id}/rotate`, { bearer: made.token, rawBody: new Uint8Array(gzipSync('{}')), headers: { 'content-encoding': 'gzip' } })
    await expectFieldError(rotation, 'content-encoding')
    expect(await appStatus(made.token)).toBe(200)
    // An empty body is no body, whatever its label: the rotation is made.
    const empty = await call('POST', `/${made.id}/rotate`, { bearer: made.token, headers: { 'content-encoding': 'gzip' } })
    expect(empty.status).toBe(200)
    expect(await appStatus((await json(empty)).token)).toBe(200)
    // No coding at all, said in any case and spacing, is the body as sent.
    for (const coding of ['identity', 'Identity', ' identity ', '']) {
      const plain = await call('POST', '', { session: alice, body: { ...body, name: `plain ${coding}` }, headers: { 'content-encoding': coding } })
      expect(plain.status).toBe(201)
    }
    expect((await json(await call('GET', '', { session: alice }))).tokens.length).toBe(before + 5)
  })

  it('a body past the limit is refused while it streams in, never read whole', async () => {
    const alice = await signIn('user_alice')
    let pulled = 0
    let cancelled = false
    const endless = new ReadableStream<Uint8Array>({
      pull(controller) {
        pulled += 4096
        controller.enqueue(new Uint8Array(4096).fill(0x20))
      },
      cancel() {
        cancelled = true
      },
    })
    const headers = { cookie: alice.cookie, 'x-csrf-token': alice.csrfToken, 'content-type': 'application/json' }
    const request = new Request('http://api.localhost/api/tokens', { method: 'POST', headers, body: endless, duplex: 'half' } as RequestInit)
    const response = await platform.fetch(request, { clientAddress: CLIENT })
    await expectFieldError(response, 'body')
    expect((await json(await call('GET', '', { session: alice }))).tokens.every((t: { name: string }) => t.name !== '')).toBe(true)
    expect(pulled).toBeLessThan(64 * 1024)
    await vi.waitFor(() => expect(cancelled).toBe(true))
  })

  it('a missing field is "required", by name', async () => {
    const alice = await signIn('user_alice')
    const noName = await call('POST', '', { session: alice, body: { servers: ['app_weather'], expires_in_days: 7 } })
    expect((await expectFieldError(noName, 'name')).message).toBe('name: is required')
    const noDays = await call('POST', '', { session: alice, body: { name: 'x', servers: ['app_weather'] } })
    expect((await expectFieldError(noDays, 'expires_in_days')).message).toBe('expires_in_days: is required')
  })

  it('a cookie-authenticated write needs the CSRF token (403 without or with a wrong one)', async () => {
    const alice = await signIn('user_alice')
    const body = { name: 'CI', servers: ['app_weather'], expires_in_days: 30 }
    const missing = await call('POST', '', { session: alice, csrf: false, body })
    expect(missing.status).toBe(403)
    expect(await json(missing)).toMatchObject({ error: 'csrf_failed' })
    const wrong = await call('POST', '', { session: { ...alice, csrfToken: 'x'.repeat(alice.csrfToken.length) }, body })
    expect(wrong.status).toBe(403)
    expect((await json(await call('GET', '', { session: alice }))).tokens.map((t: { name: string }) => t.name)).not.toContain('CI')
  })

  it('an API token cannot manage tokens (only rotate itself): 403, saying what the rest needs', async () => {
    const response = await call('POST', '', { bearer: token('alice'), body: { name: 'x', servers: ['app_weather'], expires_in_days: 7 } })
    expect(response.status).toBe(403)
    expect(await json(response)).toEqual({
      error: 'forbidden',
      message: 'A Bearer token may only rotate itself (POST {id}/rotate); the rest of the token API needs a dashboard session',
    })
    expect((await call('GET', '', { bearer: token('alice') })).status).toBe(403)
    // Nor can an OAuth access token (any Bearer credential that is not an API token), which
    // is told the same rather than that API tokens rotate themselves.
    const oauth = await call('GET', '', { authorization: 'Bearer eyJhbGciOiJSUzI1NiJ9.e30.c2ln' })
    expect(oauth.status).toBe(403)
    expect((await json(oauth)).message).toMatch(/^A Bearer token may only rotate itself/)
  })
})

describe('another Authorization scheme', () => {
  it('HTTP Basic (a staging dashboard behind a password) is not an API token: the session decides', async () => {
    const alice = await signIn('user_alice')
    const basic = 'Basic c3RhZ2luZzpwYXNzd29yZA=='
    expect((await call('GET', '', { session: alice, authorization: basic })).status).toBe(200)
    const created = await call('POST', '', {
      session: alice,
      authorization: basic,
      body: { name: 'behind basic', servers: ['app_weather'], expires_in_days: 7 },
    })
    expect(created.status).toBe(201)
    const { id } = await json(created)
    expect((await call('POST', `/${id}/rotate`, { session: alice, authorization: basic })).status).toBe(200)
    expect((await call('PATCH', `/${id}`, { session: alice, authorization: basic, body: { name: 'renamed' } })).status).toBe(200)
    expect((await call('DELETE', `/${id}`, { session: alice, authorization: basic })).status).toBe(200)
    // Without a session, the scheme alone authenticates no one.
    expect((await call('GET', '', { authorization: basic })).status).toBe(401)
  })

  it('a Bearer credential that is not well formed is still one: 403 beside a session, 401 on a rotation', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice-notes')
    for (const authorization of ['Bearer', 'Bearer ', 'bearer %%%', 'BEARER a b']) {
      expect((await call('GET', '', { session: alice, authorization })).status).toBe(403)
      expect((await call('POST', `/${id}/rotate`, { session: alice, authorization })).status).toBe(401)
    }
  })
})

describe('list (spec 2.1: name, prefix, servers, expiration, last use)', () => {
  it("shows the session user's tokens without any secret", async () => {
    const alice = await signIn('user_alice')
    const created = await createToken(alice, { name: 'listed' })
    const response = await call('GET', '', { session: alice })
    expect(response.status).toBe(200)
    const text = await response.text()
    for (const secret of [created.token, ...Object.values(platform.tokens)]) expect(text).not.toContain(secret)
    const { tokens } = JSON.parse(text)
    expect(tokens.every((t: Record<string, unknown>) => !('token' in t))).toBe(true)
    const listed = tokens.find((t: { id: string }) => t.id === created.id)
    expect(listed).toEqual({
      id: created.id,
      name: 'listed',
      prefix: created.prefix,
      expires_at: created.expires_at,
      allowed_ips: null,
      scopes: [WEATHER_SCOPE],
      created_at: created.created_at,
      last_used_at: null,
      status: 'active',
    })
    const names = tokens.map((t: { name: string }) => t.name)
    expect(names).toContain('alice-notes')
    expect(names).not.toContain('bob')
    expect(names).not.toContain('carol')
  })

  it('last_used_at shows when a token was used (coalesced writes)', async () => {
    const alice = await signIn('user_alice')
    clock.advance(5_000)
    expect(await appStatus(token('alice'))).toBe(200)
    const usedAt = async () => (await json(await call('GET', '', { session: alice }))).tokens.find((t: { name: string }) => t.name === 'alice').last_used_at
    // Shown at once, before the coalesced write (regression: it stayed null until a later
    // request of any token came a flush interval after the last write), and after it.
    expect(await usedAt()).toBe(new Date(T0 + 5_000).toISOString())
    await platform.tokenService.flush()
    expect(await usedAt()).toBe(new Date(T0 + 5_000).toISOString())
  })

  it("another user's token is 404, exactly like a missing one", async () => {
    const bob = await signIn('user_bob')
    const id = await seededId('user_alice', 'alice')
    const theirs = await call('GET', `/${id}`, { session: bob })
    const missing = await call('GET', '/00000000-0000-4000-8000-000000000000', { session: bob })
    expect(theirs.status).toBe(404)
    expect(missing.status).toBe(404)
    expect(await json(theirs)).toEqual(await json(missing))
  })
})

describe('HEAD and encoded ids', () => {
  it('HEAD is GET without the body (RFC 9110 section 9.3.2): the same status and headers, refusals included', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    for (const path of ['', `/${id}`]) {
      const got = await call('GET', path, { session: alice })
      const head = await call('HEAD', path, { session: alice })
      expect(head.status).toBe(200)
      expect(head.headers.get('content-type')).toBe(got.headers.get('content-type'))
      expect(await head.text()).toBe('')
    }
    const refused = await call('HEAD', '')
    expect(refused.status).toBe(401)
    expect(await refused.text()).toBe('')
    const wrongMethod = await call('PUT', '', { session: alice })
    expect(wrongMethod.headers.get('allow')).toBe('GET, HEAD, POST')
  })

  it('an id with percent-encoded characters is the id itself (RFC 3986 section 6.2.2.2)', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const encoded = [...id].map((c, i) => (i === 0 ? `%${c.charCodeAt(0).toString(16)}` : c)).join('')
    expect(await json(await call('GET', `/${encoded}`, { session: alice }))).toMatchObject({ id })
  })
  it('an id in upper case names the same token (RFC 9562: UUIDs are case-insensitive on input), answered with its id in lower case; someone else\'s is still 404', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const upper = id.toUpperCase()
    expect(upper).not.toBe(id)
    expect(await json(await call('GET', `/${upper}`, { session: alice }))).toMatchObject({ id, name: 'alice' })
    const edited = await call('PATCH', `/${upper}`, { session: alice, body: { name: 'alice renamed' } })
    expect(edited.status).toBe(200)
    expect(await json(edited)).toMatchObject({ id, name: 'alice renamed' })
    // Rotated by its own secret, then by the owner's session: the new secrets serve the App.
    const byBearer = await call('POST', `/${upper}/rotate`, { bearer: token('alice') })
    expect(byBearer.status).toBe(200)
    const first = await json(byBearer)
    expect(first.id).toBe(id)
    expect(await appStatus(token('alice'))).toBe(401)
    expect(await appStatus(first.token)).toBe(200)
    const bySession = await call('POST', `/${upper}/rotate`, { session: alice })
    expect(bySession.status).toBe(200)
    const second = await json(bySession)
    expect(second.id).toBe(id)
    expect(await appStatus(first.token)).toBe(401)
    expect(await appStatus(second.token)).toBe(200)
    const revoked = await call('DELETE', `/${upper}`, { session: alice })
    expect(await json(revoked)).toMatchObject({ id, status: 'revoked' })
    expect(await appStatus(second.token)).toBe(401)
    // No existence oracle in either case: Bob's session gets 404 for Alice's id.
    const bob = await signIn('user_bob')
    for (const path of [`/${id}`, `/${upper}`]) {
      const response = await call('GET', path, { session: bob })
      expect(response.status).toBe(404)
      expect(await json(response)).toEqual({ error: 'not_found', message: 'Token not found' })
    }
  })
})

describe('edit (spec 2.1, 3, 4.4)', () => {
  it('name, expires_at and allowed_ips change, and the App sees the change at once', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const secret = token('alice')
    const newExpiry = new Date(T0 + 10 * DAY).toISOString()
    const response = await call('PATCH', `/${id}`, {
      session: alice,
      body: { name: 'renamed', expires_at: newExpiry, allowed_ips: ['203.0.113.7'] },
    })
    expect(response.status).toBe(200)
    expect(await json(response)).toMatchObject({ id, name: 'renamed', expires_at: newExpiry, allowed_ips: ['203.0.113.7'] })
    expect(await appStatus(secret, CLIENT)).toBe(403)
    expect(await appStatus(secret, '203.0.113.7')).toBe(200)

    expect((await call('PATCH', `/${id}`, { session: alice, body: { allowed_ips: null } })).status).toBe(200)
    expect(await appStatus(secret, CLIENT)).toBe(200)

    clock.advance(10 * DAY) // the new expiry, not the original 30 days
    expect(await appStatus(secret)).toBe(401)
  })

  it('may move expires_at up to 90 days after creation, never past it nor into the past', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const limit = new Date(T0 + 90 * DAY).toISOString()
    expect(await json(await call('PATCH', `/${id}`, { session: alice, body: { expires_at: limit } }))).toMatchObject({ expires_at: limit })
    for (const bad of [new Date(T0 + 90 * DAY + 1).toISOString(), new Date(T0 - 1).toISOString(), 'tomorrow', 12]) {
      await expectFieldError(await call('PATCH', `/${id}`, { session: alice, body: { expires_at: bad } }), 'expires_at')
    }
  })

  it('expires_at is an ISO 8601 string of a real date: no epoch numbers, no calendar roll-over', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const before = await json(await call('GET', `/${id}`, { session: alice }))
    const inRange = new Date(T0 + 10 * DAY)
    const year = inRange.getUTCFullYear()
    for (const bad of [inRange.getTime(), `${year}-02-30T00:00:00Z`, `${year}-11-31T00:00:00Z`, `${inRange.toISOString().slice(0, 10)}T24:00:00Z`]) {
      const response = await call('PATCH', `/${id}`, { session: alice, body: { expires_at: bad } })
      expect((await expectFieldError(response, 'expires_at')).message).toMatch(/ISO 8601/)
    }
    expect(await json(await call('GET', `/${id}`, { session: alice }))).toEqual(before)
  })

  it('expires_at may write its T and Z in lower case (RFC 3339 section 5.6), and an offset in either case', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const at = new Date(T0 + 10 * DAY)
    for (const [text, ms] of [
      [at.toISOString().replace('T', 't').replace('Z', 'z'), at.getTime()],
      [`${at.toISOString().slice(0, 19).replace('T', 't')}+02:00`, at.getTime() - 2 * 3_600_000 - (at.getTime() % 1000)],
    ] as const) {
      const response = await call('PATCH', `/${id}`, { session: alice, body: { expires_at: text } })
      expect(response.status).toBe(200)
      expect((await json(response)).expires_at).toBe(new Date(ms).toISOString())
    }
  })

  it.each([
    ['servers', { servers: ['app_notes'] }],
    ['scopes', { scopes: [] }],
    ['name', { name: '' }],
    ['allowed_ips.0', { allowed_ips: ['300.0.0.1'] }],
    ['created_at', { created_at: '2020-01-01T00:00:00.000Z' }],
  ])('refuses %s with 400 naming it, changing nothing', async (field, body) => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const before = await json(await call('GET', `/${id}`, { session: alice }))
    await expectFieldError(await call('PATCH', `/${id}`, { session: alice, body }), field)
    expect(await json(await call('GET', `/${id}`, { session: alice }))).toEqual(before)
    expect(await appStatus(token('alice'))).toBe(200)
  })

  it('needs the CSRF token, and the owner', async () => {
    const alice = await signIn('user_alice')
    const bob = await signIn('user_bob')
    const id = await seededId('user_alice', 'alice')
    expect((await call('PATCH', `/${id}`, { session: alice, csrf: false, body: { name: 'x' } })).status).toBe(403)
    expect((await call('PATCH', `/${id}`, { session: bob, body: { name: 'x' } })).status).toBe(404)
  })
})

describe('rotate (spec 3, 4.3)', () => {
  it('by the token itself (Bearer, no cookie, no CSRF): new secret and prefix, everything else kept', async () => {
    const id = await seededId('user_alice', 'alice')
    const old = token('alice')
    const alice = await signIn('user_alice')
    const before = await json(await call('GET', `/${id}`, { session: alice }))
    clock.advance(3 * DAY) // rotation never extends the expiry
    const response = await call('POST', `/${id}/rotate`, { bearer: old })
    expect(response.status).toBe(200)
    const rotated = await json(response)
    expect(Object.keys(rotated).sort()).toEqual(SECRET_FIELDS)
    expect(rotated).toEqual({
      token: expect.stringMatching(/^svc_[0-9A-Za-z]{44}$/),
      id,
      name: 'alice',
      prefix: rotated.token.slice(0, 12),
      expires_at: before.expires_at,
      allowed_ips: null,
      scopes: [WEATHER_SCOPE],
      created_at: before.created_at,
    })
    expect(rotated.token).not.toBe(old)
    expect(rotated.prefix).not.toBe(before.prefix)
    // The old secret is invalid at once, on the App and for another rotation.
    expect(await appStatus(old)).toBe(401)
    expect(await appStatus(rotated.token)).toBe(200)
    expect((await call('POST', `/${id}/rotate`, { bearer: old })).status).toBe(401)
    expect((await json(await call('GET', `/${id}`, { session: alice }))).prefix).toBe(rotated.prefix)
  })

  it('rotations by made-up tokens share the address budget of the MCP path: 401 each, then 429 rate_limited with Retry-After', async () => {
    const id = await seededId('user_alice', 'alice')
    // The default budget: 600 lookups of made-up tokens per address and minute.
    for (let i = 0; i < 600; i++) expect((await call('POST', `/${id}/rotate`, { bearer: generateApiToken() })).status).toBe(401)
    const spent = await call('POST', `/${id}/rotate`, { bearer: generateApiToken() })
    expect(spent.status).toBe(429)
    expect(spent.headers.get('retry-after')).toMatch(/^[1-9][0-9]*$/)
    expect(spent.headers.get('ratelimit-policy')).toBe('"unverified";q=600;w=60')
    expect(spent.headers.get('ratelimit')).toBe(`"unverified";r=0;t=${spent.headers.get('retry-after')}`)
    expect(await json(spent)).toEqual({ error: 'rate_limited', message: 'Too many unverified access tokens from this client address' })
    // The MCP path from that address is spent too; another address is not.
    expect(await appStatus(generateApiToken())).toBe(429)
    expect(await appStatus(generateApiToken(), '198.51.100.30')).toBe(401)
  })

  it("a Bearer token cannot rotate another token, even one of the same owner: 403, nothing changes", async () => {
    const other = await seededId('user_alice', 'alice-notes')
    const response = await call('POST', `/${other}/rotate`, { bearer: token('alice') })
    expect(response.status).toBe(403)
    expect(await json(response)).toMatchObject({ error: 'forbidden' })
    expect(await appStatus(token('alice-notes'), CLIENT, 'notes')).toBe(200)
    expect(await appStatus(token('alice'))).toBe(200)
  })

  it('a Bearer rotation is held to the token allowlist (regression: the platform passed no client address)', async () => {
    const id = await seededId('user_alice', 'ipv4') // allowlist 203.0.113.7
    expect((await call('POST', `/${id}/rotate`, { bearer: token('ipv4'), clientAddress: CLIENT })).status).toBe(403)
    expect(await appStatus(token('ipv4'), '203.0.113.7')).toBe(200)
    const ok = await call('POST', `/${id}/rotate`, { bearer: token('ipv4'), clientAddress: '203.0.113.7' })
    expect(ok.status).toBe(200)
    expect((await json(ok)).allowed_ips).toEqual(['203.0.113.7'])
  })

  it('an unusable Bearer (garbage, unknown, expired) is 401 invalid_token (RFC 6750 section 3.1)', async () => {
    const id = await seededId('user_alice', 'alice-week')
    const refused = async (bearer: string) => {
      const response = await call('POST', `/${id}/rotate`, { bearer })
      expect(response.status).toBe(401)
      expect(response.headers.get('www-authenticate')).toBe('Bearer error="invalid_token"')
    }
    await refused('svc_nope')
    await refused(`svc_${'A'.repeat(44)}`)
    clock.advance(7 * DAY)
    await refused(token('alice-week'))
    // No credential at all: a challenge with no error code.
    const none = await call('POST', `/${id}/rotate`)
    expect(none.status).toBe(401)
    expect(none.headers.get('www-authenticate')).toBe('Bearer')
  })

  it('by the session owner: CSRF required; the old secret stops at once', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice-notes')
    const withoutCsrf = await call('POST', `/${id}/rotate`, { session: alice, csrf: false })
    expect(withoutCsrf.status).toBe(403)
    expect(await appStatus(token('alice-notes'), CLIENT, 'notes')).toBe(200)
    const response = await call('POST', `/${id}/rotate`, { session: alice })
    expect(response.status).toBe(200)
    const rotated = await json(response)
    expect(rotated).toMatchObject({ id, name: 'alice-notes', prefix: rotated.token.slice(0, 12) })
    expect(await appStatus(token('alice-notes'), CLIENT, 'notes')).toBe(401)
    expect(await appStatus(rotated.token, CLIENT, 'notes')).toBe(200)
  })

  it("a session cannot rotate someone else's token (404), nor a revoked one (409)", async () => {
    const bob = await signIn('user_bob')
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    expect((await call('POST', `/${id}/rotate`, { session: bob })).status).toBe(404)
    expect(await appStatus(token('alice'))).toBe(200)
    expect((await call('DELETE', `/${id}`, { session: alice })).status).toBe(200)
    const revoked = await call('POST', `/${id}/rotate`, { session: alice })
    expect(revoked.status).toBe(409)
    expect(await json(revoked)).toMatchObject({ error: 'token_inactive' })
  })

  it('takes no body (spec 4.3): none or {} rotates; anything else is 400 and rotates nothing', async () => {
    const id = await seededId('user_alice', 'alice')
    const alice = await signIn('user_alice')
    const before = await json(await call('GET', `/${id}`, { session: alice }))
    // No-break and ideographic spaces are no JSON whitespace (RFC 8259 §2), though `trim()` takes them.
    for (const rawBody of ['{"name":"renamed"}', '{bad json', '[]', '"x"', '{\u00a0}', '\u00a0{}\u3000', '{}\u2028', '\u00a0']) {
      await expectFieldError(await call('POST', `/${id}/rotate`, { bearer: token('alice'), rawBody }), 'body')
      await expectFieldError(await call('POST', `/${id}/rotate`, { session: alice, rawBody }), 'body')
    }
    expect(await json(await call('GET', `/${id}`, { session: alice }))).toEqual(before)
    expect(await appStatus(token('alice'))).toBe(200)
    const bySession = await call('POST', `/${id}/rotate`, { session: alice, rawBody: '{}' })
    expect(bySession.status).toBe(200)
    const rotated = await json(bySession)
    const again = await call('POST', `/${id}/rotate`, { bearer: rotated.token, rawBody: ' \t{\r\n} \n' })
    expect(again.status).toBe(200)
    // A UTF-8 byte order mark before it, as before a JSON body, is no content.
    expect((await call('POST', `/${id}/rotate`, { bearer: (await json(again)).token, rawBody: '\ufeff{}' })).status).toBe(200)
  })

  it('only POST rotates', async () => {
    const id = await seededId('user_alice', 'alice')
    const response = await call('GET', `/${id}/rotate`, { bearer: token('alice') })
    expect(response.status).toBe(405)
    expect(response.headers.get('allow')).toBe('POST')
  })

  it('a path past {id}/rotate, or with an empty id, names nothing: 404 not_found, and the token is not rotated', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const secret = token('alice')
    for (const path of [`/${id}/rotate/x`, `/${id}/rotate/rotate`, '//rotate']) {
      for (const credential of [{ bearer: secret }, { session: alice }]) {
        const response = await call('POST', path, credential)
        expect(response.status, path).toBe(404)
        expect(await json(response)).toEqual({ error: 'not_found', message: 'Not found' })
      }
    }
    expect(await appStatus(secret)).toBe(200)
  })

  it('an id longer than 64 characters names no token, whoever asks: 404 for a Bearer rotation too, where an id of 64 is another token\'s (403)', async () => {
    const secret = token('alice')
    const long = await call('POST', `/${'a'.repeat(65)}/rotate`, { bearer: secret })
    expect(long.status).toBe(404)
    expect(await json(long)).toEqual({ error: 'not_found', message: 'Token not found' })
    expect((await call('POST', `/${'a'.repeat(64)}/rotate`, { bearer: secret })).status).toBe(403)
    expect(await appStatus(secret)).toBe(200)
  })

  it('a 405 message names the methods of its Allow header (HEAD included)', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    for (const path of ['', `/${id}`, `/${id}/rotate`]) {
      const response = await call('PUT', path, { session: alice })
      expect(response.status).toBe(405)
      const allowed = response.headers.get('allow')!.split(', ')
      const { message } = (await json(response)) as { message: string }
      expect(message.replace(/^Use /, '').split(/, | or /)).toEqual(allowed)
    }
  })
})

describe('revoke (spec 3, 5.2)', () => {
  it('DELETE revokes permanently: 401 on the App at once, and no way back', async () => {
    const alice = await signIn('user_alice')
    const id = await seededId('user_alice', 'alice')
    const secret = token('alice')
    const withoutCsrf = await call('DELETE', `/${id}`, { session: alice, csrf: false })
    expect(withoutCsrf.status).toBe(403)
    expect(await appStatus(secret)).toBe(200)

    // A body would be silently ignored (a reason, a bulk revocation's ids): refused, nothing revoked.
    for (const body of [{ reason: 'leaked' }, { ids: [id] }, []]) {
      const refused = await expectFieldError(await call('DELETE', `/${id}`, { session: alice, body }), 'body')
      expect(refused.message).toBe('body: must be empty: a revocation takes no parameters')
      expect(await appStatus(secret)).toBe(200)
    }

    // No body, or `{}`, revokes.
    const response = await call('DELETE', `/${id}`, { session: alice, body: {} })
    expect(response.status).toBe(200)
    expect(await json(response)).toMatchObject({ id, status: 'revoked' })
    const app = await platform.fetch(mcpRequest('http://weather.localhost/v1', { token: secret }), { clientAddress: CLIENT })
    expect(app.status).toBe(401)
    expect(await json(app)).toEqual(bodies.unauthorized(true))

    // Revoked stays revoked: editing it is refused, rotating it by itself is 401.
    const patched = await call('PATCH', `/${id}`, { session: alice, body: { expires_at: new Date(T0 + 20 * DAY).toISOString() } })
    expect(patched.status).toBe(409)
    expect((await call('POST', `/${id}/rotate`, { bearer: secret })).status).toBe(401)
    expect((await json(await call('GET', `/${id}`, { session: alice }))).status).toBe('revoked')
    expect(await appStatus(secret)).toBe(401)
  })

  it("another user's token cannot be revoked (404), and keeps working", async () => {
    const bob = await signIn('user_bob')
    expect((await call('DELETE', `/${await seededId('user_alice', 'alice')}`, { session: bob })).status).toBe(404)
    expect(await appStatus(token('alice'))).toBe(200)
  })

  it('an expired token shows as expired', async () => {
    const alice = await signIn('user_alice')
    clock.advance(7 * DAY)
    const { tokens } = await json(await call('GET', '', { session: alice }))
    expect(tokens.find((t: { name: string }) => t.name === 'alice-week').status).toBe('expired')
    expect(tokens.find((t: { name: string }) => t.name === 'alice').status).toBe('active')
  })
})

describe('an expired token stays expired (spec 3: expired is an end state)', () => {
  const passwordReset = (session: Session) =>
    platform.fetch(
      new Request('http://api.localhost/dev/password-reset', {
        method: 'POST',
        headers: { cookie: session.cookie, 'x-csrf-token': session.csrfToken },
      }),
    )
  const statuses = async (session: Session): Promise<Record<string, string>> => {
    const { tokens } = await json(await call('GET', '', { session }))
    return Object.fromEntries(tokens.map((t: { name: string; status: string }) => [t.name, t.status]))
  }

  it('DELETE of an expired token answers 200 with it unchanged, still expired', async () => {
    const id = await seededId('user_alice', 'alice-week')
    // Its expiry to the millisecond: expired from expires_at on.
    clock.advance(7 * DAY)
    const alice = await signIn('user_alice')
    const response = await call('DELETE', `/${id}`, { session: alice })
    expect(response.status).toBe(200)
    expect(await json(response)).toMatchObject({ id, name: 'alice-week', status: 'expired' })
    expect((await json(await call('GET', `/${id}`, { session: alice }))).status).toBe('expired')
    expect((await statuses(alice))['alice-week']).toBe('expired')
    expect(await appStatus(token('alice-week'))).toBe(401)
    // Nothing was written: the store holds it unrevoked.
    expect((await platform.tokenService.list('user_alice')).find((t) => t.id === id)?.status).toBe('expired')
  })

  it('a millisecond before its expiry, DELETE revokes it', async () => {
    const id = await seededId('user_alice', 'alice-week')
    clock.advance(7 * DAY - 1)
    const alice = await signIn('user_alice')
    expect(await json(await call('DELETE', `/${id}`, { session: alice }))).toMatchObject({ id, status: 'revoked' })
    clock.advance(1)
    expect((await statuses(alice))['alice-week']).toBe('revoked')
  })

  it('POST /dev/password-reset revokes only the active tokens, counts only those, and leaves expired ones expired', async () => {
    clock.advance(7 * DAY)
    const alice = await signIn('user_alice')
    const answer = await passwordReset(alice)
    expect(answer.status).toBe(200)
    // Ten seeded tokens, two of them (7 days) expired.
    expect(await json(answer)).toEqual({ revoked: 8 })
    const after = await statuses(alice)
    expect(after).toMatchObject({ 'alice-week': 'expired', 'alice-notes': 'expired', alice: 'revoked', 'alice-all': 'revoked' })
    expect(Object.values(after).filter((s) => s === 'revoked')).toHaveLength(8)
    // A second reset revokes nothing more, and the expired tokens are still expired.
    expect(await json(await passwordReset(alice))).toEqual({ revoked: 0 })
    expect(await statuses(alice)).toEqual(after)
  })
})

describe('the development endpoints behind a proxy on this machine', () => {
  const signInVia = (target: Platform, clientAddress: string, headers: Record<string, string>) =>
    target.fetch(
      new Request('http://api.localhost/dev/session', {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...headers },
        body: JSON.stringify({ userId: 'user_bob' }),
      }),
      { clientAddress },
    )

  it('a loopback peer forwarding for someone is not taken for a client on this machine, whether trustProxy names it or not (regression: a local reverse proxy made every client of it loopback, and anyone could sign in as anyone)', async () => {
    const refusedFor = async (target: Platform, headers: Record<string, string>) => {
      const refused = await signInVia(target, '127.0.0.1', headers)
      expect(refused.status, JSON.stringify(headers)).toBe(403)
      expect(refused.headers.get('set-cookie')).toBeNull()
      expect(await json(refused)).toEqual({ error: 'forbidden', message: 'The development endpoints answer loopback clients only' })
    }
    // No proxy trusted: the peer is the client, and the hops it forwards are checked too.
    await refusedFor(platform, { 'x-forwarded-for': '203.0.113.7' })
    await refusedFor(platform, { 'x-forwarded-for': '127.0.0.1, 203.0.113.7' })
    await refusedFor(platform, { forwarded: 'for=203.0.113.7' })
    // A client on this machine signs in, without forwarding headers or with loopback hops only.
    expect((await signInVia(platform, '::1', {})).status).toBe(200)
    expect((await signInVia(platform, '127.0.0.1', { 'x-forwarded-for': '127.0.0.1' })).status).toBe(200)

    // The local proxy trusted: the address it forwards is the client's. Other proxies trusted,
    // not the local one: its client is still not taken for this machine.
    for (const trustProxy of [['127.0.0.1'], ['10.0.0.0/8'], 1]) {
      const behind = createTestPlatform({ trustProxy })
      try {
        await refusedFor(behind.platform, { 'x-forwarded-for': '203.0.113.7' })
        // A hop the client wrote itself, left of the one the proxy appended, is checked as well.
        await refusedFor(behind.platform, { 'x-forwarded-for': '203.0.113.7, 127.0.0.1' })
        expect((await signInVia(behind.platform, '127.0.0.1', { 'x-forwarded-for': '127.0.0.1' })).status).toBe(200)
      } finally {
        await behind.platform.close()
      }
      expect(behind.errors).toEqual([])
    }
  })

  it('a remote peer is refused whatever X-Forwarded-For it sends, though a hop count trusts it to name the client (regression: with trustProxy 1, a remote client\'s own X-Forwarded-For: 127.0.0.1 made it a client on this machine)', async () => {
    for (const trustProxy of [1, ['203.0.113.0/24']]) {
      const behind = createTestPlatform({ trustProxy })
      try {
        const refused = await signInVia(behind.platform, '203.0.113.7', { 'x-forwarded-for': '127.0.0.1' })
        expect(refused.status, JSON.stringify(trustProxy)).toBe(403)
        expect(refused.headers.get('set-cookie')).toBeNull()
      } finally {
        await behind.platform.close()
      }
    }
  })
})

describe('password reset (spec 3: revokes all of the owner’s tokens)', () => {
  it("revokeAllForUser makes every token of the owner 401, and no one else's", async () => {
    const alice = await signIn('user_alice')
    const created = await createToken(alice)
    const aliceSecrets = [created.token, token('alice'), token('alice-week'), token('alice-all')]
    for (const secret of aliceSecrets) expect(await appStatus(secret)).toBe(200)

    const count = await platform.tokenService.revokeAllForUser('user_alice')
    expect(count).toBe(11) // the ten seeded tokens and the one created here

    for (const secret of aliceSecrets) expect(await appStatus(secret)).toBe(401)
    expect(await appStatus(token('alice-notes'), CLIENT, 'notes')).toBe(401)
    expect(await appStatus(token('carol'))).toBe(200)
    const { tokens } = await json(await call('GET', '', { session: alice }))
    expect(tokens.every((t: { status: string }) => t.status === 'revoked')).toBe(true)
  })

  it('the reference platform’s POST /dev/password-reset does the same for the signed-in user, with CSRF', async () => {
    const bob = await signIn('user_bob')
    const reset = (session: Session | undefined, csrf = true) =>
      platform.fetch(
        new Request('http://api.localhost/dev/password-reset', {
          method: 'POST',
          headers: session ? { cookie: session.cookie, ...(csrf && { 'x-csrf-token': session.csrfToken }) } : {},
        }),
      )
    expect((await reset(undefined)).status).toBe(401)
    expect((await reset(bob, false)).status).toBe(403)
    // From a client that is not on this machine, with the cookie and the CSRF token: 403, as
    // every development endpoint answers it, and nothing revoked.
    const elsewhere = await platform.fetch(
      new Request('http://api.localhost/dev/password-reset', { method: 'POST', headers: { cookie: bob.cookie, 'x-csrf-token': bob.csrfToken } }),
      { clientAddress: '203.0.113.9' },
    )
    expect(elsewhere.status).toBe(403)
    expect(await json(elsewhere)).toEqual({ error: 'forbidden', message: 'The development endpoints answer loopback clients only' })
    expect(await appStatus(token('alice'))).toBe(200)
    // Bob signed in elsewhere too (a cookie someone stole with his old password), and Alice.
    const bobElsewhere = await signIn('user_bob')
    const alice = await signIn('user_alice')
    expect((await call('GET', '', { session: bobElsewhere })).status).toBe(200)
    const answer = await reset(bob)
    expect(answer.status).toBe(200)
    expect((await json(answer)).revoked).toBeGreaterThan(0)
    const { tokens } = await json(await call('GET', '', { session: bob }))
    expect(tokens.every((t: { status: string }) => t.status === 'revoked')).toBe(true)
    expect(await appStatus(token('alice'))).toBe(200)
    // Bob's other session ended with the reset; the one that made it, and Alice's, go on.
    expect((await call('GET', '', { session: bobElsewhere })).status).toBe(401)
    expect((await call('GET', '', { session: bob })).status).toBe(200)
    expect((await call('GET', '', { session: alice })).status).toBe(200)
  })
})
