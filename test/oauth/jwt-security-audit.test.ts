/**
 * OAuth access-token validation from an attacker's side: tokens made with real keys (`jose`,
 * `node:crypto` for headers `jose` will not sign), a real JWKS, userinfo and introspection
 * server on 127.0.0.1 (and a second one where a token or a secret must never go). Algorithm
 * confusion, critical and key-locating headers, `kid` as a name only, audiences, what the cache
 * keys, redirects and a body that trickles. Time is a manual clock, except for the one timeout.
 */
import { KeyObject, sign as cryptoSign } from 'node:crypto'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { type CryptoKey, type JWK, SignJWT, exportJWK, exportSPKI, generateKeyPair, importJWK } from 'jose'
import {
  AuthorizationServerUnavailableError,
  type OAuthValidatorEvent,
  type OAuthValidatorOptions,
  createOAuthValidator,
} from 'mcp-dispatch'
import { afterEach, beforeAll, beforeEach, describe, expect, it, onTestFinished, vi } from 'vitest'
import { type ManualClock, createManualClock, createRecordingSleep } from './helpers/clock.js'
import { type FakeUpstream, startFakeUpstream } from './helpers/fake-upstream.js'

let fake: FakeUpstream
let clock: ManualClock
let events: OAuthValidatorEvent[]
const weather = { resource: 'http://weather.localhost', appId: 'app_weather' }

const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')

/** A compact JWS of any header and payload, signed ES256 with `key`: `jose` refuses to sign some of these. */
function signRaw(header: Record<string, unknown>, payload: Record<string, unknown>, key: CryptoKey): string {
  const input = `${b64(header)}.${b64(payload)}`
  const signature = cryptoSign('sha256', Buffer.from(input), { key: KeyObject.from(key), dsaEncoding: 'ieee-p1363' })
  return `${input}.${signature.toString('base64url')}`
}

// The issuer's keys, and an attacker's.
let rsa: CryptoKeyPair
let ec: CryptoKeyPair
let attacker: CryptoKeyPair
let rsaJwk: JWK
let ecJwk: JWK
beforeAll(async () => {
  rsa = await generateKeyPair('RS256', { extractable: true })
  ec = await generateKeyPair('ES256')
  attacker = await generateKeyPair('ES256')
  rsaJwk = { ...(await exportJWK(rsa.publicKey)), kid: 'rk', alg: 'RS256', use: 'sig' }
  ecJwk = { ...(await exportJWK(ec.publicKey)), kid: 'k1', alg: 'ES256', use: 'sig' }
})

beforeEach(async () => {
  fake = await startFakeUpstream()
  clock = createManualClock(Date.UTC(2030, 0, 1))
  events = []
  fake.route('/.well-known/openid-configuration', {
    status: 200,
    body: {
      issuer: fake.url,
      userinfo_endpoint: `${fake.url}/me`,
      jwks_uri: `${fake.url}/jwks`,
      introspection_endpoint: `${fake.url}/introspect`,
    },
  })
  fake.route('/jwks', { status: 200, body: { keys: [rsaJwk, ecJwk] } })
})

afterEach(async () => {
  await fake.close()
})

function validator(options: Partial<OAuthValidatorOptions> = {}) {
  return createOAuthValidator({
    issuer: fake.url,
    now: clock,
    sleep: createRecordingSleep(),
    random: () => 0.5,
    onEvent: (e) => events.push(e),
    ...options,
  })
}

/** Claims that pass every check at `weather`, issued now. */
function claims(extra: Record<string, unknown> = {}): Record<string, unknown> {
  const now = Math.floor(clock() / 1000)
  return { sub: 'user_alice', iss: fake.url, aud: weather.resource, iat: now, exp: now + 600, ...extra }
}

const signed = (extra: Record<string, unknown>, header: Record<string, unknown>, key: CryptoKey | Uint8Array) =>
  new SignJWT(claims(extra)).setProtectedHeader(header as { alg: string }).sign(key)

/** The answer, or the name of the error it threw. */
const outcome = (promise: Promise<unknown>) => promise.catch((e: unknown) => (e instanceof Error ? e.constructor.name : e))

