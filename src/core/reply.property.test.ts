/**
 * Properties of the replies the dispatch layer writes itself (`reply.ts`), over generated input:
 *
 * - Every builder, on any input its signature allows (any strings, lone surrogates included; any
 *   numbers, NaN and infinities included), never throws and gives a JSON body that is a JSON-RPC
 *   2.0 error response as the module documents it: exactly `jsonrpc: "2.0"`, `id: null` and
 *   `error`, whose `code` is an integer in JSON-RPC's reserved range, `message` a non-empty
 *   string, `data` (when present) an object; `content-type: application/json`. Strings the
 *   caller gives (`requested`, `latest`, `version`) come back in `data` unchanged.
 * - With the numbers the pipeline passes (whole seconds, at least 1), `Retry-After` is that
 *   number of seconds, the same as `data.retryAfter`, and no header value holds CR or LF.
 * - `buildWwwAuthenticate`, for any URL as the WHATWG parser writes it (what the dispatcher
 *   passes: an origin, a base path and the metadata path), gives a value that a reference parser
 *   of RFC 9110 challenges (written here) reads as one `Bearer` challenge whose quoted
 *   `resource_metadata` is that URL, with `error="invalid_token"` exactly when asked; no CR or
 *   LF, nothing outside the bytes a header value may hold. `"` and `\` in the input are written
 *   as the URL parser writes them in an http(s) URL (`%22`, `/`), never left to end the quoted
 *   string.
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import {
  type Reply,
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
import { PROTECTED_RESOURCE_METADATA_PATH } from './metadata.js'

const RUNS = { numRuns: 500 }

/**
 * Any character: ASCII (controls included), any UTF-16 code unit (lone surrogates included), any
 * astral code point. Built by hand: fast-check's `binary` unit takes half a second to build.
 */
const anyChar = fc.oneof(
  fc.integer({ min: 0, max: 0x7f }).map((c) => String.fromCharCode(c)),
  fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)),
  fc.integer({ min: 0x10000, max: 0x10ffff }).map((c) => String.fromCodePoint(c)),
)
const anyString = fc.string({ unit: anyChar, maxLength: 40 })
const anyNumber = fc.oneof(fc.integer(), fc.double(), fc.constantFrom(Number.NaN, Number.POSITIVE_INFINITY, -0, 1e21))
/** What the pipeline passes for `retryAfter`: whole seconds, at least 1. */
const seconds = fc.integer({ min: 1, max: 86_400 * 366 })
const windowType = fc.constantFrom('second', 'minute', 'hour', 'day')

/**
 * An http(s) origin: DNS names (any case, IDN labels), IPv4 and IPv6 literals, any port. Built by
 * hand: fast-check's `webUrl` takes half a second to build.
 */
// No xn-- label, in any case: punycode that decodes to nothing (XN--0) is no host for Node 20's
// and 22's URL parser (Node 24 keeps it), and metadataUrl below parses the origin.
const label = fc.stringMatching(/^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,10}[a-zA-Z0-9])?$/).filter((l) => !/^xn--/i.test(l))
const host = fc.oneof(
  { weight: 4, arbitrary: fc.tuple(fc.array(label, { minLength: 1, maxLength: 3 }), fc.constantFrom('example', 'EXAMPLE', 'com', 'b\u00fccher', '\u4f8b\u3048')).map(([ls, tld]) => [...ls, tld].join('.')) },
  fc.ipV4(),
  fc.ipV6().map((a) => `[${a}]`),
  fc.constant('localhost'),
)
const origin = fc
  .tuple(fc.constantFrom('http', 'https', 'HTTPS'), host, fc.option(fc.integer({ min: 0, max: 65535 }), { nil: undefined }))
  .map(([scheme, h, port]) => `${scheme}://${h}${port === undefined ? '' : `:${port}`}`)

interface Envelope {
  jsonrpc: unknown
  id: unknown
  error: { code: unknown; message: unknown; data?: unknown }
}

