/** Claim checks and resource matching for JWT access tokens (RFC 9068, RFC 8707). */
import { SignJWT, generateKeyPair } from 'jose'
import { discoveryUrls } from '../../src/auth/discovery.js'
import { audienceMatches, checkAccessTokenClaims, issuedSince, normalizeResource, peekJwtClaims } from '../../src/auth/jwt-claims.js'
import { describe, expect, it } from 'vitest'

describe('audienceMatches', () => {
  it.each([
    [['https://weather.example.com'], ['https://weather.example.com/'], true],
    [['https://Weather.Example.com:443'], ['https://weather.example.com'], true],
    [['https://weather.example.com/v1'], ['https://weather.example.com'], true],
    [['https://weather.example.com/v1.2.3/'], ['https://weather.example.com/'], true],
    [['https://weather.example.com'], ['https://weather.example.com/v1'], false],
    [['https://platform.example.com/apps/weather-2'], ['https://platform.example.com/apps/weather'], false],
    [['https://notes.example.com'], ['https://weather.example.com'], false],
    [['http://weather.example.com'], ['https://weather.example.com'], false],
    [['api://default', 'https://weather.example.com'], ['https://weather.example.com'], true],
    [['api://default'], ['api://default'], true],
    [['api://default/x'], ['api://default'], false],
    // Userinfo: the App's origin, but no address of the App (regression).
    [['https://u@weather.example.com'], ['https://weather.example.com'], false],
    [['https://u:p@weather.example.com/v1'], ['https://weather.example.com'], false],
    // Characters no URI has, which the URL parser would clean into the App's address (regression).
    [['https://weather.example.com\\@evil.example'], ['https://weather.example.com'], false],
    [['https://weather.exam\tple.com'], ['https://weather.example.com'], false],
    [['https://weather.example.com\n'], ['https://weather.example.com'], false],
    [['https://weather.example.com\u0085'], ['https://weather.example.com'], false],
    [['https://b\u00fccher.example/v1'], ['https://B\u00dcCHER.example'], true],
    [['https://weather.example.com/v 1'], ['https://weather.example.com'], false],
    [['weather api'], ['weather api'], true],
  ])('%j against %j: %s', (actual, expected, result) => {
    expect(audienceMatches(actual, expected)).toBe(result)
  })

  it('normalizes only http(s) URLs', () => {
    expect(normalizeResource('HTTPS://A.example.com')).toBe('https://a.example.com/')
    expect(normalizeResource('urn:example:resource')).toBe('urn:example:resource')
  })
})

describe('checkAccessTokenClaims', () => {
  const now = Date.UTC(2030, 0, 1)
  const base = { issuer: 'https://auth.example.com', requireIssuer: true, now, clockToleranceMs: 0 }
  const exp = now / 1000 + 60

  it('checks iss, exp, nbf and aud', () => {
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com', exp }, base)).toBeUndefined()
    expect(checkAccessTokenClaims({ exp }, base)).toBe('issuer mismatch')
    expect(checkAccessTokenClaims({ exp }, { ...base, requireIssuer: false })).toBeUndefined()
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com', exp: now / 1000 }, base)).toBe('token expired')
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com', exp: now / 1000 }, { ...base, clockToleranceMs: 1000 })).toBeUndefined()
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com', nbf: now / 1000 + 5 }, base)).toBe('token not yet valid')
    const audience = ['https://weather.example.com']
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com', aud: 'https://weather.example.com' }, { ...base, audience })).toBeUndefined()
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com' }, { ...base, audience })).toBe('audience mismatch')
  })
})

describe('peekJwtClaims and discoveryUrls', () => {
  it('reads the claims of a JWS and nothing else', async () => {
    const { privateKey } = await generateKeyPair('ES256')
    const jwt = await new SignJWT({ sub: 'u' }).setProtectedHeader({ alg: 'ES256' }).setIssuer('https://a.example').sign(privateKey)
    expect(peekJwtClaims(jwt)).toMatchObject({ sub: 'u', iss: 'https://a.example' })
    expect(peekJwtClaims('svc_opaque-token')).toBeUndefined()
    expect(peekJwtClaims('a.b.c')).toBeUndefined()
    expect(peekJwtClaims('a.b.c.d.e')).toBeUndefined()
  })

  it('builds OpenID and RFC 8414 discovery URLs, path-aware', () => {
    expect(discoveryUrls('https://auth.example.com')).toEqual([
      'https://auth.example.com/.well-known/openid-configuration',
      'https://auth.example.com/.well-known/oauth-authorization-server',
    ])
    expect(discoveryUrls('https://auth.example.com/realms/main/')).toEqual([
      'https://auth.example.com/realms/main/.well-known/openid-configuration',
      'https://auth.example.com/.well-known/oauth-authorization-server/realms/main',
    ])
  })
})

describe('issuedSince: a token that may have been issued after a key set was fetched', () => {
  it('counts whole seconds: a token of the fetch\'s own second may be the later; the tolerance widens it; no numeric iat is not', () => {
    const fetchedAt = 1_700_000_000_500
    expect(issuedSince(1_700_000_000, fetchedAt, 0)).toBe(true) // the same second
    expect(issuedSince(1_699_999_999, fetchedAt, 0)).toBe(false) // the second before
    expect(issuedSince(1_699_999_999, fetchedAt, 5_000)).toBe(true) // within the tolerance
    expect(issuedSince(1_699_999_990, fetchedAt, 5_000)).toBe(false)
    for (const iat of [undefined, '1700000000', Number.NaN]) expect(issuedSince(iat, fetchedAt, 5_000)).toBe(false)
  })
})
