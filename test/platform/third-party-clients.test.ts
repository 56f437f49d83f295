/**
 * MCP clients other than the official SDK's own `Client`, against the reference platform over
 * real HTTP on 127.0.0.1 (docs/platform.md, "Third-party MCP clients"):
 *
 * - `@ai-sdk/mcp` (Vercel AI SDK), whose Streamable HTTP transport and JSON-RPC handling are
 *   its own code: MCP 2026-07-28 by default (`server/discover`, no session), or the 2025
 *   handshake (`protocolVersionDiscovery: false`: a session, its GET stream, `DELETE` on close);
 *   with an API token in a header, and signed in through its own OAuth `authProvider`.
 * - the MCP Inspector's CLI mode (`@modelcontextprotocol/inspector` 1.x `--cli`), one process
 *   per call, as scripts and CI jobs use it; and the 2.x line's (on Node 22, from
 *   test/conformance), whose client is the SDK 2.x's: the 2025 handshake by default, MCP
 *   2026-07-28 with `--protocol-era modern`, and signing in with OAuth through a headless browser.
 * - `mcp-remote`, the stdio-to-HTTP bridge desktop hosts run, with `--header`, and signing in
 *   with OAuth through a headless browser (`test/helpers/headless-browser.mjs` as `BROWSER`),
 *   driven here by the SDK's stdio client as a host would.
 *
 * What is checked is what a user of each would notice: the tool result, the version the
 * connection is pinned to across a deploy, and a refusal surfaced with its JSON-RPC code. The
 * platform side records every request (method, session, status, `X-MCP-Version`), so what a
 * client in a child process sent is checked too.
 *
 * The child processes resolve `*.localhost` through `test/helpers/resolve-localhost.mjs`
 * (preloaded with `--import`); `@ai-sdk/mcp` runs in this process with `localhostFetch`.
 */
import { spawn } from 'node:child_process'
import { createServer } from 'node:net'
import { mkdtemp, rm } from 'node:fs/promises'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { MCPClientError, type OAuthClientProvider, UnauthorizedError, auth, createMCPClient } from '@ai-sdk/mcp'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from 'vitest'
import { type DevAuthServer, startDevAuthServer } from '../../examples/platform/dev-auth-server.js'
import { type Platform, createPlatform } from '../../examples/platform/index.js'
import { TestOAuthClient } from '../oauth/helpers/oauth-client.js'
import { HEADLESS_BROWSER, INSPECTOR_CLI, MCP_REMOTE, RESOLVE_LOCALHOST, connectMcpRemoteOAuth, withoutDesktop } from '../helpers/audit-shared.js'
import { INSPECTOR_2_CLI, NODE_22, inspector2Available } from '../helpers/conformance.js'
import {
  APP_TOOLS,
  MODERN_APP_TOOLS,
  type ServedFetch,
  createTestPlatform,
  localhostFetch,
  serveFetch,
  testSeed,
} from '../helpers/platform.js'

/**
 * A port free on 127.0.0.1 now, for mcp-remote's OAuth callback server (it takes a port number,
 * not 0): the system's choice, released at once for mcp-remote to listen on.
 */
async function freePort(): Promise<number> {
  const server = createServer()
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '127.0.0.1', resolve))
  const { port } = server.address() as { port: number }
  await new Promise<void>((resolve) => server.close(() => resolve()))
  return port
}

/** One request as the platform saw it. */
interface Served {
  method: string
  host: string
  path: string
  session: string | null
  protocol: string | null
  accept: string | null
  status: number
  contentType: string | null
  version: string | null
  /** `Mcp-Method` (MCP 2026-07-28). */
  mcpMethod: string | null
}

let platform: Platform
let token: (name: string) => string
let errors: Array<{ error: unknown; context: string }>
let server: ServedFetch
let log: Served[]
let configDir: string

beforeAll(async () => {
  configDir = await mkdtemp(join(tmpdir(), 'mcp-remote-'))
})
afterAll(async () => {
  await rm(configDir, { recursive: true, force: true })
})

/** The test seed, with room in the limited App's minute for mcp-remote's handshake. */
function seed() {
  const base = testSeed()
  return { ...base, apps: base.apps.map((app) => (app.id === 'app_limited' ? { ...app, rateLimitPerMinute: LIMIT } : app)) }
}
const LIMIT = 10

