/**
 * Audit: the dispatch layer mounted below the host's root, as platforms mount it (Express
 * `app.use('/mcp', …)` and nested routers, Fastify contexts with a `prefix` and nested
 * prefixes, Hono `app.route` and `basePath`, the Web adapter behind a `basePath`). For each:
 * the version path is read after the mount, the handler sees the full path, paths outside the
 * mount are not the App's, and the metadata document, its `resource`, the 401's
 * `resource_metadata` and what the MCP SDK client discovers agree; an SDK client session with
 * an `svc_` token works through the mount. Real sockets on 127.0.0.1, on ports the system picks.
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import {
  discoverOAuthProtectedResourceMetadata,
  extractWWWAuthenticateParams,
  selectResourceURL,
} from '@modelcontextprotocol/sdk/client/auth.js'
import { serve } from '@hono/node-server'
import express from 'express'
import Fastify, { type FastifyInstance } from 'fastify'
import { Hono } from 'hono'
import { type DispatcherOptions, createDispatcher, createOAuthValidator, createTokenApi, type TokenService } from 'mcp-dispatch'
import { fromWebHandler as expressFromWeb, mcpDispatch as expressDispatch, serveTokenApi as expressTokenApi } from 'mcp-dispatch/express'
import { fromWebHandler as fastifyFromWeb, mcpDispatch as fastifyDispatch, serveTokenApi as fastifyTokenApi } from 'mcp-dispatch/fastify'
import { type WebMcpHandler, mcpDispatch as webDispatch, routeByVersion as webRoute } from 'mcp-dispatch/web'
import { afterAll, describe, expect, it } from 'vitest'
import { HOST, createFixture, rawRequest } from './helpers.js'
import { buildScenarioServer, createWebMcpHandler, readVersion } from './mcp.js'
import { localhostFetch } from '../helpers/platform.js'
import { EXPRESS, EXPRESS_KINDS } from '../helpers/express.js'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { TestOAuthClient, connectWithOAuth, recordingFetch } from '../oauth/helpers/oauth-client.js'

const METADATA = '/.well-known/oauth-protected-resource'
const closers: Array<() => Promise<void>> = []
afterAll(async () => {
  for (const close of closers.splice(0)) await close()
})

function listenOn(server: http.Server, port = 0): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, '127.0.0.1', () => resolve((server.address() as AddressInfo).port))
  })
}

function closeServer(server: http.Server): Promise<void> {
  server.closeAllConnections()
  return new Promise((resolve) => server.close(() => resolve()))
}

/** Serves `app` (an Express app) at `port`, by default one the system picks, closed after the file. */
function serveExpress(app: http.RequestListener, port?: number): Promise<number> {
  const server = http.createServer(app)
  closers.push(() => closeServer(server))
  return listenOn(server, port)
}

/** What the App handler saw: the path of its `Request`. */
interface Served {
  port: number
  seen: string[]
}

/** An App handler (SDK web-standard sessions, per version) that records the path it was handed. */
function appHandler(seen: string[]): WebMcpHandler {
  return webRoute((app, version) => {
    const sessions = createWebMcpHandler(() => buildScenarioServer(app.slug, version))
    closers.push(() => sessions.close())
    return (request) => {
      seen.push(new URL(request.url).pathname)
      return sessions.handle(request)
    }
  })
}

/** The dispatch layer of `options` and an App handler recording into `seen`: the middleware of an Express mount. */
function expressMcp(options: DispatcherOptions, seen: string[] = []) {
  return [expressDispatch({ dispatcher: options }), expressFromWeb(appHandler(seen))] as const
}

/** An Express error handler: records the error in `errors` and answers 500 (`body` as JSON, when given). */
function recordErrors(errors: unknown[], body?: unknown) {
  return (error: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
    errors.push(error)
    if (body === undefined) res.status(500).end()
    else res.status(500).json(body)
  }
}

type Mount = { name: string; mount: string; start(make?: (basePath: string) => DispatcherOptions): Promise<Served> }

const fixture = createFixture()
const withBase = (basePath: string) => ({ ...fixture.dispatcherOptions, basePath })

const MOUNTS: Mount[] = [
  {
    name: "Express app.use('/mcp', …)",
    mount: '/mcp',
    async start(make = withBase) {
      const seen: string[] = []
      const app = express()
      app.disable('x-powered-by')
      app.get('/health', (_req, res) => void res.json({ ok: true }))
      app.use('/mcp', ...expressMcp(make('/mcp'), seen))
      return { port: await serveExpress(app), seen }
    },
  },
  {
    name: "Express nested routers (app.use('/api', r1); r1.use('/mcp', …))",
    mount: '/api/mcp',
    async start(make = withBase) {
      const seen: string[] = []
      const app = express()
      app.disable('x-powered-by')
      const outer = express.Router()
      const inner = express.Router()
      inner.use(...expressMcp(make('/api/mcp'), seen))
      outer.use('/mcp', inner)
      app.use('/api', outer)
      return { port: await serveExpress(app), seen }
    },
  },
  {
    name: "Fastify register(…, { prefix: '/mcp' })",
    mount: '/mcp',
    async start(make = withBase) {
      const seen: string[] = []
      const app = Fastify({ forceCloseConnections: true }) as unknown as FastifyInstance
      app.removeAllContentTypeParsers()
      app.addContentTypeParser('*', (_request, _payload, done) => done(null))
      app.get('/health', async () => ({ ok: true }))
      await app.register(
        fastifyMcp(make('/mcp'), seen),
        { prefix: '/mcp' },
      )
      return { port: await serveFastify(app), seen }
    },
  },
  {
    name: "Fastify nested prefixes ('/api' then '/mcp')",
    mount: '/api/mcp',
    async start(make = withBase) {
      const seen: string[] = []
      const app = Fastify({ forceCloseConnections: true }) as unknown as FastifyInstance
      app.removeAllContentTypeParsers()
      app.addContentTypeParser('*', (_request, _payload, done) => done(null))
      await app.register(
        async (api) => {
          await api.register(fastifyMcp(make('/api/mcp'), seen), { prefix: '/mcp' })
        },
        { prefix: '/api' },
      )
      return { port: await serveFastify(app), seen }
    },
  },
  {
    name: "Hono app.route('/mcp', sub)",
    mount: '/mcp',
    async start(make = withBase) {
      const seen: string[] = []
      const handle = webDispatch({ dispatcher: make('/mcp'), handler: appHandler(seen) })
      const sub = new Hono()
      sub.all('/*', (c) => handle(c.req.raw))
      const app = new Hono()
      app.get('/health', (c) => c.json({ ok: true }))
      app.route('/mcp', sub)
      return { port: await serveHono(app.fetch), seen }
    },
  },
  {
    name: "Hono basePath('/mcp')",
    mount: '/mcp',
    async start(make = withBase) {
      const seen: string[] = []
      const handle = webDispatch({ dispatcher: make('/mcp'), handler: appHandler(seen) })
      const app = new Hono().basePath('/mcp')
      app.all('/*', (c) => handle(c.req.raw))
      return { port: await serveHono(app.fetch), seen }
    },
  },
  {
    name: "Web adapter, basePath '/mcp' (a fetch handler that serves the whole host)",
    mount: '/mcp',
    async start(make = withBase) {
      const seen: string[] = []
      const handle = webDispatch({ dispatcher: make('/mcp'), handler: appHandler(seen) })
      return { port: await serveHono((request) => handle(request)), seen }
    },
  },
]

