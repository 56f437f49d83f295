/**
 * Express adapter (`mcp-dispatch/express`): middleware that puts the whole dispatch pipeline
 * in front of an existing MCP route. Works with Express 5 and 4; it imports nothing from
 * Express at run time.
 *
 * Rejections (401, 402, 403, 404, 405, 429, 503, metadata, preflight) are answered by the
 * middleware itself, byte for byte as the Web adapter answers them. A dispatched request gets
 * `req.dispatchContext` (identity, App, version, latest version), the `X-MCP-Version` /
 * `X-MCP-Latest-Version` (and `RateLimit`, CORS) headers on its response, and goes on to the
 * next handler, for example the MCP SDK's `StreamableHTTPServerTransport`, which writes the
 * response itself (SSE streams included). The `Mcp-Session-Id` that handler assigns pins the
 * session to its version.
 *
 * @example
 * ```ts
 * import express from 'express'
 * import { mcpDispatch, routeByVersion } from 'mcp-dispatch/express'
 *
 * const app = express()
 * app.use(mcpDispatch({ dispatcher: { apps, subscriptions, tokens } }))
 * app.use(
 *   routeByVersion((appRecord, version) => {
 *     // nodeSessions (docs/adapters.md): one MCP SDK transport per session of this App version.
 *     const serve = nodeSessions(() => buildServer(appRecord, version))
 *     return (req, res) => serve(req, res, req.body)
 *   }),
 * )
 * ```
 * @module
 */
import { IncomingMessage, type OutgoingHttpHeaders, type ServerResponse } from 'node:http'
import type { ErrorRequestHandler, NextFunction, Request, RequestHandler, Response } from 'express'
import { ConfigurationError, logError } from '../../errors.js'
import type { Decision, DispatchContext } from '../../pipeline/dispatcher.js'
import type { TokenApi } from '../../tokens/token-api.js'
import { type JsonRpcErrorsOptions, errorReply, setupJsonRpcErrors } from '../error-reply.js'
import {
  answerEnded,
  answerTokenApi,
  clearHeaders,
  holdResponseHead,
  isTokenApiPath,
  installHeadInterception,
  noteEnds,
  platformHeaders,
  requireContext,
  requestProtocol,
  setHeaders,
  clientLeft,
  settleFailedAnswer,
  lowerTargetScheme,
  toDispatchRequest,
  toHandlerRequest,
  writeReply,
  writeWebResponse,
} from '../node-http.js'
import { continueIfExpected } from '../head.js'
import {
  type AdapterOptions,
  HANDLER_FAILED,
  INVALID_HOST,
  type ServeTokenApiOptions,
  mountMissed,
  secondDispatcherRefusal,
  setupAdapter,
  setupTokenApi,
} from '../shared.js'
import { type Reply, versionNotServedReply } from '../../core/reply.js'
import { isForeignThenable } from '../../core/thenable.js'
import { type RouteByVersionOptions, type VersionRoutes, createVersionRouter } from '../version-router.js'

declare global {
  // Declaration merging is how Express types request properties added by middleware.
  // eslint-disable-next-line @typescript-eslint/no-namespace
  namespace Express {
    interface Request {
      /**
       * Set by the `mcpDispatch` middleware of `mcp-dispatch/express` on every request it
       * dispatched: who is calling, the App, and the version to serve. Absent on requests
       * the middleware did not see. {@link getDispatchContext} returns it or throws.
       */
      dispatchContext?: DispatchContext
    }
  }
}

/**
 * Options of {@link mcpDispatch} (Express). An interface of its own, not an alias: the options
 * every adapter shares are of no entry point, so a project emitting declarations could not name
 * them in a type it infers (TS2742).
 */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type -- see above
export interface ExpressDispatchOptions extends AdapterOptions {}

/** A version's MCP handler: any Express handler; `req.dispatchContext` is set. */
export type ExpressMcpHandler = (req: Request, res: Response, next: NextFunction) => unknown

