/**
 * Properties of `buildProtectedResourceMetadata` (RFC 9728 document), over generated options:
 *
 * - Given an App address, issuer URLs and scope names, it never throws, and the document survives
 *   JSON: `JSON.parse(JSON.stringify(doc))` equals it (any name, lone surrogates included, comes
 *   back unchanged).
 * - Given any strings, it either builds that document or throws a `ConfigurationError` naming
 *   the option at fault (`resource`, `authorizationServers.<i>`, `scopesSupported`): never
 *   another error, never a document publishing what is no URL.
 * - `resource` and `authorization_servers` are exactly the ones given, in order;
 *   `bearer_methods_supported` is `["header"]`; `scopes_supported` is the list given or the
 *   default `openid profile email`; `resource_name` is there exactly when a name is given.
 * - The document holds copies: changing the option arrays afterwards changes nothing, and two
 *   documents share no array.
 */
import fc from 'fast-check'
import { describe, expect, it } from 'vitest'
import { ConfigurationError } from '../errors.js'
import { buildProtectedResourceMetadata } from './metadata.js'

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
const anyString = fc.string({ unit: anyChar, maxLength: 30 })
const url = fc
  .tuple(fc.constantFrom('https://', 'http://'), fc.stringMatching(/^[a-z][a-z0-9]{0,8}(\.[a-z][a-z0-9]{0,8}){0,2}$/), fc.stringMatching(/^(\/[a-z0-9]{0,6}){0,3}$/))
  .map((parts) => parts.join(''))
const scope = fc.oneof(fc.constantFrom('openid', 'mcp:tools', 'email'), fc.stringMatching(/^[\x21\x23-\x5B\x5D-\x7E]{1,12}$/))
/** Options a platform means: an App address, issuer URLs, scope names, and any name. */
const options = fc.record(
  {
    resource: url,
    authorizationServers: fc.array(url, { maxLength: 4 }),
    scopesSupported: fc.array(scope, { maxLength: 4 }),
    resourceName: anyString,
  },
  { requiredKeys: ['resource', 'authorizationServers'] },
)
/** Options of any strings, among them what the meant ones are. */
const anyOptions = fc.record(
  {
    resource: fc.oneof(anyString, url),
    authorizationServers: fc.array(fc.oneof(anyString, url), { maxLength: 4 }),
    scopesSupported: fc.array(fc.oneof(anyString, scope), { maxLength: 4 }),
  },
  { requiredKeys: ['resource', 'authorizationServers'] },
)

