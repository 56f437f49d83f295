/**
 * A development OAuth 2.0 / OpenID Connect authorization server for the reference platform
 * (`oidc-provider`), so an MCP client can sign in with no other setup. Never for production:
 * it signs everyone in without a password.
 *
 * - Listens on loopback only (`127.0.0.1`); the issuer is `http://127.0.0.1:{port}`.
 * - Dynamic client registration (RFC 7591) is open; PKCE (S256) is required.
 * - Browser-based clients (a page, such as the MCP Inspector's) can sign in: registration
 *   answers pages served from this machine (CORS; a website's page could otherwise get a code of
 *   the automatic sign-in), and the token endpoint those of the origin of one of the client's
 *   redirect URIs.
 * - Sign-in is automatic: the authorization request's `login_hint` names the seed user to sign
 *   in as (an unknown one is refused with `access_denied`); without it, the first account.
 *   A browser's session (its cookie) is never reused: each authorization request signs in
 *   anew (so `prompt=none` is always `login_required`).
 *   Consent is granted for whatever was asked. An authorization request without `scope` gets
 *   the scopes the platform's metadata names (`openid profile email`): RFC 6749 section 3.3
 *   lets a server use a default, and oidc-provider alone would refuse the request
 *   (`access_denied`: no scope granted), which MCP clients that omit `scope` do.
 * - Refresh tokens are issued to every client registered with the `refresh_token` grant.
 * - Userinfo is at `/me` (oidc-provider's path, published in discovery).
 * - `resourceIndicators` (RFC 8707) binds tokens to the App they were requested for
 *   (`aud` = the `resource`): JWT access tokens (for `mode: 'jwt'`) or opaque ones (for
 *   `mode: 'introspection'`). Such tokens are refused at userinfo by oidc-provider, so the
 *   default (off) is what `mode: 'userinfo'` needs.
 * - Token expiry follows the injected clock `now`, so tests make tokens expire without waiting.
 */
