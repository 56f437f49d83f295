/**
 * Web-standard adapter (`mcp-dispatch/web`): `(request: Request) => Promise<Response>` for
 * Hono, Next.js route handlers, Cloudflare Workers, Bun, Deno and `@hono/node-server`.
 *
 * @example
 * ```ts
 * import { mcpDispatch, routeByVersion } from 'mcp-dispatch/web'
 * const handle = mcpDispatch({
 *   dispatcher: { apps, subscriptions, tokens, authorizationServers: ['https://auth.example.com'] },
 *   // One handler per App version, created on first use; webSessions (docs/adapters.md) keeps
 *   // one MCP SDK transport per session.
 *   handler: routeByVersion((app, version) => webSessions(() => buildServer(app, version))),
 * })
 * // Workers: the client address from Cloudflare's header (never `fetch: handle` itself: the
 * // runtime's second argument, its `env`, would be taken for `info`).
 * export default { fetch: (request: Request) => handle(request, { clientAddress: request.headers.get('cf-connecting-ip') ?? undefined }) }
 * ```
 * @module
 */
import { forwardedProtocol, resolveClientAddress, schemeOf } from '../../core/client-address.js'
import { isFieldName } from '../../core/cors.js'
import { type Reply, versionNotServedReply } from '../../core/reply.js'
import { ConfigurationError } from '../../errors.js'
import { type DispatchContext, type DispatchOutcome } from '../../pipeline/dispatcher.js'
import { isForeignThenable } from '../../core/thenable.js'
import {
  CONNECTION_SPECIFIC_FIELDS,
  type Dispatched,
  type NodeResponse,
  attachToHead,
  closeIfBodyInFlight,
  continueIfExpected,
  installHeadInterception,
  isHttp2Response,
  mergeExposeHeaders,
  mergeVary,
} from '../head.js'
import { type AdapterOptions, HANDLER_FAILED, INTERNAL_ERROR, INVALID_HOST, canonicalHost, setupAdapter, splitUrl } from '../shared.js'
import { isClientDisconnect } from '../client-error.js'
import { isEventStream } from '../../core/text.js'
import { type RouteByVersionOptions, type VersionRoutes, createVersionRouter } from '../version-router.js'
import { toResponse } from './response.js'

/**
 * A web-standard MCP handler for one dispatched request. It returns a new `Response` for every
 * request: the dispatch headers may be set on it in place, so a `Response` shared between
 * requests would carry another request's version. An answer that is not a sendable
 * `Response` (nothing, `Response.error()`) is a handler failure (502).
 */
export type WebMcpHandler = (request: Request, context: DispatchContext) => Response | Promise<Response>

/** Options of {@link mcpDispatch} (web). */
export interface WebDispatchOptions extends AdapterOptions {
  /** Serves a dispatched request; `context.version` names the version to serve. */
  handler: WebMcpHandler
}

/**
 * Per-request information the runtime knows and the `Request` does not. Built by the platform:
 * a handler given to the runtime as it is (`fetch: handle`) gets the runtime's own second
 * argument here, which names no client address. Bun's `Server`, Deno's `ServeHandlerInfo`,
 * `@hono/node-server`'s `{ incoming, outgoing }` and a Hono `Context` are told apart, answered
 * 500 (-32603) and reported to `onError` (context `adapter`, naming the wiring to write); a Workers
 * `env` cannot be, and is served as an `info` without a client address.
 */
