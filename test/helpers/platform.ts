/**
 * Shared pieces of the end-to-end tests that drive the reference platform: a seed, an
 * injectable clock, request builders, the exact error bodies of spec section 7, and a way to
 * serve the platform over real HTTP on 127.0.0.1 for the MCP SDK client.
 */
import * as http from 'node:http'
import type { AddressInfo, LookupFunction } from 'node:net'
import { Readable } from 'node:stream'
import { serve } from '@hono/node-server'
import { CONFORMANCE_TOOLS } from '../../examples/platform/conformance-features.js'
import { MODERN_CONFORMANCE_TOOLS } from '../../examples/platform/conformance-features-modern.js'
import { type Platform, type PlatformOptions, type PlatformSeed, createPlatform } from '../../examples/platform/index.js'

/** Start of the injected clock: 2030-01-01T00:00:30Z, half-way through a minute window. */
export const T0 = Date.UTC(2030, 0, 1, 0, 0, 30)
export const MINUTE = 60_000
export const DAY = 86_400_000

/** A clock the tests move by hand (no sleeps). */
export interface TestClock {
  now: () => number
  advance(ms: number): void
}

export function createClock(start = T0): TestClock {
  let at = start
  return {
    now: () => at,
    advance(ms) {
      at += ms
    },
  }
}

/**
 * The seed of the end-to-end tests. Users: alice (subscribed to weather, notes, limited),
 * bob (inactive subscription to weather), carol (subscribed to weather), dave (no
 * subscriptions at all).
 */
export function testSeed(): PlatformSeed {
  return {
    apps: [
      { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0', '1.1.1', '2.0.0'] },
      { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['0.9.0', '1.0.0'] },
      { id: 'app_limited', slug: 'limited', name: 'Limited', versions: ['1.0.0'], rateLimitPerMinute: 3 },
    ],
    users: [{ id: 'user_alice' }, { id: 'user_bob' }, { id: 'user_carol' }, { id: 'user_dave' }],
    subscriptions: [
      { userId: 'user_alice', appId: 'app_weather', active: true },
      { userId: 'user_alice', appId: 'app_notes', active: true },
      { userId: 'user_alice', appId: 'app_limited', active: true },
      { userId: 'user_bob', appId: 'app_weather', active: false },
      { userId: 'user_carol', appId: 'app_weather', active: true },
    ],
    tokens: [
      { name: 'alice', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 30 },
      { name: 'alice-week', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 7 },
      { name: 'alice-notes', userId: 'user_alice', servers: ['app_notes'], expiresInDays: 7 },
      { name: 'alice-limited', userId: 'user_alice', servers: ['app_limited'], expiresInDays: 30 },
      { name: 'alice-all', userId: 'user_alice', servers: ['app_weather', 'app_notes', 'app_limited'], expiresInDays: 90 },
      { name: 'ipv4', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 30, allowedIps: ['203.0.113.7'] },
      { name: 'cidr4', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 30, allowedIps: ['198.51.100.0/24'] },
      { name: 'ipv6', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 30, allowedIps: ['2001:db8::/32'] },
      { name: 'ipv6-exact', userId: 'user_alice', servers: ['app_weather'], expiresInDays: 30, allowedIps: ['2001:db8::1'] },
      { name: 'ip-limited', userId: 'user_alice', servers: ['app_limited'], expiresInDays: 30, allowedIps: ['203.0.113.7'] },
      { name: 'bob', userId: 'user_bob', servers: ['app_weather'], expiresInDays: 90 },
      { name: 'carol', userId: 'user_carol', servers: ['app_weather'], expiresInDays: 90 },
      { name: 'dave', userId: 'user_dave', servers: ['app_weather'], expiresInDays: 90 },
    ],
  }
}

/** Creates the platform on {@link testSeed} with an injected clock; errors are collected, not logged. */
export function createTestPlatform(overrides: Partial<PlatformOptions> = {}): {
  platform: Platform
  clock: TestClock
  errors: Array<{ error: unknown; context: string }>
  token: (name: string) => string
} {
  const clock = createClock()
  const errors: Array<{ error: unknown; context: string }> = []
  const platform = createPlatform({
    seed: testSeed(),
    now: clock.now,
    onError: (error, context) => errors.push({ error, context }),
    ...overrides,
  })
  const token = (name: string) => {
    const secret = platform.tokens[name]
    if (!secret) throw new Error(`no seeded token named ${name}`)
    return secret
  }
  return { platform, clock, errors, token }
}

/** A client address outside every allowlist of the seed. */
export const CLIENT = '192.0.2.10'

/** The tools of every App version, sorted: its own and those of the MCP conformance features. */
export const APP_TOOLS = ['count', 'echo', 'get_version', ...CONFORMANCE_TOOLS].sort()
/** What a 2026-07-28 client is served: the App's tools and that revision's conformance tools. */
export const MODERN_APP_TOOLS = ['count', 'echo', 'get_version', ...MODERN_CONFORMANCE_TOOLS].sort()

export const TOOLS_LIST = { jsonrpc: '2.0', id: 1, method: 'tools/list' } as const
export const INITIALIZE = {
  jsonrpc: '2.0',
  id: 0,
  method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'e2e', version: '0.0.0' } },
} as const

