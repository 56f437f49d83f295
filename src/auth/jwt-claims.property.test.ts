/**
 * Properties of the JWT claim checks, over generated input: what a token presents is chosen by
 * whoever sends it.
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { audienceList, audienceMatches, checkAccessTokenClaims, peekJwtClaims } from './jwt-claims.js'

const b64url = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')

/** Claims as a JSON object can carry them (no `undefined`, no `-0`, which JSON cannot tell). */
const claimsArb = fc.dictionary(
  fc.string({ minLength: 1, maxLength: 12 }).filter((k) => k !== '__proto__'),
  fc.jsonValue({ maxDepth: 2 }).map((v) => JSON.parse(JSON.stringify(v)) as unknown),
  { maxKeys: 8 },
)

const label = fc.stringMatching(/^[a-z][a-z0-9]{0,9}$/)
const hostArb = fc.tuple(label, label).map(([a, b]) => `${a}.${b}.example`)
const segment = fc.stringMatching(/^[a-z0-9]{1,8}$/)
const pathArb = fc.array(segment, { maxLength: 3 }).map((s) => (s.length ? `/${s.join('/')}` : ''))

describe('peekJwtClaims', () => {
  it('never throws, and finds no claims in a string without a dot (an opaque token)', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 300 }), (token) => {
        const claims = peekJwtClaims(token)
        if (!token.includes('.')) expect(claims).toBeUndefined()
      }),
      { numRuns: 2000 },
    )
  })

  it('reads back the claims of any compact JWS, whatever its signature', () => {
    fc.assert(
      fc.property(claimsArb, fc.stringMatching(/^[A-Za-z0-9_-]{0,40}$/), (claims, signature) => {
        const token = `${b64url({ alg: 'ES256', typ: 'at+jwt' })}.${b64url(claims)}.${signature}`
        expect(peekJwtClaims(token)).toEqual(claims)
      }),
    )
  })

  it('finds nothing in a payload that is not a JSON object, or in a JWE (five parts)', () => {
    fc.assert(
      fc.property(fc.oneof(fc.jsonValue().filter((v) => v === null || typeof v !== 'object' || Array.isArray(v)), fc.constant('not json')), (payload) => {
        const body = typeof payload === 'string' ? Buffer.from(payload).toString('base64url') : b64url(payload)
        expect(peekJwtClaims(`${b64url({ alg: 'none' })}.${body}.`)).toBeUndefined()
      }),
    )
    expect(peekJwtClaims('a.b.c.d.e')).toBeUndefined()
  })
})

