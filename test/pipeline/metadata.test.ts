/**
 * Protected-resource metadata (spec 2.2, 4.2; RFC 9728) and CORS, through the reference
 * platform with real `Request` objects.
 */
import { afterEach, beforeEach, describe, expect, it } from 'vitest'
import type { Platform } from '../../examples/platform/index.js'
import { CLIENT, bodies, createTestPlatform, json, mcpRequest, metadataUrl, versionHeaders } from '../helpers/platform.js'

let platform: Platform
let token: (name: string) => string
let errors: Array<{ error: unknown; context: string }>

beforeEach(() => {
  ;({ platform, token, errors } = createTestPlatform({ authorizationServer: { issuer: 'https://auth.example.com' } }))
})
afterEach(async () => {
  await platform.close()
  expect(errors).toEqual([])
})

function get(url: string, init: RequestInit = {}) {
  return platform.fetch(new Request(url, init), { clientAddress: CLIENT })
}

describe('GET /.well-known/oauth-protected-resource (spec 4.2)', () => {
  it('answers without credentials with the fields of spec 2.2, cacheable and readable cross-origin', async () => {
    const response = await get(metadataUrl('weather'))
    expect(response.status).toBe(200)
    expect(response.headers.get('content-type')).toBe('application/json')
    expect(response.headers.get('cache-control')).toBe('public, max-age=3600')
    expect(response.headers.get('access-control-allow-origin')).toBe('*')
    // DESIGN.md: the metadata endpoint carries the exposed headers' list too.
    expect(response.headers.get('access-control-expose-headers')).toBe('WWW-Authenticate, Mcp-Session-Id, X-MCP-Version, X-MCP-Latest-Version, Retry-After, RateLimit, RateLimit-Policy, Allow')
    expect(versionHeaders(response)).toEqual({ version: null, latest: null })
    expect(await json(response)).toEqual({
      resource: 'http://weather.localhost',
      authorization_servers: ['https://auth.example.com'],
      bearer_methods_supported: ['header'],
      scopes_supported: ['openid', 'profile', 'email'],
      resource_name: 'Weather',
    })
  })

  it('is the document the 401 challenge points to', async () => {
    const unauthorized = await platform.fetch(mcpRequest('http://weather.localhost:8787/v1'), { clientAddress: CLIENT })
    const header = unauthorized.headers.get('www-authenticate') ?? ''
    const url = /resource_metadata="([^"]+)"/.exec(header)?.[1]
    expect(url).toBe('http://weather.localhost:8787/.well-known/oauth-protected-resource')
    const doc = await json(await get(url!))
    expect(doc.resource).toBe('http://weather.localhost:8787')
  })

  it('is served per App, and ignores whatever credential comes with it', async () => {
    const notes = await get(metadataUrl('notes'), { headers: { authorization: 'Bearer garbage' } })
    expect(notes.status).toBe(200)
    expect(await json(notes)).toMatchObject({ resource: 'http://notes.localhost', resource_name: 'Notes' })
  })

  it('is the one document of the App for every version path: no path-suffixed variant (RFC 9728 section 3.1)', async () => {
    // A client that discovers the metadata from `/v1` (no 401 to follow) tries the suffixed
    // URL first; its 404 sends it to this document, so it asks for the same resource as a
    // client that followed the 401's resource_metadata.
    for (const suffix of ['/', '/foo', '/v1.x', '/v1', '/v1.1', '/v1.1.1', '/v9']) {
      const response = await get(`${metadataUrl('weather')}${suffix}`)
      expect(response.status).toBe(404)
      expect(await json(response)).toEqual(bodies.notFound)
    }
  })

  it('HEAD answers the headers without a body; other methods get 405 with Allow', async () => {
    const head = await get(metadataUrl('weather'), { method: 'HEAD' })
    expect(head.status).toBe(200)
    expect(head.headers.get('cache-control')).toBe('public, max-age=3600')
    expect(await head.text()).toBe('')
    const post = await get(metadataUrl('weather'), { method: 'POST', body: '{}' })
    expect(post.status).toBe(405)
    expect(post.headers.get('allow')).toBe('GET, HEAD, OPTIONS')
    expect(post.headers.get('content-type')).toBe('application/json')
    // A browser client may read why, as it may read the document.
    expect(post.headers.get('access-control-allow-origin')).toBe('*')
    expect(await json(post)).toEqual(bodies.methodNotAllowed)
  })

  it('an unknown App has no metadata', async () => {
    const response = await get(metadataUrl('nope'))
    expect(response.status).toBe(404)
    expect(await json(response)).toEqual(bodies.notFound)
  })

  it('without a configured authorization server the list is left out, not empty (RFC 9728 section 3.2: "Parameters with zero values MUST be omitted")', async () => {
    const bare = createTestPlatform()
    try {
      const doc = await json(await bare.platform.fetch(new Request(metadataUrl('weather'))))
      expect(doc).not.toHaveProperty('authorization_servers')
      expect(doc.resource).toBe('http://weather.localhost')
    } finally {
      await bare.platform.close()
    }
  })
})

