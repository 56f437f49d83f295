/**
 * The Web adapter (`mcp-dispatch/web`, as built in dist/) in front of the MCP SDK's
 * web-standard Streamable HTTP transport, served by Bun (`Bun.serve`) or Deno (`Deno.serve`):
 * the runtime `test/runtimes/web-runtimes.test.ts` runs it under. It prints one JSON line
 * (`{ port, tokens }`) once it listens, and serves until it is killed.
 *
 * Apps are found by their host (`weather.localhost`); a request may name its host in
 * `X-Test-Host` instead, since Node's `fetch` cannot set `Host`. `POST` to
 * `control.localhost/deploy` with `{ "version": "1.1.1" }` deploys a version of weather.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import type { DispatchContext } from 'mcp-dispatch'

// The built package, as users import it; typed by the source (tsconfig paths), which tsc can
// check before anything is built.
const dist = new URL('../../dist/', import.meta.url)
const { createDispatcher, createMemoryAppStore, createMemorySubscriptionStore, createMemoryTokenStore, createTokenService } =
  (await import(new URL('index.js', dist).href)) as typeof import('mcp-dispatch')
const { mcpDispatch } = (await import(new URL('adapters/web/index.js', dist).href)) as typeof import('mcp-dispatch/web')

const apps = createMemoryAppStore([
  { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0'] },
  { id: 'app_busy', slug: 'busy', name: 'Busy', versions: ['1.0.0'] },
])
const subscriptions = createMemorySubscriptionStore([
  { userId: 'alice', appId: 'app_weather', active: true },
  { userId: 'alice', appId: 'app_busy', active: true },
  { userId: 'bob', appId: 'app_weather', active: false },
])
// Bob publishes weather (so he may make a token for it) but holds no subscription to it: 402.
const tokens = createTokenService({
  store: createMemoryTokenStore(),
  apps,
  canUseServer: (userId, appId) => (userId === 'bob' ? appId === 'app_weather' : subscriptions.isActive(userId, appId)),
})
const alice = await tokens.create({ userId: 'alice', name: 'runtime test', servers: ['app_weather', 'app_busy'], expiresInDays: 7 })
const bob = await tokens.create({ userId: 'bob', name: 'runtime test', servers: ['app_weather'], expiresInDays: 7 })

const dispatcher = createDispatcher({
  apps,
  subscriptions,
  tokens,
  authorizationServers: ['https://auth.example.test'],
  rateLimit: { policy: (_identity, app) => ({ limit: app.id === 'app_busy' ? 1 : 1_000, windowType: 'minute' }) },
})

/** Sessions of the App versions: one SDK transport per `Mcp-Session-Id`. */
const sessions = new Map<string, WebStandardStreamableHTTPServerTransport>()

function buildServer(context: DispatchContext): McpServer {
  const server = new McpServer({ name: context.app.slug, version: context.version })
  server.registerTool('get_version', { description: `Version of ${context.app.name}` }, async () => ({
    content: [{ type: 'text', text: context.version }],
  }))
  return server
}

async function app(request: Request, context: DispatchContext): Promise<Response> {
  const id = request.headers.get('mcp-session-id')
  if (id !== null) {
    const transport = sessions.get(id)
    if (!transport) return Response.json({ jsonrpc: '2.0', id: null, error: { code: -32001, message: 'Session not found' } }, { status: 404 })
    return transport.handleRequest(request)
  }
  const body = request.method === 'POST' ? await request.json() : undefined
  const initialize = (body as { method?: unknown } | undefined)?.method === 'initialize'
  const transport = new WebStandardStreamableHTTPServerTransport(
    initialize
      ? {
          sessionIdGenerator: () => crypto.randomUUID(),
          onsessioninitialized: (sessionId) => void sessions.set(sessionId, transport),
          onsessionclosed: (sessionId) => void sessions.delete(sessionId),
        }
      : { sessionIdGenerator: undefined, enableJsonResponse: true },
  )
  await buildServer(context).connect(transport)
  return transport.handleRequest(request, { parsedBody: body })
}

const dispatch = mcpDispatch({ dispatcher, handler: app })

async function serve(request: Request, clientAddress: string | undefined): Promise<Response> {
  const testHost = request.headers.get('x-test-host')
  if (testHost !== null) {
    const url = new URL(request.url)
    url.host = testHost
    // Not `new Request(url, request)`: that copies (reads) `request.signal`, which Deno warns of.
    const body = request.method === 'GET' || request.method === 'HEAD' ? null : request.body
    request = new Request(url, { method: request.method, headers: request.headers, body, ...(body && { duplex: 'half' }) } as RequestInit)
  }
  const url = new URL(request.url)
  if (url.hostname === 'control.localhost' && url.pathname === '/deploy' && request.method === 'POST') {
    const { version } = (await request.json()) as { version: string }
    return Response.json({ live: apps.deploy('app_weather', version) })
  }
  return dispatch(request, { clientAddress })
}

interface Runtimes {
  Bun?: {
    serve(options: {
      port: number
      hostname: string
      fetch(request: Request, server: { requestIP(request: Request): { address: string } | null }): Promise<Response>
    }): { port: number }
  }
  Deno?: {
    serve(
      options: { port: number; hostname: string; onListen(address: { port: number }): void },
      handler: (request: Request, info: { remoteAddr: { hostname: string } }) => Promise<Response>,
    ): unknown
  }
}
const runtime = globalThis as Runtimes
const announce = (port: number) => console.log(JSON.stringify({ port, tokens: { alice: alice.token, bob: bob.token } }))

if (runtime.Bun) {
  const server = runtime.Bun.serve({
    port: 0,
    hostname: '127.0.0.1',
    fetch: (request, bun) => serve(request, bun.requestIP(request)?.address),
  })
  announce(server.port)
} else if (runtime.Deno) {
  runtime.Deno.serve(
    { port: 0, hostname: '127.0.0.1', onListen: ({ port }) => announce(port) },
    (request, info) => serve(request, info.remoteAddr.hostname),
  )
} else {
  throw new Error('test/runtimes/server.ts runs under Bun or Deno')
}
