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
import { type IncomingMessage, type RequestListener, type Server, type ServerResponse, createServer } from 'node:http'
import { getRequestListener } from '@hono/node-server'
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js'
import {
  type AppRecord,
  type DispatchContext,
  type Dispatcher,
  type MemoryAppStore,
  type Reply,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  invalidHostReply,
  jsonRpcErrorReply,
  sessionNotFoundReply,
} from 'mcp-dispatch'
import { answerExpectationFailed } from 'mcp-dispatch/web'
import { type CallerOf, asBatchAnswer, sweepPeriod } from '../platform/mcp-app.js'

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
 * The port an example listens on: the environment variable `name` (default `PORT`), else
 * `fallback` (0: any free port). A value that is no port number ends the process with one line
 * on stderr naming it (exit 2), never a stack trace.
 */
export function examplePort(fallback: number, name = 'PORT'): number {
  const raw = process.env[name] ?? String(fallback)
  const port = /^\d{1,5}$/.test(raw) ? Number(raw) : Number.NaN
  if (!(port <= 65_535)) {
    console.error(`${name}: must be a port number (0: any free port), got ${JSON.stringify(raw)}`)
    process.exit(2)
  }
  return port
}

/**
 * Ends the process when an example cannot listen on 127.0.0.1:`port` (a port taken: EADDRINUSE;
 * one below 1024 without the right: EACCES): one line on stderr naming the port's variable
 * (`name`, default `PORT`), the port and the system's reason, exit 1, never a stack trace.
 */
export function cannotListen(port: number, error: unknown, name = 'PORT'): never {
  console.error(`${name}: cannot listen on 127.0.0.1:${port}: ${error instanceof Error ? error.message : String(error)}`)
  process.exit(1)
}

/**
 * A `node:http` server for `listener` that answers in JSON-RPC, as every other refusal, what
 * Node would refuse with an empty answer before any handler: an HTTP/1.1 request without `Host`
 * (Node's `requireHostHeader`, turned off here: the 400 of `invalidHostReply()`, RFC 9112
 * section 3.2) and an `Expect` other than `100-continue` (417: `answerExpectationFailed`). What
 * Node's parser refuses gets its body from `answerClientError` (the server's `clientError`
 * event; Fastify's `clientErrorHandler` option).
 */
export function createNodeServer(listener: RequestListener): Server {
  const server = createServer({ requireHostHeader: false }, (req, res) => {
    if (req.headers.host === undefined && req.httpVersionMajor === 1 && req.httpVersionMinor >= 1) {
      const { status, headers, body } = invalidHostReply()
      return void res.writeHead(status, { ...headers, 'content-length': Buffer.byteLength(body!), connection: 'close' }).end(body)
    }
    listener(req, res)
  })
  server.on('checkExpectation', answerExpectationFailed)
  return server
}

/** Prints how to try an example. */
export function printUsage(name: string, port: number, token: string): void {
  console.log(`mcp-dispatch ${name} example listening on http://127.0.0.1:${port}`)
  console.log(`\ncurl -s http://127.0.0.1:${port}/v1 -H 'Authorization: Bearer ${token}' \\`)
  console.log(`  -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \\`)
  console.log(`  -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"0"}}}' -D -`)
}

/** The request body limit of the Express and Fastify examples: the MCP SDK transport's own. */
export const BODY_LIMIT = 4 * 1024 * 1024

/** Who is calling, for the per-caller session caps, from the dispatch context. */
export function callerOf(context: DispatchContext): CallerOf {
  const { subject, clientId } = context.identity
  return { subject, ...(clientId !== undefined && { clientId }), appId: context.app.id, version: context.version }
}

/** MCP sessions of one App version on the SDK's Node transport (Express, Fastify). */
export interface NodeSessions {
  /**
   * Serves a request. `parsedBody`: the body the framework's parser read (it tells `initialize`
   * from a one-shot request); `caller`: who is calling, whose sessions are capped.
   */
  handle(req: IncomingMessage, res: ServerResponse, parsedBody?: unknown, caller?: CallerOf): Promise<void>
  /** Number of open sessions. */
  sessionCount(): number
  close(): Promise<void>
}

