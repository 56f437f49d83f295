/**
 * Fastify adapter (`mcp-dispatch/fastify`): a plugin (Fastify 5, not encapsulated)
 * that puts the whole dispatch pipeline in front of the MCP routes of the context it is
 * registered in.
 *
 * Its `onRequest` hook answers rejections (401, 402, 403, 404, 405, 429, 503, metadata, preflight)
 * byte for byte as the Web adapter does, before any body is read. A dispatched request gets
 * `request.dispatchContext`, and its response gets `X-MCP-Version` / `X-MCP-Latest-Version`
 * (and `RateLimit`, CORS), whether the route answers through `reply.send` or hijacks the
 * reply and lets the MCP SDK's `StreamableHTTPServerTransport` write to `reply.raw`; the
 * `Mcp-Session-Id` it assigns pins the session to its version. Replies are never buffered.
 *
 * @example
 * ```ts
 * import Fastify from 'fastify'
 * import { mcpDispatch, routeByVersion } from 'mcp-dispatch/fastify'
 *
 * const app = Fastify()
 * await app.register(mcpDispatch({ dispatcher: { apps, subscriptions, tokens } }))
 * app.all('/*', routeByVersion((appRecord, version) => {
 *   // nodeSessions (docs/adapters.md): one MCP SDK transport per session of this App version.
 *   const serve = nodeSessions(() => buildServer(appRecord, version))
 *   return async (request, reply) => {
 *     reply.hijack() // the SDK transport writes to reply.raw, SSE included
 *     await serve(request.raw, reply.raw, request.body)
 *   }
 * }))
 * ```
 * @module
 */
import type { OutgoingHttpHeaders } from 'node:http'
import type { Http2SecureServer, Http2Server, Http2ServerRequest, Http2ServerResponse } from 'node:http2'
import type {
  FastifyError,
  FastifyInstance,
  FastifyPluginAsync,
  FastifyReply,
  FastifyRequest,
  RawServerDefault,
  RouteGenericInterface,
} from 'fastify'
import { PROTECTED_RESOURCE_METADATA_PATH } from '../../core/metadata.js'
import { type Reply, notFoundReply, versionNotServedReply } from '../../core/reply.js'
import { ConfigurationError, logError } from '../../errors.js'
import { type Decision, type DispatchContext } from '../../pipeline/dispatcher.js'
import { isForeignThenable } from '../../core/thenable.js'
import type { TokenApi } from '../../tokens/token-api.js'
import { type JsonRpcErrorsOptions, errorReply, setupJsonRpcErrors } from '../error-reply.js'
import { tokenApiReporter } from '../../tokens/token-api-paths.js'
import {
  answerTokenApi,
  clearHeaders,
  hasInvalidAbsoluteFormHost,
  holdResponseHead,
  installHeadInterception,
  isTokenApiPath,
  noteEnds,
  platformHeaders,
  requestProtocol,
  requireContext,
  setHeaders,
  clientLeft,
  settleFailedAnswer,
  lowerTargetScheme,
  toDispatchRequest,
  toHandlerRequest,
  writeReply,
  writeWebResponse,
} from '../node-http.js'
import { continueIfExpected, markUnrouted, mergeExposeHeaders, mergeVary } from '../head.js'
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
import { type RouteByVersionOptions, type VersionRoutes, createVersionRouter } from '../version-router.js'

declare module 'fastify' {
  interface FastifyRequest {
    /**
     * Set by the `mcpDispatch` plugin of `mcp-dispatch/fastify` on every request it
     * dispatched: who is calling, the App, and the version to serve. `undefined` on requests
     * it did not see. {@link getDispatchContext} returns it or throws.
     */
    dispatchContext?: DispatchContext
  }
}

/**
 * Options of {@link mcpDispatch} (Fastify). An interface of its own, not an alias: the options
 * every adapter shares are of no entry point, so a project emitting declarations could not name
 * them in a type it infers (TS2742).
 */
// eslint-disable-next-line @typescript-eslint/no-empty-object-type -- see above
export interface FastifyDispatchOptions extends AdapterOptions {}

/**
 * A version's MCP handler: a Fastify route handler; `request.dispatchContext` is set. Typed for
 * an HTTP/1 server by default; for another (`Fastify({ http2: true })`), name its request and
 * reply: `FastifyMcpHandler<FastifyRequest<RouteGenericInterface, Http2Server, Http2ServerRequest>, …>`.
 */
export type FastifyMcpHandler<Req extends AnyFastifyRequest = FastifyRequest, Rep extends AnyFastifyReply = FastifyReply> = (
  request: Req,
  reply: Rep,
) => unknown