/** A web-standard MCP handler (the proxy handler, `WebStandardStreamableHTTPServerTransport`). */
export type ExpressWebHandler = (request: Request_, context: DispatchContext) => Response_ | Promise<Response_>
type Request_ = globalThis.Request
type Response_ = globalThis.Response

/** What the middleware leaves for a dispatched request: its context, and where failures go. */
interface DispatchedRequest {
  readonly context: DispatchContext
  readonly onError: (error: unknown, context: string) => void
  /** Decided by a dispatch middleware (not only given a context by the platform's code). */
  readonly decided: boolean
  /** The dispatcher that decided it, where one did. */
  readonly decidedBy?: object | undefined
}

/**
 * The dispatched requests. A WeakMap, not properties: Express swaps the prototype of every
 * request, and adding a property to such objects made V8 copy and migrate their hidden class
 * on every request (measured: about 30,000 instructions). `req.dispatchContext` reads it
 * through an accessor on Express's request prototype (see `exposeContext`).
 *
 * One map for every copy of the package in the process (an ESM import beside a CommonJS
 * require loads two), kept on `globalThis` under a registered symbol: a request one copy
 * dispatched and another routes finds its context and its `onError`, and is decided once. The
 * name holds the entries' shape (`v1`); a copy whose entries differ would name another.
 */
const dispatchedRequests = sharedWeakMap<DispatchedRequest>(Symbol.for('mcp-dispatch.express.dispatchedRequests.v1'))

/**
 * The WeakMap on `globalThis` under `key`, made there (not enumerable, not writable) by the
 * first to ask; a map of this copy's own where something else holds the key (or `globalThis`
 * is frozen), rather than a failure at load.
 */
function sharedWeakMap<V>(key: symbol): WeakMap<object, V> {
  const found = (globalThis as Record<symbol, unknown>)[key]
  if (found instanceof WeakMap) return found as WeakMap<object, V>
  const made = new WeakMap<object, V>()
  if (found === undefined && Object.isExtensible(globalThis)) {
    Object.defineProperty(globalThis, key, { value: made, enumerable: false, writable: false, configurable: false })
  }
  return made
}

/** Prototypes that have the `dispatchContext` accessor. */
const accessorOn = new WeakSet<object>()

/**
 * The path `handler` serves under as one of `route`'s handlers: the mount (`baseUrl`) and the
 * route's path, when that path is a literal one and `handler` is in the route's stack (a route
 * matched before the middleware ran stays on `req.route`: `app.get('/health', …, next)` then
 * `app.use(mw)`); `undefined` otherwise.
 */
function routeMount(baseUrl: string, route: unknown, handler: unknown): string | undefined {
  const { path, stack } = route as { path?: unknown; stack?: unknown }
  if (typeof path !== 'string' || !/^[^:*?+()[\]{}]*$/.test(path) || !Array.isArray(stack)) return undefined
  return stack.some((layer: { handle?: unknown } | null) => layer?.handle === handler) ? baseUrl + path : undefined
}

/** Whether the mount's `req.params` holds any parameter (Express 5's has no prototype). */
function hasParams(params: object | undefined): boolean {
  for (const key in params) if (Object.prototype.hasOwnProperty.call(params, key)) return true
  return false
}

/**
 * Makes `req.dispatchContext` read `dispatchedRequests`: an accessor, defined once, on the
 * prototype every Express request shares (Express's `request` object, the one just above
 * `http.IncomingMessage.prototype`, so mounted sub-apps see it too), as Express 4 and 5 define
 * `req.path`. An app of another copy of Express called as a handler (not mounted) has a
 * prototype of its own, without it: {@link getDispatchContext} reads the map itself.
 * Returns `false` for a request whose chain has no such object (a raw Node request): the
 * context then goes on the request itself.
 */