/**
 * A fresh platform per test (pins and rate-limit windows of one test never reach another).
 * Served on the Web path (no `outgoing`), so the version headers are on the `Response` logged.
 */
async function start(): Promise<void> {
  ;({ platform, token, errors } = createTestPlatform({ seed: seed() }))
  log = []
  server = await serveLogged()
}

/** Serves `platform` on 127.0.0.1, each request and its answer recorded in `log`. */
function serveLogged(): Promise<ServedFetch> {
  return serveFetch(async (request, info) => {
    const response = await platform.fetch(request, { clientAddress: info.clientAddress })
    const url = new URL(request.url)
    log.push({
      method: request.method,
      host: url.hostname,
      path: url.pathname,
      session: request.headers.get('mcp-session-id'),
      protocol: request.headers.get('mcp-protocol-version'),
      accept: request.headers.get('accept'),
      status: response.status,
      contentType: response.headers.get('content-type'),
      version: response.headers.get('x-mcp-version'),
      mcpMethod: request.headers.get('mcp-method'),
    })
    return response
  })
}

/**
 * A fresh platform whose Apps take access tokens of the authorization server at `issuer`, served
 * and logged as {@link start}'s (with the test seed as it is).
 */
async function startSigningInAt(issuer: string): Promise<void> {
  errors = []
  log = []
  platform = createPlatform({ seed: testSeed(), authorizationServer: { issuer }, onError: (error, context) => errors.push({ error, context }) })
  server = await serveLogged()
}

/**
 * For the tests of the describe it is called in: the development authorization server, signing
 * in `user_alice` at once, and the requests it served (`POST /reg`, `GET /interaction/…`),
 * from the describe's start.
 */
function devAuthServerOfSuite(): { issuer(): string; readonly requests: string[] } {
  let authServer: DevAuthServer | undefined
  const requests: string[] = []
  beforeEach(() => {
    requests.length = 0
  })
  beforeAll(async () => {
    authServer = await startDevAuthServer({
      accounts: ['user_alice'],
      onRequest: ({ method, path }) => requests.push(`${method} ${path.replace(/^\/(interaction|auth)\/.+/, '/$1/…')}`),
    })
  })
  afterAll(async () => {
    await authServer?.close()
  })
  return { issuer: () => authServer!.issuer, requests }
}

async function stop(): Promise<void> {
  await server.close()
  await platform.close()
  expect(errors).toEqual([])
}

const origin = (slug = 'weather') => `http://${slug}.localhost:${server.port}`

/** The requests the platform served at an App's MCP paths (not its metadata document). */
const mcpRequests = (slug = 'weather') => log.filter((r) => r.host === `${slug}.localhost` && !r.path.startsWith('/.well-known/'))

