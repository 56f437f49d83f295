/**
 * The MCP client side of the OAuth tests: an in-memory `OAuthClientProvider` that performs
 * the browser part of the authorization itself (fetch with manual redirects and a cookie
 * jar, against the development authorization server's automatic sign-in), plus fetch
 * functions that reach `*.localhost` Apps without DNS.
 */
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { getRequestListener } from '@hono/node-server'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { type OAuthClientProvider, type OAuthDiscoveryState, UnauthorizedError, auth } from '@modelcontextprotocol/sdk/client/auth.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type {
  OAuthClientInformationMixed,
  OAuthClientMetadata,
  OAuthTokens,
} from '@modelcontextprotocol/sdk/shared/auth.js'

/** A fetch function, as the SDK takes it. */
export type FetchLike = (input: string | URL, init?: RequestInit) => Promise<Response>

/** One request seen by a {@link recordingFetch}. */
export interface RecordedRequest {
  readonly method: string
  readonly url: string
  readonly status: number
  readonly authorization: string | null
  readonly wwwAuthenticate: string | null
  readonly body: string | null
}

/**
 * Wraps `inner` and records every request (method, URL as the client addressed it, status,
 * whether a bearer was sent).
 */
export function recordingFetch(inner: FetchLike): FetchLike & { log: RecordedRequest[] } {
  const log: RecordedRequest[] = []
  const wrapped = async (input: string | URL, init?: RequestInit) => {
    const response = await inner(input, init)
    log.push({
      method: init?.method ?? 'GET',
      url: String(input),
      status: response.status,
      authorization: new Headers(init?.headers).get('authorization'),
      wwwAuthenticate: response.headers.get('www-authenticate'),
      body: typeof init?.body === 'string' ? init.body : init?.body instanceof URLSearchParams ? init.body.toString() : null,
    })
    return response
  }
  return Object.assign(wrapped, { log })
}

/**
 * `fetch` that serves `*.localhost` URLs in process with `platformFetch` (no DNS, no socket)
 * and everything else (the authorization server) over the network.
 */
export function inProcessFetch(platformFetch: (request: Request) => Promise<Response>): FetchLike {
  return async (input, init) => {
    const url = new URL(String(input))
    if (url.hostname.endsWith('.localhost')) return platformFetch(new Request(url, init))
    return fetch(input, init)
  }
}

/**
 * Serves `platformFetch` over real HTTP on 127.0.0.1. Node's fetch cannot send a `Host`
 * header of its own, so {@link loopbackFetch} sends the App's host in `x-test-host` and the
 * server puts it back before the request reaches the platform.
 */
export async function servePlatform(
  platformFetch: (request: Request, info?: { clientAddress?: string }) => Promise<Response>,
): Promise<{ port: number; close(): Promise<void> }> {
  const listener = getRequestListener((request, env: { incoming?: { socket?: { remoteAddress?: string } } }) =>
    platformFetch(request, { clientAddress: env.incoming?.socket?.remoteAddress }),
  )
  const server = createServer((req, res) => {
    const host = req.headers['x-test-host']
    if (typeof host === 'string') {
      req.headers.host = host
      delete req.headers['x-test-host']
    }
    void listener(req, res)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve())
        server.closeAllConnections()
      }),
  }
}

/** `fetch` that sends `*.localhost` URLs to 127.0.0.1 (same port), naming the host in `x-test-host`. */
export const loopbackFetch: FetchLike = async (input, init) => {
  const url = new URL(String(input))
  if (!url.hostname.endsWith('.localhost')) return fetch(input, init)
  const headers = new Headers(init?.headers)
  headers.set('x-test-host', url.host)
  url.hostname = '127.0.0.1'
  return fetch(url, { ...init, headers })
}

/** Options of {@link TestOAuthClient}. */
export interface TestOAuthClientOptions {
  /** Seed user to sign in as (sent as `login_hint`); default: the server's first account. */
  loginHint?: string
  /** Return `undefined` from `validateResourceURL`, so no `resource` is sent. */
  omitResource?: boolean
}

/** An in-memory OAuth client (public client, PKCE, dynamic registration), like a CLI MCP client. */
export class TestOAuthClient implements OAuthClientProvider {
  readonly redirectUrl = 'http://127.0.0.1:9/oauth/callback'
  /** The authorization code of the last authorization, read from the redirect. */
  code: string | undefined
  /** Every parameter of the last redirect back to the client (`code`, `iss`, `state`). */
  callbackParams: URLSearchParams | undefined
  /** Every token set saved, in order (a refresh adds one). */
  readonly savedTokens: OAuthTokens[] = []
  validateResourceURL?: (serverUrl: string | URL, resource?: string) => Promise<URL | undefined>
  #client: OAuthClientInformationMixed | undefined
  #tokens: OAuthTokens | undefined
  #verifier = ''
  readonly #loginHint: string | undefined