function exposeContext(req: object): boolean {
  let proto = Object.getPrototypeOf(req) as object | null
  if (proto !== null && accessorOn.has(proto)) return true
  while (proto !== null && Object.getPrototypeOf(proto) !== IncomingMessage.prototype) proto = Object.getPrototypeOf(proto) as object | null
  if (proto === null) return false
  if (!accessorOn.has(proto)) {
    Object.defineProperty(proto, 'dispatchContext', {
      configurable: true,
      enumerable: false,
      get(this: object) {
        return dispatchedRequests.get(this)?.context
      },
      set(this: object, context: DispatchContext) {
        const before = dispatchedRequests.get(this)
        dispatchedRequests.set(this, { context, onError: before?.onError ?? logError, decided: before?.decided ?? false, decidedBy: before?.decidedBy })
      },
    })
    accessorOn.add(proto)
  }
  // The per-app prototype (`app.request`) too, so the next lookup stops at once.
  accessorOn.add(Object.getPrototypeOf(req) as object)
  return true
}

/**
 * The scheme of a request as Express's `req.protocol` gives it, which is the socket's for a
 * request without `X-Forwarded-Proto` whatever `trust proxy` says: the getter runs only for a
 * request with the header. On Node 20, Express leaves every request and response with a hidden
 * class of its own, so each property read on them that Express has not made misses V8's caches
 * (about 2,000 instructions): the getter and its `this.app` cost two (docs/performance.md).
 */
function expressProtocol(req: Request): 'http' | 'https' {
  return requestProtocol(req, req.headers['x-forwarded-proto'] === undefined ? undefined : req.protocol)
}

/**
 * An answer the adapter writes itself (a refusal of the dispatcher, a failed handler's 502, a
 * version no handler serves), byte for byte the other adapters': without the
 * `X-Powered-By: Express` that Express's own first middleware set (a platform's headers stay,
 * an `X-Powered-By` of its own included).
 */
function writeOwn(res: ServerResponse, reply: Reply): void {
  if (res.getHeader('x-powered-by') === 'Express') res.removeHeader('x-powered-by')
  writeReply(res, reply)
}

/**
 * Creates the dispatch middleware.
 *
 * Mount it before the MCP route, and before any body parser (rejected requests are answered
 * without reading their body). Its mount path must be the dispatcher's `basePath`: the
 * pipeline reads the full path (`req.originalUrl`), as the Web adapter reads the full URL
 * (mounted where the `basePath` names only the inner part of the mount path, every request
 * there is 404, and a `ConfigurationError` naming the `basePath` to give is told to `onError`
 * once, context `configuration`). The client address is the socket peer, resolved through this adapter's `trustProxy`
 * option, never through Express's own `trust proxy` setting.
 *
 * @example
 * ```ts
 * app.use(mcpDispatch({ dispatcher, trustProxy: ['10.0.0.0/8'] }))
 * app.all('/{*path}', (req, res) => { // GET, POST and DELETE (Express 4: app.all('*', …))
 *   const { version, identity } = getDispatchContext(req)
 *   // …
 * })
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} with a `dispatcher` (or dispatcher options), `trustProxy` or `onError` it cannot use.
 */
