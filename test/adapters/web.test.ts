/**
 * The Web adapter (`mcp-dispatch/web`) against the shared suite: in memory with `Request`
 * objects, over loopback HTTP (`@hono/node-server`) for streaming.
 */
import * as vm from 'node:vm'
import { type TrustProxy, createMemoryAppStore, createTokenApi } from 'mcp-dispatch'
import { getDispatchContext, mcpDispatch, whenBodyEnds } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { serveFetch } from '../helpers/platform.js'
import { Hono } from 'hono'
import { HOST, createFixture, loopbackFetch, rawRequest } from './helpers.js'
import { buildScenarioServer, createWebMcpHandler, expectSessionGoesOn } from './mcp.js'
import { describeAdapter } from './suite.js'
import { startWeb, startWebOnNode } from './targets.js'

describeAdapter('web', startWeb)
// On @hono/node-server with `info.outgoing`: the headers go into Node's response head.
describeAdapter('web-node-head', startWebOnNode)

describe('web adapter specifics', () => {
  it('getDispatchContext finds the context of a dispatched request, and throws for another', async () => {
    const fixture = createFixture()
    let seen: string | undefined
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: (request) => {
        seen = getDispatchContext(request).version
        return new Response('ok')
      },
    })
    const res = await handle(
      new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' }),
    )
    expect(res.status).toBe(200)
    expect(seen).toBe('1.0.0')
    expect(() => getDispatchContext(new Request('http://weather.localhost/'))).toThrow(TypeError)
  })

  it('getDispatchContext finds the context of a request that takes no property (frozen) too, and leaves a request\'s own keys alone', async () => {
    const fixture = createFixture()
    const seen: string[] = []
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: (request, context) => {
        seen.push(`${getDispatchContext(request).version} ${getDispatchContext(request) === context}`)
        return new Response('ok')
      },
    })
    const post = () => new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' })
    const open = post()
    const keys = Object.keys(open)
    expect((await handle(open)).status).toBe(200)
    expect((await handle(Object.freeze(post()))).status).toBe(200)
    expect(seen).toEqual(['1.0.0 true', '1.0.0 true'])
    expect(Object.keys(open)).toEqual(keys)
    expect(JSON.stringify(open)).toBe(JSON.stringify(post()))
  })

  it('answers HEAD of the metadata of an App with a name out of ASCII with the Content-Length of its GET body in bytes, not in characters', async () => {
    const fixture = createFixture()
    const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Météo ☀', versions: ['1.0.0'] }])
    const handle = mcpDispatch({ dispatcher: { ...fixture.dispatcherOptions, apps }, handler: () => new Response('unreached') })
    const metadata = (method: string) => handle(new Request(`http://${HOST}/.well-known/oauth-protected-resource`, { method }))
    const body = Buffer.from(await (await metadata('GET')).arrayBuffer())
    expect(JSON.parse(body.toString()).resource_name).toBe('Météo ☀')
    expect(body.byteLength).toBeGreaterThan(body.toString().length)
    const head = await metadata('HEAD')
    expect(head.status).toBe(200)
    expect(head.headers.get('content-length')).toBe(String(body.byteLength))
  })

  describe('info.outgoing (@hono/node-server)', () => {
    const probe = async (outgoing: (env: unknown) => unknown) => {
      const fixture = createFixture()
      const returned: Response[] = []
      const handle = mcpDispatch({
        dispatcher: fixture.dispatcher,
        handler: () => new Response('{"ok":true}', { headers: { 'content-type': 'application/json', 'mcp-session-id': 's-1' } }),
      })
      const served = await serveFetch(async (request, info) => {
        const response = await handle(request, { clientAddress: info.clientAddress, outgoing: outgoing(info.outgoing) })
        returned.push(response)
        return response
      })
      try {
        const res = await rawRequest(served.port, {
          path: '/v1',
          headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
          body: '{}',
        })
        // The session the handler opened is pinned either way.
        const next = await rawRequest(served.port, {
          path: '/',
          headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'mcp-session-id': 's-1', 'content-type': 'application/json' },
          body: '{}',
        })
        return { res, next, returned: returned[0]! }
      } finally {
        await served.close()
      }
    }

    it('puts the dispatch headers into the Node head and returns the handler response untouched', async () => {
      const { res, next, returned } = await probe((outgoing) => outgoing)
      expect(res.status).toBe(200)
      expect(res.headers['x-mcp-version']).toBe('1.0.0')
      expect(res.headers['x-mcp-latest-version']).toBeDefined()
      expect(returned.headers.get('x-mcp-version')).toBeNull()
      expect(next.status).toBe(200)
      expect(next.headers['x-mcp-version']).toBe('1.0.0')
    })

    it('a handler that throws or rejects gets the 502, with the dispatch headers as on Express and Fastify, and the server serves on', async () => {
      const fixture = createFixture()
      const errors: unknown[] = []
      const handle = mcpDispatch({
        dispatcher: fixture.dispatcher,
        onError: (error) => errors.push(error),
        handler: (request) => {
          const how = request.headers.get('x-fail')
          if (how === 'throw') throw new Error('thrown')
          if (how === 'reject') return Promise.reject(new Error('rejected'))
          return new Response('{}', { headers: { 'content-type': 'application/json' } })
        },
      })
      const served = await serveFetch(handle)
      try {
        const send = (how?: string) =>
          rawRequest(served.port, {
            path: '/v1',
            headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', ...(how && { 'x-fail': how }) },
            body: '{}',
          })
        for (const how of ['throw', 'reject']) {
          const res = await send(how)
          expect(res.status).toBe(502)
          expect(res.headers['x-mcp-version']).toBe('1.0.0')
          expect(JSON.parse(res.body)).toMatchObject({ error: { data: { error: 'handler_error' } } })
        }
        expect(errors.map((e) => (e as Error).message)).toEqual(['thrown', 'rejected'])
        const ok = await send()
        expect(ok.status).toBe(200)
        expect(ok.headers['x-mcp-version']).toBe('1.0.0')
      } finally {
        await served.close()
      }
    })

    it('ignores an outgoing that is not a node:http response, and stamps the Response instead', async () => {
      const { res, next, returned } = await probe(() => ({ writeHead() {}, getHeader() {}, headersSent: false }))
      const { res: atHead } = await probe((outgoing) => outgoing)
      const { date: _d1, ...stamped } = res.headers
      const { date: _d2, ...headed } = atHead.headers
      expect(stamped).toEqual(headed)
      expect(res.headers['x-mcp-version']).toBe('1.0.0')
      expect(returned.headers.get('x-mcp-version')).toBe('1.0.0')
      expect(next.status).toBe(200)
    })
  })
})