export interface WebRequestInfo {
  /**
   * The socket peer address (`@hono/node-server`: `c.env.incoming.socket.remoteAddress`).
   * `null` or `''` (a header lookup that found none, such as `cf-connecting-ip` off Cloudflare)
   * names no peer, as `undefined` does: `X-Forwarded-For` is then not read, an IP allowlist
   * refuses, and client budgets do not count the request. Anything else that is no string
   * (Bun's `server.requestIP(request)` object) is answered 500 (-32603) and reported to `onError`
   * (context `adapter`).
   */
  clientAddress?: string | null | undefined
  /**
   * The authority the client addressed, for a runtime whose `request.url` does not carry it:
   * Next.js (`next start`) builds a route handler's URL of its own address
   * (`http://localhost:3000/v1`) whatever `Host` the client sent, so there pass
   * `request.headers.get('host')` (docs/adapters.md, "Next.js"). Given, it replaces the URL's
   * host in finding the App and in the App address; it is checked as the Node adapters check
   * `Host`: one no URL can hold, or a list (`a, b`), is answered 400 `Invalid Host header`, and
   * `null` or `''` names no host (404 `not_found`). The URL's scheme and path are kept, and the
   * handler gets `request` as it came. Omitted (`undefined`), the URL's host, as elsewhere.
   * Anything else that is no string is answered 500 (-32603) and reported to `onError` (context `adapter`).
   */
  host?: string | null | undefined
  /**
   * On Node, the `http.ServerResponse` that the returned `Response` will be written to
   * (`@hono/node-server`: `c.env.outgoing`). Optional, and only for speed: with it, the
   * dispatch headers are added to the head as Node writes it, and the handler's `Response`
   * is returned as it is. Stamping them on the `Response` instead makes `@hono/node-server`
   * build a `Headers` object it would otherwise skip (measured: about a third of the
   * adapter's cost per request). Pass it only when the returned `Response` is written to
   * this very response. Anything else (an HTTP/2 response, a runtime without `node:http`) is
   * ignored, and the headers go on the `Response`.
   */
  outgoing?: unknown
}

/** The fetch-style handler returned by {@link mcpDispatch}. */
export type WebDispatchHandler = (request: Request, info?: WebRequestInfo) => Promise<Response>

const utf8 = new TextEncoder()

/**
 * HEAD is GET without content (RFC 9110 section 9.3.2): the reply's status and fields, with the
 * `Content-Length` its GET would carry, as the Express and Fastify adapters send it.
 */
function headResponse(reply: Reply): Response {
  if (reply.body === null) return new Response(null, { status: reply.status, headers: reply.headers })
  const headers = new Headers(reply.headers)
  headers.set('content-length', String(utf8.encode(reply.body).byteLength))
  return new Response(null, { status: reply.status, headers })
}

/**
 * Wraps a web-standard MCP handler in the whole dispatch pipeline. Rejections are answered
 * here; dispatched requests reach `handler` with their body untouched, and its response
 * (SSE streams included) passes through unbuffered with `X-MCP-Version` and
 * `X-MCP-Latest-Version` stamped on it.
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} without a `handler` function, or with a `dispatcher` (or dispatcher options), `trustProxy` or `onError` it cannot use.
 */
