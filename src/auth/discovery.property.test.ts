/**
 * Properties of the discovery helpers (`discovery.ts`) and of `normalizeResource`
 * (`jwt-claims.ts`), over generated issuers, documents and resource indicators:
 *
 * - Issuers are built as the validator takes them (absolute http(s), no query, no fragment):
 *   scheme in any case, DNS names in any case, IPv4 literals, default and other ports, paths with
 *   trailing slashes. For them `discoveryUrls` gives two absolute URLs on the issuer's origin, the
 *   OpenID Connect one at `{path}/.well-known/openid-configuration` and the RFC 8414 one at
 *   `/.well-known/oauth-authorization-server{path}` (the path without its trailing slashes), and
 *   `fallbackUserinfoEndpoint` an absolute URL on the same origin at `{path}/userinfo`. The
 *   expected origin and path come from the generated structure.
 * - On any string, `discoveryUrls` returns or throws a `TypeError` (an unparsable issuer), and
 *   `fallbackUserinfoEndpoint` never throws.
 * - `checkAuthorizationServerMetadata`, on any JSON value, never throws, and refuses (with a
 *   reason) exactly what a reference says: not an object, an `issuer` other than the expected
 *   one, or a `userinfo_endpoint` / `jwks_uri` / `introspection_endpoint` that is present and no
 *   absolute http(s) URL (values of known validity by construction).
 * - `normalizeResource` never throws; spellings of one http(s) URL (scheme and host case, an
 *   explicit default port, leading zeros in the port, an empty path) normalize to the same
 *   string, the one the structure says; the result is a fixed point; other strings are kept.
 *
 * Issuers the validator accepts although they end in a bare `?` or `#`, or in whitespace or a
 * control character, are kept out: for them the fallback userinfo endpoint is not at
 * `{path}/userinfo` (`https://as.example/t#` gives `https://as.example/t#/userinfo`).
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { checkAuthorizationServerMetadata, discoveryUrls, fallbackUserinfoEndpoint } from './discovery.js'
import { normalizeResource } from './jwt-claims.js'
import { createOAuthValidator } from './oauth-validator.js'
import { parseUrl } from '../core/url.js'

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

/** Changes the case of some letters. */
const recased = (text: string) =>
  fc.array(fc.boolean(), { minLength: text.length, maxLength: text.length }).map((upper) => [...text].map((c, i) => (upper[i] ? c.toUpperCase() : c)).join(''))

/** An http(s) URL as a structure: what it means, and how it is spelled. */
interface UrlParts {
  readonly scheme: 'http' | 'https'
  readonly host: string
  readonly port: number | undefined
  /** Segments of the path, `''` for the empty ones (`/a//b`). */
  readonly segments: readonly string[]
  readonly trailingSlashes: number
  readonly text: string
}
const DEFAULT_PORT = { http: 80, https: 443 } as const
// No xn-- label: that is punycode, and one that decodes to nothing (xn--a, xn--0) is no host for
// Node 20's and 22's URL parser (Node 24 keeps it as written), so the URLs of a known validity
// would not all be URLs (about one run of this file in ten failed on Node 20).
const label = fc.stringMatching(/^[a-z0-9](?:[a-z0-9-]{0,8}[a-z0-9])?$/).filter((l) => !l.startsWith('xn--'))
const dnsName = fc.tuple(fc.array(label, { minLength: 1, maxLength: 3 }), fc.constantFrom('example', 'com', 'test')).map(([ls, tld]) => [...ls, tld].join('.'))
const host = fc.oneof({ weight: 4, arbitrary: dnsName }, { weight: 1, arbitrary: fc.ipV4() }, { weight: 1, arbitrary: fc.constant('localhost') })
const segment = fc.oneof({ weight: 6, arbitrary: fc.stringMatching(/^[a-z0-9._~-]{1,8}$/).filter((s) => s !== '.' && s !== '..') }, { weight: 1, arbitrary: fc.constant('') })
const urlParts: fc.Arbitrary<UrlParts> = fc
  .record({
    scheme: fc.constantFrom('http', 'https') as fc.Arbitrary<'http' | 'https'>,
    host,
    port: fc.option(fc.oneof(fc.integer({ min: 1, max: 65535 }), fc.constantFrom(80, 443)), { nil: undefined, freq: 3 }),
    segments: fc.array(segment, { maxLength: 3 }),
    trailingSlashes: fc.constantFrom(0, 0, 1, 2),
    schemeCase: fc.boolean(),
    hostCase: fc.boolean(),
    portZeros: fc.constantFrom('', '', '0', '00'),
  })
  .chain((p) => {
    // Empty segments at the end would be trailing slashes, which the helpers strip: counted there.
    const segments = [...p.segments]
    while (segments.at(-1) === '') segments.pop()
    return fc.tuple(p.schemeCase ? recased(p.scheme) : fc.constant(p.scheme), p.hostCase ? recased(p.host) : fc.constant(p.host)).map(([scheme, h]) => ({
      scheme: p.scheme,
      host: p.host,
      port: p.port,
      segments,
      trailingSlashes: p.trailingSlashes,
      text: `${scheme}://${h}${p.port === undefined ? '' : `:${p.portZeros}${p.port}`}${segments.map((s) => `/${s}`).join('')}${'/'.repeat(p.trailingSlashes)}`,
    }))
  })