/** Sends `tools/list` as `tokenName` until the App's rate limit refuses it (429). */
async function exhaustRateLimit(slug: string, tokenName: string): Promise<void> {
  for (let i = 0; i < 20; i++) {
    const response = await localhostFetch(`${origin(slug)}/`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token(tokenName)}`, 'content-type': 'application/json', accept: 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    })
    await response.body?.cancel()
    if (response.status === 429) return
  }
  throw new Error(`${slug} never answered 429`)
}

describe('@ai-sdk/mcp', () => {
  afterEach(stop)

  /** An `@ai-sdk/mcp` client at `path` of the weather App with an API token. */
  function aiClient(path: string, tokenName: string | undefined, legacy = false, slug = 'weather') {
    return createMCPClient({
      transport: {
        type: 'http',
        url: origin(slug) + path,
        headers: tokenName === undefined ? {} : { Authorization: `Bearer ${token(tokenName)}` },
        fetch: localhostFetch,
      },
      ...(legacy && { protocolVersionDiscovery: false }),
    })
  }

  it.each([
    ['/', '2.0.0'],
    ['/v1', '1.1.1'],
    ['/v1.1.1', '1.1.1'],
  ])('MCP 2026-07-28 (its default) at %s: lists and calls tools of %s, with no session', async (path, version) => {
    await start()
    const client = await aiClient(path, 'alice')
    const { tools } = await client.listTools()
    expect(tools.map((t) => t.name).sort()).toEqual(MODERN_APP_TOOLS)
    const result = await client.callTool({ name: 'get_version', arguments: {} })
    expect(result.structuredContent).toEqual({ app: 'weather', version })
    await client.close()
    const requests = mcpRequests()
    expect(requests.map((r) => r.method)).toEqual(['POST', 'POST', 'POST'])
    for (const r of requests) expect(r).toMatchObject({ status: 200, protocol: '2026-07-28', session: null, version })
  })

  it('the 2025 handshake: a session with its GET stream, pinned across a deploy, ended with DELETE', async () => {
    await start()
    const client = await aiClient('/v1', 'alice', true)
    expect(client.serverInfo).toMatchObject({ name: 'weather', version: '1.1.1' })
    expect((await client.listTools()).tools.map((t) => t.name).sort()).toEqual(APP_TOOLS)
    const session = mcpRequests().find((r) => r.session !== null)?.session
    expect(session).toEqual(expect.any(String))
    // Its GET stream, opened once the session exists.
    expect(mcpRequests()).toContainEqual(
      expect.objectContaining({ method: 'GET', session, status: 200, contentType: 'text/event-stream', version: '1.1.1' }),
    )

    platform.deploy('app_weather', '1.1.2') // replaces 1.1.1
    platform.deploy('app_weather', '2.1.0')
    const pinned = await client.callTool({ name: 'get_version', arguments: {} })
    expect(pinned.structuredContent).toEqual({ app: 'weather', version: '1.1.1' })
    expect(mcpRequests().at(-1)).toMatchObject({ method: 'POST', session, status: 200, version: '1.1.1' })

    const fresh = await aiClient('/v1', 'alice', true)
    expect((await fresh.callTool({ name: 'get_version', arguments: {} })).structuredContent).toEqual({
      app: 'weather',
      version: '1.1.2',
    })
    await fresh.close()

    await client.close()
    expect(mcpRequests()).toContainEqual(expect.objectContaining({ method: 'DELETE', session, status: 200 }))
  })

  /**
   * Its transport would hand a JSON-RPC error body to the caller as that error (code, message,
   * data), but its schema refuses the `id: null` that spec section 7 (and JSON-RPC 2.0 for an
   * error not tied to a request) gives every refusal, so each surfaces as an `MCPClientError`
   * with the HTTP status and the body as text (docs/platform.md).
   */
  it.each([
    ['no token', 'weather', undefined, 401, -32001],
    ['a user with no subscription', 'weather', 'dave', 402, -32002],
    ['a token not scoped to the App', 'notes', 'alice', 403, -32003],
  ])('%s: the refusal surfaces with its status and JSON-RPC body', async (_case, slug, tokenName, status, code) => {
    await start()
    const error = await aiClient('/v1', tokenName, false, slug).catch((e: unknown) => e)
    expect(MCPClientError.isInstance(error)).toBe(true)
    expect(error).toMatchObject({ statusCode: status })
    expect(JSON.parse((error as MCPClientError).responseBody!)).toMatchObject({ id: null, error: { code } })
  })

  it('429 on a call in an open session surfaces with the rate-limit data', async () => {
    await start()
    const client = await aiClient('/v1', 'alice-limited', false, 'limited')
    await exhaustRateLimit('limited', 'alice-limited')
    const error = await client.callTool({ name: 'echo', arguments: { text: 'hi' } }).catch((e: unknown) => e)
    expect(error).toMatchObject({ statusCode: 429 })
    expect(JSON.parse((error as MCPClientError).responseBody!)).toMatchObject({
      error: { code: -32000, message: 'Rate limit exceeded', data: { limit: LIMIT, windowType: 'minute' } },
    })
    await client.close()
  })
})

describe('@ai-sdk/mcp signing in with its OAuth authProvider', () => {
  let authServer: DevAuthServer

  beforeAll(async () => {
    authServer = await startDevAuthServer({ accounts: ['user_alice'] })
  })
  afterAll(async () => {
    await authServer?.close()
  })

  it('finds the metadata from the 401 challenge, registers, signs in and calls a tool', async () => {
    errors = []
    platform = createPlatform({
      seed: testSeed(),
      authorizationServer: { issuer: authServer.issuer },
      onError: (error, context) => errors.push({ error, context }),
    })
    server = await serveFetch((request, info) => platform.fetch(request, info))
    try {
      const url = `${origin()}/v1`
      const provider = new TestOAuthClient({ loginHint: 'user_alice' })
      const seen: string[] = []
      // The App through `localhostFetch`, the authorization server (127.0.0.1) through Node's.
      const fetch: typeof globalThis.fetch = async (input, init) => {
        const target = input instanceof Request ? input.url : String(input)
        seen.push(`${init?.method ?? 'GET'} ${target}`)
        return new URL(target).hostname.endsWith('.localhost') ? localhostFetch(input, init) : globalThis.fetch(input, init)
      }
      const transport = { type: 'http' as const, url, authProvider: provider as unknown as OAuthClientProvider, fetch }

      // The first connection ends at the browser: the provider played it and kept the code.
      await expect(createMCPClient({ transport })).rejects.toBeInstanceOf(UnauthorizedError)
      expect(seen.slice(0, 2)).toEqual([`POST ${url}`, `GET ${origin()}/.well-known/oauth-protected-resource`])
      expect(provider.code).toEqual(expect.any(String))

      const params = provider.callbackParams!
      const outcome = await auth(provider as unknown as OAuthClientProvider, {
        serverUrl: url,
        authorizationCode: provider.code,
        callbackState: params.get('state') ?? undefined,
        callbackIssuer: params.get('iss') ?? undefined,
        fetchFn: fetch,
      })
      expect(outcome).toBe('AUTHORIZED')

      const client = await createMCPClient({ transport })
      const result = await client.callTool({ name: 'echo', arguments: { text: 'signed in' } })
      expect(result.content).toEqual([{ type: 'text', text: 'signed in (from weather 1.1.1)' }])
      await client.close()
    } finally {
      await stop()
    }
  })
})

/** What a child process printed, and how it ended. */
interface Finished {
  code: number | null
  stdout: string
  stderr: string
}

/**
 * Runs `node args…` with `*.localhost` resolved to loopback; kills it past `timeoutMs`, a guard
 * against a hang, not a measure: the Inspector's two processes take about a second here, and
 * once took 15 s on a machine also running the conformance runner and a type check.
 */
function runNode(
  args: string[],
  { node = process.execPath, env = process.env, timeoutMs = 25_000 }: { node?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<Finished> {
  const child = spawn(node, args, {
    env: { ...env, NODE_OPTIONS: `--import ${RESOLVE_LOCALHOST}` },
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  let stdout = ''
  let stderr = ''
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()))
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`node ${args.join(' ')} overran ${timeoutMs} ms:\n${stdout}\n${stderr}`))
    }, timeoutMs)
    child.on('error', reject)
    child.on('close', (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })
}

describe('the MCP Inspector CLI (@modelcontextprotocol/inspector --cli)', () => {
  beforeAll(start)
  afterAll(stop)

  /** `mcp-inspector --cli <url> --transport http [--header 'Authorization: Bearer …'] …`. */
  const inspector = (url: string, tokenName: string | undefined, ...args: string[]) =>
    runNode([
      INSPECTOR_CLI,
      '--cli',
      url,
      '--transport',
      'http',
      ...(tokenName === undefined ? [] : ['--header', `Authorization: Bearer ${token(tokenName)}`]),
      ...args,
    ])

  it('lists tools at /v1 and calls one at an exact version', async () => {
    const listed = await inspector(`${origin()}/v1`, 'alice', '--method', 'tools/list')
    expect(listed.code).toBe(0)
    expect((JSON.parse(listed.stdout) as { tools: Array<{ name: string }> }).tools.map((t) => t.name).sort()).toEqual(APP_TOOLS)

    const called = await inspector(`${origin()}/v1.0.0`, 'alice', '--method', 'tools/call', '--tool-name', 'get_version')
    expect(called.code).toBe(0)
    expect(JSON.parse(called.stdout)).toMatchObject({ structuredContent: { app: 'weather', version: '1.0.0' } })
    expect(mcpRequests().filter((r) => r.path === '/v1.0.0').every((r) => r.version === '1.0.0')).toBe(true)
  })

  it.each([
    ['no token', '/v1', undefined, -32001],
    ['an inactive subscription', '/v1', 'bob', -32002],
    ['an exact version that is not live', '/v1.1.0', 'alice', -32004],
  ])('%s: exits 1, printing the JSON-RPC error body', async (_case, path, tokenName, code) => {
    const refused = await inspector(`${origin()}${path}`, tokenName, '--method', 'tools/list')
    expect(refused.code).toBe(1)
    const body = /\{"jsonrpc".*\}/.exec(refused.stderr + refused.stdout)?.[0]
    expect(JSON.parse(body ?? 'null')).toMatchObject({ id: null, error: { code } })
  })
})

/**
 * The MCP Inspector 2.x's CLI: one process per call, on Node 22 (it asks for 22.19 or later),
 * with `--format json` (a result, or an error object, as one JSON document). Its client is the
 * SDK 2.x's: the 2025 handshake unless told `--protocol-era modern` (MCP 2026-07-28:
 * `server/discover`, no session). Without `--stored-auth-only`, a 401 starts an OAuth sign-in in
 * a browser. A home of its own and its secrets in memory, so nothing is written outside it.
 */
describe.skipIf(!inspector2Available('the MCP Inspector 2.x CLI'))('the MCP Inspector 2.x CLI (on Node 22)', () => {
  let home: string
  beforeAll(async () => {
    home = await mkdtemp(join(tmpdir(), 'mcp-inspector-'))
  })
  afterAll(async () => {
    await rm(home, { recursive: true, force: true })
  })

  /**
   * `mcp-inspector --cli <url> --transport http --format json …`, on Node 22, with none of the
   * developer's `MCP_*` settings (where it keeps its catalog, sign-ins and secrets) and no desktop.
   */
  const inspector = (url: string, args: string[], env: Record<string, string> = {}) =>
    runNode([INSPECTOR_2_CLI, url, '--transport', 'http', '--format', 'json', ...args], {
      node: NODE_22,
      env: { ...withoutDesktop(process.env, (name) => name.startsWith('MCP_')), HOME: home, MCP_INSPECTOR_SECRET_STORE: 'memory', ...env },
    })
  /** With `Authorization: Bearer <secret>`, and no OAuth sign-in. */
  const withToken = (secret: string) => ['--header', `Authorization: Bearer ${secret}`, '--stored-auth-only']

  /** The JSON document the CLI printed: `{ result }` on stdout, `{ error }` on stderr. */
  const printed = (text: string) => JSON.parse(text) as { result?: Record<string, unknown>; error?: { code: string; message: string; status?: number } }

  describe('with an API token', () => {
    beforeAll(start)
    afterAll(stop)

    // Two processes, each allowed runNode's 25 s.
    it('lists tools at /v1 and calls one at an exact version, over the 2025 handshake (a session)', { timeout: 60_000 }, async () => {
      const listed = await inspector(`${origin()}/v1`, [...withToken(token('alice')), '--method', 'tools/list'])
      expect(listed.code, listed.stderr).toBe(0)
      expect((printed(listed.stdout).result!.tools as Array<{ name: string }>).map((t) => t.name).sort()).toEqual(APP_TOOLS)

      const called = await inspector(`${origin()}/v1.0.0`, [...withToken(token('alice')), '--method', 'tools/call', '--tool-name', 'get_version'])
      expect(called.code, called.stderr).toBe(0)
      expect(printed(called.stdout).result).toMatchObject({ structuredContent: { app: 'weather', version: '1.0.0' } })
      const exact = mcpRequests().filter((r) => r.path === '/v1.0.0')
      expect(exact.some((r) => r.method === 'POST' && r.status === 200 && r.session !== null)).toBe(true)
      expect(exact.filter((r) => r.status < 300).every((r) => r.version === '1.0.0')).toBe(true)
    })

    it('MCP 2026-07-28 (--protocol-era modern): calls a tool at /v1 without a session, served by the version the path names', async () => {
      log = []
      const called = await inspector(`${origin()}/v1`, [...withToken(token('alice')), '--protocol-era', 'modern', '--method', 'tools/call', '--tool-name', 'echo', '--tool-arg', 'text=modern'])
      expect(called.code, called.stderr).toBe(0)
      expect(printed(called.stdout).result).toMatchObject({ content: [{ type: 'text', text: 'modern (from weather 1.1.1)' }] })
      const requests = mcpRequests()
      // `server/discover` first; then, beside the call, its `subscriptions/listen` stream and `tools/list`.
      expect(requests[0]?.mcpMethod).toBe('server/discover')
      expect(requests.map((r) => r.mcpMethod)).toContain('tools/call')
      expect(requests.every((r) => r.protocol === '2026-07-28' && r.session === null && r.status === 200 && r.version === '1.1.1')).toBe(true)
    })

    it.each([
      ['no token', '/v1', undefined, -32001, 3, 401],
      ['a made-up token', '/v1', 'svc_notatoken', -32001, 3, 401],
      ['an inactive subscription', '/v1', 'bob', -32002, 1, 402],
      ['an exact version that is not live', '/v1.1.0', 'alice', -32004, 1, 404],
    ])('%s: refused, the JSON-RPC error body in what it prints', async (_case, path, caller, code, exit, status) => {
      const credential = caller === undefined ? ['--stored-auth-only'] : withToken(caller.startsWith('svc_') ? caller : token(caller))
      const refused = await inspector(`${origin()}${path}`, [...credential, '--method', 'tools/list'])
      expect(refused.code, refused.stderr).toBe(exit)
      const error = printed(refused.stderr).error!
      const body = /\{"jsonrpc".*\}/.exec(error.message)?.[0]
      expect(JSON.parse(body ?? 'null'), error.message).toMatchObject({ id: null, error: { code } })
      expect(mcpRequests().at(-1)).toMatchObject({ path, status })
    })
  })

  // As mcp-remote's below: `$BROWSER` steers `xdg-open` on Linux only.
  describe.skipIf(process.platform !== 'linux')('signing in with OAuth', () => {
    const authServer = devAuthServerOfSuite()

    it('registers, signs in through the browser and calls a tool', async () => {
      await startSigningInAt(authServer.issuer())
      try {
        // No desktop: `open` runs `xdg-open`, which runs `$BROWSER <url>`. Under vitest (`VITEST`
        // set) the CLI opens no browser unless told to.
        const callback = `http://127.0.0.1:${await freePort()}/oauth/callback`
        const called = await inspector(`${origin()}/v1`, ['--callback-url', callback, '--method', 'tools/call', '--tool-name', 'echo', '--tool-arg', 'text=signed in'], {
          BROWSER: HEADLESS_BROWSER,
          MCP_AUTO_OPEN_ENABLED: 'true',
        })
        expect(called.code, called.stderr).toBe(0)
        expect(printed(called.stdout).result).toMatchObject({ content: [{ type: 'text', text: 'signed in (from weather 1.1.1)' }] })
        expect(authServer.requests).toEqual(expect.arrayContaining(['POST /reg', 'GET /auth', 'GET /interaction/…', 'POST /token']))
        // Its first request met the 401 challenge; signed in, it was served.
        const requests = mcpRequests()
        expect(requests[0]).toMatchObject({ status: 401 })
        // (Its GET stream, opened beside the call, may be answered after it.)
        expect(requests.filter((r) => r.method === 'POST').at(-1)).toMatchObject({ status: 200, version: '1.1.1' })
      } finally {
        await stop()
      }
    })
  })
})

