/**
 * HTTP/2 (cleartext, prior knowledge) through Fastify (`http2: true`, Node's compatibility API)
 * and the Web adapter on `@hono/node-server` over `http2.createServer`. HTTP/2 clients (browsers,
 * curl, Node's `http2`) name the authority in the `:authority` pseudo-header and send no `Host`:
 * the App must be found by it (regression: every such request got 404 `not_found` on the Node
 * adapters, which read `Host` only).
 */
import * as http2 from 'node:http2'
import type { AddressInfo } from 'node:net'
import { type Http2Bindings, type HttpBindings, serve } from '@hono/node-server'
import compression from 'compression'
import Fastify from 'fastify'
import type { SessionStore } from 'mcp-dispatch'
import { fromWebHandler, mcpDispatch as fastifyDispatch, routeByVersion } from 'mcp-dispatch/fastify'
import { mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { type Fixture, HOST, askH2 as ask, createFixture, decidingOnRelease } from './helpers.js'

const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
const INVALID_HOST = { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Invalid Host header', data: { error: 'invalid_request', field: 'host' } } }

interface Server {
  name: 'fastify' | 'web'
  port: number
  close(): Promise<void>
}

let fixture: Fixture
const servers: Server[] = []

/** The handler's answer: the URL it was given, so the App address it saw is checked too. */
const answer = (url: string) => ({ jsonrpc: '2.0', id: 1, result: { tools: [], url } })

beforeAll(async () => {
  fixture = createFixture()
  const fastify = Fastify({ http2: true })
  await fastify.register(fastifyDispatch({ dispatcher: fixture.dispatcher }))
  fastify.all('/*', fromWebHandler((request) => Response.json(answer(request.url))))
  await fastify.listen({ port: 0, host: '127.0.0.1' })
  servers.push({ name: 'fastify', port: (fastify.server.address() as AddressInfo).port, close: () => fastify.close() })

  const handle = webDispatch({ dispatcher: fixture.dispatcher, handler: (request) => Response.json(answer(request.url)) })
  servers.push({ name: 'web', ...(await serveHttp2(handle)) })
})

/** Serves the Web adapter's `handle` on `@hono/node-server` over HTTP/2, with `outgoing`. */
async function serveHttp2(handle: ReturnType<typeof webDispatch>): Promise<{ port: number; close(): Promise<void> }> {
  const web = serve({
    fetch: (request, env: HttpBindings | Http2Bindings) => handle(request, { clientAddress: env.incoming.socket?.remoteAddress, outgoing: env.outgoing }),
    createServer: http2.createServer,
    port: 0,
    hostname: '127.0.0.1',
  }) as unknown as http2.Http2Server
  await new Promise<void>((resolve) => (web.listening ? resolve() : web.once('listening', () => resolve())))
  return { port: (web.address() as AddressInfo).port, close: () => new Promise<void>((resolve) => web.close(() => resolve())) }
}

afterAll(async () => {
  await Promise.all(servers.map((s) => s.close()))
})

const post = (token: string | undefined, extra: http2.OutgoingHttpHeaders = {}): http2.OutgoingHttpHeaders => ({
  ':path': '/v1',
  'content-type': 'application/json',
  accept: 'application/json, text/event-stream',
  ...(token === undefined ? {} : { authorization: `Bearer ${token}` }),
  ...extra,
})

describe.each(['fastify', 'web'] as const)('HTTP/2 through the %s adapter', (name) => {
  const server = () => servers.find((s) => s.name === name)!

  it('finds the App by :authority, with no Host (regression: 404 not_found on Fastify)', async () => {
    const { port } = server()
    const served = await ask(port, post(fixture.tokens.alice, { ':authority': `${HOST}:${port}` }), TOOLS_LIST)
    expect(served.status, served.body).toBe(200)
    expect(served.headers['x-mcp-version']).toBe('1.0.0')
    expect(JSON.parse(served.body)).toEqual(answer(`http://${HOST}:${port}/v1`))
  })

  it('challenges a request without a token with the metadata of the :authority address, and serves that metadata', async () => {
    const { port } = server()
    const refused = await ask(port, post(undefined, { ':authority': `${HOST}:${port}` }), TOOLS_LIST)
    expect(refused.status).toBe(401)
    expect(refused.headers['www-authenticate']).toBe(`Bearer resource_metadata="http://${HOST}:${port}/.well-known/oauth-protected-resource"`)
    const metadata = await ask(port, { ':path': '/.well-known/oauth-protected-resource', ':authority': `${HOST}:${port}` })
    expect(metadata.status).toBe(200)
    expect(JSON.parse(metadata.body)).toMatchObject({ resource: `http://${HOST}:${port}` })
  })

  it('serves a Host beside :authority that names the same, in any case', async () => {
    const { port } = server()
    const served = await ask(port, post(fixture.tokens.alice, { ':authority': `${HOST}:${port}`, host: `${HOST.toUpperCase()}:${port}` }), TOOLS_LIST)
    expect(served.status, served.body).toBe(200)
    expect(served.headers['x-mcp-version']).toBe('1.0.0')
  })
})

it('refuses a Host beside :authority that names another host, 400 (RFC 9113 section 8.3.1: malformed) on Fastify', async () => {
  const { port } = servers.find((s) => s.name === 'fastify')!
  const refused = await ask(port, post(fixture.tokens.alice, { ':authority': `${HOST}:${port}`, host: `other.localhost:${port}` }), TOOLS_LIST)
  expect(refused.status).toBe(400)
  expect(JSON.parse(refused.body)).toEqual(INVALID_HOST)
})

describe('HTTP/2: a new session whose pin cannot be stored', () => {
  /** A session store whose writes fail, as Redis down: reads answer nothing. */
  const failing: SessionStore = {
    get: () => Promise.resolve(undefined),
    set: () => Promise.reject(new Error('pin store down')),
    delete: () => Promise.resolve(),
  }
  const opens = () =>
    new Response('{"jsonrpc":"2.0","id":1,"result":{}}', { headers: { 'content-type': 'application/json', 'mcp-session-id': 'never-pinned' } })

  it.each(['fastify', 'fastify behind compression', 'web'] as const)('%s: the store\'s 503 goes out whole in place of the answer, its body included (regression: the stream was reset, its body dropped)', async (name) => {
    const failed = createFixture({ sessions: failing })
    let port: number
    let close: () => Promise<void>
    if (name !== 'web') {
      const app = Fastify({ http2: true })
      await app.register(fastifyDispatch({ dispatcher: failed.dispatcher, onError: () => {} }))
      if (name === 'fastify') app.all('/*', fromWebHandler(opens))
      else {
        // `compression()` on the raw response after the dispatch hook: it wraps `write` and `end`,
        // and HTTP/2's `end(chunk)` writes its chunk through `this.write`.
        app.addHook('onRequest', (request, reply, done) => compression({ threshold: 0 })(request.raw as never, reply.raw as never, () => done()))
        app.all('/*', (_request, reply) => {
          reply.hijack()
          reply.raw.writeHead(200, { 'content-type': 'text/event-stream', 'mcp-session-id': 'never-pinned' })
          reply.raw.write('data: {}\n\n')
          reply.raw.end()
        })
      }
      await app.listen({ port: 0, host: '127.0.0.1' })
      port = (app.server.address() as AddressInfo).port
      close = () => app.close()
    } else {
      ;({ port, close } = await serveHttp2(webDispatch({ dispatcher: failed.dispatcher, handler: opens, onError: () => {} })))
    }
    try {
      const refused = await ask(port, post(failed.tokens.alice, { ':authority': `${HOST}:${port}`, 'accept-encoding': 'gzip' }), TOOLS_LIST)
      expect(refused.status).toBe(503)
      expect(JSON.parse(refused.body)).toMatchObject({ error: { code: -32005, data: { error: 'temporarily_unavailable' } } })
      expect(refused.headers['mcp-session-id']).toBeUndefined()
      expect(refused.headers['retry-after']).toBe('1')
    } finally {
      await close()
    }
  })
})

describe('HTTP/2 through Fastify: connection-specific fields in the head of a routeByVersion handler', () => {
  it('one set on the response before its writeHead (Transfer-Encoding), which Node\'s HTTP/2 refuses, is routeByVersion\'s 502 with the dispatch headers; TE: trailers, which HTTP/2 takes, is served', async () => {
    const local = createFixture()
    const app = Fastify({ http2: true })
    await app.register(fastifyDispatch({ dispatcher: local.dispatcher, onError: () => {} }))
    app.all(
      '/*',
      routeByVersion(() => (request, reply) => {
        const raw = reply.raw as unknown as http2.Http2ServerResponse
        if (request.headers['x-test'] === 'te') raw.writeHead(200, { 'content-type': 'application/json', te: 'trailers' })
        else {
          raw.setHeader('transfer-encoding', 'chunked')
          raw.writeHead(200, { 'content-type': 'application/json' })
        }
        raw.end('{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}')
      }),
    )
    await app.listen({ port: 0, host: '127.0.0.1' })
    const port = (app.server.address() as AddressInfo).port
    try {
      const refused = await ask(port, post(local.tokens.alice, { ':authority': `${HOST}:${port}` }), TOOLS_LIST)
      expect(refused.status, refused.body).toBe(502)
      expect(JSON.parse(refused.body).error.message).toBe('App handler failed')
      expect(refused.headers['x-mcp-version']).toBe('1.0.0')
      const served = await ask(port, post(local.tokens.alice, { ':authority': `${HOST}:${port}`, 'x-test': 'te' }), TOOLS_LIST)
      expect(served.status, served.body).toBe(200)
      expect(served.headers['x-mcp-version']).toBe('1.0.0')
    } finally {
      await app.close()
    }
  })
})

describe('HTTP/2 through Fastify: a body Fastify parsed', () => {
  it('goes on to fromWebHandler though the request named no length (HTTP/2 frames its body: no Content-Length is no empty body)', async () => {
    const local = createFixture()
    const app = Fastify({ http2: true })
    await app.register(fastifyDispatch({ dispatcher: local.dispatcher, onError: () => {} }))
    app.all('/*', fromWebHandler(async (request) => Response.json({ jsonrpc: '2.0', id: 1, result: { received: await request.text() } })))
    await app.listen({ port: 0, host: '127.0.0.1' })
    const port = (app.server.address() as AddressInfo).port
    try {
      const served = await ask(port, post(local.tokens.alice, { ':authority': `${HOST}:${port}` }), TOOLS_LIST)
      expect(served.status, served.body).toBe(200)
      expect(JSON.parse(JSON.parse(served.body).result.received)).toEqual(JSON.parse(TOOLS_LIST))
    } finally {
      await app.close()
    }
  })
})

describe('HTTP/2: a client that resets its stream while the dispatcher decides', () => {
  it('fastify: the web handler gets a Request already aborted, and the body of its answer is cancelled, not waited on for ever (regression: HTTP/2 read as finished)', async () => {
    // Asynchronous stores that answer once the client has gone.
    const { fixture: gone, release } = decidingOnRelease(createFixture())
    let sawAborted: boolean | undefined
    let cancelled!: () => void
    const bodyCancelled = new Promise<void>((resolve) => (cancelled = resolve))
    const app = Fastify({ http2: true })
    await app.register(fastifyDispatch({ dispatcher: gone.dispatcher, onError: () => {} }))
    app.all(
      '/*',
      fromWebHandler((request) => {
        sawAborted = request.signal.aborted
        const body = new ReadableStream({ pull: () => new Promise(() => {}), cancel: () => cancelled() })
        return new Response(body, { headers: { 'content-type': 'text/event-stream' } })
      }),
    )
    await app.listen({ port: 0, host: '127.0.0.1' })
    const port = (app.server.address() as AddressInfo).port
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on('error', () => {})
    try {
      const stream = session.request({ ':method': 'GET', ':path': '/v1', ':authority': `${HOST}:${port}`, authorization: `Bearer ${gone.tokens.alice}`, accept: 'text/event-stream' })
      stream.on('error', () => {})
      await new Promise((resolve) => setTimeout(resolve, 50))
      stream.close(http2.constants.NGHTTP2_CANCEL)
      await new Promise((resolve) => setTimeout(resolve, 100))
      release()
      await bodyCancelled
      expect(sawAborted).toBe(true)
    } finally {
      session.close()
      await app.close()
    }
  })
})
