/**
 * Pieces the adapter tests share: a dispatch fixture on in-memory stores with a fixed clock,
 * an HTTP client for loopback servers that keeps the `Host` header (Apps are found by host),
 * and small HTTP response records to compare byte for byte.
 */
import * as http from 'node:http'
import * as http2 from 'node:http2'
import { type AddressInfo, type Server as NetServer, connect } from 'node:net'
import type express from 'express'
import { type Http2Bindings, type HttpBindings, serve } from '@hono/node-server'
import Fastify, { type FastifyInstance } from 'fastify'
import {
  type AppRecord,
  type Dispatcher,
  type DispatcherOptions,
  type Identity,
  type MemoryAppStore,
  type RateLimitPolicy,
  type SessionStore,
  createDispatcher,
  createMemoryAppStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  displayPrefix,
  generateApiToken,
  hashApiToken,
} from 'mcp-dispatch'
import { fromWebHandler as expressFromWeb, mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { fromWebHandler as fastifyFromWeb, mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import { type WebMcpHandler, mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { createIdentitySigner, createProxyHandler } from 'mcp-dispatch/proxy'
import { generateKeyPair } from 'jose'
import { EXPRESS, type ExpressKind } from '../helpers/express.js'
import { localhostFetch, serveFetch } from '../helpers/platform.js'

/** 2030-01-01T00:00:30Z: half-way through a minute window, so 429 bodies are fixed. */
export const T0 = Date.UTC(2030, 0, 1, 0, 0, 30)
const DAY = 86_400_000

/** The Host every in-memory and raw request uses, so base URLs match across adapters. */
export const HOST = 'weather.localhost'
export const ALLOWED_ORIGIN = 'https://allowed.example'

/** The headers of an MCP client's request to the weather App with `token`, in `sessionId` when given. */
export function mcpClientHeaders(token: string, sessionId?: string): http.OutgoingHttpHeaders {
  return {
    host: HOST,
    authorization: `Bearer ${token}`,
    accept: 'application/json, text/event-stream',
    'content-type': 'application/json',
    ...(sessionId && { 'mcp-session-id': sessionId }),
  }
}

export type TokenName = 'alice' | 'aliceOther' | 'aliceBusy' | 'bob' | 'carol' | 'ipLimited'

/** A dispatcher on in-memory stores, with seeded tokens. */
export interface Fixture {
  dispatcher: Dispatcher
  /** The options the dispatcher was created with (to create variants, e.g. with a basePath). */
  dispatcherOptions: DispatcherOptions
  apps: MemoryAppStore
  tokens: Record<TokenName, string>
  errors: Array<{ error: unknown; context: string }>
  /** Puts a failure in `errors`: the dispatcher's `onError`, for an adapter's too. */
  onError(error: unknown, context: string): void
}

/**
 * Apps: weather (1.0.0, 2.0.0), notes (1.0.0; the session tests deploy to it), other (1.0.0),
 * busy (1.0.0, one request per minute). Users: alice (subscribed to all), bob (no active
 * subscription), carol (subscribed to notes).
 */
export function createFixture(options: { sessions?: SessionStore } = {}): Fixture {
  const now = () => T0
  const apps = createMemoryAppStore([
    { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '2.0.0'] },
    { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['1.0.0'] },
    { id: 'app_other', slug: 'other', name: 'Other', versions: ['1.0.0'] },
    { id: 'app_busy', slug: 'busy', name: 'Busy', versions: ['1.0.0'] },
  ])
  const subscriptions = createMemorySubscriptionStore([
    { userId: 'alice', appId: 'app_weather', active: true },
    { userId: 'alice', appId: 'app_notes', active: true },
    { userId: 'alice', appId: 'app_other', active: true },
    { userId: 'alice', appId: 'app_busy', active: true },
    { userId: 'bob', appId: 'app_weather', active: false },
    { userId: 'carol', appId: 'app_notes', active: true },
  ])
  const store = createMemoryTokenStore()
  const errors: Fixture['errors'] = []
  const onError = (error: unknown, context: string) => errors.push({ error, context })
  const tokenService = createTokenService({ store, apps, subscriptions, now, onError })
  const mint = (userId: string, servers: string[], allowedIps: string[] | null = null) => {
    const secret = generateApiToken()
    store.insert({
      id: crypto.randomUUID(),
      userId,
      name: `${userId} token`,
      tokenHash: hashApiToken(secret),
      displayPrefix: displayPrefix(secret),
      servers,
      allowedIps,
      expiresAt: T0 + 30 * DAY,
      createdAt: T0,
      lastUsedAt: null,
      revokedAt: null,
    })
    return secret
  }
  const tokens: Record<TokenName, string> = {
    alice: mint('alice', ['app_weather', 'app_notes']),
    aliceOther: mint('alice', ['app_other']),
    aliceBusy: mint('alice', ['app_busy']),
    bob: mint('bob', ['app_weather']),
    carol: mint('carol', ['app_notes']),
    ipLimited: mint('alice', ['app_weather'], ['203.0.113.0/24']),
  }
  const policy = (_identity: Identity, app: AppRecord): RateLimitPolicy | undefined =>
    app.id === 'app_busy' ? { limit: 1, windowType: 'minute' } : undefined
  const dispatcherOptions: DispatcherOptions = {
    apps,
    subscriptions,
    tokens: tokenService,
    authorizationServers: ['https://auth.example.com'],
    allowedOrigins: [ALLOWED_ORIGIN],
    rateLimit: { policy },
    ...(options.sessions && { sessions: options.sessions }),
    now,
    onError,
  }
  return { dispatcher: createDispatcher(dispatcherOptions), dispatcherOptions, apps, tokens, errors, onError }
}

/**
 * Express apps served on 127.0.0.1 for one test file (`x-powered-by` off): `serve` starts one
 * and answers its port; `closeAll` (in `afterAll`) stops every server in `servers` (those it
 * started, and any a test adds).
 */
export function expressServers() {
  const servers: http.Server[] = []
  return {
    servers,
    async serve(app: express.Express): Promise<number> {
      app.disable('x-powered-by')
      const server = http.createServer(app)
      servers.push(server)
      return listen(server)
    },
    async closeAll(): Promise<void> {
      for (const server of servers.splice(0)) await close(server)
    },
  }
}

/** An HTTP answer reduced to what the tests compare. Header names lower case. */
export interface HttpRecord {
  status: number
  headers: Record<string, string>
  body: string
}

/** A request of the tests, independent of the adapter. */
export interface TestRequest {
  method?: string
  path?: string
  /** Default {@link HOST}. */
  host?: string
  headers?: Record<string, string>
  /** Text, or bytes (a coded body). */
  body?: string | Uint8Array
}

/** Sends a request to a loopback server with node:http, keeping the exact `Host`. */
export function rawRequest(port: number, request: TestRequest): Promise<HttpRecord> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { host: request.host ?? HOST, ...request.headers }
    if (request.body !== undefined) headers['content-length'] = String(Buffer.byteLength(request.body))
    const outgoing = http.request(
      { host: '127.0.0.1', port, method: request.method ?? 'POST', path: request.path ?? '/', headers, agent: false },
      (incoming) => {
        const chunks: Buffer[] = []
        incoming.on('data', (c: Buffer) => chunks.push(c))
        incoming.on('end', () => {
          const out: Record<string, string> = {}
          for (const [name, value] of Object.entries(incoming.headers)) {
            if (value !== undefined) out[name] = Array.isArray(value) ? value.join(', ') : value
          }
          resolve({ status: incoming.statusCode ?? 0, headers: out, body: Buffer.concat(chunks).toString('utf8') })
        })
        incoming.on('error', reject)
      },
    )
    outgoing.on('error', reject)
    outgoing.end(request.body)
  })
}