/** A web-standard MCP handler (the proxy handler, `WebStandardStreamableHTTPServerTransport`). */
export type FastifyWebHandler = (request: Request, context: DispatchContext) => Response | Promise<Response>

/**
 * A request or reply of a Fastify server of any kind (HTTP/1, HTTPS, or HTTP/2 through Node's
 * compatibility API: `http2: true`), whatever its type provider and logger: the adapter reads
 * only what all of them have.
 */
export type AnyFastifyRequest = FastifyRequest<any, any, any, any, any, any, any>
/** A reply of a Fastify server of any kind (see {@link AnyFastifyRequest}). */
export type AnyFastifyReply = FastifyReply<any, any, any, any, any, any, any>

/**
 * The route handler returned by {@link routeByVersion} and {@link fromWebHandler}, for a Fastify
 * server of any kind. It answers what Fastify's own handlers answer: a promise, a value to send,
 * or nothing (`routeByVersion` passes on what the version's handler answered).
 */
export type FastifyRouteHandler = (request: AnyFastifyRequest, reply: AnyFastifyReply) => unknown

// Where a request's handler failures are reported: a request decoration under a symbol,
// declared with a `null` value so Fastify creates it with every request (a property added
// later would change the request's hidden class; a WeakMap entry per request costs GC work).
// A registered symbol: a request decided by another copy of the package (its ESM build beside
// its CommonJS one) reports there, and is not decided again.
const kReporter = Symbol.for('mcp-dispatch.onError')
type Reporter = (error: unknown, context: string) => void
/** The dispatcher that decided a request, beside its reporter (a registered symbol, as that one). */
const kDecider = Symbol.for('mcp-dispatch.fastify.decider')
type ReportingRequest = FastifyRequest & { [kReporter]?: Reporter | null; [kDecider]?: object | null }

/**
 * Sends a dispatch-layer {@link Reply} through Fastify, byte for byte; its `Vary` and
 * `Access-Control-Expose-Headers` join those the platform set on the reply before (`headers`
 * would replace them).
 */
function sendReply(reply: FastifyReply, answer: Reply): FastifyReply {
  const vary = answer.headers.vary
  const own = vary === undefined ? undefined : reply.getHeader('vary')
  const expose = answer.headers['access-control-expose-headers']
  const ownExpose = expose === undefined ? undefined : reply.getHeader('access-control-expose-headers')
  reply.code(answer.status).headers(answer.headers)
  if (own !== undefined) reply.header('vary', mergeVary(own, vary))
  // The platform's exposed names (`@fastify/cors`' `exposedHeaders`) stay readable on refusals.
  if (ownExpose !== undefined) reply.header('access-control-expose-headers', mergeExposeHeaders(ownExpose, expose))
  // A Buffer, so Fastify sends the body and the `Content-Type` exactly as given (a string
  // body would get `; charset=utf-8` appended).
  return reply.send(answer.body === null ? undefined : Buffer.from(answer.body))
}

/**
 * The dispatch plugin. Register it in the context that holds the MCP routes (the root, or an
 * encapsulated context with a prefix equal to the dispatcher's `basePath`); its hooks then run
 * for every request of that context, unmatched ones included, so the metadata endpoint and the
 * 404s need no route of their own.
 *
 * Two forms, the same plugin: `app.register(mcpDispatch({ dispatcher }))` (the options
 * checked at once, where the call is) and `app.register(mcpDispatch, { dispatcher })`, as
 * Fastify plugins are usually registered (a bad option then fails `register`, and `ready()`).
 * Either way it is marked as `fastify-plugin` marks a plugin: not encapsulated, Fastify 5.
 * The context holding it must not be (a context wrapped in `fastify-plugin` loses its
 * `prefix`): with a `basePath`, a route outside it added to the plugin's context is told to
 * `onError` once, context `configuration`, since the hook answers its requests 404.
 *
 * The client address is the socket peer, resolved through this adapter's `trustProxy`
 * option, never through Fastify's own `trustProxy`.
 *
 * @example
 * ```ts
 * await app.register(mcpDispatch({ dispatcher, trustProxy: 1 })) // or: app.register(mcpDispatch, { dispatcher, trustProxy: 1 })
 * // GET, POST and DELETE: a request no route takes gets Fastify's 404 (docs/adapters.md)
 * app.route({ method: ['GET', 'POST', 'DELETE'], url: '/*', handler: async (request, reply) => {
 *   const { app: appRecord, version } = getDispatchContext(request)
 *   reply.hijack()
 *   await sessionsOf(appRecord.id, version)(request.raw, reply.raw, request.body) // one SDK transport per session
 * } })
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} with a `dispatcher` (or dispatcher options), `trustProxy` or `onError` it cannot use.
 */
