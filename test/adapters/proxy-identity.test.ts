/**
 * The identity signer and verifier of the proxy handler (`mcp-dispatch/proxy`) on their own,
 * with no servers: what the verifier accepts (token age and lifetime, the claims every identity
 * token has, Node requests), how it tells a JWKS outage from a forged token, and which signer
 * and verifier options are refused when created rather than failing every request.
 */
import { type KeyObject, createPublicKey, generateKeyPairSync, webcrypto } from 'node:crypto'
import { IncomingMessage } from 'node:http'
import { Socket } from 'node:net'
import { type JWK, type JWTPayload, SignJWT, calculateJwkThumbprint, decodeProtectedHeader, exportJWK, generateKeyPair, importJWK } from 'jose'
import { ConfigurationError, type DispatchContext, JwksUnavailableError, UnauthorizedError } from 'mcp-dispatch'
import {
  type IdentityJwks,
  type IdentitySigner,
  type IdentitySignerOptions,
  type IdentityVerifierOptions,
  createIdentitySigner,
  createIdentityVerifier,
  createProxyHandler,
} from 'mcp-dispatch/proxy'
import { beforeAll, describe, expect, it } from 'vitest'

const ISSUER = 'https://platform.test'
const AUDIENCE = 'http://app.internal'
const at = Date.UTC(2030, 0, 1)
const seconds = at / 1000

const context: DispatchContext = {
  app: { id: 'app_weather', slug: 'weather', name: 'Weather' },
  identity: { subject: 'alice', method: 'api_token' },
  version: '2.0.0',
  latestVersion: '2.0.0',
  sessionId: undefined,
  baseUrl: 'http://weather.localhost',
  rateLimit: undefined,
}

