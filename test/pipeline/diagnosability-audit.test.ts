/**
 * From an audit of what an operator sees when a deployment is wrong (a misconfiguration that
 * only shows at run time): the client's answer and the default logger's line, which must name
 * the cause without the library's source at hand. Stub `fetch` for the authorization server.
 */
import { AuthorizationServerUnavailableError, type OAuthValidatorOptions, createOAuthValidator } from 'mcp-dispatch'
import { describe, expect, it } from 'vitest'
import { dispatchRequest } from '../helpers/dispatch-request.js'
import { written } from '../helpers/stderr.js'

const ISSUER = 'https://auth.example.com/realms/prod'
const RESOURCE = 'https://weather.example.com'
const context = { resource: RESOURCE, appId: 'app_weather' }

describe('an issuer whose discovery documents are not there (an issuer URL missing its realm path, a typo)', () => {
  /** A server that answers 404 to everything: no discovery document, no `{issuer}/userinfo`. */
  const nothingThere: typeof fetch = async () => new Response('not found', { status: 404 })
  const validatorOf = (options: Partial<OAuthValidatorOptions>) =>
    createOAuthValidator({ issuer: ISSUER, fetch: nothingThere, retry: { attempts: 1 }, ...options } as OAuthValidatorOptions)
  const discoveryNamed =
    'no discovery document at "https://auth.example.com/realms/prod/.well-known/openid-configuration" or ' +
    '"https://auth.example.com/.well-known/oauth-authorization-server/realms/prod" (HTTP 404 or 410): ' +
    'is the issuer "https://auth.example.com/realms/prod" the server\'s own?'
  /** A JWT its own claims do not refuse (its signature is never checked: no key can be had). */
  const b64 = (value: object) => Buffer.from(JSON.stringify(value)).toString('base64url')
  const jwt = `${b64({ alg: 'RS256', kid: 'k1', typ: 'at+jwt' })}.${b64({ iss: ISSUER, sub: 'u1', aud: RESOURCE, exp: 4_000_000_000 })}.${'A'.repeat(342)}`

  it('jwt mode: the line names the missing document and the issuer, not "the issuer publishes no jwks_uri"', async () => {
    const lines = await written(async () => {
      await expect(validatorOf({ mode: 'jwt' }).validate(jwt, context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    })
    expect(lines).toEqual([expect.stringMatching(/^\[mcp-dispatch\] oauth unavailable: Error: a token was answered 503 \(retry after \d+ s\): jwks: (.*)$/)])
    expect(lines[0]).toContain(`jwks: ${discoveryNamed}`)
  })

  it('introspection mode: the same, not "the issuer publishes no introspection_endpoint"', async () => {
    const lines = await written(async () => {
      const validator = validatorOf({ mode: 'introspection', introspection: { clientId: 'rs', clientSecret: 'rs-secret' } })
      await expect(validator.validate('opaque-token', context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    })
    expect(lines).toHaveLength(1)
    expect(lines[0]).toContain(`introspection: ${discoveryNamed}`)
    expect(lines[0]).not.toContain('rs-secret')
  })

  it('userinfo mode: the 404 of the guessed {issuer}/userinfo says it was a guess for want of a document, not a bare "userinfo: HTTP 404"', async () => {
    const lines = await written(async () => {
      await expect(validatorOf({}).validate('opaque-token', context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    })
    expect(lines).toHaveLength(1)
    expect(lines[0]).toContain(`userinfo: HTTP 404 at "${ISSUER}/userinfo", tried for want of a discovery document; ${discoveryNamed}`)
  })

  it('a document without the endpoint is still told as such', async () => {
    const validator = validatorOf({
      mode: 'jwt',
      fetch: async (input) => (String(input).includes('openid-configuration') ? Response.json({ issuer: ISSUER }) : new Response('', { status: 404 })),
    })
    const lines = await written(async () => {
      await expect(validator.validate(jwt, context)).rejects.toBeInstanceOf(AuthorizationServerUnavailableError)
    })
    expect(lines).toEqual([expect.stringMatching(/: jwks: the issuer publishes no jwks_uri$/)])
  })
})

describe('every token refused for a reason of the deployment (its audience, its nbf, its issuer): told, where one client\'s is not', async () => {
  const { SignJWT, exportJWK, generateKeyPair } = await import('jose')
  const { privateKey, publicKey } = await generateKeyPair('ES256')
  const jwks = { keys: [{ ...(await exportJWK(publicKey)), kid: 'k1', alg: 'ES256' }] }
  const AT = Date.UTC(2030, 0, 1)
  const sign = (claims: { aud?: string; nbf?: number; iss?: string } = {}) =>
    new SignJWT({ client_id: 'c1' })
      .setProtectedHeader({ alg: 'ES256', kid: 'k1', typ: 'at+jwt' })
      .setIssuer(claims.iss ?? ISSUER)
      .setSubject('u1')
      .setAudience(claims.aud ?? RESOURCE)
      .setIssuedAt(AT / 1000)
      .setNotBefore(claims.nbf ?? AT / 1000)
      .setExpirationTime(AT / 1000 + 3600)
      .sign(privateKey)
  const validatorOn = (clock: { at: number }) => createOAuthValidator({ issuer: ISSUER, mode: 'jwt', jwks, now: () => clock.at })
  const hint = 'check the App address every token must name (baseUrl, its scheme behind a proxy that ends TLS)'

  it('tokens for https://… at an App whose address is http:// (baseUrl behind a proxy that ends TLS): a line per 10 s naming the expected audience', async () => {
    const clock = { at: AT }
    const validator = validatorOn(clock)
    const httpApp = { resource: 'http://weather.example.com', appId: 'app_weather' }
    const lines = await written(async () => {
      expect(await validator.validate(await sign(), httpApp)).toEqual({ active: false, reason: 'audience mismatch' })
      expect(await validator.validate(await sign({ aud: `${RESOURCE}/` }), httpApp)).toMatchObject({ active: false })
      clock.at += 10_000
      expect(await validator.validate(await sign(), httpApp)).toMatchObject({ active: false })
    })
    expect(lines).toEqual([
      expect.stringMatching(/^\[mcp-dispatch\] oauth refused: Error: a token was refused \(401\): audience mismatch \(expected "http:\/\/weather\.example\.com"\), and no token was accepted/),
      expect.stringMatching(/^\[mcp-dispatch\] oauth refused; 1 more since the last line: Error: a token was refused \(401\): audience mismatch/),
    ])
    expect(lines[0]).toContain(hint)
  })

  it('a clock an hour behind the issuer\'s (every nbf to come), and an issuer option the tokens do not name: each named', async () => {
    const clock = { at: AT }
    const validator = validatorOn(clock)
    const lines = await written(async () => {
      expect(await validator.validate(await sign({ nbf: AT / 1000 + 3600 }), context)).toMatchObject({ active: false })
      expect(await validator.validate(await sign({ iss: 'https://auth.example.com/realms/test' }), context)).toMatchObject({ active: false })
    })
    expect(lines).toEqual([
      expect.stringMatching(/^\[mcp-dispatch\] oauth refused: .*: (token not yet valid|claim check failed: nbf), .*check this host's clock against the authorization server's/),
      expect.stringMatching(/^\[mcp-dispatch\] oauth refused: .*: (issuer mismatch|claim check failed: iss), .*check the issuer option/),
    ])
  })

  it('one client\'s token for another audience while others are accepted: no line (any client can send one)', async () => {
    const clock = { at: AT }
    const validator = validatorOn(clock)
    const lines = await written(async () => {
      expect(await validator.validate(await sign(), context)).toMatchObject({ active: true })
      for (let i = 0; i < 3; i++) {
        expect(await validator.validate(await sign({ aud: 'https://other.example.com' }), context)).toMatchObject({ active: false })
        clock.at += 10_000
        expect(await validator.validate(await sign(), context)).toMatchObject({ active: true })
      }
    })
    expect(lines).toEqual([])
  })

  it('given onEvent, the rejected-locally event of an audience mismatch carries the expected audience', async () => {
    const events: unknown[] = []
    const validator = createOAuthValidator({ issuer: ISSUER, mode: 'jwt', jwks, now: () => AT, onEvent: (event) => void events.push(event) })
    await validator.validate(await sign({ aud: 'https://other.example.com' }), context)
    expect(events).toContainEqual({ type: 'rejected-locally', reason: 'audience mismatch', expected: [RESOURCE] })
  })
})

describe('an App store whose getLiveVersions answers what is no list of versions (a column read as text, NULL, a bad row)', async () => {
  const { createDispatcher, createMemoryAppStore, createMemorySubscriptionStore, createMemoryTokenStore, createTokenService } = await import('mcp-dispatch')
  const answers: Record<string, unknown> = {
    'a string': '1.0.0,1.1.0',
    null: null,
    'a version that is none': ['1.0.0', 'v1.2.0'],
    // eslint-disable-next-line no-sparse-arrays
    'an array with a hole': ['1.0.0', , '1.2.3'],
  }
  for (const [what, answer, async] of Object.entries(answers).flatMap(([what, answer]) => [[what, answer, false], [`${what}, from an async store`, answer, true]] as const)) {
    it(`${what}: 503, reported as "apps failed" (the App store's), not "callback failed"`, async () => {
      const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
      const subscriptions = createMemorySubscriptionStore([{ userId: 'u1', appId: 'app_weather', active: true }])
      const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
      const { token } = await tokens.create({ userId: 'u1', name: 'CI', servers: ['app_weather'], expiresInDays: 30 })
      const reports: string[] = []
      const dispatcher = createDispatcher({
        apps: { ...apps, getAppBySlug: apps.getAppBySlug.bind(apps), getLiveVersions: () => (async ? Promise.resolve(answer as string[]) : (answer as string[])) },
        subscriptions,
        tokens,
        onError: (error, context) => void reports.push(`${context}: ${(error as Error).message}`),
      })
      const decision = await dispatcher.decide(dispatchRequest('/', { authorization: `Bearer ${token}` }))
      expect(decision).toMatchObject({ type: 'reply', reply: { status: 503 } })
      expect(reports).toEqual([expect.stringMatching(/^apps failed: mcp-dispatch: the App store's getLiveVersions\("app_weather"\) answered /)])
    })
  }
})