describe('audienceMatches', () => {
  it('an audience that begins like an http(s) URL and is none refuses the token, never throws (regression: `https://[::1` threw out of validate(), 503 on every request, before any signature check)', () => {
    const unparsable = fc.oneof(
      fc.constantFrom('https://[::1', 'http://a b', 'https://', 'http://', 'https://a.example:99999', 'HTTPS://[zz]/'),
      fc.tuple(fc.constantFrom('http://', 'https://'), fc.string({ maxLength: 20 })).map(([scheme, rest]) => scheme + rest),
    )
    fc.assert(
      fc.property(unparsable, fc.constantFrom('https://app.example', 'https://app.example/v1', 'http://127.0.0.1:8787'), (aud, expected) => {
        if (URL.canParse(aud)) return
        expect(audienceMatches([aud], [expected])).toBe(false)
        expect(audienceMatches([expected, aud], [expected])).toBe(true)
        expect(checkAccessTokenClaims({ aud }, { issuer: 'https://auth.example.com', requireIssuer: false, now: Date.now(), clockToleranceMs: 0, audience: [expected] })).toBe('audience mismatch')
      }),
      { numRuns: 1000 },
    )
  })

  it('an App address matches itself however it is spelled: case of scheme and host, default port, a trailing slash', () => {
    fc.assert(
      fc.property(fc.constantFrom('http', 'https'), hostArb, pathArb, (scheme, host, path) => {
        const address = `${scheme}://${host}${path}`
        const port = scheme === 'https' ? ':443' : ':80'
        const spelled = `${scheme.toUpperCase()}://${host.toUpperCase()}${port}${path}${path ? '' : '/'}`
        expect(audienceMatches([spelled], [address])).toBe(true)
        expect(audienceMatches([address], [spelled])).toBe(true)
      }),
    )
  })

  it('a path inside the App matches on whole segments only; another host, scheme, port or user never does', () => {
    fc.assert(
      fc.property(hostArb, hostArb, pathArb, segment, segment, (host, other, path, inside, suffix) => {
        const app = `https://${host}${path}`
        expect(audienceMatches([`${app}/${inside}`], [app])).toBe(true)
        // `/app-2` is not inside `/app`.
        if (path) expect(audienceMatches([`${app}-${suffix}`], [app])).toBe(false)
        // The App is not inside a path of itself.
        expect(audienceMatches([app], [`${app}/${inside}`])).toBe(false)
        if (other !== host) expect(audienceMatches([`https://${other}${path}`], [app])).toBe(false)
        expect(audienceMatches([`http://${host}${path}`], [app])).toBe(false)
        expect(audienceMatches([`https://${host}:8443${path}`], [app])).toBe(false)
        expect(audienceMatches([`https://u@${host}${path}/${inside}`], [app])).toBe(false)
        expect(audienceMatches([`${app}/${inside}?q=1`], [app])).toBe(false)
      }),
    )
  })

  it('an audience list matches when any of its members does, and audienceList takes a string or a non-empty array of strings only', () => {
    fc.assert(
      fc.property(hostArb, fc.array(hostArb, { maxLength: 4 }), (host, others) => {
        const app = `https://${host}`
        const foreign = others.filter((o) => o !== host).map((o) => `https://${o}`)
        expect(audienceMatches(foreign, [app])).toBe(false)
        expect(audienceMatches([...foreign, app], [app])).toBe(true)
      }),
    )
    fc.assert(
      fc.property(fc.jsonValue(), (aud) => {
        const list = audienceList(aud)
        const valid = typeof aud === 'string' || (Array.isArray(aud) && aud.length > 0 && aud.every((a) => typeof a === 'string'))
        expect(list).toEqual(valid ? (typeof aud === 'string' ? [aud] : aud) : undefined)
      }),
    )
  })
})

describe('checkAccessTokenClaims', () => {
  const issuer = 'https://auth.example.com'
  it('refuses exactly the tokens past exp (beyond the tolerance), before nbf, or of another issuer', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1_000_000, max: 4_000_000_000 }),
        fc.option(fc.integer({ min: -100_000, max: 100_000 }), { nil: undefined }),
        fc.option(fc.integer({ min: -100_000, max: 100_000 }), { nil: undefined }),
        fc.integer({ min: 0, max: 120 }),
        fc.constantFrom(issuer, 'https://evil.example.com', undefined),
        fc.boolean(),
        (nowSeconds, expOffset, nbfOffset, toleranceSeconds, iss, requireIssuer) => {
          const claims = {
            ...(iss !== undefined && { iss }),
            ...(expOffset !== undefined && { exp: nowSeconds + expOffset }),
            ...(nbfOffset !== undefined && { nbf: nowSeconds + nbfOffset }),
          }
          const reason = checkAccessTokenClaims(claims, { issuer, requireIssuer, now: nowSeconds * 1000, clockToleranceMs: toleranceSeconds * 1000 })
          const expected =
            (iss === undefined ? requireIssuer : iss !== issuer)
              ? 'issuer mismatch'
              : expOffset !== undefined && expOffset <= -toleranceSeconds
                ? 'token expired'
                : nbfOffset !== undefined && nbfOffset > toleranceSeconds
                  ? 'token not yet valid'
                  : undefined
          expect(reason).toBe(expected)
        },
      ),
      { numRuns: 2000 },
    )
  })

  it('refuses an exp or nbf that is not a number, and an audience that is absent or malformed when one is expected', () => {
    fc.assert(
      fc.property(fc.jsonValue().filter((v) => typeof v !== 'number'), (bad) => {
        const expect_ = { issuer, requireIssuer: false, now: Date.now(), clockToleranceMs: 0 }
        expect(checkAccessTokenClaims({ exp: bad as unknown as number }, expect_)).toBe('token expired')
        expect(checkAccessTokenClaims({ nbf: bad as unknown as number }, expect_)).toBe('token not yet valid')
        const aud = audienceList(bad) === undefined ? bad : undefined
        expect(checkAccessTokenClaims({ aud: aud as string }, { ...expect_, audience: ['https://app.example'] })).toBe('audience mismatch')
      }),
    )
  })
})