/** The dispatch plugin and the App behind it on every path of a Fastify context (its mount). */
function fastifyMcp(dispatcher: DispatcherOptions, seen: string[]) {
  return async (mcp: FastifyInstance) => {
    await mcp.register(fastifyDispatch({ dispatcher }))
    const h = fastifyFromWeb(appHandler(seen))
    mcp.all('/', h)
    mcp.all('/*', h)
  }
}

/** `app` listening on 127.0.0.1, closed after the file. */
async function serveFastify(app: FastifyInstance): Promise<number> {
  await app.listen({ port: 0, host: '127.0.0.1' })
  closers.push(() => app.close())
  return (app.server.address() as AddressInfo).port
}

async function serveHono(fetch: (request: Request) => Response | Promise<Response>): Promise<number> {
  const server = await new Promise<http.Server>((resolve) => {
    const s = serve({ fetch, port: 0, hostname: '127.0.0.1' }, () => resolve(s as unknown as http.Server)) as unknown as http.Server
  })
  closers.push(() => closeServer(server))
  return (server.address() as AddressInfo).port
}

const alice = () => ({ authorization: `Bearer ${fixture.tokens.alice}` })
const TOOLS = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
const post = (path: string, headers: Record<string, string> = {}) => ({
  method: 'POST',
  path,
  headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
  body: TOOLS,
})

describe.each(MOUNTS)('$name', ({ mount, start }) => {
  let served: Served
  const origin = () => `http://${HOST}:${served.port}`

  it('serves an SDK client session with an svc_ token, the version read after the mount; the handler sees the full path', async () => {
    served = await start()
    for (const [path, version] of [
      ['', '2.0.0'],
      ['/', '2.0.0'],
      ['/v1', '1.0.0'],
      ['/v1.0', '1.0.0'],
      ['/v1.0.0', '1.0.0'],
      ['/v2/', '2.0.0'],
    ] as const) {
      served.seen.length = 0
      const result = await readVersion(`${origin()}${mount}${path}`, { fetch: localhostFetch, headers: alice() })
      expect(JSON.stringify(result), `${mount}${path}`).toContain(`"text":"${version}"`)
      expect(new Set(served.seen), `${mount}${path}`).toEqual(new Set([`${mount}${path}`]))
    }
  })

  it('the metadata under the mount, its resource, the 401 resource_metadata and the SDK discovery agree', async () => {
    const resource = `${origin()}${mount}`
    const doc = await localhostFetch(`${resource}${METADATA}`)
    expect(doc.status).toBe(200)
    expect((await doc.json()).resource).toBe(resource)
    for (const path of ['', '/', '/v1', '/v1.0', '/v2.0.0']) {
      const serverUrl = new URL(`${resource}${path}`)
      const refused = await localhostFetch(serverUrl, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS })
      expect(refused.status).toBe(401)
      const { resourceMetadataUrl } = extractWWWAuthenticateParams(refused)
      expect(resourceMetadataUrl?.href).toBe(`${resource}${METADATA}`)
      // The SDK's discovery, from the 401's link, and its check that the URL it calls lies
      // under the document's resource (selectResourceURL throws otherwise).
      const metadata = await discoverOAuthProtectedResourceMetadata(serverUrl, { resourceMetadataUrl }, localhostFetch)
      expect(metadata.resource).toBe(resource)
      expect((await selectResourceURL(serverUrl, {} as never, metadata))?.href).toBe(new URL(resource).href)
    }
  })

  it('a browser client: the preflights of the metadata (the SDK sends MCP-Protocol-Version) and of a version path, then the GET', async () => {
    const preflight = (path: string, method: string, headers: string) =>
      rawRequest(served.port, {
        method: 'OPTIONS',
        path,
        headers: { origin: 'https://allowed.example', 'access-control-request-method': method, 'access-control-request-headers': headers },
      })
    const meta = await preflight(`${mount}${METADATA}`, 'GET', 'mcp-protocol-version')
    expect(meta.status, JSON.stringify(meta)).toBeLessThan(300)
    expect(meta.headers['access-control-allow-origin']).toBeDefined()
    const rpc = await preflight(`${mount}/v1`, 'POST', 'authorization, content-type, mcp-protocol-version')
    expect(rpc.status, JSON.stringify(rpc)).toBeLessThan(300)
    expect(rpc.headers['access-control-allow-origin']).toBe('https://allowed.example')
    const doc = await rawRequest(served.port, { method: 'GET', path: `${mount}${METADATA}`, headers: { origin: 'https://allowed.example', 'mcp-protocol-version': '2025-06-18' } })
    expect([doc.status, doc.headers['access-control-allow-origin'] !== undefined]).toEqual([200, true])
  })

  it('paths outside the mount are not the App; paths under it that are no version are its 404', async () => {
    const notApp = async (path: string) => {
      const answer = await rawRequest(served.port, post(path, alice()))
      return answer.status === 404 && !answer.headers['x-mcp-version']
    }
    for (const path of ['/v1', `${mount}x/v1`, `/x${mount}/v1`, `${METADATA}`]) {
      expect(await notApp(path), path).toBe(true)
    }
    // The document's RFC 9728 address: the platform's 404 where the mount keeps it from the
    // dispatch layer, else the document's own refusal of a POST (see the discovery tests below).
    const inserted = await rawRequest(served.port, post(`${METADATA}${mount}`, alice()))
    expect([404, 405], inserted.body).toContain(inserted.status)
    expect(inserted.headers['x-mcp-version']).toBeUndefined()
    if (inserted.status === 405) expect(inserted.headers.allow).toBe('GET, HEAD, OPTIONS')
    for (const path of [`${mount}/x`, `${mount}/v1/x`, `${mount}//v1`, `${mount}/v1.2.3.4`]) {
      const answer = await rawRequest(served.port, post(path, alice()))
      expect([answer.status, JSON.parse(answer.body).error?.data], path).toEqual([404, { error: 'not_found' }])
    }
    // Another case, an escaped mount path: never the App (no resource of another spelling).
    for (const path of [mount.toUpperCase() + '/v1', mount.replace('m', '%6D') + '/v1', mount.replace('m', '%6d') + METADATA]) {
      const answer = await rawRequest(served.port, post(path, alice()))
      expect(answer.status, path).toBe(404)
      expect(answer.headers['x-mcp-version'], path).toBeUndefined()
    }
  })
})

