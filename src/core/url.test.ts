/**
 * Every URL check of the package reads a Latin-1 URL the same on its first call and its
 * fifty-thousandth: Node 20's `URL.canParse`, which they used, answers `false` for one once V8
 * has optimised the call site (regression: an audience of `https://bücher.example` matched the
 * App on a fresh process and was refused after some thousands of tokens).
 */
import { describe, expect, it } from 'vitest'
import { isHttpUrl } from '../auth/discovery.js'
import { audienceMatches, normalizeResource } from '../auth/jwt-claims.js'
import { parseUrl } from './url.js'

/** Enough calls for V8 to optimise a hot call site (Node 20 answered wrong after about 10,000). */
const CALLS = 50_000

describe('parseUrl, and the checks built on it', () => {
  it('reads a URL with Latin-1 characters on every call, alternating with ASCII ones', () => {
    const answers = new Set<string>()
    for (let i = 0; i < CALLS; i++) {
      answers.add(String(parseUrl(i % 2 ? 'https://bücher.example/v1' : 'https://a.example/')?.host))
    }
    expect([...answers].sort()).toEqual(['a.example', 'xn--bcher-kva.example'])
    expect(parseUrl('https://[::1')).toBeUndefined()
    expect(parseUrl('/v1', 'http://é.localhost')?.href).toBe('http://xn--9ca.localhost/v1')
  })

  it('an audience written with a Latin-1 name matches its App, and an issuer so written is a URL, on every call', () => {
    let refused = 0
    for (let i = 0; i < CALLS; i++) {
      if (!audienceMatches(['https://BÜCHER.example/v1'], ['https://bücher.example'])) refused++
      if (!isHttpUrl('https://é.example/')) refused++
      if (audienceMatches(['https://bücher.example.evil/'], ['https://bücher.example'])) refused += 1_000_000
    }
    expect(refused).toBe(0)
    expect(normalizeResource('https://Bücher.example')).toBe('https://xn--bcher-kva.example/')
  })
})
