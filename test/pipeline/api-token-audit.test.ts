/**
 * API-token authentication and authorization as a checker written from the spec tests it
 * (spec 2.1, 3, 5.2, 7, 8; DESIGN.md "API tokens", pipeline steps 2 and 3): the token format
 * computed independently (a CRC32 and a base62 of this file's own), the refusals that never
 * reach the store, the `Authorization` header, the IP allowlist and the scope with their exact
 * bodies, hashing at rest, revocation through the cache, and `last_used_at` without a write
 * per request. Driven through `dispatcher.decide` on in-memory stores wrapped to count calls.
 */
import * as zlib from 'node:zlib'
import {
  type DispatchRequest,
  type TokenStore,
  InvalidInputError,
  MAX_BEARER_LENGTH,
  checkApiTokenFormat,
  createDispatcher,
  createMemoryAppStore,
  createMemoryInvalidationBus,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  generateApiToken,
  parseBearerToken,
  validateAllowlist,
} from 'mcp-dispatch'
import { describe, expect, it } from 'vitest'
import { bodies } from '../helpers/bodies.js'

const WEATHER = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }
const NOTES = { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['1.0.0'] }
const T0 = Date.UTC(2030, 0, 1)
const DAY = 86_400_000

// ---- an independent implementation of the format (spec 2.1, 8; DESIGN.md) ----

const ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'

/** CRC32 (IEEE 802.3, reflected 0xEDB88320), bit by bit: no table shared with the library. */
function referenceCrc32(text: string): number {
  let crc = 0xffffffff
  for (const byte of Buffer.from(text, 'latin1')) {
    crc ^= byte
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0xedb88320 : crc >>> 1
  }
  return (crc ^ 0xffffffff) >>> 0
}

/** `value` in base62 (0-9, A-Z, a-z), most significant digit first, padded to 6 digits. */
function referenceBase62(value: number): string {
  let out = ''
  for (let i = 0; i < 6; i++) {
    out = ALPHABET[value % 62]! + out
    value = Math.floor(value / 62)
  }
  return out
}

/** A deterministic random source (xorshift32), so the typo sweep runs on the same tokens every time. */
function seededRandom(seed: number) {
  let state = seed >>> 0 || 1
  return (size: number) => {
    const out = new Uint8Array(size)
    for (let i = 0; i < size; i++) {
      state ^= state << 13
      state >>>= 0
      state ^= state >>> 17
      state ^= state << 5
      state >>>= 0
      out[i] = state & 0xff
    }
    return out
  }
}

// ---- a dispatcher on counting stores ----

interface Setup {
  decide: (request: DispatchRequest) => Promise<{ status: number; body: unknown; headers: Record<string, string> }>
  lookups: () => number
  touches: () => number
  errors: Array<{ error: unknown; context: string }>
  tokens: ReturnType<typeof createTokenService>
  rawTokens: TokenStore
  clock: { now: () => number; advance: (ms: number) => void }
}

function setup(options: { prefix?: string; pepper?: string; tokenStore?: TokenStore; cacheTtlMs?: number; bus?: ReturnType<typeof createMemoryInvalidationBus> } = {}): Setup {
  let at = T0
  const clock = { now: () => at, advance: (ms: number) => void (at += ms) }
  const errors: Array<{ error: unknown; context: string }> = []
  const apps = createMemoryAppStore([WEATHER, NOTES])
  const subscriptions = createMemorySubscriptionStore([
    { userId: 'user_1', appId: WEATHER.id, active: true },
    { userId: 'user_1', appId: NOTES.id, active: true },
  ])
  const rawTokens = options.tokenStore ?? createMemoryTokenStore()
  let lookups = 0
  let touches = 0
  const counted: TokenStore = Object.create(rawTokens, {
    findByHash: {
      value: (hash: string) => {
        lookups++
        return rawTokens.findByHash(hash)
      },
    },
    touch: {
      value: (batch: Parameters<TokenStore['touch']>[0]) => {
        touches++
        return rawTokens.touch(batch)
      },
    },
  })
  const onError = (error: unknown, context: string) => errors.push({ error, context })
  const tokens = createTokenService({
    store: counted,
    apps,
    subscriptions,
    now: clock.now,
    onError,
    ...(options.prefix !== undefined && { prefix: options.prefix }),
    ...(options.pepper !== undefined && { pepper: options.pepper }),
    ...(options.cacheTtlMs !== undefined && { cacheTtlMs: options.cacheTtlMs, invalidations: options.bus ?? createMemoryInvalidationBus() }),
  })
  const dispatcher = createDispatcher({
    apps,
    subscriptions,
    tokens,
    sessions: createMemorySessionStore(),
    rateLimit: { store: createMemoryRateLimitStore(), policy: () => null },
    now: clock.now,
    onError,
  })
  return {
    async decide(request) {
      const decision = await dispatcher.decide(request)
      if (decision.type === 'dispatch') return { status: 200, body: null, headers: { ...decision.headers } }
      const reply = decision.reply
      return { status: reply.status, body: reply.body === null ? null : JSON.parse(reply.body), headers: { ...reply.headers } }
    },
    lookups: () => lookups,
    touches: () => touches,
    errors,
    tokens,
    rawTokens,
    clock,
  }
}