export interface McpRequestOptions {
  token?: string
  method?: string
  body?: unknown
  /** Raw body text; wins over `body`. */
  rawBody?: string
  headers?: Record<string, string>
}

/** A POST of a JSON-RPC message to an App, as an MCP client sends it. */
export function mcpRequest(url: string, options: McpRequestOptions = {}): Request {
  const method = options.method ?? 'POST'
  const headers = new Headers({ accept: 'application/json, text/event-stream', 'content-type': 'application/json' })
  if (options.token !== undefined) headers.set('authorization', `Bearer ${options.token}`)
  for (const [name, value] of Object.entries(options.headers ?? {})) headers.set(name, value)
  const hasBody = method !== 'GET' && method !== 'HEAD'
  const body = options.rawBody ?? JSON.stringify(options.body ?? TOOLS_LIST)
  return new Request(url, { method, headers, ...(hasBody && { body }) })
}

/** The URL of the metadata document of an App (spec 4.2). */
export function metadataUrl(slug: string): string {
  return `http://${slug}.localhost/.well-known/oauth-protected-resource`
}

/** The `WWW-Authenticate` header of a 401 (spec 5.1; RFC 6750 3.1). */
export function challenge(slug: string, invalidToken: boolean): string {
  const base = `Bearer resource_metadata="${metadataUrl(slug)}"`
  return invalidToken ? `${base}, error="invalid_token"` : base
}

export { bodies } from './bodies.js'

/** A development dashboard session of the reference platform (`POST /dev/session`). */
export interface DevSession {
  /** `name=value` of the session cookie. */
  cookie: string
  csrfToken: string
}

/** Signs `userId` in on the platform's development dashboard. */
export async function devSignIn(platform: Platform, userId: string): Promise<DevSession> {
  const response = await platform.fetch(
    new Request('http://api.localhost/dev/session', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ userId }),
    }),
  )
  if (response.status !== 200) throw new Error(`dev session for ${userId}: ${response.status}`)
  const setCookie = response.headers.get('set-cookie') ?? ''
  const { csrfToken } = await json(response)
  return { cookie: setCookie.split(';')[0]!, csrfToken }
}

/** Options of {@link tokenApiCall}. */
export interface TokenApiCallOptions {
  session?: DevSession
  /** Send the session's CSRF token (default true when a session is given). */
  csrf?: boolean
  bearer?: string
  /** A whole `Authorization` value of another kind (wins over `bearer`). */
  authorization?: string
  body?: unknown
  /** The body as sent: text, or bytes (not UTF-8, say). */
  rawBody?: string | Uint8Array<ArrayBuffer>
  contentType?: string
  clientAddress?: string
  /** More request headers, set last. */
  headers?: Record<string, string>
}

/** A request to the platform's token API (`http://api.localhost/api/tokens{path}`). */
export function tokenApiCall(platform: Platform, method: string, path: string, options: TokenApiCallOptions = {}): Promise<Response> {
  const headers = new Headers()
  if (options.session) {
    headers.set('cookie', options.session.cookie)
    if (options.csrf !== false) headers.set('x-csrf-token', options.session.csrfToken)
  }
  if (options.bearer !== undefined) headers.set('authorization', `Bearer ${options.bearer}`)
  if (options.authorization !== undefined) headers.set('authorization', options.authorization)
  const raw = options.rawBody ?? (options.body === undefined ? undefined : JSON.stringify(options.body))
  if (raw !== undefined) headers.set('content-type', options.contentType ?? 'application/json')
  for (const [name, value] of Object.entries(options.headers ?? {})) headers.set(name, value)
  return platform.fetch(
    new Request(`http://api.localhost/api/tokens${path}`, { method, headers, ...(raw !== undefined && { body: raw }) }),
    { clientAddress: options.clientAddress ?? CLIENT },
  )
}

/** Reads a JSON response body (the body of every error and of JSON MCP responses). */
export async function json(response: Response): Promise<any> {
  return JSON.parse(await response.text())
}

/**
 * Reads the JSON-RPC message of an MCP response, whether the SDK answered with JSON or with
 * a one-message SSE stream.
 */
export async function rpcResult(response: Response): Promise<any> {
  const text = await response.text()
  if ((response.headers.get('content-type') ?? '').startsWith('text/event-stream')) {
    const data = text
      .split('\n')
      .filter((line) => line.startsWith('data: '))
      .map((line) => JSON.parse(line.slice(6)))
    return data.at(-1)
  }
  return JSON.parse(text)
}

