/**
 * What the robustness tests share: a dispatch fixture on in-memory stores with a fixed clock
 * and tokens in every state, stores whose faults can be switched on per call, the three
 * adapters served over loopback around one probe handler (whichever adapters the source tree
 * has: a new one is picked up by `bench/adapters.ts`), a raw HTTP client, and the checks for
 * leaked handles and leaked secrets.
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { setFlagsFromString } from 'node:v8'
import { runInNewContext } from 'node:vm'
import type express from 'express'
import Fastify from 'fastify'
import { type JWTPayload, SignJWT, exportJWK, generateKeyPair } from 'jose'
import {
  type AccessTokenValidator,
  type AppStore,
  type Dispatcher,
  type DispatcherOptions,
  type RateLimitStore,
  type SessionStore,
  type SubscriptionStore,
  type TokenService,
  type TokenStore,
  type TrustProxy,
  createDispatcher,
  createMemoryAppStore,
  createMemoryRateLimitStore,
  createMemorySessionStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { type RedisStoreOptions, createRedisRateLimitStore, createRedisSessionStore } from 'mcp-dispatch/redis'
import { mcpDispatch as webDispatch, routeByVersion as webRoutes } from 'mcp-dispatch/web'
import { loadAdapters } from '../../bench/adapters.js'
import { EXPRESS, EXPRESS_KINDS, type ExpressKind } from '../helpers/express.js'
import { serveFetch } from '../helpers/platform.js'

/** 2030-01-01T00:00:30Z. */
export const T0 = Date.UTC(2030, 0, 1, 0, 0, 30)
const DAY = 86_400_000

export const APP = { id: 'app_fuzz', slug: 'fuzz', name: 'Fuzz' } as const
export const OTHER_APP = { id: 'app_other', slug: 'other', name: 'Other' } as const
/** Deployed in this order; live afterwards: 1.0.0, 1.1.0, 1.2.3, 2.0.0, 2.1.0-rc.1. */
export const DEPLOYS = ['1.0.0', '1.1.0', '1.2.0', '1.2.3', '2.0.0', '2.1.0-rc.1'] as const
export const LIVE = ['1.0.0', '1.1.0', '1.2.3', '2.0.0', '2.1.0-rc.1'] as const
export const LATEST = '2.0.0'
export const HOSTNAME = `${APP.slug}.localhost`

/** Tokens in every state the pipeline distinguishes. */
export interface FixtureTokens {
  /** alice, scoped to the fuzz App, no allowlist. */
  valid: string
  /** alice, revoked. */
  revoked: string
  /** alice: the secret before a rotation (no longer works). */
  rotatedOld: string
  /** alice: the secret after that rotation. */
  rotated: string
  /** alice, 7 days, created 8 days before T0. */
  expired: string
  /** alice, scoped to the other App only (403 on the fuzz App). */
  otherApp: string
  /** bob: valid token, no active subscription (402). */
  unsubscribed: string
  /** alice, allowlist 203.0.113.0/24 (TEST-NET-3). */
  testNetOnly: string
  /** alice, allowlist 127.0.0.1 and ::1. */
  loopbackOnly: string
}

/** The stores the dispatcher reads, by name, as the fault switch names them. */
export type StoreName = 'apps' | 'subscriptions' | 'tokens' | 'sessions' | 'rateLimit'

/** How a faulty store answers. */
export type Fault = 'ok' | 'throw' | 'reject' | 'hang'

/** Per-store fault modes, switchable between requests. */
export interface FaultSwitch {
  readonly modes: Record<StoreName, Fault>
  /** Promises of hung calls, released by {@link FaultSwitch.release}. */
  readonly hung: number
  /** Lets every hung call answer (as the healthy store would). */
  release(): void
}