/** Checks the JSON-RPC 2.0 error envelope of a reply, and gives its parsed body. */
function envelope(reply: Reply): Envelope {
  expect(Number.isInteger(reply.status)).toBe(true)
  expect(reply.headers['content-type']).toBe('application/json')
  expect(typeof reply.body).toBe('string')
  const body = JSON.parse(reply.body!) as Envelope
  expect(Object.keys(body).sort()).toEqual(['error', 'id', 'jsonrpc'])
  expect(body.jsonrpc).toBe('2.0')
  expect(body.id).toBeNull()
  expect(Object.keys(body.error).every((key) => key === 'code' || key === 'message' || key === 'data')).toBe(true)
  expect(Number.isInteger(body.error.code)).toBe(true)
  expect(typeof body.error.message).toBe('string')
  expect((body.error.message as string).length).toBeGreaterThan(0)
  if ('data' in body.error) {
    expect(typeof body.error.data).toBe('object')
    expect(body.error.data).not.toBeNull()
    expect(Array.isArray(body.error.data)).toBe(false)
  }
  return body
}
/** JSON-RPC 2.0's reserved range (pre-defined and implementation-defined server errors). */
const expectReservedCode = (body: Envelope) => {
  expect(body.error.code).toBeGreaterThanOrEqual(-32768)
  expect(body.error.code).toBeLessThanOrEqual(-32000)
}
const expectHeaderSafe = (reply: Reply) => {
  for (const value of Object.values(reply.headers)) expect(value).not.toMatch(/[\r\n]/)
}

/** A builder of the module, called on generated arguments. */
const builtReply: fc.Arbitrary<{ name: string; reply: Reply; strings: Record<string, unknown> }> = fc.oneof(
  fc
    .tuple(fc.boolean(), origin.map((o) => `${o}${PROTECTED_RESOURCE_METADATA_PATH}`))
    .map(([invalidToken, url]) => ({ name: 'unauthorized', reply: unauthorizedReply({ resourceMetadataUrl: url, invalidToken }), strings: {} })),
  fc
    .tuple(anyString, fc.option(anyString, { nil: null }))
    .map(([requested, latest]) => ({ name: 'versionNotFound', reply: versionNotFoundReply(requested, latest), strings: { requested, latest } })),
  anyString.map((version) => ({ name: 'versionNotServed', reply: versionNotServedReply(version), strings: { version } })),
  fc.constantFrom('GET, POST, DELETE', 'POST', 'GET, HEAD, OPTIONS').map((allow) => ({ name: 'methodNotAllowed', reply: methodNotAllowedReply(allow), strings: {} })),
  fc
    .tuple(anyNumber, anyNumber, anyNumber, anyString)
    .map(([limit, resetAt, retryAfter, w]) => ({ name: 'rateLimited', reply: rateLimitedReply({ limit, resetAt, retryAfter, windowType: w }), strings: { windowType: w } })),
  anyNumber.map((retryAfter) => ({ name: 'authorizationServerUnavailable', reply: authorizationServerUnavailableReply(retryAfter), strings: {} })),
  fc.option(anyNumber, { nil: undefined }).map((retryAfter) => ({ name: 'serviceUnavailable', reply: serviceUnavailableReply(retryAfter), strings: {} })),
  fc
    .constantFrom(
      paymentRequiredReply,
      forbiddenReply,
      ipNotAllowedReply,
      originNotAllowedReply,
      notFoundReply,
      sessionNotFoundReply,
      invalidHostReply,
      contentLengthMismatchReply,
    )
    .map((build) => ({ name: build.name, reply: build(), strings: {} })),
)

