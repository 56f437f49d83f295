/**
 * The audience check of the jwt and introspection modes is only as good as the App address it
 * compares with. With the default `resolveApp` (the first label of any Host) that address
 * would come from the caller's `Host`: a token a user gave a look-alike server
 * (`weather.evil.example`) would pass at the weather App sent with that Host. So the
 * dispatcher refuses that setup, and with `baseUrl` the look-alike's token is refused.
 */
import { type JWK, SignJWT, exportJWK, generateKeyPair } from 'jose'
import {
  ConfigurationError,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createOAuthValidator,
  createTokenService,
} from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { beforeAll, describe, expect, it } from 'vitest'

const ISSUER = 'https://auth.example.com'

describe('audience binding and the App address', () => {
  let privateKey: CryptoKey
  let publicJwk: JWK
  beforeAll(async () => {
    const pair = await generateKeyPair('ES256')
    privateKey = pair.privateKey
    publicJwk = { ...(await exportJWK(pair.publicKey)), kid: 'k1', alg: 'ES256' }
  })
  const tokenFor = (audience: string) =>
    new SignJWT({ sub: 'u1', aud: audience })
      .setProtectedHeader({ alg: 'ES256', typ: 'at+jwt', kid: 'k1' })
      .setIssuer(ISSUER)
      .setIssuedAt()
      .setExpirationTime('10m')
      .sign(privateKey)

  function stores() {
    const apps = createMemoryAppStore([{ id: 'app_1', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
    const subscriptions = createMemorySubscriptionStore([{ userId: 'u1', appId: 'app_1', active: true }])
    return { apps, subscriptions, tokens: createTokenService({ store: createMemoryTokenStore(), apps, subscriptions }) }
  }

  it('jwt and introspection modes with the default audience, or an audience function (the default written out), need baseUrl or a resolveApp of the platform’s own', () => {
    for (const oauth of [
      createOAuthValidator({ issuer: ISSUER, mode: 'jwt', jwks: { keys: [publicJwk] } }),
      createOAuthValidator({ issuer: ISSUER, mode: 'introspection', introspection: { clientId: 'rs', clientSecret: 's' } }),
      // Regression: the default written out as in the docs' example turned the check off.
      createOAuthValidator({ issuer: ISSUER, mode: 'jwt', jwks: { keys: [publicJwk] }, audience: ({ resource }) => resource }),
      createOAuthValidator({ issuer: ISSUER, audience: ({ resource }) => resource }),
    ]) {
      expect(oauth.checksAppAddress).toBe(true)
      expect(() => createDispatcher({ ...stores(), oauth })).toThrow(ConfigurationError)
      expect(() => createDispatcher({ ...stores(), oauth })).toThrow(/baseUrl/)
      // `null` (a config loader's unset value) is none (regression: it passed the check, and the
      // audience then followed the Host).
      expect(() => createDispatcher({ ...stores(), oauth, baseUrl: null as never, resolveApp: null as never })).toThrow(/baseUrl/)
      expect(() => createDispatcher({ ...stores(), oauth, baseUrl: () => 'https://weather.example.com' })).not.toThrow()
      expect(() => createDispatcher({ ...stores(), oauth, resolveApp: () => undefined })).not.toThrow()
    }
    // Userinfo mode, or a fixed audience, checks nothing against the Host.
    for (const oauth of [
      createOAuthValidator({ issuer: ISSUER }),
      createOAuthValidator({ issuer: ISSUER, mode: 'jwt', jwks: { keys: [publicJwk] }, audience: 'https://weather.example.com' }),
      createOAuthValidator({ issuer: ISSUER, mode: 'jwt', jwks: { keys: [publicJwk] }, audience: false }),
    ]) {
      expect(oauth.checksAppAddress).toBe(false)
      expect(() => createDispatcher({ ...stores(), oauth })).not.toThrow()
    }
  })

  it('with baseUrl, a token issued to a look-alike host is refused even when sent with that Host', async () => {
    const oauth = createOAuthValidator({ issuer: ISSUER, mode: 'jwt', jwks: { keys: [publicJwk] } })
    const handle = mcpDispatch({
      dispatcher: {
        ...stores(),
        oauth,
        baseUrl: (_request, app) => `https://${app.slug}.example.com`,
      },
      handler: () => new Response('{"jsonrpc":"2.0","id":1,"result":{}}', { headers: { 'content-type': 'application/json' } }),
    })
    const call = async (host: string, token: string) =>
      (
        await handle(
          new Request(`https://${host}/v1`, {
            method: 'POST',
            headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
            body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
          }),
        )
      ).status
    const evil = await tokenFor('https://weather.evil.example')
    expect(await call('weather.evil.example', evil)).toBe(401)
    expect(await call('weather.example.com', evil)).toBe(401)
    expect(await call('weather.example.com', await tokenFor('https://weather.example.com'))).toBe(200)
  })

  it('a token whose aud begins like a URL and is none (`https://[::1`) is refused 401 invalid_token in every mode, before any upstream call (regression: the audience check threw, 503 and an error report on every request)', async () => {
    const unsigned = (header: object, claims: object) =>
      `${Buffer.from(JSON.stringify(header)).toString('base64url')}.${Buffer.from(JSON.stringify(claims)).toString('base64url')}.${'A'.repeat(86)}`
    const claims = { iss: ISSUER, sub: 'u1', aud: 'https://[::1', exp: Math.floor(Date.now() / 1000) + 600 }
    let upstreamCalls = 0
    const fetch = async () => {
      upstreamCalls++
      return new Response('{}', { status: 500 })
    }
    const reports: string[] = []
    for (const oauth of [
      createOAuthValidator({ issuer: ISSUER, audience: ({ resource }) => resource, fetch }),
      createOAuthValidator({ issuer: ISSUER, mode: 'introspection', introspection: { clientId: 'rs', clientSecret: 's' }, fetch }),
      createOAuthValidator({ issuer: ISSUER, mode: 'jwt', jwks: { keys: [publicJwk] }, fetch }),
    ]) {
      const handle = mcpDispatch({
        dispatcher: { ...stores(), oauth, baseUrl: (_request, app) => `https://${app.slug}.example.com` },
        handler: () => new Response('{"jsonrpc":"2.0","id":1,"result":{}}', { headers: { 'content-type': 'application/json' } }),
        onError: (error, context) => void reports.push(`${context}: ${String(error)}`),
      })
      // A key the set does not hold, and one it holds with a signature that cannot verify.
      for (const kid of ['k-unknown', 'k1']) {
        const response = await handle(
          new Request('https://weather.example.com/v1', {
            method: 'POST',
            headers: { authorization: `Bearer ${unsigned({ alg: 'ES256', typ: 'at+jwt', kid }, claims)}`, 'content-type': 'application/json' },
            body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
          }),
        )
        expect(response.status).toBe(401)
        expect(response.headers.get('www-authenticate')).toMatch(/error="invalid_token"/)
      }
    }
    expect(upstreamCalls).toBe(0)
    expect(reports).toEqual([])
  })
})
