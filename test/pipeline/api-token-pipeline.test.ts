/**
 * Spec sections 5.2, 7 and 9 for API tokens and versions, end to end: real `Request` objects
 * through the reference platform (Web adapter → dispatcher → real MCP SDK servers), in memory.
 */
import { generateApiToken } from 'mcp-dispatch'
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import {
  CLIENT,
  DAY,
  MINUTE,
  T0,
  type TestClock,
  bodies,
  challenge,
  createTestPlatform,
  json,
  mcpRequest,
  rpcResult,
  versionHeaders,
} from '../helpers/platform.js'

let platform: Platform
let clock: TestClock
let token: (name: string) => string
let errors: Array<{ error: unknown; context: string }>

beforeEach(() => {
  ;({ platform, clock, token, errors } = createTestPlatform())
})
afterEach(async () => {
  await platform.close()
  expect(errors).toEqual([])
})

/** Sends a request to an App of the platform, from `clientAddress` (default {@link CLIENT}). */
function send(url: string, options: Parameters<typeof mcpRequest>[1] = {}, clientAddress: string | undefined = CLIENT) {
  return platform.fetch(mcpRequest(url, options), { clientAddress })
}

async function tokenId(userId: string, name: string): Promise<string> {
  const found = (await platform.tokenService.list(userId)).find((t) => t.name === name)
  if (!found) throw new Error(`no token ${name}`)
  return found.id
}

/** An error answered by the dispatch layer: JSON, the exact body, no version headers. */
async function expectReply(response: Response, status: number, body: unknown): Promise<void> {
  expect(response.status).toBe(status)
  expect(response.headers.get('content-type')).toBe('application/json')
  expect(versionHeaders(response)).toEqual({ version: null, latest: null })
  expect(await json(response)).toEqual(body)
}

async function expectUnauthorized(response: Response, invalidToken: boolean, slug = 'weather'): Promise<void> {
  expect(response.headers.get('www-authenticate')).toBe(challenge(slug, invalidToken))
  await expectReply(response, 401, bodies.unauthorized(invalidToken))
}

/** Calls the `get_version` tool in one stateless request and returns what it says. */
async function toolVersion(url: string, tokenName = 'alice'): Promise<{ tool: string; headers: ReturnType<typeof versionHeaders> }> {
  const response = await send(url, {
    token: token(tokenName),
    body: { jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name: 'get_version', arguments: {} } },
  })
  expect(response.status).toBe(200)
  const headers = versionHeaders(response)
  const message = await rpcResult(response)
  return { tool: message.result.structuredContent.version, headers }
}