export function mcpDispatch(options: WebDispatchOptions): WebDispatchHandler {
  const { dispatcher, trust, onError } = setupAdapter(options, { name: 'the Web adapter', options: ['handler'] })
  const handler = options.handler
  if (typeof handler !== 'function') throw new ConfigurationError('handler', 'must be a function')
  return async function dispatch(request, info) {
    const misread = misreadInfo(info)
    if (misread !== undefined) {
      // The platform's wiring (a runtime's object where its string belongs): said to onError, and
      // answered 500 in JSON-RPC words, never a runtime's page, nor a 503 a client would retry
      // (nothing changes until the platform is rewired).
      onError(misread, 'adapter')
      return toResponse(INTERNAL_ERROR)
    }
    const url = splitUrl(request.url)
    const schemeEnd = url.origin.indexOf('://')
    // The scheme of the App address: `http` or `https`, in any case, as the Node adapters read
    // an absolute-form target (Deno's `request.url` keeps the target's as sent: `HTTP://…`,
    // `ftp://…`). Under another scheme the whole target is the path, which is none of an App
    // (404), as on the Node adapters, and never an App address of that scheme; its authority
    // is no host either (below).
    const written = schemeEnd === -1 ? 'http' : url.origin.slice(0, schemeEnd)
    const known = written === 'http' || written === 'https' ? written : schemeOf(written)
    const scheme = known ?? 'http'
    const path = known === undefined ? url.origin + url.path : url.path
    const given = info?.host
    // The host as sent (the URL's, or `info.host`), before its scheme's default port is dropped.
    let sent = given
    let host: string | undefined
    let origin: string
    if (given === undefined) {
      const field = request.headers.get('host')
      if (schemeEnd === -1) {
        // No host in the URL: Bun builds `request.url` of the path alone when the `Host` is
        // missing or empty (no App, as on the Node adapters) or one it cannot parse (400).
        if (field) return toResponse(INVALID_HOST)
        origin = `${scheme}://`
      } else if (known === undefined) {
        // A target of another scheme (Deno's `ftp://a@host:99999/v1`): the Node adapters take
        // no host of it, and check the `Host` field as usual, so the answer is theirs: 400 for
        // a field with an invalid value, else 404 (no host, whatever the target's authority).
        if (field && canonicalHost(field, scheme) === undefined) return toResponse(INVALID_HOST)
        origin = `${scheme}://`
      } else {
        // A runtime's URL parser has checked the host; @hono/node-server's fast path has not
        // (`weather.1`, `1.2.3.999`), and such a host would become the App address.
        const raw = url.origin.slice(schemeEnd + 3)
        sent = raw
        host = canonicalHost(raw, scheme)
        if (host === undefined) return toResponse(INVALID_HOST)
        // The `Host` field, where the URL's host is not it as sent, is checked as the Node
        // adapters check it (RFC 9112 section 3.2: a `Host` with an invalid value is 400, an
        // absolute-form target or not). Bun builds the URL of what its parser made of the field
        // (`weather.localhost:`, `weath%65r.localhost`, `0x7f.1` rewritten), Deno and workerd of
        // the field as sent, a path in it too (`weather.localhost/x`). Two `Host` fields are 400
        // too: @hono/node-server and Bun build the URL of the first one and join them all in
        // `headers`, and `canonicalHost` refuses the comma of a list.
        if (field && field !== raw && canonicalHost(field, scheme) === undefined) return toResponse(INVALID_HOST)
        // Rebuilt when the host is not as sent: Deno keeps its case (`WEATHER.localhost`) and a
        // default port (`:80`), which the App address has in the parser's form on every adapter.
        origin = written === scheme && host === raw ? url.origin : `${scheme}://${host}`
      }
    } else {
      if (given === null || given === '') host = undefined
      else {
        // A list (two fields, proxies') is no authority: `canonicalHost` refuses its comma.
        host = canonicalHost(given, scheme)
        if (host === undefined) return toResponse(INVALID_HOST)
      }
      origin = `${scheme}://${host ?? ''}`
    }
    // `null` or `''` (a header lookup in a platform's JavaScript) names no peer, as `undefined` does.
    let clientAddress = info?.clientAddress || undefined
    if (trust !== false) {
      // Behind a trusted TLS-terminating proxy the App address takes the client's scheme (as
      // Express's and Fastify's `protocol` do there), and the host its default port for it.
      const scheme = forwardedProtocol(clientAddress, request.headers.get('x-forwarded-proto'), trust)
      if (scheme !== undefined && !origin.startsWith(`${scheme}:`)) {
        if (host !== undefined) {
          // From the host as sent: its port is dropped only when it is the default of the
          // client's scheme (`:80` was already gone under `http`, and is no default of https).
          host = canonicalHost(sent ?? host, scheme)
          if (host === undefined) return toResponse(INVALID_HOST)
        }
        origin = `${scheme}://${host ?? ''}`
      }
      clientAddress = resolveClientAddress(clientAddress, request.headers.get('x-forwarded-for'), trust)
    }
    const decided = dispatcher.decide({
      method: request.method,
      path,
      host,
      origin,
      headers: request.headers,
      clientAddress,
    })
    // With synchronous stores the decision is there at once: no await, no microtask.
    const decision = decided instanceof Promise ? await decided : decided
    if (decision.type === 'reply') {
      const { reply } = decision
      return request.method === 'HEAD' ? headResponse(reply) : toResponse(reply)
    }
    setContext(request, decision.context)
    // On Node, the head of `outgoing` takes the headers (and tells `complete` the outcome),
    // unless a new session's pin must be stored, asynchronously, before the answer goes out.
    const outgoing = info?.outgoing
    const atHead = outgoing !== undefined && headOf(outgoing, decision)
    // `100 Continue` once the request is let through, where the server handed `checkContinue` here.
    if (outgoing !== undefined) continueIfExpected(outgoing)
    let response: Response
    try {
      // A body read before the dispatch layer (a middleware's `c.req.json()`) would reach the
      // handler empty, and the client would get a parse error for the JSON it sent.
      if (request.bodyUsed) {
        throw new TypeError('mcp-dispatch: the request body was read before the handler (mount mcpDispatch before middleware that reads it, or pass a new Request with the body)')
      }
      const answered: unknown = handler(request, decision.context)
      response = usableResponse(answered instanceof Promise || isForeignThenable(answered) ? await answered : answered)
      // An answer given before the request's body has all arrived (a proxied App's early 413),
      // whose connection @hono/node-server closes after it: said so (`Connection: close`).
      if (outgoing !== undefined) {
        const judged = closeIfBodyInFlight(outgoing)
        if (judged !== undefined) await judged
      }
      // Stamped before the pin is stored: an answer the headers cannot go on is no answer.
      if (!atHead) response = stampHeaders(response, decision.headers, outgoing !== undefined && isHttp2Response(outgoing))
    } catch (error) {
      // Not a client that left (a body read cut short: `terminated`), which any client causes at
      // will; the request's signal tells it has, on runtimes that abort it then (@hono/node-server).
      if (!(request.signal.aborted && isClientDisconnect(error, request.signal.reason))) onError(error, 'handler')
      // The 502 carries the dispatch headers (version, rate limit, CORS) as on Express and
      // Fastify: on Node the head, still holding the decision, stamps them.
      return atHead ? toResponse(HANDLER_FAILED) : stampHeaders(toResponse(HANDLER_FAILED), decision.headers)
    }
    if (atHead) return response
    const sessionId = response.headers.get('mcp-session-id')
    // A response of a session tells the dispatcher when it ends (an SSE stream keeps the pin),
    // and lets it end the stream (a credential that no longer passes).
    let ended: (() => void) | undefined
    // Ends the relayed stream; `true` when a check failed before the relay was set up (while a
    // new session's pin was being stored): the stream is then ended as soon as it is.
    let cut: (() => void) | true | undefined
    const eventStream = response.status < 300 && isEventStream(response.headers.get('content-type'))
    const outcome: DispatchOutcome =
      sessionId === null && decision.context.sessionId === undefined && !eventStream
        ? { status: response.status, sessionId }
        : {
            status: response.status,
            sessionId,
            whenClosed: (listener) => {
              const before = ended
              ended = before === undefined ? listener : () => (before(), listener())
            },
            ...(eventStream && { close: () => (typeof cut === 'function' ? cut() : (cut = true)) }),
            // A 404 ends the session's pin only when it is the MCP transport's (JSON).
            ...(response.status === 404 && { contentType: response.headers.get('content-type') }),
          }
    const pinned = decision.complete(outcome)
    const failure = pinned instanceof Promise ? await pinned : undefined
    if (failure) {
      // The new session's pin could not be stored: its every request would be refused. The
      // store's 503 goes instead, and the handler's answer is dropped.
      response.body?.cancel().catch(() => {})
      // The answer never goes out: what `complete` registered for it (the credential's check)
      // is told it ended.
      ended?.()
      return toResponse(failure)
    }
    if (ended === undefined) return response
    try {
      return untilStreamEnds(response, ended, (end) => {
        if (cut === true) end()
        else cut = end
      })
    } catch (error) {
      // A body that cannot be read (locked by the handler): the handler's failure, and no
      // session kept open for it.
      ended()
      onError(error, 'handler')
      return stampHeaders(toResponse(HANDLER_FAILED), decision.headers)
    }
  }
}