export function mcpDispatch(options: FastifyDispatchOptions): FastifyPluginAsync
/**
 * The dispatch plugin itself, as Fastify calls it when registered as
 * `app.register(mcpDispatch, { dispatcher })`: the same hooks as `mcpDispatch(options)`'s
 * plugin. Options it cannot use reject (a `ConfigurationError`), failing that `register` and
 * `ready()`.
 */
export function mcpDispatch(fastify: FastifyInstance<RawServerDefault>, options: FastifyDispatchOptions): Promise<void>
export function mcpDispatch(
  first: FastifyDispatchOptions | FastifyInstance<RawServerDefault>,
  options?: FastifyDispatchOptions,
): FastifyPluginAsync | Promise<void> {
  if (!isFastifyInstance(first)) return dispatchPlugin(first, false)
  // Registered itself (`app.register(mcpDispatch, options)`): Fastify passes its instance and
  // the options; a bad option rejects, so `register` fails rather than the process.
  return Promise.resolve().then(() => dispatchPlugin(options as FastifyDispatchOptions, true)(first, options ?? {}))
}

/**
 * The `ConfigurationError` of a `prefix` among the register options: the plugin is not
 * encapsulated (its hook covers the context it is registered in), so Fastify would drop it
 * without a word, and every route of that context, the platform's own, be dispatched.
 */
function prefixRefused(): ConfigurationError {
  return new ConfigurationError(
    'prefix',
    'is not taken by the dispatch plugin, whose hook covers the whole context it is registered in: register it inside an encapsulated context of yours that has the prefix (the dispatcher\'s basePath), app.register(async (mcp) => { await mcp.register(mcpDispatch(...)); mcp.all(...) }, { prefix }) (docs/adapters.md, Fastify)',
  )
}
unencapsulated(mcpDispatch as unknown as FastifyPluginAsync, 'mcp-dispatch')

/** What Fastify's `register` takes beside a plugin's own options. */
const REGISTER_OPTIONS: readonly string[] = ['prefix', 'logLevel', 'logSerializers']

/** Whether `value` is a Fastify instance (what Fastify passes a plugin it registers). */
function isFastifyInstance(value: unknown): value is FastifyInstance<RawServerDefault> {
  const candidate = value as Partial<FastifyInstance> | null
  return typeof candidate === 'object' && candidate !== null && typeof candidate.addHook === 'function' && typeof candidate.register === 'function'
}

/**
 * Whether no request a route takes can be under `basePath`. A route with a parameter or a
 * wildcard is judged by its literal start: `/*` and `/:tenant/v1` may reach `/mcp`, `/health/*`
 * cannot.
 */
function routeOutside(url: string, basePath: string): boolean {
  const open = url.search(/[:*]/)
  if (open === -1) return url !== basePath && !url.startsWith(`${basePath}/`)
  const literal = url.slice(0, open)
  return !literal.startsWith(basePath) && !basePath.startsWith(literal)
}

/**
 * The plugin of `options`; `registered` when they are the options Fastify's `register` passed
 * (`app.register(mcpDispatch, options)`), which hold Fastify's own beside the adapter's.
 */