export function mcpDispatch(options: ExpressDispatchOptions): RequestHandler {
  const { dispatcher, trust, onError } = setupAdapter(options, {
    name: 'the Express adapter',
    elsewhere: (key) =>
      key === 'handler'
        ? "the Express adapter takes no handler: mount it before your MCP routes, app.use(mcpDispatch({ dispatcher })), then app.all('/{*path}', handler) (Express 4: '*') (docs/adapters.md)"
        : undefined,
  })
  installHeadInterception()
  // Which dispatcher decides, as given: middleware made from one options object (each making a
  // dispatcher of its own) count as one, as they did before a second dispatcher was refused.
  const decidedBy: object = options.dispatcher as object
  const refuseSecond = secondDispatcherRefusal(onError, 'the Express middleware')

  /** Acts on a decision: answers a refusal, or lets the request through to the next handler. */
  function act(req: Request, res: Response, next: NextFunction, decision: Decision): void {
    if (decision.type === 'reply') {
      writeOwn(res, decision.reply)
      return
    }
    dispatchedRequests.set(req, { context: decision.context, onError, decided: true, decidedBy })
    if (!exposeContext(req)) req.dispatchContext = decision.context
    holdResponseHead(res, req.method, decision, onError)
    // Node marks the response only for a request with `Expect`: the header is read first, as
    // each property read on Express's response costs V8 a cache miss (see `expressProtocol`).
    if (req.headers.expect !== undefined) continueIfExpected(res)
    next()
  }

  // The last mount path (`req.baseUrl`) found right for the basePath: checked once per mount;
  // and whether one found wrong was told (once).
  let mountSeen = ''
  let mountToldOf = false
  let routeSeen: unknown
  // Routes are looked for in the first requests only: `req.route` is no property of a request
  // under `app.use`, and reading it cost every request about 2,000 instructions (callgrind).
  // A route whose every request is a 404 shows in its first.
  let routeChecksLeft = 1_000
  return function mcpDispatchMiddleware(req, res, next) {
    // A client gone before this ran (after a slow middleware) is owed nothing, and a socket
    // closed has no address: deciding would validate its token with no client budget.
    if (req.socket?.destroyed) return
    // Mounted twice on its way (`app.use(mw)` and the route's own `mw`): decided once, so it is
    // authenticated and counted once (a second decision spent a second unit of its limit).
    const seen = dispatchedRequests.get(req)
    if (seen?.decided === true) {
      if (seen.decidedBy === decidedBy) next()
      else writeOwn(res, refuseSecond())
      return
    }
    let decision: ReturnType<typeof dispatcher.decide>
    try {
      // Mounted (`app.use('/mcp', …)`) with a basePath that misses the mount: every request
      // would be a silent 404. Told to `onError` once (context `configuration`), the request
      // answered as it would be: a mount with parameters, a wildcard or a regular expression
      // makes `req.baseUrl` of what the client sent, so no answer of the client's may hang on
      // it (its `req.params` has them: not judged at all, where it shows).
      let mount = req.baseUrl
      let where = 'Express mount path'
      // As a route's handler (`app.post('/mcp', mw, handler)`), under the route's path, which
      // `req.baseUrl` leaves out: judged in the first 1,000 requests, once per route (a literal path; one with parameters,
      // a wildcard, a list or a regular expression, not at all).
      let route: unknown
      if (routeChecksLeft > 0 && !mountToldOf) {
        routeChecksLeft--
        route = req.route
      }
      if (route !== undefined && route !== routeSeen) {
        routeSeen = route
        const path = routeMount(req.baseUrl, route, mcpDispatchMiddleware)
        if (path !== undefined) {
          mount = path
          where = 'Express route path'
        }
      }
      if (mount && mount !== mountSeen && !mountToldOf && !hasParams(req.params)) {
        const missed = mountMissed(dispatcher.basePath, mount, where)
        if (missed) {
          mountToldOf = true
          onError(missed, 'configuration')
        } else mountSeen = mount
      }
      lowerTargetScheme(req)
      // `req.protocol` follows Express's `trust proxy` only where the platform configured it;
      // by default it is the socket's scheme.
      const request = toDispatchRequest(req, req.originalUrl ?? req.url, expressProtocol(req), trust)
      if (request === undefined) {
        writeOwn(res, INVALID_HOST)
        return
      }
      decision = dispatcher.decide(request)
    } catch (error) {
      next(error)
      return
    }
    // With synchronous stores the decision is there at once: no promise, no microtask.
    if (decision instanceof Promise) decision.then((d) => act(req, res, next, d)).catch(next)
    else act(req, res, next, decision)
  }
}