  constructor(options: TestOAuthClientOptions = {}) {
    this.#loginHint = options.loginHint
    if (options.omitResource) this.validateResourceURL = async () => undefined
  }

  get clientMetadata(): OAuthClientMetadata {
    return {
      client_name: 'mcp-dispatch test client',
      redirect_uris: [this.redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    }
  }

  clientInformation() {
    return this.#client
  }
  saveClientInformation(info: OAuthClientInformationMixed) {
    this.#client = info
  }
  tokens() {
    return this.#tokens
  }
  saveTokens(tokens: OAuthTokens) {
    this.#tokens = tokens
    this.savedTokens.push(tokens)
  }
  /**
   * Discovery results the client keeps between its calls; the SDK v2 client also checks with
   * them that the code is redeemed at the authorization server that minted it (SEP-2352).
   */
  discoveryStateValue: OAuthDiscoveryState | undefined = undefined
  saveDiscoveryState(state: OAuthDiscoveryState) {
    this.discoveryStateValue = state
  }
  discoveryState() {
    return this.discoveryStateValue
  }
  saveCodeVerifier(verifier: string) {
    this.#verifier = verifier
  }
  codeVerifier() {
    return this.#verifier
  }

  /** Plays the browser: follows the sign-in redirects and keeps the code. */
  async redirectToAuthorization(authorizationUrl: URL): Promise<void> {
    const url = new URL(authorizationUrl)
    if (this.#loginHint) url.searchParams.set('login_hint', this.#loginHint)
    const target = await followSignIn(url.href, this.redirectUrl)
    const error = target.searchParams.get('error')
    if (error) throw new Error(`authorization refused: ${error} ${target.searchParams.get('error_description') ?? ''}`)
    this.code = target.searchParams.get('code') ?? undefined
    this.callbackParams = target.searchParams
  }
}

/**
 * Plays the browser of an authorization request: follows its redirects (manual, with a cookie
 * jar) through the development authorization server's automatic sign-in, and answers the URL
 * it is sent back to, the first one under `redirectUri`, without fetching it. A `jar` given is
 * kept across calls, as a browser keeps its cookies; by default each call starts a new one.
 */
export async function followSignIn(authorizationUrl: string, redirectUri: string, jar = new Map<string, string>()): Promise<URL> {
  let next = authorizationUrl
  for (let hop = 0; hop < 12; hop++) {
    const cookie = [...jar].map(([name, value]) => `${name}=${value}`).join('; ')
    const res = await fetch(next, { redirect: 'manual', headers: cookie ? { cookie } : {} })
    for (const line of res.headers.getSetCookie()) {
      const pair = line.split(';', 1)[0]!
      const eq = pair.indexOf('=')
      const name = pair.slice(0, eq).trim()
      const value = pair.slice(eq + 1)
      if (value === '') jar.delete(name)
      else jar.set(name, value)
    }
    const text = await res.text()
    const location = res.headers.get('location')
    if (!location) throw new Error(`authorization stopped with HTTP ${res.status}: ${text.slice(0, 500)}`)
    const target = new URL(location, next)
    if (target.href.startsWith(redirectUri)) return target
    next = target.href
  }
  throw new Error('authorization: too many redirects')
}

/**
 * Connects an MCP SDK client to `url` the way an interactive client does: the first attempt
 * meets 401 and signs in, then `finishAuth(code)` and a fresh transport.
 */
export async function connectWithOAuth(
  url: string,
  provider: TestOAuthClient,
  fetchFn: FetchLike,
): Promise<{ client: Client; transport: StreamableHTTPClientTransport }> {
  const first = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: fetchFn })
  const client = new Client({ name: 'oauth-test', version: '1.0.0' })
  try {
    await client.connect(first)
    return { client, transport: first }
  } catch (error) {
    if (!(error instanceof UnauthorizedError)) throw error
  }
  await first.close()
  if (!provider.code) throw new Error('no authorization code')
  await first.finishAuth(provider.code)
  const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: fetchFn })
  const signedIn = new Client({ name: 'oauth-test', version: '1.0.0' })
  await signedIn.connect(transport)
  return { client: signedIn, transport }
}

/**
 * Obtains an access token for the App at `serverUrl` without an MCP session: the SDK's own
 * `auth()` (protected-resource discovery, registration, PKCE, code exchange).
 */
export async function obtainAccessToken(
  serverUrl: string,
  fetchFn: FetchLike,
  options: TestOAuthClientOptions = {},
): Promise<{ accessToken: string; provider: TestOAuthClient }> {
  const provider = new TestOAuthClient(options)
  const first = await auth(provider, { serverUrl, fetchFn })
  if (first !== 'REDIRECT' || !provider.code) throw new Error(`expected a redirect, got ${first}`)
  const second = await auth(provider, { serverUrl, authorizationCode: provider.code, fetchFn })
  if (second !== 'AUTHORIZED') throw new Error(`expected AUTHORIZED, got ${second}`)
  return { accessToken: provider.tokens()!.access_token, provider }
}