/**
 * What a handler answered, if a runtime can send it: a `Response` (of this realm or, by its
 * shape and methods, another), not `Response.error()` (status 0, which no runtime sends), not a
 * plain object shaped like one (no `arrayBuffer`), nor one of another class than the global
 * `Response` whose body was read or is locked. Otherwise (a forgotten `return`, a plain object)
 * a `TypeError`, which the adapter answers as a handler failure: a JSON-RPC 502 with the
 * dispatch headers, reported to `onError`, instead of a runtime's bare 500 (or a 200 with an
 * empty body) that no browser client can read. Of a `Response` of the global class only the
 * status is read: the body and headers of `@hono/node-server`'s light `Response` stay unbuilt.
 */
function usableResponse(answered: unknown): Response {
  if (
    answered instanceof Response ||
    (answered !== null &&
      typeof answered === 'object' &&
      typeof (answered as Response).headers?.get === 'function' &&
      // A Response of another realm has its methods; a plain object shaped like one has not.
      typeof (answered as Response).arrayBuffer === 'function')
  ) {
    const status = (answered as Response).status
    if (!(typeof status === 'number' && status >= 200 && status <= 599)) {
      throw new TypeError(`mcp-dispatch: the handler answered with a Response of status ${String(status)}, which cannot be sent`)
    }
    // One of another class than the global `Response` (a runtime's own where @hono/node-server
    // put its light class in the global's place, as `fetch` answers there; another realm's)
    // tells at no cost whether its body can still be sent. The global class's is not asked:
    // the light one would build the Response it leaves unbuilt to answer (without `outgoing`,
    // the copy for immutable headers checks those, see stampHeaders).
    if (Object.getPrototypeOf(answered) !== Response.prototype && ((answered as Response).bodyUsed || (answered as Response).body?.locked === true)) {
      throw new TypeError('mcp-dispatch: the handler answered with a Response whose body was already read or is locked, which cannot be sent')
    }
    return answered as Response
  }
  throw new TypeError(`mcp-dispatch: the handler answered with ${answered === null ? 'null' : typeof answered}, not a Response`)
}