/**
 * `promise`, or a rejection naming `what` when it has not settled within `ms`; the timer is
 * cleared either way, so no timer of a test outlives it.
 */
export async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  try {
    return await Promise.race([promise, new Promise<never>((_resolve, reject) => (timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms)))])
  } finally {
    clearTimeout(timer)
  }
}

/** Reads a web `Response` into an {@link HttpRecord}. */
export async function recordResponse(response: Response): Promise<HttpRecord> {
  const headers: Record<string, string> = {}
  response.headers.forEach((value, name) => {
    headers[name] = value
  })
  return { status: response.status, headers, body: await response.text() }
}

/** `fetch` for loopback servers addressed by name (`http://weather.localhost:PORT/v1`); see `localhostFetch`. */
export const loopbackFetch = localhostFetch

/** Listens on 127.0.0.1, ephemeral port. */
export function listen(server: http.Server): Promise<number> {
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port)))
}

/** Closes a server and every connection it holds (SSE streams included). */
export function close(server: http.Server): Promise<void> {
  return new Promise((resolve) => {
    server.closeAllConnections()
    server.close(() => resolve())
  })
}

/** A gate a streaming handler waits on, opened by the test: proves a stream is not buffered. */
export interface Gate {
  wait(): Promise<void>
  open(): void
}

export function createGate(): Gate {
  let open!: () => void
  const opened = new Promise<void>((resolve) => (open = resolve))
  return { wait: () => opened, open: () => open() }
}

