/**
 * Proxy handler (`mcp-dispatch/proxy`): serves App versions that run as their own services.
 * Each version maps to an upstream MCP endpoint URL; the request and the response stream
 * through in both directions (SSE included, never buffered), and a client that goes away
 * aborts the upstream request.
 *
 * What crosses to the upstream:
 * - `Content-Type`, `Content-Encoding` (the body is passed on as it came), `Accept`, `Mcp-Session-Id`, `Mcp-Protocol-Version`, `Last-Event-ID`, the
 *   request metadata headers of MCP 2026-07-28 (`Mcp-Method`, `Mcp-Name` and every
 *   `Mcp-Param-{name}`, which that revision's servers check against the body and an
 *   intermediary must forward), the headers named in `forwardHeaders`, the method and the body;
 * - the body's `Content-Length`, when the client declared a valid one: the body is still
 *   streamed, but as a body of that length rather than chunked, so an upstream that requires a
 *   length (411 to a chunked request) is served. A body that runs past it or ends short of it
 *   goes no further: 400 (`contentLengthMismatchReply`), reported to `onError`. Without a
 *   `Content-Length` (or with an invalid one) the body goes chunked;
 * - `Via`: the client's, with this gateway's entry (`1.1 mcp-dispatch`) appended (RFC 9110
 *   section 7.6.3);
 * - the resolved identity as a short-lived JWT signed by the platform, in `X-MCP-Identity`
 *   (see {@link createIdentitySigner}); Apps verify it with {@link createIdentityVerifier}
 *   against the JWKS the platform publishes.
 *
 * What never crosses: the caller's `Authorization` header (the MCP authorization spec
 * forbids token passthrough), cookies in either direction (`Cookie` up, `Set-Cookie` back),
 * hop-by-hop headers (RFC 9110 section 7.6.1; `HTTP2-Settings` too, RFC 9113 section 8.2.2),
 * including those the client names in `Connection`, and, back from the upstream, the fields
 * that are the dispatch layer's or act on the platform's whole site rather than the App:
 * `WWW-Authenticate`, `Authentication-Info`,
 * `Proxy-Authentication-Info`, `Access-Control-*`, `RateLimit`, `RateLimit-Policy`,
 * `Clear-Site-Data`, `Strict-Transport-Security` and `Alt-Svc`; nor the identity header, which
 * an upstream that mirrors request headers would otherwise hand to the caller.
 *
 * Upstream failures become JSON-RPC errors: 502 when the upstream cannot be reached, answers
 * with a redirect, refuses the platform's identity (401), answers 407, a status outside 200 to
 * 599 or a `Content-Encoding` it cannot relay, or the identity cannot be signed (the platform's
 * key or `audience` failed; reported to `onError`); 504 when it makes no progress for
 * `timeoutMs` before its response head (between the request body's chunks, or from the body's
 * end to the head). A client that sends no chunk of its body for `timeoutMs` while the proxy
 * waits on it for the next gets 408 (`request_timeout`, `Connection: close`): the stall is its
 * own. A failure after the head ends the response's body with an error (the client sees a cut
 * stream) and is reported to `onError`; so does an answer that is no event stream whose
 * upstream sends nothing more of its body for `timeoutMs`. A request body in a transfer coding besides `chunked`
 * (`Transfer-Encoding: gzip, chunked`) gets 501 (`Connection: close`), and nothing is sent
 * upstream.
 *
 * It is a web-standard handler, so every adapter can use it: as the Web adapter's `handler`,
 * or through `fromWebHandler` of the Express and Fastify adapters.
 *
 * @example
 * ```ts
 * import { mcpDispatch } from 'mcp-dispatch/web'
 * import { createProxyHandler } from 'mcp-dispatch/proxy'
 *
 * const proxy = createProxyHandler({
 *   upstream: { '1.4.2': 'http://weather-v1.internal:3000/mcp', '2.0.0': 'http://weather-v2.internal:3000/mcp' },
 *   appId: 'app_weather',
 *   identity: { issuer: 'https://platform.example', privateKey },
 * })
 * const handle = mcpDispatch({ dispatcher, handler: proxy })
 * // Workers: never `fetch: handle` itself (the runtime's second argument, its `env`, is no `info`).
 * export default { fetch: (request: Request) => handle(request, { clientAddress: request.headers.get('cf-connecting-ip') ?? undefined }) }
 * ```
 * @module
 */
import { bearerChallenges } from '../../core/authorization-header.js'
import { isFieldName } from '../../core/cors.js'
import { PROTECTED_RESOURCE_METADATA_PATH } from '../../core/metadata.js'
import { isEventStream, quoted } from '../../core/text.js'
import { type Reply, RpcCode, SCOPE_LIST, buildWwwAuthenticate, contentLengthMismatchReply, jsonRpcErrorReply, versionNotServedReply } from '../../core/reply.js'
import { ConfigurationError, UpstreamError, optionNames, refuseUnknownOptions, reporterOption } from '../../errors.js'
import type { DispatchContext } from '../../pipeline/dispatcher.js'
import { fetchLettingGo } from '../../fetch-let-go.js'
import { contentCodings } from '../../read-text.js'
import { afterThisTurn, timerOption, withTimeout } from '../../timeout.js'
import { versionTable } from '../version-router.js'
import { toResponse } from '../web/response.js'
import {
  IDENTITY_HEADER,
  type IdentitySigner,
  type IdentitySignerOptions,
  createIdentitySigner,
} from './identity.js'

/**
 * Request headers always forwarded to the upstream (MCP Streamable HTTP transport, 2025-03-26
 * to 2026-07-28). Every `Mcp-Param-{name}` header is forwarded too, whatever its name.
 */
export const FORWARDED_REQUEST_HEADERS: readonly string[] = Object.freeze([
  'content-type',
  'content-encoding',
  'accept',
  'mcp-session-id',
  'mcp-protocol-version',
  'last-event-id',
  'mcp-method',
  'mcp-name',
])

/**
 * Prefix of the request headers a client mirrors from tool arguments (`x-mcp-header`, MCP
 * 2026-07-28): all are forwarded, whatever the name, since the upstream rejects a call whose
 * mirrored argument lacks its header.
 */
