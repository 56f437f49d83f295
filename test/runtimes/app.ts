/**
 * The platform the runtime suites serve: the Web adapter (`mcp-dispatch/web`, as built in dist/)
 * in front of the MCP SDK's web-standard Streamable HTTP transport. `server.ts` serves it on Bun
 * and Deno, `worker.ts` on workerd (Cloudflare Workers' runtime). The package is handed in, since
 * Bun and Deno import dist/ by its path and the worker is bundled from it.
 *
 * Nothing here draws random numbers, sets a timer or does I/O when it is created: Workers refuse
 * all three in global scope, where a Worker creates it. The API tokens are made by the first
 * `GET control.localhost/tokens`.
 *
 * Hosts: `<app>.localhost` (`weather`, `busy`, `notes`); a request may name its host in
 * `X-Test-Host` instead, since Node's `fetch` cannot set `Host`. `control.localhost` serves the
 * test's controls (below). With `oauth`, the dispatcher also takes OAuth access tokens (userinfo
 * mode), and `<app>.jwt.localhost` is a second dispatcher in `jwt` mode.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import type { DispatchContext, OAuthValidatorEvent, TokenStore } from 'mcp-dispatch'

type Package = typeof import('mcp-dispatch')
type WebAdapter = typeof import('mcp-dispatch/web')

/** Options of {@link createRuntimeApp}; the worker reads them from its bindings. */
export interface RuntimeAppOptions {
  /** Accept OAuth access tokens of this issuer, validated at its userinfo endpoint. */
  issuer?: string
  /** The userinfo endpoint, where it is not the issuer's (a proxy the test slows down). */
  userinfoEndpoint?: string
  /** Serve `<app>.jwt.localhost` in `jwt` mode, with the keys of this issuer. */
  jwtIssuer?: string
  /** The key set of the `jwt` validator, where it is not the issuer's (a proxy the test slows down). */
  jwksUrl?: string
  /** `jwksMaxAgeMs` and `jwksRefetchIntervalMs` of the `jwt` validator. */
  jwksMaxAgeMs?: number
  /** `timeoutMs` of the userinfo validator, whose retries then end within twice that. */
  oauthTimeoutMs?: number
  /** `lastUsedFlushMs` of the token service. */
  lastUsedFlushMs?: number
  /** `sessionTtlMs` of the dispatcher. */
  sessionTtlMs?: number
  /** Handed to the token service and the validators (Workers: `waitUntil` of `cloudflare:workers`). */
  waitUntil?: (promise: Promise<unknown>) => void
}

/** Users and their API tokens, made by the first `GET control.localhost/tokens`. */
export interface RuntimeTokens {
  alice: string
  bob: string
}

/**
 * The platform as one `(request, clientAddress) => Response`. Controls, on `control.localhost`:
 *
 * - `POST /deploy` with `{ "version": "1.1.1" }` deploys a version of weather;
 * - `GET /tokens` answers {@link RuntimeTokens};
 * - `GET /last-used` answers the `last_used_at` of alice's token as the store holds it (written
 *   by the token service's coalesced flush, not the pending value the token API shows);
 * - `GET /events` answers, and forgets, what the OAuth validators reported (`onEvent`).
 *
 * A request with `X-Test-Answer-Within: <ms>` is answered 504 `abandoned` when the dispatch
 * layer has not answered within that time: its request ends while what it started goes on,
 * as when a Workers client goes away.
 */