/**
 * The dispatch context of a request the middleware dispatched, also where `req.dispatchContext`
 * is not (in an app of another copy of Express called as a handler, see docs/adapters.md).
 * Throws a `TypeError` when the middleware did not run for it (a wiring mistake).
 *
 * @example
 * ```ts
 * app.all('/{*path}', (req, res) => {
 *   const { app, version, identity } = getDispatchContext(req)
 * })
 * ```
 */
export function getDispatchContext(req: Request | IncomingMessage): DispatchContext {
  // The map first: `req.dispatchContext` is an accessor on the request prototype of the Express
  // that `mcpDispatch` ran in, which an app of another copy of Express (another major, the MCP
  // SDK's own) swaps out when called as a handler rather than mounted.
  return requireContext(dispatchedRequests.get(req)?.context ?? (req as Request).dispatchContext, 'express')
}

function fail(req: Request, res: ServerResponse, error: unknown, before: OutgoingHttpHeaders | undefined): void {
  // A request dispatched by another copy of the package (its ESM build beside its CommonJS one)
  // has no record here: told to the default logger, never swallowed. Not a client that left
  // (its body cut short), which any client causes at will.
  if (!clientLeft(res, error)) (dispatchedRequests.get(req)?.onError ?? logError)(error, 'handler')
  if (settleFailedAnswer(res)) return
  // The 502 is the Web adapter's: none of the headers the handler set before it failed (a
  // `Content-Encoding` over the JSON body, an `Mcp-Session-Id` never pinned), but those the
  // platform's middleware set before the handler ran (`cors()`, `helmet()`), as they would be
  // on a Web adapter's 502 behind the same middleware. The head still takes the dispatch headers.
  // (`platformHeaders` left Express's own X-Powered-By out.)
  clearHeaders(res)
  setHeaders(res, before, dispatchedRequests.get(req)?.onError)
  writeReply(res, HANDLER_FAILED)
}

/**
 * One MCP handler per live version, so the platform does not write the version switch:
 * the request goes to the handler of `req.dispatchContext.version`. A handler that throws
 * or rejects gets the Web adapter's answer, a JSON-RPC 502, and the middleware's `onError`
 * (one that had ended its answer: the answer goes out whole and only `onError` hears it; one
 * begun and not ended: the connection is cut). A `next(error)` after the whole answer goes to
 * `onError` only, not to Express's final handler.
 * A live version without a handler gets a JSON-RPC 404 (`version_not_served`).
 *
 * @example
 * ```ts
 * // A handler per version, created on first use and kept:
 * app.use(routeByVersion((appRecord, version) => createVersionHandler(appRecord, version)))
 * // Or a fixed table: keys `${appId}@${version}`, or versions of the App `appId`:
 * app.use(routeByVersion({ '1.4.2': v1, '2.0.0': v2 }, { appId: 'app_weather' }))
 * ```
 *
 * @throws {ConfigurationError} with `routes` that are neither an object of handler functions nor
 * a function (a `Map` included), an object with no handler, a key that is neither
 * `<appId>@<version>` nor an exact version, bare-version keys without `appId`, or an empty
 * `appId`.
 */
export function routeByVersion(routes: VersionRoutes<ExpressMcpHandler>, options?: RouteByVersionOptions): RequestHandler {
  const route = createVersionRouter(routes, options)
  return function routeByVersionHandler(req, res, next) {
    let context: DispatchContext
    try {
      context = getDispatchContext(req)
    } catch (error) {
      // A route the dispatch layer did not see (a wiring mistake), as in `fromWebHandler`.
      logError(error, 'handler')
      writeOwn(res, HANDLER_FAILED)
      return
    }
    // What the platform's middleware set, kept on the 502 of a failed handler (or factory).
    const before = platformHeaders(res.getHeaders())
    try {
      // A factory that throws is a failed handler too, as on the Web adapter.
      const handler = route(context)
      if (!handler) {
        writeOwn(res, versionNotServedReply(context.version))
        return
      }
      // An `end` a wrapper makes later (`compression`) counts as made once the handler's call of it
      // returns.
      noteEnds(res)
      const result: unknown = handler(req, res, (error?: unknown) => {
        // An error after the whole answer: reported, not handed to Express's final handler,
        // which would destroy the socket under an answer still on its way (or held for the pin).
        if (error !== undefined && error !== 'route' && error !== 'router' && answerEnded(res)) {
          ;(dispatchedRequests.get(req)?.onError ?? logError)(error, 'handler')
          return
        }
        next(error as Parameters<NextFunction>[0])
      })
      // Another library's promise (Bluebird, another realm's) fails as a native one does.
      if (result instanceof Promise || isForeignThenable(result)) {
        Promise.resolve(result as PromiseLike<unknown>).then(undefined, (error: unknown) => fail(req, res, error, before))
      }
    } catch (error) {
      fail(req, res, error, before)
    }
  }
}