export interface FixtureOptions {
  /** Extra dispatcher options (oauth, storeTimeoutMs, rateLimit.failOpen, …). */
  dispatcher?: Partial<DispatcherOptions>
  /** Rate limit per minute on the fuzz App (default: none that a test reaches). */
  limitPerMinute?: number
  oauth?: AccessTokenValidator
  /** Give the dispatcher stores behind a fault switch. */
  faults?: boolean
  /**
   * Give the dispatcher and the token service no `onError`, so their reports go to the
   * library's default logger (`logError`, stderr) instead of `errors`.
   */
  defaultLogger?: boolean
}

export interface Fixture {
  readonly dispatcher: Dispatcher
  readonly tokenService: TokenService
  readonly tokens: FixtureTokens
  /** Everything handed to `onError` (dispatcher, token service and adapters). */
  readonly errors: Array<{ error: unknown; context: string }>
  readonly faults: FaultSwitch
  readonly onError: (error: unknown, context: string) => void
  close(): Promise<void>
}

function faulty<T extends object>(name: StoreName, store: T, faults: { modes: Record<StoreName, Fault>; waiting: Array<() => void> }): T {
  const wrapped: Record<string, unknown> = {}
  for (const key of Object.keys(store)) {
    const value = (store as Record<string, unknown>)[key]
    if (typeof value !== 'function') continue
    wrapped[key] = (...args: unknown[]) => {
      const call = () => (value as (...a: unknown[]) => unknown).apply(store, args)
      switch (faults.modes[name]) {
        case 'throw':
          throw new Error(`${name} store is down (injected)`)
        case 'reject':
          return Promise.reject(new Error(`${name} store is down (injected)`))
        case 'hang':
          return new Promise((resolve) => faults.waiting.push(() => resolve(call())))
        default:
          return call()
      }
    }
  }
  return wrapped as T
}

/** The dispatch fixture of the robustness tests. */
export async function createFixture(options: FixtureOptions = {}): Promise<Fixture> {
  let clock = T0 - 8 * DAY
  const now = () => clock
  const errors: Fixture['errors'] = []
  const onError = (error: unknown, context: string) => {
    errors.push({ error, context })
  }
  const apps = createMemoryAppStore([
    { ...APP, versions: DEPLOYS },
    { ...OTHER_APP, versions: ['1.0.0'] },
  ])
  const subscriptions = createMemorySubscriptionStore([
    { userId: 'alice', appId: APP.id, active: true },
    { userId: 'alice', appId: OTHER_APP.id, active: true },
    { userId: 'bob', appId: APP.id, active: false },
  ])
  const tokenStore = createMemoryTokenStore()
  const sessions = createMemorySessionStore({ now })
  const counters = createMemoryRateLimitStore()

  // Tokens are made through the public token service on the healthy stores.
  const setup = createTokenService({
    store: tokenStore,
    apps,
    canUseServer: () => true,
    now,
  })
  const create = async (userId: string, servers: string[], expiresInDays: 7 | 30 | 90, allowedIps?: string[]) =>
    (await setup.create({ userId, name: `t${Math.random()}`, servers, expiresInDays, ...(allowedIps && { allowedIps }) })).token
  const expired = await create('alice', [APP.id], 7)
  clock = T0
  const valid = await create('alice', [APP.id], 30)
  const revokedSecret = await setup.create({ userId: 'alice', name: 'revoked', servers: [APP.id], expiresInDays: 30 })
  await setup.revoke('alice', revokedSecret.id)
  const toRotate = await setup.create({ userId: 'alice', name: 'rotated', servers: [APP.id], expiresInDays: 30 })
  const rotated = (await setup.rotate(toRotate.id, { kind: 'session', userId: 'alice' })).token
  const tokens: FixtureTokens = {
    valid,
    revoked: revokedSecret.token,
    rotatedOld: toRotate.token,
    rotated,
    expired,
    otherApp: await create('alice', [OTHER_APP.id], 30),
    unsubscribed: await create('bob', [APP.id], 90),
    testNetOnly: await create('alice', [APP.id], 30, ['203.0.113.0/24']),
    loopbackOnly: await create('alice', [APP.id], 30, ['127.0.0.1', '::1']),
  }
  await setup.close()

  const switchState = {
    modes: { apps: 'ok', subscriptions: 'ok', tokens: 'ok', sessions: 'ok', rateLimit: 'ok' } as Record<StoreName, Fault>,
    waiting: [] as Array<() => void>,
  }
  const wrap = <T extends object>(name: StoreName, store: T): T => (options.faults ? faulty(name, store, switchState) : store)
  const tokenService = createTokenService({
    store: wrap<TokenStore>('tokens', tokenStore),
    apps,
    subscriptions,
    now,
    ...(!options.defaultLogger && { onError }),
  })
  const limit = options.limitPerMinute
  const dispatcher = createDispatcher({
    apps: wrap<AppStore>('apps', apps),
    subscriptions: wrap<SubscriptionStore>('subscriptions', subscriptions),
    tokens: tokenService,
    sessions: wrap<SessionStore>('sessions', sessions),
    rateLimit: {
      store: wrap<RateLimitStore>('rateLimit', counters),
      policy: () => ({ limit: limit ?? 1_000_000_000, windowType: 'minute' }),
    },
    // The validator's issuer when there is one (the dispatcher tells a metadata naming another).
    authorizationServers: [options.oauth?.issuer ?? 'https://auth.example.com'],
    ...(options.oauth && { oauth: options.oauth }),
    now,
    ...(!options.defaultLogger && { onError }),
    ...options.dispatcher,
  })
  return {
    dispatcher,
    tokenService,
    tokens,
    errors,
    onError,
    faults: {
      modes: switchState.modes,
      get hung() {
        return switchState.waiting.length
      },
      release() {
        for (const resume of switchState.waiting.splice(0)) resume()
      },
    },
    close: () => tokenService.close(),
  }
}