const originOf = (p: UrlParts) => `${p.scheme}://${p.host}${p.port === undefined || p.port === DEFAULT_PORT[p.scheme] ? '' : `:${p.port}`}`
const pathOf = (p: UrlParts) => p.segments.map((s) => `/${s}`).join('')

/** Any string: arbitrary, URL punctuation soup, or an http(s) URL with something odd after it. */
const anyText = fc.oneof(
  fc.string({ unit: anyChar, maxLength: 40 }),
  fc.string({ unit: fc.constantFrom('https://', 'http:', 'api://', '/', '//', 'a', '.', ':', '@', '?', '#', '[', ']', ' ', '%', '\\'), maxLength: 8 }),
  { weight: 2, arbitrary: fc.tuple(urlParts, fc.string({ unit: fc.constantFrom('?x', '#y', ' ', '\\a', '@b', '%41', '/..', '/./', ':', '\u00e9', '\t', '['), maxLength: 3 })).map(([p, tail]) => p.text + tail) },
)

describe('discoveryUrls and fallbackUserinfoEndpoint, property-based', () => {
  it('give absolute URLs on the issuer\'s origin, at the paths OpenID Connect Discovery and RFC 8414 name', () => {
    const seen = { withPath: 0, root: 0, trailingSlashes: 0, explicitPort: 0, defaultPort: 0, emptySegment: 0 }
    fc.assert(
      fc.property(urlParts, (p) => {
        const [oidc, rfc8414] = discoveryUrls(p.text)
        const path = pathOf(p)
        expect(oidc).toBe(`${originOf(p)}${path}/.well-known/openid-configuration`)
        expect(rfc8414).toBe(`${originOf(p)}/.well-known/oauth-authorization-server${path}`)
        const userinfo = fallbackUserinfoEndpoint(p.text)
        for (const url of [oidc, rfc8414, userinfo]) {
          expect(parseUrl(url)).toBeDefined()
          expect(new URL(url).origin).toBe(originOf(p))
        }
        expect(new URL(userinfo).pathname).toBe(`${path}/userinfo`)
        expect(new URL(userinfo).search + new URL(userinfo).hash).toBe('')

        if (path === '') seen.root++
        else seen.withPath++
        if (p.trailingSlashes > 0) seen.trailingSlashes++
        if (p.port !== undefined && p.port !== DEFAULT_PORT[p.scheme]) seen.explicitPort++
        if (p.port === DEFAULT_PORT[p.scheme]) seen.defaultPort++
        if (p.segments.includes('')) seen.emptySegment++
      }),
      RUNS,
    )
    // About 340 with a path, 160 without, 250 with trailing slashes, 260 other ports, 80 default ones, 45 empty segments.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(['defaultPort', 'emptySegment'].includes(name) ? 15 : 50)
  })

  it('on any string: discoveryUrls returns (absolute URLs for an http(s) URL) or throws a TypeError; fallbackUserinfoEndpoint never throws', () => {
    const seen = { threw: 0, httpReturned: 0 }
    fc.assert(
      fc.property(anyText, (issuer) => {
        try {
          const urls = discoveryUrls(issuer)
          expect(urls).toHaveLength(2)
          if (/^https?:\/\//i.test(issuer) && parseUrl(issuer) !== undefined) {
            for (const url of urls) expect(new URL(url).origin).toBe(new URL(issuer).origin)
            seen.httpReturned++
          }
        } catch (error) {
          expect(error).toBeInstanceOf(TypeError)
          seen.threw++
        }
        expect(typeof fallbackUserinfoEndpoint(issuer)).toBe('string')
      }),
      RUNS,
    )
    // About 250 thrown, 240 http(s) URLs answered.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(80)
  })
})

