/**
 * Translation between Node's `http` objects and the dispatch pipeline, shared by the Express
 * and Fastify adapters (both hand the MCP SDK's `StreamableHTTPServerTransport` the raw
 * `ServerResponse`, so everything here works on the raw objects, never on a framework's
 * wrapper). No rule lives here.
 * @internal
 * @module
 */
import { type IncomingHttpHeaders, type IncomingMessage, type OutgoingHttpHeader, type OutgoingHttpHeaders, ServerResponse, validateHeaderName, validateHeaderValue } from 'node:http'
import { finished } from 'node:stream'
import { type CompiledTrustProxy, resolveClientAddress, schemeOf } from '../core/client-address.js'
import { type Reply, RpcCode, jsonRpcErrorReply } from '../core/reply.js'
import { logError } from '../errors.js'
import type { DispatchContext, DispatchRequest } from '../pipeline/dispatcher.js'
import type { TokenApi } from '../tokens/token-api.js'
import { isUnderBasePath, refusalAt, tokenApiMethods, tokenApiOwns } from '../tokens/token-api-paths.js'
import {
  CONNECTION_SPECIFIC_FIELDS,
  type Dispatched,
  attachToHead,
  watchFromStart,
  continueIfExpected,
  cutResponse,
  deferCuts,
  dispatchHeadersFor,
  headOutcome,
  headerValue,
  installHeadInterception as installOn,
  isHttp2Response,
  isZeroLength,
  mergeExposeHeaders,
  mergeVary,
  sameName,
  stampHead,
  whenClosed,
} from './head.js'
import { INVALID_HOST, canonicalHost, splitUrl } from './shared.js'
import { isClientDisconnect } from './client-error.js'

/**
 * The neutral request over a Node request: one object per request, which is also its own
 * header lookup over Node's lower-cased `IncomingHttpHeaders` (no closure per request).
 */
class NodeDispatchRequest implements DispatchRequest {
  constructor(
    readonly method: string,
    readonly path: string,
    readonly host: string | undefined,
    readonly origin: string,
    readonly clientAddress: string | undefined,
    private readonly raw: IncomingHttpHeaders,
    /** Every `Authorization` field, joined (see {@link readRawHeaders}). */
    private readonly authorization: string | undefined,
  ) {}

  get headers(): DispatchRequest['headers'] {
    return this
  }

  get(name: string): string | undefined {
    // Node keeps the first `Authorization` of a request and drops the others; a request with
    // two is refused (as the Web adapter, which sees them joined, refuses it), never served
    // with whichever came first.
    if (name === 'authorization') return this.authorization
    const value = this.raw[name]
    return typeof value === 'string' || value === undefined ? value : value.join(', ')
  }
}

/**
 * What Node's `headers` object cannot tell, read in one pass over `rawHeaders`: Node keeps the
 * first `Host` and the first `Authorization` of a request and drops the others. Returns every
 * `Authorization` field joined, as a `Headers` object joins them (so a request with two is
 * refused), or `null` for a request with more than one `Host` (RFC 9112 section 3.2: a server
 * MUST answer it 400; a proxy in front that routed by the last one must not see the dispatch
 * layer decide on the first).
 */
function readRawHeaders(headers: IncomingHttpHeaders, rawHeaders: readonly string[]): string | undefined | null {
  let hosts = 0
  let authorization: string | undefined
  let seen = 0
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!
    // Length first: no comparison of the other names, and no lower-cased copy of any.
    const length = name.length
    if (length === 4) {
      if (sameName(name, 'host') && ++hosts > 1) return null
    } else if (length === 13 && sameName(name, 'authorization')) {
      authorization = seen === 0 ? rawHeaders[i + 1]! : `${authorization}, ${rawHeaders[i + 1]!}`
      seen++
    }
  }
  return seen > 1 ? authorization : headers.authorization
}

/**
 * The authority a request names: HTTP/2's `:authority`, which HTTP/2 clients send instead of
 * `Host` (RFC 9113 section 8.3.1), else `Host`; an empty one names none (RFC 9112 section 3.2:
 * as a request without one).
 */
function authorityOf(headers: IncomingHttpHeaders): string | undefined {
  const authority = headers[':authority']
  return (typeof authority === 'string' && authority) || headers.host || undefined
}

/**
 * Whether a `Host` beside HTTP/2's `:authority` names another host than `authority` (the one
 * {@link authorityOf} read): RFC 9113 section 8.3.1 makes such a request malformed (400).
 * Without `:authority` the host is the `Host` itself: one comparison.
 */
function hostConflicts(headers: IncomingHttpHeaders, authority: string | undefined, protocol: 'http' | 'https'): boolean {
  const hostField = headers.host
  return !!hostField && hostField !== authority && canonicalHost(hostField, protocol) !== canonicalHost(authority!, protocol)
}

/**
 * The scheme of a request: the framework's `protocol` (Express's `req.protocol`, Fastify's
 * `request.protocol`, which follow their own trust-proxy settings), read as a scheme, else the
 * socket's. Behind a trusted proxy a framework hands on `X-Forwarded-Proto` as it came
 * (`HTTPS`, `ws`): `http` or `https` in any case is taken, anything else gives the socket's.
 */
export function requestProtocol(req: IncomingMessage, framework: unknown): 'http' | 'https' {
  if (framework === 'http' || framework === 'https') return framework
  return (typeof framework === 'string' ? schemeOf(framework) : undefined) ?? ((req.socket as { encrypted?: boolean } | null)?.encrypted ? 'https' : 'http')
}

/**
 * RFC 9112 section 3.2.2: an absolute-form target (`POST http://host/v1?x`, as a client talking
 * to a proxy sends it) names the host, and the Host header is then ignored; the target URI is
 * the target itself (section 3.3), its scheme included. Its scheme (lower case), its host, and
 * the rest as an origin-form target (`/v1?x`); `undefined` for an origin-form target, and for a
 * target of another scheme (`ftp://host/v1`), which is no path of an App (404), as Web runtimes
 * build no `Request` of it.
 * @internal
 */
export function absoluteForm(url: string): { scheme: 'http' | 'https'; host: string; target: string } | undefined {
  if (url.charCodeAt(0) === 47 /* / */) return undefined
  // The pattern matches `http` or `https` alone, in any case.
  const scheme = ABSOLUTE_FORM.exec(url)?.[1]?.toLowerCase() as 'http' | 'https' | undefined
  if (scheme === undefined) return undefined
  const { origin } = splitUrl(url)
  const rest = url.slice(origin.length)
  return { scheme, host: origin.slice(scheme.length + 3), target: rest[0] === '/' ? rest : `/${rest}` }
}

const ABSOLUTE_FORM = /^(https?):\/\//i

/**
 * Writes the scheme of an absolute-form target in lower case in `req.url` (and Express's
 * `req.originalUrl`), the rest as sent: `POST HTTP://weather.example.com/v1` goes on as
 * `http://weather.example.com/v1`. A scheme is case-insensitive, lower case its canonical form
 * (RFC 3986 section 3.1), and the dispatch layer reads it so; the handler must too, but
 * `@hono/node-server`, which the MCP SDK's Node transport builds its `Request` with, takes only
 * `http://` and `https://` as absolute-form, and answered an upper-case one an empty 400 after
 * the caller had been authenticated and charged. Express's router writes `req.url` again as it
 * leaves and enters a mount (`app.use('/mcp', mcpDispatch(…), handler)`), from the scheme and
 * host it read before the adapter ran: so such a request's `url` becomes an accessor that
 * lowers the scheme of every later write too. An origin-form target (almost every request) is
 * told by its first character, and left alone.
 * @internal
 */