describe('jwt mode: what a token says of its own key and algorithm', () => {
  it('algorithm confusion: HS256 keyed with the RSA public key (PEM or JWK), alg none, PS256 under an RS256 key, a key whose use or key_ops is not verifying, an alg outside `algorithms`: refused (401), no refetch, breaker untouched', async () => {
    const enc = await generateKeyPair('ES256')
    const ops = await generateKeyPair('ES256')
    fake.route('/jwks', {
      status: 200,
      body: {
        keys: [
          rsaJwk,
          ecJwk,
          { ...(await exportJWK(enc.publicKey)), kid: 'enc', use: 'enc' },
          { ...(await exportJWK(ops.publicKey)), kid: 'ops', key_ops: ['encrypt'] },
        ],
      },
    })
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await signed({}, { alg: 'ES256', kid: 'k1', typ: 'at+jwt' }, ec.privateKey), weather)).toMatchObject({ active: true })
    const pem = new TextEncoder().encode(await exportSPKI(rsa.publicKey))
    const psKey = await importJWK(await exportJWK(rsa.privateKey), 'PS256')
    const refused: Record<string, string> = {
      'HS256, PEM, kid': await signed({}, { alg: 'HS256', kid: 'rk' }, pem),
      'HS256, PEM, no kid': await signed({}, { alg: 'HS256' }, pem),
      'HS256, JWK': await signed({}, { alg: 'HS256', kid: 'rk' }, new TextEncoder().encode(JSON.stringify(rsaJwk))),
      'none, kid': `${b64({ alg: 'none', kid: 'k1' })}.${b64(claims())}.`,
      'none, no kid': `${b64({ alg: 'none' })}.${b64(claims())}.`,
      'PS256 under RS256': await signed({}, { alg: 'PS256', kid: 'rk' }, psKey),
      'use enc': await signed({}, { alg: 'ES256', kid: 'enc' }, enc.privateKey),
      'key_ops encrypt': await signed({}, { alg: 'ES256', kid: 'ops' }, ops.privateKey),
    }
    for (const [name, token] of Object.entries(refused)) {
      expect(await outcome(v.validate(token, weather)), name).toMatchObject({ active: false })
    }
    expect(fake.count('/jwks')).toBe(1)
    expect(v.breakerState).toBe('closed')

    const esOnly = validator({ mode: 'jwt', algorithms: ['ES256'] })
    expect(await esOnly.validate(await signed({}, { alg: 'RS256', kid: 'rk' }, rsa.privateKey), weather)).toEqual({
      active: false,
      reason: 'invalid signature or token',
    })
    expect(fake.count('/jwks')).toBe(2) // this validator's first fetch; the token caused none of its own
  })

  it('crit, jku, x5u and an embedded jwk: an unknown critical header refuses the token; key URLs and keys a token carries are never fetched nor trusted', async () => {
    const elsewhere = await startFakeUpstream()
    try {
      const attackerJwk = await exportJWK(attacker.publicKey)
      elsewhere.route('/keys', { status: 200, body: { keys: [{ ...attackerJwk, kid: 'k1' }] } })
      const v = validator({ mode: 'jwt' })
      expect(await v.validate(await signed({}, { alg: 'ES256', kid: 'k1' }, ec.privateKey), weather)).toMatchObject({ active: true })
      const locating = { jku: `${elsewhere.url}/keys`, x5u: `${elsewhere.url}/cert`, jwk: attackerJwk }
      const tokens: Record<string, string> = {
        'crit names an unknown header': signRaw({ alg: 'ES256', kid: 'k1', crit: ['foo'], foo: 1 }, claims(), ec.privateKey),
        'crit names a registered claim': signRaw({ alg: 'ES256', kid: 'k1', crit: ['exp'], exp: 1 }, claims(), ec.privateKey),
        'unencoded payload (b64 false)': signRaw({ alg: 'ES256', kid: 'k1', b64: false, crit: ['b64'] }, claims(), ec.privateKey),
        'key headers, the issuer’s kid': await signed({}, { alg: 'ES256', kid: 'k1', ...locating }, attacker.privateKey),
        // Issued before the keys in hand: no rotation can explain it.
        'key headers, no kid': await signed({ iat: Math.floor(clock() / 1000) - 3600 }, { alg: 'ES256', ...locating }, attacker.privateKey),
      }
      for (const [name, token] of Object.entries(tokens)) {
        expect(await outcome(v.validate(token, weather)), name).toEqual({ active: false, reason: 'invalid signature or token' })
      }
      expect(elsewhere.requests).toEqual([])
      expect(fake.count('/jwks')).toBe(1)
    } finally {
      await elsewhere.close()
    }
  })

  it('a kid is only a name: path characters or 6,000 of them never change the JWKS address, events quote at most 64 characters of it, and a token naming it is asked about at most once per refetch interval', async () => {
    const v = validator({ mode: 'jwt' })
    expect(await v.validate(await signed({}, { alg: 'ES256', kid: 'k1' }, ec.privateKey), weather)).toMatchObject({ active: true })
    for (const kid of ['../../../.well-known/openid-configuration?x=1#', `k1/${'x'.repeat(6000)}`]) {
      // Recent and with claims that pass: taken for a key rotated in since the fetch (503).
      const fresh = await signed({}, { alg: 'ES256', kid }, attacker.privateKey)
      for (let i = 0; i < 5; i++) expect(await outcome(v.validate(fresh, weather))).toBe('AuthorizationServerUnavailableError')
      clock.advance(30_000)
      // The refetch shows no such key: refused, not cached, and the next refetch waits its interval.
      expect(await v.validate(fresh, weather)).toEqual({ active: false, reason: 'no matching key' })
      for (let i = 0; i < 5; i++) expect(await v.validate(fresh, weather)).toEqual({ active: false, reason: 'no matching key' })
    }
    expect(fake.count('/jwks')).toBe(3)
    expect(new Set(fake.requests.map((r) => r.path))).toEqual(new Set(['/.well-known/openid-configuration', '/jwks']))
    for (const event of events) expect(JSON.stringify(event).length).toBeLessThan(300)
    expect(v.breakerState).toBe('closed')
    // Judged by the token's own claims, which anyone can make: told as `unknown-key`, never as the
    // server `unavailable` (regression: a scanner's made-up kids paged on-call as an outage).
    expect(events.filter((e) => e.type === 'unknown-key')).toHaveLength(10)
    expect(events.filter((e) => e.type === 'unavailable')).toEqual([])
  })

  it('with no onEvent, the 503s of made-up kids with a fresh iat write nothing (the default logger writes `unavailable`: a server to see to)', async () => {
    const written = vi.spyOn(console, 'error').mockImplementation(() => {})
    onTestFinished(() => written.mockRestore())
    const v = validator({ mode: 'jwt', onEvent: undefined })
    expect(await v.validate(await signed({}, { alg: 'ES256', kid: 'k1' }, ec.privateKey), weather)).toMatchObject({ active: true })
    for (let i = 0; i < 20; i++) {
      expect(await outcome(v.validate(await signed({}, { alg: 'ES256', kid: `scan-${i}` }, attacker.privateKey), weather))).toBe('AuthorizationServerUnavailableError')
    }
    // Only this validator's lines: a timer another file left behind may print into a shared worker.
    expect(written.mock.calls.map((args) => String(args[0])).filter((line) => line.startsWith('[mcp-dispatch] oauth'))).toEqual([])
  })

  it('a JWKS key this runtime cannot import (an ML-DSA key, kty AKP) counts against the breaker once per fetched set, not per token: junk naming it cannot open the breaker for everyone (regression: 5 requests did)', async () => {
    // A `pub` of no ML-DSA-44 key's size: no runtime imports it (one without ML-DSA refuses the algorithm).
    const pq = { kty: 'AKP', kid: 'pq', alg: 'ML-DSA-44', pub: 'AAAA' }
    fake.route('/jwks', { status: 200, body: { keys: [ecJwk, pq] } })
    const v = validator({ mode: 'jwt' })
    // A new token each time: an accepted one is cached, and would not show the keys at work.
    const good = (jti: string) => signed({ jti }, { alg: 'ES256', kid: 'k1' }, ec.privateKey)
    expect(await v.validate(await good('a'), weather)).toMatchObject({ active: true })
    // What anyone can send: a header naming the key, and nothing else of any worth.
    const junk = (n: number) => `${b64({ alg: 'ML-DSA-44', kid: 'pq' })}.${b64({ n })}.${'A'.repeat(64)}`
    for (let n = 0; n < 10; n++) {
      const error = await v.validate(junk(n), weather).catch((e: unknown) => e)
      expect(error).toBeInstanceOf(AuthorizationServerUnavailableError)
    }
    // A key the server publishes and this runtime cannot use is the server's to see to.
    expect(events.filter((e) => e.type === 'unavailable')).toHaveLength(10)
    expect(v.breakerState).toBe('closed')
    const counted = () => events.filter((e) => e.type === 'upstream' && e.endpoint === 'jwks' && e.outcome === 'failure').length
    expect(counted()).toBe(1)
    // The other keys go on verifying; the set is asked again once the interval allows.
    expect(await v.validate(await good('b'), weather)).toMatchObject({ active: true })
    clock.advance(30_000)
    expect(await v.validate(await good('c'), weather)).toMatchObject({ active: true })
    // Keys past their age (suspect) serve while the refetch runs beside; waited for here.
    const fetched = () => events.filter((e) => e.type === 'upstream' && e.endpoint === 'jwks' && e.outcome === 'ok').length
    while (fetched() < 2) await new Promise((resolve) => setImmediate(resolve))
    for (let n = 10; n < 20; n++) await v.validate(junk(n), weather).catch(() => {})
    expect(counted()).toBe(2)
    expect(v.breakerState).toBe('closed')
  })
})

