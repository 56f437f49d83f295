import { describe, expect, it } from 'vitest'
import { errorReply } from '../adapters/error-reply.js'
import {
  type Reply,
  RpcCode,
  authorizationServerUnavailableReply,
  buildWwwAuthenticate,
  contentLengthMismatchReply,
  forbiddenReply,
  invalidHostReply,
  ipNotAllowedReply,
  jsonRpcErrorReply,
  methodNotAllowedReply,
  notFoundReply,
  originNotAllowedReply,
  paymentRequiredReply,
  rateLimitedReply,
  serviceUnavailableReply,
  sessionNotFoundReply,
  unauthorizedReply,
  versionNotFoundReply,
  versionNotServedReply,
} from './reply.js'

const METADATA_URL = 'https://weather.example.com/.well-known/oauth-protected-resource'

function bodyOf(reply: Reply): { jsonrpc: string; id: null; error: { code: number; message: string; data?: unknown } } {
  expect(reply.body).not.toBeNull()
  return JSON.parse(reply.body!)
}

/** Every error reply shares the JSON-RPC envelope and the content type (spec 7). */
function expectEnvelope(reply: Reply, status: number, code: number, message: string, data?: unknown): void {
  expect(reply.status).toBe(status)
  expect(reply.headers['content-type']).toBe('application/json')
  const body = bodyOf(reply)
  expect(Object.keys(body).sort()).toEqual(['error', 'id', 'jsonrpc'])
  expect(body.jsonrpc).toBe('2.0')
  expect(body.id).toBeNull()
  expect(body.error.code).toBe(code)
  expect(body.error.message).toBe(message)
  if (data === undefined) expect('data' in body.error).toBe(false)
  else expect(body.error.data).toEqual(data)
}

function expectHeaderNamesLowercase(reply: Reply): void {
  for (const name of Object.keys(reply.headers)) expect(name).toBe(name.toLowerCase())
}

describe('jsonRpcErrorReply', () => {
  it('builds a JSON-RPC 2.0 error with id null and the JSON content type', () => {
    const reply = jsonRpcErrorReply(418, { code: -1, message: 'Teapot', data: { x: 1 } })
    expectEnvelope(reply, 418, -1, 'Teapot', { x: 1 })
  })

  it('keeps extra headers beside the content type', () => {
    const reply = jsonRpcErrorReply(400, { code: -1, message: 'm' }, { 'x-extra': 'yes' })
    expect(reply.headers).toEqual({ 'content-type': 'application/json', 'x-extra': 'yes' })
  })

  it('omits data when the error has none', () => {
    expect(jsonRpcErrorReply(400, { code: -1, message: 'm' }).body).toBe(
      '{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"m"}}',
    )
  })
})

describe('401 Unauthorized (spec 7, 5.1 step 1)', () => {
  it('without a token: error unauthorized and a challenge naming the metadata URL', () => {
    const reply = unauthorizedReply({ resourceMetadataUrl: METADATA_URL })
    expectEnvelope(reply, 401, -32001, 'Unauthorized', {
      error: 'unauthorized',
      description: expect.stringMatching(/authentication is required|Authentication required/i),
    })
    expect(reply.headers['www-authenticate']).toBe(`Bearer resource_metadata="${METADATA_URL}"`)
    expect(reply.headers['www-authenticate']).not.toContain('invalid_token')
    expect(reply.headers['retry-after']).toBeUndefined()
    expectHeaderNamesLowercase(reply)
  })

  it('with a rejected token: error="invalid_token" in the challenge (RFC 6750 3.1)', () => {
    const reply = unauthorizedReply({ resourceMetadataUrl: METADATA_URL, invalidToken: true })
    // Spec section 7: the body keeps data.error = unauthorized; the challenge carries invalid_token.
    expectEnvelope(reply, 401, -32001, 'Unauthorized', {
      error: 'unauthorized',
      description: expect.stringMatching(/Authentication required/),
    })
    expect(reply.headers['www-authenticate']).toBe(
      `Bearer resource_metadata="${METADATA_URL}", error="invalid_token"`,
    )
  })

  it('buildWwwAuthenticate cannot be broken out of its quoted string', () => {
    const header = buildWwwAuthenticate({ resourceMetadataUrl: 'https://x.example/"evil\\', invalidToken: false })
    expect(header).toBe('Bearer resource_metadata="https://x.example/%22evil/"')
    // The URL the parser makes of it: where the dispatcher serves the document.
    expect(header).toBe(`Bearer resource_metadata="${new URL('https://x.example/"evil\\').href}"`)
  })

  it('buildWwwAuthenticate names a scope list, and refuses one that would need escaping or names no scope', () => {
    expect(buildWwwAuthenticate({ resourceMetadataUrl: METADATA_URL, scope: 'openid mcp:tools', invalidToken: true })).toBe(
      `Bearer resource_metadata="${METADATA_URL}", scope="openid mcp:tools", error="invalid_token"`,
    )
    // `null` is none, as `undefined` is.
    expect(buildWwwAuthenticate({ resourceMetadataUrl: METADATA_URL, scope: null })).toBe(`Bearer resource_metadata="${METADATA_URL}"`)
    for (const scope of ['', ' openid', 'openid ', 'openid  profile', 'a"b', 'a\\b', 'a\tb', 'caf\u00e9', 42]) {
      expect(() => buildWwwAuthenticate({ resourceMetadataUrl: METADATA_URL, scope: scope as string }), String(scope)).toThrow(RangeError)
    }
  })

  it('invalidToken false is the same as absent', () => {
    expect(unauthorizedReply({ resourceMetadataUrl: METADATA_URL, invalidToken: false })).toEqual(
      unauthorizedReply({ resourceMetadataUrl: METADATA_URL }),
    )
  })
})

