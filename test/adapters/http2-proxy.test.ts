/**
 * The proxy handler and the Node adapters over HTTP/2 (cleartext, prior knowledge): Fastify's
 * `http2: true` and the Web adapter on `@hono/node-server` over `http2.createServer`, driven by
 * Node's `http2` client, against real HTTP/1 upstream Apps on loopback. What HTTP/2 forbids in a
 * message (RFC 9113 section 8.2.2), a stream the client resets mid-upload, the 502 of an answer
 * Node cannot write, and a `Host` beside `:authority` on the token API.
 */
import { EventEmitter } from 'node:events'
import * as http from 'node:http'
import type { IncomingMessage, ServerResponse } from 'node:http'
import * as http2 from 'node:http2'
import type { AddressInfo } from 'node:net'
import { Readable } from 'node:stream'
import Fastify from 'fastify'
import { generateKeyPair } from 'jose'
import { type DispatchContext, type TokenService, createTokenApi } from 'mcp-dispatch'
import { type FastifyRouteHandler, fromWebHandler, mcpDispatch as fastifyDispatch, routeByVersion, serveTokenApi } from 'mcp-dispatch/fastify'
import { type IdentitySigner, type ProxyHandler, createIdentitySigner, createProxyHandler } from 'mcp-dispatch/proxy'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { toWebRequest } from '../../src/adapters/node-http.js'
import { type Fixture, HOST, type Served, askH2 as ask, close, createFixture, listen, serveWebHandler } from './helpers.js'

const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
const ANSWER = '{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}'
/** A value of `HTTP2-Settings` as an h2c upgrade sends it (RFC 7540 section 3.2.1). */
const SETTINGS = 'AAMAAABkAARAAAAAAAIAAAAA'

const post = (fixture: Fixture, port: number, extra: http2.OutgoingHttpHeaders = {}): http2.OutgoingHttpHeaders => ({
  ':path': '/v1',
  ':authority': `${HOST}:${port}`,
  'content-type': 'application/json',
  accept: 'application/json, text/event-stream',
  authorization: `Bearer ${fixture.tokens.alice}`,
  ...extra,
})

/** A tools/list over HTTP/2 to `server` (then closed) is the fixed answer with the version headers, without `field`. */
async function expectAnsweredWithout(fixture: Fixture, server: Served, field: string): Promise<void> {
  try {
    const answered = await ask(server.port, post(fixture, server.port), TOOLS_LIST)
    expect(answered.status, answered.body).toBe(200)
    expect(answered.body).toBe(ANSWER)
    expect(answered.headers[field]).toBeUndefined()
    expect(answered.headers['x-mcp-version']).toBe('1.0.0')
  } finally {
    await server.close()
  }
}

/** Fastify over HTTP/2 with the dispatch plugin and `handler` on every path, the body left unread. */
async function serveFastify(fixture: Fixture, handler: FastifyRouteHandler, onError?: () => void): Promise<Served> {
  const app = Fastify({ http2: true })
  // The body streams to a web handler only when Fastify leaves it unread.
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('*', (_request, _payload, done) => done(null))
  await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, ...(onError && { onError }) }))
  app.all('/*', handler)
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
}

/** What an upstream App saw of a request's body: ended whole, or cut off. */
interface Seen {
  body: string
  outcome: Promise<'end' | 'aborted'>
}

/** An HTTP/1 upstream App; `answer` writes its response, `seen` collects its requests. */
interface Upstream {
  origin: string
  server: http.Server
  seen: Seen[]
  answer: (req: http.IncomingMessage, res: http.ServerResponse) => void
  /** Resolves with the next request the upstream receives. */
  next(): Promise<Seen>
}