describe('identity verifier', () => {
  let privateJwk: JWK
  let jwks: IdentityJwks

  beforeAll(async () => {
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    privateJwk = await exportJWK(privateKey)
    jwks = await createIdentitySigner({ issuer: ISSUER, privateKey: privateJwk }).jwks()
  })

  const verifier = (overrides: Partial<IdentityVerifierOptions> = {}) =>
    createIdentityVerifier({ jwks, issuer: ISSUER, audience: AUDIENCE, appId: 'app_weather', now: () => at, ...overrides })

  /** A token signed with the platform's key, with the claims the signer gives unless changed. */
  async function craft(claims: JWTPayload = {}): Promise<string> {
    const payload: JWTPayload = {
      iss: ISSUER,
      sub: 'alice',
      aud: AUDIENCE,
      iat: seconds,
      exp: seconds + 60,
      jti: 'c0ffee',
      app: 'app_weather',
      ver: '2.0.0',
      method: 'api_token',
      ...claims,
    }
    for (const [name, value] of Object.entries(payload)) if (value === undefined) delete payload[name]
    return new SignJWT(payload)
      .setProtectedHeader({ alg: 'ES256', kid: jwks.keys[0]!.kid!, typ: 'mcp-identity+jwt' })
      .sign(await importJWK(privateJwk, 'ES256'))
  }

  it('accepts what the signer issues, at any ttlSeconds it allows', async () => {
    const verify = verifier()
    await expect(verify(await craft())).resolves.toMatchObject({ subject: 'alice', method: 'api_token', version: '2.0.0' })
    await expect(verify(await craft({ exp: seconds + 3600 }))).resolves.toMatchObject({ subject: 'alice' })
    await expect(verify(await craft({ method: 'oauth' }))).resolves.toMatchObject({ method: 'oauth' })
    // Issued a little ahead of this clock: within the tolerance.
    await expect(verify(await craft({ iat: seconds + 4, exp: seconds + 64 }))).resolves.toMatchObject({ subject: 'alice' })
  })

  it('refuses a token of the platform key that lives too long or comes from the future (regression: a 10-year exp was accepted)', async () => {
    const verify = verifier()
    const refused = [
      craft({ exp: seconds + 10 * 365 * 86_400 }), // ten years
      craft({ exp: seconds + 3601 }), // past maxTokenAgeSeconds (default 3600)
      craft({ iat: seconds + 365 * 86_400, exp: seconds + 365 * 86_400 + 60 }), // issued a year ahead
      craft({ iat: seconds + 6, exp: seconds + 66 }), // ahead by more than the tolerance
      craft({ iat: seconds - 7200, exp: seconds + 60 }), // issued two hours ago, still unexpired
    ]
    for (const [i, token] of refused.entries()) {
      await expect(verify(await token), `token ${i}`).rejects.toBeInstanceOf(UnauthorizedError)
    }
    // An App whose platform signs for 60 s can say so.
    const strict = verifier({ maxTokenAgeSeconds: 60 })
    await expect(strict(await craft())).resolves.toMatchObject({ subject: 'alice' })
    await expect(strict(await craft({ exp: seconds + 61 }))).rejects.toBeInstanceOf(UnauthorizedError)
    await expect(strict(await craft({ iat: seconds - 70, exp: seconds + 1 }))).rejects.toBeInstanceOf(UnauthorizedError)
  })

  it('refuses a token without jti, with an empty sub or ver, or a method it does not know (regression: mapped to api_token)', async () => {
    const verify = verifier()
    for (const claims of [
      { jti: undefined },
      { jti: '' },
      { sub: '' },
      { ver: '' },
      { ver: 2 },
      { method: 'root' },
      { method: undefined },
      { method: 'OAUTH' },
    ]) {
      await expect(verify(await craft(claims)), JSON.stringify(claims)).rejects.toBeInstanceOf(UnauthorizedError)
    }
  })

  it('reads the token from a Node request (Express, Fastify, node:http): headers as a plain object (regression: input.headers.get is not a function)', async () => {
    const verify = verifier()
    const token = await craft()
    const req = new IncomingMessage(new Socket())
    req.headers['x-mcp-identity'] = token
    await expect(verify(req)).resolves.toMatchObject({ subject: 'alice' })
    await expect(verify({ headers: { 'x-mcp-identity': token } })).resolves.toMatchObject({ subject: 'alice' })
    await expect(verify(new IncomingMessage(new Socket()))).rejects.toThrow(/Missing identity token/)
    // Two values are one invalid token, as `Headers.get` joins them.
    await expect(verify({ headers: { 'x-mcp-identity': [token, token] } })).rejects.toThrow(/Invalid identity token/)
    // The header option is a name, matched in any case, on every kind of input.
    const custom = verifier({ header: 'X-Platform-Identity' })
    await expect(custom({ headers: { 'x-platform-identity': token } })).resolves.toMatchObject({ subject: 'alice' })
    await expect(custom(new Headers({ 'X-Platform-Identity': token }))).resolves.toMatchObject({ subject: 'alice' })
    await expect(custom(new Request('http://app.internal/mcp', { headers: { 'x-platform-identity': token } }))).resolves.toMatchObject({
      subject: 'alice',
    })
    // Anything else is a programming mistake, said as such.
    await expect(verify(42 as never)).rejects.toThrow(TypeError)
    await expect(verify({} as never)).rejects.toThrow(/expects a Request, Headers, a Node request/)
  })

  describe('a JWKS URL that cannot be fetched is a JwksUnavailableError (503), never the 401 of a forged token', () => {
    const url = 'https://platform.test/.well-known/jwks.json'
    const remote = (fetch: typeof globalThis.fetch) => verifier({ jwks: url, fetch })

    it('network failure, an answer other than 200 (its keys unused, though it carries a key set), an answer that is not JSON or not a JWKS', async () => {
      const token = await craft()
      const failures: Array<[string, typeof fetch]> = [
        ['network', async () => Promise.reject(new TypeError('fetch failed'))],
        ['503', async () => new Response('down', { status: 503 })],
        // A partial answer, an error page of a cache holding a copy.
        ...[206, 404, 500].map((status): [string, typeof fetch] => [`${status} with a key set`, async () => Response.json(jwks, { status })]),
        ['not JSON', async () => new Response('<html>', { status: 200 })],
        ['not a JWKS', async () => Response.json({ keys: 'none' })],
      ]
      for (const [label, fetch] of failures) {
        const error = await remote(fetch)(token).then(
          () => undefined,
          (e: unknown) => e,
        )
        expect(error, label).toBeInstanceOf(JwksUnavailableError)
        expect(error, label).toMatchObject({ code: 'ERR_JWKS_UNAVAILABLE', status: 503 })
        expect((error as Error).cause, label).toBeDefined()
      }
    })

    /** A token of the right claims signed by a key of `kid` the JWKS may not hold, issued at `iat` (s). */
    async function signedBy(key: CryptoKey, kid: string, iat: number): Promise<string> {
      return new SignJWT({ app: 'app_weather', ver: '2.0.0', method: 'api_token', jti: `j-${iat}` })
        .setProtectedHeader({ alg: 'ES256', kid, typ: 'mcp-identity+jwt' })
        .setIssuer(ISSUER)
        .setSubject('alice')
        .setAudience(AUDIENCE)
        .setIssuedAt(iat)
        .setExpirationTime(iat + 60)
        .sign(key)
    }

    it('with the JWKS fetched, a token it has no key for, or a tampered one, is a 401; one of an unknown kid issued since the fetch is a 503 until the JWKS may be fetched again', async () => {
      let clock = at
      let fetched = 0
      const timed = verifier({ jwks: url, fetch: async () => (fetched++, Response.json(jwks)), now: () => clock })
      await expect(timed(await craft())).resolves.toMatchObject({ subject: 'alice' })
      expect(fetched).toBe(1)
      const { privateKey: stranger } = await generateKeyPair('ES256')
      const token = await craft()
      // Issued before the fetch (past the 5 s tolerance): no key published since can be its.
      for (const refused of [await signedBy(stranger, 'unknown-kid', seconds - 60), `${token.slice(0, -4)}AAAA`, 'not.a.jwt']) {
        await expect(timed(refused)).rejects.toBeInstanceOf(UnauthorizedError)
      }
      // Issued since: its key may have been published after the fetch; within 30 s of it, 503.
      await expect(timed(await signedBy(stranger, 'unknown-kid', seconds))).rejects.toBeInstanceOf(JwksUnavailableError)
      expect(fetched).toBe(1)
      // Once the JWKS may be fetched again it is; a key it still lacks, for a token issued since
      // that fetch began, is a 503 again (the rule does not depend on who fetched, or when)...
      clock += 30_000
      await expect(timed(await signedBy(stranger, 'unknown-kid', seconds + 30))).rejects.toBeInstanceOf(JwksUnavailableError)
      expect(fetched).toBe(2)
      // ...and for a token issued before it, a 401.
      await expect(timed(await signedBy(stranger, 'unknown-kid', seconds))).rejects.toBeInstanceOf(UnauthorizedError)
      expect(fetched).toBe(2)
    })

    it('a token of an unknown kid that its own claims refuse is a 401, not a 503, with the keys fetched or while they cannot be (regression: a forged iat years ahead made the App answer 503)', async () => {
      const { privateKey: stranger } = await generateKeyPair('ES256')
      /** Forged: a key of no JWKS, the claims of the platform's tokens unless changed, typ and alg as given. */
      const forged = (claims: JWTPayload, header: { typ?: string; alg?: string } = {}) => {
        const payload: JWTPayload = { iss: ISSUER, sub: 'alice', aud: AUDIENCE, iat: seconds, exp: seconds + 60, jti: 'f', app: 'app_weather', ver: '2.0.0', method: 'api_token', ...claims }
        for (const [name, value] of Object.entries(payload)) if (value === undefined) delete payload[name]
        return new SignJWT(payload).setProtectedHeader({ alg: 'ES256', kid: 'made-up', typ: 'mcp-identity+jwt', ...header }).sign(stranger)
      }
      const refusedOnTheirFace: Array<[string, Promise<string>]> = [
        ['iat ten years ahead', forged({ iat: seconds + 315_360_000, exp: seconds + 315_360_060 })],
        ['iat a minute ahead', forged({ iat: seconds + 60, exp: seconds + 120 })],
        ['expired past the tolerance (issued since the fetch, its exp made earlier)', forged({ exp: seconds - 6 })],
        ['another issuer', forged({ iss: 'https://elsewhere.test' })],
        ['another audience', forged({ aud: 'https://other-app.test' })],
        ['another App', forged({ app: 'app_other' })],
        ['no jti', forged({ jti: undefined })],
        ['a method it does not know', forged({ method: 'password' })],
        ['a lifetime past the token age', forged({ exp: seconds + 86_400 })],
        ['not yet valid', forged({ nbf: seconds + 600 })],
        ['another typ', forged({}, { typ: 'JWT' })],
      ]
      let clock = at
      let up = true
      const fetchedFirst = verifier({ jwks: url, fetch: async () => (up ? Response.json(jwks) : new Response('down', { status: 503 })), now: () => clock })
      await expect(fetchedFirst(await craft())).resolves.toMatchObject({ subject: 'alice' })
      const neverFetched = verifier({ jwks: url, fetch: async () => new Response('down', { status: 503 }), now: () => at })
      for (const [label, token] of refusedOnTheirFace) {
        await expect(fetchedFirst(await token), label).rejects.toBeInstanceOf(UnauthorizedError)
        await expect(neverFetched(await token), `${label}, JWKS down`).rejects.toBeInstanceOf(UnauthorizedError)
      }
      // One whose claims pass stays a 503: its key may be a rotation's, or hidden by the outage.
      await expect(fetchedFirst(await forged({}))).rejects.toBeInstanceOf(JwksUnavailableError)
      await expect(fetchedFirst(await forged({}, { typ: 'application/MCP-Identity+JWT' }))).rejects.toBeInstanceOf(JwksUnavailableError)
      await expect(neverFetched(await forged({}))).rejects.toBeInstanceOf(JwksUnavailableError)
      up = false
      clock += 660_000
      await expect(fetchedFirst(await forged({ iat: seconds + 660, exp: seconds + 720 }))).rejects.toBeInstanceOf(JwksUnavailableError)
      await expect(fetchedFirst(await forged({ iat: seconds + 600, exp: seconds + 630 }))).rejects.toBeInstanceOf(UnauthorizedError)
    })

    it('a key rotation: a token of the new key, issued after a fetch that did not have it, is a 503 (retry), then verified once the JWKS is fetched again', async () => {
      let clock = at
      const next = await generateKeyPair('ES256', { extractable: true })
      const nextPublic = { ...(await exportJWK(next.publicKey)), kid: 'next', alg: 'ES256', use: 'sig' }
      let published: IdentityJwks = jwks
      const verify = verifier({ jwks: url, fetch: async () => Response.json(published), now: () => clock })
      await expect(verify(await craft())).resolves.toMatchObject({ subject: 'alice' })
      // The platform switches keys 5 s later.
      published = { keys: [...jwks.keys, nextPublic] }
      clock += 5_000
      const rotated = await signedBy(next.privateKey, 'next', seconds + 5)
      await expect(verify(rotated)).rejects.toBeInstanceOf(JwksUnavailableError)
      clock += 25_000
      await expect(verify(rotated)).resolves.toMatchObject({ subject: 'alice' })
    })

    it('keys in hand stay in use while the JWKS cannot be fetched, fetched again at most once per 30 s, whatever the kids tokens name', async () => {
      let clock = at
      let fetched = 0
      let up = true
      const verify = verifier({
        jwks: url,
        fetch: async () => (fetched++, up ? Response.json(jwks) : new Response('down', { status: 503 })),
        now: () => clock,
      })
      await expect(verify(await craft())).resolves.toMatchObject({ subject: 'alice' })
      up = false
      // Ten minutes on, the keys are due a refetch, which fails: they are kept (it was a 503 for
      // every token after ten minutes, and a fetch per request).
      clock += 660_000
      const later = seconds + 660
      for (let i = 0; i < 5; i++) await expect(verify(await craft({ iat: later, exp: later + 60 }))).resolves.toMatchObject({ subject: 'alice' })
      expect(fetched).toBe(2)
      // Made-up kids: no fetch within 30 s of the last attempt (it was one per token while
      // failing). Issued since the keys in hand were fetched, they could be a rotation's, which
      // the outage hides: 503, not 401.
      const { privateKey: stranger } = await generateKeyPair('ES256')
      for (let i = 0; i < 5; i++) await expect(verify(await signedBy(stranger, `forged-${i}`, later - 60))).rejects.toBeInstanceOf(JwksUnavailableError)
      expect(fetched).toBe(2)
      clock += 30_000
      await expect(verify(await signedBy(stranger, 'forged-again', later))).rejects.toBeInstanceOf(JwksUnavailableError)
      expect(fetched).toBe(3)
      // Back up: the keys are fetched again once due, and a made-up kid is then a 401.
      up = true
      clock += 30_000
      await expect(verify(await signedBy(stranger, 'forged-last', later))).rejects.toBeInstanceOf(UnauthorizedError)
      expect(fetched).toBe(4)
    })

    it('keys due a refetch serve their tokens while it runs (a JWKS that hangs held every request up to 5 s); a clock stepped back does not hold refetches off', async () => {
      let clock = at
      let release!: () => void
      let fetched = 0
      const verify = verifier({
        jwks: url,
        fetch: async () => {
          // The second fetch hangs until released; the others answer at once.
          if (++fetched === 2) await new Promise<void>((resolve) => (release = resolve))
          return Response.json(jwks)
        },
        now: () => clock,
      })
      await expect(verify(await craft())).resolves.toMatchObject({ subject: 'alice' })
      clock += 660_000
      const later = seconds + 660
      // The refetch hangs; the keys in hand answer at once.
      await expect(verify(await craft({ iat: later, exp: later + 60 }))).resolves.toMatchObject({ subject: 'alice' })
      expect(fetched).toBe(2)
      release()
      // Stepped back an hour: the wait since the last attempt is no wait, and a new kid is fetched for.
      clock -= 3_600_000
      const { privateKey: stranger } = await generateKeyPair('ES256')
      await expect(verify(await signedBy(stranger, 'after-step', seconds - 3000))).rejects.toBeInstanceOf(UnauthorizedError)
      expect(fetched).toBe(3)
    })

    it('a fetched key that cannot be used (it does not import) is a 503, not a 401, and the JWKS is fetched again once the 30 s allow', async () => {
      let clock = at
      let fetched = 0
      const broken = { ...jwks.keys[0]!, x: jwks.keys[0]!.y, y: jwks.keys[0]!.x } // not a point of the curve
      const verify = verifier({ jwks: url, fetch: async () => (fetched++, Response.json(fetched === 1 ? { keys: [broken] } : jwks)), now: () => clock })
      const token = await craft()
      await expect(verify(token)).rejects.toBeInstanceOf(JwksUnavailableError)
      expect(fetched).toBe(1)
      clock += 30_000
      // The refetch runs beside this request, which the keys in hand still cannot serve.
      await expect(verify(token)).rejects.toBeInstanceOf(JwksUnavailableError)
      await expect(verify(token)).resolves.toMatchObject({ subject: 'alice' })
      expect(fetched).toBe(2)
    })

    it('a clock that answers no time as the JWKS is about to be fetched is that ConfigurationError, and leaves nothing behind: the next call fetches', async () => {
      let readings = 0
      let fetched = 0
      // The second reading (the fetch's start) is NaN; every other one is good.
      const verify = verifier({ jwks: url, fetch: async () => (fetched++, Response.json(jwks)), now: () => (++readings === 2 ? Number.NaN : at) })
      await expect(verify(await craft())).rejects.toBeInstanceOf(ConfigurationError)
      expect(fetched).toBe(0)
      await expect(verify(await craft())).resolves.toMatchObject({ subject: 'alice' })
      expect(fetched).toBe(1)
    })

    it('a JWKS past 1 MiB, or a redirect, is no answer (503): never read whole, never followed', async () => {
      const token = await craft()
      const huge = JSON.stringify({ keys: [...jwks.keys, { kty: 'EC', crv: 'P-256', x: 'x'.repeat(2 * 1024 * 1024), y: 'y' }] })
      await expect(remote(async () => new Response(huge, { status: 200 }))(token)).rejects.toBeInstanceOf(JwksUnavailableError)
      let followed = false
      const redirecting = remote(async (_input, init) => {
        followed = init?.redirect !== 'manual'
        return new Response(null, { status: 302, headers: { location: 'https://elsewhere.test/jwks' } })
      })
      await expect(redirecting(token)).rejects.toBeInstanceOf(JwksUnavailableError)
      expect(followed).toBe(false)
    })
  })

  it('a token naming no key is verified by whichever key of the set signed it, the set holding two of its algorithm (regression: 401, jose’s JWKSMultipleMatchingKeys)', async () => {
    const next = await generateKeyPair('ES256', { extractable: true })
    const both: IdentityJwks = { keys: [...jwks.keys, { ...(await exportJWK(next.publicKey)), kid: 'next', alg: 'ES256', use: 'sig' }] }
    const unnamed = (key: CryptoKey) =>
      new SignJWT({ app: 'app_weather', ver: '2.0.0', method: 'api_token', jti: 'no-kid' })
        .setProtectedHeader({ alg: 'ES256', typ: 'mcp-identity+jwt' })
        .setIssuer(ISSUER)
        .setSubject('alice')
        .setAudience(AUDIENCE)
        .setIssuedAt(seconds)
        .setExpirationTime(seconds + 60)
        .sign(key)
    const platformKey = (await importJWK(privateJwk, 'ES256')) as CryptoKey
    for (const verify of [verifier({ jwks: both }), verifier({ jwks: 'https://platform.test/jwks', fetch: async () => Response.json(both) })]) {
      await expect(verify(await unnamed(platformKey))).resolves.toMatchObject({ subject: 'alice' })
      await expect(verify(await unnamed(next.privateKey))).resolves.toMatchObject({ subject: 'alice' })
      const { privateKey: stranger } = await generateKeyPair('ES256')
      await expect(verify(await unnamed(stranger))).rejects.toBeInstanceOf(UnauthorizedError)
    }
  })

  it('refuses options no value of which can work when created (regression: accepted, then every call refused or threw)', () => {
    const base = { jwks, issuer: ISSUER, audience: AUDIENCE, appId: 'app_weather' }
    const bad: Array<[string, Partial<IdentityVerifierOptions>]> = [
      ['clockToleranceSeconds', { clockToleranceSeconds: Number.NaN }],
      ['clockToleranceSeconds', { clockToleranceSeconds: -1 }],
      ['clockToleranceSeconds', { clockToleranceSeconds: Number.POSITIVE_INFINITY }],
      ['clockToleranceSeconds', { clockToleranceSeconds: '5' as never }],
      ['maxTokenAgeSeconds', { maxTokenAgeSeconds: 0 }],
      ['maxTokenAgeSeconds', { maxTokenAgeSeconds: Number.NaN }],
      ['maxTokenAgeSeconds', { maxTokenAgeSeconds: '60' as never }],
      ['jwks', { jwks: 'ftp://platform.test/jwks.json' }],
      ['jwks', { jwks: new URL('file:///etc/jwks.json') }],
      // fetch refuses it on every call, and its error quoted the password (regression: accepted)
      ['jwks', { jwks: 'https://platform:s3cret-canary@platform.test/jwks.json' }],
      ['jwks', { jwks: 'https://platform@platform.test/jwks.json' }],
      ['header', { header: '' }],
      ['header', { header: 'bad header' }],
      ['header', { header: 'x-identity:' }],
    ]
    for (const [option, overrides] of bad) {
      expect(() => createIdentityVerifier({ ...base, ...overrides }), JSON.stringify(overrides)).toThrow(ConfigurationError)
      expect(() => createIdentityVerifier({ ...base, ...overrides }), JSON.stringify(overrides)).toThrow(`option "${option}"`)
      expect(() => createIdentityVerifier({ ...base, ...overrides })).not.toThrow(/s3cret-canary/)
    }
    expect(() => createIdentityVerifier({ ...base, clockToleranceSeconds: 0, maxTokenAgeSeconds: 60, header: 'X-Identity' })).not.toThrow()
  })

  /** The `ConfigurationError` `create` throws. */
  const refusal = (create: () => unknown): ConfigurationError => {
    try {
      create()
    } catch (error) {
      expect(error).toBeInstanceOf(ConfigurationError)
      return error as ConfigurationError
    }
    return expect.fail('not refused')
  }

  it('a JWKS document with no keys, a private key or a symmetric key is refused when created, naming the entry, never its values (regression: accepted)', async () => {
    const base = { issuer: ISSUER, audience: AUDIENCE, appId: 'app_weather' }
    const withKeys = (keys: unknown[]) => () => createIdentityVerifier({ ...base, jwks: { keys: keys as JWK[] } })

    const empty = refusal(withKeys([]))
    expect(empty.option).toBe('jwks')
    expect(empty.message).toMatch(/has no keys/)

    // The platform's private key, copied to the App beside the public one.
    const ec = refusal(withKeys([jwks.keys[0], privateJwk]))
    expect(ec.option).toBe('jwks.keys.1')
    expect(ec.message).toMatch(/is a private key \(it has "d"\)/)
    const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' }) as JWK
    const rsaRefusal = refusal(withKeys([rsa]))
    expect(rsaRefusal.option).toBe('jwks.keys.0')
    expect(rsaRefusal.message).toMatch(/it has "d", "p", "q", "dp", "dq", "qi"/)

    const oct = { kty: 'oct', k: 'c2VjcmV0LXNoYXJlZC13aXRoLWFwcHM', kid: 'shared' }
    const octRefusal = refusal(withKeys([oct]))
    expect(octRefusal.option).toBe('jwks.keys.0')
    expect(octRefusal.message).toMatch(/symmetric \("oct"\) key/)

    // No key material in any message (it may reach a log).
    for (const [error, key] of [[ec, privateJwk], [rsaRefusal, rsa], [octRefusal, oct]] as const) {
      for (const value of Object.values(key)) if (typeof value === 'string' && value.length > 8) expect(error.message).not.toContain(value)
    }

    // An entry that is no JWK: our error, not jose's JWKSInvalid.
    expect(refusal(withKeys(['not a key'])).option).toBe('jwks.keys.0')
    // The published document is accepted, as before.
    expect(() => createIdentityVerifier({ ...base, jwks })).not.toThrow()
  })

  it('clockToleranceSeconds is at most 300 (regression: a tolerance of hours accepted tokens hours past their exp)', async () => {
    const base = { jwks, issuer: ISSUER, audience: AUDIENCE, appId: 'app_weather' }
    for (const tolerance of [301, 86_400, Number.MAX_SAFE_INTEGER]) {
      const error = refusal(() => createIdentityVerifier({ ...base, clockToleranceSeconds: tolerance }))
      expect(error.option, String(tolerance)).toBe('clockToleranceSeconds')
      expect(error.message).toMatch(/from 0 to 300/)
    }
    const verify = verifier({ clockToleranceSeconds: 300 })
    await expect(verify(await craft({ iat: seconds - 60 - 299, exp: seconds - 299 }))).resolves.toMatchObject({ subject: 'alice' })
    await expect(verify(await craft({ iat: seconds - 60 - 301, exp: seconds - 301 }))).rejects.toThrow(UnauthorizedError)
  })

  it('a now that is not a function is refused when created; one that returns no finite number throws a ConfigurationError, not a 401 (regression: every token refused as invalid)', async () => {
    const error = refusal(() => verifier({ now: Date.now() as never }))
    expect(error.option).toBe('now')
    const token = await craft()
    for (const [value, said] of [[Number.NaN, 'NaN'], [Number.POSITIVE_INFINITY, 'Infinity'], [String(at), 'a value of type string'], [new Date(at), 'a value of type object']] as const) {
      const verify = verifier({ now: () => value as never })
      await expect(verify(token), said).rejects.toThrow(ConfigurationError)
      await expect(verify(token), said).rejects.toThrow(`option "now" must return a finite number of epoch milliseconds; it returned ${said}`)
    }
  })
})

