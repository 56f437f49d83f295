/**
 * A browser-based MCP client, in a real browser: headless Chromium (Debian's `chromium`, driven
 * by `playwright-core`) runs the official MCP SDK clients in a page of another origin than the
 * App's, so every call is cross-origin and the browser, not the test, decides what the page may
 * read (CORS). The page (test/platform/browser-page.ts, bundled with esbuild) is served from
 * `http://localhost:{port}`, an origin the platform allows by default; the App is at
 * `http://weather.localhost:{port}` (Chromium resolves `*.localhost` to loopback itself).
 *
 * What the page must be able to do: connect with an API token (`initialize`, `tools/list`,
 * `tools/call`) at `/`, `/v1` and an exact version, with the SDK v1 client and the v2 one at
 * MCP 2026-07-28; read `X-MCP-Version`, `X-MCP-Latest-Version` and `Mcp-Session-Id`; stay
 * pinned to its version across a deploy; resume with `Last-Event-ID`; end its session
 * (`DELETE`); read a 401 (status, JSON-RPC body, `WWW-Authenticate`), the protected-resource
 * metadata and the 404s of the path-suffixed variants the SDK tries; sign in with OAuth through
 * the SDK's own discovery, registration and code exchange (the development authorization
 * server); read a 402, a 429 and the 404s. A page of an origin the platform does not allow
 * (`http://evil.test:{port}`, mapped to 127.0.0.1 by Chromium's host resolver rules) reads
 * nothing of an App, and the platform answers it 403 `origin_not_allowed`.
 *
 * Needs `chromium` on PATH (Debian's `apt-get install chromium`, /usr/bin/chromium; never
 * `npx playwright install`). Without it the suite is skipped with a warning, except under
 * `.ci/run` (`MCP_DISPATCH_CI=1`), where it fails. Binds 127.0.0.1 only, on ports 47400-47499.
 */
import { accessSync, constants } from 'node:fs'
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { delimiter, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { build } from 'esbuild'
import { type Browser, type BrowserContext, type JSHandle, type Page, chromium } from 'playwright-core'
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import type { Platform } from '../../examples/platform/index.js'
import { underProjectCI } from '../helpers/ci.js'
import { APP_TOOLS, INITIALIZE, MODERN_APP_TOOLS, type ServedFetch, TOOLS_LIST, bodies, createTestPlatform, serveFetch } from '../helpers/platform.js'
import type { ConnectOptions, McpPage, PageRead } from './browser-page.js'

/** `chromium` on `PATH` (Debian's package: /usr/bin/chromium), as `.ci/run` looks for it. */
function findChromium(): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    const candidate = join(dir, 'chromium')
    try {
      accessSync(candidate, constants.X_OK)
      return candidate
    } catch {
      // not here
    }
  }
  return undefined
}

const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  // Without these Chromium reaches for Google's services as it starts, and on a machine whose
  // network is closed its connections are refused.
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  // A host the platform does not allow pages of, served by the same loopback page server.
  '--host-resolver-rules=MAP evil.test 127.0.0.1',
]
/** The loopback ports this suite may listen on. */
const PORTS = { first: 47400, last: 47499 }
const LATEST = '2.0.0'
const MODERN = '2026-07-28'

const CHROMIUM = findChromium()

function chromiumAvailable(): boolean {
  if (CHROMIUM !== undefined) return true
  const missing = 'Chromium is not installed (no `chromium` on PATH): run `apt-get install -y chromium`'
  if (underProjectCI()) throw new Error(`${missing} (under .ci/run, MCP_DISPATCH_CI, so this suite fails instead of skipping)`)
  console.warn(`[browser-client] ${missing}; suite skipped`)
  return false
}

const installed = chromiumAvailable()

/** Listens with `start` on the first free port of {@link PORTS}. */
async function onFreePort<T>(start: (port: number) => Promise<T>): Promise<T> {
  for (let port = PORTS.first; port <= PORTS.last; port++) {
    try {
      return await start(port)
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw error
    }
  }
  throw new Error(`no free port in ${PORTS.first}-${PORTS.last}`)
}

