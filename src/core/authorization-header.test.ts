import { describe, expect, it } from 'vitest'
import { MAX_BEARER_LENGTH, parseBearerToken } from './authorization-header.js'

describe('parseBearerToken (RFC 6750 2.1)', () => {
  it('missing: no header or an empty one', () => {
    expect(parseBearerToken(null)).toEqual({ kind: 'missing' })
    expect(parseBearerToken(undefined)).toEqual({ kind: 'missing' })
    expect(parseBearerToken('')).toEqual({ kind: 'missing' })
  })

  it('bearer: the token after the scheme', () => {
    expect(parseBearerToken('Bearer svc_abc')).toEqual({ kind: 'bearer', token: 'svc_abc' })
    expect(parseBearerToken('Bearer a')).toEqual({ kind: 'bearer', token: 'a' })
  })

  it('the scheme is case-insensitive', () => {
    for (const scheme of ['bearer', 'BEARER', 'BeArEr']) {
      expect(parseBearerToken(`${scheme} tok`)).toEqual({ kind: 'bearer', token: 'tok' })
    }
  })

  it('tolerates extra spaces around the token', () => {
    expect(parseBearerToken('Bearer    tok  ')).toEqual({ kind: 'bearer', token: 'tok' })
  })

  it('accepts every b64token character, with trailing "="', () => {
    const token = 'AZaz09-._~+/abc=='
    expect(parseBearerToken(`Bearer ${token}`)).toEqual({ kind: 'bearer', token })
    const jwt = 'eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig-_'
    expect(parseBearerToken(`Bearer ${jwt}`)).toEqual({ kind: 'bearer', token: jwt })
  })

  it('invalid: other schemes, no token, bad characters', () => {
    for (const header of [
      'Basic dXNlcjpwYXNz',
      'Bearer',
      'Bearer ',
      'Bearer      ',
      'Bearertoken',
      'Bearer\ttok',
      ' Bearer tok',
      'Token tok',
      'Bearer a b',
      'Bearer tok,other',
      'Bearer =abc',
      'Bearer ab=c',
      'Bearer tök',
      'Bearer "tok"',
      'Bearer tok\n',
      'Bearer tok;x',
      'x',
      'Bearer tok\u0000',
    ]) {
      expect(parseBearerToken(header), JSON.stringify(header)).toEqual({ kind: 'invalid' })
    }
  })

  it('accepts a token of MAX_BEARER_LENGTH and refuses a longer one', () => {
    const max = 'a'.repeat(MAX_BEARER_LENGTH)
    expect(parseBearerToken(`Bearer ${max}`)).toEqual({ kind: 'bearer', token: max })
    expect(parseBearerToken(`Bearer ${max}a`)).toEqual({ kind: 'invalid' })
    expect(parseBearerToken(`Bearer ${'a'.repeat(1_000_000)}`)).toEqual({ kind: 'invalid' })
  })
})
