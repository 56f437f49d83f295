/**
 * The dispatch headers and the dispatcher's `complete` at the head of a Node response, through
 * one wrapper of `writeHead` on the response prototype. Shared by the Express and Fastify
 * adapters and by the Web adapter on `@hono/node-server`. No static import of `node:http`:
 * the Web adapter also runs where there is no Node, and takes the prototype from the response
 * it is given.
 * @internal
 * @module
 */
import type { Decision, DispatchOutcome } from '../pipeline/dispatcher.js'
import { isEventStream } from '../core/text.js'

/** A dispatched decision. */
export type Dispatched = Extract<Decision, { type: 'dispatch' }>

/** What this module needs of a Node `ServerResponse`. */
export interface NodeResponse {
  writeHead(statusCode: number, ...rest: unknown[]): unknown
  getHeader(name: string): unknown
  once(event: 'close', listener: () => void): unknown
  readonly closed?: boolean
  readonly destroyed?: boolean
}

/**
 * The outcome of a response's head for `complete`. For a response of an MCP session it says how
 * to learn the response's end (`whenClosed`: its `close` event, or at once when it has already
 * closed, as it has when the client left before the head), so that an open stream keeps the
 * session's pin; a response without a session needs none, and allocates nothing for it.
 */
export function headOutcome(
  res: NodeResponse,
  decision: Dispatched,
  status: number,
  sessionId: string | undefined,
  headers?: unknown,
): DispatchOutcome {
  // Only an event stream (a session's GET stream, a long tool call's answer, in a session or
  // not) stays open: its credential is checked again while it does, and it can be ended early
  // (`close`), its chunked body ending cleanly where a body of a declared length cut short would
  // leave the client waiting for the rest.
  const stream = status < 300 && isEventStream(contentTypeOf(res, headers))
  if (!stream && sessionId === undefined && decision.context.sessionId === undefined) return { status, sessionId }
  const whenClosedOf = (listener: () => void) => whenClosed(res, listener)
  if (stream) return { status, sessionId, whenClosed: whenClosedOf, close: () => closeResponse(res) }
  if (status !== 404) return { status, sessionId, whenClosed: whenClosedOf }
  // A 404 in a session ends its pin only when it is the MCP handler's (see `DispatchOutcome`).
  return { status, sessionId, whenClosed: whenClosedOf, contentType: unrouted.has(res) ? null : contentTypeOf(res, headers) }
}

/**
 * Ends a response whose credential no longer passes (`DispatchOutcome.close`), as a complete
 * answer: the client reads the end of its event stream, and its connection stays usable (a
 * socket destroyed after the end would be taken back by the client's pool as it closes, and
 * fail its next request). What the handler writes later fails on its own call (Node answers a
 * write after the end with an `error` event, which nothing else listens for on a response, and
 * which would otherwise end the process); the response's `close` tells the handler it is gone.
 *
 * An end reaches only a client that reads: one that stopped (its socket's buffers full) would
 * never take it, and the response would neither finish nor close, its handler (a proxied
 * upstream, the App's stream) and the session's pin kept for as long as the client kept its
 * connection. So a response whose end has not gone out is watched: cut (the client reconnects,
 * and is refused then, as after an end) once a second passes in which none of what waits to go
 * out was taken, or `END_GRACE_MS` after the end whatever the pace. A client that reads, however
 * slowly, gets its end.
 */
function closeResponse(res: NodeResponse): void {
  const response = res as NodeResponse & {
    writableEnded?: boolean
    writableFinished?: boolean
    writableLength?: number
    end(): unknown
    destroy(): unknown
    on(event: 'error', listener: () => void): unknown
    once(event: 'close' | 'finish', listener: () => void): unknown
  }
  if (response.destroyed === true || response.writableEnded === true) return
  response.on('error', ignore)
  try {
    response.end()
  } catch {
    response.destroy()
    return
  }
  if (response.writableFinished === true) return
  let waiting = response.writableLength ?? 0
  let waitedMs = 0
  const timer = setInterval(() => {
    waitedMs += END_PROGRESS_MS
    const now = response.writableLength ?? 0
    if (now < waiting && waitedMs < END_GRACE_MS) {
      waiting = now
      return
    }
    clearInterval(timer)
    cutResponse(response)
  }, END_PROGRESS_MS)
  timer.unref?.()
  const settle = () => clearInterval(timer)
  response.once('finish', settle)
  whenClosed(response, settle)
}

