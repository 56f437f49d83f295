import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { canonicalHost } from './shared.js'

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
    const keepsAsciiLabels = URL.canParse('http://xn--a.com/')
    for (const host of ['weather.xn--a.com', 'xn--', 'xn--a-ecp.ru']) {
      expect(canonicalHost(host, 'http'), host).toBe(keepsAsciiLabels ? host : undefined)
      expect(canonicalHost(host, 'http'), host).toBe(parserHost(host))
    }
    expect(canonicalHost('XN--A.localhost', 'http')).toBe(keepsAsciiLabels ? 'xn--a.localhost' : undefined)
  })
})