function dispatchPlugin(options: FastifyDispatchOptions, registered: boolean): FastifyPluginAsync {
  // Fastify's register options given to the factory (`mcpDispatch({ dispatcher, prefix })`) would
  // never reach Fastify: a prefix is refused as one given to register is, the others sent there.
  if (!registered && options != null && typeof options === 'object' && Object.hasOwn(options, 'prefix')) throw prefixRefused()
  const { dispatcher, trust, onError } = setupAdapter(options, {
    name: 'the Fastify adapter',
    options: registered ? REGISTER_OPTIONS : [],
    elsewhere: (key) => {
      if (key === 'handler') {
        return "the Fastify adapter takes no handler: register it in the context of your MCP routes, app.register(mcpDispatch({ dispatcher })), then app.all('/*', handler) (docs/adapters.md)"
      }
      return REGISTER_OPTIONS.includes(key) ? `it is one of Fastify's register options: app.register(mcpDispatch({ dispatcher }), { ${key} })` : undefined
    },
  })
  installHeadInterception()
  // Which dispatcher decides, as given: plugins made from one options object (each making a
  // dispatcher of its own) count as one.
  const decidedBy: object = options.dispatcher as object
  const refuseSecond = secondDispatcherRefusal(onError, 'the Fastify plugin')

  /** Acts on a decision: answers a refusal, or lets the request through to its route. */
  function act(request: FastifyRequest, reply: FastifyReply, decision: Decision, done: (error?: Error) => void): void {
    if (decision.type === 'reply') {
      // A callback hook that answers does not call `done`: Fastify stops the chain.
      sendReply(reply, decision.reply)
      return
    }
    request.dispatchContext = decision.context
    ;(request as ReportingRequest)[kReporter] = onError
    ;(request as ReportingRequest)[kDecider] = decidedBy
    // On the raw response: a hijacked reply (the SDK transport) never writes Fastify's headers.
    holdResponseHead(reply.raw, request.raw.method, decision, onError, reply)
    // A request no route takes (a GET where only POST is routed) is answered by Fastify's
    // not-found handler: its 404 (JSON too) is taken as no MCP handler's, and does not end the
    // session's pin (an MCP handler served as the not-found handler leaves its pins to the TTL).
    if (request.is404) markUnrouted(reply.raw)
    continueIfExpected(reply.raw)
    done()
  }

  async function plugin(fastify: FastifyInstance<RawServerDefault>, registered?: { prefix?: unknown }): Promise<void> {
    // `''` and `'/'` (what a parent's options pass along, fastify-autoload's) change nothing.
    const prefix = registered?.prefix
    if (prefix !== undefined && prefix !== '' && prefix !== '/') throw prefixRefused()
    // In a context whose prefix the basePath misses (every request there a silent 404).
    // A prefix with a parameter or wildcard (`/t/:tenant`) names no one path: not judged.
    const missed =
      typeof fastify.prefix === 'string' && !/[:*]/.test(fastify.prefix) ? mountMissed(dispatcher.basePath, fastify.prefix, 'Fastify prefix') : undefined
    if (missed) throw missed
    const basePath = dispatcher.basePath
    if (basePath !== '') {
      // A route of the hook's context outside `basePath` is dead: the hook answers its every
      // request with the dispatch layer's 404 before the route runs. Most often a context
      // wrapped in fastify-plugin, which makes Fastify drop its `prefix`, so the MCP routes
      // themselves land outside. Told once; routes registered before the plugin are not seen.
      let toldOfRoute = false
      const metadataAddress = PROTECTED_RESOURCE_METADATA_PATH + basePath
      fastify.addHook('onRoute', (route) => {
        // Those of the document's RFC 9728 address (`/.well-known/oauth-protected-resource/mcp`)
        // are served: the dispatcher answers the document there.
        if (toldOfRoute || typeof route.url !== 'string' || !routeOutside(route.url, basePath)) return
        if (!routeOutside(route.url, metadataAddress)) return
        toldOfRoute = true
        const methods = Array.isArray(route.method) ? route.method.join(',') : String(route.method)
        onError(
          new ConfigurationError(
            'basePath',
            `is ${JSON.stringify(basePath)}, and the route ${methods} ${JSON.stringify(route.url.slice(0, 200))} of the dispatch plugin's context lies outside it: the plugin's hook answers its requests with the dispatch layer's 404. Register the plugin in an encapsulated context with prefix ${JSON.stringify(basePath)}, not wrapped in fastify-plugin (which drops the prefix), and other routes outside that context (docs/adapters.md, Fastify)`,
          ),
          'configuration',
        )
      })
    }
    if (!fastify.hasRequestDecorator('dispatchContext')) fastify.decorateRequest('dispatchContext', undefined)
    if (!fastify.hasRequestDecorator(kReporter as unknown as string)) fastify.decorateRequest(kReporter as unknown as string, null)
    if (!fastify.hasRequestDecorator(kDecider as unknown as string)) fastify.decorateRequest(kDecider as unknown as string, null)
    // A callback hook, not an async one: with synchronous stores the decision is made and
    // the request goes on in the same call, with no promise and no microtask.
    fastify.addHook('onRequest', function mcpDispatchHook(request, reply, done) {
      const raw = request.raw
      // A client gone before this ran is owed nothing, and a socket closed has no address:
      // deciding would validate its token with no client budget.
      if (raw.socket?.destroyed) {
        reply.hijack()
        return
      }
      // Registered twice on its way (in a context and again in a child of it): decided once, so
      // it is authenticated and counted once (a second decision spent a second unit of its limit).
      if ((request as ReportingRequest)[kReporter] != null) {
        if ((request as ReportingRequest)[kDecider] === decidedBy) done()
        else sendReply(reply, refuseSecond())
        return
      }
      lowerTargetScheme(raw)
      const dispatchRequest = toDispatchRequest(raw, dispatchTarget(raw), requestProtocol(raw, request.protocol), trust)
      if (dispatchRequest === undefined) {
        sendReply(reply, INVALID_HOST)
        return
      }
      const decision = dispatcher.decide(dispatchRequest)
      if (decision instanceof Promise) decision.then((d) => act(request, reply, d, done)).catch(done)
      else act(request, reply, decision, done)
    })
  }

  return unencapsulated(plugin, 'mcp-dispatch')
}

