/**
 * `routeByVersion` through each adapter: a table's bare version keys belong to one App
 * (`appId`), so the callers of another App with the same version never reach its handler;
 * App-qualified keys and the factory form serve every App; a table of bare keys without
 * `appId`, a `Map` and a table of nothing are refused when the handler is created. On Express
 * and Fastify, a handler that fails late: another realm's promise that rejects is the 502, an
 * answer it had ended goes out whole (behind a held head and behind `compression()` too), one
 * begun and not ended is cut.
 */
import * as http from 'node:http'
import * as net from 'node:net'
import type { AddressInfo } from 'node:net'
import * as vm from 'node:vm'
import { gunzipSync } from 'node:zlib'
import compression from 'compression'
import Fastify from 'fastify'
import { ConfigurationError, createMemorySessionStore } from 'mcp-dispatch'
import * as expressAdapter from 'mcp-dispatch/express'
import * as fastifyAdapter from 'mcp-dispatch/fastify'
import * as webAdapter from 'mcp-dispatch/web'
import { describe, expect, it, vi } from 'vitest'
import { serveFetch } from '../helpers/platform.js'
import { ADAPTER_KINDS, type AdapterKind, type Fixture, type Served, close, createFixture, isExpress, listen, rawRequest } from './helpers.js'
import { EXPRESS } from '../helpers/express.js'

/** Routes of every adapter, answering with the name given to each handler. */
type Routes = Record<string, string>

async function serveRoutes(kind: AdapterKind, fixture: Fixture, routes: Routes, options?: { appId?: string }): Promise<Served> {
  const named = <H>(handler: (name: string) => H) => Object.fromEntries(Object.entries(routes).map(([key, name]) => [key, handler(name)]))
  if (kind === 'web') {
    const handler = webAdapter.routeByVersion(
      named((name) => () => new Response(name)),
      options,
    )
    const served = await serveFetch(webAdapter.mcpDispatch({ dispatcher: fixture.dispatcher, handler }))
    return { port: served.port, close: served.close }
  }
  if (isExpress(kind)) {
    const app = EXPRESS[kind]()
    app.use(expressAdapter.mcpDispatch({ dispatcher: fixture.dispatcher }))
    app.use(
      expressAdapter.routeByVersion(
        named((name) => (_req: http.IncomingMessage, res: http.ServerResponse) => res.end(name)),
        options,
      ),
    )
    const server = http.createServer(app)
    return { port: await listen(server), close: () => close(server) }
  }
  const app = Fastify({ forceCloseConnections: true })
  await app.register(fastifyAdapter.mcpDispatch({ dispatcher: fixture.dispatcher }))
  app.all(
    '/*',
    fastifyAdapter.routeByVersion(
      named((name) => async () => name),
      options,
    ),
  )
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
}

const tools = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'

/** A `tools/list` of alice's at weather's `/v1`. */
const callV1 = (served: Served, fixture: Fixture) =>
  rawRequest(served.port, {
    host: 'weather.localhost',
    path: '/v1',
    headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
    body: tools,
  })

/**
 * A factory whose handlers answer the text `build` gives for their App and version, asked once
 * per handler built (a throw fails the build).
 */
async function serveFactory(kind: AdapterKind, fixture: Fixture, build: (app: { id: string }, version: string) => string, onError?: (error: unknown) => void): Promise<Served> {
  const factory = <H>(handler: (text: string) => H) => (app: { id: string }, version: string) => handler(build(app, version))
  const options = { dispatcher: fixture.dispatcher, ...(onError && { onError }) }
  if (kind === 'web') {
    const handler = webAdapter.routeByVersion(factory((text) => () => new Response(text)))
    const served = await serveFetch(webAdapter.mcpDispatch({ ...options, handler }))
    return { port: served.port, close: served.close }
  }
  if (isExpress(kind)) {
    const app = EXPRESS[kind]()
    app.use(expressAdapter.mcpDispatch(options))
    app.use(expressAdapter.routeByVersion(factory((text) => (_req: http.IncomingMessage, res: http.ServerResponse) => res.end(text))))
    const server = http.createServer(app)
    return { port: await listen(server), close: () => close(server) }
  }
  const app = Fastify({ forceCloseConnections: true })
  await app.register(fastifyAdapter.mcpDispatch(options))
  app.all('/*', fastifyAdapter.routeByVersion(factory((text) => async () => text)))
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
}

