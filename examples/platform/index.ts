/**
 * The reference hosting platform: every App of a seed served through mcp-dispatch, built only
 * on the public API, on in-memory stores.
 *
 * - `{slug}.{domain}` (default domain `localhost`) serves the App: MCP at `/`, `/v1`,
 *   `/v1.2`, `/v1.2.3`, metadata at `/.well-known/oauth-protected-resource`.
 * - `api.{domain}` serves the token-management API under `/api/tokens`, with a development
 *   sign-in at `POST /dev/session` (`{ "userId": "…" }` → session cookie and CSRF token),
 *   `POST /dev/deploy` (`{ "app": "weather", "version": "1.2.0" }`: a version goes live), and
 *   `POST /dev/password-reset` (session + `X-CSRF-Token`), which revokes every token of the user
 *   and ends the user's other dashboard sessions.
 *   The development endpoints answer loopback clients only.
 */
import { generateKeyPairSync, randomBytes, timingSafeEqual } from 'node:crypto'
import {
  type AccessTokenValidator,
  type AppRecord,
  type DispatchContext,
  type OAuthValidatorOptions,
  type RateLimitPolicy,
  type VersionIndex,
  type VersionSelector,
  API_TOKEN_LENGTH,
  DeployRefusedError,
  MAX_RATE_LIMIT,
  compileTrustProxy,
  compileVersions,
  createDispatcher,
  createOAuthValidator,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenApi,
  createTokenService,
  displayPrefix,
  generateApiToken,
  hashApiToken,
  invalidHostReply,
  resolveClientAddress,
  resolveVersion,
  sessionNotFoundReply,
  validateAllowlist,
  validateTokenName,
  versionNotServedReply,
} from 'mcp-dispatch'
import { type IdentityJwks, type IdentitySignerOptions, createIdentitySigner, createProxyHandler } from 'mcp-dispatch/proxy'
import { type WebRequestInfo, mcpDispatch, toResponse } from 'mcp-dispatch/web'
import { z } from 'zod'
import { type McpAppHandler, buildAppServer, buildModernAppServer, createMcpAppHandler, sweepPeriod } from './mcp-app.js'
import { APP_SLUG, RESERVED_SLUG } from './slug.js'
import { parseUrl } from '../shared/url.js'

/**
 * An upstream of a proxied version: an http(s) URL without user info, as the proxy handler
 * requires (it refuses one with credentials on every request: 502).
 */
const upstreamUrl = z
  .string()
  .url()
  .refine((url) => /^https?:$/.test(parseUrl(url)?.protocol ?? ''), 'must be an http(s) URL')
  .refine((url) => !parseUrl(url)?.username && !parseUrl(url)?.password, 'must not carry credentials (user info)')
const versionEntry = z.union([z.string(), z.object({ version: z.string(), upstream: upstreamUrl }).strict()])
// Strict objects: a misspelt key (`allowedIPs`, `rateLimit`) is an error, never a silently
// missing allowlist or limit.
const seedSchema = z.object({
  apps: z.array(
    z.object({
      id: z.string().min(1),
      slug: z
        .string()
        .regex(APP_SLUG, 'must be a DNS label in lower case')
        .refine((slug) => slug !== RESERVED_SLUG, 'is reserved for the token API host'),
      name: z.string().min(1),
      versions: z.array(versionEntry).default([]),
      rateLimitPerMinute: z.number().int().min(0).max(MAX_RATE_LIMIT).optional(),
    }).strict(),
  ),
  users: z.array(z.object({ id: z.string().min(1) }).strict()).default([]),
  subscriptions: z.array(z.object({ userId: z.string(), appId: z.string(), active: z.boolean() }).strict()).default([]),
  tokens: z
    .array(
      z.object({
        name: z.string().min(1),
        userId: z.string(),
        servers: z.array(z.string()).min(1),
        expiresInDays: z.union([z.literal(7), z.literal(30), z.literal(90)], { error: 'must be 7, 30 or 90' }),
        // Checked by validateAllowlist, as the token API checks it (`[]` is refused: no allowlist is null).
        allowedIps: z.array(z.string()).nullable().optional(),
      }).strict(),
    )
    .default([]),
}).strict()

/** The development endpoints of the `api.` host, each answering POST only. */
const DEV_ENDPOINTS: ReadonlySet<string> = new Set(['/dev/session', '/dev/deploy', '/dev/password-reset'])

/** The largest body a development endpoint reads (a small JSON object); a larger one is refused as it streams in. */
const MAX_DEV_BODY_BYTES = 16_384

/**
 * Whether a CSRF header carries the session's token, compared in constant time. By bytes: a
 * header of the right length in characters can hold a byte past 0x7f, two bytes in UTF-8,
 * which `timingSafeEqual` would refuse with a throw (a 503) instead of a mismatch (a 403).
 */
