import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { withoutTrailingSlashes } from './trailing-slash.js'

describe('withoutTrailingSlashes', () => {
  it('drops every trailing slash and nothing else', () => {
    expect(withoutTrailingSlashes('')).toBe('')
    expect(withoutTrailingSlashes('///')).toBe('')
    expect(withoutTrailingSlashes('/api/tokens/')).toBe('/api/tokens')
    expect(withoutTrailingSlashes('https://as.example//')).toBe('https://as.example')
    expect(withoutTrailingSlashes('/a//b')).toBe('/a//b')
    // The input that took /\/+$/ 1.8 s.
    expect(withoutTrailingSlashes(`${'/'.repeat(64_000)}x`)).toHaveLength(64_001)
  })

  it('agrees with the pattern it replaces', () => {
    fc.assert(
      fc.property(fc.string({ unit: fc.constantFrom('/', 'a', '\\', ' '), maxLength: 40 }), (text) => {
        expect(withoutTrailingSlashes(text)).toBe(text.replace(/\/+$/, ''))
      }),
      { numRuns: 500 },
    )
  })
})