/** A factory that fails for the App `app_notes` and serves the others. */
const serveFailingFactory = (kind: AdapterKind, fixture: Fixture, onError: (error: unknown) => void) =>
  serveFactory(
    kind,
    fixture,
    (app) => {
      if (app.id === 'app_notes') throw new Error('cannot build the notes handler')
      return 'built'
    },
    onError,
  )

/** A factory whose handler answers with the App, the version and the how-manieth handler it built. */
function serveNamingFactory(kind: AdapterKind, fixture: Fixture): Promise<Served> {
  let built = 0
  return serveFactory(kind, fixture, (app, version) => `${app.id} ${version} #${++built}`)
}

describe.each(ADAPTER_KINDS)('routeByVersion through the %s adapter', (kind) => {
  const call = (served: Served, fixture: Fixture, host: string) =>
    rawRequest(served.port, {
      host,
      path: '/v1',
      headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
      body: tools,
    })

  it("bare version keys serve only the App named by appId: another App's caller gets 404 version_not_served", async () => {
    const fixture = createFixture()
    const served = await serveRoutes(kind, fixture, { '1.0.0': 'weather 1.0.0' }, { appId: 'app_weather' })
    try {
      expect(await call(served, fixture, 'weather.localhost')).toMatchObject({ status: 200, body: 'weather 1.0.0' })
      // alice is subscribed to notes and her token is scoped to it; notes has a 1.0.0 too.
      const notes = await call(served, fixture, 'notes.localhost')
      expect(notes.status).toBe(404)
      expect(notes.headers['x-mcp-version']).toBe('1.0.0')
      expect(JSON.parse(notes.body)).toEqual({
        jsonrpc: '2.0',
        id: null,
        error: { code: -32004, message: 'Version not served', data: { error: 'version_not_served', version: '1.0.0' } },
      })
    } finally {
      await served.close()
    }
  })

  it('App-qualified keys serve their own Apps, and win over a bare key', async () => {
    const fixture = createFixture()
    const served = await serveRoutes(
      kind,
      fixture,
      { 'app_notes@1.0.0': 'notes 1.0.0', 'app_weather@1.0.0': 'weather, qualified', '1.0.0': 'weather, bare' },
      { appId: 'app_weather' },
    )
    try {
      expect(await call(served, fixture, 'notes.localhost')).toMatchObject({ status: 200, body: 'notes 1.0.0' })
      expect(await call(served, fixture, 'weather.localhost')).toMatchObject({ status: 200, body: 'weather, qualified' })
    } finally {
      await served.close()
    }
  })

  it('a factory builds one handler per App and version, kept: two Apps at the same version each get their own, never the other\'s', async () => {
    const fixture = createFixture()
    const served = await serveNamingFactory(kind, fixture)
    try {
      expect(await call(served, fixture, 'weather.localhost')).toMatchObject({ status: 200, body: 'app_weather 1.0.0 #1' })
      expect(await call(served, fixture, 'notes.localhost')).toMatchObject({ status: 200, body: 'app_notes 1.0.0 #2' })
      expect(await call(served, fixture, 'weather.localhost')).toMatchObject({ status: 200, body: 'app_weather 1.0.0 #1' })
      expect(await call(served, fixture, 'notes.localhost')).toMatchObject({ status: 200, body: 'app_notes 1.0.0 #2' })
    } finally {
      await served.close()
    }
  })

  it("a factory that throws is a failed handler: the JSON-RPC 502 with the version headers and onError, tried again on the next request (regression: Express's HTML 500, Fastify's own 500)", async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const served = await serveFailingFactory(kind, fixture, (error) => errors.push(error))
    try {
      for (let attempt = 0; attempt < 2; attempt++) {
        const failed = await call(served, fixture, 'notes.localhost')
        expect(failed.status).toBe(502)
        expect(failed.headers['content-type']).toBe('application/json')
        expect(failed.headers['x-mcp-version']).toBe('1.0.0')
        expect(JSON.parse(failed.body)).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32603, message: 'App handler failed', data: { error: 'handler_error' } } })
      }
      expect(errors.map((error) => (error as Error).message)).toEqual(['cannot build the notes handler', 'cannot build the notes handler'])
      expect(await call(served, fixture, 'weather.localhost')).toMatchObject({ status: 200, body: 'built' })
    } finally {
      await served.close()
    }
  })

  it('a table with bare version keys and no appId is refused when the handler is created', async () => {
    const fixture = createFixture()
    const refused = await serveRoutes(kind, fixture, { '1.0.0': 'any App' }).then(
      async (served) => {
        await served.close()
        return undefined
      },
      (error: unknown) => error,
    )
    expect(refused).toBeInstanceOf(ConfigurationError)
    expect((refused as ConfigurationError).option).toBe('routes')
    expect((refused as Error).message).toMatch(/"1\.0\.0" name no App: give appId/)
    const emptyAppId = await serveRoutes(kind, fixture, { '1.0.0': 'x' }, { appId: '' }).catch((error: unknown) => error)
    expect((emptyAppId as ConfigurationError).option).toBe('appId')
  })

  it('a key no dispatched request can match is refused when the handler is created, never a 404 for ever', async () => {
    const fixture = createFixture()
    for (const key of ['v1.0.0', '1.0', ' app_weather@1.0.0', 'app_weather@v1.0.0', '@1.0.0', '1.0.0+build', '']) {
      const refused = await serveRoutes(kind, fixture, { [key]: 'x' }, { appId: 'app_weather' }).then(
        async (served) => served.close(),
        (error: unknown) => error,
      )
      expect(refused, JSON.stringify(key)).toBeInstanceOf(ConfigurationError)
      expect((refused as ConfigurationError).option).toBe('routes')
      expect((refused as Error).message).toContain(`key ${JSON.stringify(key)} is neither`)
    }
    // A Map (its entries are no keys of the object: nothing would be routed) and a table of no
    // handler, each request then a 404 with no error (regression: accepted).
    const adapter = kind === 'web' ? webAdapter : isExpress(kind) ? expressAdapter : fastifyAdapter
    for (const [label, routes, message] of [
      ['a Map', new Map([['app_weather@1.0.0', () => undefined]]), /not a Map/],
      ['an empty table', {}, /has no handler/],
    ] as const) {
      const refused = (() => {
        try {
          adapter.routeByVersion(routes as never)
          return undefined
        } catch (error) {
          return error
        }
      })()
      expect(refused, label).toBeInstanceOf(ConfigurationError)
      expect((refused as Error).message, label).toMatch(message)
    }
    // Pre-releases are versions too.
    const served = await serveRoutes(kind, fixture, { 'app_weather@1.0.0': 'weather', 'app_weather@2.0.0-rc.1': 'rc' })
    await served.close()
  })
})