export function createRuntimeApp(lib: Package, web: WebAdapter, options: RuntimeAppOptions = {}) {
  const { createDispatcher, createMemoryAppStore, createMemorySubscriptionStore, createMemoryTokenStore, createOAuthValidator, createTokenService } = lib
  const apps = createMemoryAppStore([
    { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.1.0'] },
    { id: 'app_busy', slug: 'busy', name: 'Busy', versions: ['1.0.0'] },
    { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['1.0.0'] },
  ])
  const subscriptions = createMemorySubscriptionStore([
    { userId: 'alice', appId: 'app_weather', active: true },
    { userId: 'alice', appId: 'app_busy', active: true },
    { userId: 'alice', appId: 'app_notes', active: true },
    { userId: 'bob', appId: 'app_weather', active: false },
    // The OAuth tests' user (the development authorization server's account).
    { userId: 'user_alice', appId: 'app_weather', active: true },
  ])
  const store: TokenStore = createMemoryTokenStore()
  // Bob publishes weather (so he may make a token for it) but holds no subscription to it: 402.
  const tokens = createTokenService({
    store,
    apps,
    canUseServer: (userId, appId) => (userId === 'bob' ? appId === 'app_weather' : subscriptions.isActive(userId, appId)),
    pepper: 'runtime-test-pepper',
    ...(options.lastUsedFlushMs !== undefined && { lastUsedFlushMs: options.lastUsedFlushMs }),
    ...(options.waitUntil && { waitUntil: options.waitUntil }),
  })
  const events: OAuthValidatorEvent[] = []
  const onEvent = (event: OAuthValidatorEvent) => void events.push(event)
  const common = {
    apps,
    subscriptions,
    tokens,
    ...(options.sessionTtlMs !== undefined && { sessionTtlMs: options.sessionTtlMs }),
    rateLimit: {
      policy: (_identity: unknown, app: { id: string }) => ({ limit: app.id === 'app_busy' ? 1 : 1_000, windowType: 'minute' as const }),
    },
  }
  const dispatcher = createDispatcher({
    ...common,
    authorizationServers: [options.issuer ?? 'https://auth.example.test'],
    ...(options.issuer !== undefined && {
      oauth: createOAuthValidator({
        issuer: options.issuer,
        ...(options.userinfoEndpoint !== undefined && { userinfoEndpoint: options.userinfoEndpoint }),
        ...(options.oauthTimeoutMs !== undefined && { timeoutMs: options.oauthTimeoutMs, retry: { deadlineMs: 2 * options.oauthTimeoutMs } }),
        ...(options.waitUntil && { waitUntil: options.waitUntil }),
            onEvent,
      }),
    }),
  })
  const jwtDispatcher =
    options.jwtIssuer === undefined
      ? undefined
      : createDispatcher({
          ...common,
          authorizationServers: [options.jwtIssuer],
          // The App address from the Host, said outright: the test's hosts are its own.
          baseUrl: (request) => request.origin,
          oauth: createOAuthValidator({
            issuer: options.jwtIssuer,
            mode: 'jwt',
            // The App the token is presented to, named (the test's hosts are its own).
            audience: ({ resource }) => resource,
            ...(options.jwksUrl !== undefined && { jwks: options.jwksUrl }),
            ...(options.jwksMaxAgeMs !== undefined && { jwksMaxAgeMs: options.jwksMaxAgeMs, jwksRefetchIntervalMs: options.jwksMaxAgeMs }),
            ...(options.waitUntil && { waitUntil: options.waitUntil }),
                    onEvent,
          }),
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

  const dispatch = web.mcpDispatch({ dispatcher, handler: app })
  const dispatchJwt = jwtDispatcher && web.mcpDispatch({ dispatcher: jwtDispatcher, handler: app })

  let issued: Promise<RuntimeTokens & { aliceId: string }> | undefined
  const issue = async () => {
    const alice = await tokens.create({ userId: 'alice', name: 'runtime test', servers: ['app_weather', 'app_busy'], expiresInDays: 7 })
    const bob = await tokens.create({ userId: 'bob', name: 'runtime test', servers: ['app_weather'], expiresInDays: 7 })
    return { alice: alice.token, bob: bob.token, aliceId: alice.id }
  }

  async function control(request: Request, path: string): Promise<Response> {
    if (path === '/deploy' && request.method === 'POST') {
      const { version } = (await request.json()) as { version: string }
      return Response.json({ live: apps.deploy('app_weather', version) })
    }
    if (path === '/tokens') {
      const { alice, bob } = await (issued ??= issue())
      return Response.json({ alice, bob })
    }
    if (path === '/last-used') {
      const record = await store.get((await (issued ??= issue())).aliceId)
      return Response.json({ lastUsedAt: record?.lastUsedAt ?? null })
    }
    if (path === '/events') return Response.json(events.splice(0))
    return new Response('no such control', { status: 404 })
  }

  return {
    async serve(request: Request, clientAddress: string | undefined): Promise<Response> {
      const url = new URL(request.url)
      if (url.hostname === 'control.localhost') return control(request, url.pathname)
      const answering = (url.hostname.endsWith('.jwt.localhost') && dispatchJwt ? dispatchJwt : dispatch)(request, { clientAddress })
      const within = request.headers.get('x-test-answer-within')
      if (within === null) return answering
      answering.catch(() => {})
      return Promise.race([answering, new Promise<Response>((resolve) => setTimeout(() => resolve(new Response('abandoned', { status: 504 })), Number(within)))])
    },
  }
}

/** `request` with the host its `X-Test-Host` names, if it names one. */
export function withTestHost(request: Request): Request {
  const testHost = request.headers.get('x-test-host')
  if (testHost === null) return request
  const url = new URL(request.url)
  url.host = testHost
  // Not `new Request(url, request)`: that copies (reads) `request.signal`, which Deno warns of.
  const body = request.method === 'GET' || request.method === 'HEAD' ? null : request.body
  return new Request(url, { method: request.method, headers: request.headers, body, ...(body && { duplex: 'half' }) } as RequestInit)
}
