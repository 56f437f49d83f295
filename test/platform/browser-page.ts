/**
 * The page of test/platform/browser-client.test.ts, bundled for the browser with esbuild: the
 * official MCP SDK clients (`@modelcontextprotocol/sdk` and, for MCP 2026-07-28,
 * `@modelcontextprotocol/client`) and the page's own `fetch`, run by Chromium on a page of
 * another origin than the App's. Whatever a call here reads, the browser let the page read:
 * a response the CORS rules hide is a `TypeError` ("Failed to fetch"), and a header not
 * exposed is simply absent.
 *
 * Everything is on `window.mcpPage`; each function answers plain data (what crosses
 * `page.evaluate`): a failure of the SDK or of `fetch` is `{ error }`, never a throw.
 */
import { Client as ClientV2, StreamableHTTPClientTransport as StreamableHTTPClientTransportV2 } from '@modelcontextprotocol/client'
import {
  type OAuthClientProvider,
  UnauthorizedError,
  discoverOAuthProtectedResourceMetadata,
} from '@modelcontextprotocol/sdk/client/auth.js'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { OAuthClientInformationMixed, OAuthClientMetadata, OAuthTokens } from '@modelcontextprotocol/sdk/shared/auth.js'

/** One HTTP exchange of a connection, as the page saw it. */
export interface PageExchange {
  method: string
  url: string
  /** The request's `Mcp-Session-Id`, if it carried one. */
  sentSessionId: string | null
  /** The names of the request's headers, lower case, sorted. */
  sent: string[]
  status: number
  /** Every response header the page could read, by lower-case name. */
  headers: Record<string, string>
}

/** What a `fetch` of the page could read, or the error the browser gave instead. */
export type PageRead = { status: number; headers: Record<string, string>; body: string } | { error: string }

/** What the page uses of either SDK line's client. */
interface SdkClient {
  listTools(): Promise<{ tools: Array<{ name: string }> }>
  callTool(params: { name: string; arguments?: Record<string, unknown> }): Promise<Record<string, unknown>>
  close(): Promise<void>
}

interface Connection {
  client: SdkClient
  transport: { readonly sessionId?: string | undefined; terminateSession(): Promise<void> }
  exchanges: PageExchange[]
}

const connections = new Map<number, Connection>()
let nextId = 1

function visibleHeaders(response: Response): Record<string, string> {
  const headers: Record<string, string> = {}
  response.headers.forEach((value, name) => {
    headers[name] = value
  })
  return headers
}

function message(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error)
}

/** The page's `fetch`, recording what it could read of each answer. */
function recordingFetch(exchanges: PageExchange[]): typeof fetch {
  return async (input, init) => {
    const response = await fetch(input, init)
    const sent = new Headers(init?.headers)
    exchanges.push({
      method: init?.method ?? 'GET',
      url: String(input instanceof Request ? input.url : input),
      sentSessionId: sent.get('mcp-session-id'),
      sent: [...sent.keys()].sort(),
      status: response.status,
      headers: visibleHeaders(response),
    })
    return response
  }
}

/** Options of {@link connect}. */
export interface ConnectOptions {
  /** An API token or OAuth access token, sent as `Authorization: Bearer …`. */
  token?: string
  /** `v2`: the SDK v2 client (`@modelcontextprotocol/client`), pinned to MCP 2026-07-28. Default `v1`. */
  sdk?: 'v1' | 'v2'
}

const MODERN = '2026-07-28'

/** Connects an SDK client (`initialize`) to `url`; answers the connection's id. */
async function connect(
  url: string,
  options: ConnectOptions = {},
): Promise<{ id: number; sessionId: string | undefined } | { error: string; exchanges: PageExchange[] }> {
  const exchanges: PageExchange[] = []
  const requestInit = options.token === undefined ? undefined : { headers: { Authorization: `Bearer ${options.token}` } }
  const transportOptions = { ...(requestInit && { requestInit }), fetch: recordingFetch(exchanges) }
  const info = { name: 'browser-client', version: '1.0.0' }
  let connection: Connection
  try {
    if (options.sdk === 'v2') {
      const client = new ClientV2(info, { versionNegotiation: { mode: { pin: MODERN } } })
      const transport = new StreamableHTTPClientTransportV2(new URL(url), transportOptions)
      await client.connect(transport)
      connection = { client, transport, exchanges }
    } else {
      const client = new Client(info)
      const transport = new StreamableHTTPClientTransport(new URL(url), transportOptions)
      await client.connect(transport)
      connection = { client, transport, exchanges }
    }
  } catch (error) {
    return { error: message(error), exchanges }
  }
  const id = nextId++
  connections.set(id, connection)
  return { id, sessionId: connection.transport.sessionId }
}

function connection(id: number): Connection {
  const found = connections.get(id)
  if (!found) throw new Error(`no connection ${id}`)
  return found
}

/** `tools/list`: the tool names, sorted. */
async function listTools(id: number): Promise<string[] | { error: string }> {
  try {
    const { tools } = await connection(id).client.listTools()
    return tools.map((t) => t.name).sort()
  } catch (error) {
    return { error: message(error) }
  }
}

/** `tools/call`: the result's structured content, else its content. */
async function callTool(id: number, name: string, args: Record<string, unknown> = {}): Promise<unknown> {
  try {
    const result = await connection(id).client.callTool({ name, arguments: args })
    return result.structuredContent ?? result.content
  } catch (error) {
    return { error: message(error) }
  }
}

/** Ends the session (`DELETE`, from the page), then closes the client. */
async function terminate(id: number): Promise<{ ok: true } | { error: string }> {
  const { client, transport } = connection(id)
  try {
    await transport.terminateSession()
    await client.close()
    connections.delete(id)
    return { ok: true }
  } catch (error) {
    return { error: message(error) }
  }
}