describe('reply builders, property-based', () => {
  it('every builder, on any input, gives a JSON-RPC 2.0 error body with id null, an integer reserved code and a message', () => {
    const names = new Map<string, number>()
    fc.assert(
      fc.property(builtReply, ({ name, reply, strings }) => {
        const body = envelope(reply)
        expectReservedCode(body)
        expect(reply.status).toBeGreaterThanOrEqual(400)
        expect(reply.status).toBeLessThanOrEqual(599)
        // The caller's strings come back unchanged, lone surrogates included.
        const data = (body.error.data ?? {}) as Record<string, unknown>
        for (const [key, value] of Object.entries(strings)) expect(data[key]).toBe(value)
        names.set(name, (names.get(name) ?? 0) + 1)
      }),
      RUNS,
    )
    // Each builder reached (about 60 times each; the 9 constant replies share one family's share).
    const constants = [...names].filter(([name]) => name.endsWith('Reply'))
    expect(names.size - constants.length).toBe(7)
    for (const [name, count] of names) if (!name.endsWith('Reply')) expect(count, name).toBeGreaterThanOrEqual(20)
    expect(constants.reduce((sum, [, count]) => sum + count, 0)).toBeGreaterThanOrEqual(20)
  })

  it('the constant replies, each once: the same envelope, and frozen (shared between requests)', () => {
    const constants = [paymentRequiredReply, forbiddenReply, ipNotAllowedReply, originNotAllowedReply, notFoundReply, sessionNotFoundReply, contentLengthMismatchReply]
    for (const build of [...constants, invalidHostReply]) expectReservedCode(envelope(build()))
    for (const build of constants) {
      expect(Object.isFrozen(build()), build.name).toBe(true)
      expect(Object.isFrozen(build().headers), build.name).toBe(true)
    }
  })

  it('jsonRpcErrorReply keeps the status, the error object and the extra headers it is given', () => {
    const errorObject = fc.record(
      {
        code: fc.integer({ min: -32768, max: 32767 }),
        message: anyString.filter((m) => m.length > 0),
        data: fc.dictionary(anyString.filter((k) => k !== '__proto__'), fc.jsonValue({ maxDepth: 2 }).map((v) => JSON.parse(JSON.stringify(v)) as unknown), { maxKeys: 4 }),
      },
      { requiredKeys: ['code', 'message'] },
    )
    const extra = fc.option(fc.dictionary(fc.stringMatching(/^[a-z][a-z-]{0,15}$/), fc.stringMatching(/^[ -~]{0,20}$/), { maxKeys: 3 }), { nil: undefined })
    fc.assert(
      fc.property(fc.integer({ min: 400, max: 599 }), errorObject, extra, (status, error, headers) => {
        const reply = jsonRpcErrorReply(status, error, headers)
        const body = envelope(reply)
        expect(reply.status).toBe(status)
        expect(body.error).toEqual(error)
        for (const [name, value] of Object.entries(headers ?? {})) expect(reply.headers[name]).toBe(value)
      }),
      RUNS,
    )
  })

  it('Retry-After is the whole seconds given, the same as data.retryAfter, and no header holds CR or LF', () => {
    fc.assert(
      fc.property(seconds, fc.integer({ min: 0, max: 999_999_999_999_999 }), fc.integer({ min: 0, max: 2 ** 40 }), windowType, (retryAfter, limit, resetAt, w) => {
        const replies = [
          rateLimitedReply({ limit, resetAt, retryAfter, windowType: w }, { ratelimit: `"${w}";r=0;t=${retryAfter}` }),
          authorizationServerUnavailableReply(retryAfter),
          serviceUnavailableReply(retryAfter),
        ]
        for (const reply of replies) {
          const data = envelope(reply).error.data as { retryAfter: unknown }
          expect(reply.headers['retry-after']).toBe(String(retryAfter))
          expect(reply.headers['retry-after']).toMatch(/^[1-9][0-9]*$/)
          expect(data.retryAfter).toBe(retryAfter)
          expectHeaderSafe(reply)
        }
        expect(JSON.parse(replies[0]!.body!).error.data).toEqual({ limit, resetAt, retryAfter, windowType: w })
      }),
      RUNS,
    )
    expect(serviceUnavailableReply().headers['retry-after']).toBe('1')
  })

  it('whatever number a store or validator of the platform hands over (a fraction, 0, negative, NaN, an infinity, 2^53 and past, 1e21): Retry-After is delay-seconds, digits only from 1, rounded up, the same as data.retryAfter', () => {
    const odd = fc.oneof(
      anyNumber,
      fc.double({ min: -5, max: 5 }),
      fc.constantFrom(Number.NEGATIVE_INFINITY, Number.MAX_VALUE, Number.MIN_VALUE, 2 ** 53 - 1, 2 ** 53, 2 ** 53 + 2, 0.5, 1.000001, 59.0001),
    )
    fc.assert(
      fc.property(odd, windowType, (retryAfter, w) => {
        for (const reply of [rateLimitedReply({ limit: 10, resetAt: 0, retryAfter, windowType: w }), authorizationServerUnavailableReply(retryAfter), serviceUnavailableReply(retryAfter)]) {
          const header = reply.headers['retry-after']!
          // RFC 9110 section 10.2.3: delay-seconds = 1*DIGIT; never 0 (the spec: at least 1), never an exponent.
          expect(header).toMatch(/^[1-9][0-9]*$/)
          expect(Number.isSafeInteger(Number(header))).toBe(true)
          expect((envelope(reply).error.data as { retryAfter: unknown }).retryAfter).toBe(Number(header))
          if (retryAfter > 1 && retryAfter <= Number.MAX_SAFE_INTEGER) expect(Number(header)).toBe(Math.ceil(retryAfter))
          else expect(header).toBe('1')
        }
      }),
      RUNS,
    )
  })
})