describe('web adapter: answers no runtime can send, and hosts no URL parser read', () => {
  /** The handler's answer for each `x-answer`, as a handler with a bug might give it. */
  const answers: Record<string, () => unknown> = {
    nothing: () => undefined,
    object: () => ({ status: 200, body: '{}' }),
    'Response.error()': () => Response.error(),
    // Lambda-style: the shape of a Response, no Response (regression: stamped, then a runtime's 500).
    'shaped like a Response': () => ({ status: 200, headers: new Headers({ 'content-type': 'application/json' }), body: '{"a":1}' }),
    // A runtime's own Response (immutable headers, as fetch gives them) whose body the handler
    // read, or locked (regression: the copy for the headers threw, a runtime's 500, the session pinned).
    'a fetched Response already read': async () => {
      const fetched = await fetch('data:application/json,{}')
      await fetched.text()
      return fetched
    },
    'a fetched Response locked': async () => {
      const fetched = await fetch('data:application/json,{}')
      fetched.body!.getReader()
      return fetched
    },
    // A Response of another realm (by its shape and methods) with an informational status,
    // which is no final answer (a runtime's WebSocket upgrade, 101).
    'a Response of another realm of status 101': () => ({ status: 101, headers: new Headers(), body: null, bodyUsed: false, arrayBuffer: async () => new ArrayBuffer(0) }),
    'foreign promise of nothing': () => vm.runInNewContext('Promise.resolve(undefined)'),
    'foreign promise of a Response': () => vm.runInNewContext('Promise.resolve(r)', { r: Response.json({ ok: true }) }),
  }

  it.each(['@hono/node-server with outgoing', '@hono/node-server without outgoing', 'in process'])(
    '%s: a 502 with the dispatch headers, reported to onError; a promise of another realm is awaited',
    async (mode) => {
      const fixture = createFixture()
      const errors: unknown[] = []
      const handle = mcpDispatch({
        dispatcher: fixture.dispatcher,
        onError: (error) => errors.push(error),
        handler: (request) => answers[request.headers.get('x-answer')!]!() as Response,
      })
      const served =
        mode === 'in process'
          ? undefined
          : await serveFetch((request, info) =>
              handle(request, mode.includes('without') ? { clientAddress: info.clientAddress } : info),
            )
      const send = async (answer: string) => {
        const headers = { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', 'x-answer': answer }
        if (served) return rawRequest(served.port, { path: '/v1', headers, body: '{}' })
        const response = await handle(new Request(`http://${HOST}/v1`, { method: 'POST', headers, body: '{}' }))
        return { status: response.status, headers: Object.fromEntries(response.headers), body: await response.text() }
      }
      try {
        const failing = ['nothing', 'object', 'Response.error()', 'shaped like a Response', 'a fetched Response already read', 'a fetched Response locked', 'a Response of another realm of status 101', 'foreign promise of nothing']
        for (const answer of failing) {
          const res = await send(answer)
          expect(res.status, answer).toBe(502)
          expect(res.headers['x-mcp-version'], answer).toBe('1.0.0')
          expect(JSON.parse(res.body), answer).toMatchObject({ id: null, error: { data: { error: 'handler_error' } } })
        }
        expect(errors).toHaveLength(failing.length)
        for (const error of errors) expect((error as Error).message).toMatch(/^mcp-dispatch: the handler answered with/)
        expect((errors[failing.indexOf('a Response of another realm of status 101')] as Error).message).toMatch(/a Response of status 101, which cannot be sent/)
        const foreign = await send('foreign promise of a Response')
        expect(foreign.status).toBe(200)
        expect(foreign.headers['x-mcp-version']).toBe('1.0.0')
        expect(JSON.parse(foreign.body)).toEqual({ ok: true })
      } finally {
        await served?.close()
      }
    },
  )

  it('a request whose body middleware read first is the 502, onError naming the cause, never the handler\'s parse error for valid JSON (regression)', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    let handled = 0
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      onError: (error) => errors.push(error),
      handler: () => (handled++, new Response('{}')),
    })
    const request = new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{"jsonrpc":"2.0","id":1,"method":"ping"}' })
    await request.json() // a validator in front
    const res = await handle(request)
    expect([res.status, res.headers.get('x-mcp-version'), handled]).toEqual([502, '1.0.0', 0])
    expect((errors[0] as Error).message).toMatch(/request body was read before the handler/)
  })

  it('an info.host or info.clientAddress that is no string is the platform\'s wiring: 500 -32603 in JSON-RPC words, no Retry-After, reported, never a runtime\'s page (regression: rejected, or 503 unreported; then a 503 with Retry-After: 1, which a client retries for ever)', async () => {
    const fixture = createFixture()
    const errors: Array<[string, string]> = []
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      onError: (error, context) => errors.push([context, (error as Error).message]),
      handler: () => new Response('{}'),
    })
    const post = () => new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' })
    for (const info of [{ host: 123 }, { clientAddress: { address: '127.0.0.1', port: 1, family: 'IPv4' } }]) {
      const res = await handle(post(), info as never)
      expect([res.status, res.headers.get('retry-after'), res.headers.get('content-type')], JSON.stringify(info)).toEqual([500, null, 'application/json'])
      expect(await res.json()).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32603, message: 'Internal error' } })
    }
    expect(errors).toEqual([
      ['adapter', 'mcp-dispatch: info.host must be a string, got number'],
      ['adapter', 'mcp-dispatch: info.clientAddress must be a string, got object'],
    ])
    // null and '' name no peer, as before.
    expect((await handle(post(), { clientAddress: null })).status).toBe(200)
    expect((await handle(post(), { clientAddress: '' })).status).toBe(200)
  })

  it('a handler given to the runtime as it is (the runtime\'s own second argument as info, naming no client address) is the platform\'s wiring: 500, reported with the wiring to write, never served as from no known peer', async () => {
    const fixture = createFixture()
    const errors: Array<[string, string]> = []
    let handled = 0
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      onError: (error, context) => errors.push([context, (error as Error).message]),
      handler: () => (handled++, new Response('{}')),
    })
    const post = () => new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' })
    // @hono/node-server's `serve({ fetch: handle })`, for real: its env is `{ incoming, outgoing }`.
    const { serve } = await import('@hono/node-server')
    const server = await new Promise<import('node:http').Server>((resolve) => {
      const s = serve({ fetch: handle as never, port: 0, hostname: '127.0.0.1' }, () => resolve(s as never)) as unknown as import('node:http').Server
    })
    try {
      const { port } = server.address() as import('node:net').AddressInfo
      const res = await fetch(`http://127.0.0.1:${port}/v1`, { method: 'POST', headers: { host: HOST, authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' })
      expect([res.status, res.headers.get('retry-after')]).toEqual([500, null])
      expect(await res.json()).toMatchObject({ error: { code: -32603, message: 'Internal error' } })
    } finally {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
    }
    // A Hono Context in place of info (`app.post('/*', (c) => handle(c.req.raw, c))`), for real.
    const app = new Hono()
    app.post('/*', (c) => handle(c.req.raw, c as never))
    expect((await app.fetch(post())).status).toBe(500)
    // Bun's Server and Deno's ServeHandlerInfo, as those runtimes pass them (test/runtimes runs
    // the adapter under both, wired as documented).
    const bunServer = { port: 3000, hostname: '127.0.0.1', requestIP: () => ({ address: '127.0.0.1', family: 'IPv4', port: 5000 }), upgrade: () => false }
    const denoInfo = { remoteAddr: { transport: 'tcp', hostname: '127.0.0.1', port: 5000 }, completed: Promise.resolve() }
    for (const info of [bunServer, denoInfo, null, 'x']) expect((await handle(post(), info as never)).status, JSON.stringify(info)).toBe(500)
    expect(handled).toBe(0)
    expect(errors).toEqual([
      ['adapter', "mcp-dispatch: info is @hono/node-server's env, which names no client address: pass fetch: (request, env) => handle(request, { clientAddress: env.incoming.socket.remoteAddress, outgoing: env.outgoing })"],
      ['adapter', "mcp-dispatch: info is Hono's Context, which names no client address: pass (c) => handle(c.req.raw, { clientAddress: c.env.incoming.socket.remoteAddress, outgoing: c.env.outgoing }) on @hono/node-server"],
      ['adapter', "mcp-dispatch: info is Bun's server, which names no client address: pass fetch: (request, server) => handle(request, { clientAddress: server.requestIP(request)?.address })"],
      ['adapter', "mcp-dispatch: info is Deno's ServeHandlerInfo, which names no client address: pass (request, info) => handle(request, { clientAddress: info.remoteAddr.hostname })"],
      ['adapter', 'mcp-dispatch: info must be an object or undefined, got null'],
      ['adapter', 'mcp-dispatch: info must be an object or undefined, got string'],
    ])
    // Wired as documented, each is served; an info naming no client address on purpose too, and
    // one that gives `clientAddress` beside a runtime's fields.
    for (const info of [{ clientAddress: '127.0.0.1' }, { clientAddress: undefined }, {}, { ...bunServer, clientAddress: '127.0.0.1' }, { clientAddress: null, outgoing: undefined }]) {
      expect((await handle(post(), info as never)).status, JSON.stringify(info)).toBe(200)
    }
    expect(handled).toBe(5)
  })

  it('a Workers env given as info (fetch: handle), which cannot be told apart from one, is served (200, nothing reported), a binding named req or incoming of no object included', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const handle = mcpDispatch({ dispatcher: fixture.dispatcher, onError: (error) => errors.push(error), handler: () => new Response('{}') })
    // A KV namespace bound as `req`, a variable bound as `incoming`, beside the usual bindings.
    const env = { req: { get: async () => null, put: async () => {} }, incoming: 'queue-name', API_KEY: 'secret' }
    const res = await handle(new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' }), env as never)
    expect(res.status).toBe(200)
    expect(errors).toEqual([])
  })

  it('on @hono/node-server, a lower-case Host that is no host (weather.1, 1.2.3.999, 0x7f.1) is the JSON-RPC 400, not an App address', async () => {
    const fixture = createFixture()
    let handled = 0
    const served = await serveFetch(
      mcpDispatch({
        dispatcher: fixture.dispatcher,
        handler: () => {
          handled++
          return new Response('{}')
        },
      }),
    )
    try {
      for (const host of ['weather.1', '1.2.3.999', '0x7f.1', 'weather.1:8080']) {
        for (const path of ['/v1', '/.well-known/oauth-protected-resource']) {
          const res = await rawRequest(served.port, {
            host,
            path,
            method: path === '/v1' ? 'POST' : 'GET',
            headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
            ...(path === '/v1' && { body: '{}' }),
          })
          expect(res.status, `${host}${path}`).toBe(400)
          expect(JSON.parse(res.body)).toEqual({
            jsonrpc: '2.0',
            id: null,
            error: { code: -32600, message: 'Invalid Host header', data: { error: 'invalid_request', field: 'host' } },
          })
        }
      }
      expect(handled).toBe(0)
      // Hosts the parser reads are served as before.
      const metadata = await rawRequest(served.port, { host: 'weather.localhost:8080', method: 'GET', path: '/.well-known/oauth-protected-resource' })
      expect(JSON.parse(metadata.body).resource).toBe('http://weather.localhost:8080')
    } finally {
      await served.close()
    }
  })

  it('on @hono/node-server with the token API mounted in front (api(request) ?? mcp(request)), such a Host is the MCP adapter\'s 400 outside the API\'s path and the API\'s own 400 under it (regression: the API threw a TypeError on every path)', async () => {
    const fixture = createFixture()
    let handled = 0
    const mcp = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: () => {
        handled++
        return new Response('{}')
      },
    })
    const api = createTokenApi({ tokens: fixture.dispatcherOptions.tokens, authenticateSession: () => ({ userId: 'alice' }), verifyCsrf: () => true })
    const served = await serveFetch(async (request) => (await api(request)) ?? mcp(request))
    try {
      for (const host of ['weather.1', '1.2.3.999']) {
        const mcpPath = await rawRequest(served.port, { host, path: '/v1', method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' })
        expect(mcpPath.status, host).toBe(400)
        expect(JSON.parse(mcpPath.body).error).toEqual({ code: -32600, message: 'Invalid Host header', data: { error: 'invalid_request', field: 'host' } })
        for (const path of ['/api/tokens', '/api/tokens/', '/api/tokens?q', '/api/tokens/abc']) {
          const apiPath = await rawRequest(served.port, { host, path, method: 'GET' })
          expect(apiPath.status, `${host}${path}`).toBe(400)
          expect(JSON.parse(apiPath.body)).toEqual({ error: 'invalid_request', message: 'host: is not a valid Host header', field: 'host' })
        }
        // HEAD: the status and headers, no body (on the Response itself: Node drops a HEAD body
        // on the wire anyway).
        const head = await api({ url: `http://${host}/api/tokens`, method: 'HEAD', headers: new Headers() } as unknown as Request)
        expect([head?.status, head?.headers.get('content-type'), head?.body]).toEqual([400, 'application/json', null])
        // A path that only starts like the API's is not the API's, nor one that starts `//`
        // (the URL parser's path `//x/api/tokens`, not a scheme-relative reference's).
        for (const path of ['/api/tokensx', '//x/api/tokens']) {
          expect(JSON.parse((await rawRequest(served.port, { host, path, method: 'GET' })).body).error?.code, path).toBe(-32600)
        }
      }
      expect(handled).toBe(0)
      // A Host the parser reads: the API answers as before.
      expect((await rawRequest(served.port, { host: 'weather.localhost', path: '/api/tokens', method: 'GET' })).status).toBe(200)
    } finally {
      await served.close()
    }
  })
})

