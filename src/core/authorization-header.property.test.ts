import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { MAX_BEARER_LENGTH, parseBearerToken } from './authorization-header.js'

const RUNS = { numRuns: 1000 }
const B64TOKEN = /^[A-Za-z0-9\-._~+/]+=*$/

const anyHeader = fc.oneof(
  fc.string({ unit: 'binary', maxLength: 100 }),
  fc.string({ unit: 'binary-ascii', maxLength: 100 }),
  fc.string({ unit: 'binary', maxLength: 100 }).map((s) => `Bearer ${s}`),
  fc.string({ unit: 'binary-ascii', maxLength: 100 }).map((s) => `bEaReR ${s}`),
  fc.string({ unit: fc.constantFrom('B', 'e', 'a', 'r', ' ', '=', 'x', '\t', '\u0000', '\u00e9'), maxLength: 30 }),
)
const b64token = fc.stringMatching(/^[A-Za-z0-9\-._~+/]{1,200}={0,3}$/)

describe('Authorization header, property-based', () => {
  it('arbitrary headers never throw and give a consistent kind', () => {
    fc.assert(
      fc.property(anyHeader, (header) => {
        const result = parseBearerToken(header)
        expect(['missing', 'invalid', 'bearer']).toContain(result.kind)
        expect(result.kind === 'missing').toBe(header === '')
        if (result.kind === 'bearer') {
          expect(header.slice(0, 7).toLowerCase()).toBe('bearer ')
          expect(result.token.length).toBeGreaterThan(0)
          expect(result.token.length).toBeLessThanOrEqual(MAX_BEARER_LENGTH)
          expect(result.token).toMatch(B64TOKEN)
          expect(header.trimEnd().endsWith(result.token)).toBe(true)
          expect(header.slice(7).trim()).toBe(result.token)
        }
      }),
      RUNS,
    )
  })

  it('"Bearer <b64token>" round-trips, whatever the scheme case and spacing', () => {
    fc.assert(
      fc.property(
        b64token,
        fc.constantFrom('Bearer', 'bearer', 'BEARER', 'bEARER'),
        fc.nat(3),
        fc.nat(3),
        (token, scheme, before, after) => {
          const header = `${scheme} ${' '.repeat(before)}${token}${' '.repeat(after)}`
          expect(parseBearerToken(header)).toEqual({ kind: 'bearer', token })
        },
      ),
      RUNS,
    )
  })

  it('any other scheme is invalid', () => {
    fc.assert(
      fc.property(fc.stringMatching(/^[A-Za-z]{1,10}$/), b64token, (scheme, token) => {
        fc.pre(scheme.toLowerCase() !== 'bearer')
        expect(parseBearerToken(`${scheme} ${token}`)).toEqual({ kind: 'invalid' })
      }),
      RUNS,
    )
  })

  it('missing only for null, undefined and the empty string', () => {
    expect(parseBearerToken(null).kind).toBe('missing')
    expect(parseBearerToken(undefined).kind).toBe('missing')
  })
})