describe('mcp-remote (stdio bridge) with --header, driven by the SDK stdio client', () => {
  afterEach(stop)

  /** Starts mcp-remote for `url` with an API token header, and connects a stdio client to it. */
  async function bridge(url: string, tokenName: string, ...args: string[]): Promise<{ client: Client; stderr: () => string }> {
    const transport = new StdioClientTransport({
      command: process.execPath,
      args: [MCP_REMOTE, url, '--transport', 'http-only', '--allow-http', '--header', `Authorization: Bearer ${token(tokenName)}`, ...args],
      env: { ...(process.env as Record<string, string>), NODE_OPTIONS: `--import ${RESOLVE_LOCALHOST}`, MCP_REMOTE_CONFIG_DIR: configDir },
      stderr: 'pipe',
    })
    let stderr = ''
    transport.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()))
    const client = new Client({ name: 'stdio-host', version: '1.0.0' })
    await client.connect(transport)
    return { client, stderr: () => stderr }
  }

  /**
   * mcp-remote opens a session of its own to test the connection, then forwards the host's
   * `initialize` into a second one; it ends neither with `DELETE` (the App closes them when
   * idle: docs/platform.md).
   */
  it('lists and calls tools at /v1, and its session stays pinned across a deploy', async () => {
    await start()
    const { client } = await bridge(`${origin()}/v1`, 'alice')
    expect(client.getServerVersion()).toMatchObject({ name: 'weather', version: '1.1.1' })
    expect((await client.listTools()).tools.map((t) => t.name).sort()).toEqual(APP_TOOLS)

    platform.deploy('app_weather', '1.1.2') // replaces 1.1.1
    const pinned = await client.callTool({ name: 'get_version', arguments: {} })
    expect(pinned.structuredContent).toEqual({ app: 'weather', version: '1.1.1' })
    const last = mcpRequests().at(-1)!
    expect(last).toMatchObject({ method: 'POST', session: expect.any(String), status: 200, version: '1.1.1' })
    // The host's session had its GET stream too.
    expect(mcpRequests()).toContainEqual(
      expect.objectContaining({ method: 'GET', session: last.session, status: 200, contentType: 'text/event-stream' }),
    )
    await client.close()
  })

  it('a 429 of a call in an open session reaches the host with the JSON-RPC body in its message', async () => {
    await start()
    const { client } = await bridge(`${origin('limited')}/v1`, 'alice-limited')
    await exhaustRateLimit('limited', 'alice-limited')
    const error = await client.callTool({ name: 'echo', arguments: { text: 'hi' } }).catch((e: unknown) => e)
    // mcp-remote answers every failed request with its own code (-32001), the body in the message.
    expect(error).toMatchObject({ code: -32001 })
    const body = /\{"jsonrpc".*\}/.exec((error as Error).message)?.[0]
    expect(JSON.parse(body ?? 'null')).toMatchObject({
      error: { code: -32000, message: 'Rate limit exceeded', data: { limit: LIMIT, windowType: 'minute' } },
    })
    await client.close()
  })
})