// ---------------------------------------------------------------------------------------
// The probe handler, per framework. It reads the whole body (so bodies of every size go
// through), answers JSON marked `x-robustness-handler: 1`, throws when asked
// (`x-robustness-throw`), and streams SSE until the client goes away when asked
// (`x-robustness-sse`; in a new session, `x-robustness-session`: its id), counting open streams.
// ---------------------------------------------------------------------------------------

/** What the probe handler saw. */
export interface ProbeState {
  handled: number
  streamsOpen: number
  streamsClosed: number
}

export const HANDLER_MARK = 'x-robustness-handler'
const SSE_EVERY_MS = 5
const encoder = new TextEncoder()

function probeJson(version: string, bytes: number): string {
  return JSON.stringify({ jsonrpc: '2.0', id: 1, result: { handled: true, version, bytes } })
}

function webProbe(state: ProbeState) {
  return async (request: Request, context: { version: string }): Promise<Response> => {
    if (request.headers.get('x-robustness-throw')) throw new Error('probe handler failed (injected)')
    if (request.headers.get('x-robustness-sse')) {
      let timer: ReturnType<typeof setInterval> | undefined
      state.streamsOpen++
      const stream = new ReadableStream<Uint8Array>({
        start(controller) {
          let n = 0
          controller.enqueue(encoder.encode(`data: ${n++}\n\n`))
          timer = setInterval(() => controller.enqueue(encoder.encode(`data: ${n++}\n\n`)), SSE_EVERY_MS)
        },
        cancel() {
          clearInterval(timer)
          state.streamsOpen--
          state.streamsClosed++
        },
      })
      const session = request.headers.get('x-robustness-session')
      return new Response(stream, { headers: { 'content-type': 'text/event-stream', [HANDLER_MARK]: '1', ...(session && { 'mcp-session-id': session }) } })
    }
    const bytes = (await request.arrayBuffer()).byteLength
    state.handled++
    return new Response(probeJson(context.version, bytes), {
      headers: { 'content-type': 'application/json', [HANDLER_MARK]: '1' },
    })
  }
}

async function readBody(req: http.IncomingMessage): Promise<number> {
  let bytes = 0
  for await (const chunk of req) bytes += (chunk as Buffer).length
  return bytes
}

