/**
 * Properties of the JWT claim checks, over generated input: what a token presents is chosen by
 * whoever sends it.
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { audienceList, audienceMatches, checkAccessTokenClaims, issuedSince, peekJwtClaims } from './jwt-claims.js'
import { parseUrl } from '../core/url.js'

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
        if (parseUrl(aud) !== undefined) return
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

/**
 * `issuedSince`: whether a token naming a key the set in hand lacks may have been signed with a
 * key published since the set was fetched (then the set is fetched again). `iat` is whole
 * seconds (the token's instant rounded down), `at` epoch ms, `toleranceMs` the clock skew allowed.
 */
describe('issuedSince', () => {
  const RUNS = { numRuns: 2000 }
  // Epoch ms from 1970 to 2100; tolerances up to an hour.
  const at = fc.integer({ min: 0, max: 4_102_444_800_000 })
  const tolerance = fc.integer({ min: 0, max: 3_600_000 })

  it('never false for a token issued at or after `at` (to the ms): its iat is that instant rounded down to the second', () => {
    fc.assert(
      fc.property(at, fc.nat(86_400_000), tolerance, (fetchedAt, delta, tol) => {
        const issued = fetchedAt + delta
        expect(issuedSince(Math.floor(issued / 1000), fetchedAt, tol)).toBe(true)
      }),
      RUNS,
    )
  })

  it('never false for a token issued up to toleranceMs before `at` (an issuer clock behind ours)', () => {
    fc.assert(
      fc.property(at, tolerance, fc.nat(3_600_000), (fetchedAt, tol, back) => {
        fc.pre(back <= tol)
        expect(issuedSince(Math.floor((fetchedAt - back) / 1000), fetchedAt, tol)).toBe(true)
      }),
      RUNS,
    )
  })

  it('agrees with the model: some instant of the second iat, moved by at most toleranceMs, is at or after `at`', () => {
    // The second `iat` holds the instants [iat*1000, iat*1000 + 999] (whole ms); the latest, with
    // the skew allowed, is iat*1000 + 999 + toleranceMs.
    fc.assert(
      fc.property(fc.integer({ min: -1_000_000, max: 4_200_000_000 }), at, tolerance, (iat, fetchedAt, tol) => {
        expect(issuedSince(iat, fetchedAt, tol)).toBe(iat * 1000 + 999 + tol >= fetchedAt)
      }),
      RUNS,
    )
  })

  it('monotone: a later iat, a larger tolerance or an earlier `at` never turns true into false', () => {
    const iatArb = fc.oneof(fc.integer({ min: 0, max: 4_200_000_000 }), fc.double({ min: 0, max: 4.2e9, noNaN: true }))
    fc.assert(
      fc.property(iatArb, fc.nat(100_000), at, fc.nat(10_000_000), tolerance, fc.nat(3_600_000), (iat, later, fetchedAt, earlier, tol, more) => {
        if (!issuedSince(iat, fetchedAt, tol)) return
        expect(issuedSince(iat + later, fetchedAt, tol)).toBe(true)
        expect(issuedSince(iat, fetchedAt, tol + more)).toBe(true)
        expect(issuedSince(iat, fetchedAt - earlier, tol)).toBe(true)
      }),
      RUNS,
    )
  })

  it('false without a numeric iat (absent, a string of digits, null, an object, NaN): never a refetch for a claim that is not a NumericDate', () => {
    const notNumber = fc.oneof(
      fc.constant(undefined),
      fc.constant(null),
      fc.integer().map(String),
      fc.string(),
      fc.boolean(),
      fc.bigInt(),
      fc.array(fc.integer(), { maxLength: 2 }),
      fc.object(),
      fc.constant(Number.NaN),
    )
    fc.assert(
      fc.property(notNumber, at, tolerance, (iat, fetchedAt, tol) => {
        expect(issuedSince(iat, fetchedAt, tol)).toBe(false)
      }),
      RUNS,
    )
  })
})
