/**
 * Web-standard adapter (`mcp-dispatch/web`): `(request: Request) => Promise<Response>` for
 * Hono, Next.js route handlers, Cloudflare Workers, Bun, Deno and `@hono/node-server`.
 *
 * @example
 * ```ts
 * import { mcpDispatch } from 'mcp-dispatch/web'
 * const handle = mcpDispatch({
 *   dispatcher: { apps, subscriptions, tokens, authorizationServers: ['https://auth.example.com'] },
 *   handler: (request, context) => servers.get(context.version)!.handleRequest(request),
 * })
 * export default { fetch: handle }
 * ```
 * @module
 */
import { resolveClientAddress } from '../../core/client-address.js'
import type { Reply } from '../../core/reply.js'
import { ConfigurationError } from '../../errors.js'
import type { DispatchContext } from '../../pipeline/dispatcher.js'
import { type AdapterOptions, HANDLER_FAILED, setupAdapter, splitUrl } from '../shared.js'

/** A web-standard MCP handler for one dispatched request. */
export type WebMcpHandler = (request: Request, context: DispatchContext) => Response | Promise<Response>

/** Options of {@link mcpDispatch} (web). */
export interface WebDispatchOptions extends AdapterOptions {
  /** Serves a dispatched request; `context.version` names the version to serve. */
  handler: WebMcpHandler
}

/** Per-request information the runtime knows and the `Request` does not. */
export interface WebRequestInfo {
  /** The socket peer address (`@hono/node-server`: `c.env.incoming.socket.remoteAddress`). */
  clientAddress?: string
}

/** The fetch-style handler returned by {@link mcpDispatch}. */
export type WebDispatchHandler = (request: Request, info?: WebRequestInfo) => Promise<Response>

/** Writes a dispatch-layer {@link Reply} as a `Response`. */
export function toResponse(reply: Reply): Response {
  return new Response(reply.body, { status: reply.status, headers: reply.headers })
}

/**
 * Wraps a web-standard MCP handler in the whole dispatch pipeline. Rejections are answered
 * here; dispatched requests reach `handler` with their body untouched, and its response
 * (SSE streams included) passes through unbuffered with `X-MCP-Version` and
 * `X-MCP-Latest-Version` stamped on it.
 */
export function mcpDispatch(options: WebDispatchOptions): WebDispatchHandler {
  const { dispatcher, trust, onError } = setupAdapter(options)
  const handler = options.handler
  if (typeof handler !== 'function') throw new ConfigurationError('handler', 'must be a function')
  return async function dispatch(request, info) {
    const { origin, path } = splitUrl(request.url)
    const decision = await dispatcher.decide({
      method: request.method,
      path,
      host: origin.slice(origin.indexOf('://') + 3),
      origin,
      headers: request.headers,
      clientAddress: resolveClientAddress(info?.clientAddress, request.headers.get('x-forwarded-for'), trust),
    })
    if (decision.type === 'reply') return toResponse(decision.reply)
    let response: Response
    try {
      response = await handler(request, decision.context)
    } catch (error) {
      onError(error, 'handler')
      return toResponse(HANDLER_FAILED)
    }
    const headers = new Headers(response.headers)
    for (const name in decision.headers) headers.set(name, decision.headers[name]!)
    await decision.complete({ status: response.status, sessionId: response.headers.get('mcp-session-id') })
    return new Response(response.body, { status: response.status, statusText: response.statusText, headers })
  }
}

export type { DispatchContext } from '../../pipeline/dispatcher.js'
