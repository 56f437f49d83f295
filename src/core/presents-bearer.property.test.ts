/**
 * Properties of `presentsBearer`: whether an `Authorization` value (one field, or several joined
 * with `, ` as fetch's `Headers.get` joins them) presents a `Bearer` credential, well formed or
 * not, even an empty one. That is what tells a refused bearer token (`error="invalid_token"`)
 * from another scheme, which presented none.
 *
 * - Fields are generated as structures (a scheme: `Bearer` in any case, or another scheme,
 *   look-alikes such as `Bearerx`, `Bear`, `X-Bearer`, `Bearer=`; then nothing, a b64token or
 *   anything but a comma or a quote after whitespace) and joined with commas and optional whitespace. The
 *   answer must be whether one field's scheme is `bearer`, compared case-insensitively.
 * - On any string, the answer is a reference written without a regular expression: split on
 *   commas outside quoted strings (a `"` opens one, the next unescaped `"` closes it, a `\`
 *   inside escapes the next character; one never closed runs to the end); some piece, after
 *   leading whitespace (ECMAScript's white space and line terminators), starts with the six
 *   letters `bearer` in any ASCII case, followed by the end of the piece or whitespace. Never
 *   throws; `null` and `undefined` present nothing.
 * - Fields of other schemes whose auth-param values are quoted strings holding commas and
 *   `Bearer` present none (regression: `Digest username="a, Bearer b"` counted as one).
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { parseBearerToken, presentsBearer } from './authorization-header.js'

const RUNS = { numRuns: 1000 }

/** ECMAScript WhiteSpace and LineTerminator (what `\s` and `trim` know), written out. */
const WHITESPACE = '\t\n\v\f\r \u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000\ufeff'
const isSpace = (c: string | undefined) => c !== undefined && c.length === 1 && WHITESPACE.includes(c)
const asciiLower = (text: string) => text.replace(/[A-Z]/g, (c) => String.fromCharCode(c.charCodeAt(0) + 32))

/** The comma-separated pieces of `header`, quoted strings kept whole. */
function pieces(header: string): string[] {
  const out: string[] = []
  let piece = ''
  let state: 'plain' | 'quoted' | 'escaped' = 'plain'
  for (const c of header.split('')) {
    if (state === 'escaped') state = 'quoted'
    else if (state === 'quoted') state = c === '\\' ? 'escaped' : c === '"' ? 'plain' : 'quoted'
    else if (c === '"') state = 'quoted'
    else if (c === ',') {
      out.push(piece)
      piece = ''
      continue
    }
    piece += c
  }
  return [...out, piece]
}

/** The lexical reference model, on any string. */
function presentsBearerModel(header: string | null | undefined): boolean {
  if (header === null || header === undefined) return false
  return pieces(header).some((piece) => {
    let i = 0
    while (isSpace(piece[i])) i++
    return asciiLower(piece.slice(i, i + 6)) === 'bearer' && (i + 6 === piece.length || isSpace(piece[i + 6]))
  })
}

/**
 * Any character: ASCII (controls included), any UTF-16 code unit (lone surrogates included), any
 * astral code point. Built by hand: fast-check's `binary` unit takes half a second to build.
 */
const anyChar = fc.oneof(
  fc.integer({ min: 0, max: 0x7f }).map((c) => String.fromCharCode(c)),
  fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)),
  fc.integer({ min: 0x10000, max: 0x10ffff }).map((c) => String.fromCodePoint(c)),
)
/** Strings made of what matters here: the scheme's letters in both cases, commas, every kind of whitespace, look-alikes. */
const soup = fc.string({
  unit: fc.oneof(
    { weight: 2, arbitrary: fc.constantFrom('bearer', 'Bearer', 'BEARER', 'bEaReR') },
    { weight: 3, arbitrary: fc.constantFrom(',', ',', ' ', '\t', '\n', '\u00a0', '\u3000', '\ufeff', '\u200b') },
    { weight: 1, arbitrary: fc.constantFrom('b', 'e', 'a', 'r', 'R', '\u0000', '=', 'x', '\u017f', '\u0131', '"', '\\') },
  ),
  maxLength: 10,
})
const anyHeader = fc.oneof(
  fc.string({ unit: anyChar, maxLength: 80 }),
  fc.string({ unit: 'binary-ascii', maxLength: 80 }),
  { weight: 3, arbitrary: soup },
  { weight: 2, arbitrary: soup.map((s) => `Basic x,${s}`) },
)