const FORWARDED_PARAM_PREFIX = 'mcp-param-'

/** Whether the request header `name` (lower case) always crosses to the upstream. */
function alwaysForwarded(name: string): boolean {
  return FORWARDED_REQUEST_HEADERS.includes(name) || name.startsWith(FORWARDED_PARAM_PREFIX)
}

/**
 * Hop-by-hop headers (RFC 9110 section 7.6.1), never forwarded in either direction; with
 * `HTTP2-Settings`, which is as connection-specific (RFC 9113 section 8.2.2: never in an HTTP/2
 * message; Node refuses to send a response carrying it, so one from an upstream failed every
 * answer of that App over HTTP/2, and on `@hono/node-server` ended the process).
 */
const HOP_BY_HOP = new Set([
  'connection',
  'http2-settings',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
])

/**
 * Request headers that `forwardHeaders` may not name: credentials, hop-by-hop headers, those
 * the proxy sets itself, `Expect` (which Node's `fetch` refuses to send), and the
 * client-address claims (`X-Forwarded-*`, `Forwarded`, `X-Real-IP`, `X-Client-IP`, `Client-IP`,
 * `X-Cluster-Client-IP`, `True-Client-IP`, `CF-Connecting-IP`, `Fastly-Client-IP`), which from
 * the caller are only the caller's say-so.
 */
const NEVER_FORWARDED = new Set([
  ...HOP_BY_HOP,
  'authorization',
  'cookie',
  'host',
  'content-length',
  'accept-encoding',
  'via',
  'forwarded',
  // Node's `fetch` refuses to send it: every request carrying it would fail (502).
  'expect',
  'x-real-ip',
  'x-client-ip',
  'client-ip',
  'x-cluster-client-ip',
  'true-client-ip',
  'cf-connecting-ip',
  'fastly-client-ip',
])
const NEVER_FORWARDED_PREFIX = 'x-forwarded-'

/**
 * Response headers never passed back to the caller: the dispatch layer's own (its challenge,
 * CORS and rate-limit fields), the upstream's answers to an authentication, and those that act
 * on the platform's whole site, not the App
 * (`Clear-Site-Data` would clear the dashboard's cookies, HSTS and `Alt-Svc` set policy for
 * the host). `Set-Cookie` too: cookies never travel to the upstream, so one it sets could only
 * land on the platform's own hosts (with `Domain`, on its dashboard: cookie tossing).
 */
const NEVER_RELAYED = new Set([
  // Relayed rebuilt for a 403 that asks an OAuth caller for more scope (`scopeChallenge`).
  'www-authenticate',
  // The upstream's word on an authentication the caller did not make (RFC 9110 section 11.6.3),
  // and on one with the next proxy only (section 11.7.3).
  'authentication-info',
  'proxy-authentication-info',
  'set-cookie',
  'ratelimit',
  'ratelimit-policy',
  'clear-site-data',
  'strict-transport-security',
  'alt-svc',
])

/** An `error_description` value (RFC 6750 section 3). */
const DESCRIPTION_VALUE = /^[\x20\x21\x23-\x5b\x5d-\x7e]{1,500}$/

/**
 * The challenge relayed for an upstream's 403 that asks for more scope (MCP authorization,
 * "Runtime insufficient scope errors": `Bearer error="insufficient_scope", scope="…"`), or
 * `undefined`. Only to a caller that signed in with OAuth: the scopes are those of its own
 * access token, which the identity token carries to the App, and a client can ask its
 * authorization server for more (an API token cannot, and step-up would only send its client
 * into a sign-in). Rebuilt, not passed on: `error` and a well-formed `scope` and
 * `error_description` only, and `resource_metadata` naming this App's document, as the
 * dispatch layer's own 401 does, never the upstream's. Every other upstream challenge is
 * dropped (the upstream's word on the identity token is not the caller's to answer).
 */
function scopeChallenge(status: number, header: string | null, context: DispatchContext): string | undefined {
  if (status !== 403 || header === null || context.identity.method !== 'oauth') return undefined
  // The Bearer challenge asking for scope, wherever it stands among the upstream's challenges
  // (`DPoP …, Bearer error="insufficient_scope"`: regression, only a first one was read).
  // Of a name it repeats, the first counts (a repeated one is not to be trusted either way).
  const firsts = bearerChallenges(header).map((challenge) => new Map([...challenge].reverse()))
  const params = firsts.find((challenge) => challenge.get('error') === 'insufficient_scope')
  if (params === undefined) return undefined
  let challenge = `${buildWwwAuthenticate({ resourceMetadataUrl: context.baseUrl + PROTECTED_RESOURCE_METADATA_PATH })}, error="insufficient_scope"`
  const scope = params.get('scope')
  if (scope !== undefined && SCOPE_LIST.test(scope)) challenge += `, scope="${scope}"`
  const description = params.get('error_description')
  if (description !== undefined && DESCRIPTION_VALUE.test(description)) challenge += `, error_description="${description}"`
  return challenge
}

/** This gateway's `Via` entry (RFC 9110 section 7.6.3: a pseudonym for the host). */
const VIA = '1.1 mcp-dispatch'

/** Where each version lives: see {@link ProxyHandlerOptions.upstream}. */
export type UpstreamMap =
  | Readonly<Record<string, string | URL>>
  | ((context: DispatchContext) => string | URL | null | undefined)

