/**
 * Replies produced by the dispatch layer itself (rejections, metadata, preflight), as plain
 * values. Adapters write them byte for byte; they never build a body of their own.
 *
 * Every error body is a JSON-RPC 2.0 object with `id: null` and
 * `error: { code, message, data? }` (spec section 7, DESIGN.md error table).
 * @module
 */
import { wholeSeconds } from './rate-limit.js'

/** A complete HTTP answer decided by the dispatch layer. */
export interface Reply {
  /** HTTP status code. */
  readonly status: number
  /** Header names in lower case. */
  readonly headers: Readonly<Record<string, string>>
  /** Serialized body (JSON), or `null` for an empty body. */
  readonly body: string | null
}

/** JSON-RPC error object as it appears in an error body. */
export interface JsonRpcErrorObject {
  /** JSON-RPC error code ({@link RpcCode}). */
  code: number
  /** Short description (spec section 7: `Unauthorized`, `Forbidden`, …). */
  message: string
  /** Details a client can act on (`{ error: "ip_not_allowed" }`, …); absent where the spec shows none. */
  data?: Record<string, unknown> | undefined
}

/** JSON-RPC codes of the dispatch layer's answers (spec section 7, DESIGN.md, README "What the pipeline answers"). */
export const RpcCode = {
  /**
   * Generic server error; used for 429 (spec section 7), 405 (as the MCP SDK does), the 408s, the
   * proxy's 502 and 504, and, in the MCP SDK's words, the 413 and 415 of a framework's body parser
   * (`jsonRpcErrors()` of the Express and Fastify adapters).
   */
  ServerError: -32000,
  /** 429: the caller's rate limit is spent (spec section 7). */
  RateLimited: -32000,
  /** 401: no credential, or one that cannot be validated. */
  Unauthorized: -32001,
  /** 402: no active subscription to the App. */
  PaymentRequired: -32002,
  /** 403: a token's scope, IP allowlist, or the request's `Origin`. */
  Forbidden: -32003,
  /** 404: no such App, path, version or session. */
  NotFound: -32004,
  /** 503: the authorization server or a store cannot answer now. */
  Unavailable: -32005,
  /**
   * 400, 413, 417, 431 and 501 of malformed requests: an invalid `Host`, a body that does not match
   * its `Content-Length`, what Node's parser refuses (`answerClientError`), an `Expect` other than
   * `100-continue`, a request body in a transfer coding the proxy cannot pass on; and any other
   * client error (4xx) of a framework's body parser (`jsonRpcErrors()`).
   */
  InvalidRequest: -32600,
  /**
   * 502: the MCP handler threw or failed before its response head (`handler_error`); 500: a fault
   * of the server's own (an error of a framework that is no client's, a Web adapter `info` member
   * that is no string).
   */
  InternalError: -32603,
  /**
   * 400 of a framework's body parser, in the MCP SDK transport's words (`jsonRpcErrors()`): a body
   * that is not JSON, or JSON that is no JSON-RPC message.
   */
  ParseError: -32700,
} as const

const JSON_HEADERS: Readonly<Record<string, string>> = Object.freeze({ 'content-type': 'application/json' })

/**
 * Replies shared between requests are frozen: an adapter that wrote into one would otherwise
 * change the answer to every later request.
 */
function shared(reply: Reply): Reply {
  return Object.freeze({ ...reply, headers: Object.freeze({ ...reply.headers }) })
}

/**
 * Builds a JSON-RPC 2.0 error reply with `id: null`.
 *
 * @example
 * ```ts
 * jsonRpcErrorReply(403, { code: -32003, message: 'Forbidden' })
 * // { status: 403, headers: { 'content-type': 'application/json' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32003,"message":"Forbidden"}}' }
 * ```
 */
export function jsonRpcErrorReply(
  status: number,
  error: JsonRpcErrorObject,
  headers?: Readonly<Record<string, string>>,
): Reply {
  return {
    status,
    headers: headers ? { ...JSON_HEADERS, ...headers } : JSON_HEADERS,
    body: JSON.stringify({ jsonrpc: '2.0', id: null, error }),
  }
}

