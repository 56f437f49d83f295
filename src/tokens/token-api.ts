/**
 * The token-management HTTP API (spec 4.3, 4.4; DESIGN.md "API tokens"), web-standard and
 * mountable in any framework:
 *
 * | method | path | caller | answer |
 * |---|---|---|---|
 * | POST | `/api/tokens` | session | 201, token with secret |
 * | GET | `/api/tokens` | session | 200, `{ tokens: [...] }` |
 * | GET | `/api/tokens/{id}` | session | 200, token |
 * | PATCH | `/api/tokens/{id}` | session | 200, token |
 * | POST | `/api/tokens/{id}/rotate` | the token itself (Bearer) or session | 200, token with new secret |
 * | DELETE | `/api/tokens/{id}` | session | 200, revoked token (an expired one is left expired); no body, or `{}` |
 *
 * Errors are JSON `{ error, message, field? }`: 400 `invalid_request` (bad input, naming the
 * field), 401 `unauthorized`, 403 `forbidden` / `csrf_failed`, 404 `not_found`, 409
 * `token_inactive` (or `conflict`: a rotation that lost to another rotation of the token, or a
 * creation past `maxActiveTokensPerUser`), 429 `rate_limited` (`Retry-After`: a Bearer
 * rotation by a token not stored, from an address that spent its `unknownTokenBudget`), 503
 * `temporarily_unavailable`.
 * @module
 */
import { z } from 'zod'
import { type BearerParseResult, parseBearerToken, presentsBearer } from '../core/authorization-header.js'
import type { MaybePromise } from '../core/stores.js'
import { unverifiedBudgetHeaders } from '../core/rate-limit.js'
import { ConfigurationError, CsrfError, DispatchError, InvalidInputError, TooManyValidationsError, optionNames, refuseUnknownOptions, reporterOption, requireMethods } from '../errors.js'
import { BodyCutError, NotUtf8Error, contentCodings, readRequestTextUpTo } from '../read-text.js'
import { kindOf } from '../core/text.js'
import { type TokenService, parseInput, renamed } from './token-service.js'
import { type Served, isUnderBasePath, refusalAt, segmentsOf, servedAt, setTokenApiTraits } from './token-api-paths.js'
import { withoutTrailingSlashes } from '../core/trailing-slash.js'
import { parseUrl } from '../core/url.js'

/**
 * The dashboard user of a request with a session cookie. `authenticateSession` may answer more
 * (a type of its own with `userId`: the CSRF token the session holds, say), and `verifyCsrf`
 * is handed that same object, typed as answered.
 */
export interface TokenApiSession {
  /** The signed-in user: the owner of the tokens the request lists, creates or changes. */
  readonly userId: string
}

/** Options of {@link createTokenApi}; `S` is what `authenticateSession` answers. */
export interface TokenApiOptions<S extends TokenApiSession = TokenApiSession> {
  /** The token service whose tokens the API manages. */
  tokens: TokenService
  /** Path prefix of the API; default `/api/tokens`. */
  basePath?: string | undefined
  /**
   * Resolves the dashboard session of a request (from its cookie), or `null`. `info` is what
   * the caller passed beside the request: from `serveTokenApi` of `mcp-dispatch/express` and
   * `mcp-dispatch/fastify`, the framework's own request as `info.frameworkRequest`, where a
   * session middleware left its session (`express-session`'s `req.session`,
   * `@fastify/session`'s `request.session`). `null`, `undefined` or `false`: no session (401).
   * A session whose `userId` is no non-empty string is the platform's mistake: 503, reported.
   */
  authenticateSession: (request: Request, info: TokenApiRequestInfo) => MaybePromise<S | null | undefined | false>
  /**
   * CSRF check for cookie-authenticated writes (POST, PATCH, DELETE). Required; pass `false`
   * only when the session mechanism is immune by construction (e.g. not cookie-based).
   * Bearer callers (rotate only) never need it. Only an answer of `true` lets the write through;
   * any other is a 403, and a truthy one that is not `true` (a string) is reported too.
   */
  verifyCsrf: ((request: Request, session: S) => MaybePromise<boolean>) | false
  /**
   * Client address of a request, for the allowlist of a Bearer rotation, when the caller does
   * not pass it as `info.clientAddress` (the Express and Fastify `serveTokenApi` do). Without
   * either a token with an allowlist cannot rotate itself: 403, as on the MCP path. `null` or
   * `''` (a header lookup that found none) names no address, as `undefined` does.
   */
  clientAddress?: ((request: Request) => string | null | undefined) | undefined
  /** Errors the caller sees only as a 503 (context `token api`). Default `logError` (stderr). */
  onError?: ((error: unknown, context: string) => void) | undefined
  /**
   * The hosts the API answers on: host names (`dashboard.example.com`), compared without case
   * and whatever the port. A request for another host is not the API's: `null` (so
   * `serveTokenApi` answers its paths there with 404 `not_found`), whatever its path. The host
   * is the `Host` header's (a route handler of `next start` gets a URL of its own address),
   * else, with none (HTTP/2), the URL's. Default: every host. Where Apps and the dashboard
   * share a server, name the dashboard's: a dashboard cookie scoped to a parent domain reaches
   * every App host, and the API would list its tokens there.
   */
  hosts?: readonly string[] | undefined
}