/** Options of {@link createProxyHandler}. */
export interface ProxyHandlerOptions {
  /**
   * The upstream MCP endpoint of each version: an object keyed by `'<appId>@<version>'`, or
   * by version (`'1.4.2'`) for the App named by `appId` (an App-qualified key wins), or a
   * function of the dispatch context (`undefined` or `null`: none). A version without an
   * upstream gets a JSON-RPC 404 (`version_not_served`).
   */
  upstream: UpstreamMap
  /**
   * The App whose versions the table's bare version keys (`'1.4.2'`) name. Required when the
   * table has such keys: without it, every App that has a version of that number would be
   * sent to this upstream (a dispatcher serves every App of the platform). Keys of the form
   * `'<appId>@<version>'` need no `appId`.
   */
  appId?: string | undefined
  /** Signs the identity the upstream receives: a signer, or the options to create one. */
  identity: IdentitySigner | IdentitySignerOptions
  /**
   * Header carrying the identity JWT. Default `x-mcp-identity`. Never a header the proxy
   * forwards from the client (the MCP ones, `Mcp-Param-*`), a credential or a hop-by-hop header.
   */
  identityHeader?: string | undefined
  /** The `aud` of the identity JWT for an upstream. Default: the upstream URL's origin. */
  audience?: ((context: DispatchContext, upstream: URL) => string) | undefined
  /**
   * How long the upstream may make no progress before its response head, in ms (504 after):
   * the time between two chunks of the request body it takes, and from the body's end (or the
   * request's start, without a body) to the head. A slow upload that keeps moving is no
   * timeout; one the client stops while the proxy waits on it for the next chunk is the
   * client's (408). An event stream may then stay quiet for as long as both ends keep it; the
   * body of any other answer must keep coming: the proxy waits on the upstream at most this
   * long for each next chunk of it (the client's own pace is not counted), then ends it cut and
   * reports a 504 `UpstreamError` to `onError`. An App that answers in JSON
   * (`enableJsonResponse` of the SDK's transport) sends its head only with the result, so there
   * this must cover its longest tool call; an App that answers with SSE sends the head at once.
   * Default 30 s. With the default `fetch` on Node, undici's own limits (300 s for the head,
   * 300 s between two body chunks) are off, so these are the only deadlines and a quiet SSE
   * stream is never cut; a `fetch` of your own keeps whatever limits it has.
   */
  timeoutMs?: number | undefined
  /**
   * More request headers to forward. Never credentials the proxy knows (`Authorization`,
   * `Cookie`, `Proxy-Authorization`), hop-by-hop headers, the ones it sets (`Host`, `Via`,
   * `Content-Length`, `Accept-Encoding`), `Expect` (Node's `fetch` refuses to send it) or the
   * client-address claims (`X-Forwarded-*`, `Forwarded`, `X-Real-IP`, `True-Client-IP` and the
   * like: from the caller they prove nothing); other credential headers of your own (an
   * `X-Api-Key`) it cannot recognise: do not list them.
   */
  forwardHeaders?: readonly string[] | undefined
  /**
   * `fetch` to reach upstreams. Default the global one (on Node, through the global
   * dispatcher, a platform's own included, without undici's 300 s deadlines: see `timeoutMs`).
   *
   * One of your own (a dispatcher for mTLS, a connection pool) is called with the upstream URL
   * and an `init` of `method`, `headers` (a `Headers`), `redirect: 'manual'`, `signal` and, for
   * a request with a body, a `ReadableStream` `body` with `duplex: 'half'`. It must do what the
   * platform's `fetch` does:
   * - send `init.headers` as given: `Accept-Encoding: identity`, and a `Content-Length`, which
   *   then frames the stream (Node's `fetch` sends it so, not chunked; the proxy fails a body of
   *   another length before your `fetch` sees the excess or the early end);
   * - hand back a redirect as it is (not follow it), and abort on `init.signal`;
   * - decode a response body whose `Content-Encoding` lists only `gzip`, `x-gzip`, `deflate` and
   *   `br`, and keep both `Content-Encoding` and `Content-Length` as the upstream sent them, as
   *   Node's `fetch` does: the proxy reads such a label as "decoded", drops both fields from the
   *   answer and relays the bytes as they are. Bytes left encoded (a `fetch` built on
   *   `node:http` or undici's `request`, which decode nothing) would reach the client unlabelled
   *   and unreadable; the proxy cannot tell decoded bytes from encoded ones (a Brotli stream has
   *   no signature), so it relies on this. A `fetch` that decodes and removes both fields works
   *   too; one that removes `Content-Encoding` alone leaves the coded length on decoded bytes.
   *   Any other coding is a 502 whatever your `fetch` did with it. An upstream that honours
   *   `Accept-Encoding: identity` encodes nothing.
   */
  fetch?: ((input: URL, init: RequestInit) => Promise<Response>) | undefined
  /**
   * Upstream failures (the client only sees 502 / 504), and a request body that does not match
   * its `Content-Length` (a `RangeError`: on the wire, the runtime frames a body by it, so most
   * likely a middleware of the platform's rewrote the body). Not a body the client stopped
   * sending (its 408): that is the client's, and any client could send them unbounded. Context `proxy <origin>`, the upstream's origin; `proxy upstream`
   * for an `upstream` function that threw. Default `logError` (stderr).
   */
  onError?: ((error: unknown, context: string) => void) | undefined
}

/** A web-standard MCP handler that forwards to the upstream of the dispatched version. */
export type ProxyHandler = (request: Request, context: DispatchContext) => Promise<Response>

/**
 * The JSON-RPC error answer for an {@link UpstreamError} (502 or 504), as the proxy sends it.
 *
 * @example
 * ```ts
 * upstreamErrorReply(new UpstreamError(504, 'Upstream App timed out'))
 * // { status: 504, headers: { 'content-type': 'application/json' }, body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32000,…,"data":{"error":"upstream_timeout"}}}' }
 * ```
 */
export function upstreamErrorReply(error: UpstreamError): Reply {
  return jsonRpcErrorReply(error.status, {
    code: error.rpcCode,
    message: error.message,
    data: { error: error.status === 504 ? 'upstream_timeout' : 'upstream_unavailable' },
  })
}

const UNAVAILABLE = 'Upstream App unavailable'
const TIMED_OUT = 'Upstream App timed out'
/**
 * 408 when the client stopped sending its body for `timeoutMs` (the body of Node's own 408,
 * `answerClientError`); the connection closes after it, since the rest of the body may still come.
 */
const REQUEST_TIMEOUT = jsonRpcErrorReply(
  408,
  { code: RpcCode.ServerError, message: 'Request timeout', data: { error: 'request_timeout' } },
  { connection: 'close' },
)

/** Where Node's `fetch` (undici) keeps its global dispatcher, the platform's own if it set one. */
const GLOBAL_DISPATCHER = Symbol.for('undici.globalDispatcher.1')
type Dispatcher = { dispatch(options: object, handler: unknown): boolean }