/** How often an ended stream whose end has not gone out is looked at for progress. */
const END_PROGRESS_MS = 1_000

/** How long an ended stream's end may take to go out, however slowly its client reads, before its connection is cut. */
const END_GRACE_MS = 10_000

function ignore(): void {}

/**
 * Has the dispatcher watch the response to a GET from now, before its head
 * (`watchFromStart`): a handler may hold the head of an event stream back until its first event
 * (Fastify's `reply.send(stream)`, a stream piped to the response), and the credential is
 * checked again, and the session's pin kept, meanwhile too. A credential that no longer passes
 * ends the response before anything the App sends later: once its head is out, as any open
 * response; before, by closing its connection (HTTP/2: its stream), so the handler's later head
 * and writes fail quietly instead of throwing (`end()` would send a head of its own, and the
 * App's `writeHead` then throws), and its request's signal aborts (a proxied upstream is let
 * go). The client reconnects, and is refused then.
 */
export function watchFromStart(res: NodeResponse, decision: Dispatched): void {
  decision.watchFromStart?.(
    (listener) => whenClosed(res, listener),
    () => ((res as { headersSent?: boolean }).headersSent === true ? closeResponse(res) : cutBeforeHead(res)),
  )
}

/** Closes the connection of a response whose head has not gone out; later writes fail quietly. */
function cutBeforeHead(res: NodeResponse): void {
  const response = res as NodeResponse & { on(event: 'error', listener: () => void): unknown; destroy(): unknown }
  if (response.destroyed === true) return
  response.on('error', ignore)
  cutResponse(response)
}

/**
 * Has Node close the connection after `res` (`Connection: close`) when its head goes out before
 * its HTTP/1 request's body has all arrived (a handler, or a proxied App, that answered a large
 * body early: a 413 past its limit). For `@hono/node-server`, which closes such a connection
 * after the answer (it destroys the request whose body stream is cancelled, or left unread past
 * 500 ms or 64 MB): said so, a keep-alive client sends its next request on a new connection,
 * not on the one about to close (undici's failed with `UND_ERR_SOCKET`). RFC 9112 section 9.6.
 * Only before the head; HTTP/2 streams end on their own.
 *
 * Node parses the bytes that follow a head in the same packet only once the head's callbacks,
 * and their microtasks, have run: an answer given at once (the SDK transport's 406, without
 * reading the body) sees an incomplete request whose body has in fact all arrived, and which
 * `@hono/node-server` drains, keeping the connection. So an incomplete request with a body is
 * judged one turn of the event loop later (a promise, the only case that returns one); a body
 * still on its way then (a later packet) closes the connection, as before.
 */
export function closeIfBodyInFlight(res: unknown): Promise<void> | undefined {
  const req = (res as { req?: { complete?: unknown; httpVersionMajor?: unknown; method?: unknown; headers?: Record<string, unknown> } }).req
  if (req === undefined || req.complete !== false || req.httpVersionMajor !== 1) return undefined
  // @hono/node-server leaves the body of a GET or HEAD to Node, which drops it and keeps the
  // connection.
  if (req.method === 'GET' || req.method === 'HEAD') return undefined
  // A request framed with no body (a GET, a DELETE) has none in flight, and waits for nothing.
  const length = req.headers?.['content-length']
  if (req.headers?.['transfer-encoding'] === undefined && (length === undefined || isZeroLength(length))) return undefined
  return new Promise<void>((resolve) => setImmediate(resolve)).then(() => {
    const response = res as { headersSent?: unknown; shouldKeepAlive?: boolean }
    if (req.complete === false && response.headersSent === false) response.shouldKeepAlive = false
  })
}

/**
 * Whether a request's `Content-Length` is 0, in any number of zeros (`00`: Node takes only
 * digits, and reads those as 0). @internal
 */