import { randomBytes } from 'node:crypto'
import { type IncomingMessage, type ServerResponse, createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { exportJWK, generateKeyPair } from 'jose'
import { DEFAULT_SCOPES_SUPPORTED } from 'mcp-dispatch'
import Provider, { type Adapter, type AdapterPayload, type ClientRef } from 'oidc-provider'
import { parseUrl } from '../shared/url.js'

/** Options of {@link startDevAuthServer}. */
export interface DevAuthServerOptions {
  /** User ids that may sign in (the seed's users); the first one is the default. */
  accounts: readonly string[]
  /** Port; default 0 (an ephemeral one). */
  port?: number
  /** Loopback address to bind. Default `127.0.0.1`. */
  host?: string
  /** Lifetime of access tokens. Default 3600 s. */
  accessTokenTtlSeconds?: number
  /** Clock for token expiry, epoch ms. Default `Date.now`. */
  now?: () => number
  /** Bind tokens to the requested resource (RFC 8707), as JWTs or opaque tokens. Default off. */
  resourceIndicators?: { accessTokenFormat: 'jwt' | 'opaque' }
  /** A confidential client for the resource server, allowed to call the introspection endpoint. */
  introspectionClient?: { clientId: string; clientSecret: string }
  /** Sees every request (method and path), e.g. to count userinfo calls. */
  onRequest?: (request: { method: string; path: string }) => void
}

/** A running development authorization server. */
export interface DevAuthServer {
  /** Issuer identifier, `http://127.0.0.1:{port}`. */
  readonly issuer: string
  readonly port: number
  /** Userinfo endpoint (`{issuer}/me`). */
  readonly userinfoEndpoint: string
  /** Stops listening and closes open connections. */
  close(): Promise<void>
}

/** oidc-provider's dynamic client registration endpoint (RFC 7591). */
const REGISTRATION_PATH = '/reg'

/** Registered clients kept by the development server; the least recently registered go first. */
const MAX_CLIENTS = 10_000

/**
 * Entries of every kind the development server keeps at most (interactions, sessions, grants,
 * codes, tokens, registration tokens, clients): past it, expired ones go, then the least
 * recently written, down to nine tenths of it. Anyone can make it store some (an
 * authorization request stores an interaction for an hour; a registration, a client and its
 * registration token for good).
 */
const MAX_ENTRIES = 50_000

/** The largest registration request taken (RFC 7591 metadata of a client: a few hundred bytes). */
const MAX_REGISTRATION_BYTES = 16 * 1024

/** oidc-provider storage on an injectable clock: entries past their expiry are not found. */
function createAdapterFactory(now: () => number): (model: string) => Adapter {
  const entries = new Map<string, { payload: AdapterPayload; expiresAt: number }>()
  const byGrant = new Map<string, Set<string>>()
  const byUid = new Map<string, string>()
  const byUserCode = new Map<string, string>()
  // Dynamic client registration is open to anyone and registrations never expire: the oldest
  // go first past MAX_CLIENTS, so a flood of registrations cannot grow the process for ever.
  const clients = new Set<string>()
  let writes = 0

  /** Forgets the entry under `key`, and what the lookup maps hold of it. */
  const drop = (key: string) => {
    const payload = entries.get(key)?.payload
    entries.delete(key)
    clients.delete(key)
    if (!payload) return
    const id = key.slice(key.indexOf(':') + 1)
    if (payload.grantId) {
      const keys = byGrant.get(payload.grantId)
      keys?.delete(key)
      if (keys?.size === 0) byGrant.delete(payload.grantId)
    }
    if (payload.uid && byUid.get(payload.uid) === id) byUid.delete(payload.uid)
    if (payload.userCode && byUserCode.get(payload.userCode) === id) byUserCode.delete(payload.userCode)
  }
  const read = (key: string) => {
    const entry = entries.get(key)
    if (entry && entry.expiresAt <= now()) {
      drop(key)
      return undefined
    }
    return entry?.payload
  }
  const sweep = () => {
    const at = now()
    for (const [key, entry] of entries) if (entry.expiresAt <= at) drop(key)
  }

  return (model) => ({
    async upsert(id, payload, expiresIn) {
      const key = `${model}:${id}`
      // `exp` as reported (introspection) follows the same clock as the expiry below.
      if (typeof expiresIn === 'number' && typeof payload.exp === 'number') payload.exp = Math.floor(now() / 1000) + expiresIn
      // Written last: the least recently written go first past MAX_ENTRIES.
      entries.delete(key)
      entries.set(key, { payload, expiresAt: typeof expiresIn === 'number' ? now() + expiresIn * 1000 : Infinity })
      if (payload.grantId) {
        let keys = byGrant.get(payload.grantId)
        if (!keys) byGrant.set(payload.grantId, (keys = new Set()))
        keys.add(key)
      }
      if (model === 'Session' && payload.uid) byUid.set(payload.uid, id)
      if (payload.userCode) byUserCode.set(payload.userCode, id)
      if (model === 'Client') {
        clients.delete(key)
        clients.add(key)
        for (const oldest of clients) {
          if (clients.size <= MAX_CLIENTS) break
          drop(oldest)
        }
      }
      if (++writes % 500 === 0) sweep()
      if (entries.size > MAX_ENTRIES) {
        // Down to nine tenths at once, so a full store does not sweep at every write.
        sweep()
        for (const oldest of entries.keys()) {
          if (entries.size <= MAX_ENTRIES * 0.9) break
          drop(oldest)
        }
      }
    },
    async find(id) {
      return read(`${model}:${id}`)
    },
    async findByUid(uid) {
      const id = byUid.get(uid)
      return id === undefined ? undefined : read(`${model}:${id}`)
    },
    async findByUserCode(userCode) {
      const id = byUserCode.get(userCode)
      return id === undefined ? undefined : read(`${model}:${id}`)
    },
    async consume(id) {
      const payload = read(`${model}:${id}`)
      if (payload) payload.consumed = Math.floor(now() / 1000)
    },
    async destroy(id) {
      drop(`${model}:${id}`)
    },
    async revokeByGrantId(grantId) {
      for (const key of [...(byGrant.get(grantId) ?? [])]) drop(key)
      byGrant.delete(grantId)
    },
  })
}

/**
 * Starts the development authorization server.
 *
 * @example
 * ```ts
 * const auth = await startDevAuthServer({ accounts: ['user_alice', 'user_bob'] })
 * const platform = createPlatform({ seed, authorizationServer: { issuer: auth.issuer } })
 * // … later
 * await auth.close()
 * ```
 */
export async function startDevAuthServer(options: DevAuthServerOptions): Promise<DevAuthServer> {
  const accounts = [...options.accounts]
  if (accounts.length === 0) throw new TypeError('startDevAuthServer: at least one account is needed')
  const host = options.host ?? '127.0.0.1'
  const now = options.now ?? Date.now
  const ttl = options.accessTokenTtlSeconds ?? 3600
  const resourceIndicators = options.resourceIndicators

  // The issuer names the port, so listen first and attach the provider once it is known.
  let handle: (req: IncomingMessage, res: ServerResponse) => void = (_req, res) => {
    res.statusCode = 503
    res.end()
  }
  const server = createServer((req, res) => handle(req, res))
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(options.port ?? 0, host, () => resolve())
  })
  const port = (server.address() as AddressInfo).port
  const issuer = `http://${host}:${port}`

  const { privateKey } = await generateKeyPair('RS256', { extractable: true })
  const signingKey = { ...(await exportJWK(privateKey)), kid: randomBytes(8).toString('hex'), alg: 'RS256', use: 'sig' }

  const provider = new Provider(issuer, {
    adapter: createAdapterFactory(now),
    clients: options.introspectionClient
      ? [
          {
            client_id: options.introspectionClient.clientId,
            client_secret: options.introspectionClient.clientSecret,
            grant_types: [],
            response_types: [],
            redirect_uris: [],
          },
        ]
      : [],
    findAccount: async (_ctx: unknown, id: string) =>
      accounts.includes(id)
        ? { accountId: id, claims: async () => ({ sub: id, name: id, email: `${id}@example.test`, email_verified: true }) }
        : undefined,
    interactions: { url: (_ctx: unknown, interaction: { uid: string }) => `/interaction/${interaction.uid}` },
    claims: { openid: ['sub'], profile: ['name'], email: ['email', 'email_verified'] },
    scopes: ['openid', 'offline_access', 'profile', 'email'],
    features: {
      devInteractions: { enabled: false },
      registration: { enabled: true },
      introspection: { enabled: true },
      revocation: { enabled: true },
      resourceIndicators: resourceIndicators
        ? {
            enabled: true,
            defaultResource: async (_ctx: unknown, _client: unknown, oneOf?: string | string[]) => oneOf,
            useGrantedResource: async () => true,
            getResourceServerInfo: async (_ctx: unknown, resource: string) => ({
              scope: 'openid profile email',
              audience: resource,
              accessTokenTTL: ttl,
              accessTokenFormat: resourceIndicators.accessTokenFormat,
              ...(resourceIndicators.accessTokenFormat === 'jwt' && { jwt: { sign: { alg: 'RS256' } } }),
            }),
          }
        : { enabled: false },
    },
    pkce: { required: () => true },
    ttl: {
      AccessToken: () => ttl,
      AuthorizationCode: 60,
      IdToken: 3600,
      Interaction: 3600,
      Grant: 14 * 86_400,
      Session: 14 * 86_400,
      RefreshToken: 14 * 86_400,
    },
    issueRefreshToken: async (_ctx: unknown, client: ClientRef) => client.grantTypeAllowed('refresh_token'),
    // A page may call the token, revocation and introspection endpoints for a client that
    // authenticates with nothing (`none`: a browser-based one), and userinfo for any client,
    // from the origin of one of the client's redirect URIs: oidc-provider's default, stated so
    // that it does not warn at each call.
    clientBasedCORS: (ctx: { oidc: { route: string } }, origin: string, client: ClientRef) =>
      origin !== 'null' &&
      (ctx.oidc.route === 'userinfo' || client.clientAuthMethod === 'none') &&
      client.redirectUris.some((uri) => parseUrl(uri)?.origin === origin),
    clockTolerance: 0,
    cookies: { keys: [randomBytes(32).toString('base64url')] },
    jwks: { keys: [signingKey] },
    formats: {
      customizers: {
        // JWT access tokens carry times from the injected clock, like the opaque ones' expiry.
        jwt: async (_ctx: unknown, _token: unknown, jwt: { payload: Record<string, unknown> }) => {
          const iat = Math.floor(now() / 1000)
          jwt.payload.iat = iat
          jwt.payload.exp = iat + ttl
        },
      },
    },
    renderError: async (ctx: { type: string; body: unknown }, out: Record<string, unknown>) => {
      ctx.type = 'json'
      ctx.body = out
    },
  })
  const callback = provider.callback()

  async function interact(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const details = await provider.interactionDetails(req, res)
    const { prompt, params } = details
    if (prompt.name === 'login') {
      const hint = typeof params.login_hint === 'string' && params.login_hint !== '' ? params.login_hint : accounts[0]!
      const result = accounts.includes(hint)
        ? { login: { accountId: hint } }
        : { error: 'access_denied', error_description: 'login_hint names no known user' }
      return provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false })
    }
    if (prompt.name === 'consent') {
      const accountId = details.session?.accountId
      if (!accountId) throw new Error('consent without a session')
      const grant =
        (details.grantId ? await provider.Grant.find(details.grantId) : undefined) ??
        new provider.Grant({ accountId, clientId: String(params.client_id) })
      const missing = prompt.details as {
        missingOIDCScope?: string[]
        missingOIDCClaims?: string[]
        missingResourceScopes?: Record<string, string[]>
      }
      if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '))
      if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims)
      for (const [resource, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
        grant.addResourceScope(resource, scopes.join(' '))
      }
      const grantId = await grant.save()
      return provider.interactionFinished(req, res, { consent: { grantId } }, { mergeWithLastSubmission: true })
    }
    res.statusCode = 400
    res.end(`unsupported prompt ${prompt.name}`)
  }

  handle = (req, res) => {
    const path = (req.url ?? '/').split('?', 1)[0]!
    options.onRequest?.({ method: req.method ?? 'GET', path })
    const origin = req.headers.origin
    // As oidc-provider routes it: in any case, a trailing slash dropped (`/REG/` is `/reg`). A
    // loop, not `/\/+$/`, whose time is quadratic in a path of many slashes not at its end.
    let end = path.length
    while (end > 0 && path.charCodeAt(end - 1) === 0x2f) end--
    const route = path.slice(0, end).toLowerCase()
    if (route === REGISTRATION_PATH && origin !== undefined && isLoopbackOrigin(origin)) {
      // oidc-provider sends no CORS headers at the registration endpoint, so a browser-based
      // MCP client (a page, such as the MCP Inspector's) could not register. Pages served from
      // this machine only: sign-in is automatic here, so a page of any website that could
      // register would get a code for its own redirect URI, and with it a token of the
      // developer's seed user (regression: `*` let https://evil.example do it).
      res.setHeader('access-control-allow-origin', origin)
      res.setHeader('vary', 'Origin')
      if (req.method === 'OPTIONS') {
        res.writeHead(204, {
          'access-control-allow-methods': 'POST',
          'access-control-allow-headers': 'Content-Type, Accept',
          'access-control-max-age': '600',
        })
        res.end()
        return
      }
    }
    // Open to anyone, and kept: a registration is bounded in size (its length said up front).
    if (route === REGISTRATION_PATH && req.method === 'POST') {
      const length = Number(req.headers['content-length'])
      if (!Number.isSafeInteger(length) || length > MAX_REGISTRATION_BYTES) {
        const status = length > MAX_REGISTRATION_BYTES ? 413 : 411
        const description = `registration must declare its Content-Length, at most ${MAX_REGISTRATION_BYTES} bytes`
        res.writeHead(status, { 'content-type': 'application/json', connection: 'close' })
        res.end(JSON.stringify({ error: 'invalid_client_metadata', error_description: description }))
        return
      }
    }
    if (req.method === 'GET' && route === '/auth') req.url = withDefaultScope(req.url ?? '/auth')
    if (route === '/auth') withoutSession(req, res)
    if (req.method === 'GET' && path.startsWith('/interaction/')) {
      interact(req, res).catch((error: unknown) => {
        res.statusCode = 400
        res.setHeader('content-type', 'application/json')
        res.end(JSON.stringify({ error: 'invalid_request', error_description: error instanceof Error ? error.message : 'interaction failed' }))
      })
      return
    }
    callback(req, res)
  }

  return {
    issuer,
    port,
    userinfoEndpoint: `${issuer}/me`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve())
        server.closeAllConnections()
      }),
  }
}

