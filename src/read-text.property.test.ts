/**
 * Properties of `contentCodings`, the reading of a `Content-Encoding` value (RFC 9110 section
 * 8.4: `#content-coding`, case-insensitive tokens, empty list elements allowed) by the token API
 * (a coded body is refused, never read as text) and the proxy (what undici's `fetch` decoded).
 * Header values are chosen by whoever sends the request or the answer: any string.
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { contentCodings } from './read-text.js'

const RUNS = { numRuns: 1_000 }

/** Any string: ASCII (controls included), Latin-1 (what header values hold), any code unit. */
const anyChar = fc.oneof(
  fc.constantFrom(',', ' ', '\t', ', ', ' ,', 'gzip', 'GZip', 'identity', 'IDENTITY', 'br', 'x-gzip', 'deflate', 'zstd', ';q=1'),
  fc.integer({ min: 0, max: 0x7f }).map((c) => String.fromCharCode(c)),
  fc.integer({ min: 0, max: 0xff }).map((c) => String.fromCharCode(c)),
  fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)),
)
const anyValue = fc.string({ unit: anyChar, maxLength: 30 })

/** RFC 9110 tchar, for content-coding tokens. */
const token = fc.stringMatching(/^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,10}$/)
/** OWS: SP and HTAB. */
const ows = fc.stringMatching(/^[ \t]{0,3}$/)

describe('contentCodings, property-based', () => {
  it('any value: one entry per list element (commas + 1), none with a comma, each trimmed and lower case; never throws; absent is none', () => {
    fc.assert(
      fc.property(anyValue, (value) => {
        const codings = contentCodings(value)
        expect(codings.length).toBe(value.split(',').length)
        for (const coding of codings) {
          expect(coding).not.toContain(',')
          expect(coding).toBe(coding.trim())
          expect(coding).toBe(coding.toLowerCase())
        }
      }),
      RUNS,
    )
    expect(contentCodings(null)).toEqual([])
  })

  it('a list of tokens with optional whitespace around its commas reads back as the tokens, lower case, in order', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(ows, fc.option(token, { nil: '' }), ows), { minLength: 1, maxLength: 6 }), (elements) => {
        const value = elements.map(([before, t, after]) => `${before}${t}${after}`).join(',')
        // The ABNF, stated apart: split at the commas, OWS (SP, HTAB) off each end, tokens compared without case.
        expect(contentCodings(value)).toEqual(elements.map(([, t]) => t.toLowerCase()))
      }),
      RUNS,
    )
  })

  it('idempotent: the list read back, joined again, reads as the same list', () => {
    fc.assert(
      fc.property(anyValue, (value) => {
        const codings = contentCodings(value)
        expect(contentCodings(codings.join(','))).toEqual(codings)
        expect(contentCodings(codings.join(' , '))).toEqual(codings)
      }),
      RUNS,
    )
  })

  it("agrees with undici's own reading of a non-empty value (what the proxy infers fetch decoded from)", () => {
    // undici (lib/web/fetch/index.js): `contentEncoding.toLowerCase().split(',')`, each `trim()`ed;
    // an empty value is no coding there, and one empty element here (the proxy reads it as unknown).
    const undici = (value: string) => value.toLowerCase().split(',').map((c) => c.trim())
    fc.assert(
      fc.property(anyValue, (value) => {
        fc.pre(value !== '')
        expect(contentCodings(value)).toEqual(undici(value))
      }),
      RUNS,
    )
    expect(contentCodings('')).toEqual([''])
  })

  it('an identity-only value reads as identity entries (and empty ones) only; one naming any other coding never does', () => {
    const identity = fc.array(fc.tuple(ows, fc.constantFrom('identity', 'Identity', 'IDENTITY', ''), ows), { minLength: 1, maxLength: 4 })
    fc.assert(
      fc.property(identity, fc.option(token.filter((t) => t.toLowerCase() !== 'identity'), { nil: undefined }), fc.nat(4), (elements, other, at) => {
        const parts = elements.map(([b, t, a]) => `${b}${t}${a}`)
        if (other !== undefined) parts.splice(at % (parts.length + 1), 0, other)
        const plain = contentCodings(parts.join(',')).every((c) => c === '' || c === 'identity')
        expect(plain).toBe(other === undefined)
      }),
      RUNS,
    )
  })
})
