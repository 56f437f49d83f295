/**
 * The token-management API (spec 2.1, 3, 4.3, 4.4; docs/api-tokens.md) under random input,
 * through the reference platform: every create and edit body is accepted exactly when each of
 * its fields is valid, a refusal is a 400 naming a field that was bad, nothing is created or
 * changed by a refused request, and random methods, paths, credentials and bodies never get
 * a 5xx or a body that is not the API's JSON error.
 */
import fc from 'fast-check'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import { type DevSession, createTestPlatform, devSignIn, json, tokenApiCall } from '../helpers/platform.js'

const RUNS = { numRuns: Number(process.env.TOKEN_API_FUZZ_RUNS ?? 300) }
/** Apps user_alice subscribes to (test/helpers/platform.ts); user_bob's one subscription is inactive. */
const ALICE_APPS = ['app_weather', 'app_notes', 'app_limited']
const ERRORS = new Set(['invalid_request', 'unauthorized', 'forbidden', 'csrf_failed', 'not_found', 'token_inactive', 'method_not_allowed'])

/** A field value and whether the API must accept it. */
type Field = readonly [value: unknown, valid: boolean]
const valid = (arbitrary: fc.Arbitrary<unknown>): fc.Arbitrary<Field> => arbitrary.map((value) => [value, true] as const)
const invalid = (arbitrary: fc.Arbitrary<unknown>): fc.Arbitrary<Field> => arbitrary.map((value) => [value, false] as const)

const visible = fc.string({ unit: fc.constantFrom('a', 'Z', '0', '-', '_', 'é', '部', '🚀', '.'), minLength: 1, maxLength: 60 })
const name = fc.oneof(
  valid(visible),
  valid(fc.tuple(visible, fc.constantFrom(' ', '  ', '\u00a0')).map(([text, pad]) => `${pad}${text}${pad}`)),
  valid(fc.constant('x'.repeat(100))),
  invalid(fc.constantFrom('', '   ', '\u200b', 'x'.repeat(101), 'a\nb', 'tab\there', 'nul\u0000', 'line\u2028sep', 'para\u2029sep', 'evil\u202Etxt.exe', 'iso\u2066late')),
  invalid(fc.oneof(fc.integer(), fc.constant(null), fc.boolean(), fc.array(fc.string(), { maxLength: 2 }), fc.object({ maxDepth: 1 }))),
)
const servers = fc.oneof(
  { weight: 3, arbitrary: valid(fc.subarray(ALICE_APPS, { minLength: 1 })) },
  valid(fc.constantFrom(['app_weather', 'app_weather'])),
  invalid(fc.constantFrom([], 'app_weather', ['app_unknown'], ['app_weather', 'app_unknown'], [''], [42], null)),
  invalid(fc.constant(Array.from({ length: 101 }, () => 'app_weather'))),
)
const expiresInDays = fc.oneof(
  { weight: 3, arbitrary: valid(fc.constantFrom(7, 30, 90)) },
  invalid(fc.constantFrom(0, 1, 14, 31, 91, 365, -7, 30.5, '30', null, true)),
)
const ipEntry = fc.oneof(fc.ipV4(), fc.ipV6(), fc.constantFrom('10.0.0.0/8', '192.0.2.0/24', '2001:db8::/32', '::1'))
const allowedIps = fc.oneof(
  { weight: 2, arbitrary: valid(fc.array(ipEntry, { minLength: 1, maxLength: 3 })) },
  valid(fc.constant(null)),
  // Spec 2.1: one or more; null is how an allowlist is removed.
  invalid(fc.constant([])),
  invalid(fc.constantFrom('10.0.0.1', ['not-an-ip'], ['10.0.0.1/33'], ['10.0.0.1/8'], [1], {}, ['1.2.3.4', 'x'.repeat(65)])),
  invalid(fc.constantFrom([' 127.0.0.1'], ['1.2.3.0/24 '], ['fe80::1%eth0'], ['::1', '\t::2'])),
  invalid(fc.constant(Array.from({ length: 101 }, (_, i) => `10.0.${Math.floor(i / 256)}.${i % 256}`))),
)
/** A key the API does not know: the body is strict (a `userId` must never create a token for someone else). */
const extraKey = fc.option(
  fc.constantFrom('userId', 'user_id', 'token', 'id', 'scopes', 'prefix', 'created_at', 'servers_extra', '__proto__', 'constructor', 'toString'),
  { nil: undefined },
)