describe.each(ADAPTER_KINDS.filter((kind) => kind !== 'web'))('routeByVersion through the %s adapter: a handler that fails late', (kind) => {
  /** Serves `handler` for every version (Fastify's gets `reply.raw` to write on, hijacked). */
  async function serveHandler(
    fixture: Fixture,
    onError: (error: unknown) => void,
    handler: (res: http.ServerResponse, next?: (error?: unknown) => void) => unknown,
    options: { compress?: boolean } = {},
  ): Promise<Served> {
    if (isExpress(kind)) {
      const app = EXPRESS[kind]()
      app.use(expressAdapter.mcpDispatch({ dispatcher: fixture.dispatcher, onError }))
      if (options.compress) app.use(compression({ threshold: 0 }))
      app.use(expressAdapter.routeByVersion(() => (_req: http.IncomingMessage, res: http.ServerResponse, next: (error?: unknown) => void) => handler(res, next)))
      const server = http.createServer(app)
      return { port: await listen(server), close: () => close(server) }
    }
    const app = Fastify({ forceCloseConnections: true })
    await app.register(fastifyAdapter.mcpDispatch({ dispatcher: fixture.dispatcher, onError }))
    app.all(
      '/*',
      fastifyAdapter.routeByVersion(() => (_request, reply) => {
        reply.hijack()
        return handler(reply.raw)
      }),
    )
    await app.listen({ port: 0, host: '127.0.0.1' })
    return { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
  }
  const request = (fixture: Fixture) =>
    `POST /v1 HTTP/1.1\r\nHost: weather.localhost\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\nContent-Type: application/json\r\nContent-Length: ${tools.length}\r\nConnection: close\r\n\r\n${tools}`

  it('a promise of another realm that rejects is the JSON-RPC 502 and onError (regression: Express left the request hanging and the rejection unhandled)', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const served = await serveHandler(fixture, (error) => errors.push(error), () =>
      vm.runInNewContext('new Promise((resolve, reject) => setTimeout(() => reject(new Error("another realm")), 5))', { setTimeout }),
    )
    try {
      const failed = await callV1(served, fixture)
      expect(failed.status).toBe(502)
      expect(failed.headers['x-mcp-version']).toBe('1.0.0')
      expect(JSON.parse(failed.body)).toMatchObject({ error: { message: 'App handler failed', data: { error: 'handler_error' } } })
      expect(errors.map((error) => (error as Error).message)).toEqual(['another realm'])
    } finally {
      await served.close()
    }
  })

  it('an answer the handler ended goes out whole, though it throws after; onError hears it (regression: the socket was destroyed with the body still unsent)', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const size = 32 * 1024 * 1024
    const served = await serveHandler(fixture, (error) => errors.push(error), async (res) => {
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': String(size) })
      res.end(Buffer.alloc(size, 0x61))
      await null
      throw new Error('failed after the answer')
    })
    try {
      // The client reads nothing until the handler has failed: the answer is then mostly unsent.
      const socket = net.connect(served.port, '127.0.0.1')
      socket.pause()
      socket.write(request(fixture))
      await vi.waitFor(() => expect(errors).toHaveLength(1), { timeout: 5_000, interval: 10 })
      const chunks: Buffer[] = []
      socket.on('data', (chunk: Buffer) => chunks.push(chunk))
      const ended = new Promise<void>((resolve) => socket.on('close', () => resolve()))
      socket.on('error', () => {})
      socket.resume()
      await ended
      const received = Buffer.concat(chunks)
      const headEnd = received.indexOf('\r\n\r\n')
      expect(received.subarray(0, received.indexOf('\r\n')).toString()).toBe('HTTP/1.1 200 OK')
      expect(received.length - headEnd - 4).toBe(size)
      expect((errors[0] as Error).message).toBe('failed after the answer')
    } finally {
      await served.close()
    }
  })

  it('an answer ended while its head waits for the session pin (a store that answers later, as Redis) goes out whole, though the handler throws after (regression: cut)', async () => {
    const memory = createMemorySessionStore()
    const later = <T>(value: T) => new Promise<T>((resolve) => setTimeout(() => resolve(value), 100))
    const fixture = createFixture({
      sessions: { get: (id, ttl) => later(memory.get(id, ttl) as never), set: (id, pin, ttl) => later(memory.set(id, pin, ttl) as never), delete: (id) => later(memory.delete(id) as never) },
    })
    const errors: unknown[] = []
    const body = '{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"x","version":"1"}}}'
    const served = await serveHandler(fixture, (error) => errors.push(error), async (res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 'session-held' })
      res.end(body)
      await null
      throw new Error('failed after the answer')
    })
    try {
      const answer = await callV1(served, fixture)
      expect([answer.status, answer.headers['mcp-session-id'], answer.body]).toEqual([200, 'session-held', body])
      expect(errors.map((error) => (error as Error).message)).toEqual(['failed after the answer'])
      expect(await memory.get('session-held', 60_000)).toMatchObject({ appId: 'app_weather', version: '1.0.0' })
    } finally {
      await served.close()
    }
  })

  it.runIf(isExpress(kind))('a handler that calls next(error) before answering passes the error on to Express (its 500), and onError does not hear it', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const served = await serveHandler(fixture, (error) => errors.push(error), (_res, next) => next!(new Error('failed before the answer')))
    try {
      const answer = await rawRequest(served.port, {
        host: 'weather.localhost',
        path: '/v1',
        headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
        body: tools,
      })
      // Express's own 500 (its final handler's HTML page), not one of the adapter's.
      expect(answer.status).toBe(500)
      expect(answer.headers['content-type']).toMatch(/^text\/html/)
      expect(answer.headers['x-mcp-version']).toBe('1.0.0')
      expect(errors).toEqual([])
    } finally {
      await served.close()
    }
  })

  it.runIf(isExpress(kind))('behind compression(), an ended answer goes out whole, though the handler throws after or calls next(error), on either session store (regression: cut, compression ending it later)', async () => {
    const memory = createMemorySessionStore()
    const later = <T>(value: T) => new Promise<T>((resolve) => setTimeout(() => resolve(value), 50))
    const stores = {
      memory: () => createFixture(),
      later: () =>
        createFixture({
          sessions: { get: (id, ttl) => later(memory.get(id, ttl) as never), set: (id, pin, ttl) => later(memory.set(id, pin, ttl) as never), delete: (id) => later(memory.delete(id) as never) },
        }),
    }
    // Two megabytes of JSON text: zlib takes a while over it.
    const body = JSON.stringify({ jsonrpc: '2.0', id: 1, result: { text: Array.from({ length: 60_000 }, (_, i) => `line ${i} of the answer`).join('\n') } })
    for (const [store, fixtureOf] of Object.entries(stores)) {
      for (const how of ['throws', 'next(error)'] as const) {
        const what = `${store} store, ${how}`
        const fixture = fixtureOf()
        const errors: unknown[] = []
        let n = 0
        const served = await serveHandler(
          fixture,
          (error) => errors.push(error),
          async (res, next) => {
            res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': `session-${store}-${how}-${n++}` })
            res.end(body)
            if (how === 'next(error)') return next!(new Error('failed after the answer'))
            await null
            throw new Error('failed after the answer')
          },
          { compress: true },
        )
        try {
          const answer = await new Promise<{ status: number; encoding: string | undefined; body: Buffer }>((resolve, reject) => {
            const request = http.request(
              {
                host: '127.0.0.1',
                port: served.port,
                method: 'POST',
                path: '/v1',
                headers: { host: 'weather.localhost', authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', 'accept-encoding': 'gzip' },
              },
              (response) => {
                const chunks: Buffer[] = []
                response.on('data', (chunk: Buffer) => chunks.push(chunk))
                response.on('end', () => resolve({ status: response.statusCode!, encoding: response.headers['content-encoding'], body: Buffer.concat(chunks) }))
                response.on('error', reject)
              },
            )
            request.on('error', reject)
            request.end(tools)
          })
          expect([answer.status, answer.encoding], what).toEqual([200, 'gzip'])
          expect(gunzipSync(answer.body).toString(), what).toBe(body)
          expect(errors.map((error) => (error as Error).message), what).toEqual(['failed after the answer'])
        } finally {
          await served.close()
        }
      }
    }
  })

  it('an answer begun and not ended is cut when the handler throws, never left open or taken for whole', async () => {
    const fixture = createFixture()
    const errors: unknown[] = []
    const served = await serveHandler(fixture, (error) => errors.push(error), async (res) => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '100' })
      res.write('{"partial":')
      await null
      throw new Error('failed mid-answer')
    })
    try {
      const failed = await callV1(served, fixture).then(
        () => 'whole',
        (error: unknown) => (error as NodeJS.ErrnoException).code ?? String(error),
      )
      expect(failed).not.toBe('whole')
      expect(errors.map((error) => (error as Error).message)).toEqual(['failed mid-answer'])
    } finally {
      await served.close()
    }
  })
})

