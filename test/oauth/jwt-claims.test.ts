/** Claim checks and resource matching for JWT access tokens (RFC 9068, RFC 8707). */
import { SignJWT, generateKeyPair } from 'jose'
import { discoveryUrls } from '../../src/auth/discovery.js'
import { audienceMatches, checkAccessTokenClaims, idTokenSigns, issuedSince, normalizeResource, peekJwtClaims, withResourceAudience } from '../../src/auth/jwt-claims.js'
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
    // Such an audience still matches an expected value of the very same text.
    [['https://weather.example.com/v 1'], ['https://weather.example.com/v 1'], true],
    // A password alone is userinfo too.
    [['https://:p@weather.example.com/v1'], ['https://weather.example.com'], false],
    // A fragment or a query names no path inside the App, nor does a path outside an expected
    // address that has one of its own.
    [['https://weather.example.com/v1#x'], ['https://weather.example.com'], false],
    [['https://weather.example.com/v1'], ['https://weather.example.com/?tenant=a'], false],
    [['https://weather.example.com/v1'], ['https://weather.example.com/#a'], false],
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

  it('a token is valid from the second of its nbf on, and from the tolerance before it (RFC 7519 section 4.1.5: on or after)', () => {
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com', nbf: now / 1000 }, base)).toBeUndefined()
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com', nbf: now / 1000 + 5 }, { ...base, clockToleranceMs: 5_000 })).toBeUndefined()
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com', nbf: now / 1000 + 6 }, { ...base, clockToleranceMs: 5_000 })).toBe('token not yet valid')
  })

  it('an expected audience list that is empty matches no token: refused, never taken for no audience check', () => {
    expect(checkAccessTokenClaims({ iss: 'https://auth.example.com', exp, aud: 'https://weather.example.com' }, { ...base, audience: [] })).toBe('audience mismatch')
  })

  it('a client_id that is a URL names no App, with or without azp: its token is refused where the App is expected', () => {
    const audience = ['https://weather.example.com']
    const claims = { iss: 'https://auth.example.com', exp, aud: 'https://weather.example.com/client.json', client_id: 'https://weather.example.com/client.json' }
    expect(withResourceAudience(claims).aud).toEqual([])
    expect(checkAccessTokenClaims(withResourceAudience(claims), { ...base, audience })).toBe('audience mismatch')
    // Beside the App's own address, the App's is still named.
    expect(checkAccessTokenClaims(withResourceAudience({ ...claims, aud: [claims.aud, 'https://weather.example.com'] }), { ...base, audience })).toBeUndefined()
  })
})

describe('idTokenSigns', () => {
  it('takes a typ claim of "ID" in any case for an ID token (Keycloak), and "Bearer" for none', () => {
    for (const typ of ['ID', 'id', 'Id']) expect(idTokenSigns({ aud: 'client-1', azp: 'client-1', typ }), typ).toBe(true)
    expect(idTokenSigns({ aud: 'https://weather.example.com', azp: 'client-1', typ: 'Bearer' })).toBe(false)
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

  it('at the edges: a fetch at the last millisecond of the second iat (or the tolerance past it) may be the earlier; one a millisecond later is not', () => {
    const iat = 1_700_000_000
    expect(issuedSince(iat, 1_700_000_000_999, 0)).toBe(true)
    expect(issuedSince(iat, 1_700_000_001_000, 0)).toBe(false)
    expect(issuedSince(iat, 1_700_000_005_999, 5_000)).toBe(true)
    expect(issuedSince(iat, 1_700_000_006_000, 5_000)).toBe(false)
  })
})