/** Verifies `token` against what `signer` publishes. */
async function verifyWith(signer: IdentitySigner, token: string) {
  return createIdentityVerifier({ jwks: await signer.jwks(), issuer: ISSUER, audience: 'a', appId: 'app_weather', now: () => at })(token)
}

/** An RSA key of `modulusLength` bits in Web Crypto, for `name` and `hash`. */
async function webRsa(name: 'RSA-PSS' | 'RSASSA-PKCS1-v1_5', hash: string, modulusLength = 2048) {
  return webcrypto.subtle.generateKey({ name, modulusLength, publicExponent: new Uint8Array([1, 0, 1]), hash }, true, ['sign', 'verify'])
}

/** The RSAPublicKey (PKCS#1) inside an SPKI (DER): the contents of its BIT STRING, after the unused-bits byte. */
function rsaPublicKeyOf(spki: Buffer): Buffer {
  /** The length of the DER element at `at` and where its contents start. */
  const element = (at: number): [length: number, start: number] => {
    const first = spki[at + 1]!
    if (first < 0x80) return [first, at + 2]
    let length = 0
    for (let i = 0; i < (first & 0x7f); i++) length = length * 256 + spki[at + 2 + i]!
    return [length, at + 2 + (first & 0x7f)]
  }
  const [, algorithmAt] = element(0)
  const [algorithmLength, algorithmStart] = element(algorithmAt)
  const [bitsLength, bitsStart] = element(algorithmStart + algorithmLength)
  return spki.subarray(bitsStart + 1, bitsStart + bitsLength)
}