/**
 * Node's global dispatcher with undici's own deadlines turned off for this request: 300 s for
 * the response head and 300 s between two body chunks. The first would turn a tool call longer
 * than that into a 502 whatever `timeoutMs` says; the second cuts an SSE stream (a GET stream
 * of notifications) that is quiet for 5 minutes. The proxy's `timeoutMs` governs the head, and
 * a stream lasts as long as both ends keep it. Any other setting of the platform's dispatcher
 * (a proxy agent, TLS options, connection limits) stays.
 */
const withoutUndiciDeadlines: Dispatcher = {
  dispatch(options, handler) {
    const global = (globalThis as Record<symbol, Dispatcher | undefined>)[GLOBAL_DISPATCHER]!
    return global.dispatch({ ...options, headersTimeout: 0, bodyTimeout: 0 }, handler)
  },
}

/** Node (not Bun or Deno, whose `fetch` is their own): `fetch` is undici's. */
const nodeFetch =
  typeof process === 'object' &&
  typeof process.versions?.node === 'string' &&
  process.versions.bun === undefined &&
  (globalThis as { Deno?: unknown }).Deno === undefined

/** The default `fetch`: the global one, on Node without undici's deadlines. */
function defaultFetch(input: URL, init: RequestInit): Promise<Response> {
  return nodeFetch ? fetch(input, { ...init, dispatcher: withoutUndiciDeadlines } as RequestInit) : fetch(input, init)
}

/** `option`, when given, is a function. */
function optionalFunction<F>(value: F | undefined, option: string): F | undefined {
  if (value !== undefined && typeof value !== 'function') throw new ConfigurationError(option, 'must be a function')
  return value
}

/** At most this many upstream URLs of a function `upstream` are kept parsed. */
const MAX_PARSED_UPSTREAMS = 1_000