describe('web adapter: info.host, for runtimes whose request.url does not carry the Host (Next.js)', () => {
  // `next start` builds a route handler's URL of its own address (http://localhost:3000/v1),
  // whatever Host the client sent: test/nextjs/nextjs.test.ts runs it.
  const NEXT_URL = 'http://localhost:3000'
  const setup = () => {
    const fixture = createFixture()
    const seen: string[] = []
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: (request, context) => {
        seen.push(`${context.app.slug} ${context.baseUrl} ${request.url}`)
        return Response.json({ ok: true })
      },
    })
    const post = (host: string | null | undefined, path = '/v1', token = fixture.tokens.alice) =>
      handle(new Request(`${NEXT_URL}${path}`, { method: 'POST', headers: { authorization: `Bearer ${token}` }, body: '{}' }), { host })
    return { fixture, seen, handle, post }
  }

  it('finds the App by the host given, and makes the App address of it (as the URL parser reads the host); the handler gets the request as it came', async () => {
    const { seen, handle, post } = setup()
    const served = await post('weather.localhost:8080')
    expect(served.status).toBe(200)
    expect(served.headers.get('x-mcp-version')).toBe('1.0.0')
    expect(seen).toEqual([`weather http://weather.localhost:8080 ${NEXT_URL}/v1`])
    // Read as the URL parser reads it: lower case, no default port.
    expect((await post('NOTES.localhost:80')).status).toBe(200)
    expect(seen[1]).toBe(`notes http://notes.localhost ${NEXT_URL}/v1`)
    // A port with a leading zero, in the parser's form.
    expect((await post('weather.localhost:08080')).status).toBe(200)
    expect(seen[2]).toBe(`weather http://weather.localhost:8080 ${NEXT_URL}/v1`)

    const refused = await handle(new Request(`${NEXT_URL}/v1`, { method: 'POST', body: '{}' }), { host: 'weather.localhost:8080' })
    expect(refused.status).toBe(401)
    expect(refused.headers.get('www-authenticate')).toBe('Bearer resource_metadata="http://weather.localhost:8080/.well-known/oauth-protected-resource"')
    const metadata = await handle(new Request(`${NEXT_URL}/.well-known/oauth-protected-resource`), { host: 'weather.localhost:8080' })
    expect(((await metadata.json()) as { resource: string }).resource).toBe('http://weather.localhost:8080')
    // The scheme stays the URL's.
    const https = await handle(new Request('https://localhost:3000/.well-known/oauth-protected-resource'), { host: 'weather.localhost:443' })
    expect(((await https.json()) as { resource: string }).resource).toBe('https://weather.localhost')
  })

  it('a host no URL can hold, or a list of them, is the JSON-RPC 400; none (null, empty) is no App, 404; undefined is the URL\'s host', async () => {
    const { seen, post } = setup()
    for (const host of ['weather.localhost:99999', 'a@weather.localhost', 'weather.localhost/x', 'weather.1', 'weather.localhost, notes.localhost', 'weather localhost', 'weather"x.localhost', 'weather{x}.localhost', 'weather.localhost,notes.localhost']) {
      const res = await post(host)
      expect(res.status, host).toBe(400)
      expect(await res.json()).toEqual({
        jsonrpc: '2.0',
        id: null,
        error: { code: -32600, message: 'Invalid Host header', data: { error: 'invalid_request', field: 'host' } },
      })
    }
    // Through the URL itself (no info.host): the URL parser keeps `"` and `{` in a host name.
    const fixture = createFixture()
    const viaUrl = mcpDispatch({ dispatcher: fixture.dispatcher, handler: () => Response.json({ ok: true }) })
    for (const url of ['http://weather"x.localhost/v1', 'http://weather{x}.localhost/v1', 'http://weather.localhost,notes.localhost/v1']) {
      const res = await viaUrl(new Request(url, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' }))
      expect(res.status, url).toBe(400)
    }
    for (const host of [null, '']) {
      const res = await post(host)
      expect(res.status, String(host)).toBe(404)
      expect(((await res.json()) as { error: { data: unknown } }).error.data).toEqual({ error: 'not_found' })
    }
    // Without it, the URL's host (here Next's own, no App).
    expect((await post(undefined)).status).toBe(404)
    expect(seen).toEqual([])
  })
})