/**
 * The request target the dispatch layer reads: `raw.url`, which Fastify's `rewriteUrl` has
 * already rewritten (the path it routes). When that rewrite made an absolute-form target
 * (`POST http://weather.example.com/v1`, kept in `raw.originalUrl`) a path, as a rewrite for
 * an older find-my-way or `new URL(req.url, base).pathname` does, the target's scheme and
 * authority go on naming the App, ahead of the `Host` field, as without the rewrite
 * (RFC 9112 section 3.2.2): the rewritten path under the original target's origin. The MCP
 * routes' handlers (`fromWebHandler`) and the token API read the same target. A plugin that
 * sets `raw.originalUrl` itself in an earlier hook (`@fastify/express`, `@fastify/middie`)
 * hides the original: register `mcpDispatch` before it (docs/adapters.md).
 */
function dispatchTarget(raw: FastifyRequest['raw']): string {
  const url = raw.url ?? '/'
  const original = (raw as FastifyRequest['raw'] & { originalUrl?: unknown }).originalUrl
  if (typeof original !== 'string' || original === url || url.charCodeAt(0) !== 47 /* / */) return url
  const origin = ABSOLUTE_ORIGIN.exec(original)?.[0]
  if (origin !== undefined) return origin + url
  // Another scheme's target (`ftp://…`) is refused as it would be without the rewrite.
  return OTHER_SCHEME.test(original) ? original : url
}