export function lowerTargetScheme(req: { url?: string; originalUrl?: string }): void {
  const url = req.url
  if (url === undefined) return
  let current = lowerScheme(url)
  if (current === url) return
  Object.defineProperty(req, 'url', {
    configurable: true,
    enumerable: true,
    get: () => current,
    set: (value: string) => void (current = typeof value === 'string' ? lowerScheme(value) : value),
  })
  if (typeof req.originalUrl === 'string') req.originalUrl = lowerScheme(req.originalUrl)
}

/** `url` with the scheme of an absolute-form `http` or `https` target in lower case. */
function lowerScheme(url: string): string {
  if (url.charCodeAt(0) === 47 /* / */) return url
  const scheme = ABSOLUTE_FORM.exec(url)?.[1]
  return scheme === undefined || scheme === 'http' || scheme === 'https' ? url : scheme.toLowerCase() + url.slice(scheme.length)
}

/**
 * Whether `url` is an absolute-form target (`http://host/v1`) whose host no URL can hold
 * (`host:99999`, `[zz]`): what the adapters answer 400 `Invalid Host header`, for the Fastify
 * adapter's `frameworkErrors`, where Fastify refused the target before any hook ran.
 */
export function hasInvalidAbsoluteFormHost(url: string): boolean {
  const absolute = absoluteForm(url)
  return absolute !== undefined && canonicalHost(absolute.host, absolute.scheme) === undefined
}

/**
 * The neutral request of the pipeline, or `undefined` when its `Host` (or the `:authority` of an
 * HTTP/2 request), or the host of an absolute-form target, is not an authority a URL can hold
 * (the `Host` is checked beside such a target too, though the target names the host), or when
 * it has two `Host` fields, or a `Host` and an `:authority` that differ: the adapter then
 * answers 400 (`INVALID_HOST`), as a Web runtime refuses such a request before any handler
 * runs. An accepted host is read as the URL parser reads it (lower case, no default port), so
 * the App address is the one the Web adapter's `Request` gives.
 *
 * `url` is the full request target (Express: `originalUrl`, so a mount path stays part of the
 * path, as in the Web adapter). Its path is taken as it is: the framework routes the raw path,
 * so one with dot segments (`/v3/../v1`) is not a version path here (404), never approved as
 * `/v1` and then routed elsewhere. The client address is the socket peer, through `trustProxy`
 * only.
 */
export function toDispatchRequest(
  req: IncomingMessage,
  url: string,
  protocol: 'http' | 'https',
  trust: CompiledTrustProxy,
): DispatchRequest | undefined {
  // Node's `headers` is a getter: read once.
  const headers = req.headers
  const authorization = readRawHeaders(headers, req.rawHeaders ?? [])
  if (authorization === null) return undefined
  let host = authorityOf(headers)
  if (hostConflicts(headers, host, protocol)) return undefined
  const absolute = absoluteForm(url)
  if (absolute) {
    // The target names the host and the `Host` field's value is ignored (RFC 9112 section
    // 3.2.2), but a field with an invalid value is still 400 (section 3.2), as on Web runtimes.
    if (host !== undefined && canonicalHost(host, protocol) === undefined) return undefined
    host = absolute.host
    url = absolute.target
    protocol = absolute.scheme
  }
  if (host !== undefined) {
    host = canonicalHost(host, protocol)
    if (host === undefined) return undefined
  }
  let end = url.length
  const query = url.indexOf('?')
  if (query !== -1) end = query
  const hash = url.indexOf('#')
  if (hash !== -1 && hash < end) end = hash
  const path = url.slice(0, end) || '/'
  const forwardedFor = headers['x-forwarded-for']
  const method = req.method ?? 'GET'
  return new NodeDispatchRequest(
    // HTTP/1 methods arrive upper case (llhttp accepts no other); HTTP/2 ones may not.
    method === 'POST' || method === 'GET' ? method : method.toUpperCase(),
    path,
    host,
    `${protocol}://${host ?? ''}`,
    resolveClientAddress(
      req.socket?.remoteAddress,
      Array.isArray(forwardedFor) ? forwardedFor.join(', ') : forwardedFor,
      trust,
    ),
    headers,
    authorization,
  )
}


/**
 * Whether a request target is under the token API's `basePath`, as the API will see it: its
 * path with dot segments resolved (as `new URL` does for the API), so `/api/tokens/../x` is
 * not the API's and goes on untouched, and `/api/x/../tokens` is. The raw target decides
 * alone (no allocation) for an origin-form target with no dot segment, as almost every
 * request is; an absolute-form one (`http://host/api/tokens`) is read by its path.
 */
export function isTokenApiPath(api: TokenApi, url: string): boolean {
  const path = tokenApiPathname(url)
  return path !== undefined && isUnderBasePath(path, api.basePath)
}

/** The path of a request target as the token API reads it (dot segments resolved); `undefined` for none. */
function tokenApiPathname(url: string): string | undefined {
  let end = url.indexOf('?')
  if (end === -1) end = url.length
  const raw = url.slice(0, end)
  let target = url
  if (url.charCodeAt(0) === 47 /* / */) {
    if (!NEEDS_PARSING.test(raw)) return raw
  } else {
    const absolute = absoluteForm(url)
    if (absolute === undefined) return undefined
    target = absolute.target
  }
  // Appended to an origin, as the API's URL is built (`toWebRequest`): `//x/…` is a path here.
  try {
    return new URL(`http://token-api.invalid${target}`).pathname
  } catch {
    return undefined
  }
}

/**
 * What makes a target's path other than as written once parsed: a `.` or `..` segment, written
 * out or percent-encoded (`%2e`), a backslash (read as `/`), a fragment. `/.well-known/…` is none.
 */