describe('web adapter: X-Forwarded-Proto, behind a trusted TLS-terminating proxy', () => {
  const setup = (trustProxy?: TrustProxy) => {
    const fixture = createFixture()
    const seen: string[] = []
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      ...(trustProxy !== undefined && { trustProxy }),
      handler: (_request, context) => {
        seen.push(context.baseUrl)
        return Response.json({ ok: true })
      },
    })
    const ask = async (url: string, proto: string | undefined, clientAddress: string | undefined, token?: string) => {
      const headers: Record<string, string> = {}
      if (proto !== undefined) headers['x-forwarded-proto'] = proto
      if (token !== undefined) headers.authorization = `Bearer ${token}`
      return handle(new Request(url, token === undefined ? { headers } : { method: 'POST', headers, body: '{}' }), { clientAddress })
    }
    const resourceOf = async (url: string, proto: string | undefined, clientAddress: string | undefined) =>
      ((await (await ask(`${url}/.well-known/oauth-protected-resource`, proto, clientAddress)).json()) as { resource: string }).resource
    return { fixture, seen, ask, resourceOf }
  }

  it('a trusted peer sets the scheme of the App address: the metadata, the 401 and the handler\'s baseUrl', async () => {
    const { fixture, seen, ask, resourceOf } = setup(['10.0.0.0/8'])
    expect(await resourceOf(`http://${HOST}`, 'https', '10.0.0.2')).toBe(`https://${HOST}`)
    // The client's port stays; a default port of the client's scheme goes, as a URL parser reads it.
    expect(await resourceOf(`http://${HOST}:8443`, 'https', '10.0.0.2')).toBe(`https://${HOST}:8443`)
    expect(await resourceOf(`http://${HOST}:443`, 'https', '10.0.0.2')).toBe(`https://${HOST}`)
    expect(await resourceOf(`https://${HOST}`, 'HTTP', '10.0.0.2')).toBe(`http://${HOST}`)
    const refused = await ask(`http://${HOST}/v1`, 'https', '10.0.0.2', 'svc_not_a_token')
    expect(refused.status).toBe(401)
    expect(refused.headers.get('www-authenticate')).toContain(`resource_metadata="https://${HOST}/.well-known/oauth-protected-resource"`)
    const served = await ask(`http://${HOST}/v1`, 'https, http', '10.0.0.2', fixture.tokens.alice)
    expect(served.status).toBe(200)
    expect(seen).toEqual([`https://${HOST}`])
  })

  it('an explicit :80 in info.host stays when the client\'s scheme is https (no default of it), as on Express and Fastify (regression: dropped under http first)', async () => {
    const fixture = createFixture()
    const handle = mcpDispatch({ dispatcher: fixture.dispatcher, trustProxy: ['127.0.0.1'], handler: () => new Response('{}') })
    const resource = async (request: Request, info: { clientAddress?: string; host?: string }) =>
      ((await (await handle(request, info)).json()) as { resource: string }).resource
    const metadata = (proto: string) => new Request(`http://${HOST}/.well-known/oauth-protected-resource`, { headers: { 'x-forwarded-proto': proto } })
    expect(await resource(metadata('https'), { clientAddress: '127.0.0.1', host: `${HOST}:80` })).toBe(`https://${HOST}:80`)
    expect(await resource(metadata('https'), { clientAddress: '127.0.0.1', host: `${HOST}:443` })).toBe(`https://${HOST}`)
    expect(await resource(metadata('http'), { clientAddress: '127.0.0.1', host: `${HOST}:80` })).toBe(`http://${HOST}`)
    // Over @hono/node-server, whose URL has no `:80` whatever the Host (it parses it as http):
    // only the port of https can be seen there.
    const served = await serveFetch(handle)
    try {
      for (const [host, proto, expected] of [
        [`${HOST}:443`, 'https', `https://${HOST}`],
        [`${HOST}:80`, 'http', `http://${HOST}`],
        [`${HOST}:443`, 'http', `http://${HOST}:443`],
      ] as const) {
        const res = await rawRequest(served.port, { host, path: '/.well-known/oauth-protected-resource', method: 'GET', headers: { 'x-forwarded-proto': proto } })
        expect(JSON.parse(res.body).resource, `${host} ${proto}`).toBe(expected)
      }
    } finally {
      await served.close()
    }
  })

  it('is ignored from an untrusted peer, without trustProxy, without a peer address, and for a value that is no scheme', async () => {
    const trusting = setup(['10.0.0.0/8'])
    expect(await trusting.resourceOf(`http://${HOST}`, 'https', '203.0.113.9')).toBe(`http://${HOST}`)
    expect(await trusting.resourceOf(`http://${HOST}`, 'https', undefined)).toBe(`http://${HOST}`)
    for (const value of ['ws', 'javascript', 'https:', '']) {
      expect(await trusting.resourceOf(`http://${HOST}`, value, '10.0.0.2'), value).toBe(`http://${HOST}`)
    }
    expect(await setup().resourceOf(`http://${HOST}`, 'https', '10.0.0.2')).toBe(`http://${HOST}`)
    // A hop count trusts whichever peer is next to the server.
    expect(await setup(1).resourceOf(`http://${HOST}`, 'https', '203.0.113.9')).toBe(`https://${HOST}`)
  })
})

