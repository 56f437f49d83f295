/**
 * The platform of the Next.js test app: the built package's dispatcher and Web adapter in front
 * of the MCP SDK's web-standard transport (one transport per session), as
 * test/runtimes/server.ts serves it on Bun and Deno, plus what the test observes through
 * `/control/*`: request-signal aborts, event streams ended, and a tool that holds its answer open.
 *
 * Everything is kept on `globalThis`: sessions and pins live in this process's memory, and a
 * module may be evaluated more than once in it (every route's bundle under `next dev`, which
 * also re-evaluates a module it reloads); `next start` evaluates it once, which the count
 * `mcpTestModuleEvaluations` lets the test check.
 */
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import {
  type DispatchContext,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
} from 'mcp-dispatch'
import { type WebDispatchHandler, mcpDispatch, whenBodyEnds } from 'mcp-dispatch/web'

/** What the test reads through `GET /control/state`. */
export interface Observed {
  /** Requests the App handler saw whose `request.signal` aborted (the client went away). */
  aborted: number
  /** Event streams the App answered with, and how many of them ended (read out or cancelled). */
  streams: number
  streamsEnded: number
}

interface Platform {
  apps: ReturnType<typeof createMemoryAppStore>
  tokens: { alice: string; bob: string; allowlisted: string; loopback: string }
  handle: WebDispatchHandler
  observed: Observed
  /** Lets the tool `wait_for_release` answer. */
  release: () => void
}

async function createPlatform(): Promise<Platform> {
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
  const issue = async (userId: string, servers: string[], allowedIps?: string[]) =>
    (await tokens.create({ userId, name: 'nextjs test', servers, expiresInDays: 7, ...(allowedIps && { allowedIps }) })).token
  const issued = {
    alice: await issue('alice', ['app_weather', 'app_busy']),
    bob: await issue('bob', ['app_weather']),
    // TEST-NET-2: no client of the test has this address, so only a forged one could pass.
    allowlisted: await issue('alice', ['app_weather'], ['198.51.100.7']),
    loopback: await issue('alice', ['app_weather'], ['127.0.0.1']),
  }

  const dispatcher = createDispatcher({
    apps,
    subscriptions,
    tokens,
    authorizationServers: ['https://auth.example.test'],
    rateLimit: { policy: (_identity, app) => ({ limit: app.id === 'app_busy' ? 1 : 1_000, windowType: 'minute' }) },
  })

  const observed: Observed = { aborted: 0, streams: 0, streamsEnded: 0 }
  let released: Promise<void> = Promise.resolve()
  let release = () => {}
  const hold = () => {
    released = new Promise((resolve) => (release = resolve))
  }
  hold()

  function buildServer(context: DispatchContext): McpServer {
    const server = new McpServer({ name: context.app.slug, version: context.version }, { capabilities: { logging: {} } })
    server.registerTool('get_version', { description: `Version of ${context.app.name}` }, async () => ({
      content: [{ type: 'text', text: context.version }],
    }))
    // Answers by event stream: a notification at once, the result once the test releases it.
    server.registerTool('wait_for_release', { description: 'Answers once released' }, async (extra) => {
      await extra.sendNotification({ method: 'notifications/message', params: { level: 'info', data: 'waiting' } })
      await released
      hold()
      return { content: [{ type: 'text', text: 'released' }] }
    })
    // A notification of no request: it goes out on the session's GET stream.
    server.registerTool('notify', { description: 'Says the tool list changed' }, async () => {
      server.sendToolListChanged()
      return { content: [{ type: 'text', text: 'notified' }] }
    })
    return server
  }

  /** Sessions of the App versions: one SDK transport per `Mcp-Session-Id`. */
  const sessions = new Map<string, WebStandardStreamableHTTPServerTransport>()

  async function serve(request: Request, context: DispatchContext): Promise<Response> {
    // The request body as the handler receives it, for the test to compare with what it sent.
    if (request.headers.has('x-test-echo')) {
      const bytes = new Uint8Array(await request.arrayBuffer())
      const digest = Buffer.from(await crypto.subtle.digest('SHA-256', bytes)).toString('hex')
      return Response.json({ length: bytes.length, sha256: digest })
    }
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

  const handle = mcpDispatch({
    dispatcher,
    handler: async (request, context) => {
      request.signal.addEventListener('abort', () => observed.aborted++, { once: true })
      let response = await serve(request, context)
      if (!response.headers.get('content-type')?.startsWith('text/event-stream')) return response
      if (new URL(request.url).searchParams.has('open-stream')) response = openedStream(response)
      observed.streams++
      return whenBodyEnds(response, () => observed.streamsEnded++)
    },
  })

  return { apps, tokens: issued, handle, observed, release: () => release() }
}

/**
 * `response`, its event stream opened by an SSE comment (which clients skip): Next.js sends a
 * response's head with its first chunk, and the SDK's GET stream writes none until the server
 * has something to say.
 */
function openedStream(response: Response): Response {
  const { readable, writable } = new TransformStream<Uint8Array, Uint8Array>({
    start: (controller) => controller.enqueue(new TextEncoder().encode(': open\n\n')),
  })
  void response.body!.pipeTo(writable).catch(() => {})
  return new Response(readable, { status: response.status, statusText: response.statusText, headers: response.headers })
}

const kept = globalThis as { mcpTestPlatform?: Promise<Platform>; mcpTestModuleEvaluations?: number }
kept.mcpTestModuleEvaluations = (kept.mcpTestModuleEvaluations ?? 0) + 1
export const platform = (kept.mcpTestPlatform ??= createPlatform())