/** Options of {@link createNodeSessions}. */
export interface NodeSessionsOptions {
  /** A session with no request and no answer open for this long is closed. Default an hour, the dispatch layer's pin lifetime. */
  idleMs?: number
  /**
   * At most this many open sessions; the least recently used with no answer open is closed
   * first (else the least recently used). Default 10,000.
   */
  maxSessions?: number
  /**
   * At most this many open sessions per caller; that caller's least recently used with no
   * answer open is closed first (else its least recently used). Default 100.
   */
  maxSessionsPerCaller?: number
  /** Clock, epoch ms, for idleness. Default `Date.now`. */
  now?: () => number
  /**
   * Idle sessions are closed this often (by the clock `now`): by a timer, which keeps no process
   * alive, so that a version no one opens sessions of any more still lets its abandoned ones go,
   * and by the requests that come. Default 60 s, as `createMcpAppHandler`'s.
   */
  sweepEveryMs?: number
}

const MCP_ACCEPT = 'application/json, text/event-stream'

/**
 * Names both MCP media types in `req`'s `Accept` for the SDK transport, which checks their
 * names literally (406 otherwise) and reads the headers from `rawHeaders`.
 */
function acceptBoth(req: IncomingMessage): void {
  const raw = req.rawHeaders
  for (let i = raw.length - 2; i >= 0; i -= 2) if (raw[i]!.toLowerCase() === 'accept') raw.splice(i, 2)
  raw.push('Accept', MCP_ACCEPT)
  req.headers.accept = MCP_ACCEPT
}

/**
 * Whether `accept` accepts the media type `type` (RFC 9110 section 12.5.1): the most specific
 * media range that matches it (`type` itself, then its major type's range, then any type's) has
 * a weight above 0 (`q`, 1 when not given; section 12.4.2). Media type parameters are not
 * compared.
 */
function accepts(accept: string, type: string): boolean {
  const wildcard = `${type.slice(0, type.indexOf('/'))}/*`
  let specificity = -1
  let weight = 0
  for (const element of accept.split(',')) {
    const [range = '', ...params] = element.split(';').map((part) => part.trim().toLowerCase())
    const rank = range === type ? 2 : range === wildcard ? 1 : range === '*/*' ? 0 : -1
    if (rank <= specificity) continue
    const q = params.find((param) => param.startsWith('q='))
    specificity = rank
    weight = q === undefined ? 1 : Number(q.slice(2)) || 0
  }
  return weight > 0
}

const isInitialize = (body: unknown) => (Array.isArray(body) ? body.some((m) => isInitializeRequest(m)) : isInitializeRequest(body))

/**
 * Serves one App version with the SDK's `StreamableHTTPServerTransport`, as the Hono and fetch
 * examples' `createMcpAppHandler` does on the web-standard one: an `initialize` opens a session,
 * the others find theirs by `Mcp-Session-Id`, and any other request without a session (spec
 * 4.1's bare `tools/list`) is served statelessly, in JSON, by a transport and a server of its
 * own. A session idle for `idleMs` (no request, no answer still open: a GET stream or a
 * streaming answer keeps it) is closed every `sweepEveryMs` and when another opens; past
 * `maxSessions`, and past the caller's `maxSessionsPerCaller`, opening one closes the least
 * recently used session with no answer open (else the least recently used). A session still
 * being opened is never closed for another: when every slot of the caller is one, the
 * `initialize` is answered 429 (503 when every slot of the version is).
 *
 * `Accept` is honoured (RFC 9110 section 12.5.1, weights read): none, or one that accepts both
 * MCP media types (the range of any type, say), is handed to the SDK transport as naming both,
 * which it checks literally; a one-shot request, answered in JSON only, needs `application/json`
 * accepted (by name, by `application/*` or by the range of any type, weight above 0). Any other
 * `Accept` gets the SDK transport's 406.
 */