/** One `Authorization` field: the scheme it presents, and its text. */
interface Field {
  readonly scheme: string
  readonly text: string
}
const bearerScheme = fc.constantFrom('Bearer', 'bearer', 'BEARER', 'bEaReR')
const otherScheme = fc.constantFrom('Basic', 'DPoP', 'Digest', 'Negotiate', 'Bearerx', 'Bear', 'X-Bearer', 'Bearer!', 'Bearer.', 'Bearer=', 'Bearer:', 'Bearer_', 'Bearer\u200b')
const b64token = fc.stringMatching(/^[A-Za-z0-9\-._~+/]{1,40}={0,2}$/)
/** What follows the scheme: nothing, whitespace, a b64token, or anything without a comma or a quote. */
const credentials = fc.oneof(
  fc.constant(''),
  fc.constantFrom(' ', '  ', '\t'),
  b64token.map((t) => ` ${t}`),
  // (No quote either: one would open a quoted string running over the next fields.)
  fc.tuple(fc.constantFrom(' ', '\t', '\n', '\u00a0'), fc.string({ unit: anyChar, maxLength: 20 }).map((s) => s.replace(/[,"]/g, ''))).map(([w, s]) => w + s),
)
const field: fc.Arbitrary<Field> = fc
  .tuple(fc.oneof(bearerScheme, otherScheme), credentials)
  .map(([scheme, rest]) => ({ scheme, text: scheme + rest }))
const separator = fc.constantFrom(', ', ',', ' , ', ',\t', ',  ')
const fields = fc.tuple(fc.constantFrom('', ' ', '\t'), fc.array(fc.tuple(field, separator), { minLength: 1, maxLength: 4 }))
const joined = ([lead, list]: [string, [Field, string][]]) => lead + list.map(([f], i) => (i === 0 ? '' : list[i - 1]![1]) + f.text).join('')

describe('presentsBearer, property-based', () => {
  it('joined Authorization fields present a Bearer credential exactly when one field has the Bearer scheme, in any case', () => {
    const seen = { yes: 0, no: 0, bearerNotFirst: 0, emptyBearer: 0, lookAlikeOnly: 0, malformedBearer: 0 }
    fc.assert(
      fc.property(fields, (parts) => {
        const header = joined(parts)
        const list = parts[1].map(([f]) => f)
        const want = list.some((f) => f.scheme.toLowerCase() === 'bearer')
        expect(presentsBearer(header)).toBe(want)
        if (want) seen.yes++
        else seen.no++
        if (want && list[0]!.scheme.toLowerCase() !== 'bearer') seen.bearerNotFirst++
        if (list.some((f) => f.scheme.toLowerCase() === 'bearer' && f.text.trim().length === 6)) seen.emptyBearer++
        if (!want && list.some((f) => f.scheme.toLowerCase().startsWith('bearer'))) seen.lookAlikeOnly++
        if (want && parseBearerToken(header).kind === 'invalid') seen.malformedBearer++
      }),
      RUNS,
    )
    // About 770 yes, 230 no, 260 Bearer not first, 500 empty, 160 look-alikes only.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(50)
  })

  it('on any string, never throws, and agrees with the lexical reference (comma-split pieces, leading whitespace, six letters, a boundary)', () => {
    const seen = { yes: 0, no: 0, bearerWithoutBoundary: 0, bearerAfterOtherText: 0, bearerAfterUnicodeSpace: 0 }
    fc.assert(
      fc.property(anyHeader, (header) => {
        const want = presentsBearerModel(header)
        expect(presentsBearer(header)).toBe(want)
        if (want) seen.yes++
        else seen.no++
        // The near misses: the word is there, but not at a piece's start or not followed by a boundary.
        if (!want && /bearer[^\s,]/i.test(header)) seen.bearerWithoutBoundary++
        else if (!want && /bearer/i.test(header)) seen.bearerAfterOtherText++
        if (want && /(^|,)[^,]*[\u00a0\u3000\ufeff\n][^,]*bearer/i.test(header)) seen.bearerAfterUnicodeSpace++
      }),
      RUNS,
    )
    // About 200 yes, 240 near misses with no boundary, 55 with text before the word, 100 after Unicode whitespace.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(name === 'bearerAfterOtherText' ? 15 : 40)
    expect(presentsBearer(null)).toBe(false)
    expect(presentsBearer(undefined)).toBe(false)
  })

  it('another scheme whose quoted auth-param values hold commas and Bearer presents none (regression)', () => {
    expect(presentsBearer('Digest username="a, Bearer b"')).toBe(false)
    expect(presentsBearer('Digest username="a\\", Bearer b"')).toBe(false)
    expect(presentsBearer('Digest username="a", Bearer b')).toBe(true)
    const quotedText = fc.string({ unit: fc.constantFrom('a', ' ', ',', 'Bearer', 'bearer', ', Bearer ', '\\"', '\\\\'), maxLength: 8 })
    fc.assert(
      fc.property(
        fc.constantFrom('Digest', 'Basic', 'DPoP', 'Newauth'),
        fc.array(fc.tuple(fc.constantFrom('username', 'realm', 'nonce', 'uri'), quotedText), { minLength: 1, maxLength: 3 }),
        fc.boolean(),
        (scheme, params, withBearer) => {
          const header = `${scheme} ${params.map(([name, value]) => `${name}="${value}"`).join(', ')}${withBearer ? ', Bearer x' : ''}`
          expect(presentsBearer(header)).toBe(withBearer)
        },
      ),
      RUNS,
    )
  })

  it('a header parseBearerToken reads as a bearer token always presents one', () => {
    fc.assert(
      fc.property(bearerScheme, b64token, fc.nat(3), (scheme, token, spaces) => {
        const header = `${scheme} ${' '.repeat(spaces)}${token}`
        expect(parseBearerToken(header).kind).toBe('bearer')
        expect(presentsBearer(header)).toBe(true)
      }),
      RUNS,
    )
  })
})
