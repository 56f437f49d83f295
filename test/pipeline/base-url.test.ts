/**
 * The App address a platform gives as `baseUrl` (spec 4.2, 5.1): the 401's `resource_metadata`
 * URL must be one the dispatcher serves the document at, whatever the address's trailing slash
 * or path, and the document's `resource` the address the MCP SDK's client checks.
 */
import { discoverOAuthProtectedResourceMetadata } from '@modelcontextprotocol/sdk/client/auth.js'
import { type DispatcherOptions, createDispatcher, createMemorySubscriptionStore, createMemoryTokenStore, createTokenService, generateApiToken } from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { HOST, createFixture } from '../adapters/helpers.js'

const METADATA = '/.well-known/oauth-protected-resource'
const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })

/** The Web adapter over the fixture's dispatcher with `options` changed; the App answers 200. */
function serve(options: Partial<DispatcherOptions>) {
  const fixture = createFixture()
  const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, ...options })
  const handle = mcpDispatch({ dispatcher, handler: () => Response.json({ jsonrpc: '2.0', id: 1, result: { tools: [] } }) })
  const fetch = async (input: string | URL | Request, init?: RequestInit) => {
    const response = await handle(new Request(input, init), { clientAddress: '127.0.0.1' })
    return response ?? new Response('not ours', { status: 418 })
  }
  return { fetch, errors: fixture.errors }
}

/** The `resource_metadata` URL of an unauthenticated `tools/list` to `url`. */
async function challengeOf(fetch: (url: string, init?: RequestInit) => Promise<Response>, url: string): Promise<string> {
  const response = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: TOOLS_LIST })
  expect(response.status).toBe(401)
  return /resource_metadata="([^"]+)"/.exec(response.headers.get('www-authenticate') ?? '')![1]!
}