async function startUpstream(): Promise<Upstream> {
  let waiting: ((seen: Seen) => void) | undefined
  const upstream: Upstream = {
    origin: '',
    seen: [],
    answer: (_req, res) => void res.writeHead(200, { 'content-type': 'application/json' }).end(ANSWER),
    server: http.createServer((req, res) => {
      const seen: Seen = {
        body: '',
        outcome: new Promise((resolve) => {
          req.on('data', (chunk: Buffer) => (seen.body += chunk.toString('utf8')))
          req.on('end', () => resolve('end'))
          req.on('aborted', () => resolve('aborted'))
          req.on('error', () => resolve('aborted'))
        }),
      }
      upstream.seen.push(seen)
      waiting?.(seen)
      waiting = undefined
      upstream.answer(req, res)
    }),
    next: () => new Promise((resolve) => (waiting = resolve)),
  }
  upstream.origin = `http://127.0.0.1:${await listen(upstream.server)}`
  return upstream
}

/** The context the dispatcher gives a request of alice's to the weather App, version 1.0.0. */
const CONTEXT: DispatchContext = {
  app: { id: 'app_weather', slug: 'weather', name: 'Weather' },
  identity: { subject: 'alice', method: 'oauth', clientId: 'client-1', scopes: [] },
  version: '1.0.0',
  latestVersion: '2.0.0',
  sessionId: undefined,
  baseUrl: `http://${HOST}`,
  rateLimit: undefined,
}

let fixture: Fixture
let upstream: Upstream
let signer: IdentitySigner
let proxy: ProxyHandler

beforeAll(async () => {
  fixture = createFixture()
  upstream = await startUpstream()
  const { privateKey } = await generateKeyPair('ES256', { extractable: true })
  signer = createIdentitySigner({ issuer: 'https://platform.test', privateKey })
  proxy = createProxyHandler({ upstream: { '1.0.0': `${upstream.origin}/mcp` }, appId: 'app_weather', identity: signer, onError: () => {} })
})

afterAll(() => close(upstream.server))

const adapters = {
  fastify: () => serveFastify(fixture, fromWebHandler(proxy)),
  web: () => serveWebHandler('web', fixture, proxy, { http2: true }),
}

