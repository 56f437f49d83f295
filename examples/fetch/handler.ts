/**
 * A fetch-style handler, `(request: Request) => Promise<Response>`: what a Next.js route
 * handler or a Cloudflare Worker exports. Deployed serverless, such runtimes do not keep MCP
 * sessions in memory between requests, so here every App version runs as its own service and
 * the dispatch layer proxies to it (`mcp-dispatch/proxy`): the caller's token stays here; the
 * App receives who is calling as a short-lived JWT signed by the platform, verifiable against
 * the JWKS this handler publishes at `/.well-known/jwks.json`.
 *
 * Next.js (`app/[[...path]]/route.ts`), which gives a route handler a `request.url` of its own
 * address, so the App's host comes from the `Host` header (the client address: docs/adapters.md,
 * "Next.js"). The handler is kept on `globalThis` ("Module state" there): `next dev` evaluates
 * the module again after an edit and once per route, and a new dispatcher knows no session pin.
 * Pins live in the dispatcher's session store: on a serverless runtime, where instances come and
 * go, give the dispatcher a shared one (`sessions`: mcp-dispatch/redis, docs/stores.md), or a
 * session pinned on one instance is unknown on the next.
 * ```ts
 * const kept = globalThis as { mcpFetchHandler?: FetchHandler }
 * const handler = (kept.mcpFetchHandler ??= createFetchHandler({ dispatcher, signer, upstream, host: (r) => r.headers.get('host') }))
 * const route = (request: Request) => handler(request)
 * export { route as GET, route as POST, route as DELETE, route as OPTIONS, route as PUT, route as PATCH }
 * ```
 * Cloudflare Workers (`CF-Connecting-IP` is set by Cloudflare, so it is the client address):
 * ```ts
 * const handler = createFetchHandler({ dispatcher, signer, upstream, clientAddress: (r) => r.headers.get('cf-connecting-ip') ?? undefined })
 * // The request alone: Workers pass `env` and `ctx` after it, which the handler would read
 * // as its `info`.
 * export default { fetch: (request: Request) => handler(request) }
 * ```
 * Run locally: `npx tsx examples/fetch/server.ts`.
 */
import { type DispatchContext, type Dispatcher, methodNotAllowedReply } from 'mcp-dispatch'
import { type IdentitySigner, createProxyHandler } from 'mcp-dispatch/proxy'
import { mcpDispatch, toResponse } from 'mcp-dispatch/web'

/** Options of {@link createFetchHandler}. */
export interface FetchHandlerOptions {
  dispatcher: Dispatcher
  /** Signs the identity the upstream Apps receive. */
  signer: IdentitySigner
  /** The upstream MCP endpoint of a version. */
  upstream: (context: DispatchContext) => string | undefined
  /** The client address of a request, where the runtime knows it. */
  clientAddress?: (request: Request) => string | undefined
  /** The host the client addressed, where `request.url` does not carry it (Next.js): `info.host` of `mcp-dispatch/web`. */
  host?: (request: Request) => string | null | undefined
}

/**
 * A fetch handler; `info.clientAddress` is the socket address where the server knows it, and
 * `info.outgoing`, on Node, the `http.ServerResponse` the answer is written to (the Web adapter's
 * `outgoing`: the dispatch headers go into its head, and an answer given before a large request
 * body has all arrived, such as the App's 413, closes its connection after it).
 */
export type FetchHandler = (request: Request, info?: { clientAddress?: string; outgoing?: unknown }) => Promise<Response>

/** Builds the handler: the JWKS document, and every MCP request through the dispatch layer to the proxy. */
export function createFetchHandler(options: FetchHandlerOptions): FetchHandler {
  const mcp = mcpDispatch({
    dispatcher: options.dispatcher,
    handler: createProxyHandler({ upstream: options.upstream, identity: options.signer, timeoutMs: 10_000 }),
  })
  return async (request, info) => {
    if (new URL(request.url).pathname === '/.well-known/jwks.json') {
      // A document to read (a runtime leaves the body out for HEAD): any other method is
      // refused, as the dispatch layer refuses its own.
      if (request.method !== 'GET' && request.method !== 'HEAD') return toResponse(methodNotAllowedReply('GET, HEAD'))
      // Revalidated by any cache between: a JWKS served stale would hide a key published ahead.
      return Response.json(await options.signer.jwks(), { headers: { 'cache-control': 'no-cache' } })
    }
    return mcp(request, { clientAddress: info?.clientAddress ?? options.clientAddress?.(request), host: options.host?.(request), outgoing: info?.outgoing })
  }
}