/** Builds a body from fields (absent ones are invalid when required); returns it with the names of its bad fields. */
function body(fields: Record<string, Field | undefined>, required: readonly string[], extra: string | undefined): { body: Record<string, unknown>; bad: Set<string> } {
  const out: Record<string, unknown> = {}
  const bad = new Set<string>()
  for (const [key, field] of Object.entries(fields)) {
    if (field === undefined) {
      if (required.includes(key)) bad.add(key)
      continue
    }
    out[key] = field[0]
    if (!field[1]) bad.add(key)
  }
  if (extra !== undefined) {
    // An own key even when it is `__proto__` (an assignment would set the prototype instead).
    Object.defineProperty(out, extra, { value: 'user_bob', enumerable: true, writable: true, configurable: true })
    bad.add(extra)
  }
  return { body: out, bad }
}

async function expectRefusal(response: Response, bad: Set<string>): Promise<void> {
  expect(response.status).toBe(400)
  expect(response.headers.get('content-type')).toBe('application/json')
  const answer = await json(response)
  expect(answer.error).toBe('invalid_request')
  expect(bad).toContain(String(answer.field).split('.')[0])
  expect(answer.message.startsWith(`${answer.field}: `)).toBe(true)
}

let platform: Platform
let alice: DevSession
let bob: DevSession
let errors: Array<{ error: unknown; context: string }>

beforeAll(async () => {
  ;({ platform, errors } = createTestPlatform())
  alice = await devSignIn(platform, 'user_alice')
  bob = await devSignIn(platform, 'user_bob')
})
afterAll(async () => {
  await platform.close()
  expect(errors).toEqual([])
})

async function tokenCount(userId: string): Promise<number> {
  return (await platform.tokenService.list(userId)).length
}