function request(authorization: string | undefined, options: { host?: string; clientAddress?: string | undefined } = {}): DispatchRequest {
  const host = options.host ?? 'weather.example.com'
  return {
    method: 'POST',
    path: '/v1',
    host,
    origin: `https://${host}`,
    headers: { get: (name) => (name === 'authorization' ? authorization : undefined) },
    clientAddress: 'clientAddress' in options ? options.clientAddress : '203.0.113.7',
  }
}

const METADATA = 'https://weather.example.com/.well-known/oauth-protected-resource'
const UNAUTHORIZED = (invalidToken: boolean) => ({
  status: 401,
  headers: {
    'content-type': 'application/json',
    'www-authenticate': invalidToken ? `Bearer resource_metadata="${METADATA}", error="invalid_token"` : `Bearer resource_metadata="${METADATA}"`,
  },
  body: bodies.unauthorized(invalidToken),
})
const FORBIDDEN = { jsonrpc: '2.0', id: null, error: { code: -32003, message: 'Forbidden' } }
const IP_NOT_ALLOWED = { jsonrpc: '2.0', id: null, error: { code: -32003, message: 'Forbidden', data: { error: 'ip_not_allowed' } } }

async function expectUnauthorized(s: Setup, req: DispatchRequest, invalidToken: boolean): Promise<void> {
  const answer = await s.decide(req)
  expect(answer).toMatchObject({ status: 401, body: UNAUTHORIZED(invalidToken).body })
  expect(answer.headers['www-authenticate']).toBe(UNAUTHORIZED(invalidToken).headers['www-authenticate'])
  expect(answer.headers['content-type']).toBe('application/json')
  // Produced before the MCP layer: no version headers (spec 7).
  expect(answer.headers['x-mcp-version']).toBeUndefined()
}

async function createToken(s: Setup, extra: { servers?: string[]; allowedIps?: string[] | null; expiresInDays?: 7 | 30 | 90 } = {}) {
  return s.tokens.create({ userId: 'user_1', name: 'audit', servers: extra.servers ?? [WEATHER.id], expiresInDays: extra.expiresInDays ?? 30, allowedIps: extra.allowedIps ?? null })
}