/** One request the platform answered, as the server saw it. */
interface Served {
  method: string
  url: string
  origin: string | null
  authorization: boolean
  status: number
  /**
   * Its `Access-Control-Allow-Origin`, as the `Response` carries it: a refusal's (a dispatched
   * answer's dispatch headers go straight into Node's response head).
   */
  allowOrigin: string | null
  /** The body of a 403 (the only refusal a page of an origin not allowed gets). */
  body?: string
}

/** The page server: the test page (at `/` and `/callback`) and its script, for any `Host`. */
async function servePage(script: string): Promise<{ port: number; close(): Promise<void> }> {
  const html = '<!doctype html><meta charset="utf-8"><title>MCP browser client</title><script src="/page.js"></script>'
  const server = http.createServer((request, response) => {
    const path = (request.url ?? '/').split('?')[0]
    if (path === '/page.js') {
      response.writeHead(200, { 'content-type': 'text/javascript; charset=utf-8' }).end(script)
    } else if (path === '/' || path === '/callback') {
      response.writeHead(200, { 'content-type': 'text/html; charset=utf-8' }).end(html)
    } else {
      response.writeHead(404).end()
    }
  })
  const port = await onFreePort(
    (p) =>
      new Promise<number>((resolve, reject) => {
        server.once('error', reject)
        server.listen(p, '127.0.0.1', () => {
          server.off('error', reject)
          resolve((server.address() as AddressInfo).port)
        })
      }),
  )
  return {
    port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}

let browser: Browser
let auth: DevAuthServer
let platform: Platform
let token: (name: string) => string
let errors: Array<{ error: unknown; context: string }>
let app: ServedFetch
let pageServer: { port: number; close(): Promise<void> }
const served: Served[] = []
/** `http://{slug}.localhost:{port}` */
let appOrigin: (slug: string) => string
/** The page's origin, allowed by the platform's default `allowedOrigins`. */
let pageOrigin: string
/** The same page from an origin the platform does not allow. */
let evilOrigin: string

describe.skipIf(!installed)('a browser-based MCP client in headless Chromium', () => {
  beforeAll(async () => {
    const bundled = await build({
      entryPoints: [fileURLToPath(new URL('./browser-page.ts', import.meta.url))],
      bundle: true,
      platform: 'browser',
      format: 'iife',
      target: 'chrome120',
      write: false,
      logLevel: 'silent',
    })
    pageServer = await servePage(bundled.outputFiles[0]!.text)
    pageOrigin = `http://localhost:${pageServer.port}`
    evilOrigin = `http://evil.test:${pageServer.port}`

    auth = await onFreePort((port) => startDevAuthServer({ accounts: ['user_alice', 'user_bob'], port }))
    ;({ platform, token, errors } = createTestPlatform({ authorizationServer: { issuer: auth.issuer } }))
    app = await onFreePort((port) =>
      serveFetch(async (request, info) => {
        const response = await platform.fetch(request, info)
        const url = new URL(request.url)
        served.push({
          method: request.method,
          url: `${url.host}${url.pathname}`,
          origin: request.headers.get('origin'),
          authorization: request.headers.has('authorization'),
          status: response.status,
          allowOrigin: response.headers.get('access-control-allow-origin'),
          ...(response.status === 403 && { body: await response.clone().text() }),
        })
        return response
      }, port),
    )
    appOrigin = (slug) => `http://${slug}.localhost:${app.port}`

    browser = await chromium.launch({ executablePath: CHROMIUM, args: CHROMIUM_ARGS })
  })

  afterAll(async () => {
    await browser?.close()
    await app?.close()
    await pageServer?.close()
    await platform?.close()
    await auth?.close()
  })

  let context: BrowserContext | undefined
  afterEach(async () => {
    await context?.close()
    context = undefined
    expect(errors).toEqual([])
  })

  /** The test page at `origin` (a browser context of its own: no shared preflight cache or storage). */
  async function openPage(origin = pageOrigin): Promise<{ page: Page; mcp: JSHandle<McpPage> }> {
    context ??= await browser.newContext()
    const page = await context.newPage()
    await page.goto(`${origin}/`)
    return { page, mcp: await pageApi(page) }
  }

  /** `window.mcpPage` of the page, once its script has run. */
  async function pageApi(page: Page): Promise<JSHandle<McpPage>> {
    await page.waitForFunction(() => 'mcpPage' in globalThis)
    return page.evaluateHandle(() => (globalThis as unknown as { mcpPage: McpPage }).mcpPage)
  }

  /** An MCP `POST` from the page, as a client sends it (`initialize` unless told). */
  function post(mcp: JSHandle<McpPage>, url: string, options: { token?: string; body?: unknown; headers?: Record<string, string> } = {}) {
    const init: RequestInit = {
      method: 'POST',
      headers: {
        accept: 'application/json, text/event-stream',
        'content-type': 'application/json',
        ...(options.token !== undefined && { authorization: `Bearer ${options.token}` }),
        ...options.headers,
      },
      body: JSON.stringify(options.body ?? INITIALIZE),
    }
    return mcp.evaluate((m, [u, i]) => m.read(u, i), [url, init] as const)
  }

  /** Connects an SDK client in the page; throws with what the page saw when it cannot. */
  async function connect(mcp: JSHandle<McpPage>, url: string, options: ConnectOptions = {}) {
    const connected = await mcp.evaluate((m, [u, o]) => m.connect(u, o), [url, options] as const)
    if ('error' in connected) throw new Error(`${url}: ${connected.error} after ${JSON.stringify(connected.exchanges)}`)
    return connected
  }

  function callTool(mcp: JSHandle<McpPage>, id: number, name: string, args: Record<string, unknown> = {}) {
    return mcp.evaluate((m, [i, n, a]) => m.callTool(i, n, a), [id, name, args] as const)
  }

  /** The JSON body of what the page read, after checking that it could read it. */
  function bodyOf(result: PageRead): unknown {
    if ('error' in result) throw new Error(`the page could not read the answer: ${result.error}`)
    return JSON.parse(result.body)
  }

  describe('with an API token', () => {
    it.each([
      ['/', LATEST],
      ['/v1', '1.1.1'],
      ['/v1.0.0', '1.0.0'],
    ])('%s: initialize, tools/list, tools/call and DELETE, reading the version headers and the session id', async (path, version) => {
      const { mcp } = await openPage()
      const url = `${appOrigin('weather')}${path}`
      const { id, sessionId } = await connect(mcp, url, { token: token('alice') })
      // The SDK read `Mcp-Session-Id` from the initialize answer.
      expect(sessionId).toMatch(/^[\x21-\x7e]+$/)
      expect(await mcp.evaluate((m, i) => m.listTools(i), id)).toEqual(APP_TOOLS)
      expect(await callTool(mcp, id, 'get_version')).toEqual({ app: 'weather', version })
      expect(await callTool(mcp, id, 'echo', { text: 'from a page' })).toEqual([{ type: 'text', text: `from a page (from weather ${version})` }])

      // Every answer (the POSTs, the GET stream the SDK opens) is readable, with both version headers.
      const seen = await mcp.evaluate((m, i) => m.exchanges(i), id)
      expect(seen.map((e) => e.method)).toEqual(expect.arrayContaining(['POST', 'GET']))
      for (const exchange of seen) {
        expect(exchange.status).toBeLessThan(300)
        expect(exchange.headers).toMatchObject({ 'x-mcp-version': version, 'x-mcp-latest-version': LATEST })
      }
      expect(seen[0]!.headers['mcp-session-id']).toBe(sessionId)
      expect(seen.slice(1).every((e) => e.sentSessionId === sessionId && e.sent.includes('mcp-protocol-version'))).toBe(true)

      // Resuming a stream: a GET with `Last-Event-ID` passes the preflight.
      const resumed = await mcp.evaluate((m, [u, h]) => m.readHead(u, { headers: h }), [
        url,
        {
          accept: 'text/event-stream',
          authorization: `Bearer ${token('alice')}`,
          'mcp-session-id': sessionId!,
          'mcp-protocol-version': '2025-06-18',
          'last-event-id': 'no-such-event',
        },
      ] as const)
      expect(resumed).not.toHaveProperty('error')

      // DELETE from the page ends the session; the page then reads the 404 of a request on it.
      expect(await mcp.evaluate((m, i) => m.terminate(i), id)).toEqual({ ok: true })
      const gone = await post(mcp, url, {
        token: token('alice'),
        body: TOOLS_LIST,
        headers: { 'mcp-session-id': sessionId!, 'mcp-protocol-version': '2025-06-18' },
      })
      expect(gone).toMatchObject({ status: 404 })
      expect(bodyOf(gone)).toEqual(bodies.sessionNotFound)
    })

    it.each(['localhost', '127.0.0.1'])('a page of http://%s reads the version headers and the session id from a fetch of its own', async (host) => {
      const { mcp } = await openPage(`http://${host}:${pageServer.port}`)
      const answer = await post(mcp, `${appOrigin('weather')}/v1`, { token: token('alice') })
      expect(answer).toMatchObject({
        status: 200,
        headers: { 'x-mcp-version': '1.1.1', 'x-mcp-latest-version': LATEST, 'mcp-session-id': expect.any(String) },
      })
    })

    it('stays pinned to its version across a deploy; a new session gets the new one', async () => {
      const { mcp } = await openPage()
      const url = `${appOrigin('notes')}/`
      const old = await connect(mcp, url, { token: token('alice-notes') })
      expect(await callTool(mcp, old.id, 'get_version')).toEqual({ app: 'notes', version: '1.0.0' })

      platform.deploy('app_notes', '1.1.0')

      expect(await callTool(mcp, old.id, 'get_version')).toEqual({ app: 'notes', version: '1.0.0' })
      expect((await mcp.evaluate((m, i) => m.exchanges(i), old.id)).at(-1)).toMatchObject({
        status: 200,
        sentSessionId: old.sessionId,
        headers: { 'x-mcp-version': '1.0.0', 'x-mcp-latest-version': '1.1.0' },
      })
      const fresh = await connect(mcp, url, { token: token('alice-notes') })
      expect(fresh.sessionId).not.toBe(old.sessionId)
      expect(await callTool(mcp, fresh.id, 'get_version')).toEqual({ app: 'notes', version: '1.1.0' })
      await mcp.evaluate((m) => m.closeAll())
    })

    it('the SDK v2 client at MCP 2026-07-28 (Mcp-Method, Mcp-Name), and an Mcp-Param-* header', async () => {
      const { mcp } = await openPage()
      const url = `${appOrigin('weather')}/v1`
      const { id } = await connect(mcp, url, { token: token('alice'), sdk: 'v2' })
      expect(await mcp.evaluate((m, i) => m.listTools(i), id)).toEqual(MODERN_APP_TOOLS)
      expect(await callTool(mcp, id, 'get_version')).toEqual({ app: 'weather', version: '1.1.1' })
      const seen = await mcp.evaluate((m, i) => m.exchanges(i), id)
      expect(seen.filter((e) => e.sent.includes('mcp-method')).length).toBeGreaterThanOrEqual(2)
      expect(seen.flatMap((e) => e.sent)).toEqual(expect.arrayContaining(['mcp-name', 'mcp-protocol-version']))
      for (const exchange of seen) expect(exchange).toMatchObject({ status: 200, headers: { 'x-mcp-version': '1.1.1', 'x-mcp-latest-version': LATEST } })
      await mcp.evaluate((m) => m.closeAll())

      // In a browser the SDK does not mirror arguments into `Mcp-Param-*` headers (it cannot know
      // whether a server's preflight allows them); a page that sends one itself gets it allowed.
      const mirrored = await post(mcp, url, {
        token: token('alice'),
        headers: { 'mcp-protocol-version': MODERN, 'mcp-method': 'tools/call', 'mcp-name': 'test_custom_headers', 'mcp-param-region': 'eu-west' },
        body: {
          jsonrpc: '2.0',
          id: 1,
          method: 'tools/call',
          params: {
            name: 'test_custom_headers',
            arguments: { region: 'eu-west' },
            _meta: {
              'io.modelcontextprotocol/protocolVersion': MODERN,
              'io.modelcontextprotocol/clientInfo': { name: 'page', version: '1.0.0' },
              'io.modelcontextprotocol/clientCapabilities': {},
            },
          },
        },
      })
      expect(mirrored).toMatchObject({ status: 200, headers: { 'x-mcp-version': '1.1.1' }, body: expect.stringContaining('region=eu-west') })
    })
  })

  describe('with OAuth', () => {
    it("signs in through the SDK's discovery, registration and code exchange, then calls a tool", async () => {
      const { page, mcp } = await openPage()
      const url = `${appOrigin('weather')}/v1`
      // The SDK meets the 401, reads the metadata and the authorization server's, registers the
      // page (RFC 7591), and asks to send the user to the authorization endpoint.
      const started = await mcp.evaluate((m, u) => m.oauthStart(u), url)
      expect(started.error).toBeUndefined()
      expect(started.exchanges.map((e) => `${e.method} ${e.url} ${e.status}`)).toEqual([
        `POST ${url} 401`,
        `GET ${appOrigin('weather')}/.well-known/oauth-protected-resource 200`,
        `GET ${auth.issuer}/.well-known/oauth-authorization-server 200`,
        `POST ${auth.issuer}/reg 201`,
      ])
      const authorization = new URL(started.authorizationUrl!)
      expect(authorization.origin + authorization.pathname).toBe(`${auth.issuer}/auth`)
      expect(authorization.searchParams.get('resource')).toBe(appOrigin('weather'))
      expect(authorization.searchParams.get('redirect_uri')).toBe(`${pageOrigin}/callback`)

      // The user follows it: the development server signs alice in and sends the page back with
      // a code, which the page redeems at the token endpoint (cross-origin), then connects.
      await page.goto(authorization.href)
      await page.waitForURL((u) => u.href.startsWith(`${pageOrigin}/callback?`))
      const back = await pageApi(page)
      const finished = await back.evaluate((m, u) => m.oauthFinish(u), url)
      if ('error' in finished) throw new Error(finished.error)
      expect(await callTool(back, finished.id, 'get_version')).toEqual({ app: 'weather', version: '1.1.1' })
      const signedIn = await back.evaluate((m, i) => m.exchanges(i), finished.id)
      expect(signedIn.every((e) => e.status < 300 && e.sent.includes('authorization'))).toBe(true)
      await back.evaluate((m) => m.closeAll())
    })
  })

  describe('refusals a page can read', () => {
    it('401 without a token: the status, the JSON-RPC body and WWW-Authenticate', async () => {
      const { mcp } = await openPage()
      const url = `${appOrigin('weather')}/v1`
      const answer = await post(mcp, url)
      expect(answer).toMatchObject({
        status: 401,
        headers: { 'www-authenticate': `Bearer resource_metadata="${appOrigin('weather')}/.well-known/oauth-protected-resource"` },
      })
      expect(bodyOf(answer)).toEqual(bodies.unauthorized(false))
      // The SDK client (without an auth provider) fails with the body it read.
      expect(await mcp.evaluate((m, u) => m.connect(u), url)).toMatchObject({ error: expect.stringContaining('"code":-32001') })
    })

    it('reads the protected-resource metadata, and the 404s of the path-suffixed variants the SDK tries', async () => {
      const { mcp } = await openPage()
      const root = `${appOrigin('weather')}/.well-known/oauth-protected-resource`
      const metadata = { resource: appOrigin('weather'), authorization_servers: [auth.issuer] }
      // As the SDK asks: with MCP-Protocol-Version, so after a preflight.
      const headers = { 'mcp-protocol-version': '2025-06-18' }
      const document = await mcp.evaluate((m, [u, h]) => m.read(u, { headers: h }), [root, headers] as const)
      expect(document).toMatchObject({ status: 200 })
      expect(bodyOf(document)).toMatchObject(metadata)
      for (const suffix of ['/v1', '/v1.0.0', '/']) {
        const variant = await mcp.evaluate((m, [u, h]) => m.read(u, { headers: h }), [`${root}${suffix}`, headers] as const)
        expect(variant).toMatchObject({ status: 404 })
        expect(bodyOf(variant)).toEqual(bodies.notFound)
      }
      // The SDK's own discovery for `/v1`: the path-suffixed document, then the root one.
      expect(await mcp.evaluate((m, u) => m.discoverResource(u), `${appOrigin('weather')}/v1`)).toEqual({
        metadata: expect.objectContaining(metadata),
        seen: [`${root}/v1 404`, `${root} 200`],
      })
    })

    it('402 without an active subscription', async () => {
      const { mcp } = await openPage()
      const url = `${appOrigin('weather')}/v1`
      const answer = await post(mcp, url, { token: token('bob') })
      expect(answer).toMatchObject({ status: 402 })
      expect(bodyOf(answer)).toEqual(bodies.paymentRequired)
      expect(await connectError(mcp, url, token('bob'))).toContain('"code":-32002')
    })

    it('429 past the rate limit, with Retry-After and the rate-limit fields', async () => {
      const { mcp } = await openPage()
      const url = `${appOrigin('limited')}/`
      const policy = '"minute";q=3;w=60'
      for (let i = 0; i < 3; i++) {
        expect(await post(mcp, url, { token: token('alice-limited'), body: TOOLS_LIST })).toMatchObject({
          status: 200,
          headers: { ratelimit: `"minute";r=${2 - i};t=30`, 'ratelimit-policy': policy },
        })
      }
      const limited = await post(mcp, url, { token: token('alice-limited'), body: TOOLS_LIST })
      expect(limited).toMatchObject({ status: 429, headers: { 'retry-after': '30', ratelimit: '"minute";r=0;t=30', 'ratelimit-policy': policy } })
      expect(bodyOf(limited)).toMatchObject({ error: { code: -32000, message: 'Rate limit exceeded' } })
    })

    it('404 version_not_found and not_found, and the SDK client fails with the body', async () => {
      const { mcp } = await openPage()
      const url = `${appOrigin('weather')}/v3`
      const answer = await post(mcp, url, { token: token('alice') })
      expect(answer).toMatchObject({ status: 404 })
      expect(bodyOf(answer)).toEqual(bodies.versionNotFound('3', LATEST))
      expect(await connectError(mcp, url, token('alice'))).toContain('"error":"version_not_found"')
      // An App that does not exist: its preflight is answered, so the page reads the 404.
      const nowhere = await post(mcp, `${appOrigin('nosuch')}/`, { token: token('alice') })
      expect(nowhere).toMatchObject({ status: 404 })
      expect(bodyOf(nowhere)).toEqual(bodies.notFound)
    })
  })

  describe('a page of an origin the platform does not allow', () => {
    it('reads nothing of an App, and the platform answers 403 origin_not_allowed', async () => {
      const { mcp } = await openPage(evilOrigin)
      const from = served.length
      const url = `${appOrigin('weather')}/v1`
      const blocked = { error: 'TypeError: Failed to fetch' }
      // With a token: the preflight is refused, so the request itself is never sent.
      expect(await post(mcp, url, { token: token('alice') })).toEqual(blocked)
      expect(await connectError(mcp, url, token('alice'))).toBe(blocked.error)
      // A simple request (no preflight) is sent, refused, and unreadable.
      expect(await mcp.evaluate((m, u) => m.read(u, { method: 'POST', headers: { 'content-type': 'text/plain' }, body: '{}' }), url)).toEqual(blocked)
      // Nor can it tell whether an App or a path exists.
      expect(await mcp.evaluate((m, u) => m.read(u), `${appOrigin('nosuch')}/`)).toEqual(blocked)
      expect(await mcp.evaluate((m, u) => m.read(u), `${appOrigin('weather')}/nosuch`)).toEqual(blocked)
      // The metadata document alone is public, to any page (docs/pipeline.md).
      expect(await mcp.evaluate((m, u) => m.read(u), `${appOrigin('weather')}/.well-known/oauth-protected-resource`)).toMatchObject({
        status: 200,
      })

      // What the platform answered: 403 origin_not_allowed at the App's MCP path, a bare 404
      // elsewhere, never a CORS header that would let the page read it (but the metadata's),
      // and no request carrying the token ever reached it.
      const seen = served.slice(from)
      expect(seen.every((r) => r.origin === evilOrigin && !r.authorization)).toBe(true)
      const atApp = seen.filter((r) => r.url === `weather.localhost:${app.port}/v1`)
      expect(atApp.map((r) => r.method).sort()).toEqual(['OPTIONS', 'OPTIONS', 'POST'])
      for (const r of atApp) {
        expect(r).toMatchObject({ status: 403, allowOrigin: null })
        expect(JSON.parse(r.body!)).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32003, message: 'Forbidden', data: { error: 'origin_not_allowed' } } })
      }
      expect(seen.filter((r) => !r.url.includes('/.well-known/')).every((r) => r.allowOrigin === null)).toBe(true)
    })
  })

  /** The error of an SDK client that could not connect from the page. */
  async function connectError(mcp: JSHandle<McpPage>, url: string, secret: string): Promise<string> {
    const connected = await mcp.evaluate((m, [u, t]) => m.connect(u, { token: t }), [url, secret] as const)
    if (!('error' in connected)) throw new Error(`${url}: connected`)
    return connected.error
  }
})