const MAX_BODY_BYTES = 16_384
/** The `info` of a request the API was handed without one. */
const NO_INFO: TokenApiRequestInfo = Object.freeze({})
const createBody = z
  .object({
    name: z.unknown(),
    servers: z.unknown(),
    expires_in_days: z.unknown(),
    allowed_ips: z.unknown().optional(),
  })
  .strict()
const updateBody = z
  .object({
    name: z.unknown().optional(),
    expires_at: z.unknown().optional(),
    allowed_ips: z.unknown().optional(),
  })
  .strict()
const SNAKE: Record<string, string> = {
  expiresInDays: 'expires_in_days',
  allowedIps: 'allowed_ips',
  expiresAt: 'expires_at',
}


function notServed(served: Served | string): Response {
  const refusal = refusalAt(served)
  return json(refusal.status, refusal.body, refusal.allow === undefined ? undefined : { allow: refusal.allow })
}

function json(status: number, body: unknown, headers?: Record<string, string>): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { 'content-type': 'application/json', 'cache-control': 'no-store', ...headers },
  })
}

/**
 * `call` of the token service, whose bad-input errors name its camelCase fields, with those
 * fields in the API's snake_case (`allowedIps.1` is `allowed_ips.1`). Errors about the body as
 * sent are raised by the API itself and name the caller's own keys (an unknown `expiresAt`
 * stays `expiresAt`).
 */
async function inApiNames<T>(call: Promise<T>): Promise<T> {
  try {
    return await call
  } catch (error) {
    if (!(error instanceof InvalidInputError)) throw error
    const field = error.field
      .split('.')
      .map((p) => renamed(SNAKE, p))
      .join('.')
    throw new InvalidInputError(field, error.message.slice(error.field.length + 2))
  }
}

/**
 * The JSON answer of a refusal. A 401 to a request that presented a Bearer token (a rotation
 * by a secret that is unknown, revoked or expired) says so in its challenge (RFC 6750 section
 * 3.1: `invalid_token`); one for want of a session carries no error code.
 */
function errorResponse(error: DispatchError, presentedBearer: boolean): Response {
  const kind: Record<number, string> = {
    400: 'invalid_request',
    401: 'unauthorized',
    403: error.code === 'ERR_CSRF' ? 'csrf_failed' : 'forbidden',
    404: 'not_found',
    409: error.code === 'ERR_CONFLICT' ? 'conflict' : 'token_inactive',
    // A rotation by an unknown token from an address that spent its `unknownTokenBudget`.
    429: 'rate_limited',
    503: 'temporarily_unavailable',
  }
  const field = error instanceof InvalidInputError ? error.field : undefined
  return json(
    error.status,
    { error: kind[error.status] ?? 'error', message: error.message, ...(field !== undefined && { field }) },
    error.status === 401
      ? { 'www-authenticate': presentedBearer ? 'Bearer error="invalid_token"' : 'Bearer' }
      : error instanceof TooManyValidationsError
        ? { 'retry-after': String(error.retryAfter), ...unverifiedBudgetHeaders(error) }
        : undefined,
  )
}