/** Reads from a byte stream until `text` has appeared; returns everything read so far. */
export async function readUntil(reader: ReadableStreamDefaultReader<Uint8Array>, text: string): Promise<string> {
  const decoder = new TextDecoder()
  let seen = ''
  while (!seen.includes(text)) {
    const { done, value } = await reader.read()
    if (done) throw new Error(`stream ended before ${JSON.stringify(text)}; got ${JSON.stringify(seen)}`)
    seen += decoder.decode(value, { stream: true })
  }
  return seen
}

/** The three adapters, the Express one on Express 5 (`express`) and Express 4 (`express4`). */
export type AdapterKind = 'web' | ExpressKind | 'fastify'
export const ADAPTER_KINDS: readonly AdapterKind[] = ['web', 'express', 'express4', 'fastify']

/** Whether `kind` is the Express adapter (on Express 5 or 4). */
export function isExpress(kind: AdapterKind): kind is ExpressKind {
  return kind === 'express' || kind === 'express4'
}

/** A server on 127.0.0.1 and how to stop it. */
export interface Served {
  port: number
  close(): Promise<void>
}

/**
 * The dispatch layer of `kind` on 127.0.0.1 in front of a web-standard handler (the proxy
 * handler, an SDK web transport): the Web adapter on `@hono/node-server` (with `outgoing`),
 * or `fromWebHandler` behind the Express (5 or 4) or Fastify adapter, request bodies left unread so they
 * stream. The adapters' failures go to `fixture.errors`. With `http2` (Web and Fastify only),
 * over h2c: `@hono/node-server` on `http2.createServer`, or `Fastify({ http2: true })`.
 */
export async function serveWebHandler(kind: AdapterKind, fixture: Fixture, handler: WebMcpHandler, options: { http2?: boolean } = {}): Promise<Served> {
  const { onError } = fixture
  if (kind === 'web') {
    const handle = webDispatch({ dispatcher: fixture.dispatcher, onError, handler })
    if (!options.http2) {
      const served = await serveFetch(handle)
      return { port: served.port, close: served.close }
    }
    const server = serve({
      fetch: (request, env: HttpBindings | Http2Bindings) => handle(request, { clientAddress: env.incoming.socket?.remoteAddress, outgoing: env.outgoing }),
      createServer: http2.createServer,
      port: 0,
      hostname: '127.0.0.1',
    }) as unknown as http2.Http2Server
    await new Promise<void>((resolve) => (server.listening ? resolve() : server.once('listening', () => resolve())))
    return { port: (server.address() as AddressInfo).port, close: () => new Promise<void>((resolve) => server.close(() => resolve())) }
  }
  if (options.http2 && kind !== 'fastify') throw new Error(`${kind} serves no HTTP/2`)
  if (isExpress(kind)) {
    const app = EXPRESS[kind]()
    app.use(expressDispatch({ dispatcher: fixture.dispatcher, onError }))
    app.use(expressFromWeb(handler))
    const server = http.createServer(app)
    return { port: await listen(server), close: () => close(server) }
  }
  const app = (options.http2 ? Fastify({ http2: true }) : Fastify({ forceCloseConnections: true })) as unknown as FastifyInstance
  await app.register(fastifyDispatch({ dispatcher: fixture.dispatcher, onError }))
  app.removeAllContentTypeParsers()
  app.addContentTypeParser('*', (_request, _payload, done) => done(null))
  app.all('/*', fastifyFromWeb(handler))
  await app.listen({ port: 0, host: '127.0.0.1' })
  return { port: (app.server.address() as AddressInfo).port, close: () => app.close() }
}

/** The Web adapter on a runtime without Node's response (`outgoing` not given): the body is relayed. */
export async function serveWebWithoutOutgoing(fixture: Fixture, handler: WebMcpHandler): Promise<Served> {
  const dispatch = webDispatch({ dispatcher: fixture.dispatcher, handler, onError: fixture.onError })
  const served = await serveFetch((request, info) => dispatch(request, { clientAddress: info.clientAddress }))
  return { port: served.port, close: served.close }
}

/**
 * The fixture with a dispatcher whose decisions wait for `release()` (asynchronous stores that
 * answer once the client has gone); `decided` resolves when the first decision is made.
 */
export function decidingOnRelease(fixture: Fixture) {
  let release!: () => void
  const released = new Promise<void>((resolve) => (release = resolve))
  let markDecided!: () => void
  const decided = new Promise<void>((resolve) => (markDecided = resolve))
  const dispatcher = {
    ...fixture.dispatcher,
    async decide(request: Parameters<Fixture['dispatcher']['decide']>[0]) {
      await released
      const decision = await fixture.dispatcher.decide(request)
      markDecided()
      return decision
    },
  }
  return { fixture: { ...fixture, dispatcher }, release, decided }
}