describe('401 Unauthorized (spec 5.1, 5.2, 7)', () => {
  const url = 'http://weather.localhost/v1'

  it('no Authorization header: challenge without error code', async () => {
    await expectUnauthorized(await send(url), false)
  })

  it('a scheme other than Bearer: challenge without error code (RFC 6750 3.1; regression: was error="invalid_token")', async () => {
    await expectUnauthorized(await send(url, { headers: { authorization: 'Basic dXNlcjpwYXNz' } }), false)
    await expectUnauthorized(await send(url, { headers: { authorization: `Token ${token('alice')}` } }), false)
  })

  it('a garbage Bearer value: invalid_token', async () => {
    await expectUnauthorized(await send(url, { headers: { authorization: 'Bearer !!!not a token!!!' } }), true)
    await expectUnauthorized(await send(url, { headers: { authorization: 'Bearer' } }), true)
  })

  it('malformed svc_ tokens (length, checksum, alphabet) are refused', async () => {
    const good = token('alice')
    const last = good.at(-1) === 'A' ? 'B' : 'A'
    for (const bad of [
      'svc_short',
      `${good}x`,
      good.slice(0, -1) + last, // checksum no longer matches
      `svc_${'_'.repeat(44)}`,
    ]) {
      await expectUnauthorized(await send(url, { token: bad }), true)
    }
  })

  it('a well-formed token that was never issued', async () => {
    await expectUnauthorized(await send(url, { token: generateApiToken() }), true)
  })

  it('an expired token, by the injected clock, stays refused', async () => {
    const secret = token('alice-week')
    clock.advance(7 * DAY - 1)
    expect((await send(url, { token: secret })).status).toBe(200)
    clock.advance(1)
    await expectUnauthorized(await send(url, { token: secret }), true)
    clock.advance(DAY)
    await expectUnauthorized(await send(url, { token: secret }), true)
  })

  it('a revoked token', async () => {
    const secret = token('alice')
    expect((await send(url, { token: secret })).status).toBe(200)
    await platform.tokenService.revoke('user_alice', await tokenId('user_alice', 'alice'))
    await expectUnauthorized(await send(url, { token: secret }), true)
  })

  it('the old secret of a rotated token, at once; the new secret works', async () => {
    const old = token('alice')
    const rotated = await platform.tokenService.rotate(await tokenId('user_alice', 'alice'), { kind: 'token', token: old })
    await expectUnauthorized(await send(url, { token: old }), true)
    expect((await send(url, { token: rotated.token })).status).toBe(200)
  })

  it('the challenge names the metadata URL of the App that was asked', async () => {
    await expectUnauthorized(await send('http://notes.localhost/v1.0.0'), false, 'notes')
    const response = await send('http://WEATHER.localhost:8787/')
    expect(response.headers.get('www-authenticate')).toBe(
      'Bearer resource_metadata="http://weather.localhost:8787/.well-known/oauth-protected-resource"',
    )
  })
})

describe('403 Forbidden: scope and IP allowlist (spec 5.2, 7)', () => {
  it('a valid token not scoped to the App, even though its owner subscribes to the App', async () => {
    // alice subscribes to weather, but this token names only notes.
    await expectReply(await send('http://weather.localhost/', { token: token('alice-notes') }), 403, bodies.forbidden)
    expect((await send('http://notes.localhost/', { token: token('alice-notes') })).status).toBe(200)
  })

  it('IPv4 address: only the listed address', async () => {
    const secret = token('ipv4')
    expect((await send('http://weather.localhost/', { token: secret }, '203.0.113.7')).status).toBe(200)
    await expectReply(await send('http://weather.localhost/', { token: secret }, '203.0.113.8'), 403, bodies.ipNotAllowed)
  })

  it('IPv4 CIDR range', async () => {
    const secret = token('cidr4')
    for (const ok of ['198.51.100.0', '198.51.100.77', '198.51.100.255']) {
      expect((await send('http://weather.localhost/', { token: secret }, ok)).status).toBe(200)
    }
    for (const out of ['198.51.101.0', '198.51.99.255', '10.0.0.1']) {
      await expectReply(await send('http://weather.localhost/', { token: secret }, out), 403, bodies.ipNotAllowed)
    }
  })

  it('IPv6 range and address, in any spelling', async () => {
    for (const ok of ['2001:db8::1', '2001:db8:ffff::abcd', '2001:0DB8:0000::0001']) {
      expect((await send('http://weather.localhost/', { token: token('ipv6') }, ok)).status).toBe(200)
    }
    await expectReply(await send('http://weather.localhost/', { token: token('ipv6') }, '2001:db9::1'), 403, bodies.ipNotAllowed)
    expect((await send('http://weather.localhost/', { token: token('ipv6-exact') }, '2001:0db8:0:0:0:0:0:1')).status).toBe(200)
    await expectReply(
      await send('http://weather.localhost/', { token: token('ipv6-exact') }, '2001:db8::2'),
      403,
      bodies.ipNotAllowed,
    )
  })

  it('an IPv4-mapped IPv6 socket address matches the IPv4 entry (dual-stack servers)', async () => {
    expect((await send('http://weather.localhost/', { token: token('ipv4') }, '::ffff:203.0.113.7')).status).toBe(200)
    expect((await send('http://weather.localhost/', { token: token('cidr4') }, '::ffff:198.51.100.9')).status).toBe(200)
    await expectReply(await send('http://weather.localhost/', { token: token('ipv4') }, '::ffff:203.0.113.8'), 403, bodies.ipNotAllowed)
  })

  it('an unknown client address never passes an allowlist; a token without one works from anywhere', async () => {
    await expectReply(await send('http://weather.localhost/', { token: token('ipv4') }, undefined), 403, bodies.ipNotAllowed)
    expect((await send('http://weather.localhost/', { token: token('alice') }, undefined)).status).toBe(200)
    expect((await send('http://weather.localhost/', { token: token('alice') }, '2001:db9::1')).status).toBe(200)
  })

  it('X-Forwarded-For is ignored by default', async () => {
    const response = await send(
      'http://weather.localhost/',
      { token: token('ipv4'), headers: { 'x-forwarded-for': '203.0.113.7' } },
      '10.0.0.1',
    )
    await expectReply(response, 403, bodies.ipNotAllowed)
  })

  it('X-Forwarded-For is honoured only from a trusted proxy (trustProxy)', async () => {
    const proxied = createTestPlatform({ trustProxy: ['10.0.0.0/8'] })
    try {
      const secret = proxied.token('ipv4')
      const viaProxy = await proxied.platform.fetch(
        mcpRequest('http://weather.localhost/', { token: secret, headers: { 'x-forwarded-for': '203.0.113.7' } }),
        { clientAddress: '10.0.0.1' },
      )
      expect(viaProxy.status).toBe(200)
      // The same header from a peer that is not a trusted proxy is a spoof.
      const spoofed = await proxied.platform.fetch(
        mcpRequest('http://weather.localhost/', { token: secret, headers: { 'x-forwarded-for': '203.0.113.7' } }),
        { clientAddress: '192.0.2.1' },
      )
      await expectReply(spoofed, 403, bodies.ipNotAllowed)
      // The client behind the proxy is outside the list.
      const outside = await proxied.platform.fetch(
        mcpRequest('http://weather.localhost/', { token: secret, headers: { 'x-forwarded-for': '203.0.113.8' } }),
        { clientAddress: '10.0.0.1' },
      )
      await expectReply(outside, 403, bodies.ipNotAllowed)
    } finally {
      await proxied.platform.close()
    }
  })
})