describe('token API, property-based', () => {
  it('create: 201 exactly when every field is valid; otherwise 400 naming a bad field, and nothing is created', async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.option(name, { nil: undefined }),
        fc.option(servers, { nil: undefined }),
        fc.option(expiresInDays, { nil: undefined }),
        fc.option(allowedIps, { nil: undefined }),
        extraKey,
        async (n, s, e, ips, extra) => {
          const { body: sent, bad } = body(
            { name: n, servers: s, expires_in_days: e, allowed_ips: ips },
            ['name', 'servers', 'expires_in_days'],
            extra,
          )
          const before = { alice: await tokenCount('user_alice'), bob: await tokenCount('user_bob') }
          const response = await tokenApiCall(platform, 'POST', '', { session: alice, body: sent })
          if (bad.size > 0) {
            await expectRefusal(response, bad)
            expect(await tokenCount('user_alice')).toBe(before.alice)
          } else {
            expect(response.status).toBe(201)
            const created = await json(response)
            expect(created.token).toMatch(/^svc_[A-Za-z0-9]{44}$/)
            expect(created.name).toBe(String(sent.name).trim())
            expect(created.scopes.map((scope: { server_id: string }) => scope.server_id).sort()).toEqual([...new Set(sent.servers as string[])].sort())
            const ips = sent.allowed_ips as string[] | null | undefined
            expect(created.allowed_ips).toEqual(ips ? [...new Set(ips)] : null)
            expect(await tokenCount('user_alice')).toBe(before.alice + 1)
          }
          expect(await tokenCount('user_bob')).toBe(before.bob)
        },
      ),
      RUNS,
    )
  })

  it('edit: 200 exactly when every field is valid, and then only those fields change; otherwise 400 and nothing changes', async () => {
    const created = await json(
      await tokenApiCall(platform, 'POST', '', { session: alice, body: { name: 'edit me', servers: ['app_weather'], expires_in_days: 30 } }),
    )
    const createdAt = Date.parse(created.created_at)
    const expiresAt = fc.oneof(
      valid(fc.integer({ min: 1, max: 90 * 24 }).map((hours) => new Date(createdAt + hours * 3_600_000).toISOString())),
      invalid(fc.integer({ min: 1, max: 1000 }).map((hours) => new Date(createdAt - hours * 3_600_000).toISOString())),
      invalid(fc.integer({ min: 1, max: 1000 }).map((hours) => new Date(createdAt + 90 * 86_400_000 + hours * 3_600_000).toISOString())),
      invalid(fc.constantFrom('tomorrow', '2030-13-01T00:00:00.000Z', '2030-01-05', '', null, true, [], {})),
      // Impossible dates Date.parse would roll over; epoch numbers (the HTTP API takes ISO strings only).
      invalid(fc.constantFrom('2030-02-30T00:00:00Z', '2030-11-31T00:00:00Z', '2030-01-01T24:00:00Z', '2030-01-01T12:60:00Z', '2030-01-01T12:00:00+24:00')),
      invalid(fc.integer({ min: 1, max: 90 * 24 }).map((hours) => createdAt + hours * 3_600_000)),
    )
    await fc.assert(
      fc.asyncProperty(
        fc.option(name, { nil: undefined }),
        fc.option(expiresAt, { nil: undefined }),
        fc.option(allowedIps, { nil: undefined }),
        fc.option(fc.constantFrom('servers', 'scopes', 'token', 'userId', '__proto__', 'constructor', 'valueOf'), { nil: undefined }),
        async (n, e, ips, extra) => {
          const { body: sent, bad } = body({ name: n, expires_at: e, allowed_ips: ips }, [], extra)
          const before = await json(await tokenApiCall(platform, 'GET', `/${created.id}`, { session: alice }))
          const response = await tokenApiCall(platform, 'PATCH', `/${created.id}`, { session: alice, body: sent })
          const after = await json(await tokenApiCall(platform, 'GET', `/${created.id}`, { session: alice }))
          if (bad.size > 0) {
            await expectRefusal(response, bad)
            expect(after).toEqual(before)
            return
          }
          expect(response.status).toBe(200)
          const expected = { ...before }
          if ('name' in sent) expected.name = String(sent.name).trim()
          if ('expires_at' in sent) expected.expires_at = sent.expires_at
          if ('allowed_ips' in sent) {
            const list = sent.allowed_ips as string[] | null
            expected.allowed_ips = list ? [...new Set(list)] : null
          }
          expect(after).toEqual(expected)
          expect(await json(response)).toEqual(after)
        },
      ),
      RUNS,
    )
  })

  it('random methods, paths, credentials and bodies: never a 5xx, every refusal a JSON error of the API, no secret but at creation and rotation', async () => {
    const own = await json(
      await tokenApiCall(platform, 'POST', '', { session: alice, body: { name: 'fuzz target', servers: ['app_notes'], expires_in_days: 7 } }),
    )
    let secret: string = own.token
    const path = fc.oneof(
      fc.constantFrom('', '/', `/${own.id}`, `/${own.id}/`, `/${own.id}/rotate`, `/${own.id}/rotate/x`, '/00000000-0000-4000-8000-000000000000', '/..', '/%2e%2e', '//', '/rotate'),
      fc.webSegment().map((segment) => `/${segment}`),
      fc.tuple(fc.webSegment(), fc.webSegment()).map(([a, b]) => `/${a}/${b}`),
    )
    const caller = fc.constantFrom('none', 'alice', 'alice-no-csrf', 'bob', 'own-token', 'garbage-bearer')
    const payload = fc.oneof(
      fc.constant(undefined),
      fc.jsonValue({ maxDepth: 2 }).map((value) => JSON.stringify(value)),
      fc.string({ unit: 'binary', maxLength: 200 }),
      fc.constant(JSON.stringify({ name: 'x'.repeat(20_000) })),
    )
    await fc.assert(
      fc.asyncProperty(
        fc.constantFrom('GET', 'POST', 'PATCH', 'DELETE', 'PUT', 'OPTIONS', 'HEAD'),
        path,
        caller,
        payload,
        fc.constantFrom('application/json', 'text/plain', 'application/json; charset=utf-8'),
        async (method, target, who, raw, contentType) => {
          const options = {
            ...(who.startsWith('alice') && { session: alice, csrf: who === 'alice' }),
            ...(who === 'bob' && { session: bob }),
            ...(who === 'own-token' && { bearer: secret }),
            ...(who === 'garbage-bearer' && { bearer: 'svc_not-a-token' }),
            ...(raw !== undefined && method !== 'GET' && method !== 'HEAD' && { rawBody: raw, contentType }),
          }
          const response = await tokenApiCall(platform, method, target, options)
          expect(response.status).toBeLessThan(500)
          const text = await response.text()
          if (method === 'HEAD') return
          if (response.status >= 400) {
            expect(response.headers.get('content-type')).toBe('application/json')
            const answer = JSON.parse(text)
            expect(ERRORS).toContain(answer.error)
            expect(typeof answer.message).toBe('string')
          }
          const created = response.status === 201 && method === 'POST' && (target === '' || target === '/')
          const rotated = response.status === 200 && method === 'POST' && /\/rotate\/?$/.test(target)
          if (!created && !rotated) expect(text).not.toMatch(/svc_[A-Za-z0-9]{44}/)
          if (rotated && target.includes(own.id)) secret = JSON.parse(text).token
        },
      ),
      RUNS,
    )
  })
})