/** Streams SSE on a raw response until the client goes away; in a new session when `session` names one. */
function nodeSse(res: http.ServerResponse, state: ProbeState, session: string | string[] | undefined): void {
  state.streamsOpen++
  res.writeHead(200, { 'content-type': 'text/event-stream', [HANDLER_MARK]: '1', ...(typeof session === 'string' && { 'mcp-session-id': session }) })
  let n = 0
  res.write(`data: ${n++}\n\n`)
  const timer = setInterval(() => res.write(`data: ${n++}\n\n`), SSE_EVERY_MS)
  res.once('close', () => {
    clearInterval(timer)
    state.streamsOpen--
    state.streamsClosed++
  })
}

function expressProbe(state: ProbeState) {
  return async (req: express.Request, res: express.Response) => {
    if (req.headers['x-robustness-throw']) throw new Error('probe handler failed (injected)')
    if (req.headers['x-robustness-sse']) return nodeSse(res, state, req.headers['x-robustness-session'])
    const bytes = await readBody(req)
    state.handled++
    res.writeHead(200, { 'content-type': 'application/json', [HANDLER_MARK]: '1' })
    res.end(probeJson((req as { dispatchContext?: { version: string } }).dispatchContext!.version, bytes))
  }
}

function fastifyProbe(state: ProbeState) {
  return async (request: import('fastify').FastifyRequest, reply: import('fastify').FastifyReply) => {
    if (request.headers['x-robustness-throw']) throw new Error('probe handler failed (injected)')
    if (request.headers['x-robustness-sse']) {
      // As the MCP SDK's transport does: the handler takes over the raw response.
      reply.hijack()
      return nodeSse(reply.raw, state, request.headers['x-robustness-session'])
    }
    const bytes = await readBody(request.raw)
    state.handled++
    const version = (request as { dispatchContext?: { version: string } }).dispatchContext!.version
    return reply.code(200).headers({ 'content-type': 'application/json', [HANDLER_MARK]: '1' }).send(probeJson(version, bytes))
  }
}

/** A running adapter around the probe handler. */
export interface RunningTarget {
  readonly name: string
  readonly port: number
  readonly state: ProbeState
  /** Open connections on the server (sockets not yet closed). */
  connections(): Promise<number>
  close(): Promise<void>
}

export interface TargetOptions {
  dispatcher: Dispatcher
  /** The adapter's `onError`; `undefined`: the library's default logger. */
  onError: ((error: unknown, context: string) => void) | undefined
  trustProxy?: TrustProxy
  /** Turn on the framework's own proxy trust (Express `trust proxy`, Fastify `trustProxy`). */
  frameworkTrustsProxy?: boolean
  /**
   * Hand Node's `checkContinue` event to the adapter, as docs/adapters.md ("Expect:
   * 100-continue") wires it: `100 Continue` comes from the adapter, once a request is let through.
   */
  checkContinue?: boolean
}

/** `checkContinue` handed to the server's own request handler (docs/adapters.md). */
function handCheckContinue(server: http.Server): void {
  server.on('checkContinue', (req: http.IncomingMessage, res: http.ServerResponse) => server.emit('request', req, res))
}

/** An adapter the tests can serve. */
export interface AdapterTarget {
  readonly name: 'web' | ExpressKind | 'fastify'
  start(options: TargetOptions): Promise<RunningTarget>
  /**
   * Names an answer the framework itself gives before or around the adapter (a 4xx the
   * adapter cannot see or shape) to `request`, or `undefined` for any other answer.
   */
  frameworkAnswer?(response: RawResponse, request: RawRequest): string | undefined
}

/**
 * Express routes nothing, no middleware at all, for a request target its URL parser gives no
 * path for (`//G@#`: an authority without a path); its final handler answers an HTML 404.
 * Only such a target: the same page for another would be a request the middleware let by
 * without a decision.
 */