function parseUpstream(value: string | URL, option: string): URL {
  let url: URL
  try {
    url = new URL(String(value))
  } catch {
    // The value is not shown: an upstream address may carry credentials in its user info or
    // query, and this message reaches `onError` (a log) when a function `upstream` answers it.
    throw new ConfigurationError(option, 'is not an absolute URL')
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new ConfigurationError(option, 'must be an http(s) URL')
  if (url.username || url.password) throw new ConfigurationError(option, 'must not carry credentials')
  return url
}

/**
 * The body to pass on, read on demand (no read-ahead, so the client's pace is the upstream's).
 * `null` for an empty answer (a 202 to a notification, a 200 to DELETE), so no runtime labels
 * it with a default `Content-Type`; only an answer with neither `Content-Type` nor length is
 * peeked at for that, so a stream's head is never held back. When the client goes away
 * (`gone` aborted), the upstream is aborted and the body ends quietly instead of failing, so
 * runtimes do not log a disconnect as an error. `ended` is called once the stream it returns
 * has ended, failed or been cancelled (not for `null`: the caller knows). `onFailure` hears an
 * upstream that fails mid-body and answers the error the stream fails with (the one it told).
 *
 * A body that is no event stream fails once the upstream has sent none of it for `idleMs`
 * while the proxy waits on it (the client's own pace is not counted: a chunk is asked for only
 * when the client takes one): an App that stalls mid-answer would otherwise hold the client,
 * the connection to it and the session's pin for ever. An event stream may stay quiet.
 */
async function relayBody(
  upstream: Response,
  method: string,
  gone: AbortSignal,
  deadline: AbortSignal,
  idleMs: number,
  onFailure: (error: unknown) => unknown,
  ended: () => void,
): Promise<ReadableStream<Uint8Array> | null> {
  const body = upstream.body
  if (!body) return null
  const status = upstream.status
  const length = upstream.headers.get('content-length')
  if (status === 204 || method === 'HEAD' || length === '0') {
    void body.cancel().catch(() => {})
    return null
  }
  const reader = body.getReader()
  let first: Uint8Array | undefined
  if (!upstream.headers.has('content-type') && length === null) {
    const peeked = await readBefore(reader, deadline)
    if (peeked.done) return null
    first = peeked.value
  }
  const stallAfterMs = isEventStream(upstream.headers.get('content-type')) ? undefined : idleMs
  return new ReadableStream<Uint8Array>(
    {
      start(controller) {
        if (first) controller.enqueue(first)
      },
      async pull(controller) {
        try {
          const next = stallAfterMs === undefined ? await reader.read() : await readWithin(reader, stallAfterMs)
          if (next.done) {
            controller.close()
            ended()
          } else controller.enqueue(next.value)
        } catch (error) {
          ended()
          if (gone.aborted) controller.close()
          else {
            // The head is out: the client can only see the stream cut; the platform hears why.
            // The body fails with what was told (an `UpstreamError`), which `fromWebHandler`
            // does not tell again.
            controller.error(onFailure(error))
          }
        }
      },
      cancel(reason) {
        ended()
        // Never rejects (a runtime cancelling a body may rethrow what it rejects with).
        return reader.cancel(reason).catch(() => {})
      },
    },
    { highWaterMark: 0 },
  )
}

/**
 * `reader.read()`, rejected with a 504 `UpstreamError` (and the body cancelled) when nothing came
 * of it for `ms`: `withTimeout`'s deadline, so a chunk that came while the event loop was held is
 * not taken for a stall.
 */
function readWithin(reader: ReadableStreamDefaultReader<Uint8Array>, ms: number): Promise<ReadableStreamReadResult<Uint8Array>> {
  let answered = false
  const reading = reader.read()
  reading.then(
    () => (answered = true),
    () => (answered = true),
  )
  return withTimeout(reading, ms, 'the upstream App').catch((error: unknown) => {
    if (answered) throw error
    void reader.cancel().catch(() => {})
    throw new UpstreamError(504, `Upstream App sent nothing of its answer's body for ${ms} ms`, { cause: error })
  })
}

/**
 * `reader.read()`, rejected (and the body cancelled) once `deadline` aborts, whether or not
 * the `fetch` in use ends its body on the abort signal.
 */
function readBefore(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  deadline: AbortSignal,
): Promise<ReadableStreamReadResult<Uint8Array>> {
  if (deadline.aborted) return Promise.reject(deadline.reason)
  return new Promise((resolve, reject) => {
    const onAbort = () => {
      reject(deadline.reason)
      void reader.cancel().catch(() => {})
    }
    deadline.addEventListener('abort', onAbort, { once: true })
    reader.read().then(
      (result) => {
        deadline.removeEventListener('abort', onAbort)
        resolve(result)
      },
      (error: unknown) => {
        deadline.removeEventListener('abort', onAbort)
        reject(error)
      },
    )
  })
}

const PROXY_HANDLER_OPTIONS = optionNames<ProxyHandlerOptions>({ upstream: true, identity: true, audience: true, appId: true, identityHeader: true, forwardHeaders: true, timeoutMs: true, fetch: true, onError: true })

/**
 * Creates the proxy handler.
 *
 * @example
 * ```ts
 * const proxy = createProxyHandler({
 *   upstream: (context) => upstreams.get(`${context.app.id}@${context.version}`),
 *   identity: signer,
 *   timeoutMs: 10_000,
 * })
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} with an `upstream` that is not a table of http(s) URLs or a function (a `Map` included), a table of no URL, a table key that is neither `'<appId>@<version>'` nor an exact version, bare version keys without `appId`, `identity` options the signer refuses (see {@link createIdentitySigner}), an `identityHeader` that is not a header name or is one the proxy forwards or refuses, a `forwardHeaders` that is not an array of header names or names a header it never forwards (hop-by-hop, a credential, one the proxy sets: `Host`, `Via`, `Content-Length`, `Accept-Encoding`; `Expect`, a client-address claim, or the identity header), a `timeoutMs` out of range, or an `audience`, `fetch` or `onError` that is not a function.
 */
export function createProxyHandler(options: ProxyHandlerOptions): ProxyHandler {
  if (!options) throw new ConfigurationError('upstream', 'is required')
  if (typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  refuseUnknownOptions(options, PROXY_HANDLER_OPTIONS, 'createProxyHandler')
  const signer: IdentitySigner =
    options.identity && typeof (options.identity as IdentitySigner).sign === 'function'
      ? (options.identity as IdentitySigner)
      : createIdentitySigner(options.identity as IdentitySignerOptions)
  const identityHeader = options.identityHeader ?? IDENTITY_HEADER
  if (typeof identityHeader !== 'string' || !isFieldName(identityHeader)) {
    throw new ConfigurationError('identityHeader', 'must be a header field name')
  }
  const identityName = identityHeader.toLowerCase()
  if (NEVER_FORWARDED.has(identityName) || alwaysForwarded(identityName)) {
    throw new ConfigurationError('identityHeader', `must not be ${JSON.stringify(identityName)}`)
  }
  const timeoutMs = timerOption('timeoutMs', options.timeoutMs ?? 30_000)
  const forwarded = new Set(FORWARDED_REQUEST_HEADERS)
  const extra: unknown = options.forwardHeaders ?? []
  // A string would be taken character by character: `'x-trace'` would forward a header `x`.
  if (!Array.isArray(extra)) throw new ConfigurationError('forwardHeaders', 'must be an array of header names')
  for (const name of extra) {
    if (typeof name !== 'string' || !isFieldName(name)) {
      throw new ConfigurationError('forwardHeaders', `${typeof name === 'string' ? quoted(name) : JSON.stringify(name)} is not a header field name`)
    }
    const lower = name.toLowerCase()
    if (NEVER_FORWARDED.has(lower) || lower.startsWith(NEVER_FORWARDED_PREFIX) || lower === identityName) {
      throw new ConfigurationError('forwardHeaders', `must not name ${JSON.stringify(lower)}`)
    }
    forwarded.add(lower)
  }
  const fetchUpstream = optionalFunction(options.fetch, 'fetch') ?? defaultFetch
  const onError = reporterOption(options.onError)
  const audienceOf = optionalFunction(options.audience, 'audience') ?? ((_context: DispatchContext, upstream: URL) => upstream.origin)

  let upstreamOf: (context: DispatchContext) => URL | undefined
  const source = options.upstream
  if (typeof source === 'function') {
    // Bounded: a function may answer a URL per request (a query naming the caller).
    const parsed = new Map<string, URL>()
    upstreamOf = (context) => {
      const value = source(context) as string | URL | null | undefined
      // `null` names none too, as `routeByVersion` takes it (a lookup that found no row).
      if (value == null) return undefined
      const key = String(value)
      let url = parsed.get(key)
      if (!url) {
        url = parseUpstream(value, 'upstream')
        if (parsed.size >= MAX_PARSED_UPSTREAMS) parsed.delete(parsed.keys().next().value!)
        parsed.set(key, url)
      }
      return url
    }
  } else if (source && typeof source === 'object') {
    // A Map's entries are no keys of the object: it would proxy nothing, each request a 404.
    if (source instanceof Map) {
      throw new ConfigurationError('upstream', 'must be a plain object of URLs keyed by version, or a function, not a Map (give Object.fromEntries(map))')
    }
    const table = new Map<string, URL>()
    for (const [key, value] of Object.entries(source)) table.set(key, parseUpstream(value, `upstream.${key}`))
    if (table.size === 0) throw new ConfigurationError('upstream', 'has no URL: every request would be answered version_not_served')
    upstreamOf = versionTable(table, options.appId, 'upstream', 'upstream')
  } else {
    throw new ConfigurationError('upstream', 'must be an object of URLs keyed by version, or a function')
  }

  return async function proxy(request, context) {
    let target: URL | undefined
    try {
      target = upstreamOf(context)
    } catch (error) {
      onError(error, 'proxy upstream')
      return toResponse(upstreamErrorReply(new UpstreamError(502, UNAVAILABLE)))
    }
    if (!target) return toResponse(versionNotServedReply(context.version))
    // A transfer coding besides `chunked` (`gzip, chunked`): Node's parser takes off the chunked
    // framing only, so the body would go on still coded, and nothing would say so
    // (Transfer-Encoding is this hop's). RFC 9112 section 6.1: 501 for a coding not understood.
    const transferCoding = request.headers.get('transfer-encoding')
    if (transferCoding !== null && !ONLY_CHUNKED.test(transferCoding)) return toResponse(TRANSFER_CODING_NOT_SUPPORTED)

    const headers = new Headers()
    // Headers the client named in `Connection` are hop-by-hop (RFC 9110 section 7.6.1), even
    // MCP ones: they were meant for this hop only.
    const hopOnly = connectionTokens(request.headers.get('connection'))
    // `Headers` iterates lower-case names, each once (repeated ones joined, as `get` gives them).
    request.headers.forEach((value, name) => {
      if ((forwarded.has(name) || name.startsWith(FORWARDED_PARAM_PREFIX)) && !hopOnly?.has(name)) headers.set(name, value)
    })
    // Compressed bodies would be decoded by `fetch` and re-labelled wrongly; ask for none.
    headers.set('accept-encoding', 'identity')
    const via = request.headers.get('via')
    headers.set('via', via ? `${via}, ${VIA}` : VIA)
    try {
      headers.set(identityName, await signer.sign(context, audienceOf(context, target)))
    } catch (error) {
      // The platform's failure (its key, its audience function), not the App's: nothing goes
      // upstream without the identity; the client gets the 502, the platform hears why.
      onError(new UpstreamError(502, 'Identity token could not be signed', { cause: error }), `proxy ${target.origin}`)
      return toResponse(upstreamErrorReply(new UpstreamError(502, UNAVAILABLE)))
    }

    const method = request.method
    const mayHaveBody = method !== 'GET' && method !== 'HEAD'
    const hasBody = request.body !== null && mayHaveBody
    /** Set when the body did not match `declared`: the request went no further (400, not 502). */
    let lengthMismatch = false
    const onMismatch = (error: RangeError) => {
      lengthMismatch = true
      // On the wire, the runtime frames a body by its `Content-Length`, so a mismatch is most
      // likely the platform's own doing (a middleware that rewrote the body and kept the header).
      onError(error, `proxy ${target!.origin}`)
    }
    // The client's length goes on, so an upstream that requires one (411 to a chunked request)
    // is served; the body is still streamed, and `progressOf` holds it to that length.
    const declared = mayHaveBody ? declaredLength(request.headers) : undefined
    if (declared !== undefined) {
      if (!hasBody && declared > 0) {
        onMismatch(new RangeError(`Request has no body, but a Content-Length of ${declared}`))
        return toResponse(contentLengthMismatchReply())
      }
      headers.set('content-length', String(declared))
    }
    const controller = new AbortController()
    let timedOut = false
    /** Whether the proxy was waiting on the client's next body chunk when `timeoutMs` ran out. */
    let clientStalled = false
    /**
     * Set by `progressOf`: `awaitingClient` while the proxy waits on the client for its next
     * body chunk; `letGo`, which cancels what the upstream has not taken of the client's body.
     */
    const upload: Upload = { awaitingClient: false, letGo: undefined }
    let timer: ReturnType<typeof setTimeout> | undefined
    let settled = false
    /** (Re)starts the no-progress deadline, until `fetch` has answered or failed. */
    const arm = () => {
      if (settled || controller.signal.aborted) return
      clearTimeout(timer)
      timer = setTimeout(() => {
        timedOut = true
        clientStalled = !settled && upload.awaitingClient
        controller.abort()
      }, timeoutMs)
    }
    arm()
    const clientGone = () => controller.abort()
    if (request.signal.aborted) controller.abort()
    else request.signal.addEventListener('abort', clientGone, { once: true })
    /**
     * Takes `clientGone` off the client's signal once the exchange is over. It must go: left on,
     * it kept the request whole after its answer (its closure holds the request, and undici's
     * `Request` finalizer holds the signal; about 16 KB per proxied POST, for ever).
     */
    const release = () => {
      request.signal.removeEventListener('abort', clientGone)
      // The exchange is over: what the upstream did not take of the client's body (it answered
      // first: a 413 past its limit) it never will. Cancelled, the adapter drains the rest from
      // the client's connection, which then serves its next request; left paused, it held the
      // connection until a timeout, and the keep-alive client's next request on it failed.
      upload.letGo?.()
    }

    let upstream: Response
    try {
      const init: RequestInit & { duplex?: 'half' } = {
        method,
        headers,
        redirect: 'manual',
        ...(hasBody && { body: progressOf(request.body!, arm, declared, onMismatch, upload, controller.signal, request.signal), duplex: 'half' as const }),
      }
      upstream = await fetchLettingGo(fetchUpstream, target, init, controller)
      // The body may still be taken after the head (an upstream that answers first): that no
      // longer restarts the deadline, which now covers only what `relayBody` peeks at.
      settled = true
    } catch (error) {
      // Nor after a failure: a body chunk the client sends late must not start a timer.
      settled = true
      clearTimeout(timer)
      release()
      if (lengthMismatch) return toResponse(contentLengthMismatchReply())
      return failed(error)
    }

    /**
     * The 502 (or 504 past `timeoutMs`) for a failure before the answer's head went out; 408
     * when the time ran out waiting for the client's next body chunk: the stall was the
     * client's, not the upstream's.
     */
    function failed(error: unknown, message = UNAVAILABLE): Response {
      // Not reported: the stall is the client's, no failure of the platform or the upstream, and
      // any client could send one per connection it holds, as often as it likes.
      if (clientStalled) return toResponse(REQUEST_TIMEOUT)
      const failure = timedOut
        ? new UpstreamError(504, TIMED_OUT, { cause: error })
        : new UpstreamError(502, message, { cause: error })
      if (!request.signal.aborted) onError(failure, `proxy ${target!.origin}`)
      return toResponse(upstreamErrorReply(timedOut ? failure : new UpstreamError(502, UNAVAILABLE)))
    }

    const status = upstream.status
    // A redirect could send the next request (and its identity) elsewhere; a 401 means the
    // upstream refuses the platform's identity, which the caller can do nothing about; a
    // status outside 200 to 599 is not HTTP the client could be given.
    if ((status >= 300 && status < 400) || status === 401 || status === 407 || status < 200 || status > 599) {
      clearTimeout(timer)
      release()
      void upstream.body?.cancel().catch(() => {})
      return failed(undefined, `Upstream answered ${status}`)
    }

    // The upstream was asked for no coding. `fetch` decodes gzip, deflate and br (a `fetch`
    // option must too: see its doc), and the labels are then dropped; what else it decodes
    // depends on its version (zstd on newer Node), so any other coding is an answer this proxy
    // cannot relay truthfully: 502.
    const coding = codingOf(upstream.headers.get('content-encoding'))
    if (coding === 'unknown') {
      clearTimeout(timer)
      release()
      void upstream.body?.cancel().catch(() => {})
      return failed(undefined, `Upstream answered Content-Encoding ${quoted(upstream.headers.get('content-encoding') ?? '')}`)
    }
    const decoded = coding === 'decoded'
    const out = new Headers()
    const hopByHop = connectionTokens(upstream.headers.get('connection'))
    upstream.headers.forEach((value, name) => {
      if (HOP_BY_HOP.has(name) || hopByHop?.has(name) || NEVER_RELAYED.has(name)) return
      // The platform's identity token, as an upstream that echoes request headers sends it
      // back: the caller would hold a signed identity it could present to the App directly.
      if (name === identityName) return
      // CORS is the dispatch layer's, for the App's address: an upstream's own fields (say
      // `Access-Control-Allow-Credentials`) would join it, and could pair with an echoed origin.
      if (name.startsWith('access-control-')) return
      if (decoded && (name === 'content-encoding' || name === 'content-length')) return
      // A 204 has no content, and no `Content-Length` may say otherwise (RFC 9110 section 8.6).
      // Nor a 205's, which `fetch` gives no body: its length is said to be 0 below.
      if ((status === 204 || status === 205) && name === 'content-length') return
      out.set(name, value)
    })
    const challenge = scopeChallenge(status, upstream.headers.get('www-authenticate'), context)
    if (challenge !== undefined) out.set('www-authenticate', challenge)
    // RFC 9110 section 15.3.6: a 205 says it has no content (`Content-Length: 0`). The upstream's
    // own length, kept, left a keep-alive client waiting for bytes that never came.
    if (status === 205) out.set('content-length', '0')
    let body: ReadableStream<Uint8Array> | null
    try {
      // Still under `timeoutMs`: an answer without `Content-Type` or length is peeked at, and an
      // upstream that sends such a head and then nothing must not hold the client forever.
      body = await relayBody(
        upstream,
        method,
        request.signal,
        controller.signal,
        timeoutMs,
        (error) => {
          const failure = new UpstreamError(502, 'Upstream App failed after its response head', { cause: error })
          onError(failure, `proxy ${target!.origin}`)
          return failure
        },
        release,
      )
    } catch (error) {
      release()
      void upstream.body?.cancel().catch(() => {})
      return failed(error)
    } finally {
      clearTimeout(timer)
    }
    if (body === null) release()
    // The status line's reason phrase is not passed on: it is optional, and an upstream's may
    // hold bytes no runtime can write.
    return new Response(body, { status, headers: out })
  }
}

/**
 * The request's `Content-Length`, when it is one non-negative decimal integer (RFC 9110 section
 * 8.6) and no `Transfer-Encoding` overrides it (RFC 9112 section 6.3); `undefined` otherwise, and
 * the body then goes on chunked, as the runtime delivered it.
 */
function declaredLength(headers: Headers): number | undefined {
  const value = headers.get('content-length')
  if (value === null || headers.has('transfer-encoding') || !/^\d{1,16}$/.test(value)) return undefined
  const length = Number(value)
  return Number.isSafeInteger(length) ? length : undefined
}

/** What `progressOf` and the exchange share of the upload. */
interface Upload {
  /** Whether the proxy waits on the client for its next body chunk (the proxy's 408). */
  awaitingClient: boolean
  /** Cancels what the upstream has not taken of the client's body, once the exchange is over. */
  letGo: (() => void) | undefined
}

/**
 * The request body, passed on as the upstream pulls it (no read-ahead), with `progress()` called
 * for each chunk taken and at its end: the no-progress deadline then counts from there. With a
 * `declared` length (the `Content-Length` sent on), a chunk that would run past it, or an end
 * short of it, is not passed on: `mismatch` hears why and the stream fails, so the upstream never
 * sees a complete request of the wrong length (Node's `fetch` aborts the one it was sending). The
 * chunk that completes the length is held until the client's body ends, so bytes past it in a
 * later chunk fail the stream while the upstream still lacks the last of it.
 * `upload.awaitingClient` is set while it waits on the client for the next chunk (the proxy's
 * 408); once `signal` aborts (a timeout, the client gone), nothing more is taken and the
 * client's body is cancelled. Once `client` (the request's own signal, which stays linked to
 * the client after `signal` is let go of) aborts, the stream fails too: the upstream is never
 * given the end of a body the client cut off (see `end`).
 */
function progressOf(
  body: ReadableStream<Uint8Array>,
  progress: () => void,
  declared: number | undefined,
  mismatch: (error: RangeError) => void,
  upload: Upload,
  signal: AbortSignal,
  client: AbortSignal,
): ReadableStream<Uint8Array> {
  const reader = body.getReader()
  let received = 0
  let cancelled = false
  let passedOn: ReadableStreamDefaultController<Uint8Array> | undefined
  upload.letGo = () => {
    if (cancelled) return
    cancelled = true
    signal.removeEventListener('abort', stop)
    // The upstream, should it still read, is never given the end of a body it did not take (a
    // body passed on whole is closed already: then this is nothing).
    passedOn?.error(new Error('the exchange is over: the rest of the request body is not passed on'))
    void reader.cancel().catch(() => {})
  }
  // Once the exchange is aborted (a timeout, the client gone), nothing more of the body is
  // taken: Node's fetch goes on pulling a request body after its abort, and would read the
  // client's whole upload into a dead socket (a body always ready, in a loop that starves the
  // event loop). A read pending on the client ends too.
  const stop = () => void reader.cancel(signal.reason).catch(() => {})
  signal.addEventListener('abort', stop, { once: true })
  const fail = (controller: ReadableStreamDefaultController<Uint8Array>, error: RangeError) => {
    mismatch(error)
    controller.error(error)
    void reader.cancel(error).catch(() => {})
  }
  /** The client's next chunk (the 408's wait while it comes), progress noted once it has. */
  const take = async () => {
    upload.awaitingClient = true
    let next: ReadableStreamReadResult<Uint8Array>
    try {
      next = await reader.read()
    } finally {
      upload.awaitingClient = false
    }
    progress()
    return next
  }
  const gone = () => signal.aborted || client.aborted
  /** Fails the stream: the exchange was aborted, or the client went away. */
  const cut = (controller: ReadableStreamDefaultController<Uint8Array>) => {
    signal.removeEventListener('abort', stop)
    const reason: unknown = signal.aborted ? signal.reason : client.reason
    controller.error(reason)
    void reader.cancel(reason).catch(() => {})
  }
  /**
   * Ends the stream (after `last`, the held chunk that completes a declared length), unless the
   * client went away. The end waits one turn of the event loop (`setImmediate`; the end only,
   * never a chunk): an HTTP/2 client that resets its stream mid-upload (RST_STREAM without
   * END_STREAM) ends Node's compatibility request as if whole (its `aborted`, then a normal
   * end), and the signal that says so aborts in the same I/O event, in an order of Node's
   * internal callbacks (on Node 20, `@hono/node-server` and the Node adapters abort it first).
   * One turn later every callback of that event has run: a reset is seen whatever the order,
   * and the upstream never gets a whole request of what the client cut off. (A client that
   * ended its body, END_STREAM, and only then resets sent a whole request: it goes on whole.)
   */
  const end = async (controller: ReadableStreamDefaultController<Uint8Array>, last?: Uint8Array) => {
    await new Promise<void>((resolve) => afterThisTurn(resolve))
    if (cancelled) return
    if (gone()) {
      cut(controller)
      return
    }
    signal.removeEventListener('abort', stop)
    if (last !== undefined) controller.enqueue(last)
    controller.close()
  }
  return new ReadableStream<Uint8Array>(
    {
      start(controller) {
        passedOn = controller
      },
      async pull(controller) {
        if (gone()) {
          cut(controller)
          return
        }
        const next = await take()
        // Let go of once the exchange was over (`letGo`): nothing more goes on, nothing is told.
        if (cancelled) return
        if (gone()) {
          cut(controller)
          return
        }
        if (next.done) {
          if (declared !== undefined && received < declared) {
            signal.removeEventListener('abort', stop)
            fail(controller, new RangeError(`Request body ended after ${received} bytes, short of its Content-Length ${declared}`))
          } else await end(controller)
          return
        }
        received += next.value.byteLength
        if (declared === undefined || received < declared) {
          controller.enqueue(next.value)
          return
        }
        if (received > declared) {
          fail(controller, new RangeError(`Request body ran past its Content-Length ${declared}`))
          return
        }
        // The chunk that completes the declared length waits for the client's end: bytes past
        // it in a later chunk must fail the stream before the upstream has a whole request.
        let after = await take()
        while (!after.done && after.value.byteLength === 0 && !gone() && !cancelled) after = await take()
        if (cancelled) return
        if (gone()) {
          cut(controller)
          return
        }
        if (!after.done) {
          fail(controller, new RangeError(`Request body ran past its Content-Length ${declared}`))
          return
        }
        await end(controller, next.value)
      },
      cancel(reason) {
        cancelled = true
        signal.removeEventListener('abort', stop)
        // Never rejects: `fetch` cancels the request body when the client went away, and
        // rethrows what the cancel rejects with (the client's body, errored `aborted`) where
        // nothing catches it: an unhandled rejection, which ends the process.
        return reader.cancel(reason).catch(() => {})
      },
    },
    { highWaterMark: 0 },
  )
}

/**
 * A `Transfer-Encoding` value that lists `chunked` alone, empty list elements aside (RFC 9110
 * section 5.6.1); `chunked` takes no parameters, so nothing quoted can be in such a value.
 */
const ONLY_CHUNKED = /^[ \t,]*chunked[ \t,]*$/i

/** 501 for a request body in a transfer coding other than `chunked` (RFC 9112 section 6.1). */
const TRANSFER_CODING_NOT_SUPPORTED = jsonRpcErrorReply(
  501,
  { code: RpcCode.InvalidRequest, message: 'Transfer coding not supported', data: { error: 'invalid_request', field: 'transfer-encoding' } },
  // The body is left unread: the connection is not used again.
  { connection: 'close' },
)

/** Lower-case field names listed in a `Connection` value, or `undefined` when there are none. */
function connectionTokens(value: string | null): Set<string> | undefined {
  if (!value) return undefined
  const names = new Set<string>()
  for (const token of value.split(',')) {
    const name = token.trim().toLowerCase()
    if (name) names.add(name)
  }
  return names
}

/** Content codings every `fetch` of Node (undici) since 20 decodes, when all the listed ones are. */
const FETCH_DECODES = new Set(['gzip', 'x-gzip', 'deflate', 'br'])

/**
 * What `fetch` did with a `Content-Encoding`: nothing to do (`none`: absent, or `identity`),
 * every coding decoded (`decoded`), or not known for sure (`unknown`: another coding, or an
 * empty list entry, which makes undici decode nothing).
 */
function codingOf(contentEncoding: string | null): 'none' | 'decoded' | 'unknown' {
  if (contentEncoding === null) return 'none'
  const codings = contentCodings(contentEncoding)
  if (codings.every((c) => c === 'identity')) return 'none'
  return codings.every((c) => FETCH_DECODES.has(c)) ? 'decoded' : 'unknown'
}

export {
  DEFAULT_IDENTITY_TTL_SECONDS,
  IDENTITY_HEADER,
  IDENTITY_TOKEN_TYPE,
  createIdentitySigner,
  createIdentityVerifier,
} from './identity.js'
export type {
  IdentityClaims,
  IdentityJwks,
  IdentityKey,
  IdentityNodeRequest,
  IdentityPreviousKey,
  IdentitySigner,
  IdentitySignerOptions,
  IdentityVerifier,
  IdentityVerifierOptions,
  VerifiedIdentity,
} from './identity.js'
export type { DispatchContext } from '../../pipeline/dispatcher.js'