describe('402 Payment Required (spec 5.1, 7)', () => {
  it('an inactive subscription', async () => {
    await expectReply(await send('http://weather.localhost/', { token: token('bob') }), 402, bodies.paymentRequired)
  })

  it('no subscription at all', async () => {
    await expectReply(await send('http://weather.localhost/v2', { token: token('dave') }), 402, bodies.paymentRequired)
  })
})

describe('404 Not Found (spec 7, 9.2; DESIGN.md)', () => {
  it('an exact version that was never deployed; broader patterns still resolve', async () => {
    await expectReply(
      await send('http://weather.localhost/v1.0.5', { token: token('alice') }),
      404,
      bodies.versionNotFound('1.0.5', '2.0.0'),
    )
    await expectReply(await send('http://weather.localhost/v3', { token: token('alice') }), 404, bodies.versionNotFound('3', '2.0.0'))
    await expectReply(await send('http://weather.localhost/v1.7', { token: token('alice') }), 404, bodies.versionNotFound('1.7', '2.0.0'))
    expect((await toolVersion('http://weather.localhost/v1.0')).tool).toBe('1.0.0')
  })

  it('an exact version replaced by a newer patch (seed and deploy)', async () => {
    // The seed deployed 1.1.0 then 1.1.1: 1.1.0 is no longer live.
    await expectReply(
      await send('http://weather.localhost/v1.1.0', { token: token('alice') }),
      404,
      bodies.versionNotFound('1.1.0', '2.0.0'),
    )
    expect((await toolVersion('http://weather.localhost/v1.1.1')).tool).toBe('1.1.1')
    platform.deploy('app_weather', '1.1.2')
    await expectReply(
      await send('http://weather.localhost/v1.1.1', { token: token('alice') }),
      404,
      bodies.versionNotFound('1.1.1', '2.0.0'),
    )
    expect((await toolVersion('http://weather.localhost/v1.1')).tool).toBe('1.1.2')
    expect((await toolVersion('http://weather.localhost/v1.1.2')).tool).toBe('1.1.2')
  })

  it('an unknown App (host), with or without a token, never a 401', async () => {
    for (const url of [
      'http://nope.localhost/v1',
      'http://localhost/v1',
      'http://a.weather.localhost/v1',
      'http://weather.example.com/v1',
      'http://127.0.0.1/v1',
    ]) {
      await expectReply(await send(url), 404, bodies.notFound)
      await expectReply(await send(url, { token: token('alice') }), 404, bodies.notFound)
    }
  })

  it('an unknown path on a known App, before authentication', async () => {
    for (const path of ['/v1.x', '/foo', '/v1/extra', '/v', '/vv1', '/v1.1.1.1', '/V1', '/v-1', '/v1..1', '/index.html']) {
      await expectReply(await send(`http://weather.localhost${path}`), 404, bodies.notFound)
      await expectReply(await send(`http://weather.localhost${path}`, { token: token('alice') }), 404, bodies.notFound)
    }
  })

  it('a pre-release is reachable only by its exact URL', async () => {
    platform.deploy('app_weather', '2.1.0-beta.1')
    expect((await toolVersion('http://weather.localhost/v2.1.0-beta.1')).tool).toBe('2.1.0-beta.1')
    expect((await toolVersion('http://weather.localhost/')).tool).toBe('2.0.0')
    expect((await toolVersion('http://weather.localhost/v2')).tool).toBe('2.0.0')
    await expectReply(await send('http://weather.localhost/v2.1', { token: token('alice') }), 404, bodies.versionNotFound('2.1', '2.0.0'))
  })
})