function expressAnswer(response: RawResponse, request: RawRequest): string | undefined {
  if (!request.path.startsWith('//')) return undefined
  const html = String(response.headers['content-type']).startsWith('text/html')
  return response.status === 404 && html && response.body.includes('<pre>Cannot ') ? 'express-final-handler-404' : undefined
}

/**
 * Fastify answers a `Content-Type` it cannot parse itself (415 `FST_ERR_CTP_INVALID_MEDIA_TYPE`,
 * after `onRequest`: so that answer carries the version headers), with its own body, not
 * JSON-RPC. A URL with a bad percent-escape (`FST_ERR_BAD_URL`, before any hook) is answered by
 * the adapter's `frameworkErrors`, which the target passes to Fastify, as a JSON-RPC 404.
 */
const FASTIFY_OWN_ANSWERS: Record<string, number> = { FST_ERR_CTP_INVALID_MEDIA_TYPE: 415 }
function fastifyAnswer(response: RawResponse): string | undefined {
  try {
    const code = (JSON.parse(response.body.toString()) as { code?: unknown }).code
    return typeof code === 'string' && FASTIFY_OWN_ANSWERS[code] === response.status ? code : undefined
  } catch {
    return undefined
  }
}

function countConnections(server: http.Server): () => Promise<number> {
  return () => new Promise((resolve, reject) => server.getConnections((error, n) => (error ? reject(error) : resolve(n))))
}

function closeServer(server: http.Server): Promise<void> {
  server.closeAllConnections()
  return new Promise((resolve, reject) => server.close((error) => (error ? reject(error) : resolve())))
}

function listening(server: http.Server): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => resolve((server.address() as AddressInfo).port))
  })
}

const webTarget: AdapterTarget = {
  name: 'web',
  async start({ dispatcher, onError, trustProxy, checkContinue }) {
    const state: ProbeState = { handled: 0, streamsOpen: 0, streamsClosed: 0 }
    const handle = webDispatch({
      dispatcher,
      onError,
      ...(trustProxy !== undefined && { trustProxy }),
      handler: webRoutes(() => webProbe(state)),
    })
    const { port, server } = await serveFetch(handle)
    if (checkContinue) handCheckContinue(server)
    return { name: 'web', port, state, connections: countConnections(server), close: () => closeServer(server) }
  },
}

/** The adapters of the source tree: Web always, Express (on Express 5 and 4) and Fastify when they exist. */
export async function adapterTargets(): Promise<AdapterTarget[]> {
  const { express: expressAdapter, fastify: fastifyAdapter } = await loadAdapters()
  const targets: AdapterTarget[] = [webTarget]
  if (expressAdapter?.routeByVersion) {
    const routeByVersion = expressAdapter.routeByVersion
    // On Express 5 (`express`) and Express 4 (`express4`).
    for (const name of EXPRESS_KINDS) {
      targets.push({
        name,
        frameworkAnswer: expressAnswer,
        async start({ dispatcher, onError, trustProxy, frameworkTrustsProxy, checkContinue }) {
          const state: ProbeState = { handled: 0, streamsOpen: 0, streamsClosed: 0 }
          const app = EXPRESS[name]()
          app.disable('x-powered-by')
          if (frameworkTrustsProxy) app.set('trust proxy', true)
          app.use(expressAdapter.mcpDispatch({ dispatcher, onError, ...(trustProxy !== undefined && { trustProxy }) }))
          app.use(routeByVersion(() => expressProbe(state)))
          const server = http.createServer(app)
          if (checkContinue) handCheckContinue(server)
          const port = await listening(server)
          return { name, port, state, connections: countConnections(server), close: () => closeServer(server) }
        },
      })
    }
  }
  if (fastifyAdapter?.routeByVersion) {
    const routeByVersion = fastifyAdapter.routeByVersion
    targets.push({
      name: 'fastify',
      frameworkAnswer: fastifyAnswer,
      async start({ dispatcher, onError, trustProxy, frameworkTrustsProxy, checkContinue }) {
        const state: ProbeState = { handled: 0, streamsOpen: 0, streamsClosed: 0 }
        const app = Fastify({ logger: false, trustProxy: frameworkTrustsProxy === true, frameworkErrors: fastifyAdapter.frameworkErrors })
        await app.register(fastifyAdapter.mcpDispatch({ dispatcher, onError, ...(trustProxy !== undefined && { trustProxy }) }))
        // The body reaches the handler unread, as the MCP SDK's transport wants it.
        app.removeAllContentTypeParsers()
        app.addContentTypeParser('*', (_request, _payload, done) => done(null))
        app.all('/*', routeByVersion(() => fastifyProbe(state)))
        if (checkContinue) handCheckContinue(app.server)
        await app.listen({ port: 0, host: '127.0.0.1' })
        const port = (app.server.address() as AddressInfo).port
        return {
          name: 'fastify',
          port,
          state,
          connections: countConnections(app.server),
          close: async () => {
            app.server.closeAllConnections()
            await app.close()
          },
        }
      },
    })
  }
  return targets
}