describe('web adapter: a clientAddress of null or \'\' (a header lookup in a platform\'s JavaScript) names no peer', () => {
  it('as undefined does: X-Forwarded-For and -Proto are not taken on their word, an allowlist refuses (403), nothing fails', async () => {
    for (const trustProxy of [undefined, 1, ['10.0.0.0/8']] as const) {
      const fixture = createFixture()
      const handle = mcpDispatch({
        dispatcher: fixture.dispatcher,
        ...(trustProxy !== undefined && { trustProxy }),
        handler: (_request, context) => Response.json({ baseUrl: context.baseUrl }),
      })
      for (const none of [null, '']) {
        const ask = (token: string) =>
          handle(
            new Request(`http://${HOST}/v1`, {
              method: 'POST',
              headers: { authorization: `Bearer ${token}`, 'x-forwarded-for': '203.0.113.7', 'x-forwarded-proto': 'https' },
              body: '{}',
            }),
            { clientAddress: none as never },
          )
        // The allowlist holds 203.0.113.0/24: the header's say-so must not let the token in.
        const limited = await ask(fixture.tokens.ipLimited)
        expect(limited.status, `${String(trustProxy)} ${JSON.stringify(none)}`).toBe(403)
        expect(((await limited.json()) as { error: { data: { error: string } } }).error.data.error).toBe('ip_not_allowed')
        const served = await ask(fixture.tokens.alice)
        expect(served.status).toBe(200)
        expect(await served.json()).toEqual({ baseUrl: `http://${HOST}` })
      }
      expect(fixture.errors).toEqual([])
    }
  })

  it('as undefined does: an OAuth validator is given a context without clientAddress, where a peer address is passed on', async () => {
    const fixture = createFixture()
    const contexts: object[] = []
    const handle = mcpDispatch({
      dispatcher: {
        ...fixture.dispatcherOptions,
        oauth: {
          validate: async (_token: string, context?: object) => {
            contexts.push(context!)
            return { active: false as const, reason: 'refused' }
          },
        },
      },
      handler: () => Response.json({ ok: true }),
    })
    for (const clientAddress of [undefined, null, '', '203.0.113.9']) {
      const res = await handle(new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: 'Bearer an-oauth-access-token' }, body: '{}' }), { clientAddress })
      expect(res.status).toBe(401)
    }
    const resource = { resource: `http://${HOST}`, appId: 'app_weather' }
    expect(contexts).toEqual([resource, resource, resource, { ...resource, clientAddress: '203.0.113.9' }])
    for (const context of contexts.slice(0, 3)) expect(Object.keys(context)).not.toContain('clientAddress')
  })
})