/**
 * Sends a GET stream request of `fixture.tokens.alice` to `port` and resets the connection 50 ms
 * later; resolves 100 ms after that, once the server has seen the reset.
 */
export async function requestThenReset(port: number, fixture: Fixture, path = '/v2'): Promise<void> {
  const socket = connect(port, '127.0.0.1')
  socket.on('error', () => {})
  socket.write(`GET ${path} HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\nAccept: text/event-stream\r\n\r\n`)
  await new Promise((resolve) => setTimeout(resolve, 50))
  socket.resetAndDestroy()
  await new Promise((resolve) => setTimeout(resolve, 100))
}

/**
 * A client that sends a request, waits until the server is inside a slow step before the
 * dispatch layer (`slow`: await it in that step), then resets its connection; `gone()`
 * resolves when the server has seen the reset, and releases the slow step. `decisions` counts
 * the dispatcher's decisions.
 */
export function goneClientProbe(fixture: Fixture) {
  let decisions = 0
  const dispatcher = {
    ...fixture.dispatcher,
    decide(request: Parameters<Fixture['dispatcher']['decide']>[0]) {
      decisions++
      return fixture.dispatcher.decide(request)
    },
  }
  let reached!: () => void
  const inSlowStep = new Promise<void>((resolve) => (reached = resolve))
  let release!: () => void
  const released = new Promise<void>((resolve) => (release = resolve))
  return {
    dispatcher,
    decisions: () => decisions,
    /** The platform's slow step before the dispatch layer (a session or tenant lookup). */
    async slow() {
      reached()
      await released
    },
    /** Sends, resets once the server is in the slow step, waits for the server to see it, then releases. */
    async gone(server: NetServer, port: number) {
      const socket = connect(port, '127.0.0.1')
      socket.on('error', () => {})
      socket.write('POST /v1 HTTP/1.1\r\nHost: weather.localhost\r\nAuthorization: Bearer made-up\r\nContent-Length: 0\r\n\r\n')
      await inSlowStep
      socket.resetAndDestroy()
      const connections = () => new Promise<number>((resolve) => server.getConnections((_e, n) => resolve(n)))
      while ((await connections()) > 0) await new Promise((resolve) => setTimeout(resolve, 5))
      release()
      await new Promise((resolve) => setTimeout(resolve, 20))
    },
  }
}

/** An HTTP/2 answer, its body as text. */
export interface H2Answer {
  status: number
  headers: http2.IncomingHttpHeaders
  body: string
}

/** One request on its own h2c session to 127.0.0.1 (`headers` may hold `:authority`, `host`, …). */
export function askH2(port: number, headers: http2.OutgoingHttpHeaders, body?: string): Promise<H2Answer> {
  return new Promise((resolve, reject) => {
    const session = http2.connect(`http://127.0.0.1:${port}`)
    session.on('error', reject)
    const stream = session.request({ ':method': body === undefined ? 'GET' : 'POST', ...headers })
    let received = ''
    let head: http2.IncomingHttpHeaders = {}
    stream.setEncoding('utf8')
    stream.on('response', (h) => (head = h))
    stream.on('data', (chunk: string) => (received += chunk))
    stream.on('error', (error) => {
      session.close()
      reject(error)
    })
    stream.on('end', () => {
      session.close()
      resolve({ status: Number(head[':status']), headers: head, body: received })
    })
    stream.end(body)
  })
}

/**
 * The smallest platform on real time: one App (weather, 1.0.0), alice subscribed to it with an
 * API token of hers (`token`), memory stores (sessions too, unless `extra` names others), every
 * failure recorded in `errors`.
 */
export async function aliceOnWeather(extra: Partial<DispatcherOptions> = {}) {
  const apps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
  const errors: Array<{ error: unknown; context: string }> = []
  const onError = (error: unknown, context: string) => void errors.push({ error, context })
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions, onError })
  const created = await tokens.create({ userId: 'alice', name: 'laptop', servers: ['app_weather'], expiresInDays: 7 })
  const dispatcher = createDispatcher({ apps, subscriptions, tokens, sessions: createMemorySessionStore(), onError, ...extra })
  return { dispatcher, tokens, created, token: created.token, errors, onError }
}

/** The proxy to `origin`'s `/mcp`, the platform's identity signed with a key made for it. */
export async function signedProxy(origin: string, onError: (error: unknown, context: string) => void, timeoutMs?: number): Promise<WebMcpHandler> {
  const { privateKey } = await generateKeyPair('ES256', { extractable: true })
  const identity = createIdentitySigner({ issuer: 'https://platform.test', privateKey })
  return createProxyHandler({ upstream: () => `${origin}/mcp`, identity, onError, ...(timeoutMs !== undefined && { timeoutMs }) })
}