describe('identity signer: keys that cannot sign are refused when created, not a 502 at every request', () => {
  const create = (options: Partial<IdentitySignerOptions>) =>
    createIdentitySigner({ issuer: ISSUER, now: () => at, ...options } as IdentitySignerOptions)
  let ecJwk: JWK

  beforeAll(async () => {
    ecJwk = await exportJWK((await generateKeyPair('ES256', { extractable: true })).privateKey)
  })

  it('a private JWK whose alg does not fit it, or whose key_ops leave out sign (regression: imported as HS256 / ES384 at every request)', () => {
    expect(() => create({ privateKey: { ...ecJwk, alg: 'HS256' } })).toThrow(/identity\.privateKey.*"alg" "HS256".*does not fit/)
    expect(() => create({ privateKey: { ...ecJwk, alg: 'ES384' } })).toThrow(/identity\.privateKey.*"alg" "ES384".*does not fit/)
    expect(() => create({ privateKey: { ...ecJwk, key_ops: ['verify'] } })).toThrow(/identity\.privateKey.*key_ops/)
  })

  it('a private JWK of its own alg, kid and key_ops signs with them', async () => {
    const signer = create({ privateKey: { ...ecJwk, alg: 'ES256', kid: 'platform-1', key_ops: ['sign', 'verify'] } })
    const token = await signer.sign(context, 'a')
    expect(decodeProtectedHeader(token)).toMatchObject({ alg: 'ES256', kid: 'platform-1' })
    await expect(verifyWith(signer, token)).resolves.toMatchObject({ subject: 'alice' })
  })

  it('an RSA key under 2048 bits: KeyObject, CryptoKey or JWK (regression: jose refused it at every request)', async () => {
    const small = generateKeyPairSync('rsa', { modulusLength: 1024 }).privateKey
    expect(() => create({ privateKey: small })).toThrow(/identity\.privateKey.*1024-bit RSA key/)
    expect(() => create({ privateKey: small.export({ format: 'jwk' }) as JWK })).toThrow(/1024-bit RSA key/)
    const smallWeb = (await webRsa('RSASSA-PKCS1-v1_5', 'SHA-256', 1024)).privateKey
    expect(() => create({ privateKey: smallWeb })).toThrow(/1024-bit RSA key/)
    expect(() => create({ privateKey: generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey })).not.toThrow()
  })

  it('a public KeyObject or CryptoKey given as the private key, or an object that is no key', async () => {
    const ec = await generateKeyPair('ES256', { extractable: true })
    expect(() => create({ privateKey: ec.publicKey })).toThrow(/identity\.privateKey.*is a public key/)
    expect(() => create({ privateKey: generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey })).toThrow(/is a public key/)
    expect(() => create({ privateKey: {} as never })).toThrow(/identity\.privateKey.*must be a CryptoKey, a KeyObject or a private JWK/)
  })

  it('an RSA-PSS key signs with PS* by default, a Web Crypto RSA key with the hash it is bound to (regression: RS256 picked)', async () => {
    const cases: Array<[string, Promise<CryptoKeyPair>, string]> = [
      ['RSA-PSS SHA-256', webRsa('RSA-PSS', 'SHA-256'), 'PS256'],
      ['RSA-PSS SHA-384', webRsa('RSA-PSS', 'SHA-384'), 'PS384'],
      ['RSASSA-PKCS1-v1_5 SHA-512', webRsa('RSASSA-PKCS1-v1_5', 'SHA-512'), 'RS512'],
    ]
    for (const [label, pair, alg] of cases) {
      const signer = create({ privateKey: (await pair).privateKey })
      const token = await signer.sign(context, 'a')
      expect(decodeProtectedHeader(token).alg, label).toBe(alg)
      expect((await signer.jwks()).keys[0]!.alg, label).toBe(alg)
      await expect(verifyWith(signer, token), label).resolves.toMatchObject({ subject: 'alice' })
    }
    // An algorithm of another hash or scheme does not fit such a key.
    const rs512 = (await webRsa('RSASSA-PKCS1-v1_5', 'SHA-512')).privateKey
    expect(() => create({ privateKey: rs512, algorithm: 'RS256' })).toThrow(/identity\.algorithm.*RS256 does not fit the key \(it signs with RS512\)/)
    const pssWeb = (await webRsa('RSA-PSS', 'SHA-256')).privateKey
    expect(() => create({ privateKey: pssWeb, algorithm: 'RS256' })).toThrow(/does not fit/)
    // A node:crypto rsa-pss key signs with PS* only, with the hash it may be bound to.
    const pss = generateKeyPairSync('rsa-pss', { modulusLength: 2048 }).privateKey
    expect(() => create({ privateKey: pss, algorithm: 'RS256' })).toThrow(/RS256 does not fit the key \(it signs with PS256, PS384, PS512\)/)
    // Node exports no JWK of an rsa-pss KeyObject: it cannot be the published key.
    const pssPair = await webRsa('RSA-PSS', 'SHA-256')
    expect(() => create({ privateKey: pssPair.privateKey, publicKey: pss })).toThrow(/identity\.publicKey.*exports no JWK/)
    expect(() => create({ privateKey: pssPair.privateKey, publicKey: pssPair.publicKey })).not.toThrow()
    const bound = generateKeyPairSync('rsa-pss', { modulusLength: 2048, hashAlgorithm: 'sha384', mgf1HashAlgorithm: 'sha384', saltLength: 48 } as never) as unknown as {
      privateKey: KeyObject
    }
    expect(() => create({ privateKey: bound.privateKey, algorithm: 'PS256' })).toThrow(/it signs with PS384\)/)
  })

  it('an rsa-pss KeyObject is refused when created where jose cannot sign with it (regression: on Node 22 and 24, accepted, then every request 502)', async () => {
    const pair = generateKeyPairSync('rsa-pss', { modulusLength: 2048 })
    // jose signs with a KeyObject through KeyObject.toCryptoKey (Node 22.10 or later), which
    // Node's Web Crypto refuses for rsa-pss keys (22 and 24); before 22.10 there is none.
    let signs: boolean
    try {
      ;(pair.privateKey as KeyObject & { toCryptoKey(algorithm: object, extractable: boolean, usages: string[]): unknown }).toCryptoKey(
        { name: 'RSA-PSS', hash: 'SHA-256' },
        false,
        ['sign'],
      )
      signs = true
    } catch {
      signs = false
    }
    // Its public key as a JWK (Node exports none of an rsa-pss KeyObject): the RSAPublicKey in its SPKI.
    const spki = pair.publicKey.export({ type: 'spki', format: 'der' })
    const publicJwk = createPublicKey({ key: rsaPublicKeyOf(spki), format: 'der', type: 'pkcs1' }).export({ format: 'jwk' }) as JWK
    if (!signs) {
      expect(() => create({ privateKey: pair.privateKey, publicKey: publicJwk })).toThrow(/identity\.privateKey.*rsa-pss KeyObject, which jose cannot sign with/)
      expect(() => create({ privateKey: pair.privateKey, publicKey: publicJwk, algorithm: 'PS384' })).toThrow(/rsa-pss KeyObject/)
    } else {
      // A runtime whose Web Crypto takes it: it signs.
      await expect(create({ privateKey: pair.privateKey, publicKey: publicJwk }).sign(context, AUDIENCE)).resolves.toMatch(/^ey/)
    }
  })

  it('a publicKey that is not the private key’s pair: when created where it can be seen, else at the first sign (regression: published, verifying nothing)', async () => {
    const a = await generateKeyPair('ES256', { extractable: true })
    const b = await generateKeyPair('ES256', { extractable: true })
    const aJwk = await exportJWK(a.privateKey)
    // JWKs and KeyObjects: seen now.
    const bJwk = await exportJWK(b.publicKey)
    expect(() => create({ privateKey: aJwk, publicKey: bJwk })).toThrow(/identity\.publicKey.*not the public key of privateKey/)
    const nodeA = generateKeyPairSync('ec', { namedCurve: 'P-256' })
    const nodeB = generateKeyPairSync('ec', { namedCurve: 'P-256' })
    expect(() => create({ privateKey: nodeA.privateKey, publicKey: nodeB.publicKey })).toThrow(/identity\.publicKey/)
    // Another key type: seen now whatever the key.
    const p384 = (await generateKeyPair('ES384')).publicKey
    expect(() => create({ privateKey: a.privateKey, publicKey: p384 })).toThrow(/identity\.publicKey/)
    // CryptoKeys of one type: the first use signs a probe and verifies it with the published key.
    const signer = create({ privateKey: a.privateKey, publicKey: b.publicKey })
    await expect(signer.sign(context, 'a')).rejects.toThrow(ConfigurationError)
    await expect(signer.sign(context, 'a')).rejects.toThrow(/identity\.publicKey.*not the public key of privateKey/)
    await expect(signer.jwks()).rejects.toThrow(/identity\.publicKey/)
    // The pair itself, a non-extractable private key with its public key, is what publicKey is for.
    const sealed = await generateKeyPair('ES256')
    const ok = create({ privateKey: sealed.privateKey, publicKey: sealed.publicKey })
    await expect(verifyWith(ok, await ok.sign(context, 'a'))).resolves.toMatchObject({ subject: 'alice' })
  })

  it('a failed first use is not kept for ever: a later call tries again (regression: the rejected load was cached)', async () => {
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    const other = await exportJWK((await generateKeyPair('ES256', { extractable: true })).publicKey)
    const publicKey: JWK = { ...other }
    // A CryptoKey's public members cannot be read without waiting: checked on first use.
    const signer = create({ privateKey, publicKey })
    await expect(signer.sign(context, 'a')).rejects.toThrow(/identity\.publicKey/)
    Object.assign(publicKey, await exportJWK(privateKey), { d: undefined })
    delete publicKey.d
    const token = await signer.sign(context, 'a')
    await expect(verifyWith(signer, token)).resolves.toMatchObject({ subject: 'alice' })
  })

  it('keys that fail on first use are a 502 of the proxy handler, that ConfigurationError reported to onError, before any upstream request; the next request tries again', async () => {
    const a = await generateKeyPair('ES256', { extractable: true })
    const b = await generateKeyPair('ES256', { extractable: true })
    const fetches: string[] = []
    const reported: unknown[] = []
    const proxy = createProxyHandler({
      upstream: { 'app_weather@2.0.0': 'http://127.0.0.1:47201/mcp' },
      identity: { issuer: ISSUER, privateKey: a.privateKey, publicKey: b.publicKey },
      fetch: async (input) => {
        fetches.push(String(input))
        return new Response(null, { status: 204 })
      },
      onError: (error) => reported.push(error),
    })
    const request = () => new Request('http://weather.localhost/v2', { method: 'POST', body: '{}' })
    for (let i = 0; i < 2; i++) {
      const response = await proxy(request(), context)
      expect(response.status).toBe(502)
      expect(reported[i]).toMatchObject({ message: 'Identity token could not be signed' })
      const cause = (reported[i] as Error).cause
      expect(cause).toBeInstanceOf(ConfigurationError)
      expect(cause).toMatchObject({ option: 'identity.publicKey' })
    }
    expect(fetches).toEqual([])
  })

  it('a now that is not a function is refused when created; one that returns no finite number makes sign reject, never a token of made-up iat (regression: a string clock signed iat 0)', async () => {
    expect(() => create({ privateKey: ecJwk, now: at as never })).toThrow(ConfigurationError)
    expect(() => create({ privateKey: ecJwk, now: at as never })).toThrow('option "identity.now" must be a function')
    for (const [value, said] of [[Number.NaN, 'NaN'], [Number.NEGATIVE_INFINITY, '-Infinity'], [String(at), 'a value of type string'], [undefined, 'a value of type undefined']] as const) {
      const signer = create({ privateKey: ecJwk, now: () => value as never })
      await expect(signer.sign(context, 'a'), said).rejects.toThrow(ConfigurationError)
      await expect(signer.sign(context, 'a'), said).rejects.toThrow(`option "identity.now" must return a finite number of epoch milliseconds; it returned ${said}`)
    }
    // A clock that recovers signs again: the reading is checked each time, nothing is kept.
    let clock: unknown = Number.NaN
    const signer = create({ privateKey: ecJwk, now: () => clock as number })
    await expect(signer.sign(context, 'a')).rejects.toThrow(ConfigurationError)
    clock = at
    await expect(verifyWith(signer, await signer.sign(context, 'a'))).resolves.toMatchObject({ subject: 'alice' })
  })

  it('a previous key that is a secret, a key type no algorithm here signs with, or lacks its members (regression: oct accepted)', () => {
    const previous = (previousKeys: IdentitySignerOptions['previousKeys']) => () => create({ privateKey: ecJwk, previousKeys })
    expect(previous([{ kty: 'oct', k: 'c2VjcmV0' }])).toThrow(/identity\.previousKeys\.0.*not a secret/)
    expect(previous([{ jwk: { kty: 'oct', k: 'c2VjcmV0' } }])).toThrow(/identity\.previousKeys\.0\.jwk/)
    const ed448 = generateKeyPairSync('ed448').publicKey.export({ format: 'jwk' }) as JWK
    expect(previous([ed448])).toThrow(/identity\.previousKeys\.0" must be an EC key/)
    expect(previous([{ kty: 'EC', crv: 'P-256', x: ecJwk.x! }])).toThrow(/identity\.previousKeys\.0.*lacks a member/)
    expect(previous([generateKeyPairSync('rsa', { modulusLength: 1024 }).publicKey.export({ format: 'jwk' }) as JWK])).toThrow(/1024-bit/)
    expect(previous(['not a key' as never])).toThrow(/identity\.previousKeys\.0.*must be a public JWK/)
    // Published with that use, it verified none of its tokens (regression: taken).
    expect(previous([{ kty: 'EC', crv: 'P-256', x: ecJwk.x!, y: ecJwk.y!, use: 'enc' }])).toThrow(/identity\.previousKeys\.0\.use.*"enc"/)
    // So is a signing key meant for another use.
    expect(() => create({ privateKey: { ...ecJwk, use: 'enc' } })).toThrow(/identity\.privateKey\.use.*"enc"/)
  })

  it('publishes the public members of each key, its kid, alg and use, and nothing else of what it was given', async () => {
    const { publicKey: oldPublic } = await generateKeyPair('ES256', { extractable: true })
    const oldJwk = await exportJWK(oldPublic)
    const extra = { note: 'vault/platform/identity-2025', x5c: ['MIIB…'], ext: true }
    const signer = create({
      privateKey: { ...ecJwk, ...extra, key_ops: ['sign'] } as JWK,
      previousKeys: [{ ...oldJwk, ...extra, key_ops: ['verify'], kid: 'old' } as JWK],
    })
    const { keys } = await signer.jwks()
    expect(keys).toHaveLength(2)
    for (const key of keys) expect(Object.keys(key).sort()).toEqual(['alg', 'crv', 'kid', 'kty', 'use', 'x', 'y'])
    expect(keys[1]).toMatchObject({ kid: 'old', use: 'sig', x: oldJwk.x })
  })

  it('answers each caller a JWKS of its own: one changed by its caller (a key added, a kid rewritten) leaves the next answer as it was', async () => {
    const signer = create({ privateKey: ecJwk })
    const first = await signer.jwks()
    const published = structuredClone(first)
    first.keys[0]!.kid = 'rewritten'
    ;(first.keys as JWK[]).push({ kty: 'oct', k: 'c2VjcmV0' })
    expect(await signer.jwks()).toEqual(published)
  })
})