/** Endpoint field values whose validity is known by construction. */
const goodEndpoint = urlParts.map((p) => p.text)
const badEndpoint = fc.oneof(
  fc.constantFrom('/userinfo', 'userinfo', 'ftp://as.example/x', 'javascript:alert(1)', 'https://', 'http://', 'https://exa mple.com/', 'https://[::1/x', 'http://a.example:99999/', ' https://as.example/', 'https:as.example', 'wss://as.example/', ''),
  fc.oneof(fc.integer(), fc.boolean(), fc.constant(null), fc.array(goodEndpoint, { maxLength: 2 }), fc.dictionary(fc.string({ maxLength: 3 }), goodEndpoint, { maxKeys: 1 })),
)
const FIELDS = ['userinfo_endpoint', 'jwks_uri', 'introspection_endpoint'] as const
type Doc = { value: unknown; refused: boolean }
const issuerOf = urlParts.map((p) => p.text)
/** A document for `issuer`, and whether the reference refuses it. */
const docFor = (issuer: string): fc.Arbitrary<Doc> =>
  fc.oneof(
    {
      weight: 6,
      arbitrary: fc
        .record({
          issuerField: fc.oneof({ weight: 4, arbitrary: fc.constant<unknown>(issuer) }, { weight: 1, arbitrary: fc.constantFrom<unknown>(`${issuer}/`, issuer.toUpperCase(), undefined, null, 1, [issuer]) }, { weight: 1, arbitrary: issuerOf }),
          fields: fc.tuple(...FIELDS.map(() => fc.option(fc.oneof({ weight: 4, arbitrary: goodEndpoint.map((v) => ({ v, ok: true })) }, { weight: 1, arbitrary: badEndpoint.map((v) => ({ v, ok: false })) }), { nil: undefined, freq: 3 }))),
          extra: fc.dictionary(fc.constantFrom('scopes_supported', 'token_endpoint', 'x'), fc.jsonValue({ maxDepth: 1 }), { maxKeys: 2 }),
        })
        .map(({ issuerField, fields, extra }) => {
          const value: Record<string, unknown> = { ...extra }
          if (issuerField !== undefined) value.issuer = issuerField
          fields.forEach((f, i) => {
            if (f !== undefined) value[FIELDS[i]!] = f.v
          })
          // An https issuer's endpoints are https too: a plain http one is refused.
          const plain = (f: { v: unknown }) => /^https:/i.test(issuer) && !/^https:/i.test(f.v as string)
          return { value, refused: issuerField !== issuer || fields.some((f) => f !== undefined && (!f.ok || plain(f))) }
        }),
    },
    { weight: 1, arbitrary: fc.oneof(fc.jsonValue({ maxDepth: 2 }).filter((v) => v === null || typeof v !== 'object' || Array.isArray(v)), fc.constant([{ issuer }])).map((value) => ({ value, refused: true })) },
  )

describe('checkAuthorizationServerMetadata, property-based', () => {
  it('refuses, with a reason, exactly a non-object, another issuer, or an endpoint that is no absolute http(s) URL', () => {
    const seen = { accepted: 0, notObject: 0, issuerMismatch: 0, badEndpointOnly: 0 }
    fc.assert(
      fc.property(issuerOf.chain((issuer) => fc.tuple(fc.constant(issuer), docFor(issuer))), ([issuer, doc]) => {
        const reason = checkAuthorizationServerMetadata(doc.value, issuer)
        if (doc.refused) {
          expect(typeof reason).toBe('string')
          expect(reason!.length).toBeGreaterThan(0)
        } else expect(reason).toBeUndefined()

        const value = doc.value as Record<string, unknown> | null
        if (!doc.refused) seen.accepted++
        else if (value === null || typeof value !== 'object' || Array.isArray(value)) seen.notObject++
        else if (value.issuer !== issuer) seen.issuerMismatch++
        else seen.badEndpointOnly++
      }),
      RUNS,
    )
    // About 190 accepted, 70 not objects, 140 another issuer, 100 refused for an endpoint alone.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(30)
  })

  it('an endpoint with a user name or password is refused: fetch would refuse to call it', () => {
    const issuer = 'https://auth.example.com'
    for (const field of ['userinfo_endpoint', 'jwks_uri', 'introspection_endpoint']) {
      for (const url of ['https://rs:secret@auth.example.com/x', 'https://rs@auth.example.com/x', 'https://:secret@auth.example.com/x']) {
        expect(checkAuthorizationServerMetadata({ issuer, [field]: url }, issuer)).toBe(`discovery field ${field} holds a user name or password`)
      }
      expect(checkAuthorizationServerMetadata({ issuer, [field]: 'https://auth.example.com/x' }, issuer)).toBeUndefined()
    }
  })

  it('an https issuer whose document names a plain http endpoint is refused: the token and client secret would go in clear', () => {
    for (const field of ['userinfo_endpoint', 'jwks_uri', 'introspection_endpoint']) {
      expect(checkAuthorizationServerMetadata({ issuer: 'https://auth.example.com', [field]: 'http://auth.example.com/x' }, 'https://auth.example.com')).toBe(
        `discovery field ${field} is not an https URL, and the issuer is`,
      )
      expect(checkAuthorizationServerMetadata({ issuer: 'https://auth.example.com', [field]: 'HTTPS://auth.example.com/x' }, 'https://auth.example.com')).toBeUndefined()
      // A development issuer on plain http may name plain http endpoints.
      expect(checkAuthorizationServerMetadata({ issuer: 'http://127.0.0.1:9000', [field]: 'http://127.0.0.1:9000/x' }, 'http://127.0.0.1:9000')).toBeUndefined()
    }
  })

  it('an array is no discovery document, whatever it holds: refused as such, not as another issuer', () => {
    const issuer = 'https://auth.example.com'
    for (const doc of [[], [{ issuer }]]) expect(checkAuthorizationServerMetadata(doc, issuer)).toBe('discovery document is not a JSON object')
  })

  it('never throws on any JSON value, whatever issuer it is checked against', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 3 }), fc.string({ unit: anyChar, maxLength: 20 }), (doc, issuer) => {
        const reason = checkAuthorizationServerMetadata(doc, issuer)
        expect(reason === undefined || typeof reason === 'string').toBe(true)
      }),
      RUNS,
    )
  })
})