/**
 * What is wrong with the `info` a platform passed, or `undefined`: `host` and `clientAddress`
 * are strings when given (Bun's `server.requestIP(request)` is an object: its `address` is the
 * string), and `info` is no runtime's own second argument (a handler passed to the runtime as
 * it is: Bun's `Server`, Deno's `ServeHandlerInfo`, `@hono/node-server`'s `{ incoming, outgoing }`,
 * or a Hono `Context` given in its place),
 * which names no client address: served, every request would be taken for one of no known peer
 * (an IP allowlist refusing all, client budgets counting none).
 */
function misreadInfo(info: WebRequestInfo | undefined): TypeError | undefined {
  if (info === undefined) return undefined
  if (info === null || typeof info !== 'object') return new TypeError(`mcp-dispatch: info must be an object or undefined, got ${info === null ? 'null' : typeof info}`)
  const { host, clientAddress } = info as { host?: unknown; clientAddress?: unknown }
  if (host !== undefined && host !== null && typeof host !== 'string') return notAString('host', host)
  if (clientAddress !== undefined && clientAddress !== null && typeof clientAddress !== 'string') return notAString('clientAddress', clientAddress)
  // Only an info without a client address can be a runtime's object: the check costs nothing
  // on the usual wiring.
  return clientAddress === undefined ? runtimeObject(info as Record<string, unknown>) : undefined
}

/** A runtime's second argument given as `info`, named with the wiring to write instead. */
function runtimeObject(info: Record<string, unknown>): TypeError | undefined {
  const runtime =
    typeof info.requestIP === 'function'
      ? ["Bun's server", 'fetch: (request, server) => handle(request, { clientAddress: server.requestIP(request)?.address })']
      : typeof info.remoteAddr === 'object' && info.remoteAddr !== null
        ? ["Deno's ServeHandlerInfo", '(request, info) => handle(request, { clientAddress: info.remoteAddr.hostname })']
        : typeof info.incoming === 'object' && info.incoming !== null
          ? ["@hono/node-server's env", 'fetch: (request, env) => handle(request, { clientAddress: env.incoming.socket.remoteAddress, outgoing: env.outgoing })']
          : 'env' in info && typeof info.req === 'object' && info.req !== null
            ? ["Hono's Context", '(c) => handle(c.req.raw, { clientAddress: c.env.incoming.socket.remoteAddress, outgoing: c.env.outgoing }) on @hono/node-server']
            : undefined
  if (runtime === undefined) return undefined
  return new TypeError(`mcp-dispatch: info is ${runtime[0]}, which names no client address: pass ${runtime[1]}`)
}

function notAString(field: string, value: unknown): TypeError {
  return new TypeError(`mcp-dispatch: info.${field} must be a string, got ${Array.isArray(value) ? 'an array' : typeof value}`)
}

/**
 * `response`, with `onEnd` called once when its body is done: read to the end, cancelled by
 * the client, or failed; at once for a response without a body. The body is relayed through a
 * new stream, pulled chunk for chunk (back-pressure holds), the client's cancel and the
 * source's errors passed on. For keeping track of open answers, such as an MCP session's
 * streams (the adapter keeps a session's pin alive with it; the reference platform's Apps
 * keep a session from going idle).
 *
 * @example
 * ```ts
 * open++
 * return whenBodyEnds(await transport.handleRequest(request), () => open--)
 * ```
 */
export function whenBodyEnds(response: Response, onEnd: () => void): Response {
  return relayBody(response, onEnd)
}

/**
 * {@link whenBodyEnds}, and, with `closer`, a function handed to it that ends the relayed body
 * early (`DispatchOutcome.close`).
 */
