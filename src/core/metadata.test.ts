import { describe, expect, it } from 'vitest'
import { ConfigurationError } from '../errors.js'
import {
  DEFAULT_SCOPES_SUPPORTED,
  PROTECTED_RESOURCE_METADATA_PATH,
  buildProtectedResourceMetadata,
} from './metadata.js'

describe('buildProtectedResourceMetadata (spec 2.2, RFC 9728)', () => {
  it('has the fields of spec 2.2 with the defaults', () => {
    expect(
      buildProtectedResourceMetadata({
        resource: 'https://weather.example.com',
        authorizationServers: ['https://auth.example.com'],
      }),
    ).toEqual({
      resource: 'https://weather.example.com',
      authorization_servers: ['https://auth.example.com'],
      bearer_methods_supported: ['header'],
      scopes_supported: ['openid', 'profile', 'email'],
    })
  })

  it('uses configured scopes and resource name', () => {
    const doc = buildProtectedResourceMetadata({
      resource: 'https://w.example',
      authorizationServers: ['https://a.example', 'https://b.example'],
      scopesSupported: ['openid', 'mcp'],
      resourceName: 'Weather',
    })
    expect(doc.authorization_servers).toEqual(['https://a.example', 'https://b.example'])
    expect(doc.scopes_supported).toEqual(['openid', 'mcp'])
    expect(doc.resource_name).toBe('Weather')
  })

  it('omits resource_name when none is given', () => {
    const doc = buildProtectedResourceMetadata({ resource: 'https://w.example', authorizationServers: [] })
    expect('resource_name' in doc).toBe(false)
    expect(JSON.parse(JSON.stringify(doc))).toEqual(doc)
  })

  it('omits a list with no entries (RFC 9728 section 3.2: "Parameters with zero values MUST be omitted from the response")', () => {
    // An API-tokens-only platform names no authorization server; a platform may list no scope.
    // A present but empty array is a malformed document to strict RFC 9728 clients.
    const doc = buildProtectedResourceMetadata({ resource: 'https://w.example', authorizationServers: [], scopesSupported: [] })
    expect(doc).toEqual({ resource: 'https://w.example', bearer_methods_supported: ['header'] })
    expect('authorization_servers' in doc).toBe(false)
    expect('scopes_supported' in doc).toBe(false)
  })

  it('copies its inputs: changing a document changes neither the options nor the defaults', () => {
    const servers = ['https://a.example']
    const doc = buildProtectedResourceMetadata({ resource: 'https://w.example', authorizationServers: servers })
    doc.authorization_servers!.push('https://evil.example')
    doc.scopes_supported!.push('admin')
    expect(servers).toEqual(['https://a.example'])
    expect(DEFAULT_SCOPES_SUPPORTED).toEqual(['openid', 'profile', 'email'])
  })

  it('refuses, naming the option, what would publish a document clients cannot use: a string for an array (published letter by letter), no resource, a resource or server that is no URL', () => {
    const base = { resource: 'https://weather.example.com', authorizationServers: ['https://auth.example.com'] }
    const refused = (options: unknown) => {
      try {
        buildProtectedResourceMetadata(options as never)
      } catch (error) {
        expect(error).toBeInstanceOf(ConfigurationError)
        return (error as ConfigurationError).option
      }
      return undefined
    }
    expect(refused({ ...base, authorizationServers: 'https://auth.example.com' })).toBe('authorizationServers')
    expect(refused({ ...base, scopesSupported: 'openid' })).toBe('scopesSupported')
    expect(refused({ ...base, scopesSupported: ['open id'] })).toBe('scopesSupported')
    expect(refused({ authorizationServers: base.authorizationServers })).toBe('resource')
    expect(refused({ ...base, resource: 'nope' })).toBe('resource')
    expect(refused({ ...base, resource: 'https://weather.example.com/#x' })).toBe('resource')
    expect(refused({ ...base, authorizationServers: ['https://auth.example.com', 'https://user:pw@auth.example.com'] })).toBe('authorizationServers.1')
    expect(refused({ ...base, authorizationServers: ['https://auth.example.com?tenant=1'] })).toBe('authorizationServers.0')
    expect(refused(null)).toBe('options')
    expect(refused(base)).toBeUndefined()
  })

  it('is served at /.well-known/oauth-protected-resource (spec 4.2)', () => {
    expect(PROTECTED_RESOURCE_METADATA_PATH).toBe('/.well-known/oauth-protected-resource')
  })
})