export function isZeroLength(length: unknown): boolean {
  return typeof length === 'string' && /^0+$/.test(length)
}

/**
 * Responses to requests the framework routed to no route (Fastify's `request.is404`), answered
 * by its not-found handler: their 404, whatever its type, is taken as no MCP handler's (an MCP
 * handler served as the not-found handler then leaves its pins to their idle TTL).
 */
const unrouted = new WeakSet<object>()

/** Marks `res` as the answer to a request no route of the framework takes. */
export function markUnrouted(res: NodeResponse): void {
  unrouted.add(res)
}

/**
 * The `Content-Type` of a head: among the `writeHead` headers, else set on the response, else
 * in the head Node stored (`writeHead` headers given as an object are written there, not kept).
 */
function contentTypeOf(res: NodeResponse, headers: unknown): string | null {
  const value = headerValue(findHeader(headers, 'content-type')) ?? headerValue(res.getHeader('content-type'))
  if (value !== undefined) return value
  const head = (res as { _header?: unknown })._header
  const match = typeof head === 'string' ? /\r\ncontent-type:[ \t]*([^\r]*)/i.exec(head) : null
  return match ? match[1]! : null
}

/** Calls `listener` when `res` closes, or at once when it has closed already (HTTP/1 and HTTP/2). */
export function whenClosed(res: NodeResponse, listener: () => void): void {
  // `close` is emitted once: a listener added later would never run. HTTP/2's compatibility
  // response tells it by its stream.
  if (res.closed === true || res.destroyed === true || (res as { stream?: { destroyed?: boolean } }).stream?.destroyed === true) listener()
  else res.once('close', listener)
}

/**
 * Where the prototype-level `writeHead` finds the decision of a dispatched response: an own
 * property of the response, declared `undefined` on the prototype so that the lookup on
 * responses the adapters did not dispatch stops there. One property of one kind on every
 * dispatched response: one hidden class for all of them.
 */
const kDispatch = Symbol('mcp-dispatch.decision')
type WithDecision = NodeResponse & { [kDispatch]?: Dispatched | undefined }
const EXPOSE = 'access-control-expose-headers'

/** Decisions of responses whose prototype is not the wrapped prototype itself. */
const aside = new WeakMap<object, Dispatched>()
let asideUsed = false

/**
 * `a` equals the lower-case name `lower`, ignoring ASCII case, as field names compare (RFC 9110
 * section 5.1), character by character: no lower-cased copy of `a` is made.
 */
export function sameName(a: string, lower: string): boolean {
  if (a === lower) return true
  const length = a.length
  if (length !== lower.length) return false
  for (let i = 0; i < length; i++) {
    const c = a.charCodeAt(i)
    if (c !== lower.charCodeAt(i) && (c < 65 || c > 90 || (c | 32) !== lower.charCodeAt(i))) return false
  }
  return true
}

/** A header value as one string (`undefined` when absent). */
export function headerValue(value: unknown): string | undefined {
  return Array.isArray(value) ? value.join(', ') : value == null ? undefined : String(value)
}

/** Whether the header `key` is one of `names` (lower-case), ignoring case. */
function isOneOf(key: string, names: Readonly<Record<string, string>>): boolean {
  if (Object.hasOwn(names, key)) return true
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i)
    if (c >= 65 && c <= 90) return Object.hasOwn(names, key.toLowerCase())
  }
  return false
}

/**
 * Node's own marks on an HTTP/1 response: `_expect_continue` is set when Node found
 * `Expect: 100-continue` on an HTTP/1.1 request (it ignores the expectation on HTTP/1.0, as RFC
 * 9110 says a server must), and `_sent100` once `100 Continue` went out.
 */
interface ContinuableResponse {
  readonly _expect_continue?: boolean
  readonly _sent100?: boolean
  writeContinue?: () => void
}

