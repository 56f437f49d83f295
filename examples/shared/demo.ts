/**
 * The setup the adapter examples share, so each example shows only its framework: one App
 * ("Weather", versions 1.0.0 and 2.0.0) on in-memory stores, one user with an active
 * subscription, and one API token for that user. A real platform passes its own stores.
 *
 * The examples serve that one App at the root of their server (`resolveApp`), so
 * `http://127.0.0.1:PORT/v1` reaches it; the reference platform (`examples/platform`) shows
 * the `{slug}.{domain}` layout instead.
 */
import { randomUUID } from 'node:crypto'
import type { IncomingMessage, ServerResponse } from 'node:http'
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import {
  type AppRecord,
  type Dispatcher,
  type MemoryAppStore,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  sessionNotFoundReply,
} from 'mcp-dispatch'

/** What an example needs to serve the demo App. */
export interface Demo {
  dispatcher: Dispatcher
  /** The demo App and its live versions (call `apps.deploy('app_weather', '2.1.0')` to deploy). */
  apps: MemoryAppStore
  app: AppRecord
  /** A valid API token of the demo user: `Authorization: Bearer <token>`. */
  token: string
}

/** Creates the demo stores, dispatcher and token. */
export async function createDemo(): Promise<Demo> {
  const app: AppRecord = { id: 'app_weather', slug: 'weather', name: 'Weather' }
  const apps = createMemoryAppStore([{ ...app, versions: ['1.0.0', '2.0.0'] }])
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: app.id, active: true }])
  const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
  const { token } = await tokens.create({ userId: 'alice', name: 'demo', servers: [app.id], expiresInDays: 7 })
  const dispatcher = createDispatcher({
    apps,
    subscriptions,
    tokens,
    resolveApp: () => app,
    rateLimit: { policy: () => ({ limit: 600, windowType: 'minute' }) },
  })
  return { dispatcher, apps, app, token }
}

/**
 * The port an example listens on: `PORT`, else `fallback` (0: any free port). A `PORT` that is no
 * port number ends the process with one line on stderr naming it (exit 2), never a stack trace.
 */
export function examplePort(fallback: number): number {
  const raw = process.env.PORT ?? String(fallback)
  const port = /^\d{1,5}$/.test(raw) ? Number(raw) : Number.NaN
  if (!(port <= 65_535)) {
    console.error(`PORT: must be a port number (0: any free port), got ${JSON.stringify(raw)}`)
    process.exit(2)
  }
  return port
}

/**
 * Ends the process when an example cannot listen on 127.0.0.1:`port` (a port taken: EADDRINUSE;
 * one below 1024 without the right: EACCES): one line on stderr naming the port and the system's
 * reason, exit 1, never a stack trace.
 */
export function cannotListen(port: number, error: unknown): never {
  console.error(`PORT: cannot listen on 127.0.0.1:${port}: ${error instanceof Error ? error.message : String(error)}`)
  process.exit(1)
}

/** Prints how to try an example. */
export function printUsage(name: string, port: number, token: string): void {
  console.log(`mcp-dispatch ${name} example listening on http://127.0.0.1:${port}`)
  console.log(`\ncurl -s http://127.0.0.1:${port}/v1 -H 'Authorization: Bearer ${token}' \\`)
  console.log(`  -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \\`)
  console.log(`  -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"0"}}}' -D -`)
}

/** MCP sessions of one App version on the SDK's Node transport (Express, Fastify). */
export interface NodeSessions {
  handle(req: IncomingMessage, res: ServerResponse, parsedBody?: unknown): Promise<void>
  close(): Promise<void>
}

/**
 * Serves one App version with the SDK's `StreamableHTTPServerTransport`: a request without a
 * session (`initialize`) opens one; the others find theirs by `Mcp-Session-Id`. A session idle
 * for `idleMs` (default an hour, the dispatch layer's pin lifetime), or the least recently used
 * past `maxSessions`, is closed when another opens.
 */
export function createNodeSessions(build: () => McpServer, idleMs = 60 * 60_000, maxSessions = 10_000): NodeSessions {
  const sessions = new Map<string, { transport: StreamableHTTPServerTransport; lastSeen: number }>()
  const error = (res: ServerResponse, status: number, message: string, allow?: string): void =>
    void res
      .writeHead(status, { 'content-type': 'application/json', ...(allow && { allow }) })
      .end(JSON.stringify({ jsonrpc: '2.0', id: null, error: { code: -32000, message } }))
  // Sessions idle past `idleMs` (the dispatch layer's pin lives an hour by default), and the
  // oldest past `maxSessions`, are closed when a new one opens: nothing is kept for ever.
  const sweep = () => {
    const cutoff = Date.now() - idleMs
    for (const [id, s] of sessions) {
      if (s.lastSeen >= cutoff && sessions.size < maxSessions) break
      sessions.delete(id)
      void s.transport.close()
    }
  }
  return {
    async handle(req, res, parsedBody) {
      const id = req.headers['mcp-session-id']
      if (typeof id === 'string') {
        const session = sessions.get(id)
        // The dispatch layer's own 404 session_not_found (docs/adapters.md's nodeSessions): a
        // client sees one answer whichever layer lost the session.
        if (!session) {
          const { status, headers, body } = sessionNotFoundReply()
          return void res.writeHead(status, headers).end(body)
        }
        // Most recently used last: the sweep finds the idle ones first.
        sessions.delete(id)
        sessions.set(id, session)
        session.lastSeen = Date.now()
        return session.transport.handleRequest(req, res, parsedBody)
      }
      if (req.method !== 'POST') return error(res, 405, 'Method not allowed without a session', 'POST')
      sweep()
      const transport: StreamableHTTPServerTransport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (sid) => void sessions.set(sid, { transport, lastSeen: Date.now() }),
        onsessionclosed: (sid) => void sessions.delete(sid),
      })
      await build().connect(transport)
      await transport.handleRequest(req, res, parsedBody)
    },
    async close() {
      await Promise.all([...sessions.values()].map((s) => s.transport.close()))
      sessions.clear()
    },
  }
}