/**
 * mcp-remote without `--header` signs in with OAuth: it finds the authorization server from
 * the 401's `resource_metadata`, registers (RFC 7591), and opens the authorization URL in a
 * browser with the `open` package, whose bundled `xdg-open` runs `$BROWSER <url>` outside a
 * desktop session. `BROWSER` here is `test/helpers/headless-browser.mjs`, which follows the
 * development authorization server's automatic sign-in to mcp-remote's callback on loopback;
 * mcp-remote then redeems the code and connects with the access token.
 */
// `$BROWSER` is how `xdg-open` is steered; on macOS and Windows `open` would start a real browser.
describe.skipIf(process.platform !== 'linux')('mcp-remote (stdio bridge) signing in with OAuth, driven by the SDK stdio client', () => {
  const authServer = devAuthServerOfSuite()

  it('registers, signs in through the browser, calls tools and stays pinned across a deploy', async () => {
    await startSigningInAt(authServer.issuer())
    // The callback port (mcp-remote's second argument).
    const remote = await connectMcpRemoteOAuth(`${origin()}/v1`, await freePort()).catch(async (error: unknown) => {
      await stop()
      throw error
    })
    const client = remote.client
    try {
      expect(remote.stderr()).toContain('Browser opened automatically')
      expect(authServer.requests).toEqual(
        expect.arrayContaining(['POST /reg', 'GET /auth', 'GET /interaction/…', 'POST /token', 'GET /me']),
      )
      expect(client.getServerVersion()).toMatchObject({ name: 'weather', version: '1.1.1' })
      const echoed = await client.callTool({ name: 'echo', arguments: { text: 'signed in' } })
      expect(echoed.content).toEqual([{ type: 'text', text: 'signed in (from weather 1.1.1)' }])

      platform.deploy('app_weather', '1.1.2') // replaces 1.1.1
      const pinned = await client.callTool({ name: 'get_version', arguments: {} })
      expect(pinned.structuredContent).toEqual({ app: 'weather', version: '1.1.1' })
      // Before signing in, its probe met the 401 challenge; afterwards every request went through.
      const requests = mcpRequests()
      expect(requests[0]).toMatchObject({ status: 401 })
      const last = requests.at(-1)!
      expect(last).toMatchObject({ method: 'POST', session: expect.any(String), status: 200, version: '1.1.1' })
      expect(requests.filter((r) => r.session === last.session).every((r) => r.status < 300)).toBe(true)
    } finally {
      await remote.close()
      await stop()
    }
  })
})