function csrfMatches(header: string | null, expected: string): boolean {
  const given = Buffer.from(header ?? '')
  const wanted = Buffer.from(expected)
  return given.length === wanted.length && timingSafeEqual(given, wanted)
}

/**
 * A request body as text, read only up to `maxBytes`: `null` once it is larger, never held whole.
 * As the token API reads its bodies: a UTF-8 byte order mark is dropped, and bytes that are not
 * UTF-8 reject (a `TypeError` from the decoder) rather than become U+FFFD.
 */
async function readUpTo(request: Request, maxBytes: number): Promise<string | null> {
  if (Number(request.headers.get('content-length') ?? 0) > maxBytes) return null
  if (!request.body) return ''
  const reader = request.body.getReader()
  const chunks: Uint8Array[] = []
  let size = 0
  for (;;) {
    const { done, value } = await reader.read()
    if (done) return new TextDecoder('utf-8', { fatal: true }).decode(Buffer.concat(chunks))
    size += value.byteLength
    if (size > maxBytes) {
      reader.cancel().catch(() => {})
      return null
    }
    chunks.push(value)
  }
}

/** Development dashboard sessions kept at most. */
const MAX_DEV_SESSIONS = 10_000

/** Whether an address is this machine's (127.0.0.0/8, ::1, and their IPv4-mapped forms). */
function isLoopback(address: string): boolean {
  return address === '::1' || /^(?:::ffff:)?127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/i.test(address)
}

/** The seed of {@link createPlatform} (see `seed.json`). */
export type PlatformSeed = z.input<typeof seedSchema>

/**
 * Checks a seed's shape (every field, no unknown key) and fills in its defaults; what refers to
 * what (subscriptions to users, versions to the deploy rule) {@link createPlatform} checks.
 *
 * @throws {TypeError} naming the first field that is wrong (`seed apps.1.slug: …`), not zod's dump.
 */
export function parseSeed(seed: unknown): z.output<typeof seedSchema> {
  const parsed = seedSchema.safeParse(seed)
  if (parsed.success) return parsed.data
  const issue = parsed.error.issues[0]!
  const path = issue.path.map(String).join('.')
  throw new TypeError(`seed${path ? ` ${path}` : ''}: ${issue.message}${parsed.error.issues.length > 1 ? ` (and ${parsed.error.issues.length - 1} more)` : ''}`)
}

/** Options of {@link createPlatform}. */
export interface PlatformOptions {
  seed: PlatformSeed
  /**
   * Clock, epoch milliseconds. Default `Date.now`; when not given, spans (session TTLs, idle
   * sessions, caches, the breaker's cool-down) are timed on a monotonic clock.
   */
  now?: () => number
  /** Domain the Apps live under: `{slug}.{domain}`. Default `localhost`. */
  domain?: string
  /**
   * Validate OAuth access tokens against this authorization server: `sub` is the seed user's
   * id. Any option of `createOAuthValidator` may be given (mode, audience, timeouts, breaker…);
   * its clock is the platform's `now` when given (its own defaults otherwise; an
   * `authorizationServer.now` is not taken). The issuer is listed in the protected-resource metadata.
   */
  authorizationServer?: Omit<OAuthValidatorOptions, 'now'>
  /** An OAuth validator to use instead of the default one (tests, custom providers). */
  oauth?: AccessTokenValidator
  /** Trust `X-Forwarded-For`, and `X-Forwarded-Proto` for the scheme of App addresses, from these proxies (default: never). */
  trustProxy?: false | number | string[]
  /**
   * Browser origins allowed to call the Apps (the MCP transport's DNS-rebinding rule: any other
   * `Origin` gets 403). Default: `https` pages, and `http` pages on a loopback host
   * (`localhost`, `127.0.0.1`, `[::1]`, such as the MCP Inspector's) or on the platform's own
   * domain (`{domain}` and `*.{domain}`), any port. Requests without `Origin` (every non-browser client) are
   * not affected.
   */
  allowedOrigins?: readonly string[] | ((origin: string) => boolean)
  /** Receives errors the clients only see as a status. Default: `console.error` without secrets. */
  onError?: (error: unknown, context: string) => void
  /**
   * Signs the identity sent to versions seeded as `{ version, upstream }` (proxied, see
   * `mcp-dispatch/proxy`); issuer `http://api.{domain}`. Default: a P-256 key made at start.
   */
  identityKey?: IdentitySignerOptions['privateKey']
  /**
   * How often (by the clock `now` when given, else a monotonic one) idle MCP sessions are closed, and the handler of a version a
   * deploy replaced is dropped once nothing uses it: no session, no stream, no request for the
   * sessions' idle time (30 minutes). Runs on a timer that keeps no process alive. Default 60 s.
   */
  sweepEveryMs?: number
  /**
   * How often the credential of an open MCP stream is checked again (the dispatcher's
   * `reauthorizeEveryMs`): a stream whose token was revoked (a password reset included), rotated
   * away or expired, or whose subscription ended, is ended at the next check. Default 60 s;
   * `false`: never.
   */
  reauthorizeEveryMs?: number | false
}