describe('proxy: an upstream answer with HTTP2-Settings (regression: Fastify answered 502; @hono/node-server ended the process)', () => {
  const withSettings = (_req: http.IncomingMessage, res: http.ServerResponse) => {
    res.writeHead(200, { 'content-type': 'application/json', 'http2-settings': SETTINGS })
    res.end(ANSWER)
  }

  it('is hop-by-hop: never relayed (RFC 9113 section 8.2.2)', async () => {
    upstream.answer = withSettings
    const response = await proxy(new Request(`http://${HOST}/v1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: TOOLS_LIST }), CONTEXT)
    expect(response.status).toBe(200)
    expect(response.headers.has('http2-settings')).toBe(false)
    expect(await response.text()).toBe(ANSWER)
  })

  it.each(['fastify', 'web'] as const)('%s over HTTP/2: the answer goes out without it', async (name) => {
    upstream.answer = withSettings
    await expectAnsweredWithout(fixture, await adapters[name](), 'http2-settings')
  })
})

/**
 * Sends part of a POST body (no `Content-Length`, no END_STREAM) once the upstream has the
 * request, then resets the stream (RST_STREAM CANCEL: what an aborted `fetch` upload sends).
 * `ClientHttp2Stream.close(NGHTTP2_CANCEL)` would not do: it sends END_STREAM first (an empty
 * DATA frame), so the body it cut is whole on the wire.
 */
async function uploadThenReset(port: number, onRequest: Promise<unknown>): Promise<void> {
  const session = http2.connect(`http://127.0.0.1:${port}`)
  session.on('error', () => {})
  const abort = new AbortController()
  try {
    const stream = session.request({ ':method': 'POST', ...post(fixture, port) }, { signal: abort.signal })
    stream.on('error', () => {})
    const closed = new Promise((resolve) => stream.once('close', resolve))
    stream.write('{"jsonrpc":"2.0","id":1,')
    await onRequest
    // Destroys the stream with an AbortError: RST_STREAM CANCEL, and no END_STREAM before it.
    abort.abort()
    await closed
  } finally {
    // Graceful: the RST_STREAM queued goes out before the GOAWAY.
    session.close()
  }
}

describe('HTTP/2: a client that resets its stream mid-upload', () => {
  it.each(['fastify', 'web'] as const)('%s: the proxied App sees the request cut off, never a whole one', async (name) => {
    upstream.answer = () => {}
    const server = await adapters[name]()
    try {
      const arrived = upstream.next()
      await uploadThenReset(server.port, arrived)
      const seen = await arrived
      expect(await seen.outcome).toBe('aborted')
      expect(seen.body).toBe('{"jsonrpc":"2.0","id":1,')
    } finally {
      await server.close()
    }
  })

  it('fastify: a web handler reading the body gets an error, not the part sent as the whole', async () => {
    let read!: (outcome: string) => void
    const outcome = new Promise<string>((resolve) => (read = resolve))
    let started!: () => void
    const handling = new Promise<void>((resolve) => (started = resolve))
    const server = await serveFastify(
      fixture,
      fromWebHandler(async (request) => {
        started()
        try {
          read(`whole: ${await request.text()}`)
        } catch (error) {
          read(`failed: ${(error as Error).message}`)
        }
        return new Response(null, { status: 202 })
      }),
    )
    try {
      await uploadThenReset(server.port, handling)
      expect(await outcome).toMatch(/^failed: /)
    } finally {
      await server.close()
    }
  })
})

it('Node adapters: a request that ends as a whole one after its `aborted` (HTTP/2 compatibility, on RST_STREAM) errors its web body (regression: it ended whole)', async () => {
  // What Node's compatibility request does on a reset: `aborted` (and `req.aborted`), then the
  // end of its readable as any other (`push(null)`), which `finished()` may take for a whole body.
  const req = Object.assign(new Readable({ read() {} }), {
    method: 'POST',
    url: '/v1',
    headers: { ':authority': HOST, 'content-type': 'application/json' },
    rawHeaders: [':authority', HOST, 'content-type', 'application/json'],
    httpVersionMajor: 2,
    aborted: false,
  })
  const res = Object.assign(new EventEmitter(), { writableEnded: false })
  const request = toWebRequest({ req: req as unknown as IncomingMessage, res: res as unknown as ServerResponse, url: '/v1', protocol: 'http' })
  const text = request.text()
  req.push('{"jsonrpc":')
  req.aborted = true
  req.emit('aborted')
  req.push(null)
  await expect(text).rejects.toThrow()
})

describe('proxy: the end of a request body the client cut off is never passed on', () => {
  /** A `fetch` that answers at once and reads the request body to its end or failure. */
  function recordingProxy(): { proxy: ProxyHandler; body: Promise<'end' | 'error'> } {
    let settle!: (outcome: 'end' | 'error') => void
    const body = new Promise<'end' | 'error'>((resolve) => (settle = resolve))
    return {
      body,
      proxy: createProxyHandler({
        upstream: { '1.0.0': 'http://upstream.test/mcp' },
        appId: 'app_weather',
        identity: signer,
        onError: () => {},
        fetch: async (_url, init) => {
          const reader = (init.body as ReadableStream<Uint8Array>).getReader()
          void (async () => {
            try {
              while (!(await reader.read()).done);
              settle('end')
            } catch {
              settle('error')
            }
          })()
          return new Response(ANSWER, { headers: { 'content-type': 'application/json' } })
        },
      }),
    }
  }

  /** A request whose body the test ends; its signal, the client's, the test aborts. */
  function clientRequest() {
    const client = new AbortController()
    let body!: ReadableStreamDefaultController<Uint8Array>
    const stream = new ReadableStream<Uint8Array>({ start: (controller) => void (body = controller) })
    body.enqueue(new TextEncoder().encode('{"jsonrpc":'))
    const request = new Request(`http://${HOST}/v1`, { method: 'POST', body: stream, duplex: 'half', signal: client.signal } as RequestInit)
    return { request, client, body }
  }

  it('when the client\'s signal aborts in the same turn as the body ends, after it (regression: the upstream got a whole request)', async () => {
    const { proxy: recording, body: seen } = recordingProxy()
    const { request, client, body } = clientRequest()
    const response = await recording(request, CONTEXT)
    expect(response.status).toBe(200)
    body.close()
    // As a runtime whose reset ends the body first and aborts the signal in the same event.
    process.nextTick(() => client.abort())
    expect(await seen).toBe('error')
    await response.body?.cancel()
  })

  it('when the client goes away after the upstream has answered (regression: the upstream got a whole request)', async () => {
    const { proxy: recording, body: seen } = recordingProxy()
    const { request, client, body } = clientRequest()
    const response = await recording(request, CONTEXT)
    // The answer read to its end: the exchange is over on the proxy's side, and what the
    // upstream did not take of the body is let go of (the client's cancelled, so its adapter
    // drains the rest): the upstream's read fails, whatever the client does next.
    expect(await response.text()).toBe(ANSWER)
    expect(await seen).toBe('error')
    client.abort()
    expect(() => body.close()).toThrow(TypeError) // cancelled already
  })

  it('a body that ends with its client still there ends whole', async () => {
    const { proxy: recording, body: seen } = recordingProxy()
    const { request, body } = clientRequest()
    const response = await recording(request, CONTEXT)
    body.close()
    expect(await seen).toBe('end')
    expect(await response.text()).toBe(ANSWER)
  })
})

describe('Web adapter over HTTP/2: a handler\'s own connection-specific fields (regression: @hono/node-server ended the process)', () => {
  it('are dropped, with those its Connection names, from a Response the handler built', async () => {
    const server = await serveWebHandler(
      'web',
      fixture,
      () =>
        new Response(ANSWER, {
          headers: {
            'content-type': 'application/json',
            connection: 'keep-alive, x-hop',
            'keep-alive': 'timeout=5',
            'proxy-connection': 'keep-alive',
            upgrade: 'h2c',
            'http2-settings': SETTINGS,
            te: 'gzip',
            'x-hop': 'this hop only',
            'x-kept': 'yes',
          },
        }),
      { http2: true },
    )
    try {
      const answered = await ask(server.port, post(fixture, server.port), TOOLS_LIST)
      expect(answered.status, answered.body).toBe(200)
      expect(answered.body).toBe(ANSWER)
      for (const name of ['connection', 'keep-alive', 'proxy-connection', 'upgrade', 'http2-settings', 'te', 'x-hop']) expect(answered.headers[name], name).toBeUndefined()
      expect(answered.headers['x-kept']).toBe('yes')
      expect(answered.headers['x-mcp-version']).toBe('1.0.0')
    } finally {
      await server.close()
    }
  })

  it('are dropped from the Response of an HTTP/1 fetch() handed on as it came (immutable headers)', async () => {
    upstream.answer = (_req, res) => void res.writeHead(200, { 'content-type': 'application/json', connection: 'keep-alive', 'keep-alive': 'timeout=5' }).end(ANSWER)
    await expectAnsweredWithout(fixture, await serveWebHandler('web', fixture, () => fetch(`${upstream.origin}/mcp`), { http2: true }), 'keep-alive')
  })
})

describe('Fastify over HTTP/2: the 502 of an answer Node cannot write carries the dispatch headers (regression: it had none)', () => {
  const refused: Record<string, FastifyRouteHandler> = {
    'fromWebHandler, HTTP2-Settings': fromWebHandler(() => new Response(ANSWER, { headers: { 'content-type': 'application/json', 'http2-settings': SETTINGS } })),
    'fromWebHandler, Keep-Alive': fromWebHandler(() => new Response(ANSWER, { headers: { 'content-type': 'application/json', 'keep-alive': 'timeout=5' } })),
    'routeByVersion, writeHead with Upgrade': routeByVersion(
      () => (_request, reply) => {
        reply.hijack()
        reply.raw.writeHead(200, { 'content-type': 'application/json', upgrade: 'h2c' })
        reply.raw.end(ANSWER)
      },
    ),
    'routeByVersion, setHeader Transfer-Encoding then end': routeByVersion(
      () => (_request, reply) => {
        reply.hijack()
        reply.raw.setHeader('transfer-encoding', 'chunked')
        reply.raw.end(ANSWER)
      },
    ),
    'fromWebHandler, Response.error()': fromWebHandler(() => Response.error()),
  }

  it.each(Object.keys(refused))('%s', async (name) => {
    const failures: unknown[] = []
    const app = Fastify({ http2: true })
    await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError: (error) => failures.push(error) }))
    app.all('/*', refused[name]!)
    await app.listen({ port: 0, host: '127.0.0.1' })
    const port = (app.server.address() as AddressInfo).port
    try {
      const answered = await ask(port, post(fixture, port), TOOLS_LIST)
      expect(answered.status, answered.body).toBe(502)
      expect(JSON.parse(answered.body)).toMatchObject({ error: { data: { error: 'handler_error' } } })
      expect(answered.headers['x-mcp-version']).toBe('1.0.0')
      expect(answered.headers['x-mcp-latest-version']).toBe('2.0.0')
      expect(failures).toHaveLength(1)
    } finally {
      await app.close()
    }
  })
})

it('Fastify over HTTP/2: a Connection the handler writes is dropped by Node, the answer sent', async () => {
  const app = Fastify({ http2: true })
  await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher }))
  app.all(
    '/*',
    routeByVersion(() => (_request, reply) => {
      reply.hijack()
      reply.raw.writeHead(200, { 'content-type': 'application/json', connection: 'close' })
      reply.raw.end(ANSWER)
    }),
  )
  await app.listen({ port: 0, host: '127.0.0.1' })
  const port = (app.server.address() as AddressInfo).port
  try {
    const answered = await ask(port, post(fixture, port), TOOLS_LIST)
    expect(answered.status, answered.body).toBe(200)
    expect(answered.body).toBe(ANSWER)
    expect(answered.headers.connection).toBeUndefined()
    expect(answered.headers['x-mcp-version']).toBe('1.0.0')
  } finally {
    await app.close()
  }
})