const NEEDS_PARSING = /[\\#]|\/(?:\.|%2e){1,2}(?=\/|$)/i

const BAD_HOST = JSON.stringify({ error: 'invalid_request', message: 'host: is not a valid Host header', field: 'host' })
const UNSERIALIZABLE_MESSAGE = 'body: a body parser read it, and it cannot be written back as JSON (nested too deep, or a value JSON cannot hold)'
const BAD_PARSED_BODY = JSON.stringify({ error: 'invalid_request', message: UNSERIALIZABLE_MESSAGE, field: 'body' })
const NOT_FOUND = JSON.stringify({ error: 'not_found', message: 'Not found' })
const UNAVAILABLE = JSON.stringify({ error: 'temporarily_unavailable', message: 'Service unavailable' })

/**
 * Answers a request under the token API's `basePath` (see {@link isTokenApiPath}), always:
 * the body may be spent. The client address is the socket peer, through `trust`;
 * `frameworkRequest` (Express's `req`, Fastify's `request`) goes to the API's
 * `authenticateSession` as `info.frameworkRequest`. A failure
 * under the answer (the socket) ends the response: 503 as the API answers its own failures,
 * or the connection closed when the head is out.
 */
export async function answerTokenApi(api: TokenApi, source: WebRequestSource, trust: CompiledTrustProxy, frameworkRequest: unknown): Promise<void> {
  try {
    await answer(api, source, trust, frameworkRequest)
  } catch {
    if (source.res.headersSent) cutResponse(source.res)
    else writeJson(source.res, 503, UNAVAILABLE, { 'retry-after': '1' })
  }
}

async function answer(api: TokenApi, source: WebRequestSource, trust: CompiledTrustProxy, frameworkRequest: unknown): Promise<void> {
  const { req } = source
  // The API reads every body it is sent: `100 Continue` at once, where `checkContinue` was handed here.
  continueIfExpected(source.res)
  const forwardedFor = req.headers['x-forwarded-for']
  const clientAddress = resolveClientAddress(
    req.socket?.remoteAddress,
    Array.isArray(forwardedFor) ? forwardedFor.join(', ') : forwardedFor,
    trust,
  )
  // A method `fetch` forbids (`TRACE`): no `Request` can carry it, and the API serves it on no
  // path. Its Host checked as any request's, it is answered here, as the API answers a method it
  // does not serve, without asking the API or a wrapper of it (one that answers OPTIONS itself
  // must not take it for a preflight).
  const forbidden = FETCH_FORBIDDEN.test(req.method ?? '')
  // A `Host` beside HTTP/2's `:authority` that names another host: malformed, as `mcpDispatch`
  // answers it (the API would otherwise be asked for the `:authority` host, past its `hosts`).
  if (hostConflicts(req.headers, authorityOf(req.headers), source.protocol)) {
    writeJson(source.res, 400, BAD_HOST)
    return
  }
  let request: Request
  try {
    // A Host the URL parser refuses (`a b`, `[::1`, a port past 65535) is the client's error;
    // so is a body a parser took that cannot be written back as JSON.
    request = toWebRequest(forbidden ? { ...source, method: 'GET' } : source)
  } catch (error) {
    writeJson(source.res, 400, error instanceof UnserializableBody ? BAD_PARSED_BODY : BAD_HOST)
    return
  }
  if (forbidden) {
    // Not the API's (a host outside its `hosts`, a Host that moved the path): the 404 any
    // method gets there.
    if (!tokenApiOwns(api, request)) {
      writeJson(source.res, 404, NOT_FOUND)
      return
    }
    const refusal = refusalAt(tokenApiMethods(api, new URL(request.url).pathname))
    writeJson(source.res, refusal.status, JSON.stringify(refusal.body), refusal.allow === undefined ? undefined : { allow: refusal.allow })
    return
  }
  const response = await api(request, clientAddress === undefined ? { frameworkRequest } : { clientAddress, frameworkRequest })
  // Not the API's after all (a host outside its `hosts`, or a Host that moved the path):
  // answered as the API answers an unknown path, since the body may be spent.
  if (!response) {
    writeJson(source.res, 404, NOT_FOUND)
    return
  }
  // Whole, with its length: the API's answers are small JSON documents, never streamed.
  const body = response.body === null ? undefined : Buffer.from(await response.arrayBuffer())
  const headers = webHead(source.res, response)
  if (body !== undefined) headers['content-length'] = body.byteLength
  source.res.writeHead(response.status, headers)
  source.res.end(body)
}

/** The methods whose `Request` `fetch` refuses to make. */
const FETCH_FORBIDDEN = /^(?:CONNECT|TRACE|TRACK)$/i

function writeJson(res: ServerResponse, status: number, body: string, headers?: OutgoingHttpHeaders): void {
  res.writeHead(status, { 'content-type': 'application/json', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body), ...headers })
  res.end(body)
}

/**
 * Removes every header set on a raw response whose head is not written yet, and the reason
 * phrase: one the handler set, or the one its refused `writeHead` left (Node sets it before it
 * checks the headers), would otherwise go out on the status line of the answer written next
 * (`502 OK`).
 */
export function clearHeaders(res: ServerResponse): void {
  for (const name of res.getHeaderNames()) res.removeHeader(name)
  // Empty: Node's `writeHead` fills in its status's phrase (HTTP/2 has none, and warns when set).
  if (res instanceof ServerResponse) res.statusMessage = ''
}

/**
 * Headers of a body or of a session, which only the answer they came with may carry: never put
 * back on the 502 of a failed handler (a `Content-Encoding` over its JSON body, an
 * `Mcp-Session-Id` never pinned).
 */
const ANSWER_HEADERS = new Set([
  'content-type',
  'content-length',
  'content-encoding',
  'content-range',
  'content-location',
  'transfer-encoding',
  'etag',
  'last-modified',
  'mcp-session-id',
])

/**
 * Of the headers set before the MCP handler ran (the platform's middleware: CORS, security
 * headers, a request id), those the 502 of a failed handler keeps; `undefined` when none.
 * @internal
 */
export function platformHeaders(headers: Readonly<Record<string, OutgoingHttpHeader | undefined>>): OutgoingHttpHeaders | undefined {
  let kept: OutgoingHttpHeaders | undefined
  for (const name in headers) {
    const value = headers[name]
    const lower = name.toLowerCase()
    if (value === undefined || ANSWER_HEADERS.has(lower)) continue
    // Express's own (`X-Powered-By: Express`): the adapters' own answers carry none.
    if (lower === 'x-powered-by' && value === 'Express') continue
    ;(kept ??= {})[name] = value
  }
  return kept
}

/**
 * Sets `headers` (what {@link platformHeaders} kept) on a raw response whose head is not written.
 * One Node refuses (a value with a character outside Latin-1, set with Fastify's `reply.header`,
 * which checks nothing) is left out and given to `report` (the adapter's `onError`), never
 * thrown: the throw would leave a hijacked reply unanswered.
 * @internal
 */
export function setHeaders(
  res: ServerResponse,
  headers: OutgoingHttpHeaders | undefined,
  report: (error: unknown, context: string) => void = logError,
): void {
  if (headers === undefined) return
  for (const name in headers) {
    try {
      res.setHeader(name, headers[name]!)
    } catch (error) {
      report(error, `a header the platform set was left out (Node refuses it): ${JSON.stringify(name.slice(0, 64))}`)
    }
  }
}

/**
 * A `Vary` or `Access-Control-Expose-Headers` in `headers` (about to be given to `writeHead`,
 * which would replace one set before) joined with the one the platform set on `res` ahead of
 * the adapter (`cors({ exposedHeaders })`: its names stay readable on refusals too).
 */
function joinPlatformVary(res: ServerResponse, headers: OutgoingHttpHeaders): void {
  if (headers.vary !== undefined && res.hasHeader('vary')) headers.vary = mergeVary(res.getHeader('vary'), headers.vary)
  const expose = headers['access-control-expose-headers']
  if (expose !== undefined && res.hasHeader('access-control-expose-headers')) {
    headers['access-control-expose-headers'] = mergeExposeHeaders(res.getHeader('access-control-expose-headers'), expose)
  }
}

/**
 * The head fields of `reply` on `res`: joined with the platform's `Vary` and
 * `Access-Control-Expose-Headers`, and an explicit length, as a web `Response` with a string
 * body gets, never chunked encoding.
 */
function replyHeaders(res: ServerResponse, reply: Reply): OutgoingHttpHeaders {
  const headers: OutgoingHttpHeaders = { ...reply.headers }
  joinPlatformVary(res, headers)
  if (reply.body !== null) headers['content-length'] = Buffer.byteLength(reply.body)
  return headers
}

