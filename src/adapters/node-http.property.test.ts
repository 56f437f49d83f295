import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { isAuthority } from './node-http.js'

const RUNS = { numRuns: 2_000 }

/** What the WHATWG URL parser says: `host` parses as the authority of `http://host/` and nothing else. */
function parserSays(host: string): boolean {
  if (host === '') return false
  try {
    const url = new URL(`http://${host}/`)
    return url.pathname === '/' && url.search === '' && url.hash === '' && url.username === '' && url.password === ''
  } catch {
    return false
  }
}

const hostChar = fc.constantFrom(...'abcXYZ019.-:_@/?#[]\\% \t~!$&\'()*+,;='.split(''))

describe('isAuthority (the Host check of the Node adapters)', () => {
  it('agrees with the URL parser on any string of host-like characters', () => {
    fc.assert(
      fc.property(fc.string({ unit: hostChar, maxLength: 24 }), (host) => {
        expect(isAuthority(host)).toBe(parserSays(host))
      }),
      RUNS,
    )
  })

  it('agrees with the URL parser on names with ports, the fast path', () => {
    fc.assert(
      fc.property(fc.stringMatching(/^[A-Za-z0-9.-]{0,20}$/), fc.option(fc.nat({ max: 200_000 })), (name, port) => {
        const host = port === null ? name : `${name}:${port}`
        expect(isAuthority(host)).toBe(parserSays(host))
      }),
      RUNS,
    )
  })

  it('accepts what Hosts look like and refuses what would change the App address', () => {
    for (const host of ['weather.localhost', 'weather.localhost:8787', 'WEATHER.example.com', '127.0.0.1:80', '[::1]:8787', 'a_b.example']) {
      expect(isAuthority(host), host).toBe(true)
    }
    for (const host of ['', 'weather.localhost/x', 'evil@weather.localhost', 'weather.localhost:99999', 'weather.localhost?x', 'weather.localhost#x', 'a b', 'weather.localhost\\x', ':80']) {
      expect(isAuthority(host), host).toBe(false)
    }
  })
})