describe('made-up API tokens: 401 each, then 429 once the client address has spent its lookups', () => {
  const resetAt = Math.ceil((T0 - (T0 % MINUTE) + MINUTE) / 1000)

  it('600 distinct well-formed tokens a minute per address reach the store (the default budget); the next is 429 with Retry-After, real tokens still served', async () => {
    const url = 'http://weather.localhost/v1'
    // A real token this instance has served before the budget is spent.
    expect((await send(url, { token: token('alice') })).status).toBe(200)
    for (let i = 0; i < 600; i++) await expectUnauthorized(await send(url, { token: generateApiToken() }), true)
    const spent = await send(url, { token: generateApiToken() })
    expect(spent.headers.get('retry-after')).toBe('30')
    // The RateLimit fields name a policy of their own: the App's limit ("minute") is not spent.
    expect(spent.headers.get('ratelimit-policy')).toBe('"unverified";q=600;w=60')
    expect(spent.headers.get('ratelimit')).toBe('"unverified";r=0;t=30')
    await expectReply(spent, 429, bodies.rateLimited(600, resetAt, 30))
    // The same made-up token again is a 401 (held as unknown), not a 429 nor a lookup.
    const repeated = generateApiToken()
    await expectUnauthorized(await send(url, { token: repeated }, '198.51.100.20'), true)
    await expectUnauthorized(await send(url, { token: repeated }), true)
    // Another address is not held up, nor a real token this instance has served: its hash is
    // known to be stored, so it is not counted. (One this instance has not seen yet would need
    // a lookup, and waits for the next window like any other from this address.)
    await expectUnauthorized(await send(url, { token: generateApiToken() }, '198.51.100.21'), true)
    expect((await send(url, { token: token('alice') })).status).toBe(200)
    expect((await send(url, { token: token('alice-all') })).status).toBe(429)
    // The next window.
    clock.advance(30_000)
    await expectUnauthorized(await send(url, { token: generateApiToken() }), true)
  })
})