describe('402 Payment Required (spec 7)', () => {
  it('carries error payment_required and a description about the subscription', () => {
    const reply = paymentRequiredReply()
    expectEnvelope(reply, 402, -32002, 'Payment Required', {
      error: 'payment_required',
      description: expect.stringMatching(/active subscription/i),
    })
    expect(reply.headers['www-authenticate']).toBeUndefined()
  })
})

describe('403 Forbidden', () => {
  it('out of scope (spec 7): code -32003, no data', () => {
    expectEnvelope(forbiddenReply(), 403, -32003, 'Forbidden')
  })

  it('outside the IP allowlist (DESIGN.md): -32003 with error ip_not_allowed', () => {
    expectEnvelope(ipNotAllowedReply(), 403, -32003, 'Forbidden', { error: 'ip_not_allowed' })
  })

  it('origin not allowed: -32003 with error origin_not_allowed', () => {
    expectEnvelope(originNotAllowedReply(), 403, -32003, 'Forbidden', { error: 'origin_not_allowed' })
    // The answer depends on `Origin`: a cache must not hand it to another origin.
    expect(originNotAllowedReply().headers.vary).toBe('Origin')
  })
})

describe('404 Not Found (DESIGN.md)', () => {
  it('exact version not live: -32004 with requested and latest', () => {
    expectEnvelope(versionNotFoundReply('1.2.3', '1.4.0'), 404, -32004, 'Version not found', {
      error: 'version_not_found',
      requested: '1.2.3',
      latest: '1.4.0',
    })
  })

  it('exact version not live when nothing is live: latest is null', () => {
    expectEnvelope(versionNotFoundReply('1.0.0', null), 404, -32004, 'Version not found', {
      error: 'version_not_found',
      requested: '1.0.0',
      latest: null,
    })
  })

  it('unknown App or path: -32004 with error not_found', () => {
    expectEnvelope(notFoundReply(), 404, -32004, 'Not found', { error: 'not_found' })
  })

  it('unknown session: -32004 with error session_not_found', () => {
    expectEnvelope(sessionNotFoundReply(), 404, -32004, 'Session not found', { error: 'session_not_found' })
  })
})

describe('405 Method not allowed', () => {
  it('lists the allowed methods in Allow', () => {
    const reply = methodNotAllowedReply('GET, POST, DELETE')
    expectEnvelope(reply, 405, -32000, 'Method not allowed', { error: 'method_not_allowed' })
    expect(reply.headers.allow).toBe('GET, POST, DELETE')
  })
})