/** A running reference platform. */
export interface Platform {
  /**
   * Serves one request. `info.clientAddress` is the socket peer address; `info.outgoing`, on
   * Node, the response the answer is written to (see the Web adapter's `WebRequestInfo`).
   */
  fetch(request: Request, info?: WebRequestInfo): Promise<Response>
  /** Seeded token name → full secret. */
  readonly tokens: Readonly<Record<string, string>>
  /**
   * Makes a version live by the versions rule; throws `DeployRefusedError` when refused. With
   * `upstream`, the version is served by proxying to that MCP endpoint.
   */
  deploy(appId: string, version: string, upstream?: string): readonly string[]
  /** The JWKS proxied Apps verify identities against (also at `api.{domain}/.well-known/jwks.json`). */
  jwks(): Promise<IdentityJwks>
  /**
   * The versions of an App this process holds a handler for, sorted as strings: the live ones
   * it serves itself (not proxied), and replaced ones still in use (see `sweepEveryMs`).
   */
  servedVersions(appId: string): string[]
  /** The token service (create, rotate, revoke, revoke-all). */
  readonly tokenService: ReturnType<typeof createTokenService>
  /**
   * Ends the open 2026-07-28 `subscriptions/listen` streams of every App version. They never end
   * on their own; a stop ends them first, so that waiting for the answers in flight does not
   * wait for them (their clients listen again elsewhere).
   */
  endStreams(): void
  /** Closes every open MCP session. */
  close(): Promise<void>
}

const DAY_MS = 86_400_000

/** Every option of {@link createPlatform}: typed so that one added to `PlatformOptions` must be named here. */
const PLATFORM_OPTIONS = Object.keys({
  seed: true,
  now: true,
  domain: true,
  authorizationServer: true,
  oauth: true,
  trustProxy: true,
  allowedOrigins: true,
  onError: true,
  identityKey: true,
  sweepEveryMs: true,
  reauthorizeEveryMs: true,
} satisfies Record<keyof PlatformOptions, true>)