describe('429 Rate limit exceeded (spec 7, 8)', () => {
  const url = 'http://limited.localhost/v1'
  const resetAt = Math.ceil((T0 - (T0 % MINUTE) + MINUTE) / 1000)

  it('answers the spec body and Retry-After once the window is spent, and resets in the next window', async () => {
    const secret = token('alice-limited')
    for (const remaining of [2, 1, 0]) {
      const ok = await send(url, { token: secret })
      expect(ok.status).toBe(200)
      expect(ok.headers.get('ratelimit-policy')).toBe('"minute";q=3;w=60')
      expect(ok.headers.get('ratelimit')).toBe(`"minute";r=${remaining};t=30`)
    }
    const limited = await send(url, { token: secret })
    expect(limited.headers.get('retry-after')).toBe('30')
    await expectReply(limited, 429, bodies.rateLimited(3, resetAt, 30))

    clock.advance(20_000)
    const later = await send(url, { token: secret })
    expect(later.headers.get('retry-after')).toBe('10')
    await expectReply(later, 429, bodies.rateLimited(3, resetAt, 10))

    clock.advance(10_000) // the next minute window
    const fresh = await send(url, { token: secret })
    expect(fresh.status).toBe(200)
    expect(fresh.headers.get('ratelimit')).toBe('"minute";r=2;t=60')
  })

  it('counts per caller, not per token: every token of the owner shares the window', async () => {
    for (let i = 0; i < 3; i++) expect((await send(url, { token: token('alice-limited') })).status).toBe(200)
    const other = await send(url, { token: token('alice-all') })
    await expectReply(other, 429, bodies.rateLimited(3, resetAt, 30))
  })

  it('an App without a limit sends no RateLimit headers', async () => {
    const response = await send('http://weather.localhost/', { token: token('alice') })
    expect(response.status).toBe(200)
    expect(response.headers.get('ratelimit')).toBeNull()
    expect(response.headers.get('ratelimit-policy')).toBeNull()
  })
})

describe('success: version resolution and headers (spec 9)', () => {
  it.each([
    ['/', '2.0.0'],
    ['/v1', '1.1.1'],
    ['/v1/', '1.1.1'],
    ['/v1.1', '1.1.1'],
    ['/v1.1.1', '1.1.1'],
    ['/v1.0', '1.0.0'],
    ['/v1.0.0', '1.0.0'],
    ['/v2', '2.0.0'],
    // Percent-encoded unreserved characters are the same URL (RFC 3986 6.2.2.2).
    ['/v%31', '1.1.1'],
    ['/%76%31%2E%30', '1.0.0'],
  ])('%s serves %s, and the tool of that version answers', async (path, version) => {
    const { tool, headers } = await toolVersion(`http://weather.localhost${path}`)
    expect(tool).toBe(version)
    expect(headers).toEqual({ version, latest: '2.0.0' })
  })

  it('tools/list comes from the resolved version (spec 4.1)', async () => {
    const response = await send('http://weather.localhost/v1.0', { token: token('alice') })
    expect(response.status).toBe(200)
    expect(versionHeaders(response)).toEqual({ version: '1.0.0', latest: '2.0.0' })
    const message = await rpcResult(response)
    expect(message).toMatchObject({ jsonrpc: '2.0', id: 1 })
    const names = message.result.tools.map((t: { name: string }) => t.name)
    expect(names).toContain('get_version')
    expect(message.result.tools.find((t: { name: string }) => t.name === 'get_version').description).toContain('(1.0.0)')
  })

  it('X-MCP-Latest-Version follows deploys; each request without a session resolves anew', async () => {
    platform.deploy('app_weather', '2.1.0')
    expect(await toolVersion('http://weather.localhost/v1')).toEqual({ tool: '1.1.1', headers: { version: '1.1.1', latest: '2.1.0' } })
    expect(await toolVersion('http://weather.localhost/')).toEqual({ tool: '2.1.0', headers: { version: '2.1.0', latest: '2.1.0' } })
    platform.deploy('app_weather', '1.2.0')
    expect(await toolVersion('http://weather.localhost/v1')).toEqual({ tool: '1.2.0', headers: { version: '1.2.0', latest: '2.1.0' } })
  })

  it('a refused deploy (lower patch) changes nothing', async () => {
    expect(() => platform.deploy('app_weather', '1.1.0')).toThrow(/1\.1\.0/)
    expect((await toolVersion('http://weather.localhost/v1.1')).tool).toBe('1.1.1')
  })

  it('the rate-limit headers ride on successful responses, beside the version headers', async () => {
    const response = await send('http://limited.localhost/', { token: token('alice-limited') })
    expect(response.status).toBe(200)
    expect(versionHeaders(response)).toEqual({ version: '1.0.0', latest: '1.0.0' })
    expect(response.headers.get('ratelimit')).toBe('"minute";r=2;t=30')
  })
})

