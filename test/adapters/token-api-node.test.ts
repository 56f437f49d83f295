/**
 * The token API served from Node frameworks (`serveTokenApi` of `mcp-dispatch/express`, on
 * Express 5 and 4, and `mcp-dispatch/fastify`), beside the MCP dispatch layer, over loopback HTTP: a dashboard
 * session creates and lists tokens, a token rotates itself under its IP allowlist with the
 * socket address, other paths reach the MCP layer; and a request with two `Authorization`
 * fields is refused by every adapter, never served with the first. `authenticateSession` reads
 * the session a middleware left on the framework's request (express-session itself on Express;
 * a hook of its shape on Fastify), and `verifyCsrf` gets that session.
 */
import * as http from 'node:http'
import { type AddressInfo, connect } from 'node:net'
import { gzipSync } from 'node:zlib'
import express from 'express'
import session from 'express-session'
import fc from 'fast-check'
import Fastify from 'fastify'
import { ConfigurationError, type TokenApi, type TokenService, createTokenApi, hashesEqual } from 'mcp-dispatch'
import * as expressAdapter from 'mcp-dispatch/express'
import * as fastifyAdapter from 'mcp-dispatch/fastify'
import { mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { afterAll, describe, expect, it, vi } from 'vitest'
import { askH2, close, createFixture, listen, rawRequest } from './helpers.js'
import { EXPRESS, EXPRESS_KINDS, type ExpressModule } from '../helpers/express.js'
import { serveFetch } from '../helpers/platform.js'

const COOKIE = 'dash=alice-session'
const CSRF = 'csrf-123'

function tokenApi(tokens: TokenService): TokenApi {
  return createTokenApi({
    tokens,
    authenticateSession: (request) => (request.headers.get('cookie') === COOKIE ? { userId: 'alice' } : null),
    verifyCsrf: (request) => request.headers.get('x-csrf-token') === CSRF,
  })
}

type Start = (api: TokenApi, fixture: ReturnType<typeof createFixture>) => Promise<{ port: number; close(): Promise<void> }>

/** Express (5 or 4) with the token API, then the dispatch layer; `json`: with express.json() in front. */
function expressTarget(express: ExpressModule, json: boolean): Start {
  return async (api, fixture) => {
    const app = express()
    if (json) app.use(express.json())
    app.use(expressAdapter.serveTokenApi(api))
    app.use(expressAdapter.mcpDispatch({ dispatcher: fixture.dispatcher }))
    app.use((_req, res) => res.json({ served: true }))
    const server = http.createServer(app)
    const port = await listen(server)
    return { port, close: () => close(server) }
  }
}

const targets: Record<string, Start> = {
  express: expressTarget(EXPRESS.express, false),
  'express after express.json()': expressTarget(EXPRESS.express, true),
  express4: expressTarget(EXPRESS.express4, false),
  'express4 after express.json()': expressTarget(EXPRESS.express4, true),
  async fastify(api, fixture) {
    const app = Fastify()
    await app.register(fastifyAdapter.serveTokenApi(api))
    await app.register(fastifyAdapter.mcpDispatch({ dispatcher: fixture.dispatcher }))
    app.all('/*', async () => ({ served: true }))
    await app.listen({ port: 0, host: '127.0.0.1' })
    return { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
  },
}

for (const [name, start] of Object.entries(targets)) {
  describe(`serveTokenApi: ${name}`, () => {
    it('create and list with a dashboard session; a token rotates itself under its allowlist (socket address); other paths reach the MCP layer', async () => {
      const fixture = createFixture()
      const tokens = fixture.dispatcherOptions.tokens as TokenService
      const server = await start(tokenApi(tokens), fixture)
      try {
        const session = { cookie: COOKIE, 'x-csrf-token': CSRF, 'content-type': 'application/json' }
        const created = await rawRequest(server.port, {
          path: '/api/tokens',
          headers: session,
          body: JSON.stringify({ name: 'CI', servers: ['app_weather'], expires_in_days: 7, allowed_ips: ['127.0.0.1'] }),
        })
        expect(created.status).toBe(201)
        const secret = JSON.parse(created.body)
        expect(secret.token).toMatch(/^svc_/)
        const listed = await rawRequest(server.port, { method: 'GET', path: '/api/tokens?x=1', headers: { cookie: COOKIE } })
        expect(JSON.parse(listed.body).tokens.map((t: { id: string }) => t.id)).toContain(secret.id)
        // A write without the CSRF header is refused; without a session, 401.
        expect((await rawRequest(server.port, { method: 'DELETE', path: `/api/tokens/${secret.id}`, headers: { cookie: COOKIE } })).status).toBe(403)
        expect((await rawRequest(server.port, { method: 'GET', path: '/api/tokens' })).status).toBe(401)
        // Bearer rotation: the socket is 127.0.0.1, inside the allowlist; X-Forwarded-For is not trusted.
        const rotated = await rawRequest(server.port, {
          path: `/api/tokens/${secret.id}/rotate`,
          headers: { authorization: `Bearer ${secret.token}`, 'x-forwarded-for': '203.0.113.9' },
        })
        expect(rotated.status).toBe(200)
        const fresh = JSON.parse(rotated.body).token as string
        // The new secret works on the MCP path; the old one does not; a path outside the API reaches it.
        const mcp = (bearer: string) =>
          rawRequest(server.port, { path: '/v1', headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json' }, body: '{}' })
        expect((await mcp(fresh)).status).toBe(200)
        expect((await mcp(secret.token)).status).toBe(401)
      } finally {
        await server.close()
      }
    })

    it('a body over 16 KiB, announced by Content-Length or chunked, is a 400 naming the body, and the server serves on (regression: on Node 20 it ended the process)', async () => {
      const fixture = createFixture()
      const server = await start(tokenApi(fixture.dispatcherOptions.tokens as TokenService), fixture)
      const session = { cookie: COOKIE, 'x-csrf-token': CSRF, 'content-type': 'application/json' }
      const create = (name: string) => JSON.stringify({ name, servers: ['app_weather'], expires_in_days: 7 })
      try {
        for (const size of [16_385, 20_000, 100_000]) {
          const refused = await rawRequest(server.port, { path: '/api/tokens', headers: session, body: create('x'.repeat(size)) })
          expect(refused.status, `${size} bytes`).toBe(400)
          expect(JSON.parse(refused.body)).toMatchObject({ error: 'invalid_request', field: 'body' })
        }
        const chunked = await new Promise<{ status: number; body: string }>((resolve, reject) => {
          const outgoing = http.request(
            { host: '127.0.0.1', port: server.port, method: 'POST', path: '/api/tokens', headers: session, agent: false },
            (incoming) => {
              let body = ''
              incoming.setEncoding('utf8')
              incoming.on('data', (chunk: string) => (body += chunk))
              incoming.on('end', () => resolve({ status: incoming.statusCode ?? 0, body }))
              incoming.on('error', reject)
            },
          )
          outgoing.on('error', reject)
          const body = create('y'.repeat(40_000))
          for (let at = 0; at < body.length; at += 4_096) outgoing.write(body.slice(at, at + 4_096))
          outgoing.end()
        })
        expect(chunked.status).toBe(400)
        expect(JSON.parse(chunked.body)).toMatchObject({ field: 'body' })
        // Still serving.
        const created = await rawRequest(server.port, { path: '/api/tokens', headers: session, body: create('after') })
        expect(created.status).toBe(201)
      } finally {
        await server.close()
      }
    })

    it('a gzip body is created from when a body parser in front decoded it (express.json()), else refused naming Content-Encoding', async () => {
      const fixture = createFixture()
      const server = await start(tokenApi(fixture.dispatcherOptions.tokens as TokenService), fixture)
      try {
        const body = new Uint8Array(gzipSync(JSON.stringify({ name: 'coded', servers: ['app_weather'], expires_in_days: 7 })))
        const headers = { cookie: COOKIE, 'x-csrf-token': CSRF, 'content-type': 'application/json', 'content-encoding': 'gzip' }
        const answer = await rawRequest(server.port, { path: '/api/tokens', headers, body })
        if (name.endsWith('express.json()')) {
          expect(answer.status).toBe(201)
          expect(JSON.parse(answer.body)).toMatchObject({ name: 'coded' })
        } else {
          expect(answer.status).toBe(400)
          expect(JSON.parse(answer.body)).toMatchObject({ error: 'invalid_request', field: 'content-encoding' })
        }
      } finally {
        await server.close()
      }
    })

    it('a body nested deeper than can be written back as JSON (read by express.json(), which has no depth limit) is 400 naming body, as without the parser, never blamed on the Host (regression)', async () => {
      const fixture = createFixture()
      const server = await start(tokenApi(fixture.dispatcherOptions.tokens as TokenService), fixture)
      try {
        const headers = { cookie: COOKIE, 'x-csrf-token': CSRF, 'content-type': 'application/json' }
        const body = `{"name":${'['.repeat(8000)}${']'.repeat(8000)},"servers":["app_weather"],"expires_in_days":7}`
        const answer = await rawRequest(server.port, { path: '/api/tokens', headers, body })
        expect(answer.status).toBe(400)
        expect(JSON.parse(answer.body)).toMatchObject({ error: 'invalid_request', field: name.endsWith('express.json()') ? 'body' : 'name' })
      } finally {
        await server.close()
      }
    })

    it('answers as the Web adapter does: whole, with Content-Length (never chunked), no X-Powered-By; a method fetch forbids (TRACE) is the path\'s 405 with Allow, not a Host error', async () => {
      const fixture = createFixture()
      const server = await start(tokenApi(fixture.dispatcherOptions.tokens as TokenService), fixture)
      try {
        for (const [method, path] of [['GET', '/api/tokens'], ['GET', '/api/tokens/tok_missing'], ['PUT', '/api/tokens']]) {
          const answer = await rawRequest(server.port, { method, path, headers: { cookie: COOKIE } })
          expect(answer.headers['content-length'], `${method} ${path}`).toBe(String(Buffer.byteLength(answer.body)))
          expect(answer.headers['transfer-encoding'], `${method} ${path}`).toBeUndefined()
          expect(answer.headers['x-powered-by'], `${method} ${path}`).toBeUndefined()
        }
        for (const method of ['TRACE']) {
          const collection = await rawRequest(server.port, { method, path: '/api/tokens' })
          expect([collection.status, collection.headers.allow, JSON.parse(collection.body)], method).toEqual([405, 'GET, HEAD, POST', { error: 'method_not_allowed', message: 'Use GET, HEAD or POST' }])
          expect(collection.headers['cache-control']).toBe('no-store')
          // With a Bearer token too (the API would answer it 403 before the method).
          const item = await rawRequest(server.port, { method, path: '/api/tokens/tok-1', headers: { authorization: 'Bearer svc_x' } })
          expect([item.status, item.headers.allow], method).toEqual([405, 'GET, HEAD, PATCH, DELETE'])
          const rotation = await rawRequest(server.port, { method, path: '/api/tokens/tok-1/rotate/' })
          expect([rotation.status, rotation.headers.allow], method).toEqual([405, 'POST'])
          // The 404s of the paths the API names nothing at, with their messages, and a bad Host's 400, as for any method.
          const nothing = await rawRequest(server.port, { method, path: '/api/tokens/a/b/c' })
          expect([nothing.status, JSON.parse(nothing.body)], method).toEqual([404, { error: 'not_found', message: 'Not found' }])
          const noToken = await rawRequest(server.port, { method, path: '/api/tokens/a:b' })
          expect([noToken.status, JSON.parse(noToken.body)], method).toEqual([404, { error: 'not_found', message: 'Token not found' }])
          const badHost = await rawRequest(server.port, { method, path: '/api/tokens', host: 'a b' })
          expect([badHost.status, JSON.parse(badHost.body).field], method).toEqual([400, 'host'])
        }
      } finally {
        await server.close()
      }
    })
  })
}

/** The dashboard session of these tests: the user, and the CSRF token the session holds. */
interface DashboardSession {
  readonly userId: string
  readonly csrfToken: string
}

describe('serveTokenApi: the framework request reaches authenticateSession, and its session verifyCsrf', () => {
  // Typed: verifyCsrf gets the DashboardSession authenticateSession answered, not just { userId }.
  const api = (tokens: TokenService, seen: unknown[]) =>
    createTokenApi<DashboardSession>({
      tokens,
      authenticateSession: (_request, info) => {
        seen.push(info.frameworkRequest)
        const session = (info.frameworkRequest as { session?: Partial<DashboardSession> | null } | undefined)?.session
        return session?.userId && session.csrfToken ? { userId: session.userId, csrfToken: session.csrfToken } : null
      },
      verifyCsrf: (request, session) => hashesEqual(request.headers.get('x-csrf-token') ?? '', session.csrfToken),
    })
  type Served = { port: number; close(): Promise<void>; signIn(): Promise<string> }
  const starts: Record<string, (tokens: TokenService, seen: unknown[]) => Promise<Served>> = {
    ...Object.fromEntries(
      EXPRESS_KINDS.map((kind) => [
        kind,
        async (tokens: TokenService, seen: unknown[]): Promise<Served> => {
          const app = EXPRESS[kind]()
          // express-session itself, in front of the API, as docs/api-tokens.md shows it.
          app.use(session({ secret: 'test-secret', resave: false, saveUninitialized: false }))
          app.post('/login', (req, res) => {
            Object.assign(req.session, { userId: 'alice', csrfToken: 'csrf-of-alice' })
            res.end()
          })
          app.use(expressAdapter.serveTokenApi(api(tokens, seen)))
          const server = http.createServer(app)
          const port = await listen(server)
          const signIn = async () => (await rawRequest(port, { path: '/login' })).headers['set-cookie']!.split(';')[0]!
          return { port, close: () => close(server), signIn }
        },
      ]),
    ),
    async fastify(tokens, seen) {
      const sessions = new Map<string, DashboardSession>()
      const app = Fastify()
      // As @fastify/session is: an onRequest hook, registered first, that leaves request.session.
      app.decorateRequest('session', null)
      app.addHook('onRequest', async (request) => {
        const sid = /(?:^|;\s*)sid=([^;]+)/.exec(request.headers.cookie ?? '')?.[1]
        ;(request as unknown as { session?: DashboardSession }).session = sid === undefined ? undefined : sessions.get(sid)
      })
      app.post('/login', async (_request, reply) => {
        sessions.set('sid-alice', { userId: 'alice', csrfToken: 'csrf-of-alice' })
        return reply.header('set-cookie', 'sid=sid-alice; HttpOnly').send()
      })
      await app.register(fastifyAdapter.serveTokenApi(api(tokens, seen)))
      await app.listen({ port: 0, host: '127.0.0.1' })
      const port = (app.server.address() as AddressInfo).port
      const signIn = async () => (await rawRequest(port, { path: '/login' })).headers['set-cookie']!.split(';')[0]!
      return { port, close: () => app.close(), signIn }
    },
  }
  for (const [name, start] of Object.entries(starts)) {
    it(name, async () => {
      const fixture = createFixture()
      const seen: unknown[] = []
      const server = await start(fixture.dispatcherOptions.tokens as TokenService, seen)
      try {
        const cookie = `theme=dark; ${await server.signIn()}`
        const body = JSON.stringify({ name: 'CI', servers: ['app_weather'], expires_in_days: 7 })
        const created = await rawRequest(server.port, {
          path: '/api/tokens',
          headers: { cookie, 'x-csrf-token': 'csrf-of-alice', 'content-type': 'application/json' },
          body,
        })
        expect(created.status).toBe(201)
        // The session's own CSRF token, not another's; no session, 401.
        const forged = await rawRequest(server.port, { path: '/api/tokens', headers: { cookie, 'x-csrf-token': 'csrf-123', 'content-type': 'application/json' }, body })
        expect(forged.status).toBe(403)
        expect((await rawRequest(server.port, { method: 'GET', path: '/api/tokens', headers: { cookie: 'theme=dark' } })).status).toBe(401)
        const listed = await rawRequest(server.port, { method: 'GET', path: '/api/tokens', headers: { cookie } })
        expect(JSON.parse(listed.body).tokens.map((t: { id: string }) => t.id)).toContain(JSON.parse(created.body).id)
        // The framework's own request: Express's req, Fastify's request (not the raw one).
        expect(seen).toHaveLength(4)
        for (const request of seen) {
          if (name === 'fastify') expect(request).toHaveProperty('raw')
          else expect(request).toBeInstanceOf(http.IncomingMessage)
        }
      } finally {
        await server.close()
      }
    })
  }
  it('called with a Request alone, authenticateSession gets an info without frameworkRequest', async () => {
    const fixture = createFixture()
    const seen: unknown[] = []
    const answer = await api(fixture.dispatcherOptions.tokens as TokenService, seen)(new Request('http://dash.example/api/tokens'))
    expect(answer?.status).toBe(401)
    expect(seen).toEqual([undefined])
  })
})

describe('serveTokenApi on Fastify: the platform\'s hooks', () => {
  it('keeps the headers an earlier onRequest hook set on the reply (@fastify/cors\'s), as the MCP routes do', async () => {
    const fixture = createFixture()
    const app = Fastify()
    // What @fastify/cors does for a request with an Origin it allows, in its onRequest hook.
    app.addHook('onRequest', async (request, reply) => {
      if (request.headers.origin === 'https://dash.example') {
        reply.header('access-control-allow-origin', 'https://dash.example')
        reply.header('access-control-allow-credentials', 'true')
        reply.header('vary', 'Origin')
      }
      reply.header('x-frame-options', 'DENY')
    })
    await app.register(fastifyAdapter.serveTokenApi(tokenApi(fixture.dispatcherOptions.tokens as TokenService)))
    await app.listen({ port: 0, host: '127.0.0.1' })
    try {
      const port = (app.server.address() as AddressInfo).port
      const listed = await rawRequest(port, { method: 'GET', path: '/api/tokens', headers: { cookie: COOKIE, origin: 'https://dash.example' } })
      expect(listed.status).toBe(200)
      expect(listed.headers).toMatchObject({
        'access-control-allow-origin': 'https://dash.example',
        'access-control-allow-credentials': 'true',
        'x-frame-options': 'DENY',
        'cache-control': 'no-store',
        'content-type': 'application/json',
      })
      expect(listed.headers.vary).toMatch(/origin/i)
    } finally {
      await app.close()
    }
  })

  it('a header an earlier hook set that Node refuses is left out and said on stderr; the API still answers (regression: no answer at all, for good)', async () => {
    const fixture = createFixture()
    const app = Fastify()
    app.addHook('onRequest', async (_request, reply) => {
      reply.header('x-display-name', 'Zoë €')
      reply.header('x-frame-options', 'DENY')
    })
    await app.register(fastifyAdapter.serveTokenApi(tokenApi(fixture.dispatcherOptions.tokens as TokenService)))
    await app.listen({ port: 0, host: '127.0.0.1' })
    const said = vi.spyOn(console, 'error').mockImplementation(() => {})
    try {
      const port = (app.server.address() as AddressInfo).port
      const listed = await rawRequest(port, { method: 'GET', path: '/api/tokens', headers: { cookie: COOKIE } })
      expect([listed.status, Array.isArray(JSON.parse(listed.body).tokens)]).toEqual([200, true])
      expect(listed.headers['x-frame-options']).toBe('DENY')
      expect(listed.headers['x-display-name']).toBeUndefined()
      expect(said.mock.calls.map((c) => String(c[0])).join('\n')).toMatch(/"x-display-name"/)
    } finally {
      said.mockRestore()
      await app.close()
    }
  })

  it("a header Node refuses goes to the API's onError when it has one, not to stderr (regression: always stderr)", async () => {
    const fixture = createFixture()
    const reported: string[] = []
    const api = createTokenApi({
      tokens: fixture.dispatcherOptions.tokens as TokenService,
      authenticateSession: (request) => (request.headers.get('cookie') === COOKIE ? { userId: 'alice' } : null),
      verifyCsrf: (request) => request.headers.get('x-csrf-token') === CSRF,
      onError: (_error, context) => reported.push(context),
    })
    const app = Fastify()
    app.addHook('onRequest', async (_request, reply) => {
      reply.header('x-display-name', 'Zoë €')
    })
    await app.register(fastifyAdapter.serveTokenApi(api))
    await app.listen({ port: 0, host: '127.0.0.1' })
    const said = vi.spyOn(console, 'error').mockImplementation(() => {})
    try {
      const port = (app.server.address() as AddressInfo).port
      const listed = await rawRequest(port, { method: 'GET', path: '/api/tokens', headers: { cookie: COOKIE } })
      expect(listed.status).toBe(200)
      expect(reported).toEqual([expect.stringContaining('"x-display-name"')])
      expect(said).not.toHaveBeenCalled()
    } finally {
      said.mockRestore()
      await app.close()
    }
  })

  it('refuses a prefix it would not apply (its hook matches the full path), naming the basePath to give', async () => {
    const fixture = createFixture()
    const app = Fastify()
    await expect(app.register(fastifyAdapter.serveTokenApi(tokenApi(fixture.dispatcherOptions.tokens as TokenService)), { prefix: '/dash' })).rejects.toThrow(
      expect.objectContaining({ name: 'ConfigurationError', message: expect.stringContaining('basePath: "/dash/api/tokens"') }),
    )
    await app.close()
    // A prefix without its leading slash: the basePath named is one createTokenApi takes.
    const bare = Fastify()
    await expect(bare.register(fastifyAdapter.serveTokenApi(tokenApi(fixture.dispatcherOptions.tokens as TokenService)), { prefix: 'dash' })).rejects.toThrow(
      expect.objectContaining({ message: expect.stringContaining('basePath: "/dash/api/tokens"') }),
    )
    await bare.close()
    // Inside a context of the platform's with that prefix and routes of its own, with the
    // basePath under it, the API answers (the hook runs for that context's routes).
    const nested = Fastify()
    const dashApi = createTokenApi({
      tokens: fixture.dispatcherOptions.tokens as TokenService,
      authenticateSession: (request) => (request.headers.get('cookie') === COOKIE ? { userId: 'alice' } : null),
      verifyCsrf: false,
      basePath: '/dash/api/tokens',
    })
    await nested.register(async (child) => {
      await child.register(fastifyAdapter.serveTokenApi(dashApi))
      child.all('/*', async () => ({ served: true }))
    }, { prefix: '/dash' })
    await nested.listen({ port: 0, host: '127.0.0.1' })
    try {
      const listed = await rawRequest((nested.server.address() as AddressInfo).port, { method: 'GET', path: '/dash/api/tokens', headers: { cookie: COOKIE } })
      expect([listed.status, Array.isArray(JSON.parse(listed.body).tokens)]).toEqual([200, true])
    } finally {
      await nested.close()
    }
    // '' and '/' (what fastify-autoload passes along) change nothing.
    const plain = Fastify()
    await plain.register(fastifyAdapter.serveTokenApi(tokenApi(fixture.dispatcherOptions.tokens as TokenService)), { prefix: '/' })
    await plain.close()
  })
})

describe('serveTokenApi: what is not the API\'s', () => {
  it('a path that only looks under basePath (dot segments) goes on with its body untouched; a bad Host under it is a 400', async () => {
    const fixture = createFixture()
    const api = tokenApi(fixture.dispatcherOptions.tokens as TokenService)
    const app = express()
    app.use(expressAdapter.serveTokenApi(api))
    app.use(express.text({ type: '*/*', limit: '1mb' }))
    app.use((req, res) => res.json({ path: req.path, length: String(req.body).length }))
    const server = http.createServer(app)
    const port = await listen(server)
    const fastifyApp = Fastify()
    await fastifyApp.register(fastifyAdapter.serveTokenApi(api))
    fastifyApp.all('/*', async (request) => ({ path: request.url }))
    await fastifyApp.listen({ port: 0, host: '127.0.0.1' })
    try {
      const big = 'x'.repeat(90_000)
      const moved = await rawRequest(port, { path: '/api/tokens/../x', headers: { 'content-type': 'text/plain' }, body: big })
      expect(JSON.parse(moved.body)).toEqual({ path: '/api/tokens/../x', length: 90_000 })
      // A path the API would read with its first segment as a host's (`//x/…` appended to an
      // origin): `//api/tokens`, not the API's.
      const authority = await rawRequest(port, { path: '//x/../api/tokens', headers: { 'content-type': 'text/plain' }, body: big })
      expect(JSON.parse(authority.body)).toMatchObject({ length: 90_000 })
      const fastifyPort = (fastifyApp.server.address() as AddressInfo).port
      for (const path of ['/api/tokens/../x', '/api/tokens/%2e%2e/x', '/api/tokens/..']) {
        const answer = await rawRequest(fastifyPort, { method: 'GET', path })
        expect(answer.status).toBe(200)
        expect(JSON.parse(answer.body).path).toBe(path) // the route's answer, not an empty one
      }
      // And a target the API reads as its own, with dot segments or in absolute form, is the
      // API's (regression: the raw target alone decided, and it went on to the next handler).
      for (const target of [port, fastifyPort]) {
        for (const path of ['/api/x/../tokens', '/api/%2E/tokens', '/api\\tokens', `http://weather.localhost:${target}/api/tokens`]) {
          const answer = await rawRequest(target, { method: 'GET', path })
          expect([answer.status, JSON.parse(answer.body)], `${path} on ${target}`).toEqual([401, expect.objectContaining({ error: 'unauthorized' })])
        }
      }
      for (const target of [port, fastifyPort]) {
        const badHost = await rawRequest(target, { method: 'GET', path: '/api/tokens', host: 'a b' })
        expect(badHost.status).toBe(400)
        expect(JSON.parse(badHost.body)).toMatchObject({ error: 'invalid_request', field: 'host' })
      }
    } finally {
      await close(server)
      await fastifyApp.close()
    }
  })
})

describe('serveTokenApi: paths that only begin like basePath', () => {
  it('a path that only starts with the basePath\'s letters (/api/tokens-old, /api/tokensx) is not the API\'s: it goes on to the next handler on Express and Fastify', async () => {
    const fixture = createFixture()
    const served = await servedOnBoth(tokenApi(fixture.dispatcherOptions.tokens as TokenService), { fallback: true })
    try {
      for (const target of served.ports) {
        for (const path of ['/api/tokens-old', '/api/tokensx', '/api/tokens.json']) {
          const answer = await rawRequest(target, { method: 'GET', path, headers: { cookie: COOKIE } })
          expect([answer.status, JSON.parse(answer.body)], `${path} on ${target}`).toEqual([200, { path }])
        }
      }
    } finally {
      await served.close()
    }
  })
})

/**
 * `api` served by `serveTokenApi` on Express and on Fastify, each on a port of its own (`ports`);
 * with `fallback`, a request that is not the API's goes on to a route answering its `{ path }`.
 */
async function servedOnBoth(api: TokenApi, { fallback = false } = {}): Promise<{ ports: number[]; close(): Promise<void> }> {
  const app = express()
  app.use(expressAdapter.serveTokenApi(api))
  if (fallback) app.use((req, res) => res.json({ path: req.path }))
  const server = http.createServer(app)
  const port = await listen(server)
  const fastifyApp = Fastify()
  try {
    await fastifyApp.register(fastifyAdapter.serveTokenApi(api))
    if (fallback) fastifyApp.all('/*', async (request) => ({ path: request.url }))
    await fastifyApp.listen({ port: 0, host: '127.0.0.1' })
  } catch (error) {
    await Promise.all([close(server), fastifyApp.close()])
    throw error
  }
  return {
    ports: [port, (fastifyApp.server.address() as AddressInfo).port],
    close: async () => {
      await close(server)
      await fastifyApp.close()
    },
  }
}

/** An API answering on dash.example.com only, the session the one COOKIE opens. */
function dashboardApi(): TokenApi {
  return createTokenApi({
    tokens: createFixture().dispatcherOptions.tokens as TokenService,
    authenticateSession: (request) => (request.headers.get('cookie') === COOKIE ? { userId: 'alice' } : null),
    verifyCsrf: false,
    hosts: ['dash.example.com'],
  })
}

describe('serveTokenApi: an absolute-form target', () => {
  it('is the API\'s on the host the target names, whatever the Host field says (RFC 9112 section 3.2.2): the API\'s hosts read that host', async () => {
    const api = dashboardApi()
    const app = express()
    app.use(expressAdapter.serveTokenApi(api))
    app.use((_req, res) => res.status(418).json({ served: 'elsewhere' }))
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      const named = await rawRequest(port, { method: 'GET', path: 'http://dash.example.com/api/tokens', host: 'other.example.com', headers: { cookie: COOKIE } })
      expect([named.status, Array.isArray(JSON.parse(named.body).tokens)]).toEqual([200, true])
      // And the other way round: a target naming another host is not the API's, whatever the Host says.
      const other = await rawRequest(port, { method: 'GET', path: 'http://other.example.com/api/tokens', host: 'dash.example.com', headers: { cookie: COOKIE } })
      expect(other.status).toBe(404)
    } finally {
      await close(server)
    }
  })
})

describe('serveTokenApi: an API that fails under the answer', () => {
  it('an API that throws is answered 503 temporarily_unavailable with Retry-After: 1 and Cache-Control: no-store, as the API answers its own failures, and the server serves on', async () => {
    const fixture = createFixture()
    const inner = tokenApi(fixture.dispatcherOptions.tokens as TokenService)
    let fail = true
    const flaky: TokenApi = Object.assign(
      async (request: Request, info?: Parameters<TokenApi>[1]) => {
        if (fail) throw new Error('store down')
        return inner(request, info)
      },
      { basePath: inner.basePath },
    )
    const served = await servedOnBoth(flaky)
    try {
      for (const target of served.ports) {
        fail = true
        const failed = await rawRequest(target, { method: 'GET', path: '/api/tokens', headers: { cookie: COOKIE } })
        expect([failed.status, failed.headers['retry-after'], failed.headers['cache-control'], JSON.parse(failed.body)], `on ${target}`).toEqual([
          503,
          '1',
          'no-store',
          { error: 'temporarily_unavailable', message: 'Service unavailable' },
        ])
        fail = false
        expect((await rawRequest(target, { method: 'GET', path: '/api/tokens', headers: { cookie: COOKIE } })).status, `on ${target}`).toBe(200)
      }
    } finally {
      await served.close()
    }
  })
})

describe('serveTokenApi: Expect: 100-continue', () => {
  it('invites the body at once where the server hands checkContinue to the app (the API reads every body it is sent): the client is never left waiting', async () => {
    const fixture = createFixture()
    const app = express()
    app.use(expressAdapter.serveTokenApi(tokenApi(fixture.dispatcherOptions.tokens as TokenService)))
    const server = http.createServer(app)
    server.on('checkContinue', (req, res) => server.emit('request', req, res))
    const port = await listen(server)
    const body = JSON.stringify({ name: 'CI', servers: ['app_weather'], expires_in_days: 7 })
    const socket = connect(port, '127.0.0.1')
    try {
      let received = ''
      const seen = (text: string) =>
        new Promise<boolean>((resolve) => {
          const timer = setTimeout(() => resolve(false), 5_000)
          const check = () => {
            if (!received.includes(text)) return
            clearTimeout(timer)
            socket.off('data', onData)
            resolve(true)
          }
          const onData = (chunk: Buffer) => {
            received += chunk.toString('latin1')
            check()
          }
          socket.on('data', onData)
          check()
        })
      socket.on('error', () => {})
      socket.write(
        `POST /api/tokens HTTP/1.1\r\nHost: weather.localhost\r\nCookie: ${COOKIE}\r\nX-CSRF-Token: ${CSRF}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nExpect: 100-continue\r\n\r\n`,
      )
      expect(await seen('HTTP/1.1 100 Continue\r\n\r\n'), received).toBe(true)
      socket.write(body)
      expect(await seen('HTTP/1.1 201 '), received).toBe(true)
    } finally {
      socket.destroy()
      await close(server)
    }
  })
})

describe('serveTokenApi over HTTP/2 (Fastify)', () => {
  it('refuses a Host beside :authority that names another host, 400 naming host (RFC 9113 section 8.3.1: malformed), as mcpDispatch does; the API is never asked for the :authority host', async () => {
    const fixture = createFixture()
    const app = Fastify({ http2: true })
    await app.register(fastifyAdapter.serveTokenApi(tokenApi(fixture.dispatcherOptions.tokens as TokenService)))
    await app.listen({ port: 0, host: '127.0.0.1' })
    try {
      const port = (app.server.address() as AddressInfo).port
      const ask = (host?: string) =>
        askH2(port, { ':method': 'GET', ':path': '/api/tokens', ':authority': 'weather.localhost', cookie: COOKIE, ...(host === undefined ? {} : { host }) })
      const conflicting = await ask('other.localhost')
      expect([conflicting.status, JSON.parse(conflicting.body)]).toEqual([400, expect.objectContaining({ error: 'invalid_request', field: 'host' })])
      // The same host, spelt otherwise (case, default port), is no conflict.
      expect((await ask('WEATHER.localhost:80')).status).toBe(200)
      expect((await ask()).status).toBe(200)
    } finally {
      await app.close()
    }
  })
})

describe.each(EXPRESS_KINDS)('serveTokenApi on %s under a mount path', (kind) => {
  const express = EXPRESS[kind]
  it('answers under the mount when basePath includes it; with a basePath that does not, the request meant for it is a ConfigurationError, not an API never reached', async () => {
    const fixture = createFixture()
    const tokens = fixture.dispatcherOptions.tokens as TokenService
    const auth = {
      authenticateSession: (request: Request) => (request.headers.get('cookie') === COOKIE ? { userId: 'alice' } : null),
      verifyCsrf: () => true,
    }
    const errors: unknown[] = []
    const app = express()
    app.use('/dash', expressAdapter.serveTokenApi(createTokenApi({ tokens, ...auth, basePath: '/dash/api/tokens' })))
    app.use('/wrong', expressAdapter.serveTokenApi(createTokenApi({ tokens, ...auth })))
    app.use((_req, res) => res.status(404).json({ fell: 'through' }))
    app.use((error: unknown, _req: express.Request, res: express.Response, _next: express.NextFunction) => {
      errors.push(error)
      res.status(500).json({ configuration: true })
    })
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      const listed = await rawRequest(port, { method: 'GET', path: '/dash/api/tokens', headers: { cookie: COOKIE } })
      expect(listed.status).toBe(200)
      expect(JSON.parse(listed.body).tokens.length).toBeGreaterThan(0) // the fixture's tokens of alice
      const wrong = await rawRequest(port, { method: 'GET', path: '/wrong/api/tokens', headers: { cookie: COOKIE } })
      expect(wrong.status).toBe(500)
      expect(errors).toHaveLength(1)
      expect(errors[0]).toBeInstanceOf(ConfigurationError)
      expect((errors[0] as ConfigurationError).option).toBe('basePath')
      expect((errors[0] as Error).message).toContain('"/wrong/api/tokens"')
      // Other paths under either mount go on as before, whatever their case (Express routes
      // case-insensitively; the API's paths are case-sensitive): never a client-made 500.
      for (const path of ['/wrong/other', '/DASH/other', '/Dash/api/tokens', '/dash/API/tokens', '/dash/dash/api/tokens', '/DASH/dash/api/tokens']) {
        const other = await rawRequest(port, { method: 'GET', path, headers: { cookie: COOKIE } })
        expect(other.status, path).toBe(404)
        expect(JSON.parse(other.body), path).toEqual({ fell: 'through' })
      }
      expect(errors).toHaveLength(1)
    } finally {
      await close(server)
    }
  })
})

describe('serveTokenApi under random requests', () => {
  const ERRORS = new Set(['invalid_request', 'unauthorized', 'forbidden', 'csrf_failed', 'not_found', 'token_inactive', 'method_not_allowed'])
  for (const [name, start] of Object.entries(targets)) {
    it(`${name}: never a 5xx or a hang, every refusal a JSON error of the API, no secret outside creation`, async () => {
      const fixture = createFixture()
      const server = await start(tokenApi(fixture.dispatcherOptions.tokens as TokenService), fixture)
      try {
        await fc.assert(
          fc.asyncProperty(
            fc.constantFrom('GET', 'POST', 'PATCH', 'DELETE', 'PUT', 'OPTIONS'),
            fc.oneof(
              fc.constantFrom('/api/tokens', '/api/tokens/', '/api/tokens/x/rotate', '/api/tokens/%2e%2e', '/api/tokens//', '/api/tokens?q=1'),
              fc.webSegment().map((segment) => `/api/tokens/${segment}`),
            ),
            fc.constantFrom('none', 'session', 'session-csrf', 'bearer'),
            fc.oneof(fc.constant(undefined), fc.jsonValue({ maxDepth: 2 }).map((v) => JSON.stringify(v)), fc.string({ maxLength: 100 })),
            async (method, path, who, body) => {
              const headers: Record<string, string> = { 'content-type': 'application/json' }
              if (who.startsWith('session')) headers.cookie = COOKIE
              if (who === 'session-csrf') headers['x-csrf-token'] = CSRF
              if (who === 'bearer') headers.authorization = `Bearer ${fixture.tokens.alice}`
              const answer = await rawRequest(server.port, { method, path, headers, ...(body !== undefined && method !== 'GET' && { body }) })
              expect(answer.status).toBeLessThan(500)
              if (answer.status >= 400 && answer.headers['content-type']?.startsWith('application/json')) {
                const parsed = JSON.parse(answer.body)
                if (!('jsonrpc' in parsed)) expect(ERRORS).toContain(parsed.error)
              }
              const created = answer.status === 201
              if (!created) expect(answer.body).not.toMatch(/svc_[A-Za-z0-9]{44}/)
            },
          ),
          { numRuns: 120 },
        )
      } finally {
        await server.close()
      }
    })
  }
})

describe('serveTokenApi: a TRACE with the API wrapped', () => {
  it('is the 405 of the path, never handed to the wrapper as a preflight', async () => {
    const fixture = createFixture()
    const inner = tokenApi(fixture.dispatcherOptions.tokens as TokenService)
    // A platform's wrapper that answers CORS preflights itself.
    const wrapped: TokenApi = Object.assign(
      async (request: Request, info?: Parameters<TokenApi>[1]) =>
        request.method === 'OPTIONS' ? new Response(null, { status: 204, headers: { 'access-control-allow-origin': '*' } }) : inner(request, info),
      { basePath: inner.basePath },
    )
    const app = express()
    app.use(expressAdapter.serveTokenApi(wrapped))
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      const traced = await rawRequest(port, { method: 'TRACE', path: '/api/tokens' })
      expect([traced.status, traced.headers.allow, traced.headers['access-control-allow-origin']]).toEqual([405, 'GET, HEAD, POST', undefined])
    } finally {
      await close(server)
    }
  })
})

describe('serveTokenApi: a TRACE where the API is not', () => {
  it('on a host outside its hosts, or with a Host that moves the path, is the 404 any method gets there, never a 405 with Allow telling the API is there (regression: it was, with the Allow of another path for a moved one); over HTTP/1 on Express and Fastify, in absolute form, and over HTTP/2', async () => {
    const dashboard = await servedOnBoth(dashboardApi())
    const everywhere = await servedOnBoth(tokenApi(createFixture().dispatcherOptions.tokens as TokenService))
    const overHttp2 = Fastify({ http2: true })
    await overHttp2.register(fastifyAdapter.serveTokenApi(dashboardApi()))
    await overHttp2.listen({ port: 0, host: '127.0.0.1' })
    const seen = async (target: number, method: string, host: string, path = '/api/tokens') => {
      const answer = await rawRequest(target, { method, path, host, headers: { cookie: COOKIE } })
      return [answer.status, answer.headers.allow, JSON.parse(answer.body).error]
    }
    const notThere = [404, undefined, 'not_found']
    try {
      for (const target of dashboard.ports) {
        expect(await seen(target, 'GET', 'other.example.com'), `on ${target}`).toEqual(notThere)
        expect(await seen(target, 'TRACE', 'other.example.com'), `on ${target}`).toEqual(notThere)
        // On its host, the path's 405 as before.
        expect(await seen(target, 'TRACE', 'dash.example.com'), `on ${target}`).toEqual([405, 'GET, HEAD, POST', 'method_not_allowed'])
        // In absolute form, the target's host decides (RFC 9112 section 3.2.2).
        expect(await seen(target, 'TRACE', 'dash.example.com', 'http://other.example.com/api/tokens'), `on ${target}`).toEqual(notThere)
        expect(await seen(target, 'TRACE', 'other.example.com', 'http://dash.example.com/api/tokens/tok-1'), `on ${target}`).toEqual([405, 'GET, HEAD, PATCH, DELETE', 'method_not_allowed'])
      }
      // A Host that moves the path (`a/b`: the URL's path is /b/api/tokens), on an API of every host.
      for (const target of everywhere.ports) {
        expect(await seen(target, 'GET', 'a/b'), `on ${target}`).toEqual(notThere)
        expect(await seen(target, 'TRACE', 'a/b'), `on ${target}`).toEqual(notThere)
      }
      const port = (overHttp2.server.address() as AddressInfo).port
      const traced = async (authority: string) => {
        const answer = await askH2(port, { ':method': 'TRACE', ':path': '/api/tokens', ':authority': authority, cookie: COOKIE })
        return [answer.status, answer.headers.allow, JSON.parse(answer.body).error]
      }
      expect(await traced('other.example.com')).toEqual(notThere)
      expect(await traced('dash.example.com')).toEqual([405, 'GET, HEAD, POST', 'method_not_allowed'])
    } finally {
      await dashboard.close()
      await everywhere.close()
      await overHttp2.close()
    }
  })

  it('of a wrapper of the API, whose hosts the adapter cannot read, is the path\'s 405 on every host (as documented), and the 404 where a Host moves the path', async () => {
    const inner = dashboardApi()
    const wrapper: TokenApi = Object.assign(async (request: Request, info?: Parameters<TokenApi>[1]) => inner(request, info), { basePath: inner.basePath })
    const served = await servedOnBoth(wrapper)
    try {
      for (const target of served.ports) {
        for (const host of ['dash.example.com', 'other.example.com']) {
          const answer = await rawRequest(target, { method: 'TRACE', path: '/api/tokens', host })
          expect([answer.status, answer.headers.allow], `${host} on ${target}`).toEqual([405, 'GET, HEAD, POST'])
        }
        const moved = await rawRequest(target, { method: 'TRACE', path: '/api/tokens', host: 'a/b' })
        expect([moved.status, JSON.parse(moved.body).error], `on ${target}`).toEqual([404, 'not_found'])
      }
    } finally {
      await served.close()
    }
  })
})

describe('createTokenApi: hosts', () => {
  it('answers on the hosts named (any port, any case), by the Host header, else the URL; elsewhere it is not the API\'s', async () => {
    const fixture = createFixture()
    const api = createTokenApi({
      tokens: fixture.dispatcherOptions.tokens as TokenService,
      authenticateSession: (request) => (request.headers.get('cookie') === COOKIE ? { userId: 'alice' } : null),
      verifyCsrf: (request) => request.headers.get('x-csrf-token') === CSRF,
      hosts: ['dash.example.com'],
    })
    const get = (url: string, headers: Record<string, string> = {}) => api(new Request(url, { headers: { cookie: COOKIE, ...headers } }))
    expect((await get('http://localhost:3000/api/tokens', { host: 'DASH.example.com:8443' }))?.status).toBe(200)
    // next start: request.url names its own address, the Host the client's.
    expect(await get('http://dash.example.com/api/tokens', { host: 'weather.example.com' })).toBeNull()
    // No Host header (HTTP/2): the URL's.
    expect((await get('https://dash.example.com/api/tokens'))?.status).toBe(200)
    expect(await get('https://weather.example.com/api/tokens')).toBeNull()
    // A Host that is more than a host and a port is none; so is one the URL parser would rewrite
    // (mcpDispatch answers it 400 on every adapter). Before, it was the host it was rewritten to.
    expect(await get('http://localhost/api/tokens', { host: 'evil@dash.example.com' })).toBeNull()
    for (const host of ['dash%2Eexample.com', 'd%61sh.example.com', 'dash.example.com.']) expect(await get('http://localhost/api/tokens', { host }), host).toBeNull()
    const onLoopback = createTokenApi({ tokens: fixture.dispatcherOptions.tokens as TokenService, authenticateSession: () => ({ userId: 'alice' }), verifyCsrf: false, hosts: ['127.0.0.1'] })
    for (const host of ['0x7f.1', '2130706433', '127.1:8080']) expect(await onLoopback(new Request('http://x/api/tokens', { headers: { host } })), host).toBeNull()
    expect((await onLoopback(new Request('http://x/api/tokens', { headers: { host: '127.0.0.1:8080' } })))?.status).toBe(200)
    // An IPv6 address named bare, an IDN by its Unicode name: matched as the parser writes them.
    const named = createTokenApi({ tokens: fixture.dispatcherOptions.tokens as TokenService, authenticateSession: () => ({ userId: 'alice' }), verifyCsrf: false, hosts: ['::1', 'bücher.example'] })
    expect((await named(new Request('http://x/api/tokens', { headers: { host: '[0:0::1]:8080' } })))?.status).toBe(200)
    expect((await named(new Request('http://x/api/tokens', { headers: { host: 'xn--bcher-kva.example' } })))?.status).toBe(200)
    // Served by serveTokenApi: another host's request under basePath is the API's 404.
    const app = express()
    app.use(expressAdapter.serveTokenApi(api))
    const server = http.createServer(app)
    const port = await listen(server)
    try {
      const there = await rawRequest(port, { method: 'GET', path: '/api/tokens', host: 'dash.example.com', headers: { cookie: COOKIE } })
      expect(there.status).toBe(200)
      const elsewhere = await rawRequest(port, { method: 'GET', path: '/api/tokens', host: 'weather.example.com', headers: { cookie: COOKIE } })
      expect([elsewhere.status, JSON.parse(elsewhere.body).error]).toEqual([404, 'not_found'])
      // An absolute-form target's authority is the request's host, its Host field ignored (RFC 9112 3.2.2).
      const absolute = await rawRequest(port, { method: 'GET', path: 'http://weather.example.com/api/tokens', host: 'dash.example.com', headers: { cookie: COOKIE } })
      expect(absolute.status).toBe(404)
      const absoluteThere = await rawRequest(port, { method: 'GET', path: 'http://dash.example.com/api/tokens', host: 'weather.example.com', headers: { cookie: COOKIE } })
      expect(absoluteThere.status).toBe(200)
    } finally {
      await close(server)
    }
  })

  it('refuses what is not a list of host names', () => {
    const fixture = createFixture()
    const base = { tokens: fixture.dispatcherOptions.tokens as TokenService, authenticateSession: () => null, verifyCsrf: false as const }
    for (const [hosts, field] of [
      [[], 'hosts'],
      ['dash.example.com', 'hosts'],
      [['https://dash.example.com'], 'hosts.0'],
      [['ok.example', 'dash.example.com:443'], 'hosts.1'],
      [[''], 'hosts.0'],
      [['*.example.com'], 'hosts.0'],
      [['dash.example.com.'], 'hosts.0'],
      [['[::1]:443'], 'hosts.0'],
      [['user@dash.example.com'], 'hosts.0'],
    ] as const) {
      expect(() => createTokenApi({ ...base, hosts: hosts as never }), JSON.stringify(hosts)).toThrow(expect.objectContaining({ name: 'ConfigurationError', option: field }))
    }
  })
})

describe('serveTokenApi: options', () => {
  it('refuses what is not the token API, and a bad trustProxy, when created', () => {
    const api = tokenApi(createFixture().dispatcherOptions.tokens as TokenService)
    for (const adapter of [expressAdapter, fastifyAdapter]) {
      expect(() => adapter.serveTokenApi((async () => null) as never)).toThrow(ConfigurationError)
      expect(() => adapter.serveTokenApi(api, { trustProxy: ['not an address'] })).toThrow(ConfigurationError)
    }
  })
})

describe('two Authorization fields in one request', () => {
  const servers: Array<{ close(): Promise<void> }> = []
  afterAll(async () => {
    for (const s of servers) await s.close()
  })

  /** Sends a raw request with two Authorization fields (values as given); answers status and challenge. */
  function twice(port: number, first: string, second: string): Promise<{ status: number; challenge: string | undefined }> {
    return new Promise((resolve, reject) => {
      const socket = connect(port, '127.0.0.1')
      let text = ''
      socket.on('data', (chunk) => {
        text += chunk.toString('latin1')
        const head = text.indexOf('\r\n\r\n')
        if (head === -1) return
        const lines = text.slice(0, head).split('\r\n')
        const challenge = lines.find((l) => /^www-authenticate:/i.test(l))?.replace(/^[^:]+:\s*/, '')
        resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(lines[0]!)?.[1]), challenge })
        socket.destroy()
      })
      socket.on('error', reject)
      socket.write(
        `POST /v1 HTTP/1.1\r\nHost: weather.localhost\r\nAuthorization: ${first}\r\nAuthorization: ${second}\r\n` +
          'Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}',
      )
    })
  }

  it('is refused (401) by the Express, Fastify and Web adapters alike, never served with the first one', async () => {
    const fixture = createFixture()
    const good = fixture.tokens.alice
    const expressApp = express()
    expressApp.use(expressAdapter.mcpDispatch({ dispatcher: fixture.dispatcher }))
    expressApp.use((_req, res) => res.json({ served: true }))
    const expressServer = http.createServer(expressApp)
    const expressPort = await listen(expressServer)
    servers.push({ close: () => close(expressServer) })
    const fastifyApp = Fastify()
    await fastifyApp.register(fastifyAdapter.mcpDispatch({ dispatcher: fixture.dispatcher }))
    fastifyApp.all('/*', async () => ({ served: true }))
    await fastifyApp.listen({ port: 0, host: '127.0.0.1' })
    servers.push({ close: () => fastifyApp.close() })
    const web = await serveFetch(webDispatch({ dispatcher: fixture.dispatcher, handler: () => Response.json({ served: true }) }))
    servers.push(web)
    for (const port of [expressPort, (fastifyApp.server.address() as AddressInfo).port, web.port]) {
      for (const [first, second] of [
        [`Bearer ${good}`, 'Bearer appended-by-a-proxy'],
        [`Bearer ${good}`, `Bearer ${good}`],
        // A Bearer credential was presented, whatever the other field holds (RFC 6750 3.1).
        ['', `Bearer ${good}`],
        ['Basic dXNlcjpwYXNz', `Bearer ${good}`],
      ]) {
        const answer = await twice(port, first!, second!)
        expect(answer.status, `${first} + ${second}`).toBe(401)
        expect(answer.challenge, `${first} + ${second}`).toContain('error="invalid_token"')
      }
    }
  })
})
