/**
 * One App version as a real MCP server (the official SDK), served over the web-standard
 * Streamable HTTP transport. Requests that open a session (`initialize`) get a stateful
 * transport, kept until DELETE or idle expiry; other requests without a session are served
 * statelessly with a JSON response, so `curl … tools/list` works in one request (spec 4.1).
 *
 * Both revisions of the transport are served. MCP 2025-era requests go to the SDK v1 server
 * above (sessions, SSE resumption, server-to-client requests: everything the conformance
 * suite's 2025-11-25 scenarios exercise). Requests of MCP 2026-07-28 (no session; the method
 * and the protocol version in every request) go to an SDK v2 `createMcpHandler` serving the
 * App's own tools, routed by the SDK's own classifier (`isLegacyRequest`).
 *
 * This is the platform's handler, not the library: it may read the body.
 */
import { randomUUID } from 'node:crypto'
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import {
  type McpHttpHandler,
  McpServer as ModernMcpServer,
  type ServerNotifier,
  createMcpHandler,
  isLegacyRequest,
} from '@modelcontextprotocol/server'
import { WebStandardStreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js'
import { LATEST_PROTOCOL_VERSION, SUPPORTED_PROTOCOL_VERSIONS } from '@modelcontextprotocol/sdk/types.js'
import { sessionNotFoundReply } from 'mcp-dispatch'
import { toResponse, whenBodyEnds } from 'mcp-dispatch/web'
import { z } from 'zod'
import { registerConformanceFeatures } from './conformance-features.js'
import { registerModernConformanceFeatures, requestStateCodec } from './conformance-features-modern.js'
import { createSessionEventStore } from './event-store.js'

/**
 * Builds the MCP server of one App version: its own tools (`get_version`, `echo`, `count`) and,
 * unless `conformance` is `false`, the features of the MCP conformance suite
 * (conformance-features.ts: the reference platform serves them; the adapter examples do not).
 */
export function buildAppServer(app: AppIdentity, version: string, options: { conformance?: boolean } = {}): McpServer {
  const server = new McpServer({ name: app.slug, version }, { capabilities: { logging: {} } })
  const tools = appTools(app, version)
  server.registerTool('get_version', { ...tools.getVersion.config, inputSchema: {} }, async () => tools.getVersion.run())
  server.registerTool('echo', { ...tools.echo.config, inputSchema: tools.echo.input.shape }, async (args) => tools.echo.run(args))
  server.registerTool('count', { ...tools.count.config, inputSchema: tools.count.input.shape }, async (args, extra) =>
    tools.count.run(args, extra._meta?.progressToken, (notification) => extra.sendNotification(notification)),
  )
  if (options.conformance ?? true) registerConformanceFeatures(server)
  return server
}

/**
 * The same App version for MCP 2026-07-28 clients (SDK v2): the App's own tools, answered per
 * request. Progress notifications ride on the answer, which the SDK then streams (SSE).
 * `notify` reaches the version's open `subscriptions/listen` streams.
 */
export function buildModernAppServer(app: AppIdentity, version: string, notify: ServerNotifier): ModernMcpServer {
  const server = new ModernMcpServer(
    { name: app.slug, version },
    { capabilities: { logging: {} }, requestState: { verify: requestStateCodec.verify } },
  )
  const tools = appTools(app, version)
  server.registerTool('get_version', tools.getVersion.config, async () => tools.getVersion.run())
  server.registerTool('echo', { ...tools.echo.config, inputSchema: tools.echo.input }, async (args) => tools.echo.run(args))
  server.registerTool('count', { ...tools.count.config, inputSchema: tools.count.input }, async (args, ctx) =>
    tools.count.run(args, ctx.mcpReq._meta?.progressToken, (notification) => ctx.mcpReq.notify(notification)),
  )
  registerModernConformanceFeatures(server, notify)
  return server
}

/** What an App server is named by. */
export interface AppIdentity {
  slug: string
  name: string
}

type Progress = { method: 'notifications/progress'; params: { progressToken: string | number; progress: number; total: number } }

/** The App's own tools, once for both SDK lines: their descriptions, inputs and answers. */
function appTools(app: AppIdentity, version: string) {
  const text = (value: string) => ({ content: [{ type: 'text' as const, text: value }] })
  return {
    getVersion: {
      config: {
        title: `${app.name} version`,
        description: `Returns the version of ${app.name} that serves this connection (${version}).`,
      },
      run: () => ({ ...text(version), structuredContent: { app: app.slug, version } }),
    },
    echo: {
      config: { title: 'Echo', description: `Echoes its input (served by ${app.slug} ${version}).` },
      input: z.object({ text: z.string().max(10_000) }),
      run: ({ text: value }: { text: string }) => text(`${value} (from ${app.slug} ${version})`),
    },
    count: {
      config: { title: 'Count with progress', description: `Counts to n, sending a progress notification per step (${version}).` },
      input: z.object({ n: z.number().int().min(1).max(100) }),
      async run({ n }: { n: number }, token: string | number | undefined, notify: (notification: Progress) => Promise<void>) {
        for (let i = 1; i <= n; i++) {
          if (token !== undefined) await notify({ method: 'notifications/progress', params: { progressToken: token, progress: i, total: n } })
        }
        return text(`counted to ${n} (${version})`)
      },
    },
  }
}

const ACCEPT = 'application/json, text/event-stream'
/** How long a client waits before it resumes a stream the server closed (SSE `retry`, SEP-1699). */
const RETRY_INTERVAL_MS = 1_000
/** The SDK transport's own default body limit, which a `parsedBody` would otherwise bypass. */
const MAX_BODY_BYTES = 4 * 1024 * 1024
/** How long a POST body may take to arrive in full (408 after). */
const BODY_DEADLINE_MS = 30_000
const TOO_SLOW = Symbol('too slow')

function rpcError(status: number, code: number, message: string, headers?: Record<string, string>): Response {
  return Response.json({ jsonrpc: '2.0', id: null, error: { code, message } }, { status, ...(headers && { headers }) })
}

/**
 * `request` with `Accept` naming both MCP media types, for the SDK transport. Its body is
 * passed on unread when the handler has it parsed (`body`), else as text.
 */
async function withMcpAccept(request: Request, body: unknown): Promise<Request> {
  const headers = new Headers(request.headers)
  headers.set('accept', ACCEPT)
  const text = request.method === 'POST' && body === undefined ? await request.text() : null
  return new Request(request.url, { method: request.method, headers, body: text, signal: request.signal })
}

/**
 * JSON-RPC 2.0 section 6: a batch is answered with an array, a batch that gets one response
 * too. The SDK transport answers that one alone (`responses.length === 1`), so a 200 in JSON
 * holding one response object is put in an array; anything else is passed on as it is.
 */
export async function asBatchAnswer(answer: Response): Promise<Response> {
  if (answer.status !== 200 || !answer.headers.get('content-type')?.startsWith('application/json')) return answer
  const text = await answer.text()
  // The transport's own JSON: one response is an object, several an array.
  const one = text.trimStart().startsWith('{')
  const headers = new Headers(answer.headers)
  headers.delete('content-length')
  return new Response(one ? `[${text}]` : text, { status: answer.status, statusText: answer.statusText, headers })
}

/** Longest string `_meta.progressToken` a request may carry (a number is at most a double). */
const MAX_PROGRESS_TOKEN_CHARS = 256

function hasLongProgressToken(message: unknown): boolean {
  const token = (message as { params?: { _meta?: { progressToken?: unknown } } } | null)?.params?._meta?.progressToken
  return typeof token === 'string' && token.length > MAX_PROGRESS_TOKEN_CHARS
}

/**
 * The `sweepEveryMs` option checked, default 60 s (besides every `initialize`): a timer's
 * delay, since past 2^31 - 1 ms Node fires a timer every millisecond.
 */
export function sweepPeriod(value: number | undefined): number {
  const ms = value ?? 60_000
  if (!Number.isSafeInteger(ms) || ms < 1 || ms > 2_147_483_647) {
    throw new TypeError(`sweepEveryMs must be a whole number of milliseconds from 1 to 2147483647, got ${String(ms)}`)
  }
  return ms
}

/**
 * Reads a request body once, stopping past the limit: the text, `null` when too large, or
 * `TOO_SLOW` when it has not arrived within `timeoutMs`.
 */
async function readBody(request: Request, timeoutMs: number): Promise<string | null | typeof TOO_SLOW> {
  if (Number(request.headers.get('content-length')) > MAX_BODY_BYTES) return null
  if (!request.body) return ''
  const reader = request.body.getReader()
  const chunks: Uint8Array[] = []
  let size = 0
  // A body that trickles in holds its connection and the caller's session slot: it has
  // `timeoutMs` to arrive in full.
  let timer: ReturnType<typeof setTimeout> | undefined
  const deadline = new Promise<typeof TOO_SLOW>((resolve) => {
    timer = setTimeout(() => resolve(TOO_SLOW), timeoutMs)
    timer.unref?.()
  })
  try {
    for (;;) {
      const next = await Promise.race([reader.read(), deadline])
      if (next === TOO_SLOW) {
        void reader.cancel().catch(() => {})
        return TOO_SLOW
      }
      const { done, value } = next
      if (done) break
      size += value.byteLength
      if (size > MAX_BODY_BYTES) {
        void reader.cancel()
        return null
      }
      chunks.push(value)
    }
  } finally {
    clearTimeout(timer)
  }
  return Buffer.concat(chunks).toString('utf8')
}

/** A batch with a message that carries the 2026-07-28 `_meta` envelope. */
function holdsModernMessage(body: unknown): boolean {
  return (
    Array.isArray(body) &&
    body.some((m) => {
      const meta = (m as { params?: { _meta?: Record<string, unknown> } } | null)?.params?._meta
      return meta !== null && typeof meta === 'object' && 'io.modelcontextprotocol/protocolVersion' in meta
    })
  )
}

/** A single JSON-RPC 2.0 message with a method (a request or a notification). */
function isMessage(body: unknown): boolean {
  return (
    body !== null &&
    typeof body === 'object' &&
    !Array.isArray(body) &&
    (body as { jsonrpc?: unknown }).jsonrpc === '2.0' &&
    typeof (body as { method?: unknown }).method === 'string'
  )
}

/**
 * The revision the SDK server answers an `initialize` with: the one the client asked for when
 * it supports it, else its latest (`Server`'s own rule).
 */
function negotiatedRevision(body: unknown): string {
  const messages = Array.isArray(body) ? body : [body]
  const initialize = messages.find((m) => m !== null && typeof m === 'object' && (m as { method?: unknown }).method === 'initialize') as
    | { params?: { protocolVersion?: unknown } }
    | undefined
  const asked = initialize?.params?.protocolVersion
  return typeof asked === 'string' && SUPPORTED_PROTOCOL_VERSIONS.includes(asked) ? asked : LATEST_PROTOCOL_VERSION
}

function isInitialize(body: unknown): boolean {
  const messages = Array.isArray(body) ? body : [body]
  return messages.some((m) => m !== null && typeof m === 'object' && (m as { method?: unknown }).method === 'initialize')
}

/** Options of {@link createMcpAppHandler}. */
export interface McpAppHandlerOptions {
  /**
   * The App version's server for MCP 2026-07-28 requests (SDK v2), made per request. Without
   * it such requests get the 2025-era server's answer (a 400 naming its protocol versions).
   */
  modern?: (notify: ServerNotifier) => ModernMcpServer
  /**
   * Sessions idle longer than this are closed: no request for that long and no answer still
   * streaming (an open GET stream or a long tool call keeps a session). Default 30 minutes.
   */
  idleMs?: number
  /**
   * Clock for idleness, in ms (only spans are read from it). Default `performance.now()`: a
   * monotonic clock, which a wall clock stepped forward (NTP, a resumed VM) does not move, so
   * the step closes no session.
   */
  now?: () => number
  /**
   * At most this many open sessions, those being opened included; opening one more closes the
   * least recently used with no answer streaming (else the least recently used), never one
   * still being opened: when every slot is one, the `initialize` gets 503 (`Retry-After: 1`).
   * Default 10,000.
   */
  maxSessions?: number
  /**
   * At most this many open sessions per caller (user); opening one more closes that caller's
   * least recently used one (with no answer streaming first), so one user cannot push everyone
   * else's sessions out of `maxSessions`; when every slot of the caller is a session still being
   * opened, the `initialize` gets 429 (`Retry-After: 1`). Default 100.
   */
  maxSessionsPerCaller?: number
  /**
   * 2026-07-28: at most this many open `subscriptions/listen` streams per caller; one more is
   * refused with the SDK's own answer to a full router (JSON-RPC -32603), so one user cannot
   * hold every slot of the App version. Default 16.
   */
  maxListensPerCaller?: number
  /** A POST body must arrive in full within this time, or the request gets 408. Default 30 s. */
  bodyTimeoutMs?: number
  /**
   * Characters of events (their JSON) each session keeps for resuming its streams, oldest
   * dropped first. Default 1,000,000; with the per-caller cap, one caller holds at most
   * `maxSessionsPerCaller` times this per App version.
   */
  maxEventChars?: number
  /**
   * Idle sessions are closed this often (by the clock `now`, default monotonic): by a timer, which keeps no
   * process alive, so that a version no request reaches any more (one a deploy replaced)
   * still lets its abandoned sessions go, and by the requests that come. Default 60 s.
   */
  sweepEveryMs?: number
}

/** Who a dispatched request is for, as the dispatch layer decided (`DispatchContext`). */
export interface CallerOf {
  subject: string
  clientId?: string
  appId: string
  version: string
}

/** A web handler for one App version, with its open sessions. */
export interface McpAppHandler {
  /** `caller`, when given, reaches 2026-07-28 tools as `ctx.http.authInfo` (binding their state to it). */
  (request: Request, caller?: CallerOf): Promise<Response>
  /** Number of open sessions. */
  readonly sessionCount: () => number
  /**
   * Tells the open 2026-07-28 `subscriptions/listen` streams that opted in that the tool, prompt
   * and resource lists changed (a deploy moved an address they may have been opened at).
   */
  listsChanged(): void
  /**
   * No session open or being opened, no `subscriptions/listen` stream, no answer still
   * streaming, and no request for `idleMs`: closing the handler now would cut nothing a client
   * still holds.
   */
  readonly idle: () => boolean
  /**
   * Ends the open 2026-07-28 `subscriptions/listen` streams, which never end on their own, as a
   * dropped connection ends them (no final `complete` result; the client listens again, elsewhere):
   * what a stop does first, while the answers in flight finish (GET streams end last).
   */
  endListens(): void
  /** Closes every session. */
  close(): Promise<void>
}

/** Serves one App version: stateful sessions for `initialize`, stateless JSON otherwise. */
export function createMcpAppHandler(build: () => McpServer, options: McpAppHandlerOptions = {}): McpAppHandler {
  const idleMs = options.idleMs ?? 30 * 60_000
  const now = options.now ?? (() => performance.now())
  const maxSessions = options.maxSessions ?? 10_000
  const maxSessionsPerCaller = options.maxSessionsPerCaller ?? 100
  const maxListensPerCaller = options.maxListensPerCaller ?? 16
  const bodyTimeoutMs = options.bodyTimeoutMs ?? BODY_DEADLINE_MS
  const maxEventChars = options.maxEventChars
  const sweepEveryMs = sweepPeriod(options.sweepEveryMs)
  /**
   * `open`: answers of the session still streaming; a session with one is not idle. `opening`:
   * its `initialize` is not answered yet, and no other `initialize` may close it (its client
   * would get an id that answers 404).
   */
  // `revision`: the MCP revision negotiated at initialize, which a batch of the session
  // without `MCP-Protocol-Version` is judged by.
  type Session = {
    transport: WebStandardStreamableHTTPServerTransport
    lastSeen: number
    open: number
    opening: boolean
    revision: string
    subject?: string
  }
  const sessions = new Map<string, Session>()
  // Open sessions, and slots taken for sessions being opened (not in `sessions` yet), in all and
  // per caller; listen streams per caller. A slot is taken before the first await of the request
  // that will fill it, so a burst cannot pass the caps.
  const sessionsOf = new Map<string, Set<string>>()
  const openingOf = new Map<string, number>()
  let openingAll = 0
  const listensOf = new Map<string, number>()

  function addTo(counts: Map<string, number>, subject: string, by: number): void {
    const n = (counts.get(subject) ?? 0) + by
    if (n > 0) counts.set(subject, n)
    else counts.delete(subject)
  }

  function dropSession(id: string): void {
    const subject = sessions.get(id)?.subject
    sessions.delete(id)
    if (subject === undefined) return
    const own = sessionsOf.get(subject)
    own?.delete(id)
    if (own?.size === 0) sessionsOf.delete(subject)
  }

  /**
   * Takes a slot for one more session of `subject` (none: a caller the handler was not told
   * of), closing sessions to make room: first that caller's own while at its cap, then, while
   * the version is at `maxSessions`, anyone's; in each, the least recently used with no answer
   * streaming first (a client's open GET stream is not cut while a quiet session is left), never
   * one still being opened. The caller's cap is served first, so a caller at its own cap closes
   * its own session, not another user's. The refusal when the slots left are all sessions
   * still being opened: 429 for the caller's, 503 for the version's.
   */
  function reserveSession(subject: string | undefined): Response | undefined {
    if (subject !== undefined) {
      const own = sessionsOf.get(subject)
      const opening = openingOf.get(subject) ?? 0
      if (!makeRoom(() => own ?? [], () => (own?.size ?? 0) + opening, maxSessionsPerCaller)) {
        return rpcError(429, -32000, `Too many sessions being opened for this caller (${maxSessionsPerCaller})`, { 'retry-after': '1' })
      }
    }
    if (!makeRoom(() => sessions.keys(), () => sessions.size + openingAll, maxSessions)) {
      return rpcError(503, -32000, `Too many sessions being opened (${maxSessions})`, { 'retry-after': '1' })
    }
    openingAll++
    if (subject !== undefined) addTo(openingOf, subject, 1)
    return undefined
  }

  /**
   * Closes sessions of `ids()` (see {@link leastRecentlyUsed}) while `taken()` is at `cap`;
   * whether a slot is free then (not when every one left is a session still being opened).
   */
  function makeRoom(ids: () => Iterable<string>, taken: () => number, cap: number): boolean {
    while (taken() >= cap) {
      const id = leastRecentlyUsed(ids())
      if (id === undefined) return false
      closeSession(id)
    }
    return true
  }

  /**
   * Of `ids`, the session to close for a new one: the least recently used with no answer
   * streaming, else the least recently used; never one still being opened.
   */
  function leastRecentlyUsed(ids: Iterable<string>): string | undefined {
    let oldest: string | undefined
    let o: Session | undefined
    for (const id of ids) {
      const s = sessions.get(id)!
      if (s.opening) continue
      const quiet = s.open === 0
      if (o === undefined || (quiet && o.open !== 0) || (quiet === (o.open === 0) && s.lastSeen < o.lastSeen)) {
        oldest = id
        o = s
      }
    }
    return oldest
  }

  function closeSession(id: string): void {
    const session = sessions.get(id)!
    dropSession(id)
    void session.transport.close()
  }

  /**
   * What ends each open `subscriptions/listen` stream (see `endListens`), with the request the
   * SDK was handed: it holds the signal the SDK listens to, which follows the ender's only while
   * the request lives (Node's `Request` links them through a weak reference), and the SDK keeps
   * the signal alone.
   */
  const listenEnders = new Map<AbortController, Request>()
  /** A `subscriptions/listen` stream ended (or its request failed): no longer counted, nor ended. */
  function endedListen(ender: AbortController, subject: string): void {
    addTo(listensOf, subject, -1)
    listenEnders.delete(ender)
  }

  /**
   * A `subscriptions/listen` answer, counted against its caller while its stream is open; the
   * count goes back when the stream ends or the client leaves.
   */
  function countedListen(ender: AbortController, subject: string, response: Response): Response {
    const release = () => endedListen(ender, subject)
    // The slot was taken before the request went to the SDK; an answer that is no stream gives it back.
    if (!(response.headers.get('content-type') ?? '').includes('text/event-stream')) {
      release()
      return response
    }
    return whenBodyEnds(response, release)
  }
  const buildModern = options.modern
  // The handler's own notifier, for the servers it makes (asked for only once it exists).
  const notify: ServerNotifier = {
    toolsChanged: () => modern?.notify.toolsChanged(),
    promptsChanged: () => modern?.notify.promptsChanged(),
    resourcesChanged: () => modern?.notify.resourcesChanged(),
    resourceUpdated: (uri) => modern?.notify.resourceUpdated(uri),
  }
  const modern: McpHttpHandler | undefined = buildModern && createMcpHandler(() => buildModern(notify), { legacy: 'reject' })

  let lastSweep = now()
  /** Closes the idle sessions (those past the caps are closed as a new one takes its slot: `reserveSession`). */
  function sweep(): void {
    lastSweep = now()
    const cutoff = lastSweep - idleMs
    for (const [id, s] of sessions) if (s.open === 0 && !s.opening && s.lastSeen < cutoff) closeSession(id)
  }

  let closed = false
  let lastRequest = now()
  // Idle sessions go whatever requests come in, and when none come (an App version a deploy
  // replaced keeps its abandoned sessions otherwise: about 100 kB each, for ever).
  const sweeper = setInterval(() => {
    if (!closed && now() - lastSweep >= sweepEveryMs) sweep()
  }, sweepEveryMs)
  sweeper.unref?.()
  /** Requests not answered in full: an event stream still running keeps the handler in use. */
  let inFlight = 0
  const handle = async (request: Request, given?: CallerOf): Promise<Response> => {
    inFlight++
    let response: Response
    try {
      response = await serve(request, given)
    } catch (error) {
      inFlight--
      throw error
    }
    // Any other answer is complete as it stands (and a string body keeps the runtime's fast path).
    if (!response.headers.get('content-type')?.startsWith('text/event-stream')) {
      inFlight--
      return response
    }
    return whenBodyEnds(response, () => inFlight--)
  }
  const serve = async (request: Request, given?: CallerOf): Promise<Response> => {
    if (closed) return rpcError(503, -32000, 'App version closed')
    lastRequest = now()
    if (lastRequest - lastSweep >= sweepEveryMs) sweep()
    // Handed something else as the second argument (a DispatchContext, by `routeByVersion`
    // wiring): no caller, rather than one without a subject that every user would share.
    const caller = given !== undefined && typeof given.subject === 'string' ? given : undefined
    // A POST body is read here once, within the limit, and handed to the transport parsed;
    // when it is not JSON the transport gets the text back and answers -32700 itself.
    let body: unknown
    if (request.method === 'POST') {
      const text = await readBody(request, bodyTimeoutMs)
      if (text === null) return rpcError(413, -32000, `Payload Too Large: Request body must not exceed ${MAX_BODY_BYTES} bytes`)
      // The rest of the body is not read: the connection ends with this answer, and says so.
      if (text === TOO_SLOW) return rpcError(408, -32000, `Request Timeout: the body did not arrive within ${bodyTimeoutMs} ms`, { connection: 'close' })
      try {
        body = JSON.parse(text)
      } catch {
        body = undefined
        request = new Request(request.url, { method: 'POST', headers: request.headers, body: text })
      }
      // JSON-RPC 2.0 section 6: an empty batch is one Invalid Request error (the SDK answers 202).
      if (Array.isArray(body) && body.length === 0) return rpcError(400, -32600, 'Invalid Request: empty batch')
      // Every progress notification repeats the request's progress token: `count` sends 100, so
      // a token of 3 MB made one request of 3 MB stream 300 MB, held in memory while the client
      // did not read. A token is an identifier; a long one is refused.
      if ((Array.isArray(body) ? body : [body]).some(hasLongProgressToken)) {
        return rpcError(400, -32602, `Invalid params: _meta.progressToken is longer than ${MAX_PROGRESS_TOKEN_CHARS} characters`)
      }
      // MCP 2026-07-28: classified as the SDK's own handler would (headers and body). A single
      // request or notification, or a batch holding one of that revision (which the SDK then
      // refuses: 2026-07-28 has no batches); anything else that is not JSON-RPC gets the 2025
      // server's JSON-RPC error, as before. A request in a session is 2025's whatever it claims
      // (2026-07-28 has no sessions): an `MCP-Protocol-Version` the session cannot take gets
      // that transport's 400 "Unsupported protocol version", naming the supported ones.
      const inSession = request.headers.has('mcp-session-id')
      if (modern && !inSession && (isMessage(body) || holdsModernMessage(body)) && !(await isLegacyRequest(request, body))) {
        const listen = caller !== undefined && (body as { method?: unknown }).method === 'subscriptions/listen'
        if (listen && (listensOf.get(caller.subject) ?? 0) >= maxListensPerCaller) {
          return Response.json({
            jsonrpc: '2.0',
            id: (body as { id?: unknown }).id ?? null,
            error: { code: -32603, message: `Subscription limit reached for this caller (${maxListensPerCaller})` },
          })
        }
        // Its stream never ends on its own: `endListens` ends it through the request's signal, as
        // a client that leaves does (the body was read above, and is handed over parsed).
        const ender = listen ? new AbortController() : undefined
        let answer: Response
        try {
          if (ender !== undefined) {
            addTo(listensOf, caller!.subject, 1)
            request = new Request(request.url, { method: 'POST', headers: request.headers, signal: AbortSignal.any([request.signal, ender.signal]) })
            listenEnders.set(ender, request)
          }
          answer = await modern.fetch(request, {
            parsedBody: body,
            ...(caller && {
              authInfo: {
                token: '',
                clientId: caller.clientId ?? '',
                scopes: [],
                extra: { subject: caller.subject, appId: caller.appId, version: caller.version },
              },
            }),
          })
        } catch (error) {
          if (ender !== undefined) endedListen(ender, caller!.subject)
          throw error
        }
        return ender !== undefined ? countedListen(ender, caller!.subject, answer) : answer
      }
    }
    // JSON-RPC batches left MCP in 2025-06-18: a batch is served only under a revision older
    // than that: exactly one such `MCP-Protocol-Version`, or none, which means the revision the
    // session negotiated at initialize, and without a session 2025-03-26 (which requires batches
    // to be received). Any other value (a later revision, which such clients send on every
    // request after initialize; two of them) is refused, and so is a batch without the header
    // in a session that negotiated 2025-06-18 or later: MCP 2025-06-18 ("Protocol Version
    // Header") has a server assume 2025-03-26 only when it has no other way to know, such as
    // the revision negotiated at initialize. (The SDK transport itself takes 2025-03-26.)
    const revision = Array.isArray(body)
      ? (request.headers.get('mcp-protocol-version') ?? sessions.get(request.headers.get('mcp-session-id') ?? '')?.revision ?? null)
      : null
    if (revision !== null && !(/^\d{4}-\d{2}-\d{2}$/.test(revision) && revision < '2025-06-18')) {
      return rpcError(400, -32600, 'Invalid Request: JSON-RPC batches are not part of MCP 2025-06-18 and later')
    }
    const parsed = body === undefined ? undefined : { parsedBody: body }
    // Spec 4.1 lists no `Accept`, and `*/*` accepts both of MCP's media types (RFC 9110 section
    // 12.5.1); the SDK transport checks their names literally and answers 406 otherwise.
    const accept = request.headers.get('accept')
    if (accept === null || accept.includes('*/*')) request = await withMcpAccept(request, body)
    const sessionId = request.headers.get('mcp-session-id')
    if (sessionId) {
      const session = sessions.get(sessionId)
      const at = now()
      // Idle past `idleMs` is closed, even between sweeps.
      if (session && session.open === 0 && at - session.lastSeen > idleMs) {
        dropSession(sessionId)
        void session.transport.close()
      }
      // Closed here (idle, or the caller's least recently used past its cap) or never opened:
      // the dispatch layer's own answer for an unknown session (404 `session_not_found`), so a
      // client sees one answer whichever layer found the session gone.
      if (!session || !sessions.has(sessionId)) return toResponse(sessionNotFoundReply())
      session.lastSeen = at
      session.open++
      const done = () => {
        session.open--
        session.lastSeen = now()
      }
      let answer: Response
      try {
        answer = await session.transport.handleRequest(request, parsed)
      } catch (error) {
        done()
        throw error
      }
      return whenBodyEnds(answer, done)
    }
    if (request.method !== 'POST') {
      return Response.json(
        { jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Method not allowed without a session' } },
        { status: 405, headers: { allow: 'POST' } },
      )
    }
    if (isInitialize(body)) {
      sweep()
      const refused = reserveSession(caller?.subject)
      if (refused) return refused
      // The slot taken above, given back once: when the session opens (it then counts in
      // `sessions`), or when the transport refuses to open it.
      let pending = true
      const release = () => {
        if (!pending) return
        pending = false
        openingAll--
        if (caller) addTo(openingOf, caller.subject, -1)
      }
      let opened: Session | undefined
      const transport = new WebStandardStreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        // Resumable streams: a client reconnects with Last-Event-ID and gets what it missed.
        eventStore: createSessionEventStore(maxEventChars === undefined ? {} : { maxChars: maxEventChars }),
        retryInterval: RETRY_INTERVAL_MS,
        onsessioninitialized: (id) => {
          opened = { transport, lastSeen: now(), open: 0, opening: true, revision: negotiatedRevision(body), ...(caller && { subject: caller.subject }) }
          sessions.set(id, opened)
          if (caller) {
            let own = sessionsOf.get(caller.subject)
            if (!own) sessionsOf.set(caller.subject, (own = new Set()))
            own.add(id)
          }
          release()
        },
        onsessionclosed: (id) => dropSession(id),
      })
      transport.onclose = () => {
        if (transport.sessionId) dropSession(transport.sessionId)
      }
      let answer: Response
      try {
        await build().connect(transport)
        answer = await transport.handleRequest(request, parsed)
      } finally {
        release()
        if (opened) opened.opening = false
      }
      // The answer to `initialize` still streaming counts as any answer of the session.
      const session = opened
      if (session === undefined || !sessions.has(transport.sessionId ?? '')) return answer
      session.open++
      return whenBodyEnds(answer, () => {
        session.open--
        session.lastSeen = now()
      })
    }
    // One-shot request without a session (spec 4.1 shows a bare tools/list): stateless, JSON.
    const transport = new WebStandardStreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true })
    const server = build()
    await server.connect(transport)
    // Answered in JSON whatever the client accepts.
    const accepts = request.headers.get('accept') ?? ''
    const forwarded =
      accepts.includes('application/json') && accepts.includes('text/event-stream') ? request : await withMcpAccept(request, body)
    try {
      const answer = await transport.handleRequest(forwarded, parsed)
      return Array.isArray(body) ? await asBatchAnswer(answer) : answer
    } finally {
      void server.close()
    }
  }
  return Object.assign(handle, {
    sessionCount: () => sessions.size,
    listsChanged() {
      notify.toolsChanged()
      notify.promptsChanged()
      notify.resourcesChanged()
    },
    idle: () => inFlight === 0 && sessions.size === 0 && openingAll === 0 && listensOf.size === 0 && now() - lastRequest >= idleMs,
    endListens() {
      // Each stream's end gives its caller's slot back (`countedListen`), once its body is read.
      for (const ender of listenEnders.keys()) ender.abort()
      listenEnders.clear()
    },
    async close() {
      closed = true
      clearInterval(sweeper)
      await Promise.all([...sessions.values()].map((s) => s.transport.close()))
      sessions.clear()
      await modern?.close()
    },
  })
}