/**
 * Writes a dispatch-layer {@link Reply} on a raw response, byte for byte; its `Vary` and
 * `Access-Control-Expose-Headers` join those the platform set on the response before (a
 * `writeHead` header would replace them).
 */
export function writeReply(res: ServerResponse, reply: Reply): void {
  res.writeHead(reply.status, replyHeaders(res, reply))
  res.end(reply.body ?? undefined)
}

type HeldMethod = 'writeHead' | 'write' | 'end' | 'flushHeaders'
const HELD: readonly HeldMethod[] = ['writeHead', 'write', 'end', 'flushHeaders']
/** What Node refuses once the head is out; refused the same way while it is held. */
type GuardedMethod = 'setHeader' | 'appendHeader' | 'removeHeader'
const GUARDED: readonly [GuardedMethod, string][] = [
  ['setHeader', 'set'],
  ['appendHeader', 'append'],
  ['removeHeader', 'remove'],
]
type Method = (...args: unknown[]) => unknown

/** The reason phrase a response has set, on HTTP/1 (HTTP/2 has none, and warns when asked). */
function reasonOf(res: ServerResponse): string | undefined {
  return res instanceof ServerResponse ? res.statusMessage : undefined
}

/** Node's `ERR_HTTP_HEADERS_SENT`, for a call Node would refuse were the held head out. */
function headersSentError(action: string): Error {
  return Object.assign(new Error(`Cannot ${action} headers after they are sent to the client`), { code: 'ERR_HTTP_HEADERS_SENT' })
}

/** Node's default high-water mark of a writable stream, for a response that tells none. */
const DEFAULT_HIGH_WATER_MARK = 16_384

/** A written chunk's length: bytes, or a string's UTF-16 code units (close enough for back-pressure). */
function chunkLength(chunk: unknown): number {
  return typeof chunk === 'string' ? chunk.length : ArrayBuffer.isView(chunk) ? chunk.byteLength : 0
}

/**
 * Puts the dispatch headers on a raw response and makes sure the dispatcher records the
 * outcome (`decision.complete`) before the client can see the answer: the status and the
 * `Mcp-Session-Id` the MCP handler assigns are read from the response head.
 *
 * - A request that already belongs to a session, or any request with a synchronous session
 *   store (memory): the prototype-level `writeHead` (see `installHeadInterception`) stamps the
 *   head and records the outcome, with no hold and no per-request closure.
 * - A new session with an asynchronous store (Redis): the first `writeHead`, `write`, `end`
 *   or `flushHeaders` and every call after it are queued, in order, until the pin is stored,
 *   then replayed on the real methods. So the next request of a new session finds its pin on
 *   every instance, as with the Web adapter, which awaits `complete` before returning the
 *   response. (Corking the socket cannot do this: Node fully uncorks it on `end()`.) When the
 *   pin cannot be stored, they are dropped and the store's 503 is written in their place (see
 *   `holdUntilPinned`).
 *
 * The dispatch headers (version, rate limit, CORS) win over the handler's headers of the same
 * name, as in the Web adapter.
 */
export function holdResponseHead(
  res: ServerResponse,
  method: string | undefined,
  decision: Dispatched,
  onError: (error: unknown, context: string) => void,
  platform?: HeaderSource,
): void {
  if (!attachToHead(res, ServerResponse.prototype, decision)) holdUntilPinned(res, decision, onError, platform ?? res)
  // A GET's event stream may wait for its first event to send its head: watched from now. (The
  // method as the adapter read it: a read of Express's response would cost V8 a cache miss.)
  if (method === 'GET') watchFromStart(res, decision)
}

/** Where the headers the platform set before the handler are read (a Fastify reply, or the response). */
interface HeaderSource {
  getHeaders(): Readonly<Record<string, OutgoingHttpHeader | undefined>>
}

/** Installs the `writeHead` interception on `ServerResponse.prototype` (see head.ts). */
export function installHeadInterception(): void {
  installOn(ServerResponse.prototype)
}

/**
 * The connection-specific fields Node's HTTP/2 refuses in a response head; `TE` only other than
 * `trailers`. Not `Connection`: the compatibility response drops it (with a warning) when set.
 */
const REFUSED_ON_HTTP2 = new Set(CONNECTION_SPECIFIC_FIELDS.filter((name) => name !== 'connection'))

/** What Node's HTTP/2 throws for a connection-specific field in a response head. */
function connectionHeaderError(name: string): TypeError {
  return Object.assign(new TypeError(`HTTP/1 Connection specific headers are forbidden: ${JSON.stringify(name)}`), {
    code: 'ERR_HTTP2_INVALID_CONNECTION_HEADERS',
  })
}

function refusedOnHttp2(name: string, value: unknown): boolean {
  const lower = name.toLowerCase()
  return REFUSED_ON_HTTP2.has(lower) && (lower !== 'te' || String(value) !== 'trailers')
}

/**
 * Throws what Node's `writeHead` throws for a status out of range, a reason phrase or a header
 * it cannot write (the validators are Node's own), before a held head is taken. On HTTP/2
 * (`res` given, not a `node:http` response), a connection-specific field too, among `headers`
 * or set on `res`: the compatibility `writeHead` sets its headers on the response before its
 * `respond()` refuses them, so the head would be taken (the pin stored, the hold done) and the
 * answer that follows (the 502) would go out without the dispatch headers, wiped with the
 * handler's.
 */
function checkHead(status: number, reason: unknown, headers: unknown, res?: Pick<ServerResponse, 'getHeaderNames' | 'getHeader'>): void {
  if ((status | 0) < 100 || (status | 0) > 999) {
    throw Object.assign(new RangeError(`Invalid status code: ${status}`), { code: 'ERR_HTTP_INVALID_STATUS_CODE' })
  }
  if (typeof reason === 'string') validateHeaderValue('statusMessage', reason)
  const http2 = res !== undefined && isHttp2Response(res)
  if (http2) {
    for (const name of res.getHeaderNames()) if (refusedOnHttp2(name, res.getHeader(name))) throw connectionHeaderError(name)
  }
  if (headers === undefined || headers === null || typeof headers !== 'object') return
  const check = (name: unknown, value: unknown) => {
    // An empty name is skipped where setHeader headers are merged (Node's slow path).
    if (name === '' || name === undefined || name === null) return
    validateHeaderName(String(name))
    validateHeaderValue(String(name), value as string)
    if (http2 && refusedOnHttp2(String(name), value)) throw connectionHeaderError(String(name))
  }
  if (!Array.isArray(headers)) {
    for (const name in headers) check(name, (headers as Record<string, unknown>)[name])
  } else if (headers.length > 0 && Array.isArray(headers[0])) {
    for (const pair of headers as unknown[][]) check(pair[0], pair[1])
  } else {
    for (let i = 0; i < headers.length; i += 2) check(headers[i], headers[i + 1])
  }
}

/**
 * Responses whose `end` was called and returned (made since or not): queued behind a head held
 * for the session's pin, or taken by a wrapper that makes it later (`compression` ends its zlib
 * stream first), as {@link noteEnds} sees it.
 */
const endCalled = new WeakSet<ServerResponse>()

/**
 * Whether the handler ended `res`: `end` was made (`writableEnded`), or called and queued behind
 * a held head or a wrapper (see {@link noteEnds}). Such an answer is whole, and goes out whole.
 * @internal
 */