/** A host name in lower case: DNS labels joined by dots, none empty (no port, no trailing dot). */
const HOST_NAME = /^(?=.{1,253}$)[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$/

/**
 * Creates the reference platform from a seed. Synchronous: seeded tokens are minted at once.
 * Throws a `TypeError` naming what is wrong: an option it does not have (a misspelt name), a
 * bad seed (its field), a `now` or `onError` that is not a function, a `domain` that is no host
 * name (`localhost:8787`, `.example.com`).
 *
 * @example
 * ```ts
 * const platform = createPlatform({ seed })
 * const res = await platform.fetch(new Request('http://weather.localhost/v1', { method: 'POST', … }))
 * ```
 */
export function createPlatform(options: PlatformOptions): Platform {
  if (options === null || typeof options !== 'object') throw new TypeError('options: must be an object with a seed')
  // A misspelt option (`sweepEverMs`) would leave its default in silence.
  const unknown = Object.keys(options).filter((key) => !(PLATFORM_OPTIONS as readonly string[]).includes(key))
  if (unknown.length > 0) throw new TypeError(`${unknown.map((key) => JSON.stringify(key)).join(', ')}: not an option of createPlatform (${PLATFORM_OPTIONS.join(', ')})`)
  const seed = parseSeed(options.seed)
  if (options.now !== undefined && typeof options.now !== 'function') throw new TypeError('now: must be a function answering epoch milliseconds')
  const now = options.now ?? Date.now
  // The library's components get the clock only when one is given: by default they time spans
  // (sessions' idle TTL, caches, the breaker's cool-down) on a monotonic clock, which a wall
  // clock stepped by NTP does not move.
  const clock = options.now === undefined ? {} : { now: options.now }
  // A port, a scheme or a stray dot would leave every host unmatched: each request a 404.
  if (options.domain !== undefined && (typeof options.domain !== 'string' || !HOST_NAME.test(options.domain.toLowerCase()))) {
    throw new TypeError(`domain: must be a host name without port or scheme (example.com, localhost), got ${JSON.stringify(String(options.domain))}`)
  }
  const domain = (options.domain ?? 'localhost').toLowerCase()
  if (options.onError !== undefined && typeof options.onError !== 'function') throw new TypeError('onError: must be a function')
  const onError =
    options.onError ??
    ((error: unknown, context: string) =>
      console.error(`[platform] ${context}:`, error instanceof Error ? error.message : String(error)))

  const userIds = new Set(seed.users.map((u) => u.id))
  const apps = createMemoryAppStore()
  const handlers = new Map<string, McpAppHandler>() // `${appId}@${version}`
  const upstreams = new Map<string, string>()
  const appSeeds = new Map(seed.apps.map((a) => [a.id, a]))

  const sweepEveryMs = sweepPeriod(options.sweepEveryMs)
  function ensureHandler(app: AppRecord, version: string): void {
    const key = `${app.id}@${version}`
    if (!handlers.has(key) && !upstreams.has(key)) {
      handlers.set(
        key,
        createMcpAppHandler(() => buildAppServer(app, version), { modern: (notify) => buildModernAppServer(app, version, notify), ...clock, sweepEveryMs }),
      )
    }
  }
  /**
   * A version a deploy replaced keeps its handler while its pinned sessions last; once nothing
   * uses it, it goes (kept for ever, each held about 8 kB and its abandoned sessions more).
   * A session request for it after that gets the same 404 as one its handler had closed.
   */
  function dropReplacedHandlers(): void {
    for (const [key, handler] of handlers) {
      const [appId, version] = keyParts(key)
      if ((apps.getLiveVersions(appId) as readonly string[]).includes(version) || !handler.idle()) continue
      handlers.delete(key)
      void handler.close()
    }
  }
  /**
   * MCP 2026-07-28 requests resolve their version each time (no session pins it), so a deploy
   * that moves `/`, `/vX` or `/vX.Y` to another version changes the lists a client at that
   * address sees: the `subscriptions/listen` streams of each version an address moved away from
   * are told (they stay on their version; the client's next list goes to the new one). A stream
   * opened at an exact URL, or at an address that did not move, may hear it too: it lists again
   * and gets the same lists, or 404 where the deploy retired that version. A version the deploy
   * retired has its exact URL move too (to 404): a pre-release, which no broader address reaches,
   * is told so through it.
   */
  function tellMovedAddresses(appId: string, before: VersionIndex, after: VersionIndex): void {
    for (const [key, handler] of handlers) {
      const [app, version] = keyParts(key)
      if (app !== appId) continue
      const [major, minor] = version.split('.').map(Number) as [number, number]
      const selectors: VersionSelector[] = [
        { kind: 'latest' },
        { kind: 'major', major },
        { kind: 'minor', major, minor },
        { kind: 'exact', version },
      ]
      if (selectors.some((s) => resolveVersion(before, s) === version && resolveVersion(after, s) !== version)) handler.listsChanged()
    }
  }
  const pruner = setInterval(dropReplacedHandlers, sweepEveryMs)
  pruner.unref?.()

  const slugs = new Set<string>()
  for (const [a, app] of seed.apps.entries()) {
    // Named by their place in the seed, as zod names the other fields.
    if (seed.apps.findIndex((other) => other.id === app.id) !== a) throw new TypeError(`seed apps.${a}.id: ${JSON.stringify(app.id)} is used twice`)
    if (slugs.has(app.slug)) throw new TypeError(`seed apps.${a}.slug: ${JSON.stringify(app.slug)} is used twice`)
    slugs.add(app.slug)
    apps.addApp({ id: app.id, slug: app.slug, name: app.name })
    for (const [v, entry] of app.versions.entries()) {
      const version = typeof entry === 'string' ? entry : entry.version
      if (typeof entry !== 'string') upstreams.set(`${app.id}@${version}`, entry.upstream)
      try {
        apps.deploy(app.id, version)
      } catch (error) {
        throw new TypeError(`seed apps.${a}.versions.${v} (${app.slug}): ${(error as Error).message}`, { cause: error })
      }
    }
    // Handlers for what the versions rule left live; a seeded version a later one replaced
    // (1.1.0 before 1.1.1) never served anyone.
    for (const version of apps.getLiveVersions(app.id) as readonly string[]) ensureHandler(app, version)
  }
  const subscribed = new Map<string, boolean>()
  for (const [i, s] of seed.subscriptions.entries()) {
    if (!userIds.has(s.userId)) throw new TypeError(`seed subscriptions.${i}: unknown user ${s.userId}`)
    if (!appSeeds.has(s.appId)) throw new TypeError(`seed subscriptions.${i}: unknown App ${s.appId}`)
    // Two entries for one user and App that disagree: which one holds would be a guess.
    const key = `${s.userId}\u0000${s.appId}`
    if (subscribed.has(key) && subscribed.get(key) !== s.active) {
      throw new TypeError(`seed subscriptions.${i}: ${s.userId} on ${s.appId} is already listed as ${subscribed.get(key) ? 'active' : 'inactive'}`)
    }
    subscribed.set(key, s.active)
  }
  const subscriptions = createMemorySubscriptionStore(seed.subscriptions)
  const tokenStore = createMemoryTokenStore()
  const tokenService = createTokenService({ store: tokenStore, apps, subscriptions, ...clock, onError })

  // Seeded tokens are minted synchronously with the public primitives, so createPlatform
  // stays synchronous; they follow the same rules as tokens created through the API.
  // No prototype: a token may be named `constructor` or `__proto__` like any other.
  const seededTokens: Record<string, string> = Object.create(null) as Record<string, string>
  for (const t of seed.tokens) {
    if (!userIds.has(t.userId)) throw new TypeError(`seed token ${JSON.stringify(t.name)}: unknown user ${t.userId}`)
    // Secrets are handed back by name: two tokens of one name would lose one.
    if (Object.hasOwn(seededTokens, t.name)) throw new TypeError(`seed token ${JSON.stringify(t.name)}: the name is used twice`)
    // The same rules as a name given through the token API, so the dashboard never shows
    // a seeded name the API would have refused.
    const badName = validateTokenName(t.name)
    if (badName) throw new TypeError(`seed token ${JSON.stringify(t.name)}: name ${badName}`)
    if (t.name.trim() !== t.name) throw new TypeError(`seed token ${JSON.stringify(t.name)}: name has spaces around it`)
    const badList = t.allowedIps ? validateAllowlist(t.allowedIps) : null
    if (badList) throw new TypeError(`seed token ${JSON.stringify(t.name)}: allowedIps ${badList.message}`)
    for (const s of t.servers) {
      if (!appSeeds.has(s)) throw new TypeError(`seed token ${JSON.stringify(t.name)}: unknown App ${s}`)
    }
    const secret = generateApiToken()
    const createdAt = now()
    tokenStore.insert({
      id: crypto.randomUUID(),
      userId: t.userId,
      name: t.name,
      tokenHash: hashApiToken(secret),
      displayPrefix: displayPrefix(secret),
      servers: [...new Set(t.servers)],
      allowedIps: t.allowedIps ? [...new Set(t.allowedIps)] : null,
      expiresAt: createdAt + t.expiresInDays * DAY_MS,
      createdAt,
      lastUsedAt: null,
      revokedAt: null,
    })
    seededTokens[t.name] = secret
  }
  if (Object.values(seededTokens).some((s) => s.length !== API_TOKEN_LENGTH)) throw new Error('token length')

  const rateLimits = new Map<string, RateLimitPolicy>()
  for (const app of seed.apps) {
    if (app.rateLimitPerMinute !== undefined) rateLimits.set(app.id, { limit: app.rateLimitPerMinute, windowType: 'minute' })
  }

  const oauth =
    options.oauth ?? (options.authorizationServer && createOAuthValidator({ ...options.authorizationServer, now: options.now }))
  const dispatcher = createDispatcher({
    apps,
    subscriptions,
    tokens: tokenService,
    // The metadata names the authorization server of `oauth` (its issuer, by default); without
    // one, none: API tokens only.
    ...(oauth && { oauth }),
    ...(options.authorizationServer && { authorizationServers: [options.authorizationServer.issuer] }),
    rateLimit: { policy: (_identity, app) => rateLimits.get(app.id) },
    allowedOrigins: options.allowedOrigins ?? ((origin) => isLocalOrigin(origin, domain)),
    resolveApp: (request) => {
      const host = (request.host ?? '').toLowerCase().replace(/:\d+$/, '')
      if (!host.endsWith(`.${domain}`)) return undefined
      const slug = host.slice(0, -domain.length - 1)
      return slug.includes('.') ? undefined : apps.getAppBySlug(slug)
    },
    ...clock,
    onError,
    ...(options.reauthorizeEveryMs !== undefined && { reauthorizeEveryMs: options.reauthorizeEveryMs }),
  })

  // Versions seeded as `{ version, upstream }` run as their own services: proxied, with the
  // caller's identity as a JWT signed by the platform (never the caller's token).
  // Without `identityKey`, a key of this process (a development default): tokens signed before
  // a restart no longer verify after it. A platform keeps its key, and rotates with
  // `previousKeys` (docs/adapters.md, "Key rotation").
  const signer = createIdentitySigner({
    issuer: `http://api.${domain}`,
    privateKey: options.identityKey ?? generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey,
    ...clock,
  })
  const proxy = createProxyHandler({
    upstream: (context) => upstreams.get(`${context.app.id}@${context.version}`),
    identity: signer,
    onError,
  })

  const mcp = mcpDispatch({
    dispatcher,
    ...(options.trustProxy !== undefined && { trustProxy: options.trustProxy }),
    onError,
    handler: (request: Request, context: DispatchContext) => {
      if (upstreams.has(`${context.app.id}@${context.version}`)) return proxy(request, context)
      const handler = handlers.get(`${context.app.id}@${context.version}`)
      if (!handler) {
        // A session pinned to a version whose handler went once unused (dropReplacedHandlers).
        if (request.headers.has('mcp-session-id')) return toResponse(sessionNotFoundReply())
        return toResponse(versionNotServedReply(context.version))
      }
      return handler(request, {
        subject: context.identity.subject,
        ...(context.identity.clientId !== undefined && { clientId: context.identity.clientId }),
        appId: context.app.id,
        version: context.version,
      })
    },
  })

  // Development dashboard sessions: cookie → user, with a double-submit CSRF token.
  const dashboardSessions = new Map<string, { userId: string; csrf: string }>()
  const readSession = (request: Request) => {
    const cookie = request.headers.get('cookie') ?? ''
    const match = /(?:^|;\s*)mcp_dev_session=([A-Za-z0-9_-]{20,100})/.exec(cookie)
    return match ? dashboardSessions.get(match[1]!) : undefined
  }
  const tokenApi = createTokenApi({
    tokens: tokenService,
    authenticateSession: (request) => {
      const s = readSession(request)
      return s ? { userId: s.userId } : null
    },
    verifyCsrf: (request) => {
      const s = readSession(request)
      return !!s && csrfMatches(request.headers.get('x-csrf-token'), s.csrf)
    },
    // A token rotating itself is held to its IP allowlist, like any other use of it.
    clientAddress: (request) => apiClients.get(request)?.address,
    onError,
  })
  // Each request of the api host's socket peer, and its client (the peer, or the one a trusted
  // proxy names); neither for an in-process call.
  const apiClients = new WeakMap<Request, { peer: string | undefined; address: string | undefined }>()
  const apiTrust = compileTrustProxy(options.trustProxy ?? false)

  async function api(request: Request): Promise<Response> {
    const url = new URL(request.url)
    if (url.pathname === '/.well-known/jwks.json') {
      // A document to read, as `examples/fetch` publishes its own: HEAD is GET without the body
      // (RFC 9110 section 9.3.2), any other method 405 (it was a 404, as if there were no JWKS).
      if (request.method !== 'GET' && request.method !== 'HEAD') {
        return methodNotAllowed(url.pathname, ['GET', 'HEAD'])
      }
      // Revalidated by any cache between: a JWKS served stale for minutes would hide a new key
      // from the Apps that fetch it again to find one (they fetch at most every 30 s anyway).
      const jwks = Response.json(await signer.jwks(), { headers: { 'cache-control': 'no-cache' } })
      return request.method === 'HEAD' ? new Response(null, { headers: jwks.headers }) : jwks
    }
    if (url.pathname === '/dev/session' && request.method === 'POST') {
      const body = await devRequestBody(request, ['userId'])
      if (body instanceof Response) return body
      const userId = body.userId
      if (typeof userId !== 'string' || !userIds.has(userId)) return devFieldError('userId', 'is not a known user')
      const id = randomBytes(24).toString('base64url')
      const csrf = randomBytes(24).toString('base64url')
      dashboardSessions.set(id, { userId, csrf })
      // Bounded: the oldest session goes first.
      if (dashboardSessions.size > MAX_DEV_SESSIONS) dashboardSessions.delete(dashboardSessions.keys().next().value!)
      return Response.json(
        { userId, csrfToken: csrf },
        // It holds the session's CSRF token: never stored by a cache, as the token API's answers.
        { headers: { 'set-cookie': `mcp_dev_session=${id}; HttpOnly; SameSite=Strict; Path=/`, 'cache-control': 'no-store' } },
      )
    }
    if (url.pathname === '/dev/deploy' && request.method === 'POST') {
      // What the platform's deploy pipeline does: a version goes live by the versions rule, so
      // the pinning of spec 9.2 can be watched from outside the process (loopback clients only).
      const body = await devRequestBody(request, ['app', 'version', 'upstream'])
      if (body instanceof Response) return body
      const app = typeof body.app === 'string' ? ((await apps.getApp(body.app)) ?? (await apps.getAppBySlug(body.app))) : undefined
      if (app === undefined) return devFieldError('app', 'is not the id or slug of a seeded App')
      if (typeof body.version !== 'string') return devFieldError('version', 'must be a string <major>.<minor>.<patch>')
      // The check `deploy` makes, made first so that its TypeError is never taken for another.
      if (body.upstream !== undefined) {
        const target = upstreamUrl.safeParse(body.upstream)
        if (!target.success) return devFieldError('upstream', target.error.issues[0]?.message ?? 'must be an http(s) URL')
      }
      try {
        const live = platform.deploy(app.id, body.version, body.upstream as string | undefined)
        return Response.json({ app: app.slug, version: body.version, live })
      } catch (error) {
        if (!(error instanceof DeployRefusedError)) throw error
        return Response.json({ error: 'deploy_refused', message: error.message, field: 'version' }, { status: 409 })
      }
    }
    if (url.pathname === '/dev/password-reset' && request.method === 'POST') {
      // What the dashboard does after a password reset (spec 3): every token of the user is revoked.
      const elsewhere = notThisMachine(request)
      if (elsewhere) return elsewhere
      const session = readSession(request)
      if (!session) return Response.json({ error: 'unauthorized', message: 'A dashboard session is required' }, { status: 401 })
      if (!csrfMatches(request.headers.get('x-csrf-token'), session.csrf)) {
        return Response.json({ error: 'csrf_failed', message: 'CSRF check failed' }, { status: 403 })
      }
      const revoked = await tokenService.revokeAllForUser(session.userId)
      // A reset also signs the user out everywhere else: a session opened with the old password
      // (a stolen cookie) ends with it. The one that made the reset goes on.
      for (const [id, other] of dashboardSessions) if (other.userId === session.userId && other !== session) dashboardSessions.delete(id)
      return Response.json({ revoked })
    }
    if (DEV_ENDPOINTS.has(url.pathname)) {
      return methodNotAllowed(url.pathname, ['POST'])
    }
    return (await tokenApi(request)) ?? Response.json({ error: 'not_found', message: 'Not found' }, { status: 404 })
  }

  /**
   * The 403 of a development endpoint for a client that is not on this machine (an in-process
   * call has no address). Every address the request names must be this machine's: the socket
   * peer, the client (the one a trusted proxy forwards), and each hop of `X-Forwarded-For`, to
   * which a proxy on this machine, trusted or not, appends its client; a `Forwarded` header,
   * which the platform does not read, refuses. A reverse proxy on this machine would otherwise
   * make every client of it loopback; one that appends nothing still does (docs/platform.md).
   * The peer is checked beside the client: trusting a hop count, or a proxy that appends
   * nothing, a remote client's own `X-Forwarded-For: 127.0.0.1` made it the loopback client.
   */
  function notThisMachine(request: Request): Response | undefined {
    const { peer, address } = apiClients.get(request) ?? {}
    if (peer === undefined || address === undefined) return undefined
    const hops = request.headers.get('x-forwarded-for')?.split(',') ?? []
    if (isLoopback(address) && isLoopback(peer) && !request.headers.has('forwarded') && hops.every((hop) => isLoopback(hop.trim()))) return undefined
    return Response.json({ error: 'forbidden', message: 'The development endpoints answer loopback clients only' }, { status: 403 })
  }

  /**
   * The JSON object a development endpoint was sent, or the answer refusing it: such an
   * endpoint answers this machine only, whatever HOST the server listens on (an in-process call
   * has no address), and JSON only, so no page of another site can send it as a simple
   * cross-site request. A key not in `fields` is refused with a 400 naming it, as the token API
   * refuses one: a misspelled `upstream` would otherwise deploy the version in process.
   */
  async function devRequestBody(request: Request, fields: readonly string[]): Promise<Record<string, unknown> | Response> {
    const elsewhere = notThisMachine(request)
    if (elsewhere) return elsewhere
    if (!/^application\/json[ \t]*(;|$)/i.test(request.headers.get('content-type') ?? '')) {
      return devFieldError('content-type', 'must be application/json')
    }
    // Read as sent, as the token API reads its bodies: a body in a content coding is named as
    // such, not taken for a body that is not JSON.
    const codings = (request.headers.get('content-encoding') ?? '').split(',').map((coding) => coding.trim().toLowerCase())
    if (codings.some((coding) => coding !== '' && coding !== 'identity')) {
      return devFieldError('content-encoding', 'is not supported: send the body uncompressed (no Content-Encoding, or identity)')
    }
    let text: string | null
    try {
      text = await readUpTo(request, MAX_DEV_BODY_BYTES)
    } catch (error) {
      if (error instanceof TypeError && (error as { code?: unknown }).code === 'ERR_ENCODING_INVALID_ENCODED_DATA') return devFieldError('body', 'is not valid UTF-8')
      throw error
    }
    if (text === null) return devFieldError('body', `must be at most ${MAX_DEV_BODY_BYTES} bytes`)
    let body: unknown
    try {
      body = JSON.parse(text)
    } catch {
      return devFieldError('body', 'is not JSON')
    }
    if (typeof body !== 'object' || body === null || Array.isArray(body)) return devFieldError('body', 'must be a JSON object')
    const unknown = Object.keys(body).find((key) => !fields.includes(key))
    if (unknown !== undefined) {
      // Named when it reads as a key: a long one (a token, a session cookie or a CSRF token
      // pasted as a key: 32 characters and more) is not sent back.
      const named = unknown.length <= 24 && /^[A-Za-z_$][\w$]*$/.test(unknown)
      const problem = `is not a field of ${new URL(request.url).pathname} (${fields.join(', ')})`
      return named ? devFieldError(unknown, problem) : devFieldError('body', `holds a key (not shown) that ${problem}`)
    }
    return body as Record<string, unknown>
  }

  const platform: Platform = {
    tokens: seededTokens,
    tokenService,
    async fetch(request, info) {
      let host: string
      try {
        host = new URL(request.url).hostname.toLowerCase()
      } catch {
        // A Host @hono/node-server put in the URL without the URL parser (`weather.1`,
        // `1.2.3.999`, `xn--a.localhost` before Node 24): the client's error, answered as the Web adapter answers
        // it (regression: the TypeError made @hono/node-server answer 500).
        return toResponse(invalidHostReply())
      }
      // Two `Host` fields (RFC 9112 section 3.2: 400): @hono/node-server joins them here and built
      // the URL of the first one, so one naming `api.` must not reach the API either.
      if (request.headers.get('host')?.includes(',')) return toResponse(invalidHostReply())
      if (host === `api.${domain}`) {
        // The API reads every body it is sent: `100 Continue` at once where the server left the
        // client waiting for it (`checkContinue`, as `npm start` wires it), decided by the host
        // routed by here (an absolute-form target's, not the `Host` header's).
        continueNow(info?.outgoing)
        const peer = info?.clientAddress || undefined
        apiClients.set(request, { peer, address: resolveClientAddress(peer, request.headers.get('x-forwarded-for'), apiTrust) })
        return api(request)
      }
      return mcp(request, info)
    },
    jwks: () => signer.jwks(),
    servedVersions: (appId) =>
      [...handlers.keys()]
        .map(keyParts)
        .filter(([app]) => app === appId)
        .map(([, version]) => version)
        .sort(),
    deploy(appId, version, upstream) {
      // Checked before the version goes live: a version refused here never serves anyone.
      const target = upstream === undefined ? undefined : upstreamUrl.safeParse(upstream)
      if (target !== undefined && !target.success) {
        throw new TypeError(`deploy ${appId}@${version}: upstream ${target.error.issues[0]?.message ?? 'is not an http(s) URL'}`)
      }
      const before = compileVersions(apps.getLiveVersions(appId) as readonly string[])
      const live = apps.deploy(appId, version) as readonly string[]
      tellMovedAddresses(appId, before, compileVersions(live))
      if (target !== undefined) upstreams.set(`${appId}@${version}`, new URL(target.data!).href)
      const app = appSeeds.get(appId)!
      ensureHandler({ id: app.id, slug: app.slug, name: app.name }, version)
      return live
    },
    endStreams() {
      for (const handler of handlers.values()) handler.endListens()
    },
    async close() {
      clearInterval(pruner)
      await Promise.all([...handlers.values()].map((h) => h.close()))
      await tokenService.close()
    },
  }
  return platform
}

/** The App id and the version of a handler key, `${appId}@${version}` (a version holds no `@`). */
function keyParts(key: string): [appId: string, version: string] {
  const at = key.lastIndexOf('@')
  return [key.slice(0, at), key.slice(at + 1)]
}

/** 405 for a path of the api host asked with another method than `methods`, which `Allow` lists. */
function methodNotAllowed(pathname: string, methods: readonly string[]): Response {
  const message = `${pathname} takes ${methods.join(' or ')}`
  return Response.json({ error: 'method_not_allowed', message }, { status: 405, headers: { allow: methods.join(', ') } })
}

/** 400 naming the field of a development endpoint's request that is wrong. */
function devFieldError(field: string, problem: string): Response {
  return Response.json({ error: 'invalid_request', message: `${field}: ${problem}`, field }, { status: 400 })
}

/**
 * `100 Continue` on a Node response whose HTTP/1.1 request expects it and has not had it: Node's
 * own marks, as the dispatch layer's adapters read them (docs/adapters.md, "Expect:
 * 100-continue").
 */
function continueNow(outgoing: unknown): void {
  const res = outgoing as { _expect_continue?: boolean; _sent100?: boolean; writeContinue?: () => void } | undefined
  if (res?._expect_continue === true && res._sent100 !== true) res.writeContinue?.()
}

/**
 * The platform's default `allowedOrigins`: any `https` page, and `http` pages on a loopback
 * host or under `domain`. DNS rebinding, which the MCP transport's Origin check is for, needs a
 * page that reaches this plain-HTTP server as its own origin: a page served over `http` from
 * another name (`http://evil.example.com`, its name rebound to 127.0.0.1). An `https` page
 * rebound here would fail its TLS handshake, so hosted browser clients keep working.
 */
function isLocalOrigin(origin: string, domain: string): boolean {
  const url = parseUrl(origin)
  if (url === undefined) return false
  // An origin exactly as browsers serialize it (RFC 6454): lower case, no default port, path,
  // user info, or non-ASCII name.
  if (url.origin !== origin) return false
  const { protocol, hostname } = url
  if (protocol === 'https:') return true
  if (protocol !== 'http:') return false
  return (
    hostname === 'localhost' ||
    hostname === '127.0.0.1' ||
    hostname === '[::1]' ||
    hostname === domain ||
    hostname.endsWith(`.${domain}`)
  )
}