/** RFC 9110 tchar, and a reference parser of one challenge: `scheme [ 1*SP #auth-param ]`, quoted-strings by the grammar. */
const TCHAR = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
function parseChallenge(text: string): { scheme: string; params: [string, string][] } | null {
  let i = 0
  const token = () => {
    const start = i
    while (i < text.length && TCHAR.includes(text[i]!)) i++
    return text.slice(start, i)
  }
  const ows = () => {
    while (text[i] === ' ' || text[i] === '\t') i++
  }
  const scheme = token()
  if (scheme === '') return null
  const params: [string, string][] = []
  if (i === text.length) return { scheme, params }
  if (text[i] !== ' ') return null
  while (text[i] === ' ') i++
  for (;;) {
    const name = token()
    if (name === '') return null
    ows()
    if (text[i++] !== '=') return null
    ows()
    let value = ''
    if (text[i] === '"') {
      i++
      for (;;) {
        if (i >= text.length) return null
        const c = text[i]!
        const code = c.charCodeAt(0)
        if (c === '"') break
        if (c === '\\') {
          const next = text.charCodeAt(i + 1)
          // quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
          if (!(next === 9 || (next >= 0x20 && next <= 0x7e) || (next >= 0x80 && next <= 0xff))) return null
          value += text[i + 1]
          i += 2
          continue
        }
        // qdtext = HTAB / SP / %x21 / %x23-5B / %x5D-7E / obs-text
        if (!(code === 9 || (code >= 0x20 && code <= 0x7e) || (code >= 0x80 && code <= 0xff))) return null
        value += c
        i++
      }
      i++
    } else {
      value = token()
      if (value === '') return null
    }
    params.push([name.toLowerCase(), value])
    ows()
    if (i === text.length) return { scheme, params }
    if (text[i++] !== ',') return null
    ows()
  }
}

/** URLs as the dispatcher builds them: an origin (any host the WHATWG parser takes), a base path, the metadata path. */
const pathChar = fc.constantFrom('a', 'Z', '0', '-', '.', '_', '~', '%', ' ', '"', '\\', '<', '>', '`', '{', '}', '|', '^', "'", '\u00e9', '\u4e2d', '\ud83d\ude00', '?', '#', ';', '=', ',')
const metadataUrl = fc
  .tuple(
    fc.oneof(origin, fc.constantFrom('http://localhost:3000', 'https://[::1]:8443', 'https://b\u00fccher.example', 'HTTPS://App.Example.COM:443')),
    fc.array(fc.string({ unit: pathChar, minLength: 1, maxLength: 6 }), { maxLength: 3 }),
  )
  .map(([origin, segments]) => {
    const base = new URL(origin)
    const url = new URL(base.origin)
    url.pathname = `${segments.map((s) => `/${s}`).join('')}${PROTECTED_RESOURCE_METADATA_PATH}`
    return url.href
  })

