import { describe, expect, it } from 'vitest'
import { bearerTokenError } from './oauth-validator.js'

describe('bearerTokenError: an RFC 6750 error about the token in a WWW-Authenticate value (RFC 9110 section 11.6.1)', () => {
  it.each([
    'Bearer error="insufficient_scope"',
    'Bearer realm="https://as.example", error="insufficient_scope", error_description="access token missing openid scope", scope="openid"',
    'bearer error=invalid_token',
    'Bearer error="invalid_request"',
    // Another challenge first, or two fields joined by fetch's Headers.get.
    'DPoP algs="ES256", Bearer error="insufficient_scope"',
    'Basic realm="x", Bearer error="invalid_token"',
    'Basic realm="a, b", Bearer realm="c", error="invalid_token"',
    'Bearer realm="quoted \\"error=nothing\\"", error="invalid_token"',
  ])('%s', (header) => {
    expect(bearerTokenError(header)).toBe(true)
  })

  it.each([
    '',
    'Bearer',
    'Bearer realm="x"',
    'Bearer error="server_error"',
    'Basic error="invalid_token"',
    'DPoP error="invalid_token", Bearer realm="x"',
    'Bearer realm="gw", DPoP error="invalid_token"',
    'Bearer realm="error=invalid_token"',
    'Bearer realm="a, error=invalid_token"',
    'Bearer error_description="invalid_token"',
    'Bearer error="invalid_token_x"',
    'Bearerx error="invalid_token"',
  ])('not %s', (header) => {
    expect(bearerTokenError(header)).toBe(false)
  })

  it('an authorization server\'s run of spaces before a stray quote is read in linear time (regression: quadratic backtracking, 128 ms at 16,000 spaces; a million here would take minutes)', () => {
    const spaces = ' '.repeat(1_000_000)
    expect(bearerTokenError(`Bearer error=${spaces}"`)).toBe(false)
    expect(bearerTokenError(`Bearer realm=x, a=${spaces}", error="invalid_token"`)).toBe(false)
    expect(bearerTokenError(`Bearer error=${spaces}invalid_token`)).toBe(true)
  })

  it.each(['Bearer error = "invalid_token" ', 'Bearer realm="x" ,  error=invalid_token  ', 'Bearer  error="invalid_token"'])('surrounding whitespace: %j', (header) => {
    expect(bearerTokenError(header)).toBe(true)
  })
})
