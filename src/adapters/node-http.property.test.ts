import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { absoluteForm, lowerTargetScheme } from './node-http.js'
import { canonicalHost } from './shared.js'
import { parseUrl } from '../core/url.js'

const RUNS = { numRuns: 2_000 }

/**
 * What a Web runtime on Node (@hono/node-server) makes of a Host: the host of
 * `{protocol}://{host}/` by the WHATWG URL parser when that holds an authority and nothing
 * else and the parser kept the name as written (but for its case), otherwise `undefined`.
 */
function parserHost(host: string, protocol = 'http'): string | undefined {
  try {
    const url = new URL(`${protocol}://${host}/`)
    const authority = url.pathname === '/' && url.search === '' && url.hash === '' && url.username === '' && url.password === ''
    // @hono/node-server's rule: the name must be what the client wrote, but for its case.
    const written = host.replace(/:\d+$/, '').toLowerCase()
    // And a name of RFC 3986 unreserved characters (the parser keeps `,` `"` `{`), or an IP literal.
    const name = /^(?:[a-z0-9._~-]+|\[[0-9a-f:.]+\])$/.test(url.hostname)
    return authority && url.hostname !== '' && url.hostname === written && name ? url.host : undefined
  } catch {
    return undefined
  }
}

/** Characters of Hosts, valid and not; `xn--` as one piece, so punycode labels come up. */
const hostPiece = fc.oneof(
  { weight: 8, arbitrary: fc.constantFrom(...'abcnxXYZ019.-:_@/?#[]\\% \t~!$&\'()*+,;=\u00ad\u00e9'.split('')) },
  { weight: 1, arbitrary: fc.constantFrom('xn--', 'XN--', 'xn--a', '0x', ':80', ':443', ':08') },
)

describe('canonicalHost (the Host check of every adapter)', () => {
  it('agrees with the URL parser on any string of host-like pieces, under http and https', () => {
    fc.assert(
      fc.property(fc.array(hostPiece, { maxLength: 12 }).map((pieces) => pieces.join('')), fc.constantFrom('http', 'https'), (host, protocol) => {
        expect(canonicalHost(host, protocol)).toBe(parserHost(host, protocol))
      }),
      RUNS,
    )
  })

  it('agrees with the URL parser on names with ports, the fast path', () => {
    fc.assert(
      fc.property(fc.stringMatching(/^[A-Za-z0-9.-]{0,20}$/), fc.option(fc.nat({ max: 200_000 })), (name, port) => {
        const host = port === null ? name : `${name}:${port}`
        expect(canonicalHost(host, 'http')).toBe(parserHost(host))
      }),
      RUNS,
    )
  })

  it('keeps what Hosts look like, reads the rest as the parser does, and refuses what would change the App address', () => {
    for (const host of ['weather.localhost', 'weather.localhost:8787', 'a_b.example', 'weather.localhost.']) {
      expect(canonicalHost(host, 'http'), host).toBe(host)
    }
    expect(canonicalHost('WEATHER.localhost', 'http')).toBe('weather.localhost')
    expect(canonicalHost('weather.localhost:80', 'http')).toBe('weather.localhost')
    expect(canonicalHost('weather.localhost:443', 'https')).toBe('weather.localhost')
    expect(canonicalHost('weather.localhost:443', 'http')).toBe('weather.localhost:443')
    expect(canonicalHost('127.0.0.1:8787', 'http')).toBe('127.0.0.1:8787')
    expect(canonicalHost('[::1]:8787', 'http')).toBe('[::1]:8787')
    for (const host of ['', 'weather.localhost/x', 'evil@weather.localhost', 'weather.localhost:99999', 'weather.localhost?x', 'weather.localhost#x', 'a b', 'weather.localhost\\x', 'weather.localhost,notes.localhost', 'weather"x.localhost', 'weather{x}.localhost', 'a;b', ':80', '1.2.3.999', '0x7f.1', 'weather.ex%41mple.com', 'weather.\u00adlocalhost', 'weather.localhost:']) {
      expect(canonicalHost(host, 'http'), host).toBeUndefined()
    }
  })

  it('reads an xn-- label as the runtime’s URL parser does: one that is no punycode is refused on Node 20 and 22, kept on Node 24', () => {
    // Valid punycode is kept on every runtime (`β`).
    expect(canonicalHost('weather.xn--nxa.com', 'http')).toBe('weather.xn--nxa.com')
    expect(canonicalHost('XN--NXA.localhost:8787', 'http')).toBe('xn--nxa.localhost:8787')
    // A label that is no punycode: Node 20 and 22 (ada 2) refuse it; Node 24 (ada 4) follows the
    // URL Standard's ASCII fast path (whatwg/url#914, as browsers), which keeps an ASCII name
    // without decoding it. The Web adapter sees what the parser made of it, so the Node
    // adapters must too: refused (400) on the one, a name like any other (no such App: 404) on the other.
    const keepsAsciiLabels = parseUrl('http://xn--a.com/') !== undefined
    for (const host of ['weather.xn--a.com', 'xn--', 'xn--a-ecp.ru']) {
      expect(canonicalHost(host, 'http'), host).toBe(keepsAsciiLabels ? host : undefined)
      expect(canonicalHost(host, 'http'), host).toBe(parserHost(host))
    }
    expect(canonicalHost('XN--A.localhost', 'http')).toBe(keepsAsciiLabels ? 'xn--a.localhost' : undefined)
  })
})