describe('buildWwwAuthenticate, property-based', () => {
  it('reads back as one Bearer challenge naming the URL, with error="invalid_token" exactly when asked; a valid header value', () => {
    let percentEncoded = 0
    fc.assert(
      fc.property(metadataUrl, fc.option(fc.boolean(), { nil: undefined }), (url, invalidToken) => {
        const value = buildWwwAuthenticate({ resourceMetadataUrl: url, invalidToken })
        // Field-value bytes only (RFC 9110 section 5.5): no CR, LF, NUL or other controls, nothing past 0xFF.
        expect(value).toMatch(/^[\t\x20-\x7e\x80-\xff]*$/)
        const challenge = parseChallenge(value)
        expect(challenge).not.toBeNull()
        expect(challenge!.scheme).toBe('Bearer')
        expect(challenge!.params).toEqual(invalidToken ? [['resource_metadata', url], ['error', 'invalid_token']] : [['resource_metadata', url]])
        if (url.includes('%')) percentEncoded++
      }),
      RUNS,
    )
    expect(percentEncoded).toBeGreaterThanOrEqual(50)
  })

  it('any string, controls and characters past ASCII included: a value of printable ASCII, the rest percent-encoded (regression: passed through)', () => {
    expect(buildWwwAuthenticate({ resourceMetadataUrl: 'https://\u4e2d.example/\r\n\ud800' })).toBe('Bearer resource_metadata="https://%E4%B8%AD.example/%0D%0A%EF%BF%BD"')
    let encoded = 0
    fc.assert(
      fc.property(fc.string({ unit: fc.oneof(fc.constantFrom('a', '/', ' ', '\t', '"', '\\', '%'), fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)), fc.integer({ min: 0x10000, max: 0x10ffff }).map((c) => String.fromCodePoint(c))), maxLength: 20 }), (url) => {
        const value = buildWwwAuthenticate({ resourceMetadataUrl: url, invalidToken: true })
        expect(value).toMatch(/^[\t\x20-\x7e]*$/)
        const challenge = parseChallenge(value)
        expect(challenge).not.toBeNull()
        const kept = url.replace(/"/g, '%22').replace(/\\/g, '/')
        // Each code point kept, or its UTF-8 bytes escaped (a lone surrogate as U+FFFD's).
        const utf8 = new TextEncoder()
        const expected = [...kept]
          .map((c) => (/^[\t\x20-\x7e]$/.test(c) ? c : [...utf8.encode(c)].map((b) => `%${b.toString(16).toUpperCase().padStart(2, '0')}`).join('')))
          .join('')
        expect(challenge!.params[0]![1]).toBe(expected)
        if (/[^\t\x20-\x7e]/.test(kept)) encoded++
      }),
      RUNS,
    )
    expect(encoded).toBeGreaterThanOrEqual(100)
  })

  it('any string: the quoted string is never broken out of, and holds the input with its quotes as %22 and backslashes as /', () => {
    let brokenOut = 0
    fc.assert(
      fc.property(
        fc.oneof(
          fc.string({ unit: fc.constantFrom('"', '\\', ',', ' ', 'a', '=', 'error="invalid_token"', '\\"'), maxLength: 12 }),
          // Printable ASCII and HTAB: what a quoted string may hold, once quotes and backslashes are rewritten.
          fc.string({ unit: 'binary-ascii', maxLength: 40 }).map((s) => [...s].filter((c) => c === '\t' || (c >= ' ' && c <= '~')).join('')),
        ),
        fc.boolean(),
        (url, invalidToken) => {
          const challenge = parseChallenge(buildWwwAuthenticate({ resourceMetadataUrl: url, invalidToken }))
          expect(challenge).not.toBeNull()
          const expected = [...url].map((c) => (c === '"' ? '%22' : c === '\\' ? '/' : c)).join('')
          expect(challenge!.params).toEqual(invalidToken ? [['resource_metadata', expected], ['error', 'invalid_token']] : [['resource_metadata', expected]])
          if (url.includes('"')) brokenOut++
        },
      ),
      RUNS,
    )
    expect(brokenOut).toBeGreaterThanOrEqual(50)
  })
})
