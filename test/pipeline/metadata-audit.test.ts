/**
 * From an audit of the protected-resource metadata (spec 2.2, 4.2; RFC 9728), the 401 challenge
 * (spec 5.1; RFC 6750) and the client address behind proxies (DESIGN.md "Adapters"), through the
 * Web adapter with real `Request` objects.
 */
import { discoverOAuthProtectedResourceMetadata } from '@modelcontextprotocol/sdk/client/auth.js'
import { type AppRecord, type DispatcherOptions, type TrustProxy, createDispatcher } from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { HOST, createFixture } from '../adapters/helpers.js'

const METADATA = '/.well-known/oauth-protected-resource'
const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
const CHALLENGE = `Bearer resource_metadata="http://${HOST}${METADATA}"`

/** The Web adapter over the fixture's dispatcher with `options` changed; the App answers 200 and counts its calls. */
function serve(options: Partial<DispatcherOptions> = {}, adapter: { trustProxy?: TrustProxy; clientAddress?: string } = {}, fixture = createFixture()) {
  const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, ...options })
  const handled: Request[] = []
  const handle = mcpDispatch({
    dispatcher,
    handler: (request) => {
      handled.push(request)
      return Response.json({ jsonrpc: '2.0', id: 1, result: { tools: [] } })
    },
    ...(adapter.trustProxy !== undefined && { trustProxy: adapter.trustProxy }),
  })
  const fetch = async (input: string | URL | Request, init?: RequestInit) => {
    const response = await handle(new Request(input, init), { clientAddress: adapter.clientAddress ?? '127.0.0.1' })
    return response ?? new Response('not ours', { status: 418 })
  }
  return { fetch, handled, fixture }
}

describe('the metadata document when the App store answers a record without a name', () => {
  it('a null name is left out, so the MCP SDK client still reads the document (regression: "resource_name": null, refused by its schema)', async () => {
    const fixture = createFixture()
    const weather = await fixture.apps.getAppBySlug('weather')
    // A platform's store over a nullable column: what JavaScript hands the dispatcher.
    const unnamed = { ...weather, name: null } as unknown as AppRecord
    const { fetch, fixture: { errors } } = serve({ resolveApp: () => unnamed }, {}, fixture)

    const response = await fetch(`http://${HOST}${METADATA}`)
    expect(response.status).toBe(200)
    const doc = (await response.json()) as Record<string, unknown>
    expect('resource_name' in doc).toBe(false)
    expect(doc).toEqual({
      resource: `http://${HOST}`,
      authorization_servers: ['https://auth.example.com'],
      bearer_methods_supported: ['header'],
      scopes_supported: ['openid', 'profile', 'email'],
    })

    // What an MCP client does with the 401's resource_metadata: it parses the document.
    const discovered = await discoverOAuthProtectedResourceMetadata(`http://${HOST}/v1`, { resourceMetadataUrl: `http://${HOST}${METADATA}` }, (url, init) =>
      fetch(String(url), init),
    )
    expect(discovered.resource).toBe(`http://${HOST}`)
    expect(discovered.authorization_servers).toEqual(['https://auth.example.com'])
    expect(errors).toEqual([])
  })

  it('a named App keeps its resource_name', async () => {
    const { fetch } = serve()
    const doc = (await (await fetch(`http://${HOST}${METADATA}`)).json()) as Record<string, unknown>
    expect(doc.resource_name).toBe('Weather')
  })
})

describe('the metadata document answers whatever comes with the request (spec 4.2: no credential needed)', () => {
  it.each([
    ['a query string', `${METADATA}?resource=https://evil.example&x=1`, {}],
    ['a Basic credential', METADATA, { authorization: 'Basic Zm9vOmJhcg==' }],
    ['an empty Bearer', METADATA, { authorization: 'Bearer' }],
    ['a malformed Bearer', METADATA, { authorization: 'Bearer a b "c"' }],
    ['an unknown API token', METADATA, { authorization: 'Bearer svc_000000000000000000000000000000000000000000AAAA' }],
  ])('with %s: the same 200 document, no challenge', async (_name, path, headers) => {
    const { fetch, handled } = serve()
    const response = await fetch(`http://${HOST}${path}`, { headers })
    expect(response.status).toBe(200)
    expect(response.headers.get('www-authenticate')).toBeNull()
    expect(response.headers.get('content-type')).toBe('application/json')
    expect(response.headers.get('cache-control')).toBe('public, max-age=3600')
    expect(((await response.json()) as { resource: string }).resource).toBe(`http://${HOST}`)
    expect(handled).toHaveLength(0)
  })
})