describe('buildProtectedResourceMetadata, property-based', () => {
  it('survives JSON, and names the resource, servers, scopes and name given', () => {
    const seen = { defaultScopes: 0, givenScopes: 0, named: 0, unnamed: 0, noServers: 0, loneSurrogate: 0 }
    fc.assert(
      fc.property(options, (given) => {
        const doc = buildProtectedResourceMetadata(given)
        const json = JSON.stringify(doc)
        expect(JSON.parse(json)).toEqual(doc)
        expect(doc.resource).toBe(given.resource)
        // A list with no entries is left out (RFC 9728 section 3.2).
        const scopes = given.scopesSupported ?? ['openid', 'profile', 'email']
        expect(doc.authorization_servers).toEqual(given.authorizationServers.length > 0 ? given.authorizationServers : undefined)
        expect(doc.bearer_methods_supported).toEqual(['header'])
        expect(doc.scopes_supported).toEqual(scopes.length > 0 ? scopes : undefined)
        expect('resource_name' in doc).toBe(given.resourceName !== undefined)
        if (given.resourceName !== undefined) expect(doc.resource_name).toBe(given.resourceName)
        const keys = [
          'resource',
          ...(given.authorizationServers.length > 0 ? ['authorization_servers'] : []),
          'bearer_methods_supported',
          ...(scopes.length > 0 ? ['scopes_supported'] : []),
          ...(given.resourceName === undefined ? [] : ['resource_name']),
        ]
        expect(Object.keys(doc).sort()).toEqual(keys.sort())

        if (given.scopesSupported === undefined) seen.defaultScopes++
        else seen.givenScopes++
        if (given.resourceName === undefined) seen.unnamed++
        else seen.named++
        if (given.authorizationServers.length === 0) seen.noServers++
        // JSON.stringify writes a lone surrogate as an escape (a pair goes through as it is).
        if (/\\ud[89a-f][0-9a-f]{2}/.test(json)) seen.loneSurrogate++
      }),
      RUNS,
    )
    // About 80 with default scopes (420 given), 80 unnamed (420 named), 110 without servers, 16
    // with lone surrogates (in the name).
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(name === 'loneSurrogate' ? 4 : 30)
  })

  it('given any strings: the document of them, or a ConfigurationError naming the option at fault', () => {
    const seen = { built: 0, resource: 0, authorizationServers: 0, scopesSupported: 0 }
    fc.assert(
      fc.property(anyOptions, (given) => {
        let doc
        try {
          doc = buildProtectedResourceMetadata(given)
        } catch (error) {
          expect(error).toBeInstanceOf(ConfigurationError)
          const option = (error as ConfigurationError).option
          expect(option).toMatch(/^(resource|authorizationServers\.\d|scopesSupported)$/)
          seen[option.split('.')[0] as 'resource']++
          // What it names is at fault: the same options with it replaced by a meant value build.
          const mended = option === 'resource' ? { ...given, resource: 'https://a.example' } : option === 'scopesSupported' ? { ...given, scopesSupported: ['openid'] } : { ...given, authorizationServers: given.authorizationServers.map((server, i) => (String(i) === option.split('.')[1] ? 'https://a.example' : server)) }
          expect(() => buildProtectedResourceMetadata(mended), option).not.toThrow(new RegExp(option.replace('.', '\\.')))
          return
        }
        seen.built++
        // Built: an address that parses as http(s), with no fragment; the servers and scopes given.
        expect(new URL(doc.resource).protocol).toMatch(/^https?:$/)
        expect(doc.resource).not.toContain('#')
        const scopes = given.scopesSupported ?? ['openid', 'profile', 'email']
        expect(doc.authorization_servers).toEqual(given.authorizationServers.length > 0 ? given.authorizationServers : undefined)
        for (const server of doc.authorization_servers ?? []) expect(server).toMatch(/^https?:\/\/[^?#\s]+$/i)
        expect(doc.scopes_supported).toEqual(scopes.length > 0 ? scopes : undefined)
      }),
      RUNS,
    )
    for (const [name, count] of Object.entries(seen)) expect(count, name).toBeGreaterThanOrEqual(10)
  })

  it('refuses an option it does not know (the document\'s own names) and a resourceName that is no string; null leaves the name out', () => {
    const base = { resource: 'https://weather.example.com', authorizationServers: ['https://auth.example.com'] }
    // Before: ignored, and the default scopes published instead of the platform's.
    expect(() => buildProtectedResourceMetadata({ ...base, scopes_supported: ['mcp:tools'] } as never)).toThrow(/scopes_supported.*buildProtectedResourceMetadata|buildProtectedResourceMetadata.*scopes_supported/)
    expect(() => buildProtectedResourceMetadata({ ...base, resourceName: 5 } as never)).toThrow(new ConfigurationError('resourceName', "must be a string (the App's name), or absent"))
    expect(buildProtectedResourceMetadata({ ...base, resourceName: null } as never)).not.toHaveProperty('resource_name')
    expect(buildProtectedResourceMetadata({ ...base, resourceName: 'Weather' }).resource_name).toBe('Weather')
  })

  it('holds copies: changing the option arrays afterwards changes nothing, and documents share no array', () => {
    fc.assert(
      fc.property(options, anyString, (given, extra) => {
        const servers = [...given.authorizationServers]
        const scopes = given.scopesSupported === undefined ? undefined : [...given.scopesSupported]
        const doc = buildProtectedResourceMetadata({ ...given, authorizationServers: servers, ...(scopes && { scopesSupported: scopes }) })
        const other = buildProtectedResourceMetadata({ ...given, authorizationServers: servers, ...(scopes && { scopesSupported: scopes }) })
        const before = JSON.stringify(doc)
        servers.push(extra)
        scopes?.push(extra)
        other.authorization_servers?.push(extra)
        other.scopes_supported?.push(extra)
        other.bearer_methods_supported.push(extra)
        expect(JSON.stringify(doc)).toBe(before)
        // The defaults too: another document still gets them whole.
        expect(buildProtectedResourceMetadata({ resource: 'https://a.example', authorizationServers: [] }).scopes_supported).toEqual(['openid', 'profile', 'email'])
        expect(buildProtectedResourceMetadata({ resource: 'https://a.example', authorizationServers: [] }).bearer_methods_supported).toEqual(['header'])
      }),
      RUNS,
    )
  })
})