export function answerEnded(res: ServerResponse): boolean {
  return res.writableEnded || endCalled.has(res)
}

/**
 * Whether a handler's `error` is its client's leaving and the client of `res` has gone (its
 * connection closed; on HTTP/2, whose compatibility response has no `destroyed`, its stream):
 * not reported, since any client causes one at will (see {@link isClientDisconnect}).
 * @internal
 */
export function clientLeft(res: ServerResponse, error: unknown): boolean {
  const gone = res.destroyed === true || (res as { stream?: { destroyed?: boolean } }).stream?.destroyed === true
  return gone && isClientDisconnect(error)
}

/**
 * Settles the answer of a handler that failed, when it has one: an answer the handler ended
 * goes out whole, whatever it did after (Node may still be writing it: a destroy would cut it);
 * one begun and not ended is cut, so the client does not take it for whole. A held head reports
 * `headersSent` too, and an `end` behind it is an end (see {@link holdUntilPinned}). `false`
 * when nothing of an answer went out: the 502 is the caller's to write.
 * @internal
 */
export function settleFailedAnswer(res: ServerResponse): boolean {
  if (answerEnded(res)) return true
  if (!res.headersSent) return false
  cutResponse(res)
  return true
}

/**
 * Notes each call of `res.end` from now on, for {@link answerEnded}, where `end` is not Node's
 * own (a wrapper such as `compression`'s, which calls it later): a handler's `end` then counts
 * as made once it returns (one that throws, such as a head Node refuses, ended nothing). Nothing
 * for a response whose `end` is Node's own, whose `writableEnded` says it (no allocation on that
 * path).
 * @internal
 */
export function noteEnds(res: ServerResponse): void {
  const end = res.end
  if (end === ServerResponse.prototype.end || typeof end !== 'function') return
  res.end = function noted(this: ServerResponse, ...args: unknown[]) {
    // A head Node would refuse is refused here, before a wrapper's `writeHead` hook makes
    // anything of it (`compression()` would start its gzip stream, and the 502 that follows
    // would go through it under no `Content-Encoding`).
    if (!res.headersSent) checkHead(res.statusCode, reasonOf(res), undefined, res)
    // Counted once it returned: an `end` that threw (a head Node refuses) ended nothing, and the
    // answer that follows must still be sent.
    const ended = (end as (...rest: unknown[]) => ServerResponse).apply(this, args)
    endCalled.add(res)
    return ended
  } as ServerResponse['end']
}

/**
 * The states of a held response: not begun, head held until the pin is stored, passed through,
 * and replaced (the pin could not be stored: the 503 went out instead, and the handler's calls
 * are dropped).
 */
const IDLE = 0
const HOLDING = 1
const DONE = 2
const REPLACED = 3

/**
 * The hold of `holdResponseHead` for a new session on an asynchronous store; also the path
 * of responses whose `writeHead` another middleware replaced on the instance before
 * `mcpDispatch` ran (`on-headers`, as morgan, response-time or express-session use it) or that
 * is not node:http's (HTTP/2 compatibility), where the calls are intercepted on the instance.
 *
 * Middleware after `mcpDispatch` may wrap the same methods (`compression` wraps `write`,
 * `end` and `writeHead`, keeps references to the ones it found, here the wrappers, and calls
 * them after the head). So:
 * - once the head is replayed (`DONE`), a wrapper only forwards to the method it replaced,
 *   and only a slot that still holds one of these wrappers gets its method back, never one a
 *   later middleware installed;
 * - while the head is held, the response is what it would be were the head out: it reports
 *   `headersSent` (so no one writes a head again, Express's final handler does not answer over
 *   it, and Fastify does not send over it), and a second `writeHead`, `setHeader`,
 *   `appendHeader` or `removeHeader` throws `ERR_HTTP_HEADERS_SENT` at once, as Node does.
 * None of this exists for a response that never reaches this path.
 */