/**
 * Serves dispatched requests with a web-standard handler (the proxy handler of
 * `mcp-dispatch/proxy`, or the SDK's `WebStandardStreamableHTTPServerTransport`): the body
 * streams from the socket (or, after `express.json()`, is re-serialized from `req.body`),
 * the response streams back unbuffered, and a client that goes away aborts `request.signal`.
 * A handler that throws or rejects, or answers what Node cannot write (a header value Node
 * refuses, `Response.error()`), gets the JSON-RPC 502 and the middleware's `onError`, mounted
 * with `app.use` or through `routeByVersion`, on Express 5 and 4 alike. A body that fails
 * mid-way is cut, and its error goes to `onError` too (not the proxy's, told by the proxy).
 *
 * @example
 * ```ts
 * import { createProxyHandler } from 'mcp-dispatch/proxy'
 * app.use(mcpDispatch({ dispatcher }))
 * app.use(fromWebHandler(createProxyHandler({ upstream, identity })))
 * ```
 *
 * @throws {ConfigurationError} when `handler` is not a function.
 */
export function fromWebHandler(handler: ExpressWebHandler): ExpressMcpHandler {
  if (typeof handler !== 'function') throw new ConfigurationError('handler', 'must be a function')
  return async function webHandler(req, res) {
    let context: DispatchContext
    try {
      context = getDispatchContext(req)
    } catch (error) {
      // A route the dispatch layer did not see (a wiring mistake): said on stderr, answered as
      // a failed handler, never Express's HTML page.
      logError(error, 'handler')
      writeOwn(res, HANDLER_FAILED)
      return
    }
    const request = toHandlerRequest({
      req,
      res,
      url: req.originalUrl ?? req.url,
      protocol: expressProtocol(req),
      parsedBody: (req as { body?: unknown }).body,
    })
    if (!request) return
    const before = platformHeaders(res.getHeaders())
    // Never rejects: mounted with `app.use`, a rejection would be Express 5's HTML 500 and, on
    // Express 4, which does not catch rejected handlers, no answer at all. A response Node
    // cannot write (a header value it refuses, `Response.error()`'s status 0, no `Response`)
    // fails before any byte of it goes out: the handler failed.
    try {
      await writeWebResponse(res, await handler(request, context), dispatchedRequests.get(req)?.onError)
    } catch (error) {
      fail(req, res, error, before)
    }
  }
}

/**
 * Serves the token-management API (`createTokenApi`) from Express: requests under its
 * `basePath` are answered (the body streams from the socket, or is re-serialized after
 * `express.json()`), with the socket address, through `trustProxy`, as the client address of
 * Bearer rotations; any other request goes on to `next()`. Mount it where its paths are
 * reached; it needs no dispatch context. It matches the full path (`req.originalUrl`), so under
 * a mount path (`app.use('/dash', …)`) the API's `basePath` must include it
 * (`createTokenApi({ basePath: '/dash/api/tokens' })`). With one that does not, a request to
 * the mount path followed by `basePath` (`/dash/api/tokens`) is passed to `next(error)` with a
 * `ConfigurationError` saying so, rather than falling through to an API never reached.
 *
 * @example
 * ```ts
 * const api = createTokenApi({ tokens, authenticateSession, verifyCsrf })
 * app.use(serveTokenApi(api))            // /api/tokens…
 * app.use(mcpDispatch({ dispatcher }))   // everything else
 * ```
 *
 * @throws {ConfigurationError} with an `api` that is not the handler `createTokenApi` returns,
 * or a `trustProxy` it cannot use.
 */
