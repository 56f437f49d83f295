/**
 * The platform of `token-api-runtimes-audit.test.ts`: the token API (`createTokenApi`) and the
 * dispatch layer (`mcpDispatch`) of one token service, as a platform serves both from one fetch
 * handler, on Bun, Deno, workerd and Node alike. The package is handed in (the suite hands it
 * the source, src/, so a fix is what runs).
 *
 * Nothing here draws random numbers, sets a timer or does I/O when it is created (Workers refuse
 * all three in global scope).
 *
 * Hosts: `dash.localhost` is the token API's (`/api/tokens`; the cookie `dash=<user>` is that
 * user's session, `X-CSRF-Token: csrf-ok` its CSRF token); `<app>.localhost` the Apps'
 * (`weather`, `notes`); `<app>.fixed.localhost` the Apps' through a dispatcher with a `baseUrl`
 * of its own (`https://<slug>.apps.example.com`); `<app>.other.localhost` through a second token
 * service on the same store and bus, as another instance; `control.localhost` the test's controls:
 * `GET /errors` (what `onError` got, then forgotten), `GET /stored?id=` (the record as the
 * store holds it: `lastUsedAt`, `revokedAt`), `POST /flush` (`tokens.flush()`), `POST /fail-publish?n=`
 * (the bus refuses its next `n` publishes).
 * A request may name its host in `X-Test-Host` (Node's `fetch` cannot set `Host`).
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import type { InvalidationBus, TokenStore } from 'mcp-dispatch'

type Package = typeof import('mcp-dispatch')
type WebAdapter = typeof import('mcp-dispatch/web')

/** The CSRF token of every session, in `X-CSRF-Token`. */
export const CSRF = 'csrf-ok'

/**
 * The token API's sessions as the audits sign them in (`token-api-audit.test.ts` too): the cookie
 * `dash=<user>` is that user's session, `X-CSRF-Token: csrf-ok` its CSRF token.
 */
export const DASH_SESSION = {
  authenticateSession: (request: Request) => {
    const user = /(?:^|;\s*)dash=(\w+)/.exec(request.headers.get('cookie') ?? '')?.[1]
    return user === undefined ? null : { userId: user }
  },
  verifyCsrf: (request: Request) => request.headers.get('x-csrf-token') === CSRF,
}

/**
 * The Apps (`weather`, `notes`, version 1.0.0) and their subscriptions (alice to both, bob to
 * `weather`) of the token API's audits, on the memory stores of `lib`.
 */
export function createAuditStores(lib: Pick<Package, 'createMemoryAppStore' | 'createMemorySubscriptionStore'>) {
  const apps = lib.createMemoryAppStore([
    { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] },
    { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['1.0.0'] },
  ])
  const subscriptions = lib.createMemorySubscriptionStore([
    { userId: 'alice', appId: 'app_weather', active: true },
    { userId: 'alice', appId: 'app_notes', active: true },
    { userId: 'bob', appId: 'app_weather', active: true },
  ])
  return { apps, subscriptions }
}

export interface AuditAppOptions {
  lastUsedFlushMs?: number
  waitUntil?: (promise: Promise<unknown>) => void
}

export function createAuditApp(lib: Package, web: WebAdapter, options: AuditAppOptions = {}) {
  const { createDispatcher, createMemoryTokenStore, createTokenApi, createTokenService, createMemoryInvalidationBus } = lib
  const { apps, subscriptions } = createAuditStores(lib)
  const errors: string[] = []
  const onError = (error: unknown, context: string) => void errors.push(`${context}: ${error instanceof Error ? error.message : String(error)}`)
  const store: TokenStore = createMemoryTokenStore()
  // One bus for two token services on one store (two instances of a platform), whose next
  // publishes can be made to fail (`POST /fail-publish?n=`).
  const inProcess = createMemoryInvalidationBus()
  let failing = 0
  const invalidations: InvalidationBus = {
    publish(message) {
      if (failing > 0) {
        failing--
        return Promise.reject(new Error('publish refused by the test'))
      }
      return inProcess.publish(message)
    },
    subscribe: (listener) => inProcess.subscribe(listener),
  }
  const serviceOptions = {
    store,
    apps,
    subscriptions,
    pepper: 'audit-pepper',
    // A cache, so that revocations and rotations must reach it through the bus.
    cacheTtlMs: 60_000,
    invalidations,
    onError,
    ...(options.lastUsedFlushMs !== undefined && { lastUsedFlushMs: options.lastUsedFlushMs }),
    ...(options.waitUntil && { waitUntil: options.waitUntil }),
  }
  const tokens = createTokenService(serviceOptions)
  const other = createTokenService(serviceOptions)
  const api = createTokenApi({ tokens, ...DASH_SESSION, onError })
  const common = { apps, subscriptions, tokens, onError, authorizationServers: ['https://auth.example.test'] }
  const dispatcher = createDispatcher(common)
  const fixed = createDispatcher({ ...common, baseUrl: (_request: unknown, app: { slug: string }) => `https://${app.slug}.apps.example.com` })
  // The MCP SDK's web-standard transport, stateless, reads the body as an App does.
  const handler = async (request: Request, context: { version: string }) => {
    const server = new McpServer({ name: 'audit', version: context.version })
    server.registerTool('get_version', { description: 'The version' }, async () => ({ content: [{ type: 'text', text: context.version }] }))
    const transport = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true })
    await server.connect(transport)
    return transport.handleRequest(request)
  }
  const dispatch = web.mcpDispatch({ dispatcher, handler, onError })
  const dispatchFixed = web.mcpDispatch({ dispatcher: fixed, handler, onError })
  const dispatchOther = web.mcpDispatch({ dispatcher: createDispatcher({ ...common, tokens: other }), handler, onError })

  async function control(request: Request, url: URL): Promise<Response> {
    if (url.pathname === '/errors') return Response.json(errors.splice(0))
    if (url.pathname === '/stored') {
      const record = await store.get(url.searchParams.get('id') ?? '')
      return Response.json(record === undefined || record === null ? null : { lastUsedAt: record.lastUsedAt ?? null, revokedAt: record.revokedAt ?? null })
    }
    if (url.pathname === '/fail-publish' && request.method === 'POST') {
      failing = Number(url.searchParams.get('n') ?? 1)
      return Response.json({ failing })
    }
    if (url.pathname === '/flush' && request.method === 'POST') {
      await tokens.flush()
      return Response.json({ flushed: true })
    }
    return new Response('no such control', { status: 404 })
  }

  return {
    api,
    dispatch,
    dispatchFixed,
    control,
    async serve(request: Request, clientAddress: string | undefined): Promise<Response> {
      const url = new URL(request.url)
      if (url.hostname === 'control.localhost') return control(request, url)
      if (url.hostname === 'dash.localhost') {
        const answered = await api(request, { clientAddress })
        if (answered !== null) return answered
      }
      const chosen = url.hostname.endsWith('.fixed.localhost') ? dispatchFixed : url.hostname.endsWith('.other.localhost') ? dispatchOther : dispatch
      return chosen(request, { clientAddress })
    },
  }
}