describe('429 Rate limit exceeded (spec 7)', () => {
  it('carries limit, resetAt, retryAfter, windowType and Retry-After', () => {
    const reply = rateLimitedReply({ limit: 60, resetAt: 1_700_000_060, retryAfter: 17, windowType: 'minute' })
    expectEnvelope(reply, 429, -32000, 'Rate limit exceeded', {
      limit: 60,
      resetAt: 1_700_000_060,
      retryAfter: 17,
      windowType: 'minute',
    })
    expect(reply.headers['retry-after']).toBe('17')
    const data = bodyOf(reply).error.data as Record<string, unknown>
    for (const key of ['limit', 'resetAt', 'retryAfter']) expect(Number.isInteger(data[key])).toBe(true)
    expect(Object.keys(data).sort()).toEqual(['limit', 'resetAt', 'retryAfter', 'windowType'])
  })

  it('keeps extra headers (RateLimit fields) and the content type', () => {
    const reply = rateLimitedReply(
      { limit: 1, resetAt: 2, retryAfter: 3, windowType: 'minute' },
      { ratelimit: '"minute";r=0;t=3' },
    )
    expect(reply.headers).toEqual({
      'content-type': 'application/json',
      ratelimit: '"minute";r=0;t=3',
      'retry-after': '3',
    })
  })

  it('Retry-After always agrees with the body', () => {
    const reply = rateLimitedReply({ limit: 1, resetAt: 2, retryAfter: 3, windowType: 'minute' }, { 'retry-after': '99' })
    expect(reply.headers['retry-after']).toBe('3')
  })
})

describe('503 (DESIGN.md)', () => {
  it('authorization server unavailable: -32005, temporarily_unavailable, Retry-After', () => {
    const reply = authorizationServerUnavailableReply(30)
    expectEnvelope(reply, 503, -32005, 'Authorization server unavailable', {
      error: 'temporarily_unavailable',
      retryAfter: 30,
    })
    expect(reply.headers['retry-after']).toBe('30')
  })

  it('store unavailable: -32005 with Retry-After (default 1 s)', () => {
    const reply = serviceUnavailableReply()
    expectEnvelope(reply, 503, -32005, 'Service unavailable', { error: 'temporarily_unavailable', retryAfter: 1 })
    expect(reply.headers['retry-after']).toBe('1')
    expect(serviceUnavailableReply(5).headers['retry-after']).toBe('5')
  })
})

describe('RpcCode', () => {
  it('matches the codes of spec 7 and DESIGN.md, and JSON-RPC 2.0\'s for malformed requests and handler failures', () => {
    expect(RpcCode).toMatchObject({
      Unauthorized: -32001,
      PaymentRequired: -32002,
      Forbidden: -32003,
      NotFound: -32004,
      Unavailable: -32005,
      RateLimited: -32000,
      InvalidRequest: -32600,
      InternalError: -32603,
      ParseError: -32700,
    })
  })

  it('names the code of every answer the dispatch layer builds, so a client switching on it misses none', () => {
    const codes = new Set<number>(Object.values(RpcCode))
    const replies = [
      unauthorizedReply({ resourceMetadataUrl: METADATA_URL }),
      paymentRequiredReply(),
      forbiddenReply(),
      ipNotAllowedReply(),
      originNotAllowedReply(),
      versionNotFoundReply('3', '2.0.0'),
      notFoundReply(),
      sessionNotFoundReply(),
      methodNotAllowedReply('GET, POST, DELETE, OPTIONS'),
      rateLimitedReply({ limit: 1, windowType: 'minute', resetAt: 60_000, retryAfter: 1 }),
      authorizationServerUnavailableReply(1),
      serviceUnavailableReply(),
      versionNotServedReply('1.0.0'),
      invalidHostReply(),
      contentLengthMismatchReply(),
      // What `jsonRpcErrors()` answers for a framework's body parser: not JSON, too large, another
      // media type, another client error, the server's own fault.
      ...[{ status: 400, type: 'entity.parse.failed' }, { statusCode: 413 }, { statusCode: 415 }, { statusCode: 404 }, new Error('x')].map((e) => errorReply(e).reply),
    ]
    for (const reply of replies) {
      const { code } = (JSON.parse(reply.body!) as { error: { code: number } }).error
      expect(codes.has(code), `${reply.status} ${reply.body}`).toBe(true)
    }
  })
})

describe('shared replies', () => {
  it('cannot be changed by a caller', () => {
    const reply = forbiddenReply()
    expect(() => {
      ;(reply.headers as Record<string, string>)['x-injected'] = 'yes'
    }).toThrow()
    expect(forbiddenReply().headers['x-injected']).toBeUndefined()
  })
})