describe('Express trust proxy under a mount', () => {
  /** Metadata resource and 401 link, for a request with `X-Forwarded-Proto: https`. */
  async function addresses(port: number, mount: string) {
    const forwarded = { 'x-forwarded-proto': 'https' }
    const doc = await rawRequest(port, { method: 'GET', path: `${mount}${METADATA}`, headers: forwarded })
    const refused = await rawRequest(port, post(`${mount}/v1`, forwarded))
    return { resource: JSON.parse(doc.body).resource, challenge: refused.headers['www-authenticate'] }
  }

  /** The App address at `/mcp`, in `scheme`, in the metadata's `resource` and in the 401's challenge alike. */
  async function expectAddresses(port: number, scheme: 'http' | 'https') {
    const { resource, challenge } = await addresses(port, '/mcp')
    expect(resource).toBe(`${scheme}://${HOST}/mcp`)
    expect(challenge).toBe(`Bearer resource_metadata="${scheme}://${HOST}/mcp${METADATA}"`)
  }

  it.each([
    ['the app that mounts the dispatch', 'app'],
    ['the parent of a mounted sub-app', 'parent'],
  ])("follows Express's trust proxy set on %s, the same in the metadata and the 401", async (_name, where) => {
    const app = express()
    const sub = express()
    app.set('trust proxy', 'loopback')
    if (where === 'app') {
      app.use('/mcp', ...expressMcp(withBase('/mcp')))
    } else {
      sub.use(...expressMcp(withBase('/mcp')))
      app.use('/mcp', sub)
    }
    const port = await serveExpress(app)
    await expectAddresses(port, 'https')
  })

  it('without trust proxy, the socket scheme in both', async () => {
    const app = express()
    app.use('/mcp', ...expressMcp(withBase('/mcp')))
    const port = await serveExpress(app)
    await expectAddresses(port, 'http')
  })

  it("a mount path written with a trailing slash (app.use('/mcp/'), basePath '/mcp/') is the same mount", async () => {
    const app = express()
    app.use('/mcp/', ...expressMcp(withBase('/mcp/')))
    const port = await serveExpress(app)
    await expectAddresses(port, 'http')
    expect(JSON.stringify(await readVersion(`http://${HOST}:${port}/mcp/v1`, { fetch: localhostFetch, headers: alice() }))).toContain('"text":"1.0.0"')
  })
})