function holdUntilPinned(
  res: ServerResponse,
  decision: Dispatched,
  onError: (error: unknown, context: string) => void,
  platform: HeaderSource,
): void {
  const target = res as unknown as Record<HeldMethod | GuardedMethod, Method>
  // The methods as the response has them now (usually its prototype's). Restoring assigns them
  // back rather than deleting the patches: a `delete` would turn the response object into a
  // slow dictionary-mode object for the rest of its life.
  const originals = HELD.map((name) => target[name])
  const wrappers: Method[] = []
  let guarded: Method[] | undefined
  let guards: Method[] | undefined
  let implicitHeader: Method | undefined
  let implicitGuard: Method | undefined
  let state = IDLE
  let queue: Array<[HeldMethod, unknown[]]> | undefined
  // A cut asked for while the head was held (see `hold`).
  let cutOnRelease = false
  // The bytes of the held writes, answered with back-pressure past the response's high-water
  // mark as Node would: a writer that waits for `drain` (a proxied upstream's body) is not read
  // into memory for as long as the store takes, whether or not the client reads.
  let heldBytes = 0
  let owesDrain = false
  // What the platform had set when the dispatch layer let the request through (its CORS, a
  // request id), kept on the 503 that may replace the answer of a new session on an
  // asynchronous store (the only answer that can be replaced).
  const before = decision.context.sessionId === undefined && !decision.synchronousPins ? platformHeaders(platform.getHeaders()) : undefined

  const replay = (name: HeldMethod, args: unknown[]) => originals[HELD.indexOf(name)]!.apply(res, args)
  /** Whether Node has the head (stored or sent), whatever the accessor of a hold says. */
  const headTaken = () => Reflect.get(Object.getPrototypeOf(res) as object, 'headersSent', res) === true

  /**
   * Checks an implicit head as Node would write it now (`writeHead(res.statusCode)`) and sets the
   * dispatch headers it will carry; answers its status and reason.
   */
  function stampImplicitHead(): { status: number; reason: string | undefined } {
    const implicit = { status: res.statusCode, reason: reasonOf(res) }
    checkHead(implicit.status, implicit.reason, undefined, res)
    const headers = dispatchHeadersFor(res, decision.headers)
    for (const name in headers) res.setHeader(name, headers[name]!)
    return implicit
  }

  /** Passes every call through from now on; gives back the slots no one wrapped since. */
  function finish(): void {
    state = DONE
    deferCuts(res, undefined)
    for (let i = 0; i < HELD.length; i++) if (target[HELD[i]!] === wrappers[i]) target[HELD[i]!] = originals[i]!
    if (guards === undefined) return
    for (let i = 0; i < GUARDED.length; i++) if (target[GUARDED[i]![0]] === guards[i]) target[GUARDED[i]![0]] = guarded![i]!
    const slots = res as unknown as { _implicitHeader?: Method }
    if (implicitGuard !== undefined && slots._implicitHeader === implicitGuard) slots._implicitHeader = implicitHeader
  }

  /**
   * Sends `failure` (the 503 of a session store that could not store the new session's pin) in
   * place of the handler's answer, whose head is not out: none of its headers (its
   * `Mcp-Session-Id` above all), and its calls from now on dropped, as on a response whose
   * client has gone. Written on the response's own methods, past any wrapper of a later
   * middleware, which has seen nothing of it.
   */
  function replaceWith(failure: Reply): void {
    // Set when the answer was held (`begin`), which is all `replaceWith` follows.
    const dropped = queue!
    queue = undefined
    state = REPLACED
    // The 503 is a whole answer in place of the held one: not cut, whatever the handler did.
    deferCuts(res, undefined)
    try {
      clearHeaders(res)
      setHeaders(res, before, onError)
      originals[0]!.call(res, failure.status, replyHeaders(res, failure))
      // The body on the response's own `write`, then `end` with none: HTTP/2's `end(chunk)`
      // writes its chunk through `this.write`, a later middleware's wrapper (`compression()`'s)
      // or these, which drop it now.
      if (failure.body !== null) originals[1]!.call(res, failure.body)
      originals[2]!.call(res)
    } catch (error) {
      onError(error, 'handler')
      cutResponse(res)
    }
    for (const [name, args] of dropped) drop(name, args)
    payDrain()
  }

  /** What the real methods answer: `write` true, `flushHeaders` nothing, others `res`. */
  function heldAnswer(name: HeldMethod): unknown {
    return name === 'write' ? true : name === 'flushHeaders' ? undefined : res
  }

  /** Holds a call until the pin is stored; a `write` past the high-water mark answers `false`, and `drain` follows the replay. */
  function enqueue(name: HeldMethod, args: unknown[]): unknown {
    if (name === 'end') endCalled.add(res)
    queue!.push([name, args])
    if (name !== 'write') return heldAnswer(name)
    heldBytes += chunkLength(args[0])
    if (heldBytes < (res.writableHighWaterMark || DEFAULT_HIGH_WATER_MARK)) return true
    owesDrain = true
    return false
  }

  /** Tells a writer held back by `enqueue` to go on, once its calls are replayed or dropped and Node owes it no `drain` of its own. */
  function payDrain(): void {
    if (!owesDrain) return
    // HTTP/2's compatibility response has neither `destroyed` nor `writableNeedDrain`: its stream's.
    const stream = (res as { stream?: { destroyed?: boolean; writableNeedDrain?: boolean } }).stream
    const writable = stream ?? res
    if (writable.destroyed !== true && writable.writableNeedDrain !== true) res.emit('drain')
  }

  /**
   * A call of the handler's dropped once its answer was replaced. Its callback is not left
   * waiting: a `write`'s gets the error of a stream destroyed (as Node gives it when the client
   * has gone), an `end`'s is called once the 503 has been written.
   */
  function drop(name: HeldMethod, args: unknown[]): unknown {
    const callback = args[args.length - 1]
    if (typeof callback === 'function') {
      if (name === 'write') {
        const error = Object.assign(new Error('Cannot call write after a stream was destroyed'), { code: 'ERR_STREAM_DESTROYED' })
        process.nextTick(callback as (error: Error) => void, error)
      } else if (name === 'end') {
        if (res.writableFinished) process.nextTick(callback as () => void)
        else res.once('finish', callback as () => void)
      }
    }
    return heldAnswer(name)
  }

  /** From the held head on, the response behaves as one whose head is out. */
  function hold(): void {
    state = HOLDING
    // A cut asked for meanwhile (the handler failed after its head) waits for the head to go
    // out, with what the handler wrote after it, as it would with nothing held.
    deferCuts(res, () => void (cutOnRelease = true))
    // An own accessor, left in place when done (a `delete` would cost what it costs above): it
    // then reads the response's own `headersSent`.
    Object.defineProperty(res, 'headersSent', {
      configurable: true,
      get: () => state === HOLDING || headTaken(),
    })
    guarded = GUARDED.map(([name]) => target[name])
    guards = GUARDED.map(([name, action], i) => {
      const guard = function guard(this: unknown, ...args: unknown[]) {
        if (state === HOLDING) throw headersSentError(action)
        return guarded![i]!.apply(this, args)
      }
      target[name] = guard
      return guard
    })
    // Middleware that asks `_header` rather than `headersSent` (express-session's `end`) makes
    // the head Node's way, `_implicitHeader()`, which would reach the held `writeHead` and throw:
    // while held, the head is made already, and that does nothing.
    const slots = res as unknown as { _implicitHeader?: Method }
    if (typeof slots._implicitHeader === 'function') {
      implicitHeader = slots._implicitHeader
      implicitGuard = function implicitHeld(this: unknown, ...args: unknown[]) {
        if (state === HOLDING) return undefined
        return implicitHeader!.apply(this, args)
      }
      slots._implicitHeader = implicitGuard
    }
  }

  function begin(first: HeldMethod, args: unknown[]): unknown {
    // The head was stored past this wrapper already (the handler's own `writeHead` went through
    // a later middleware's hook that does not call the one it replaced): it is held with this
    // call, without the dispatch headers, which nothing can add to it now.
    let pastUs = headTaken()
    if (!pastUs && first !== 'writeHead' && target.writeHead !== wrappers[0]) {
      // The head is implicit and a middleware after `mcpDispatch` hooked `writeHead`
      // (`on-headers`: `compression()` sets its encoding and stream there). Node would call that
      // hook only when the held head is replayed, after the body went by the stream it had not
      // made yet (a plain body under a gzip header): take the head through it now, as Node does
      // at once when nothing is held. The dispatch headers are set first, whatever the hook does.
      stampImplicitHead()
      ;(target.writeHead as Method).call(res, res.statusCode)
      if (state === HOLDING) return enqueue(first, args)
      if (state === DONE) return replay(first, args)
      // The hook wrote the head itself, past this wrapper, with the dispatch headers in it. On
      // HTTP/1 Node has only stored it: it leaves with the first `write`, `end` or
      // `flushHeaders`, which is held below like any other until the pin is stored (on HTTP/2
      // the compatibility `writeHead` sends it at once, and only the body is held).
      pastUs = headTaken()
    }
    let status = res.statusCode
    let sessionId: string | undefined
    // The status and reason of an implicit head, as Node would write them now: a change the
    // handler makes while the head is held is too late, as it is when nothing is held.
    let implicit: { status: number; reason: string | undefined } | undefined
    // The handler's own `writeHead` headers (for the type of a 404).
    let given: unknown
    if (pastUs) {
      // Node has stored the head: checked by Node, and stamped above when this wrapper's call
      // of the hook made it.
    } else if (first === 'writeHead') {
      status = Number(args[0])
      const headerIndex = typeof args[1] === 'string' ? 2 : 1
      // What Node would refuse is refused before the pin is stored, as the pin of a head
      // written at once is stored only once Node has taken it (see head.ts).
      checkHead(status, headerIndex === 2 ? args[1] : undefined, args[headerIndex], res)
      given = args[headerIndex]
      const head = stampHead(given, dispatchHeadersFor(res, decision.headers, given))
      sessionId = head.sessionId
      args = [...args]
      args[headerIndex] = head.headers
    } else {
      // The head is implicit (`write`, `end`, `flushHeaders`).
      implicit = stampImplicitHead()
    }
    if (sessionId === undefined) sessionId = headerValue(res.getHeader('mcp-session-id'))
    const pending = decision.complete(headOutcome(res, decision, status, sessionId, given))
    // A request that already belongs to a session only ends its pin (DELETE, or a 404 of the
    // handler's), which needs no answer before the response goes out: held for new sessions only.
    if (!pending || decision.context.sessionId !== undefined) {
      finish()
      return replay(first, args)
    }
    hold()
    queue = []
    const answer = enqueue(first, args)
    void pending.then((failure) => {
      // Replaced where Node does not have the head yet (a hook that wrote it past this wrapper
      // has it: that answer goes out, the failure reported).
      if (failure !== undefined && !pastUs) {
        replaceWith(failure)
        return
      }
      finish()
      try {
        if (implicit !== undefined) {
          res.statusCode = implicit.status
          if (implicit.reason !== undefined) res.statusMessage = implicit.reason
        }
        for (const [name, callArgs] of queue!) replay(name, callArgs)
      } catch (error) {
        // A call the real response refuses (a head Node cannot write): the answer is broken; end it.
        onError(error, 'handler')
        cutOnRelease = true
      }
      queue = undefined
      if (cutOnRelease) {
        cutResponse(res)
        return
      }
      payDrain()
    })
    return answer
  }

  for (let i = 0; i < HELD.length; i++) {
    const name = HELD[i]!
    const wrapper = function held(this: unknown, ...args: unknown[]) {
      if (state === DONE) return originals[i]!.apply(this, args)
      if (state === IDLE) return begin(name, args)
      if (state === REPLACED) return drop(name, args)
      if (name === 'writeHead') throw headersSentError('write')
      return enqueue(name, args)
    }
    wrappers.push(wrapper)
    target[name] = wrapper
  }
}