describe('jwt mode: audiences, ID tokens and the cache key', () => {
  it('aud: one match among others is taken (RFC 7519); an empty list, or one holding a non-string, is refused; an ID token (its audience the client, nonce, at_hash) is refused by the default audience', async () => {
    const v = validator({ mode: 'jwt' })
    const es = { alg: 'ES256', kid: 'k1' }
    expect(await v.validate(await signed({ aud: ['https://api.other.example', weather.resource] }, es, ec.privateKey), weather)).toMatchObject({ active: true })
    for (const aud of [[], [weather.resource, 5], ['https://api.other.example']]) {
      expect(await v.validate(await signed({ aud }, es, ec.privateKey), weather), JSON.stringify(aud)).toEqual({ active: false, reason: 'audience mismatch' })
    }
    const idToken = await signed({ aud: 'client-1', azp: 'client-1', nonce: 'n-0S6_WzA2Mj', at_hash: '77QmUPtjPfzWtF2AnpK9RQ' }, { ...es, typ: 'JWT' }, ec.privateKey)
    expect(await v.validate(idToken, weather)).toEqual({ active: false, reason: 'not an access token (ID token)' })
    expect(await v.validate(await signed({ aud: 'client-1', azp: 'client-1' }, es, ec.privateKey), weather)).toEqual({ active: false, reason: 'audience mismatch' })
  })

  it('an ID token is refused by its claims (untyped or typed JWT), and a client id that is a URL at or under the App (a Client ID Metadata Document hosted there) never names the App, whichever App saw the token first (regression: its ID tokens were taken as access tokens, the path-inside audience match taking its client id); access tokens of Keycloak, Cognito, Entra and those naming their client beside the App are taken', async () => {
    const v = validator({ mode: 'jwt' })
    const refused = { active: false, reason: 'not an access token (ID token)' }
    const mismatch = { active: false, reason: 'audience mismatch' }
    const clientId = `${weather.resource}/clients/agent.json`
    for (const typ of [undefined, 'JWT', 'jwt', 'application/JWT']) {
      const es = { alg: 'ES256', kid: 'k1', ...(typ && { typ }) }
      const idTokens = {
        'at_hash, audience the App': { at_hash: '77QmUPtjPfzWtF2AnpK9RQ' },
        c_hash: { c_hash: 'LDktKdoQak3Pk0cnXxCltA' },
        s_hash: { s_hash: 'x6mBGlvPxuCgHFzIcZFuSw' },
        'nonce, no client named': { nonce: 'n-0S6_WzA2Mj' },
        "Keycloak's ID token (typ claim ID)": { typ: 'ID', azp: 'client-1', aud: [weather.resource, 'client-1'] },
        "Cognito's ID token (token_use id)": { token_use: 'id' },
      }
      for (const [name, extra] of Object.entries(idTokens)) {
        expect(await v.validate(await signed(extra, es, ec.privateKey), weather), `${name}, typ ${typ}`).toEqual(refused)
      }
      // Refused before any signature check: an attacker's key gets the same answer, and the
      // JWKS is not asked again.
      expect(await v.validate(await signed(idTokens.c_hash, { ...es, kid: 'nope' }, attacker.privateKey), weather)).toEqual(refused)
      // An audience naming the App only through the client's own id (a URL): no match.
      const ownId = {
        'code flow, nonce': { aud: clientId, azp: clientId, nonce: 'n-0S6_WzA2Mj' },
        'azp, no nonce': { aud: clientId, azp: clientId },
        'client id the App itself, spelt otherwise': { aud: weather.resource, azp: `${weather.resource.toUpperCase()}/` },
        'client_id claim': { aud: [clientId, 'https://api.other.example'], client_id: clientId },
      }
      for (const [name, extra] of Object.entries(ownId)) {
        expect(await v.validate(await signed(extra, es, ec.privateKey), weather), `${name}, typ ${typ}`).toEqual(mismatch)
      }
      // Access tokens that name their client: taken. Keycloak before 24 copies the nonce into
      // its access tokens, which name their client in azp; Cognito's say token_use access.
      for (const extra of [{ azp: 'client-1' }, { azp: 'client-1', nonce: 'n-0S6_WzA2Mj', typ: 'Bearer' }, { cid: 'client-1', nonce: 'n' }, { appid: 'client-1', nonce: 'n' }, { applicationId: 'client-1', nonce: 'n' }, { client_id: 'client-1', token_use: 'access' }, { client_id: clientId }, { aud: [weather.resource, clientId], azp: clientId }, { azp: clientId, aud: `${weather.resource}/v1` }]) {
        expect(await v.validate(await signed(extra, es, ec.privateKey), weather), `${JSON.stringify(extra)}, typ ${typ}`).toMatchObject({ active: true, info: { subject: 'user_alice' } })
      }
    }
    expect(fake.count('/jwks')).toBe(1)
    // Whichever App sees it first: accepted where it names another App, never at the App its
    // client id lies under (the cached entry keeps no client id as an audience).
    const other = { resource: 'https://api.other.example', appId: 'app_other' }
    const both = await signed({ aud: [clientId, other.resource], azp: clientId }, { alg: 'ES256', kid: 'k1' }, ec.privateKey)
    expect(await v.validate(both, other)).toMatchObject({ active: true })
    expect(await v.validate(both, weather)).toEqual(mismatch)
    expect(await v.validate(both, other)).toMatchObject({ active: true })
    // A client id that is no URL names no App address: an Entra API that is its own client
    // (aud and azp the same GUID) is taken where that GUID is the audience expected.
    const guid = '6e74172b-be56-4843-9ff4-e66a39bb12e3'
    const entra = validator({ mode: 'jwt', audience: guid })
    expect(await entra.validate(await signed({ aud: guid, azp: guid, ver: '2.0' }, { alg: 'ES256', kid: 'k1', typ: 'JWT' }, ec.privateKey), weather)).toMatchObject({ active: true })
    // Typed at+jwt (RFC 9068), no claim makes it an ID token, but its client id still names no App.
    const at = { alg: 'ES256', kid: 'k1', typ: 'at+jwt' }
    expect(await v.validate(await signed({ client_id: clientId, jti: 'j1', nonce: 'n', at_hash: 'x' }, at, ec.privateKey), weather)).toMatchObject({ active: true })
    expect(await v.validate(await signed({ aud: clientId, client_id: clientId, jti: 'j2' }, at, ec.privateKey), weather)).toEqual(mismatch)
    // With any audience accepted (`audience: false`), an ID token's own claims still refuse it.
    const anyAudience = validator({ mode: 'jwt', audience: false })
    for (const extra of [{ at_hash: 'x' }, { nonce: 'n' }, { typ: 'ID', azp: 'client-1' }]) {
      expect(await anyAudience.validate(await signed({ aud: 'client-1', ...extra }, { alg: 'ES256', kid: 'k1' }, ec.privateKey), weather), JSON.stringify(extra)).toEqual(refused)
    }
    // Nothing tells this one from an access token for the client (documented).
    expect(await anyAudience.validate(await signed({ aud: 'client-1', azp: 'client-1', nonce: 'n' }, { alg: 'ES256', kid: 'k1' }, ec.privateKey), weather)).toMatchObject({ active: true })

    // Userinfo mode with an audience to check: the only audience check there is the early one
    // on the token's own claims, and the client's own id names no App in it either.
    fake.route('/me', { status: 200, body: { sub: 'user_alice' } })
    const userinfo = validator({ audience: ({ resource }) => resource })
    expect(await userinfo.validate(await signed({ aud: clientId, azp: clientId }, { alg: 'ES256', kid: 'k1' }, ec.privateKey), weather)).toEqual(mismatch)
    expect(fake.count('/me')).toBe(0)
    expect(await userinfo.validate(await signed({ azp: clientId }, { alg: 'ES256', kid: 'k1' }, ec.privateKey), weather)).toMatchObject({ active: true })
    expect(fake.count('/me')).toBe(1)

    // Introspection: a server that answers an ID token active (Keycloak's, with `typ: "ID"` and
    // the token's claims) gets it refused the same way.
    const base = { active: true, sub: 'user_alice', iss: fake.url, token_type: 'Bearer', exp: Math.floor(clock() / 1000) + 600 }
    const answers: Record<string, Record<string, unknown>> = {
      'id-nonce': { ...base, typ: 'ID', aud: clientId, azp: clientId, nonce: 'n-0S6_WzA2Mj' },
      'id-azp': { ...base, typ: 'ID', aud: clientId, azp: clientId },
      'id-azp-untyped': { ...base, aud: clientId, azp: clientId },
      'id-azp-spelt-otherwise': { ...base, aud: `${clientId}`.replace('http:', 'HTTP:'), azp: clientId },
      'id-client': { ...base, aud: [clientId], client_id: clientId },
      access: { ...base, aud: weather.resource, client_id: clientId },
      'keycloak-access': { ...base, typ: 'Bearer', aud: weather.resource, azp: 'client-1', client_id: clientId, nonce: 'n-0S6_WzA2Mj' },
      'access-both': { ...base, aud: [clientId, `${weather.resource}/v1`], client_id: clientId },
    }
    fake.route('/introspect', (req) => ({ status: 200, body: answers[new URLSearchParams(req.body).get('token')!]! }))
    const introspection = validator({ mode: 'introspection', introspection: { clientId: 'rs', clientSecret: 's3cret' } })
    for (const token of ['id-nonce', 'id-azp']) expect(await introspection.validate(token, weather), token).toEqual(refused)
    for (const token of ['id-azp-untyped', 'id-azp-spelt-otherwise', 'id-client']) expect(await introspection.validate(token, weather), token).toEqual({ active: false, reason: 'audience mismatch' })
    for (const token of ['access', 'access-both', 'keycloak-access']) expect(await introspection.validate(token, weather), token).toMatchObject({ active: true, info: { subject: 'user_alice', clientId } })
  })

  it('a token differing from an accepted one only in case, or by whitespace around it, is not served its cached answer (jwt and userinfo modes)', async () => {
    const v = validator({ mode: 'jwt' })
    const good = await signed({}, { alg: 'ES256', kid: 'k1' }, ec.privateKey)
    expect(await v.validate(good, weather)).toMatchObject({ active: true })
    const [header, payload, signature] = good.split('.') as [string, string, string]
    for (const variant of [`${header}.${payload}.${signature.toUpperCase()}`, `${header.toLowerCase()}.${payload}.${signature}`, ` ${good}`, `${good}\n`]) {
      expect(await v.validate(variant, weather)).toMatchObject({ active: false })
    }

    fake.route('/me', (req) => (req.headers.authorization === 'Bearer good-token' ? { status: 200, body: { sub: 'user_alice' } } : { status: 401 }))
    const u = validator()
    expect(await u.validate('good-token')).toMatchObject({ active: true })
    expect(await u.validate('GOOD-TOKEN')).toEqual({ active: false, reason: 'rejected by the authorization server' })
    expect(await u.validate(' good-token')).toEqual({ active: false, reason: 'not an RFC 6750 bearer token' })
    expect(await u.validate('good-token ')).toEqual({ active: false, reason: 'not an RFC 6750 bearer token' })
    expect(fake.count('/me')).toBe(2)
  })
})