describe('SDK discovery without the 401 link (path-aware, RFC 9728 section 3.1, then the root)', () => {
  /** What the MCP SDK client discovers from `url` alone (a new transport's `finishAuth`, a web client's callback page). */
  const discover = (url: string) => discoverOAuthProtectedResourceMetadata(new URL(url), undefined, localhostFetch)

  it('under a basePath finds the document at its RFC 9728 address, /.well-known/oauth-protected-resource/mcp, naming the App address (regression: 404, nothing found)', async () => {
    const errors: unknown[] = []
    const mounted = webDispatch({ dispatcher: withBase('/mcp'), handler: appHandler([]), onError: (error) => void errors.push(error) })
    const port = await serveHono((request) => mounted(request))
    const address = `http://${HOST}:${port}/mcp`
    for (const called of ['', '/', '/v1', '/v1.2', '/v1.2.3']) {
      expect((await discover(address + called)).resource, called).toBe(address)
    }
    // The document of the 401's link is the same one.
    const refused = await localhostFetch(`${address}/v1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS })
    const linked = await localhostFetch(extractWWWAuthenticateParams(refused).resourceMetadataUrl!)
    const inserted = await localhostFetch(`http://${HOST}:${port}${METADATA}/mcp`)
    expect([inserted.status, inserted.headers.get('cache-control'), inserted.headers.get('access-control-allow-origin')]).toEqual([200, 'public, max-age=3600', '*'])
    expect(await inserted.json()).toEqual(await linked.json())
    // HEAD and a browser's preflight, as at the linked address; other methods 405.
    const head = await localhostFetch(`http://${HOST}:${port}${METADATA}/mcp/v1`, { method: 'HEAD' })
    expect([head.status, await head.text()]).toEqual([200, ''])
    const preflight = await localhostFetch(`http://${HOST}:${port}${METADATA}/mcp`, {
      method: 'OPTIONS',
      headers: { origin: 'https://inspector.example', 'access-control-request-method': 'GET', 'access-control-request-headers': 'mcp-protocol-version' },
    })
    expect([preflight.status < 300, preflight.headers.get('access-control-allow-origin')]).toEqual([true, '*'])
    expect((await localhostFetch(`http://${HOST}:${port}${METADATA}/mcp`, { method: 'POST', body: TOOLS })).status).toBe(405)
    // Only the App address and its version paths: no document for another path, another mount,
    // another spelling, or the origin's root (the address of no App here).
    for (const path of [`${METADATA}/mcp/x`, `${METADATA}/mcp/v1/x`, `${METADATA}/mcpx`, `${METADATA}/MCP`, `${METADATA}/m%63p`, `${METADATA}/api/mcp`, `${METADATA}`, `${METADATA}/`, `${METADATA}/mcp${METADATA}`]) {
      const answer = await localhostFetch(`http://${HOST}:${port}${path}`)
      expect([answer.status, (await answer.json()).error?.data], path).toEqual([404, { error: 'not_found' }])
    }
    expect(errors).toEqual([])
  })

  it('with a baseUrl at the origin, finds the root document; with one of its own path, the document at that path inserted', async () => {
    const atOrigin = webDispatch({
      dispatcher: { ...withBase('/mcp'), baseUrl: (request) => request.origin },
      handler: appHandler([]),
    })
    const port2 = await serveHono((request) => atOrigin(request))
    const metadata = await discover(`http://${HOST}:${port2}/mcp/v1`)
    expect(metadata.resource).toBe(`http://${HOST}:${port2}`)
    const refused = await localhostFetch(`http://${HOST}:${port2}/mcp/v1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS })
    expect(extractWWWAuthenticateParams(refused).resourceMetadataUrl?.href).toBe(`http://${HOST}:${port2}${METADATA}`)
    // The App address is the origin: /.well-known/oauth-protected-resource/mcp would name another resource.
    expect((await localhostFetch(`http://${HOST}:${port2}${METADATA}/mcp`)).status).toBe(404)

    const elsewhere = webDispatch({
      dispatcher: { ...withBase('/mcp'), baseUrl: (request) => `${request.origin}/apps/weather` },
      handler: appHandler([]),
    })
    const port3 = await serveHono((request) => elsewhere(request))
    for (const path of [`/apps/weather${METADATA}`, `${METADATA}/apps/weather`, `${METADATA}/apps/weather/v1`]) {
      const doc = await localhostFetch(`http://${HOST}:${port3}${path}`)
      expect([doc.status, (await doc.json()).resource], path).toEqual([200, `http://${HOST}:${port3}/apps/weather`])
    }
    expect((await localhostFetch(`http://${HOST}:${port3}${METADATA}/mcp`)).status).toBe(404)
  })

  it('two Apps side by side on one origin (basePath /weather and /notes): each client finds its own App, where the root could name only one (regression: neither found one)', async () => {
    const notes = { ...fixture.apps, getAppBySlug: () => fixture.apps.getAppBySlug('weather') }
    const weather = webDispatch({ dispatcher: withBase('/weather'), handler: appHandler([]) })
    const other = webDispatch({ dispatcher: { ...withBase('/notes'), apps: notes }, handler: appHandler([]) })
    // The platform routes each App's paths, and its metadata address, to its dispatch layer.
    const port = await serveHono((request) => {
      const path = new URL(request.url).pathname
      return path.startsWith('/notes') || path.startsWith(`${METADATA}/notes`) ? other(request) : weather(request)
    })
    for (const app of ['weather', 'notes']) {
      expect((await discover(`http://${HOST}:${port}/${app}/v1`)).resource, app).toBe(`http://${HOST}:${port}/${app}`)
    }
  })

  it("Express and Fastify: the dispatch layer mounted a second time at the document's RFC 9728 address is served and is no mount mistake", async () => {
    const errors: unknown[] = []
    const onError = (error: unknown) => void errors.push(error)
    const dispatcher = createDispatcher(withBase('/mcp'))
    const app = express()
    app.disable('x-powered-by')
    app.use(['/mcp', `${METADATA}/mcp`], expressDispatch({ dispatcher, onError }), expressFromWeb(appHandler([])))
    const expressPort = await serveExpress(app)

    const fastify = Fastify({ forceCloseConnections: true }) as unknown as FastifyInstance
    const h = fastifyFromWeb(appHandler([]))
    for (const prefix of ['/mcp', `${METADATA}/mcp`]) {
      await fastify.register(
        async (mcp) => {
          await mcp.register(fastifyDispatch({ dispatcher, onError }))
          mcp.all('/', h)
          mcp.all('/*', h)
        },
        { prefix },
      )
    }
    const fastifyPort = await serveFastify(fastify)
    for (const port of [expressPort, fastifyPort]) {
      for (const called of ['/mcp', '/mcp/v1']) {
        expect((await discover(`http://${HOST}:${port}${called}`)).resource, `${port} ${called}`).toBe(`http://${HOST}:${port}/mcp`)
      }
      expect((await localhostFetch(`http://${HOST}:${port}${METADATA}/mcp/x`)).status).toBe(404)
    }
    expect(errors).toEqual([])
  })
})

describe("the dispatcher's basePath", () => {
  // Compared as sent with each request's path, and the App address (`resource`, the 401's
  // link) made from it: one no request path can be would 404 every request, silently, and name
  // an address with a space, query or fragment (refused from a baseUrl callback). The token
  // API's basePath is refused so (createTokenApi); the dispatcher's is the same kind of option.
  it.each(['/my mcp', '/café', '/mcp?x=1', '/mcp#x', '/a/../mcp', '/./mcp', '/mcp\\x'])('refuses %j, which no request path can be', (basePath) => {
    expect(() => createDispatcher(withBase(basePath))).toThrow(
      expect.objectContaining({ name: 'ConfigurationError', option: 'basePath', message: expect.stringContaining('percent-encoded') }),
    )
    // As the token API does.
    expect(() => createTokenApi({ tokens: fixture.dispatcherOptions.tokens as TokenService, authenticateSession: () => null, verifyCsrf: false, basePath })).toThrow(
      expect.objectContaining({ name: 'ConfigurationError', option: 'basePath' }),
    )
  })

  it.each([
    ['/mcp', '/mcp'],
    ['/mcp/', '/mcp'],
    ['/', ''],
    ['', ''],
    ['/m%63p', '/m%63p'],
    ['/caf%C3%A9', '/caf%C3%A9'],
    ['/api/mcp', '/api/mcp'],
  ])('takes %j (as %j)', (basePath, kept) => {
    expect(createDispatcher(withBase(basePath)).basePath).toBe(kept)
  })

  it('an escaped basePath is matched as sent, and the App address keeps its spelling', async () => {
    const handle = webDispatch({ dispatcher: withBase('/caf%C3%A9'), handler: appHandler([]) })
    const port = await serveHono((request) => handle(request))
    const resource = `http://${HOST}:${port}/caf%C3%A9`
    const doc = await localhostFetch(`http://${HOST}:${port}/café${METADATA}`)
    expect([doc.status, (await doc.json()).resource]).toEqual([200, resource])
    const refused = await localhostFetch(`${resource}/v1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS })
    expect(extractWWWAuthenticateParams(refused).resourceMetadataUrl?.href).toBe(`${resource}${METADATA}`)
    expect(JSON.stringify(await readVersion(`http://${HOST}:${port}/café/v1`, { fetch: localhostFetch, headers: alice() }))).toContain('"text":"1.0.0"')
  })
})

describe('the token API under a mount (its basePath holds the mount), beside the dispatch', () => {
  const COOKIE = 'dash=alice'
  const api = (basePath: string) =>
    createTokenApi({
      tokens: fixture.dispatcherOptions.tokens as TokenService,
      authenticateSession: (request) => (request.headers.get('cookie') === COOKIE ? { userId: 'alice' } : null),
      verifyCsrf: false,
      basePath,
    })

  const TARGETS: Array<[string, string, () => Promise<number>]> = [
    ["Express app.use('/dash', …)", '/dash/api/tokens', async () => {
      const app = express()
      app.use('/dash', expressTokenApi(api('/dash/api/tokens')))
      app.use('/mcp', ...expressMcp(withBase('/mcp')))
      return serveExpress(app)
    }],
    ["Express nested routers ('/dash' then '/api')", '/dash/api/tokens', async () => {
      const app = express()
      const dash = express.Router()
      const inner = express.Router()
      inner.use(expressTokenApi(api('/dash/api/tokens')))
      dash.use('/api', inner)
      app.use('/dash', dash)
      app.use('/mcp', ...expressMcp(withBase('/mcp')))
      return serveExpress(app)
    }],
    ["Express, basePath '/dash/api/tokens/' (trailing slash)", '/dash/api/tokens', async () => {
      const app = express()
      app.use('/dash', expressTokenApi(api('/dash/api/tokens/')))
      app.use('/mcp', ...expressMcp(withBase('/mcp')))
      return serveExpress(app)
    }],
    ["Fastify context with prefix '/dash'", '/dash/api/tokens', async () => {
      const app = Fastify({ forceCloseConnections: true }) as unknown as FastifyInstance
      await app.register(async (dash) => {
        await dash.register(fastifyTokenApi(api('/dash/api/tokens')))
        dash.all('/*', async () => ({ dash: true }))
      }, { prefix: '/dash' })
      await app.register(fastifyMcp(withBase('/mcp'), []), { prefix: '/mcp' })
      return serveFastify(app)
    }],
    ["Hono app.route('/dash', sub)", '/dash/api/tokens', async () => {
      const tokenApi = api('/dash/api/tokens')
      const handle = webDispatch({ dispatcher: withBase('/mcp'), handler: appHandler([]) })
      const sub = new Hono()
      sub.all('/*', async (c) => (await tokenApi(c.req.raw)) ?? c.notFound())
      const app = new Hono()
      app.route('/dash', sub)
      app.all('/mcp/*', (c) => handle(c.req.raw))
      return serveHono(app.fetch)
    }],
  ]

  it.each(TARGETS)('%s: create, follow Location, and an SDK session with the created svc_ token', async (_name, base, start) => {
    const port = await start()
    const origin = `http://${HOST}:${port}`
    const created = await localhostFetch(`${origin}${base}`, {
      method: 'POST',
      headers: { cookie: COOKIE, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'mounted', servers: ['app_weather'], expires_in_days: 7 }),
    })
    const body = await created.json()
    expect(created.status, JSON.stringify(body)).toBe(201)
    expect(created.headers.get('location')).toBe(`${base}/${body.id}`)
    const read = await localhostFetch(new URL(created.headers.get('location')!, origin), { headers: { cookie: COOKIE } })
    expect([read.status, (await read.json()).id]).toEqual([200, body.id])
    const listed = await localhostFetch(`${origin}${base}/`, { headers: { cookie: COOKIE } })
    expect(listed.status).toBe(200)
    expect(JSON.stringify(await readVersion(`${origin}/mcp/v1`, { fetch: localhostFetch, headers: { authorization: `Bearer ${body.token}` } }))).toContain('"text":"1.0.0"')
    // Outside its basePath, not the API's (the mount alone, another case).
    for (const path of ['/api/tokens', '/dash/api', '/dash/api/tokensx', '/DASH/api/tokens']) {
      const other = await localhostFetch(`${origin}${path}`, { headers: { cookie: COOKIE } })
      const text = await other.text()
      expect(text.includes('"tokens"'), path).toBe(false)
    }
  })
})

describe('OAuth sign-in of the SDK client from a bare 401, through each mount (oidc-provider on 127.0.0.1)', () => {
  let auth: DevAuthServer
  it.each(MOUNTS)('$name', async ({ mount, start }) => {
    if (!auth) {
      auth = await startDevAuthServer({ accounts: ['alice'] })
      const started = auth
      closers.push(() => started.close())
    }
    const served = await start((basePath) => ({
      ...withBase(basePath),
      oauth: createOAuthValidator({ issuer: auth.issuer }),
      authorizationServers: [auth.issuer],
      scopesSupported: ['openid'],
    }))
    const origin = `http://${HOST}:${served.port}`
    const fetchFn = recordingFetch(localhostFetch as never)
    const provider = new TestOAuthClient({ loginHint: 'alice' })
    const { client } = await connectWithOAuth(`${origin}${mount}/v1`, provider, fetchFn)
    const result = await client.callTool({ name: 'get_version', arguments: {} })
    expect(JSON.stringify(result)).toContain('"text":"1.0.0"')
    await client.close()
    // The client found the document where the 401 sent it, and asked for the App's resource.
    const asked = fetchFn.log.map((r) => r.url)
    expect(asked).toContain(`${origin}${mount}${METADATA}`)
    expect(provider.discoveryStateValue?.resourceMetadata?.resource).toBe(`${origin}${mount}`)
    expect(provider.discoveryStateValue?.authorizationServerUrl).toBe(auth.issuer)
  })
})

describe('OAuth with audience-bound JWTs (RFC 8707 resource = the metadata resource) through each mount', () => {
  let auth: DevAuthServer
  it.each(MOUNTS)('$name', async ({ mount, start }) => {
    if (!auth) {
      auth = await startDevAuthServer({ accounts: ['alice'], resourceIndicators: { accessTokenFormat: 'jwt' } })
      const started = auth
      closers.push(() => started.close())
    }
    const served = await start((basePath) => ({
      ...withBase(basePath),
      // The audience is the App address: pinned to the host's origin and the mount.
      baseUrl: (request) => request.origin + basePath,
      oauth: createOAuthValidator({ issuer: auth.issuer, mode: 'jwt' }),
      authorizationServers: [auth.issuer],
      scopesSupported: ['openid'],
    }))
    const origin = `http://${HOST}:${served.port}`
    const provider = new TestOAuthClient({ loginHint: 'alice' })
    const { client } = await connectWithOAuth(`${origin}${mount}/v1`, provider, recordingFetch(localhostFetch as never))
    expect(JSON.stringify(await client.callTool({ name: 'get_version', arguments: {} }))).toContain('"text":"1.0.0"')
    await client.close()
    const claims = JSON.parse(Buffer.from(provider.tokens()!.access_token.split('.')[1]!, 'base64url').toString())
    expect(claims.aud).toBe(`${origin}${mount}`)
  })
})

describe('a mount the dispatcher basePath does not hold (every request would be a silent 404)', () => {
  it.each(
    EXPRESS_KINDS.flatMap((kind) => [
      [kind, "app.use('/mcp', …), no basePath", ['/mcp'], '', '/mcp'],
      [kind, "app.use('/api', r); r.use('/mcp', …), basePath '/mcp'", ['/api', '/mcp'], '/mcp', '/api/mcp'],
    ] as const),
  )('%s %s: a ConfigurationError told to onError once (context configuration), naming the basePath to give; the requests answered as before', async (kind, _name, mounts, basePath, expected) => {
    const errors: unknown[] = []
    const reported: Array<[unknown, string]> = []
    const express = EXPRESS[kind]
    const app = express()
    let router: express.Router = express.Router()
    router.use(expressDispatch({ dispatcher: withBase(basePath), onError: (error, context) => void reported.push([error, context]) }), (_req: express.Request, res: express.Response) => void res.json({ served: true }))
    for (const mount of [...mounts].reverse().slice(0, -1)) {
      const outer = express.Router()
      outer.use(mount, router)
      router = outer
    }
    app.use(mounts[0]!, router)
    app.use(recordErrors(errors, { configuration: true }))
    const port = await serveExpress(app)
    // The dispatch layer's 404, as before: no answer of a client's hangs on the mount.
    expect((await rawRequest(port, post(`${expected}/v1`, alice()))).status).toBe(404)
    expect((await rawRequest(port, post(`${expected}/v1`, alice()))).status).toBe(404)
    expect(errors).toEqual([])
    expect(reported).toHaveLength(1)
    expect(reported[0]![1]).toBe('configuration')
    expect(reported[0]![0]).toMatchObject({ name: 'ConfigurationError', option: 'basePath', message: expect.stringContaining(`"${expected}"`) })
  })

  it.each(EXPRESS_KINDS)(
    "%s: as a route's handler (app.post('/mcp', mw, handler)) with no basePath, the route's path is judged as a mount is: told once, naming the basePath; other routes and the right basePath are quiet",
    async (kind) => {
      const express = EXPRESS[kind]
      const reported: Array<[unknown, string]> = []
      const onError = (error: unknown, context: string) => void reported.push([error, context])
      const served = (_req: express.Request, res: express.Response) => void res.json({ served: true })
      const app = express()
      // (Port 0: any free one, outside this file's range.)
      // A route matched first that passes the request on: `req.route` is still it when the
      // middleware of app.use runs, and is no route of the middleware's.
      app.get('/health', (_req: express.Request, _res: express.Response, next: express.NextFunction) => next())
      const used = expressDispatch({ dispatcher: withBase(''), onError })
      app.use(used, served)
      const port1 = await serveExpress(app, 0)
      expect((await rawRequest(port1, { method: 'GET', path: '/health', headers: { host: HOST } })).status).toBe(404)
      expect(reported).toEqual([])
      const wrong = express()
      wrong.post('/mcp', expressDispatch({ dispatcher: withBase(''), onError }), served)
      const port2 = await serveExpress(wrong, 0)
      // The dispatch layer's 404, as before (every request to it would be: the dispatcher reads /mcp as the App's path).
      expect((await rawRequest(port2, post('/mcp', alice()))).status).toBe(404)
      expect((await rawRequest(port2, post('/mcp', alice()))).status).toBe(404)
      expect(reported).toHaveLength(1)
      expect(reported[0]![1]).toBe('configuration')
      expect(reported[0]![0]).toMatchObject({
        name: 'ConfigurationError',
        option: 'basePath',
        message: expect.stringContaining('under the Express route path "/mcp" give the dispatcher basePath: "/mcp"'),
      })
      // With the basePath, served and quiet; and a route path with a pattern (an optional
      // character, which leaves no parameter) or a list is not judged.
      const quiet: unknown[] = []
      const right = express()
      right.post('/mcp', expressDispatch({ dispatcher: withBase('/mcp'), onError: (error) => quiet.push(error) }), served)
      right.post(['/a', '/b'], expressDispatch({ dispatcher: withBase(''), onError: (error) => quiet.push(error) }), served)
      right.post(kind === 'express4' ? '/ab?c' : '/ab{c}', expressDispatch({ dispatcher: withBase(''), onError: (error) => quiet.push(error) }), served)
      const port3 = await serveExpress(right, 0)
      const answer = await rawRequest(port3, post('/mcp', alice()))
      expect([answer.status, answer.headers['x-mcp-version']]).toEqual([200, '2.0.0'])
      expect((await rawRequest(port3, post('/a', alice()))).status).toBe(404)
      expect((await rawRequest(port3, post('/abc', alice()))).status).toBe(404)
      expect(quiet).toEqual([])
    },
  )

  it('Express: a mount above the basePath, and a mount of the basePath in another case, are no mistake', async () => {
    const errors: unknown[] = []
    const app = express()
    app.use('/api', ...expressMcp(withBase('/api/mcp')))
    app.use('/MCP', ...expressMcp(withBase('/MCP')))
    // A mount with a parameter whose value the client picks: another tenant is its 404, never a 500.
    app.use('/t/:tenant', ...expressMcp(withBase('/t/acme')))
    app.use(recordErrors(errors))
    const port = await serveExpress(app)
    // Dispatched (the SDK transport then answers a tools/list without a session 400).
    expect((await rawRequest(port, post('/api/mcp/v1', alice()))).headers['x-mcp-version']).toBe('1.0.0')
    expect((await rawRequest(port, post('/api/other', alice()))).status).toBe(404)
    expect((await rawRequest(port, post('/MCP/v1', alice()))).headers['x-mcp-version']).toBe('1.0.0')
    expect((await rawRequest(port, post('/mcp/v1', alice()))).status).toBe(404)
    expect((await rawRequest(port, post('/t/acme/v1', alice()))).headers['x-mcp-version']).toBe('1.0.0')
    expect((await rawRequest(port, post('/t/other/v1', alice()))).status).toBe(404)
    expect((await rawRequest(port, post('/t/other/api/t/acme/v1', alice()))).status).toBe(404)
    expect(errors).toEqual([])
  })

  it.each([
    ['prefix /mcp, no basePath', ['/mcp'], '', '/mcp'],
    ["prefixes '/api' then '/mcp', basePath '/mcp'", ['/api', '/mcp'], '/mcp', '/api/mcp'],
    // Fastify keeps a prefix's trailing slash (`fastify.prefix` is '/api/mcp/').
    ["prefixes '/api/' then '/mcp/', basePath '/mcp'", ['/api/', '/mcp/'], '/mcp', '/api/mcp/'],
  ])('Fastify %s: register rejects with a ConfigurationError naming the basePath to give', async (_name, prefixes, basePath, expected) => {
    const app = Fastify() as unknown as FastifyInstance
    const inner = async (scope: FastifyInstance) => {
      await scope.register(fastifyDispatch({ dispatcher: withBase(basePath) }))
      scope.all('/*', async () => ({ served: true }))
    }
    if (prefixes.length === 1) void app.register(inner, { prefix: prefixes[0]! })
    else void app.register(async (outer) => void (await outer.register(inner, { prefix: prefixes[1]! })), { prefix: prefixes[0]! })
    // (The instance ready() resolves to is no value to print: 'ready' stands for it.)
    expect(await app.ready().then(() => 'ready', (error: unknown) => error)).toMatchObject({
      name: 'ConfigurationError',
      option: 'basePath',
      message: expect.stringContaining(`"${expected}"`),
    })
    await app.close()
  })

  it('Fastify: a context wrapped in fastify-plugin loses its prefix, so its routes land outside the basePath and every platform route is 404: the plugin tells onError once, naming the route (regression: silent)', async () => {
    const told: Array<[unknown, string]> = []
    const app = Fastify() as unknown as FastifyInstance
    app.get('/health', async () => ({ ok: true }))
    const context = async (mcp: FastifyInstance) => {
      await mcp.register(fastifyDispatch({ dispatcher: withBase('/mcp'), onError: (error, where) => told.push([error, where]) }))
      mcp.all('/', async () => ({ served: true }))
      mcp.all('/*', async () => ({ served: true }))
      mcp.get('/status', async () => ({ ok: true }))
    }
    // What fastify-plugin does to the function it wraps: Fastify then ignores the `prefix`.
    ;(context as unknown as Record<symbol, boolean>)[Symbol.for('skip-override')] = true
    await app.register(context, { prefix: '/mcp' })
    await app.ready()
    expect(told).toHaveLength(1)
    expect(told[0]![1]).toBe('configuration')
    expect(told[0]![0]).toMatchObject({ name: 'ConfigurationError', option: 'basePath', message: expect.stringMatching(/route [A-Z,]+ "\/" .*fastify-plugin/) })
    // What it warns of: the dispatch layer's 404 on the platform's own route.
    const health = await app.inject({ method: 'GET', url: '/health', headers: { host: HOST } })
    expect([health.statusCode, health.json().error?.data]).toEqual([404, { error: 'not_found' }])
    await app.close()

    // The same context encapsulated, with its routes and a wildcard route under the prefix: nothing told.
    const quiet: unknown[] = []
    const good = Fastify() as unknown as FastifyInstance
    good.get('/health', async () => ({ ok: true }))
    await good.register(async (mcp) => {
      await mcp.register(fastifyDispatch({ dispatcher: withBase('/mcp'), onError: (error) => quiet.push(error) }))
      mcp.all('/', async () => ({ served: true }))
      mcp.all('/*', async () => ({ served: true }))
    }, { prefix: '/mcp' })
    await good.ready()
    expect(quiet).toEqual([])
    expect((await good.inject({ method: 'GET', url: '/health', headers: { host: HOST } })).json()).toEqual({ ok: true })
    await good.close()
  })

  it('Fastify: a prefix above the basePath is no mistake', async () => {
    const app = Fastify() as unknown as FastifyInstance
    await app.register(async (scope) => {
      await scope.register(fastifyDispatch({ dispatcher: withBase('/api/mcp') }))
      scope.all('/*', async () => ({ served: true }))
    }, { prefix: '/api' })
    await app.ready()
    const answer = await app.inject({ method: 'POST', url: '/api/mcp/v1', headers: { ...alice(), host: HOST, 'content-type': 'application/json' }, payload: TOOLS })
    expect(answer.statusCode).toBe(200)
    await app.close()
  })
})

describe("Hono app.mount('/mcp', …), which takes the prefix off the URL (docs/adapters.md, Next.js basePath)", () => {
  it("with basePath '/mcp' nothing matches; with none and baseUrl origin + '/mcp', the address, the 401 and the metadata agree", async () => {
    const mismatched = webDispatch({ dispatcher: withBase('/mcp'), handler: appHandler([]) })
    const app = new Hono()
    app.mount('/mcp', (request) => mismatched(request))
    const port = await serveHono(app.fetch)
    const refused = await rawRequest(port, post('/mcp/v1', alice()))
    expect([refused.status, JSON.parse(refused.body).error.data]).toEqual([404, { error: 'not_found' }])

    const seen: string[] = []
    const handle = webDispatch({ dispatcher: { ...withBase(''), baseUrl: (request) => `${request.origin}/mcp` }, handler: appHandler(seen) })
    const app2 = new Hono()
    app2.mount('/mcp', (request) => handle(request))
    const port2 = await serveHono(app2.fetch)
    const resource = `http://${HOST}:${port2}/mcp`
    const challenge = await localhostFetch(`${resource}/v1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS })
    const { resourceMetadataUrl } = extractWWWAuthenticateParams(challenge)
    expect(resourceMetadataUrl?.href).toBe(`${resource}${METADATA}`)
    const metadata = await discoverOAuthProtectedResourceMetadata(new URL(`${resource}/v1`), { resourceMetadataUrl }, localhostFetch)
    expect(metadata.resource).toBe(resource)
    expect(JSON.stringify(await readVersion(`${resource}/v1`, { fetch: localhostFetch, headers: alice() }))).toContain('"text":"1.0.0"')
    // The handler gets the URL Hono gave the mounted app: without the prefix.
    expect(new Set(seen)).toEqual(new Set(['/v1']))
  })
})

describe("the token API's basePath variants", () => {
  const COOKIE = 'dash=alice'
  const api = (basePath: string) =>
    createTokenApi({
      tokens: fixture.dispatcherOptions.tokens as TokenService,
      authenticateSession: (request) => (request.headers.get('cookie') === COOKIE ? { userId: 'alice' } : null),
      verifyCsrf: false,
      basePath,
    })
  const create = (path: string) =>
    new Request(`http://api.localhost${path}`, {
      method: 'POST',
      headers: { cookie: COOKIE, 'content-type': 'application/json' },
      body: JSON.stringify({ name: 'variant', servers: ['app_weather'], expires_in_days: 7 }),
    })

  it.each([
    ['/', '', '/'],
    ['/api/tokens/', '/api/tokens', '/api/tokens'],
    ['/API/Tokens', '/API/Tokens', '/API/Tokens'],
    ['/caf%C3%A9/tokens', '/caf%C3%A9/tokens', '/café/tokens'],
  ])('%j: kept as %j, Location under it, the Location read back', async (basePath, kept, requested) => {
    const handler = api(basePath)
    expect(handler.basePath).toBe(kept)
    const created = (await handler(create(requested)))!
    const body = await created.json()
    expect(created.status, JSON.stringify(body)).toBe(201)
    expect(created.headers.get('location')).toBe(`${kept}/${body.id}`)
    const read = (await handler(new Request(new URL(created.headers.get('location')!, 'http://api.localhost'), { headers: { cookie: COOKIE } })))!
    expect([read.status, (await read.json()).id]).toEqual([200, body.id])
  })

  it('is case-sensitive and matched on a segment boundary', async () => {
    const handler = api('/api/tokens')
    for (const path of ['/API/tokens', '/api/Tokens', '/api/tokensx', '/api']) {
      expect(await handler(new Request(`http://api.localhost${path}`, { headers: { cookie: COOKIE } })), path).toBeNull()
    }
  })
})

describe('mounts the basePath check must not refuse (review of the mount check)', () => {
  const listenReview = (app: http.RequestListener): Promise<number> => serveExpress(app)
  const served = (answer: { headers: Record<string, unknown> }) => answer.headers['x-mcp-version']

  it.each(EXPRESS_KINDS)(
    '%s: a wildcard mount (req.baseUrl is then the whole path the client sent) is never a 500, and serves what it served',
    async (kind) => {
      const errors: unknown[] = []
      const express = EXPRESS[kind]
      const app = express()
      // Express 4's `*`, Express 5's `/{*path}`: mounted on every path, as at the root.
      const all = kind === 'express4' ? '*' : '/{*path}'
      app.use(all, ...expressMcp(withBase('')))
      app.use(recordErrors(errors))
      const root = await listenReview(app)
      const under = express()
      under.use(all, ...expressMcp(withBase('/mcp')))
      under.use(recordErrors(errors))
      const mcp = await listenReview(under)
      expect(served(await rawRequest(root, post('/v1', alice())))).toBe('1.0.0')
      expect((await rawRequest(root, post('/other', alice()))).status).toBe(404)
      expect(served(await rawRequest(mcp, post('/mcp/v1', alice())))).toBe('1.0.0')
      // A path of the client's that ends with the basePath: the dispatch layer's 404, not a 500.
      expect((await rawRequest(mcp, post('/x/mcp', alice()))).status).toBe(404)
      expect(errors).toEqual([])
    },
  )

  it.each(EXPRESS_KINDS)("%s, no basePath: a mount of the dispatcher's own paths (app.use('/v1'), the metadata's) is served", async (kind) => {
    const errors: unknown[] = []
    const express = EXPRESS[kind]
    const app = express()
    app.use('/v1', ...expressMcp(withBase('')))
    app.use(METADATA, expressDispatch({ dispatcher: withBase('') }))
    app.use(recordErrors(errors))
    const port = await listenReview(app)
    expect(served(await rawRequest(port, post('/v1', alice())))).toBe('1.0.0')
    // Express routes the mount in any case; the dispatch layer's version path is `v`: its 404.
    expect((await rawRequest(port, post('/V1', alice()))).status).toBe(404)
    const doc = await rawRequest(port, { method: 'GET', path: METADATA })
    expect(doc.status).toBe(200)
    expect(errors).toEqual([])
  })

  it('Express: one middleware mounted right and wrong; the mount found right is remembered, the wrong one told once and answered 404', async () => {
    const errors: unknown[] = []
    const reported: Array<[unknown, string]> = []
    const app = express()
    const dispatch = expressDispatch({ dispatcher: withBase('/mcp'), onError: (error, context) => void reported.push([error, context]) })
    const handler = expressFromWeb(appHandler([]))
    app.use('/mcp', dispatch, handler)
    app.use('/api/mcp', dispatch, handler)
    app.use(recordErrors(errors))
    const port = await listenReview(app)
    for (let i = 0; i < 2; i++) {
      expect(served(await rawRequest(port, post('/mcp/v1', alice())))).toBe('1.0.0')
      expect((await rawRequest(port, post('/api/mcp/v1', alice()))).status).toBe(404)
      expect((await rawRequest(port, post('/api/mcp/v1', alice()))).status).toBe(404)
    }
    expect(errors).toEqual([])
    expect(reported).toHaveLength(1)
    expect(reported[0]).toEqual([expect.objectContaining({ name: 'ConfigurationError', option: 'basePath' }), 'configuration'])
  })

  it("Fastify, no basePath: a context of the dispatcher's own path (prefix '/v1') registers and is served", async () => {
    const app = Fastify() as unknown as FastifyInstance
    await app.register(async (scope) => {
      await scope.register(fastifyDispatch({ dispatcher: withBase('') }))
      scope.all('/', async () => ({ served: true }))
      scope.all('/*', async () => ({ served: true }))
    }, { prefix: '/v1' })
    await app.ready()
    const answer = await app.inject({ method: 'POST', url: '/v1', headers: { ...alice(), host: HOST, 'content-type': 'application/json' }, payload: TOOLS })
    expect([answer.statusCode, answer.headers['x-mcp-version']]).toEqual([200, '1.0.0'])
    await app.close()
  })

  it("Fastify: a prefix with a parameter names no path to give as basePath (the check said basePath: '/:tenant', which no request matches)", async () => {
    const app = Fastify() as unknown as FastifyInstance
    await app.register(async (scope) => {
      await scope.register(fastifyDispatch({ dispatcher: withBase('') }))
      scope.all('/*', async () => ({ served: true }))
    }, { prefix: '/:tenant' })
    await app.ready()
    const answer = await app.inject({ method: 'POST', url: '/acme/v1', headers: { ...alice(), host: HOST, 'content-type': 'application/json' }, payload: TOOLS })
    expect(answer.statusCode).toBe(404)
    await app.close()
  })
})