async function closeAll(): Promise<void> {
  await Promise.all([...connections.values()].map((c) => c.client.close().catch(() => {})))
  connections.clear()
}

/** Every exchange of a connection so far. */
function exchanges(id: number): PageExchange[] {
  return connection(id).exchanges
}

/** A `fetch` from the page: what it could read of the answer. */
async function read(url: string, init: RequestInit = {}): Promise<PageRead> {
  try {
    const response = await fetch(url, init)
    return { status: response.status, headers: visibleHeaders(response), body: await response.text() }
  } catch (error) {
    return { error: message(error) }
  }
}

/** A `fetch` from the page that reads the status and headers, then drops the body (an SSE stream stays open). */
async function readHead(url: string, init: RequestInit = {}): Promise<PageRead> {
  const abort = new AbortController()
  try {
    const response = await fetch(url, { ...init, signal: abort.signal })
    return { status: response.status, headers: visibleHeaders(response), body: '' }
  } catch (error) {
    return { error: message(error) }
  } finally {
    abort.abort()
  }
}

/**
 * The SDK's own protected-resource discovery (RFC 9728) for `serverUrl`, without the 401's
 * `resource_metadata`: the path-suffixed document first, then the root one.
 */
async function discoverResource(serverUrl: string): Promise<{ metadata?: unknown; error?: string; seen: string[] }> {
  const seen: string[] = []
  const fetchFn: typeof fetch = async (input, init) => {
    try {
      const response = await fetch(input, init)
      seen.push(`${String(input)} ${response.status}`)
      return response
    } catch (error) {
      seen.push(`${String(input)} ${message(error)}`)
      throw error
    }
  }
  try {
    return { metadata: await discoverOAuthProtectedResourceMetadata(serverUrl, undefined, fetchFn), seen }
  } catch (error) {
    return { error: message(error), seen }
  }
}

/**
 * An OAuth client of the page. Its state lives in `sessionStorage`, as a browser client's does:
 * the page goes to the authorization server and comes back to `/callback`.
 */
class PageOAuthProvider implements OAuthClientProvider {
  get redirectUrl(): string {
    return `${location.origin}/callback`
  }
  get clientMetadata(): OAuthClientMetadata {
    return {
      client_name: 'mcp-dispatch browser test',
      redirect_uris: [this.redirectUrl],
      grant_types: ['authorization_code', 'refresh_token'],
      response_types: ['code'],
      token_endpoint_auth_method: 'none',
    }
  }
  #get<T>(key: string): T | undefined {
    const value = sessionStorage.getItem(`oauth.${key}`)
    return value === null ? undefined : (JSON.parse(value) as T)
  }
  #set(key: string, value: unknown): void {
    sessionStorage.setItem(`oauth.${key}`, JSON.stringify(value))
  }
  clientInformation() {
    return this.#get<OAuthClientInformationMixed>('client')
  }
  saveClientInformation(info: OAuthClientInformationMixed) {
    this.#set('client', info)
  }
  tokens() {
    return this.#get<OAuthTokens>('tokens')
  }
  saveTokens(tokens: OAuthTokens) {
    this.#set('tokens', tokens)
  }
  saveCodeVerifier(verifier: string) {
    this.#set('verifier', verifier)
  }
  codeVerifier() {
    return this.#get<string>('verifier') ?? ''
  }
  /** Records where the SDK sends the user; the test navigates there (the user's click). */
  redirectToAuthorization(url: URL) {
    this.#set('authorizationUrl', url.href)
  }
}

/**
 * Connects with the OAuth provider and no token: the SDK meets the 401, discovers the resource
 * and its authorization server, registers, and asks for the redirect.
 */
async function oauthStart(url: string): Promise<{ authorizationUrl: string | undefined; error?: string; exchanges: PageExchange[] }> {
  const exchanges: PageExchange[] = []
  const provider = new PageOAuthProvider()
  const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: recordingFetch(exchanges) })
  const client = new Client({ name: 'browser-oauth', version: '1.0.0' })
  try {
    await client.connect(transport)
    await client.close()
    return { authorizationUrl: undefined, error: 'connected without signing in', exchanges }
  } catch (error) {
    await transport.close()
    const authorizationUrl = sessionStorage.getItem('oauth.authorizationUrl')
    return {
      authorizationUrl: authorizationUrl === null ? undefined : (JSON.parse(authorizationUrl) as string),
      ...(!(error instanceof UnauthorizedError) && { error: message(error) }),
      exchanges,
    }
  }
}

/** Back at `/callback`: redeems the code (cross-origin `POST` to the token endpoint), then connects. */
async function oauthFinish(url: string): Promise<{ id: number; sessionId: string | undefined } | { error: string }> {
  const code = new URLSearchParams(location.search).get('code')
  if (code === null) return { error: `no code in ${location.href}` }
  const provider = new PageOAuthProvider()
  try {
    const first = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider })
    await first.finishAuth(code)
    await first.close()
    const exchangesSeen: PageExchange[] = []
    const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: recordingFetch(exchangesSeen) })
    const client = new Client({ name: 'browser-oauth', version: '1.0.0' })
    await client.connect(transport)
    const id = nextId++
    connections.set(id, { client, transport, exchanges: exchangesSeen })
    return { id, sessionId: transport.sessionId }
  } catch (error) {
    return { error: message(error) }
  }
}

const mcpPage = { connect, listTools, callTool, terminate, closeAll, exchanges, read, readHead, discoverResource, oauthStart, oauthFinish }
/** What the test calls in the page. */
export type McpPage = typeof mcpPage
;(globalThis as unknown as { mcpPage: McpPage }).mcpPage = mcpPage