/**
 * RFC 9110 section 10.1.1: a client that sent `Expect: 100-continue` waits for `100 Continue`
 * before it sends the body. Where the server hands Node's `checkContinue` event to the adapters
 * (docs/adapters.md, "Expect: 100-continue"), nothing has been sent yet: the adapters send it
 * once the dispatch layer has let the request through, so a refusal (401, 402, 403, 429…) is
 * answered before any body is sent, and Node closes that connection rather than read a body it
 * never invited. Sent only where Node itself would have sent it, on HTTP/1.1, and only if Node
 * has not (no `checkContinue` listener, its default): never on HTTP/1.0, whose client may take a
 * 100 for the final answer, nor on HTTP/2's compatibility API, which leaves no mark of a 100
 * already sent (there Node answers it itself; docs/adapters.md). A request without `Expect`
 * costs one property read.
 */
export function continueIfExpected(res: unknown): void {
  const response = res as ContinuableResponse
  if (response._expect_continue === true && response._sent100 !== true && typeof response.writeContinue === 'function') response.writeContinue()
}

/**
 * The fields HTTP/2 forbids in a message (RFC 9113 section 8.2.2: connection-specific). Node's
 * HTTP/2 refuses to send a response head carrying one (`ERR_HTTP2_INVALID_CONNECTION_HEADERS`),
 * but `Connection`, which its compatibility response drops, and `TE: trailers`.
 * @internal
 */