/**
 * Drops oidc-provider's session from an authorization request (`/auth`, before the sign-in it
 * resumes at `/auth/{uid}`), and from the browser, so that each authorization request signs in
 * anew as its `login_hint` names (or as the first account). Sign-in is automatic, so a session
 * saves nothing; kept, it made a browser that had signed in once (its cookie kept, as browsers
 * and the MCP Inspector's page keep it) get that first user's token for every later request,
 * whatever its `login_hint` named, an unknown user's included. (A login prompt forced for
 * another user instead ends in oidc-provider's logout page, which only a page running scripts
 * submits.)
 */
function withoutSession(req: IncomingMessage, res: ServerResponse): void {
  const cookie = req.headers.cookie
  if (cookie === undefined) return
  const dropped: string[] = []
  const kept = cookie.split(';').filter((pair) => {
    const name = pair.slice(0, pair.indexOf('=') >>> 0).trim()
    if (name !== '_session' && name !== '_session.sig') return true
    dropped.push(name)
    return false
  })
  if (dropped.length === 0) return
  if (kept.length === 0) delete req.headers.cookie
  else req.headers.cookie = kept.join(';')
  // Expired in the browser too: the resumption after sign-in must not bring it back. (oidc-
  // provider adds its own cookies to these.)
  res.setHeader(
    'set-cookie',
    dropped.map((name) => `${name}=; path=/; expires=Thu, 01 Jan 1970 00:00:00 GMT; samesite=lax; httponly`),
  )
}

/** A page served from this machine: `localhost`, `*.localhost`, `127.0.0.1` or `[::1]`, any port. */
function isLoopbackOrigin(origin: string): boolean {
  const url = parseUrl(origin)
  if (url === undefined) return false
  const { protocol, hostname } = url
  if (protocol !== 'http:' && protocol !== 'https:') return false
  return hostname === 'localhost' || hostname.endsWith('.localhost') || hostname === '127.0.0.1' || hostname === '[::1]'
}

/**
 * The authorization request `url` (`/auth?…`) with `scope` set to the default when it is
 * missing or empty (RFC 6749 section 3.3: "a pre-defined default value").
 */
function withDefaultScope(url: string): string {
  const query = url.indexOf('?')
  const params = new URLSearchParams(query === -1 ? '' : url.slice(query + 1))
  if (params.get('scope')?.trim()) return url
  params.set('scope', DEFAULT_SCOPES_SUPPORTED.join(' '))
  return `/auth?${params}`
}
