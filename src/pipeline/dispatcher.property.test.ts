/**
 * Properties of `originEntry`, the reading of one `allowedOrigins` entry (docs/pipeline.md,
 * `allowedOrigins`): the set it builds is compared as a string with `Origin` as browsers send it
 * (the ASCII serialization of an origin), so an http(s) entry must come out as exactly that
 * serialization, whatever spelling the platform wrote, and an entry no `Origin` can equal
 * (a path, query, fragment, credentials, `*`, no URL) must be refused at creation, not kept to
 * silently refuse every browser.
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { ConfigurationError } from '../errors.js'
import { originEntry } from './dispatcher.js'
import { parseUrl } from '../core/url.js'

const RUNS = { numRuns: 1_000 }
const OPTION = 'allowedOrigins.3'

/** Upper-cases some of the ASCII letters of `text`, by a mask of booleans. */
const anyCase = (text: string) =>
  fc.array(fc.boolean(), { minLength: text.length, maxLength: text.length }).map((mask) => [...text].map((c, i) => (mask[i] ? c.toUpperCase() : c)).join(''))

const label = fc.stringMatching(/^[a-z0-9](?:[a-z0-9-]{0,8}[a-z0-9])?$/).filter((l) => !/^xn--/.test(l))
/** A host as written and the host as a browser serializes it in `Origin`. */
const host: fc.Arbitrary<{ written: fc.Arbitrary<string>; serialized: string }> = fc.oneof(
  // DNS names: lower case in `Origin`, computed by hand. A last label of digits makes an IPv4 address
  // of the name for the URL parser (`a.1`): not generated here.
  fc
    .tuple(fc.array(label, { minLength: 1, maxLength: 3 }), fc.constantFrom('example', 'com', 'localhost', 'test'))
    .map(([labels, tld]) => [...labels, tld].join('.'))
    .map((name) => ({ written: anyCase(name), serialized: name })),
  fc.constant({ written: fc.constant('localhost'), serialized: 'localhost' }),
  fc.ipV4().map((ip) => ({ written: fc.constant(ip), serialized: ip })),
  // IPv6 literals and IDN names: the parser's own serialization of the host (compressed, punycode).
  fc.ipV6().map((ip) => ({ written: anyCase(`[${ip}]`), serialized: new URL(`http://[${ip}]`).hostname })),
  fc.constantFrom('b\u00fccher.example', '\u4f8b\u3048.test', 'M\u00fcnchen.DE').map((name) => ({ written: fc.constant(name), serialized: new URL(`http://${name}`).hostname })),
)
const DEFAULT_PORT = { http: 80, https: 443 } as const

/** An http(s) origin as a platform may write it, and as a browser sends it in `Origin`. */
const spelledOrigin = fc
  .tuple(
    fc.constantFrom('http', 'https' as const),
    host,
    fc.oneof(
      fc.constant<'none' | 'default' | number>('none'),
      fc.constant<'none' | 'default' | number>('default'),
      fc.integer({ min: 1, max: 65535 }),
    ),
    fc.boolean(),
  )
  .chain(([scheme, h, port, slash]) =>
    fc.tuple(anyCase(scheme), h.written).map(([writtenScheme, writtenHost]) => {
      const portNumber = port === 'none' ? undefined : port === 'default' ? DEFAULT_PORT[scheme] : port
      const written = `${writtenScheme}://${writtenHost}${portNumber === undefined ? '' : `:${portNumber}`}${slash ? '/' : ''}`
      const keptPort = portNumber === undefined || portNumber === DEFAULT_PORT[scheme] ? '' : `:${portNumber}`
      return { written, serialized: `${scheme}://${h.serialized}${keptPort}` }
    }),
  )

/** What an origin written as `entry` gives, or the error it throws. */
function outcome(entry: string): { value: string } | { error: unknown } {
  try {
    return { value: originEntry(entry, OPTION) }
  } catch (error) {
    return { error }
  }
}

function expectRefused(entry: string): void {
  const result = outcome(entry)
  expect('error' in result, `${JSON.stringify(entry)} accepted as ${'value' in result ? result.value : ''}`).toBe(true)
  const error = (result as { error: unknown }).error
  expect(error).toBeInstanceOf(ConfigurationError)
  expect((error as ConfigurationError).option).toBe(OPTION)
}