describe('whenBodyEnds', () => {
  const encoder = new TextEncoder()
  const streamOf = (chunks: string[], fail?: Error) =>
    new ReadableStream<Uint8Array>({
      start(controller) {
        for (const chunk of chunks) controller.enqueue(encoder.encode(chunk))
        if (fail) controller.error(fail)
        else controller.close()
      },
    })

  it('calls back once the body is read to the end, and passes status, reason phrase, headers and bytes through', async () => {
    let ended = 0
    const response = whenBodyEnds(new Response(streamOf(['a', 'b']), { status: 201, statusText: 'Made', headers: { 'x-kept': 'yes' } }), () => ended++)
    expect(ended).toBe(0)
    expect(response.status).toBe(201)
    expect(response.statusText).toBe('Made')
    expect(response.headers.get('x-kept')).toBe('yes')
    expect(await response.text()).toBe('ab')
    expect(ended).toBe(1)
  })

  it('calls back once when the reader cancels, or the source fails; at once without a body', async () => {
    let cancelledSource = false
    const source = new ReadableStream<Uint8Array>({
      pull: (controller) => controller.enqueue(encoder.encode('tick')),
      cancel: () => void (cancelledSource = true),
    })
    let ended = 0
    const open = whenBodyEnds(new Response(source), () => ended++)
    const reader = open.body!.getReader()
    await reader.read()
    await reader.cancel('client gone')
    expect(cancelledSource).toBe(true)
    expect(ended).toBe(1)

    let failed = 0
    await expect(whenBodyEnds(new Response(streamOf(['x'], new Error('upstream broke'))), () => failed++).text()).rejects.toThrow('upstream broke')
    expect(failed).toBe(1)

    let empty = 0
    whenBodyEnds(new Response(null, { status: 204 }), () => empty++)
    expect(empty).toBe(1)
  })
})