/**
 * The body as text, read only up to the limit: a larger one (chunked, or with a false
 * `Content-Length`) is refused once the limit is passed, never held whole in memory.
 */
async function readText(request: Request): Promise<string> {
  // A coded body (`gzip`, `br`) is not decoded here: refused naming the header, not read as
  // text and called invalid UTF-8 or JSON. An empty one is no body whatever its label (a
  // rotation's). A body parser in front that decodes it drops the header (the Express adapter
  // does when it serializes the parser's result again).
  const coded = !contentCodings(request.headers.get('content-encoding')).every((coding) => coding === '' || coding === 'identity')
  let text: string | null
  try {
    text = await readRequestTextUpTo(request, MAX_BODY_BYTES, true)
  } catch (error) {
    if (coded && error instanceof NotUtf8Error) throw codedBodyError()
    // Not stored with U+FFFD in place of what was sent: the caller is told.
    if (error instanceof NotUtf8Error) throw new InvalidInputError('body', 'is not valid UTF-8')
    // The connection ended before the whole body did, as its runtime says (`readRequestTextUpTo`).
    // The client's error, answered 400 as Node's HTTP parser answers it, and nothing for `onError`
    // (regression: Deno and workerd hand the API such a request, which was answered 503 with
    // `Retry-After: 1` and reported as a failure of the service, once per request of any client).
    // Any other failure (a body the platform's hooks read or locked first, a platform's own stream
    // in front of the API, spooled or decoded) is the server's: 503, reported, not a 400 that
    // blames the client's connection.
    if (error instanceof BodyCutError) throw new InvalidInputError('body', 'was cut short: the connection ended before the whole body arrived')
    throw error
  }
  if (coded && text !== '') throw codedBodyError()
  if (text === null) throw new InvalidInputError('body', `must be at most ${MAX_BODY_BYTES} bytes`)
  return text
}

/** The refusal of a body in a content coding, which the API does not decode. */
function codedBodyError(): InvalidInputError {
  return new InvalidInputError('content-encoding', 'is not supported: send the body uncompressed (no Content-Encoding, or identity)')
}

async function readJson(request: Request): Promise<unknown> {
  const type = request.headers.get('content-type') ?? ''
  // `application/json`, with parameters or none: not `application/json-seq` and the like.
  if (!/^application\/json[ \t]*(;|$)/i.test(type)) throw new InvalidInputError('content-type', 'must be application/json')
  const text = await readText(request)
  try {
    return JSON.parse(text)
  } catch {
    throw new InvalidInputError('body', 'is not valid JSON')
  }
}

/**
 * Rotation (spec 4.3) and revocation take no body: none, or `{}` with JSON's whitespace (space,
 * tab, CR, LF; not `trim()`'s, which also takes a no-break space); anything else would be
 * silently ignored (a revocation's `{"reason": …}`, or a bulk revocation's list of ids, of
 * which only the token named in the path would go).
 */
async function readNoBody(request: Request, what: 'a rotation' | 'a revocation'): Promise<void> {
  const text = await readText(request)
  if (/^[ \t\r\n]*(?:\{[ \t\r\n]*\}[ \t\r\n]*)?$/.test(text)) return
  throw new InvalidInputError('body', `must be empty: ${what} takes no parameters`)
}

/** What a request carries besides the `Request` itself. */
export interface TokenApiRequestInfo {
  /**
   * The client's address (the socket peer, through your proxy trust), for Bearer rotations.
   * `null` or `''` names none, as `undefined` does.
   */
  clientAddress?: string | null | undefined
  /**
   * The request as the framework that served it has it, handed to `authenticateSession`:
   * Express's `req` from the Express `serveTokenApi`, Fastify's `request` from the Fastify one.
   * `undefined` when the API is called with a `Request` alone.
   */
  frameworkRequest?: unknown
}

/**
 * The token-management API: answers a request under its `basePath` (on its `hosts`, when
 * given), and `null` for any other path or host, so it composes with other routes. Serve it
 * from Node with `serveTokenApi` of `mcp-dispatch/express` or `mcp-dispatch/fastify`.
 */
export interface TokenApi {
  (request: Request, info?: TokenApiRequestInfo): Promise<Response | null>
  /** The path prefix it answers under (no trailing slash). */
  readonly basePath: string
}