// ---------------------------------------------------------------------------------------
// An authorization server on loopback, for `createOAuthValidator`'s `jwt` mode.
// ---------------------------------------------------------------------------------------

/** The key id of the server's one published key. */
const SIGNING_KID = 'robustness-1'

/**
 * An authorization server on 127.0.0.1 that publishes its discovery documents (RFC 8414, OpenID)
 * and a JWKS of one ES256 key, and signs access tokens (RFC 9068) with it: the validator fetches
 * the keys over HTTP and verifies real signatures, as it would against a provider.
 */
export interface AuthorizationServer {
  /** `http://127.0.0.1:{port}`. */
  readonly issuer: string
  readonly jwksUri: string
  /**
   * A JWT of `claims` (`iss` is the issuer unless given), typed `at+jwt` unless `typ` is given,
   * signed with the published key, or with `foreignKey` one the JWKS does not hold (under the
   * published key id, or `kid`).
   */
  sign(claims: JWTPayload, options?: { typ?: string; foreignKey?: boolean; kid?: string }): Promise<string>
  close(): Promise<void>
}

export async function startAuthorizationServer(): Promise<AuthorizationServer> {
  const own = await generateKeyPair('ES256')
  const foreign = await generateKeyPair('ES256')
  const jwks = JSON.stringify({ keys: [{ ...(await exportJWK(own.publicKey)), kid: SIGNING_KID, alg: 'ES256', use: 'sig' }] })
  let issuer = ''
  const server = http.createServer((req, res) => {
    const path = (req.url ?? '').split('?', 1)[0]
    const discovery = path === '/.well-known/oauth-authorization-server' || path === '/.well-known/openid-configuration'
    const body = path === '/jwks' ? jwks : discovery ? JSON.stringify({ issuer, jwks_uri: `${issuer}/jwks`, response_types_supported: ['code'] }) : undefined
    // `Connection: close`: no keep-alive socket of the validator's fetch outlives a test file.
    res.writeHead(body === undefined ? 404 : 200, { 'content-type': 'application/json', connection: 'close' })
    res.end(body ?? '{}')
  })
  issuer = `http://127.0.0.1:${await listening(server)}`
  return {
    issuer,
    jwksUri: `${issuer}/jwks`,
    sign: (claims, options = {}) =>
      new SignJWT({ iss: issuer, ...claims })
        .setProtectedHeader({ alg: 'ES256', typ: options.typ ?? 'at+jwt', kid: options.kid ?? SIGNING_KID })
        .sign(options.foreignKey ? foreign.privateKey : own.privateKey),
    close: () => closeServer(server),
  }
}

// ---------------------------------------------------------------------------------------
// A raw HTTP client: any method, any header set, a per-request deadline.
// ---------------------------------------------------------------------------------------

export interface RawRequest {
  method: string
  path: string
  headers: Array<[string, string]> | Record<string, string>
  body?: Uint8Array | string | null
}

export interface RawResponse {
  status: number
  headers: http.IncomingHttpHeaders
  body: Buffer
}