describe('CORS for browser-based MCP clients (DESIGN.md "Adapters")', () => {
  // An https page: allowed by the platform's default allowedOrigins, and echoed (docs/platform.md).
  const origin = 'https://inspector.example'

  it('OPTIONS preflight on the metadata document', async () => {
    const response = await get(metadataUrl('weather'), {
      method: 'OPTIONS',
      headers: { origin, 'access-control-request-method': 'GET' },
    })
    expect(response.status).toBe(204)
    expect(response.headers.get('access-control-allow-origin')).toBe('*')
    // The methods of the document, not the MCP endpoint's: a POST there is 405.
    expect(response.headers.get('access-control-allow-methods')).toBe('GET, HEAD, OPTIONS')
    expect(response.headers.get('allow')).toBe('GET, HEAD, OPTIONS')
    expect(await response.text()).toBe('')
  })

  it('a plain OPTIONS (no preflight) on an MCP path: 204 with Allow naming its methods, no credential needed', async () => {
    const response = await get('http://weather.localhost/v1', { method: 'OPTIONS' })
    expect(response.status).toBe(204)
    expect(response.headers.get('allow')).toBe('GET, POST, DELETE, OPTIONS')
    expect(await response.text()).toBe('')
  })

  it('OPTIONS preflight on an MCP path needs no credential and allows the MCP headers', async () => {
    const response = await get('http://weather.localhost/v1', {
      method: 'OPTIONS',
      headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, mcp-session-id' },
    })
    expect(response.status).toBe(204)
    expect(response.headers.get('access-control-allow-origin')).toBe(origin)
    expect(response.headers.get('access-control-allow-methods')).toBe('GET, POST, DELETE, OPTIONS')
    expect(response.headers.get('allow')).toBe('GET, POST, DELETE, OPTIONS')
    const allowed = (response.headers.get('access-control-allow-headers') ?? '').toLowerCase()
    for (const name of ['authorization', 'content-type', 'mcp-session-id', 'mcp-protocol-version']) expect(allowed).toContain(name)
    expect(versionHeaders(response)).toEqual({ version: null, latest: null })
  })

  it('a preflight to an unknown path or App succeeds, so the browser sends the request and can read its 404 (regression)', async () => {
    for (const url of ['http://weather.localhost/foo', 'http://weather.localhost/v1.x', 'http://nope.localhost/v1']) {
      const preflight = await get(url, {
        method: 'OPTIONS',
        headers: { origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' },
      })
      expect(preflight.status).toBe(204)
      expect(preflight.headers.get('access-control-allow-origin')).toBe(origin)
      const request = await platform.fetch(mcpRequest(url, { token: token('alice'), headers: { origin } }), { clientAddress: CLIENT })
      expect(request.status).toBe(404)
      expect(request.headers.get('access-control-allow-origin')).toBe(origin)
      expect(await json(request)).toEqual(bodies.notFound)
    }
    // A plain OPTIONS (no preflight: no Access-Control-Request-Method), with an Origin or without, is still a 404 there.
    expect((await get('http://weather.localhost/foo', { method: 'OPTIONS' })).status).toBe(404)
    const plain = await get('http://weather.localhost/foo', { method: 'OPTIONS', headers: { origin } })
    expect(plain.status).toBe(404)
    expect(plain.headers.get('access-control-allow-origin')).toBe(origin)
    expect(await json(plain)).toEqual(bodies.notFound)
  })

  it('a 405 is readable by a browser: Allow is exposed, with the headers every other error answer exposes', async () => {
    const head = await platform.fetch(mcpRequest('http://weather.localhost/v1', { method: 'HEAD', token: token('alice'), headers: { origin } }), { clientAddress: CLIENT })
    expect(head.status).toBe(405)
    expect(head.headers.get('access-control-expose-headers')).toContain('Allow')
    const metadata = await get(metadataUrl('weather'), { method: 'POST', headers: { origin }, body: '{}' })
    expect(metadata.status).toBe(405)
    expect(metadata.headers.get('access-control-allow-origin')).toBe('*')
    expect(metadata.headers.get('access-control-expose-headers')).toBe(head.headers.get('access-control-expose-headers'))
  })

  it('a 401 to a browser exposes WWW-Authenticate so the client can find the metadata', async () => {
    const response = await platform.fetch(mcpRequest('http://weather.localhost/v1', { headers: { origin } }), {
      clientAddress: CLIENT,
    })
    expect(response.status).toBe(401)
    expect(response.headers.get('access-control-allow-origin')).toBe(origin)
    expect(response.headers.get('access-control-expose-headers')).toContain('WWW-Authenticate')
  })

  it('a success to a browser exposes the session and version headers', async () => {
    const response = await platform.fetch(mcpRequest('http://weather.localhost/v1', { token: token('alice'), headers: { origin } }), {
      clientAddress: CLIENT,
    })
    expect(response.status).toBe(200)
    expect(response.headers.get('access-control-allow-origin')).toBe(origin)
    const exposed = response.headers.get('access-control-expose-headers') ?? ''
    for (const name of ['Mcp-Session-Id', 'X-MCP-Version', 'X-MCP-Latest-Version']) expect(exposed).toContain(name)
  })
})