describe('originEntry (allowedOrigins entries), property-based', () => {
  it('an http(s) origin however spelled (case, default port, a lone /) gives what a browser sends in Origin', () => {
    fc.assert(
      fc.property(spelledOrigin, ({ written, serialized }) => {
        expect(originEntry(written, OPTION)).toBe(serialized)
      }),
      RUNS,
    )
  })

  it('what it gives for an http(s) entry is its own origin: a fixed point, and the Origin of every page under it', () => {
    const pagePath = fc.stringMatching(/^(?:\/[a-zA-Z0-9._~%-]{0,8}){0,3}(?:\?[a-z=&]{0,8})?(?:#[a-z]{0,5})?$/)
    fc.assert(
      fc.property(spelledOrigin, pagePath, ({ written }, page) => {
        const entry = originEntry(written, OPTION)
        expect(originEntry(entry, OPTION)).toBe(entry)
        expect(new URL(entry).origin).toBe(entry)
        // A page anywhere on the origin sends exactly this `Origin`: the entry matches it as a string.
        expect(new URL(`${entry}${page.startsWith('/') ? page : `/${page}`}`).origin).toBe(entry)
        expect(entry).not.toMatch(/\/$/)
        // Lower case throughout: scheme, name, IPv6 literal, punycode.
        expect(entry).toBe(entry.toLowerCase())
      }),
      RUNS,
    )
  })

  it('a path, a query, a fragment (empty ones included) or credentials are refused, naming the option', () => {
    const extra = fc.oneof(
      // A path that is no dot segment (those the parser resolves to `/`).
      fc.stringMatching(/^(?:\/[a-zA-Z0-9_~-][a-zA-Z0-9._~-]{0,6}){1,3}\/?$/).map((p) => ({ where: 'path' as const, text: p })),
      fc.constantFrom('//', '/a/', '/%20', '/index.html', '/.well-known/x').map((p) => ({ where: 'path' as const, text: p })),
      fc.stringMatching(/^\/?\?[a-z0-9=&]{0,8}$/).map((q) => ({ where: 'end' as const, text: q })),
      fc.stringMatching(/^\/?#[a-z0-9]{0,8}$/).map((f) => ({ where: 'end' as const, text: f })),
      fc.constantFrom('?#', '/?#', '#?', '?a#b').map((s) => ({ where: 'end' as const, text: s })),
      fc.stringMatching(/^[a-z0-9]{1,6}(?::[a-z0-9]{0,6})?@$|^:[a-z0-9]{1,6}@$/).map((c) => ({ where: 'userinfo' as const, text: c })),
    )
    fc.assert(
      fc.property(spelledOrigin, extra, ({ written }, { where, text }) => {
        const base = written.replace(/\/$/, '')
        const entry = where === 'userinfo' ? base.replace('://', `://${text}`) : `${base}${text}`
        expectRefused(entry)
      }),
      RUNS,
    )
  })

  it('entries of other schemes are kept as written; `null` is kept; `*` and what is no URL are refused', () => {
    const other = fc
      .tuple(
        fc.constantFrom('chrome-extension', 'moz-extension', 'safari-web-extension', 'capacitor', 'tauri', 'app', 'ws', 'wss', 'ftp', 'file', 'x-custom'),
        fc.stringMatching(/^[a-z0-9.-]{1,20}$/),
      )
      .map(([scheme, rest]) => `${scheme}://${rest}`)
    fc.assert(
      fc.property(other, (entry) => {
        fc.pre(parseUrl(entry) !== undefined)
        expect(originEntry(entry, OPTION)).toBe(entry)
      }),
      RUNS,
    )
    expect(originEntry('null', OPTION)).toBe('null')
    expectRefused('*')
    for (const entry of ['', 'NULL', 'app.example', '//app.example', 'https//app.example', 'https://', 'http://[::1', 'http://a:65536', 'http://a b.example']) expectRefused(entry)
  })

  it('any string: gives a string or throws a ConfigurationError naming the option; agrees with a model of the documented rule', () => {
    const anyChar = fc.oneof(
      fc.constantFrom(...'hHtTpPsS:/?#@[]%.-_~*! \t\n\\'.split(''), 'http://', 'https://', 'HTTPS://', ':443', ':80', 'null', 'x.example', 'user@', '\u00e9', '\ud800'),
      fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)),
    )
    // The documented rule, stated on the parser's serialization: `*` refused, `null` kept, no URL
    // refused, other schemes kept, an http(s) URL that is its origin and nothing more (no `?` or
    // `#`, even empty) and has no wildcard in its host gives its origin, any other refused.
    const model = (entry: string): string | null => {
      if (entry === '*') return null
      if (entry === 'null') return entry
      if (parseUrl(entry) === undefined) return null
      const url = new URL(entry)
      if (url.protocol !== 'http:' && url.protocol !== 'https:') return entry
      return url.href === `${url.origin}/` && !url.hostname.includes('*') ? url.origin : null
    }
    // The parser drops leading and trailing spaces and controls, and tabs and newlines anywhere:
    // the model reads `https://a/? ` as having a query, the function as having none (harmless:
    // what it gives is still the origin). Entries without those are compared.
    const plain = (entry: string) => entry.trim() === entry && entry.charCodeAt(0) > 0x20 && entry.charCodeAt(entry.length - 1) > 0x20 && !/[\t\n\r]/.test(entry)
    fc.assert(
      fc.property(fc.string({ unit: anyChar, maxLength: 30 }), (entry) => {
        const result = outcome(entry)
        if ('error' in result) {
          expect(result.error).toBeInstanceOf(ConfigurationError)
          expect((result.error as ConfigurationError).option).toBe(OPTION)
        } else {
          expect(typeof result.value).toBe('string')
          if (result.value !== entry) expect(new URL(result.value).origin).toBe(result.value)
        }
        if (plain(entry)) expect('value' in result ? result.value : null).toBe(model(entry))
      }),
      { numRuns: 3_000 },
    )
  })
})