/**
 * `absoluteForm`: an absolute-form request target (RFC 9112 section 3.2.2, `POST http://host/v1?x`)
 * read as its scheme, its host (the Host field is then ignored) and the rest as an origin-form
 * target; `undefined` for an origin-form target and for a target of another scheme. The target
 * comes from the request line, whoever sends it: any string.
 */
describe('absoluteForm (absolute-form request targets), property-based', () => {
  const RUNS = { numRuns: 2_000 }
  const targetChar = fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom(...'hHtTpPsS:/?#@.%[]\\ab1'.split(''), 'http://', 'HTTPS://', 'https:', 'ftp://', 'ws://', '//', '://') },
    { weight: 1, arbitrary: fc.integer({ min: 0, max: 0xffff }).map((c) => String.fromCharCode(c)) },
  )
  const anyTarget = fc.oneof(
    fc.string({ unit: targetChar, maxLength: 24 }),
    fc.tuple(fc.constantFrom('http://', 'https://', 'HtTp://', 'HTTPS://', '/', 'ftp://', 'httpx://', 'http:/', 'https:', ' http://'), fc.string({ unit: targetChar, maxLength: 20 })).map(([a, b]) => a + b),
  )

  it('defined exactly for targets that begin with http:// or https:// (any case); origin-form targets and other schemes are undefined', () => {
    fc.assert(
      fc.property(anyTarget, (url) => {
        const absolute = absoluteForm(url)
        expect(absolute !== undefined).toBe(/^https?:\/\//i.test(url))
        if (url.startsWith('/')) expect(absolute).toBeUndefined()
      }),
      RUNS,
    )
  })

  it('lowerTargetScheme: an absolute-form target gets its scheme in lower case and nothing else changed (the same absoluteForm reading), in url, originalUrl and every later write of url; any other target untouched', () => {
    fc.assert(
      fc.property(anyTarget, anyTarget, (url, other) => {
        const req = { url, originalUrl: url }
        lowerTargetScheme(req)
        const absolute = absoluteForm(url)
        if (absolute === undefined) {
          expect(req).toEqual({ url, originalUrl: url })
          return
        }
        const expected = absolute.scheme + url.slice(absolute.scheme.length)
        expect(req).toEqual({ url: expected, originalUrl: expected })
        expect(absoluteForm(expected)).toEqual(absolute)
        // Under an Express mount, `originalUrl` may be another target: its scheme is lowered too.
        const mounted = { url, originalUrl: other }
        lowerTargetScheme(mounted)
        expect(mounted.url).toBe(expected)
        const otherAbsolute = absoluteForm(other)
        const otherLowered = otherAbsolute ? otherAbsolute.scheme + other.slice(otherAbsolute.scheme.length) : other
        // Only a request whose own target needed it is touched.
        expect(mounted.originalUrl).toBe(expected !== url ? otherLowered : other)
        // What the router writes later (leaving or entering a mount) is lowered as well.
        if (expected !== url) {
          ;(req as { url: string }).url = other
          expect(req.url).toBe(mounted.originalUrl)
        }
      }),
      RUNS,
    )
  })

  it('any target: scheme (lower case), host and rest put back together are the target; the host holds no / ? #; the target is origin-form', () => {
    fc.assert(
      fc.property(anyTarget, (url) => {
        const absolute = absoluteForm(url)
        if (absolute === undefined) return
        const { scheme, host, target } = absolute
        expect(url.slice(0, scheme.length).toLowerCase()).toBe(scheme)
        expect(url.slice(scheme.length, scheme.length + 3)).toBe('://')
        expect(url.slice(scheme.length + 3, scheme.length + 3 + host.length)).toBe(host)
        expect(host).not.toMatch(/[/?#]/)
        const rest = url.slice(scheme.length + 3 + host.length)
        // What follows the host is the path, or the query or fragment of an empty path.
        expect(rest === '' || /^[/?#]/.test(rest)).toBe(true)
        expect(target).toBe(rest.startsWith('/') ? rest : `/${rest}`)
        expect(target.startsWith('/')).toBe(true)
        // Read again, what the adapter builds from it (`${scheme}://${host}${target}`) gives the same parts.
        expect(absoluteForm(`${scheme}://${host}${target}`)).toEqual(absolute)
      }),
      RUNS,
    )
  })

  it('on well-formed http(s) URLs, agrees with the WHATWG URL parser: scheme, host, and the URL rebuilt from the parts', () => {
    const name = fc.oneof(
      fc.stringMatching(/^[A-Za-z0-9](?:[A-Za-z0-9-]{0,6}[A-Za-z0-9])?(?:\.[A-Za-z]{1,6}){1,2}$/).filter((n) => !/(?:^|\.)xn--/i.test(n)),
      fc.ipV4(),
      // IPv6 as the parser writes it (canonicalHost refuses a literal it would rewrite, `[::0:0]`).
      fc.ipV6().map((a) => new URL(`http://[${a}]`).hostname),
      fc.constant('localhost'),
    )
    const port = fc.option(fc.integer({ min: 1, max: 65535 }).map((p) => `:${p}`), { nil: '' })
    const pchar = fc.constantFrom('a', 'Z', '0', '-', '.', '_', '~', '%41', '%2F', ':', '@', '!', '$', '&', "'", '(', ')', '*', '+', ',', ';', '=')
    const path = fc.array(fc.string({ unit: pchar, maxLength: 5 }), { maxLength: 3 }).map((segments) => segments.map((s) => `/${s}`).join(''))
    const queryish = fc.string({ unit: fc.oneof(pchar, fc.constantFrom('/', '?')), maxLength: 6 })
    const url = fc
      .tuple(fc.constantFrom('http', 'https', 'HTTP', 'Https'), name, port, path, fc.option(queryish, { nil: undefined }), fc.option(queryish, { nil: undefined }))
      .map(([scheme, host, p, pathname, query, fragment]) => `${scheme}://${host}${p}${pathname}${query === undefined ? '' : `?${query}`}${fragment === undefined ? '' : `#${fragment}`}`)
    fc.assert(
      fc.property(url, (target) => {
        const parsed = new URL(target)
        const absolute = absoluteForm(target)!
        expect(absolute).toBeDefined()
        expect(`${absolute.scheme}:`).toBe(parsed.protocol)
        expect(canonicalHost(absolute.host, absolute.scheme)).toBe(parsed.host)
        expect(new URL(`${absolute.scheme}://${absolute.host}${absolute.target}`).href).toBe(parsed.href)
        // The origin-form target is the URL's path and query (and fragment) as sent.
        expect(new URL(`http://x.invalid${absolute.target}`).pathname).toBe(parsed.pathname)
      }),
      RUNS,
    )
  })
})