describe('Fastify over HTTP/2: serveTokenApi and a Host beside :authority', () => {
  const COOKIE = 'dash=alice-session'
  let port: number
  let stop: () => Promise<void>

  beforeAll(async () => {
    const api = createTokenApi({
      tokens: fixture.dispatcherOptions.tokens as TokenService,
      authenticateSession: (request) => (request.headers.get('cookie') === COOKIE ? { userId: 'alice' } : null),
      verifyCsrf: () => true,
    })
    const app = Fastify({ http2: true })
    await app.register(serveTokenApi(api))
    await app.listen({ port: 0, host: '127.0.0.1' })
    port = (app.server.address() as AddressInfo).port
    stop = () => app.close()
  })
  afterAll(() => stop())

  it('refuses one that names another host, 400 naming host, as mcpDispatch does (regression: answered with the tokens)', async () => {
    const refused = await ask(port, { ':path': '/api/tokens', ':authority': `${HOST}:${port}`, host: `dashboard.localhost:${port}`, cookie: COOKIE })
    expect(refused.status).toBe(400)
    expect(JSON.parse(refused.body)).toEqual({ error: 'invalid_request', message: 'host: is not a valid Host header', field: 'host' })
  })

  it('serves one that names the same host, in any case', async () => {
    const served = await ask(port, { ':path': '/api/tokens', ':authority': `${HOST}:${port}`, host: `${HOST.toUpperCase()}:${port}`, cookie: COOKIE })
    expect(served.status, served.body).toBe(200)
  })
})