/** Options of {@link unauthorizedReply}. */
export interface UnauthorizedReplyOptions {
  /** Full URL of the protected-resource metadata document (spec 5.1 step 1). */
  resourceMetadataUrl: string
  /**
   * Set when a token was presented and rejected: adds `error="invalid_token"` to the
   * challenge (RFC 6750 section 3.1) so clients know to refresh or re-authorize.
   */
  invalidToken?: boolean | undefined
  /**
   * Scopes the challenge names (`scope="openid mcp:tools"`, RFC 6750 section 3): scope names
   * (RFC 6749 section 3.3) separated by single spaces. The MCP authorization specification
   * (2025-11-25) asks servers to name the scopes a resource needs, and clients to ask for these
   * before the metadata's `scopes_supported`. Left out by default (`null` too): spec 5.1's
   * challenge names the metadata alone.
   * @throws {RangeError} from {@link buildWwwAuthenticate} for a value that is not such a list.
   */
  scope?: string | null | undefined
}

/**
 * 401 of spec section 7 with the `WWW-Authenticate` challenge of spec 5.1 step 1.
 *
 * @example
 * ```ts
 * unauthorizedReply({ resourceMetadataUrl: 'https://w.example/.well-known/oauth-protected-resource' })
 * // { status: 401, headers: { 'content-type': 'application/json',
 * //   'www-authenticate': 'Bearer resource_metadata="https://w.example/.well-known/oauth-protected-resource"' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"Unauthorized","data":{"error":"unauthorized","description":"Authentication required: send Authorization: Bearer <token>"}}}' }
 * ```
 */
export function unauthorizedReply(options: UnauthorizedReplyOptions): Reply {
  return jsonRpcErrorReply(
    401,
    {
      code: RpcCode.Unauthorized,
      message: 'Unauthorized',
      data: {
        // Spec section 7: data.error is always `unauthorized`; the RFC 6750 error code for a
        // rejected token travels in the WWW-Authenticate challenge.
        error: 'unauthorized',
        description: options.invalidToken
          ? 'Authentication required: the bearer token is invalid, expired or revoked'
          : 'Authentication required: send Authorization: Bearer <token>',
      },
    },
    { 'www-authenticate': buildWwwAuthenticate(options) },
  )
}

/**
 * The `WWW-Authenticate` header value of a 401 (spec 5.1; RFC 6750 section 3; RFC 9728
 * section 5.1). The URL goes into a quoted string: `"` is written `%22` and `\` is written `/`
 * (as the URL parser writes them in an http(s) URL's path), and anything but
 * HTAB and printable ASCII (controls, a name not yet in Punycode from a platform's `baseUrl`) is
 * percent-encoded as UTF-8, so the value is always one a runtime writes (Node's `setHeader`
 * throws on characters past U+00FF, on every 401).
 *
 * @example
 * ```ts
 * buildWwwAuthenticate({ resourceMetadataUrl: 'https://w.example/.well-known/oauth-protected-resource', invalidToken: true })
 * // 'Bearer resource_metadata="https://w.example/.well-known/oauth-protected-resource", error="invalid_token"'
 * buildWwwAuthenticate({ resourceMetadataUrl: 'https://w.example/.well-known/oauth-protected-resource', scope: 'openid mcp:tools' })
 * // 'Bearer resource_metadata="https://w.example/.well-known/oauth-protected-resource", scope="openid mcp:tools"'
 * ```
 */