export function createNodeSessions(build: () => McpServer, options: NodeSessionsOptions = {}): NodeSessions {
  const { idleMs = 60 * 60_000, maxSessions = 10_000, maxSessionsPerCaller = 100, now = Date.now } = options
  const sweepEveryMs = sweepPeriod(options.sweepEveryMs)
  /**
   * `open`: answers still streaming; `opening`: its `initialize` is not answered yet, and no
   * other `initialize` may close it (its client would get an id that answers 404).
   */
  type Session = { transport: StreamableHTTPServerTransport; lastSeen: number; open: number; opening: boolean; subject?: string }
  // Least recently used first, in all and per caller: each request moves its session last.
  const sessions = new Map<string, Session>()
  const sessionsOf = new Map<string, Set<string>>()
  const use = (id: string, session: Session) => {
    sessions.delete(id)
    sessions.set(id, session)
    if (session.subject === undefined) return
    let own = sessionsOf.get(session.subject)
    if (!own) sessionsOf.set(session.subject, (own = new Set()))
    own.delete(id)
    own.add(id)
  }
  const forget = (id: string) => {
    const subject = sessions.get(id)?.subject
    sessions.delete(id)
    const own = subject === undefined ? undefined : sessionsOf.get(subject)
    own?.delete(id)
    if (own?.size === 0) sessionsOf.delete(subject!)
  }
  const closeSession = (id: string) => {
    const session = sessions.get(id)
    forget(id)
    void session?.transport.close()
  }
  // An answer still open (a GET stream, a streaming tool call) keeps its session from idling,
  // and its end is a use of the session: it moves last, as a request does.
  const track = (id: string, session: Session, res: ServerResponse) => {
    // A response already closed (its client gone while the dispatch layer decided) emits no more.
    if (res.destroyed || res.closed) return
    session.open++
    res.once('close', () => {
      session.open--
      session.lastSeen = now()
      if (sessions.get(id) === session) use(id, session)
    })
  }
  let lastSweep = now()
  const sweep = () => {
    lastSweep = now()
    const cutoff = lastSweep - idleMs
    for (const [id, s] of sessions) if (s.open === 0 && !s.opening && s.lastSeen < cutoff) closeSession(id)
  }
  // Sessions of a version no one opens sessions of any more (one a deploy replaced) go too.
  let closed = false
  const sweeper = setInterval(() => {
    if (!closed && now() - lastSweep >= sweepEveryMs) sweep()
  }, sweepEveryMs)
  sweeper.unref?.()
  /**
   * The session of `ids` (least recently used first) to close for a new one: the first with no
   * answer open, else the first at all; never one still being opened.
   */
  const victim = (ids: Iterable<string>) => {
    let streaming: string | undefined
    for (const id of ids) {
      const s = sessions.get(id)!
      if (s.opening) continue
      if (s.open === 0) return id
      streaming ??= id
    }
    return streaming
  }
  /**
   * Closes the idle sessions and, past the caps, the ones `victim` picks; the refusal to answer
   * when the slots left are all sessions still being opened.
   */
  const makeRoom = (subject: string | undefined): Reply | undefined => {
    sweep()
    const own = subject === undefined ? undefined : sessionsOf.get(subject)
    while (own !== undefined && own.size >= maxSessionsPerCaller) {
      const id = victim(own)
      if (id === undefined) {
        return jsonRpcErrorReply(429, { code: -32000, message: `Too many sessions being opened for this caller (${maxSessionsPerCaller})` }, { 'retry-after': '1' })
      }
      closeSession(id)
    }
    while (sessions.size >= maxSessions) {
      const id = victim(sessions.keys())
      if (id === undefined) return jsonRpcErrorReply(503, { code: -32000, message: `Too many sessions being opened (${maxSessions})` }, { 'retry-after': '1' })
      closeSession(id)
    }
    return undefined
  }
  return {
    async handle(req, res, parsedBody, caller) {
      if (now() - lastSweep >= sweepEveryMs) sweep()
      // Spec 4.1 lists no `Accept`. What one accepts is read here, weights included, and refused
      // here (the SDK transport only looks for the types' names, so `application/json;q=0` would
      // pass it); one it accepts is rewritten to name both types, which the transport then takes.
      const accept = req.headers.accept
      const json = accept === undefined || accepts(accept, 'application/json')
      const stream = accept === undefined || accepts(accept, 'text/event-stream')
      const id = req.headers['mcp-session-id']
      const oneShot = typeof id !== 'string' && req.method === 'POST' && !isInitialize(parsedBody)
      // A one-shot request is answered in JSON; a GET opens a stream; any other POST may be either.
      const needed = oneShot ? json : req.method === 'GET' ? stream : req.method === 'POST' ? json && stream : true
      if (!needed) {
        const message = req.method === 'GET' ? 'Not Acceptable: Client must accept text/event-stream' : 'Not Acceptable: Client must accept both application/json and text/event-stream'
        const { status, headers, body } = jsonRpcErrorReply(406, { code: -32000, message })
        return void res.writeHead(status, headers).end(body)
      }
      acceptBoth(req)
      if (typeof id === 'string') {
        const session = sessions.get(id)
        // The dispatch layer's own 404 session_not_found (docs/adapters.md's nodeSessions): a
        // client sees one answer whichever layer lost the session.
        if (!session) {
          const { status, headers, body } = sessionNotFoundReply()
          return void res.writeHead(status, headers).end(body)
        }
        use(id, session)
        session.lastSeen = now()
        track(id, session, res)
        return session.transport.handleRequest(req, res, parsedBody)
      }
      if (req.method !== 'POST') {
        const { status, headers, body } = jsonRpcErrorReply(405, { code: -32000, message: 'Method not allowed without a session' }, { allow: 'POST' })
        return void res.writeHead(status, headers).end(body)
      }
      if (oneShot) {
        // Stateless, answered in JSON, to a client that accepts JSON (`application/json` alone, as
        // curl users send, included). The Web transport behind @hono/node-server's listener, as
        // the SDK's Node transport runs it, so that a batch that gets one response gets it in an
        // array (JSON-RPC 2.0 section 6), which the transport alone does not do.
        const transport = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true })
        const server = build()
        await server.connect(transport)
        const batch = Array.isArray(parsedBody)
        try {
          const listener = getRequestListener(
            async (request) => {
              const answer = await transport.handleRequest(request, { parsedBody })
              return batch ? asBatchAnswer(answer) : answer
            },
            { overrideGlobalObjects: false },
          )
          return await listener(req, res)
        } finally {
          void server.close()
        }
      }
      const refused = makeRoom(caller?.subject)
      if (refused) return void res.writeHead(refused.status, refused.headers).end(refused.body)
      // The session takes its slot here, before the first await, so a burst of `initialize`
      // cannot pass the caps, and keeps it, never closed for another, until its `initialize` is
      // answered; it is forgotten again if the transport refuses to open it.
      const sid = randomUUID()
      const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: () => sid, onsessionclosed: forget })
      const session: Session = { transport, lastSeen: now(), open: 0, opening: true, ...(caller && { subject: caller.subject }) }
      use(sid, session)
      track(sid, session, res)
      try {
        await build().connect(transport)
        await transport.handleRequest(req, res, parsedBody)
      } finally {
        session.opening = false
        if (transport.sessionId === undefined) forget(sid)
      }
    },
    sessionCount: () => sessions.size,
    async close() {
      closed = true
      clearInterval(sweeper)
      await Promise.all([...sessions.values()].map((s) => s.transport.close()))
      sessions.clear()
      sessionsOf.clear()
    },
  }
}