const TOKEN_API_OPTIONS = optionNames<TokenApiOptions>({ tokens: true, basePath: true, hosts: true, authenticateSession: true, verifyCsrf: true, clientAddress: true, onError: true })

/**
 * Creates the token-management API handler. It answers only paths under `basePath` (on its
 * `hosts`, when given) and returns `null` for anything else, so it composes with other routes.
 *
 * @example
 * ```ts
 * const api = createTokenApi({ tokens, authenticateSession: readCookie, verifyCsrf: checkHeader })
 * const response = (await api(request, { clientAddress })) ?? new Response('Not found', { status: 404 })
 * ```
 *
 * @throws {ConfigurationError} with an option it does not have (a misspelt name, or another function's), naming it and where it belongs.
 * @throws {ConfigurationError} without `tokens` (or with one lacking the service's methods) or `authenticateSession`, with a `clientAddress` that is not a function, with a `verifyCsrf` that is neither a function nor `false`, a `basePath` that does not start with `/` or that no request's path can be (not percent-encoded, or with a dot segment, backslash, query or fragment), `hosts` that are not a non-empty array of host names (naming `hosts` or the entry, `hosts.1`), or an `onError` that is not a function.
 */
export function createTokenApi<S extends TokenApiSession = TokenApiSession>(options: TokenApiOptions<S>): TokenApi {
  if (options === null || typeof options !== 'object') throw new ConfigurationError('options', 'must be an object')
  refuseUnknownOptions(options, TOKEN_API_OPTIONS, 'createTokenApi', (key) =>
    key === 'trustProxy' ? "the token API takes the client address from clientAddress (a function of the request); serveTokenApi's trustProxy (Express, Fastify) reads X-Forwarded-For" : undefined,
  )
  const { tokens } = options
  requireMethods('tokens', tokens, 'a TokenService (createTokenService)', ['create', 'list', 'get', 'update', 'rotate', 'revoke'])
  if (options.clientAddress != null && typeof options.clientAddress !== 'function') {
    throw new ConfigurationError('clientAddress', 'must be a function of the request')
  }
  if (typeof options.authenticateSession !== 'function') {
    throw new ConfigurationError('authenticateSession', 'must be a function')
  }
  if (options.verifyCsrf !== false && typeof options.verifyCsrf !== 'function') {
    throw new ConfigurationError('verifyCsrf', 'must be a function, or false to disable CSRF checks explicitly')
  }
  if (options.basePath !== undefined && (typeof options.basePath !== 'string' || !options.basePath.startsWith('/'))) {
    throw new ConfigurationError('basePath', 'must be a path starting with "/"')
  }
  const basePath = withoutTrailingSlashes(options.basePath ?? '/api/tokens')
  // A path no request's can be (`/api/jetons-é`, `/a/../tokens`, `/api/tokens?v=1`): compared
  // with the URL parser's path of each request, the API would answer none, silently.
  // (`new URL`, not `URL.parse`, which older Web runtimes lack; this path always parses.)
  const parsedBase = new URL(`http://token-api.invalid${basePath}`).pathname
  if (parsedBase !== (basePath === '' ? '/' : basePath)) {
    throw new ConfigurationError(
      'basePath',
      `must be a URL path as requests carry it: percent-encoded, with no dot segment, backslash, query or fragment (${JSON.stringify(options.basePath)} is read as ${JSON.stringify(parsedBase)})`,
    )
  }
  const onError = reporterOption(options.onError)
  const hosts = hostsOption(options.hosts)

  async function session(request: Request, write: boolean, info: TokenApiRequestInfo | undefined): Promise<S> {
    const s = await options.authenticateSession(request, info ?? NO_INFO)
    if (!s) throw new DispatchError('ERR_UNAUTHORIZED', 401, -32001, 'A dashboard session is required')
    // A session of another shape (`'u1'`, `{ id }`) is the platform's mistake, not the
    // client's: a 503 reported to `onError`, not a 400 about a field the client never sent.
    const userId: unknown = (s as Partial<TokenApiSession>).userId
    if (typeof userId !== 'string' || userId === '') {
      throw new TypeError(`mcp-dispatch: authenticateSession answered a session whose userId is ${userId === '' ? 'empty' : kindOf(userId)}, not a non-empty string`)
    }
    if (write && options.verifyCsrf) {
      const verified: unknown = await options.verifyCsrf(request, s)
      // Only `true` passes: any other answer is a 403, never a write let through. A truthy one
      // (`'false'`, the header's value) is a bug of the check, reported; a falsy one (`null`,
      // `''`, what `header && header === expected` gives a forged request) is not.
      if (verified !== true) {
        if (verified) onError(new TypeError(`mcp-dispatch: verifyCsrf answered ${kindOf(verified)}, not a boolean: refused (403)`), 'token api')
        throw new CsrfError()
      }
    }
    return s
  }

  /**
   * The API token a request presents. Only the Bearer scheme presents one: another scheme
   * (HTTP Basic in front of a staging dashboard) is the platform's, and the session decides.
   */
  function apiTokenOf(authorization: string | null): BearerParseResult {
    const bearer = parseBearerToken(authorization)
    return bearer.kind === 'invalid' && !presentsBearer(authorization) ? NO_BEARER : bearer
  }

  async function route(request: Request, rest: string, info: TokenApiRequestInfo | undefined, bearer: BearerParseResult): Promise<Response> {
    const method = request.method
    const segments = segmentsOf(rest)
    const [id, action] = segments
    const served = servedAt(segments)
    if (typeof served === 'string') return notServed(served)
    // Rotation by the token itself: Bearer only, no cookie, no CSRF (spec 4.3).
    if (action === 'rotate') {
      if (method !== 'POST') return notServed(served)
      if (bearer.kind === 'bearer') {
        await readNoBody(request, 'a rotation')
        // `null` or `''` names none, as `undefined` does: the option is asked then too.
        const clientAddress = info?.clientAddress || options.clientAddress?.(request) || undefined
        const result = await tokens.rotate(id!, {
          kind: 'token',
          token: bearer.token,
          ...(clientAddress !== undefined && { clientAddress }),
        }, { signal: callerSignal(request) })
        return json(200, result)
      }
      if (bearer.kind === 'invalid') throw new DispatchError('ERR_UNAUTHORIZED', 401, -32001, 'Unauthorized')
      const s = await session(request, true, info)
      await readNoBody(request, 'a rotation')
      return json(200, await tokens.rotate(id!, { kind: 'session', userId: s.userId }, { signal: callerSignal(request) }))
    }
    // A method the path does not serve is 405 whoever asks, a Bearer caller too (as a `TRACE`,
    // which the Node adapters answer without the API, is): its `Allow` is the path's.
    if (!served.methods.has(method)) return notServed(served)
    if (bearer.kind !== 'missing') {
      // Any Bearer credential, an OAuth access token's included: none manages tokens.
      throw new DispatchError('ERR_FORBIDDEN', 403, -32003, 'A Bearer token may only rotate itself (POST {id}/rotate); the rest of the token API needs a dashboard session')
    }
    if (id === undefined) {
      if (method === 'GET') return json(200, { tokens: await tokens.list((await session(request, false, info)).userId) })
      if (method === 'POST') {
        const s = await session(request, true, info)
        const body = parseInput(createBody, await readJson(request))
        const created = await inApiNames(tokens.create({
          userId: s.userId,
          name: body.name as string,
          servers: body.servers as string[],
          expiresInDays: body.expires_in_days as 7,
          ...(body.allowed_ips !== undefined && { allowedIps: body.allowed_ips as string[] | null }),
        }, { signal: callerSignal(request) }))
        return json(201, created, { location: `${basePath}/${created.id}` })
      }
      return notServed(served)
    }
    if (method === 'GET') return json(200, await tokens.get((await session(request, false, info)).userId, id))
    if (method === 'PATCH') {
      const s = await session(request, true, info)
      const raw = await readJson(request)
      if (raw && typeof raw === 'object' && ('servers' in raw || 'scopes' in raw)) {
        throw new InvalidInputError('servers' in raw ? 'servers' : 'scopes', 'cannot be changed after creation')
      }
      const body = parseInput(updateBody, raw)
      // The HTTP API takes the ISO 8601 string of spec 2.1 only (the service also takes epoch ms).
      if (body.expires_at !== undefined && typeof body.expires_at !== 'string') {
        throw new InvalidInputError('expires_at', 'must be an ISO 8601 timestamp string (e.g. 2026-01-31T12:00:00Z)')
      }
      return json(
        200,
        await inApiNames(
          tokens.update(s.userId, id, {
            ...(body.name !== undefined && { name: body.name as string }),
            ...(body.expires_at !== undefined && { expiresAt: body.expires_at as string }),
            ...(body.allowed_ips !== undefined && { allowedIps: body.allowed_ips as string[] | null }),
          }),
        ),
      )
    }
    if (method === 'DELETE') {
      const s = await session(request, true, info)
      await readNoBody(request, 'a revocation')
      return json(200, await tokens.revoke(s.userId, id))
    }
    return notServed(served)
  }

  async function answer(request: Request, rest: string, info: TokenApiRequestInfo | undefined): Promise<Response> {
    // Read once: the refusal below needs it too (a header of 16,000 commas cost its scan twice).
    const bearer = apiTokenOf(request.headers.get('authorization'))
    try {
      return await route(request, rest, info, bearer)
    } catch (error) {
      // A refusal of a request that presented a Bearer credential, well formed or not, says
      // `invalid_token` (`apiTokenOf`: only another scheme, or none, presents none).
      if (error instanceof DispatchError && error.status < 500) return errorResponse(error, bearer.kind !== 'missing')
      // A client that left mid-body is no failure worth a log line (any client can cause one).
      if (!request.signal?.aborted) onError(error, 'token api')
      return json(503, { error: 'temporarily_unavailable', message: 'Service unavailable' }, { 'retry-after': '1' })
    }
  }

  /**
   * The path of a request the API answers (under `basePath`, on its `hosts`), and whether its
   * Host is one the URL parser refused; `undefined` for a request that is not the API's.
   */
  function ownPath(request: Request): { path: string; hostRefused: boolean } | undefined {
    let path: string | undefined
    let hostRefused = false
    try {
      path = new URL(request.url).pathname
    } catch {
      // A Host @hono/node-server put in the URL without the URL parser (`weather.1`,
      // `1.2.3.999`): not the API's when its path is not, else the client's error, as the Express
      // and Fastify routes answer it (regression: a TypeError out of the API for every request,
      // on any path, where it was mounted in front of the MCP adapter).
      path = pathAfterRefusedHost(request.url)
      hostRefused = true
    }
    if (path === undefined || !isUnderBasePath(path, basePath)) return undefined
    if (hosts !== undefined && !hosts.has(hostnameOf(request) ?? '')) return undefined
    return { path, hostRefused }
  }

  const api = async function tokenApi(request: Request, info?: TokenApiRequestInfo): Promise<Response | null> {
    const own = ownPath(request)
    if (own === undefined) return null
    const { path, hostRefused } = own
    const head = request.method === 'HEAD'
    if (hostRefused) {
      const refused = json(400, { error: 'invalid_request', message: 'host: is not a valid Host header', field: 'host' })
      return head ? await withoutBody(refused) : refused
    }
    const rest = path.slice(basePath.length).replace(/\/$/, '')
    if (!head) return answer(request, rest, info)
    // HEAD is GET without the body (RFC 9110 section 9.3.2). Not `new Request(request, …)`: that
    // reads `request.signal`, which Deno's server warns of on stderr. What a runtime tells of the
    // request beside its headers goes with it: workerd's `cf` (the client certificate, country,
    // bot score a hook may read; regression: a HEAD's hooks saw none, and a session read from it
    // was 401 where its GET was 200).
    const asGet: RequestInit & { cf?: unknown } = { method: 'GET', headers: request.headers }
    const cf = (request as { cf?: unknown }).cf
    if (cf !== undefined) asGet.cf = cf
    return withoutBody(await answer(new Request(request.url, asGet), rest, info))
  }
  const made = Object.assign(api, { basePath }) as TokenApi
  setTokenApiTraits(made, { report: onError, owns: (request) => ownPath(request) !== undefined })
  return made
}
/**
 * The `hosts` option as a set of host names as the URL parser writes them (lower case, an IDN
 * in punycode, IPv6 in brackets), which is how a request's are read; `undefined` for every host.
 */