function relayBody(response: Response, onEnd: () => void, closer?: (close: () => void) => void): Response {
  const body = response.body
  if (body === null) {
    onEnd()
    return response
  }
  const reader = body.getReader()
  let done = false
  const end = () => {
    if (done) return
    done = true
    onEnd()
  }
  let closed = false
  const relayed = new ReadableStream<Uint8Array>({
    start(controller) {
      // Ends the relayed body where it stands (the client reads a complete stream) and cancels
      // the handler's: what it writes later goes nowhere.
      closer?.(() => {
        if (closed) return
        closed = true
        end()
        try {
          controller.close()
        } catch {
          // Already errored or closed by the runtime.
        }
        reader.cancel().catch(() => {})
      })
    },
    async pull(controller) {
      if (closed) return
      try {
        const chunk = await reader.read()
        if (closed) return
        if (chunk.done) {
          end()
          controller.close()
        } else controller.enqueue(chunk.value)
      } catch (error) {
        if (closed) return
        end()
        controller.error(error)
      }
    },
    cancel(reason) {
      end()
      // Never rejects (a runtime cancelling a body may rethrow what it rejects with).
      return reader.cancel(reason).catch(() => {})
    },
  })
  return new Response(relayed, { status: response.status, statusText: response.statusText, headers: response.headers })
}

/**
 * {@link whenBodyEnds} for an event stream only: any other answer ends as it is written, so
 * `onEnd` runs at once and the response is left as it is (a string body keeps the runtime's
 * fast path).
 */
function untilStreamEnds(response: Response, onEnd: () => void, closer: (close: () => void) => void): Response {
  if (!isEventStream(response.headers.get('content-type'))) {
    onEnd()
    return response
  }
  return relayBody(response, onEnd, closer)
}

/** `node:http`'s `ServerResponse.prototype`, where there is Node (`null` elsewhere); read once. */
let nodeResponsePrototype: NodeResponse | null | undefined

/**
 * Hands the decision to the head of a Node response (see `WebRequestInfo.outgoing`). `false`
 * when `outgoing` is not an unsent `node:http` response, or when `attachToHead` declines (a
 * new session on an asynchronous pin store: the adapter awaits the pin itself).
 */
function headOf(outgoing: unknown, decision: Dispatched): boolean {
  if (typeof outgoing !== 'object' || outgoing === null) return false
  if (nodeResponsePrototype === undefined) {
    // No static import of node:http: this adapter also runs on Workers, Deno and Bun.
    const getBuiltinModule = (globalThis as { process?: { getBuiltinModule?: (id: string) => unknown } }).process
      ?.getBuiltinModule
    const http = getBuiltinModule?.('node:http') as { ServerResponse?: { prototype: NodeResponse } } | undefined
    nodeResponsePrototype = http?.ServerResponse?.prototype ?? null
    if (nodeResponsePrototype !== null) installHeadInterception(nodeResponsePrototype)
  }
  if (nodeResponsePrototype === null || (outgoing as { headersSent?: unknown }).headersSent !== false) return false
  return attachToHead(outgoing as NodeResponse, nodeResponsePrototype, decision)
}

/**
 * Adds the dispatch headers to the handler's response. In place when its headers are
 * mutable (a `Response` the handler built), as Hono middleware does: copying it into a new
 * `Response` turns the body into a stream, which on `@hono/node-server` costs the fast path
 * for string bodies (measured: half the throughput). A response with immutable headers
 * (`fetch()`, `Response.redirect()`) is copied; one whose body the handler read or locked has
 * nothing to copy and throws a `TypeError` (the handler's failure, the 502). So a handler must
 * return a new `Response`, with headers of its own, for every request.
 */
function stampHeaders(response: Response, headers: Readonly<Record<string, string>>, http2 = false): Response {
  try {
    stampOn(response.headers, headers, http2)
    return response
  } catch {
    // Immutable headers: a runtime's own Response (`fetch`'s, `Response.redirect`), whose body
    // goes on in a copy. One the handler read or locked has none to give: its failure. (Not
    // asked of a Response with mutable headers: @hono/node-server's light one would build the
    // Response it leaves unbuilt to answer.)
    if (response.bodyUsed || response.body?.locked === true) {
      throw new TypeError('mcp-dispatch: the handler answered with a Response whose body was already read or is locked, which cannot be sent')
    }
    const copy = new Headers(response.headers)
    stampOn(copy, headers, http2)
    return new Response(response.body, { status: response.status, statusText: response.statusText, headers: copy })
  }
}

