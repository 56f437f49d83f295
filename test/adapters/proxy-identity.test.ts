/**
 * The identity signer and verifier of the proxy handler (`mcp-dispatch/proxy`) on their own,
 * with no servers: what the verifier accepts (token age and lifetime, the claims every identity
 * token has, Node requests), how it tells a JWKS outage from a forged token, and which signer
 * and verifier options are refused when created rather than failing every request.
 */
import { IncomingMessage } from 'node:http'
import { Socket } from 'node:net'
import { type JWK, type JWTPayload, SignJWT, exportJWK, generateKeyPair, importJWK } from 'jose'
import { ConfigurationError, type DispatchContext, JwksUnavailableError, UnauthorizedError } from 'mcp-dispatch'
import { type IdentityJwks, type IdentityVerifierOptions, createIdentitySigner, createIdentityVerifier } from 'mcp-dispatch/proxy'
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

    it('network failure, an answer other than 200, an answer that is not JSON or not a JWKS', async () => {
      const token = await craft()
      const failures: Array<[string, typeof fetch]> = [
        ['network', async () => Promise.reject(new TypeError('fetch failed'))],
        ['503', async () => new Response('down', { status: 503 })],
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

    it('with the JWKS fetched, a token it has no key for, or a tampered one, is still a 401', async () => {
      const verify = remote(async () => Response.json(jwks))
      await expect(verify(await craft())).resolves.toMatchObject({ subject: 'alice' })
      const { privateKey: stranger } = await generateKeyPair('ES256')
      const foreign = await new SignJWT({ app: 'app_weather', ver: '2.0.0', method: 'api_token', jti: 'x' })
        .setProtectedHeader({ alg: 'ES256', kid: 'unknown-kid', typ: 'mcp-identity+jwt' })
        .setIssuer(ISSUER)
        .setSubject('alice')
        .setAudience(AUDIENCE)
        .setIssuedAt(seconds)
        .setExpirationTime(seconds + 60)
        .sign(stranger)
      const token = await craft()
      for (const refused of [foreign, `${token.slice(0, -4)}AAAA`, 'not.a.jwt']) {
        await expect(verify(refused)).rejects.toBeInstanceOf(UnauthorizedError)
      }
    })
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
      ['header', { header: '' }],
      ['header', { header: 'bad header' }],
      ['header', { header: 'x-identity:' }],
    ]
    for (const [option, overrides] of bad) {
      expect(() => createIdentityVerifier({ ...base, ...overrides }), JSON.stringify(overrides)).toThrow(ConfigurationError)
      expect(() => createIdentityVerifier({ ...base, ...overrides }), JSON.stringify(overrides)).toThrow(`option "${option}"`)
    }
    expect(() => createIdentityVerifier({ ...base, clockToleranceSeconds: 0, maxTokenAgeSeconds: 60, header: 'X-Identity' })).not.toThrow()
  })
})

void context