describe('token format, computed independently (spec 2.1, 5.2, 8)', () => {
  it('svc_ + 38 base62 + the 6-digit base62 CRC32 of the rest (the 42 characters before it, prefix included: DESIGN.md): 48 characters; display prefix the first 12', async () => {
    const zlibCrc32 = (zlib as { crc32?: (data: string | Uint8Array) => number }).crc32
    for (let seed = 1; seed <= 200; seed++) {
      const token = generateApiToken('svc_', seededRandom(seed))
      expect(token).toMatch(/^svc_[0-9A-Za-z]{44}$/)
      expect(token).toHaveLength(48)
      const head = token.slice(0, 42)
      expect(token.slice(42)).toBe(referenceBase62(referenceCrc32(head)))
      // Node 20.19+ and 22.2+ have zlib.crc32: the reference agrees with it.
      if (zlibCrc32) expect(referenceCrc32(head)).toBe(zlibCrc32(head))
    }
    const s = setup()
    const created = await createToken(s)
    expect(created.prefix).toBe(created.token.slice(0, 12))
    expect(created.token.slice(42)).toBe(referenceBase62(referenceCrc32(created.token.slice(0, 42))))
  })

  it('a string built with the reference checksum of all before it is a token; the checksum of the random part alone is not', () => {
    const body = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKL'
    expect(body).toHaveLength(38)
    expect(checkApiTokenFormat(`svc_${body}${referenceBase62(referenceCrc32(`svc_${body}`))}`)).toBeNull()
    expect(checkApiTokenFormat(`svc_${body}${referenceBase62(referenceCrc32(body))}`)).toBe('checksum')
  })

  it('every one-character typo and every adjacent transposition is 401 invalid_token without a store lookup', async () => {
    const s = setup()
    const { token } = await createToken(s)
    // The real token works, and costs its lookup.
    expect((await s.decide(request(`Bearer ${token}`))).status).toBe(200)
    const before = s.lookups()
    const variants = new Set<string>()
    for (let i = 0; i < token.length; i++) {
      for (const c of `${ALPHABET}_-.~`) if (c !== token[i]) variants.add(token.slice(0, i) + c + token.slice(i + 1))
      if (i + 1 < token.length && token[i] !== token[i + 1]) variants.add(token.slice(0, i) + token[i + 1] + token[i] + token.slice(i + 2))
    }
    expect(variants.size).toBeGreaterThan(3000)
    let refused = 0
    for (const variant of variants) {
      const answer = await s.decide(request(`Bearer ${variant}`))
      if (answer.status === 401 && answer.headers['www-authenticate']!.endsWith('error="invalid_token"')) refused++
    }
    expect(refused).toBe(variants.size)
    expect(s.lookups()).toBe(before)
    expect(s.errors).toEqual([])
  })

  it('another length or a prefix in another case or with another separator: 401 invalid_token, no lookup', async () => {
    const s = setup()
    const { token } = await createToken(s)
    const rest = token.slice(4)
    for (const variant of [`SVC_${rest}`, `Svc_${rest}`, `svc-${rest}`, `svc${rest}`, token.slice(0, 47), `${token}a`, `svc_${rest}${rest}`, 'svc_']) {
      await expectUnauthorized(s, request(`Bearer ${variant}`), true)
    }
    expect(s.lookups()).toBe(0)
  })

  it('a configured prefix: its tokens are 48 characters with the checksum of the 42 before it, prefix included; svc_ tokens are refused', async () => {
    const s = setup({ prefix: 'acme_' })
    const { token, prefix } = await createToken(s)
    expect(token).toMatch(/^acme_[0-9A-Za-z]{43}$/)
    expect(prefix).toBe(token.slice(0, 12))
    expect(token.slice(42)).toBe(referenceBase62(referenceCrc32(token.slice(0, 42))))
    expect((await s.decide(request(`Bearer ${token}`))).status).toBe(200)
    const other = generateApiToken('svc_', seededRandom(7))
    await expectUnauthorized(s, request(`Bearer ${other}`), true)
    await expectUnauthorized(s, request(`Bearer svc_${token.slice(5)}`), true)
  })
})