/** Options of {@link toWebRequest}. */
export interface WebRequestSource {
  req: IncomingMessage
  res: ServerResponse
  /** The request target including any mount path. */
  url: string
  /** `http` or `https`: see {@link requestProtocol}. */
  protocol: 'http' | 'https'
  /** A body the framework already parsed (the raw stream is then spent). */
  parsedBody?: unknown
  /** The method to ask with, where not the request's own. */
  method?: string
}

/**
 * A web `Request` for a raw Node request, for web-standard handlers (the proxy): the body
 * streams from the socket unless the framework already consumed it; the signal aborts when
 * the client goes away before the response is finished.
 */
export function toWebRequest(source: WebRequestSource): Request {
  const { req, res } = source
  const controller = new AbortController()
  // Not `writableFinished`: HTTP/2's compatibility response reads as finished once its stream
  // is reset. A client gone while the dispatcher decided (asynchronous stores) closed the
  // response before this listener: aborted at once, or the upstream would be asked, and a
  // stream kept, for nobody.
  let abandonBody: (() => void) | undefined
  // Node's Request follows `controller.signal` through a weak reference to a controller of its
  // own, which lives as long as the Request: a handler that kept `request.signal` alone (an
  // event stream ending on abort) and let the Request go never heard the client leave once a
  // garbage collection took it (the adapters' frames drop it once optimized). This listener
  // holds the Request until the response closes.
  let request: Request | undefined
  whenClosed(res, () => {
    if (!res.writableEnded) controller.abort()
    abandonBody?.()
    request = undefined
  })
  const headers = new Headers()
  const raw = req.rawHeaders
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!
    if (name.charCodeAt(0) !== 58 /* ':' (HTTP/2 pseudo-header) */) headers.append(name, raw[i + 1]!)
  }
  const method = (source.method ?? req.method ?? 'GET').toUpperCase()
  let body: BodyInit | null = null
  if (method !== 'GET' && method !== 'HEAD') {
    const consumed = req.readableEnded || (req as { readableDidRead?: boolean }).readableDidRead === true
    if (!consumed) {
      const stream = bodyStream(req)
      body = stream.body
      abandonBody = stream.abandon
    }
    // A request that sent no body (HTTP/1.1 framing: no length, or 0) has none to pass on, even
    // where a parser set one (`express.json()` gives `{}`: a DELETE would go on as `{}`).
    else if (source.parsedBody !== undefined && !sentNoBody(req)) body = serializeParsedBody(source.parsedBody, headers)
  }
  const init: RequestInit & { duplex?: 'half' } = { method, headers, body, signal: controller.signal }
  if (body !== null) init.duplex = 'half'
  // The URL the dispatcher read (`toDispatchRequest`), absolute-form targets included.
  const absolute = absoluteForm(source.url)
  // The target's authority is the request's host (RFC 9112 section 3.2.2: the Host field is
  // then ignored): the handler, and the token API's `hosts`, read the one the dispatcher read.
  if (absolute !== undefined) headers.set('host', absolute.host)
  const host = absolute?.host ?? authorityOf(req.headers) ?? 'localhost'
  request = new Request(`${absolute?.scheme ?? source.protocol}://${host}${absolute?.target ?? source.url}`, init)
  return request
}

/** Bytes of a request body queued in {@link bodyStream} before the socket is paused. */
const BODY_HIGH_WATER_MARK = 65_536

/**
 * The body of a raw Node request as a web stream, which pauses the request while its reader is
 * behind. Not `Readable.toWeb`: on Node 20 its stream, cancelled before the body has arrived (the
 * token API refusing a `Content-Length` over its limit), still hands it the next chunk, and its
 * `data` listener throws "Controller is already closed" where nothing can catch it: the process
 * ended. Cancelled, this one lets go of the request and drains the rest of the body unread, so
 * the answer is written on a connection that stays usable. A request that ends early (the
 * client went away) errors the stream.
 */
function bodyStream(req: IncomingMessage): { body: ReadableStream<Uint8Array>; abandon: () => void } {
  let open = true
  let release = (): void => {}
  let fail = (_error: Error): void => {}
  const body = new ReadableStream<Uint8Array>(
    {
      start(controller) {
        fail = (error) => controller.error(error)
        const onData = (chunk: Buffer | string) => {
          if (!open) return
          const bytes = typeof chunk === 'string' ? Buffer.from(chunk) : chunk
          controller.enqueue(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength))
          if ((controller.desiredSize ?? 1) <= 0) req.pause()
        }
        const stopWatching = finished(req, (error) => {
          if (!open) return
          release()
          // HTTP/2's compatibility request ends as a whole one when its stream is reset
          // (RST_STREAM: Node pushes the end after `aborted`); a body cut off is no body.
          if (error === undefined && req.aborted) error = Object.assign(new Error('aborted'), { code: 'ECONNRESET' })
          if (error) controller.error(error)
          else controller.close()
        })
        release = () => {
          open = false
          req.off('data', onData)
          stopWatching()
        }
        req.on('data', onData)
      },
      pull() {
        if (open) req.resume()
      },
      cancel() {
        if (!open) return
        release()
        req.resume()
      },
    },
    new ByteLengthQueuingStrategy({ highWaterMark: BODY_HIGH_WATER_MARK }),
  )
  return {
    body,
    // The response is over and the handler never took the body (it answered, or threw, before
    // reading it: the SDK's 406 and 415, an unknown session): drained unread, as Node drains a
    // body nobody consumes. Left paused past the high-water mark, it held the connection, and
    // the next request on it was never answered. A body being read is left to its reader.
    abandon() {
      if (!open || body.locked) return
      release()
      req.resume()
      fail(Object.assign(new Error('the response was finished before the request body was read'), { code: 'ERR_BODY_ABANDONED' }))
    },
  }
}

/**
 * {@link toWebRequest} for a handler (`fromWebHandler`), or `undefined` after answering 400
 * (`INVALID_HOST`) when the target cannot be a URL: the client's error, never a framework 500.
 */