/** Sends one request; rejects after `timeoutMs` (a hang) or on a connection error. */
export function send(port: number, request: RawRequest, agent?: http.Agent, timeoutMs = 10_000): Promise<RawResponse> {
  const body = typeof request.body === 'string' ? Buffer.from(request.body, 'latin1') : (request.body ?? undefined)
  let headers = Array.isArray(request.headers) ? request.headers.flat() : { ...request.headers }
  // Raw header arrays get no framing from Node: without a length, a GET or DELETE body would
  // run into the next request on the connection.
  if (body !== undefined) {
    if (Array.isArray(headers)) headers = [...headers, 'content-length', String(body.byteLength)]
    else headers['content-length'] = String(body.byteLength)
  }
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: '127.0.0.1',
        port,
        method: request.method,
        path: request.path,
        agent: agent ?? false,
        setHost: false,
        headers,
      },
      (res) => {
        const chunks: Buffer[] = []
        res.on('data', (chunk: Buffer) => chunks.push(chunk))
        res.on('end', () => {
          clearTimeout(timer)
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) })
        })
        res.on('error', (error) => {
          clearTimeout(timer)
          reject(error)
        })
      },
    )
    const timer = setTimeout(() => {
      req.destroy(new Error(`no complete answer within ${timeoutMs} ms (hang): ${request.method} ${request.path.slice(0, 80)}`))
    }, timeoutMs)
    req.on('error', (error) => {
      clearTimeout(timer)
      reject(error)
    })
    req.end(body)
  })
}

/** Standard headers of a well-formed MCP request to the fuzz App. */
export function mcpHeaders(port: number, token: string | undefined, extra: Record<string, string> = {}): Record<string, string> {
  return {
    host: `${HOSTNAME}:${port}`,
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
    ...(token !== undefined && { authorization: `Bearer ${token}` }),
    ...extra,
  }
}

export const TOOLS_LIST = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })

/** A JSON-RPC 2.0 error body with `id: null`, or `undefined` when `body` is not one. */
export function jsonRpcError(body: Buffer | string): { code: number; message: string; data?: Record<string, unknown> } | undefined {
  try {
    const parsed = JSON.parse(body.toString()) as { jsonrpc?: unknown; id?: unknown; error?: { code?: unknown; message?: unknown } }
    if (parsed.jsonrpc !== '2.0' || parsed.id !== null || !parsed.error) return undefined
    if (!Number.isInteger(parsed.error.code) || typeof parsed.error.message !== 'string') return undefined
    return parsed.error as { code: number; message: string; data?: Record<string, unknown> }
  } catch {
    return undefined
  }
}

// ---------------------------------------------------------------------------------------
// Leaks: handles and memory.
// ---------------------------------------------------------------------------------------

/** Counts of active handles by type (`TCPSocketWrap`, `Timeout`, …), as Node reports them. */
export function activeResources(): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const type of process.getActiveResourcesInfo()) counts[type] = (counts[type] ?? 0) + 1
  return counts
}

const HANDLE_TYPES = ['TCPSocketWrap', 'TCPServerWrap', 'Timeout'] as const

/**
 * Sockets, servers and timers beyond `baseline` (`{}` when none), after letting the event loop
 * finish closing what was closed.
 */
export async function leakedHandles(baseline: Record<string, number>): Promise<Record<string, [number, number]>> {
  const within = () => HANDLE_TYPES.every((type) => (activeResources()[type] ?? 0) <= (baseline[type] ?? 0))
  if (await settles(within)) return {}
  const now = activeResources()
  return Object.fromEntries(
    HANDLE_TYPES.filter((t) => (now[t] ?? 0) > (baseline[t] ?? 0)).map((t) => [t, [baseline[t] ?? 0, now[t] ?? 0]]),
  )
}

/**
 * Waits (event-loop turns, never a fixed sleep) until `check` holds, up to `turns` turns of
 * `setImmediate` interleaved with short timers; returns whether it held. Closing sockets and
 * clearing timers take a few loop turns after the last request.
 */