describe('Authorization header (RFC 6750 2.1, spec 5.2)', () => {
  it('the scheme in any case and several spaces around the token are accepted', async () => {
    const s = setup()
    const { token } = await createToken(s)
    for (const header of [`Bearer ${token}`, `bearer ${token}`, `BEARER ${token}`, `bEaReR ${token}`, `Bearer    ${token}`, `Bearer ${token}   `]) {
      expect((await s.decide(request(header))).status, JSON.stringify(header)).toBe(200)
    }
  })

  it('a Bearer value that is no single b64token is invalid_token; another scheme or none has no error code', async () => {
    const s = setup()
    const { token } = await createToken(s)
    await expectUnauthorized(s, request(undefined), false)
    await expectUnauthorized(s, request(''), false)
    await expectUnauthorized(s, request(`Basic ${Buffer.from('a:b').toString('base64')}`), false)
    await expectUnauthorized(s, request(`Token ${token}`), false)
    for (const header of [
      `Bearer\t${token}`,
      `Bearer ${token}, Bearer ${token}`, // two Authorization fields joined
      `Basic eDp5, Bearer ${token}`,
      `Bearer ${token},`,
      `Bearer ${token.slice(0, 20)}é${token.slice(21)}`,
      `Bearer ${token.slice(0, 20)}\u0000${token.slice(21)}`,
      `Bearer "${token}"`,
      'Bearer',
      'Bearer   ',
    ]) {
      await expectUnauthorized(s, request(header), true)
    }
    expect(s.lookups()).toBe(0)
  })

  it('token68 characters pass the header but not the API-token format: 401 invalid_token, no lookup', async () => {
    const s = setup()
    const { token } = await createToken(s)
    expect((await s.decide(request(`Bearer ${token}`))).status).toBe(200)
    const before = s.lookups()
    for (const c of ['-', '.', '_', '~', '+', '/']) await expectUnauthorized(s, request(`Bearer ${token.slice(0, 30)}${c}${token.slice(31)}`), true)
    await expectUnauthorized(s, request(`Bearer ${token.slice(0, 46)}==`), true)
    expect(s.lookups()).toBe(before)
  })

  it(`a credential of MAX_BEARER_LENGTH (${MAX_BEARER_LENGTH}) is accepted whatever the spaces around it; a longer one never (regression: refused with one space more)`, () => {
    const max = 'a'.repeat(MAX_BEARER_LENGTH)
    for (const header of [`Bearer ${max}`, `Bearer  ${max}`, `Bearer ${max} `, `bearer   ${max}   `]) {
      expect(parseBearerToken(header), `${JSON.stringify(header.slice(0, 10))}… (${header.length})`).toEqual({ kind: 'bearer', token: max })
    }
    for (const header of [`Bearer ${max}a`, `Bearer  ${max}a `, `Bearer ${'a'.repeat(4 * MAX_BEARER_LENGTH)}`, `Bearer ${' '.repeat(4 * MAX_BEARER_LENGTH)}a`]) {
      expect(parseBearerToken(header)).toEqual({ kind: 'invalid' })
    }
  })

  it('an over-long Bearer header is 401 invalid_token without a lookup', async () => {
    const s = setup()
    await expectUnauthorized(s, request(`Bearer svc_${'a'.repeat(MAX_BEARER_LENGTH)}`), true)
    expect(s.lookups()).toBe(0)
  })
})