export const CONNECTION_SPECIFIC_FIELDS: readonly string[] = ['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'upgrade', 'http2-settings', 'te']

/** Whether `res` is Node's HTTP/2 compatibility response (it has a `stream`; `node:http`'s has none). @internal */
export function isHttp2Response(res: unknown): boolean {
  return typeof res === 'object' && res !== null && typeof (res as { stream?: unknown }).stream === 'object'
}

/** `NGHTTP2_INTERNAL_ERROR` (RFC 9113 section 7), without importing `node:http2` here. */
const HTTP2_INTERNAL_ERROR = 2

/**
 * Ends a response whose head is out before its end, so that the client cannot take it for
 * whole: over HTTP/1 the connection is destroyed (a chunked body without its last chunk, or one
 * short of its `Content-Length`); over HTTP/2 the stream is reset with `INTERNAL_ERROR`, since
 * the compatibility response's `destroy()` resets it with `NO_ERROR`, which Node's client (and
 * others) read as the end of the body. `destroy(error)` is not used over HTTP/1: it would raise
 * the server's `clientError`.
 *
 * Over HTTP/1, what was written in this turn of the event loop goes out first: Node corks a
 * response's socket at its first `write` until the next tick, and a destroy discards what the
 * cork holds. A handler that wrote its head and part of a body and then threw got its
 * connection closed with no byte of either: a client takes that for a connection closed before
 * any answer, which browsers send again on a new connection (a `tools/call` run twice). So is
 * a head stored and not sent yet, alone.
 * @internal
 */
export function cutResponse(res: { destroy(): unknown }): void {
  // A head a hold keeps back (node-http's `holdUntilPinned`, a new session's pin on an
  // asynchronous store) is cut once it has gone out, with what was written after it, as it is
  // when nothing is held: cut now, the client would see no byte (see above).
  const deferred = deferredCuts.get(res)
  if (deferred !== undefined) {
    deferred()
    return
  }
  const stream = (res as { stream?: { close?: (code: number) => void; destroyed?: boolean } }).stream
  if (typeof stream === 'object' && stream !== null && typeof stream.close === 'function') {
    if (stream.destroyed !== true) stream.close(HTTP2_INTERNAL_ERROR)
    return
  }
  const socket = (res as { socket?: { writableCorked?: number; uncork?: () => void; destroyed?: boolean } | null }).socket
  if (typeof socket === 'object' && socket !== null && socket.destroyed !== true && typeof socket.uncork === 'function') {
    while ((socket.writableCorked ?? 0) > 0) socket.uncork()
    // A head Node stored whole and has not sent (`compression()` took the body into its zlib
    // stream, whose bytes reach the response a turn later) goes out alone: the client sees an
    // answer cut, not a connection closed before any answer. Never a head Node refused (it
    // stores none), nor one a hold keeps back (node-http's `holdUntilPinned`: Node has none).
    const node = res as { _header?: unknown; _headerSent?: boolean; _send?: (data: string, encoding: string) => unknown }
    if (typeof node._header === 'string' && node._headerSent === false && typeof node._send === 'function') node._send('', 'latin1')
  }
  res.destroy()
}

/** Responses whose head a hold keeps back, and what cuts them once it is out (see {@link cutResponse}). */
const deferredCuts = new WeakMap<object, () => void>()

/**
 * While `cut` is given, {@link cutResponse} of `res` calls it instead of cutting: `res` has a
 * head held back, which must go out first. `undefined` ends that.
 * @internal
 */
export function deferCuts(res: object, cut: (() => void) | undefined): void {
  if (cut === undefined) deferredCuts.delete(res)
  else deferredCuts.set(res, cut)
}

/**
 * `Vary` values joined: each field name once (case-insensitive, first spelling kept), `*`
 * alone when any says `*`. The dispatch layer's `Vary: Origin` joins the handler's own (a
 * cache must still tell `Accept-Encoding` variants apart) instead of replacing it.
 */
export function mergeVary(...values: ReadonlyArray<unknown>): string {
  return joinFieldNames(values, true)
}

/**
 * `Access-Control-Expose-Headers` values joined: each field name once (case-insensitive, first
 * spelling kept). The dispatch layer's list joins the handler's own (a platform's
 * `X-Request-Id` stays readable by browser clients) instead of replacing it. A `*` stays one
 * name among the others: it is a wildcard only for requests without credentials, and the
 * names keep working for the others.
 */
export function mergeExposeHeaders(...values: ReadonlyArray<unknown>): string {
  return joinFieldNames(values, false)
}

function joinFieldNames(values: ReadonlyArray<unknown>, starAlone: boolean): string {
  const seen = new Map<string, string>()
  for (const value of values) {
    const text = headerValue(value)
    if (text === undefined) continue
    for (const part of text.split(',')) {
      const name = part.trim()
      if (name === '*' && starAlone) return '*'
      if (name !== '' && !seen.has(name.toLowerCase())) seen.set(name.toLowerCase(), name)
    }
  }
  return [...seen.values()].join(', ')
}

/** The value of header `name` (lower-case) in `writeHead` headers, object or array form. */
function findHeader(headers: unknown, name: string): unknown {
  if (headers === undefined || headers === null || typeof headers !== 'object') return undefined
  if (Array.isArray(headers)) {
    const pairs = headers.length > 0 && Array.isArray(headers[0])
    for (let i = 0; i < headers.length; i += pairs ? 1 : 2) {
      const key = String(pairs ? (headers[i] as unknown[])[0] : headers[i])
      if (key.toLowerCase() === name) return pairs ? (headers[i] as unknown[])[1] : headers[i + 1]
    }
    return undefined
  }
  for (const key in headers as Record<string, unknown>) if (key.toLowerCase() === name) return (headers as Record<string, unknown>)[key]
  return undefined
}

/**
 * The dispatch headers to write at the head of `res`: as decided, but for `Vary` (only with
 * `allowedOrigins`) and `Access-Control-Expose-Headers` (on requests with an `Origin`), which
 * join the handler's, set with `setHeader` or in `headers` (the `writeHead` argument).
 */
export function dispatchHeadersFor(
  res: { getHeader(name: string): unknown },
  stamped: Readonly<Record<string, string>>,
  headers?: unknown,
): Readonly<Record<string, string>> {
  const vary = stamped.vary
  const expose = stamped[EXPOSE]
  if (vary === undefined && expose === undefined) return stamped
  const out = { ...stamped }
  if (vary !== undefined) out.vary = mergeVary(res.getHeader('vary'), findHeader(headers, 'vary'), vary)
  if (expose !== undefined) {
    const own = res.getHeader(EXPOSE)
    const given = findHeader(headers, EXPOSE)
    if (own !== undefined || given !== undefined) out[EXPOSE] = mergeExposeHeaders(own, given, expose)
  }
  return out
}


/** The head about to be written, with the dispatch headers in it. */
export interface StampedHead {
  /** What to pass to the real `writeHead` as headers. */
  headers: unknown
  /** `Mcp-Session-Id` among the handler's `writeHead` headers, if any. */
  sessionId: string | undefined
}

/**
 * The `writeHead` headers of the handler with the dispatch headers added: a new object (never
 * the handler's, which may be shared), in which the dispatch headers replace any of the same
 * name, so they win, as in the Web adapter. With no handler headers, the dispatch headers
 * alone: Node then merges them over those set with `setHeader`, and they win there too.
 */
export function stampHead(headers: unknown, stamped: Readonly<Record<string, string>>): StampedHead {
  if (headers === undefined || headers === null || typeof headers !== 'object') return { headers: stamped, sessionId: undefined }
  let sessionId: string | undefined
  if (Array.isArray(headers)) {
    // `[name, value, name, value]` or `[[name, value], …]`.
    const out: unknown[] = []
    const pairs = headers.length > 0 && Array.isArray(headers[0])
    const step = pairs ? 1 : 2
    for (let i = 0; i < headers.length; i += step) {
      const name = String(pairs ? (headers[i] as unknown[])[0] : headers[i])
      const value = pairs ? (headers[i] as unknown[])[1] : headers[i + 1]
      if (isOneOf(name, stamped)) continue
      if (sessionId === undefined && sameName(name, 'mcp-session-id')) sessionId = headerValue(value)
      out.push(name, value)
    }
    for (const name in stamped) out.push(name, stamped[name])
    return { headers: out, sessionId }
  }
  const source = headers as Record<string, unknown>
  const found = scanGiven(source, stamped)
  // Usually no handler header has the name of a dispatch header: a plain copy (native).
  if (found !== CLASH) return { headers: Object.assign({}, source, stamped), sessionId: found }
  const out: Record<string, unknown> = {}
  for (const key in source) {
    if (isOneOf(key, stamped)) continue
    out[key] = source[key]
    if (sessionId === undefined && sameName(key, 'mcp-session-id')) sessionId = headerValue(source[key])
  }
  return { headers: Object.assign(out, stamped), sessionId }
}

/**
 * Tells the dispatcher the outcome of a head Node has taken (the status, and the
 * `Mcp-Session-Id` the MCP handler assigned, from the `writeHead` headers or those set before).
 * Called once the real `writeHead` has returned: Node has then only buffered the head, so the
 * pin is stored before any byte of it leaves, and a head Node refused pins nothing.
 */
function recordHead(
  res: NodeResponse,
  getHeader: NodeResponse['getHeader'],
  decision: Dispatched,
  status: number,
  sessionId: string | undefined,
  headers: unknown,
): void {
  // The id `writeHead` named, else the one set before, in a session too: a handler that opens
  // another session there is reported, whichever way it set the id (regression: set with
  // `setHeader`, the new session went unpinned and unreported).
  sessionId ??= headerValue(getHeader.call(res, 'mcp-session-id'))
  // Synchronous here, or a promise that never rejects, awaited by no one: only an
  // asynchronous pin of a new session must be stored first, and `attachToHead` leaves those
  // responses to another path (node-http's hold, or the Web adapter's own await).
  decision.complete(headOutcome(res, decision, status, sessionId, headers))
}

/** A Node HTTP/1 response, the only kind that takes head lines. */
type RemovableHeaders = WithDecision & { hasHeader(name: string): boolean; removeHeader(name: string): void }

type WriteHead = (this: NodeResponse, statusCode: number, ...rest: unknown[]) => unknown

const wrapped = new WeakSet<object>()

/**
 * Installs the `writeHead` interception on a response prototype (`ServerResponse.prototype`):
 * a wrapper, once, which acts on responses that carry a decision (see
 * {@link attachToHead}). Node sends every head through `writeHead` (`write`, `end` and
 * `flushHeaders` call it implicitly), so one interception point suffices. For a response no
 * adapter dispatched it costs one property read.
 *
 * Patching `writeHead` on each response instead gave every response a hidden class of its
 * own and slowed all of Node's HTTP code that touches it (measured: about 15 µs per request
 * on Fastify). The Node adapters call this when they are created, before any request, so that
 * a per-request wrapper installed later by other middleware (for example `on-headers`) still
 * ends in it.
 */
export function installHeadInterception(proto: NodeResponse): void {
  if (wrapped.has(proto)) return
  const target = proto as WithDecision
  const original = target.writeHead as WriteHead
  // The prototype's own header methods, as Node's `writeHead` reads its headers itself: not
  // looked up on each response (see `aside` above for what a lookup costs on Express's).
  const getHeader = target.getHeader
  const { hasHeader, removeHeader } = target as unknown as RemovableHeaders
  target[kDispatch] = undefined
  target.writeHead = function writeHead(this: WithDecision, statusCode: number, reason?: unknown, headers?: unknown) {
    // A response of another prototype (Express swaps it on every response) looks in `aside`
    // first: such a response has a hidden class of its own, and each property read on it that
    // the framework has not made costs V8 a cache miss (about 2,000 instructions).
    const swapped = asideUsed && Object.getPrototypeOf(this) !== target
    let decision = swapped ? aside.get(this) : undefined
    const own = decision === undefined && (decision = this[kDispatch]) !== undefined
    // A response whose prototype was put back after its decision was set aside.
    if (decision === undefined && asideUsed && !swapped) decision = aside.get(this)
    if (decision === undefined) {
      return reason === undefined && headers === undefined ? original.call(this, statusCode) : original.call(this, statusCode, reason, headers)
    }
    // Assigned back, never deleted: a `delete` would turn the response into a slow
    // dictionary-mode object for the rest of its life.
    if (own) this[kDispatch] = undefined
    else aside.delete(this)
    const named = typeof reason === 'string'
    const given = named ? headers : (reason ?? headers)
    // The dispatch headers as head lines, where they can be (see `headLines`): Node's
    // writeHead passes the status line to `_storeHeader`, which starts the head with it and
    // adds the header fields after. Handed over so, Node writes them as they are, without
    // checking, lower-casing and concatenating each field again, and the handler's own headers
    // pass untouched, not copied into a new object: about 6,300 instructions less per request
    // on Fastify, a sixth of the adapter's cost (docs/performance.md). Elsewhere, the merge.
    let lines = writesLines ? headLines(decision.headers) : undefined
    let sessionId = lines === undefined ? CLASH : scanGiven(given, decision.headers)
    let out = headers
    if (sessionId === CLASH) {
      lines = undefined
      const head = stampHead(given, dispatchHeadersFor(this, decision.headers, given))
      sessionId = head.sessionId
      out = head.headers
    }
    // Saved and put back: a `writeHead` of another response inside this one (a wrapper of the
    // platform's) must neither take these lines nor lose its own.
    const outerResponse = linesFor
    const outerLines = pendingLines
    let written: unknown
    try {
      if (lines !== undefined) {
        // Those set with `setHeader` give way, as they do in Node's own merge.
        for (const name in decision.headers) if (hasHeader.call(this, name)) removeHeader.call(this, name)
        handLines(this, lines)
        written = reason === undefined && headers === undefined ? original.call(this, statusCode) : original.call(this, statusCode, reason, headers)
      } else {
        written = named ? original.call(this, statusCode, reason, out) : original.call(this, statusCode, out)
      }
    } catch (error) {
      linesFor = outerResponse
      pendingLines = outerLines
      // Node refused the head (a status out of range, a header value it cannot write) and
      // wrote nothing: the answer that follows (the framework's error, the 502) still takes
      // the dispatch headers, and no session is pinned to an id the client never got.
      if (own) this[kDispatch] = decision
      else aside.set(this, decision)
      throw error
    }
    // A Node whose writeHead stored a head without `_storeHeader`: the merge from now on.
    if (lines !== undefined && linesFor === this) writesLines = false
    linesFor = outerResponse
    pendingLines = outerLines
    recordHead(this, getHeader, decision, statusCode, sessionId, given)
    return written
  }

  // Only Node's HTTP/1 response has `_storeHeader` (HTTP/2's compatibility response does not):
  // elsewhere the dispatch headers always take the merge above.
  const storeHeader = (proto as { _storeHeader?: unknown })._storeHeader
  let writesLines = typeof storeHeader === 'function' && storeHeader.length === 2
  if (writesLines) {
    const store = storeHeader as (this: unknown, firstLine: string, headers: unknown) => unknown
    ;(proto as { _storeHeader?: unknown })._storeHeader = function _storeHeader(this: unknown, firstLine: string, headers: unknown) {
      if (linesFor !== this) return store.call(this, firstLine, headers)
      const lines = pendingLines
      linesFor = undefined
      pendingLines = ''
      return store.call(this, firstLine + lines, headers)
    }
  }
  wrapped.add(proto)
}

/** The response whose head is being written with the dispatch headers as lines, and those lines. */
let linesFor: object | undefined
let pendingLines = ''

/** Makes the next `_storeHeader` of `res` append `lines` to its status line. */
function handLines(res: object, lines: string): void {
  linesFor = res
  pendingLines = lines
}

/** What Node refuses in a header value (its `checkInvalidHeaderChar`). */
const INVALID_VALUE = /[^\t\x20-\x7e\x80-\xff]/

/**
 * The dispatch headers as head lines (`name: value` and CRLF each), or `undefined` where they
 * take the merge instead: when `Vary` or `Access-Control-Expose-Headers` must join the
 * handler's (requests with an `Origin`), or when a value holds a character Node refuses in a
 * header, which Node's own check then throws on (none should get here: the values are the
 * App's versions, checked when compiled, a pinned version, checked by the dispatcher, and the
 * rate-limit figures). The names are the dispatcher's own, valid field names.
 */
function headLines(stamped: Readonly<Record<string, string>>): string | undefined {
  if (stamped.vary !== undefined || stamped[EXPOSE] !== undefined) return undefined
  let lines = ''
  let i = 0
  for (const name in stamped) {
    const value = stamped[name]!
    if (lineValues[i] !== value || lineNames[i] !== name) {
      if (INVALID_VALUE.test(value)) return undefined
      lineNames[i] = name
      lineValues[i] = value
      lineTexts[i] = `${name}: ${value}\r\n`
    }
    lines += lineTexts[i]!
    i++
  }
  return lines
}

/**
 * The lines `headLines` last wrote, by position, their values found valid: the versions and the
 * policy repeat request after request, so only the rate-limit line is built (and checked) anew.
 */
const lineNames: string[] = []
const lineValues: string[] = []
const lineTexts: string[] = []

/** Where the handler's `writeHead` headers hold a dispatch header's name, or come as an array. */
const CLASH = Symbol('clash')

/**
 * `Mcp-Session-Id` among the handler's `writeHead` headers (`undefined` when absent), or
 * `CLASH` when they hold a dispatch header's name or come as an array: those need a merge.
 */
function scanGiven(given: unknown, stamped: Readonly<Record<string, string>>): string | undefined | typeof CLASH {
  if (given === undefined || given === null || typeof given !== 'object') return undefined
  if (Array.isArray(given)) return CLASH
  let sessionId: string | undefined
  for (const key in given) {
    if (isOneOf(key, stamped)) return CLASH
    if (sessionId === undefined && sameName(key, 'mcp-session-id')) sessionId = headerValue((given as Record<string, unknown>)[key])
  }
  return sessionId
}

/**
 * Hands `decision` to the wrapped `writeHead` of `res`, whose prototype chain must hold
 * `proto`, wrapped by {@link installHeadInterception}. Returns `false`, doing nothing, when
 * the head cannot record the outcome on its own: a new session whose pin an asynchronous
 * store must hold before the answer goes out, or a response whose `writeHead` is not that
 * wrapper (a per-response override, an HTTP/2 response). The caller then takes its own path.
 */
export function attachToHead(res: NodeResponse, proto: NodeResponse, decision: Dispatched): boolean {
  if (!decision.synchronousPins && decision.context.sessionId === undefined) return false
  if (!wrapped.has(proto) || res.writeHead !== proto.writeHead) return false
  if (Object.getPrototypeOf(res) === proto) (res as WithDecision)[kDispatch] = decision
  else {
    // A response whose prototype was swapped (Express does it to every response): adding a
    // property to such objects made V8 copy and migrate their hidden class on every request
    // (measured: about 60,000 instructions); a WeakMap entry costs far less there.
    aside.set(res, decision)
    asideUsed = true
  }
  return true
}