export function toHandlerRequest(source: WebRequestSource): Request | undefined {
  try {
    return toWebRequest(source)
  } catch (error) {
    writeReply(source.res, error instanceof UnserializableBody ? UNSERIALIZABLE_BODY : INVALID_HOST)
    return undefined
  }
}

/**
 * 400 for a body a parser in front of the adapter took (`express.json()`, which has no depth
 * limit) that `JSON.stringify` cannot write back: nested deeper than the stack allows, or a
 * `BigInt` or a cycle a parser of the platform's put in. The client's error, as the same body
 * without the parser is (the handler's JSON parser refuses it), never blamed on its `Host`.
 */
const UNSERIALIZABLE_BODY: Reply = jsonRpcErrorReply(400, {
  code: RpcCode.InvalidRequest,
  message: 'Request body cannot be passed on',
  data: { error: 'invalid_request', field: 'body' },
})

/** Thrown by {@link toWebRequest} for a parsed body `JSON.stringify` cannot write. */
class UnserializableBody extends Error {}

/**
 * Whether an HTTP/1.x request says it has no body (RFC 9112 section 6.3): no length, or 0
 * (`00` too, which Node reads as 0; regression: a bodiless DELETE with it reached a
 * `fromWebHandler` handler behind `express.json()` with the body `{}`).
 */
function sentNoBody(req: IncomingMessage): boolean {
  const length = req.headers['content-length']
  if (length !== undefined) return isZeroLength(length)
  return req.headers['transfer-encoding'] === undefined && req.httpVersionMajor < 2
}

function serializeParsedBody(parsed: unknown, headers: Headers): BodyInit {
  headers.delete('content-length')
  // A body parser decoded the body (`express.json()` inflates gzip): what goes on is not coded.
  headers.delete('content-encoding')
  if (typeof parsed === 'string' || parsed instanceof Uint8Array) return parsed as BodyInit
  try {
    return JSON.stringify(parsed)
  } catch (error) {
    throw new UnserializableBody(UNSERIALIZABLE_MESSAGE, { cause: error })
  }
}

/** The chunk that sends a response's head without a byte of its body. */
const EMPTY_CHUNK = new Uint8Array(0)

/** What {@link writeWebResponse} races a read against: a chunk not yet there. */
const NOT_READY: unique symbol = Symbol('not ready')

/** {@link NOT_READY} after the I/O of this turn of the event loop. */
function nextTurn(): Promise<typeof NOT_READY> {
  return new Promise((resolve) => setImmediate(resolve, NOT_READY))
}

/**
 * Writes a web `Response` on a raw Node response, streaming its body with back-pressure
 * (SSE included, no buffering); a client that goes away cancels the body, which cancels the
 * upstream of a proxied response. Its `Vary` joins one the platform set on the response before.
 * A body that fails mid-way (the handler's stream errors) cuts the response, and the failure
 * goes to `report` (the adapter's `onError`), as a Node handler's throw after its head does:
 * not a client's leaving, nor the proxy's `UpstreamError`, which the proxy has told already.
 */
export async function writeWebResponse(res: ServerResponse, response: Response, report: (error: unknown, context: string) => void = logError): Promise<void> {
  const headers = webHead(res, response)
  if (response.statusText) res.writeHead(response.status, response.statusText, headers)
  else res.writeHead(response.status, headers)
  if (!response.body) {
    res.end()
    return
  }
  const reader = response.body.getReader()
  let closed = false
  let wake: (() => void) | undefined
  const onClose = () => {
    closed = true
    wake?.()
    reader.cancel().catch(() => {})
  }
  // One `drain` listener for the whole response, waking the wait of the moment: `compression()`
  // hands `drain` listeners to its zlib stream, where `once` never takes them off again (one
  // more per wait, until Node warned of a leak; the one left there dies with the response).
  const onDrain = () => wake?.()
  let drainHeard = false
  // Gone already (before the handler answered; on HTTP/2, a reset stream): the body is
  // cancelled, never waited on.
  whenClosed(res, onClose)
  // The head goes out now, before the first chunk (an SSE stream may stay quiet): written with
  // an empty chunk, which Node sends as Latin-1, byte for byte. `flushHeaders()` writes it as a
  // UTF-8 string, which turned a header byte 0xE9 relayed from an upstream into C3 A9.
  res.write(EMPTY_CHUNK)
  // A compressing middleware (Express's `compression()`) holds written bytes until its buffer
  // fills, or the end: an SSE event would wait for the whole stream. It adds `flush` for
  // streams to push what they wrote, which is called whenever the body has nothing more ready
  // (each flush ends a zlib block: flushed after every chunk, a JSON body given in 1 KiB chunks
  // came out 2.4 times larger).
  const flush = (res as { flush?: unknown }).flush
  const push = typeof flush === 'function' ? () => flush.call(res) : undefined
  try {
    for (;;) {
      const reading = reader.read()
      // Another chunk there or on its way (a body through a TransformStream arrives a few
      // microtasks later, an async generator's too) is written first; the bytes go out when the
      // body has had a turn of the event loop and still has none.
      if (push !== undefined && (await Promise.race([reading, NOT_READY])) === NOT_READY && (await Promise.race([reading, nextTurn()])) === NOT_READY) push()
      const { done, value } = await reading
      if (done || closed) break
      if (!res.write(value) && !closed) {
        if (!drainHeard) {
          res.on('drain', onDrain)
          drainHeard = true
        }
        await new Promise<void>((resolve) => (wake = resolve))
        wake = undefined
      }
    }
  } catch (error) {
    // The body failed mid-stream (the handler's stream, an upstream gone): end the response
    // where it stands, and say why (never heard before: the client saw a cut answer, and no log
    // line anywhere told of it).
    if (!closed) {
      // Judged before the cut, which destroys the response (a failure that reads as a
      // disconnect, its own upstream's reset, would then pass for its client's leaving).
      const told = toldByProxy(error) || clientLeft(res, error)
      cutResponse(res)
      if (!told) report(error, 'handler')
    }
    return
  } finally {
    res.off('close', onClose)
    if (drainHeard) res.off('drain', onDrain)
  }
  if (!closed) res.end()
}

/**
 * Whether a body's failure is the proxy's `UpstreamError`, told to its own `onError` when it
 * failed the body (by its code: a copy of the package in the other module format has a class
 * of its own).
 */
function toldByProxy(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 'ERR_UPSTREAM'
}

/** `response`'s headers for Node's `writeHead`: each `Set-Cookie` its own, `Vary` joined with the platform's. */
function webHead(res: ServerResponse, response: Response): OutgoingHttpHeaders {
  const headers: OutgoingHttpHeaders = {}
  response.headers.forEach((value, name) => {
    if (name !== 'set-cookie') headers[name] = value
  })
  joinPlatformVary(res, headers)
  const cookies = response.headers.getSetCookie()
  if (cookies.length > 0) headers['set-cookie'] = cookies
  return headers
}

/** The context stored on a request by an adapter, or a clear error when the adapter did not run. */
export function requireContext(context: DispatchContext | undefined, adapter: string): DispatchContext {
  if (context === undefined) {
    throw new TypeError(
      `mcp-dispatch: no dispatch context on this request; register the ${adapter} mcpDispatch ${adapter === 'express' ? 'middleware' : 'plugin'} before this handler`,
    )
  }
  return context
}