describe('web adapter: an App routed for POST only (a Hono app as the handler)', () => {
  it('the client\'s GET stream gets the router\'s text 404, which leaves the session\'s pin alone, and the SDK client goes on (regression: the pin was deleted, and every later request was 404 session_not_found)', async () => {
    const fixture = createFixture()
    const sessions = createWebMcpHandler(() => buildScenarioServer('weather', '1.0.0'))
    const app = new Hono()
    app.post('*', (c) => sessions.handle(c.req.raw))
    const served = await serveFetch(mcpDispatch({ dispatcher: fixture.dispatcher, handler: (request) => app.fetch(request) }))
    try {
      await expectSessionGoesOn(`http://${HOST}:${served.port}/v1`, { fetch: loopbackFetch, headers: { authorization: `Bearer ${fixture.tokens.alice}` } }, 404, /^text\/plain/)
    } finally {
      await sessions.close()
      await served.close()
    }
  })
})

describe('web adapter without info.outgoing: a new session whose pin cannot be stored', () => {
  it('answers the store\'s 503 in place of the handler\'s event stream, and cancels that stream\'s body, which no client will read', async () => {
    const fixture = createFixture({
      sessions: { get: () => Promise.resolve(undefined), set: () => Promise.reject(new Error('pin store down')), delete: () => Promise.resolve() },
    })
    let cancelled = false
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      onError: () => {},
      handler: () =>
        new Response(new ReadableStream({ pull: (controller) => controller.enqueue(new TextEncoder().encode('data: {}\n\n')), cancel: () => void (cancelled = true) }), {
          headers: { 'content-type': 'text/event-stream', 'mcp-session-id': 'never-pinned' },
        }),
    })
    const res = await handle(new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' }))
    expect(res.status).toBe(503)
    expect(res.headers.get('mcp-session-id')).toBeNull()
    expect(((await res.json()) as { error: { data: { error: string } } }).error.data.error).toBe('temporarily_unavailable')
    expect(cancelled).toBe(true)
  })
})

