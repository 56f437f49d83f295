/**
 * The Fastify adapter (`mcp-dispatch/fastify`) against the shared suite: in memory with
 * `fastify.inject`, over loopback HTTP for streaming.
 */
import type { AddressInfo } from 'node:net'
import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify'
import { ConfigurationError, createDispatcher, createMemorySubscriptionStore, createTokenApi, invalidHostReply, notFoundReply } from 'mcp-dispatch'
import { frameworkErrors, fromWebHandler, getDispatchContext, mcpDispatch, routeByVersion, serveTokenApi } from 'mcp-dispatch/fastify'
import { describe, expect, it, vi } from 'vitest'
import { HOST, createFixture, goneClientProbe, loopbackFetch, rawRequest } from './helpers.js'
import { buildScenarioServer, createNodeMcpHandler, expectSessionGoesOn } from './mcp.js'
import { describeAdapter } from './suite.js'
import { startFastify } from './targets.js'

describeAdapter('fastify', startFastify)

describe('fastify adapter specifics', () => {
  it('in an encapsulated context without a prefix (App at the root), the platform\'s own routes are left alone while every other path is dispatched (docs/adapters.md)', async () => {
    const fixture = createFixture()
    const app = Fastify()
    app.get('/admin/stats', async () => ({ admin: true }))
    await app.register(async (mcp) => {
      await mcp.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
      const handler = async () => ({ served: true })
      mcp.all('/', handler)
      mcp.all('/*', handler)
    })
    try {
      const get = (url: string) => app.inject({ method: 'GET', url, headers: { host: HOST } })
      const admin = await get('/admin/stats')
      expect([admin.statusCode, admin.json()]).toEqual([200, { admin: true }])
      expect(admin.headers['x-mcp-version']).toBeUndefined()
      expect((await get('/.well-known/oauth-protected-resource')).json()).toMatchObject({ resource: `http://${HOST}` })
      expect((await get('/nope')).json()).toMatchObject({ error: { data: { error: 'not_found' } } })
      const unauthenticated = await app.inject({ method: 'POST', url: '/v1', headers: { host: HOST }, payload: {} })
      expect(unauthenticated.statusCode).toBe(401)
      const served = await app.inject({ method: 'POST', url: '/v1', headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}` }, payload: {} })
      expect([served.statusCode, served.json(), served.headers['x-mcp-version']]).toEqual([200, { served: true }, '1.0.0'])
    } finally {
      await app.close()
    }
  })

  const tools = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'

  it('registered twice on a request\'s way (at the root and again in a child context): decided once, so counted once (regression: the busy App\'s one request a minute was 429 at the first, its unit spent twice)', async () => {
    const fixture = createFixture()
    const app = Fastify()
    await app.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
    await app.register(async (child) => {
      await child.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
      child.post('/', async (request) => ({ version: request.dispatchContext?.version }))
    })
    try {
      const post = () =>
        app.inject({ method: 'POST', url: '/', headers: { host: 'busy.localhost', authorization: `Bearer ${fixture.tokens.aliceBusy}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, payload: tools })
      const first = await post()
      expect([first.statusCode, first.headers.ratelimit, first.json()]).toEqual([200, '"minute";r=0;t=30', { version: '1.0.0' }])
      expect((await post()).statusCode).toBe(429)
    } finally {
      await app.close()
    }
  })

  it('met by the plugin of a second dispatcher after one decided it: 500, told to onError, never passed on unchecked by the second (regression: a subscription the second dispatcher\'s store refuses was served)', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const second = createDispatcher({ ...fixture.dispatcherOptions, subscriptions: createMemorySubscriptionStore([]) })
    const app = Fastify()
    await app.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
    await app.register(async (child) => {
      await child.register(mcpDispatch({ dispatcher: second, onError: (error) => void errors.push(error) }))
      child.post('/', async () => ({ served: true }))
    })
    try {
      const answer = await app.inject({ method: 'POST', url: '/', headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, payload: tools })
      expect([answer.statusCode, answer.json().error.code]).toEqual([500, -32603])
      expect(errors).toEqual([expect.objectContaining({ name: 'ConfigurationError', message: expect.stringMatching(/a request may meet one dispatcher only/) })])
    } finally {
      await app.close()
    }
  })

  it('registers as Fastify plugins usually are, app.register(mcpDispatch, options): the same hooks for the routes beside it; a bad option fails register, not the process', async () => {
    const fixture = createFixture()
    const app = Fastify()
    await app.register(mcpDispatch, { dispatcher: fixture.dispatcher })
    app.all('/*', async () => ({ served: true }))
    try {
      const refused = await app.inject({ method: 'POST', url: '/v1', headers: { host: HOST }, payload: tools })
      expect(refused.statusCode).toBe(401)
      expect(refused.json().error.data).toMatchObject({ error: 'unauthorized' })
      const served = await app.inject({
        method: 'POST',
        url: '/v1',
        headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
        payload: tools,
      })
      expect([served.statusCode, served.json(), served.headers['x-mcp-version']]).toEqual([200, { served: true }, '1.0.0'])
    } finally {
      await app.close()
    }
    for (const options of [{}, { dispatcher: fixture.dispatcher, trustProxy: -1 }]) {
      const bad = Fastify()
      await expect(bad.register(mcpDispatch, options as never)).rejects.toBeInstanceOf(ConfigurationError)
      await bad.close().catch(() => {})
    }
  })

  it('a request no route takes (a GET where only POST is routed) gets Fastify\'s not-found 404, which leaves the session\'s pin alone; an MCP handler served as the not-found handler keeps its pins: the SDK client goes on (regression: the pin was deleted, and the next request was 404 session_not_found)', async () => {
    for (const wiring of ['post only', 'not-found handler'] as const) {
      const fixture = createFixture()
      const sessions = createNodeMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
      const app = Fastify()
      await app.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
      const serve = async (request: FastifyRequest, reply: FastifyReply) => {
        reply.hijack()
        await sessions.handle(request.raw, reply.raw, request.body)
      }
      if (wiring === 'post only') app.post('/*', serve)
      else app.setNotFoundHandler(serve)
      await app.listen({ port: 0, host: '127.0.0.1' })
      try {
        const { port } = app.server.address() as AddressInfo
        const options = { fetch: loopbackFetch, headers: { authorization: `Bearer ${fixture.tokens.alice}` } }
        await expectSessionGoesOn(`http://${HOST}:${port}/v1`, options, wiring === 'post only' ? 404 : 200, wiring === 'post only' ? /^application\/json/ : /^text\/event-stream/)
      } finally {
        await sessions.close()
        await app.close()
      }
    }
  })

  it('a prefix among its register options is refused (ConfigurationError naming it): the plugin is not encapsulated, so Fastify would drop it and dispatch the platform\'s own routes (regression: GET /health was a JSON-RPC 404)', async () => {
    const fixture = createFixture()
    for (const register of [
      (app: ReturnType<typeof Fastify>) => app.register(mcpDispatch({ dispatcher: fixture.dispatcher }), { prefix: '/mcp' }),
      (app: ReturnType<typeof Fastify>) => app.register(mcpDispatch, { dispatcher: fixture.dispatcher, prefix: '/mcp' } as never),
    ]) {
      const app = Fastify()
      const refused = await Promise.resolve(register(app)).then(() => undefined, (error: unknown) => error)
      expect(refused).toBeInstanceOf(ConfigurationError)
      expect((refused as ConfigurationError).option).toBe('prefix')
      await app.close().catch(() => {})
    }
    // '' and '/' change nothing (a parent's options passed along, as fastify-autoload does): taken.
    for (const prefix of ['', '/']) {
      const app = Fastify()
      await app.register(mcpDispatch, { dispatcher: fixture.dispatcher, prefix } as never)
      app.all('/*', async () => ({ served: true }))
      expect((await app.inject({ method: 'POST', url: '/v1', headers: { host: HOST }, payload: tools })).statusCode, prefix).toBe(401)
      await app.close()
    }
  })

  it('refuses misconfiguration when the plugin is created', () => {
    expect(() => mcpDispatch({} as never)).toThrow(ConfigurationError)
    expect(() => mcpDispatch({ dispatcher: createFixture().dispatcher, trustProxy: -1 })).toThrow(ConfigurationError)
    expect(() => mcpDispatch({ dispatcher: createFixture().dispatcher, onError: 'log' as never })).toThrow(ConfigurationError)
    // The option is named once (regression: 'option "trustProxy" trustProxy must be …').
    expect(() => mcpDispatch({ dispatcher: createFixture().dispatcher, trustProxy: -1 })).toThrow(/^mcp-dispatch: option "trustProxy" must be a hop count >= 0$/)
    expect(() => mcpDispatch({ dispatcher: createFixture().dispatcher, trustProxy: ['10.0.0.0/33'] })).toThrow(/^mcp-dispatch: option "trustProxy" entry 0/)
    expect(() => fromWebHandler(42 as never)).toThrow(ConfigurationError)
  })

  it('a route of its own behind the plugin (/v3/*, a retired version) is not reached through dot segments (/v3/../v1)', async () => {
    const fixture = createFixture()
    const app = Fastify()
    await app.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
    let retiredRan = 0
    app.all('/v3/*', async () => ({ retired: ++retiredRan }))
    app.all('/*', async () => ({ served: true }))
    await app.listen({ port: 0, host: '127.0.0.1' })
    try {
      const port = (app.server.address() as AddressInfo).port
      for (const path of ['/v3/../v1', '/v3/%2e%2e/v1', '/v3/x/../../v1']) {
        const res = await rawRequest(port, { path, headers: { 'content-type': 'application/json', authorization: `Bearer ${fixture.tokens.alice}` }, body: tools })
        expect(res.status, path).toBe(404)
        expect(JSON.parse(res.body), path).toMatchObject({ error: { code: -32004, data: { error: 'not_found' } } })
      }
      expect(retiredRan).toBe(0)
    } finally {
      await app.close()
    }
  })

  it('frameworkErrors answers a target Fastify cannot decode as the other adapters do (JSON-RPC 404), and leaves other errors to Fastify', async () => {
    const fixture = createFixture()
    const plain = Fastify()
    const app = Fastify({ frameworkErrors, routerOptions: { maxParamLength: 10 } })
    for (const instance of [plain, app]) {
      await instance.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
      // No catch-all on `app`: a path over the parameter limit would be that route's.
      if (instance === plain) instance.all('/*', async () => ({ served: true }))
      instance.get('/p/:name', async () => ({ param: true }))
      await instance.listen({ port: 0, host: '127.0.0.1' })
    }
    try {
      const port = (instance: typeof app) => (instance.server.address() as AddressInfo).port
      const expected = notFoundReply()
      for (const path of ['/v1%zz', '/%', '/v1%C0']) {
        const request = { path, headers: { 'content-type': 'application/json', authorization: `Bearer ${fixture.tokens.alice}` }, body: tools }
        const before = await rawRequest(port(plain), request)
        expect(before.status, path).toBe(400)
        expect(JSON.parse(before.body).code, path).toBe('FST_ERR_BAD_URL')
        const res = await rawRequest(port(app), request)
        expect(res.status, path).toBe(expected.status)
        expect(res.headers['content-type'], path).toBe('application/json')
        expect(res.body, path).toBe(expected.body)
        expect(res.headers['x-mcp-version'], path).toBeUndefined()
      }
      // A path parameter over the router's limit: without frameworkErrors, Fastify's 414
      // FST_ERR_MAX_PARAM_LENGTH; with it, the 404 of a bad path.
      const long = await rawRequest(port(app), { method: 'GET', path: `/p/${'x'.repeat(20)}` })
      expect(long.status).toBe(404)
      expect(long.body).toBe(expected.body)
      // An absolute-form target whose host no URL can hold is the Host's fault: 400, as that
      // host in the Host field gets from the plugin, not the 404 of a bad path.
      const invalidHost = invalidHostReply()
      for (const target of [`http://${HOST}:99999/v1`, 'http://[zz]/v1', `HTTP://${HOST}:70000/.well-known/oauth-protected-resource`]) {
        const res = await rawRequest(port(app), { path: target, headers: { 'content-type': 'application/json', authorization: `Bearer ${fixture.tokens.alice}` }, body: tools })
        expect([res.status, res.body], target).toEqual([invalidHost.status, invalidHost.body])
        const asHost = await rawRequest(port(app), { path: '/v1', host: target.split('/')[2]!, headers: { 'content-type': 'application/json', authorization: `Bearer ${fixture.tokens.alice}` }, body: tools })
        expect([asHost.status, asHost.body], target).toEqual([invalidHost.status, invalidHost.body])
      }
      // A well-formed one with a bad escape in its path is still a bad path.
      const badPath = await rawRequest(port(app), { path: `http://${HOST}/v1%zz`, headers: { authorization: `Bearer ${fixture.tokens.alice}` } })
      expect([badPath.status, badPath.body]).toEqual([expected.status, expected.body])
    } finally {
      await plain.close()
      await app.close()
    }
  })

  it('a client gone before its hook runs (after a slow hook of the platform) is not decided for', async () => {
    const probe = goneClientProbe(createFixture())
    const app = Fastify({ forceCloseConnections: true })
    app.addHook('onRequest', () => probe.slow())
    await app.register(mcpDispatch({ dispatcher: probe.dispatcher }))
    app.all('/*', async () => ({}))
    await app.listen({ port: 0, host: '127.0.0.1' })
    try {
      await probe.gone(app.server, (app.server.address() as AddressInfo).port)
      expect(probe.decisions()).toBe(0)
      const stays = await app.inject({ method: 'POST', url: '/v1', headers: { host: HOST }, payload: tools })
      expect(stays.statusCode).toBe(401)
      expect(probe.decisions()).toBe(1)
    } finally {
      await app.close()
    }
  })

  it('applies only to the encapsulated context it is registered in', async () => {
    const fixture = createFixture()
    const app = Fastify()
    app.get('/health', async () => ({ ok: true }))
    await app.register(
      async (scope) => {
        await scope.register(mcpDispatch({ dispatcher: { ...fixture.dispatcherOptions, basePath: '/mcp' } }))
        scope.all('/*', async (request) => ({ version: getDispatchContext(request).version }))
      },
      { prefix: '/mcp' },
    )
    try {
      const health = await app.inject({ method: 'GET', url: '/health', headers: { host: HOST } })
      expect(health.json()).toEqual({ ok: true })
      const dispatched = await app.inject({
        method: 'POST',
        url: '/mcp/v1',
        headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
        payload: tools,
      })
      expect(dispatched.json()).toEqual({ version: '1.0.0' })
      expect(dispatched.headers['x-mcp-version']).toBe('1.0.0')
      const refused = await app.inject({ method: 'POST', url: '/mcp/v1', headers: { host: HOST }, payload: tools })
      expect(refused.statusCode).toBe(401)
    } finally {
      await app.close()
    }
  })

  it('both plugins are Fastify 5 plugins by name: another major refuses them (FST_ERR_PLUGIN_VERSION_MISMATCH), and the platform can depend on them', async () => {
    const fixture = createFixture()
    for (const [name, plugin] of [
      ['mcp-dispatch', mcpDispatch({ dispatcher: fixture.dispatcher })],
      ['mcp-dispatch-token-api', serveTokenApi(createTokenApi({ tokens: fixture.dispatcherOptions.tokens, authenticateSession: () => null, verifyCsrf: () => true }))],
    ] as const) {
      const older = Fastify()
      Object.defineProperty(older, 'version', { value: '4.29.1' })
      await expect(older.register(plugin).ready(), name).rejects.toMatchObject({ code: 'FST_ERR_PLUGIN_VERSION_MISMATCH', message: expect.stringContaining(name) })
      await older.close()
      // Registered under its name, a platform plugin can declare it as a dependency.
      const app = Fastify()
      await app.register(plugin)
      const dependent = Object.assign(async () => {}, { [Symbol.for('plugin-meta')]: { name: 'platform', dependencies: [name] } })
      await expect(app.register(dependent).ready(), name).resolves.toBeDefined()
      await app.close()
    }
  })

  it('getDispatchContext throws where the plugin did not run', async () => {
    const app = Fastify()
    app.get('/', async (request) => {
      try {
        getDispatchContext(request)
        return 'no error'
      } catch (error) {
        return (error as Error).constructor.name
      }
    })
    expect((await app.inject({ method: 'GET', url: '/' })).body).toBe('TypeError')
    await app.close()
  })

  it('behind a proxy Fastify trusts, the App address and the handler\'s Request take the scheme of X-Forwarded-Proto, read as a scheme (HTTPS, not ws)', async () => {
    const fixture = createFixture()
    const app = Fastify({ trustProxy: true })
    await app.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
    app.all('/*', fromWebHandler((request, context) => new Response(`${context.baseUrl} ${request.url}`)))
    const ask = (url: string, proto: string) =>
      app.inject({ method: url === '/v1' ? 'POST' : 'GET', url, headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', 'x-forwarded-proto': proto }, payload: url === '/v1' ? tools : undefined })
    const resourceOf = async (proto: string) => (JSON.parse((await ask('/.well-known/oauth-protected-resource', proto)).body) as { resource: string }).resource
    expect(await resourceOf('HTTPS')).toBe(`https://${HOST}`)
    expect(await resourceOf('ws')).toBe(`http://${HOST}`)
    expect((await ask('/v1', 'HTTPS')).body).toBe(`https://${HOST} https://${HOST}/v1`)
    expect((await ask('/v1', 'javascript')).body).toBe(`http://${HOST} http://${HOST}/v1`)
    await app.close()
  })

  it('routeByVersion: a handler that is not async behaves as it would as the route itself (one that sends later was an empty 200 at once)', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const app = Fastify()
    await app.register(mcpDispatch({ dispatcher: fixture.dispatcher, onError: (error) => errors.push(error) }))
    type Handler = (request: unknown, reply: { send(body: unknown): unknown; hijack(): void; raw: import('node:http').ServerResponse }) => unknown
    const handlers: Record<string, Handler> = {
      // Fastify's own contract for such a handler: it answers nothing, and sends when ready.
      later: (_request, reply) => void setTimeout(() => reply.send({ answer: 'later' }), 20),
      value: () => ({ answer: 'value' }),
      sent: (_request, reply) => reply.send({ answer: 'sent' }),
      async: async () => ({ answer: 'async' }),
      hijacked: (_request, reply) => {
        reply.hijack()
        setTimeout(() => reply.raw.writeHead(200, { 'content-type': 'application/json' }).end('{"answer":"hijacked"}'), 20)
      },
      throws: () => {
        throw new Error('sync failure')
      },
      rejects: async () => {
        throw new Error('async failure')
      },
    }
    app.all('/*', routeByVersion(() => (request, reply) => handlers[(request as { headers: Record<string, string> }).headers['x-answer']!]!(request, reply as never)))
    await app.listen({ host: '127.0.0.1', port: 0 })
    try {
      const port = (app.server.address() as AddressInfo).port
      for (const answer of Object.keys(handlers)) {
        const res = await rawRequest(port, { path: '/v1', headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', 'x-answer': answer }, body: tools })
        expect(res.headers['x-mcp-version'], answer).toBe('1.0.0')
        if (answer === 'throws' || answer === 'rejects') {
          expect(res.status, answer).toBe(502)
          expect(JSON.parse(res.body), answer).toMatchObject({ error: { data: { error: 'handler_error' } } })
        } else {
          expect(res.status, answer).toBe(200)
          expect(JSON.parse(res.body), answer).toEqual({ answer })
        }
      }
      expect(errors.map((error) => (error as Error).message)).toEqual(['sync failure', 'async failure'])
    } finally {
      await app.close()
    }
  })

  it('fromWebHandler re-serializes a body Fastify already parsed', async () => {
    const fixture = createFixture()
    const app = Fastify()
    await app.register(mcpDispatch({ dispatcher: fixture.dispatcher }))
    app.all('/*', fromWebHandler(async (request, context) => new Response(`${context.version} ${await request.text()}`)))
    const res = await app.inject({
      method: 'POST',
      url: '/v2',
      headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
      payload: '{ "jsonrpc": "2.0", "id": 1, "method": "tools/list" }',
    })
    expect(res.statusCode).toBe(200)
    expect(res.headers['x-mcp-version']).toBe('2.0.0')
    expect(res.body).toBe(`2.0.0 ${tools}`)
    await app.close()
  })

  it('fromWebHandler, a Response it cannot write (a header value Node refuses, Response.error(), no Response): the JSON-RPC 502 and onError (regression: the hijacked reply was never answered)', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const app = Fastify()
    await app.register(mcpDispatch({ dispatcher: fixture.dispatcher, onError: (error) => errors.push(error) }))
    const answers: Record<string, () => Response> = {
      header: () => new Response('{}', { headers: { 'x-tool': 'a\x01b' } }),
      error: () => Response.error(),
      none: () => undefined as unknown as Response,
    }
    app.all('/*', fromWebHandler((request) => answers[request.headers.get('x-answer')!]!()))
    await app.listen({ host: '127.0.0.1', port: 0 })
    try {
      const port = (app.server.address() as AddressInfo).port
      for (const answer of Object.keys(answers)) {
        const res = await Promise.race([
          rawRequest(port, { path: '/v1', headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', 'x-answer': answer }, body: tools }),
          new Promise<never>((_resolve, reject) => setTimeout(() => reject(new Error(`${answer}: no answer in 2 s`)), 2000)),
        ])
        expect(res.status, answer).toBe(502)
        expect(JSON.parse(res.body), answer).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32603, data: { error: 'handler_error' } } })
        expect(res.headers['content-type'], answer).toBe('application/json')
        expect(res.headers['x-mcp-version'], answer).toBe('1.0.0')
      }
      expect(errors).toHaveLength(3)
    } finally {
      await app.close()
    }
  })

  it("fromWebHandler, a header a platform hook set that Node refuses: left out, the handler's answer goes out, and the plugin's onError hears it, not stderr (regression: stderr)", async () => {
    const fixture = createFixture()
    const reported: string[] = []
    const app = Fastify()
    app.addHook('onRequest', async (_request, reply) => {
      reply.header('x-display-name', 'Zoë €')
      reply.header('x-frame-options', 'DENY')
    })
    await app.register(mcpDispatch({ dispatcher: fixture.dispatcher, onError: (_error, context) => reported.push(context) }))
    app.all('/*', fromWebHandler(() => Response.json({ jsonrpc: '2.0', id: 1, result: { tools: [] } })))
    await app.listen({ host: '127.0.0.1', port: 0 })
    const stderr = vi.spyOn(console, 'error').mockImplementation(() => {})
    try {
      const port = (app.server.address() as AddressInfo).port
      const res = await rawRequest(port, { path: '/v1', headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' }, body: tools })
      expect([res.status, res.headers['x-frame-options'], res.headers['x-display-name'], res.headers['x-mcp-version']]).toEqual([200, 'DENY', undefined, '1.0.0'])
      expect(reported).toEqual([expect.stringContaining('"x-display-name"')])
      expect(stderr).not.toHaveBeenCalled()
    } finally {
      stderr.mockRestore()
      await app.close()
    }
  })

  it('fromWebHandler and routeByVersion on a route the dispatch layer never saw (a wiring mistake) answer the JSON-RPC 502, not Fastify\'s 500 with the TypeError', async () => {
    for (const handler of [fromWebHandler(() => new Response('never')), routeByVersion(() => () => 'never')]) {
      const app = Fastify()
      app.all('/*', handler)
      const stderr = vi.spyOn(console, 'error').mockImplementation(() => {})
      try {
        const res = await app.inject({ method: 'POST', url: '/v1', headers: { host: HOST, 'content-type': 'application/json' }, payload: tools })
        expect(res.statusCode).toBe(502)
        expect(res.json()).toMatchObject({ jsonrpc: '2.0', error: { data: { error: 'handler_error' } } })
        expect(res.body).not.toContain('TypeError')
        expect(stderr.mock.calls.join(' ')).toMatch(/dispatch/i)
      } finally {
        stderr.mockRestore()
        await app.close()
      }
    }
  })
})