describe('IP allowlist (spec 5.2, 7; DESIGN.md step 3)', () => {
  it('entries with a space inside are refused at creation, 400 naming the entry (regression: "10.0.0.0 /8" was stored as written)', async () => {
    const s = setup()
    for (const entry of ['10.0.0.0 /8', '2001:db8:: /32', '10.0.0.0\t/8', '203.0.113.7 /32', '10.0.0.0\u00a0/8']) {
      expect(validateAllowlist([entry]), JSON.stringify(entry)).toEqual({ index: 0, message: expect.stringMatching(/^entry 0 /) })
      const error = await createToken(s, { allowedIps: ['192.0.2.1', entry] }).then(
        () => undefined,
        (e: unknown) => e,
      )
      expect(error, JSON.stringify(entry)).toBeInstanceOf(InvalidInputError)
      expect((error as InvalidInputError).field).toBe('allowedIps.1')
    }
    for (const entry of ['10.0.0.0/ 8', ' 10.0.0.0/8', '10.0.0.0/8 ', '010.0.0.1', '10.0.0.01/32', '10.0.0.1/8', '10.0.0.0/33', '::/129', 'fe80::1%eth0', '[::1]', '0x0a.0.0.1', '10.0.0.0/08']) {
      expect(validateAllowlist([entry]), JSON.stringify(entry)).not.toBeNull()
    }
    expect(await s.tokens.list('user_1')).toEqual([])
  })

  it('/0, /32, /128, IPv4-mapped IPv6 against IPv4 entries and back, zone ids and leading zeros', async () => {
    const s = setup()
    const cases: Array<[string[], string | undefined, boolean]> = [
      [['0.0.0.0/0'], '198.51.100.1', true],
      [['0.0.0.0/0'], '::ffff:198.51.100.1', true],
      [['0.0.0.0/0'], '2001:db8::1', false], // an IPv4 range holds no IPv6 address
      [['::/0'], '2001:db8::1', true],
      [['::/0'], '198.51.100.1', true], // every address, IPv4 ones as IPv4-mapped
      [['203.0.113.7/32'], '203.0.113.7', true],
      [['203.0.113.7/32'], '203.0.113.8', false],
      [['203.0.113.7'], '::ffff:203.0.113.7', true],
      [['203.0.113.7'], '::ffff:cb00:7107', true],
      [['::ffff:203.0.113.7'], '203.0.113.7', true],
      [['::ffff:203.0.113.0/120'], '203.0.113.99', true],
      [['2001:db8::1/128'], '2001:db8::1', true],
      [['2001:db8::1/128'], '2001:0db8:0:0:0:0:0:1', true],
      [['2001:db8::1/128'], '2001:db8::2', false],
      [['fe80::/64'], 'fe80::1%eth0', true],
      [['10.0.0.0/8'], '010.0.0.1', false], // never read as octal 8.0.0.1, nor as 10.0.0.1
      [['8.0.0.0/8'], '010.0.0.1', false],
      [['10.0.0.0/8'], '::a00:1', false], // IPv4-compatible (deprecated), not IPv4-mapped
      [['10.0.0.0/8'], undefined, false],
    ]
    for (const [allowedIps, clientAddress, allowed] of cases) {
      const { token } = await createToken(s, { allowedIps })
      const answer = await s.decide(request(`Bearer ${token}`, { clientAddress }))
      if (allowed) expect(answer.status, `${clientAddress} in ${allowedIps}`).toBe(200)
      else expect({ status: answer.status, body: answer.body }, `${clientAddress} in ${allowedIps}`).toEqual({ status: 403, body: IP_NOT_ALLOWED })
    }
  })

  it('the allowlist comes before the scope: exact bodies, no version headers, no WWW-Authenticate', async () => {
    const s = setup()
    const { token } = await createToken(s, { servers: [NOTES.id], allowedIps: ['198.51.100.0/24'] })
    const outside = await s.decide(request(`Bearer ${token}`))
    expect(outside.status).toBe(403)
    expect(outside.body).toEqual(IP_NOT_ALLOWED)
    expect(outside.headers['www-authenticate']).toBeUndefined()
    expect(outside.headers['x-mcp-version']).toBeUndefined()
    const inside = await s.decide(request(`Bearer ${token}`, { clientAddress: '198.51.100.9' }))
    expect(inside.status).toBe(403)
    expect(inside.body).toEqual(FORBIDDEN)
    expect(inside.headers['x-mcp-version']).toBeUndefined()
    expect((await s.decide(request(`Bearer ${token}`, { host: 'notes.example.com', clientAddress: '198.51.100.9' }))).status).toBe(200)
  })
})

describe('scope (spec 5.2, 7)', () => {
  it('a token reaches exactly its Apps, every method alike; no data in the 403', async () => {
    const s = setup()
    const { token } = await createToken(s)
    expect((await s.decide(request(`Bearer ${token}`))).status).toBe(200)
    const other = await s.decide(request(`Bearer ${token}`, { host: 'notes.example.com' }))
    expect(other).toMatchObject({ status: 403, body: FORBIDDEN })
    expect((other.body as { error: object }).error).not.toHaveProperty('data')
  })

  it('no servers, an unknown server or an empty id are refused at creation with 400 naming the field', async () => {
    const s = setup()
    const refusal = (servers: string[]) =>
      createToken(s, { servers }).then(
        () => undefined,
        (e: unknown) => e,
      )
    const none = await refusal([])
    expect(none).toBeInstanceOf(InvalidInputError)
    expect((none as InvalidInputError).field).toBe('servers')
    const unknown = await refusal([WEATHER.id, 'app_nope'])
    expect(unknown).toBeInstanceOf(InvalidInputError)
    expect((unknown as InvalidInputError).field).toBe('servers.1')
    const empty = await refusal([''])
    expect(empty).toBeInstanceOf(InvalidInputError)
    expect((empty as InvalidInputError).field).toBe('servers.0')
    expect(await s.tokens.list('user_1')).toEqual([])
  })
})