describe('RFC 6750 sections 2.2 and 2.3: a token in the query string or a form body is no credential', () => {
  it('a valid API token in the query is not accepted: 401 with no error code (RFC 6750 section 3.1: no supported method used), the token echoed nowhere', async () => {
    const { fetch, handled, fixture } = serve()
    const token = fixture.tokens.alice
    // The same token in the header is served: the refusal is about where it was sent.
    const served = await fetch(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: TOOLS_LIST })
    expect(served.status).toBe(200)

    const response = await fetch(`http://${HOST}/v1?access_token=${token}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS_LIST })
    expect(response.status).toBe(401)
    expect(response.headers.get('www-authenticate')).toBe(CHALLENGE)
    const text = await response.text()
    expect(text).not.toContain(token)
    for (const value of response.headers.values()) expect(value).not.toContain(token)
    expect(handled).toHaveLength(1)
  })

  it('a token in an application/x-www-form-urlencoded body: 401 with no error code, the body not read, the token echoed nowhere', async () => {
    const { fetch, handled, fixture } = serve()
    const token = fixture.tokens.alice
    const response = await fetch(`http://${HOST}/v1`, { method: 'POST', headers: { 'content-type': 'application/x-www-form-urlencoded' }, body: `access_token=${token}` })
    expect(response.status).toBe(401)
    expect(response.headers.get('www-authenticate')).toBe(CHALLENGE)
    const text = await response.text()
    expect(text).not.toContain(token)
    expect(handled).toHaveLength(0)
  })

  it('a refused Bearer token: error="invalid_token", and the token is echoed nowhere', async () => {
    const { fetch } = serve()
    const token = 'svc_thisIsNotARealTokenButLooksLikeOne0000000000'
    const response = await fetch(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: TOOLS_LIST })
    expect(response.status).toBe(401)
    expect(response.headers.get('www-authenticate')).toBe(`${CHALLENGE}, error="invalid_token"`)
    expect(await response.text()).not.toContain(token)
    for (const value of response.headers.values()) expect(value).not.toContain(token)
  })
})

describe('client address behind a trusted proxy, against an IPv4 allowlist (203.0.113.0/24)', () => {
  const PROXY = '10.0.0.2'
  async function statusWith(trustProxy: TrustProxy | undefined, socket: string, forwardedFor: string | undefined): Promise<number> {
    const { fetch, fixture } = serve({}, { ...(trustProxy !== undefined && { trustProxy }), clientAddress: socket })
    const headers: Record<string, string> = { authorization: `Bearer ${fixture.tokens.ipLimited}`, 'content-type': 'application/json' }
    if (forwardedFor !== undefined) headers['x-forwarded-for'] = forwardedFor
    const response = await fetch(`http://${HOST}/v1`, { method: 'POST', headers, body: TOOLS_LIST })
    return response.status
  }

  it('without trustProxy the header is never read, whatever it says', async () => {
    expect(await statusWith(undefined, PROXY, '203.0.113.7')).toBe(403)
    expect(await statusWith(undefined, '203.0.113.7', '10.0.0.1')).toBe(200)
  })

  it.each([
    ['an IPv4 hop', '203.0.113.7'],
    ['an IPv4 hop with a port', '203.0.113.7:51234'],
    ['an IPv4-mapped IPv6 hop, bracketed with a port', '[::ffff:203.0.113.7]:443'],
    ['an IPv4-mapped IPv6 hop in hex', '::ffff:cb00:7107'],
    ['spoofed entries left of the hop the proxy wrote', '198.51.100.1, 203.0.113.7'],
  ])('%s from the trusted proxy is the client', async (_name, forwardedFor) => {
    expect(await statusWith(['10.0.0.0/8'], PROXY, forwardedFor)).toBe(200)
    expect(await statusWith(1, PROXY, forwardedFor)).toBe(200)
    // The proxy seen by a dual-stack socket as IPv4-mapped IPv6 is still the trusted one.
    expect(await statusWith(['10.0.0.0/8'], `::ffff:${PROXY}`, forwardedFor)).toBe(200)
  })

  it.each([
    ['"unknown" (RFC 7239)', 'unknown'],
    ['an obfuscated identifier', '_hidden'],
    ['a Forwarded-style quoted value', '"203.0.113.7"'],
    ['a Forwarded-style pair', 'for=203.0.113.7'],
    ['a leading-zero IPv4 (octal in some parsers)', '203.0.113.007'],
    ['a hop the proxy wrote after an allowed one', '203.0.113.7, 198.51.100.1'],
  ])('%s as the client hop fails the allowlist closed', async (_name, forwardedFor) => {
    expect(await statusWith(['10.0.0.0/8'], PROXY, forwardedFor)).toBe(403)
    expect(await statusWith(1, PROXY, forwardedFor)).toBe(403)
  })

  it('a peer outside the trusted ranges is the client, whatever the header says', async () => {
    expect(await statusWith(['10.0.0.0/8'], '198.51.100.9', '203.0.113.7')).toBe(403)
    expect(await statusWith(['10.0.0.0/8'], '203.0.113.7', '198.51.100.9')).toBe(200)
  })
})

describe('the 401 challenge names where the document is served, whatever characters the baseUrl holds', () => {
  it('a baseUrl with a quote and a backslash: the resource_metadata URL is fetched, 200 (regression: both were dropped, naming /pqr/… where nothing is served)', async () => {
    // The endpoint at /mcp, the App's address (and so its document) at a path of the platform's.
    const { fetch } = serve({ basePath: '/mcp', baseUrl: () => `http://${HOST}/p"q\\r` })
    const refused = await fetch(`http://${HOST}/mcp/v1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS_LIST })
    expect(refused.status).toBe(401)
    const challenge = refused.headers.get('www-authenticate')!
    const url = /resource_metadata="([^"]*)"/.exec(challenge)?.[1]
    expect(url).toBe(`http://${HOST}/p%22q/r${METADATA}`)
    const response = await fetch(url!)
    expect(response.status).toBe(200)
  })
})