export function buildWwwAuthenticate(options: UnauthorizedReplyOptions): string {
  // Kept inside its quoted string, and naming where the document is served: a quote as the URL
  // parser writes it (`%22`), a backslash as it reads one in an http(s) URL (`/`). Dropped, they
  // named another path (`https://a.example/p"q\r` as `/pqr`, served at `/p%22q/r`).
  const url = options.resourceMetadataUrl.replace(/"/g, '%22').replace(/\\/g, '/').replace(/[^\t\x20-\x7e]/gu, percentEncoded)
  let challenge = `Bearer resource_metadata="${url}"`
  const scope = options.scope
  if (scope !== undefined && scope !== null) {
    // Checked, not escaped: a scope-token holds no `"` or `\`, so a value that needs escaping
    // names no scope a client could ask for.
    if (typeof scope !== 'string' || !SCOPE_LIST.test(scope)) {
      throw new RangeError('scope must be scope names (RFC 6749 section 3.3: printable ASCII, no double quotes or backslashes) separated by single spaces')
    }
    challenge += `, scope="${scope}"`
  }
  return options.invalidToken ? `${challenge}, error="invalid_token"` : challenge
}

/** A scope name (RFC 6749 section 3.3's scope-token). @internal */
export const SCOPE_TOKEN = /^[\x21\x23-\x5B\x5D-\x7E]+$/
/** RFC 6749 section 3.3's `scope`: scope-tokens separated by single spaces. @internal */
export const SCOPE_LIST = new RegExp(`^${SCOPE_TOKEN.source.slice(1, -1)}(?: ${SCOPE_TOKEN.source.slice(1, -1)})*$`)

/** One character as UTF-8 percent-escapes; a lone surrogate as U+FFFD's. */
function percentEncoded(character: string): string {
  try {
    return encodeURIComponent(character)
  } catch {
    return '%EF%BF%BD'
  }
}

/**
 * 402 of spec section 7: identity verified, no active subscription.
 *
 * @example
 * ```ts
 * paymentRequiredReply()
 * // { status: 402, headers: { 'content-type': 'application/json' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32002,"message":"Payment Required","data":{"error":"payment_required","description":"An active subscription to this App is required"}}}' }
 * ```
 */
export function paymentRequiredReply(): Reply {
  return PAYMENT_REQUIRED
}
const PAYMENT_REQUIRED = shared(jsonRpcErrorReply(402, {
  code: RpcCode.PaymentRequired,
  message: 'Payment Required',
  data: { error: 'payment_required', description: 'An active subscription to this App is required' },
}))

/**
 * 403 of spec section 7: API token valid but not scoped to the App (no data).
 *
 * @example
 * ```ts
 * forbiddenReply()
 * // { status: 403, headers: { 'content-type': 'application/json' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32003,"message":"Forbidden"}}' }
 * ```
 */
export function forbiddenReply(): Reply {
  return FORBIDDEN
}
const FORBIDDEN = shared(jsonRpcErrorReply(403, { code: RpcCode.Forbidden, message: 'Forbidden' }))

/**
 * 403 of DESIGN.md: request from an address outside the token's IP allowlist.
 *
 * @example
 * ```ts
 * ipNotAllowedReply()
 * // { status: 403, headers: { 'content-type': 'application/json' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32003,"message":"Forbidden","data":{"error":"ip_not_allowed"}}}' }
 * ```
 */
export function ipNotAllowedReply(): Reply {
  return IP_NOT_ALLOWED
}
const IP_NOT_ALLOWED = shared(jsonRpcErrorReply(403, {
  code: RpcCode.Forbidden,
  message: 'Forbidden',
  data: { error: 'ip_not_allowed' },
}))

/**
 * 403: the request's `Origin` is not an allowed origin (MCP transport, DNS rebinding).
 *
 * @example
 * ```ts
 * originNotAllowedReply()
 * // { status: 403, headers: { 'content-type': 'application/json', vary: 'Origin' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32003,"message":"Forbidden","data":{"error":"origin_not_allowed"}}}' }
 * ```
 */
export function originNotAllowedReply(): Reply {
  return ORIGIN_NOT_ALLOWED
}
// `Vary: Origin`: the refusal depends on the `Origin` header (another origin gets another answer).
const ORIGIN_NOT_ALLOWED = shared(jsonRpcErrorReply(403, {
  code: RpcCode.Forbidden,
  message: 'Forbidden',
  data: { error: 'origin_not_allowed' },
}, { vary: 'Origin' }))

/**
 * 404 of DESIGN.md: exact version requested is not live.
 *
 * @example
 * ```ts
 * versionNotFoundReply('1.2.3', '1.4.0')
 * // { status: 404, headers: { 'content-type': 'application/json' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32004,"message":"Version not found","data":{"error":"version_not_found","requested":"1.2.3","latest":"1.4.0"}}}' }
 * ```
 */
export function versionNotFoundReply(requested: string, latest: string | null): Reply {
  return jsonRpcErrorReply(404, {
    code: RpcCode.NotFound,
    message: 'Version not found',
    data: { error: 'version_not_found', requested, latest },
  })
}

/**
 * 404 of DESIGN.md: unknown App or path.
 *
 * @example
 * ```ts
 * notFoundReply()
 * // { status: 404, headers: { 'content-type': 'application/json' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32004,"message":"Not found","data":{"error":"not_found"}}}' }
 * ```
 */
export function notFoundReply(): Reply {
  return NOT_FOUND
}
const NOT_FOUND = shared(jsonRpcErrorReply(404, { code: RpcCode.NotFound, message: 'Not found', data: { error: 'not_found' } }))

/**
 * 404 for an `Mcp-Session-Id` that is unknown, expired, or pinned to another identity or App
 * (MCP Streamable HTTP transport: the client must start a new session).
 *
 * @example
 * ```ts
 * sessionNotFoundReply()
 * // { status: 404, headers: { 'content-type': 'application/json' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32004,"message":"Session not found","data":{"error":"session_not_found"}}}' }
 * ```
 */
export function sessionNotFoundReply(): Reply {
  return SESSION_NOT_FOUND
}
const SESSION_NOT_FOUND = shared(jsonRpcErrorReply(404, {
  code: RpcCode.NotFound,
  message: 'Session not found',
  data: { error: 'session_not_found' },
}))

/**
 * 405 for methods the MCP endpoint does not serve; `Allow` lists the ones it does.
 *
 * @example
 * ```ts
 * methodNotAllowedReply('GET, POST, DELETE')
 * // { status: 405, headers: { 'content-type': 'application/json', allow: 'GET, POST, DELETE' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Method not allowed","data":{"error":"method_not_allowed"}}}' }
 * ```
 */
export function methodNotAllowedReply(allow: string): Reply {
  return jsonRpcErrorReply(
    405,
    { code: RpcCode.ServerError, message: 'Method not allowed', data: { error: 'method_not_allowed' } },
    { allow },
  )
}

/** Fields of the 429 body (spec section 7). */
export interface RateLimitedInfo {
  /** Requests allowed per window. */
  limit: number
  /** End of the current window, Unix time in seconds. */
  resetAt: number
  /** Seconds until a request may succeed (at least 1). */
  retryAfter: number
  /** Window name; `minute` is the one the spec shows. */
  windowType: string
}

/**
 * 429 of spec section 7, with `Retry-After`; `info.retryAfter` goes out rounded up to a whole
 * number of seconds, at least 1 (1 for no positive number or one past 2^53 - 1).
 *
 * @example
 * ```ts
 * rateLimitedReply({ limit: 60, resetAt: 1_700_000_160, retryAfter: 31, windowType: 'minute' })
 * // { status: 429, headers: { 'content-type': 'application/json', 'retry-after': '31' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32000,"message":"Rate limit exceeded","data":{"limit":60,"resetAt":1700000160,"retryAfter":31,"windowType":"minute"}}}' }
 * ```
 */
export function rateLimitedReply(info: RateLimitedInfo, headers?: Readonly<Record<string, string>>): Reply {
  const retryAfter = wholeSeconds(info.retryAfter)
  return jsonRpcErrorReply(
    429,
    {
      code: RpcCode.RateLimited,
      message: 'Rate limit exceeded',
      data: { limit: info.limit, resetAt: info.resetAt, retryAfter, windowType: info.windowType },
    },
    { ...headers, 'retry-after': String(retryAfter) },
  )
}

/**
 * 503 of DESIGN.md: authorization server unavailable (breaker open, retries spent), with
 * `Retry-After` and `data.retryAfter`: `seconds` rounded up to a whole number, at least 1.
 *
 * @example
 * ```ts
 * authorizationServerUnavailableReply(12.5)
 * // { status: 503, headers: { 'content-type': 'application/json', 'retry-after': '13' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32005,"message":"Authorization server unavailable","data":{"error":"temporarily_unavailable","retryAfter":13}}}' }
 * ```
 */
export function authorizationServerUnavailableReply(seconds: number): Reply {
  const retryAfter = wholeSeconds(seconds)
  return jsonRpcErrorReply(
    503,
    {
      code: RpcCode.Unavailable,
      message: 'Authorization server unavailable',
      data: { error: 'temporarily_unavailable', retryAfter },
    },
    { 'retry-after': String(retryAfter) },
  )
}

/**
 * 503 when a store the decision depends on cannot answer (never a silent allow), with
 * `Retry-After` and `data.retryAfter`: `seconds` rounded up to a whole number, at least 1
 * (default 1).
 *
 * @example
 * ```ts
 * serviceUnavailableReply()
 * // { status: 503, headers: { 'content-type': 'application/json', 'retry-after': '1' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32005,"message":"Service unavailable","data":{"error":"temporarily_unavailable","retryAfter":1}}}' }
 * ```
 */
export function serviceUnavailableReply(seconds = 1): Reply {
  const retryAfter = wholeSeconds(seconds)
  return jsonRpcErrorReply(
    503,
    {
      code: RpcCode.Unavailable,
      message: 'Service unavailable',
      data: { error: 'temporarily_unavailable', retryAfter },
    },
    { 'retry-after': String(retryAfter) },
  )
}

/** `Vary: Origin`, the one frozen object every answer that carries it alone shares. @internal */
export const VARY_ORIGIN: Readonly<Record<string, string>> = Object.freeze({ vary: 'Origin' })

/**
 * 404 when the version is live but the platform gave `routeByVersion` no handler for it.
 * Carries the version headers, since the version was resolved, and `Vary: Origin` as the
 * dispatch layer's other 404s do (a shared cache may keep a 404: RFC 9111 section 4.2.2); the
 * router does not know whether CORS is on, and the header costs a cache nothing where it is off.
 *
 * @example
 * ```ts
 * versionNotServedReply('1.2.3')
 * // { status: 404, headers: { 'content-type': 'application/json', vary: 'Origin' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32004,"message":"Version not served","data":{"error":"version_not_served","version":"1.2.3"}}}' }
 * ```
 */
export function versionNotServedReply(version: string): Reply {
  return jsonRpcErrorReply(
    404,
    {
      code: RpcCode.NotFound,
      message: 'Version not served',
      data: { error: 'version_not_served', version },
    },
    VARY_ORIGIN,
  )
}

/**
 * 400: the request's `Host` (or the host of an absolute-form target) is not an authority a URL
 * can hold, so no App address can be built from it (the Express and Fastify adapters; a Web
 * server's own error handler may answer the same).
 *
 * @example
 * ```ts
 * invalidHostReply()
 * // { status: 400, headers: { 'content-type': 'application/json' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Host header","data":{"error":"invalid_request","field":"host"}}}' }
 * ```
 */
export function invalidHostReply(): Reply {
  return jsonRpcErrorReply(400, {
    code: RpcCode.InvalidRequest,
    message: 'Invalid Host header',
    data: { error: 'invalid_request', field: 'host' },
  })
}

/**
 * 400 from the proxy handler (`mcp-dispatch/proxy`): the request body ran past, or ended short
 * of, the length its `Content-Length` declares, so it was not passed on as that length (RFC
 * 9112 section 6.3: a message whose framing cannot be trusted is refused with 400).
 *
 * @example
 * ```ts
 * contentLengthMismatchReply()
 * // { status: 400, headers: { 'content-type': 'application/json' },
 * //   body: '{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Request body does not match its Content-Length","data":{"error":"invalid_request","field":"content-length"}}}' }
 * ```
 */
export function contentLengthMismatchReply(): Reply {
  return CONTENT_LENGTH_MISMATCH
}
const CONTENT_LENGTH_MISMATCH = shared(jsonRpcErrorReply(400, {
  code: RpcCode.InvalidRequest,
  message: 'Request body does not match its Content-Length',
  data: { error: 'invalid_request', field: 'content-length' },
}))