describe('secrets at rest and in errors; expiry, revocation and last_used_at (spec 3, 5.2, 8)', () => {
  it('the store holds HMAC-SHA-256(pepper) of the token and never the token; a failing store reports no secret', async () => {
    const { createHmac } = await import('node:crypto')
    const store = createMemoryTokenStore()
    const s = setup({ pepper: 'pepper-of-the-audit', tokenStore: store })
    const { token, id } = await createToken(s)
    const record = await store.get(id)
    expect(record!.tokenHash).toBe(createHmac('sha256', 'pepper-of-the-audit').update(token).digest('hex'))
    expect(JSON.stringify(record)).not.toContain(token.slice(4, 42))
    const failing = setup({ tokenStore: Object.create(store, { findByHash: { value: () => Promise.reject(new Error('db down')) } }) as TokenStore })
    const answer = await failing.decide(request(`Bearer ${generateApiToken('svc_', seededRandom(99))}`))
    expect(answer.status).toBe(503)
    expect(failing.errors.length).toBeGreaterThan(0)
    const secret = generateApiToken('svc_', seededRandom(99))
    for (const { error, context } of failing.errors) {
      expect(context).not.toContain(secret)
      expect(String(error)).not.toContain(secret)
      expect(String((error as Error).stack)).not.toContain(secret)
      expect(String((error as { cause?: unknown }).cause)).not.toContain(secret)
    }
  })

  it('expired (at expires_at exactly) and revoked tokens: 401 with error="invalid_token"', async () => {
    const s = setup()
    const week = await createToken(s, { expiresInDays: 7 })
    const revoked = await createToken(s)
    await s.tokens.revoke('user_1', revoked.id)
    await expectUnauthorized(s, request(`Bearer ${revoked.token}`), true)
    s.clock.advance(7 * DAY - 1)
    expect((await s.decide(request(`Bearer ${week.token}`))).status).toBe(200)
    s.clock.advance(1)
    await expectUnauthorized(s, request(`Bearer ${week.token}`), true)
  })

  it('with a cache, a revocation is effective at once through the bus, and within the TTL on an instance that does not hear it', async () => {
    const store = createMemoryTokenStore()
    const bus = createMemoryInvalidationBus()
    const a = setup({ tokenStore: store, cacheTtlMs: 60_000, bus })
    const b = setup({ tokenStore: store, cacheTtlMs: 60_000, bus })
    const deaf = setup({ tokenStore: store, cacheTtlMs: 60_000 }) // its own bus: hears nobody
    const { token, id } = await createToken(a)
    for (const s of [a, b, deaf]) expect((await s.decide(request(`Bearer ${token}`))).status).toBe(200)
    const lookups = [a, b, deaf].map((s) => s.lookups())
    for (const s of [a, b, deaf]) expect((await s.decide(request(`Bearer ${token}`))).status).toBe(200)
    expect([a, b, deaf].map((s) => s.lookups())).toEqual(lookups) // served from the cache
    await a.tokens.revoke('user_1', id)
    await expectUnauthorized(a, request(`Bearer ${token}`), true)
    await expectUnauthorized(b, request(`Bearer ${token}`), true)
    // The deaf instance keeps its cached record for the TTL (spec 3: within 10 minutes), not longer.
    deaf.clock.advance(59_999)
    expect((await deaf.decide(request(`Bearer ${token}`))).status).toBe(200)
    deaf.clock.advance(1)
    await expectUnauthorized(deaf, request(`Bearer ${token}`), true)
    await Promise.all([a.tokens.close(), b.tokens.close(), deaf.tokens.close()])
  })

  it('last_used_at is recorded without a store write per request: one touch for many uses, shown at once', async () => {
    const s = setup()
    const { token, id } = await createToken(s)
    for (let i = 0; i < 50; i++) {
      s.clock.advance(1000)
      expect((await s.decide(request(`Bearer ${token}`))).status).toBe(200)
    }
    expect(s.touches()).toBe(0)
    const listed = (await s.tokens.list('user_1')).find((t) => t.id === id)!
    expect(listed.last_used_at).toBe(new Date(T0 + 50_000).toISOString())
    await s.tokens.flush()
    expect(s.touches()).toBe(1)
    expect((await s.rawTokens.get(id))!.lastUsedAt).toBe(T0 + 50_000)
    await s.tokens.close()
  })
})