describe('identity signer: one kid, one key (regression: a duplicate kid made jose refuse every token, ERR_JWKS_MULTIPLE_MATCHING_KEYS)', () => {
  it('a rotation that keeps a fixed keyId, or the signing key listed again under its keyId: refused when created, whatever the key', async () => {
    const old = generateKeyPairSync('ec', { namedCurve: 'P-256' })
    const oldJwk = old.publicKey.export({ format: 'jwk' }) as JWK
    const web = await generateKeyPair('ES256', { extractable: true })
    const keys: unknown[] = [generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey, web.privateKey, await exportJWK(web.privateKey)]
    for (const privateKey of keys) {
      for (const previousKeys of [[{ ...oldJwk, kid: 'identity-key' }], [{ jwk: oldJwk, keyId: 'identity-key' }]]) {
        expect(() => createIdentitySigner({ issuer: ISSUER, privateKey: privateKey as JWK, keyId: 'identity-key', previousKeys })).toThrow(
          /identity\.previousKeys\.0.*has kid "identity-key", as the signing key \(identity\.keyId\) does/,
        )
      }
    }
    const webPublic = await exportJWK(web.publicKey)
    expect(() => createIdentitySigner({ issuer: ISSUER, privateKey: web.privateKey, keyId: 'k', previousKeys: [{ jwk: webPublic, keyId: 'k' }] })).toThrow(
      /needs no previousKeys entry/,
    )
  })

  it('a thumbprint kid, known on first use, that another key has: sign and jwks reject', async () => {
    const current = await generateKeyPair('ES256', { extractable: true })
    const thumbprint = await calculateJwkThumbprint(await exportJWK(current.publicKey))
    const other = generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey.export({ format: 'jwk' }) as JWK
    const signer = createIdentitySigner({ issuer: ISSUER, privateKey: current.privateKey, previousKeys: [{ ...other, kid: thumbprint }] })
    await expect(signer.sign(context, 'a')).rejects.toThrow(/identity\.previousKeys\.0.*has kid/)
    await expect(signer.jwks()).rejects.toThrow(ConfigurationError)
  })

  it('two previous keys of one kid are refused; the current key listed again is published once', async () => {
    const a = generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey.export({ format: 'jwk' }) as JWK
    const b = generateKeyPairSync('ec', { namedCurve: 'P-256' }).publicKey.export({ format: 'jwk' }) as JWK
    const current = await generateKeyPair('ES256', { extractable: true })
    const privateKey = await exportJWK(current.privateKey)
    expect(() => createIdentitySigner({ issuer: ISSUER, privateKey, previousKeys: [{ ...a, kid: 'k' }, { ...b, kid: 'k' }] })).toThrow(
      /identity\.previousKeys\.1.*has kid "k", as identity\.previousKeys\.0 does/,
    )
    const currentPublic = await exportJWK(current.publicKey)
    const thumbprint = await calculateJwkThumbprint(currentPublic)
    for (const previousKeys of [[currentPublic], [{ ...currentPublic, kid: thumbprint }], [a, { ...a }]]) {
      const signer = createIdentitySigner({ issuer: ISSUER, privateKey, previousKeys, now: () => at })
      const kids = (await signer.jwks()).keys.map((k) => k.kid)
      expect(new Set(kids).size, JSON.stringify(kids)).toBe(kids.length)
      await expect(verifyWith(signer, await signer.sign(context, 'a'))).resolves.toMatchObject({ subject: 'alice' })
    }
    // Through a CryptoKey, known on first use: the same.
    const web = createIdentitySigner({ issuer: ISSUER, privateKey: current.privateKey, previousKeys: [currentPublic] })
    expect((await web.jwks()).keys).toHaveLength(1)
  })

  it('one kid on keys a token tells apart (another key type, or both with their own alg) is not a clash', async () => {
    const rsaOld = generateKeyPairSync('rsa', { modulusLength: 2048 })
    const before = await createIdentitySigner({ issuer: ISSUER, privateKey: rsaOld.privateKey, keyId: 'identity-key', now: () => at }).sign(context, 'a')
    const signer = createIdentitySigner({
      issuer: ISSUER,
      privateKey: generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey,
      keyId: 'identity-key',
      previousKeys: [{ jwk: rsaOld.publicKey.export({ format: 'jwk' }) as JWK, keyId: 'identity-key', algorithm: 'RS256' }],
      now: () => at,
    })
    await expect(verifyWith(signer, before)).resolves.toMatchObject({ subject: 'alice' })
    await expect(verifyWith(signer, await signer.sign(context, 'a'))).resolves.toMatchObject({ subject: 'alice' })
  })
})