/** The scheme and authority of an absolute-form `http` or `https` target (RFC 3986 section 3.2). */
const ABSOLUTE_ORIGIN = /^https?:\/\/[^/?#]*/i
/** An absolute target of any scheme (RFC 3986 section 3.1). */
const OTHER_SCHEME = /^[a-z][a-z0-9+.-]*:\/\//i

/**
 * Fastify's `frameworkErrors` option, for what Fastify refuses before any hook runs: a request
 * target with a bad percent-escape (`/v1%zz`, `FST_ERR_BAD_URL`) or a path parameter longer than
 * the router allows (`FST_ERR_MAX_PARAM_LENGTH`) is answered as the Express and Web adapters
 * answer such a path, the JSON-RPC 404 `not_found`, instead of Fastify's own 400 error object;
 * an absolute-form target whose host no URL can hold (`POST http://weather.example.com:99999/v1`)
 * as the plugin answers such a `Host`, 400 `Invalid Host header`.
 * No dispatch decision was made for it, so the answer carries no CORS headers (a CORS
 * preflight gets the same 404, not the dispatcher's 204 or 403). Any other error goes on to
 * Fastify's error handling as before.
 *
 * @example
 * ```ts
 * import Fastify from 'fastify'
 * import { frameworkErrors, mcpDispatch } from 'mcp-dispatch/fastify'
 *
 * const app = Fastify({ frameworkErrors })
 * await app.register(mcpDispatch({ dispatcher }))
 * ```
 *
 * Typed for HTTP/1, HTTPS and HTTP/2 servers (`Fastify({ http2: true, frameworkErrors })`):
 * Fastify types this option with the request and reply of the server it makes.
 */
export function frameworkErrors(error: FastifyError, request: FrameworkErrorsRequest, reply: FrameworkErrorsReply): void {
  const anyReply: AnyFastifyReply = reply
  if (error.code === 'FST_ERR_BAD_URL' || error.code === 'FST_ERR_MAX_PARAM_LENGTH') {
    // An absolute-form target whose host no URL can hold is the Host's fault, as its Host-field
    // form is (the plugin's 400); Fastify finds it unparsable before any hook runs.
    sendReply(anyReply, hasInvalidAbsoluteFormHost(request.raw?.url ?? '') ? INVALID_HOST : notFoundReply())
    return
  }
  anyReply.send(error)
}

/**
 * The requests and replies {@link frameworkErrors} takes: of an HTTP/1 or HTTPS server, or an
 * HTTP/2 one. Named server by server rather than as {@link AnyFastifyRequest}: Fastify infers
 * the server `Fastify(options)` makes from its options, and an `any` server there would be
 * inferred as that server (a `serverFactory` beside it would lose its types).
 */
type FrameworkErrorsRequest =
  | FastifyRequest
  | FastifyRequest<RouteGenericInterface, Http2Server, Http2ServerRequest>
  | FastifyRequest<RouteGenericInterface, Http2SecureServer, Http2ServerRequest>
type FrameworkErrorsReply =
  | FastifyReply
  | FastifyReply<RouteGenericInterface, Http2Server, Http2ServerRequest, Http2ServerResponse>
  | FastifyReply<RouteGenericInterface, Http2SecureServer, Http2ServerRequest, Http2ServerResponse>

/**
 * The dispatch context of a request the plugin dispatched.
 * Throws a `TypeError` when the plugin did not run for it (a wiring mistake).
 *
 * @example
 * ```ts
 * app.route({ method: ['GET', 'POST', 'DELETE'], url: '/*', handler: async (request) => {
 *   const { app, version, identity } = getDispatchContext(request)
 * } })
 * ```
 */
export function getDispatchContext(request: AnyFastifyRequest): DispatchContext {
  return requireContext(request.dispatchContext, 'fastify')
}

function fail(request: FastifyRequest, reply: FastifyReply, error: unknown, before: OutgoingHttpHeaders | undefined): FastifyReply | undefined {
  const raw = reply.raw
  // Not a client that left (its body cut short), which any client causes at will.
  if (!clientLeft(raw, error)) ((request as ReportingRequest)[kReporter] ?? logError)(error, 'handler')
  if (settleFailedAnswer(raw)) return undefined
  // The 502 is the Web adapter's: none of the headers the handler set before it failed (a
  // `Content-Encoding` over the JSON body, an `Mcp-Session-Id` never pinned), on the reply or on
  // `reply.raw`, but those the platform's hooks set before the handler ran (`@fastify/cors`,
  // `@fastify/helmet`), as on a Web adapter's 502 behind the same middleware. The head still
  // takes the dispatch headers.
  for (const name in reply.getHeaders()) reply.removeHeader(name)
  clearHeaders(raw)
  if (reply.sent) {
    // Hijacked: Fastify no longer writes this reply.
    setHeaders(raw, before, (request as ReportingRequest)[kReporter] ?? undefined)
    writeReply(raw, HANDLER_FAILED)
    return undefined
  }
  if (before !== undefined) reply.headers(before)
  return sendReply(reply, HANDLER_FAILED)
}

/**
 * One MCP handler per live version, so the platform does not write the version switch:
 * the request goes to the handler of `request.dispatchContext.version`. A handler that throws
 * gets the Web adapter's answer, a JSON-RPC 502, and the plugin's `onError` (one that had ended
 * its answer: the answer goes out whole and only `onError` hears it; one begun and not ended:
 * the connection is cut). A live version
 * without a handler gets a JSON-RPC 404 (`version_not_served`).
 *
 * @example
 * ```ts
 * app.all('/*', routeByVersion((appRecord, version) => createVersionHandler(appRecord, version)))
 * app.all('/*', routeByVersion({ '1.4.2': v1, '2.0.0': v2 }, { appId: 'app_weather' }))
 * ```
 *
 * @throws {ConfigurationError} with `routes` that are neither an object of handler functions nor
 * a function (a `Map` included), an object with no handler, a key that is neither
 * `<appId>@<version>` nor an exact version, bare-version keys without `appId`, or an empty
 * `appId`.
 */
export function routeByVersion<Handler extends FastifyMcpHandler<any, any> = FastifyMcpHandler>(
  routes: VersionRoutes<Handler>,
  options?: RouteByVersionOptions,
): FastifyRouteHandler {
  const route = createVersionRouter(routes, options)
  return function routeByVersionHandler(request, reply) {
    let context: DispatchContext
    try {
      context = getDispatchContext(request)
    } catch (error) {
      // A route the dispatch layer did not see (a wiring mistake), as in `fromWebHandler`.
      logError(error, 'handler')
      return sendReply(reply, HANDLER_FAILED)
    }
    let answer: unknown
    // What the platform's hooks set, kept on the 502 of a failed handler (or factory).
    const before = platformHeaders(reply.getHeaders())
    try {
      // A factory that throws is a failed handler too, as on the Web adapter.
      const handler = route(context)
      if (!handler) return sendReply(reply, versionNotServedReply(context.version))
      // An `end` a wrapper makes later counts as made once the handler's call of it returns.
      noteEnds(reply.raw)
      answer = handler(request, reply)
    } catch (error) {
      return fail(request, reply, error, before)
    }
    // What the handler answered goes to Fastify as it is, so the route behaves as the handler
    // would on its own: a promise (an async handler), a value to send, or nothing from a handler
    // that sends later (made a promise of nothing, Fastify sent an empty 200 at once).
    if (answer instanceof Promise || isForeignThenable(answer)) {
      return Promise.resolve(answer as PromiseLike<unknown>).then(undefined, (error: unknown) => fail(request, reply, error, before))
    }
    return answer
  }
}

/**
 * Serves dispatched requests with a web-standard handler (the proxy handler of
 * `mcp-dispatch/proxy`, or the SDK's `WebStandardStreamableHTTPServerTransport`). The
 * response streams back unbuffered, and a client that goes away aborts `request.signal`.
 * For the request body to stream too, let Fastify leave it unread in that context:
 * `app.removeAllContentTypeParsers(); app.addContentTypeParser('*', (_req, _payload, done) => done(null))`;
 * otherwise the parsed body is re-serialized. A handler that throws or rejects, or answers what
 * Node cannot write (a header value Node refuses, `Response.error()`), gets the JSON-RPC 502
 * and the plugin's `onError`. A body that fails mid-way is cut, and its error goes to `onError`
 * too (not the proxy's, told by the proxy).
 *
 * @example
 * ```ts
 * app.all('/*', fromWebHandler(createProxyHandler({ upstream, identity })))
 * ```
 *
 * @throws {ConfigurationError} when `handler` is not a function.
 */
export function fromWebHandler(handler: FastifyWebHandler): FastifyRouteHandler {
  if (typeof handler !== 'function') throw new ConfigurationError('handler', 'must be a function')
  return async function webHandler(request, reply) {
    reply.hijack()
    let context: DispatchContext
    try {
      context = getDispatchContext(request)
    } catch (error) {
      // A route the dispatch layer did not see (a wiring mistake): said on stderr, answered as
      // a failed handler, never Fastify's own error object.
      logError(error, 'handler')
      writeReply(reply.raw, HANDLER_FAILED)
      return undefined
    }
    const webRequest = toHandlerRequest({
      req: request.raw,
      res: reply.raw,
      url: dispatchTarget(request.raw),
      protocol: requestProtocol(request.raw, request.protocol),
      parsedBody: request.body,
    })
    if (!webRequest) return undefined
    // Hijacked, the reply's own headers (those `@fastify/cors` sets with `reply.header` in its
    // hook) would not be written: they go on the raw head, under the handler's own.
    const before = platformHeaders(reply.getHeaders())
    setHeaders(reply.raw, before, (request as ReportingRequest)[kReporter] ?? undefined)
    // A response Node cannot write (a header value it refuses, `Response.error()`'s status 0,
    // no `Response`) fails before any byte of it goes out: the handler failed. Hijacked, the
    // reply is no longer Fastify's to answer, so a rejection here would leave the client waiting.
    try {
      await writeWebResponse(reply.raw, await handler(webRequest, context), (request as ReportingRequest)[kReporter] ?? undefined)
    } catch (error) {
      return fail(request, reply, error, before)
    }
    return undefined
  }
}

/**
 * Serves the token-management API (`createTokenApi`) from Fastify, as a plugin: an `onRequest`
 * hook answers requests under its `basePath` before any route or body parser (the body
 * streams from the socket), with the socket address, through `trustProxy`, as the client
 * address of Bearer rotations; other requests go on untouched. It needs no dispatch context.
 *
 * @example
 * ```ts
 * const api = createTokenApi({ tokens, authenticateSession, verifyCsrf })
 * await app.register(serveTokenApi(api))                 // /api/tokens…
 * await app.register(mcpDispatch({ dispatcher }))        // the MCP routes
 * ```
 *
 * @throws {ConfigurationError} with an `api` that is not the handler `createTokenApi` returns,
 * or a `trustProxy` it cannot use.
 * The plugin, when registered with a `prefix` (`app.register(plugin, { prefix })`), rejects with
 * a `ConfigurationError` naming the `basePath` to give instead: its hook matches the full path.
 */
export function serveTokenApi(api: TokenApi, options?: ServeTokenApiOptions): FastifyPluginAsync {
  const trust = setupTokenApi(api, options)
  const plugin = async (fastify: FastifyInstance<RawServerDefault>, registered?: { prefix?: unknown }): Promise<void> => {
    // The hook matches the full path: a prefix would move nothing. (One of a parent context is
    // the platform's: inside it, the hook answers for that context's routes, by their full path.)
    const prefix = registered?.prefix
    if (prefix !== undefined && prefix !== '' && prefix !== '/') {
      const under = `/${String(prefix).replace(/^\/+|\/+$/g, '')}`
      const basePath = api.basePath.startsWith(`${under}/`) ? api.basePath : `${under}${api.basePath}`
      throw new ConfigurationError(
        'prefix',
        `is not taken by serveTokenApi, whose hook matches the full path: register it without one, with createTokenApi({ basePath: ${JSON.stringify(basePath)} })`,
      )
    }
    fastify.addHook('onRequest', function tokenApiHook(request, reply, done) {
      const raw = request.raw
      const url = dispatchTarget(raw)
      if (!isTokenApiPath(api, url)) return done()
      reply.hijack()
      // Hijacked, the headers the platform's earlier hooks set on the reply (`@fastify/cors`'s)
      // would not be written: they go on the raw head, as on the MCP routes.
      setHeaders(reply.raw, platformHeaders(reply.getHeaders()), tokenApiReporter(api))
      void answerTokenApi(api, { req: raw, res: reply.raw, url, protocol: requestProtocol(raw, request.protocol) }, trust, request)
    })
  }
  return unencapsulated(plugin as FastifyPluginAsync, 'mcp-dispatch-token-api')
}

/**
 * `plugin`, marked as `fastify-plugin` marks a plugin, with the three properties Fastify itself
 * reads: `skip-override` (not encapsulated: its hooks reach the routes registered beside it),
 * its name, and its metadata, so Fastify refuses to register it on any Fastify but 5
 * (`FST_ERR_PLUGIN_VERSION_MISMATCH`). Set here rather than through `fastify-plugin`: one
 * optional peer dependency fewer, and none whose major version can conflict with the
 * platform's own (`fastify-plugin` 6 beside a peer range of 5 stopped `npm install`).
 */
function unencapsulated(plugin: FastifyPluginAsync, name: string): FastifyPluginAsync {
  const marked = plugin as typeof plugin & Record<symbol, unknown>
  marked[Symbol.for('skip-override')] = true
  marked[Symbol.for('fastify.display-name')] = name
  marked[Symbol.for('plugin-meta')] = { fastify: '5.x', name }
  return marked as unknown as FastifyPluginAsync
}

/**
 * A Fastify error handler that answers in JSON-RPC, as the MCP SDK transport answers a body
 * where no framework parser runs, rather than with Fastify's own error object. Give it to
 * `setErrorHandler` in the context of the MCP routes. A body Fastify's parser refused: not
 * JSON (`FST_ERR_CTP_INVALID_JSON_BODY`, a `SyntaxError` with status 400, an empty body under
 * `Content-Type: application/json`) 400 -32700 `Parse error: Invalid JSON`, past the route's
 * `bodyLimit` 413 -32000 `Payload Too Large: Request body must not exceed <bodyLimit> bytes`,
 * a content type no parser takes 415 -32000 as the SDK's; a rate limiter's 429
 * (`@fastify/rate-limit`) -32000 `Rate limit exceeded`, as the dispatcher's own says; another
 * error with a client status (4xx `statusCode`) that status with -32600 `Invalid Request`;
 * anything else 500 -32603 `Internal error`, reported to `onError` (Fastify's own handler would
 * log it). The error's own text is never sent.
 *
 * @example
 * ```ts
 * await app.register(mcpDispatch({ dispatcher }))
 * app.setErrorHandler(jsonRpcErrors())
 * app.all('/*', routeByVersion(…))
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have, or an `onError` that is not a function.
 */
export function jsonRpcErrors(options?: JsonRpcErrorsOptions): (error: unknown, request: AnyFastifyRequest, reply: AnyFastifyReply) => void {
  const report = setupJsonRpcErrors(options)
  return function jsonRpcErrorHandler(error, request, reply) {
    const { reply: answer, serverFault } = errorReply(error, (request as FastifyRequest).routeOptions?.bodyLimit)
    if (serverFault) report(error, 'error handler')
    sendReply(reply as FastifyReply, answer)
  }
}

export type { ServeTokenApiOptions } from '../shared.js'
export type { JsonRpcErrorsOptions } from '../error-reply.js'
export { answerClientError, answerExpectationFailed } from '../client-error.js'
export type { ClientError, ClientErrorSocket, ExpectationResponse } from '../client-error.js'
export type { RouteByVersionOptions, VersionRoutes } from '../version-router.js'
export type { DispatchContext } from '../../pipeline/dispatcher.js'