describe('userinfo and introspection: where the token and the secret go', () => {
  it('a userinfo answer naming another issuer refuses the token (401, remembered as a refusal): a shared userinfo endpoint takes other tenants’ tokens (regression: their sub was taken); one naming this issuer, or none, is taken; a sub that is no string is 503', async () => {
    const answers: Record<string, { status: number; body: unknown; headers?: Record<string, string> }> = {
      'other-tenant': { status: 200, body: { sub: 'user_alice', iss: 'https://idp.example.com/t/other' } },
      'iss-slash': { status: 200, body: { sub: 'user_alice', iss: `${fake.url}/` } },
      'iss-number': { status: 200, body: { sub: 'user_alice', iss: 7 } },
      'signed-other': {
        status: 200,
        headers: { 'content-type': 'application/jwt' },
        body: await new SignJWT({ sub: 'user_alice', iss: 'https://idp.example.com/t/other' }).setProtectedHeader({ alg: 'ES256' }).sign(attacker.privateKey),
      },
      mine: { status: 200, body: { sub: 'user_alice', iss: fake.url } },
      none: { status: 200, body: { sub: 'user_alice' } },
      'sub-number': { status: 200, body: { sub: 42 } },
      'sub-list': { status: 200, body: { sub: ['user_alice'] } },
      'sub-empty': { status: 200, body: { sub: '' } },
    }
    fake.route('/me', (req) => answers[req.headers.authorization!.slice('Bearer '.length)]!)
    const v = validator({ breaker: { failureThreshold: 2 } })
    for (const token of ['other-tenant', 'iss-slash', 'iss-number', 'signed-other']) {
      expect(await v.validate(token), token).toEqual({ active: false, reason: 'issuer mismatch' })
      expect(await v.validate(token), token).toEqual({ active: false, reason: 'issuer mismatch' })
    }
    expect(fake.count('/me')).toBe(4) // each refusal remembered
    expect(await v.validate('mine')).toEqual({ active: true, info: { subject: 'user_alice' } })
    expect(await v.validate('none')).toEqual({ active: true, info: { subject: 'user_alice' } })
    for (const token of ['sub-number', 'sub-list', 'sub-empty']) {
      await expect(v.validate(token), token).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    }
    expect(v.breakerState).toBe('closed')
  })

  it('a redirect to another host is not followed: that host never sees the token or the client secret (503, not counted)', async () => {
    const elsewhere = await startFakeUpstream()
    try {
      elsewhere.route('/steal', { status: 200, body: { active: true, sub: 'user_alice', aud: weather.resource } })
      fake.route('/introspect', { status: 307, headers: { location: `${elsewhere.url}/steal` } })
      fake.route('/me', { status: 308, headers: { location: `${elsewhere.url}/steal` } })
      const introspection = validator({ mode: 'introspection', introspection: { clientId: 'rs', clientSecret: 's3cret' } })
      const userinfo = validator()
      await expect(introspection.validate('opaque-token-1', weather)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
      await expect(userinfo.validate('opaque-token-2', weather)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
      expect(elsewhere.requests).toEqual([])
      expect([introspection.breakerState, userinfo.breakerState]).toEqual(['closed', 'closed'])
    } finally {
      await elsewhere.close()
    }
  })

  it('an answer that trickles in (headers at once, then a byte at a time) is cut at timeoutMs, not read for as long as the server drips', async () => {
    let closed = false
    const server = createServer((_req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.write('{"sub":"user_alice"')
      const drip = setInterval(() => res.write(' '), 10)
      res.on('close', () => {
        clearInterval(drip)
        closed = true
      })
    })
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    try {
      const v = createOAuthValidator({
        issuer: fake.url,
        userinfoEndpoint: `http://127.0.0.1:${(server.address() as AddressInfo).port}/me`,
        timeoutMs: 200,
        retry: { attempts: 1 },
      })
      const started = Date.now()
      const error = await v.validate('opaque-token').catch((e: unknown) => e)
      expect(error).toBeInstanceOf(AuthorizationServerUnavailableError)
      expect(((error as Error).cause as Error).message).toBe('userinfo: timed out after 200 ms')
      expect(Date.now() - started).toBeLessThan(2_000)
      for (let i = 0; i < 100 && !closed; i++) await new Promise((resolve) => setTimeout(resolve, 10))
      expect(closed).toBe(true)
    } finally {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
    }
  })
})