describe('identity signer: rotation keeps verifying tokens signed before it, whatever kid and alg they carry', () => {
  /** A token of an old signer, and the new signer with `previous` made from the old public key. */
  async function rotate(
    pair: { privateKey: unknown; publicKey: unknown },
    old: Partial<IdentitySignerOptions>,
    previous: (jwk: JWK) => NonNullable<IdentitySignerOptions['previousKeys']>[number],
  ) {
    const before = await createIdentitySigner({ issuer: ISSUER, privateKey: pair.privateKey as KeyObject, now: () => at, ...old }).sign(context, 'a')
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    const oldJwk = await exportJWK(pair.publicKey as KeyObject)
    const rotated = createIdentitySigner({ issuer: ISSUER, privateKey, previousKeys: [previous(oldJwk)], now: () => at })
    return { before, rotated }
  }

  it('a custom keyId: given as the JWK’s kid or as { jwk, keyId } (regression: the thumbprint was published instead)', async () => {
    for (const previous of [(jwk: JWK) => ({ ...jwk, kid: '2024-key' }), (jwk: JWK) => ({ jwk, keyId: '2024-key' })]) {
      const { before, rotated } = await rotate(generateKeyPairSync('ec', { namedCurve: 'P-256' }), { keyId: '2024-key' }, previous)
      expect((await rotated.jwks()).keys[1]).toMatchObject({ kid: '2024-key', alg: 'ES256', use: 'sig' })
      await expect(verifyWith(rotated, before)).resolves.toMatchObject({ subject: 'alice' })
    }
  })

  it('PS256 and Ed25519 signers: a plain exportJWK gets no made-up alg (regression: RS256 / EdDSA published, the old tokens refused)', async () => {
    const cases: Array<[string, { privateKey: unknown; publicKey: unknown }, Partial<IdentitySignerOptions>]> = [
      ['PS256', generateKeyPairSync('rsa', { modulusLength: 2048 }), { algorithm: 'PS256' }],
      ['Ed25519', generateKeyPairSync('ed25519'), { algorithm: 'Ed25519' }],
      ['EdDSA', generateKeyPairSync('ed25519'), {}],
      ['RS256', generateKeyPairSync('rsa', { modulusLength: 2048 }), {}],
    ]
    for (const [label, pair, old] of cases) {
      const { before, rotated } = await rotate(pair, old, (jwk) => jwk)
      expect((await rotated.jwks()).keys[1]!.alg, label).toBeUndefined()
      await expect(verifyWith(rotated, before), label).resolves.toMatchObject({ subject: 'alice' })
    }
  })

  it('{ jwk, algorithm } publishes the alg the old signer used; one that does not fit the key is refused', async () => {
    const pair = generateKeyPairSync('rsa', { modulusLength: 2048 })
    const { before, rotated } = await rotate(pair, { algorithm: 'PS256' }, (jwk) => ({ jwk, algorithm: 'PS256' }))
    expect((await rotated.jwks()).keys[1]).toMatchObject({ kty: 'RSA', alg: 'PS256', kid: expect.any(String) })
    await expect(verifyWith(rotated, before)).resolves.toMatchObject({ subject: 'alice' })
    const jwk = pair.publicKey.export({ format: 'jwk' }) as JWK
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    expect(() => createIdentitySigner({ issuer: ISSUER, privateKey, previousKeys: [{ jwk, algorithm: 'ES256' }] })).toThrow(
      /identity\.previousKeys\.0\.algorithm.*ES256 does not fit/,
    )
    expect(() => createIdentitySigner({ issuer: ISSUER, privateKey, previousKeys: [{ ...jwk, alg: 'HS256' }] })).toThrow(/identity\.previousKeys\.0\.alg/)
    expect(() => createIdentitySigner({ issuer: ISSUER, privateKey, previousKeys: [{ jwk, keyId: '' }] })).toThrow(/identity\.previousKeys\.0\.keyId/)
  })
})