export function serveTokenApi(api: TokenApi, options?: ServeTokenApiOptions): RequestHandler {
  const trust = setupTokenApi(api, options)
  return function tokenApiMiddleware(req, res, next) {
    const url = req.originalUrl ?? req.url
    if (!isTokenApiPath(api, url)) {
      // Under a mount path the API was meant to answer (its basePath follows the mount) but,
      // matching the full path, never will: say so rather than fall through unnoticed.
      const mount = req.baseUrl
      if (mount && req.url !== url && isTokenApiPath(api, req.url) && !api.basePath.toLowerCase().startsWith(`${mount.toLowerCase()}/`)) {
        return next(
          new ConfigurationError(
            'basePath',
            `is ${JSON.stringify(api.basePath)}, and the token API matches the full path: under the Express mount path ${JSON.stringify(req.baseUrl)} give createTokenApi({ basePath: ${JSON.stringify(`${req.baseUrl}${api.basePath}`)} })`,
          ),
        )
      }
      return next()
    }
    const protocol = expressProtocol(req)
    // The API's answers byte for byte the other adapters', as `writeOwn`'s.
    if (res.getHeader('x-powered-by') === 'Express') res.removeHeader('x-powered-by')
    void answerTokenApi(api, { req, res, url, protocol, parsedBody: (req as { body?: unknown }).body }, trust, req)
  }
}

/**
 * Express error middleware that answers in JSON-RPC, as the MCP SDK transport answers a body
 * where no framework parser runs, rather than with Express's HTML page (which, outside
 * `NODE_ENV=production`, carries the stack trace and the server's file names). Mount it after
 * the routes. A body `express.json()` refused: not JSON 400 -32700 `Parse error: Invalid
 * JSON`, past its `limit` 413 -32000 `Payload Too Large: Request body must not exceed <limit>
 * bytes`, an unsupported charset or encoding 415 -32000 as the SDK's; an error of status 429
 * (a rate limiter's) -32000 `Rate limit exceeded`, as the dispatcher's own says; another
 * error with a client status (4xx, `status` or `statusCode`) that status with -32600
 * `Invalid Request`;
 * anything else 500 -32603 `Internal error`, reported to `onError`. The error's own text is
 * never sent. An error after the response has begun goes on to `next(error)`, which ends the
 * connection, as Express does.
 *
 * @example
 * ```ts
 * app.use(mcpDispatch({ dispatcher }))
 * app.use(express.json({ limit: '4mb' }))
 * app.use(routeByVersion(…))
 * app.use(jsonRpcErrors())
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have, or an `onError` that is not a function.
 */
export function jsonRpcErrors(options?: JsonRpcErrorsOptions): ErrorRequestHandler {
  const report = setupJsonRpcErrors(options)
  return function jsonRpcErrorMiddleware(error, _req, res, next) {
    if (res.headersSent) return next(error)
    const { reply, serverFault } = errorReply(error)
    if (serverFault) report(error, 'error handler')
    writeOwn(res, reply)
  }
}

export type { ServeTokenApiOptions } from '../shared.js'
export type { JsonRpcErrorsOptions } from '../error-reply.js'
export { answerClientError, answerExpectationFailed } from '../client-error.js'
export type { ClientError, ClientErrorSocket, ExpectationResponse } from '../client-error.js'
export type { RouteByVersionOptions, VersionRoutes } from '../version-router.js'
export type { DispatchContext } from '../../pipeline/dispatcher.js'