export async function settles(check: () => boolean | Promise<boolean>, turns = 200): Promise<boolean> {
  for (let i = 0; i < turns; i++) {
    if (await check()) return true
    await new Promise((resolve) => setTimeout(resolve, i < 20 ? 0 : 10))
  }
  return check()
}

let collect: (() => void) | undefined
/** A full GC when the runtime allows turning `--expose-gc` on at run time. */
export function collectGarbage(): boolean {
  if (!collect) {
    try {
      setFlagsFromString('--expose-gc')
      collect = runInNewContext('gc') as () => void
    } catch {
      return false
    }
  }
  collect()
  return true
}

// ---------------------------------------------------------------------------------------
// Secrets.
// ---------------------------------------------------------------------------------------

/** An API token (`svc_` + base62) anywhere in a text. */
export const API_TOKEN_PATTERN = /svc_[0-9A-Za-z]{6,}/

/** Every string reachable from a value: messages, stacks, causes, properties (depth-limited). */
export function textsOf(value: unknown, depth = 0, seen = new Set<unknown>()): string[] {
  if (value === null || value === undefined || depth > 6) return []
  if (typeof value === 'string') return [value]
  if (typeof value !== 'object' && typeof value !== 'function') return [String(value)]
  if (seen.has(value)) return []
  seen.add(value)
  const out: string[] = []
  if (value instanceof Error) {
    out.push(value.message, value.stack ?? '', String(value))
    if (value.cause !== undefined) out.push(...textsOf(value.cause, depth + 1, seen))
  }
  for (const key of Object.getOwnPropertyNames(value)) {
    let inner: unknown
    try {
      inner = (value as Record<string, unknown>)[key]
    } catch {
      continue
    }
    if (typeof inner !== 'function') out.push(...textsOf(inner, depth + 1, seen))
  }
  return out
}

/**
 * The Web adapter over the fixture's in-memory stores, with the given session and counter stores
 * (the Redis tests' stores under test). Its handler opens a session when asked
 * (`x-open-session`), as an MCP server answering `initialize` does; `send` posts `tools/list`
 * with the fixture's valid token and reads the answer whole.
 */
export async function createStorePipeline(sessions: SessionStore, counters: RateLimitStore) {
  const fixture = await createFixture({
    dispatcher: { sessions, rateLimit: { store: counters, policy: () => ({ limit: 1_000, windowType: 'minute' }) } },
  })
  const handle = webDispatch({
    dispatcher: fixture.dispatcher,
    onError: fixture.onError,
    handler: async (request) =>
      new Response('{"jsonrpc":"2.0","id":1,"result":{}}', {
        headers: {
          'content-type': 'application/json',
          ...(request.headers.get('x-open-session') && { 'mcp-session-id': request.headers.get('x-open-session')! }),
        },
      }),
  })
  const send = async (headers: Record<string, string> = {}) => {
    const started = performance.now()
    const response = await handle(
      new Request(`http://${HOSTNAME}/v1`, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
          authorization: `Bearer ${fixture.tokens.valid}`,
          ...headers,
        },
        body: TOOLS_LIST,
      }),
      { clientAddress: '127.0.0.1' },
    )
    const body = await response.text()
    return { response, body, status: response.status, ratelimit: response.headers.get('ratelimit'), ms: performance.now() - started }
  }
  /** What `onError` got since the last call, as `[context, message]`. */
  const reported = () => fixture.errors.splice(0).map((e) => [e.context, (e.error as Error).message])
  return { fixture, send, reported }
}

/**
 * {@link createStorePipeline} with the Redis stores: its session pins through `sessions`' client
 * and prefix, its rate-limit counters through `counters`' (the same unless given: on a Redis
 * Cluster, another prefix puts them on another master).
 */
export function createRedisStorePipeline(sessions: RedisStoreOptions, counters: RedisStoreOptions = sessions) {
  return createStorePipeline(createRedisSessionStore(sessions), createRedisRateLimitStore(counters))
}
