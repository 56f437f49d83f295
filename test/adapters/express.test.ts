/**
 * The Express adapter (`mcp-dispatch/express`) against the shared suite, over loopback HTTP
 * (Express has no in-memory injection; node:http keeps the exact `Host`), on Express 5 and 4.
 */
import * as http from 'node:http'
import { createGunzip, gunzipSync, gzipSync } from 'node:zlib'
import compression from 'compression'
import type express from 'express'
import { ConfigurationError, createDispatcher, createMemoryAppStore, createMemorySubscriptionStore, jsonRpcErrorReply } from 'mcp-dispatch'
import { fromWebHandler, getDispatchContext, mcpDispatch, routeByVersion } from 'mcp-dispatch/express'
import { afterAll, describe, expect, it, vi } from 'vitest'
import { ALLOWED_ORIGIN, HOST, createFixture, createGate, expressServers, goneClientProbe, listen, loopbackFetch, rawRequest } from './helpers.js'
import { buildScenarioServer, createNodeMcpHandler, expectSessionGoesOn } from './mcp.js'
import { describeAdapter } from './suite.js'
import { EXPRESS, EXPRESS_KINDS } from '../helpers/express.js'
import { startExpress, startExpress4 } from './targets.js'

/** The Web adapter's answer to a failed handler. */
const HANDLER_FAILED = jsonRpcErrorReply(502, { code: -32603, message: 'App handler failed', data: { error: 'handler_error' } })

describeAdapter('express', startExpress)
describeAdapter('express4', startExpress4)