describe('pipeline order (DESIGN.md "Request pipeline")', () => {
  it('path and App come first: unknown path or host is 404 even without a token', async () => {
    await expectReply(await send('http://weather.localhost/v1.x'), 404, bodies.notFound)
    await expectReply(await send('http://nope.localhost/'), 404, bodies.notFound)
  })

  it('authentication before the version: a missing exact version is 401 to a stranger', async () => {
    await expectUnauthorized(await send('http://weather.localhost/v9.9.9'), false)
  })

  it('authentication before the subscription: an unusable token on an App without subscription is 401, not 402', async () => {
    // bob has no active subscription to weather: his token gives 402 while valid.
    const secret = token('bob')
    await expectReply(await send('http://weather.localhost/', { token: secret }), 402, bodies.paymentRequired)
    await platform.tokenService.revokeAllForUser('user_bob')
    await expectUnauthorized(await send('http://weather.localhost/', { token: secret }), true)
    // A token nobody issued on an App nobody pays for: 401 too.
    await expectUnauthorized(await send('http://limited.localhost/', { token: generateApiToken() }), true, 'limited')
  })

  it('allowlist before scope: an out-of-scope token from a wrong address is told about the address', async () => {
    const secret = token('ip-limited') // scoped to limited, allowlist 203.0.113.7
    await expectReply(await send('http://weather.localhost/', { token: secret }, '192.0.2.1'), 403, bodies.ipNotAllowed)
    await expectReply(await send('http://weather.localhost/', { token: secret }, '203.0.113.7'), 403, bodies.forbidden)
    expect((await send('http://limited.localhost/', { token: secret }, '203.0.113.7')).status).toBe(200)
  })

  it('scope before subscription: an out-of-scope token of a non-subscriber is 403, not 402', async () => {
    await expectReply(await send('http://notes.localhost/', { token: token('bob') }), 403, bodies.forbidden)
  })

  it('refusals before the rate limit never consume it (out of scope, allowlist, 401)', async () => {
    const url = 'http://limited.localhost/'
    for (let i = 0; i < 10; i++) {
      await expectReply(await send(url, { token: token('alice-notes') }), 403, bodies.forbidden)
      await expectReply(await send(url, { token: token('ip-limited') }, '192.0.2.1'), 403, bodies.ipNotAllowed)
      expect((await send(url)).status).toBe(401)
    }
    for (const remaining of [2, 1, 0]) {
      const ok = await send(url, { token: token('alice-limited') })
      expect(ok.status).toBe(200)
      expect(ok.headers.get('ratelimit')).toBe(`"minute";r=${remaining};t=30`)
    }
  })

  it('rate limit before the version: once limited, a missing version is 429, not 404', async () => {
    for (let i = 0; i < 3; i++) expect((await send('http://limited.localhost/', { token: token('alice-limited') })).status).toBe(200)
    const response = await send('http://limited.localhost/v9.9.9', { token: token('alice-limited') })
    expect(response.status).toBe(429)
    expect(versionHeaders(response)).toEqual({ version: null, latest: null })
  })
})