describe('baseUrl: where the 401 sends a client is where the document is', () => {
  it('a trailing slash on the address is dropped, in the challenge and in `resource` (regression: `//.well-known`, 404)', async () => {
    for (const slashes of ['/', '//']) {
      const { fetch, errors } = serve({ baseUrl: (_request, app) => `https://${app.slug}.apps.example.com${slashes}` })
      const url = await challengeOf(fetch, `https://${HOST}/v1`)
      expect(url).toBe(`https://weather.apps.example.com${METADATA}`)
      // The platform routes that host to this dispatcher: what the client fetches there.
      const doc = await fetch(`https://${HOST}${METADATA}`)
      expect(doc.status).toBe(200)
      expect((await doc.json()).resource).toBe('https://weather.apps.example.com')
      expect(errors).toEqual([])
    }
  })

  it('an address without the basePath: the document is served at the address, as well as under the mount (regression: 404 there)', async () => {
    const { fetch, errors } = serve({ basePath: '/mcp', baseUrl: (request) => request.origin })
    const url = await challengeOf(fetch, `http://${HOST}/mcp/v1`)
    expect(url).toBe(`http://${HOST}${METADATA}`)
    for (const at of [url, `http://${HOST}/mcp${METADATA}`]) {
      const doc = await fetch(at)
      expect(doc.status, at).toBe(200)
      expect((await doc.json()).resource).toBe(`http://${HOST}`)
    }
    // The MCP SDK's client, from the 401 on: it finds the document, and its resource covers the endpoint.
    const found = await discoverOAuthProtectedResourceMetadata(`http://${HOST}/mcp/v1`, { resourceMetadataUrl: new URL(url) }, fetch)
    expect(found.resource).toBe(`http://${HOST}`)
    // Nothing else outside the mount is answered: other paths, a path-suffixed document, an unknown App.
    for (const path of ['/v1', `${METADATA}/mcp`, `/other${METADATA}`]) expect((await fetch(`http://${HOST}${path}`)).status, path).toBe(404)
    expect((await fetch(`http://nowhere.localhost${METADATA}`)).status).toBe(404)
    expect(errors).toEqual([])
  })

  it('an address with a path of its own outside the mount: the document at that path', async () => {
    const { fetch } = serve({ basePath: '/mcp', baseUrl: (request) => `${request.origin}/apps/weather` })
    const url = await challengeOf(fetch, `http://${HOST}/mcp/v1`)
    expect(url).toBe(`http://${HOST}/apps/weather${METADATA}`)
    expect((await fetch(url)).status).toBe(200)
    expect((await fetch(`http://${HOST}${METADATA}`)).status).toBe(404)
  })

  it('with the default address (origin + basePath), the origin root has no document, and a probe there asks no store', async () => {
    const fixture = createFixture()
    let lookups = 0
    const apps = { ...fixture.apps, getAppBySlug: (slug: string) => (lookups++, fixture.apps.getAppBySlug(slug)) }
    const { fetch, errors } = serve({ basePath: '/mcp', apps })
    expect(await challengeOf(fetch, `http://${HOST}/mcp/v1`)).toBe(`http://${HOST}/mcp${METADATA}`)
    expect((await fetch(`http://${HOST}/mcp${METADATA}`)).status).toBe(200)
    const before = lookups
    // Clients probe the root (RFC 9728's rule without the 401): answered 404 as any path outside the mount.
    for (const path of [METADATA, `/x${METADATA}`]) expect((await fetch(`http://${HOST}${path}`)).status).toBe(404)
    expect(lookups).toBe(before)
    expect(errors).toEqual([])
  })

  it('a path that only begins with the basePath (/mcpx, /mcp.v1) is outside the mount, on a segment boundary: 404, asking no store', async () => {
    const fixture = createFixture()
    let lookups = 0
    const apps = { ...fixture.apps, getAppBySlug: (slug: string) => (lookups++, fixture.apps.getAppBySlug(slug)) }
    const { fetch, errors } = serve({ basePath: '/mcp', apps })
    for (const path of ['/mcpx', '/mcpx/v1', '/mcp.v1', `/mcpx${METADATA}`]) {
      const response = await fetch(`http://${HOST}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS_LIST })
      expect(response.status, path).toBe(404)
    }
    expect(lookups).toBe(0)
    expect((await fetch(`http://${HOST}/mcp/v1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS_LIST })).status).toBe(401)
    expect(lookups).toBe(1)
    expect(errors).toEqual([])
  })

  it("the handler is told the App address the 401 and the metadata name: origin + basePath, or baseUrl's answer without its trailing slash", async () => {
    for (const [options, path, address] of [
      [{}, '/v1', `http://${HOST}`],
      [{ basePath: '/mcp' }, '/mcp/v1', `http://${HOST}/mcp`],
      [{ basePath: '/mcp', baseUrl: () => 'https://weather.apps.example.com/' }, '/mcp/v1', 'https://weather.apps.example.com'],
    ] as const) {
      const fixture = createFixture()
      const handle = mcpDispatch({
        dispatcher: createDispatcher({ ...fixture.dispatcherOptions, ...options }),
        handler: (_request, context) => Response.json({ baseUrl: context.baseUrl }),
      })
      const response = await handle(
        new Request(`http://${HOST}${path}`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' }, body: TOOLS_LIST }),
        { clientAddress: '127.0.0.1' },
      )
      expect(await response.json(), path).toEqual({ baseUrl: address })
      expect(fixture.errors).toEqual([])
    }
  })

  it('a baseUrl that answers no string, or throws, fails the request as a callback, saying what it answered', async () => {
    const fixture = createFixture()
    // A token store that answers with promises (the lookup goes on asynchronously), and an
    // OAuth validator that refuses: the address is asked for on either path.
    const memory = createMemoryTokenStore()
    const asyncTokens = createTokenService({
      store: { ...memory, findByHash: async (hash) => memory.findByHash(hash) },
      apps: fixture.apps,
      subscriptions: createMemorySubscriptionStore([]),
    })
    const refusing = { validate: async () => ({ active: false as const, reason: 'refused' }) }
    const bearer = (token: string) => ({ method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${token}` }, body: TOOLS_LIST })
    const cases: Array<[Partial<DispatcherOptions>, RequestInit]> = [
      [{}, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS_LIST }],
      // Well formed, so it is looked up (a malformed one is refused before any lookup).
      [{ tokens: asyncTokens }, bearer(generateApiToken())],
      [{ oauth: refusing }, bearer('an-oauth-access-token')],
    ]
    for (const answer of [undefined, null, new URL('https://weather.apps.example.com/'), 'throws', 'weather.apps.example.com', 'javascript:alert(1)', 'https:///x', 'https://weather.apps.example.com/#f', 'https://weather.apps.example.com?tenant=1', 'https://weather.apps.example.com/a b', 'https://u:Sup3rSecretPw@weather.apps.example.com']) {
      const baseUrl = () => {
        if (answer === 'throws') throw new Error('no address for this App')
        return answer as unknown as string
      }
      for (const [options, init] of cases) {
        const { fetch, errors } = serve({ baseUrl, ...options })
        const response = await fetch(`http://${HOST}/v1`, init)
        expect(response.status).toBe(503)
        expect(errors.map((e) => e.context)).toEqual(['callback failed'])
        expect(String(errors[0]!.error)).toContain(
          answer === 'throws'
            ? 'no address for this App'
            : typeof answer === 'string'
              ? 'the baseUrl option answered a string that is no http(s) URL'
              : `the baseUrl option answered ${answer === null ? 'null' : typeof answer}, not a string`,
        )
        // Credentials in an address are neither published nor quoted (regression: served in `resource_metadata`).
        expect(String(errors[0]!.error)).not.toContain('Sup3rSecretPw')
        expect(response.headers.get('www-authenticate') ?? '').not.toContain('Sup3rSecretPw')
      }
    }
  })
})

describe('callbacks of the metadata document', () => {
  it('an authorizationServers function that throws fails the document as a callback (503, `callback failed`), not as the App store', async () => {
    const { fetch, errors } = serve({
      baseUrl: (request) => request.origin,
      authorizationServers: () => {
        throw new Error('no issuer configured for this App')
      },
    })
    expect((await fetch(`http://${HOST}${METADATA}`)).status).toBe(503)
    expect(errors.map((e) => e.context)).toEqual(['callback failed'])
  })

  it('an authorizationServers function that answers anything but an array of URLs fails the document, saying what it answered (it was served as given: a string as its characters)', async () => {
    const answers: Array<[unknown, string]> = [
      ['https://auth.example.com', 'string'],
      [Promise.resolve(['https://auth.example.com']), 'object'],
      [['https://auth.example.com', 'auth'], 'an array holding something that is no http(s) URL'],
      [[1n], 'an array holding something that is no http(s) URL'],
      // A URL clients cannot sign in at (regression: published as given).
      [['javascript:alert(1)'], 'an array holding something that is no http(s) URL'],
      // Holes are no URLs either (`every` alone skips them).
      [new Array(2), 'an array holding something that is no http(s) URL'],
      [null, 'null'],
    ]
    for (const [answer, what] of answers) {
      const { fetch, errors } = serve({ authorizationServers: () => answer as string[] })
      expect((await fetch(`http://${HOST}${METADATA}`)).status, what).toBe(503)
      expect(errors.map((e) => e.context)).toEqual(['callback failed'])
      expect(String(errors[0]!.error)).toContain(`the authorizationServers option answered ${what}, not an array of URLs`)
    }
    // Issuer identifiers, as at creation: no query, fragment, password or space (regression:
    // published as given).
    for (const url of ['https://auth.example.com/?tenant=1', 'https://u:p@auth.example.com', 'https://auth.example.com\n']) {
      const { fetch, errors } = serve({ authorizationServers: () => [url] })
      expect((await fetch(`http://${HOST}${METADATA}`)).status, url).toBe(503)
      expect(String(errors[0]!.error)).toContain('the authorizationServers option answered an array holding a URL that is no issuer identifier')
      expect(String(errors[0]!.error)).not.toContain('u:p')
    }
    // With oauth, a document must name where to sign in (regression: served with none).
    const { fetch: withOAuth, errors } = serve({ oauth: { validate: async () => ({ active: false as const, reason: 'refused' }) }, authorizationServers: () => [] })
    expect((await withOAuth(`http://${HOST}${METADATA}`)).status).toBe(503)
    expect(String(errors[0]!.error)).toContain('the authorizationServers option answered an empty array, and oauth is given')
    const { fetch } = serve({ authorizationServers: (app) => [`https://auth.example.com/${app.slug}`] })
    expect((await (await fetch(`http://${HOST}${METADATA}`)).json()).authorization_servers).toEqual(['https://auth.example.com/weather'])
  })
})

describe('CORS and caches (Fetch standard, "CORS protocol and HTTP caches")', () => {
  it('a 404 or 405 answered without CORS headers (no Origin) varies by Origin, so a shared cache keeps it from browser pages', async () => {
    for (const allowedOrigins of [undefined, ['https://allowed.example']]) {
      const { fetch } = serve({ allowedOrigins })
      const missing = await fetch(`http://${HOST}/nowhere`)
      expect(missing.status).toBe(404)
      expect(missing.headers.get('vary')).toBe('Origin')
      expect(missing.headers.get('access-control-allow-origin')).toBeNull()
      const refused = await fetch(`http://${HOST}/v1`, { method: 'PUT' })
      expect(refused.status).toBe(405)
      expect(refused.headers.get('vary')).toBe('Origin')
      // With an Origin, the CORS headers a browser needs.
      const browser = await fetch(`http://${HOST}/nowhere`, { headers: { origin: 'https://allowed.example' } })
      expect(browser.headers.get('access-control-allow-origin')).toBe(allowedOrigins ? 'https://allowed.example' : '*')
    }
  })

  it('with cors off nothing is added', async () => {
    const { fetch } = serve({ cors: false })
    expect((await fetch(`http://${HOST}/nowhere`)).headers.get('vary')).toBeNull()
  })
})

describe('dispatcher.metadata(app, baseUrl), the document to serve elsewhere', () => {
  const app = { id: 'app_weather', slug: 'weather', name: 'Weather' }
  const dispatcher = createDispatcher(createFixture().dispatcherOptions)

  it('names the address as the dispatcher’s own document does: trailing slashes dropped (regression: `resource` …/mcp/, another string than the 401 link’s)', () => {
    expect(dispatcher.metadata(app, 'https://weather.example.com/mcp/').resource).toBe('https://weather.example.com/mcp')
    expect(dispatcher.metadata(app, 'https://weather.example.com//').resource).toBe('https://weather.example.com')
    expect(dispatcher.metadata(app, 'https://weather.example.com').resource).toBe('https://weather.example.com')
  })

  it.each([['weather.example.com/mcp'], ['https://weather.example.com/?x=1'], ['https://weather.example.com/#f'], ['https://weather.example.com/a b'], ['https://u:Sup3rSecretPw@weather.example.com'], ['https://token@weather.example.com/mcp'], ['javascript:alert(1)'], [''], [undefined], [new URL('https://weather.example.com')]])(
    'refuses %j, which is no App address, with a TypeError saying what it takes (regression: published as given)',
    (baseUrl) => {
      expect(() => dispatcher.metadata(app, baseUrl as string)).toThrow(
        expect.objectContaining({ name: 'TypeError', message: expect.stringContaining('http(s) URL without query, fragment, credentials or spaces') }),
      )
    },
  )
})