describe('web adapter without info.outgoing (Workers, Deno, Bun): a 404 of the handler to a session', () => {
  it('a text 404 to a session\'s GET leaves the pin alone, and the session\'s next POST reaches the handler; a JSON 404 ends the pin (404 session_not_found)', async () => {
    const fixture = createFixture()
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: (request) => {
        if (request.method === 'GET') return new Response('404 Not Found', { status: 404, headers: { 'content-type': 'text/plain; charset=UTF-8' } })
        if (request.headers.get('x-forget') !== null) return Response.json({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } }, { status: 404 })
        return Response.json({ ok: true }, { headers: { 'mcp-session-id': 's-1' } })
      },
    })
    const ask = (method: string, path: string, headers: Record<string, string> = {}) =>
      handle(new Request(`http://${HOST}${path}`, { method, headers: { authorization: `Bearer ${fixture.tokens.alice}`, ...headers }, ...(method === 'POST' && { body: '{}' }) }))
    expect((await ask('POST', '/v1')).headers.get('mcp-session-id')).toBe('s-1')
    const stream = await ask('GET', '/', { 'mcp-session-id': 's-1', accept: 'text/event-stream' })
    expect(stream.status).toBe(404)
    expect(await stream.text()).toBe('404 Not Found')
    const next = await ask('POST', '/', { 'mcp-session-id': 's-1' })
    expect(next.status).toBe(200)
    expect(await next.json()).toEqual({ ok: true })
    expect((await ask('POST', '/', { 'mcp-session-id': 's-1', 'x-forget': '1' })).status).toBe(404)
    const gone = await ask('POST', '/', { 'mcp-session-id': 's-1' })
    expect(gone.status).toBe(404)
    expect(((await gone.json()) as { error: { data: { error: string } } }).error.data.error).toBe('session_not_found')
  })
})
