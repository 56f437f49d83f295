import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { headerValue, mergeExposeHeaders, mergeVary, sameName, stampHead } from './head.js'
import { splitUrl } from './shared.js'

const RUNS = { numRuns: 500 }

/** Changes the case of some letters of a header name. */
const recased = (name: string) =>
  fc.array(fc.boolean(), { minLength: name.length, maxLength: name.length }).map((upper) =>
    [...name].map((c, i) => (upper[i] ? c.toUpperCase() : c)).join(''),
  )

const DISPATCH_NAMES = ['x-mcp-version', 'x-mcp-latest-version', 'ratelimit', 'ratelimit-policy', 'access-control-allow-origin', 'vary']
const stamped = fc
  .subarray(DISPATCH_NAMES, { minLength: 1 })
  .chain((names) => fc.tuple(...names.map((name) => fc.string({ maxLength: 12 }).map((value) => [name, value] as const))))
  .map((entries) => Object.fromEntries(entries) as Record<string, string>)

/** Handler header names: its own, case variants of the dispatch names and of Mcp-Session-Id. */
const handlerName = fc.oneof(
  fc.constantFrom('content-type', 'Content-Length', 'cache-control', 'X-Custom', 'set-cookie'),
  fc.constantFrom(...DISPATCH_NAMES, 'mcp-session-id').chain(recased),
  fc.stringMatching(/^[a-zA-Z][a-zA-Z0-9-]{0,15}$/),
)
const handlerValue = fc.oneof(fc.string({ maxLength: 12 }), fc.integer(), fc.array(fc.string({ maxLength: 6 }), { maxLength: 3 }))

const lower = (name: string) => name.toLowerCase()

/** Name-value pairs of a `writeHead` header argument (object, flat array or array of pairs). */
function pairsOf(headers: unknown): [string, unknown][] {
  if (!Array.isArray(headers)) return Object.entries(headers as Record<string, unknown>)
  if (headers.length > 0 && Array.isArray(headers[0])) return (headers as [string, unknown][]).map(([n, v]) => [n, v])
  const pairs: [string, unknown][] = []
  for (let i = 0; i < headers.length; i += 2) pairs.push([String(headers[i]), headers[i + 1]])
  return pairs
}

/** What every form must give: the dispatch headers once each, with their values; the handler's others untouched. */
function checkStamped(handler: [string, unknown][], dispatch: Record<string, string>, result: ReturnType<typeof stampHead>) {
  const out = pairsOf(result.headers)
  const dispatchNames = new Set(Object.keys(dispatch))
  for (const [name, value] of Object.entries(dispatch)) {
    const matches = out.filter(([n]) => lower(n) === name)
    expect(matches).toEqual([[name, value]])
  }
  const kept = handler.filter(([n]) => !dispatchNames.has(lower(n)))
  expect(out.filter(([n]) => !dispatchNames.has(lower(n)))).toEqual(kept)
  const session = kept.find(([n]) => lower(n) === 'mcp-session-id')
  expect(result.sessionId).toBe(session === undefined ? undefined : headerValue(session[1]))
}

describe('stampHead, property-based', () => {
  it('object headers: the dispatch headers win once each, every other handler header stays, the input is not changed', () => {
    fc.assert(
      fc.property(fc.dictionary(handlerName, handlerValue, { maxKeys: 8 }), stamped, (handler, dispatch) => {
        const before = structuredClone(handler)
        const result = stampHead(handler, dispatch)
        expect(handler).toEqual(before)
        expect(result.headers).not.toBe(handler)
        checkStamped(Object.entries(handler), dispatch, result)
      }),
      RUNS,
    )
  })

  it('array headers, flat or in pairs: the same, in the handler order', () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(handlerName, handlerValue), { maxLength: 8 }), stamped, fc.boolean(), (pairs, dispatch, flat) => {
        const handler = flat ? pairs.flat() : pairs.map(([n, v]) => [n, v])
        const before = structuredClone(handler)
        const result = stampHead(handler, dispatch)
        expect(handler).toEqual(before)
        checkStamped(pairs, dispatch, result)
      }),
      RUNS,
    )
  })

  it('no handler headers: the dispatch headers alone', () => {
    fc.assert(
      fc.property(fc.constantFrom(undefined, null, 'text', 42), stamped, (handler, dispatch) => {
        expect(stampHead(handler, dispatch)).toEqual({ headers: dispatch, sessionId: undefined })
      }),
      RUNS,
    )
  })
})