describe('normalizeResource, property-based', () => {
  it('spellings of one http(s) URL normalize to the string the structure gives, a fixed point', () => {
    const seen = { defaultPortDropped: 0, emptyPathBecameSlash: 0, recased: 0 }
    fc.assert(
      fc.property(urlParts, (p) => {
        const normalized = normalizeResource(p.text)
        const path = `${pathOf(p)}${'/'.repeat(p.trailingSlashes)}`
        expect(normalized).toBe(`${originOf(p)}${path === '' ? '/' : path}`)
        expect(normalizeResource(normalized)).toBe(normalized)
        if (p.port === DEFAULT_PORT[p.scheme]) seen.defaultPortDropped++
        if (path === '') seen.emptyPathBecameSlash++
        if (p.text !== p.text.toLowerCase()) seen.recased++
      }),
      RUNS,
    )
    // About 80 default ports dropped, 75 empty paths, 350 in mixed case.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(30)
  })

  it('never throws; other strings are kept as they are, and every result is a fixed point', () => {
    const seen = { kept: 0, normalized: 0 }
    fc.assert(
      fc.property(anyText, (value) => {
        const normalized = normalizeResource(value)
        expect(normalizeResource(normalized)).toBe(normalized)
        if (!/^https?:\/\//i.test(value)) {
          expect(normalized).toBe(value)
          seen.kept++
        } else if (normalized !== value) {
          expect(normalized).toMatch(/^https?:\/\//)
          seen.normalized++
        }
      }),
      RUNS,
    )
    // About 240 kept, 220 changed by the parser.
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(80)
  })
})

describe('the issuers createOAuthValidator accepts (regression: a bare ? or #, a space or a control character passed)', () => {
  const accepted = (issuer: string) => {
    try {
      createOAuthValidator({ issuer })
      return true
    } catch {
      return false
    }
  }

  it('have a fallback userinfo endpoint at {issuer path}/userinfo on the issuer origin, with no query or fragment', () => {
    const tails = ['', '', '/', '?', '#', '?#', '?a=1', '#x', ' ', '\u0000', '\t', '\n', '\u007f']
    let refused = 0
    fc.assert(
      fc.property(fc.constantFrom('https://as.example', 'https://as.example/t', 'http://localhost:8080/realms/x/'), fc.constantFrom(...tails), (origin, tail) => {
        const issuer = origin + tail
        if (!accepted(issuer)) {
          refused++
          expect(tail).not.toBe('')
          return
        }
        expect(['', '/']).toContain(tail)
        const endpoint = new URL(fallbackUserinfoEndpoint(issuer))
        const parsed = new URL(issuer)
        expect(endpoint.origin).toBe(parsed.origin)
        expect(endpoint.pathname).toBe(`${parsed.pathname.replace(/\/+$/, '')}/userinfo`)
        expect(endpoint.search + endpoint.hash).toBe('')
      }),
      { numRuns: 300 },
    )
    expect(refused).toBeGreaterThan(100)
  })
})