/** Asserts nothing; returns the version headers of a response, for `toEqual`. */
export function versionHeaders(response: Response): { version: string | null; latest: string | null } {
  return { version: response.headers.get('x-mcp-version'), latest: response.headers.get('x-mcp-latest-version') }
}

/**
 * `fetch` for `http://*.localhost` URLs. Browsers and curl resolve every `*.localhost` name to
 * the loopback address (RFC 6761 section 6.3), but Node's `fetch` asks the system resolver,
 * which here answers ENOTFOUND, and Node's `fetch` drops a hand-set `Host` header. This one
 * goes through `node:http` with a lookup that maps `*.localhost` to 127.0.0.1, so the request
 * keeps its real `Host` (`weather.localhost:PORT`), which is how the platform routes Apps.
 * Response bodies stream (SSE), and aborting the signal ends the request.
 */
export const localhostFetch = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
  const request = new Request(input, init)
  const url = new URL(request.url)
  const lookup: LookupFunction = (hostname, options, callback) => {
    if (hostname === 'localhost' || hostname.endsWith('.localhost')) {
      if ((options as { all?: boolean }).all) {
        ;(callback as unknown as (e: null, a: Array<{ address: string; family: number }>) => void)(null, [
          { address: '127.0.0.1', family: 4 },
        ])
      } else callback(null, '127.0.0.1', 4)
      return
    }
    callback(Object.assign(new Error(`localhostFetch resolves only *.localhost, not ${hostname}`), { code: 'ENOTFOUND' }), '', 4)
  }
  const body = request.body ? Buffer.from(await request.arrayBuffer()) : undefined
  const headers: Record<string, string> = {}
  request.headers.forEach((value, name) => {
    headers[name] = value
  })
  if (body) headers['content-length'] = String(body.length)
  return new Promise<Response>((resolve, reject) => {
    const outgoing = http.request(url, { method: request.method, headers, lookup, agent: false }, (incoming) => {
      const responseHeaders = new Headers()
      for (const [name, value] of Object.entries(incoming.headers)) {
        if (Array.isArray(value)) for (const v of value) responseHeaders.append(name, v)
        else if (value !== undefined) responseHeaders.set(name, value)
      }
      const status = incoming.statusCode ?? 500
      const nullBody = status === 204 || status === 304 || request.method === 'HEAD'
      if (nullBody) incoming.resume()
      resolve(
        new Response(nullBody ? null : (Readable.toWeb(incoming) as ReadableStream<Uint8Array>), {
          status,
          statusText: incoming.statusMessage ?? '',
          headers: responseHeaders,
        }),
      )
    })
    // Before anything can destroy the request: an 'error' event without a listener would
    // bring the process down.
    outgoing.on('error', reject)
    const signal = init.signal ?? request.signal
    if (signal) {
      if (signal.aborted) {
        reject(signal.reason)
        outgoing.destroy()
        return
      }
      signal.addEventListener('abort', () => outgoing.destroy(signal.reason instanceof Error ? signal.reason : undefined), {
        once: true,
      })
    }
    outgoing.end(body)
  })
}

/** The platform served over real HTTP on 127.0.0.1 (ephemeral port). */
export interface ServedPlatform {
  port: number
  /** `http://{slug}.localhost:{port}` */
  origin(slug: string): string
  close(): Promise<void>
}

/** A fetch-style handler served on 127.0.0.1 by `@hono/node-server`. */
export interface ServedFetch {
  readonly port: number
  /** The node:http server, for tests that watch its connections. */
  readonly server: http.Server
  /** Ends open connections and stops the server. */
  close(): Promise<void>
}

/**
 * Serves `handle` on a loopback port (default: an ephemeral one) with `@hono/node-server`,
 * passing the socket peer as `clientAddress`, as a platform does. Rejects when the port cannot
 * be listened on (`EADDRINUSE`).
 */
export async function serveFetch(
  handle: (request: Request, info: { clientAddress?: string; outgoing?: unknown }) => Response | Promise<Response>,
  port = 0,
): Promise<ServedFetch> {
  let server!: http.Server
  const listening = await new Promise<number>((resolve, reject) => {
    server = serve(
      {
        port,
        hostname: '127.0.0.1',
        // `outgoing`: the Web adapter's Node path (headers at Node's `writeHead`), as in
        // examples/platform/server.ts.
        fetch: (request: Request, env: { incoming?: { socket?: { remoteAddress?: string } }; outgoing?: unknown }) =>
          handle(request, { clientAddress: env.incoming?.socket?.remoteAddress, outgoing: env.outgoing }),
      },
      (info: AddressInfo) => resolve(info.port),
    ) as unknown as http.Server
    server.once('error', reject)
  })
  return {
    port: listening,
    server,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections?.()
        server.close(() => resolve())
      }),
  }
}

export async function servePlatform(platform: Platform): Promise<ServedPlatform> {
  const served = await serveFetch((request, info) => platform.fetch(request, info))
  return { port: served.port, origin: (slug) => `http://${slug}.localhost:${served.port}`, close: served.close }
}