describe('splitUrl, property-based', () => {
  const scheme = fc.constantFrom('http', 'https')
  const host = fc.oneof(fc.domain(), fc.ipV4(), fc.ipV6().map((a) => `[${a}]`), fc.tuple(fc.domain(), fc.integer({ min: 1, max: 65535 })).map(([d, p]) => `${d}:${p}`))
  const path = fc.oneof(fc.constant(''), fc.webPath().filter((p) => !p.includes('?') && !p.includes('#')))
  const query = fc.option(fc.webQueryParameters().map((q) => `?${q}`), { nil: '' })
  const fragment = fc.option(fc.webFragments().map((f) => `#${f}`), { nil: '' })

  it('splits scheme://host/path?query#fragment into its origin and path, a missing path being "/"', () => {
    fc.assert(
      fc.property(scheme, host, path, query, fragment, (s, h, p, q, f) => {
        expect(splitUrl(`${s}://${h}${p}${q}${f}`)).toEqual({ origin: `${s}://${h}`, path: p === '' ? '/' : p })
      }),
      RUNS,
    )
  })

  it('never throws: the origin is a prefix of the URL, the path starts with "/" and holds no query or fragment', () => {
    fc.assert(
      fc.property(fc.oneof(fc.webUrl({ withQueryParameters: true, withFragments: true }), fc.string({ unit: 'binary', maxLength: 60 })), (url) => {
        const { origin, path } = splitUrl(url)
        expect(url.startsWith(origin)).toBe(true)
        expect(path.startsWith('/')).toBe(true)
        expect(path).not.toMatch(/[?#]/)
        if (path !== '/' || url.slice(origin.length).startsWith('/')) expect(url.slice(origin.length).startsWith(path)).toBe(true)
      }),
      RUNS,
    )
  })
})

describe('mergeVary', () => {
  const token = fc.constantFrom('Origin', 'origin', 'Accept-Encoding', 'accept-encoding', 'Accept', 'Cookie', 'X-Custom')
  const list = fc.array(token, { maxLength: 5 }).map((names) => names.join(', '))

  it('joins every field name once, case-insensitively, in order of first appearance; * alone wins', () => {
    fc.assert(
      fc.property(fc.array(fc.option(list, { nil: undefined }), { maxLength: 4 }), (values) => {
        const merged = mergeVary(...values)
        const names = merged === '' ? [] : merged.split(', ')
        const lower = names.map((n) => n.toLowerCase())
        expect(new Set(lower).size).toBe(lower.length)
        const wanted = [...new Set(values.flatMap((v) => (v ? v.split(', ') : [])).map((n) => n.toLowerCase()))]
        expect(lower).toEqual(wanted)
      }),
      RUNS,
    )
    expect(mergeVary('Accept-Encoding', 'Origin')).toBe('Accept-Encoding, Origin')
    expect(mergeVary(['Accept', 'Origin'], 'origin')).toBe('Accept, Origin')
    expect(mergeVary('Accept', '*', 'Origin')).toBe('*')
    expect(mergeVary(undefined, null, ' , ')).toBe('')
  })
})

describe('mergeExposeHeaders', () => {
  const token = fc.constantFrom('X-Request-Id', 'x-request-id', 'Mcp-Session-Id', 'WWW-Authenticate', '*', 'X-Custom')
  const list = fc.array(token, { maxLength: 5 }).map((names) => names.join(', '))

  it('joins every field name once, case-insensitively, in order of first appearance; * stays one name', () => {
    fc.assert(
      fc.property(fc.array(fc.option(list, { nil: undefined }), { maxLength: 4 }), (values) => {
        const merged = mergeExposeHeaders(...values)
        const lower = (merged === '' ? [] : merged.split(', ')).map((n) => n.toLowerCase())
        const wanted = [...new Set(values.flatMap((v) => (v ? v.split(', ') : [])).map((n) => n.toLowerCase()))]
        expect(lower).toEqual(wanted)
      }),
      RUNS,
    )
    // A wildcard covers requests without credentials only: the names stay for the others.
    expect(mergeExposeHeaders('*', 'Mcp-Session-Id, X-MCP-Version')).toBe('*, Mcp-Session-Id, X-MCP-Version')
    expect(mergeExposeHeaders(['X-Request-Id', 'mcp-session-id'], 'Mcp-Session-Id')).toBe('X-Request-Id, mcp-session-id')
  })
})

describe('sameName', () => {
  const NAMES = ['mcp-session-id', 'content-length', 'host', 'authorization']

  it('is lower-casing and comparing, for every field name (ASCII)', () => {
    const name = fc.oneof(fc.constantFrom(...NAMES).chain(recased), fc.stringMatching(/^[!#$%&'*+.^_`|~0-9A-Za-z-]{0,16}$/))
    fc.assert(
      fc.property(name, fc.constantFrom(...NAMES), (a, wanted) => {
        expect(sameName(a, wanted)).toBe(a.toLowerCase() === wanted)
      }),
      RUNS,
    )
  })

  it('folds ASCII letters only: no other character is taken for one of a name', () => {
    // U+212A KELVIN SIGN lower-cases to "k", but is no character of a field name (RFC 9110
    // section 5.1): a name holding it names no field.
    expect('\u212Aeep-alive'.toLowerCase()).toBe('keep-alive')
    expect(sameName('\u212Aeep-alive', 'keep-alive')).toBe(false)
    expect(sameName('HOST', 'host')).toBe(true)
    expect(sameName('h0st', 'host')).toBe(false)
    // "@" (64) and "[" (91) sit beside the capitals: no case of a letter.
    expect(sameName('@', '`')).toBe(false)
    expect(sameName('[', '{')).toBe(false)
  })
})