function hostsOption(hosts: unknown): ReadonlySet<string> | undefined {
  if (hosts === undefined) return undefined
  if (!Array.isArray(hosts) || hosts.length === 0) throw new ConfigurationError('hosts', 'must be a non-empty array of host names')
  const names = new Set<string>()
  for (const [i, host] of hosts.entries()) {
    // A host name only: no scheme, port, path, user or wildcard (`https://dash.example.com`,
    // `dash.example.com:443`, `*.example.com`), and no trailing dot (a second name of the host).
    // An IPv6 address with or without its brackets.
    const ipv6 = typeof host === 'string' && host.includes(':') && !host.startsWith('[')
    const url = typeof host === 'string' && host !== '' && !/[/\\@*?#%\s]|\.$/.test(host) ? parseUrl(`http://${ipv6 ? `[${host}]` : host}`) : undefined
    if (url === undefined || url.port !== '' || url.hostname === '') {
      throw new ConfigurationError(`hosts.${i}`, 'must be a host name, without scheme, port or wildcard (dashboard.example.com, 192.0.2.1, ::1)')
    }
    names.add(url.hostname)
  }
  return names
}

/** Whether this is Deno, whose `Deno.serve` writes a warning on stderr when a request's `signal` is read. */
const ON_DENO = typeof (globalThis as { Deno?: unknown }).Deno === 'object'

/**
 * The request's signal, for a call that hands out a secret (`SecretCallOptions`): none on Deno,
 * whose `Deno.serve` warns on stderr when it is read (its signal aborts once the answer is sent,
 * its legacy behaviour), so a platform there hears nothing it cannot act on.
 */
function callerSignal(request: Request): AbortSignal | undefined {
  return ON_DENO ? undefined : request.signal
}

/**
 * The host name a request is for, as the URL parser writes it: its `Host` header's (only a
 * host and a port), else, with none (HTTP/2), its URL's. A name the parser would rewrite beyond
 * its case (`d%61sh.example.com`, `0x7f.1`, `2130706433`; an IPv6 literal excepted) is none: it
 * is not the listed host as written, and `mcpDispatch` answers such a Host 400 (the Web adapter on
 * `@hono/node-server` refused some of them before the API ran, Express and Fastify none).
 */
function hostnameOf(request: Request): string | undefined {
  const host = request.headers.get('host')
  if (host === null) return parseUrl(request.url)?.hostname
  if (/[/\\@?#]/.test(host)) return undefined
  const hostname = parseUrl(`http://${host}`)?.hostname
  // An IPv6 literal is one address however written (`[0:0::1]` is `[::1]`).
  return host.startsWith('[') || hostname === host.replace(/:\d+$/, '').toLowerCase() ? hostname : undefined
}

/**
 * `response` as the answer to a HEAD: its status and headers, with the `Content-Length` its GET
 * carries (RFC 9110 section 8.6), as the MCP path's HEAD answers: without one, Bun and Deno
 * write `Content-Length: 0` for the empty body, which a HEAD must not send unless its GET's is
 * empty. The API's answers are small JSON documents.
 */
async function withoutBody(response: Response): Promise<Response> {
  const headers = new Headers(response.headers)
  if (response.body !== null) headers.set('content-length', String((await response.arrayBuffer()).byteLength))
  return new Response(null, { status: response.status, statusText: response.statusText, headers })
}

/**
 * The path of a URL whose host the URL parser refused, normalized as it normalizes one (dot
 * segments, percent-encoding); `undefined` when it refuses the path too.
 */
function pathAfterRefusedHost(url: string): string | undefined {
  const schemeEnd = url.indexOf('://')
  const hostStart = schemeEnd === -1 ? 0 : schemeEnd + 3
  const end = url.slice(hostStart).search(/[/?#]/)
  if (end === -1 || url[hostStart + end] !== '/') return '/'
  try {
    // Appended to an origin, not resolved against one: `//x/api/tokens` is a path here too.
    return new URL(`http://token-api.invalid${url.slice(hostStart + end)}`).pathname
  } catch {
    return undefined
  }
}
const NO_BEARER: BearerParseResult = Object.freeze({ kind: 'missing' })