describe.each(ADAPTER_KINDS.filter((kind) => kind !== 'web'))('the %s adapter: what the platform set before the handler', (kind) => {
  /** How the handler fails: thrown by a routeByVersion handler (on Fastify, hijacked or not), or by a web handler. */
  type Failing = 'routeByVersion' | 'routeByVersion, hijacked' | 'routeByVersion, its factory' | 'fromWebHandler'
  const ways: Failing[] = isExpress(kind)
    ? ['routeByVersion', 'routeByVersion, its factory', 'fromWebHandler']
    : ['routeByVersion', 'routeByVersion, hijacked', 'routeByVersion, its factory', 'fromWebHandler']
  const factoryFails = () => {
    throw new Error('cannot build the handler')
  }
  const PLATFORM = { 'access-control-allow-origin': 'http://ui.example', 'x-request-id': 'r1', 'x-content-type-options': 'nosniff' }

  async function serveFailing(fixture: Fixture, way: Failing, webHandler: () => Promise<Response>): Promise<Served> {
    const onError = () => {}
    const throwing = (set: (name: string, value: string) => void) => {
      set('content-encoding', 'gzip')
      set('mcp-session-id', 'never-pinned')
      set('x-request-id', 'the handler\'s')
      throw new Error('App bug')
    }
    if (isExpress(kind)) {
      const app = EXPRESS[kind]()
      // The platform's own middleware (cors(), helmet(), a request id), before the dispatch layer.
      app.use((_req: http.IncomingMessage, res: http.ServerResponse, next: () => void) => {
        for (const [name, value] of Object.entries(PLATFORM)) res.setHeader(name, value)
        next()
      })
      app.use(expressAdapter.mcpDispatch({ dispatcher: fixture.dispatcher, onError }))
      app.use(
        way === 'fromWebHandler'
          ? expressAdapter.fromWebHandler(webHandler)
          : way === 'routeByVersion, its factory'
            ? expressAdapter.routeByVersion(factoryFails)
            : expressAdapter.routeByVersion(() => (_req: http.IncomingMessage, res: http.ServerResponse) => throwing((name, value) => res.setHeader(name, value))),
      )
      const server = http.createServer(app)
      return { port: await listen(server), close: () => close(server) }
    }
    const app = Fastify({ forceCloseConnections: true })
    // The platform's own hooks (@fastify/cors, @fastify/helmet set reply headers there).
    app.addHook('onRequest', async (_request, reply) => {
      reply.headers(PLATFORM)
    })
    await app.register(fastifyAdapter.mcpDispatch({ dispatcher: fixture.dispatcher, onError }))
    const handler =
      way === 'fromWebHandler'
        ? fastifyAdapter.fromWebHandler(webHandler)
        : way === 'routeByVersion, its factory'
          ? fastifyAdapter.routeByVersion(factoryFails)
          : fastifyAdapter.routeByVersion(() => (_request, reply) => {
            if (way === 'routeByVersion') return throwing((name, value) => void reply.header(name, value))
            reply.hijack()
            return throwing((name, value) => void reply.raw.setHeader(name, value))
          })
    app.route({ method: ['GET', 'POST', 'DELETE'], url: '/*', handler })
    await app.listen({ port: 0, host: '127.0.0.1' })
    return { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
  }


  it.each(ways)('the 502 of a handler that fails (%s) keeps the headers the platform set before it, and none the handler set (regression: the platform\'s CORS and security headers were dropped)', async (way) => {
    const fixture = createFixture()
    const served = await serveFailing(fixture, way, () => Promise.reject(new Error('App bug')))
    try {
      const failed = await callV1(served, fixture)
      expect(failed.status).toBe(502)
      expect(JSON.parse(failed.body)).toMatchObject({ error: { data: { error: 'handler_error' } } })
      expect(failed.headers['x-mcp-version']).toBe('1.0.0')
      expect(failed.headers['content-type']).toBe('application/json')
      for (const [name, value] of Object.entries(PLATFORM)) expect(failed.headers[name], name).toBe(value)
      expect(failed.headers['content-encoding']).toBeUndefined()
      expect(failed.headers['mcp-session-id']).toBeUndefined()
    } finally {
      await served.close()
    }
  })

  it('a web handler\'s answer carries them too, under its own headers (regression on Fastify: hijacked, the reply\'s headers were dropped)', async () => {
    const fixture = createFixture()
    const served = await serveFailing(fixture, 'fromWebHandler', async () =>
      new Response('{"jsonrpc":"2.0","id":1,"result":{}}', { headers: { 'content-type': 'application/json', 'x-request-id': 'the handler\'s' } }),
    )
    try {
      const answered = await callV1(served, fixture)
      expect(answered.status).toBe(200)
      expect(answered.headers['x-mcp-version']).toBe('1.0.0')
      expect(answered.headers['access-control-allow-origin']).toBe('http://ui.example')
      expect(answered.headers['x-content-type-options']).toBe('nosniff')
      expect(answered.headers['x-request-id']).toBe('the handler\'s')
    } finally {
      await served.close()
    }
  })
})