describe.each(EXPRESS_KINDS)('%s adapter specifics', (kind) => {
  const express = EXPRESS[kind]
  const { serve: serveApp, closeAll, servers } = expressServers()
  afterAll(closeAll)
  const tools = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'

  it('a route that takes POST only: the client\'s GET stream gets Express\'s HTML 404, which leaves the session\'s pin alone, and the SDK client goes on (regression: the pin was deleted, and every later request was 404 session_not_found)', async () => {
    const fixture = createFixture()
    const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
    const app = express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }))
    app.post(kind === 'express4' ? '*' : '/{*path}', (req: http.IncomingMessage, res: http.ServerResponse) => sessions.handle(req, res))
    const port = await serveApp(app)
    try {
      await expectSessionGoesOn(`http://${HOST}:${port}/v1`, { fetch: loopbackFetch, headers: { authorization: `Bearer ${fixture.tokens.alice}` } }, 404, /^text\/html/)
    } finally {
      await sessions.close()
    }
  })

  it('mounted twice on a request\'s way (app.use and the route\'s own): decided once, so counted once (regression: the busy App\'s one request a minute was 429 at the first, its unit spent twice)', async () => {
    const fixture = createFixture()
    const dispatch = mcpDispatch({ dispatcher: fixture.dispatcher })
    const app = express()
    app.use(dispatch)
    app.post('/', dispatch, (req: express.Request, res: http.ServerResponse) => void res.end(JSON.stringify({ version: getDispatchContext(req).version })))
    const port = await serveApp(app)
    const post = () =>
      loopbackFetch(`http://busy.localhost:${port}/`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.aliceBusy}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: tools })
    const first = await post()
    expect([first.status, first.headers.get('ratelimit'), await first.json()]).toEqual([200, '"minute";r=0;t=30', { version: '1.0.0' }])
    expect((await post()).status).toBe(429)
  })

  it('met by the middleware of a second dispatcher after one decided it: 500, told to onError, never passed on unchecked by the second (regression: a subscription the second dispatcher\'s store refuses was served)', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    // The second dispatcher's stores know no subscription: alone, it answers 402.
    const second = createDispatcher({ ...fixture.dispatcherOptions, subscriptions: createMemorySubscriptionStore([]) })
    const app = express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }))
    app.post('/', mcpDispatch({ dispatcher: second, onError: (error) => void errors.push(error) }), (_req, res) => void res.json({ served: true }))
    const port = await serveApp(app)
    for (let i = 0; i < 2; i++) {
      const answer = await loopbackFetch(`http://weather.localhost:${port}/`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: tools })
      expect([answer.status, (await answer.json()).error.code]).toEqual([500, -32603])
    }
    // Told once, not once per request.
    expect(errors).toEqual([expect.objectContaining({ name: 'ConfigurationError', message: expect.stringMatching(/a request may meet one dispatcher only/) })])
    // Middleware made from one options object are one dispatcher's: decided once, as before.
    const options = fixture.dispatcherOptions
    const same = express()
    same.use(mcpDispatch({ dispatcher: options }))
    same.post('/', mcpDispatch({ dispatcher: options }), (_req, res) => void res.json({ served: true }))
    const samePort = await serveApp(same)
    const served = await loopbackFetch(`http://weather.localhost:${samePort}/`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: tools })
    expect([served.status, await served.json()]).toEqual([200, { served: true }])
  })

  it('refuses misconfiguration when the middleware is created', () => {
    expect(() => mcpDispatch({} as never)).toThrow(ConfigurationError)
    expect(() => mcpDispatch({ dispatcher: createFixture().dispatcher, trustProxy: ['not an address'] })).toThrow(ConfigurationError)
    expect(() => mcpDispatch({ dispatcher: createFixture().dispatcher, onError: 'log' as never })).toThrow(ConfigurationError)
    expect(() => fromWebHandler(42 as never)).toThrow(ConfigurationError)
  })

  it("a refusal drops Express's own X-Powered-By (the other adapters' bytes), and keeps the platform's headers, an X-Powered-By of its own included", async () => {
    const fixture = createFixture()
    const defaults = express()
    defaults.use(mcpDispatch({ dispatcher: fixture.dispatcher }))
    const own = express()
    own.disable('x-powered-by')
    own.use((_req, res, next) => {
      res.setHeader('X-Powered-By', 'AcmeHost')
      res.setHeader('X-Request-Id', 'r-1')
      next()
    })
    own.use(mcpDispatch({ dispatcher: fixture.dispatcher }))
    const refused = (port: number) => rawRequest(port, { path: '/v1', headers: { 'content-type': 'application/json' }, body: tools })
    const plain = await refused(await serveApp(defaults))
    expect(plain.status).toBe(401)
    expect(plain.headers['x-powered-by']).toBeUndefined()
    const kept = await refused(await serveApp(own))
    expect(kept.status).toBe(401)
    expect([kept.headers['x-powered-by'], kept.headers['x-request-id']]).toEqual(['AcmeHost', 'r-1'])
  })

  it('behind a proxy Express trusts, the App address takes the scheme of X-Forwarded-Proto, read as a scheme (HTTPS, not ws)', async () => {
    const fixture = createFixture()
    const app = express()
    app.set('trust proxy', 'loopback')
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }))
    const port = await serveApp(app)
    const resourceOf = async (proto: string) => {
      const res = await rawRequest(port, { method: 'GET', path: '/.well-known/oauth-protected-resource', headers: { 'x-forwarded-proto': proto } })
      return (JSON.parse(res.body) as { resource: string }).resource
    }
    expect(await resourceOf('https')).toBe('https://weather.localhost')
    expect(await resourceOf('HTTPS')).toBe('https://weather.localhost')
    expect(await resourceOf('https, http')).toBe('https://weather.localhost')
    // Express hands these on as they came; the App address keeps the socket's scheme.
    expect(await resourceOf('ws')).toBe('http://weather.localhost')
    expect(await resourceOf('javascript')).toBe('http://weather.localhost')
  })

  it('a router of its own behind the middleware (/v3, a retired version) is not reached through dot segments (/v3/../v1)', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }))
    let retiredRan = 0
    app.use('/v3', (_req, res) => void res.json({ retired: ++retiredRan }))
    app.use((_req, res) => void res.json({ served: true }))
    const port = await serveApp(app)
    for (const path of ['/v3/../v1', '/v3/%2e%2e/v1', '/v3/x/../../v1']) {
      const res = await rawRequest(port, { path, headers: { 'content-type': 'application/json', authorization: `Bearer ${fixture.tokens.alice}` }, body: tools })
      expect(res.status, path).toBe(404)
      expect(JSON.parse(res.body), path).toMatchObject({ error: { code: -32004, data: { error: 'not_found' } } })
    }
    expect(retiredRan).toBe(0)
  })

  it('a client gone before the middleware runs (after a slow middleware) is not decided for: no decision, no token validation', async () => {
    const probe = goneClientProbe(createFixture())
    const app = express()
    app.use(async (_req, _res, next) => {
      await probe.slow()
      next()
    })
    app.use(mcpDispatch({ dispatcher: probe.dispatcher }))
    app.use((_req, res) => res.end('{}'))
    const port = await serveApp(app)
    await probe.gone(servers.at(-1)!, port)
    expect(probe.decisions()).toBe(0)
    // A client that stays is decided for as usual.
    expect((await rawRequest(port, { path: '/v1', body: tools })).status).toBe(401)
    expect(probe.decisions()).toBe(1)
  })

  it('passes an async failure of the pipeline to next(err)', async () => {
    const broken = { ...createFixture().dispatcher, decide: () => Promise.reject(new Error('pipeline broke')) }
    const app = express()
    const caught: unknown[] = []
    app.use(mcpDispatch({ dispatcher: broken }))
    app.use((error: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
      caught.push(error)
      res.status(500).end('caught')
    })
    const res = await rawRequest(await serveApp(app), { path: '/v1', body: tools })
    expect(res).toMatchObject({ status: 500, body: 'caught' })
    expect((caught[0] as Error).message).toBe('pipeline broke')
  })

  it('works mounted under a path equal to the dispatcher basePath, leaving other routes alone', async () => {
    const fixture = createFixture()
    const app = express()
    app.get('/health', (_req, res) => res.json({ ok: true }))
    app.use('/mcp', mcpDispatch({ dispatcher: { ...fixture.dispatcherOptions, basePath: '/mcp' } }))
    app.use('/mcp', (req, res) => res.json({ version: getDispatchContext(req).version, url: req.originalUrl }))
    const port = await serveApp(app)
    expect(await rawRequest(port, { method: 'GET', path: '/health' })).toMatchObject({ status: 200, body: '{"ok":true}' })
    const dispatched = await rawRequest(port, {
      path: '/mcp/v1',
      headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
      body: tools,
    })
    expect(dispatched.status).toBe(200)
    expect(JSON.parse(dispatched.body)).toEqual({ version: '1.0.0', url: '/mcp/v1' })
    const refused = await rawRequest(port, { path: '/mcp/v1', body: tools })
    expect(refused.status).toBe(401)
    expect(refused.headers['www-authenticate']).toBe(
      'Bearer resource_metadata="http://weather.localhost/mcp/.well-known/oauth-protected-resource"',
    )
  })

  it('req.dispatchContext reaches a mounted sub-app and a router, is absent where the middleware did not run, and can be set', async () => {
    const fixture = createFixture()
    const app = express()
    const seen: unknown[] = []
    app.get('/health', (req, res) => {
      seen.push(req.dispatchContext)
      res.json({ ok: true })
    })
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }))
    const sub = express()
    sub.post('/v1', (req, res) => res.json({ sub: req.dispatchContext?.version, own: Object.keys(req).includes('dispatchContext') }))
    const router = express.Router()
    router.post('/v2', (req, res) => res.json({ router: getDispatchContext(req).version }))
    app.use(sub)
    app.use(router)
    const port = await serveApp(app)
    const alice = { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' }
    const viaSub = await rawRequest(port, { path: '/v1', headers: alice, body: tools })
    expect(JSON.parse(viaSub.body)).toEqual({ sub: '1.0.0', own: false })
    const viaRouter = await rawRequest(port, { path: '/v2', headers: alice, body: tools })
    expect(JSON.parse(viaRouter.body)).toEqual({ router: '2.0.0' })
    // /health is answered before the middleware: no context there.
    expect((await rawRequest(port, { method: 'GET', path: '/health' })).status).toBe(200)
    expect(seen).toEqual([undefined])
    // Other code may still assign it, as before the accessor.
    const plain = Object.create(express.request) as express.Request
    const assigned = { version: '9.9.9' } as unknown as NonNullable<express.Request['dispatchContext']>
    plain.dispatchContext = assigned
    expect(getDispatchContext(plain)).toBe(assigned)
  })

  it('an Express app of another copy of Express, called as a handler rather than mounted (the MCP SDK builds its apps on its own Express 5): getDispatchContext and routeByVersion still find the context', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }))
    // The other major, with a request prototype of its own, as another copy of Express has.
    const other = EXPRESS[kind === 'express' ? 'express4' : 'express']()
    const own = Object.create(http.IncomingMessage.prototype) as object
    for (const [name, descriptor] of Object.entries(Object.getOwnPropertyDescriptors(Object.getPrototypeOf(other.request)))) {
      if (name !== 'dispatchContext') Object.defineProperty(own, name, descriptor)
    }
    other.request = Object.create(own, { app: { configurable: true, enumerable: true, writable: true, value: other } })
    other.post('/v1', (req, res) => res.json({ version: getDispatchContext(req).version }))
    other.use(routeByVersion(() => (req, res) => res.json({ routed: getDispatchContext(req).version })))
    app.use((req, res, next) => other(req, res, next))
    const port = await serveApp(app)
    const headers = { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' }
    expect(await rawRequest(port, { path: '/v1', headers, body: tools })).toMatchObject({ status: 200, body: '{"version":"1.0.0"}' })
    expect(await rawRequest(port, { path: '/v2', headers, body: tools })).toMatchObject({ status: 200, body: '{"routed":"2.0.0"}' })
  })

  it('works on a raw Node request too (no Express prototype): the context is a plain property there', async () => {
    const fixture = createFixture()
    const middleware = mcpDispatch({ dispatcher: fixture.dispatcher })
    const server = http.createServer((req, res) => {
      middleware(req as express.Request, res as express.Response, () => {
        const own = Object.keys(req).includes('dispatchContext')
        res.setHeader('content-type', 'application/json')
        res.end(JSON.stringify({ version: getDispatchContext(req).version, own }))
      })
    })
    servers.push(server)
    const port = await listen(server)
    const res = await rawRequest(port, {
      path: '/v1',
      headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
      body: tools,
    })
    expect(res.status).toBe(200)
    expect(res.headers['x-mcp-version']).toBe('1.0.0')
    expect(JSON.parse(res.body)).toEqual({ version: '1.0.0', own: true })
  })

  it('a handler that fails after writing its head: the connection ends, onError hears it, the server keeps serving', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const app = express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher, onError: (error) => errors.push(error) }))
    app.use(
      routeByVersion({
        '1.0.0': async (_req, res) => {
          res.writeHead(200, { 'content-type': 'text/event-stream' })
          throw new Error('failed mid-answer')
        },
        '2.0.0': (_req, res) => res.end('fine'),
      }, { appId: 'app_weather' }),
    )
    const port = await serveApp(app)
    const headers = { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' }
    await expect(rawRequest(port, { path: '/v1', headers, body: tools })).rejects.toThrow()
    expect((errors[0] as Error).message).toBe('failed mid-answer')
    expect(await rawRequest(port, { path: '/v2', headers, body: tools })).toMatchObject({ status: 200, body: 'fine' })
  })

  it('getDispatchContext throws where the middleware did not run', async () => {
    const app = express()
    app.get('/', (req, res) => {
      try {
        getDispatchContext(req)
        res.end('no error')
      } catch (error) {
        res.end((error as Error).constructor.name)
      }
    })
    expect((await rawRequest(await serveApp(app), { method: 'GET', path: '/' })).body).toBe('TypeError')
  })

  it('fromWebHandler mounted with app.use, a Response it cannot write (a header value Node refuses, Response.error(), no Response): the JSON-RPC 502 and onError (regression: Express 5 answered its HTML 500, Express 4 never answered)', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const app = express()
    app.set('env', 'test') // Express's final handler logs nothing
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher, onError: (error) => errors.push(error) }))
    const answers: Record<string, () => Response> = {
      header: () => new Response('{}', { headers: { 'x-tool': 'a\x01b' } }),
      error: () => Response.error(),
      none: () => undefined as unknown as Response,
    }
    app.use(fromWebHandler((request) => answers[request.headers.get('x-answer')!]!()))
    const port = await serveApp(app)
    const headers = { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', origin: ALLOWED_ORIGIN }
    for (const path of Object.keys(answers)) {
      const res = await Promise.race([
        rawRequest(port, { path: '/v1', headers: { ...headers, 'x-answer': path }, body: tools }),
        new Promise<never>((_resolve, reject) => setTimeout(() => reject(new Error(`${path}: no answer in 2 s`)), 2000)),
      ])
      expect(res.status, path).toBe(502)
      expect(res.body, path).toBe(HANDLER_FAILED.body)
      expect(res.headers['content-type'], path).toBe('application/json')
      expect(res.headers['x-mcp-version'], path).toBe('1.0.0')
      expect(res.headers['access-control-allow-origin'], path).toBe(ALLOWED_ORIGIN)
    }
    expect(errors).toHaveLength(3)
  })

  it('fromWebHandler re-serializes a body that express.json() already read', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }), express.json())
    app.use(fromWebHandler(async (request, context) => new Response(`${context.version} ${await request.text()}`)))
    const res = await rawRequest(await serveApp(app), {
      path: '/v2',
      headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
      body: '{ "jsonrpc": "2.0", "id": 1, "method": "tools/list" }',
    })
    expect(res.status).toBe(200)
    expect(res.headers['x-mcp-version']).toBe('2.0.0')
    expect(res.body).toBe(`2.0.0 ${tools}`)
  })

  it('fromWebHandler: a body express.json() read that JSON.stringify cannot write back (nested 8,000 deep) is 400 naming body, not blamed on the Host (regression)', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }), express.json())
    app.use(fromWebHandler(async (request) => new Response(await request.text())))
    const res = await rawRequest(await serveApp(app), {
      path: '/v2',
      headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
      body: `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":${'['.repeat(8000)}${']'.repeat(8000)}}`,
    })
    expect(res.status).toBe(400)
    expect(JSON.parse(res.body)).toMatchObject({ error: { code: -32600, data: { error: 'invalid_request', field: 'body' } } })
  })

  it('fromWebHandler: the Response\'s Vary joins one a middleware ahead set, rather than replacing it', async () => {
    const fixture = createFixture()
    const app = express()
    app.use((_req, res, next) => {
      res.setHeader('vary', 'Accept-Language')
      next()
    })
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }))
    app.use(fromWebHandler(() => new Response('{}', { headers: { vary: 'Accept-Encoding' } })))
    const res = await rawRequest(await serveApp(app), { path: '/v2', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' })
    expect(res.status).toBe(200)
    expect(res.headers.vary).toBe('Accept-Language, Accept-Encoding')
  })

  it('fromWebHandler passes no body on for a request that sent none (no length, 0 or 00), though express.json() set one ({}: a DELETE went on as {})', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }), express.json())
    app.use(fromWebHandler(async (request) => new Response(JSON.stringify({ body: await request.text() }))))
    const port = await serveApp(app)
    const headers = { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' }
    // Without a length (express.json() leaves it unread), with Content-Length: 0 (it reads it),
    // and with Content-Length: 00, which Node reads as 0 too (regression: that went on as {}).
    for (const sent of [{}, { body: '' }, { headers: { ...headers, 'content-length': '00' } }]) {
      const res = await rawRequest(port, { method: 'DELETE', path: '/v2', headers, ...sent })
      expect(res.status, JSON.stringify(sent)).toBe(200)
      expect(JSON.parse(res.body), JSON.stringify(sent)).toEqual({ body: '' })
    }
    const posted = await rawRequest(port, { path: '/v2', headers, body: tools })
    expect(JSON.parse(posted.body)).toEqual({ body: tools })
  })

  it('an answer of the dispatch layer with characters past ASCII (the metadata of an App named Météo ☀) goes out whole: its Content-Length counts bytes, not characters', async () => {
    const fixture = createFixture()
    const dispatcher = createDispatcher({
      ...fixture.dispatcherOptions,
      apps: createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Météo ☀', versions: ['1.0.0'] }]),
    })
    const app = express()
    app.use(mcpDispatch({ dispatcher }))
    const port = await serveApp(app)
    const res = await rawRequest(port, { method: 'GET', path: '/.well-known/oauth-protected-resource' })
    expect(res.status).toBe(200)
    expect(res.headers['content-length']).toBe(String(Buffer.byteLength(res.body)))
    expect(JSON.parse(res.body)).toMatchObject({ resource: `http://${HOST}`, resource_name: 'Météo ☀' })
  })

  it('fromWebHandler passes a body express.text() or express.raw() read on as the bytes sent, never as a JSON string or a JSON Buffer', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(mcpDispatch({ dispatcher: fixture.dispatcher }), express.text({ type: 'text/plain' }), express.raw({ type: 'application/octet-stream' }))
    app.use(fromWebHandler(async (request) => new Response(JSON.stringify({ body: await request.text() }))))
    const port = await serveApp(app)
    for (const type of ['text/plain', 'application/octet-stream']) {
      const res = await rawRequest(port, { path: '/v2', headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': type }, body: tools })
      expect(res.status, type).toBe(200)
      expect(JSON.parse(res.body), type).toEqual({ body: tools })
    }
  })

  it('fromWebHandler behind compression(): a stream reaches the client chunk by chunk, not at its end', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(compression(), mcpDispatch({ dispatcher: fixture.dispatcher }))
    const next = createGate()
    const encoder = new TextEncoder()
    app.use(
      fromWebHandler(
        () =>
          new Response(
            new ReadableStream<Uint8Array>({
              async start(controller) {
                controller.enqueue(encoder.encode('data: one\n\n'))
                // The second event only once the client has read the first.
                await next.wait()
                controller.enqueue(encoder.encode('data: two\n\n'))
                controller.close()
              },
            }),
            { headers: { 'content-type': 'text/event-stream' } },
          ),
      ),
    )
    const port = await serveApp(app)
    const body = await new Promise<string>((resolve, reject) => {
      const outgoing = http.request(
        { host: '127.0.0.1', port, method: 'POST', path: '/v2', headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}`, 'accept-encoding': 'gzip' } },
        (incoming) => {
          expect(incoming.headers['content-encoding']).toBe('gzip')
          let text = ''
          const gunzip = createGunzip()
          incoming.pipe(gunzip)
          gunzip.setEncoding('utf8')
          gunzip.on('data', (chunk: string) => {
            text += chunk
            if (text.includes('data: one')) next.open()
          })
          gunzip.on('end', () => resolve(text))
          gunzip.on('error', reject)
        },
      )
      // Held whole by the middleware, the first event never came: the stream never ended.
      outgoing.setTimeout(5000, () => outgoing.destroy(new Error('the first event did not arrive before the stream ended')))
      outgoing.on('error', reject)
      outgoing.end()
    })
    expect(body).toBe('data: one\n\ndata: two\n\n')
  })

  it('fromWebHandler behind compression(): a body given in many small chunks is pushed out only when none is ready, so it compresses as a whole would, and leaks no drain listeners', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(compression(), mcpDispatch({ dispatcher: fixture.dispatcher }))
    const text = JSON.stringify({ jsonrpc: '2.0', id: 1, result: { items: Array.from({ length: 20_000 }, (_, i) => ({ id: i, name: `item ${i}`, tags: ['a', 'b'] })) } })
    const bytes = new TextEncoder().encode(text)
    app.use(
      fromWebHandler((request) => {
        let at = 0
        // 1 KiB chunks, each ready as soon as asked for; or a few microtasks later, through a
        // TransformStream.
        const body = new ReadableStream<Uint8Array>({
          pull(controller) {
            if (at >= bytes.length) return controller.close()
            controller.enqueue(bytes.subarray(at, (at += 1024)))
          },
        })
        const piped = request.headers.get('x-body') === 'piped'
        return new Response(piped ? body.pipeThrough(new TransformStream()) : body, { headers: { 'content-type': 'application/json' } })
      }),
    )
    const warnings: Error[] = []
    const onWarning = (warning: Error) => warnings.push(warning)
    process.on('warning', onWarning)
    try {
      const port = await serveApp(app)
      for (const kind of ['queued', 'piped']) {
        const { compressed, body } = await new Promise<{ compressed: number; body: string }>((resolve, reject) => {
          http
            .request({ host: '127.0.0.1', port, method: 'POST', path: '/v2', headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}`, 'accept-encoding': 'gzip', 'x-body': kind } }, (incoming) => {
              const chunks: Buffer[] = []
              incoming.on('data', (chunk: Buffer) => chunks.push(chunk))
              incoming.on('end', () => {
                const all = Buffer.concat(chunks)
                resolve({ compressed: all.length, body: gunzipSync(all).toString('utf8') })
              })
              incoming.on('error', reject)
            })
            .on('error', reject)
            .end()
        })
        expect(body, kind).toBe(text)
        // A flush after each chunk made it 2.4 times what gzip makes of the whole.
        expect(compressed, kind).toBeLessThan(gzipSync(bytes).length * 1.2)
      }
      await new Promise((resolve) => setImmediate(resolve))
      expect(warnings.filter((warning) => warning.name === 'MaxListenersExceededWarning')).toEqual([])
    } finally {
      process.off('warning', onWarning)
    }
  })

  it('fromWebHandler and routeByVersion on a route the dispatch layer never saw (a wiring mistake) answer the JSON-RPC 502, not an HTML 500 with a stack', async () => {
    for (const handler of [fromWebHandler(() => new Response('never')), routeByVersion(() => (_req, res) => res.end('never'))]) {
      const app = express()
      app.use(handler)
      const stderr = vi.spyOn(console, 'error').mockImplementation(() => {})
      try {
        const res = await rawRequest(await serveApp(app), { path: '/v1', body: tools })
        expect(res.status).toBe(502)
        expect(JSON.parse(res.body)).toMatchObject({ jsonrpc: '2.0', error: { data: { error: 'handler_error' } } })
        expect(stderr.mock.calls.join(' ')).toMatch(/no dispatch context|dispatch/i)
      } finally {
        stderr.mockRestore()
      }
    }
  })
})