/**
 * The dispatch headers onto `target`; `Vary` and `Access-Control-Expose-Headers` join the
 * handler's (see `mergeVary`, `mergeExposeHeaders`). For an HTTP/2 response, the handler's
 * connection-specific fields go, with those its `Connection` names, as an intermediary drops
 * them (RFC 9113 section 8.2.2).
 */
function stampOn(target: Headers, headers: Readonly<Record<string, string>>, http2: boolean): void {
  if (http2) {
    const named = target.get('connection')
    if (named !== null) {
      for (const token of named.split(',')) {
        const name = token.trim()
        if (isFieldName(name)) target.delete(name)
      }
    }
    // `@hono/node-server` (2.1) lets Node's refusal of such a head end the process: a handler's
    // `Response` of an HTTP/1 `fetch()` (`Keep-Alive: timeout=5`) would have. (`TE` means
    // nothing on a response.)
    for (const name of CONNECTION_SPECIFIC_FIELDS) target.delete(name)
  }
  for (const name in headers) {
    const value = headers[name]!
    if (name === 'vary') target.set(name, mergeVary(target.get(name), value))
    else if (name === 'access-control-expose-headers' && target.has(name)) target.set(name, mergeExposeHeaders(target.get(name), value))
    else target.set(name, value)
  }
}

// The context rides on the request under a symbol: a WeakMap entry per request is work for
// every garbage collection (V8 treats such entries specially in each scavenge). A request
// that takes no property (frozen) is kept in the WeakMap instead.
const kContext = Symbol('mcp-dispatch.context')
type CarryingRequest = Request & { [kContext]?: DispatchContext }
const contexts = new WeakMap<Request, DispatchContext>()

function setContext(request: Request, context: DispatchContext): void {
  try {
    ;(request as CarryingRequest)[kContext] = context
  } catch {
    contexts.set(request, context)
  }
}

/**
 * The dispatch context of a request that {@link mcpDispatch} dispatched (the handler also
 * receives it as its second argument). Throws a `TypeError` for a request it did not see.
 *
 * @example
 * ```ts
 * const { app, version, identity } = getDispatchContext(request)
 * ```
 */
export function getDispatchContext(request: Request): DispatchContext {
  const context = (request as CarryingRequest | undefined)?.[kContext] ?? contexts.get(request)
  if (!context) {
    throw new TypeError('mcp-dispatch: no dispatch context on this request; serve it through the web mcpDispatch handler')
  }
  return context
}

/**
 * One MCP handler per live version, so the platform does not write the version switch: use
 * the result as `handler`. A live version without a handler gets a JSON-RPC 404
 * (`version_not_served`); a handler that throws gets the adapter's 502.
 *
 * @example
 * ```ts
 * mcpDispatch({
 *   dispatcher,
 *   // Created on the first request to each App version, then kept:
 *   handler: routeByVersion((app, version) => handlerFor(app, version)),
 * })
 * mcpDispatch({ dispatcher, handler: routeByVersion({ '1.4.2': v1, '2.0.0': v2 }, { appId: 'app_weather' }) })
 * ```
 *
 * @throws {ConfigurationError} with `routes` that are neither an object of handler functions nor
 * a function (a `Map` included), an object with no handler, a key that is neither
 * `<appId>@<version>` nor an exact version, bare-version keys without `appId`, or an empty
 * `appId`.
 */
export function routeByVersion(routes: VersionRoutes<WebMcpHandler>, options?: RouteByVersionOptions): WebMcpHandler {
  const route = createVersionRouter(routes, options)
  return (request, context) => {
    const handler = route(context)
    return handler ? handler(request, context) : toResponse(versionNotServedReply(context.version))
  }
}

export { answerClientError, answerExpectationFailed } from '../client-error.js'
export { toResponse } from './response.js'
export { type NodeServerFault, nodeServerErrorHandler, nodeServerFault } from './node-server.js'
export type { ClientError, ClientErrorSocket, ExpectationResponse } from '../client-error.js'
export type { RouteByVersionOptions, VersionRoutes } from '../version-router.js'
export type { DispatchContext } from '../../pipeline/dispatcher.js'
